//! Smoke tests of the sandbox itself: its manager runs units in real cgroups, and it is torn
//! down even when a test panics.
//!
//! Each test starts its own sandbox; none may leave a process or cgroup behind.

use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::time::Duration;

use crate::Test;
use crate::support::Sandbox;

/// Generous: these wait on real systemd and kernel events, never on a speed.
const TIMEOUT: Duration = Duration::from_secs(20);

pub const TESTS: &[Test] = &[
    (
        "a_transient_unit_runs_and_its_cgroup_is_reported",
        a_transient_unit_runs_and_its_cgroup_is_reported,
    ),
    (
        "a_panicking_test_still_tears_its_sandbox_down",
        a_panicking_test_still_tears_its_sandbox_down,
    ),
];

/// Whether `cgroup.events` in `dir` says `populated 1`; `None` if it cannot be read (e.g. the
/// cgroup is gone).
fn populated(dir: &Path) -> Option<bool> {
    let events = std::fs::read_to_string(dir.join("cgroup.events")).ok()?;
    events
        .lines()
        .find_map(|line| line.strip_prefix("populated "))
        .map(|value| value == "1")
}

fn a_transient_unit_runs_and_its_cgroup_is_reported() {
    let sandbox = Sandbox::start("smoke");
    let output = sandbox.run("systemd-run", &["--user", "--unit=smoke", "sleep", "100"]);
    assert!(
        output.status.success(),
        "systemd-run failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );

    assert_eq!(sandbox.show("smoke.service", "ActiveState"), "active");
    let control_group = sandbox.show("smoke.service", "ControlGroup");
    assert!(
        control_group.starts_with(&format!("{}/", sandbox.cgroup())),
        "ControlGroup {control_group:?} is not under the sandbox's cgroup {}",
        sandbox.cgroup()
    );
    let host_dir = sandbox.host_cgroup_dir(&control_group);
    assert_eq!(populated(&host_dir), Some(true), "{}", host_dir.display());
    // Inside the namespace, the same cgroup is under /sys/fs/cgroup.
    let inner_dir = sandbox.host_path(&format!("/sys/fs/cgroup{control_group}"));
    assert_eq!(populated(&inner_dir), Some(true), "{}", inner_dir.display());

    let output = sandbox.systemctl(&["kill", "-s", "KILL", "smoke.service"]);
    assert!(
        output.status.success(),
        "systemctl kill failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Killed by a signal, the unit ends up failed, or inactive once garbage-collected.
    sandbox.wait_until("smoke.service is no longer active", TIMEOUT, || {
        matches!(
            sandbox.show("smoke.service", "ActiveState").as_str(),
            "inactive" | "failed"
        )
    });
    sandbox.wait_until(
        "the cgroup of smoke.service is empty or gone",
        TIMEOUT,
        || populated(&host_dir) != Some(true),
    );
}

fn a_panicking_test_still_tears_its_sandbox_down() {
    let mut started = None;
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let sandbox = Sandbox::start("panics");
        started = Some((sandbox.pid(), sandbox.host_cgroup_dir(&sandbox.cgroup())));
        // Unwinds like a failing assertion, without the panic hook's noise in the test log.
        std::panic::resume_unwind(Box::new("deliberate panic"));
    }));
    assert!(outcome.is_err(), "the inner test did not panic");
    let Some((pid, cgroup_dir)) = started else {
        panic!("the sandbox did not start");
    };
    assert!(
        !cgroup_dir.exists(),
        "{} is left behind",
        cgroup_dir.display()
    );
    // A gone manager may linger briefly as a zombie until its parent (pid 1) reaps it, and its
    // pid may be reused: only a live systemd with that pid counts.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let running = stat
        .split_once(" (systemd) ")
        .is_some_and(|(_, rest)| !rest.starts_with('Z'));
    assert!(!running, "manager {pid} still runs: {stat}");
}
