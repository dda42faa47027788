//! A proof made: its event, worded from the exit record or systemd's own exit status; the
//! release of the generation's files; telling everyone; retention.

use std::time::Instant;

use super::event::{EventKind, ProofEvent, systemd_record, terminal_wording};
use super::{Core, Output, StopKind, UnitKey, Watch, to_log_level};
use crate::control::wire;
use crate::exit::record::{ExitRecord, SanitizedRecord};
use crate::proof::release::{ReleaseInput, ReleaseOutput};
use crate::proof::{Cause, Proof};

impl Core {
    /// A unit's proof is made. A terminal proof whose watch names an exit record waits for it
    /// (read once and consumed: it must never count for a later invocation).
    pub(super) fn on_proof(&mut self, key: UnitKey, proof: Proof, now: Instant) {
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        if proof.cause == Cause::Exited
            && let (Some(run_dir), Some(name)) = (watch.spec.run_dir.clone(), watch.record_name())
        {
            watch.proof_pending = Some(Box::new(proof));
            self.outputs
                .push_back(Output::TakeExitRecord { key, run_dir, name });
            return;
        }
        self.proven(key, proof, None, now);
    }

    pub(super) fn on_exit_record(
        &mut self,
        key: UnitKey,
        record: Option<ExitRecord>,
        now: Instant,
    ) {
        let Some(proof) = self
            .units
            .get_mut(&key)
            .and_then(|w| w.proof_pending.take())
        else {
            return;
        };
        self.proven(key, *proof, record, now);
    }

    fn proven(&mut self, key: UnitKey, proof: Proof, record: Option<ExitRecord>, now: Instant) {
        let Some(watch) = self.units.get(&key) else {
            return;
        };
        // "Replaced after stop" is this watch's own stop's story, not another watch's.
        let siblings = match proof.cause {
            Cause::ReplacedAfterStop => Vec::new(),
            _ => self.unproven_watches_of_the_same_invocation(key),
        };
        let cause = proof.cause;
        let terminal_at = watch.terminal_at;
        self.count_proof(cause, terminal_at, now);
        let Some(watch) = self.units.get(&key) else {
            return;
        };
        let mut level = proof.level;
        let mut event = ProofEvent {
            kind: EventKind::Proven,
            unit: watch.unit.to_string(),
            invocation: watch.our_invocation().unwrap_or_default().to_owned(),
            level: level.into(),
            message: proof.message,
            cause: proof.cause.into(),
            proven_mono_ns: self.mono_ns(now),
            proven_realtime_us: self.realtime_us(now),
            stop_requested: watch.stop_requested(),
            systemd: None,
            record: None,
            generation: watch.spec.generation,
            launch_file: watch
                .spec
                .launch_file
                .as_ref()
                .map(|p| p.display().to_string()),
        };
        if proof.cause == Cause::Exited {
            let systemd = watch.facts.service_exit().map(|exit| systemd_record(&exit));
            let names_record = watch.spec.run_dir.is_some();
            let message;
            (level, message) = terminal_wording(names_record, record.as_ref(), systemd.as_ref());
            event.level = level.into();
            event.message = message;
            event.systemd = systemd.as_ref().map(SanitizedRecord::from);
            event.record = record.as_ref().map(SanitizedRecord::from);
        }
        // A generation's files go only on the proofs that read the cgroup (and after a
        // reboot, its launch file): a replaced-after-stop proof leaves them, since a final
        // StopUnit then would stop the new invocation.
        let release_input = match proof.cause {
            Cause::Exited | Cause::RestartedOutside => Some(ReleaseInput::Proven),
            Cause::Rebooted => Some(ReleaseInput::ProvenAfterReboot),
            Cause::ReplacedAfterStop => None,
        };
        // The proof is saved, with its release unfinished, before any file of the generation
        // is released and before anyone is told: an agent killed in between neither proves
        // it again after its restart (with another cause, or without the exit record it
        // consumed) nor forgets the release, which it then carries out (`restore`).
        if let Some(watch) = self.units.get_mut(&key) {
            watch.event = Some(Box::new(event.clone()));
            self.unsaved.unit(&watch.unit);
            if let Some(release) = watch.release.as_mut()
                && let Some(input) = release_input
            {
                release.handle(input);
            }
            self.save_now(now);
        }
        self.carry_out_release(key);
        // Released before anyone is told: a caller that hears "proven" finds the launch file
        // gone.
        self.tell_proven(key, event, to_log_level(level), now);
        // A `watch` waiting for the first read of one taken up after a restart, proven by a
        // sibling before that read, is answered with the proof.
        self.answer_watch_replies(key);
        // What is proven is an invocation's end, whichever watch proved it: another watch of
        // the same invocation (under an alias, say) may know less of the invocations after it
        // and still wait for a process this one placed.
        for sibling in siblings {
            let stop_requested = self.units.get(&sibling).is_some_and(Watch::stop_requested);
            self.on_proof(sibling, Proof::of_sibling(cause, stop_requested), now);
        }
    }

    /// A watch at its first read (made with an alias, or restored under the name its client
    /// gave) takes the proof another watch of the unit made of the same invocation before they
    /// were known to be one unit (found by the simulator, 125481835117919: after a restart, an
    /// alias's watch asked to stop waited long on a later invocation's leftover it could not
    /// place, that its sibling had placed). Whether it took one.
    pub(super) fn take_a_siblings_proof(&mut self, key: UnitKey, now: Instant) -> bool {
        let Some(watch) = self.units.get(&key) else {
            return false;
        };
        if watch.proof.is_none() || watch.event.is_some() || watch.proof_pending.is_some() {
            return false;
        }
        let Some(ours) = watch.our_invocation().filter(|i| !i.is_empty()) else {
            return false;
        };
        let cause = self
            .by_id
            .keys(&watch.id, &self.units)
            .filter(|other| *other != key)
            .find_map(|other| {
                let event = self.units.get(&other)?.event.as_deref()?;
                match event.cause {
                    _ if event.invocation != ours => None,
                    wire::Cause::Exited => Some(Cause::Exited),
                    wire::Cause::RestartedOutside => Some(Cause::RestartedOutside),
                    // Its own stop's story, proven for every watch after a reboot, or a cause
                    // this agent does not know.
                    wire::Cause::ReplacedAfterStop | wire::Cause::Rebooted | wire::Cause::Other => {
                        None
                    }
                }
            });
        let Some(cause) = cause else {
            return false;
        };
        let proof = Proof::of_sibling(cause, watch.stop_requested());
        self.on_proof(key, proof, now);
        true
    }

    /// The other watches of `key`'s unit (by systemd's name) and invocation that are not
    /// proven. One asked to stop takes the proof too, in its own words: left to itself, it
    /// may wait long on a later invocation's process it cannot place, one this watch placed.
    /// So does one taken up after a restart whose first read is not in yet (its unit's name is
    /// the one it was saved with): should this watch be replaced before that read comes back,
    /// nothing would tell it any more (found by the simulator, 22864267666403: a generation's
    /// launch file never released, its watch's reads cut short by agent kills until the
    /// proven one was replaced).
    fn unproven_watches_of_the_same_invocation(&self, key: UnitKey) -> Vec<UnitKey> {
        let Some(watch) = self.units.get(&key) else {
            return Vec::new();
        };
        let Some(invocation) = watch.our_invocation().filter(|i| !i.is_empty()) else {
            return Vec::new();
        };
        self.by_id
            .keys(&watch.id, &self.units)
            .filter(|other| {
                *other != key
                    && self.units.get(other).is_some_and(|w| {
                        (w.proof.is_some() || w.restored)
                            && w.event.is_none()
                            && w.proof_pending.is_none()
                            && w.our_invocation() == Some(invocation)
                    })
            })
            .collect()
    }

    /// Hands a fact to a generation's release and carries out what it asks for.
    pub(super) fn release(&mut self, key: UnitKey, input: ReleaseInput) {
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        let Some(release) = watch.release.as_mut() else {
            return;
        };
        release.handle(input);
        self.carry_out_release(key);
    }

    /// Carries out what a generation's release asks for now. A proven watch's saved record
    /// changes with it: whether its release is over.
    pub(super) fn carry_out_release(&mut self, key: UnitKey) {
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        let Some(release) = watch.release.as_mut() else {
            return;
        };
        if watch.event.is_some() {
            self.unsaved.unit(&watch.unit);
        }
        for output in release.take_outputs() {
            match output {
                ReleaseOutput::RemoveLaunchFile => {
                    if let Some(path) = watch.spec.launch_file.clone() {
                        let unit = watch.unit.to_string();
                        self.outputs
                            .push_back(Output::RemoveLaunchFile { unit, path });
                    }
                }
                ReleaseOutput::FinalStop => {
                    self.stop(key, StopKind::FinalGeneration);
                    return;
                }
            }
        }
    }

    /// The proof is in: release what the unit held (its inotify watches), exactly once, then
    /// tell everyone.
    fn tell_proven(&mut self, key: UnitKey, event: ProofEvent, level: log::Level, now: Instant) {
        self.outputs.push_back(Output::DropKernelHandles { key });
        self.log_about(
            key,
            Some(event.cause),
            level,
            format!(
                "{}: proven: {} ({:?})",
                event.unit, event.message, event.cause
            ),
        );
        for to in self.waiters.take_key(key) {
            let answer = self.event_answer(key, event.clone());
            self.reply(to, answer);
        }
        // Said to those who waited for this proof; a later `wait` or `stop` gets the proof.
        self.moved_on.remove(&key);
        if !self.subscribers.is_empty() {
            let clients = self.subscribers.iter().copied().collect();
            self.outputs.push_back(Output::Broadcast {
                clients,
                event: Box::new(event),
            });
        }
        if let Some(watch) = self.units.get_mut(&key) {
            watch.retry = None;
            if let Some(at) = watch.timer.take() {
                self.timers.remove(&(at, key));
            }
            self.unsaved.unit(&watch.unit);
        }
        self.proven_order.push_back((now, key));
        while self.proven_order.len() > self.config.retain_proven {
            if let Some((_, old)) = self.proven_order.pop_front() {
                self.drop_watch(old);
            }
        }
    }
}
