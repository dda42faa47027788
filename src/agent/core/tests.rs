//! Scripted tests of the core's rules, in virtual time: each names the rule it guards.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::watch::Reads;
use super::*;
use crate::agent::saved::{SavedProcess, SavedWatch};
use crate::cgroup::procs::{GoneRoot, OnceHeld};
use crate::control::protocol::parse_request;
use crate::control::wire::{Cause, Phase};
use crate::systemd::signal::{UnitChange, unit_path};

const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const C: &str = "cccccccccccccccccccccccccccccccc";
const CLIENT: u64 = 1;

/// A core, a clock and a fake cgroup file system; synchronous outputs are answered at once,
/// the rest are kept for the test to look at.
struct Script {
    core: Core,
    now: Instant,
    cgroups: HashMap<String, CgroupReading>,
    /// Per cgroup, the pids a count of leftovers finds (none unless a test says).
    leftovers: HashMap<String, Vec<i32>>,
    /// The pids the next count of leftovers finds possibly ours but exited before a pidfd
    /// held them (none unless a test says).
    exited_before_held: Vec<i32>,
    /// How many processes each coming count's census lists but finds gone before their start
    /// is read, in turn (none once they are used up).
    vanished_before_read: VecDeque<usize>,
    /// What each coming count of leftovers holds, in turn, before `leftovers` says.
    next_counts: VecDeque<Vec<i32>>,
    /// The pids each count so far was told were held before, in order.
    counted_as_held: Vec<Vec<i32>>,
    /// What the last count of leftovers was told of the next invocation.
    counted_against: Option<NextInvocation>,
    outputs: Vec<Output>,
    serial: u32,
    /// What the saves so far add up to, as a restart would load it.
    saved: AgentState,
    /// How many cgroup reads the core asked for.
    reads: usize,
    /// What every take of an exit record finds (none unless a test says).
    exit_record: Option<ExitRecord>,
    /// How many exit records the core asked to take.
    records_taken: usize,
}

/// A process of the fake census: pid `pid`, started at tick `1000 + pid`.
fn started(pid: i32) -> ProcessStart {
    ProcessStart {
        pid,
        start_ticks: 1000 + u64::try_from(pid).unwrap_or(0),
        held_as: None,
    }
}

fn config(boot_id: &str) -> CoreConfig {
    CoreConfig {
        retain_proven: 16,
        retain_for: Duration::from_secs(3600),
        resync_interval: None,
        max_reads_in_flight: 32,
        boot_id: Some(boot_id.to_owned()),
        clock_anchor: (Instant::now(), 0),
    }
}

impl Script {
    fn new() -> Script {
        Script::restored(AgentState::default(), "boot-1")
    }

    /// `g.service` watched as generation 3 with its launch file, read active with invocation
    /// `A` and a populated cgroup.
    fn watching_generation_3() -> Script {
        let mut s = Script::new();
        s.input(Input::BusUp);
        s.cgroups
            .insert("/app.slice/g.service".into(), CgroupReading::Populated);
        s.request(r#"{"cmd":"watch","unit":"g.service","gen":3,"launch_file":"/run/g/launch-3"}"#);
        s.answer_reads(|u| Ok(snapshot(u, "active", A, "/app.slice/g.service")));
        s
    }

    fn restored(state: AgentState, boot_id: &str) -> Script {
        Script::configured(config(boot_id), state)
    }

    fn configured(config: CoreConfig, state: AgentState) -> Script {
        let now = config.clock_anchor.0;
        let mut script = Script {
            core: Core::new(config, state, now),
            now,
            cgroups: HashMap::new(),
            leftovers: HashMap::new(),
            exited_before_held: Vec::new(),
            vanished_before_read: VecDeque::new(),
            next_counts: VecDeque::new(),
            counted_as_held: Vec::new(),
            counted_against: None,
            outputs: Vec::new(),
            serial: 100,
            saved: AgentState::default(),
            reads: 0,
            exit_record: None,
            records_taken: 0,
        };
        script.drain();
        // As the driver does: a snapshot at start, which the change sets after it follow.
        script.core.save_snapshot(now);
        script.drain();
        script.outputs.retain(|o| !matches!(o, Output::Save(_)));
        script
    }

    /// One input, as one turn of the driver's loop: it ends with what must be saved.
    fn input(&mut self, input: Input) {
        self.core.handle_input(input, self.now);
        self.core.end_turn(self.now);
        self.drain();
    }

    fn drain(&mut self) {
        while let Some(output) = self.core.poll_output() {
            match output {
                Output::AddInotifyWatches { key, .. } => self.core.handle_input(
                    Input::InotifyWatchesAdded {
                        key,
                        result: Ok(()),
                    },
                    self.now,
                ),
                Output::ReadCgroup { key, cgroup } => {
                    self.reads += 1;
                    let reading = self
                        .cgroups
                        .get(&cgroup)
                        .cloned()
                        .unwrap_or(CgroupReading::Gone);
                    self.core
                        .handle_input(Input::CgroupRead { key, reading }, self.now);
                }
                Output::CountLeftovers {
                    key,
                    cgroup,
                    next,
                    held,
                } => {
                    self.counted_against = Some(next);
                    self.counted_as_held
                        .push(held.iter().map(|p| p.pid).collect());
                    let held = (self.next_counts.pop_front())
                        .or_else(|| self.leftovers.get(&cgroup).cloned())
                        .unwrap_or_default();
                    let result = Ok(CountedLeftovers {
                        held: held.into_iter().map(started).collect(),
                        exited: std::mem::take(&mut self.exited_before_held)
                            .into_iter()
                            .map(started)
                            .collect(),
                        vanished: self.vanished_before_read.pop_front().unwrap_or(0),
                    });
                    self.core
                        .handle_input(Input::Leftovers { key, result }, self.now);
                }
                Output::TakeExitRecord { key, .. } => {
                    self.records_taken += 1;
                    let record = self.exit_record.clone();
                    self.core
                        .handle_input(Input::ExitRecord { key, record }, self.now);
                }
                Output::Save(save) => {
                    match &*save {
                        StateSave::Snapshot(state) => self.saved = state.clone(),
                        StateSave::Changes(changes) => self.saved.apply([changes]),
                    }
                    self.outputs.push(Output::Save(save));
                }
                other => self.outputs.push(other),
            }
        }
    }

    fn request(&mut self, line: &str) {
        let request = parse_request(line.as_bytes()).expect("a valid request");
        let client = ClientId::for_test(CLIENT);
        self.input(Input::Request { client, request });
    }

    fn next_serial(&mut self) -> u32 {
        self.serial += 1;
        self.serial
    }

    fn signal(&mut self, signal: SystemdSignal) {
        let serial = self.next_serial();
        self.input(Input::Signal { serial, signal });
    }

    fn changed(&mut self, unit: &str, active: &str, invocation: &str) {
        let change = UnitChange {
            active_state: Some(active.into()),
            sub_state: Some("x".into()),
            invocation: Some(invocation.into()),
            ..UnitChange::default()
        };
        self.signal(SystemdSignal::UnitChanged {
            path: unit_path(unit),
            change,
        });
    }

    /// systemd's Service interface says `unit`'s MainPID is `pid` (no ControlPID).
    fn main_pid(&mut self, unit: &str, pid: u32) {
        self.signal(SystemdSignal::UnitChanged {
            path: unit_path(unit),
            change: UnitChange {
                main_pid: Some(pid),
                control_pid: Some(0),
                ..UnitChange::default()
            },
        });
    }

    /// The key of the read asked for last; every output so far is taken.
    fn read_asked(&mut self) -> UnitKey {
        self.take()
            .into_iter()
            .rev()
            .find_map(|o| match o {
                Output::ReadUnit { key, .. } => Some(key),
                _ => None,
            })
            .expect("a read was asked for")
    }

    /// The gone roots the last count of leftovers was made against.
    fn counted_gone_roots(&mut self) -> Vec<i32> {
        self.counted_against
            .take()
            .expect("leftovers counted")
            .gone_pids()
    }

    /// Answers `key`'s read with one older than what the unit's other watch was told (A still
    /// deactivating), then checks that a `stop` of `unit` sends no StopUnit: systemd said ours
    /// is over.
    fn assert_an_older_read_asks_no_stop(&mut self, key: UnitKey, unit: &str, cgroup: &str) {
        let older = UnitSnapshot {
            serial: 1,
            ..snapshot(unit, "deactivating", A, cgroup)
        };
        self.input(Input::UnitRead {
            key,
            result: Ok(older),
        });
        self.take();
        self.request(&format!(r#"{{"cmd":"stop","unit":"{unit}"}}"#));
        assert_eq!(self.stops(), [], "systemd said ours is over");
    }

    /// The next invocation the last count of leftovers was made against, checked to hold the
    /// start `start_ticks` of `pid` (read when systemd named it a root, or passed on).
    fn counted_knowing_start(&mut self, pid: i32, start_ticks: u64) -> NextInvocation {
        let counted = self.counted_against.take().expect("leftovers counted");
        let start = ProcessStart {
            pid,
            start_ticks,
            held_as: None,
        };
        assert!(counted.once_held.as_slice().contains(&start), "{counted:?}");
        counted
    }

    /// Checks that the last count of leftovers took `pid` for a root of an invocation after
    /// ours (B's MainPID, in the tests that use it).
    fn assert_counted_as_a_later_root(&mut self, pid: i32) {
        let gone_roots = self.counted_gone_roots();
        assert!(
            gone_roots.contains(&pid),
            "B's MainPID is a root after ours: {gone_roots:?}"
        );
    }

    /// Lets `time` pass: timers fire, and a save that was due is made.
    fn pass(&mut self, time: Duration) {
        self.now += time;
        self.core.handle_timeout(self.now);
        self.core.end_turn(self.now);
        self.drain();
    }

    /// Takes every output so far.
    fn take(&mut self) -> Vec<Output> {
        std::mem::take(&mut self.outputs)
    }

    /// Answers every read asked for so far with `snapshot` (id and path filled in per unit
    /// unless given); returns the units read.
    fn answer_reads(
        &mut self,
        answer: impl Fn(&str) -> Result<UnitSnapshot, String>,
    ) -> Vec<String> {
        let mut read = Vec::new();
        let outputs = self.take();
        for output in outputs {
            match output {
                Output::ReadUnit { key, unit, .. } => {
                    let result = answer(&unit).map(|mut s| {
                        s.serial = self.next_serial();
                        s
                    });
                    read.push(unit);
                    self.input(Input::UnitRead { key, result });
                }
                other => self.outputs.push(other),
            }
        }
        read
    }

    /// Saves now (if anything changed) and returns what the saves add up to.
    fn save(&mut self) -> AgentState {
        self.core.save_now(self.now);
        self.drain();
        self.saved.clone()
    }

    fn proofs(&self) -> Vec<ProofEvent> {
        self.event_answers()
            .into_iter()
            .map(|answer| answer.event)
            .collect()
    }

    /// The `wait` and `stop` answers so far, whole.
    fn event_answers(&self) -> Vec<EventAnswer> {
        self.outputs
            .iter()
            .filter_map(|o| match o {
                Output::Reply {
                    answer: Answer::Event(answer),
                    ..
                } => Some((**answer).clone()),
                _ => None,
            })
            .collect()
    }

    fn stops(&self) -> Vec<(String, StopKind)> {
        self.outputs
            .iter()
            .filter_map(|o| match o {
                Output::StopUnit { unit, kind, .. } => Some((unit.clone(), *kind)),
                _ => None,
            })
            .collect()
    }

    /// Sends `line` and returns the last answer `pick` takes; the other outputs stay.
    fn ask<T>(&mut self, line: &str, mut pick: impl FnMut(&Answer) -> Option<T>) -> Option<T> {
        self.request(line);
        let outputs = self.take();
        let mut picked = None;
        for output in outputs {
            match &output {
                Output::Reply { answer, .. } if pick(answer).is_some() => picked = pick(answer),
                _ => self.outputs.push(output),
            }
        }
        picked
    }

    fn list(&mut self) -> Vec<WatchView> {
        self.ask(r#"{"cmd":"list"}"#, |answer| match answer {
            Answer::Units(units) => Some(units.clone()),
            _ => None,
        })
        .expect("a list answer")
    }

    fn phase(&mut self, unit: &str) -> Phase {
        self.view(unit).phase
    }

    /// The unit's entry in `list`.
    fn view(&mut self, unit: &str) -> WatchView {
        self.list()
            .into_iter()
            .find(|v| v.unit == unit)
            .expect("the unit is listed")
    }
}

fn snapshot(unit: &str, active: &str, invocation: &str, cgroup: &str) -> UnitSnapshot {
    UnitSnapshot {
        serial: 0,
        loaded: true,
        id: unit.to_owned(),
        path: unit_path(unit),
        active_state: active.into(),
        sub_state: "x".into(),
        invocation: invocation.into(),
        control_group: cgroup.into(),
        exit: None,
        current: Default::default(),
        load_state: None,
    }
}

fn unloaded(unit: &str) -> UnitSnapshot {
    UnitSnapshot {
        loaded: false,
        control_group: String::new(),
        ..snapshot(unit, "inactive", "", "")
    }
}

/// A script with `unit` watched and its first read answered: active, invocation A, cgroup
/// populated.
fn watching(unit: &str, active: &str) -> Script {
    let mut s = Script::new();
    s.input(Input::BusUp);
    let cgroup = format!("/app.slice/{unit}");
    s.cgroups.insert(cgroup.clone(), CgroupReading::Populated);
    s.request(&format!(r#"{{"cmd":"watch","unit":"{unit}"}}"#));
    s.answer_reads(|u| Ok(snapshot(u, active, A, &cgroup)));
    s
}

#[test]
fn a_reload_storm_proves_nothing_about_a_remain_after_exit_unit() {
    let mut s = watching("rae.service", "active");
    s.cgroups
        .insert("/app.slice/rae.service".into(), CgroupReading::Gone);
    s.signal(SystemdSignal::Reloading(true));
    s.signal(SystemdSignal::UnitRemoved {
        unit: "rae.service".into(),
    });
    s.signal(SystemdSignal::UnitNew {
        unit: "rae.service".into(),
    });
    assert_eq!(s.phase("rae.service"), Phase::Watching);
    s.signal(SystemdSignal::Reloading(false));
    let read = s.answer_reads(|u| Ok(snapshot(u, "active", A, "")));
    assert_eq!(read, ["rae.service"], "every unit is read after the reload");
    assert_eq!(s.phase("rae.service"), Phase::Watching);
    assert!(s.proofs().is_empty());
    // The stop runs ExecStop under the same invocation; then it is over.
    s.changed("rae.service", "deactivating", A);
    assert_eq!(s.phase("rae.service"), Phase::Watching);
    s.changed("rae.service", "inactive", A);
    assert_eq!(s.phase("rae.service"), Phase::Proven);
}

#[test]
fn state_signalled_during_a_reload_waits_for_a_read_after_it() {
    let mut s = watching("x.service", "active");
    s.cgroups
        .insert("/app.slice/x.service".into(), CgroupReading::Empty);
    s.signal(SystemdSignal::Reloading(true));
    s.changed("x.service", "inactive", A);
    assert_eq!(s.phase("x.service"), Phase::Watching, "stale until read");
    s.signal(SystemdSignal::Reloading(false));
    s.answer_reads(|u| Ok(snapshot(u, "inactive", A, "/app.slice/x.service")));
    assert_eq!(s.phase("x.service"), Phase::Proven);
}

#[test]
fn a_read_in_flight_across_a_reload_does_not_make_facts_fresh() {
    let mut s = watching("x.service", "active");
    s.cgroups
        .insert("/app.slice/x.service".into(), CgroupReading::Empty);
    s.signal(SystemdSignal::UnitNew {
        unit: "x.service".into(),
    });
    // That read is in flight when the reload begins; it answers with what systemd said then.
    s.signal(SystemdSignal::Reloading(true));
    s.answer_reads(|u| Ok(snapshot(u, "inactive", A, "/app.slice/x.service")));
    assert_eq!(s.phase("x.service"), Phase::Watching);
    s.signal(SystemdSignal::Reloading(false));
    let read = s.answer_reads(|u| Ok(snapshot(u, "active", A, "/app.slice/x.service")));
    assert_eq!(read, ["x.service"]);
    assert_eq!(s.phase("x.service"), Phase::Watching);
}

#[test]
fn unit_removed_is_a_hint_and_no_such_unit_is_the_fact() {
    let mut s = watching("t.service", "active");
    s.signal(SystemdSignal::UnitRemoved {
        unit: "t.service".into(),
    });
    assert_eq!(s.phase("t.service"), Phase::Watching);
    // Garbage-collected; its cgroup is gone too.
    s.cgroups.remove("/app.slice/t.service");
    let read = s.answer_reads(|u| Ok(unloaded(u)));
    assert_eq!(read, ["t.service"]);
    assert_eq!(s.phase("t.service"), Phase::Proven);
}

#[test]
fn an_unloaded_unit_with_leftovers_in_its_cgroup_is_not_proven() {
    let mut s = watching("t.service", "active");
    s.signal(SystemdSignal::UnitRemoved {
        unit: "t.service".into(),
    });
    s.answer_reads(|u| Ok(unloaded(u)));
    assert_eq!(
        s.phase("t.service"),
        Phase::Watching,
        "the cached cgroup is read, and it is populated"
    );
}

#[test]
fn an_alias_is_followed_under_the_units_own_name_and_reported_under_the_clients() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    s.request(r#"{"cmd":"watch","unit":"nick.service"}"#);
    s.cgroups
        .insert("/app.slice/real1.service".into(), CgroupReading::Populated);
    for _ in 0..2 {
        s.answer_reads(|_| {
            Ok(snapshot(
                "real1.service",
                "active",
                A,
                "/app.slice/real1.service",
            ))
        });
    }
    s.cgroups
        .insert("/app.slice/real1.service".into(), CgroupReading::Empty);
    s.changed("real1.service", "failed", A);
    assert_eq!(s.phase("nick.service"), Phase::Proven);
    s.request(r#"{"cmd":"wait","unit":"nick.service"}"#);
    let proofs = s.proofs();
    assert_eq!(proofs.len(), 1);
    assert_eq!(proofs[0].unit, "nick.service");
}

/// A proof is the invocation's end whichever watch makes it: the unit's watch proves it while
/// the alias's watch of the same invocation waits for a read (after a reload), and the alias's
/// takes the same proof; a watch of the unit asked for another invocation does not.
#[test]
fn a_proof_proves_every_watch_of_its_invocation_and_no_other() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    let cgroup = "/app.slice/real1.service";
    s.cgroups.insert(cgroup.into(), CgroupReading::Populated);
    s.request(r#"{"cmd":"watch","unit":"real1.service"}"#);
    s.request(&format!(
        r#"{{"cmd":"watch","unit":"nick.service","invocation":"{A}"}}"#
    ));
    s.request(&format!(
        r#"{{"cmd":"watch","unit":"other.service","invocation":"{B}"}}"#
    ));
    for _ in 0..2 {
        s.answer_reads(|_| Ok(snapshot("real1.service", "active", A, cgroup)));
    }
    s.cgroups.insert(cgroup.into(), CgroupReading::Empty);
    s.signal(SystemdSignal::Reloading(true));
    s.signal(SystemdSignal::Reloading(false));
    // Every watch reads the unit by its own name now; only the first read is answered.
    let answered = std::cell::Cell::new(false);
    s.answer_reads(|_| match answered.replace(true) {
        false => Ok(snapshot("real1.service", "inactive", A, cgroup)),
        true => Err("Method call timed out".into()),
    });
    assert_eq!(s.phase("real1.service"), Phase::Proven);
    assert_eq!(
        s.phase("nick.service"),
        Phase::Proven,
        "the same invocation"
    );
    assert_eq!(
        s.phase("other.service"),
        Phase::Watching,
        "another invocation"
    );
    s.request(r#"{"cmd":"wait","unit":"real1.service"}"#);
    s.request(r#"{"cmd":"wait","unit":"nick.service"}"#);
    let proofs = s.proofs();
    assert_eq!(proofs.len(), 2, "{proofs:?}");
    assert_eq!(proofs[0].cause, proofs[1].cause, "{proofs:?}");
    assert_eq!(proofs[1].unit, "nick.service");
}

/// A watch asked to stop takes its sibling's proof too, in its own words: the unit's watch
/// stops an invocation started outside and proves ours over, while the alias's watch, asked to
/// stop ours, waits for a read after a reload. It is proven "replaced after stop" and keeps
/// its launch file, as its own state would have it (found by the simulator, 125481835117919:
/// left to itself, such a watch waited long on a later invocation's leftover it could not
/// place).
#[test]
fn a_watch_asked_to_stop_takes_its_siblings_proof_in_its_own_words() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    let cgroup = "/app.slice/real1.service";
    s.cgroups.insert(cgroup.into(), CgroupReading::Populated);
    s.request(r#"{"cmd":"watch","unit":"real1.service","gen":1,"launch_file":"/run/l/1"}"#);
    s.request(&format!(
        r#"{{"cmd":"watch","unit":"nick.service","invocation":"{A}","gen":2,"launch_file":"/run/l/2"}}"#
    ));
    for _ in 0..2 {
        s.answer_reads(|_| Ok(snapshot("real1.service", "active", A, cgroup)));
    }
    s.request(r#"{"cmd":"stop","unit":"nick.service"}"#);
    assert_eq!(
        s.stops(),
        [(
            "real1.service".into(),
            StopKind::Proof(StopReason::Requested)
        )],
        "systemd's name"
    );
    s.take();
    s.cgroups.insert(cgroup.into(), CgroupReading::Empty);
    s.signal(SystemdSignal::Reloading(true));
    s.signal(SystemdSignal::Reloading(false));
    s.answer_reads(|unit| match unit {
        "real1.service" => Ok(snapshot("real1.service", "inactive", B, cgroup)),
        _ => Err("Method call timed out".into()),
    });
    let removed: Vec<PathBuf> = s
        .outputs
        .iter()
        .filter_map(|o| match o {
            Output::RemoveLaunchFile { path, .. } => Some(path.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        removed,
        [PathBuf::from("/run/l/1")],
        "nick's generation is B's now"
    );
    let stopped = s.proofs();
    assert_eq!(stopped.len(), 1, "the stop is answered: {stopped:?}");
    assert_eq!(stopped[0].unit, "nick.service");
    assert_eq!(stopped[0].cause, Cause::ReplacedAfterStop);
    s.request(r#"{"cmd":"wait","unit":"real1.service"}"#);
    let proofs = s.proofs();
    assert_eq!(proofs[1].cause, Cause::RestartedOutside, "{proofs:?}");
}

/// A watch made after another watch of the unit proved its invocation takes that proof at its
/// first read, in its own words, rather than wait on what it cannot place: here the alias's
/// watch, asked to stop before its first read, would count a process of the invocation that
/// replaced ours (found by the simulator, 125481835117919, where the watch was restored after
/// a restart and waited for some 60 steps).
#[test]
fn a_new_watch_of_a_proven_invocation_takes_the_proof_at_its_first_read() {
    let mut s = watching("real1.service", "active");
    let cgroup = "/app.slice/real1.service";
    s.changed("real1.service", "active", B);
    s.changed("real1.service", "inactive", B);
    assert_eq!(s.phase("real1.service"), Phase::Proven);
    s.leftovers.insert(cgroup.into(), vec![41]);
    s.request(&format!(
        r#"{{"cmd":"watch","unit":"nick.service","invocation":"{A}","gen":2,"launch_file":"/run/l/2"}}"#
    ));
    s.request(r#"{"cmd":"stop","unit":"nick.service"}"#);
    s.answer_reads(|_| Ok(snapshot("real1.service", "active", C, cgroup)));
    s.answer_reads(|_| Ok(snapshot("real1.service", "active", C, cgroup)));
    let view = s.view("nick.service");
    assert_eq!(view.phase, Phase::Proven, "{view:?}");
    let stopped = s.proofs();
    assert_eq!(stopped.len(), 1, "the stop is answered: {stopped:?}");
    assert_eq!(stopped[0].cause, Cause::ReplacedAfterStop);
    assert!(
        !s.outputs
            .iter()
            .any(|o| matches!(o, Output::RemoveLaunchFile { .. })),
        "replaced after stop keeps the generation's files"
    );
}

/// A watch still waiting for its first read takes what a read of another watch of the same
/// unit (here an alias's) said: its own read, sent earlier and answered later, is older, and a
/// stop asked for on it would reach the invocation after ours (found by the simulator).
#[test]
fn a_first_read_older_than_an_alias_watchs_read_does_not_bring_back_a_running_state() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    let cgroup = "/app.slice/real1.service";
    s.cgroups.insert(cgroup.into(), CgroupReading::Gone);
    s.request(r#"{"cmd":"watch","unit":"real1.service"}"#);
    let unit_key = s.read_asked();
    s.request(&format!(
        r#"{{"cmd":"watch","unit":"nick.service","invocation":"{A}"}}"#
    ));
    let read = s.answer_reads(|_| Ok(snapshot("real1.service", "inactive", A, "")));
    assert_eq!(read, ["nick.service"], "the alias is followed");
    let read = s.answer_reads(|_| Ok(snapshot("real1.service", "inactive", A, "")));
    assert_eq!(read, ["real1.service"], "by the unit's own name");
    s.assert_an_older_read_asks_no_stop(unit_key, "real1.service", cgroup);
}

#[test]
fn a_watch_made_with_an_alias_adopts_the_invocation_read_after_the_name_resolved() {
    // Signals under the unit's own path were not routed to the watch before its first read
    // named the unit: what that read says may be over already (found by the simulator).
    let mut s = Script::new();
    s.input(Input::BusUp);
    s.cgroups
        .insert("/app.slice/real1.service".into(), CgroupReading::Populated);
    s.request(r#"{"cmd":"watch","unit":"nick.service"}"#);
    s.request(r#"{"cmd":"stop","unit":"nick.service"}"#);
    let read = s.answer_reads(|_| {
        Ok(snapshot(
            "real1.service",
            "inactive",
            A,
            "/app.slice/real1.service",
        ))
    });
    assert_eq!(read, ["nick.service"]);
    assert!(s.stops().is_empty(), "nothing is stopped on a name lookup");
    let read = s.answer_reads(|_| {
        Ok(snapshot(
            "real1.service",
            "active",
            B,
            "/app.slice/real1.service",
        ))
    });
    assert_eq!(
        read,
        ["real1.service"],
        "read again under the unit's own name"
    );
    let view = s
        .list()
        .into_iter()
        .find(|v| v.unit == "nick.service")
        .expect("listed");
    assert_eq!(view.invocation.as_deref(), Some(B));
    assert_eq!(
        s.stops(),
        [(
            "real1.service".to_owned(),
            StopKind::Proof(StopReason::Requested)
        )]
    );
}

#[test]
fn replaced_after_stop_releases_no_generation_files() {
    let mut s = Script::watching_generation_3();
    s.request(r#"{"cmd":"stop","unit":"g.service"}"#);
    assert_eq!(
        s.stops(),
        [(
            "g.service".to_owned(),
            StopKind::Proof(StopReason::Requested)
        )]
    );
    s.changed("g.service", "activating", B);
    let proofs = s.proofs();
    assert_eq!(proofs.len(), 1);
    assert_eq!(proofs[0].cause, Cause::ReplacedAfterStop);
    let key = match s
        .outputs
        .iter()
        .find(|o| matches!(o, Output::StopUnit { .. }))
    {
        Some(Output::StopUnit { key, .. }) => *key,
        _ => unreachable!(),
    };
    s.input(Input::StopDone {
        key,
        kind: StopKind::Proof(StopReason::Requested),
        succeeded: false,
    });
    assert_eq!(
        s.stops().len(),
        1,
        "no final stop reaches the new invocation"
    );
    assert!(
        !s.outputs
            .iter()
            .any(|o| matches!(o, Output::RemoveLaunchFile { .. }))
    );
}

#[test]
fn the_final_stop_waits_for_a_read_after_the_proof_and_reaches_only_a_loaded_unit() {
    // An unloaded unit holds nothing to stop, and a StopUnit would load it under whatever
    // name it goes by by then: an alias of a unit started since (found by the simulator).
    for loaded in [true, false] {
        let mut s = Script::watching_generation_3();
        s.cgroups
            .insert("/app.slice/g.service".into(), CgroupReading::Empty);
        s.changed("g.service", "failed", A);
        assert_eq!(s.phase("g.service"), Phase::Proven);
        assert!(s.stops().is_empty(), "not before a read after the proof");
        let read = s.answer_reads(|u| {
            Ok(if loaded {
                snapshot(u, "failed", A, "/app.slice/g.service")
            } else {
                unloaded(u)
            })
        });
        assert_eq!(read, ["g.service"]);
        let expected = if loaded {
            vec![("g.service".to_owned(), StopKind::FinalGeneration)]
        } else {
            vec![]
        };
        assert_eq!(s.stops(), expected, "loaded: {loaded}");
    }
}

#[test]
fn a_failed_first_read_refuses_a_new_watch_and_keeps_its_generation_free() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    s.request(r#"{"id":1,"cmd":"watch","unit":"f.service","gen":5}"#);
    s.answer_reads(|_| Err("method call timed out".into()));
    assert!(s.outputs.iter().any(|o| matches!(
        o,
        Output::Reply {
            answer: Answer::Error(ErrorKind::Internal, _),
            ..
        }
    )));
    assert!(s.list().is_empty());
    s.take();
    s.request(r#"{"id":2,"cmd":"watch","unit":"f.service","gen":5}"#);
    let read = s.answer_reads(|u| Ok(snapshot(u, "active", A, "")));
    assert_eq!(read, ["f.service"], "the generation was not used up");
}

fn saved(unit: &str, invocation: &str) -> SavedWatch {
    SavedWatch {
        control_group: Some(format!("/app.slice/{unit}")),
        ..SavedWatch::bare(unit, invocation)
    }
}

fn state(boot: &str, watches: Vec<SavedWatch>) -> AgentState {
    AgentState {
        watches,
        boot_id: Some(boot.into()),
        ..AgentState::default()
    }
}

#[test]
fn a_restored_watch_survives_failed_reads_and_is_read_again() {
    let mut s = Script::restored(state("boot-1", vec![saved("r.service", A)]), "boot-1");
    s.input(Input::BusUp);
    s.answer_reads(|_| Err("method call timed out".into()));
    assert_eq!(s.list().len(), 1, "a restored watch is never dropped");
    s.now += Duration::from_secs(1);
    s.core.handle_timeout(s.now);
    s.drain();
    let read = s.answer_reads(|u| Ok(snapshot(u, "active", A, "/app.slice/r.service")));
    assert_eq!(read, ["r.service"], "read again after a backoff");
}

#[test]
fn a_watch_from_another_boot_is_proven_at_once_and_nothing_is_stopped() {
    let mut record = saved("b.service", A);
    record.stop_requested = true;
    record.stop_unsent = true;
    record.generation = Some(2);
    record.launch_file = Some("/run/b/launch-2".into());
    let mut s = Script::restored(state("boot-0", vec![record]), "boot-1");
    s.input(Input::BusUp);
    s.answer_reads(|u| Ok(snapshot(u, "active", B, "/app.slice/b.service")));
    assert_eq!(s.phase("b.service"), Phase::Proven);
    let views = s.list();
    let proof = views[0].proof.clone().expect("proven");
    assert_eq!(proof.cause, Cause::Rebooted);
    assert!(
        s.stops().is_empty(),
        "the unit's invocation in this boot is not ours"
    );
    assert!(
        s.outputs
            .iter()
            .any(|o| matches!(o, Output::RemoveLaunchFile { .. }))
    );
}

#[test]
fn rewatching_a_proven_invocation_answers_its_proof_and_stops_nothing() {
    let mut s = watching("w.service", "active");
    s.cgroups
        .insert("/app.slice/w.service".into(), CgroupReading::Empty);
    s.changed("w.service", "inactive", A);
    assert_eq!(s.phase("w.service"), Phase::Proven);
    s.changed("w.service", "active", B);
    s.take();
    s.request(&format!(
        r#"{{"cmd":"watch","unit":"w.service","invocation":"{A}"}}"#
    ));
    s.answer_reads(|u| Ok(snapshot(u, "active", B, "/app.slice/w.service")));
    assert!(s.stops().is_empty());
    s.pass(SAVE_INTERVAL);
    let answered = s.outputs.iter().any(|o| match o {
        Output::Reply {
            answer: Answer::Watch(view),
            ..
        } => view.proof.as_ref().is_some_and(|p| p.invocation == A),
        _ => false,
    });
    assert!(answered, "{:?}", s.outputs);
}

#[test]
fn a_stop_decided_while_the_bus_was_down_is_not_sent_to_a_new_invocation() {
    let mut s = watching("d.service", "active");
    s.input(Input::BusLost);
    s.request(r#"{"cmd":"stop","unit":"d.service"}"#);
    assert!(s.stops().is_empty(), "deferred");
    s.input(Input::BusUp);
    s.answer_reads(|u| Ok(snapshot(u, "active", B, "/app.slice/d.service")));
    assert!(s.stops().is_empty(), "the unit runs another invocation now");
}

#[test]
fn a_stop_decided_while_the_bus_was_down_is_sent_once_it_is_back() {
    let mut s = watching("d.service", "active");
    s.input(Input::BusLost);
    s.request(r#"{"cmd":"stop","unit":"d.service"}"#);
    s.input(Input::BusUp);
    s.answer_reads(|u| Ok(snapshot(u, "active", A, "/app.slice/d.service")));
    assert_eq!(
        s.stops(),
        [(
            "d.service".to_owned(),
            StopKind::Proof(StopReason::Requested)
        )]
    );
}

#[test]
fn an_unsent_stop_survives_a_restart() {
    let mut s = watching("d.service", "active");
    s.input(Input::BusLost);
    s.request(r#"{"cmd":"stop","unit":"d.service"}"#);
    let saved = s.save();
    assert!(saved.watches[0].stop_unsent);
    let mut s = Script::restored(saved, "boot-1");
    s.input(Input::BusUp);
    s.answer_reads(|u| Ok(snapshot(u, "active", A, "/app.slice/d.service")));
    assert_eq!(
        s.stops(),
        [(
            "d.service".to_owned(),
            StopKind::Proof(StopReason::Requested)
        )]
    );
}

#[test]
fn an_overflow_rebuilds_every_cgroup_watch_then_reads() {
    let mut s = watching("o.service", "active");
    s.changed("o.service", "inactive", A);
    assert_eq!(s.phase("o.service"), Phase::Watching, "populated");
    s.cgroups
        .insert("/app.slice/o.service".into(), CgroupReading::Empty);
    s.core.handle_input(Input::CgroupOverflow, s.now);
    let rebuilt = matches!(s.core.poll_output(), Some(Output::Log { .. }))
        && matches!(s.core.poll_output(), Some(Output::AddInotifyWatches { .. }));
    assert!(rebuilt);
    s.input(Input::InotifyWatchesAdded {
        key: UnitKey(0),
        result: Ok(()),
    });
    assert_eq!(s.phase("o.service"), Phase::Proven);
}

#[test]
fn a_lost_bus_voids_every_fact_until_a_read_on_the_new_connection() {
    let mut s = watching("l.service", "active");
    s.cgroups
        .insert("/app.slice/l.service".into(), CgroupReading::Empty);
    s.input(Input::BusLost);
    s.input(Input::BusUp);
    // A signal on the new connection before the read: one field known is not a state.
    let change = UnitChange {
        active_state: Some("inactive".into()),
        ..UnitChange::default()
    };
    s.signal(SystemdSignal::UnitChanged {
        path: unit_path("l.service"),
        change,
    });
    assert_eq!(s.phase("l.service"), Phase::Watching);
    s.answer_reads(|u| Ok(snapshot(u, "inactive", A, "/app.slice/l.service")));
    assert_eq!(s.phase("l.service"), Phase::Proven);
}

#[test]
fn a_leftover_beside_the_next_invocation_blocks_replaced_after_stop_until_it_exits() {
    let mut s = watching("k.service", "active");
    s.request(r#"{"cmd":"stop","unit":"k.service"}"#);
    s.changed("k.service", "inactive", A);
    s.leftovers.insert("/app.slice/k.service".into(), vec![41]);
    s.changed("k.service", "activating", B);
    assert_eq!(s.phase("k.service"), Phase::Stopping, "pid 41 may be ours");
    s.input(Input::LeftoverExited {
        key: UnitKey(0),
        pid: 77,
    });
    assert_eq!(
        s.phase("k.service"),
        Phase::Stopping,
        "not a leftover of ours"
    );
    // The last one exits: a count again finds none (it forked nothing meanwhile).
    s.leftovers.remove("/app.slice/k.service");
    s.input(Input::LeftoverExited {
        key: UnitKey(0),
        pid: 41,
    });
    assert_eq!(s.phase("k.service"), Phase::Proven);
}

/// What a count holds is saved with each process's start and held again by an agent restarted
/// in the same boot: once such a leftover is gone, only that start tells systemd's guess of it
/// (a later invocation's MainPID, `unit_search_main_pid`) from the later invocation's own fork.
/// The simulator's 50944944674065: held before the agent was killed, guessed and gone while it
/// was down, the leftover's children were taken for the next invocation's and the watch proven
/// while they lived.
#[test]
fn a_held_leftover_is_held_again_with_its_start_after_a_restart() {
    let unit = "k.service";
    let held = |saved: &AgentState| -> Vec<SavedProcess> {
        let record = saved.watches.iter().find(|w| w.unit == unit);
        record.map(|w| w.held.clone()).unwrap_or_default()
    };
    let mut s = stopped_beside(unit, &[41]);
    s.changed(unit, "activating", B);
    assert_eq!(s.phase(unit), Phase::Stopping, "pid 41 may be ours");
    let saved = s.save();
    assert_eq!(held(&saved), [SavedProcess::from(&started(41))]);

    let mut restarted = Script::restored(saved, "boot-1");
    restarted.input(Input::BusUp);
    let cgroup = format!("/app.slice/{unit}");
    restarted
        .cgroups
        .insert(cgroup.clone(), CgroupReading::Populated);
    restarted.leftovers.insert(cgroup.clone(), vec![41]);
    restarted.answer_reads(|u| Ok(snapshot(u, "active", B, &cgroup)));
    assert_eq!(
        restarted.counted_as_held.first(),
        Some(&vec![41]),
        "counted with 41 held, as before the restart"
    );
    assert_eq!(restarted.phase(unit), Phase::Stopping);

    // Its exit is saved too: a restart after it holds nothing.
    restarted.last_leftover_exits(unit, 41);
    assert_eq!(held(&restarted.save()), []);
    assert_eq!(restarted.phase(unit), Phase::Proven);
}

/// A leftover of ours that a count listed exits before its pidfd holds it, having forked
/// after the listing (as an ExecStop= waiter does when the next invocation's ExecStart= tells
/// it to fork a daemon and exit): that count holds nothing and proves nothing; a count again,
/// told the exited one was held, finds what it forked. Failed before: proven
/// `replaced-after-stop` at once (seen against real systemd in CI, the waiter's child alive).
#[test]
fn a_leftover_that_exits_before_its_pidfd_blocks_the_proof_until_a_count_again() {
    let mut s = stopped_beside("k.service", &[41]);
    s.changed("k.service", "activating", B);
    assert_eq!(s.phase("k.service"), Phase::Stopping, "pid 41 may be ours");
    // 41 forks 43 after the next count lists it, and exits before its pidfd is opened.
    s.next_counts.push_back(vec![]);
    s.exited_before_held = vec![41];
    s.leftovers.insert("/app.slice/k.service".into(), vec![43]);
    s.counted_as_held.clear();
    s.b_is("k.service", "active", 50);
    assert_eq!(
        s.counted_as_held,
        [vec![41], vec![41]],
        "counted again, 41 as held"
    );
    assert_eq!(s.phase("k.service"), Phase::Stopping, "its child 43 lives");
    s.last_leftover_exits("k.service", 43);
    assert_eq!(s.phase("k.service"), Phase::Proven);
}

/// A process the census listed is gone before its start is read: whoever's it was, what it
/// forked after the listing is not in the census, so a count that holds nothing proves
/// nothing until a count again.
#[test]
fn a_process_gone_before_its_start_is_read_blocks_the_proof_until_a_count_again() {
    let mut s = stopped_beside("v.service", &[43]);
    s.counted_as_held.clear();
    s.next_counts.push_back(vec![]);
    s.vanished_before_read.push_back(1);
    s.changed("v.service", "activating", B);
    assert_eq!(s.counted_as_held.len(), 2, "counted again");
    assert_eq!(s.phase("v.service"), Phase::Stopping, "43 may be ours");
    s.last_leftover_exits("v.service", 43);
    assert_eq!(s.phase("v.service"), Phase::Proven);
}

/// What remains once ours is over is counted at once and held; the count proves nothing.
/// The roots the facts hold for the current invocation, ours, are counted against as a later
/// one's: systemd says the next one's MainPID before its InvocationID.
#[test]
fn what_remains_once_ours_is_over_is_counted_and_held() {
    let mut s = watching("r.service", "active");
    s.main_pid("r.service", 300);
    s.leftovers.insert("/app.slice/r.service".into(), vec![301]);
    s.changed("r.service", "inactive", A);
    let next = s.counted_against.take().expect("counted");
    assert_eq!(next.roots, [300]);
    assert_eq!(s.phase("r.service"), Phase::Watching);
    let status = s.core.unit_status(UnitKey(0), s.now).expect("watched");
    assert_eq!(status.leftovers, [301]);
}

/// Processes that keep forking and exiting (each forks the next and exits) make every census
/// see an exit: the count is made again once at once, then only after the proof's backoff,
/// never in a loop within one turn; the proof waits until a census sees no exit.
#[test]
fn processes_that_keep_forking_and_exiting_are_counted_again_after_a_backoff() {
    let mut s = stopped_beside("h.service", &[]);
    s.counted_as_held.clear();
    s.cgroups
        .insert("/app.slice/h.service".into(), CgroupReading::Populated);
    s.next_counts.extend([vec![], vec![], vec![]]);
    s.vanished_before_read.extend([1, 1, 1]);
    s.changed("h.service", "activating", B);
    assert_eq!(s.counted_as_held.len(), 2, "once again at once, no more");
    assert_eq!(s.phase("h.service"), Phase::Stopping);
    s.pass(Duration::from_millis(49));
    assert_eq!(s.counted_as_held.len(), 2, "not before the backoff");
    s.pass(Duration::from_millis(1));
    assert_eq!(s.counted_as_held.len(), 3, "again after the backoff, once");
    assert_eq!(s.phase("h.service"), Phase::Stopping);
    // The chain ends: the next census sees no exit, and nothing of ours.
    s.pass(Duration::from_millis(100));
    assert_eq!(s.counted_as_held.len(), 4);
    assert_eq!(s.phase("h.service"), Phase::Proven);
}

#[test]
fn leftovers_are_counted_against_what_systemd_said_of_the_next_invocation() {
    let mut s = watching("n.service", "active");
    // MainPID of our own invocation: said before a message still carrying our InvocationID,
    // so never a root of the next one.
    let ours = UnitChange {
        main_pid: Some(200),
        ..UnitChange::default()
    };
    s.signal(SystemdSignal::UnitChanged {
        path: unit_path("n.service"),
        change: ours,
    });
    s.request(r#"{"cmd":"stop","unit":"n.service"}"#);
    s.changed("n.service", "deactivating", A);
    let next = UnitChange {
        active_state: Some("activating".into()),
        invocation: Some(B.into()),
        inactive_exit_us: Some(5_000_000),
        control_pid: Some(300),
        ..UnitChange::default()
    };
    s.signal(SystemdSignal::UnitChanged {
        path: unit_path("n.service"),
        change: next,
    });
    assert_eq!(
        s.counted_against,
        Some(NextInvocation {
            began_us: Some(5_000_000),
            roots_began_us: Some(5_000_000),
            roots: vec![300],
            gone_roots: vec![],
            once_held: OnceHeld::None,
            // 200 was ours: a root of a later invocation with its pid, gone unseen, is a guess.
            counted_roots: vec![200],
        })
    );
    assert_eq!(s.phase("n.service"), Phase::Proven, "none of ours left");
}

#[test]
fn a_watch_and_the_same_watch_asked_again_are_answered_only_once_saved() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    s.request(r#"{"cmd":"watch","unit":"first.service"}"#);
    s.answer_reads(|u| Ok(snapshot(u, "active", A, "")));
    s.take();
    // A second watch within the save interval: its answer waits for the save, and so does
    // the answer to the same watch asked again meanwhile (found by the simulator: the agent
    // was killed before the save, and the client had been told the unit was watched).
    s.request(r#"{"cmd":"watch","unit":"second.service"}"#);
    s.answer_reads(|u| Ok(snapshot(u, "active", A, "")));
    s.request(r#"{"cmd":"watch","unit":"second.service"}"#);
    let answered = |outputs: &[Output]| {
        outputs.iter().position(|o| {
            matches!(
                o,
                Output::Reply {
                    answer: Answer::Watch(_),
                    ..
                }
            )
        })
    };
    assert_eq!(answered(&s.outputs), None, "not saved yet, so not answered");
    s.pass(SAVE_INTERVAL);
    let saved_at = s.outputs.iter().position(|o| {
        matches!(&o, Output::Save(save) if matches!(&**save,
                StateSave::Changes(changes)
                if changes.watches.iter().any(|w| w.unit == "second.service")))
    });
    let answered_at = answered(&s.outputs);
    assert!(
        saved_at.is_some() && answered_at > saved_at,
        "{:?}",
        s.outputs
    );
    let answers = s
        .outputs
        .iter()
        .filter(|o| {
            matches!(
                o,
                Output::Reply {
                    answer: Answer::Watch(view),
                    ..
                } if view.unit == "second.service"
            )
        })
        .count();
    assert_eq!(
        answers, 2,
        "both watch requests are answered after the save"
    );
}

#[test]
fn the_last_leftover_exiting_is_counted_again_for_what_it_forked() {
    let mut s = watching("f.service", "active");
    s.request(r#"{"cmd":"stop","unit":"f.service"}"#);
    s.changed("f.service", "inactive", A);
    s.leftovers.insert("/app.slice/f.service".into(), vec![41]);
    s.changed("f.service", "activating", B);
    // 41 forked 42 after the count, then exited.
    s.leftovers.insert("/app.slice/f.service".into(), vec![42]);
    s.input(Input::LeftoverExited {
        key: UnitKey(0),
        pid: 41,
    });
    assert_eq!(s.phase("f.service"), Phase::Stopping, "42 is ours too");
    s.leftovers.remove("/app.slice/f.service");
    s.input(Input::LeftoverExited {
        key: UnitKey(0),
        pid: 42,
    });
    assert_eq!(s.phase("f.service"), Phase::Proven);
}

#[test]
fn a_generations_proof_is_saved_before_its_files_go_and_anyone_is_told() {
    // The driver carries out nothing after a save that failed, so what follows the save may
    // rely on it: an agent stopped there releases nothing and tells nobody.
    let mut s = Script::watching_generation_3();
    s.request(r#"{"cmd":"wait","unit":"g.service"}"#);
    s.take();
    s.cgroups
        .insert("/app.slice/g.service".into(), CgroupReading::Gone);
    s.changed("g.service", "inactive", A);
    let position = |found: fn(&Output) -> bool| s.outputs.iter().position(found);
    let saved = position(|o| {
        matches!(o, Output::Save(save) if matches!(&**save,
            StateSave::Changes(changes) if changes.watches.iter().any(|w| w.proof.is_some())))
    });
    let removed = position(|o| matches!(o, Output::RemoveLaunchFile { .. }));
    let told = position(|o| {
        matches!(
            o,
            Output::Reply {
                answer: Answer::Event(_),
                ..
            }
        )
    });
    assert!(
        saved.is_some() && saved < removed && removed < told,
        "{:?}",
        s.outputs
    );
}

#[test]
fn version_is_answered_at_once_with_the_build_versions() {
    let mut s = Script::new();
    s.request(r#"{"id":3,"cmd":"version"}"#);
    let outputs = s.take();
    assert!(
        matches!(
            outputs.as_slice(),
            [Output::Reply { to, answer: Answer::Version(version) }]
                if to.id == Some(RequestId::Number(3.into())) && *version == Version::CURRENT
        ),
        "{outputs:?}"
    );
}

/// Watches of `names` under keys 1, 2, ... in that order, each with systemd's name `id` when
/// its name starts with `alias-`.
fn watches_named(names: &[&str], id: &str) -> Watches {
    let mut units = Watches::default();
    for (key, name) in (1..).zip(names) {
        let unit: UnitName = name.parse().expect("a valid unit name");
        let spec = crate::control::protocol::WatchSpec::default();
        let mut watch = Watch::new(&unit, None, spec);
        if name.starts_with("alias-") {
            watch.id = id.into();
        }
        units.insert(UnitKey(key), watch);
    }
    units
}

#[test]
fn an_index_keeps_every_key_of_a_name_oldest_watch_first() {
    let units = watches_named(
        &[
            "a.service",
            "alias-1.service",
            "alias-2.service",
            "b.service",
        ],
        "a.service",
    );
    let mut by_id = NameIndex::new(|watch| &watch.id);
    for key in [3, 1, 2, 3] {
        by_id.insert("a.service", UnitKey(key), &units);
    }
    by_id.insert("b.service", UnitKey(4), &units);
    let keys = |index: &NameIndex, name| index.keys(name, &units).collect::<Vec<_>>();
    assert_eq!(
        keys(&by_id, "a.service"),
        [UnitKey(1), UnitKey(2), UnitKey(3)]
    );
    by_id.remove("a.service", UnitKey(1), &units);
    assert_eq!(keys(&by_id, "a.service"), [UnitKey(2), UnitKey(3)]);
    by_id.remove("a.service", UnitKey(3), &units);
    by_id.remove("a.service", UnitKey(2), &units);
    assert_eq!(keys(&by_id, "a.service"), []);
    assert_eq!(keys(&by_id, "b.service"), [UnitKey(4)]);
    by_id.remove("b.service", UnitKey(9), &units);
    by_id.remove("a.service", UnitKey(4), &units);
    assert_eq!(keys(&by_id, "b.service"), [UnitKey(4)]);
    // A key is found only under the name its watch has now.
    assert_eq!(keys(&by_id, "alias-1.service"), []);
}

#[test]
fn an_index_by_the_clients_name_holds_the_last_watch_of_a_name() {
    let units = watches_named(&["a.service", "a.service", "b.service"], "");
    let mut by_name = NameIndex::new(|watch| &watch.unit);
    by_name.replace("a.service", UnitKey(1), &units);
    by_name.replace("b.service", UnitKey(3), &units);
    by_name.replace("a.service", UnitKey(2), &units);
    assert_eq!(by_name.key("a.service", &units), Some(UnitKey(2)));
    assert_eq!(by_name.keys("a.service", &units).count(), 1);
    // The watch it replaced is no longer filed: removing it leaves the last one.
    by_name.remove("a.service", UnitKey(1), &units);
    assert_eq!(by_name.key("a.service", &units), Some(UnitKey(2)));
    assert_eq!(by_name.key("b.service", &units), Some(UnitKey(3)));
}

#[test]
fn an_index_finds_every_key_as_it_grows_and_shrinks() {
    let names: Vec<String> = (0..1000).map(|i| format!("u{i}.service")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let units = watches_named(&names, "");
    let mut by_name = NameIndex::new(|watch| &watch.unit);
    for (key, name) in (1..).zip(&names) {
        by_name.replace(name, UnitKey(key), &units);
    }
    // Nine in ten removed, which shrinks the table on the way.
    for (key, name) in (1..).zip(&names) {
        if key % 10 != 0 {
            by_name.remove(name, UnitKey(key), &units);
        }
    }
    for (key, name) in (1..).zip(&names) {
        let expected = (key % 10 == 0).then_some(UnitKey(key));
        assert_eq!(by_name.key(name, &units), expected, "{name}");
    }
}

/// The change sets a script's outputs hold, in order.
fn change_sets(outputs: &[Output]) -> Vec<ChangeSet> {
    outputs
        .iter()
        .filter_map(|o| match o {
            Output::Save(save) => match &**save {
                StateSave::Changes(changes) => Some(changes.clone()),
                StateSave::Snapshot(_) => None,
            },
            _ => None,
        })
        .collect()
}

fn units_of(changes: &ChangeSet) -> Vec<&str> {
    changes.watches.iter().map(|w| w.unit.as_str()).collect()
}

#[test]
fn a_change_set_holds_exactly_the_watches_that_changed() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    for unit in ["a.service", "b.service", "c.service"] {
        s.request(&format!(r#"{{"cmd":"watch","unit":"{unit}","gen":1}}"#));
    }
    s.answer_reads(|u| Ok(snapshot(u, "active", A, "")));
    s.pass(SAVE_INTERVAL);
    let first = change_sets(&s.take());
    let all: Vec<&str> = first.iter().flat_map(units_of).collect();
    assert_eq!(all, ["a.service", "b.service", "c.service"], "{first:?}");
    let generations: Vec<_> = first.iter().flat_map(|c| c.generations.clone()).collect();
    assert_eq!(generations.len(), 3, "{first:?}");

    // One stop: b's record alone, whole.
    s.pass(SAVE_INTERVAL);
    s.request(r#"{"cmd":"stop","unit":"b.service"}"#);
    s.pass(SAVE_INTERVAL);
    let stopped = change_sets(&s.take());
    assert_eq!(stopped.len(), 1, "{stopped:?}");
    assert_eq!(units_of(&stopped[0]), ["b.service"]);
    assert!(stopped[0].watches[0].stop_requested);
    assert!(stopped[0].removed.is_empty() && stopped[0].generations.is_empty());

    // One unwatch: c's removal alone.
    s.pass(SAVE_INTERVAL);
    s.request(r#"{"cmd":"unwatch","unit":"c.service"}"#);
    s.pass(SAVE_INTERVAL);
    let unwatched = change_sets(&s.take());
    assert_eq!(unwatched.len(), 1, "{unwatched:?}");
    assert!(unwatched[0].watches.is_empty(), "{unwatched:?}");
    assert_eq!(unwatched[0].removed, ["c.service"]);

    // A turn that changes nothing saves nothing.
    s.pass(SAVE_INTERVAL);
    assert!(change_sets(&s.take()).is_empty());
    let saved = s.save();
    let units: Vec<&str> = saved.watches.iter().map(|w| w.unit.as_str()).collect();
    assert_eq!(units, ["a.service", "b.service"]);
    assert_eq!(saved.generations.len(), 3, "a generation is never reused");
}

#[test]
fn a_refused_watch_gives_its_generation_back_in_a_change_set() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    s.request(r#"{"cmd":"watch","unit":"f.service","gen":4}"#);
    s.pass(SAVE_INTERVAL);
    assert_eq!(s.saved.generations, [("f.service".to_owned(), 4)]);
    s.answer_reads(|_| Err("org.freedesktop.DBus.Error.AccessDenied".into()));
    s.pass(SAVE_INTERVAL);
    let freed: Vec<_> = change_sets(&s.take())
        .into_iter()
        .flat_map(|c| c.generations_freed)
        .collect();
    assert_eq!(freed, [("f.service".to_owned(), 4)]);
    assert!(s.saved.generations.is_empty() && s.saved.watches.is_empty());
}

#[test]
fn a_unit_watched_again_after_its_proof_in_an_old_file_keeps_the_new_watch() {
    let proven = SavedWatch {
        proof: Some(
            crate::agent::saved::ProofJson::from_json(&serde_json::json!({"unit": "p.service"}))
                .expect("encode"),
        ),
        ..saved("p.service", A)
    };
    let s = Script::restored(
        state("boot-1", vec![proven, saved("p.service", B)]),
        "boot-1",
    );
    let units: Vec<(&str, &str)> = s
        .saved
        .watches
        .iter()
        .map(|w| (w.unit.as_str(), w.invocation.as_str()))
        .collect();
    assert_eq!(units, [("p.service", B)]);
}

#[test]
fn a_reboots_proofs_are_saved_with_every_watch_before_any_release() {
    let with_generation = |unit: &str| SavedWatch {
        generation: Some(1),
        launch_file: Some(PathBuf::from(format!("/run/{unit}.launch"))),
        ..saved(unit, A)
    };
    let config = config("boot-1");
    let now = config.clock_anchor.0;
    let restored = state(
        "boot-0",
        vec![with_generation("a.service"), with_generation("b.service")],
    );
    let mut core = Core::new(config, restored, now);
    let outputs: Vec<Output> = std::iter::from_fn(|| core.poll_output()).collect();
    let first_save = outputs.iter().position(|o| matches!(o, Output::Save(_)));
    let first_release = outputs
        .iter()
        .position(|o| matches!(o, Output::RemoveLaunchFile { .. }));
    assert!(
        first_release.is_some() && first_save < first_release,
        "{outputs:?}"
    );
    // The first save of a life is a snapshot, and it holds every watch taken up.
    match first_save.map(|at| &outputs[at]) {
        Some(Output::Save(save)) => match &**save {
            StateSave::Snapshot(state) => assert_eq!(state.watches.len(), 2, "{state:?}"),
            other => panic!("expected a snapshot, got {other:?}"),
        },
        other => panic!("expected a save, got {other:?}"),
    }
}
#[test]
fn the_log_line_of_a_proof_names_its_unit_invocation_and_cause() {
    let mut s = watching("b.service", "active");
    s.changed("b.service", "inactive", A);
    s.cgroups
        .insert("/app.slice/b.service".into(), CgroupReading::Empty);
    s.input(Input::CgroupChanged { key: UnitKey(0) });
    let subjects: Vec<LogSubject> = s
        .take()
        .into_iter()
        .filter_map(|o| match o {
            Output::Log {
                about: Some(about), ..
            } => Some(*about),
            _ => None,
        })
        .collect();
    let proof = LogSubject {
        unit: "b.service".into(),
        invocation: A.into(),
        cause: Some(Cause::Exited),
    };
    assert!(subjects.contains(&proof), "{subjects:?}");
    assert!(
        subjects.iter().all(|about| about.unit == "b.service"),
        "{subjects:?}"
    );
}

/// The cgroup is read on a notice only when the proof would use the reading: while our
/// invocation runs, a notice reads nothing (in a burst of deaths each read of a removed cgroup
/// can wait tens of milliseconds on the cgroup filesystem's lock, for nothing); once it is
/// terminal and processes remain, a notice reads, and an empty reading proves.
#[test]
fn a_cgroup_notice_is_read_only_when_the_proof_would_use_the_reading() {
    let mut s = watching("b.service", "active");
    let cgroup = "/app.slice/b.service";
    let before = s.reads;
    s.cgroups.insert(cgroup.into(), CgroupReading::Empty);
    s.input(Input::CgroupChanged { key: UnitKey(0) });
    assert_eq!(s.reads, before, "a read while our invocation runs");
    assert_eq!(s.phase("b.service"), Phase::Watching);

    s.cgroups.insert(cgroup.into(), CgroupReading::Populated);
    s.changed("b.service", "inactive", A);
    assert_eq!(
        s.reads,
        before + 1,
        "the proof's own read, after the terminal state"
    );
    assert_eq!(s.phase("b.service"), Phase::Watching, "processes remain");

    s.cgroups.insert(cgroup.into(), CgroupReading::Empty);
    s.input(Input::CgroupChanged { key: UnitKey(0) });
    assert_eq!(
        s.reads,
        before + 2,
        "a notice while the proof waits for the cgroup"
    );
    assert_eq!(s.phase("b.service"), Phase::Proven);

    s.input(Input::CgroupChanged { key: UnitKey(0) });
    assert_eq!(s.reads, before + 2, "a read after the proof");
}

mod beginnings;
mod later_roots;
mod listing;
mod reads;
mod records;
mod stats;
mod status;

/// A RemainAfterExit= unit watched while active (exited) reads no ControlGroup: systemd pruned
/// the cgroup when it entered `exited`. Its ExecStop= realizes the cgroup again under the same
/// invocation, and with KillMode=process a child of ExecStop= outlives the stop: the "no
/// cgroup" of the first read is no fact about the state after it.
#[test]
fn a_remain_after_exit_unit_watched_while_exited_learns_the_cgroup_its_exec_stop_makes() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    s.request(r#"{"cmd":"watch","unit":"rae.service"}"#);
    s.answer_reads(|u| Ok(snapshot(u, "active", A, "")));
    assert_eq!(s.phase("rae.service"), Phase::Watching);
    let cgroup = "/app.slice/rae.service";
    s.cgroups.insert(cgroup.into(), CgroupReading::Populated);
    s.changed("rae.service", "deactivating", A);
    s.changed("rae.service", "inactive", A);
    assert_eq!(
        s.phase("rae.service"),
        Phase::Watching,
        "an empty ControlGroup read before the stop proves nothing after it"
    );
    let read = s.answer_reads(|u| Ok(snapshot(u, "inactive", A, cgroup)));
    assert_eq!(
        read,
        ["rae.service"],
        "the unit is read again for its cgroup"
    );
    assert_eq!(
        s.phase("rae.service"),
        Phase::Watching,
        "ExecStop's leftover lives"
    );
    s.cgroups.insert(cgroup.into(), CgroupReading::Empty);
    s.input(Input::CgroupChanged { key: UnitKey(0) });
    assert_eq!(s.phase("rae.service"), Phase::Proven);
    assert_eq!(s.proofs().len(), 0, "nobody waited");
}

/// The same unit with no leftover: a read after the stop that finds no ControlGroup is
/// systemd's word that the cgroup was empty when it let it go.
#[test]
fn a_remain_after_exit_unit_is_proven_once_a_read_after_its_stop_finds_no_cgroup() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    s.request(r#"{"cmd":"watch","unit":"rae.service"}"#);
    s.answer_reads(|u| Ok(snapshot(u, "active", A, "")));
    s.changed("rae.service", "inactive", A);
    assert_eq!(s.phase("rae.service"), Phase::Watching);
    s.answer_reads(|u| Ok(snapshot(u, "inactive", A, "")));
    assert_eq!(s.phase("rae.service"), Phase::Proven);
}

/// A read that finds no ControlGroup while the unit runs an invocation after ours is a fact
/// about ours for good, however much systemd said since: systemd let go of the cgroup, so found
/// it empty, after ours ended, and never runs ours again. Without this, a RemainAfterExit= unit
/// restarted outside faster than it is read is read again and again, and never proven.
#[test]
fn a_read_that_finds_no_cgroup_under_a_later_invocation_proves_ours_despite_newer_signals() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    s.request(r#"{"cmd":"watch","unit":"rae.service"}"#);
    s.answer_reads(|u| Ok(snapshot(u, "active", A, "")));
    s.changed("rae.service", "inactive", A);
    s.changed("rae.service", "inactive", B);
    s.changed("rae.service", "active", B);
    s.answer_reads(|u| Ok(snapshot(u, "active", B, "")));
    assert_eq!(
        s.stops(),
        [("rae.service".into(), StopKind::Proof(StopReason::Foreign))]
    );
    let key = s.read_asked();
    s.changed("rae.service", "inactive", B);
    s.changed("rae.service", "inactive", C);
    s.changed("rae.service", "active", C);
    let serial = s.serial;
    s.changed("rae.service", "deactivating", C);
    let read = UnitSnapshot {
        serial,
        ..snapshot("rae.service", "active", C, "")
    };
    s.input(Input::UnitRead {
        key,
        result: Ok(read),
    });
    assert_eq!(s.phase("rae.service"), Phase::Proven);
    assert!(
        !s.take()
            .iter()
            .any(|o| matches!(o, Output::ReadUnit { .. })),
        "not read again"
    );
}

/// A Slice= change between two invocations: the next one runs in another cgroup. Our
/// invocation's KillMode=process leftover is in ours, so the count of leftovers looks there,
/// not in the cgroup of the invocation that replaced it.
#[test]
fn leftovers_are_counted_in_our_invocations_cgroup_after_a_slice_change() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    let ours = "/a.slice/s.service";
    let theirs = "/b.slice/s.service";
    s.cgroups.insert(ours.into(), CgroupReading::Populated);
    s.request(r#"{"cmd":"watch","unit":"s.service"}"#);
    s.answer_reads(|u| Ok(snapshot(u, "active", A, ours)));
    s.request(r#"{"cmd":"stop","unit":"s.service"}"#);
    s.changed("s.service", "inactive", A);
    s.leftovers.insert(ours.into(), vec![42]);
    s.cgroups.insert(theirs.into(), CgroupReading::Populated);
    s.changed("s.service", "active", B);
    let read = s.answer_reads(|u| Ok(snapshot(u, "active", B, theirs)));
    assert_eq!(read, ["s.service"], "a new invocation is read again");
    assert_eq!(
        s.phase("s.service"),
        Phase::Stopping,
        "our leftover lives in our cgroup"
    );
    s.input(Input::LeftoverExited {
        key: UnitKey(0),
        pid: 42,
    });
    s.leftovers.insert(ours.into(), vec![]);
    s.input(Input::LeftoverExited {
        key: UnitKey(0),
        pid: 42,
    });
    assert_eq!(s.phase("s.service"), Phase::Proven);
}

/// StopUnit names a unit, not an invocation: a stop asked for once systemd said ours ended
/// would reach the next invocation, started outside meanwhile. It is not sent.
#[test]
fn a_stop_requested_after_our_invocation_ended_is_not_sent() {
    let mut s = watching("late.service", "active");
    // KillMode=process: a leftover keeps the proof open after the unit is inactive.
    s.changed("late.service", "inactive", A);
    assert_eq!(s.phase("late.service"), Phase::Watching);
    s.take();
    s.request(r#"{"cmd":"stop","unit":"late.service"}"#);
    assert_eq!(
        s.stops(),
        [],
        "our invocation is over: nothing of ours to stop"
    );
    assert_eq!(s.phase("late.service"), Phase::Stopping);
}

/// `systemctl clean` runs under the last InvocationID in ActiveState `maintenance`, only once
/// ours ended (`service_clean`): a stop asked for then is not sent either, as the next start
/// may already run (found by the simulator's model of `clean`).
#[test]
fn a_stop_requested_while_the_unit_is_cleaned_is_not_sent() {
    let mut s = watching("clean.service", "active");
    s.changed("clean.service", "inactive", A);
    s.changed("clean.service", "maintenance", A);
    s.take();
    s.request(r#"{"cmd":"stop","unit":"clean.service"}"#);
    assert_eq!(s.stops(), [], "ours ended; the clean is systemd's own");
}

/// `auto-restart` still names our invocation, but ours ended (systemd said `failed` before
/// it) and the restart, which may already run, gets a new InvocationID: a stop asked for then
/// is not sent either.
#[test]
fn a_stop_requested_while_ours_waits_to_restart_is_not_sent() {
    let mut s = watching("again.service", "active");
    s.changed("again.service", "failed", A);
    let restarting = UnitChange {
        active_state: Some("activating".into()),
        sub_state: Some("auto-restart".into()),
        invocation: Some(A.into()),
        ..UnitChange::default()
    };
    s.signal(SystemdSignal::UnitChanged {
        path: unit_path("again.service"),
        change: restarting,
    });
    s.take();
    s.request(r#"{"cmd":"stop","unit":"again.service"}"#);
    assert_eq!(s.stops(), [], "ours ended; the restart is not ours to stop");
}

/// The final stop of a proven generation removes its files: not once the unit has begun
/// another invocation since ours, even one that is over too.
#[test]
fn a_generations_final_stop_is_not_sent_once_another_invocation_ran() {
    let mut s = Script::watching_generation_3();
    s.cgroups
        .insert("/app.slice/g.service".into(), CgroupReading::Gone);
    s.changed("g.service", "inactive", A);
    assert_eq!(s.phase("g.service"), Phase::Proven);
    let read = s.answer_reads(|u| Ok(snapshot(u, "inactive", B, "")));
    assert_eq!(read, ["g.service"], "the final stop waits for a read");
    assert_eq!(s.stops(), [], "the unit ran another invocation since ours");
}

/// The agent stops an invocation started outside it; with KillMode=process that invocation
/// leaves a process behind. It began after ours was over, so it is not ours to wait for: once
/// the stopped invocation is over, only processes older than it keep our proof open.
#[test]
fn a_stopped_foreign_invocations_leftover_does_not_hold_our_proof() {
    let mut s = watching("f.service", "active");
    let cgroup = "/app.slice/f.service";
    let theirs = UnitChange {
        active_state: Some("active".into()),
        invocation: Some(B.into()),
        inactive_exit_us: Some(5_000_000),
        main_pid: Some(300),
        ..UnitChange::default()
    };
    s.signal(SystemdSignal::UnitChanged {
        path: unit_path("f.service"),
        change: theirs,
    });
    assert_eq!(
        s.stops(),
        [("f.service".to_owned(), StopKind::Proof(StopReason::Foreign))]
    );
    s.answer_reads(|u| Ok(snapshot(u, "active", B, cgroup)));
    assert_eq!(s.phase("f.service"), Phase::Watching, "theirs still runs");
    // Their main process is stopped; their leftover (started after they began) stays.
    s.leftovers.insert(cgroup.into(), vec![]);
    s.changed("f.service", "inactive", B);
    assert_eq!(
        s.counted_against.as_ref().map(|next| next.began_us),
        Some(Some(5_000_000)),
        "counted against when the stopped invocation began, though it is over"
    );
    assert_eq!(s.phase("f.service"), Phase::Proven);
    let views = s.list();
    let proof = views[0].proof.as_ref().expect("a proof");
    assert_eq!(proof.cause, Cause::RestartedOutside);
}

/// A foreign invocation the agent stopped is a writer of the unit until systemd says it is
/// over, even where our cgroup is already empty: after a Slice= change it runs in another.
#[test]
fn restarted_outside_waits_until_the_stopped_invocation_is_over() {
    let mut s = watching("m.service", "active");
    let ours = "/app.slice/m.service";
    s.cgroups.insert(ours.into(), CgroupReading::Gone);
    s.changed("m.service", "active", B);
    let read = s.answer_reads(|u| Ok(snapshot(u, "active", B, "/b.slice/m.service")));
    assert_eq!(read, ["m.service"]);
    s.changed("m.service", "deactivating", B);
    assert_eq!(s.phase("m.service"), Phase::Watching, "theirs still stops");
    s.changed("m.service", "inactive", B);
    assert_eq!(s.phase("m.service"), Phase::Proven);
    let views = s.list();
    let proof = views[0].proof.as_ref().expect("a proof");
    assert_eq!(proof.cause, Cause::RestartedOutside);
}

/// After ours, the unit ran one invocation, then another. What the first of them left in the
/// cgroup is no more ours than what the second leaves: a count is made against the earliest
/// beginning systemd told and every session they began, though the facts keep only the
/// current invocation's.
#[test]
fn leftovers_are_counted_against_every_invocation_after_ours() {
    let mut s = watching("l.service", "active");
    let cgroup = "/app.slice/l.service";
    s.leftovers.insert(cgroup.into(), vec![41]);
    s.changed("l.service", "inactive", A);
    let begins = |invocation: &str, began_us: u64, main_pid: u32| UnitChange {
        active_state: Some("activating".into()),
        invocation: Some(invocation.into()),
        inactive_exit_us: Some(began_us),
        main_pid: Some(main_pid),
        ..UnitChange::default()
    };
    s.signal(SystemdSignal::UnitChanged {
        path: unit_path("l.service"),
        change: begins(B, 5_000_000, 300),
    });
    s.changed("l.service", "inactive", B);
    s.signal(SystemdSignal::UnitChanged {
        path: unit_path("l.service"),
        change: begins(C, 9_000_000, 400),
    });
    // A count is made again once a process it held exits.
    s.leftovers.insert(cgroup.into(), vec![42]);
    s.input(Input::LeftoverExited {
        key: UnitKey(0),
        pid: 41,
    });
    assert_eq!(
        s.counted_against,
        Some(NextInvocation {
            began_us: Some(5_000_000),
            roots_began_us: Some(9_000_000),
            roots: vec![400],
            gone_roots: vec![GoneRoot {
                pid: 300,
                began_us: Some(5_000_000)
            }],
            // 41 was ours: a root named with its pid and gone is judged by its start.
            once_held: OnceHeld::from(vec![started(41)]),
            counted_roots: vec![],
        })
    );
    assert_eq!(s.phase("l.service"), Phase::Watching, "pid 42 may be ours");
}

/// Every count of leftovers after ours is told the MainPIDs systemd named for our invocation:
/// one it names again for a later invocation is its guess of our process, though no count saw
/// it before it was gone (found by the simulator, 233102442500749).
#[test]
fn later_counts_are_told_the_roots_systemd_named_for_our_invocation() {
    let mut s = watching("g.service", "active");
    let cgroup = "/app.slice/g.service";
    s.signal(SystemdSignal::UnitChanged {
        path: unit_path("g.service"),
        change: UnitChange {
            main_pid: Some(115),
            ..UnitChange::default()
        },
    });
    s.request(r#"{"cmd":"stop","unit":"g.service"}"#);
    s.changed("g.service", "inactive", A);
    s.leftovers.insert(cgroup.into(), vec![139]);
    // B's ExecStart= (130) forks the daemon and exits; systemd guesses our 115 for B.
    s.b_is("g.service", "activating", 130);
    s.signal(SystemdSignal::UnitChanged {
        path: unit_path("g.service"),
        change: UnitChange {
            active_state: Some("active".into()),
            main_pid: Some(115),
            ..UnitChange::default()
        },
    });
    let counted = s
        .counted_against
        .take()
        .expect("a count against invocation B");
    assert_eq!(counted.counted_roots, [115], "{counted:?}");
    assert_eq!(s.phase("g.service"), Phase::Stopping, "pid 139 may be ours");
}

/// `unit` watched, stopped at our request and over (invocation A), `leftovers` in its cgroup.
fn stopped_beside(unit: &str, leftovers: &[i32]) -> Script {
    let mut s = watching(unit, "active");
    s.request(&format!(r#"{{"cmd":"stop","unit":"{unit}"}}"#));
    s.changed(unit, "inactive", A);
    s.leftovers
        .insert(format!("/app.slice/{unit}"), leftovers.to_vec());
    s
}

impl Script {
    /// The last leftover of `unit` (watched first), `pid`, exits: a count again finds none.
    fn last_leftover_exits(&mut self, unit: &str, pid: i32) {
        self.leftovers.remove(&format!("/app.slice/{unit}"));
        self.input(Input::LeftoverExited {
            key: UnitKey(0),
            pid,
        });
    }

    /// systemd says `unit` runs invocation B, begun at 5 s, in `active` with `main_pid`.
    fn b_is(&mut self, unit: &str, active: &str, main_pid: u32) {
        self.signal(SystemdSignal::UnitChanged {
            path: unit_path(unit),
            change: UnitChange {
                active_state: Some(active.into()),
                invocation: Some(B.into()),
                inactive_exit_us: Some(5_000_000),
                main_pid: Some(main_pid),
                ..UnitChange::default()
            },
        });
    }
}

/// systemd may name our leftover a later invocation's MainPID (a guess, see
/// `earlier_processes`), before or after it exits. Each leftover that exits, its exit heard
/// from its pidfd or gone before one held it, is kept with its start, and every later count
/// is told of it: a root gone with that pid is judged by that start.
#[test]
fn every_later_count_is_told_the_start_of_each_leftover_that_exited() {
    let mut s = stopped_beside("g.service", &[300, 301]);
    s.exited_before_held = vec![302];
    s.b_is("g.service", "active", 300);
    assert_eq!(
        s.counted_against.take().map(|n| n.once_held),
        Some(OnceHeld::None)
    );
    // 300 exits, and systemd then names no MainPID.
    s.exited_before_held = vec![];
    s.leftovers.insert("/app.slice/g.service".into(), vec![301]);
    s.input(Input::LeftoverExited {
        key: UnitKey(0),
        pid: 300,
    });
    s.b_is("g.service", "failed", 0);
    let next = s.counted_against.take().expect("leftovers counted");
    assert_eq!(next.gone_pids(), [300]);
    assert_eq!(next.once_held.as_slice(), [started(302), started(300)]);
    assert_eq!(s.phase("g.service"), Phase::Stopping, "pid 301 is ours");
}

/// A count made before a held leftover's exit is heard no longer finds it: its start is kept
/// all the same (found by the simulator, seed 160436693682008: systemd's word that the
/// guessed MainPID was gone came before its pidfd was read).
#[test]
fn a_leftover_a_count_no_longer_finds_is_kept_with_its_start() {
    let mut s = stopped_beside("n.service", &[300, 301]);
    s.b_is("n.service", "active", 300);
    s.leftovers.insert("/app.slice/n.service".into(), vec![301]);
    s.b_is("n.service", "deactivating", 0);
    assert_eq!(
        s.counted_against.take().map(|n| n.once_held),
        Some(OnceHeld::None)
    );
    s.input(Input::CgroupChanged { key: UnitKey(0) });
    let next = s.counted_against.take().expect("leftovers counted");
    assert_eq!(next.once_held.as_slice(), [started(300)]);
    assert_eq!(s.phase("n.service"), Phase::Stopping, "pid 301 is ours");
}

/// A `Reloading(false)` lost on a live connection would leave every unit stale for good: the
/// safety-net relist takes a reload that has lasted a whole interval as over, and the unit is
/// proven from a read sent after it.
#[test]
fn a_reload_never_heard_to_end_ends_at_the_next_relist() {
    let every = Duration::from_secs(300);
    let config = CoreConfig {
        resync_interval: Some(every),
        ..config("boot-1")
    };
    let mut s = Script::configured(config, AgentState::default());
    s.input(Input::BusUp);
    let cgroup = "/app.slice/r.service";
    s.cgroups.insert(cgroup.into(), CgroupReading::Populated);
    s.request(r#"{"cmd":"watch","unit":"r.service"}"#);
    s.answer_reads(|u| Ok(snapshot(u, "active", A, cgroup)));
    // The reload begins a second before the first relist, which finds it young.
    s.pass(every - Duration::from_secs(1));
    s.signal(SystemdSignal::Reloading(true));
    s.cgroups.insert(cgroup.into(), CgroupReading::Gone);
    s.changed("r.service", "inactive", A);
    assert_eq!(
        s.phase("r.service"),
        Phase::Watching,
        "stale while reloading"
    );
    s.pass(Duration::from_secs(1));
    assert_eq!(
        s.answer_reads(|u| Ok(snapshot(u, "inactive", A, cgroup))),
        Vec::<String>::new(),
        "nothing is read while systemd reloads"
    );
    s.pass(every);
    assert_eq!(
        s.answer_reads(|u| Ok(snapshot(u, "inactive", A, cgroup))),
        ["r.service"]
    );
    assert_eq!(s.phase("r.service"), Phase::Proven);
}

/// The core tells its driver when to call `handle_timeout` next: the earliest of what it
/// waits for, here the next relist, then a `wait`'s deadline before it. The driver sleeps
/// until then; the scripted tests fire timers at every turn, so only this checks it.
#[test]
fn the_core_asks_to_be_woken_at_its_earliest_deadline() {
    let every = Duration::from_secs(300);
    let config = CoreConfig {
        resync_interval: Some(every),
        ..config("boot-1")
    };
    let mut s = Script::configured(config, AgentState::default());
    let start = s.now;
    s.input(Input::BusUp);
    let cgroup = "/app.slice/w.service";
    s.cgroups.insert(cgroup.into(), CgroupReading::Populated);
    s.request(r#"{"cmd":"watch","unit":"w.service"}"#);
    s.answer_reads(|u| Ok(snapshot(u, "active", A, cgroup)));
    s.pass(Duration::from_secs(1));
    assert_eq!(
        s.core.poll_timeout(),
        Some(start + every),
        "the next relist"
    );
    s.request(r#"{"cmd":"wait","unit":"w.service","timeout_ms":10000}"#);
    assert_eq!(
        s.core.poll_timeout(),
        Some(s.now + Duration::from_secs(10)),
        "the wait's deadline"
    );
}

/// How many replies of each kind `outputs` holds: (events, still running).
fn answered(outputs: &[Output]) -> (usize, usize) {
    let count = |pick: fn(&Answer) -> bool| {
        outputs
            .iter()
            .filter(|o| matches!(o, Output::Reply { answer, .. } if pick(answer)))
            .count()
    };
    (
        count(|a| matches!(a, Answer::Event(_))),
        count(|a| matches!(a, Answer::StillRunning(_))),
    )
}

/// `wait` and `stop` with a timeout answer "still running" only once their time is up, and a
/// waiter that gives up leaves the others of the unit to the proof.
#[test]
fn a_timeout_answers_only_its_own_request_and_only_when_due() {
    let mut s = watching("w.service", "active");
    s.request(r#"{"cmd":"wait","unit":"w.service","timeout_ms":10000}"#);
    s.request(r#"{"cmd":"stop","unit":"w.service","timeout_ms":20000}"#);
    s.request(r#"{"cmd":"wait","unit":"w.service"}"#);
    s.take();
    s.pass(Duration::from_secs(1));
    assert_eq!(answered(&s.take()), (0, 0), "no time is up after 1 s");
    s.pass(Duration::from_secs(10));
    assert_eq!(answered(&s.take()), (0, 1), "the wait's 10 s are up");
    s.pass(Duration::from_secs(10));
    assert_eq!(answered(&s.take()), (0, 1), "the stop's 20 s are up");
    s.cgroups
        .insert("/app.slice/w.service".into(), CgroupReading::Gone);
    s.changed("w.service", "inactive", A);
    assert_eq!(
        answered(&s.take()),
        (1, 0),
        "the proof answers the waiter with no timeout"
    );
}

/// A generation proven after the agent restarted gets its final stop unless a stop of ours
/// succeeded before the restart: the state file carries that, since the control side's files
/// go only with a StopUnit of the unit.
#[test]
fn a_generations_final_stop_after_a_restart_depends_on_a_stop_that_succeeded_before() {
    for stopped_before in [false, true] {
        let mut s = Script::watching_generation_3();
        if stopped_before {
            s.request(r#"{"cmd":"stop","unit":"g.service"}"#);
            s.take();
            s.input(Input::StopDone {
                key: UnitKey(0),
                kind: StopKind::Proof(StopReason::Requested),
                succeeded: true,
            });
        }
        let saved = s.save();
        let mut s = Script::restored(saved, "boot-1");
        s.input(Input::BusUp);
        s.cgroups
            .insert("/app.slice/g.service".into(), CgroupReading::Gone);
        s.answer_reads(|u| Ok(snapshot(u, "inactive", A, "/app.slice/g.service")));
        assert_eq!(s.phase("g.service"), Phase::Proven);
        s.answer_reads(|u| Ok(snapshot(u, "inactive", A, "/app.slice/g.service")));
        let expected = if stopped_before {
            vec![]
        } else {
            vec![("g.service".to_owned(), StopKind::FinalGeneration)]
        };
        assert_eq!(s.stops(), expected, "stopped before: {stopped_before}");
    }
}

/// A read sent before a reload and answered after it may hold what systemd said before:
/// it proves nothing, and the unit is read again.
#[test]
fn a_read_that_spans_a_reload_proves_nothing() {
    let mut s = watching("span.service", "active");
    let cgroup = "/app.slice/span.service";
    s.signal(SystemdSignal::UnitNew {
        unit: "span.service".into(),
    });
    s.signal(SystemdSignal::Reloading(true));
    s.signal(SystemdSignal::Reloading(false));
    s.cgroups.insert(cgroup.into(), CgroupReading::Gone);
    let read = s.answer_reads(|u| Ok(snapshot(u, "inactive", A, cgroup)));
    assert_eq!(read, ["span.service"], "the read sent before the reload");
    assert_eq!(s.phase("span.service"), Phase::Watching);
    let read = s.answer_reads(|u| Ok(snapshot(u, "inactive", A, cgroup)));
    assert_eq!(read, ["span.service"], "read again after the reload");
    assert_eq!(s.phase("span.service"), Phase::Proven);
}

/// How many `watch` answers and refusals `outputs` holds: (answers, refusals).
fn watch_answers(outputs: &[Output]) -> (usize, usize) {
    let answers = outputs
        .iter()
        .filter(|o| {
            matches!(
                o,
                Output::Reply {
                    answer: Answer::Watch(_),
                    ..
                }
            )
        })
        .count();
    let refusals = outputs
        .iter()
        .filter(|o| {
            matches!(
                o,
                Output::Reply {
                    answer: Answer::Error(ErrorKind::BadRequest, _),
                    ..
                }
            )
        })
        .count();
    (answers, refusals)
}

/// A unit watched with options is watched again with the same options or none; other
/// options are refused. A `watch` that finds the unit's watch not yet read (made by `wait`)
/// is answered with the first read, not before.
#[test]
fn a_watch_again_joins_with_the_same_options_or_none_and_waits_for_the_first_read() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    let cgroup = "/app.slice/o.service";
    s.cgroups.insert(cgroup.into(), CgroupReading::Populated);
    s.request(r#"{"cmd":"wait","unit":"o.service"}"#);
    s.request(r#"{"cmd":"watch","unit":"o.service"}"#);
    s.save();
    assert_eq!(
        watch_answers(&s.outputs),
        (0, 0),
        "not before the first read"
    );
    s.answer_reads(|u| Ok(snapshot(u, "active", A, cgroup)));
    s.save();
    assert_eq!(watch_answers(&s.take()), (1, 0));

    let mut s = Script::new();
    s.input(Input::BusUp);
    s.cgroups.insert(cgroup.into(), CgroupReading::Populated);
    s.request(r#"{"cmd":"watch","unit":"o.service","run_dir":"/run/o"}"#);
    s.answer_reads(|u| Ok(snapshot(u, "active", A, cgroup)));
    s.save();
    s.take();
    s.request(r#"{"cmd":"watch","unit":"o.service","run_dir":"/run/o"}"#);
    s.request(r#"{"cmd":"watch","unit":"o.service"}"#);
    s.save();
    assert_eq!(
        watch_answers(&s.take()),
        (2, 0),
        "the same options, or none"
    );
    s.request(r#"{"cmd":"watch","unit":"o.service","run_dir":"/run/other"}"#);
    assert_eq!(watch_answers(&s.take()), (0, 1), "other options");
}

/// Watching a proven unit again with another invocation watches that invocation; it does
/// not answer with the old proof.
#[test]
fn a_proven_unit_watched_with_another_invocation_is_watched_afresh() {
    let mut s = watching("p.service", "active");
    s.cgroups
        .insert("/app.slice/p.service".into(), CgroupReading::Gone);
    s.changed("p.service", "inactive", A);
    assert_eq!(s.phase("p.service"), Phase::Proven);
    s.cgroups
        .insert("/app.slice/p.service".into(), CgroupReading::Populated);
    s.request(&format!(
        r#"{{"cmd":"watch","unit":"p.service","invocation":"{B}"}}"#
    ));
    s.answer_reads(|u| Ok(snapshot(u, "active", B, "/app.slice/p.service")));
    let views = s.list();
    assert_eq!(views.len(), 1);
    assert_eq!(views[0].invocation.as_deref(), Some(B));
    assert_eq!(views[0].phase, Phase::Watching);
}

/// A stop asked for in this life of the agent is saved as asked for, and after a restart a
/// new invocation is then our stop's replacement, not an invocation started outside.
#[test]
fn a_stop_asked_for_is_saved_and_outlives_a_restart() {
    let mut s = watching("k.service", "active");
    s.request(r#"{"cmd":"stop","unit":"k.service"}"#);
    let saved = s.save();
    assert!(saved.watches[0].stop_requested);
    let mut s = Script::restored(saved, "boot-1");
    assert!(
        s.list()[0].stop_requested,
        "listed so before the first read"
    );
    s.input(Input::BusUp);
    s.cgroups
        .insert("/app.slice/k.service".into(), CgroupReading::Gone);
    s.answer_reads(|u| Ok(snapshot(u, "activating", B, "/app.slice/k.service")));
    assert_eq!(s.stops(), [], "no foreign stop of our stop's replacement");
    let views = s.list();
    let proof = views[0].proof.as_ref().expect("proven");
    assert_eq!(proof.cause, Cause::ReplacedAfterStop);
    assert!(proof.stop_requested);
}

/// Generation 3 of `g.service` proven; the saved state as an agent killed right after the
/// proof's own save (the first save of that turn) left it, and the script that went on.
fn proven_generation_3_killed_after_its_save() -> (AgentState, Script) {
    let mut s = Script::watching_generation_3();
    let mut saved = s.save();
    s.take();
    s.cgroups
        .insert("/app.slice/g.service".into(), CgroupReading::Gone);
    s.changed("g.service", "inactive", A);
    assert_eq!(s.phase("g.service"), Phase::Proven);
    let proof_save = s
        .outputs
        .iter()
        .find_map(|o| match o {
            Output::Save(save) => Some(save.clone()),
            _ => None,
        })
        .expect("the proof is saved");
    match *proof_save {
        StateSave::Changes(changes) => saved.apply([&changes]),
        StateSave::Snapshot(state) => saved = state,
    }
    (saved, s)
}

/// An agent killed after a generation's proof was saved and before its release ended carries
/// the release out after its restart: the launch file is removed (again at worst, when it was
/// this generation's alone) and the final stop goes out once a read shows the unit runs
/// nothing. A release that ended is not done again.
#[test]
fn a_release_cut_short_by_a_kill_is_carried_out_after_the_restart() {
    let launch_file = PathBuf::from("/run/g/launch-3");
    for killed in [true, false] {
        let (mut saved, mut s) = proven_generation_3_killed_after_its_save();
        assert!(saved.watches[0].release_unfinished);
        if !killed {
            s.answer_reads(|u| Ok(snapshot(u, "inactive", A, "/app.slice/g.service")));
            assert_eq!(
                s.stops(),
                [("g.service".to_owned(), StopKind::FinalGeneration)]
            );
            s.input(Input::StopDone {
                key: UnitKey(0),
                kind: StopKind::FinalGeneration,
                succeeded: true,
            });
            saved = s.save();
            assert!(!saved.watches[0].release_unfinished);
        }
        let mut s = Script::restored(saved, "boot-1");
        let removed = s
            .take()
            .iter()
            .filter(|o| matches!(o, Output::RemoveLaunchFile { path, .. } if *path == launch_file))
            .count();
        assert_eq!(removed, usize::from(killed), "killed: {killed}");
        s.input(Input::BusUp);
        s.answer_reads(|u| Ok(snapshot(u, "inactive", A, "/app.slice/g.service")));
        let expected = if killed {
            vec![("g.service".to_owned(), StopKind::FinalGeneration)]
        } else {
            vec![]
        };
        assert_eq!(s.stops(), expected, "killed: {killed}");
    }
}

/// A release resumed after a restart leaves where it is a launch file that another saved
/// watch names too: it may be that watch's by now.
#[test]
fn a_resumed_release_leaves_a_launch_file_another_saved_watch_names() {
    let (mut state, _) = proven_generation_3_killed_after_its_save();
    assert!(state.watches[0].release_unfinished);
    state.watches.push(SavedWatch {
        generation: Some(4),
        launch_file: Some(PathBuf::from("/run/g/launch-3")),
        ..saved("h.service", B)
    });
    let mut s = Script::restored(state, "boot-1");
    let removed: Vec<Output> = s
        .take()
        .into_iter()
        .filter(|o| matches!(o, Output::RemoveLaunchFile { .. }))
        .collect();
    assert!(removed.is_empty(), "{removed:?}");
}

/// A release resumed after a restart hears the unit's signals while its final stop waits for
/// a read: a read older than a signal that the unit began another invocation sends nothing.
#[test]
fn a_resumed_release_hears_the_units_signals_before_its_final_stop() {
    let (saved, _) = proven_generation_3_killed_after_its_save();
    let mut s = Script::restored(saved, "boot-1");
    s.input(Input::BusUp);
    let key = s
        .take()
        .into_iter()
        .find_map(|o| match o {
            Output::ReadUnit { key, .. } => Some(key),
            _ => None,
        })
        .expect("the unit is read for its final stop");
    let read_serial = s.next_serial();
    s.changed("g.service", "activating", B);
    let read = UnitSnapshot {
        serial: read_serial,
        ..snapshot("g.service", "inactive", "", "")
    };
    s.input(Input::UnitRead {
        key,
        result: Ok(read),
    });
    assert_eq!(s.stops(), [], "the unit runs another invocation now");
}

/// A watch taken up after a restart gathers what systemd says of the invocations after ours
/// from the first message of the connection on, before its own first read is back: ours
/// began before this life, so none of them is earlier. A leftover in the session of the
/// MainPID of such an invocation is then that invocation's, not ours.
#[test]
fn a_restored_watch_gathers_later_invocations_before_its_first_read() {
    let mut s = Script::restored(state("boot-1", vec![saved("r.service", A)]), "boot-1");
    s.input(Input::BusUp);
    let reads = s.take();
    s.main_pid("r.service", 77);
    s.changed("r.service", "active", B);
    s.changed("r.service", "inactive", B);
    s.changed("r.service", "active", C);
    s.outputs = reads;
    s.cgroups
        .insert("/app.slice/r.service".into(), CgroupReading::Populated);
    s.answer_reads(|u| Ok(snapshot(u, "active", C, "/app.slice/r.service")));
    assert_eq!(
        s.stops(),
        [("r.service".to_owned(), StopKind::Proof(StopReason::Foreign))]
    );
    s.changed("r.service", "inactive", C);
    s.assert_counted_as_a_later_root(77);
}

/// What a new watch hears before its first read comes back is kept until that read tells
/// whose it is: an invocation named in a message newer than the read is ours or a later one,
/// so the MainPID said of it is a root after ours.
#[test]
fn what_a_new_watch_hears_before_its_first_read_counts_once_the_read_places_it() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    s.request(r#"{"cmd":"watch","unit":"w.service"}"#);
    let key = s.read_asked();
    let read_serial = s.next_serial();
    s.main_pid("w.service", 77);
    s.changed("w.service", "active", B);
    s.changed("w.service", "inactive", B);
    s.changed("w.service", "active", C);
    s.cgroups
        .insert("/app.slice/w.service".into(), CgroupReading::Populated);
    let read = UnitSnapshot {
        serial: read_serial,
        ..snapshot("w.service", "active", A, "/app.slice/w.service")
    };
    s.input(Input::UnitRead {
        key,
        result: Ok(read),
    });
    assert_eq!(
        s.stops(),
        [("w.service".to_owned(), StopKind::Proof(StopReason::Foreign))]
    );
    s.changed("w.service", "inactive", C);
    s.assert_counted_as_a_later_root(77);
}

/// A read handled after signals that named a later invocation (systemd answered it before it
/// sent them, or they were lost with a connection) still tells the MainPID of the invocation
/// it names, which is after ours: a leftover in that root's session is not ours.
#[test]
fn a_late_read_places_its_main_pid_with_the_invocation_it_names() {
    let mut s = watching("l.service", "active");
    // A process whose session's leader is gone: ours, unless the leader was another's root.
    s.leftovers.insert("/app.slice/l.service".into(), vec![78]);
    s.changed("l.service", "inactive", A);
    s.changed("l.service", "active", B);
    let key = s.read_asked();
    let read_serial = s.serial;
    s.changed("l.service", "inactive", B);
    s.changed("l.service", "active", C);
    let mut read = UnitSnapshot {
        serial: read_serial,
        ..snapshot("l.service", "active", B, "/app.slice/l.service")
    };
    read.current.pids = Some(((77, 0), read_serial));
    s.input(Input::UnitRead {
        key,
        result: Ok(read),
    });
    s.changed("l.service", "inactive", C);
    s.assert_counted_as_a_later_root(77);
}

/// A ControlPID heard when the connection broke between the Service interface's change and the
/// Unit interface's that named its invocation (`send_changed_signal`) is placed with ours, and
/// counts on the next connection are told it as a root of ours until systemd names it the
/// ControlPID of the invocation the unit runs, which it forked it for; from then on no count is
/// (found by the simulator, 7478359040164440: children of the next invocation's ExecStartPre=
/// waited as ours for good).
#[test]
fn a_control_pid_named_for_a_later_invocation_is_not_counted_as_ours() {
    let mut s = watching("k.service", "active");
    let cgroup = "/app.slice/k.service";
    s.leftovers.insert(cgroup.into(), vec![38]);
    s.signal(SystemdSignal::UnitChanged {
        path: unit_path("k.service"),
        change: UnitChange {
            main_pid: Some(0),
            control_pid: Some(36),
            ..UnitChange::default()
        },
    });
    s.input(Input::BusLost);
    s.input(Input::BusUp);
    let key = s.read_asked();
    s.changed("k.service", "inactive", B);
    let mut read = UnitSnapshot {
        serial: s.next_serial(),
        ..snapshot("k.service", "inactive", B, cgroup)
    };
    read.current.pids = Some(((0, 36), read.serial));
    s.input(Input::UnitRead {
        key,
        result: Ok(read),
    });
    let counted = s.counted_against.take().expect("leftovers counted");
    assert_eq!(counted.counted_roots, Vec::<i32>::new(), "B's: {counted:?}");
}

/// A watch made with an alias keeps systemd's own name of the unit across a restart: the
/// restarted agent hears the unit's signals, which name it by that name, before its first read
/// comes back, and so learns a later invocation's MainPID said only then (found by the
/// simulator, 125481835150473: a process in that root's session waited as ours for good).
#[test]
fn a_watch_restored_under_an_alias_hears_the_units_signals_before_its_first_read() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    let cgroup = "/app.slice/real1.service";
    s.cgroups.insert(cgroup.into(), CgroupReading::Populated);
    s.request(&format!(
        r#"{{"cmd":"watch","unit":"nick.service","invocation":"{A}"}}"#
    ));
    for _ in 0..2 {
        s.answer_reads(|_| Ok(snapshot("real1.service", "active", A, cgroup)));
    }
    let saved = s.save();
    assert_eq!(saved.watches[0].unit_id.as_deref(), Some("real1.service"));
    let mut s = Script::restored(saved, "boot-1");
    s.cgroups.insert(cgroup.into(), CgroupReading::Populated);
    s.leftovers.insert(cgroup.into(), vec![148]);
    s.input(Input::BusUp);
    let key = s.read_asked();
    s.main_pid("real1.service", 147);
    s.changed("real1.service", "deactivating", B);
    let read = UnitSnapshot {
        serial: s.next_serial(),
        ..snapshot("real1.service", "inactive", B, cgroup)
    };
    s.input(Input::UnitRead {
        key,
        result: Ok(read),
    });
    let counted = s.counted_against.take().expect("leftovers counted");
    assert_eq!(counted.roots, [147], "B's MainPID: {counted:?}");
}

/// A watch made late, for an invocation another watch of the unit heard systemd name roots
/// of, keeps them for its counts: systemd may guess that invocation's leftover MainPID (154)
/// as a later invocation's, and what it forks then is ours (found by CI's random base,
/// 245230654104363: a false proof, the new watch had heard 154 only as the later invocation's
/// MainPID, and took the leftover's child for that invocation's). The other watch is the
/// unit's proven one the new watch replaces, or one still kept beside an alias's watch.
#[test]
fn a_watch_made_late_keeps_the_roots_the_units_other_watch_heard_for_its_invocation() {
    for name in ["g.service", "nick.service"] {
        let mut s = watching("g.service", "active");
        let cgroup = "/app.slice/g.service";
        s.main_pid("g.service", 154);
        s.changed("g.service", "active", B);
        s.changed("g.service", "failed", B);
        assert_eq!(s.phase("g.service"), Phase::Proven, "A, restarted outside");
        // C begins, and systemd guesses B's leftover 154 as its MainPID.
        s.changed("g.service", "inactive", C);
        s.main_pid("g.service", 154);
        s.changed("g.service", "active", C);
        s.request(&format!(
            r#"{{"cmd":"watch","unit":"{name}","invocation":"{B}"}}"#
        ));
        for _ in 0..2 {
            s.answer_reads(|_| Ok(snapshot("g.service", "active", C, cgroup)));
        }
        s.leftovers.insert(cgroup.into(), vec![158]);
        s.changed("g.service", "failed", C);
        let counted = s.counted_against.take().expect("leftovers counted");
        assert_eq!(counted.counted_roots, [154], "{name}: {counted:?}");
    }
}

/// After a restart, a watch of the unit whose first read is not in yet takes the proof
/// another watch of the same invocation makes first, and releases its generation: should that
/// other watch be replaced before the read comes back, nothing would tell it any more (found
/// by the simulator, 22864267666403: the launch file was never released).
#[test]
fn a_restored_watch_takes_a_siblings_proof_before_its_own_first_read() {
    let cgroup = "/app.slice/g.service";
    let nick = SavedWatch {
        unit_id: Some("g.service".into()),
        ..saved("nick.service", A)
    };
    let generation_4 = SavedWatch {
        generation: Some(4),
        launch_file: Some(PathBuf::from("/run/g/launch-4")),
        ..saved("g.service", A)
    };
    let mut state = state("boot-1", vec![nick, generation_4]);
    state.generations = vec![("g.service".into(), 4)];
    let mut s = Script::restored(state, "boot-1");
    s.cgroups.insert(cgroup.into(), CgroupReading::Empty);
    s.input(Input::BusUp);
    // A client asks for the watch again: answered once it is proven.
    s.request(r#"{"cmd":"watch","unit":"g.service"}"#);
    // Both read the unit by its own name; nick.service's watch, restored first, has the
    // lower key.
    let nick_read = s
        .take()
        .into_iter()
        .filter_map(|o| match o {
            Output::ReadUnit { key, unit, .. } if unit == "g.service" => Some(key),
            _ => None,
        })
        .min()
        .expect("nick.service is read");
    let read = UnitSnapshot {
        serial: s.next_serial(),
        ..snapshot("g.service", "inactive", A, cgroup)
    };
    s.input(Input::UnitRead {
        key: nick_read,
        result: Ok(read),
    });
    assert_eq!(s.phase("nick.service"), Phase::Proven);
    assert_eq!(s.phase("g.service"), Phase::Proven, "the same invocation");
    let released = s
        .outputs
        .iter()
        .any(|o| matches!(o, Output::RemoveLaunchFile { path, .. } if *path == Path::new("/run/g/launch-4")));
    assert!(released, "{:?}", s.outputs);
    // Once saved.
    s.pass(Duration::from_secs(1));
    let answered = s.outputs.iter().any(|o| {
        matches!(o, Output::Reply { answer: Answer::Watch(view), .. }
            if view.unit == "g.service" && view.phase == Phase::Proven)
    });
    assert!(answered, "{:?}", s.outputs);
}

/// A watch made late learns which invocations came after its own, what systemd named for them
/// and the starts of those roots, from what the unit's other watch heard, or the proven watch
/// it replaces: a process in
/// the session of C's MainPID 157, gone, is C's, not ours (found by CI's base of 131da92,
/// 240964879799085: a lost proof, 157's child waited as ours for good, as only the unit's
/// older watch had heard 157 named, and its facts kept one invocation back).
#[test]
fn a_watch_made_late_learns_the_roots_of_the_invocations_after_its_own() {
    const D: &str = "dddddddddddddddddddddddddddddddd";
    for name in ["g.service", "nick.service"] {
        let mut s = watching("g.service", "active");
        let cgroup = "/app.slice/g.service";
        s.changed("g.service", "inactive", B);
        s.changed("g.service", "active", B);
        s.changed("g.service", "inactive", B);
        assert_eq!(s.phase("g.service"), Phase::Proven, "A, restarted outside");
        // C ran with MainPID 157, which forked 158 and exited; D followed.
        s.changed("g.service", "inactive", C);
        s.main_pid("g.service", 157);
        s.input(Input::RootStart {
            unit: "g.service".into(),
            pid: 157,
            start_ticks: Some(9),
        });
        s.changed("g.service", "active", C);
        s.main_pid("g.service", 0);
        s.changed("g.service", "failed", C);
        s.changed("g.service", "inactive", D);
        s.changed("g.service", "active", D);
        s.request(&format!(
            r#"{{"cmd":"watch","unit":"{name}","invocation":"{B}"}}"#
        ));
        for _ in 0..2 {
            s.answer_reads(|_| Ok(snapshot("g.service", "active", D, cgroup)));
        }
        s.leftovers.insert(cgroup.into(), vec![158]);
        s.changed("g.service", "failed", D);
        // With its start, read while it lived: a guess of systemd's is told by it.
        let counted = s.counted_knowing_start(157, 9);
        assert!(counted.gone_pids().contains(&157), "{name}: {counted:?}");
    }
}

/// The start of a running unit's MainPID, which nearly every watch reads, is kept in the watch
/// itself, with nothing said of a later invocation allocated for it (at 10,000 watched units a
/// box and a vector for it were 2.7 MB of the heap).
#[test]
fn a_running_units_root_start_allocates_nothing_of_later_invocations() {
    let mut s = watching("m.service", "active");
    s.main_pid("m.service", 120);
    s.input(Input::RootStart {
        unit: "m.service".into(),
        pid: 120,
        start_ticks: Some(7),
    });
    let key = s.core.by_name.key("m.service", &s.core.units);
    let watch = key.and_then(|key| s.core.units.get(&key)).expect("watched");
    assert!(watch.after_ours.is_none(), "{:?}", watch.after_ours);
    assert!(
        matches!(watch.once_held, OnceHeld::One(_)),
        "{:?}",
        watch.once_held
    );
    assert!(watch.knows_start_of(120));
}

/// A watch is one allocation a unit, in glibc chunks of 16 bytes (8 of them its header): 648
/// bytes fit a 656-byte chunk, and each 16 bytes more are 160 KB at 10,000 watched units, where
/// RSS is to stay within 16 MiB.
#[test]
fn a_watch_stays_within_648_bytes() {
    assert!(
        std::mem::size_of::<Watch>() <= 648,
        "{}",
        std::mem::size_of::<Watch>()
    );
}

/// A watch made afresh over a proven one keeps the starts of the processes that one knew: a
/// root systemd named for a later invocation (C's MainPID 130, never named for B), its start
/// read while it lived, is judged by that start once it is gone (a guess of systemd's, B's
/// leftover, leads a session of B's), not taken for C's own fork.
#[test]
fn a_watch_made_afresh_keeps_the_starts_its_predecessor_read() {
    let mut s = watching("g.service", "active");
    let cgroup = "/app.slice/g.service";
    s.changed("g.service", "inactive", B);
    s.changed("g.service", "active", B);
    s.changed("g.service", "failed", B);
    assert_eq!(s.phase("g.service"), Phase::Proven, "A, restarted outside");
    s.changed("g.service", "inactive", C);
    s.take();
    s.main_pid("g.service", 130);
    let asked = s
        .take()
        .iter()
        .any(|o| matches!(o, Output::ReadRootStart { pid: 130, .. }));
    assert!(asked, "a proven watch has the start read too");
    s.input(Input::RootStart {
        unit: "g.service".into(),
        pid: 130,
        start_ticks: Some(5),
    });
    s.changed("g.service", "active", C);
    s.request(&format!(
        r#"{{"cmd":"watch","unit":"g.service","invocation":"{B}"}}"#
    ));
    s.answer_reads(|_| Ok(snapshot("g.service", "active", C, cgroup)));
    s.leftovers.insert(cgroup.into(), vec![146]);
    s.changed("g.service", "failed", C);
    s.counted_knowing_start(130, 5);
}

/// A watch made with an alias hears nothing of its unit until a read names the unit: what
/// systemd signalled of it meanwhile is kept and taken when the watch follows the alias, here
/// B's ControlPID 142, said only in a signal, and its start, read at once (found by the
/// simulator, 94778623380596: a process in 142's session waited as ours for good).
#[test]
fn a_watch_made_with_an_alias_takes_what_its_unit_signalled_before_its_first_read() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    let cgroup = "/app.slice/g.service";
    s.cgroups.insert(cgroup.into(), CgroupReading::Populated);
    s.request(&format!(
        r#"{{"cmd":"watch","unit":"nick.service","invocation":"{A}"}}"#
    ));
    s.signal(SystemdSignal::UnitChanged {
        path: unit_path("g.service"),
        change: UnitChange {
            main_pid: Some(0),
            control_pid: Some(142),
            ..UnitChange::default()
        },
    });
    let asked = s
        .outputs
        .iter()
        .any(|o| matches!(o, Output::ReadRootStart { unit, pid: 142 } if unit == "g.service"));
    assert!(asked, "the root's start is read: {:?}", s.outputs);
    s.input(Input::RootStart {
        unit: "g.service".into(),
        pid: 142,
        start_ticks: Some(7),
    });
    s.changed("g.service", "activating", B);
    s.leftovers.insert(cgroup.into(), vec![143]);
    for _ in 0..2 {
        s.answer_reads(|_| Ok(snapshot("g.service", "inactive", B, cgroup)));
    }
    let counted = s.counted_knowing_start(142, 7);
    assert!(
        counted.roots.contains(&142) || counted.gone_pids().contains(&142),
        "B's ControlPID: {counted:?}"
    );
}

/// A signal handled after a read that told a later invocation is late: the MainPID it said
/// (150) is placed with the invocation the signal right after it names (B, between ours and
/// the one read), and counts as that one's root, not ours.
#[test]
fn a_late_signals_main_pid_is_placed_with_the_invocation_named_right_after_it() {
    let mut s = watching("g.service", "active");
    let cgroup = "/app.slice/g.service";
    s.leftovers.insert(cgroup.into(), vec![151]);
    s.signal(SystemdSignal::UnitNew {
        unit: "g.service".into(),
    });
    let key = s.read_asked();
    let (late_pids, late_b) = (s.next_serial(), s.next_serial());
    let read = UnitSnapshot {
        serial: s.next_serial(),
        ..snapshot("g.service", "inactive", C, cgroup)
    };
    s.input(Input::UnitRead {
        key,
        result: Ok(read),
    });
    s.input(Input::Signal {
        serial: late_pids,
        signal: SystemdSignal::UnitChanged {
            path: unit_path("g.service"),
            change: UnitChange {
                main_pid: Some(150),
                control_pid: Some(0),
                ..UnitChange::default()
            },
        },
    });
    s.input(Input::Signal {
        serial: late_b,
        signal: SystemdSignal::UnitChanged {
            path: unit_path("g.service"),
            change: UnitChange {
                active_state: Some("active".into()),
                invocation: Some(B.into()),
                ..UnitChange::default()
            },
        },
    });
    s.input(Input::CgroupChanged { key });
    let gone_roots = s.counted_gone_roots();
    assert!(gone_roots.contains(&150), "B's MainPID: {gone_roots:?}");
}

/// The start of a root systemd names is read at once, while it may live, and kept: a count
/// made after it exited judges it by that start (rule 0), so systemd's guess of a leftover as a
/// later MainPID is told even if no count ever saw it alive (found by CI's random base,
/// 240964879782844: systemd named no MainPID for ours, guessed ours' daemon as the next one's,
/// and it forked a child and exited before any count: a false proof). Each pid is read once.
#[test]
fn a_roots_start_is_read_when_systemd_names_it_and_kept_for_counts() {
    let mut s = watching("g.service", "active");
    let cgroup = "/app.slice/g.service";
    s.take();
    s.main_pid("g.service", 130);
    s.changed("g.service", "active", B);
    let asked: Vec<(String, i32)> = s
        .take()
        .into_iter()
        .filter_map(|o| match o {
            Output::ReadRootStart { unit, pid } => Some((unit, pid)),
            _ => None,
        })
        .collect();
    assert_eq!(asked, [("g.service".to_owned(), 130)]);
    s.input(Input::RootStart {
        unit: "g.service".into(),
        pid: 130,
        start_ticks: Some(5),
    });
    s.main_pid("g.service", 130);
    assert!(
        !s.outputs
            .iter()
            .any(|o| matches!(o, Output::ReadRootStart { .. })),
        "read once"
    );
    s.leftovers.insert(cgroup.into(), vec![146]);
    s.changed("g.service", "failed", B);
    s.counted_knowing_start(130, 5);
}

/// A read answered after its watch was refused or unwatched still says what systemd said of
/// the unit: another watch of it, whose own read is older, takes it (found by the simulator:
/// a stop asked for on the older read reached the invocation after ours).
#[test]
fn a_read_of_a_watch_gone_meanwhile_still_tells_the_units_other_watches() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    let cgroup = "/app.slice/g.service";
    s.cgroups.insert(cgroup.into(), CgroupReading::Populated);
    s.request(r#"{"cmd":"watch","unit":"g.service"}"#);
    let unit_key = s.read_asked();
    s.request(&format!(
        r#"{{"cmd":"watch","unit":"nick.service","invocation":"{A}"}}"#
    ));
    let read = s.answer_reads(|_| Ok(snapshot("g.service", "deactivating", A, cgroup)));
    assert_eq!(read, ["nick.service"], "the alias is followed");
    let alias_key = s.read_asked();
    s.request(r#"{"cmd":"unwatch","unit":"nick.service"}"#);
    s.take();
    let newer = UnitSnapshot {
        serial: s.next_serial(),
        ..snapshot("g.service", "inactive", A, "")
    };
    s.input(Input::UnitRead {
        key: alias_key,
        result: Ok(newer),
    });
    s.assert_an_older_read_asks_no_stop(unit_key, "g.service", cgroup);
}

/// What a new watch heard before its first read is placed by that read's serial only on the
/// same connection: serials start afresh on the next one, where an earlier invocation's
/// message may look newer than the read.
#[test]
fn what_a_new_watch_heard_on_a_lost_connection_is_not_placed_by_a_read_on_the_next() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    s.request(r#"{"cmd":"watch","unit":"w.service"}"#);
    s.take();
    // B, before ours (C), with MainPID 77, said on a connection then lost.
    s.serial = 40;
    s.main_pid("w.service", 77);
    s.changed("w.service", "inactive", B);
    s.input(Input::BusLost);
    s.input(Input::BusUp);
    let key = s.read_asked();
    s.cgroups
        .insert("/app.slice/w.service".into(), CgroupReading::Populated);
    let read = UnitSnapshot {
        serial: 21,
        ..snapshot("w.service", "active", C, "/app.slice/w.service")
    };
    s.input(Input::UnitRead {
        key,
        result: Ok(read),
    });
    s.serial = 30;
    s.changed("w.service", "active", A);
    s.changed("w.service", "inactive", A);
    let gone_roots = s.counted_gone_roots();
    assert!(
        !gone_roots.contains(&77),
        "B began before ours: {gone_roots:?}"
    );
}

/// The kinds of the unit reads asked for so far, by unit (the outputs stay).
fn read_kinds(s: &Script) -> Vec<(String, ReadKind)> {
    s.outputs
        .iter()
        .filter_map(|o| match o {
            Output::ReadUnit { unit, kind, .. } => Some((unit.clone(), *kind)),
            _ => None,
        })
        .collect()
}

/// The error answers so far.
fn errors(s: &Script) -> Vec<(ErrorKind, String)> {
    s.outputs
        .iter()
        .filter_map(|o| match o {
            Output::Reply {
                answer: Answer::Error(kind, message),
                ..
            } => Some((*kind, message.clone())),
            _ => None,
        })
        .collect()
}

/// What a `LoadUnit` read says of a unit systemd has no unit file for.
fn not_found(unit: &str) -> UnitSnapshot {
    UnitSnapshot {
        load_state: Some("not-found".into()),
        ..snapshot(unit, "inactive", "", "")
    }
}

#[test]
fn a_unit_systemd_does_not_know_is_refused_never_proven() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    for (cmd, unit) in [
        ("watch", "wbe.service"),
        ("wait", "wbf.service"),
        ("stop", "wbg.service"),
    ] {
        s.request(&format!(r#"{{"cmd":"{cmd}","unit":"{unit}"}}"#));
        assert_eq!(read_kinds(&s), [(unit.to_owned(), ReadKind::Load)], "{cmd}");
        s.answer_reads(|u| Ok(not_found(u)));
        assert_eq!(
            errors(&s),
            [(
                ErrorKind::NotFound,
                format!("{unit} not found: systemd has no such unit")
            )],
            "{cmd}"
        );
        assert!(s.proofs().is_empty(), "{cmd}");
        assert!(s.stops().is_empty(), "{cmd}");
        s.take();
    }
    assert!(s.list().is_empty(), "nothing of a refused watch stays");
    for state in ["masked", "bad-setting", "error"] {
        s.request(r#"{"cmd":"watch","unit":"m.service"}"#);
        s.answer_reads(|u| {
            Ok(UnitSnapshot {
                load_state: Some(state.into()),
                ..not_found(u)
            })
        });
        assert_eq!(errors(&s).len(), 1, "{state}");
        assert_eq!(errors(&s)[0].0, ErrorKind::NotFound, "{state}");
        s.take();
    }
}

#[test]
fn a_named_invocation_of_a_unit_systemd_no_longer_has_is_proven() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    s.request(&format!(
        r#"{{"cmd":"watch","unit":"gone.service","invocation":"{A}"}}"#
    ));
    // A read that names an invocation never loads the unit: collected, it is inactive.
    assert_eq!(read_kinds(&s), [("gone.service".to_owned(), ReadKind::Get)]);
    s.answer_reads(|u| Ok(unloaded(u)));
    assert_eq!(s.phase("gone.service"), Phase::Proven);
    assert!(errors(&s).is_empty());
}

#[test]
fn a_running_unit_whose_unit_file_is_gone_is_still_watched() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    s.cgroups
        .insert("/app.slice/r.service".into(), CgroupReading::Populated);
    s.request(r#"{"cmd":"watch","unit":"r.service"}"#);
    s.answer_reads(|u| {
        Ok(UnitSnapshot {
            load_state: Some("not-found".into()),
            ..snapshot(u, "active", A, "/app.slice/r.service")
        })
    });
    assert!(errors(&s).is_empty());
    assert_eq!(s.phase("r.service"), Phase::Watching);
}

#[test]
fn stop_of_a_proven_unit_running_another_invocation_stops_and_proves_that_one() {
    let mut s = watching("w.service", "active");
    s.cgroups
        .insert("/app.slice/w.service".into(), CgroupReading::Gone);
    s.changed("w.service", "inactive", A);
    assert_eq!(s.phase("w.service"), Phase::Proven);
    // Started again by someone else: a proven watch still hears it.
    s.changed("w.service", "activating", B);
    s.changed("w.service", "active", B);
    assert_eq!(s.view("w.service").now_running.as_deref(), Some(B));
    s.take();
    s.request(r#"{"cmd":"wait","unit":"w.service"}"#);
    let answers = s.event_answers();
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0].event.invocation, A);
    assert_eq!(answers[0].now_running.as_deref(), Some(B));
    s.take();

    s.request(r#"{"cmd":"stop","unit":"w.service"}"#);
    assert!(s.proofs().is_empty(), "never the older invocation's proof");
    assert_eq!(read_kinds(&s), [("w.service".to_owned(), ReadKind::Get)]);
    s.cgroups
        .insert("/app.slice/w.service".into(), CgroupReading::Populated);
    s.answer_reads(|u| Ok(snapshot(u, "active", B, "/app.slice/w.service")));
    assert_eq!(
        s.stops(),
        [(
            "w.service".to_owned(),
            StopKind::Proof(StopReason::Requested)
        )]
    );
    s.cgroups
        .insert("/app.slice/w.service".into(), CgroupReading::Gone);
    s.changed("w.service", "inactive", B);
    let answers = s.event_answers();
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0].event.invocation, B);
    assert!(answers[0].event.stop_requested);
    assert_eq!(answers[0].moved_on_from.as_deref(), Some(A));
    assert_eq!(answers[0].now_running, None);
}

#[test]
fn stop_of_a_proven_unit_that_runs_nothing_answers_with_its_proof() {
    let mut s = watching("n.service", "active");
    s.cgroups
        .insert("/app.slice/n.service".into(), CgroupReading::Gone);
    s.changed("n.service", "inactive", A);
    // Started and ended again since: it runs nothing now.
    s.changed("n.service", "active", B);
    s.changed("n.service", "inactive", B);
    assert_eq!(s.view("n.service").now_running, None);
    s.take();
    s.request(r#"{"cmd":"stop","unit":"n.service"}"#);
    let answers = s.event_answers();
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0].event.invocation, A);
    assert_eq!(answers[0].moved_on_from, None);
    assert!(s.stops().is_empty());
}

#[test]
fn start_watches_the_invocation_its_start_job_began() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    s.request(r#"{"id":1,"cmd":"start","unit":"web.service"}"#);
    let started: Vec<(ReplyTo, UnitName)> = s
        .take()
        .into_iter()
        .filter_map(|o| match o {
            Output::StartUnit { reply, unit } => Some((reply, unit)),
            _ => None,
        })
        .collect();
    assert_eq!(started.len(), 1, "{started:?}");
    let (reply, unit) = started[0].clone();
    s.input(Input::UnitStarted {
        reply,
        unit,
        result: Ok(B.to_owned()),
    });
    assert_eq!(read_kinds(&s), [("web.service".to_owned(), ReadKind::Get)]);
    s.cgroups
        .insert("/app.slice/web.service".into(), CgroupReading::Populated);
    // Even if a read first finds another invocation, the watch is of the one started.
    s.answer_reads(|u| Ok(snapshot(u, "active", B, "/app.slice/web.service")));
    s.save();
    let watched: Vec<WatchView> = s
        .outputs
        .iter()
        .filter_map(|o| match o {
            Output::Reply {
                answer: Answer::Watch(view),
                ..
            } => Some((**view).clone()),
            _ => None,
        })
        .collect();
    assert_eq!(watched.len(), 1, "{:?}", s.outputs);
    assert_eq!(watched[0].invocation.as_deref(), Some(B));
    assert_eq!(watched[0].phase, Phase::Watching);

    s.take();
    s.request(r#"{"id":2,"cmd":"start","unit":"typo.service"}"#);
    let Some(Output::StartUnit { reply, unit }) = s.take().into_iter().next() else {
        panic!("a start");
    };
    let message = "start typo.service: Unit typo.service not found.".to_owned();
    s.input(Input::UnitStarted {
        reply,
        unit,
        result: Err((ErrorKind::NotFound, message.clone())),
    });
    assert_eq!(errors(&s), [(ErrorKind::NotFound, message)]);
    assert!(
        !s.list().iter().any(|v| v.unit == "typo.service"),
        "nothing watched"
    );
}

/// A `watch` still waiting for its first read when the client unwatches the unit is answered:
/// unwatched, as a `wait` would be (found by the simulator's oracle of answers: the request
/// was never answered).
#[test]
fn unwatching_answers_a_watch_still_waiting_for_its_first_read() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    s.request(r#"{"id":1,"cmd":"watch","unit":"w.service"}"#);
    s.take();
    s.request(r#"{"id":2,"cmd":"unwatch","unit":"w.service"}"#);
    let answered: Vec<(Option<RequestId>, bool)> = s
        .take()
        .into_iter()
        .filter_map(|o| match o {
            Output::Reply { to, answer } => Some((
                to.id,
                matches!(answer, Answer::Error(ErrorKind::NotWatched, _)),
            )),
            _ => None,
        })
        .collect();
    let id = |n: u64| Some(RequestId::Number(n.into()));
    assert!(answered.contains(&(id(1), true)), "{answered:?}");
}

#[test]
fn unwatch_proven_forgets_every_proven_watch_and_only_those() {
    let mut s = watching("done.service", "active");
    s.request(r#"{"cmd":"watch","unit":"runs.service"}"#);
    s.answer_reads(|u| Ok(snapshot(u, "active", B, "/app.slice/runs.service")));
    s.cgroups
        .insert("/app.slice/done.service".into(), CgroupReading::Empty);
    s.changed("done.service", "inactive", A);
    assert_eq!(s.phase("done.service"), Phase::Proven);
    assert_eq!(s.phase("runs.service"), Phase::Watching);
    s.take();
    s.request(r#"{"cmd":"unwatch","proven":true}"#);
    s.pass(SAVE_INTERVAL);
    let answered: Vec<_> = s
        .outputs
        .iter()
        .filter_map(|o| match o {
            Output::Reply {
                answer: Answer::Unwatched(units),
                ..
            } => Some(units.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(answered, [vec!["done.service".to_owned()]]);
    let listed: Vec<String> = s.list().into_iter().map(|v| v.unit).collect();
    assert_eq!(listed, ["runs.service"]);
}

/// A log line about a unit names the invocation watched, in its text as well as its fields;
/// a proof carries the wall-clock time once the driver said the clock's offset.
#[test]
fn log_lines_name_the_invocation_and_proofs_carry_the_wall_clock() {
    let mut s = watching("l.service", "active");
    s.core.observe_wall_clock(1_000_000_000_000_000_000);
    s.cgroups
        .insert("/app.slice/l.service".into(), CgroupReading::Gone);
    s.changed("l.service", "inactive", A);
    let outputs = s.take();
    let proven_line = outputs
        .iter()
        .find_map(|o| match o {
            Output::Log { line, .. } if line.contains(": proven: ") => Some(line.clone()),
            _ => None,
        })
        .expect("the proof is logged");
    assert!(
        proven_line.ends_with(&format!("(invocation {A})")),
        "{proven_line}"
    );
    let views = s.list();
    let proof = views[0].proof.as_ref().expect("proven");
    let wall_us = 1_000_000_000_000_000 + proof.proven_mono_ns / 1000;
    assert_eq!(proof.proven_realtime_us, Some(wall_us));
}

/// A proof is told only once it is written: an agent killed after telling it finds it at its
/// restart, and neither proves the invocation again (with another cause, after the unit began
/// another invocation) nor loses the exit record it consumed.
#[test]
fn a_proof_is_saved_before_anyone_is_told_even_without_a_generation() {
    let mut s = watching("b.service", "active");
    s.request(r#"{"cmd":"events"}"#);
    s.request(r#"{"id":7,"cmd":"wait","unit":"b.service","timeout_ms":10000}"#);
    s.take();
    // Within the save interval of the last save: only the proof may ask for one now.
    s.changed("b.service", "inactive", A);
    s.cgroups
        .insert("/app.slice/b.service".into(), CgroupReading::Empty);
    s.core
        .handle_input(Input::CgroupChanged { key: UnitKey(0) }, s.now);
    s.drain();
    let outputs = s.take();
    let told = outputs
        .iter()
        .position(|o| matches!(o, Output::Broadcast { .. }))
        .expect("the proof is broadcast");
    let answered = outputs
        .iter()
        .position(|o| {
            matches!(
                o,
                Output::Reply {
                    answer: Answer::Event(_),
                    ..
                }
            )
        })
        .expect("the waiter is answered");
    let saved = outputs.iter().position(|o| {
        matches!(o, Output::Save(save) if matches!(&**save,
            StateSave::Changes(changes) if changes.watches.iter().any(|w| w.proof.is_some())))
    });
    assert!(
        saved.is_some_and(|at| at < told && at < answered),
        "{outputs:?}"
    );
    // What was written by then is what a restart takes up: the unit, proven.
    let mut restarted = Script::restored(s.saved.clone(), "boot-1");
    assert_eq!(restarted.phase("b.service"), Phase::Proven);
}

#[test]
fn a_read_answered_after_the_counter_wrapped_is_one_sent_after_the_decision() {
    let reads = |answered| Reads {
        answered,
        ..Reads::default()
    };
    assert!(reads(5).answered_since(5));
    assert!(reads(6).answered_since(5));
    assert!(!reads(4).answered_since(5));
    assert!(reads(1).answered_since(u32::MAX));
    assert!(!reads(u32::MAX).answered_since(0));
}

/// A leftover held again keeps its place as the count that first held it found it: a child
/// held under our leftover, orphaned since, must not be judged afresh because the count after
/// its parent died found it orphaned, and the one after that found it unchanged.
#[test]
fn a_leftover_held_again_keeps_its_place_when_first_held() {
    use crate::cgroup::procs::Lineage;
    let unit: UnitName = "k.service".parse().expect("a valid unit name");
    let mut watch = Watch::new(&unit, None, crate::control::protocol::WatchSpec::default());
    let held = |pid, parent, held_as_session| ProcessStart {
        pid,
        start_ticks: 600,
        held_as: Some(Lineage {
            parent,
            session: held_as_session,
        }),
    };
    watch.hold_leftovers(vec![held(41, 40, 41)]);
    watch.hold_leftovers(vec![held(41, 0, 41), held(42, 0, 42)]);
    let leftovers = watch.leftovers.as_deref().expect("held");
    assert_eq!(leftovers[&41], held(41, 40, 41), "first held under 40");
    assert_eq!(leftovers[&42], held(42, 0, 42));
    // Gone from a count, then held again: found anew.
    watch.hold_leftovers(vec![held(42, 0, 42)]);
    watch.hold_leftovers(vec![held(41, 0, 41)]);
    let leftovers = watch.leftovers.as_deref().expect("held");
    assert_eq!(leftovers[&41], held(41, 0, 41));
}

/// The time suspended, as the driver notes it each turn, is saved when it rises and taken up
/// by an agent started again in the same boot, not after a reboot (the clocks start afresh).
#[test]
fn the_time_suspended_is_saved_and_taken_up_in_the_same_boot_only() {
    let mut s = Script::new();
    s.core.observe_suspended(5_000_000, 0);
    assert!(s.save().offset_floors.is_empty(), "a floor of 0 is no news");
    s.core.observe_suspended(15_000_000, 40_000_000_000);
    s.core.observe_suspended(16_000_000, 40_000_000_000);
    let saved = s.save();
    assert_eq!(saved.offset_floors, [(15_000_000, 40_000_000_000)]);
    let again = Script::restored(saved.clone(), "boot-1");
    assert_eq!(again.core.offset_floors().pairs(), saved.offset_floors);
    let rebooted = Script::restored(saved, "boot-2");
    assert!(rebooted.core.offset_floors().pairs().is_empty());
}
