//! `exitproof bench` end to end, small: every field of bench.json is there with sane values and
//! every unit is proven by every contender. It asserts no speeds.

use serde_json::Value;

use crate::Test;
use crate::support::Sandbox;
use crate::support::agent::binary;

pub const TESTS: &[Test] = &[(
    "a_small_bench_reports_every_field_for_every_contender",
    a_small_bench_reports_every_field_for_every_contender,
)];

fn number(value: &Value, path: &str) -> f64 {
    let mut v = value;
    for key in path.split('.') {
        v = &v[key];
    }
    v.as_f64()
        .unwrap_or_else(|| panic!("{path} is not a number in {value}"))
}

fn a_small_bench_reports_every_field_for_every_contender() {
    let sandbox = Sandbox::start("bench");
    let out = sandbox.host_path("/run/bench-out");
    let inner_binary = format!("/proc/{}/root{}", std::process::id(), binary());
    let output = sandbox
        .command(&inner_binary)
        .args([
            "--user",
            "bench",
            "--units",
            "5",
            "--rounds",
            "1",
            "--idle",
            "1s",
            "--poll-interval",
            "200ms",
            "--out",
            "/run/bench-out",
        ])
        .output()
        .expect("run exitproof bench");
    assert!(
        output.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let json: Value = serde_json::from_slice(&std::fs::read(out.join("bench.json")).unwrap())
        .expect("bench.json is JSON");
    let summary = &json["summary"];
    assert_eq!(summary["units"], 5);
    assert_eq!(summary["rounds"], 1);
    for contender in ["event", "poll", "systemd"] {
        assert_eq!(summary[contender]["proven"], 5, "{contender}: {summary}");
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
    assert!(number(summary, "event.rss_kib") > 0.0);
    assert_eq!(
        summary["event"]["threads"], 1,
        "the agent runs on one thread"
    );
    assert!(
        number(summary, "poll.spawned_cpu_ms") > 0.0,
        "systemctl was spawned"
    );
    assert!(summary["ratios"].get("p50_e2e_poll_over_event").is_some());
    assert!(summary["ratios"].get("idle_cpu_poll_over_event").is_some());
    let samples = json["run"]["samples"].as_array().expect("raw samples");
    assert_eq!(samples.len(), 5);
    for sample in samples {
        for t in [
            "t_kill_ns",
            "t_cgroup_ns",
            "t_signal_ns",
            "t_event_ns",
            "t_poll_ns",
        ] {
            assert!(sample[t].as_u64().is_some_and(|t| t > 0), "{t} in {sample}");
        }
        assert!(sample["t_event_ns"].as_u64() > sample["t_kill_ns"].as_u64());
    }
    let md = std::fs::read_to_string(out.join("bench.md")).expect("bench.md");
    assert!(md.contains("| event |") && md.contains("| poll |"), "{md}");
    let svg = std::fs::read_to_string(out.join("latency.svg")).expect("latency.svg");
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
}
