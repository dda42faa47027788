//! `status`: one watch as it stands, with the facts behind it and, when systemd says our
//! invocation is over but its cgroup still holds processes, since when that blocks the proof.
//! The processes themselves are listed by the driver ([`RemainingProcess`]).

use std::time::Instant;

use super::{Answer, Core, ReplyTo, UnitKey};
use crate::control::protocol::ErrorKind;
use crate::control::wire::UnitStatus;
use crate::unit_name::UnitName;

/// The `still-running` message of a `wait` or `stop` past its deadline: what systemd says of
/// the unit and, when systemd calls it over, how many processes its cgroup still holds, rather
/// than "still running" of a unit systemd calls dead. Pure: the driver has listed the
/// processes.
pub(crate) fn still_running_message(status: &UnitStatus) -> String {
    let view = &status.watch;
    let state = match (&view.active_state, &view.sub_state) {
        (Some(active), Some(sub)) => format!("systemd says {active}/{sub}"),
        (Some(active), None) => format!("systemd says {active}"),
        _ => "systemd has not said how it stands".to_owned(),
    };
    let unit = &view.unit;
    if !status.blocked {
        return format!(
            "{unit} still running: not proven before the timeout ({state}); it stays watched"
        );
    }
    let remain = match status.remaining_total {
        Some(1) => "1 process remains in its cgroup".to_owned(),
        Some(n) => format!("{n} processes remain in its cgroup"),
        None => "its cgroup still holds processes".to_owned(),
    };
    format!(
        "{unit} not proven before the timeout: {state}, but {remain} (`exitproof status \
         {unit}` lists them); it stays watched"
    )
}

/// At most this many remaining processes are listed; `remaining_total` counts them all.
pub(crate) const MAX_REMAINING: usize = 32;

impl Core {
    pub(super) fn cmd_status(&mut self, reply: ReplyTo, unit: &UnitName, now: Instant) {
        let Some(key) = self.by_name.key(unit.as_str(), &self.units) else {
            let message = format!("{unit} is not watched");
            self.reply(reply, Answer::Error(ErrorKind::NotWatched, message));
            return;
        };
        if let Some(status) = self.unit_status(key, now) {
            self.reply(reply, Answer::Status(Box::new(status)));
        }
    }

    /// The status of the watch under `key`, as `status` answers it and as a `wait` past its
    /// deadline tells what blocks the proof.
    pub(super) fn unit_status(&self, key: UnitKey, now: Instant) -> Option<UnitStatus> {
        let watch = self.units.get(&key)?;
        let unproven = watch.event.is_none();
        let terminal_at = watch.terminal_at.filter(|_| unproven);
        let status = UnitStatus {
            watch: watch.view(),
            cgroup: (!watch.control_group.is_empty()).then(|| watch.control_group.to_string()),
            cgroup_error: unproven.then(|| watch.cgroup_error()).flatten(),
            blocked: unproven && watch.blocked(),
            terminal_since_mono_ns: terminal_at.map(|at| self.mono_ns(at)),
            terminal_for_ms: terminal_at.map(|at| {
                u64::try_from(now.saturating_duration_since(at).as_millis()).unwrap_or(u64::MAX)
            }),
            leftovers: watch
                .leftovers
                .as_deref()
                .into_iter()
                .flat_map(|leftovers| leftovers.keys())
                .copied()
                .collect(),
            remaining: None,
            remaining_total: None,
            remaining_error: None,
            systemd_error: None,
        };
        Some(status)
    }

    /// CLOCK_MONOTONIC nanoseconds at `at`, from the clock anchor the driver gave.
    pub(super) fn mono_ns(&self, at: Instant) -> u64 {
        let (anchor, anchor_ns) = self.config.clock_anchor;
        let since_anchor = at.saturating_duration_since(anchor).as_nanos();
        anchor_ns.saturating_add(u64::try_from(since_anchor).unwrap_or(u64::MAX))
    }
}
