//! Pure statistics over a benchmark run: latencies per contender, their quantiles, the
//! resource figures and the ratios between the old polling design and exitproof's agent.
//!
//! Everything here is a pure function of a [`BenchRun`]: it must never read a clock, a file
//! or the system, so that a stored `bench.json` always summarises to the same numbers.

use serde::Serialize;

use super::sample::{BenchRun, Mode, Resources, UnitSample};
use crate::control::wire::LoopStats;

/// Nanoseconds in a millisecond, for converting monotonic timestamp differences.
const NS_PER_MS: f64 = 1_000_000.0;

/// The `p`-th percentile of `sorted` by the nearest-rank method.
///
/// The result is the element of rank `ceil(p / 100 * n)` (1-based, at least 1), so it is
/// always one of the samples, never an interpolation between two: with 10 samples the 90th
/// percentile is the 9th smallest, the 99th and the 100th are the largest, and the 0th is
/// the smallest. `p` is clamped to `[0, 100]`.
///
/// `sorted` must be in ascending order; passing an unsorted slice is the caller's bug (it is
/// checked in debug builds only, and gives a meaningless result in release builds).
/// Returns `None` for an empty slice or a NaN `p`.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    debug_assert!(
        sorted.is_sorted_by(|a, b| a <= b),
        "percentile needs an ascending slice"
    );
    if sorted.is_empty() || p.is_nan() {
        return None;
    }
    let count = sorted.len() as f64;
    // Multiplying before dividing keeps whole-number ranks exact (90 * 10 / 100 is exactly
    // 9, where 0.9 * 10 may not be), so ceil() does not step over to the next sample.
    let rank = (p.clamp(0.0, 100.0) * count / 100.0).ceil();
    // rank is in [0, n], so the index is in [0, n - 1].
    let index = (rank as usize).saturating_sub(1);
    sorted.get(index).copied()
}

/// The distribution of end-to-end latencies of one contender, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Quantiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Quantiles {
    /// The nearest-rank quantiles of `values` (in any order); `None` when it is empty.
    pub fn of(values: &[f64]) -> Option<Self> {
        let sorted = sorted_copy(values);
        Some(Self {
            p50: percentile(&sorted, 50.0)?,
            p90: percentile(&sorted, 90.0)?,
            p99: percentile(&sorted, 99.0)?,
            max: percentile(&sorted, 100.0)?,
        })
    }
}

/// The distribution of a contender's overhead over the bench's own observers, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Overhead {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl Overhead {
    /// The nearest-rank quantiles of `values` (in any order); `None` when it is empty.
    pub fn of(values: &[f64]) -> Option<Self> {
        let sorted = sorted_copy(values);
        Some(Self {
            p50: percentile(&sorted, 50.0)?,
            p99: percentile(&sorted, 99.0)?,
            max: percentile(&sorted, 100.0)?,
        })
    }
}

/// The empirical cumulative distribution of `values` (in any order): one `(value, fraction
/// of values <= value)` point per value, ascending, the last fraction being 1.0.
///
/// Equal values give one point each, with growing fractions, so a plot drawn through the
/// points rises by the right amount at that value.
pub fn cdf_points(values: &[f64]) -> Vec<(f64, f64)> {
    let sorted = sorted_copy(values);
    let count = sorted.len() as f64;
    sorted
        .into_iter()
        .enumerate()
        .map(|(index, value)| (value, (index + 1) as f64 / count))
        .collect()
}

/// `numerator / denominator`, or `None` when the denominator is 0 or either is not finite,
/// so that a report never shows an infinity or a NaN.
pub fn ratio(numerator: f64, denominator: f64) -> Option<f64> {
    if denominator == 0.0 || !numerator.is_finite() || !denominator.is_finite() {
        return None;
    }
    Some(numerator / denominator)
}

/// How many units a contender proved gone, how many it did not, and how fast.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Latency {
    /// Time from the kill to the contender's proof, in ms; `null` when it proved no unit.
    pub e2e_ms: Option<Quantiles>,
    /// Samples with this contender's time.
    pub proven: usize,
    /// Samples of its phases without it (the contender never proved that unit gone in that
    /// round).
    pub missing: usize,
}

/// The summary of a contender that proves exits itself (the agent and the poller).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ContenderSummary {
    #[serde(flatten)]
    pub latency: Latency,
    /// Time from the later of the bench's two observers (its cgroup inotify and its D-Bus
    /// signal) to the contender's proof, in ms, over the samples where all three exist;
    /// `null` when there is no such sample.
    ///
    /// It is kept signed and never clamped: a contender that reads `cgroup.events` before the
    /// bench's own inotify fires is legitimately faster than the observer, and the negative
    /// value says so.
    pub overhead_ms: Option<Overhead>,
    /// CPU time used during the idle window, all units watched, in ms. For the poller this
    /// includes the CPU time of the `systemctl` processes it spawned, as measured by the
    /// bench ([`Resources::idle_cpu_ms`] must already hold that total).
    pub idle_cpu_ms: f64,
    /// CPU time used during the kill rounds, in ms; for the poller, including its spawned
    /// processes, as for `idle_cpu_ms`.
    pub round_cpu_ms: f64,
    /// Peak resident set size in KiB; `null` where it cannot be told apart from the bench's.
    pub rss_kib: Option<u64>,
    /// Proportional set size at the end of the rounds, KiB ([`Resources::pss_kib`]).
    pub pss_kib: Option<u64>,
    /// Anonymous memory resident at the end of the rounds, KiB.
    pub anon_kib: Option<u64>,
    /// Threads of the contender's process; `null` where it has no process of its own.
    pub threads: Option<u64>,
}

/// The summary of the polling contender: a [`ContenderSummary`] plus its spawned processes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PollSummary {
    #[serde(flatten)]
    pub contender: ContenderSummary,
    /// CPU time of the `systemctl` processes the poller spawned, idle window and kill rounds
    /// together, in ms. Information only: it is already part of `idle_cpu_ms` and
    /// `round_cpu_ms`. `null` when the bench could not measure it.
    pub spawned_cpu_ms: Option<f64>,
}

/// How much worse the polling design is than exitproof's agent; `null` where the ratio
/// cannot be computed (the agent's figure is 0 or missing), never infinity.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Ratios {
    /// Poller's median end-to-end latency over the agent's.
    pub p50_e2e_poll_over_event: Option<f64>,
    /// Poller's idle-window CPU time (spawned processes included) over the agent's.
    pub idle_cpu_poll_over_event: Option<f64>,
    /// The agent's median end-to-end latency over that of systemd's own signal, on the units the
    /// agent watched: how far above the floor it proves.
    pub p50_e2e_event_over_systemd: Option<f64>,
}

/// The summary of a benchmark run, as written under `"summary"` in `bench.json`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub units: usize,
    pub rounds: u32,
    /// Whether each contender ran in a phase of its own or both at once.
    pub mode: Mode,
    /// One unit killed every this many ms (0: all at once).
    pub kill_interval_ms: u64,
    /// The seed of the kill schedule's jitter.
    pub seed: u64,
    /// exitproof's agent.
    pub event: ContenderSummary,
    /// The old design: one `systemctl show` per unit per poll interval.
    pub poll: PollSummary,
    /// systemd's own D-Bus signal as seen by the bench: the floor the others are compared to.
    pub systemd: Latency,
    pub ratios: Ratios,
    /// The agent's own time per proof, from its `stats`; `null` where it was not taken.
    pub agent_own_ms: Option<OwnTime>,
}

/// The agent's own time per proof, as its histogram tells it (`stats`' `loop`): from the
/// loop's receipt of what decided a proof to the proof written to its subscribers.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct OwnTime {
    /// Proofs in the histogram.
    pub proofs: u64,
    /// The upper bound of the bucket holding the median (nearest rank), in ms: the median is
    /// at most this.
    pub p50_at_most: f64,
    /// The same for the 99th percentile.
    pub p99_at_most: f64,
    /// The longest, exactly, in ms.
    pub max: f64,
}

impl OwnTime {
    pub fn of(event_loop: &LoopStats) -> Option<OwnTime> {
        let histogram = &event_loop.proof_latency;
        let max_us = event_loop.proof_latency_max_us;
        let at_most = |p: u64| {
            let rank = histogram.count.saturating_mul(p).div_ceil(100).max(1);
            let bucket = histogram.buckets.iter().find(|b| b.count >= rank)?;
            Some(bucket.le_us.map_or(max_us, |le| le.min(max_us)) as f64 / 1000.0)
        };
        (histogram.count > 0).then_some(())?;
        Some(OwnTime {
            proofs: histogram.count,
            p50_at_most: at_most(50)?,
            p99_at_most: at_most(99)?,
            max: max_us as f64 / 1000.0,
        })
    }
}

/// One of the three contenders of the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contender {
    /// exitproof's agent.
    Event,
    /// The old design: one `systemctl show` per unit per poll interval.
    Poll,
    /// systemd's own D-Bus signal, as the bench saw it.
    Systemd,
}

impl Contender {
    /// Every contender, in the order reports show them.
    pub const ALL: [Self; 3] = [Self::Event, Self::Poll, Self::Systemd];

    /// The contender's name, as in `bench.json`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Event => "event",
            Self::Poll => "poll",
            Self::Systemd => "systemd",
        }
    }

    /// Whether this contender watched `sample`'s unit (systemd's signal is observed for all).
    pub fn watched(self, sample: &UnitSample) -> bool {
        match self {
            Self::Event => sample.phase.has_agent(),
            Self::Poll => sample.phase.has_poller(),
            Self::Systemd => true,
        }
    }

    /// When this contender proved `sample`'s unit gone, if it did.
    pub fn proof_ns(self, sample: &UnitSample) -> Option<u64> {
        match self {
            Self::Event => sample.t_event_ns,
            Self::Poll => sample.t_poll_ns,
            Self::Systemd => sample.t_signal_ns,
        }
    }
}

/// Summarises `run`: every figure of [`Summary`], from its raw samples and resources.
pub fn summarize(run: &BenchRun) -> Summary {
    let event = contender_summary(&run.samples, Contender::Event, &run.event);
    let poll = PollSummary {
        contender: contender_summary(&run.samples, Contender::Poll, &run.poll),
        spawned_cpu_ms: run.poll.spawned_cpu_ms,
    };
    let systemd = latency(&run.samples, Contender::Systemd);
    let p50_ratio = |numerator: &Option<Quantiles>, denominator: &Option<Quantiles>| {
        ratio(numerator.as_ref()?.p50, denominator.as_ref()?.p50)
    };
    let systemd_on_event_units = Quantiles::of(&e2e_of(
        run.samples.iter().filter(|s| Contender::Event.watched(s)),
        Contender::Systemd,
    ));
    let ratios = Ratios {
        p50_e2e_poll_over_event: p50_ratio(&poll.contender.latency.e2e_ms, &event.latency.e2e_ms),
        idle_cpu_poll_over_event: ratio(poll.contender.idle_cpu_ms, event.idle_cpu_ms),
        p50_e2e_event_over_systemd: p50_ratio(&event.latency.e2e_ms, &systemd_on_event_units),
    };
    Summary {
        units: run.units,
        rounds: run.rounds,
        mode: run.mode,
        kill_interval_ms: run.kill_interval_ms,
        seed: run.seed,
        event,
        poll,
        systemd,
        ratios,
        agent_own_ms: run.agent_loop.as_ref().and_then(OwnTime::of),
    }
}

/// The end-to-end latencies (kill to proof) in ms of the samples `contender` watched and proved.
pub fn e2e_ms(samples: &[UnitSample], contender: Contender) -> Vec<f64> {
    e2e_of(samples.iter().filter(|s| contender.watched(s)), contender)
}

/// The end-to-end latencies in ms of those of `samples` that `contender` proved.
fn e2e_of<'a>(samples: impl Iterator<Item = &'a UnitSample>, contender: Contender) -> Vec<f64> {
    samples
        .filter_map(|sample| {
            let proved = contender.proof_ns(sample)?;
            Some(elapsed_ms(sample.t_kill_ns, proved))
        })
        .collect()
}

/// How many of `samples` `contender` watched.
pub fn watched_count(samples: &[UnitSample], contender: Contender) -> usize {
    samples.iter().filter(|s| contender.watched(s)).count()
}

/// The [`Latency`] of one contender over the samples it watched.
fn latency(samples: &[UnitSample], contender: Contender) -> Latency {
    let e2e = e2e_ms(samples, contender);
    let watched = watched_count(samples, contender);
    Latency {
        e2e_ms: Quantiles::of(&e2e),
        proven: e2e.len(),
        missing: watched.saturating_sub(e2e.len()),
    }
}

/// The [`ContenderSummary`] of the agent or the poller.
fn contender_summary(
    samples: &[UnitSample],
    contender: Contender,
    resources: &Resources,
) -> ContenderSummary {
    let overhead: Vec<f64> = samples
        .iter()
        .filter_map(|sample| {
            let observed = sample.t_cgroup_ns?.max(sample.t_signal_ns?);
            Some(elapsed_ms(observed, contender.proof_ns(sample)?))
        })
        .collect();
    ContenderSummary {
        latency: latency(samples, contender),
        overhead_ms: Overhead::of(&overhead),
        idle_cpu_ms: resources.idle_cpu_ms,
        round_cpu_ms: resources.round_cpu_ms,
        rss_kib: resources.rss_kib,
        pss_kib: resources.pss_kib,
        anon_kib: resources.anon_kib,
        threads: resources.threads,
    }
}

/// `to - from` in milliseconds, negative when `to` is earlier.
fn elapsed_ms(from_ns: u64, to_ns: u64) -> f64 {
    // i128 holds the difference of any two u64 without overflow.
    (i128::from(to_ns) - i128::from(from_ns)) as f64 / NS_PER_MS
}

/// `values` sorted ascending (NaNs, which no timestamp difference produces, sort last).
fn sorted_copy(values: &[f64]) -> Vec<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::sample::Phase;

    #[test]
    fn percentile_is_nearest_rank() {
        let ten: Vec<f64> = (1..=10).map(f64::from).collect();
        let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        // (slice, p, expected)
        let cases: &[(&[f64], f64, Option<f64>)] = &[
            (&[], 50.0, None),
            (&[7.0], 0.0, Some(7.0)),
            (&[7.0], 50.0, Some(7.0)),
            (&[7.0], 90.0, Some(7.0)),
            (&[7.0], 99.0, Some(7.0)),
            (&[7.0], 100.0, Some(7.0)),
            (&[1.0, 2.0], 0.0, Some(1.0)),
            (&[1.0, 2.0], 50.0, Some(1.0)),
            (&[1.0, 2.0], 90.0, Some(2.0)),
            (&[1.0, 2.0], 99.0, Some(2.0)),
            (&[1.0, 2.0], 100.0, Some(2.0)),
            (&ten, 0.0, Some(1.0)),
            (&ten, 50.0, Some(5.0)),
            (&ten, 90.0, Some(9.0)),
            (&ten, 99.0, Some(10.0)),
            (&ten, 100.0, Some(10.0)),
            (&hundred, 0.0, Some(1.0)),
            (&hundred, 50.0, Some(50.0)),
            (&hundred, 90.0, Some(90.0)),
            (&hundred, 99.0, Some(99.0)),
            (&hundred, 100.0, Some(100.0)),
            (&ten, -5.0, Some(1.0)),
            (&ten, 250.0, Some(10.0)),
            (&ten, f64::NAN, None),
        ];
        for (sorted, p, expected) in cases {
            assert_eq!(
                percentile(sorted, *p),
                *expected,
                "p{p} of {} elements",
                sorted.len()
            );
        }
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "ascending")]
    fn percentile_rejects_unsorted_input_in_debug_builds() {
        percentile(&[3.0, 1.0, 2.0], 50.0);
    }

    /// Values, and the CDF points expected of them.
    type CdfCase<'a> = (&'a [f64], &'a [(f64, f64)]);

    #[test]
    fn cdf_points_are_ascending_with_one_point_per_value() {
        let cases: &[CdfCase] = &[
            (&[], &[]),
            (&[5.0], &[(5.0, 1.0)]),
            (&[3.0, 1.0], &[(1.0, 0.5), (3.0, 1.0)]),
            (
                &[2.0, 1.0, 2.0, 4.0],
                &[(1.0, 0.25), (2.0, 0.5), (2.0, 0.75), (4.0, 1.0)],
            ),
            (&[-1.0, 0.0], &[(-1.0, 0.5), (0.0, 1.0)]),
        ];
        for (values, expected) in cases {
            assert_eq!(cdf_points(values), expected.to_vec(), "values {values:?}");
        }
    }

    #[test]
    fn ratio_refuses_what_it_cannot_divide() {
        let cases = [
            (10.0, 2.0, Some(5.0)),
            (0.0, 2.0, Some(0.0)),
            (-3.0, 2.0, Some(-1.5)),
            (10.0, 0.0, None),
            (0.0, 0.0, None),
            (10.0, -0.0, None),
            (f64::NAN, 2.0, None),
            (10.0, f64::NAN, None),
            (f64::INFINITY, 2.0, None),
            (10.0, f64::INFINITY, None),
            (10.0, f64::NEG_INFINITY, None),
        ];
        for (numerator, denominator, expected) in cases {
            assert_eq!(
                ratio(numerator, denominator),
                expected,
                "{numerator} / {denominator}"
            );
        }
    }

    const MS: u64 = 1_000_000;

    /// A sample of unit `unit` killed at `kill_ms`, every other time in ms after the kill.
    fn sample(
        unit: &str,
        kill_ms: u64,
        [cgroup, signal, event, poll]: [Option<u64>; 4],
    ) -> UnitSample {
        let after_kill = |ms: Option<u64>| ms.map(|ms| (kill_ms + ms) * MS);
        UnitSample {
            phase: Phase::Together,
            round: 0,
            unit: unit.to_owned(),
            t_kill_ns: kill_ms * MS,
            t_cgroup_ns: after_kill(cgroup),
            t_signal_ns: after_kill(signal),
            t_event_ns: after_kill(event),
            t_poll_ns: after_kill(poll),
        }
    }

    fn run(samples: Vec<UnitSample>, event: Resources, poll: Resources) -> BenchRun {
        BenchRun {
            units: 2,
            rounds: 2,
            mode: Mode::Together,
            kill_interval_ms: 0,
            seed: 42,
            poll_interval_ms: 1000,
            idle_ms: 5000,
            machine: "test machine".to_owned(),
            date: "2026-01-01".to_owned(),
            samples,
            event,
            poll,
            state_dir: None,
            agent_loop: None,
        }
    }

    #[test]
    fn summarize_has_the_agreed_json_shape_and_values() {
        let samples = vec![
            // Everything seen; the agent read the cgroup 1 ms before the bench's own inotify
            // and the signal, which gives a negative overhead.
            sample("a", 1000, [Some(3), Some(2), Some(2), Some(500)]),
            sample("b", 2000, [Some(4), Some(5), Some(7), Some(900)]),
            // No observer signal: no overhead for this sample, but the e2e counts.
            sample("a", 3000, [Some(1), None, Some(4), Some(700)]),
            // The agent missed it; the poller never proved anything here.
            sample("b", 4000, [Some(2), Some(3), None, None]),
        ];
        let event = Resources {
            idle_cpu_ms: 2.0,
            round_cpu_ms: 4.0,
            rss_kib: Some(3000),
            pss_kib: Some(2000),
            anon_kib: Some(1500),
            threads: Some(1),
            spawned_cpu_ms: None,
        };
        let poll = Resources {
            idle_cpu_ms: 500.0,
            round_cpu_ms: 80.0,
            rss_kib: None,
            pss_kib: None,
            anon_kib: None,
            threads: None,
            spawned_cpu_ms: Some(450.0),
        };
        let json = serde_json::to_value(summarize(&run(samples, event, poll)))
            .expect("a summary has only string keys");
        let expected = serde_json::json!({
            "units": 2,
            "rounds": 2,
            "mode": "together",
            "kill_interval_ms": 0,
            "seed": 42,
            "event": {
                "e2e_ms": {"p50": 4.0, "p90": 7.0, "p99": 7.0, "max": 7.0},
                "overhead_ms": {"p50": -1.0, "p99": 2.0, "max": 2.0},
                "idle_cpu_ms": 2.0,
                "round_cpu_ms": 4.0,
                "rss_kib": 3000,
                "pss_kib": 2000,
                "anon_kib": 1500,
                "threads": 1,
                "proven": 3,
                "missing": 1,
            },
            "poll": {
                "e2e_ms": {"p50": 700.0, "p90": 900.0, "p99": 900.0, "max": 900.0},
                "overhead_ms": {"p50": 497.0, "p99": 895.0, "max": 895.0},
                "idle_cpu_ms": 500.0,
                "round_cpu_ms": 80.0,
                "rss_kib": null,
                "pss_kib": null,
                "anon_kib": null,
                "threads": null,
                "spawned_cpu_ms": 450.0,
                "proven": 3,
                "missing": 1,
            },
            "systemd": {
                "e2e_ms": {"p50": 3.0, "p90": 5.0, "p99": 5.0, "max": 5.0},
                "proven": 3,
                "missing": 1,
            },
            "ratios": {
                "p50_e2e_poll_over_event": 175.0,
                "idle_cpu_poll_over_event": 250.0,
                // The agent's p50 (4 ms) over systemd's on the same units (3 ms).
                "p50_e2e_event_over_systemd": 4.0 / 3.0,
            },
            "agent_own_ms": null,
        });
        assert_eq!(json, expected);
    }

    #[test]
    fn the_agent_s_own_time_is_read_off_its_histogram_as_bucket_bounds() {
        let mut event_loop = LoopStats {
            proof_latency_max_us: 900,
            ..LoopStats::default()
        };
        // 98 proofs at most 50 us, one at most 200 us, one of 900 us past the last bound.
        let counts = [(Some(50), 98), (Some(200), 99), (None, 100)];
        event_loop.proof_latency.buckets = counts
            .iter()
            .map(|&(le_us, count)| crate::control::wire::Bucket { le_us, count })
            .collect();
        event_loop.proof_latency.count = 100;
        let own = OwnTime::of(&event_loop).expect("proofs were counted");
        assert_eq!(
            (own.proofs, own.p50_at_most, own.p99_at_most),
            (100, 0.05, 0.2)
        );
        assert_eq!(own.max, 0.9);
        assert_eq!(OwnTime::of(&LoopStats::default()), None);
    }

    #[test]
    fn summarize_gives_null_for_what_cannot_be_computed() {
        // The agent proved nothing and used no CPU; nothing else was observed either.
        let samples = vec![
            sample("a", 1000, [None, None, None, Some(800)]),
            sample("b", 1000, [None, None, None, Some(900)]),
        ];
        let poll = Resources {
            idle_cpu_ms: 40.0,
            ..Resources::default()
        };
        let json = serde_json::to_value(summarize(&run(samples, Resources::default(), poll)))
            .expect("a summary has only string keys");
        let cases = [
            ("/event/e2e_ms", serde_json::Value::Null),
            ("/event/overhead_ms", serde_json::Value::Null),
            ("/event/proven", 0.into()),
            ("/event/missing", 2.into()),
            ("/poll/e2e_ms/p50", 800.0.into()),
            ("/poll/overhead_ms", serde_json::Value::Null),
            ("/poll/spawned_cpu_ms", serde_json::Value::Null),
            ("/systemd/e2e_ms", serde_json::Value::Null),
            ("/systemd/missing", 2.into()),
            ("/ratios/p50_e2e_poll_over_event", serde_json::Value::Null),
            ("/ratios/idle_cpu_poll_over_event", serde_json::Value::Null),
            (
                "/ratios/p50_e2e_event_over_systemd",
                serde_json::Value::Null,
            ),
        ];
        for (pointer, expected) in cases {
            assert_eq!(json.pointer(pointer), Some(&expected), "{pointer}");
        }
    }

    #[test]
    fn in_separate_phases_each_contender_counts_its_own_units() {
        let in_phase = |phase, sample: UnitSample| UnitSample { phase, ..sample };
        let samples = vec![
            in_phase(
                Phase::Event,
                sample("a", 0, [Some(1), Some(2), Some(3), None]),
            ),
            in_phase(Phase::Event, sample("b", 0, [Some(1), Some(4), None, None])),
            in_phase(
                Phase::Poll,
                sample("c", 0, [Some(8), Some(9), None, Some(400)]),
            ),
        ];
        let summary = summarize(&BenchRun {
            mode: Mode::Separate,
            kill_interval_ms: 20,
            ..run(samples, Resources::default(), Resources::default())
        });
        let counts = |latency: &Latency| (latency.proven, latency.missing);
        assert_eq!(counts(&summary.event.latency), (1, 1));
        assert_eq!(counts(&summary.poll.contender.latency), (1, 0));
        assert_eq!(counts(&summary.systemd), (3, 0));
        assert_eq!(summary.systemd.e2e_ms.map(|q| q.max), Some(9.0));
        // systemd's floor under the agent comes from the agent's units alone (2 and 4 ms).
        assert_eq!(summary.ratios.p50_e2e_event_over_systemd, Some(1.5));
        assert_eq!(
            (summary.mode, summary.kill_interval_ms),
            (Mode::Separate, 20)
        );
    }

    #[test]
    fn summarize_an_empty_run() {
        let summary = summarize(&run(Vec::new(), Resources::default(), Resources::default()));
        assert_eq!(summary.event.latency.proven, 0);
        assert_eq!(summary.event.latency.missing, 0);
        assert_eq!(summary.systemd.e2e_ms, None);
        assert_eq!(summary.ratios.p50_e2e_poll_over_event, None);
    }
}
