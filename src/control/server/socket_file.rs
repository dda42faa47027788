//! The socket file's life: a stale one (nobody answers) is replaced, a new one is bound in a
//! private staging directory with its exact mode and renamed into place, and only the file this
//! server made is removed at the end.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use mio::net::{UnixListener, UnixStream};
use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};

use crate::control::ControlError;

/// The longest path a Unix socket address holds (`sun_path` is 108 bytes including the NUL).
const SOCKET_PATH_MAX: usize = 107;

/// Removes a stale socket file at `path`; errors if a live server answers there or the path is not a
/// socket.
pub(super) fn clear_stale_socket(path: &Path) -> Result<(), ControlError> {
    let metadata = match fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(ControlError::Io {
                action: "inspect control socket path",
                path: path.to_owned(),
                source,
            });
        }
    };
    if !metadata.file_type().is_socket() {
        return Err(ControlError::NotASocket {
            path: path.to_owned(),
        });
    }
    // A non-blocking connect never hangs on a live server with a full backlog: that is WouldBlock.
    match UnixStream::connect(path) {
        Ok(_) => Err(ControlError::AlreadyListening {
            path: path.to_owned(),
        }),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(ControlError::AlreadyListening {
            path: path.to_owned(),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            log::info!("replacing stale control socket {}", path.display());
            match fs::remove_file(path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(ControlError::Io {
                    action: "remove stale control socket",
                    path: path.to_owned(),
                    source: e,
                }),
                _ => Ok(()),
            }
        }
        Err(source) => Err(ControlError::Io {
            action: "probe existing control socket",
            path: path.to_owned(),
            source,
        }),
    }
}

/// Distinguishes staging directories of several binds in one process.
static STAGING_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A private directory next to the socket path, removed with whatever is left in it when dropped.
struct StagingDir {
    dir: PathBuf,
    socket: PathBuf,
}

impl Drop for StagingDir {
    fn drop(&mut self) {
        // After a successful rename the socket is gone from here; both removals are best effort.
        let _ = fs::remove_file(&self.socket);
        let _ = fs::remove_dir(&self.dir);
    }
}

/// Binds a listener at `path` whose socket file has exactly `mode`, never visible with other bits.
pub(super) fn bind_with_mode(path: &Path, mode: u32) -> Result<UnixListener, ControlError> {
    let io_error = |action, source| ControlError::Io {
        action,
        path: path.to_owned(),
        source,
    };
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let staging_name = format!(
        ".ep{:x}.{:x}",
        std::process::id(),
        STAGING_COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let dir = parent.join(staging_name);
    let staging = StagingDir {
        socket: dir.join("s"),
        dir,
    };
    if staging.socket.as_os_str().len() > SOCKET_PATH_MAX {
        return Err(io_error(
            "bind control socket",
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "its directory path is too long for a Unix socket (the socket is staged at {}, \
                     which exceeds {SOCKET_PATH_MAX} bytes)",
                    staging.socket.display()
                ),
            ),
        ));
    }
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&staging.dir)
        .map_err(|e| io_error("create staging directory for control socket", e))?;
    let listener =
        UnixListener::bind(&staging.socket).map_err(|e| io_error("bind control socket", e))?;
    fs::set_permissions(&staging.socket, fs::Permissions::from_mode(mode))
        .map_err(|e| io_error("set permissions of control socket", e))?;
    // NOREPLACE: a file that appeared at the path since the stale check is never clobbered.
    renameat2(
        AT_FDCWD,
        &staging.socket,
        AT_FDCWD,
        path,
        RenameFlags::RENAME_NOREPLACE,
    )
    .map_err(|errno| io_error("move control socket into place at", errno.into()))?;
    Ok(listener)
}

/// Removes the socket file at `path` if it is still `socket_file` (device and inode), the one
/// this server made; if the path now names something else, or the socket was handed over
/// (`None`), it is not ours.
pub(super) fn remove_if_ours(path: &Path, socket_file: Option<(u64, u64)>) {
    match fs::symlink_metadata(path) {
        Ok(metadata) if Some((metadata.dev(), metadata.ino())) == socket_file => {
            if let Err(e) = fs::remove_file(path) {
                log::warn!("cannot remove control socket {}: {e}", path.display());
            }
        }
        _ => {}
    }
}
