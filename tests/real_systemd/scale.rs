//! 10,000 watched units (`EXITPROOF_SCALE_UNITS` to change it): bounded memory, no inotify
//! watch leak, every unit proven after a mass kill. Starting that many units takes minutes, so
//! this suite is marked ignored and runs on request:
//! `cargo test --release --test real_systemd -- --ignored scale`. It prints what it measured.

use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::Test;
use crate::support::Sandbox;
use crate::support::agent::Agent;

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

fn status(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

fn schedstat_ns(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// How many saves the agent's log reports so far, and their sizes and durations.
fn save_summary(log: &str) -> String {
    // "saved N watches (B bytes) in U us"
    let saves: Vec<(u64, u64)> = log
        .lines()
        .filter_map(|line| {
            let rest = &line[line.find("saved ")?..];
            let words: Vec<&str> = rest.split_whitespace().collect();
            let bytes = words.get(3)?.trim_start_matches('(').parse().ok()?;
            let us = words.get(6)?.parse().ok()?;
            Some((bytes, us))
        })
        .collect();
    let total_us: u64 = saves.iter().map(|(_, us)| us).sum();
    format!(
        "{} saves taking {:.1} ms in all (the largest {} bytes, the longest {:.1} ms)",
        saves.len(),
        total_us as f64 / 1000.0,
        saves.iter().map(|(b, _)| *b).max().unwrap_or(0),
        saves.iter().map(|(_, us)| *us).max().unwrap_or(0) as f64 / 1000.0
    )
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
    let agent = match &disk_state {
        Some(dir) => Agent::start_in(&sandbox, &dir.path().to_string_lossy(), &[]),
        None => Agent::start(&sandbox),
    };
    let mut conn = agent.connect();
    // Pipelined: another thread writes every request without waiting for an answer, while
    // this one reads the answers.
    let mut writer = conn.writer.try_clone().expect("clone the connection");
    let requests: String = names
        .iter()
        .map(|name| format!("{}\n", json!({"cmd": "watch", "unit": name})))
        .collect();
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
    sender.join().expect("every request is written");
    eprintln!(
        "scale: {units} pipelined watch requests answered in {:.2} s (state directory {}); {}",
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
    assert_eq!(status(pid, "Threads:"), 1);
    let before = schedstat_ns(pid);
    std::thread::sleep(Duration::from_secs(60));
    let idle_ns = schedstat_ns(pid) - before;
    let rss = status(pid, "VmRSS:");
    let hwm = status(pid, "VmHWM:");

    let mut events = agent.connect();
    assert_eq!(events.request(&json!({"cmd": "events"}))["ok"], true);
    // Read as they come: a subscriber that lets 1 MiB pile up is dropped, by design.
    let reader = std::thread::spawn(move || {
        for _ in 0..units {
            events.read();
        }
    });
    sandbox.systemctl_ok(&["kill", "-s", "KILL", "s@*.service"]);
    reader
        .join()
        .expect("every proof arrives on the event stream");
    sandbox.wait_until(
        "every inotify watch is released",
        Duration::from_secs(60),
        || inotify_watches(pid) == 0,
    );
    eprintln!(
        "scale: {units} units; RSS {rss} KiB watching, peak {hwm} KiB (after the kill {} KiB); \
         idle CPU {idle_ns} ns over 60 s; {watches} inotify watches, 0 after the proofs",
        status(pid, "VmHWM:")
    );
}
