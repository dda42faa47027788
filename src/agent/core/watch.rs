//! One watched unit: what the client asked for, what systemd said, and its proof.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::control_group::ControlGroup;
use super::event::{ProofEvent, WatchView};
use super::facts::UnitFacts;
use super::{NextInvocation, ProcessStart, ReplyTo, StopKind, UnitKey};
use crate::cgroup::CgroupReading;
use crate::cgroup::procs::OnceHeld;
use crate::control::protocol::WatchSpec;
use crate::key_hash::KeyMap;
use crate::memory::shrink_when_sparse;
use crate::proof::release::Release;
use crate::proof::{Phase, Proof, Resumed, UnitProof};
use crate::record_name::RecordName;
use crate::unit_name::UnitName;

/// A watch's options, boxed only when it has any: most watches have none, and inline they are
/// 88 bytes of every watch. Reads as a [`WatchSpec`].
#[derive(Debug, Default)]
pub(super) struct SpecIfAny(Option<Box<WatchSpec>>);

/// What a watch without options reads as.
static NO_SPEC: WatchSpec = WatchSpec {
    run_dir: None,
    record: None,
    generation: None,
    launch_file: None,
};

impl SpecIfAny {
    fn new(spec: WatchSpec) -> SpecIfAny {
        SpecIfAny((spec != NO_SPEC).then(|| Box::new(spec)))
    }
}

impl std::ops::Deref for SpecIfAny {
    type Target = WatchSpec;

    fn deref(&self) -> &WatchSpec {
        self.0.as_deref().unwrap_or(&NO_SPEC)
    }
}

/// The `watch` requests a watch answers once the first reading of its cgroup is in. A thin
/// pointer: a watch has them only until then, and a `Vec` inline is 16 bytes more a watch.
#[derive(Debug, Default)]
pub(super) struct WatchReplies(
    #[expect(
        clippy::box_collection,
        reason = "a thin pointer keeps every watch 16 bytes smaller"
    )]
    Option<Box<Vec<ReplyTo>>>,
);

impl WatchReplies {
    pub(super) fn push(&mut self, reply: ReplyTo) {
        self.0.get_or_insert_default().push(reply);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_none()
    }
}

impl IntoIterator for WatchReplies {
    type Item = ReplyTo;
    type IntoIter = std::vec::IntoIter<ReplyTo>;

    fn into_iter(self) -> Self::IntoIter {
        self.0
            .map(|replies| *replies)
            .unwrap_or_default()
            .into_iter()
    }
}

/// Where the unit's reads stand.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Reads {
    pub in_flight: bool,
    /// Another read was asked for while one was in flight: it runs when that one returns.
    pub again: bool,
    /// The core's fact epoch when the read in flight was sent.
    pub epoch: u32,
    /// How many reads were sent, and the number of the last one answered, counting on past
    /// `u32::MAX` from 0: 32 bits, not 64, keep every watch 16 bytes smaller, and
    /// [`Reads::answered_since`] compares them as D-Bus serials are compared.
    pub sent: u32,
    pub answered: u32,
}

impl Reads {
    /// Whether the last read answered is read `first` or one sent after it: fewer than 2^31
    /// reads of one unit lie between a stop's decision and its sending.
    pub(super) fn answered_since(&self, first: u32) -> bool {
        self.answered.wrapping_sub(first) as i32 >= 0
    }
}

/// The inotify watches of the unit's cgroup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum InotifyWatches {
    /// None asked for yet, or the last attempt failed.
    #[default]
    Absent,
    /// Asked for with the first read: the rest of the first read waits for the answer.
    First,
    /// Asked for again (the cgroup moved, a watch was dropped, events were lost): a read
    /// follows the answer.
    Rebuilding,
    Held,
}

/// A StopUnit decided while the bus was down. It is sent once the bus is back and a fresh
/// read shows the unit still runs `target` (for the final stop of a generation: that the
/// unit runs nothing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct UnsentStop {
    pub kind: StopKind,
    pub target: String,
    /// The first read whose answer may decide it: one sent after the stop was decided, where
    /// what the decision was made from may predate what systemd does now (`None`: any read).
    pub first_read: Option<u32>,
}

/// One watched unit.
pub(super) struct Watch {
    /// The name the client used (a valid [`UnitName`]), and the name it is reported under.
    pub unit: Rc<str>,
    /// systemd's own name for the unit (an alias resolves to it at the first read), which its
    /// signals' object path escapes. Both names are shared with each other and with the
    /// registry's keys: each would otherwise be a copy a watch.
    pub id: Rc<str>,
    /// The invocation the watch was asked for; `None` adopts the current one. Boxed, a thin
    /// pointer: most watches adopt the current one.
    #[expect(
        clippy::box_collection,
        reason = "a thin pointer keeps every watch 8 bytes smaller"
    )]
    pub asked_invocation: Option<Box<String>>,
    /// `None` until the first read of the unit came back.
    pub proof: Option<UnitProof>,
    pub facts: UnitFacts,
    /// Facts seen before a reload or a lost bus: no decision until a fresh read.
    pub stale: bool,
    /// Our invocation's cgroup: the last non-empty ControlGroup read of it (or, while the
    /// watch knows none, of whatever invocation the unit ran). systemd reports it empty once it
    /// removed the cgroup, and another invocation may run in another cgroup (a Slice= change),
    /// where none of ours are.
    pub control_group: ControlGroup,
    /// The last read, if it found no ControlGroup.
    pub no_cgroup_read: Option<NoCgroupRead>,
    pub inotify_watches: InotifyWatches,
    /// A stop asked for before the first read came back.
    pub pending_stop: bool,
    /// What the proof had before the agent restarted: a stop requested stays requested, with
    /// no new StopUnit.
    pub resumed: Resumed,
    /// Boxed, like the other parts most watches never have: they would make every watch larger.
    pub unsent_stop: Option<Box<UnsentStop>>,
    /// `watch` requests answered once the first reading of the cgroup is in.
    pub watch_replies: WatchReplies,
    pub reads: Reads,
    /// The next read after a failed one (or a failed cgroup watch), and its backoff; boxed,
    /// as most watches never have one.
    pub retry: Option<Box<(Instant, Duration)>>,
    /// Taken up from the state file: never dropped because a read failed.
    pub restored: bool,
    pub timer: Option<Instant>,
    /// When the core first learned that our invocation is terminal: the start of the proof's
    /// latency, and of how long remaining processes block it.
    pub terminal_at: Option<Instant>,
    /// Processes in the cgroup that may be ours, each with its start (clock ticks since
    /// boot) and its place when first held, followed until they exit, while a new invocation
    /// runs beside them. Boxed: most watches never have any.
    #[expect(
        clippy::box_collection,
        reason = "a thin pointer keeps every watch 16 bytes smaller"
    )]
    pub leftovers: Option<Box<BTreeMap<i32, ProcessStart>>>,
    /// What systemd said of the invocations after ours, gathered as they came: the facts keep
    /// only the current one's, and the cgroup may hold what an earlier of them left. Boxed:
    /// most watches never see one.
    pub after_ours: Option<Box<AfterOurs>>,
    /// The starts of processes this watch held as leftovers or read as roots, whichever
    /// invocation's they are: a count's [`NextInvocation::once_held`]. Beside `after_ours`, not
    /// in it, as nearly every watch has one (its MainPID's).
    pub once_held: OnceHeld,
    /// A proof waiting for its exit record before it is told.
    pub proof_pending: Option<Box<Proof>>,
    pub event: Option<Box<ProofEvent>>,
    pub spec: SpecIfAny,
    /// A generation's files to release after the proof; `None` for a watch without `gen`
    /// (boxed: most watches have none).
    pub release: Option<Box<Release>>,
}

/// A read of the unit that found no ControlGroup. systemd forgets the path only once the cgroup
/// is empty (`unit_maybe_release_cgroup`), but realizes it again for a control process of the
/// same invocation (ExecStop= of a RemainAfterExit= unit). So "no cgroup" holds for a state
/// said no later than that read, and, if the read named an invocation after ours, for good:
/// systemd never runs ours again, and nothing of ours enters a cgroup after it was let go.
#[derive(Clone, Copy, Debug)]
pub(super) struct NoCgroupRead {
    pub serial: u32,
    pub of_a_later_invocation: bool,
}

/// What systemd said of the invocations after ours.
#[derive(Debug, Default)]
pub(super) struct AfterOurs {
    /// Gathered from invocations known to come after ours; the starts a count needs are the
    /// watch's [`Watch::once_held`], so this one's stay empty.
    pub known: NextInvocation,
    /// Heard before the watch's first read, so not yet known to come after ours: each
    /// invocation other than the current one, the oldest message known to name it, and what
    /// was said of it. The first read decides: one named in a message newer than the read is
    /// ours or later.
    pub unconfirmed: Vec<(String, u32, NextInvocation)>,
    /// Set once a count's census saw a process that may be ours exit (before its stat was
    /// read, or its pidfd opened), until a count sees none: those it saw, counted as held by
    /// the count made again. A count is made only beside a later invocation, so here.
    pub census_raced: Option<Vec<ProcessStart>>,
}

/// What one watch heard of its unit that another watch of it may not have: [`Watch::heard_of`].
#[derive(Debug, Default)]
pub(super) struct Heard {
    /// Every MainPID and ControlPID systemd named for the invocation asked about.
    pub roots_of_ours: Vec<i32>,
    /// Each invocation after it, oldest first, and what tells its processes apart.
    pub after_ours: Vec<(String, NextInvocation)>,
    /// The starts of processes held or named as roots: a pid and its start name a process for
    /// good, whichever invocation's it is.
    pub starts: Vec<ProcessStart>,
}

impl Watch {
    pub(super) fn new(unit: &UnitName, asked_invocation: Option<String>, spec: WatchSpec) -> Watch {
        let unit: Rc<str> = Rc::from(unit.as_str());
        Watch {
            id: Rc::clone(&unit),
            unit,
            asked_invocation: asked_invocation.map(Box::new),
            proof: None,
            facts: UnitFacts::default(),
            stale: false,
            control_group: ControlGroup::default(),
            no_cgroup_read: None,
            inotify_watches: InotifyWatches::Absent,
            pending_stop: false,
            resumed: Resumed::default(),
            unsent_stop: None,
            watch_replies: WatchReplies::default(),
            reads: Reads::default(),
            retry: None,
            restored: false,
            timer: None,
            terminal_at: None,
            leftovers: None,
            after_ours: None,
            once_held: OnceHeld::None,
            proof_pending: None,
            event: None,
            release: spec
                .generation
                .map(|_| Box::new(Release::new(spec.launch_file.is_some()))),
            spec: SpecIfAny::new(spec),
        }
    }

    /// Keeps a process held as a leftover and held no more, with its start: a root systemd
    /// names with its pid, gone, is judged by it (a guess of systemd's, or a pid used again).
    pub(super) fn note_once_held(&mut self, process: ProcessStart) {
        self.once_held.note(process);
    }

    /// Holds `held`, a count's answer, in place of what was held: what drops out (exited, or
    /// found not ours) is kept as once held. One held before keeps its place as first held.
    /// Says whether what is held changed (it is saved).
    pub(super) fn hold_leftovers(&mut self, held: Vec<ProcessStart>) -> bool {
        let before = self.leftovers.take().unwrap_or_default();
        let same =
            |a: &ProcessStart, b: &ProcessStart| a.pid == b.pid && a.start_ticks == b.start_ticks;
        for process in before.values() {
            if !held.iter().any(|h| same(h, process)) {
                self.note_once_held(*process);
            }
        }
        self.leftovers = (!held.is_empty()).then(|| {
            let kept = held.into_iter().map(|process| {
                let first = before.get(&process.pid).filter(|b| same(b, &process));
                let held_as = first.map_or(process.held_as, |b| b.held_as);
                (process.pid, ProcessStart { held_as, ..process })
            });
            Box::new(kept.collect())
        });
        let before = (!before.is_empty()).then_some(&*before);
        self.leftovers.as_deref() != before
    }

    /// Holds again what a count held before the agent restarted, as it saved it.
    pub(super) fn restore_leftovers(&mut self, held: impl Iterator<Item = ProcessStart>) {
        let held: BTreeMap<i32, ProcessStart> = held.map(|p| (p.pid, p)).collect();
        self.leftovers = (!held.is_empty()).then(|| Box::new(held));
    }

    /// Whether the start of the process `pid` is known (a count held it, or its start was read
    /// when systemd named it a root).
    pub(super) fn knows_start_of(&self, pid: i32) -> bool {
        self.once_held.as_slice().iter().any(|p| p.pid == pid)
    }

    /// What is known of the invocations after ours: the current one's, from the facts, and
    /// what was gathered of the others. While the current one is ours (what remains is
    /// counted as soon as ours is over), its roots are taken for a later one's all the same:
    /// systemd says the next invocation's MainPID before its InvocationID
    /// (`send_changed_signal`), and a count that holds less only waits less (the simulator's
    /// 228379457904599, CI's: taken for ours, such a root's session kept the next invocation's
    /// process waiting as ours).
    pub(super) fn later_invocations(&self) -> NextInvocation {
        let mut next = self.facts.next_invocation();
        if let Some(after_ours) = &self.after_ours {
            next.absorb(&after_ours.known);
        }
        for &process in self.once_held.as_slice() {
            next.note_once_held(process);
        }
        next
    }

    /// What this watch heard of the unit that a watch made later for `ours` (an invocation of
    /// the unit) needs and cannot hear itself: the roots systemd named for `ours`, what it said
    /// of the invocations the facts moved on to after it, and the starts of processes it knows.
    pub(super) fn heard_of(&self, ours: &str) -> Heard {
        Heard {
            roots_of_ours: self.facts.roots_of(ours),
            after_ours: self.facts.known_after(ours),
            starts: self.known_starts(),
        }
    }

    /// The starts of the processes this watch held or read as roots.
    pub(super) fn known_starts(&self) -> Vec<ProcessStart> {
        self.once_held.as_slice().to_vec()
    }

    /// Our invocation, once known.
    pub(super) fn our_invocation(&self) -> Option<&str> {
        match (&self.event, &self.proof) {
            (Some(event), _) => Some(&event.invocation),
            (None, Some(proof)) => Some(proof.invocation()),
            (None, None) => self.asked_invocation.as_deref().map(String::as_str),
        }
    }

    /// Why the last reading of the cgroup is no evidence, if it is not.
    pub(super) fn cgroup_error(&self) -> Option<String> {
        match self.proof.as_ref()?.last_reading()? {
            CgroupReading::Unreadable(why) => Some(why.clone()),
            _ => None,
        }
    }

    /// Whether systemd says our invocation runs in the cgroup the watch knows: a state that
    /// holds processes, and the last read reported that cgroup. Not in `active (exited)`,
    /// which prunes the cgroup (`unit_prune_cgroup`). The cgroup then exists, so a reading
    /// that finds none is the agent failing to see it, never the cgroup gone.
    pub(super) fn runs_in_its_cgroup(&self) -> bool {
        let running = matches!(
            self.facts.active_state(),
            Some("active" | "activating" | "deactivating" | "reloading")
        );
        running
            && self.facts.sub_state() != Some("exited")
            && !self.control_group.is_empty()
            && self.no_cgroup_read.is_none()
            && self.facts.invocation().as_deref() == self.our_invocation()
    }

    /// Whether the unit has no cgroup for what its proof decides: the watch knows none, and
    /// the last read, which found none, is no older than the state, or named an invocation
    /// after ours.
    pub(super) fn has_no_cgroup(&self) -> bool {
        self.control_group.is_empty()
            && self.no_cgroup_read.is_some_and(|read| {
                read.of_a_later_invocation || !self.facts.state_said_after(read.serial)
            })
    }

    /// Whether a stop of ours was requested, before or after the first read or a restart.
    pub(super) fn stop_requested(&self) -> bool {
        self.proof.as_ref().is_some_and(UnitProof::stop_requested)
            || self.pending_stop
            || self.resumed.stop_requested
            || self.event.as_ref().is_some_and(|e| e.stop_requested)
    }

    /// The exit record's file name, once our invocation is known.
    pub(super) fn record_name(&self) -> Option<RecordName> {
        self.spec.run_dir.as_ref()?;
        match &self.spec.record {
            Some(name) => Some(name.clone()),
            // An invocation is hex (systemd's, or a request's checked one), so its name is one.
            None => RecordName::for_invocation(self.proof.as_ref()?.invocation()).ok(),
        }
    }

    pub(super) fn phase(&self) -> Phase {
        match (&self.event, &self.proof) {
            (Some(_), _) => Phase::Proven,
            (None, Some(proof)) => proof.phase(),
            (None, None) => Phase::Watching,
        }
    }

    /// Once proven: the invocation systemd runs now, if another than the one proven. A proven
    /// watch still hears the unit's signals (nothing is read for it), so this costs nothing;
    /// after the bus is lost it is unknown until the next signal.
    pub(super) fn now_running(&self) -> Option<String> {
        let proven = &self.event.as_ref()?.invocation;
        let state = self.facts.state()?;
        let runs = !matches!(state.active_state.as_str(), "inactive" | "failed")
            && !self.facts.ended_meanwhile();
        (runs && !state.invocation.is_empty() && state.invocation != *proven)
            .then_some(state.invocation)
    }

    pub(super) fn view(&self) -> WatchView {
        let proof = self.proof.as_ref();
        WatchView {
            unit: self.unit.to_string(),
            invocation: self.our_invocation().map(str::to_owned),
            active_state: self.facts.active_state().map(Into::into),
            sub_state: self.facts.sub_state().map(Into::into),
            populated: match proof.and_then(|p| p.last_reading()) {
                Some(CgroupReading::Populated) => Some(true),
                Some(CgroupReading::Empty) => Some(false),
                _ => None,
            },
            phase: self.phase().into(),
            stop_requested: self.stop_requested(),
            run_dir: self.spec.run_dir.as_ref().map(|p| p.display().to_string()),
            record: self
                .record_name()
                .or_else(|| self.spec.record.clone())
                .map(|name| name.to_string()),
            generation: self.spec.generation,
            launch_file: self
                .spec
                .launch_file
                .as_ref()
                .map(|p| p.display().to_string()),
            proof: self.event.as_deref().cloned(),
            now_running: self.now_running(),
        }
    }
}

/// Every watch, by its key. Each is boxed: a watch is over a kilobyte and the table keeps up to
/// twice as many slots as watches, so inline they cost 2.5 KiB a unit (measured at 1,000).
#[derive(Default)]
pub(super) struct Watches(KeyMap<UnitKey, Box<Watch>>);

impl Watches {
    pub(super) fn insert(&mut self, key: UnitKey, watch: Watch) {
        self.0.insert(key, Box::new(watch));
    }

    pub(super) fn get(&self, key: &UnitKey) -> Option<&Watch> {
        self.0.get(key).map(|watch| &**watch)
    }

    pub(super) fn get_mut(&mut self, key: &UnitKey) -> Option<&mut Watch> {
        self.0.get_mut(key).map(|watch| &mut **watch)
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    pub(super) fn remove(&mut self, key: &UnitKey) -> Option<Box<Watch>> {
        let watch = self.0.remove(key);
        shrink_when_sparse(&mut self.0);
        watch
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&UnitKey, &Watch)> {
        self.0.iter().map(|(key, watch)| (key, &**watch))
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Watch> {
        self.0.values().map(|watch| &**watch)
    }
}
