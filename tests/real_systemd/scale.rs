//! 10,000 watched units (`EXITPROOF_SCALE_UNITS` to change it): bounded memory, no inotify
//! watch leak, every unit proven after a mass kill. Starting that many units takes minutes, so
//! this suite is marked ignored and runs on request:
//! `cargo test --release --test real_systemd -- --ignored scale`. It prints what it measured:
//! memory (resident, proportional, anonymous and file-backed) and the largest mappings, while
//! watching, once all are proven, and once all are unwatched.
//!
//! `EXITPROOF_SCALE_HEAPTRACK=DIR` (a directory outside `/tmp`, which the sandbox replaces)
//! runs the agent under heaptrack's preloaded library and writes `DIR/{watching,proven,
//! unwatched}.heaptrack`: what was allocated up to each point, with what was still live
//! reported as leaked (`heaptrack_print --print-leaks 1 DIR/watching.heaptrack`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::Test;
use crate::support::Sandbox;
use crate::support::agent::{Agent, SOCKET, STATE_DIR};
use crate::support::sandbox::cgroup_kill;

pub const TESTS: &[Test] = &[(
    "ten_thousand_units_are_watched_and_proven_with_no_leak",
    ten_thousand_units_are_watched_and_proven_with_no_leak,
)];

/// The agent's inotify watches, from /proc/PID/fdinfo (one "inotify" line per watch).
fn inotify_watches(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .map(|dir| {
            dir.filter_map(Result::ok)
                .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                .map(|info| info.lines().filter(|l| l.starts_with("inotify ")).count())
                .sum()
        })
        .unwrap_or(0)
}

/// A field of `/proc/PID/<file>` in KiB (or a count, as `Threads:`), 0 when unreadable.
fn proc_field(pid: u32, file: &str, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/{file}"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

fn status(pid: u32, field: &str) -> u64 {
    proc_field(pid, "status", field)
}

/// The agent's memory: resident (RSS), proportional (PSS: each shared page divided by the
/// processes that map it, so libc's pages count little and the agent's own in full) and
/// anonymous (heap, stacks) from `/proc/PID/smaps_rollup`, file-backed (binary, libraries)
/// from `/proc/PID/status`; and where it lies: each mapping's resident and proportional size
/// from `/proc/PID/smaps`, summed by name (`[anon]` for the unnamed), largest first.
fn memory(pid: u32) -> String {
    // (name, RSS, PSS) in KiB.
    let mut by_name: Vec<(String, u64, u64)> = Vec::new();
    let mut name = String::new();
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let first = fields.next().unwrap_or_default();
        if first == "Rss:" || first == "Pss:" {
            let kib: u64 = fields.next().and_then(|k| k.parse().ok()).unwrap_or(0);
            let index = match by_name.iter().position(|(n, _, _)| *n == name) {
                Some(index) => index,
                None => {
                    by_name.push((name.clone(), 0, 0));
                    by_name.len() - 1
                }
            };
            let (_, rss, pss) = &mut by_name[index];
            *if first == "Rss:" { rss } else { pss } += kib;
        } else if first.contains('-') && !first.ends_with(':') {
            let path = line.split_whitespace().nth(5).unwrap_or("[anon]");
            name = path.rsplit('/').next().unwrap_or(path).to_owned();
        }
    }
    by_name.sort_by_key(|(_, rss, _)| std::cmp::Reverse(*rss));
    let largest: Vec<String> = by_name
        .iter()
        .take(6)
        .map(|(name, rss, pss)| format!("{name} {rss} (PSS {pss})"))
        .collect();
    format!(
        "RSS {} KiB, peak so far {}, PSS {}, anonymous {} (file {}; largest mappings, KiB: {})",
        status(pid, "VmRSS:"),
        status(pid, "VmHWM:"),
        proc_field(pid, "smaps_rollup", "Pss:"),
        proc_field(pid, "smaps_rollup", "Anonymous:"),
        status(pid, "RssFile:"),
        largest.join(", ")
    )
}

/// heaptrack's preloaded library, which records every allocation to a file as it happens.
const HEAPTRACK_PRELOAD: &str = "/usr/lib/heaptrack/libheaptrack_preload.so";
const HEAPTRACK_INTERPRET: &str = "/usr/lib/heaptrack/libexec/heaptrack_interpret";

/// Turns what heaptrack recorded so far into `dir/phase.heaptrack`. The raw record is taken
/// up to now and interpreted while the agent's binary is still reachable by the path it was
/// run from (through this process's `/proc/PID/root`).
fn heap_snapshot(dir: &Path, phase: &str) {
    let raw = dir.join(format!("{phase}.raw"));
    std::fs::copy(dir.join("agent.raw"), &raw).expect("copy heaptrack's record");
    let output = std::fs::File::create(dir.join(format!("{phase}.heaptrack")))
        .expect("create the heap profile");
    let status = Command::new(HEAPTRACK_INTERPRET)
        .stdin(std::fs::File::open(&raw).expect("open the copied record"))
        .stdout(output)
        .stderr(Stdio::inherit())
        .status()
        .expect("run heaptrack_interpret");
    assert!(status.success(), "heaptrack_interpret: {status}");
    std::fs::remove_file(raw).expect("remove the copied record");
}

/// Long enough for the agent to give back the memory of a burst, which it does once a second
/// after the loop had something to do.
const SETTLE: Duration = Duration::from_secs(3);

fn schedstat_ns(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The pids of the sandbox's bus daemons: processes named `dbus-daemon` in its cgroup.
fn bus_daemons(sandbox: &Sandbox) -> Vec<u32> {
    let in_sandbox = format!("0::{}/", sandbox.cgroup());
    std::fs::read_dir("/proc")
        .map(|dir| {
            dir.filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .filter(|pid| {
                    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"));
                    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup"));
                    comm.is_ok_and(|c| c.trim_end() == "dbus-daemon")
                        && cgroup.is_ok_and(|c| c.lines().any(|l| l.starts_with(&in_sandbox)))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// How many saves the agent's log reports so far (journal appends and snapshots), and their
/// sizes and durations.
fn save_summary(log: &str) -> String {
    // "saved changes of N watches (B bytes) in U us", "saved a snapshot of N watches (...)"
    let saves: Vec<(bool, u64, u64)> = log
        .lines()
        .filter_map(|line| {
            let rest = &line[line.find("saved ")?..];
            let snapshot = rest.starts_with("saved a snapshot");
            let bytes = rest[rest.find('(')? + 1..]
                .split(' ')
                .next()?
                .parse()
                .ok()?;
            let us = rest[rest.find(") in ")? + 5..]
                .split(' ')
                .next()?
                .parse()
                .ok()?;
            Some((snapshot, bytes, us))
        })
        .collect();
    let summary = |snapshots: bool| {
        let some: Vec<(u64, u64)> = saves
            .iter()
            .filter(|(s, _, _)| *s == snapshots)
            .map(|(_, b, us)| (*b, *us))
            .collect();
        let total_us: u64 = some.iter().map(|(_, us)| us).sum();
        format!(
            "{} {} taking {:.1} ms in all (the largest {} bytes, the longest {:.1} ms)",
            some.len(),
            if snapshots { "snapshots" } else { "appends" },
            total_us as f64 / 1000.0,
            some.iter().map(|(b, _)| *b).max().unwrap_or(0),
            some.iter().map(|(_, us)| *us).max().unwrap_or(0) as f64 / 1000.0
        )
    };
    format!("{}; {}", summary(false), summary(true))
}

fn ten_thousand_units_are_watched_and_proven_with_no_leak() {
    let units: usize = std::env::var("EXITPROOF_SCALE_UNITS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let sandbox = Sandbox::start("scale");
    sandbox.install_unit("s@.service", "[Service]\nExecStart=/bin/sleep 100000\n");
    let names: Vec<String> = (0..units).map(|i| format!("s@{i}.service")).collect();
    for batch in names.chunks(1000) {
        let mut start = vec!["start"];
        start.extend(batch.iter().map(String::as_str));
        sandbox.systemctl_ok(&start);
    }
    // The sandbox's /run is a tmpfs, where fsync costs nothing; a state directory on a disk
    // (seen at the same path inside the sandbox) measures what a real save costs.
    let disk_state = std::env::var_os("EXITPROOF_SCALE_STATE_DIR").map(|base| {
        tempfile::Builder::new()
            .prefix("exitproof-scale-")
            .tempdir_in(base)
            .expect("a state directory under EXITPROOF_SCALE_STATE_DIR")
    });
    let state_dir = match &disk_state {
        Some(dir) => dir.path().to_string_lossy().into_owned(),
        None => STATE_DIR.to_owned(),
    };
    let heap_dir = std::env::var_os("EXITPROOF_SCALE_HEAPTRACK").map(PathBuf::from);
    let env = match &heap_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).expect("create the heap profile directory");
            let record = dir.join("agent.raw");
            vec![
                format!("LD_PRELOAD={HEAPTRACK_PRELOAD}"),
                format!("DUMP_HEAPTRACK_OUTPUT={}", record.display()),
            ]
        }
        None => Vec::new(),
    };
    let agent = Agent::start_with_env(&sandbox, SOCKET, &state_dir, &[], &env);
    let snapshot = |phase: &str| {
        if let Some(dir) = &heap_dir {
            heap_snapshot(dir, phase);
        }
    };
    let mut conn = agent.connect();
    // Pipelined: another thread writes every request without waiting for an answer, while
    // this one reads the answers.
    let mut writer = conn.writer.try_clone().expect("clone the connection");
    let requests: String = names
        .iter()
        .map(|name| format!("{}\n", json!({"cmd": "watch", "unit": name})))
        .collect();
    // Who was busy while the requests were answered: each watch's first read is systemd's
    // work, carried by the bus.
    let buses = bus_daemons(&sandbox);
    let cpu_of = |pids: &[u32]| pids.iter().map(|&p| schedstat_ns(p)).sum::<u64>();
    let cpu_before = (
        schedstat_ns(sandbox.pid()),
        cpu_of(&buses),
        schedstat_ns(agent.pid()),
    );
    let started = Instant::now();
    let sender = std::thread::spawn(move || {
        writer
            .write_all(requests.as_bytes())
            .expect("write the watch requests");
    });
    for _ in &names {
        let reply = conn.read();
        assert_eq!(reply["ok"], true, "{reply}");
    }
    let answered_in = started.elapsed();
    let busy_s = |after: u64, before: u64| after.saturating_sub(before) as f64 / 1e9;
    let busy = format!(
        "CPU meanwhile: systemd {:.2} s, bus {:.2} s, agent {:.2} s",
        busy_s(schedstat_ns(sandbox.pid()), cpu_before.0),
        busy_s(cpu_of(&buses), cpu_before.1),
        busy_s(schedstat_ns(agent.pid()), cpu_before.2),
    );
    sender.join().expect("every request is written");
    eprintln!(
        "scale: {units} pipelined watch requests answered in {:.2} s ({busy}; state directory \
         {}); {}",
        answered_in.as_secs_f64(),
        disk_state
            .as_ref()
            .map_or_else(|| "on tmpfs".to_owned(), |d| d.path().display().to_string()),
        save_summary(&agent.log_text())
    );
    let pid = agent.pid();
    let watches = inotify_watches(pid);
    assert!(
        watches > units && watches <= units + 2,
        "{watches} inotify watches"
    );
    // heaptrack's library runs a thread of its own.
    if heap_dir.is_none() {
        assert_eq!(status(pid, "Threads:"), 1);
    }
    let before = schedstat_ns(pid);
    std::thread::sleep(Duration::from_secs(60));
    let idle_ns = schedstat_ns(pid) - before;
    let watching = memory(pid);
    snapshot("watching");

    let mut events = agent.connect();
    assert_eq!(events.request(&json!({"cmd": "events"}))["ok"], true);
    // Read as they come: a subscriber that lets 1 MiB pile up is dropped, by design.
    let reader = std::thread::spawn(move || {
        for _ in 0..units {
            events.read();
        }
    });
    // Every instance at once, with one write to the cgroup.kill of the slice that holds them
    // (nothing else runs there): `systemctl kill` of the 10,000 is a D-Bus call per unit, one
    // of which systemd, busy with the deaths, once answered too late (a timeout, and no report).
    let slice = sandbox.unit_cgroup_dir("s@0.service");
    let slice = slice.parent().expect("a unit's cgroup is in a slice");
    let units_in_slice = std::fs::read_dir(slice)
        .expect("list the slice")
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .count();
    assert_eq!(
        units_in_slice, units,
        "only the test's units are in {slice:?}"
    );
    cgroup_kill(slice);
    reader
        .join()
        .expect("every proof arrives on the event stream");
    sandbox.wait_until(
        "every inotify watch is released",
        Duration::from_secs(60),
        || inotify_watches(pid) == 0,
    );
    std::thread::sleep(SETTLE);
    let proven = memory(pid);
    snapshot("proven");
    for name in &names {
        conn.send_raw(format!("{}\n", json!({"cmd": "unwatch", "unit": name})).as_bytes());
    }
    for _ in &names {
        // Past the retention limit (1024 proven units) the oldest proofs are already gone.
        let reply = conn.read();
        assert!(
            reply["ok"] == true || reply["error"]["kind"] == "not-watched",
            "{reply}"
        );
    }
    assert_eq!(conn.request(&json!({"cmd": "list"}))["units"], json!([]));
    std::thread::sleep(SETTLE);
    let unwatched = memory(pid);
    snapshot("unwatched");
    eprintln!(
        "scale: {units} units; idle CPU {idle_ns} ns over 60 s; {watches} inotify watches, 0 \
         after the proofs; peak RSS {} KiB\n  watching: {watching}\n  proven: {proven}\n  \
         unwatched: {unwatched}",
        status(pid, "VmHWM:")
    );
}
