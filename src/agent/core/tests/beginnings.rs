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
