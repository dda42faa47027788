//! The core's counters and gauges, checked against scripted inputs.

use super::*;

/// The `stats` answer, asked for as a client would.
fn stats(s: &mut Script) -> CoreStats {
    s.ask(r#"{"cmd":"stats"}"#, |answer| match answer {
        Answer::Stats(stats) => Some((**stats).clone()),
        _ => None,
    })
    .expect("a stats answer")
}

fn bucket(stats: &CoreStats, le_us: Option<u64>) -> u64 {
    stats
        .proof_latency
        .buckets
        .iter()
        .find(|b| b.le_us == le_us)
        .map(|b| b.count)
        .expect("a bucket with that bound")
}

#[test]
fn a_terminal_unit_with_processes_left_is_blocked_until_its_proof_whose_latency_is_counted() {
    let mut s = watching("b.service", "active");
    let before = stats(&mut s);
    assert_eq!((before.watches.watching, before.blocked), (1, 0));
    assert_eq!(before.proof_latency.count, 0);

    s.changed("b.service", "inactive", A);
    let blocked = stats(&mut s);
    assert_eq!(blocked.blocked, 1, "terminal, cgroup populated");
    assert_eq!(blocked.watches.watching, 1);

    s.now += Duration::from_millis(3);
    s.cgroups
        .insert("/app.slice/b.service".into(), CgroupReading::Empty);
    s.input(Input::CgroupChanged { key: UnitKey(0) });
    let proven = stats(&mut s);
    assert_eq!(proven.blocked, 0);
    assert_eq!(
        (proven.watches.watching, proven.watches.proven),
        (0, 1),
        "a proven unit is retained"
    );
    assert_eq!(proven.proofs.exited, 1);
    assert_eq!(proven.proof_latency.count, 1);
    assert_eq!(proven.proof_latency.sum_us, 3_000);
    assert_eq!(bucket(&proven, Some(2_500)), 0);
    assert_eq!(bucket(&proven, Some(5_000)), 1, "cumulative from here");
    assert_eq!(bucket(&proven, None), 1);
}

#[test]
fn a_proof_without_a_terminal_state_is_counted_by_cause_with_no_latency() {
    let mut s = watching("r.service", "active");
    s.request(r#"{"cmd":"stop","unit":"r.service"}"#);
    let stopping = stats(&mut s);
    assert_eq!(stopping.watches.stopping, 1);
    s.cgroups
        .insert("/app.slice/r.service".into(), CgroupReading::Empty);
    s.changed("r.service", "activating", B);
    let proven = stats(&mut s);
    assert_eq!(proven.proofs.replaced_after_stop, 1);
    assert_eq!(proven.proofs.exited, 0);
    assert_eq!(proven.proof_latency.count, 0);
}

#[test]
fn a_watch_from_another_boot_counts_as_rebooted() {
    let mut s = Script::restored(state("boot-0", vec![saved("x.service", A)]), "boot-1");
    let stats = stats(&mut s);
    assert_eq!(stats.proofs.rebooted, 1);
    assert_eq!(stats.watches.proven, 1);
}

#[test]
fn each_safety_net_relist_is_counted() {
    let mut config = config("boot-1");
    config.resync_interval = Some(Duration::from_secs(60));
    let mut s = Script::configured(config, AgentState::default());
    s.pass(Duration::from_secs(59));
    assert_eq!(stats(&mut s).resyncs, 0);
    s.pass(Duration::from_secs(1));
    s.pass(Duration::from_secs(60));
    assert_eq!(stats(&mut s).resyncs, 2);
}

#[test]
fn the_latency_histogram_puts_a_bound_in_its_own_bucket_and_the_rest_past_the_last() {
    let mut histogram =
        super::super::stats::Histogram::new(&super::super::stats::LATENCY_BOUNDS_US);
    histogram.observe(Duration::from_micros(100));
    histogram.observe(Duration::from_micros(101));
    histogram.observe(Duration::from_secs(3600));
    let summary = histogram.summary();
    assert_eq!(
        summary.buckets.len(),
        super::super::stats::LATENCY_BOUNDS_US.len() + 1
    );
    assert_eq!(summary.buckets[0].count, 1, "le is inclusive");
    assert_eq!(summary.buckets[1].count, 2);
    let last_bound = summary.buckets[super::super::stats::LATENCY_BOUNDS_US.len() - 1].count;
    assert_eq!(last_bound, 2);
    assert_eq!(summary.buckets.last().map(|b| b.count), Some(3));
    assert_eq!(summary.count, 3);
    assert_eq!(summary.sum_us, 100 + 101 + 3_600_000_000);
}
