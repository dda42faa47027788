//! The polling contender: the design exitproof replaces, implemented inside the bench as a
//! baseline and labelled as such. It is not a mode of the agent.
//!
//! Faithful to that design (docs/replaced-design.md): every watched unit is polled every
//! interval; its state comes from a spawned `systemctl show -p ActiveState -p InvocationID UNIT`,
//! its cgroup from a read of `cgroup.events`, and the decision from the very same rules (it
//! drives a [`UnitProof`] per unit). That design ran one goroutine per unit; here each round
//! spawns the `systemctl`s of every unwatched-yet-unproven unit at once.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::BenchError;
use crate::cgroup::read_events_file;
use crate::clock::monotonic_ns;
use crate::proof::{Input, Output, UnitProof, UnitState};
use crate::systemd::Bus;

struct PolledUnit {
    unit: String,
    cgroup_dir: PathBuf,
    proof: UnitProof,
}

#[derive(Default)]
struct Shared {
    added: Vec<PolledUnit>,
    proven: HashMap<String, u64>,
}

/// The running polling contender.
pub struct Poller {
    shared: Arc<Mutex<Shared>>,
    stop: Arc<AtomicBool>,
    tid: Arc<AtomicI32>,
    thread: Option<JoinHandle<()>>,
}

fn lock(shared: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Poller {
    /// Starts polling every `interval` on its own thread.
    pub fn start(bus: Bus, interval: Duration) -> Result<Poller, BenchError> {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let tid = Arc::new(AtomicI32::new(0));
        let thread = {
            let (shared, stop, tid) = (shared.clone(), stop.clone(), tid.clone());
            std::thread::Builder::new()
                .name("bench poller".into())
                .spawn(move || {
                    tid.store(nix::unistd::gettid().as_raw(), Ordering::Relaxed);
                    poll_loop(bus, interval, &shared, &stop);
                })
                .map_err(|e| BenchError::Io("start the poller thread".into(), e))?
        };
        Ok(Poller {
            shared,
            stop,
            tid,
            thread: Some(thread),
        })
    }

    /// Starts polling `units`: (unit, our invocation, the cgroup directory).
    pub fn watch(&self, units: Vec<(String, String, PathBuf)>) {
        let mut shared = lock(&self.shared);
        for (unit, invocation, cgroup_dir) in units {
            shared.added.push(PolledUnit {
                unit,
                cgroup_dir,
                proof: UnitProof::new(invocation),
            });
        }
    }

    /// When the poller proved `unit`, if it has.
    pub fn proven(&self, unit: &str) -> Option<u64> {
        lock(&self.shared).proven.get(unit).copied()
    }

    /// The poller thread's own CPU time so far, in nanoseconds (its `systemctl`s are children
    /// of the process and counted apart, see `super::children_cpu_ns`).
    pub fn thread_cpu_ns(&self) -> u64 {
        let tid = self.tid.load(Ordering::Relaxed);
        super::schedstat_ns(&format!("/proc/self/task/{tid}/schedstat")).unwrap_or(0)
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn poll_loop(bus: Bus, interval: Duration, shared: &Mutex<Shared>, stop: &AtomicBool) {
    let mut units: Vec<PolledUnit> = Vec::new();
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now < next {
            // Sleeping is the design being measured: one poll per unit per interval. Short
            // naps keep a stop request prompt.
            std::thread::sleep((next - now).min(Duration::from_millis(50)));
            continue;
        }
        next = now + interval;
        units.append(&mut lock(shared).added);
        let children: Vec<_> = units
            .iter()
            .map(|u| {
                let mut command = Command::new("systemctl");
                if bus == Bus::User {
                    command.arg("--user");
                }
                command
                    .args(["show", "-p", "ActiveState", "-p", "InvocationID", &u.unit])
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
            })
            .collect();
        let mut proven = Vec::new();
        for (unit, child) in units.iter_mut().zip(children) {
            let state = child
                .and_then(|c| c.wait_with_output())
                .ok()
                .filter(|out| out.status.success())
                .and_then(|out| parse_show(&String::from_utf8_lossy(&out.stdout)));
            // A failed systemctl is not a state: it is logged and decides nothing.
            let Some(state) = state else { continue };
            let now = Instant::now();
            unit.proof.handle_input(Input::State(state), now);
            while let Some(output) = unit.proof.poll_output() {
                match output {
                    Output::ReadCgroup => {
                        let reading = read_events_file(&unit.cgroup_dir.join("cgroup.events"));
                        unit.proof.handle_input(Input::Cgroup(reading), now);
                    }
                    Output::Proven(_) => proven.push((unit.unit.clone(), monotonic_ns())),
                    // The baseline never stops a unit, so it is never asked to count leftovers.
                    Output::StopUnit(_) | Output::Log(..) | Output::CountLeftovers => {}
                }
            }
        }
        units.retain(|u| u.proof.proof().is_none());
        lock(shared).proven.extend(proven);
    }
}

/// Parses `systemctl show -p ActiveState -p InvocationID` output.
fn parse_show(text: &str) -> Option<UnitState> {
    let mut active_state = None;
    let mut invocation = None;
    for line in text.lines() {
        match line.split_once('=') {
            Some(("ActiveState", v)) => active_state = Some(v.to_owned()),
            Some(("InvocationID", v)) => invocation = Some(v.to_owned()),
            _ => {}
        }
    }
    // A read (`systemctl show` is one) never tells a starting invocation's `inactive`.
    Some(UnitState {
        active_state: active_state?,
        invocation: invocation?,
        starting: false,
    })
}

#[cfg(test)]
mod tests {
    use super::parse_show;

    #[test]
    fn systemctl_show_output_parses() {
        let state = parse_show("ActiveState=active\nInvocationID=abc\n").unwrap();
        assert_eq!(
            (state.active_state.as_str(), state.invocation.as_str()),
            ("active", "abc")
        );
        let state = parse_show("InvocationID=\nActiveState=inactive\n").unwrap();
        assert_eq!(
            (state.active_state.as_str(), state.invocation.as_str()),
            ("inactive", "")
        );
        assert!(parse_show("ActiveState=active\n").is_none());
        assert!(parse_show("").is_none());
    }
}
