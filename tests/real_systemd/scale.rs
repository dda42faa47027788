//! 10,000 watched units (`EXITPROOF_SCALE_UNITS` to change it): bounded memory, no inotify
//! watch leak, every unit proven after a mass kill. Starting that many units takes minutes, so
//! this suite is marked ignored and runs on request:
//! `cargo test --release --test real_systemd -- --ignored scale`. It prints what it measured.

use std::time::Duration;

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
    let agent = Agent::start(&sandbox);
    let mut conn = agent.connect();
    for name in &names {
        conn.send_raw(format!("{}\n", json!({"cmd": "watch", "unit": name})).as_bytes());
    }
    for _ in &names {
        let reply = conn.read();
        assert_eq!(reply["ok"], true, "{reply}");
    }
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
