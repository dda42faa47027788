//! The agent contender: the `exitproof` agent as a child process of the bench, its control
//! connection, and the proofs its event stream reported.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::setup::{BenchConfig, StartedUnit, unit_name};
use super::{BenchError, reap, schedstat_ns};
use crate::control::client::Client;
use crate::control::protocol::{self, Request, WatchArgs};
use crate::control::wire::{AgentStats, WatchAnswer};
use crate::systemd::Bus;

/// The agent contender, a child process of the bench.
pub(super) struct AgentChild {
    child: Child,
    socket: PathBuf,
}

impl AgentChild {
    fn start(config: &BenchConfig) -> Result<AgentChild, BenchError> {
        std::fs::create_dir_all(&config.work_dir)
            .map_err(|e| BenchError::Io(format!("create {}", config.work_dir.display()), e))?;
        let socket = config.work_dir.join("agent.sock");
        let log_path = config.work_dir.join("agent.log");
        let log = std::fs::File::create(&log_path)
            .map_err(|e| BenchError::Io(format!("create {}", log_path.display()), e))?;
        let mut command = Command::new(&config.agent_binary);
        command
            .arg("agent")
            .arg("--socket")
            .arg(&socket)
            .arg("--state-dir")
            .arg(state_dir(config));
        if config.bus == Bus::User {
            command.arg("--user");
        }
        let child = command
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| BenchError::Io(format!("run {}", config.agent_binary.display()), e))?;
        let mut agent = AgentChild { child, socket };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Client::connect(&agent.socket).is_err() {
            if !matches!(agent.child.try_wait(), Ok(None)) || Instant::now() > deadline {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                return Err(BenchError::Failed(format!(
                    "the agent did not start: {}",
                    log.trim()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(agent)
    }

    /// The agent's own figures (`stats`), `None` if it does not answer.
    pub(super) fn stats(&self) -> Option<AgentStats> {
        Client::connect(&self.socket).ok()?.stats().ok()
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A field of the agent's `/proc/PID/<file>` (`status`, `smaps_rollup`), its unit dropped.
    pub(super) fn proc_field(&self, file: &str, field: &str) -> Option<u64> {
        let text = std::fs::read_to_string(format!("/proc/{}/{file}", self.pid())).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
    }

    pub(super) fn cpu_ns(&self) -> u64 {
        schedstat_ns(&format!("/proc/{}/schedstat", self.pid())).unwrap_or(0)
    }
}

/// The agent's state directory, empty: each phase's agent starts with no watches.
fn state_dir(config: &BenchConfig) -> PathBuf {
    let dir = config
        .state_dir
        .clone()
        .unwrap_or_else(|| config.work_dir.join("state"));
    for file in ["state.json", "state.journal"] {
        let _ = std::fs::remove_file(dir.join(file));
    }
    dir
}

impl Drop for AgentChild {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        reap(&mut self.child);
    }
}

/// The agent's event stream, read on a thread: unit -> proven_mono_ns.
fn follow_events(socket: &Path) -> Result<Arc<Mutex<HashMap<String, u64>>>, BenchError> {
    let events = Client::connect(socket)
        .and_then(Client::events)
        .map_err(BenchError::Control)?;
    let proven: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let sink = proven.clone();
    std::thread::Builder::new()
        .name("bench events".into())
        .spawn(move || {
            for event in events.map_while(Result::ok) {
                sink.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(event.unit, event.proven_mono_ns);
            }
        })
        .map_err(|e| BenchError::Io("start the events thread".into(), e))?;
    Ok(proven)
}

/// The agent with its control connection and what its event stream said.
pub(super) struct AgentContender {
    pub(super) child: AgentChild,
    client: Client,
    pub(super) proven: Arc<Mutex<HashMap<String, u64>>>,
}

impl AgentContender {
    pub(super) fn start(config: &BenchConfig) -> Result<AgentContender, BenchError> {
        let child = AgentChild::start(config)?;
        let proven = follow_events(&child.socket)?;
        let client = Client::connect(&child.socket).map_err(BenchError::Control)?;
        Ok(AgentContender {
            child,
            client,
            proven,
        })
    }

    /// Watches every unit, the requests pipelined on one connection.
    pub(super) fn watch(&mut self, units: &[StartedUnit]) -> Result<(), BenchError> {
        for unit in units {
            let name = unit_name(&unit.name)?;
            let request = Request {
                id: None,
                command: protocol::Command::Watch(WatchArgs::new(name)),
            };
            self.client.send(&request).map_err(BenchError::Control)?;
        }
        for _ in units {
            self.client
                .receive::<WatchAnswer>()
                .map_err(BenchError::Control)?;
        }
        Ok(())
    }

    pub(super) fn proven(&self) -> HashMap<String, u64> {
        self.proven
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Keeps the agent's list to the units of the round under way.
    pub(super) fn unwatch(&mut self, unit: &str) {
        if let Ok(unit) = unit_name(unit) {
            let _ = self.client.unwatch(&unit);
        }
    }
}
