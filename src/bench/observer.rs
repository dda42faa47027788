//! The benchmark's independent observer: a process of its own (`exitproof-bench --observer`)
//! whose one loop does nothing but watch, with its own subscribed D-Bus connection and its own
//! inotify. It timestamps when systemd says a unit is terminal (`t_signal`) and when its cgroup
//! is empty or gone (`t_cgroup`), and shares nothing with the contenders: it is the referee and
//! the floor, so it must never be the slow party (on a thread of the bench it shared a process
//! with the poller's forks and came in later than the agent).
//!
//! The bench writes one [`Arm`] JSON line per unit to its stdin and reads one [`Report`] JSON
//! line per thing seen from its stdout; closing its stdin ends it.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::os::fd::AsFd;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use serde::{Deserialize, Serialize};
use zbus::export::futures_core::Stream;

use super::{BenchError, METHOD_TIMEOUT};
use crate::cgroup::{CgroupReading, CgroupWatcher, Notice, cgroup2_mount};
use crate::clock::monotonic_ns;
use crate::systemd::Bus;
use crate::systemd::runtime::MioRuntime;
use crate::systemd::signal::{self, SystemdSignal, unit_path};

const WAKER: Token = Token(0);
const INOTIFY: Token = Token(1);
const STDIN: Token = Token(2);
/// How long the observer may take to connect, or to watch the units of one arm.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// A unit for the observer to watch: one JSON line on its stdin.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Arm {
    pub unit: String,
    /// The unit's ControlGroup, as systemd reports it.
    pub cgroup: String,
}

/// What the observer tells the bench: one JSON line on its stdout.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Report {
    /// Connected to the bus and subscribed.
    Ready,
    /// Watching the unit's cgroup, read once after the watch was set.
    Armed { unit: String },
    /// The unit's cgroup said `populated 0` or was gone.
    Cgroup { unit: String, at_ns: u64 },
    /// systemd signalled a terminal ActiveState, or the unit's removal.
    Signal { unit: String, at_ns: u64 },
}

/// What the observer saw of one unit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    pub t_cgroup_ns: Option<u64>,
    pub t_signal_ns: Option<u64>,
}

#[derive(Default)]
struct Shared {
    ready: bool,
    /// The observer's stdout closed: it exited.
    ended: bool,
    armed: usize,
    observed: HashMap<String, Observed>,
}

/// The bench's handle on the observer process.
pub struct Observer {
    child: Child,
    stdin: Option<ChildStdin>,
    shared: Arc<(Mutex<Shared>, Condvar)>,
    reader: Option<JoinHandle<()>>,
    /// Units sent to be armed so far.
    sent: usize,
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Observer {
    /// Starts `program --observer` (the bench's own binary) on `bus` and waits until it is
    /// subscribed.
    pub fn start(program: &Path, bus: Bus) -> Result<Observer, BenchError> {
        let mut command = Command::new(program);
        command.arg("--observer");
        if bus == Bus::User {
            command.arg("--user");
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| BenchError::Io(format!("run the observer {}", program.display()), e))?;
        let stdout = child.stdout.take().expect("stdout was piped");
        let shared: Arc<(Mutex<Shared>, Condvar)> = Arc::default();
        let reader = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("bench observer reports".into())
                .spawn(move || read_reports(stdout, &shared))
                .map_err(|e| BenchError::Io("start the observer's reader".into(), e))?
        };
        let observer = Observer {
            stdin: child.stdin.take(),
            child,
            shared,
            reader: Some(reader),
            sent: 0,
        };
        observer.wait_until("connect", |shared| shared.ready)?;
        Ok(observer)
    }

    /// Starts watching `units` and returns once the observer watches them all, so a kill that
    /// follows cannot slip past it.
    pub fn arm(&mut self, units: &[Arm]) -> Result<(), BenchError> {
        let mut lines = String::new();
        for arm in units {
            lines.push_str(&serde_json::to_string(arm).expect("an Arm encodes"));
            lines.push('\n');
        }
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| BenchError::Failed("the observer's stdin is closed".into()))?;
        stdin
            .write_all(lines.as_bytes())
            .and_then(|()| stdin.flush())
            .map_err(|e| BenchError::Io("send units to the observer".into(), e))?;
        self.sent += units.len();
        let target = self.sent;
        self.wait_until("watch the units", |shared| shared.armed >= target)
    }

    /// What was seen of `unit` so far.
    pub fn observed(&self, unit: &str) -> Observed {
        lock(&self.shared.0)
            .observed
            .get(unit)
            .copied()
            .unwrap_or_default()
    }

    fn wait_until(&self, what: &str, done: impl Fn(&Shared) -> bool) -> Result<(), BenchError> {
        let (mutex, changed) = &*self.shared;
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        let mut shared = lock(mutex);
        while !done(&shared) {
            let left = deadline.saturating_duration_since(Instant::now());
            if shared.ended || left.is_zero() {
                return Err(BenchError::Failed(format!(
                    "the observer did not {what} (it stopped, or took over {ANSWER_TIMEOUT:?})"
                )));
            }
            shared = changed
                .wait_timeout(shared, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        Ok(())
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        // End of input is the observer's signal to exit.
        drop(self.stdin.take());
        super::reap(&mut self.child);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

/// The bench's side: takes in the observer's reports until its stdout closes.
fn read_reports(stdout: impl Read, shared: &(Mutex<Shared>, Condvar)) {
    let (mutex, changed) = shared;
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        let Ok(report) = serde_json::from_str::<Report>(&line) else {
            continue;
        };
        let mut shared = lock(mutex);
        match report {
            Report::Ready => shared.ready = true,
            Report::Armed { .. } => shared.armed += 1,
            Report::Cgroup { unit, at_ns } => {
                let observed = shared.observed.entry(unit).or_default();
                observed.t_cgroup_ns.get_or_insert(at_ns);
            }
            Report::Signal { unit, at_ns } => {
                let observed = shared.observed.entry(unit).or_default();
                observed.t_signal_ns.get_or_insert(at_ns);
            }
        }
        changed.notify_all();
    }
    lock(mutex).ended = true;
    changed.notify_all();
}

/// The observer process's loop: until its stdin closes, watches the units it is sent and
/// reports on its stdout what it sees of them, each stamped as soon as the loop has it.
pub fn observe(bus: Bus) -> Result<(), BenchError> {
    // The referee goes first when the CPUs are busy (allowed to root; anyone else just keeps
    // the priority it has). SAFETY: setpriority only reads its arguments.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, -10) };
    let mut poll = Poll::new().map_err(|e| BenchError::Io("create a poll".into(), e))?;
    let runtime = MioRuntime::new(poll.registry(), WAKER, 16..(1 << 20))
        .map_err(|e| BenchError::Io("create a runtime".into(), e))?;
    let (_conn, subscription) =
        crate::systemd::connect(&runtime, &mut poll, bus, METHOD_TIMEOUT, None)
            .and_then(|(conn, subscribed)| Ok((conn, subscribed.into_systemd()?)))
            .map_err(BenchError::Connect)?;
    let root = cgroup2_mount().map_err(|e| BenchError::Failed(e.to_string()))?;
    let mut cgroups =
        CgroupWatcher::<usize>::new(root).map_err(|e| BenchError::Failed(e.to_string()))?;
    poll.registry()
        .register(
            &mut SourceFd(&cgroups.as_raw_fd()),
            INOTIFY,
            Interest::READABLE,
        )
        .map_err(|e| BenchError::Io("watch inotify".into(), e))?;
    let mut input = nonblocking_stdin()?;
    poll.registry()
        .register(&mut SourceFd(&0), STDIN, Interest::READABLE)
        .map_err(|e| BenchError::Io("watch stdin".into(), e))?;

    let signals: Arc<Mutex<Vec<(u64, zbus::Message)>>> = Arc::default();
    for mut stream in [subscription.units, subscription.manager] {
        let signals = signals.clone();
        zbus::runtime::traits::TaskHandle::detach(runtime.spawn(async move {
            while let Some(Ok(message)) =
                std::future::poll_fn(|cx| std::pin::Pin::new(&mut stream).poll_next(cx)).await
            {
                // Stamped as it comes off the socket, before anything else is done with it.
                let now = monotonic_ns();
                signals
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((now, message));
            }
        }));
    }

    let mut out = Reports::default();
    out.push(Report::Ready);
    out.flush()?;
    let mut units: Vec<String> = Vec::new();
    let mut by_path: HashMap<String, usize> = HashMap::new();
    let mut by_name: HashMap<String, usize> = HashMap::new();
    let mut events = Events::with_capacity(1024);
    let mut notices = Vec::new();
    let mut pending_input = Vec::new();
    loop {
        if let Err(e) = poll.poll(&mut events, runtime.timeout())
            && e.kind() != ErrorKind::Interrupted
        {
            return Err(BenchError::Io("wait for events".into(), e));
        }
        let now = monotonic_ns();
        let (mut cgroups_ready, mut input_ready) = (false, false);
        for event in events.iter() {
            match event.token() {
                INOTIFY => cgroups_ready = true,
                STDIN => input_ready = true,
                _ if runtime.owns(event.token()) => runtime.handle_event(event),
                _ => {}
            }
        }
        if cgroups_ready {
            notices.clear();
            let _ = cgroups.drain(&mut notices);
            for notice in &notices {
                let keys: Vec<usize> = match notice {
                    Notice::Changed(key) | Notice::Lost(key) => vec![*key],
                    Notice::Overflow => (0..units.len()).collect(),
                };
                for key in keys {
                    if is_empty(&cgroups, key) {
                        out.push(Report::Cgroup {
                            unit: units[key].clone(),
                            at_ns: now,
                        });
                    }
                }
            }
        }
        runtime.turn();
        let arrived = std::mem::take(&mut *signals.lock().unwrap_or_else(PoisonError::into_inner));
        for (at_ns, message) in arrived {
            let terminal_unit = match signal::decode(&message) {
                Ok(Some(SystemdSignal::UnitChanged { path, change })) => change
                    .active_state
                    .filter(|s| s == "inactive" || s == "failed")
                    .and_then(|_| by_path.get(&path).copied()),
                Ok(Some(SystemdSignal::UnitRemoved { unit })) => by_name.get(&unit).copied(),
                _ => None,
            };
            if let Some(key) = terminal_unit {
                out.push(Report::Signal {
                    unit: units[key].clone(),
                    at_ns,
                });
            }
        }
        if input_ready {
            let open = read_available(&mut input, &mut pending_input)?;
            for arm in take_lines(&mut pending_input) {
                let key = units.len();
                by_path.insert(unit_path(&arm.unit), key);
                by_name.insert(arm.unit.clone(), key);
                units.push(arm.unit.clone());
                // The watch comes before the read, so nothing between the two is missed.
                cgroups
                    .add_watches(key, &arm.cgroup)
                    .map_err(|e| BenchError::Failed(format!("observer: {e}")))?;
                if is_empty(&cgroups, key) {
                    out.push(Report::Cgroup {
                        unit: arm.unit.clone(),
                        at_ns: monotonic_ns(),
                    });
                }
                out.push(Report::Armed { unit: arm.unit });
            }
            if !open {
                return out.flush();
            }
        }
        out.flush()?;
    }
}

fn is_empty(cgroups: &CgroupWatcher<usize>, key: usize) -> bool {
    matches!(
        cgroups.read(key),
        CgroupReading::Empty | CgroupReading::Gone
    )
}

/// The observer's stdin as a non-blocking file, for the loop to read when it is readable.
fn nonblocking_stdin() -> Result<File, BenchError> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let io_error = |e| BenchError::Io("set up stdin".into(), e);
    let input = File::from(
        std::io::stdin()
            .as_fd()
            .try_clone_to_owned()
            .map_err(io_error)?,
    );
    let flags = fcntl(&input, FcntlArg::F_GETFL).map_err(|e| io_error(e.into()))?;
    fcntl(
        &input,
        FcntlArg::F_SETFL(OFlag::from_bits_retain(flags) | OFlag::O_NONBLOCK),
    )
    .map_err(|e| io_error(e.into()))?;
    Ok(input)
}

/// Appends everything `input` has to `buffer`; false once it reached its end.
fn read_available(input: &mut impl Read, buffer: &mut Vec<u8>) -> Result<bool, BenchError> {
    let mut chunk = [0u8; 8192];
    loop {
        match input.read(&mut chunk) {
            Ok(0) => return Ok(false),
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(true),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(BenchError::Io("read stdin".into(), e)),
        }
    }
}

/// Takes the complete lines off the front of `buffer` and decodes them (a line that is not an
/// [`Arm`] is skipped: only the bench writes here).
fn take_lines(buffer: &mut Vec<u8>) -> Vec<Arm> {
    let Some(end) = buffer.iter().rposition(|&b| b == b'\n') else {
        return Vec::new();
    };
    let complete: Vec<u8> = buffer.drain(..=end).collect();
    complete
        .split(|&b| b == b'\n')
        .filter_map(|line| serde_json::from_slice(line).ok())
        .collect()
}

/// Reports of one loop turn, written in one go once the turn's stamps are taken.
#[derive(Default)]
struct Reports(String);

impl Reports {
    fn push(&mut self, report: Report) {
        self.0
            .push_str(&serde_json::to_string(&report).expect("a Report encodes"));
        self.0.push('\n');
    }

    fn flush(&mut self) -> Result<(), BenchError> {
        if self.0.is_empty() {
            return Ok(());
        }
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(self.0.as_bytes())
            .and_then(|()| stdout.flush())
            .map_err(|e| BenchError::Io("write to stdout".into(), e))?;
        self.0.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_are_one_tagged_json_line_each() {
        let cases = [
            (Report::Ready, r#"{"kind":"ready"}"#),
            (
                Report::Armed {
                    unit: "a.service".into(),
                },
                r#"{"kind":"armed","unit":"a.service"}"#,
            ),
            (
                Report::Cgroup {
                    unit: "a.service".into(),
                    at_ns: 5,
                },
                r#"{"kind":"cgroup","unit":"a.service","at_ns":5}"#,
            ),
            (
                Report::Signal {
                    unit: "a.service".into(),
                    at_ns: 7,
                },
                r#"{"kind":"signal","unit":"a.service","at_ns":7}"#,
            ),
        ];
        for (report, line) in cases {
            assert_eq!(serde_json::to_string(&report).unwrap(), line);
            assert_eq!(serde_json::from_str::<Report>(line).unwrap(), report);
        }
    }

    #[test]
    fn only_complete_lines_are_taken() {
        let mut buffer =
            b"{\"unit\":\"a.service\",\"cgroup\":\"/a\"}\nnot json\n{\"unit\":\"b".to_vec();
        let arms = take_lines(&mut buffer);
        assert_eq!(
            arms,
            vec![Arm {
                unit: "a.service".into(),
                cgroup: "/a".into()
            }]
        );
        assert_eq!(buffer, b"{\"unit\":\"b");
        assert!(take_lines(&mut buffer).is_empty());
        buffer.extend_from_slice(b"\",\"cgroup\":\"/b\"}\n");
        assert_eq!(take_lines(&mut buffer)[0].unit, "b");
        assert!(buffer.is_empty());
    }

    #[test]
    fn the_reader_keeps_the_first_time_of_each() {
        let lines = concat!(
            "{\"kind\":\"ready\"}\n",
            "{\"kind\":\"cgroup\",\"unit\":\"a.service\",\"at_ns\":5}\n",
            "{\"kind\":\"armed\",\"unit\":\"a.service\"}\n",
            "{\"kind\":\"signal\",\"unit\":\"a.service\",\"at_ns\":9}\n",
            "{\"kind\":\"cgroup\",\"unit\":\"a.service\",\"at_ns\":11}\n",
        );
        let shared = (Mutex::new(Shared::default()), Condvar::new());
        read_reports(lines.as_bytes(), &shared);
        let shared = lock(&shared.0);
        assert!(shared.ready && shared.ended);
        assert_eq!(shared.armed, 1);
        assert_eq!(
            shared.observed["a.service"],
            Observed {
                t_cgroup_ns: Some(5),
                t_signal_ns: Some(9)
            }
        );
    }
}
