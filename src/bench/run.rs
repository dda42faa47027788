//! One benchmark run: start N transient units, have every contender watch them, measure an
//! idle window, kill them through `cgroup.kill`, and collect who knew when.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::observer::Observer;
use super::poll::Poller;
use super::sample::{BenchRun, Resources, UnitSample};
use super::{BenchError, METHOD_TIMEOUT, children_cpu_ns, schedstat_ns};
use crate::agent::monotonic_ns;
use crate::cgroup::cgroup2_mount;
use crate::control::client::Client;
use crate::systemd::manager::{SYSTEMD, read_unit, start_transient_service};
use crate::systemd::runtime::MioRuntime;
use crate::systemd::{Bus, connect};

/// What to run.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    pub bus: Bus,
    pub units: usize,
    pub rounds: u32,
    pub poll_interval: Duration,
    pub idle: Duration,
    /// The exitproof binary that runs the agent contender.
    pub agent_binary: PathBuf,
    /// Where the agent's socket and log go.
    pub work_dir: PathBuf,
}

/// How long a round may take before the missing proofs are recorded as missing.
fn round_timeout(config: &BenchConfig) -> Duration {
    Duration::from_secs(60).max(config.poll_interval * 10)
}

/// The agent contender, a child process of the bench.
struct AgentChild {
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
            .arg(config.work_dir.join("state"));
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

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn status_field(&self, field: &str) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
    }

    fn cpu_ns(&self) -> u64 {
        schedstat_ns(&format!("/proc/{}/schedstat", self.pid())).unwrap_or(0)
    }
}

impl Drop for AgentChild {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The agent's event stream, read on a thread: unit -> proven_mono_ns.
fn follow_events(socket: &Path) -> Result<Arc<Mutex<HashMap<String, u64>>>, BenchError> {
    let mut client = Client::connect(socket).map_err(BenchError::Control)?;
    let reply = client
        .request(&json!({"cmd": "events"}))
        .map_err(BenchError::Control)?;
    if reply["ok"] != true {
        return Err(BenchError::Failed(format!("subscribe to events: {reply}")));
    }
    let proven: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let sink = proven.clone();
    std::thread::Builder::new()
        .name("bench events".into())
        .spawn(move || {
            while let Ok(Some(line)) = client.next_line() {
                let event = &line["event"];
                if let (Some(unit), Some(at)) =
                    (event["unit"].as_str(), event["proven_mono_ns"].as_u64())
                {
                    sink.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(unit.to_owned(), at);
                }
            }
        })
        .map_err(|e| BenchError::Io("start the events thread".into(), e))?;
    Ok(proven)
}

/// CPU used by the contenders between two instants.
#[derive(Clone, Copy, Default)]
struct CpuMark {
    agent_ns: u64,
    poll_thread_ns: u64,
    children_ns: u64,
}

impl CpuMark {
    fn take(agent: &AgentChild, poller: &Poller) -> CpuMark {
        CpuMark {
            agent_ns: agent.cpu_ns(),
            poll_thread_ns: poller.thread_cpu_ns(),
            children_ns: children_cpu_ns(),
        }
    }

    fn since(self, start: CpuMark) -> CpuMark {
        CpuMark {
            agent_ns: self.agent_ns.saturating_sub(start.agent_ns),
            poll_thread_ns: self.poll_thread_ns.saturating_sub(start.poll_thread_ns),
            children_ns: self.children_ns.saturating_sub(start.children_ns),
        }
    }
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// Runs the benchmark and returns everything it measured.
pub fn run(config: &BenchConfig) -> Result<BenchRun, BenchError> {
    if config.units == 0 || config.rounds == 0 {
        return Err(BenchError::Failed(
            "--units and --rounds must be at least 1".into(),
        ));
    }
    let mut poll = mio::Poll::new().map_err(|e| BenchError::Io("create a poll".into(), e))?;
    let runtime = MioRuntime::new(poll.registry(), mio::Token(0), 16..(1 << 20))
        .map_err(|e| BenchError::Io("create a runtime".into(), e))?;
    let (conn, subscription) =
        connect(&runtime, &mut poll, config.bus, METHOD_TIMEOUT).map_err(BenchError::Connect)?;
    // This connection only makes calls; undrained signal streams would stall its replies.
    drop(subscription);
    let cgroup_root = cgroup2_mount().map_err(|e| BenchError::Failed(e.to_string()))?;
    let agent = AgentChild::start(config)?;
    let agent_proven = follow_events(&agent.socket)?;
    let mut agent_client = Client::connect(&agent.socket).map_err(BenchError::Control)?;
    let observer = Observer::start(config.bus)?;
    let poller = Poller::start(config.bus, config.poll_interval)?;

    let mut samples = Vec::new();
    let mut idle = CpuMark::default();
    let mut rounds_cpu = CpuMark::default();
    for round in 1..=config.rounds {
        let names: Vec<String> = (0..config.units)
            .map(|i| {
                format!(
                    "exitproof-bench-{}-r{round}-{i}.service",
                    std::process::id()
                )
            })
            .collect();
        progress(&format!(
            "round {round}/{}: starting {} units",
            config.rounds,
            names.len()
        ));
        runtime
            .block_on(&mut poll, async {
                for name in &names {
                    start_transient_service(&conn, name, &["/bin/sleep", "100000"]).await?;
                }
                Ok::<_, crate::systemd::manager::ManagerError>(())
            })
            .map_err(|e| BenchError::Io("run the bus".into(), e))?
            .map_err(BenchError::Manager)?;
        let units = wait_active(&runtime, &mut poll, &conn, &names)?;

        for (name, _, _) in &units {
            agent_client
                .send(&json!({"cmd": "watch", "unit": name}))
                .map_err(BenchError::Control)?;
        }
        for _ in &units {
            let reply = agent_client.next_line().map_err(BenchError::Control)?;
            if reply.as_ref().map(|r| r["ok"] == true) != Some(true) {
                return Err(BenchError::Failed(format!(
                    "the agent refused a watch: {reply:?}"
                )));
            }
        }
        poller.watch(
            units
                .iter()
                .map(|(n, inv, cg)| {
                    (
                        n.clone(),
                        inv.clone(),
                        cgroup_root.join(cg.trim_start_matches('/')),
                    )
                })
                .collect(),
        );
        observer.arm(
            &units
                .iter()
                .map(|(n, _, cg)| (n.clone(), cg.clone()))
                .collect::<Vec<_>>(),
        )?;

        if round == 1 {
            progress(&format!(
                "round 1/{}: idle window of {:?} with {} units watched",
                config.rounds,
                config.idle,
                units.len()
            ));
            let start = CpuMark::take(&agent, &poller);
            std::thread::sleep(config.idle);
            idle = CpuMark::take(&agent, &poller).since(start);
        }

        let start = CpuMark::take(&agent, &poller);
        let mut kills = Vec::with_capacity(units.len());
        for (name, _, cg) in &units {
            let t_kill = monotonic_ns();
            let kill = cgroup_root
                .join(cg.trim_start_matches('/'))
                .join("cgroup.kill");
            std::fs::write(&kill, "1")
                .map_err(|e| BenchError::Io(format!("write {}", kill.display()), e))?;
            kills.push((name.clone(), t_kill));
        }
        let deadline = Instant::now() + round_timeout(config);
        loop {
            let agent_done = {
                let proven = agent_proven.lock().unwrap_or_else(PoisonError::into_inner);
                kills.iter().filter(|(n, _)| proven.contains_key(n)).count()
            };
            let poll_done = kills
                .iter()
                .filter(|(n, _)| poller.proven(n).is_some())
                .count();
            let seen = kills
                .iter()
                .filter(|(n, _)| {
                    let o = observer.observed(n);
                    o.t_cgroup_ns.is_some() && o.t_signal_ns.is_some()
                })
                .count();
            progress(&format!(
                "round {round}/{}: proven by event {agent_done}/{n}, poll {poll_done}/{n}; observed {seen}/{n}",
                config.rounds,
                n = kills.len()
            ));
            let all = kills.len();
            if (agent_done == all && poll_done == all && seen == all) || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let spent = CpuMark::take(&agent, &poller).since(start);
        rounds_cpu.agent_ns += spent.agent_ns;
        rounds_cpu.poll_thread_ns += spent.poll_thread_ns;
        rounds_cpu.children_ns += spent.children_ns;

        let agent_proven_now = agent_proven
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for (name, t_kill) in kills {
            let observed = observer.observed(&name);
            samples.push(UnitSample {
                round,
                t_kill_ns: t_kill,
                t_cgroup_ns: observed.t_cgroup_ns,
                t_signal_ns: observed.t_signal_ns,
                t_event_ns: agent_proven_now.get(&name).copied(),
                t_poll_ns: poller.proven(&name),
                unit: name.clone(),
            });
            // Keep the agent's list to the units of the round under way.
            let _ = agent_client.request(&json!({"cmd": "unwatch", "unit": name}));
        }
    }
    if std::io::stderr().is_terminal() {
        eprintln!();
    }
    let event = Resources {
        idle_cpu_ms: ms(idle.agent_ns),
        round_cpu_ms: ms(rounds_cpu.agent_ns),
        rss_kib: agent.status_field("VmHWM:"),
        threads: agent.status_field("Threads:"),
        spawned_cpu_ms: None,
    };
    let poll_resources = Resources {
        idle_cpu_ms: ms(idle.poll_thread_ns + idle.children_ns),
        round_cpu_ms: ms(rounds_cpu.poll_thread_ns + rounds_cpu.children_ns),
        rss_kib: None,
        threads: Some(1),
        spawned_cpu_ms: Some(ms(idle.children_ns + rounds_cpu.children_ns)),
    };
    Ok(BenchRun {
        units: config.units,
        rounds: config.rounds,
        poll_interval_ms: u64::try_from(config.poll_interval.as_millis()).unwrap_or(u64::MAX),
        idle_ms: u64::try_from(config.idle.as_millis()).unwrap_or(u64::MAX),
        machine: machine(),
        date: command_line("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]),
        samples,
        event,
        poll: poll_resources,
    })
}

/// Waits until every unit is active with a cgroup; returns (unit, invocation, cgroup).
fn wait_active(
    runtime: &MioRuntime,
    poll: &mut mio::Poll,
    conn: &zbus::Connection,
    names: &[String],
) -> Result<Vec<(String, String, String)>, BenchError> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut ready = Vec::with_capacity(names.len());
    for name in names {
        loop {
            let snapshot = runtime
                .block_on(poll, read_unit(conn, SYSTEMD, name))
                .map_err(|e| BenchError::Io("run the bus".into(), e))?
                .map_err(BenchError::Manager)?;
            if snapshot.active_state == "active" && !snapshot.control_group.is_empty() {
                ready.push((name.clone(), snapshot.invocation, snapshot.control_group));
                break;
            }
            if Instant::now() > deadline {
                return Err(BenchError::Failed(format!(
                    "{name} did not become active (it is {})",
                    snapshot.active_state
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(ready)
}

/// Shows how far the run is: one line rewritten in place on a terminal, else a line per
/// change.
fn progress(line: &str) {
    static LAST: Mutex<String> = Mutex::new(String::new());
    let mut last = LAST.lock().unwrap_or_else(PoisonError::into_inner);
    if *last == line {
        return;
    }
    line.clone_into(&mut last);
    let mut err = std::io::stderr().lock();
    let _ = if err.is_terminal() {
        write!(err, "\r\x1b[2K{line}")
    } else {
        writeln!(err, "{line}")
    };
    let _ = err.flush();
}

fn command_line(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// The machine, as a person would describe it: CPU model, cores, kernel.
fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_owned())
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = command_line("uname", &["-r"]);
    format!("{model}, {cores} cores, Linux {kernel}")
}

/// The JSON a caller may want besides the files: the summary only.
pub fn summary_value(run: &BenchRun) -> Value {
    super::report::summary_json(run)["summary"].clone()
}
