//! The invariants, checked against the world after every step.
//!
//! Safety: a proof of invocation X is made only when no process of X lives and systemd cannot
//! start one under X, and for a cause the world's history bears out; a launch file is removed
//! at most once and only with its proof; a StopUnit never hits an invocation the watch does
//! not own, unless the watch saw it and decided on a foreign stop.
//! Liveness: once X is over and faults have stopped, its proof comes within a bounded number of
//! steps, and so does the removal of the launch file of its generation once it is proven.

use std::collections::{BTreeMap, BTreeSet};

use super::kernel::{Inv, Pid, Proc, TICK_US};
use super::world::{World, short};
use crate::cgroup::procs::{ClockBasis, StartOrder};
use crate::control::wire::Cause;

/// Quiet steps a proof may take once its invocation is over: enough for every read, retry and
/// reconnect the agent does, far short of any periodic relist.
pub(crate) const LIVENESS_STEPS: u32 = 40;

/// Why a StopUnit was sent, as the oracle judges it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StopWhy {
    Requested,
    Foreign,
    Final,
}

/// What one watch (unit, its invocation) was told in this life of the agent, from its first
/// read on.
#[derive(Debug, Default)]
pub(crate) struct Told {
    /// MainPIDs and ControlPIDs: the sessions it can know to be another invocation's.
    pub roots: BTreeSet<Pid>,
    /// Invocations it was told began, and when: those it can know to be after its own.
    pub began: BTreeSet<Inv>,
}

/// A StopUnit the agent sends, with what the agent knew then.
pub(crate) struct StopSent<'a> {
    /// The unit's name as the stop names it.
    pub name: &'a str,
    /// The watch's own invocation.
    pub ours: Option<Inv>,
    pub why: StopWhy,
    /// Invocations of the unit the agent had been told of.
    pub seen: &'a BTreeSet<Inv>,
    /// Invocations of the unit the agent had been told were over.
    pub told_over: &'a BTreeSet<Inv>,
    /// The platform asked to stop the unit (under the watch's name or this one).
    pub asked: bool,
    /// The watch sent a requested stop before.
    pub ours_stopped_before: bool,
}

/// A proof the agent owes: an acknowledged watch of `inv` on `unit`.
#[derive(Clone, Debug)]
struct Owed {
    /// Quiet steps since the invocation was seen over.
    over_for: Option<u32>,
}

#[derive(Debug, Default)]
pub(crate) struct Oracle {
    pub violations: Vec<String>,
    owed: BTreeMap<(usize, Inv), Owed>,
    proven: BTreeSet<(usize, Inv)>,
    /// Of those, the ones whose last proof was blind: what the agent does after it (a launch
    /// file kept while another watch of the invocation still waits on its processes) is judged
    /// as part of that limit.
    blindly_proven: BTreeSet<(usize, Inv)>,
    /// Each launch file removed, with the agent's life (its restarts so far) that removed it.
    removed: BTreeMap<String, u32>,
    /// Launch files of acknowledged watches, with the (unit, invocation) whose proof releases
    /// them (unless it is replaced after a stop) and the steps without faults since that proof.
    launch_files: BTreeMap<String, ((usize, Inv), Option<u32>)>,
    /// Invocations of each unit a watch judged foreign (it sent a foreign stop knowing them).
    foreign: BTreeMap<usize, BTreeSet<Inv>>,
    /// The invocations each watch's foreign stops hit knowing them (0: none, or one it did not
    /// know), by the watch's unit and invocation.
    foreign_hit: BTreeMap<(usize, Inv), BTreeSet<Inv>>,
    /// StopUnits that hit an invocation the agent had not heard of yet: a race no agent can
    /// win (systemd has no conditional stop), counted, not failed.
    pub stop_races: u32,
    /// Proofs made while `systemctl clean` ran under the invocation: systemd forked it after
    /// the invocation ended, perhaps after what the proof was made from; counted, not failed.
    pub clean_races: u32,
    pub proofs: u32,
    /// Invocations whose proof was judged false: their launch file's removal is the same
    /// defect, not another.
    falsely_proven: BTreeSet<Inv>,
}

/// An InvocationID from its hex form; empty is 0.
pub(crate) fn parse_inv(hex: &str) -> Inv {
    u128::from_str_radix(hex, 16).unwrap_or(0)
}

impl Oracle {
    fn fail(&mut self, line: String) {
        self.violations.push(line);
    }

    /// The agent owes a proof of `inv` of unit `u` from now on.
    pub(crate) fn owe(&mut self, u: usize, inv: Inv) {
        if inv != 0 && !self.proven.contains(&(u, inv)) {
            self.owed.entry((u, inv)).or_insert(Owed { over_for: None });
        }
    }

    /// The (unit, invocation) pairs a proof is owed of.
    pub(crate) fn owed(&self) -> Vec<(usize, Inv)> {
        self.owed.keys().copied().collect()
    }

    pub(crate) fn is_proven(&self, u: usize, inv: Inv) -> bool {
        self.proven.contains(&(u, inv))
    }

    /// The watch was dropped by its client: nothing is owed any more.
    pub(crate) fn forgive(&mut self, u: usize, inv: Inv) {
        self.owed.remove(&(u, inv));
        self.launch_files.retain(|_, (of, _)| *of != (u, inv));
    }

    /// The acknowledged watch of `inv` of unit `u` has launch file `path`: its proof owes the
    /// file's removal too.
    pub(crate) fn owe_launch_file(&mut self, path: &str, u: usize, inv: Inv) {
        if inv != 0 && !self.proven.contains(&(u, inv)) {
            self.launch_files.insert(path.to_owned(), ((u, inv), None));
        }
    }

    /// A watch's proof of `inv` of unit `u`, told or only saved: one "replaced after stop"
    /// keeps the generation's files of every watch of the invocation, the new invocation runs
    /// in them. A proof only saved (the agent killed right after the save) counts too, though
    /// another watch proved the invocation first (7478359040187961).
    pub(crate) fn on_watch_proven(&mut self, u: usize, inv: Inv, cause: Cause) {
        if cause == Cause::ReplacedAfterStop {
            self.launch_files.retain(|_, (of, _)| *of != (u, inv));
        }
    }

    /// A proof of `inv` of unit `u` (named `name`) was broadcast. `blind`: it is of a watch
    /// whose read found no loaded unit by its name, an alias systemd no longer resolved, and
    /// no unit running `inv` either: to the agent, a unit collected after `inv` ended. What is
    /// wrong with such a proof is marked `BLIND PROOF`, a documented limit (docs/rules.md).
    pub(crate) fn on_proof(
        &mut self,
        w: &World,
        u: usize,
        inv: Inv,
        cause: Cause,
        stop_requested: bool,
        blind: bool,
    ) {
        let before = self.violations.len();
        self.judge_proof(w, u, inv, cause, stop_requested);
        if blind {
            self.blindly_proven.insert((u, inv));
            for violation in &mut self.violations[before..] {
                *violation = format!("BLIND PROOF: {violation}");
            }
        } else {
            self.blindly_proven.remove(&(u, inv));
        }
    }

    fn judge_proof(&mut self, w: &World, u: usize, inv: Inv, cause: Cause, stop_requested: bool) {
        self.proofs += 1;
        self.owed.remove(&(u, inv));
        self.proven.insert((u, inv));
        let name = &w.units[u].name;
        if inv == 0 {
            return;
        }
        let names: Vec<String> = w.units.iter().map(|u| u.name.clone()).collect();
        let pids: Vec<String> = w
            .procs_of(inv)
            .into_iter()
            .map(|p| w.kernel.describe(p, &names))
            .collect();
        self.clean_races += u32::from(w.cleaning_under(inv));
        if !pids.is_empty() {
            // systemd's word on a later invocation's MainPID may be a guess
            // (`unit_search_main_pid`) that names a leftover of this one.
            let guessed: Vec<Pid> = w
                .procs_of(inv)
                .into_iter()
                .filter(|pid| {
                    let session = w.kernel.procs.get(pid).map_or(0, |p| p.session);
                    w.misguessed.contains(&(inv, *pid)) || w.misguessed.contains(&(inv, session))
                })
                .collect();
            let guessed = if guessed.is_empty() {
                String::new()
            } else {
                format!(
                    "; {guessed:?} of a session systemd guessed as a later invocation's \
                     MainPID (unit_search_main_pid)"
                )
            };
            self.falsely_proven.insert(inv);
            self.fail(format!(
                "FALSE PROOF of {name} inv {} ({cause:?}): processes {pids:?} of it are \
                 alive{guessed}",
                short(inv)
            ));
        }
        if w.may_start_under(inv) {
            let unit = &w.units[u];
            self.fail(format!(
                "FALSE PROOF of {name} inv {} ({cause:?}): systemd may still start a process \
                 under it ({}/{})",
                short(inv),
                unit.state.active_state(),
                unit.state.sub_state()
            ));
        }
        // `restarted-outside` means the foreign invocation the watch stopped is over too: a
        // writer of the unit's resources (a lease, a port) while it runs. One started outside
        // again since is not (no watch stops more than the one it found), and with it running
        // the one stopped before it is over: false only if every foreign invocation the
        // watches of this invocation stopped is the one that runs.
        let stopped_runs = w.running_invocation(u).filter(|r| {
            self.foreign_hit
                .get(&(u, inv))
                .is_some_and(|hit| hit.iter().all(|h| h == r))
        });
        if let (Cause::RestartedOutside, Some(theirs)) = (cause, stopped_runs) {
            let unit = &w.units[u];
            self.fail(format!(
                "FALSE PROOF of {name} inv {} (RestartedOutside): the foreign invocation {} it \
                 stopped still runs ({}/{})",
                short(inv),
                short(theirs),
                unit.state.active_state(),
                unit.state.sub_state()
            ));
        }
        let Some(record) = w.history.get(&inv) else {
            self.fail(format!(
                "proof of {name} names unknown invocation {}",
                short(inv)
            ));
            return;
        };
        if record.unit != u {
            self.fail(format!(
                "proof of {name} names invocation {} of {}",
                short(inv),
                w.units[record.unit].name
            ));
        }
        let right = match cause {
            Cause::Exited => record.ended,
            Cause::RestartedOutside => record.next.is_some(),
            Cause::ReplacedAfterStop => stop_requested && record.next.is_some(),
            // No reboot is modelled, and `Other` is never proven, only read.
            Cause::Rebooted | Cause::Other => false,
        };
        if !right {
            self.fail(format!(
                "proof of {name} inv {} has the wrong cause {cause:?}: ended {}, next {}, \
                 stop requested {stop_requested}",
                short(inv),
                record.ended,
                record.next.map_or("-".into(), short)
            ));
        }
    }

    /// A StopUnit goes out (see [`StopSent`]). Judged against what runs in the world when it
    /// is sent (systemd has no conditional stop, so what runs then is what it hits):
    /// - a requested stop only if the platform asked to stop the unit, and only to our
    ///   invocation: never to one the agent had been told of and never judged foreign, nor to
    ///   one started after ours was over once the agent had been told ours was over;
    /// - a foreign stop only to an invocation the agent had been told of, never to ours, and
    ///   never after a stop of ours (what runs after our stop is not foreign, it is what our
    ///   stop let start);
    /// - a final stop never to an invocation the agent knew and never judged foreign.
    ///
    /// A stop that hits an invocation the agent could not know of is a race, counted.
    pub(crate) fn on_stop(&mut self, w: &World, stop: &StopSent) {
        let name = stop.name;
        let Some(u) = w.resolve(name) else { return };
        let ours_s = stop.ours.map_or("-".into(), short);
        let running = w.running_invocation(u);
        if stop.why == StopWhy::Foreign {
            if stop.ours_stopped_before {
                self.fail(format!(
                    "StopUnit (Foreign) of {name} for a watch of {ours_s} after a stop of ours: \
                     what runs now ({}) is what our stop let start",
                    running.map_or("-".into(), short)
                ));
            }
            match running {
                Some(r) if Some(r) == stop.ours => self.fail(format!(
                    "StopUnit (Foreign) of {name} hits our own invocation {ours_s}"
                )),
                Some(r) if !stop.seen.contains(&r) => self.stop_races += 1,
                _ => {}
            }
            // One it had not heard of yet is a race, not a stop it decided; and one that hit
            // nothing (what it meant to stop was over already, in `auto-restart` say) is
            // noted as 0: the watch may prove from the one it meant once systemd runs another.
            if let Some(ours) = stop.ours {
                let hit = running.filter(|r| stop.seen.contains(r)).unwrap_or(0);
                self.foreign_hit.entry((u, ours)).or_default().insert(hit);
            }
            // The agent stops what it knows runs there and is not ours.
            let judged = self.foreign.entry(u).or_default();
            for inv in stop.seen.iter().filter(|i| Some(**i) != stop.ours) {
                judged.insert(*inv);
            }
            return;
        }
        if stop.why == StopWhy::Requested && !stop.asked {
            self.fail(format!(
                "StopUnit (Requested) of {name} for a watch of {ours_s}, which the platform \
                 never asked to stop"
            ));
        }
        let Some(running) = running else {
            return;
        };
        let judged = self.foreign.get(&u).is_some_and(|j| j.contains(&running));
        if Some(running) == stop.ours || judged {
            return;
        }
        let ours_over_told = stop
            .ours
            .is_some_and(|ours| w.ended(ours) && stop.told_over.contains(&ours));
        if stop.why == StopWhy::Requested && ours_over_told {
            self.fail(format!(
                "StopUnit (Requested) of {name} for a watch of {ours_s} hits invocation {}, \
                 started after ours was over, which the agent had been told",
                short(running)
            ));
        } else if stop.seen.contains(&running) {
            self.fail(format!(
                "StopUnit ({:?}) of {name} for a watch of {ours_s} hits invocation {}, which \
                 the agent had been told of and never judged foreign",
                stop.why,
                short(running)
            ));
        } else {
            self.stop_races += 1;
        }
    }

    /// A launch file is removed; `inv` is its generation's invocation, `proven` whether the
    /// proof of it is out (or goes out in the same turn).
    pub(crate) fn on_remove_launch_file(
        &mut self,
        w: &World,
        path: &str,
        inv: Inv,
        proven: bool,
        life: u32,
    ) {
        // Again in a later life of the agent is a release resumed after a kill that cut it
        // short: harmless, as every generation's launch file has a path of its own here.
        if self.removed.insert(path.to_owned(), life) == Some(life) {
            self.fail(format!("launch file {path} removed twice"));
        }
        if !proven {
            self.fail(format!("launch file {path} removed with no proof"));
        }
        if inv != 0 && !w.over(inv) && !self.falsely_proven.contains(&inv) {
            self.fail(format!(
                "launch file {path} removed while invocation {} is not over",
                short(inv)
            ));
        }
    }

    /// One step without faults passed: every owed proof of an invocation that is over gets
    /// closer to its deadline. Under load no operator kills what an older invocation of the
    /// unit left (KillMode=process), and the agent cannot tell such an orphan forked while ours
    /// ran from one of ours: no proof is due while one lives.
    /// `told`: the MainPIDs and ControlPIDs, and the invocations, each watch (unit, invocation)
    /// was told of.
    /// Another invocation's orphan in a session none of them began cannot be told from an
    /// orphaned child of our own leftover: the agent must wait for it, and the line says so.
    pub(crate) fn quiet_step(
        &mut self,
        w: &World,
        told: &BTreeMap<(usize, Inv), Told>,
        under_load: bool,
    ) {
        let mut late = Vec::new();
        for ((u, inv), owed) in self.owed.iter_mut() {
            // A unit systemd still says runs `inv` (RemainAfterExit=, active/exited) is not
            // over for a proof, which needs a terminal state, however empty its cgroup.
            let still_runs = w.running_invocation(*u) == Some(*inv);
            if !w.over(*inv) || still_runs || under_load && w.older_leftovers(*u, *inv) {
                owed.over_for = None;
                continue;
            }
            let n = owed.over_for.get_or_insert(0);
            *n += 1;
            if *n == LIVENESS_STEPS {
                let unit = &w.units[*u];
                let others: Vec<&Proc> = w
                    .kernel
                    .procs
                    .values()
                    .filter(|p| p.unit == *u && p.invocation != *inv)
                    .collect();
                let told = told.get(&(*u, *inv));
                let told_began = |of: Inv| told.is_some_and(|told| told.began.contains(&of));
                // Told as a root of its own invocation: systemd's guess of another one's
                // MainPID (`unit_search_main_pid`, a leftover of `of`'s) is no word on whose it
                // is, and the agent takes a guess that started before the invocation it was
                // named for began for one that may be ours (rule 0 of `earlier_processes`).
                let told_root = |pid: Pid, of: Inv| {
                    told.is_some_and(|told| told.roots.contains(&pid))
                        && !w.misguessed.contains(&(of, pid))
                };
                let untold = |p: &&Proc| {
                    let leader_gone = w
                        .kernel
                        .procs
                        .get(&p.session)
                        .is_none_or(|leader| leader.session != p.session);
                    p.session != p.pid && leader_gone && !told_root(p.session, p.invocation)
                };
                // A session leader (a main or control process, or a daemon that called
                // setsid) forked as its invocation began, within the clock's uncertainty (a
                // tick, and the time suspended), or before the beginning of any invocation after
                // ours the watch was told (it was never told its own: in an earlier life of the
                // agent, before its first read, or only once it had ended): never told as a
                // root, it may as well be a child a leftover of ours forked just before.
                let began_of = |of: Inv| w.history.get(&of).map_or(0, |r| r.began_us);
                let untold_root = |p: &&Proc| {
                    let began = if told_began(p.invocation) {
                        began_of(p.invocation)
                    } else {
                        w.later(*inv)
                            .into_iter()
                            .filter(|&later| told_began(later))
                            .map(began_of)
                            .min()
                            .unwrap_or(u64::MAX)
                    };
                    let basis = ClockBasis {
                        clk_tck: 1_000_000 / TICK_US,
                        boot_minus_mono_ns: w.kernel.suspended_us * 1000,
                        ..ClockBasis::default()
                    };
                    p.session == p.pid
                        && basis.start_order(p.start_boot_us / TICK_US, began)
                            != StartOrder::AtOrAfter
                        && !told_root(p.pid, p.invocation)
                };
                let why = if others.is_empty() {
                    "nothing of another invocation is left".to_owned()
                } else if others.iter().any(untold_root) {
                    let untold: Vec<&Proc> = others.iter().copied().filter(untold_root).collect();
                    format!(
                        "other invocations' roots it was never told of, forked as their \
                         invocation began or before any it was told began: {}",
                        describe(&untold)
                    )
                } else if others.iter().any(untold) {
                    let untold: Vec<&Proc> = others.iter().copied().filter(untold).collect();
                    format!(
                        "other invocations' orphans of sessions it was never told of: {}",
                        describe(&untold)
                    )
                } else {
                    format!("other invocations' processes live: {}", describe(&others))
                };
                late.push(format!(
                    "NO PROOF of {} inv {}: over for {LIVENESS_STEPS} quiet steps ({}/{}, {why})",
                    unit.name,
                    short(*inv),
                    unit.state.active_state(),
                    unit.state.sub_state(),
                ));
            }
        }
        for (path, ((u, inv), since)) in self.launch_files.iter_mut() {
            if !self.proven.contains(&(*u, *inv)) || self.removed.contains_key(path) {
                continue;
            }
            let n = since.get_or_insert(0);
            *n += 1;
            if *n == LIVENESS_STEPS {
                let blind = if self.blindly_proven.contains(&(*u, *inv)) {
                    "BLIND PROOF: "
                } else {
                    ""
                };
                late.push(format!(
                    "{blind}NO RELEASE of launch file {path}: still there {LIVENESS_STEPS} steps \
                     without faults after the proof of {} inv {}",
                    w.units[*u].name,
                    short(*inv)
                ));
            }
        }
        self.violations.extend(late);
    }
}

fn describe(procs: &[&Proc]) -> String {
    let each: Vec<String> = procs
        .iter()
        .map(|p| format!("{} of {}", p.pid, short(p.invocation)))
        .collect();
    each.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::sim::step::Action;
    use crate::agent::sim::unit::UnitConfig;

    #[test]
    fn a_proof_while_exec_stop_may_run_is_false_and_a_late_proof_is_caught() {
        let mut w = World::empty(3);
        w.add_unit(
            "x.service",
            vec![],
            UnitConfig {
                oneshot: true,
                remain_after_exit: true,
                exec_stop: true,
                ..UnitConfig::default()
            },
        );
        w.apply(Action::Start(0));
        w.apply(Action::Progress(0));
        w.apply(Action::Progress(0));
        let inv = w.units[0].invocation;
        let mut oracle = Oracle::default();
        oracle.owe(0, inv);
        oracle.on_proof(&w, 0, inv, Cause::Exited, false, false);
        assert!(oracle.violations.iter().any(|v| v.contains("FALSE PROOF")));

        let mut oracle = Oracle::default();
        oracle.owe(0, inv);
        w.apply(Action::Stop(0));
        for _ in 0..10 {
            w.settle(false);
        }
        assert!(w.over(inv));
        for _ in 0..LIVENESS_STEPS {
            oracle.quiet_step(&w, &BTreeMap::new(), false);
        }
        assert_eq!(oracle.violations.len(), 1, "{:?}", oracle.violations);
        oracle.on_proof(&w, 0, inv, Cause::Exited, false, false);
        assert_eq!(oracle.violations.len(), 1, "a true proof, if late");
    }
}
