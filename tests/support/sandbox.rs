//! A throwaway systemd user manager for integration tests, driven through `scripts/sandbox`.
//!
//! A [`Sandbox`] boots on [`Sandbox::start`] and is torn down by `Drop`, also when the test
//! panics. It must never boot systemd in system mode, never kill anything that the script
//! cannot prove is its own, and never be used outside tests: its helpers panic on failure.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Prefix of the cgroup, under the cgroup v2 root, that `scripts/sandbox` makes for each sandbox.
const CGROUP_PREFIX: &str = "exitproof-test-";

/// The environment that makes `systemctl --user` and D-Bus clients inside the namespace find the
/// sandbox's manager, with the sandbox's own HOME; the same as the script's `exec`.
const INNER_ENV: [&str; 11] = [
    "-u",
    "XDG_CONFIG_HOME",
    "-u",
    "XDG_DATA_HOME",
    "-u",
    "XDG_STATE_HOME",
    "-u",
    "XDG_CACHE_HOME",
    "HOME=/run/sandbox-home",
    "XDG_RUNTIME_DIR=/run/user/0",
    "DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/0/bus",
];

/// How often [`Sandbox::wait_until`] polls its condition.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Tells sandboxes of one test process apart; the process id tells test processes apart.
static NEXT_SANDBOX: AtomicUsize = AtomicUsize::new(0);

/// A running systemd user manager in its own mount namespace and cgroup.
pub struct Sandbox {
    name: String,
    pid: u32,
}

impl Sandbox {
    /// Tells whether a sandbox can run on this machine; `Err` carries the reason it cannot.
    pub fn availability() -> Result<(), String> {
        let output = Command::new(script())
            .arg("check")
            .output()
            .map_err(|error| format!("cannot run {}: {error}", script().display()))?;
        if output.status.success() {
            return Ok(());
        }
        let reason = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        if reason.is_empty() {
            Err(format!(
                "{} check failed ({}): {}",
                script().display(),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        } else {
            Err(reason)
        }
    }

    /// Boots a sandbox named after `name` (plus the process id and a counter, so that parallel
    /// tests and test binaries never collide). Panics with the script's report if it fails.
    pub fn start(name: &str) -> Sandbox {
        let unique_name = format!(
            "{name}-{}-{}",
            std::process::id(),
            NEXT_SANDBOX.fetch_add(1, Ordering::Relaxed)
        );
        let output = Command::new(script())
            .args(["start", &unique_name])
            .output()
            .unwrap_or_else(|error| panic!("cannot run {}: {error}", script().display()));
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() {
            panic!(
                "sandbox {unique_name} did not start ({}):\n{stderr}",
                output.status
            );
        }
        let pid = stdout.trim().parse().unwrap_or_else(|error| {
            panic!("sandbox {unique_name} printed no pid ({error}): {stdout:?}\n{stderr}")
        });
        Sandbox {
            name: unique_name,
            pid,
        }
    }

    /// The pid of the sandbox's systemd user manager, as seen from the host.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The sandbox's own cgroup, relative to the cgroup v2 root (e.g. `/exitproof-test-x-1-0`);
    /// every `ControlGroup` its manager reports starts with it.
    pub fn cgroup(&self) -> String {
        format!("/{CGROUP_PREFIX}{}", self.name)
    }

    /// A command that runs `program` inside the sandbox's mount namespace, with the
    /// environment that finds its manager and bus.
    pub fn command(&self, program: &str) -> Command {
        self.command_with_env(program, &[])
    }

    /// A command as [`Sandbox::command`], with `env` (`NAME=value`) set for `program` alone: not
    /// for `nsenter`, which a preloaded library (a profiler's) could break.
    pub fn command_with_env(&self, program: &str, env: &[String]) -> Command {
        let mut command = Command::new("nsenter");
        command
            .args(["-t", &self.pid.to_string(), "-m", "env"])
            .args(INNER_ENV)
            .args(env)
            .arg(program);
        command
    }

    /// Runs `program` with `args` inside the sandbox and returns its output; panics only if it
    /// cannot be spawned.
    pub fn run(&self, program: &str, args: &[&str]) -> Output {
        self.command(program)
            .args(args)
            .output()
            .unwrap_or_else(|error| {
                panic!("cannot run {program} in sandbox {}: {error}", self.name)
            })
    }

    /// Runs `systemctl --user` with `args` inside the sandbox.
    pub fn systemctl(&self, args: &[&str]) -> Output {
        let mut user_args = vec!["--user"];
        user_args.extend_from_slice(args);
        self.run("systemctl", &user_args)
    }

    /// The value of property `prop` of `unit` (`systemctl --user show -p PROP --value`); panics
    /// with systemctl's stderr if it fails.
    pub fn show(&self, unit: &str, prop: &str) -> String {
        let output = self.systemctl(&["show", "-p", prop, "--value", unit]);
        if !output.status.success() {
            panic!(
                "systemctl --user show -p {prop} {unit} failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        String::from_utf8_lossy(&output.stdout)
            .trim_end()
            .to_owned()
    }

    /// The host path of `inner`, a path inside the sandbox's mount namespace.
    pub fn host_path(&self, inner: &str) -> PathBuf {
        Path::new(&format!("/proc/{}/root", self.pid)).join(inner.trim_start_matches('/'))
    }

    /// The host directory of `control_group`, a cgroup path as the manager reports it
    /// (`ControlGroup`): the host's cgroup v2 mount joined with it. Panics if the host has no
    /// cgroup v2 mount, which a running sandbox rules out.
    pub fn host_cgroup_dir(&self, control_group: &str) -> PathBuf {
        let mount = host_cgroup2_mount()
            .unwrap_or_else(|error| panic!("sandbox {} has no host cgroup2: {error}", self.name));
        mount.join(control_group.trim_start_matches('/'))
    }

    /// The directory of `unit`'s cgroup, as the test (outside the sandbox) reaches it.
    pub fn unit_cgroup_dir(&self, unit: &str) -> PathBuf {
        self.host_cgroup_dir(&self.show(unit, "ControlGroup"))
    }

    /// Writes a unit file the manager loads (in its runtime unit directory) and reloads it.
    pub fn install_unit(&self, name: &str, body: &str) {
        let dir = self.unit_dir();
        std::fs::write(dir.join(name), body).expect("write the unit file");
        self.systemctl_ok(&["daemon-reload"]);
    }

    /// Makes `alias` an alias of the installed unit `target` (a symlink beside it in the
    /// runtime unit directory, as `systemctl enable` makes for `Alias=`) and reloads.
    pub fn install_alias(&self, alias: &str, target: &str) {
        let dir = self.unit_dir();
        std::os::unix::fs::symlink(target, dir.join(alias)).expect("link the alias");
        self.systemctl_ok(&["daemon-reload"]);
    }

    /// Takes the alias `alias` away (its symlink) and reloads: systemd no longer resolves it.
    pub fn remove_alias(&self, alias: &str) {
        std::fs::remove_file(self.unit_dir().join(alias)).expect("unlink the alias");
        self.systemctl_ok(&["daemon-reload"]);
    }

    /// The manager's runtime unit directory, as the host reaches it; created if missing.
    fn unit_dir(&self) -> PathBuf {
        let dir = self.host_path("/run/user/0/systemd/user");
        std::fs::create_dir_all(&dir).expect("create the user unit directory");
        dir
    }

    /// The pids in `control_group` itself (its `cgroup.procs`, not its descendants'), where
    /// `control_group` is a cgroup path as the manager reports it; none if it is gone.
    pub fn cgroup_pids(&self, control_group: &str) -> Vec<i32> {
        let procs = self.host_cgroup_dir(control_group).join("cgroup.procs");
        std::fs::read_to_string(procs)
            .unwrap_or_default()
            .split_whitespace()
            .map(|pid| pid.parse().expect("a pid in cgroup.procs"))
            .collect()
    }

    /// Runs `systemctl --user ARGS` and panics with its stderr unless it succeeds.
    pub fn systemctl_ok(&self, args: &[&str]) {
        let out = self.systemctl(args);
        assert!(
            out.status.success(),
            "systemctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Polls `condition` every 20 ms until it holds; panics naming `what` after `timeout`.
    pub fn wait_until(&self, what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
        let start = Instant::now();
        while !condition() {
            if start.elapsed() > timeout {
                panic!(
                    "sandbox {}: timed out after {timeout:?} waiting until {what}",
                    self.name
                );
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }
}

impl Drop for Sandbox {
    /// Tears the sandbox down; reports failure loudly but never panics, since a panic while
    /// unwinding from a failed test would abort the whole test binary.
    fn drop(&mut self) {
        let result = Command::new(script())
            .args(["stop", &self.pid.to_string(), &self.name])
            .output();
        match result {
            Ok(output) if output.status.success() => {}
            Ok(output) => eprintln!(
                "SANDBOX LEAK: stop of sandbox {} (pid {}) failed ({}): {}",
                self.name,
                self.pid,
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
            Err(error) => eprintln!(
                "SANDBOX LEAK: cannot run {} to stop sandbox {}: {error}",
                script().display(),
                self.name
            ),
        }
    }
}

/// The path of `scripts/sandbox` in this repository.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/sandbox")
}

/// The host's cgroup v2 mount point, read from `/proc/self/mountinfo`.
fn host_cgroup2_mount() -> Result<PathBuf, String> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|error| format!("cannot read /proc/self/mountinfo: {error}"))?;
    mountinfo
        .lines()
        .find_map(|line| {
            // Fields before " - " are the mount's own; the first one after it is the fs type.
            let (mount_fields, source_fields) = line.split_once(" - ")?;
            if source_fields.split(' ').next()? != "cgroup2" {
                return None;
            }
            mount_fields.split(' ').nth(4).map(unescape_mountinfo)
        })
        .ok_or_else(|| "no cgroup2 mount in /proc/self/mountinfo".to_owned())
}

/// Undoes the kernel's octal escapes of space, tab, newline and backslash in a mountinfo path.
fn unescape_mountinfo(field: &str) -> PathBuf {
    // Backslash last, so that an escaped backslash never forms a new escape.
    let unescaped = field
        .replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\");
    PathBuf::from(unescaped)
}

/// Kills every process of the cgroup `dir` and below, without going through systemd or the bus.
pub fn cgroup_kill(dir: &Path) {
    std::fs::write(dir.join("cgroup.kill"), "1").expect("write cgroup.kill");
}
