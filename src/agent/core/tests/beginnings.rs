//! When systemd says the next invocation began: what a count of leftovers tells apart.

use super::*;
use crate::agent::core::facts::UnitFacts;

/// systemd says InactiveExitTimestamp 0 of a unit that never left `inactive`: no beginning.
/// Taken as one, every process would have begun after it, and none would count as ours.
#[test]
fn an_inactive_exit_timestamp_of_zero_is_no_beginning() {
    let mut facts = UnitFacts::default();
    let started = UnitChange {
        active_state: Some("activating".into()),
        invocation: Some(B.into()),
        inactive_exit_us: Some(0),
        ..UnitChange::default()
    };
    facts.apply_change(&started, 1);
    assert_eq!(facts.next_invocation().began_us, None);
}

/// `systemctl clean` leaves `inactive` under the ended invocation and systemd stamps
/// InactiveExitTimestamp again (`unit_notify`): that is no beginning of the invocation. Taken
/// as one, what its roots forked before the clean would have started before it "began", and
/// would wait as ours (found by the simulator).
#[test]
fn an_invocation_began_when_first_said_not_when_a_clean_stamped_it_again() {
    let mut facts = UnitFacts::default();
    let said = |active: &str, began: Option<u64>, control: u32| UnitChange {
        active_state: Some(active.into()),
        invocation: Some(B.into()),
        inactive_exit_us: began,
        main_pid: Some(0),
        control_pid: Some(control),
        ..UnitChange::default()
    };
    facts.apply_change(&said("activating", Some(5_000), 20), 1);
    facts.apply_change(&said("inactive", None, 0), 2);
    facts.apply_change(&said("maintenance", Some(9_000), 30), 3);
    facts.apply_change(&said("inactive", None, 0), 4);
    let next = facts.next_invocation();
    assert_eq!(next.began_us, Some(5_000));
    assert_eq!(
        next.gone_roots,
        [20, 30].map(|pid| GoneRoot {
            pid,
            began_us: Some(5_000)
        })
    );
}
