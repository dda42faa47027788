//! Smoke tests of the sandbox itself: its manager runs units in real cgroups, it is torn down
//! even when a test panics, and its shell (the README's demo) leaves the caller's home alone.
//!
//! Each test starts its own sandbox; none may leave a process or cgroup behind.

use std::io::Write;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::Test;
use crate::support::Sandbox;
use crate::support::agent::binary_in_sandbox;
use crate::support::sandbox::script;

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
    (
        "the_sandbox_shell_and_its_agent_write_nothing_into_the_callers_home",
        the_sandbox_shell_and_its_agent_write_nothing_into_the_callers_home,
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

/// The README's demo, typed into `scripts/sandbox shell` by a caller whose HOME is a fresh
/// directory: the shell starts in the caller's directory, the agent runs with `--user` and its
/// default state directory (under `$XDG_STATE_HOME`, else `~/.local/state`), and on `exit`
/// nothing is left in that HOME (bash writes `~/.bash_history` there on exit).
fn the_sandbox_shell_and_its_agent_write_nothing_into_the_callers_home() {
    // Not under /tmp or /run, which the sandbox mounts its own: the HOME must be visible inside
    // for the test to catch a write to it.
    let home = tempfile::Builder::new()
        .prefix("exitproof-home-")
        .tempdir_in("/var/tmp")
        .expect("a temporary HOME");
    let workdir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let binary = binary_in_sandbox();
    let typed = format!(
        "pwd\n\
         systemd-run --user --unit=exitproof --service-type=notify {binary} agent --user\n\
         {binary} --user version\n\
         exit\n"
    );
    let name = format!("home-{}", std::process::id());
    let mut shell = Command::new(script())
        .args(["shell", &name])
        .current_dir(workdir)
        .env("HOME", home.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn scripts/sandbox shell");
    // Dropping stdin after the commands is an end of input: the shell exits, and the script
    // tears the sandbox down.
    shell
        .stdin
        .take()
        .expect("the shell's stdin")
        .write_all(typed.as_bytes())
        .expect("type into the shell");
    let output = shell.wait_with_output().expect("the shell's output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{}: {stdout}\n{stderr}",
        output.status
    );

    let mut lines = stdout.lines();
    // Where the checkout is under /tmp the shell cannot start there, and says so.
    if !workdir.starts_with("/tmp") && !workdir.starts_with("/run") {
        assert_eq!(
            lines.next().map(Path::new),
            Some(workdir),
            "the shell did not start in the caller's directory: {stdout}\n{stderr}"
        );
    }
    assert!(
        stdout.contains(&format!("agent {}", env!("CARGO_PKG_VERSION"))),
        "the agent did not answer `version`: {stdout}\n{stderr}"
    );
    let left: Vec<_> = std::fs::read_dir(home.path())
        .expect("read the HOME")
        .map(|entry| entry.expect("an entry").path())
        .collect();
    assert!(left.is_empty(), "written into the caller's HOME: {left:?}");
}
