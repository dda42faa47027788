//! Socket activation: the listening control socket handed over by systemd (a `.socket` unit, or
//! `systemd-socket-activate`) through `LISTEN_PID`, `LISTEN_FDS` and file descriptor 3, as
//! `sd_listen_fds(3)` describes, without libsystemd.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;

use nix::fcntl::{FcntlArg, FdFlag, fcntl};
use nix::sys::socket::{
    AddressFamily, SockType, SockaddrLike, SockaddrStorage, getsockname, getsockopt, sockopt,
};
use nix::sys::stat::{SFlag, fstat};

/// The first passed descriptor (`SD_LISTEN_FDS_START`).
const FIRST_FD: RawFd = 3;
/// The variables of the protocol, all removed once read so that no child inherits them.
const VARIABLES: [&str; 3] = ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"];

/// A listening socket handed to this process.
#[derive(Debug)]
pub struct Activated {
    /// The listening socket, to serve as it is.
    pub listener: UnixListener,
    /// The socket's path, as it was bound (for logs; an abstract socket reads `@name`).
    pub path: PathBuf,
}

/// Why a handed-over socket cannot be served.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("socket activation: {0}")]
pub struct ActivationError(String);

/// How many descriptors the environment passes to this process (`pid`): `None` when it passes
/// none (no `LISTEN_PID`, or another process's), else `LISTEN_FDS`. Pure, for tests.
pub fn passed_fds(
    listen_pid: Option<&str>,
    listen_fds: Option<&str>,
    pid: u32,
) -> Result<Option<u32>, ActivationError> {
    let Some(listen_pid) = listen_pid else {
        return Ok(None);
    };
    let listen_pid: u32 = listen_pid
        .parse()
        .map_err(|_| ActivationError(format!("LISTEN_PID={listen_pid:?} is not a pid")))?;
    if listen_pid != pid {
        // Meant for another process (inherited through one that did not clear it).
        return Ok(None);
    }
    let listen_fds = listen_fds.ok_or_else(|| ActivationError("LISTEN_FDS is not set".into()))?;
    match listen_fds.parse::<u32>() {
        Ok(0) => Ok(None),
        Ok(1) => Ok(Some(1)),
        Ok(n) => Err(ActivationError(format!(
            "{n} sockets were passed (LISTEN_FDS={n}); the agent serves exactly one control \
             socket (one ListenStream= in the socket unit)"
        ))),
        Err(_) => Err(ActivationError(format!(
            "LISTEN_FDS={listen_fds:?} is not a number"
        ))),
    }
}

/// Takes the control socket this process was handed, if any, and removes the protocol's
/// variables from the environment (if this is the process's only thread: an embedder's other
/// threads might read it).
pub fn take_listener() -> Result<Option<Activated>, ActivationError> {
    let listen_pid = std::env::var("LISTEN_PID").ok();
    let listen_fds = std::env::var("LISTEN_FDS").ok();
    if crate::service::is_single_threaded() {
        for variable in VARIABLES {
            // SAFETY: `remove_var` is unsound only while another thread reads or writes the
            // environment; `/proc/self/task` has just listed this thread alone, and only this
            // thread could start another.
            unsafe { std::env::remove_var(variable) };
        }
    } else if listen_pid.is_some() {
        log::warn!(
            "more than one thread is running, so LISTEN_PID and LISTEN_FDS stay in the \
             environment (children would inherit them)"
        );
    }
    match passed_fds(
        listen_pid.as_deref(),
        listen_fds.as_deref(),
        std::process::id(),
    )? {
        None => Ok(None),
        Some(_) => listener_at(FIRST_FD).map(Some),
    }
}

/// The listening Unix stream socket at `fd`, which this process then owns (close-on-exec).
fn listener_at(fd: RawFd) -> Result<Activated, ActivationError> {
    let fail = |what: String| ActivationError(format!("file descriptor {fd} {what}"));
    // SAFETY: only looked at; a descriptor that is not open makes fstat fail with EBADF.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let stat = fstat(borrowed).map_err(|e| fail(format!("cannot be used: {e}")))?;
    if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFSOCK {
        return Err(fail("is not a socket".into()));
    }
    // SAFETY: the descriptor is open (fstat succeeded) and passed to this process alone, which
    // takes it over here, once.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    fcntl(&owned, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))
        .map_err(|e| fail(format!("cannot be made close-on-exec: {e}")))?;
    let address: SockaddrStorage =
        getsockname(owned.as_raw_fd()).map_err(|e| fail(format!("getsockname: {e}")))?;
    let unix = address
        .as_unix_addr()
        .filter(|_| address.family() == Some(AddressFamily::Unix));
    let Some(unix) = unix else {
        return Err(fail(format!(
            "is not a Unix socket (family {:?}): the agent listens on a Unix stream socket \
             (ListenStream=/path)",
            address.family()
        )));
    };
    let kind = getsockopt(&owned, sockopt::SockType).map_err(|e| fail(format!("SO_TYPE: {e}")))?;
    if kind != SockType::Stream {
        return Err(fail(format!(
            "is a {kind:?} socket, not a stream socket: use ListenStream=, not ListenDatagram= \
             or ListenSequentialPacket="
        )));
    }
    let listening =
        getsockopt(&owned, sockopt::AcceptConn).map_err(|e| fail(format!("SO_ACCEPTCONN: {e}")))?;
    if !listening {
        return Err(fail(
            "is a Unix stream socket that does not listen (a connection, or Accept=yes): the \
             agent needs the listening socket (Accept=no)"
                .into(),
        ));
    }
    let path = match (unix.path(), unix.as_abstract()) {
        (Some(path), _) => path.to_owned(),
        (None, Some(name)) => PathBuf::from(format!("@{}", String::from_utf8_lossy(name))),
        (None, None) => PathBuf::from("(unnamed)"),
    };
    Ok(Activated {
        listener: UnixListener::from(owned),
        path,
    })
}

#[cfg(test)]
mod tests;
