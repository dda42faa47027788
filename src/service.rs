//! Running as a systemd service: the sd_notify protocol (readiness, stopping, status and the
//! watchdog), spoken by hand over a Unix datagram socket, and log lines in the form the journal
//! understands.
//!
//! It must never block the loop on the notify socket (every send is `MSG_DONTWAIT`), never panic on
//! what the environment holds, and never let a child inherit `NOTIFY_SOCKET` or `WATCHDOG_*`, which
//! would let it speak for the agent.

use std::env;
use std::ffi::OsString;
use std::fmt;
use std::fs;
#[cfg(feature = "cli")]
use std::io::{self, Write};
#[cfg(feature = "cli")]
use std::os::fd::AsFd;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::Duration;

use nix::errno::Errno;
#[cfg(feature = "cli")]
use nix::libc::{dev_t, ino_t};
use nix::sys::socket::{AddressFamily, MsgFlags, SockFlag, SockType, UnixAddr, sendto, socket};

/// The variables through which systemd hands the notify socket and the watchdog to its main process.
const NOTIFY_VARIABLES: [&str; 3] = ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"];

/// Where the service manager listens for notifications, as `NOTIFY_SOCKET` names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum NotifyAddress {
    /// A socket file, from an absolute path.
    Path(PathBuf),
    /// A socket in the abstract namespace, from `@name` (the name without its `@`).
    Abstract(Vec<u8>),
}

impl fmt::Display for NotifyAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotifyAddress::Path(path) => write!(f, "{}", path.display()),
            NotifyAddress::Abstract(name) => write!(f, "@{}", String::from_utf8_lossy(name)),
        }
    }
}

/// A failure to set up or use the sd_notify protocol.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NotifyError {
    /// `NOTIFY_SOCKET` names no address this agent can send to.
    #[error("invalid NOTIFY_SOCKET {value:?}: {reason}")]
    InvalidSocket {
        /// The variable's value, lossily decoded.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// `WATCHDOG_USEC` or `WATCHDOG_PID` is not a positive whole number.
    #[error("invalid {variable} {value:?}: expected a whole number greater than 0")]
    InvalidWatchdog {
        /// The variable's name.
        variable: &'static str,
        /// The variable's value, lossily decoded.
        value: String,
    },
    /// The datagram socket could not be created.
    #[error("cannot create a datagram socket for sd_notify: {source}")]
    Socket {
        /// The error from `socket(2)`.
        source: Errno,
    },
    /// A notification was not sent; `EAGAIN` means the manager's queue is full.
    #[error("cannot send {variable} to the notify socket {address}: {source}")]
    Send {
        /// The variable the notification carried, e.g. `READY`.
        variable: &'static str,
        /// Where it was sent.
        address: NotifyAddress,
        /// The error from `sendto(2)`.
        source: Errno,
    },
}

/// Speaks the sd_notify protocol to the service manager that started the agent.
pub(crate) struct Notifier {
    socket: OwnedFd,
    address: NotifyAddress,
    unix_address: UnixAddr,
    watchdog: Option<Duration>,
}

impl fmt::Debug for Notifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Notifier")
            .field("address", &self.address)
            .field("watchdog", &self.watchdog)
            .finish_non_exhaustive()
    }
}

impl Notifier {
    /// Reads `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID`, then removes all three from the
    /// environment so that no child inherits them. Returns `None` when the agent was not started
    /// with a notify socket, or when the socket cannot be used (logged as a warning). An invalid or
    /// foreign watchdog (one whose `WATCHDOG_PID` is another process) leaves the notifier without a
    /// watchdog.
    ///
    /// Call it early in `main`, after [`init_logging`] (so its warnings are seen) and before any
    /// thread is started: the variables are removed only while the process has one thread (checked
    /// in `/proc/self/task`), because changing the environment races with any other thread reading
    /// it; otherwise they stay, with a warning.
    pub(crate) fn from_env() -> Option<Notifier> {
        let [socket, usec, pid] = NOTIFY_VARIABLES.map(env::var_os);
        forget_notify_environment();
        let socket = socket?;
        let address = match socket.to_str().map(parse_notify_socket) {
            Some(Ok(address)) => address,
            Some(Err(e)) => {
                log::warn!("not notifying systemd: {e}");
                return None;
            }
            None => {
                log::warn!(
                    "not notifying systemd: {}",
                    NotifyError::InvalidSocket {
                        value: socket.to_string_lossy().into_owned(),
                        reason: "it is not UTF-8",
                    }
                );
                return None;
            }
        };
        let watchdog = parse_watchdog(
            usec.as_ref().map(text_of),
            pid.as_ref().map(text_of),
            std::process::id(),
        )
        .unwrap_or_else(|e| {
            log::warn!("running without the systemd watchdog: {e}");
            None
        });
        match Notifier::new(address, watchdog) {
            Ok(notifier) => Some(notifier),
            Err(e) => {
                log::warn!("not notifying systemd: {e}");
                None
            }
        }
    }

    /// A notifier that sends to `address`, with the watchdog timeout `watchdog` (the full
    /// `WATCHDOG_USEC`, not the ping interval).
    pub(crate) fn new(
        address: NotifyAddress,
        watchdog: Option<Duration>,
    ) -> Result<Notifier, NotifyError> {
        let too_long = |_| NotifyError::InvalidSocket {
            value: address.to_string(),
            reason: "it is too long for a unix socket address",
        };
        let unix_address = match &address {
            NotifyAddress::Path(path) => UnixAddr::new(path.as_path()).map_err(too_long)?,
            NotifyAddress::Abstract(name) => UnixAddr::new_abstract(name).map_err(too_long)?,
        };
        // CLOEXEC: a child must not inherit a channel to the manager.
        let socket = socket(
            AddressFamily::Unix,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(|source| NotifyError::Socket { source })?;
        Ok(Notifier {
            socket,
            address,
            unix_address,
            watchdog,
        })
    }

    /// Tells the manager that the agent is ready (`READY=1`).
    pub(crate) fn ready(&self) -> Result<(), NotifyError> {
        self.send("READY", "READY=1")
    }

    /// Tells the manager that the agent is shutting down (`STOPPING=1`).
    pub(crate) fn stopping(&self) -> Result<(), NotifyError> {
        self.send("STOPPING", "STOPPING=1")
    }

    #[cfg(test)]
    /// Sets the one-line status `systemctl status` shows (`STATUS=...`); see [`status_message`].
    pub(crate) fn status(&self, text: &str) -> Result<(), NotifyError> {
        self.send("STATUS", &status_message(text))
    }

    /// Tells the watchdog the agent is alive (`WATCHDOG=1`).
    pub(crate) fn ping(&self) -> Result<(), NotifyError> {
        self.send("WATCHDOG", "WATCHDOG=1")
    }

    /// How often to [`ping`](Notifier::ping): half the watchdog timeout, as systemd recommends, or
    /// `None` when no watchdog is armed for this process.
    pub(crate) fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog.map(|timeout| timeout / 2)
    }

    fn send(&self, variable: &'static str, message: &str) -> Result<(), NotifyError> {
        // A datagram is sent whole or not at all, so the byte count needs no check.
        sendto(
            self.socket.as_raw_fd(),
            message.as_bytes(),
            &self.unix_address,
            MsgFlags::MSG_DONTWAIT,
        )
        .map(drop)
        .map_err(|source| NotifyError::Send {
            variable,
            address: self.address.clone(),
            source,
        })
    }
}

/// Parses `NOTIFY_SOCKET`: an absolute path, or `@name` for the abstract namespace.
pub(crate) fn parse_notify_socket(value: &str) -> Result<NotifyAddress, NotifyError> {
    let invalid = |reason| NotifyError::InvalidSocket {
        value: value.to_owned(),
        reason,
    };
    if let Some(name) = value.strip_prefix('@') {
        if name.is_empty() {
            return Err(invalid("the abstract socket name is empty"));
        }
        Ok(NotifyAddress::Abstract(name.as_bytes().to_vec()))
    } else if value.starts_with('/') {
        Ok(NotifyAddress::Path(PathBuf::from(value)))
    } else {
        Err(invalid(
            "it is neither an absolute path nor an @abstract name",
        ))
    }
}

/// Parses `WATCHDOG_USEC` and `WATCHDOG_PID` into the watchdog timeout for the process `own_pid`:
/// `None` if there is no watchdog, or if `WATCHDOG_PID` names another process (the watchdog is
/// then that process's, as with `sd_watchdog_enabled`).
pub(crate) fn parse_watchdog(
    usec: Option<&str>,
    pid: Option<&str>,
    own_pid: u32,
) -> Result<Option<Duration>, NotifyError> {
    let Some(usec) = usec else {
        return Ok(None);
    };
    let micros = positive(usec).ok_or_else(|| NotifyError::InvalidWatchdog {
        variable: "WATCHDOG_USEC",
        value: usec.to_owned(),
    })?;
    if let Some(pid) = pid {
        let watched = positive(pid).ok_or_else(|| NotifyError::InvalidWatchdog {
            variable: "WATCHDOG_PID",
            value: pid.to_owned(),
        })?;
        if watched != u64::from(own_pid) {
            return Ok(None);
        }
    }
    Ok(Some(Duration::from_micros(micros)))
}

#[cfg(test)]
/// The `STATUS=` notification for `text`. Newlines and NUL bytes become spaces: a newline would
/// start another assignment, and the manager ignores a datagram containing NUL.
pub(crate) fn status_message(text: &str) -> String {
    let clean: String = text
        .chars()
        .map(|c| if matches!(c, '\n' | '\0') { ' ' } else { c })
        .collect();
    format!("STATUS={clean}")
}

fn positive(text: &str) -> Option<u64> {
    text.parse().ok().filter(|&n| n > 0)
}

/// A variable's value as text; a non-UTF-8 value is decoded lossily and then fails to parse.
fn text_of(value: &OsString) -> &str {
    std::str::from_utf8(value.as_bytes()).unwrap_or("\u{fffd}")
}

/// Removes the notify variables from the environment, if this is the process's only thread.
fn forget_notify_environment() {
    if !is_single_threaded() {
        log::warn!(
            "more than one thread is running, so NOTIFY_SOCKET and WATCHDOG_* stay in the \
             environment (children would inherit them)"
        );
        return;
    }
    for name in NOTIFY_VARIABLES {
        // SAFETY: `remove_var` is unsound only while another thread reads or writes the
        // environment. `/proc/self/task` has just listed this thread alone, and no other thread can
        // appear meanwhile, since only this thread could start one and it does not here.
        unsafe { env::remove_var(name) };
    }
}

/// Whether the process has exactly one thread; `false` if that cannot be read.
pub(crate) fn is_single_threaded() -> bool {
    fs::read_dir("/proc/self/task").is_ok_and(|tasks| tasks.count() == 1)
}

/// Sets up logging to stderr with env_logger: level `info` unless `RUST_LOG` says otherwise. When
/// stderr is the journal stream systemd named in `JOURNAL_STREAM`, each line starts with its syslog
/// priority (see [`journal_prefix`]) and carries no timestamp, since the journal adds its own;
/// otherwise lines have env_logger's usual format. A second call keeps the first logger.
#[cfg(feature = "cli")]
pub(crate) fn init_logging() {
    let mut builder =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    let mut no_journald = None;
    if stderr_is_journal() {
        // Records go to the journal's native socket, with their fields; a record it cannot
        // take at all (too large, the journal gone) goes down the stream as before.
        let journal =
            crate::journald::Journald::connect(std::path::Path::new(crate::journald::SOCKET));
        let journal = journal.map_err(|e| no_journald = Some(e)).ok();
        builder
            .write_style(env_logger::WriteStyle::Never)
            .format(move |out, record| {
                if let Some(journal) = &journal
                    && journal.send(record).is_ok()
                {
                    return Ok(());
                }
                let text =
                    journal_lines(record.level(), record.target(), &record.args().to_string());
                out.write_all(text.as_bytes())
            });
    }
    // Only a logger already installed makes this fail, and keeping that one is what is wanted.
    let _ = builder.try_init();
    if let Some(e) = no_journald {
        log::info!(
            "{}: {e}; logging to stderr, without structured fields",
            crate::journald::SOCKET
        );
    }
}

/// The syslog priority prefix the journal reads from the start of a line: `<3>` error, `<4>`
/// warning, `<6>` info, `<7>` debug and trace.
#[cfg(feature = "cli")]
pub(crate) fn journal_prefix(level: log::Level) -> &'static str {
    match level {
        log::Level::Error => "<3>",
        log::Level::Warn => "<4>",
        log::Level::Info => "<6>",
        log::Level::Debug | log::Level::Trace => "<7>",
    }
}

/// Formats one log record for the journal: `<P>target: message`, with every further line of the
/// message prefixed too, since the journal makes each line its own entry.
#[cfg(feature = "cli")]
fn journal_lines(level: log::Level, target: &str, message: &str) -> String {
    let prefix = journal_prefix(level);
    let mut text = format!("{prefix}{target}: ");
    for (index, line) in message.split('\n').enumerate() {
        if index > 0 {
            text.push_str(prefix);
        }
        text.push_str(line);
        text.push('\n');
    }
    text
}

/// Parses `JOURNAL_STREAM`, `device:inode` in decimal.
#[cfg(feature = "cli")]
fn parse_journal_stream(value: &str) -> Option<(dev_t, ino_t)> {
    let (device, inode) = value.split_once(':')?;
    Some((device.parse().ok()?, inode.parse().ok()?))
}

/// Whether stderr is the journal stream systemd connected: `JOURNAL_STREAM` alone is not enough,
/// since a child of a service inherits it even when its stderr goes elsewhere.
#[cfg(feature = "cli")]
fn stderr_is_journal() -> bool {
    is_journal_stream(env::var("JOURNAL_STREAM").ok().as_deref(), io::stderr())
}

/// Whether `file` is the stream a `JOURNAL_STREAM` value of `value` names.
#[cfg(feature = "cli")]
fn is_journal_stream(value: Option<&str>, file: impl AsFd) -> bool {
    let Some(expected) = value.and_then(parse_journal_stream) else {
        return false;
    };
    nix::sys::stat::fstat(file).is_ok_and(|stat| (stat.st_dev, stat.st_ino) == expected)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};

    #[test]
    fn notify_socket_values() {
        let path = |p: &str| Some(NotifyAddress::Path(PathBuf::from(p)));
        let cases = [
            ("/run/systemd/notify", path("/run/systemd/notify")),
            ("@/org/freedesktop/systemd1/notify/1", {
                Some(NotifyAddress::Abstract(
                    b"/org/freedesktop/systemd1/notify/1".to_vec(),
                ))
            }),
            ("@x", Some(NotifyAddress::Abstract(b"x".to_vec()))),
            ("@", None),
            ("", None),
            ("run/notify", None),
            ("vsock:2:1234", None),
        ];
        for (value, expected) in cases {
            assert_eq!(parse_notify_socket(value).ok(), expected, "{value:?}");
        }
        let err = parse_notify_socket("relative").expect_err("relative path");
        assert_eq!(
            err.to_string(),
            "invalid NOTIFY_SOCKET \"relative\": it is neither an absolute path nor an @abstract name"
        );
    }

    #[test]
    fn overlong_socket_address_is_refused() {
        for address in [
            NotifyAddress::Path(PathBuf::from(format!("/{}", "a".repeat(200)))),
            NotifyAddress::Abstract(vec![b'a'; 200]),
        ] {
            let err = Notifier::new(address, None).expect_err("too long");
            assert!(matches!(err, NotifyError::InvalidSocket { .. }), "{err}");
        }
    }

    #[test]
    fn watchdog_values() {
        let secs = |s| Ok(Some(Duration::from_secs(s)));
        type Case<'a> = (
            Option<&'a str>,
            Option<&'a str>,
            Result<Option<Duration>, &'a str>,
        );
        let cases: Vec<Case<'_>> = vec![
            (None, None, Ok(None)),
            (None, Some("42"), Ok(None)),
            (Some("30000000"), None, secs(30)),
            (Some("30000000"), Some("42"), secs(30)),
            (Some("30000000"), Some("43"), Ok(None)),
            (Some("0"), None, Err("WATCHDOG_USEC")),
            (Some("-5"), None, Err("WATCHDOG_USEC")),
            (Some("30s"), None, Err("WATCHDOG_USEC")),
            (Some(""), None, Err("WATCHDOG_USEC")),
            (Some("18446744073709551616"), None, Err("WATCHDOG_USEC")),
            (Some("30000000"), Some("0"), Err("WATCHDOG_PID")),
            (Some("30000000"), Some("x"), Err("WATCHDOG_PID")),
        ];
        for (usec, pid, expected) in cases {
            let got = parse_watchdog(usec, pid, 42).map_err(|e| match e {
                NotifyError::InvalidWatchdog { variable, .. } => variable,
                other => panic!("unexpected error {other}"),
            });
            assert_eq!(got, expected, "{usec:?} {pid:?}");
        }
    }

    #[test]
    fn status_is_one_line() {
        let cases = [
            ("watching 3 units", "STATUS=watching 3 units"),
            ("a\nb\0c", "STATUS=a b c"),
            ("", "STATUS="),
        ];
        for (text, expected) in cases {
            assert_eq!(status_message(text), expected);
        }
    }

    /// Receives every datagram waiting on `socket`.
    fn drain(socket: &UnixDatagram) -> Vec<String> {
        socket.set_nonblocking(true).expect("set nonblocking");
        let mut buffer = [0u8; 512];
        let mut got = Vec::new();
        while let Ok(n) = socket.recv(&mut buffer) {
            got.push(String::from_utf8_lossy(&buffer[..n]).into_owned());
        }
        got
    }

    #[test]
    fn sends_exact_datagrams_to_a_path_socket() {
        let dir = tempfile::tempdir().expect("create temporary directory");
        let path = dir.path().join("notify");
        let manager = UnixDatagram::bind(&path).expect("bind manager socket");
        let value = path.to_str().expect("temporary path is UTF-8");
        let watchdog =
            parse_watchdog(Some("30000000"), None, std::process::id()).expect("valid watchdog");
        let notifier = Notifier::new(
            parse_notify_socket(value).expect("valid socket path"),
            watchdog,
        )
        .expect("notifier");
        assert_eq!(notifier.watchdog_interval(), Some(Duration::from_secs(15)));
        notifier.ready().expect("ready");
        notifier.status("watching 2 units\nnow").expect("status");
        notifier.ping().expect("ping");
        notifier.stopping().expect("stopping");
        assert_eq!(
            drain(&manager),
            [
                "READY=1",
                "STATUS=watching 2 units now",
                "WATCHDOG=1",
                "STOPPING=1"
            ]
        );
    }

    #[test]
    fn sends_to_an_abstract_socket() {
        let name = format!("exitproof-test-notify-{}", std::process::id());
        let address = SocketAddr::from_abstract_name(name.as_bytes()).expect("abstract address");
        let manager = UnixDatagram::bind_addr(&address).expect("bind abstract manager socket");
        let notifier = Notifier::new(
            parse_notify_socket(&format!("@{name}")).expect("valid abstract name"),
            None,
        )
        .expect("notifier");
        assert_eq!(notifier.watchdog_interval(), None);
        notifier.ready().expect("ready");
        assert_eq!(drain(&manager), ["READY=1"]);
    }

    #[test]
    fn send_failures_are_errors_not_blocks() {
        let dir = tempfile::tempdir().expect("create temporary directory");
        let path = dir.path().join("notify");
        let missing = Notifier::new(NotifyAddress::Path(path.clone()), None).expect("notifier");
        let err = missing.ready().expect_err("nobody listens");
        assert!(
            matches!(
                err,
                NotifyError::Send {
                    source: Errno::ENOENT,
                    variable: "READY",
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "cannot send READY to the notify socket {}: ENOENT: No such file or directory",
                path.display()
            )
        );
        // A manager that never reads: its queue fills and sends fail with EAGAIN instead of
        // blocking. The kernel queues at most a few hundred datagrams; the bound only keeps a
        // broken implementation finite.
        let _manager = UnixDatagram::bind(&path).expect("bind manager socket");
        let notifier = Notifier::new(NotifyAddress::Path(path), None).expect("notifier");
        let full = (0..100_000).find_map(|_| notifier.ping().err());
        assert!(
            matches!(
                full,
                Some(NotifyError::Send {
                    source: Errno::EAGAIN,
                    ..
                })
            ),
            "{full:?}"
        );
    }

    #[cfg(feature = "cli")]
    #[test]
    fn journal_prefixes() {
        let cases = [
            (log::Level::Error, "<3>"),
            (log::Level::Warn, "<4>"),
            (log::Level::Info, "<6>"),
            (log::Level::Debug, "<7>"),
            (log::Level::Trace, "<7>"),
        ];
        for (level, prefix) in cases {
            assert_eq!(journal_prefix(level), prefix, "{level}");
        }
    }

    #[cfg(feature = "cli")]
    #[test]
    fn journal_lines_prefix_every_line() {
        let cases = [
            (
                log::Level::Info,
                "listening",
                "<6>exitproof::agent: listening\n",
            ),
            (
                log::Level::Warn,
                "two\nlines",
                "<4>exitproof::agent: two\n<4>lines\n",
            ),
        ];
        for (level, message, expected) in cases {
            assert_eq!(journal_lines(level, "exitproof::agent", message), expected);
        }
    }

    #[cfg(feature = "cli")]
    #[test]
    fn journal_stream_values() {
        let cases = [
            ("8:1234", Some((8, 1234))),
            ("0:0", Some((0, 0))),
            ("8", None),
            ("8:", None),
            (":1", None),
            ("a:b", None),
            ("8:1:2", None),
        ];
        for (value, expected) in cases {
            assert_eq!(parse_journal_stream(value), expected, "{value:?}");
        }
    }

    #[cfg(feature = "cli")]
    #[test]
    fn journal_stream_must_name_the_file_itself() {
        let file = tempfile::tempfile().expect("create temporary file");
        let other = tempfile::tempfile().expect("create temporary file");
        let stat = nix::sys::stat::fstat(&file).expect("fstat temporary file");
        let own = format!("{}:{}", stat.st_dev, stat.st_ino);
        assert!(is_journal_stream(Some(&own), &file));
        assert!(!is_journal_stream(Some(&own), &other));
        assert!(!is_journal_stream(None, &file));
        assert!(!is_journal_stream(Some("garbage"), &file));
    }
}
