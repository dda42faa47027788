//! What systemd says, and what the core asks of it: signals, unit reads, reloads, the bus
//! coming and going, and StopUnit.
//!
//! The rules that keep a proof honest here:
//! - A signal is a hint or a stamped value, never a verdict by itself. `UnitRemoved` in
//!   particular says nothing about the unit: systemd sends it for every unit on a
//!   daemon-reload or reexec, and for a unit it garbage-collects. A read answering
//!   `NoSuchUnit` is the fact "inactive, no invocation".
//! - From `Reloading(true)`, a lost bus or a new connection, every unit's facts are stale:
//!   its proof is told the state is unknown and decides nothing until a read sent after the
//!   reload ended (or on the new connection) comes back.
//! - A StopUnit decided while the bus is down is sent once it is back only if a fresh read
//!   shows the unit still runs the invocation it was meant for.

use std::rc::Rc;
use std::time::Instant;

use super::watch::{InotifyWatches, NoCgroupRead, UnsentStop, Watch};
use super::{Answer, Core, Output, StopKind, UnitKey};
use crate::control::protocol::ErrorKind;
use crate::proof::release::ReleaseInput;
use crate::proof::{Input as ProofInput, StopReason, UnitProof};
use crate::systemd::signal::{SystemdSignal, unit_of_path};
use crate::systemd::snapshot::{ReadKind, UnitSnapshot};

/// ActiveStates in which the unit runs nothing.
fn is_terminal(active_state: &str) -> bool {
    matches!(active_state, "inactive" | "failed")
}

/// Whether a watch is read at all: until it is proven, and after only for a stop decided
/// while the bus was down.
fn wants_reads(watch: &Watch) -> bool {
    watch.event.is_none() || watch.unsent_stop.is_some()
}

/// Whether a client waits for `watch`'s answer: a client's new watch before its first read is
/// in (a `watch` request is answered after it), or one with `watch` requests pending.
fn awaited(watch: &Watch) -> bool {
    (watch.proof.is_none() && !watch.restored) || !watch.watch_replies.is_empty()
}

/// Why a new watch's first read shows a unit systemd does not know, if it does: its LoadState
/// (asked only by such a read) says it found no unit file, or a masked or invalid one, and the
/// unit runs nothing. One that still runs (its unit file removed since it started) is known
/// by its invocation. systemd's words for these states: `unit_load_state_to_string`.
fn unknown_to_systemd(unit: &str, snapshot: &UnitSnapshot) -> Option<String> {
    let state = snapshot.load_state.as_deref()?;
    if !is_terminal(&snapshot.active_state) {
        return None;
    }
    Some(match state {
        "not-found" => format!("{unit} not found: systemd has no such unit"),
        "masked" => format!("{unit} is masked: systemd will not start it"),
        "bad-setting" | "error" => {
            format!("{unit} could not be loaded by systemd (LoadState {state})")
        }
        _ => return None,
    })
}

impl Core {
    pub(super) fn on_bus_up(&mut self, _now: Instant) {
        self.bus_up = true;
        self.reloading = None;
        self.fact_epoch = self.fact_epoch.wrapping_add(1);
        for key in self.live_keys() {
            self.read_unit(key);
        }
    }

    pub(super) fn on_bus_lost(&mut self, now: Instant) {
        if !self.bus_up {
            return;
        }
        self.bus_up = false;
        self.reloading = None;
        self.fact_epoch = self.fact_epoch.wrapping_add(1);
        self.log(
            log::Level::Error,
            "lost systemd on the bus: every unit's state is unknown until it is read again"
                .to_owned(),
        );
        self.read_queue.clear();
        self.reads_in_flight = 0;
        self.unheard.clear();
        // Proven watches too: one may yet have a stop to send, judged on facts of the next
        // connection only.
        for key in self.keys_where(|_| true) {
            if let Some(watch) = self.units.get_mut(&key) {
                // Serial numbers belong to one connection; the next one starts afresh, so what
                // waits for a read's serial to be placed is dropped with them.
                watch.facts.clear();
                if let Some(after_ours) = watch.after_ours.as_mut() {
                    after_ours.unconfirmed.clear();
                }
                watch.stale = true;
                watch.reads.in_flight = false;
                watch.reads.again = false;
            }
            self.feed(key, ProofInput::StateUnknown, now);
        }
    }

    pub(super) fn on_signal(&mut self, serial: u32, signal: SystemdSignal, now: Instant) {
        match signal {
            SystemdSignal::UnitChanged { path, change } => {
                // A path no unit name escapes to is no unit's: no watch hears it.
                let Some(unit) = unit_of_path(&path) else {
                    return;
                };
                if self.unheard.keeping() && self.by_id.key(&unit, &self.units).is_none() {
                    self.unheard.keep(serial, &unit, &change);
                }
                self.read_new_root_starts(&unit, [change.main_pid, change.control_pid]);
                for key in self.by_id.keys(&unit, &self.units) {
                    let Some(watch) = self.units.get_mut(&key) else {
                        continue;
                    };
                    let new_invocation = watch.facts.apply_change(&change, serial);
                    self.note_late_roots(key);
                    if new_invocation || change.invalidated {
                        // A new invocation may run in another cgroup, and ControlGroup is
                        // never signalled: read it again.
                        self.read_unit(key);
                    }
                    self.feed_state(key, now);
                }
            }
            // Hints: the unit may have been loaded, unloaded or garbage-collected; only a
            // read says which. During a reload every unit is read once it ends.
            SystemdSignal::UnitRemoved { unit } | SystemdSignal::UnitNew { unit } => {
                if self.reloading.is_none() {
                    for key in self.by_id.keys(&unit, &self.units) {
                        self.read_unit(key);
                    }
                }
            }
            SystemdSignal::Reloading(true) => {
                self.log(
                    log::Level::Debug,
                    "systemd is reloading: no proof from what was seen before".to_owned(),
                );
                self.reloading = Some(now);
                self.fact_epoch = self.fact_epoch.wrapping_add(1);
                for key in self.keys_where(|_| true) {
                    if let Some(watch) = self.units.get_mut(&key) {
                        watch.stale = true;
                    }
                    self.feed(key, ProofInput::StateUnknown, now);
                }
            }
            SystemdSignal::Reloading(false) => self.end_reload(),
        }
    }

    fn end_reload(&mut self) {
        self.reloading = None;
        self.fact_epoch = self.fact_epoch.wrapping_add(1);
        for key in self.live_keys() {
            self.read_unit(key);
        }
    }

    /// The safety net for a `Reloading(false)` lost on a live connection: a reload that has
    /// lasted a whole resync interval is taken as over. systemd answers no call while it
    /// reloads, so whatever a read sent now says is from after the reload.
    pub(super) fn end_reload_never_heard_to_end(&mut self, now: Instant) {
        let (Some(since), Some(every)) = (self.reloading, self.config.resync_interval) else {
            return;
        };
        if now.saturating_duration_since(since) < every {
            return;
        }
        self.log(
            log::Level::Warn,
            format!(
                "systemd began a reload {} s ago and was never heard to end it: reading every \
                 unit again",
                now.saturating_duration_since(since).as_secs()
            ),
        );
        self.end_reload();
    }

    /// Reads a unit's state and cgroup path again; at most one read per unit is in flight,
    /// and one asked for meanwhile runs when it returns. Nothing is read while the bus is
    /// down or systemd is reloading: every unit is read when that ends.
    pub(super) fn read_unit(&mut self, key: UnitKey) {
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        if !wants_reads(watch) || !self.bus_up || self.reloading.is_some() {
            return;
        }
        if watch.reads.in_flight {
            watch.reads.again = true;
            return;
        }
        watch.reads.in_flight = true;
        if self.reads_in_flight < self.config.max_reads_in_flight {
            self.start_read(key);
        } else {
            let awaited = awaited(watch);
            self.read_queue.push(key, awaited);
        }
    }

    fn start_read(&mut self, key: UnitKey) {
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        watch.reads.epoch = self.fact_epoch;
        watch.reads.sent = watch.reads.sent.wrapping_add(1);
        self.reads_in_flight += 1;
        // By systemd's own name for the unit once a read found it: an alias taken away or
        // pointed elsewhere since (`GetUnit` then answers that no such unit is loaded) says
        // nothing of the unit that runs ours, and read as its state proved a unit still
        // `active (exited)` (a false proof against real systemd).
        let unit = watch.id.to_string();
        // Only a client's new watch that names no invocation asks whether systemd knows the
        // unit at all: any other read must never load a unit (one garbage-collected after it
        // ended is inactive with no invocation, `not-found` only to a new watch).
        let kind = if watch.proof.is_none() && !watch.restored && watch.asked_invocation.is_none() {
            ReadKind::Load
        } else {
            ReadKind::Get
        };
        // A name no loaded unit has (an alias taken away, perhaps before the first read) says
        // nothing of the unit that runs ours: the driver reads the unit running it, if any.
        let ours = (watch.our_invocation())
            .filter(|ours| !ours.is_empty())
            .map(str::to_owned);
        self.outputs.push_back(Output::ReadUnit {
            key,
            unit,
            kind,
            ours,
        });
    }

    /// A read came back: the next queued one may go.
    fn read_done(&mut self) {
        self.reads_in_flight = self.reads_in_flight.saturating_sub(1);
        while self.reads_in_flight < self.config.max_reads_in_flight {
            let Some(key) = self.read_queue.pop() else {
                break;
            };
            match self.units.get_mut(&key) {
                // Proven while it waited: its slot goes to a watch that still needs one.
                Some(watch) if !wants_reads(watch) => {
                    watch.reads.in_flight = false;
                    watch.reads.again = false;
                }
                Some(_) => self.start_read(key),
                None => {}
            }
        }
    }

    pub(super) fn on_unit_read(
        &mut self,
        key: UnitKey,
        result: Result<UnitSnapshot, String>,
        now: Instant,
    ) {
        if !self.bus_up {
            return;
        }
        self.read_done();
        let Some(watch) = self.units.get_mut(&key) else {
            // Unwatched or refused meanwhile: what systemd said still holds for the unit's
            // other watches.
            if let Ok(snapshot) = &result {
                self.share_snapshot(key, snapshot, now);
            }
            return;
        };
        if !watch.reads.in_flight {
            return;
        }
        watch.reads.in_flight = false;
        watch.reads.answered = watch.reads.sent;
        let fresh = watch.reads.epoch == self.fact_epoch && self.reloading.is_none();
        if let Ok(snapshot) = &result
            && snapshot.loaded
            && *snapshot.id != *watch.id
        {
            self.follow_alias(key, snapshot, now);
            return;
        }
        if result.is_ok() {
            self.unheard.named(key);
        }
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        if watch.event.is_some() {
            // Proven; read only for a stop decided while the bus was down.
            if let Ok(snapshot) = &result {
                watch.facts.apply_snapshot(snapshot);
                watch.stale &= !fresh;
                self.share_snapshot(key, snapshot, now);
                self.send_unsent_stop(key);
            }
            return;
        }
        let snapshot = match result {
            Ok(snapshot) => snapshot,
            Err(e) => {
                let message = format!("{}: {e}", watch.unit);
                if watch.proof.is_none() && !watch.restored {
                    // Only a client's own new watch may be refused.
                    self.fail_watch(key, ErrorKind::Internal, &message);
                } else {
                    self.log_about(
                        key,
                        None,
                        log::Level::Warn,
                        format!("{message}; reading it again"),
                    );
                    self.retry_later(key, now);
                }
                return;
            }
        };
        if watch.proof.is_none()
            && let Some(why) = unknown_to_systemd(&watch.unit, &snapshot)
        {
            // Refused, never proven: a proof of a unit systemd does not know (a typo, say)
            // would be a proof of nothing the person meant.
            self.fail_watch(key, ErrorKind::NotFound, &why);
            return;
        }
        watch.facts.apply_snapshot(&snapshot);
        let late = watch.facts.late_read_roots(&snapshot);
        if let Some((invocation, roots)) = late {
            self.absorb_after_ours(key, &invocation, &roots);
        }
        self.share_snapshot(key, &snapshot, now);
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        if fresh {
            watch.stale = false;
        }
        watch.retry = None;
        watch.no_cgroup_read = snapshot.control_group.is_empty().then(|| NoCgroupRead {
            serial: snapshot.serial,
            // A client names an invocation systemd told it of, so one the read does not name
            // ended before the read; without a name, ours is the one read.
            of_a_later_invocation: watch
                .our_invocation()
                .is_some_and(|ours| ours != snapshot.invocation),
        });
        // Our invocation's processes stay in its cgroup: another invocation's cgroup (a Slice=
        // change between the two) is taken only while the watch knows none of ours.
        let of_ours = watch.proof.is_none()
            || watch.control_group.is_empty()
            || Some(snapshot.invocation.as_str()) == watch.our_invocation();
        let moved = of_ours
            && !snapshot.control_group.is_empty()
            && !watch.control_group.is(&snapshot.control_group);
        if moved {
            watch.control_group = self.control_groups.make(&snapshot.control_group, &watch.id);
            self.unsaved.unit(&watch.unit);
        }
        if watch.reads.again {
            watch.reads.again = false;
            self.read_unit(key);
        }
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        if watch.proof.is_none() {
            let invocation = watch
                .asked_invocation
                .as_deref()
                .map_or_else(|| snapshot.invocation.clone(), String::clone);
            watch.proof = Some(UnitProof::resume(invocation, watch.resumed));
            self.unsaved.unit(&watch.unit);
            // Ours is known now: what was heard before of the invocations after it counts.
            self.confirm_after_ours(key, snapshot.serial);
            self.gather_what_was_heard(key);
            if self.take_a_siblings_proof(key, now) {
                self.answer_watch_replies(key);
                return;
            }
            let Some(watch) = self.units.get_mut(&key) else {
                return;
            };
            if watch.control_group.is_empty() {
                self.first_read_done(key, now);
            } else {
                // The watch comes before any read of the cgroup, so no change between the two
                // can be missed; the rest of the first read waits for its answer.
                watch.inotify_watches = InotifyWatches::First;
                let cgroup = watch.control_group.to_string();
                self.outputs
                    .push_back(Output::AddInotifyWatches { key, cgroup });
            }
            return;
        }
        if moved || watch.inotify_watches == InotifyWatches::Absent {
            self.rebuild_cgroup_watch(key);
        }
        self.feed_state(key, now);
        self.send_unsent_stop(key);
        self.rearm(key);
    }

    /// Asks for the start of each MainPID and ControlPID systemd named for `unit` (in a signal
    /// or a read) that a watch of it does not know the start of yet (`Output::ReadRootStart`);
    /// a proven one too, as a watch made later takes what it heard (`Watch::heard_of`).
    fn read_new_root_starts(&mut self, unit: &str, pids: [Option<u32>; 2]) {
        for pid in pids {
            let Some(pid) = pid
                .and_then(|pid| i32::try_from(pid).ok())
                .filter(|pid| *pid > 0)
            else {
                continue;
            };
            let mut watches = self.by_id.keys(unit, &self.units).peekable();
            // A signal no watch heard is kept while a watch waits for its unit's name
            // (`Unheard`), and the starts of its roots with it.
            let unheard = watches.peek().is_none() && self.unheard.keeping();
            let unknown = unheard
                || watches.any(|key| self.units.get(&key).is_some_and(|w| !w.knows_start_of(pid)));
            if unknown {
                self.outputs.push_back(Output::ReadRootStart {
                    unit: unit.to_owned(),
                    pid,
                });
            }
        }
    }

    /// A read found the unit under another name (the watch was made with an alias, or the
    /// alias was not loaded at the first read): systemd signals the unit under its own name
    /// and path, so signals sent before now may not have reached this watch, and this read
    /// may already be outdated by them. It only tells the name: the watch follows it and
    /// decides nothing (no proof, no stop, no invocation adopted) until a read sent after.
    fn follow_alias(&mut self, key: UnitKey, snapshot: &UnitSnapshot, now: Instant) {
        self.hear_unheard(key, &snapshot.id);
        self.unheard.named(key);
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        watch.facts.apply_snapshot(snapshot);
        watch.stale = true;
        watch.reads.again = false;
        // It decides nothing, but what it says of an invocation after ours is systemd's word,
        // kept now: the facts keep only the current invocation's roots, and go with the
        // connection.
        if let Some(state) = watch.facts.state() {
            self.note_after_ours(key, &state.invocation);
        }
        let Some(old_id) = self.units.get(&key).map(|watch| Rc::clone(&watch.id)) else {
            return;
        };
        // Out of the index under the name it was filed under, before the name changes.
        self.by_id.remove(&old_id, key, &self.units);
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        let id: Rc<str> = Rc::from(snapshot.id.as_str());
        watch.id = Rc::clone(&id);
        // Saved, so a restarted agent hears the unit's signals before its first read.
        self.unsaved.unit(&watch.unit);
        self.by_id.insert(&id, key, &self.units);
        self.share_snapshot(key, snapshot, now);
        self.confirm_after_ours(key, snapshot.serial);
        self.read_unit(key);
    }

    /// A watch filed under an alias learned its unit's name `unit`: it takes the signals of
    /// that unit no watch heard meanwhile (`Unheard`), in their order, as if it had heard them
    /// then, and the starts of the roots they named. It decides nothing on them: the read that
    /// named the unit is followed by another.
    fn hear_unheard(&mut self, key: UnitKey, unit: &str) {
        let (changes, starts) = self.unheard.of(unit);
        for (serial, change) in changes {
            let Some(watch) = self.units.get_mut(&key) else {
                return;
            };
            watch.facts.apply_change(&change, serial);
            self.note_late_roots(key);
            let Some(state) = self.units.get(&key).and_then(|watch| watch.facts.state()) else {
                continue;
            };
            self.note_after_ours(key, &state.invocation);
        }
        if let Some(watch) = self.units.get_mut(&key) {
            for start in starts {
                watch.note_once_held(start);
            }
        }
    }

    /// What systemd said of the unit holds for every watch of it (an alias and its unit, a
    /// proven one included): one that has not heard it yet must not act on what it heard
    /// before, nor, still waiting for its first read, on an older read of its own (a stop
    /// asked for then would reach the invocation after ours).
    fn share_snapshot(&mut self, key: UnitKey, snapshot: &UnitSnapshot, now: Instant) {
        if !snapshot.loaded {
            return;
        }
        if let Some(((main, control), _)) = snapshot.current.pids {
            self.read_new_root_starts(&snapshot.id, [Some(main), Some(control)]);
        }
        for other in self.by_id.keys(&snapshot.id, &self.units) {
            if let Some(sibling) = self.units.get_mut(&other)
                && other != key
            {
                sibling.facts.apply_shared_snapshot(snapshot);
                if sibling.proof.is_some() {
                    self.feed_state(other, now);
                }
            }
        }
    }

    /// The rest of a first read, once the cgroup is watched: decide, then answer the
    /// `watch` requests after a first reading of the cgroup.
    fn first_read_done(&mut self, key: UnitKey, now: Instant) {
        self.feed_state(key, now);
        if let Some(watch) = self.units.get_mut(&key)
            && std::mem::take(&mut watch.pending_stop)
        {
            self.feed(key, ProofInput::StopRequested, now);
        }
        self.send_unsent_stop(key);
        // A first reading for `list` and the `watch` answer; judged only if the state asks.
        match self.units.get(&key) {
            Some(watch) if watch.event.is_some() => self.answer_watch_replies(key),
            Some(watch) if watch.has_no_cgroup() => {
                self.on_cgroup_read(key, crate::cgroup::CgroupReading::Gone, now);
            }
            Some(watch) if watch.control_group.is_empty() => {
                // Told of a state newer than the read: answered with no reading, and read again.
                self.answer_watch_replies(key);
                self.read_unit(key);
            }
            Some(_) => self.read_cgroup(key, now),
            None => {}
        }
        self.rearm(key);
    }

    pub(super) fn on_cgroup_watched(
        &mut self,
        key: UnitKey,
        result: Result<(), String>,
        now: Instant,
    ) {
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        let asked = watch.inotify_watches;
        match result {
            Ok(()) => {
                watch.inotify_watches = InotifyWatches::Held;
                match asked {
                    InotifyWatches::First => self.first_read_done(key, now),
                    _ => self.read_cgroup(key, now),
                }
            }
            Err(e) => {
                watch.inotify_watches = InotifyWatches::Absent;
                let message = format!("{}: {e}", watch.unit);
                if asked == InotifyWatches::First && !watch.restored {
                    // A watch that cannot see its cgroup change is no watch: refuse it
                    // clearly (the inotify watch limit, typically) rather than prove late.
                    self.fail_watch(key, ErrorKind::Internal, &message);
                    return;
                }
                self.log_about(
                    key,
                    None,
                    log::Level::Error,
                    format!("{message}; trying again (until then only reads prove it)"),
                );
                self.retry_later(key, now);
                if asked == InotifyWatches::First {
                    self.first_read_done(key, now);
                } else {
                    self.read_cgroup(key, now);
                }
            }
        }
    }

    /// Refuses a client's new watch whose first read failed, found a unit systemd does not
    /// know, or whose cgroup cannot be watched: everyone waiting on it gets the error (of
    /// `kind`), nothing of it stays, and its generation number is not used up.
    pub(super) fn fail_watch(&mut self, key: UnitKey, kind: ErrorKind, message: &str) {
        self.log_about(key, None, log::Level::Warn, message.to_owned());
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        let replies = std::mem::take(&mut watch.watch_replies);
        if let Some(generation) = watch.spec.generation
            && self
                .generations
                .remove(&(watch.unit.to_string(), generation))
        {
            self.unsaved.generation(&watch.unit, generation, false);
        }
        for to in replies.into_iter().chain(self.waiters.take_key(key)) {
            self.reply(to, Answer::Error(kind, message.to_owned()));
        }
        self.drop_watch(key);
    }

    /// Issues a StopUnit, or keeps it until the bus is back.
    pub(super) fn stop(&mut self, key: UnitKey, kind: StopKind) {
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        // A stop must not reach an invocation that is not its target: with the bus down or the
        // facts stale, it waits for a fresh read (see `send_unsent_stop`). StopUnit names the
        // unit, not an invocation, so a requested stop goes out only while systemd says ours
        // runs: once it says ours ended, or runs another (or none), the stop would reach
        // whatever systemd starts next, and ours needs none. `auto-restart` is ours ended
        // (systemd said `failed` before it, `service_enter_restart`): the next start, which
        // may already run, gets a new InvocationID.
        let ours_not_running = kind == StopKind::Proof(StopReason::Requested)
            && watch.facts.state().is_some_and(|now| {
                now.is_over()
                    || watch.facts.ended_meanwhile()
                    || Some(now.invocation.as_str()) != watch.our_invocation()
            });
        // The final stop of a generation goes out only once a read after the proof shows the
        // unit runs nothing: what the proof was made from may predate a new invocation.
        let final_stop = kind == StopKind::FinalGeneration;
        let unknown = !self.bus_up || watch.stale;
        if unknown || ours_not_running || final_stop {
            let target = match kind {
                StopKind::Proof(StopReason::Requested) => watch.our_invocation().map(str::to_owned),
                StopKind::Proof(StopReason::Foreign) => watch.facts.invocation(),
                StopKind::FinalGeneration => Some(String::new()),
            };
            let target = target.unwrap_or_default();
            let first_read = final_stop.then(|| watch.reads.sent.wrapping_add(1));
            watch.unsent_stop = Some(Box::new(UnsentStop {
                kind,
                target,
                first_read,
            }));
            self.unsaved.unit(&watch.unit);
            if unknown {
                let line = format!(
                    "{}: stop ({kind}) deferred until systemd's state is read again",
                    watch.unit
                );
                self.log_about(key, None, log::Level::Info, line);
            }
            if final_stop {
                self.read_unit(key);
            } else {
                // With fresh facts it is decided now (and not sent: the unit runs another one).
                self.send_unsent_stop(key);
            }
            return;
        }
        self.send_stop(key, kind);
    }

    fn send_stop(&mut self, key: UnitKey, kind: StopKind) {
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        if let Some(release) = watch.release.as_mut() {
            release.handle(ReleaseInput::StopIssued);
        }
        let unit = watch.id.to_string();
        let line = format!("{}: stopping ({kind})", watch.unit);
        self.log_about(key, None, log::Level::Info, line);
        self.outputs.push_back(Output::StopUnit { key, unit, kind });
    }

    /// Sends a stop decided while the bus was down, if fresh facts show it still has its
    /// target; drops it otherwise.
    fn send_unsent_stop(&mut self, key: UnitKey) {
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        let decidable = watch.unsent_stop.as_ref().is_some_and(|stop| {
            stop.first_read
                .is_none_or(|first| watch.reads.answered_since(first))
        });
        if watch.stale || !self.bus_up || !decidable {
            return;
        }
        let Some(state) = watch.facts.state() else {
            return;
        };
        let Some(UnsentStop { kind, target, .. }) = watch.unsent_stop.take().map(|stop| *stop)
        else {
            return;
        };
        self.unsaved.unit(&watch.unit);
        let terminal = state.is_over();
        let still_due = match kind {
            // A unit systemd does not have loaded holds nothing to stop, and a StopUnit would
            // load it under whatever name it goes by now (an alias of a unit started since).
            // Nor does one that has begun another invocation since ours: its files are not
            // the generation's to remove.
            StopKind::FinalGeneration => {
                terminal
                    && watch.facts.loaded() == Some(true)
                    && (state.invocation.is_empty()
                        || Some(state.invocation.as_str()) == watch.our_invocation())
            }
            StopKind::Proof(StopReason::Requested) => {
                !terminal && !watch.facts.ended_meanwhile() && state.invocation == target
            }
            StopKind::Proof(StopReason::Foreign) => !terminal && state.invocation == target,
        };
        if still_due {
            self.send_stop(key, kind);
        } else {
            let now_runs = if watch.facts.loaded() == Some(false) {
                "not loaded".to_owned()
            } else {
                let invocation = match state.invocation.as_str() {
                    "" => "none",
                    id => id,
                };
                format!("{} with invocation {invocation}", state.active_state)
            };
            let line = format!(
                "{}: stop ({kind}) not sent: the unit is {now_runs} now",
                watch.unit
            );
            self.log_about(key, None, log::Level::Info, line);
        }
    }

    pub(super) fn on_stop_done(
        &mut self,
        key: UnitKey,
        kind: StopKind,
        succeeded: bool,
        now: Instant,
    ) {
        let Some(watch) = self.units.get(&key) else {
            return;
        };
        let line = if succeeded {
            (
                log::Level::Debug,
                format!("{}: stop ({kind}) accepted", watch.unit),
            )
        } else {
            (
                log::Level::Warn,
                format!("{}: stop ({kind}) failed", watch.unit),
            )
        };
        self.log_about(key, None, line.0, line.1);
        self.release(key, ReleaseInput::StopFinished { succeeded });
        if !succeeded && kind == StopKind::Proof(StopReason::Foreign) {
            self.feed(key, ProofInput::ForeignStopFailed, now);
        }
        self.mark_changed(key);
    }
}
