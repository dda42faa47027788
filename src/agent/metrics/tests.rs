use std::os::unix::fs::MetadataExt;

use super::*;
use crate::agent::core::stats::LATENCY_BOUNDS_US;
use crate::agent::stats::DriverCounters;
use crate::agent::turns::OWN_LATENCY_BOUNDS_US;
use crate::control::wire::{Bucket, CoreStats, LoopStats};

fn sample() -> AgentStats {
    let mut buckets: Vec<Bucket> = LATENCY_BOUNDS_US
        .iter()
        .map(|&le| Bucket {
            le_us: Some(le),
            count: u64::from(le >= 5_000) + u64::from(le >= 1_000_000),
        })
        .collect();
    buckets.push(Bucket {
        le_us: None,
        count: 3,
    });
    let core = CoreStats {
        watches: crate::control::wire::PhaseCounts {
            watching: 4,
            stopping: 1,
            proven: 2,
        },
        blocked: 1,
        proofs: crate::control::wire::ProofCounts {
            exited: 2,
            replaced_after_stop: 1,
            restarted_outside: 0,
            rebooted: 0,
        },
        resyncs: 7,
        proof_latency: LatencySummary {
            buckets,
            sum_us: 3_600_004_500,
            count: 3,
        },
    };
    let counters = DriverCounters {
        bus_reconnects: 2,
        inotify_overflows: 1,
    };
    let mut own = crate::agent::core::stats::Histogram::new(&OWN_LATENCY_BOUNDS_US);
    own.observe(Duration::from_micros(45));
    own.observe(Duration::from_micros(180));
    let mut event_loop = LoopStats {
        proof_latency: own.summary(),
        proof_latency_max_us: 180,
        turns: 40,
        ..LoopStats::default()
    };
    event_loop.work.saves = 3;
    event_loop.work.sync_us = 1_500;
    AgentStats::new(core, counters, 10, 5, None, event_loop)
}

#[test]
fn every_family_has_help_and_type_before_its_samples() {
    let text = render(&sample());
    let mut declared = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("name and type");
            assert!(["gauge", "counter", "histogram"].contains(&kind), "{line}");
            declared.push(name.to_owned());
            continue;
        }
        if line.starts_with("# HELP ") {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("a sample is `series value`");
        value.parse::<f64>().expect("a number");
        let name = series.split('{').next().expect("a name");
        assert!(name.starts_with("exitproof_"), "{line}");
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .filter(|base| declared.last().map(String::as_str) == Some(*base))
            .unwrap_or(name);
        assert_eq!(declared.last().map(String::as_str), Some(family), "{line}");
    }
    assert!(text.ends_with('\n'));
}

#[test]
fn the_figures_are_rendered_with_their_labels() {
    let text = render(&sample());
    for line in [
        "exitproof_watches{phase=\"watching\"} 4",
        "exitproof_watches{phase=\"stopping\"} 1",
        "exitproof_watches{phase=\"proven\"} 2",
        "exitproof_units_blocked 1",
        "exitproof_proofs_total{cause=\"exited\"} 2",
        "exitproof_proofs_total{cause=\"replaced-after-stop\"} 1",
        "exitproof_proofs_total{cause=\"rebooted\"} 0",
        "exitproof_resyncs_total 7",
        "exitproof_bus_reconnects_total 2",
        "exitproof_inotify_overflows_total 1",
        "exitproof_inotify_watches 10",
        "exitproof_systemd_heard 1",
        "exitproof_journald_dropped_total 5",
        "# TYPE exitproof_proof_latency_seconds histogram",
        "exitproof_proof_latency_seconds_bucket{le=\"0.0001\"} 0",
        "exitproof_proof_latency_seconds_bucket{le=\"0.005\"} 1",
        "exitproof_proof_latency_seconds_bucket{le=\"1\"} 2",
        "exitproof_proof_latency_seconds_bucket{le=\"300\"} 2",
        "exitproof_proof_latency_seconds_bucket{le=\"+Inf\"} 3",
        "exitproof_proof_latency_seconds_sum 3600.0045",
        "exitproof_proof_latency_seconds_count 3",
        "# TYPE exitproof_loop_proof_latency_seconds histogram",
        "exitproof_loop_proof_latency_seconds_bucket{le=\"0.00004\"} 0",
        "exitproof_loop_proof_latency_seconds_bucket{le=\"0.00005\"} 1",
        "exitproof_loop_proof_latency_seconds_bucket{le=\"0.0002\"} 2",
        "exitproof_loop_proof_latency_seconds_sum 0.000225",
        "exitproof_loop_proof_latency_seconds_count 2",
        "exitproof_loop_turns_total 40",
        "exitproof_loop_work_total{work=\"save\"} 3",
        "exitproof_loop_work_microseconds_total{work=\"sync\"} 1500",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in:\n{text}"
        );
    }
}

#[test]
fn systemd_unheard_is_a_zero() {
    let stats = AgentStats {
        systemd_error: Some("the bus connection closed".to_owned()),
        ..sample()
    };
    let text = render(&stats);
    assert!(
        text.lines().any(|l| l == "exitproof_systemd_heard 0"),
        "{text}"
    );
}

#[test]
fn microseconds_become_exact_seconds() {
    assert_eq!(seconds(0), "0");
    assert_eq!(seconds(100), "0.0001");
    assert_eq!(seconds(2_500), "0.0025");
    assert_eq!(seconds(1_000_000), "1");
    assert_eq!(seconds(1_234_567), "1.234567");
}

#[test]
fn the_file_is_refreshed_at_most_every_interval_and_only_when_its_text_changed() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("exitproof.prom");
    let start = Instant::now();
    let mut file = MetricsFile::new(&path, start).expect("a metrics file");
    assert_eq!(file.due(), Some(start), "written first at start");
    file.refresh_if_due(start, sample);
    assert_eq!(file.due(), None, "idle: no timer");
    let written = std::fs::read_to_string(&path).expect("written");
    assert_eq!(written, render(&sample()));
    let inode = std::fs::metadata(&path).expect("metadata").ino();

    file.changed(start + Duration::from_secs(1));
    assert_eq!(
        file.due(),
        Some(start + REFRESH_INTERVAL),
        "not before the interval"
    );
    file.changed(start + Duration::from_secs(2));
    assert_eq!(
        file.due(),
        Some(start + REFRESH_INTERVAL),
        "one refresh for both"
    );
    file.refresh_if_due(start + Duration::from_secs(4), || panic!("not due yet"));
    file.refresh_if_due(start + REFRESH_INTERVAL, sample);
    assert_eq!(
        std::fs::metadata(&path).expect("metadata").ino(),
        inode,
        "the same figures are not written again"
    );

    let later = start + Duration::from_secs(60);
    file.changed(later);
    assert_eq!(
        file.due(),
        Some(later),
        "long after the last refresh: at once"
    );
    let mut changed = sample();
    changed.core.blocked = 0;
    file.refresh_if_due(later, || changed.clone());
    let rewritten = std::fs::read_to_string(&path).expect("rewritten");
    assert!(rewritten.contains("exitproof_units_blocked 0\n"));
    assert_eq!(
        crate::atomic_file::dir_entries(dir.path()),
        ["exitproof.prom"]
    );
}

#[test]
fn a_file_that_cannot_be_written_is_retried_on_the_next_change() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("missing").join("exitproof.prom");
    let start = Instant::now();
    let mut file = MetricsFile::new(&path, start).expect("a metrics file");
    file.refresh_if_due(start, sample);
    std::fs::create_dir(dir.path().join("missing")).expect("mkdir");
    let later = start + REFRESH_INTERVAL;
    file.changed(later);
    file.refresh_if_due(later, sample);
    assert_eq!(
        std::fs::read_to_string(&path).expect("written"),
        render(&sample())
    );
}
