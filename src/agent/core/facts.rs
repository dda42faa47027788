//! systemd's state of one unit, merged from signals and reads in systemd's own order.
//!
//! A PropertiesChanged signal and the reply to a read travel on different paths through the
//! connection, so the agent may see them in either order. Both come from one sender, whose
//! serial numbers only grow, so each property keeps the serial of the message it came from and
//! an older message never overwrites a newer value.

use std::num::NonZeroU64;

use crate::cgroup::procs::{GoneRoot, NextInvocation, OnceHeld};
use crate::proof::UnitState;
use crate::proof::words::{Word, word};
use crate::systemd::signal::{UnitChange, lower_hex};
use crate::systemd::snapshot::{ServiceExit, UnitSnapshot};

/// One property and the serial of the message that set it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stamped<T> {
    value: Option<T>,
    serial: u32,
}

impl<T> Default for Stamped<T> {
    fn default() -> Self {
        Stamped {
            value: None,
            serial: 0,
        }
    }
}

impl<T: PartialEq + Clone> Stamped<T> {
    /// Takes `value` if it comes from a message newer than the current one; true if it did.
    fn offer(&mut self, value: &T, serial: u32) -> bool {
        if self.value.is_some() && !newer(serial, self.serial) {
            return false;
        }
        self.value = Some(value.clone());
        self.serial = serial;
        true
    }

    /// Offers `value` if there is one.
    fn offer_some(&mut self, value: Option<&T>, serial: u32) {
        if let Some(v) = value {
            self.offer(v, serial);
        }
    }
}

/// An InvocationID as the facts keep it: the 32 lowercase hex digits systemd's are held as
/// their 16 bytes, anything else (none: empty) as it came. Every watch holds one.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Invocation {
    Id([u8; 16]),
    Text(Box<str>),
}

impl Invocation {
    fn new(text: &str) -> Invocation {
        let digit = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        let mut id = [0u8; 16];
        let parsed = text.len() == 32
            && text.as_bytes().chunks(2).zip(&mut id).all(|(pair, byte)| {
                match (digit(pair[0]), digit(pair[1])) {
                    (Some(high), Some(low)) => {
                        *byte = high << 4 | low;
                        true
                    }
                    _ => false,
                }
            });
        if parsed {
            Invocation::Id(id)
        } else {
            Invocation::Text(text.into())
        }
    }

    /// The text it was made from.
    fn text(&self) -> String {
        match self {
            Invocation::Id(id) => lower_hex(id),
            Invocation::Text(text) => text.to_string(),
        }
    }
}

/// Whether a unit in `active_state` and `sub_state` has ended its invocation though it is
/// neither `inactive` nor `failed` ([`UnitFacts::ended_meanwhile`]).
fn ended_meanwhile(active_state: Option<&str>, sub_state: Option<&str>) -> bool {
    matches!(sub_state, Some("auto-restart" | "auto-restart-queued"))
        || active_state == Some("maintenance")
}

/// Whether InactiveExitTimestamp said beside `active_state` and `sub_state` tells when the
/// invocation said with it began: once the unit left `inactive` or `failed` (systemd assigns
/// the InvocationID before, while the timestamp is still the previous invocation's), and not
/// when it left them again after the invocation ended (`unit_notify` stamps every such change):
/// to wait for a restart, or to be cleaned.
fn stamps_a_beginning(active_state: Option<&str>, sub_state: Option<&str>) -> bool {
    !matches!(active_state, None | Some("inactive" | "failed"))
        && !ended_meanwhile(active_state, sub_state)
}

/// Whether serial `a` comes after `b`, allowing for the counter wrapping around.
fn newer(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// The merged state of one unit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct UnitFacts {
    /// systemd has the unit loaded (a signal about it says so too).
    loaded: Stamped<bool>,
    active_state: Stamped<Word>,
    sub_state: Stamped<Word>,
    invocation: Stamped<Invocation>,
    result: Stamped<Word>,
    exec_main_code: Stamped<i32>,
    exec_main_status: Stamped<i32>,
    inactive_exit_us: Stamped<u64>,
    main_pid: Stamped<u32>,
    control_pid: Stamped<u32>,
    /// The serial of the last message that still carried the previous InvocationID: what
    /// systemd said after it is about the current invocation (`None`: all it said is).
    previous_invocation_until: Option<u32>,
    /// When the current invocation began (InactiveExitTimestamp said while it had begun),
    /// kept once it ends: an invocation over again reads `inactive` like one yet to begin,
    /// whose InactiveExitTimestamp is still the previous invocation's. Never 0 (systemd's
    /// "never"), which keeps the facts 8 bytes smaller.
    began_us: Option<NonZeroU64>,
    /// Every MainPID and ControlPID said of the current invocation, newest last, at most
    /// [`MAX_ROOTS_SEEN`]: the sessions they began are the invocation's after they are gone.
    roots_seen: Vec<u32>,
    /// The oldest message known to carry the current InvocationID: an InvocationID never
    /// comes back, so every message from it on, to the newest, is about the current one,
    /// though a read may tell it before older signals are handled.
    invocation_since: u32,
    /// What was known of the current invocation when the connection was lost: serials start
    /// afresh on the next one, but an InvocationID names one invocation for good, so it is
    /// taken back if the next connection names the same.
    before_loss: Option<Box<KnownOfInvocation>>,
    /// What was known of the invocations before the current one when the facts moved on from
    /// each, oldest first, at most [`MAX_EARLIER`]: the core keeps our invocation's roots from
    /// it, which systemd may name again for a later one (its guess of a Type=forking MainPID),
    /// and a watch made later learns from it which invocations came after its own. Boxed: most
    /// watches never see their unit move on.
    #[expect(
        clippy::box_collection,
        reason = "a thin pointer keeps every watch 16 bytes smaller"
    )]
    earlier: Option<Box<Vec<KnownOfInvocation>>>,
    /// The MainPID and ControlPID of a signal older than the current invocation's messages (a
    /// signal handled after a read that told a later invocation), until the signal after it
    /// names their invocation: systemd sends a service's change right before its unit's.
    late_roots: Option<Box<LateRoots>>,
    /// The serial of the first read on this connection. What a message from it on names is
    /// the watch's invocation or a later one (the facts only move forward from a read), while
    /// an older message may name one before it.
    first_read: Option<u32>,
    /// A read was in on an earlier connection: every message of this one was sent after it.
    read_before_loss: bool,
    /// The ActiveState was said by a signal, not a read (see [`UnitFacts::starting`]).
    state_from_signal: bool,
}

/// Roots said in a late signal, and then whose they are.
#[derive(Clone, Debug, PartialEq, Eq)]
enum LateRoots {
    /// Said in the signal of `serial`, whose invocation the next signal tells.
    Unplaced { pids: [u32; 2], serial: u32 },
    /// Said of `invocation`, not the current one, which began at `began_us` if the signal
    /// that named it said so.
    Placed {
        invocation: Invocation,
        pids: [u32; 2],
        began_us: Option<u64>,
    },
}

/// What the facts gather of one invocation beyond its current values.
#[derive(Clone, Debug, PartialEq, Eq)]
struct KnownOfInvocation {
    invocation: Invocation,
    began_us: Option<NonZeroU64>,
    roots_seen: Vec<u32>,
}

/// How many of an invocation's MainPIDs and ControlPIDs the facts keep: one per command it ran
/// (ExecCondition=, ExecStartPre=, ExecStart=, ExecStartPost=, ExecReload=, ExecStop=,
/// ExecStopPost=); the oldest go first, and a session forgotten only makes its orphans wait.
const MAX_ROOTS_SEEN: usize = 8;

/// How many invocations before the current one the facts keep; the oldest go first, and one
/// forgotten only leaves a watch made later for it, or after it, knowing less (it waits).
const MAX_EARLIER: usize = 8;

impl UnitFacts {
    /// Applies a read. Returns true if the invocation changed.
    pub(super) fn apply_snapshot(&mut self, snapshot: &UnitSnapshot) -> bool {
        self.first_read.get_or_insert(snapshot.serial);
        self.apply_shared_snapshot(snapshot)
    }

    /// Applies another watch's read of the same unit (an alias, or the unit of an alias): what
    /// it says holds, but it is no read of this watch, which places what it heard by its own
    /// first read. Returns true if the invocation changed.
    pub(super) fn apply_shared_snapshot(&mut self, snapshot: &UnitSnapshot) -> bool {
        let before = self.invocation.value.clone();
        self.loaded.offer(&snapshot.loaded, snapshot.serial);
        if self
            .active_state
            .offer(&word(&snapshot.active_state), snapshot.serial)
        {
            self.state_from_signal = false;
        }
        self.sub_state
            .offer(&word(&snapshot.sub_state), snapshot.serial);
        self.offer_invocation(
            &Invocation::new(&snapshot.invocation),
            snapshot.serial,
            true,
        );
        if let Some((exit, serial)) = &snapshot.exit {
            self.result
                .offer_some(exit.result.as_deref().map(word).as_ref(), *serial);
            self.exec_main_code
                .offer_some(exit.exec_main_code.as_ref(), *serial);
            self.exec_main_status
                .offer_some(exit.exec_main_status.as_ref(), *serial);
        }
        let current = &snapshot.current;
        self.inactive_exit_us
            .offer_some(current.inactive_exit_us.as_ref(), snapshot.serial);
        if let Some(((main, control), serial)) = current.pids {
            self.main_pid.offer(&main, serial);
            self.control_pid.offer(&control, serial);
        }
        let (pids, serial) = current
            .pids
            .filter(|_| self.invocation.value == Some(Invocation::new(&snapshot.invocation)))
            .map_or(([0, 0], snapshot.serial), |((main, control), serial)| {
                ([main, control], serial)
            });
        self.note_roots(pids, serial);
        self.note_beginning();
        before.is_some() && before != self.invocation.value
    }

    /// What a read of this watch said of another invocation than the current one, when it was
    /// handled after messages that named a later one (systemd answered it before it sent them,
    /// or they were lost with a connection): the invocation it names, and its MainPID,
    /// ControlPID and beginning. A read is sent after the watch was made, so after ours began:
    /// that invocation is ours or a later one.
    pub(super) fn late_read_roots(
        &self,
        snapshot: &UnitSnapshot,
    ) -> Option<(String, NextInvocation)> {
        let named = Invocation::new(&snapshot.invocation);
        if snapshot.invocation.is_empty() || self.invocation.value.as_ref() == Some(&named) {
            return None;
        }
        let ((main, control), _) = snapshot.current.pids?;
        let began = stamps_a_beginning(Some(&snapshot.active_state), Some(&snapshot.sub_state));
        let began_us = snapshot
            .current
            .inactive_exit_us
            .filter(|us| began && *us > 0);
        let gone_roots: Vec<GoneRoot> = [main, control]
            .into_iter()
            .filter(|pid| *pid > 0)
            .filter_map(|pid| i32::try_from(pid).ok())
            .map(|pid| GoneRoot { pid, began_us })
            .collect();
        (!gone_roots.is_empty()).then(|| {
            let roots = NextInvocation {
                began_us,
                gone_roots,
                ..NextInvocation::default()
            };
            (snapshot.invocation.clone(), roots)
        })
    }

    /// Applies a signal. Returns true if the invocation changed.
    pub(super) fn apply_change(&mut self, change: &UnitChange, serial: u32) -> bool {
        self.loaded.offer(&true, serial);
        if change
            .active_state
            .as_deref()
            .is_some_and(|state| self.active_state.offer(&word(state), serial))
        {
            self.state_from_signal = true;
        }
        self.sub_state
            .offer_some(change.sub_state.as_deref().map(word).as_ref(), serial);
        self.result
            .offer_some(change.result.as_deref().map(word).as_ref(), serial);
        self.exec_main_code
            .offer_some(change.exec_main_code.as_ref(), serial);
        self.exec_main_status
            .offer_some(change.exec_main_status.as_ref(), serial);
        self.inactive_exit_us
            .offer_some(change.inactive_exit_us.as_ref(), serial);
        self.main_pid.offer_some(change.main_pid.as_ref(), serial);
        self.control_pid
            .offer_some(change.control_pid.as_ref(), serial);
        let before = self.invocation.value.clone();
        let changed = match &change.invocation {
            Some(v) => {
                let v = Invocation::new(v);
                self.offer_invocation(&v, serial, false) && before.is_some() && before != Some(v)
            }
            None => false,
        };
        let pids = [change.main_pid, change.control_pid].map(Option::unwrap_or_default);
        self.note_roots(pids, serial);
        self.note_beginning();
        self.note_late_roots(change, pids, serial);
        changed
    }

    /// Keeps the roots a late signal said (one older than the current invocation's messages)
    /// until the late signal right after it names their invocation. Signals come in serial
    /// order, so no signal of this unit lies between the two.
    fn note_late_roots(&mut self, change: &UnitChange, pids: [u32; 2], serial: u32) {
        let unplaced = match self.late_roots.take().map(|late| *late) {
            Some(LateRoots::Unplaced { pids, serial: said }) if newer(serial, said) => Some(pids),
            _ => None,
        };
        if self.said_of_current(serial) {
            // A late change that names the current invocation (it moved when that was first
            // said back to this one): the roots said right before it are the current's.
            if let Some(pids) = unplaced
                && change.invocation.is_some()
            {
                self.note_roots(pids, serial);
            }
            return;
        }
        // Only an invocation named after the first read is known to come after the watch's.
        let after_first_read = self.first_read.is_some_and(|read| !newer(read, serial));
        // As for the current invocation (`current_began_us`).
        let began = stamps_a_beginning(change.active_state.as_deref(), change.sub_state.as_deref());
        let began_us = change.inactive_exit_us.filter(|us| began && *us > 0);
        self.late_roots = match (change.invocation.as_deref(), unplaced) {
            (Some(invocation), Some(pids)) if after_first_read => Some(LateRoots::Placed {
                invocation: Invocation::new(invocation),
                pids,
                began_us,
            }),
            (None, _) if pids != [0, 0] => Some(LateRoots::Unplaced { pids, serial }),
            _ => None,
        }
        .map(Box::new);
    }

    /// The roots a late signal said of another invocation than the current one, named after
    /// the first read, once the signal after it named it: that invocation, and what they tell
    /// of its processes.
    pub(super) fn take_late_roots(&mut self) -> Option<(String, NextInvocation)> {
        let Some(LateRoots::Placed {
            invocation,
            pids,
            began_us,
        }) = self.late_roots.as_deref()
        else {
            return None;
        };
        let placed = (
            invocation.text(),
            NextInvocation {
                began_us: *began_us,
                gone_roots: pids
                    .iter()
                    .filter(|pid| **pid > 0)
                    .filter_map(|pid| i32::try_from(*pid).ok())
                    .map(|pid| GoneRoot {
                        pid,
                        began_us: *began_us,
                    })
                    .collect(),
                ..NextInvocation::default()
            },
        );
        self.late_roots = None;
        Some(placed)
    }

    /// Keeps when the current invocation began, once systemd says it has.
    fn note_beginning(&mut self) {
        if let Some(began_us) = self.current_began_us() {
            self.began_us = NonZeroU64::new(began_us);
        }
    }

    /// Keeps a MainPID and ControlPID (0: none) said in message `serial` of the current
    /// invocation, even when a newer message said they changed since: each began a session.
    /// What the current values say is kept too: the Service interface's change comes just
    /// before the InvocationID of the same change.
    fn note_roots(&mut self, pids: [u32; 2], serial: u32) {
        let of_current = self.said_of_current(serial);
        if let Some(control) = self.current_roots()[1] {
            self.forget_as_earlier(control);
        }
        let said = pids.into_iter().filter(|_| of_current);
        let current = self.current_roots().into_iter().flatten();
        for pid in said.chain(current).filter(|pid| *pid > 0) {
            if !self.roots_seen.contains(&pid) {
                if self.roots_seen.len() == MAX_ROOTS_SEEN {
                    self.roots_seen.remove(0);
                }
                self.roots_seen.push(pid);
            }
        }
    }

    /// A ControlPID is the invocation's it is said of: systemd forks it for that invocation
    /// and never guesses one (it guesses only a MainPID, `service_search_main_pid`). One kept
    /// with an earlier invocation leaves it: the facts place a Service-interface change with
    /// the invocation they know, and the Unit-interface change right after it that named a new
    /// one (`send_changed_signal`) may have been lost with the connection.
    fn forget_as_earlier(&mut self, control: u32) {
        let earlier = self
            .earlier
            .iter_mut()
            .flat_map(|earlier| earlier.iter_mut());
        for known in earlier
            .chain(self.before_loss.as_deref_mut())
            .filter(|known| Some(&known.invocation) != self.invocation.value.as_ref())
        {
            known.roots_seen.retain(|pid| *pid != control);
        }
    }

    /// The current invocation's ControlPID, if systemd said one of it.
    pub(super) fn current_control_pid(&self) -> Option<i32> {
        self.current_roots()[1].and_then(|pid| i32::try_from(pid).ok())
    }

    /// The MainPID and ControlPID said of the current invocation, those that are set.
    fn current_roots(&self) -> [Option<u32>; 2] {
        [&self.main_pid, &self.control_pid].map(|stamped| {
            stamped
                .value
                .filter(|pid| *pid > 0 && self.said_of_current(stamped.serial))
        })
    }

    /// When the current invocation began, if systemd says it has begun: InactiveExitTimestamp
    /// said after the previous InvocationID, in a state that stamps a beginning.
    fn current_began_us(&self) -> Option<u64> {
        let began = stamps_a_beginning(self.active_state.value.as_deref(), self.sub_state());
        self.inactive_exit_us
            .value
            .filter(|us| began && *us > 0 && self.said_of_current(self.inactive_exit_us.serial))
    }

    /// Whether a value of message `serial` is about the current invocation: said after the
    /// previous one's last message, or no older than the oldest message known to carry the
    /// current one (an InvocationID never comes back).
    fn said_of_current(&self, serial: u32) -> bool {
        self.invocation.value.is_some()
            && (self
                .previous_invocation_until
                .is_none_or(|until| newer(serial, until))
                || !newer(self.invocation_since, serial))
    }

    /// Takes a newer InvocationID, remembering until when the previous one was said.
    fn offer_invocation(&mut self, value: &Invocation, serial: u32, told_by_read: bool) -> bool {
        let previous = self.invocation.clone();
        let had_previous = previous.value.is_some();
        let taken = self.invocation.offer(value, serial);
        let same = previous.value.as_ref() == Some(value);
        if (taken && !same) || (same && newer(self.invocation_since, serial)) {
            self.invocation_since = serial;
        }
        if taken && !same {
            // In order, signals tell where the previous one ended; the first signal has
            // nothing before it but its own Service interface's change. A read (handled before
            // older signals) may tell one after others the agent has not seen: only from its
            // own message on is anything about it.
            self.previous_invocation_until = match previous.value {
                _ if told_by_read => Some(serial.wrapping_sub(1)),
                Some(_) => Some(previous.serial),
                None => None,
            };
            // A MainPID or ControlPID said after the last message that named the previous
            // invocation may be this one's: systemd sends a service's change just before its
            // unit's.
            let said_since = [&self.main_pid, &self.control_pid].map(|stamped| {
                stamped
                    .value
                    .filter(|_| newer(stamped.serial, previous.serial))
            });
            let moved_on_from = match previous.value {
                Some(invocation) => Some(Box::new(KnownOfInvocation {
                    invocation,
                    began_us: self.began_us.take(),
                    roots_seen: std::mem::take(&mut self.roots_seen)
                        .into_iter()
                        .filter(|pid| !said_since.contains(&Some(*pid)))
                        .collect(),
                })),
                None => self
                    .before_loss
                    .clone()
                    .filter(|known| known.invocation != *value),
            };
            if let Some(moved_on_from) = moved_on_from {
                self.note_earlier(*moved_on_from);
            }
            self.began_us = None;
            self.roots_seen.clear();
        }
        if taken {
            let known = self.before_loss.take();
            if let Some(known) = known.filter(|known| !had_previous && known.invocation == *value) {
                self.began_us = known.began_us;
                self.roots_seen = known.roots_seen;
            }
        }
        taken
    }

    /// Keeps what was known of `known`, an invocation the facts moved on from, as the latest
    /// of the earlier ones. The facts move on from an invocation once: they take only a newer
    /// one, and an InvocationID never comes back.
    fn note_earlier(&mut self, known: KnownOfInvocation) {
        let earlier = self.earlier.get_or_insert_default();
        if earlier.len() == MAX_EARLIER {
            earlier.remove(0);
        }
        earlier.push(known);
    }

    /// The facts a watch made afresh in place of this one's starts from: systemd's state of the
    /// unit, with the invocations they moved on from in order, is the same for it; only what
    /// places messages against this watch's own first read is not.
    pub(super) fn carried_on(&self) -> UnitFacts {
        UnitFacts {
            first_read: None,
            read_before_loss: false,
            ..self.clone()
        }
    }

    /// Forgets everything (the connection was lost: its serials mean nothing on the next one).
    pub(super) fn clear(&mut self) {
        let known = self.invocation.value.take().map(|invocation| {
            Box::new(KnownOfInvocation {
                invocation,
                began_us: self.began_us,
                roots_seen: std::mem::take(&mut self.roots_seen),
            })
        });
        *self = UnitFacts {
            before_loss: known.or_else(|| self.before_loss.take()),
            earlier: self.earlier.take(),
            read_before_loss: self.read_before_loss || self.first_read.is_some(),
            ..UnitFacts::default()
        };
    }

    /// The oldest message known to name the current invocation, if there is one.
    pub(super) fn invocation_since(&self) -> Option<u32> {
        self.invocation
            .value
            .as_ref()
            .map(|_| self.invocation_since)
    }

    /// Whether a read is in on this connection.
    pub(super) fn read_in(&self) -> bool {
        self.first_read.is_some()
    }

    /// Whether a read was in on an earlier connection of this life of the agent.
    pub(super) fn read_before_loss(&self) -> bool {
        self.read_before_loss
    }

    /// Whether systemd had the unit loaded, as last said (`None`: not said yet).
    pub(super) fn loaded(&self) -> Option<bool> {
        self.loaded.value
    }

    /// The state the proof is made from, once both of its fields are known.
    pub(super) fn state(&self) -> Option<UnitState> {
        Some(UnitState {
            active_state: self.active_state.value.as_deref()?.to_owned(),
            invocation: self.invocation.value.as_ref()?.text(),
            starting: self.starting(),
        })
    }

    /// Whether the ActiveState is `inactive` or `failed` as said by the oldest message known to
    /// name the current invocation, a signal: systemd's announcement that the invocation
    /// starts, not its end. `service_start` takes the new InvocationID
    /// (`unit_acquire_invocation_id`) while the unit is still dead or failed, and `unit_notify`
    /// sends that change (`bus_unit_send_pending_change_signal`) before the `activating` of
    /// the same turn of systemd's loop: the end of an invocation is always said in a later
    /// message than the first to name it. A read is answered between two turns, so it never
    /// tells that state of an invocation about to start; nor does a message older than the
    /// signal that names the invocation in it (then the signal is not the first). No
    /// invocation (an empty InvocationID) is never one that starts.
    fn starting(&self) -> bool {
        let named = matches!(&self.invocation.value, Some(Invocation::Id(_)))
            || matches!(&self.invocation.value, Some(Invocation::Text(text)) if !text.is_empty());
        self.state_from_signal
            && named
            && self.active_state.serial == self.invocation_since
            && matches!(self.active_state(), Some("inactive" | "failed"))
    }

    /// How the service's main process last ended, as far as systemd has said.
    pub(super) fn service_exit(&self) -> Option<ServiceExit> {
        let exit = ServiceExit {
            result: self.result.value.as_deref().map(str::to_owned),
            exec_main_code: self.exec_main_code.value,
            exec_main_status: self.exec_main_status.value,
        };
        (exit != ServiceExit::default()).then_some(exit)
    }

    /// What tells the current invocation's processes apart: only values systemd said after the
    /// last message that carried the previous InvocationID, so they cannot be an earlier one's
    /// (systemd sends a service's MainPID before the InvocationID of the same change).
    pub(super) fn next_invocation(&self) -> NextInvocation {
        let as_pid = |pid: u32| i32::try_from(pid).ok();
        let roots: Vec<i32> = self
            .current_roots()
            .into_iter()
            .flatten()
            .filter_map(as_pid)
            .collect();
        let began_us = self
            .current_began_us()
            .or(self.began_us.map(NonZeroU64::get));
        let gone_roots = self
            .roots_seen
            .iter()
            .filter_map(|pid| as_pid(*pid))
            .filter(|pid| !roots.contains(pid))
            .map(|pid| GoneRoot { pid, began_us })
            .collect();
        NextInvocation {
            began_us,
            roots,
            roots_began_us: began_us,
            gone_roots,
            once_held: OnceHeld::None,
            counted_roots: Vec::new(),
        }
    }

    /// Every MainPID and ControlPID systemd said of `invocation` (its text), as far as the facts
    /// still hold it: the current invocation, an earlier one, or the one known when the
    /// connection was lost.
    pub(super) fn roots_of(&self, invocation: &str) -> Vec<i32> {
        // Parsed once and compared as the facts hold it: formatting each held one as text
        // would allocate for every signal the watch hears while a later invocation runs.
        let wanted = Invocation::new(invocation);
        // The current values are in `roots_seen` too (`note_roots`).
        let seen = if self.invocation.value.as_ref() == Some(&wanted) {
            Some(&self.roots_seen)
        } else {
            self.earlier
                .iter()
                .flat_map(|earlier| earlier.iter())
                .chain(self.before_loss.as_deref())
                .find(|known| known.invocation == wanted)
                .map(|known| &known.roots_seen)
        };
        seen.into_iter()
            .flatten()
            .filter_map(|&pid| i32::try_from(pid).ok())
            .collect()
    }

    /// What the facts know of each invocation after `invocation` (its text) that they moved on
    /// from, oldest first: the current one a watch takes from its own facts, and nothing is
    /// known if they do not hold `invocation` among the earlier ones. The facts move on in
    /// systemd's order (by serial, and every message of a connection after the last one's),
    /// so only an invocation they moved on from places the ones after it.
    pub(super) fn known_after(&self, invocation: &str) -> Vec<(String, NextInvocation)> {
        let wanted = Invocation::new(invocation);
        let Some(earlier) = self.earlier.as_deref() else {
            return Vec::new();
        };
        let Some(at) = earlier.iter().position(|known| known.invocation == wanted) else {
            return Vec::new();
        };
        let as_pid = |pid: &u32| i32::try_from(*pid).ok();
        earlier[at + 1..]
            .iter()
            .map(|known| {
                let began_us = known.began_us.map(NonZeroU64::get);
                let gone_roots = known.roots_seen.iter().filter_map(as_pid);
                let next = NextInvocation {
                    began_us,
                    gone_roots: gone_roots.map(|pid| GoneRoot { pid, began_us }).collect(),
                    ..NextInvocation::default()
                };
                (known.invocation.text(), next)
            })
            .collect()
    }

    /// Whether the state (ActiveState or InvocationID) was said in a message after `serial`:
    /// then what a read of serial `serial` said beside it may be older than the state.
    pub(super) fn state_said_after(&self, serial: u32) -> bool {
        newer(self.active_state.serial, serial) || newer(self.invocation.serial, serial)
    }

    pub(super) fn active_state(&self) -> Option<&str> {
        self.active_state.value.as_deref()
    }

    /// Whether the invocation systemd names has ended though the unit is neither `inactive`
    /// nor `failed`: it waits to be started again (`service_enter_restart`; systemd said
    /// `failed` before), or is being cleaned (`maintenance`, `service_clean`, only from
    /// `dead` or `failed`). The next start gets a new InvocationID.
    pub(super) fn ended_meanwhile(&self) -> bool {
        ended_meanwhile(self.active_state(), self.sub_state())
    }

    pub(super) fn sub_state(&self) -> Option<&str> {
        self.sub_state.value.as_deref()
    }

    pub(super) fn invocation(&self) -> Option<String> {
        self.invocation.value.as_ref().map(Invocation::text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(serial: u32, active: &str, invocation: &str) -> UnitSnapshot {
        UnitSnapshot {
            serial,
            loaded: true,
            id: "x.service".into(),
            path: String::new(),
            active_state: active.into(),
            sub_state: "x".into(),
            invocation: invocation.into(),
            control_group: String::new(),
            exit: None,
            current: Default::default(),
            load_state: None,
        }
    }

    fn change(active: Option<&str>, invocation: Option<&str>) -> UnitChange {
        UnitChange {
            active_state: active.map(Into::into),
            sub_state: None,
            invocation: invocation.map(Into::into),
            ..UnitChange::default()
        }
    }

    #[test]
    fn a_signal_newer_than_the_read_wins_whichever_arrives_first() {
        let mut signal_first = UnitFacts::default();
        signal_first.apply_change(&change(Some("inactive"), None), 11);
        signal_first.apply_snapshot(&snapshot(10, "active", "a"));
        let mut read_first = UnitFacts::default();
        read_first.apply_snapshot(&snapshot(10, "active", "a"));
        read_first.apply_change(&change(Some("inactive"), None), 11);
        for facts in [signal_first, read_first] {
            assert_eq!(facts.active_state(), Some("inactive"));
            assert_eq!(facts.invocation().as_deref(), Some("a"));
        }
    }

    #[test]
    fn a_read_newer_than_the_signal_wins_whichever_arrives_first() {
        let mut facts = UnitFacts::default();
        facts.apply_snapshot(&snapshot(20, "active", "b"));
        facts.apply_change(&change(Some("inactive"), Some("a")), 19);
        assert_eq!(facts.state().map(|s| s.active_state), Some("active".into()));
        assert_eq!(facts.invocation().as_deref(), Some("b"));
    }

    fn starting(facts: &UnitFacts) -> Option<bool> {
        facts.state().map(|state| state.starting)
    }

    /// systemd names a new invocation first in a signal that still says the old state: that
    /// state is its start, and only a later message can say its end.
    #[test]
    fn an_invocations_first_signal_inactive_is_its_start_not_its_end() {
        let mut facts = UnitFacts::default();
        facts.apply_snapshot(&snapshot(10, "active", "w"));
        assert_eq!(starting(&facts), Some(false));
        facts.apply_change(&change(Some("inactive"), Some("w")), 11);
        assert_eq!(starting(&facts), Some(false), "w's end");
        facts.apply_change(&change(Some("inactive"), Some("x")), 12);
        assert_eq!(starting(&facts), Some(true), "x's start");
        facts.apply_change(&change(Some("activating"), Some("x")), 13);
        assert_eq!(starting(&facts), Some(false));
        facts.apply_change(&change(Some("failed"), Some("x")), 14);
        assert_eq!(starting(&facts), Some(false), "x's end");
        facts.apply_change(&change(Some("failed"), Some("y")), 15);
        assert_eq!(starting(&facts), Some(true), "y's start, after a failed x");
        // A read newer than the signal tells the state of that moment, never a start.
        facts.apply_snapshot(&snapshot(16, "inactive", "y"));
        assert_eq!(starting(&facts), Some(false));
    }

    /// A read handled after a newer signal: one that names the invocation in an older message
    /// shows the signal was not its first (so `failed` there is its end); one that names an
    /// earlier invocation leaves the signal its start.
    #[test]
    fn an_older_read_naming_the_invocation_shows_its_first_signal_was_not_its_start() {
        let mut named_before = UnitFacts::default();
        named_before.apply_change(&change(Some("failed"), Some("x")), 20);
        assert_eq!(starting(&named_before), Some(true));
        named_before.apply_snapshot(&snapshot(19, "deactivating", "x"));
        assert_eq!(named_before.active_state(), Some("failed"));
        assert_eq!(starting(&named_before), Some(false));

        let mut earlier_one = UnitFacts::default();
        earlier_one.apply_change(&change(Some("inactive"), Some("x")), 20);
        earlier_one.apply_snapshot(&snapshot(19, "active", "w"));
        assert_eq!(earlier_one.invocation().as_deref(), Some("x"));
        assert_eq!(starting(&earlier_one), Some(true));
        // No invocation is never one that starts.
        let mut none = UnitFacts::default();
        none.apply_change(&change(Some("inactive"), Some("")), 3);
        assert_eq!(starting(&none), Some(false));
    }

    #[test]
    fn state_needs_both_fields() {
        let mut facts = UnitFacts::default();
        assert_eq!(facts.state(), None);
        facts.apply_change(&change(Some("active"), None), 1);
        assert_eq!(facts.state(), None);
        facts.apply_change(&change(None, Some("a")), 2);
        assert!(facts.state().is_some());
        facts.clear();
        assert_eq!(facts.state(), None);
    }

    #[test]
    fn an_invocation_over_is_still_told_by_when_it_began() {
        let mut facts = UnitFacts::default();
        let at = |active: &str, invocation: &str, began: u64| UnitChange {
            active_state: Some(active.into()),
            invocation: Some(invocation.into()),
            inactive_exit_us: Some(began),
            ..UnitChange::default()
        };
        facts.apply_change(&at("active", "a", 1_000), 1);
        facts.apply_change(&at("inactive", "b", 1_000), 2);
        facts.apply_change(&at("active", "b", 5_000), 3);
        facts.apply_change(&at("inactive", "b", 5_000), 4);
        assert_eq!(
            facts.next_invocation().began_us,
            Some(5_000),
            "b began, then ended"
        );
        facts.apply_change(&at("inactive", "c", 5_000), 5);
        assert_eq!(
            facts.next_invocation().began_us,
            None,
            "c has not begun: 5,000 is when b began"
        );
    }

    #[test]
    fn invocation_changes_are_reported() {
        let mut facts = UnitFacts::default();
        assert!(!facts.apply_snapshot(&snapshot(1, "active", "a")));
        assert!(!facts.apply_change(&change(None, Some("a")), 2));
        assert!(facts.apply_change(&change(None, Some("b")), 3));
        assert!(
            !facts.apply_change(&change(None, Some("c")), 2),
            "older signal ignored"
        );
        assert!(facts.apply_snapshot(&snapshot(4, "active", "d")));
    }

    #[test]
    fn the_next_invocation_is_told_by_what_was_said_with_or_after_its_invocation_id() {
        let mut facts = UnitFacts::default();
        let ours = UnitChange {
            active_state: Some("active".into()),
            invocation: Some("a".into()),
            inactive_exit_us: Some(1_000),
            main_pid: Some(10),
            ..UnitChange::default()
        };
        facts.apply_change(&ours, 1);
        // The next InvocationID comes while the unit is still inactive: the timestamp is ours.
        let assigned = UnitChange {
            active_state: Some("inactive".into()),
            invocation: Some("b".into()),
            inactive_exit_us: Some(1_000),
            main_pid: Some(0),
            ..UnitChange::default()
        };
        facts.apply_change(&assigned, 2);
        assert_eq!(facts.next_invocation(), NextInvocation::default());
        let started = UnitChange {
            active_state: Some("activating".into()),
            inactive_exit_us: Some(5_000),
            ..UnitChange::default()
        };
        facts.apply_change(&started, 3);
        let pids = UnitChange {
            main_pid: Some(20),
            control_pid: Some(0),
            ..UnitChange::default()
        };
        facts.apply_change(&pids, 4);
        assert_eq!(
            facts.next_invocation(),
            NextInvocation {
                began_us: Some(5_000),
                roots_began_us: Some(5_000),
                roots: vec![20],
                gone_roots: vec![],
                once_held: OnceHeld::None,
                counted_roots: vec![],
            }
        );
    }

    #[test]
    fn a_main_pid_said_just_before_the_next_invocation_id_is_the_next_ones() {
        let mut facts = UnitFacts::default();
        facts.apply_change(&change(Some("inactive"), Some("a")), 1);
        // systemd's order: the Service interface's change, then the Unit interface's.
        let service = UnitChange {
            main_pid: Some(30),
            ..UnitChange::default()
        };
        facts.apply_change(&service, 2);
        let unit = UnitChange {
            active_state: Some("activating".into()),
            invocation: Some("b".into()),
            inactive_exit_us: Some(7_000),
            ..UnitChange::default()
        };
        facts.apply_change(&unit, 3);
        assert_eq!(
            facts.next_invocation(),
            NextInvocation {
                began_us: Some(7_000),
                roots_began_us: Some(7_000),
                roots: vec![30],
                gone_roots: vec![],
                once_held: OnceHeld::None,
                counted_roots: vec![],
            }
        );
    }

    #[test]
    fn an_invocation_reads_back_as_it_came() {
        let id = "0123456789abcdef0123456789abcdef";
        assert!(matches!(Invocation::new(id), Invocation::Id(_)));
        for text in [
            id,
            "",
            "a",
            "0123456789ABCDEF0123456789ABCDEF",
            "0123456789abcdef0123456789abcdeg",
        ] {
            assert_eq!(Invocation::new(text).text(), text);
        }
        assert_ne!(
            Invocation::new(id),
            Invocation::new(&id.to_ascii_uppercase())
        );
    }

    #[test]
    fn serials_compare_across_the_wrap() {
        assert!(newer(1, u32::MAX));
        assert!(newer(5, 4));
        assert!(!newer(4, 5));
        assert!(!newer(7, 7));
    }
    fn pids(main: u32, control: u32) -> UnitChange {
        UnitChange {
            main_pid: Some(main),
            control_pid: Some(control),
            ..UnitChange::default()
        }
    }

    #[test]
    fn every_main_and_control_pid_of_the_next_invocation_is_kept_once_gone() {
        let mut facts = UnitFacts::default();
        facts.apply_change(&change(Some("active"), Some("a")), 1);
        // The Service interface's change comes just before the new InvocationID.
        facts.apply_change(&pids(0, 20), 2);
        facts.apply_change(&change(Some("inactive"), Some("b")), 3);
        facts.apply_change(&pids(21, 0), 4);
        facts.apply_change(&change(Some("activating"), None), 5);
        facts.apply_change(&pids(0, 0), 6);
        let next = facts.next_invocation();
        assert_eq!(next.roots, Vec::<i32>::new());
        assert_eq!(next.gone_pids(), [20, 21]);
        // Another invocation: what was b's is not its.
        facts.apply_change(&change(Some("inactive"), Some("c")), 7);
        assert_eq!(facts.next_invocation().gone_pids(), Vec::<i32>::new());
    }

    #[test]
    fn pids_older_than_the_read_that_told_the_invocation_are_not_its() {
        let mut facts = UnitFacts::default();
        // A read tells invocation b before older signals are handled: they may be of a, or
        // of an invocation between a and b.
        facts.apply_snapshot(&snapshot(10, "active", "b"));
        facts.apply_change(&pids(30, 0), 7);
        facts.apply_change(&change(Some("inactive"), Some("x")), 8);
        facts.apply_change(&pids(31, 0), 9);
        assert_eq!(facts.next_invocation().gone_pids(), Vec::<i32>::new());
        // From the read on, what is said is b's.
        facts.apply_change(&pids(32, 0), 11);
        facts.apply_change(&pids(0, 0), 12);
        assert_eq!(facts.next_invocation().gone_pids(), [32]);
    }
    /// A late signal that names the current invocation, handled after the read that told it:
    /// the MainPID said right before it is the current invocation's, one of its roots.
    #[test]
    fn a_late_signal_naming_the_current_invocation_keeps_the_main_pid_said_before_it() {
        let mut facts = UnitFacts::default();
        facts.apply_snapshot(&snapshot(660, "deactivating", "f"));
        facts.apply_change(&pids(126, 0), 601);
        facts.apply_change(&change(Some("activating"), Some("f")), 602);
        assert_eq!(facts.next_invocation().gone_pids(), [126]);
    }

    /// A late signal, handled after a read that told a later invocation, still places the
    /// MainPID said right before it with the invocation it names, if that was named after
    /// the first read: it is an invocation after the watch's. Before the first read it may be
    /// one before the watch's, and nothing is placed.
    #[test]
    fn a_late_signal_places_its_roots_with_the_invocation_it_names_after_the_first_read() {
        let mut facts = UnitFacts::default();
        facts.apply_snapshot(&snapshot(5, "activating", "x"));
        facts.apply_snapshot(&snapshot(10, "active", "b"));
        facts.apply_change(&pids(30, 0), 7);
        facts.apply_change(&change(Some("active"), Some("x")), 8);
        let (invocation, roots) = facts.take_late_roots().expect("placed");
        assert_eq!(invocation, "x");
        assert_eq!(roots.gone_pids(), [30]);
        assert_eq!(facts.take_late_roots(), None, "taken once");
        // Nor what another signal came between.
        let mut facts = UnitFacts::default();
        facts.apply_snapshot(&snapshot(5, "activating", "x"));
        facts.apply_snapshot(&snapshot(10, "active", "b"));
        facts.apply_change(&pids(31, 0), 6);
        facts.apply_change(&change(Some("active"), None), 7);
        facts.apply_change(&change(Some("active"), Some("x")), 8);
        assert_eq!(facts.take_late_roots(), None);

        let mut facts = UnitFacts::default();
        facts.apply_snapshot(&snapshot(10, "active", "b"));
        facts.apply_change(&pids(30, 0), 7);
        facts.apply_change(&change(Some("active"), Some("a")), 8);
        assert_eq!(facts.take_late_roots(), None, "said before the first read");
    }

    #[test]
    fn what_was_known_of_an_invocation_outlives_a_lost_connection_if_it_is_named_again() {
        let known_roots = |next_connection: &str| {
            let mut facts = UnitFacts::default();
            facts.apply_change(&change(Some("active"), Some("a")), 1);
            facts.apply_change(&pids(0, 20), 2);
            facts.apply_change(&change(Some("deactivating"), Some("a")), 3);
            facts.apply_change(&pids(0, 0), 4);
            facts.clear();
            facts.clear();
            // Serials start afresh on the next connection.
            facts.apply_change(&change(Some("inactive"), Some(next_connection)), 1);
            facts.next_invocation().gone_pids()
        };
        assert_eq!(known_roots("a"), [20]);
        assert_eq!(known_roots("b"), Vec::<i32>::new());
    }

    /// systemd sends a change as the Service interface's signal, then the Unit interface's,
    /// which names the invocation (`send_changed_signal`): a ControlPID heard when the
    /// connection broke between the two is placed with the invocation the facts knew, until a
    /// read names it the ControlPID of the next one, which systemd forked it for (found by the
    /// simulator, 7478359040164440). A MainPID stays: systemd may guess ours as the next's.
    #[test]
    fn a_control_pid_named_for_the_next_invocation_is_no_root_of_ours() {
        let roots_of_a = |main: u32, control: u32| {
            let mut facts = UnitFacts::default();
            facts.apply_change(&change(Some("inactive"), Some("a")), 1);
            facts.apply_change(&pids(main, control), 2);
            facts.clear();
            assert_eq!(
                facts.roots_of("a"),
                [main.max(control) as i32],
                "placed with ours"
            );
            let mut read = snapshot(1, "activating", "b");
            read.current.pids = Some(((main, control), 1));
            facts.apply_snapshot(&read);
            facts.roots_of("a")
        };
        assert_eq!(roots_of_a(0, 36), Vec::<i32>::new());
        assert_eq!(roots_of_a(36, 0), [36]);
    }

    /// The invocations the facts moved on from after an earlier one are told in systemd's
    /// order, with the roots named for each; a read older than the facts (another watch's,
    /// handled late) moves nothing; an invocation the facts never moved on from places nothing,
    /// and neither does one forgotten past [`MAX_EARLIER`].
    #[test]
    fn the_invocations_after_an_earlier_one_are_known_in_order_with_their_roots() {
        let mut facts = UnitFacts::default();
        facts.apply_change(&change(Some("active"), Some("a")), 1);
        facts.apply_change(&change(Some("inactive"), Some("b")), 2);
        facts.apply_change(&pids(157, 0), 3);
        facts.apply_change(&change(Some("active"), Some("c")), 4);
        facts.apply_change(&pids(0, 0), 5);
        facts.apply_change(&change(Some("failed"), Some("c")), 6);
        facts.apply_shared_snapshot(&snapshot(3, "active", "a"));
        facts.apply_change(&change(Some("active"), Some("d")), 7);
        let after_a: Vec<(String, Vec<i32>)> = facts
            .known_after("a")
            .into_iter()
            .map(|(invocation, next)| (invocation, next.gone_pids()))
            .collect();
        assert_eq!(
            after_a,
            [("b".to_owned(), vec![]), ("c".to_owned(), vec![157])]
        );
        assert_eq!(facts.known_after("c"), [], "d is the current one");
        assert_eq!(facts.known_after("d"), []);
        assert_eq!(facts.known_after("x"), []);
        for (serial, invocation) in (8..).zip(["e", "f", "g", "h", "i", "j", "k"]) {
            facts.apply_change(&change(Some("active"), Some(invocation)), serial);
        }
        // Ten moved on from: a and b are forgotten.
        assert_eq!(facts.known_after("b"), []);
        assert_eq!(facts.known_after("c").len(), MAX_EARLIER - 1);
    }
}
