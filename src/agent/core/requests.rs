//! The request rules: watch, start, wait, stop, unwatch, list, events, version.

use std::rc::Rc;
use std::time::Instant;

use super::watch::{Heard, Watch};
use super::{Answer, Core, Output, ReplyTo, UnitKey};
use crate::control::ClientId;
use crate::control::protocol::{
    Command, ErrorKind, Request, StartArgs, StatusArgs, UnwatchArgs, Version, WaitArgs, WatchArgs,
    WatchSpec,
};
use crate::proof::Input as ProofInput;
use crate::unit_name::UnitName;

impl Core {
    pub(super) fn on_request(&mut self, client: ClientId, request: Request, now: Instant) {
        let reply = ReplyTo {
            client,
            id: request.id,
        };
        match request.command {
            Command::Watch(WatchArgs {
                unit,
                invocation,
                spec,
            }) => self.cmd_watch(reply, unit, invocation, spec),
            Command::Wait(WaitArgs { unit, timeout }) => {
                let key = self.ensure_watch(&unit);
                self.wait_for(key, reply, timeout.map(|t| now + t));
            }
            Command::Stop(WaitArgs { unit, timeout }) => {
                let key = self.watch_to_stop(&unit);
                if let Some(watch) = self.units.get_mut(&key)
                    && watch.event.is_none()
                {
                    if watch.proof.is_some() {
                        self.feed(key, ProofInput::StopRequested, now);
                    } else {
                        watch.pending_stop = true;
                    }
                    self.mark_changed(key);
                }
                self.wait_for(key, reply, timeout.map(|t| now + t));
            }
            Command::Unwatch(UnwatchArgs {
                unit: Some(unit), ..
            }) => match self.by_name.key(unit.as_str(), &self.units) {
                Some(key) => {
                    self.unwatch(key);
                    self.reply_when_saved(reply, Answer::Done);
                }
                None => self.reply(
                    reply,
                    Answer::Error(ErrorKind::NotWatched, format!("{unit} is not watched")),
                ),
            },
            Command::Unwatch(UnwatchArgs { unit: None, .. }) => {
                // A proven watch has no waiters: its proof answered them.
                let mut proven: Vec<(String, UnitKey)> = self
                    .units
                    .iter()
                    .filter(|(_, watch)| watch.event.is_some())
                    .map(|(key, watch)| (watch.unit.to_string(), *key))
                    .collect();
                // Each key once: unstable is the same order, with no scratch buffer.
                proven.sort_unstable();
                for (_, key) in &proven {
                    self.unwatch(*key);
                }
                let units = proven.into_iter().map(|(unit, _)| unit).collect();
                self.reply_when_saved(reply, Answer::Unwatched(units));
            }
            Command::List => {
                let mut views: Vec<_> = self.units.values().map(Watch::view).collect();
                // A unit once: the same order as a stable sort, with no scratch buffer.
                views.sort_unstable_by(|a, b| a.unit.cmp(&b.unit));
                self.reply(reply, Answer::Units(views));
            }
            Command::Events => {
                self.subscribers.insert(client);
                self.reply(reply, Answer::Done);
            }
            Command::Version => self.reply(reply, Answer::Version(Version::CURRENT)),
            Command::Stats => self.reply(reply, Answer::Stats(Box::new(self.stats()))),
            Command::Status(StatusArgs { unit }) => self.cmd_status(reply, &unit, now),
            Command::Start(StartArgs { unit }) => {
                self.outputs.push_back(Output::StartUnit { reply, unit });
            }
        }
    }

    /// A `start` is done: the invocation its start job began is watched, by name, so the
    /// proof is of that invocation however soon it ends. Watching before starting is the
    /// natural order, and a watch that adopts whatever runs cannot tell a start from it.
    pub(super) fn on_unit_started(
        &mut self,
        reply: ReplyTo,
        unit: UnitName,
        result: Result<String, (ErrorKind, String)>,
    ) {
        match result {
            Ok(invocation) => {
                self.log(
                    log::Level::Info,
                    format!("{unit}: started, invocation {invocation}"),
                );
                self.cmd_watch(reply, unit, Some(invocation), WatchSpec::default());
            }
            Err((kind, message)) => {
                self.log(log::Level::Warn, message.clone());
                self.reply(reply, Answer::Error(kind, message));
            }
        }
    }

    /// Forgets the watch under `key` and its retained proof; everyone still waiting on it (a
    /// `watch` waiting for its first read, a `wait`, a `stop`) is told it was unwatched.
    fn unwatch(&mut self, key: UnitKey) {
        let unanswered = self
            .units
            .get_mut(&key)
            .map(|watch| std::mem::take(&mut watch.watch_replies))
            .unwrap_or_default();
        for waiter in unanswered.into_iter().chain(self.waiters.take_key(key)) {
            self.reply(
                waiter,
                Answer::Error(ErrorKind::NotWatched, "unwatched".to_owned()),
            );
        }
        self.drop_watch(key);
    }

    fn cmd_watch(
        &mut self,
        reply: ReplyTo,
        unit: UnitName,
        invocation: Option<String>,
        spec: WatchSpec,
    ) {
        if let Some(generation) = spec.generation {
            if self.generations.insert((unit.to_string(), generation)) {
                self.unsaved.generation(unit.as_str(), generation, true);
            } else {
                let message = format!(
                    "generation {generation} of {unit} was already watched; generation numbers are never reused"
                );
                self.reply(reply, Answer::Error(ErrorKind::BadRequest, message));
                return;
            }
        }
        let mut replaced = None;
        if let Some(key) = self.by_name.key(unit.as_str(), &self.units)
            && let Some(watch) = self.units.get_mut(&key)
        {
            let ours = watch.our_invocation().map(str::to_owned);
            if let Some(event) = &watch.event {
                if invocation.is_some() && invocation.as_deref() == Some(event.invocation.as_str())
                {
                    // That invocation is proven over: say so, and start nothing that could
                    // take the unit's current invocation for a foreign one.
                    let view = Box::new(watch.view());
                    self.reply_saved(reply, Answer::Watch(view));
                    return;
                }
                // A proven unit is watched afresh: its retained proof is replaced.
                replaced = Some(key);
            } else if invocation.is_some() && invocation != ours {
                // A watch still adopting whatever invocation its first read finds cannot promise
                // to be for the one this request names.
                let message = match ours {
                    Some(ours) => format!("{unit} is already watched with invocation {ours}"),
                    None => format!("{unit} is already watched, adopting its current invocation"),
                };
                self.reply(reply, Answer::Error(ErrorKind::BadRequest, message));
                return;
            } else if spec != WatchSpec::default() && spec != *watch.spec {
                let message = format!("{unit} is already watched with other options");
                self.reply(reply, Answer::Error(ErrorKind::BadRequest, message));
                return;
            } else if watch.proof.is_some() && watch.watch_replies.is_empty() {
                // The same watch again: its first answer may still wait for the save.
                let view = Box::new(watch.view());
                self.reply_saved(reply, Answer::Watch(view));
                return;
            } else {
                watch.watch_replies.push(reply);
                return;
            }
        }
        let key = match replaced {
            Some(old) => self.watch_afresh(old, &unit, invocation, spec),
            None => self.new_watch(&unit, invocation, spec),
        };
        if let Some(watch) = self.units.get_mut(&key) {
            watch.watch_replies.push(reply);
        }
    }

    /// The watch a `stop` of `unit` stops: the unit's, started if there is none. A proven one
    /// whose unit runs another invocation now (started since by someone else) moves on to it:
    /// `stop` must never answer with an older invocation's proof while systemd runs another.
    /// The new watch names that invocation, so the stop reaches it only while it runs.
    fn watch_to_stop(&mut self, unit: &UnitName) -> UnitKey {
        let key = self.ensure_watch(unit);
        let Some(watch) = self.units.get(&key) else {
            return key;
        };
        let (Some(event), Some(running)) = (&watch.event, watch.now_running()) else {
            return key;
        };
        let proven = event.invocation.clone();
        let line = format!(
            "{unit}: the proven invocation {proven} is over; stopping the running invocation \
             {running}"
        );
        self.log_about(key, None, log::Level::Info, line);
        let key = self.watch_afresh(key, unit, Some(running), WatchSpec::default());
        self.moved_on.insert(key, proven);
        key
    }

    /// Replaces the proven watch `old` with a new one for `invocation`, which carries on what
    /// `old` heard: the unit's facts, with the invocations they moved on from in order (a
    /// watch made after its invocation ended learns from them what systemd named for it and
    /// which invocations came after it, `Core::gather_what_was_heard`), and the starts of the
    /// processes it knew.
    fn watch_afresh(
        &mut self,
        old: UnitKey,
        unit: &UnitName,
        invocation: Option<String>,
        spec: WatchSpec,
    ) -> UnitKey {
        let carried = self.units.get(&old).map(|watch| {
            let heard = Heard {
                starts: watch.known_starts(),
                ..Heard::default()
            };
            (watch.facts.carried_on(), heard)
        });
        self.drop_watch(old);
        let key = self.new_watch(unit, invocation, spec);
        if let Some((facts, heard)) = carried {
            if let Some(watch) = self.units.get_mut(&key) {
                watch.facts = facts;
            }
            self.take_heard(key, heard);
        }
        key
    }

    /// The unit's watch, started (adopting its current invocation) if there is none.
    fn ensure_watch(&mut self, unit: &UnitName) -> UnitKey {
        match self.by_name.key(unit.as_str(), &self.units) {
            Some(key) => key,
            None => self.new_watch(unit, None, WatchSpec::default()),
        }
    }

    pub(super) fn new_watch(
        &mut self,
        unit: &UnitName,
        invocation: Option<String>,
        spec: WatchSpec,
    ) -> UnitKey {
        let key = self.new_key();
        let watch = Watch::new(unit, invocation, spec);
        let (name, id) = (Rc::clone(&watch.unit), Rc::clone(&watch.id));
        self.units.insert(key, watch);
        self.by_name.replace(&name, key, &self.units);
        self.by_id.insert(&id, key, &self.units);
        self.unheard.naming(key);
        self.read_unit(key);
        self.mark_changed(key);
        key
    }

    fn wait_for(&mut self, key: UnitKey, reply: ReplyTo, deadline: Option<Instant>) {
        let Some(watch) = self.units.get(&key) else {
            return;
        };
        match &watch.event {
            Some(event) => {
                let answer = self.event_answer(key, (**event).clone());
                self.reply(reply, answer);
            }
            None => {
                self.waiters.add(key, reply, deadline);
            }
        }
    }
}
