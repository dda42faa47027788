//! One benchmark run: in each phase, start the phase's contenders, then per round start N
//! transient units, have the contenders watch them, measure an idle window (first round), kill
//! them through `cgroup.kill` on the kill schedule, and collect who knew when.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::process::Command;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::agent::AgentContender;
use super::observer::{Arm, Observer};
use super::poll::Poller;
use super::sample::{BenchRun, Phase, Resources, UnitSample};
use super::schedule::kill_offsets;
pub use super::setup::BenchConfig;
use super::setup::StartedUnit;
use super::{BenchError, METHOD_TIMEOUT, children_cpu_ns};
use crate::cgroup::cgroup2_mount;
use crate::clock::monotonic_ns;
use crate::systemd::manager::{SYSTEMD, start_transient_service};
use crate::systemd::read::read_unit;
use crate::systemd::runtime::MioRuntime;
use crate::systemd::snapshot::ReadKind;
use crate::systemd::{Bus, connect};

/// How long a round may take, once every kill is done, before the missing proofs are recorded
/// as missing.
fn round_timeout(config: &BenchConfig) -> Duration {
    Duration::from_secs(60).max(config.poll_interval * 10)
}

/// The contenders of one phase: the agent, the poller, or both.
struct Contenders {
    agent: Option<AgentContender>,
    poller: Option<Poller>,
}

impl Contenders {
    fn start(phase: Phase, config: &BenchConfig) -> Result<Contenders, BenchError> {
        let agent = phase
            .has_agent()
            .then(|| AgentContender::start(config))
            .transpose()?;
        let poller = phase
            .has_poller()
            .then(|| Poller::start(config.bus, config.poll_interval))
            .transpose()?;
        Ok(Contenders { agent, poller })
    }

    fn watch(&mut self, units: &[StartedUnit], cgroup_root: &Path) -> Result<(), BenchError> {
        if let Some(agent) = &mut self.agent {
            agent.watch(units)?;
        }
        if let Some(poller) = &self.poller {
            poller.watch(
                units
                    .iter()
                    .map(|u| {
                        (
                            u.name.clone(),
                            u.invocation.clone(),
                            cgroup_root.join(u.cgroup.trim_start_matches('/')),
                        )
                    })
                    .collect(),
            );
        }
        Ok(())
    }

    fn cpu(&self) -> CpuMark {
        CpuMark {
            agent_ns: self.agent.as_ref().map_or(0, |a| a.child.cpu_ns()),
            poll_thread_ns: self.poller.as_ref().map_or(0, Poller::thread_cpu_ns),
            children_ns: children_cpu_ns(),
        }
    }
}

/// CPU used by the contenders between two instants.
#[derive(Clone, Copy, Default)]
struct CpuMark {
    agent_ns: u64,
    poll_thread_ns: u64,
    children_ns: u64,
}

impl CpuMark {
    fn since(self, start: CpuMark) -> CpuMark {
        CpuMark {
            agent_ns: self.agent_ns.saturating_sub(start.agent_ns),
            poll_thread_ns: self.poll_thread_ns.saturating_sub(start.poll_thread_ns),
            children_ns: self.children_ns.saturating_sub(start.children_ns),
        }
    }

    fn add(&mut self, other: CpuMark) {
        self.agent_ns += other.agent_ns;
        self.poll_thread_ns += other.poll_thread_ns;
        self.children_ns += other.children_ns;
    }
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn ms_of(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The bench's own connection to systemd, to start units and read them.
struct Manager {
    poll: mio::Poll,
    runtime: MioRuntime,
    conn: zbus::Connection,
}

impl Manager {
    fn connect(bus: Bus) -> Result<Manager, BenchError> {
        let mut poll = mio::Poll::new().map_err(|e| BenchError::Io("create a poll".into(), e))?;
        let runtime = MioRuntime::new(poll.registry(), mio::Token(0), 16..(1 << 20))
            .map_err(|e| BenchError::Io("create a runtime".into(), e))?;
        let (conn, subscription) = connect(&runtime, &mut poll, bus, METHOD_TIMEOUT, None)
            .and_then(|(conn, subscribed)| Ok((conn, subscribed.into_systemd()?)))
            .map_err(BenchError::Connect)?;
        // This connection only makes calls; undrained signal streams would stall its replies.
        drop(subscription);
        Ok(Manager {
            poll,
            runtime,
            conn,
        })
    }

    /// Starts `names` as transient `sleep` services and waits until every one is active.
    fn start_units(&mut self, names: &[String]) -> Result<Vec<StartedUnit>, BenchError> {
        let conn = &self.conn;
        self.runtime
            .block_on(&mut self.poll, async {
                for name in names {
                    start_transient_service(conn, name, &["/bin/sleep", "100000"]).await?;
                }
                Ok::<_, crate::systemd::manager::ManagerError>(())
            })
            .map_err(|e| BenchError::Io("run the bus".into(), e))?
            .map_err(BenchError::Manager)?;
        wait_active(&self.runtime, &mut self.poll, &self.conn, names)
    }
}

/// Kills `units` through their `cgroup.kill`, unit `i` at `offsets[i]` from now; returns each
/// unit's `t_kill` (taken just before its write).
fn kill_on_schedule(
    units: &[StartedUnit],
    offsets: &[Duration],
    cgroup_root: &Path,
) -> Result<Vec<u64>, BenchError> {
    let start = Instant::now();
    let mut kills = Vec::with_capacity(units.len());
    for (unit, offset) in units.iter().zip(offsets) {
        let due = start + *offset;
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        let kill = cgroup_root
            .join(unit.cgroup.trim_start_matches('/'))
            .join("cgroup.kill");
        kills.push(monotonic_ns());
        std::fs::write(&kill, "1")
            .map_err(|e| BenchError::Io(format!("write {}", kill.display()), e))?;
    }
    Ok(kills)
}

/// Runs the benchmark and returns everything it measured.
pub fn run(config: &BenchConfig) -> Result<BenchRun, BenchError> {
    if config.units == 0 || config.rounds == 0 {
        return Err(BenchError::Failed(
            "--units and --rounds must be at least 1".into(),
        ));
    }
    let machine = machine();
    let mut manager = Manager::connect(config.bus)?;
    let cgroup_root = cgroup2_mount().map_err(|e| BenchError::Failed(e.to_string()))?;
    let offsets = kill_offsets(config.units, config.kill_interval, config.seed);

    let mut samples = Vec::new();
    let mut event = Resources::default();
    let mut poll = Resources::default();
    let mut agent_loop = None;
    for &phase in config.mode.phases() {
        let mut contenders = Contenders::start(phase, config)?;
        // An observer per phase, subscribed after the contenders and running at a higher
        // priority (see `observer::observe`): started before them, it stamped systemd's signal
        // after the agent's proof at the median (by 0.05 to 0.08 ms); started after, it did not.
        let mut observer = Observer::start(&config.bench_binary, config.bus)?;
        let mut idle = CpuMark::default();
        let mut rounds_cpu = CpuMark::default();
        for round in 1..=config.rounds {
            let label = format!("{} round {round}/{}", phase.name(), config.rounds);
            let names: Vec<String> = (0..config.units)
                .map(|i| {
                    format!(
                        "exitproof-bench-{}-{}-r{round}-{i}.service",
                        std::process::id(),
                        phase.name()
                    )
                })
                .collect();
            progress(&format!("{label}: starting {} units", names.len()));
            let units = manager.start_units(&names)?;
            contenders.watch(&units, &cgroup_root)?;
            let arms: Vec<Arm> = units
                .iter()
                .map(|u| Arm {
                    unit: u.name.clone(),
                    cgroup: u.cgroup.clone(),
                })
                .collect();
            observer.arm(&arms)?;

            if round == 1 && !config.idle.is_zero() {
                progress(&format!(
                    "{label}: idle window of {:?} with {} units watched",
                    config.idle,
                    units.len()
                ));
                let start = contenders.cpu();
                std::thread::sleep(config.idle);
                idle = contenders.cpu().since(start);
            }

            progress(&format!(
                "{label}: killing {} units, one every {:?}",
                units.len(),
                config.kill_interval
            ));
            let start = contenders.cpu();
            let kills = kill_on_schedule(&units, &offsets, &cgroup_root)?;
            await_round(
                &label,
                &units,
                &contenders,
                &observer,
                round_timeout(config),
            );
            rounds_cpu.add(contenders.cpu().since(start));

            let agent_proven = contenders
                .agent
                .as_ref()
                .map(AgentContender::proven)
                .unwrap_or_default();
            for (unit, t_kill_ns) in units.iter().zip(kills) {
                let observed = observer.observed(&unit.name);
                samples.push(UnitSample {
                    phase,
                    round,
                    unit: unit.name.clone(),
                    t_kill_ns,
                    t_cgroup_ns: observed.t_cgroup_ns,
                    t_signal_ns: observed.t_signal_ns,
                    t_event_ns: agent_proven.get(&unit.name).copied(),
                    t_poll_ns: contenders
                        .poller
                        .as_ref()
                        .and_then(|p| p.proven(&unit.name)),
                });
                if let Some(agent) = &mut contenders.agent {
                    agent.unwatch(&unit.name);
                }
            }
        }
        if let Some(agent) = &contenders.agent {
            agent_loop = agent.child.stats().map(|stats| stats.event_loop);
            event = Resources {
                idle_cpu_ms: ms(idle.agent_ns),
                round_cpu_ms: ms(rounds_cpu.agent_ns),
                rss_kib: agent.child.proc_field("status", "VmHWM:"),
                pss_kib: agent.child.proc_field("smaps_rollup", "Pss:"),
                anon_kib: agent.child.proc_field("smaps_rollup", "Anonymous:"),
                threads: agent.child.proc_field("status", "Threads:"),
                spawned_cpu_ms: None,
            };
        }
        if contenders.poller.is_some() {
            poll = Resources {
                idle_cpu_ms: ms(idle.poll_thread_ns + idle.children_ns),
                round_cpu_ms: ms(rounds_cpu.poll_thread_ns + rounds_cpu.children_ns),
                rss_kib: None,
                pss_kib: None,
                anon_kib: None,
                threads: Some(1),
                spawned_cpu_ms: Some(ms(idle.children_ns + rounds_cpu.children_ns)),
            };
        }
    }
    if std::io::stderr().is_terminal() {
        eprintln!();
    }
    Ok(BenchRun {
        units: config.units,
        rounds: config.rounds,
        mode: config.mode,
        kill_interval_ms: ms_of(config.kill_interval),
        seed: config.seed,
        poll_interval_ms: ms_of(config.poll_interval),
        idle_ms: ms_of(config.idle),
        machine,
        date: command_line("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]),
        samples,
        event,
        poll,
        state_dir: config
            .state_dir
            .as_ref()
            .map(|dir| dir.display().to_string()),
        agent_loop,
    })
}

/// Waits until every contender of the phase has proved every unit and the observer has seen
/// each one's signal and empty cgroup, or `timeout` has passed.
fn await_round(
    label: &str,
    units: &[StartedUnit],
    contenders: &Contenders,
    observer: &Observer,
    timeout: Duration,
) {
    let deadline = Instant::now() + timeout;
    let all = units.len();
    loop {
        let agent_done = contenders.agent.as_ref().map(|agent| {
            let proven = agent.proven.lock().unwrap_or_else(PoisonError::into_inner);
            units
                .iter()
                .filter(|u| proven.contains_key(&u.name))
                .count()
        });
        let poll_done = contenders.poller.as_ref().map(|poller| {
            units
                .iter()
                .filter(|u| poller.proven(&u.name).is_some())
                .count()
        });
        let seen = units
            .iter()
            .filter(|u| {
                let o = observer.observed(&u.name);
                o.t_cgroup_ns.is_some() && o.t_signal_ns.is_some()
            })
            .count();
        let proven: Vec<String> = [("event", agent_done), ("poll", poll_done)]
            .into_iter()
            .filter_map(|(name, done)| Some(format!("{name} {}/{all}", done?)))
            .collect();
        progress(&format!(
            "{label}: proven by {}; observed {seen}/{all}",
            proven.join(", ")
        ));
        let finished = [agent_done, poll_done]
            .into_iter()
            .flatten()
            .all(|d| d == all);
        if (finished && seen == all) || Instant::now() > deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until every unit is active with a cgroup.
fn wait_active(
    runtime: &MioRuntime,
    poll: &mut mio::Poll,
    conn: &zbus::Connection,
    names: &[String],
) -> Result<Vec<StartedUnit>, BenchError> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut ready = Vec::with_capacity(names.len());
    for name in names {
        loop {
            let snapshot = runtime
                .block_on(poll, read_unit(conn, SYSTEMD, name, ReadKind::Get, None))
                .map_err(|e| BenchError::Io("run the bus".into(), e))?
                .map_err(BenchError::Manager)?;
            if snapshot.active_state == "active" && !snapshot.control_group.is_empty() {
                ready.push(StartedUnit {
                    name: name.clone(),
                    invocation: snapshot.invocation,
                    cgroup: snapshot.control_group,
                });
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

/// The machine, as a person would describe it: CPU model, cores, kernel, and how loaded it was
/// as the run began (others' work skews the numbers).
fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_owned())
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = command_line("uname", &["-r"]);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    format!(
        "{model}, {cores} cores, Linux {kernel}, load average {} at start",
        load.join(" ")
    )
}

/// The JSON a caller may want besides the files: the summary only.
pub fn summary_value(run: &BenchRun) -> Value {
    super::report::summary_json(run)["summary"].clone()
}
