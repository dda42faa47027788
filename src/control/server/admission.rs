//! Which peers may use the socket, decided on the kernel's word (`SO_PEERCRED`), and telling a
//! refused one why.

use std::os::fd::AsRawFd;

use mio::net::UnixStream;
use nix::sys::socket::{MsgFlags, getsockopt, send, sockopt};

use super::ServerOptions;
use crate::control::protocol::{ErrorKind, Response};

/// Whether the peer of `stream` may use the socket of an agent running with effective uid
/// `own_euid`; a refused peer is logged and told why.
pub(super) fn admitted(stream: &UnixStream, options: &ServerOptions, own_euid: u32) -> bool {
    let credentials = match getsockopt(stream, sockopt::PeerCredentials) {
        Ok(credentials) => credentials,
        Err(errno) => {
            log::warn!("control client refused: cannot read its credentials: {errno}");
            return false;
        }
    };
    let (uid, gid) = (credentials.uid(), credentials.gid());
    if !options.allows(own_euid, uid, gid) {
        log::warn!(
            "control client refused: uid {uid} gid {gid} (pid {}) is not allowed",
            credentials.pid()
        );
        refuse(
            stream,
            ErrorKind::Forbidden,
            format!(
                "uid {uid} is not allowed to use this socket (the agent admits it with \
                 --allow-uid {uid} or --allow-gid {gid})"
            ),
        );
        return false;
    }
    true
}

/// Tells a refused client why it is disconnected, in one error line; best effort, the socket is closed
/// when the caller drops it.
pub(super) fn refuse(stream: &UnixStream, kind: ErrorKind, message: String) {
    let mut line = Response::error(None, kind, message).to_line();
    line.push('\n');
    // A fresh socket's send buffer is empty, so the short line fits; if it does not, closing is enough.
    let _ = send(
        stream.as_raw_fd(),
        line.as_bytes(),
        MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
    );
}
