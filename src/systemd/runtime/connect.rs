//! The non-blocking connects the runtime makes on the loop's poll and its own timer.
//!
//! A connect must never block the loop's thread, and must hand back a socket no longer
//! registered, since zbus registers it again for its own traffic.

use std::{future::poll_fn, io, net::SocketAddr, os::fd::OwnedFd, path::Path, time::Duration};

use nix::errno::Errno;
use socket2::{Domain, SockAddr, SockRef, Socket, Type};
use zbus::runtime::{
    Interest, IoSource,
    traits::{self, PollIo},
};

use super::RuntimeHandle;

/// How long a unix connect turned away by a full listen backlog waits before it tries again.
const BACKLOG_RETRY_INTERVAL: Duration = Duration::from_millis(20);

/// A stream socket connected to the TCP endpoint at `address`.
pub(super) async fn tcp(handle: &RuntimeHandle, address: SocketAddr) -> io::Result<IoSource> {
    connect(handle, Domain::for_address(address), &address.into()).await
}

/// A stream socket connected to the unix-domain socket at `path` (abstract when it starts with
/// a zero byte).
///
/// A non-blocking connect to a listener whose backlog is full fails with `EAGAIN` where a
/// blocking one would wait in the kernel, so the wait is made here, on the runtime's timer.
pub(super) async fn unix(handle: &RuntimeHandle, path: &Path) -> io::Result<IoSource> {
    let address = SockAddr::unix(path)?;

    loop {
        match connect(handle, Domain::UNIX, &address).await {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                traits::Runtime::sleep(handle, BACKLOG_RETRY_INTERVAL).await
            }
            result => return result,
        }
    }
}

/// One try at a non-blocking stream socket of `domain` connected to `address`.
///
/// A connect the kernel cannot complete at once is waited for as writability, which the kernel
/// reports once the connect has settled either way; [`settled`] then says which way.
async fn connect(
    handle: &RuntimeHandle,
    domain: Domain,
    address: &SockAddr,
) -> io::Result<IoSource> {
    let socket = Socket::new(domain, Type::STREAM, None)?;
    socket.set_nonblocking(true)?;

    let connected = socket.connect(address);
    let source = IoSource::from(OwnedFd::from(socket));
    match connected {
        Ok(()) => return Ok(source),
        Err(e) if e.raw_os_error() == Some(Errno::EINPROGRESS as i32) => {}
        Err(e) => return Err(e),
    }

    let registration = traits::Runtime::register_io_source(handle, source.clone())?;
    let outcome =
        poll_fn(|cx| registration.poll_io(cx, Interest::Writable, || settled(&source))).await;
    // Off the poll before zbus registers the socket again for the connection's traffic.
    drop(registration);
    outcome?;

    Ok(source)
}

/// What has become of the connect under way on `source`: `WouldBlock` while it still is.
///
/// `SO_ERROR` holds the reason for a connect that failed; a socket with no peer yet
/// (`ENOTCONN`) is one whose connect is still under way.
fn settled(source: &IoSource) -> io::Result<()> {
    let socket = SockRef::from(source);

    match socket.take_error()? {
        Some(e) => Err(e),
        None => match socket.peer_addr() {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotConnected => {
                Err(io::ErrorKind::WouldBlock.into())
            }
            Err(e) => Err(e),
        },
    }
}
