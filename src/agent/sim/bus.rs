//! The D-Bus between systemd and the agent: systemd's serial counter, the agent's
//! subscription, calls in flight and their replies, and the ways the bus fails.
//!
//! Every message systemd sends takes the next serial of its connection, signals and replies
//! alike, so serials only grow on one connection (and restart on a new one: a reexec or a bus
//! restart). Signals reach the agent in order among themselves, and replies in order among
//! themselves; the harness may interleave the two queues in any way, as zbus may.

use std::collections::{BTreeSet, VecDeque};

use super::kernel::Inv;
use crate::systemd::signal::SystemdSignal;
use crate::systemd::snapshot::{self, Attempt, properties_asked};

/// What systemd answered a read with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Snapshot {
    pub serial: u32,
    pub loaded: bool,
    /// The unit's own name (an alias resolves to it).
    pub id: String,
    pub active_state: String,
    pub sub_state: String,
    pub invocation: String,
    pub control_group: String,
    pub result: String,
    pub exec_main_code: i32,
    pub exec_main_status: i32,
    pub inactive_enter_us: u64,
    pub inactive_exit_us: u64,
    /// MainPID and ControlPID (0: none).
    pub main_pid: u32,
    pub control_pid: u32,
    /// For the oracle, not on the wire: the invocation had already ended in the world.
    pub ended: bool,
    /// For the oracle, not on the wire: no loaded unit by the name, an alias systemd no
    /// longer resolves.
    pub unresolved: bool,
}

/// One message on the agent's signal path, in the order the agent sees it.
#[derive(Clone, Debug)]
pub(crate) enum Msg {
    /// A signal with its serial, and (for the oracle, not on the wire) the invocation it shows
    /// over: named while it had already ended in the world (0: none).
    Signal(u32, SystemdSignal, u128),
    /// NameOwnerChanged: systemd left the bus (reexec); the connection's facts are stale.
    SystemdLeft,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CallKind {
    Read(ReadKind),
    Stop,
}

/// How a read asks systemd, as the driver does (`systemd::read::read_unit`). Each of its
/// messages is answered at its own moment, and other calls may be answered in between.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReadKind {
    /// It begins with GetUnit (a first attempt; another asks at the path that one gave).
    pub get_unit: bool,
    /// InvocationID, each property, InvocationID again; else GetAll of the Unit interface,
    /// then of the Service interface.
    pub by_property: bool,
    /// When GetUnit finds no loaded unit, GetUnitByInvocationID of this (the watch's own):
    /// the rest is read at the path of the unit running it, if any.
    pub by_invocation: Option<Inv>,
}

impl ReadKind {
    /// How the driver asks in `attempt`: only the first begins with GetUnit.
    pub(crate) fn of(attempt: Attempt) -> ReadKind {
        ReadKind {
            get_unit: attempt == Attempt::FIRST,
            by_property: attempt.by_property(),
            by_invocation: None,
        }
    }

    /// How many answers make a read of `unit`: a service's properties, or another unit
    /// type's ControlGroup (`properties_asked`).
    pub(crate) fn parts(self, unit: &str) -> usize {
        let properties = if self.by_property {
            2 + properties_asked(unit, snapshot::ReadKind::Get).len()
        } else {
            2
        };
        usize::from(self.get_unit) + properties
    }
}

impl Call {
    /// Whether GetUnit found no loaded unit and the read goes on with GetUnitByInvocationID:
    /// one answer more.
    pub(crate) fn asked_by_invocation(&self) -> bool {
        matches!(self.kind, CallKind::Read(kind) if kind.get_unit && kind.by_invocation.is_some())
            && self.parts.first().is_some_and(|first| !first.loaded)
    }

    /// How many answers make this call's read.
    pub(crate) fn parts_needed(&self, kind: ReadKind) -> usize {
        kind.parts(&self.unit) + usize::from(self.asked_by_invocation())
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Call {
    pub id: u64,
    pub epoch: u64,
    pub unit: String,
    pub kind: CallKind,
    /// A read's answers so far, one per message, each taken when systemd answered it.
    pub parts: Vec<Snapshot>,
}

#[derive(Clone, Debug)]
pub(crate) enum Answer {
    Read(Result<Vec<Snapshot>, String>),
    /// `Err` carries the D-Bus error name (NoSuchUnit is one).
    Stop(Result<(), String>),
}

#[derive(Clone, Debug)]
pub(crate) struct Reply {
    pub id: u64,
    pub answer: Answer,
}

pub(crate) const NO_SUCH_UNIT: &str = "org.freedesktop.systemd1.NoSuchUnit";
/// The bus daemon's answer to a call for a unique name nobody owns any more.
const SERVICE_UNKNOWN: &str = "org.freedesktop.DBus.Error.ServiceUnknown";

#[derive(Debug)]
pub(crate) struct Bus {
    /// The bus daemon runs.
    pub daemon_up: bool,
    /// systemd is connected to it (not in the middle of a reexec).
    pub systemd_on: bool,
    serial: u32,
    /// The agent's connection (an epoch number), once it has subscribed.
    pub agent: Option<u64>,
    /// systemd left the agent's connection (reexec): its match rules name the old sender,
    /// so nothing from the new systemd reaches it until it subscribes again.
    stale: bool,
    next_epoch: u64,
    next_call: u64,
    pub signals: VecDeque<Msg>,
    pub calls: VecDeque<Call>,
    pub replies: VecDeque<Reply>,
    /// Calls the agent gave up on (timed out): systemd may still carry them out.
    abandoned: BTreeSet<u64>,
    /// Percent of signals lost on the way to a live connection (the world draws).
    pub lose_percent: u32,
    /// Percent of calls systemd answers with an error other than NoSuchUnit.
    pub error_percent: u32,
    /// Signals lost so far.
    pub lost: u32,
    /// A first connection's serials start here (a systemd that has sent billions).
    first_serial: u32,
}

impl Bus {
    /// How many reads of the agent's connection systemd has not answered yet.
    pub(crate) fn reads_in_flight(&self) -> usize {
        self.calls
            .iter()
            .filter(|call| matches!(call.kind, CallKind::Read(_)) && Some(call.epoch) == self.agent)
            .count()
    }

    /// No signal is lost and no call answered with an error from now on.
    pub(crate) fn stop_faults(&mut self) {
        self.lose_percent = 0;
        self.error_percent = 0;
    }

    pub(crate) fn new() -> Bus {
        Bus {
            daemon_up: true,
            systemd_on: true,
            serial: 1,
            agent: None,
            stale: false,
            next_epoch: 0,
            next_call: 0,
            signals: VecDeque::new(),
            calls: VecDeque::new(),
            replies: VecDeque::new(),
            abandoned: BTreeSet::new(),
            lose_percent: 0,
            error_percent: 0,
            lost: 0,
            first_serial: 1,
        }
    }

    /// systemd's connection has sent nearly 2^32 messages: serials start close to u32::MAX
    /// (with room for the run: sd-bus refuses to send past it, `sd_bus_message_seal`).
    pub(crate) fn start_serials_near_max(&mut self, rng: &mut super::rng::Rng) {
        self.first_serial = u32::MAX - 200_000 + rng.below(100_000) as u32;
        self.serial = self.first_serial;
    }

    /// systemd emits a signal that a live connection silently loses (a full queue on the
    /// way, say): its serial is spent, the agent never hears of it.
    pub(crate) fn emit_lost(&mut self, gap: u32) {
        if !self.systemd_on {
            return;
        }
        self.next_serial(gap);
        if self.agent.is_some() && !self.stale {
            self.lost += 1;
        }
    }

    /// The next serial of systemd's connection; `gap` stands for messages to other clients.
    pub(crate) fn next_serial(&mut self, gap: u32) -> u32 {
        self.serial = self.serial.wrapping_add(1 + gap);
        self.serial
    }

    /// systemd emits a signal; only a subscribed agent receives it.
    pub(crate) fn emit(&mut self, signal: SystemdSignal, gap: u32, over: u128) {
        if !self.systemd_on {
            return;
        }
        let serial = self.next_serial(gap);
        if self.agent.is_some() && !self.stale {
            self.signals.push_back(Msg::Signal(serial, signal, over));
        }
    }

    /// The agent connects and subscribes; `None` while the bus or systemd is away.
    pub(crate) fn connect(&mut self) -> Option<u64> {
        if !self.daemon_up || !self.systemd_on {
            return None;
        }
        self.next_epoch += 1;
        self.agent = Some(self.next_epoch);
        self.stale = false;
        Some(self.next_epoch)
    }

    /// The agent's connection is gone: nothing queued for it arrives. Calls already on their
    /// way to systemd stay; systemd carries them out and its replies go nowhere.
    pub(crate) fn disconnect_agent(&mut self) {
        self.agent = None;
        self.signals.clear();
        self.replies.clear();
    }

    /// The agent sends a call; `None` (fails at once) without a connection.
    ///
    /// The agent addresses its calls to the unique name it subscribed to: once that systemd
    /// has left (a reexec), the bus daemon answers at once that nobody owns the name, and the
    /// systemd that came back never sees the call.
    pub(crate) fn send(&mut self, unit: &str, kind: CallKind) -> Option<u64> {
        let epoch = self.agent?;
        self.next_call += 1;
        let call = Call {
            id: self.next_call,
            epoch,
            unit: unit.to_owned(),
            kind,
            parts: Vec::new(),
        };
        if self.stale {
            let error = SERVICE_UNKNOWN.to_owned();
            let answer = match kind {
                CallKind::Read(_) => Answer::Read(Err(error)),
                CallKind::Stop => Answer::Stop(Err(error)),
            };
            self.reply(&call, answer);
        } else {
            self.calls.push_back(call);
        }
        Some(self.next_call)
    }

    /// Whether a reply to `call` would still reach the agent.
    pub(crate) fn wanted(&self, call: &Call) -> bool {
        self.agent == Some(call.epoch) && !self.abandoned.contains(&call.id)
    }

    pub(crate) fn reply(&mut self, call: &Call, answer: Answer) {
        if self.wanted(call) {
            self.replies.push_back(Reply {
                id: call.id,
                answer,
            });
        }
    }

    /// The agent gives up on a call (its timeout): a reply that comes later is dropped.
    pub(crate) fn abandon(&mut self, id: u64) {
        self.abandoned.insert(id);
        self.replies.retain(|r| r.id != id);
    }

    /// The bus daemon goes away: everyone's connection with it, and what was in it, is lost.
    pub(crate) fn daemon_down(&mut self) {
        self.daemon_up = false;
        self.systemd_on = false;
        self.calls.clear();
        self.disconnect_agent();
    }

    /// The bus daemon is back, and systemd on it with a new connection (serials restart).
    pub(crate) fn daemon_back(&mut self) {
        self.daemon_up = true;
        self.systemd_back();
    }

    /// systemd leaves the bus to re-execute: calls it did not read get no answer.
    pub(crate) fn systemd_leaves(&mut self) {
        if self.agent.is_some() {
            self.signals.push_back(Msg::SystemdLeft);
            self.stale = true;
        }
        self.systemd_on = false;
        self.calls.clear();
    }

    pub(crate) fn systemd_back(&mut self) {
        if self.daemon_up {
            self.systemd_on = true;
            self.serial = 1;
        }
    }

    /// Every call still outstanding for the agent: not yet answered, not given up on.
    pub(crate) fn outstanding(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self
            .calls
            .iter()
            .filter(|c| self.wanted(c))
            .map(|c| c.id)
            .chain(self.replies.iter().map(|r| r.id))
            .collect();
        ids.sort_unstable();
        ids
    }
}
