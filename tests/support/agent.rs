//! The exitproof agent, run inside a sandbox for a test, and the CLI pointed at it.
//!
//! The agent runs in the sandbox's mount namespace (it needs the sandbox's session bus and
//! cgroup v2 mount); the test reaches its socket from outside through `/proc/PID/root`. Drop
//! stops the agent by pid (TERM, then KILL) and, if the test is failing, prints its log.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::Sandbox;

/// Where the agent's socket is inside the sandbox.
pub const SOCKET: &str = "/run/exitproof-test.sock";
/// Where the agent keeps its watch set inside the sandbox (a tmpfs that goes with it).
pub const STATE_DIR: &str = "/run/exitproof-state";
/// Generous: the agent starts in milliseconds, but CI machines are loaded.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running agent.
pub struct Agent {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

/// The agent binary under test.
pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_exitproof")
}

/// The agent binary under test, as a process inside a sandbox reaches it. The sandbox mounts its
/// own /tmp, where a checkout (and so the binary) may live; the test process's root, seen through
/// /proc from inside, still shows the host's files.
pub fn binary_in_sandbox() -> String {
    format!("/proc/{}/root{}", std::process::id(), binary())
}

/// The arguments that run the agent on the sandbox's session bus, with its socket at `socket`
/// and its state in `state_dir` (paths inside the sandbox).
pub fn agent_args<'a>(socket: &'a str, state_dir: &'a str) -> [&'a str; 6] {
    [
        "agent",
        "--user",
        "--socket",
        socket,
        "--state-dir",
        state_dir,
    ]
}

impl Agent {
    /// Starts the agent inside `sandbox` on its session bus and waits until it answers.
    pub fn start(sandbox: &Sandbox) -> Agent {
        Agent::start_with(sandbox, &[])
    }

    /// Starts the agent with `extra` arguments after the usual ones.
    pub fn start_with(sandbox: &Sandbox, extra: &[&str]) -> Agent {
        Agent::start_at(sandbox, SOCKET, STATE_DIR, extra)
    }

    /// Starts the agent with its socket at `socket` and its state in `state_dir` (paths inside
    /// the sandbox), with `extra` arguments after the usual ones.
    pub fn start_at(sandbox: &Sandbox, socket: &str, state_dir: &str, extra: &[&str]) -> Agent {
        Agent::start_with_env(sandbox, socket, state_dir, extra, &[])
    }

    /// As [`Agent::start_at`], with `env` variables (`NAME=value`) for the agent alone.
    pub fn start_with_env(
        sandbox: &Sandbox,
        socket: &str,
        state_dir: &str,
        extra: &[&str],
        env: &[String],
    ) -> Agent {
        let mut command = sandbox.command_with_env(&binary_in_sandbox(), env);
        command.args(agent_args(socket, state_dir)).args(extra);
        Agent::spawn(sandbox, command, socket)
    }

    /// Runs `command`, an agent inside `sandbox` that listens on `socket` (a path inside it),
    /// with its log kept, and waits until it answers.
    pub fn spawn(sandbox: &Sandbox, command: Command, socket: &str) -> Agent {
        match Agent::try_spawn(sandbox, command, socket) {
            Ok(agent) => agent,
            Err((status, log)) => panic!("the agent exited at start ({status}); its log:\n{log}"),
        }
    }

    /// As [`Agent::spawn`], but an agent that exits before it answers is no failure: its exit
    /// status and its log (stderr) are returned instead.
    pub fn try_spawn(
        sandbox: &Sandbox,
        mut command: Command,
        socket: &str,
    ) -> Result<Agent, (std::process::ExitStatus, String)> {
        static STARTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = sandbox.host_path(&format!(
            "/run/exitproof-agent-{}-{n}.log",
            std::process::id()
        ));
        let log_file = File::create(&log).expect("create the agent's log file");
        let child = command
            .env("RUST_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .expect("spawn the agent");
        let mut agent = Agent {
            child,
            socket: sandbox.host_path(socket),
            log,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        while UnixStream::connect(&agent.socket).is_err() {
            if let Ok(Some(status)) = agent.child.try_wait() {
                return Err((status, agent.log_text()));
            }
            assert!(
                Instant::now() < deadline,
                "the agent did not listen within {START_TIMEOUT:?}; its log:\n{}",
                agent.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(agent)
    }

    /// The socket, as the test (outside the sandbox) reaches it.
    pub fn socket(&self) -> &PathBuf {
        &self.socket
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the agent with SIGKILL, as a crash would, and waits for it.
    pub fn kill_hard(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the agent to exit on its own and returns how it exited.
    pub fn wait(&mut self) -> std::process::ExitStatus {
        self.child.wait().expect("wait for the agent")
    }

    /// Whether the agent process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Runs the CLI against this agent with `args` and returns what it did.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(binary())
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run the exitproof CLI")
    }

    /// Runs the CLI with `--json`, requires exit code `code`, and returns its stdout parsed as
    /// JSON lines.
    pub fn cli_json(&self, args: &[&str], code: i32) -> Vec<Value> {
        let output = self.cli(&[&["--json"], args].concat());
        assert_eq!(
            output.status.code(),
            Some(code),
            "exitproof {args:?}: stdout {} stderr {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    /// A raw connection to the control socket, for protocol-level tests.
    pub fn connect(&self) -> Connection {
        let stream = UnixStream::connect(&self.socket).expect("connect to the agent");
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .expect("set a read timeout");
        Connection {
            reader: BufReader::new(stream.try_clone().expect("clone the stream")),
            writer: stream,
        }
    }

    /// The agent's `list`, one value per watched unit.
    pub fn list(&self) -> Vec<Value> {
        self.cli_json(&["list"], 0)
    }

    /// The `list` entry of `unit`.
    pub fn entry(&self, unit: &str) -> Option<Value> {
        self.list().into_iter().find(|v| v["unit"] == unit)
    }

    /// Runs the CLI, requires exit 0 and exactly one JSON line, and returns that line.
    pub fn one(&self, args: &[&str]) -> Value {
        let mut lines = self.cli_json(args, 0);
        assert_eq!(lines.len(), 1, "exitproof {args:?}: {lines:?}");
        lines.remove(0)
    }

    /// Returns once the agent has handled every signal systemd sent before this call: it has
    /// the agent prove an invocation of a unit that does not exist (named: a watch without one
    /// would be refused), which takes a call to systemd whose reply comes after those signals
    /// on the agent's connection, then unwatches that unit.
    pub fn barrier(&self) {
        static BARRIERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = BARRIERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let unit = format!("exitproof-barrier-{}-{n}.service", std::process::id());
        let invocation = format!("{:032x}", n + 1);
        let view = self.one(&["watch", &unit, "--invocation", &invocation]);
        assert_eq!(view["phase"], "proven", "{view}");
        self.cli_json(&["unwatch", &unit], 0);
    }

    /// Watches `unit`'s `list` entry for `period` and panics, with the agent's log, if it is
    /// ever proven or no longer listed. For "no proof while ...": it asserts nothing about speed.
    pub fn assert_unproven_for(&self, unit: &str, period: Duration, why: &str) {
        let deadline = Instant::now() + period;
        loop {
            let entry = self.entry(unit);
            let Some(entry) = entry else {
                panic!("{unit} is no longer watched ({why})");
            };
            assert_ne!(
                entry["phase"], "proven",
                "{unit} proven while {why}: {entry}"
            );
            if Instant::now() >= deadline {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "---- agent log ----\n{}\n---- end of agent log ----",
                self.log_text()
            );
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The agent stopped with SIGSTOP, as a busy agent would be; it continues (SIGCONT) on drop,
/// also when the test panics.
pub struct Paused {
    pid: nix::unistd::Pid,
}

impl Agent {
    /// Stops the agent with SIGSTOP until the returned guard is dropped: whatever systemd does
    /// meanwhile reaches it afterwards, all at once and in order.
    pub fn pause(&self) -> Paused {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("pause the agent");
        Paused { pid }
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.pid, nix::sys::signal::Signal::SIGCONT);
    }
}

/// A line-oriented connection to the control socket.
pub struct Connection {
    reader: BufReader<UnixStream>,
    pub writer: UnixStream,
}

impl Connection {
    /// Sends raw bytes (a line, garbage, anything).
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).expect("write to the agent");
    }

    /// Reads one response line.
    pub fn read(&mut self) -> Value {
        self.read_unless_closed()
            .expect("the agent closed the connection")
    }

    /// Reads one response line, or `None` if the agent closed the connection first.
    pub fn read_unless_closed(&mut self) -> Option<Value> {
        let mut line = String::new();
        let n = self
            .reader
            .read_line(&mut line)
            .expect("read from the agent");
        (n > 0).then(|| serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}")))
    }

    /// Sends one request and reads one response.
    pub fn request(&mut self, request: &Value) -> Value {
        self.send_raw(format!("{request}\n").as_bytes());
        self.read()
    }
}
