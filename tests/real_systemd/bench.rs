//! `exitproof-bench` end to end, small: in separate phases with a kill interval and with both
//! contenders together, every field of bench.json is there with sane values and every unit is
//! proven by every contender that watched it. It asserts no speeds.

use serde_json::Value;

use crate::Test;
use crate::support::Sandbox;
use crate::support::agent::binary;

pub const TESTS: &[Test] = &[
    (
        "separate_phases_with_a_kill_interval_report_every_field",
        separate_phases_with_a_kill_interval_report_every_field,
    ),
    (
        "together_both_contenders_prove_the_same_units",
        together_both_contenders_prove_the_same_units,
    ),
];

const UNITS: u64 = 3;

fn number(value: &Value, path: &str) -> f64 {
    let mut v = value;
    for key in path.split('.') {
        v = &v[key];
    }
    v.as_f64()
        .unwrap_or_else(|| panic!("{path} is not a number in {value}"))
}

/// Runs `exitproof-bench --user` with `args` in a sandbox of its own and returns bench.json,
/// after checking what every mode must have.
fn run_bench(name: &str, args: &[&str]) -> (Value, String, String) {
    let sandbox = Sandbox::start(name);
    let out = sandbox.host_path("/run/bench-out");
    // The binaries by their path through this process's root: the sandbox has its own /tmp.
    let host = |path: &str| format!("/proc/{}/root{path}", std::process::id());
    let output = sandbox
        .command(&host(env!("CARGO_BIN_EXE_exitproof-bench")))
        .args(["--user", "--agent", &host(binary())])
        .args(["--units", &UNITS.to_string(), "--rounds", "1"])
        .args(["--poll-interval", "200ms", "--out", "/run/bench-out"])
        .args(args)
        .output()
        .expect("run exitproof-bench");
    assert!(
        output.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let json: Value = serde_json::from_slice(&std::fs::read(out.join("bench.json")).unwrap())
        .expect("bench.json is JSON");
    let summary = &json["summary"];
    assert_eq!(summary["units"], UNITS);
    assert_eq!(summary["rounds"], 1);
    // systemd's signal is observed in every phase: one per contender when they are separate.
    let phases = if summary["mode"] == "separate" { 2 } else { 1 };
    let watched = [
        ("event", UNITS),
        ("poll", UNITS),
        ("systemd", UNITS * phases),
    ];
    for (contender, count) in watched {
        assert_eq!(
            summary[contender]["proven"], count,
            "{contender}: {summary}"
        );
        assert_eq!(summary[contender]["missing"], 0, "{contender}: {summary}");
        for q in ["p50", "p90", "p99", "max"] {
            let v = number(summary, &format!("{contender}.e2e_ms.{q}"));
            assert!(v > 0.0, "{contender} e2e {q} = {v}");
        }
    }
    for contender in ["event", "poll"] {
        for q in ["p50", "p99", "max"] {
            number(summary, &format!("{contender}.overhead_ms.{q}"));
        }
        assert!(number(summary, &format!("{contender}.idle_cpu_ms")) >= 0.0);
        assert!(number(summary, &format!("{contender}.round_cpu_ms")) >= 0.0);
    }
    for memory in ["rss_kib", "pss_kib", "anon_kib"] {
        assert!(
            number(summary, &format!("event.{memory}")) > 0.0,
            "{memory}"
        );
    }
    assert_eq!(
        summary["event"]["threads"], 1,
        "the agent runs on one thread"
    );
    assert!(
        number(summary, "poll.spawned_cpu_ms") > 0.0,
        "systemctl was spawned"
    );
    for ratio in [
        "p50_e2e_poll_over_event",
        "idle_cpu_poll_over_event",
        "p50_e2e_event_over_systemd",
    ] {
        assert!(summary["ratios"].get(ratio).is_some(), "{ratio}: {summary}");
    }
    for sample in json["run"]["samples"].as_array().expect("raw samples") {
        for t in ["t_kill_ns", "t_cgroup_ns", "t_signal_ns"] {
            assert!(sample[t].as_u64().is_some_and(|t| t > 0), "{t} in {sample}");
        }
    }
    let md = std::fs::read_to_string(out.join("bench.md")).expect("bench.md");
    assert!(md.contains("| event |") && md.contains("| poll |"), "{md}");
    let svg = std::fs::read_to_string(out.join("latency.svg")).expect("latency.svg");
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
    (json, md, svg)
}

/// The samples of `phase`.
fn samples_of<'a>(json: &'a Value, phase: &str) -> Vec<&'a Value> {
    json["run"]["samples"]
        .as_array()
        .expect("raw samples")
        .iter()
        .filter(|s| s["phase"] == phase)
        .collect()
}

fn separate_phases_with_a_kill_interval_report_every_field() {
    let (json, md, svg) = run_bench(
        "bench-separate",
        &["--kill-interval", "20ms", "--seed", "5", "--idle", "1s"],
    );
    let summary = &json["summary"];
    assert_eq!(summary["mode"], "separate", "{summary}");
    assert_eq!(summary["kill_interval_ms"], 20);
    assert_eq!(summary["seed"], 5);
    for (phase, proved, did_not) in [
        ("event", "t_event_ns", "t_poll_ns"),
        ("poll", "t_poll_ns", "t_event_ns"),
    ] {
        let samples = samples_of(&json, phase);
        assert_eq!(samples.len() as u64, UNITS, "{phase}: {json}");
        for sample in &samples {
            assert!(sample[proved].as_u64() > sample["t_kill_ns"].as_u64());
            assert!(sample[did_not].is_null(), "{sample}");
        }
        // Kill i is due at i × 20 ms plus up to 20 ms, and sleeping never ends early: the
        // last of 3 comes at least 20 ms after the first.
        let kills: Vec<u64> = samples
            .iter()
            .map(|s| s["t_kill_ns"].as_u64().unwrap())
            .collect();
        assert!(kills.is_sorted(), "{kills:?}");
        assert!(kills[2] - kills[0] >= 20_000_000, "{kills:?}");
    }
    assert!(md.contains("- mode: separate phases"), "{md}");
    assert!(md.contains("- kills: one every 20 ms (seed 5)"), "{md}");
    assert!(svg.contains("separate phases, one every 20 ms"));
}

fn together_both_contenders_prove_the_same_units() {
    let (json, md, _) = run_bench("bench-together", &["--together", "--idle", "0"]);
    let summary = &json["summary"];
    assert_eq!(summary["mode"], "together", "{summary}");
    assert_eq!(summary["kill_interval_ms"], 0);
    assert_eq!(number(summary, "event.idle_cpu_ms"), 0.0, "no idle window");
    let samples = samples_of(&json, "together");
    assert_eq!(samples.len() as u64, UNITS, "{json}");
    for sample in samples {
        for t in ["t_event_ns", "t_poll_ns"] {
            assert!(
                sample[t].as_u64() > sample["t_kill_ns"].as_u64(),
                "{t}: {sample}"
            );
        }
    }
    assert!(md.contains("- kills: all at once"), "{md}");
}
