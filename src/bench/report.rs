//! The benchmark's reports: `bench.json` (every raw sample plus the summary), `bench.md` (a
//! table a person reads) and `latency.svg` (the latency distributions, plotted).
//!
//! It only formats what [`stats`](super::stats) computed: it must never compute a statistic
//! of its own, nor measure anything.

use std::fmt;
use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};

use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor;
use serde::Serialize;

use super::sample::{BenchRun, Mode};
use super::stats::{self, Contender, ContenderSummary, Latency, Summary};

/// What went wrong while producing a report.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A report file or its directory could not be written.
    #[error("write {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    /// `bench.json` could not be encoded.
    #[error("encode bench.json: {source}")]
    Json { source: serde_json::Error },
    /// The latency plot could not be drawn.
    #[error("draw the latency plot: {message}")]
    Plot { message: String },
}

/// What `bench.json` holds.
#[derive(Serialize)]
struct BenchJson<'a> {
    summary: &'a Summary,
    run: &'a BenchRun,
}

/// `{"summary": Summary, "run": BenchRun}`: what `bench.json` holds, every raw sample plus
/// the summary computed from them. Non-finite numbers in `run` become `null`.
pub fn summary_json(run: &BenchRun) -> serde_json::Value {
    bench_json(run, &stats::summarize(run))
}

fn bench_json(run: &BenchRun, summary: &Summary) -> serde_json::Value {
    serde_json::to_value(BenchJson { summary, run })
        // Encoding into a Value fails only for maps with non-string keys, and these types
        // have none.
        .expect("bench.json has no map with non-string keys")
}

/// Shown in a table cell for a figure that was not measured or does not apply.
const NONE: &str = "—";

/// `bench.md`: one row per contender, then the ratios, then how and where it ran.
pub fn render_markdown(run: &BenchRun, summary: &Summary) -> String {
    let mut md = String::new();
    // Writing to a String cannot fail, so the fmt::Results below are ignored on purpose.
    let _ = writeln!(
        md,
        "# exitproof benchmark: time to prove every process of a killed unit gone\n"
    );
    let _ = writeln!(
        md,
        "| contender | proven | missing | e2e p50 (ms) | e2e p90 (ms) | e2e p99 (ms) \
         | e2e max (ms) | overhead p50 (ms) | overhead p99 (ms) | overhead max (ms) \
         | idle CPU (ms) | round CPU (ms) | peak RSS (KiB) | PSS (KiB) | anon (KiB) | threads |"
    );
    let _ = writeln!(md, "|---{}|", "|---:".repeat(15));
    markdown_row(
        &mut md,
        Contender::Event,
        &summary.event.latency,
        Some(&summary.event),
    );
    markdown_row(
        &mut md,
        Contender::Poll,
        &summary.poll.contender.latency,
        Some(&summary.poll.contender),
    );
    markdown_row(&mut md, Contender::Systemd, &summary.systemd, None);
    let _ = writeln!(
        md,
        "\n{NONE}: not measured, or not applicable. *proven*, *missing*: of the units the \
         contender watched (in separate phases, each watched its own; systemd's signal is \
         observed on all). *e2e*: from the write to the unit's `cgroup.kill` to the \
         contender's proof. *overhead*: from the later of the bench's own \
         two observations (its inotify on `cgroup.events` and its D-Bus signal) to the \
         contender's proof; negative when the contender read the cgroup before the bench's \
         inotify fired. Quantiles are nearest-rank. *peak RSS*: the most ever resident; \
         *PSS* (shared pages divided among the processes mapping them) and *anon* (heap, \
         stacks): at the end of the rounds."
    );
    let spawned = summary.poll.spawned_cpu_ms.map_or_else(
        || "not measured".to_owned(),
        |ms| format!("{} ms", fmt_ms(ms)),
    );
    let _ = writeln!(
        md,
        "\npoll's CPU figures include the `systemctl` processes it spawned ({spawned} over the \
         idle window and the kill rounds together)."
    );

    let _ = writeln!(md, "\n## poll over event\n");
    let p50_ratio = summary.ratios.p50_e2e_poll_over_event.map_or_else(
        || {
            if summary.event.latency.e2e_ms.is_none()
                || summary.poll.contender.latency.e2e_ms.is_none()
            {
                "n/a (a contender proved no unit)".to_owned()
            } else {
                "n/a (event's median is 0 ms)".to_owned()
            }
        },
        fmt_ratio,
    );
    let idle_ratio = summary.ratios.idle_cpu_poll_over_event.map_or_else(
        || {
            if summary.event.idle_cpu_ms == 0.0 {
                "n/a (event used no measurable CPU)".to_owned()
            } else {
                "n/a (a CPU figure is not a number)".to_owned()
            }
        },
        fmt_ratio,
    );
    let _ = writeln!(md, "- median end-to-end latency: {p50_ratio}");
    let _ = writeln!(md, "- CPU while idle: {idle_ratio}");
    let floor_ratio = summary.ratios.p50_e2e_event_over_systemd.map_or_else(
        || "n/a (no proof, or no signal, on the agent's units)".to_owned(),
        fmt_ratio,
    );
    let _ = writeln!(
        md,
        "\n## event over systemd's own signal, on the agent's units\n\n- median end-to-end \
         latency: {floor_ratio}"
    );

    own_time_section(&mut md, run, summary);

    let _ = writeln!(md, "\n## run\n");
    let _ = writeln!(md, "- units: {}", run.units);
    let _ = writeln!(md, "- rounds: {}", run.rounds);
    let _ = writeln!(md, "- mode: {}", mode_words(run));
    let _ = writeln!(md, "- kills: {} (seed {})", kill_words(run), run.seed);
    let _ = writeln!(md, "- poll interval: {} ms", run.poll_interval_ms);
    let _ = writeln!(md, "- idle window: {} ms", run.idle_ms);
    let _ = writeln!(
        md,
        "- the agent's state: {}",
        run.state_dir
            .as_deref()
            .unwrap_or("in the bench's temporary directory")
    );
    let _ = writeln!(md, "- machine: {}", run.machine);
    let _ = writeln!(md, "- date: {}", run.date);
    md
}

/// The agent's own time per proof and its slowest turns, from its `stats` (`loop`).
fn own_time_section(md: &mut String, run: &BenchRun, summary: &Summary) {
    let _ = writeln!(
        md,
        "\n## the agent's own time per proof (its `stats`)\n\nFrom the loop's receipt of \
         what decided a proof (its wake from `epoll_wait`) to the proof written to its \
         subscribers (the last write counted by its own CPU time); p50 and p99 are the upper \
         bounds of the histogram's buckets that hold them.\n"
    );
    let (Some(own), Some(event_loop)) = (summary.agent_own_ms, &run.agent_loop) else {
        let _ = writeln!(md, "- not taken");
        return;
    };
    let _ = writeln!(
        md,
        "- {} proofs: p50 ≤ {} ms, p99 ≤ {} ms, max {} ms",
        own.proofs,
        fmt_ms(own.p50_at_most),
        fmt_ms(own.p99_at_most),
        fmt_ms(own.max)
    );
    let work = &event_loop.work;
    let _ = writeln!(
        md,
        "- {} turns, {} ms of them on a CPU, {} page faults, {} preemptions: {} saves ({} ms), \
         {} syncs ({} ms), {} cgroup reads ({} ms), {} heap trims ({} ms); leftover counts {} \
         ms, the bus {} ms, the rules {} ms, telling clients {} ms, log lines {} ms",
        event_loop.turns,
        fmt_ms(work.cpu_us as f64 / 1000.0),
        work.minor_faults,
        work.preemptions,
        work.saves,
        fmt_ms(work.save_us as f64 / 1000.0),
        work.syncs,
        fmt_ms(work.sync_us as f64 / 1000.0),
        work.cgroup_reads,
        fmt_ms(work.cgroup_read_us as f64 / 1000.0),
        work.trims,
        fmt_ms(work.trim_us as f64 / 1000.0),
        fmt_ms(work.census_us as f64 / 1000.0),
        fmt_ms(work.bus_us as f64 / 1000.0),
        fmt_ms(work.rules_us as f64 / 1000.0),
        fmt_ms(work.tell_us as f64 / 1000.0),
        fmt_ms(work.log_us as f64 / 1000.0),
    );
    for (title, slow) in [
        (
            "slowest proofs (the work of their turn before them)",
            &event_loop.slowest_proofs,
        ),
        ("slowest turns", &event_loop.slowest_turns),
    ] {
        let _ = writeln!(
            md,
            "\n{title}:\n\n| at (CLOCK_MONOTONIC ms) | took (ms) | on a CPU (ms) | page \
             faults | preemptions | inputs | proofs | saves (ms) | syncs (ms) | cgroup reads \
             (ms) | trims (ms) | counts, bus, rules, telling, logs (ms) |\n\
             |---:|---:|---:|---:|---:|---:|---:|---|---|---|---|---|"
        );
        for turn in slow {
            let w = &turn.work;
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} ({}) | {} ({}) | {} ({}) | {} ({}) | \
                 {}, {}, {}, {}, {} |",
                turn.at_mono_ns / 1_000_000,
                fmt_ms(turn.us as f64 / 1000.0),
                fmt_ms(w.cpu_us as f64 / 1000.0),
                w.minor_faults,
                w.preemptions,
                w.inputs,
                w.proofs,
                w.saves,
                fmt_ms(w.save_us as f64 / 1000.0),
                w.syncs,
                fmt_ms(w.sync_us as f64 / 1000.0),
                w.cgroup_reads,
                fmt_ms(w.cgroup_read_us as f64 / 1000.0),
                w.trims,
                fmt_ms(w.trim_us as f64 / 1000.0),
                fmt_ms(w.census_us as f64 / 1000.0),
                fmt_ms(w.bus_us as f64 / 1000.0),
                fmt_ms(w.rules_us as f64 / 1000.0),
                fmt_ms(w.tell_us as f64 / 1000.0),
                fmt_ms(w.log_us as f64 / 1000.0),
            );
        }
    }
}

/// How the contenders shared the run, in words.
fn mode_words(run: &BenchRun) -> &'static str {
    match run.mode {
        Mode::Separate => "separate phases",
        Mode::Together => "together",
    }
}

/// The kill schedule, in words.
fn kill_words(run: &BenchRun) -> String {
    match run.kill_interval_ms {
        0 => "all at once".to_owned(),
        ms => format!("one every {ms} ms"),
    }
}

/// One contender's table row; `costs` is `None` for systemd, which has no proof of its own.
fn markdown_row(
    md: &mut String,
    contender: Contender,
    latency: &Latency,
    costs: Option<&ContenderSummary>,
) {
    let e2e = latency.e2e_ms;
    let overhead = costs.and_then(|costs| costs.overhead_ms);
    let cells = [
        latency.proven.to_string(),
        latency.missing.to_string(),
        opt_ms(e2e.map(|q| q.p50)),
        opt_ms(e2e.map(|q| q.p90)),
        opt_ms(e2e.map(|q| q.p99)),
        opt_ms(e2e.map(|q| q.max)),
        opt_ms(overhead.map(|o| o.p50)),
        opt_ms(overhead.map(|o| o.p99)),
        opt_ms(overhead.map(|o| o.max)),
        opt_ms(costs.map(|costs| costs.idle_cpu_ms)),
        opt_ms(costs.map(|costs| costs.round_cpu_ms)),
        opt_count(costs.and_then(|costs| costs.rss_kib)),
        opt_count(costs.and_then(|costs| costs.pss_kib)),
        opt_count(costs.and_then(|costs| costs.anon_kib)),
        opt_count(costs.and_then(|costs| costs.threads)),
    ];
    let _ = writeln!(md, "| {} | {} |", contender.name(), cells.join(" | "));
}

/// Milliseconds with 3 decimals below 10 ms, 1 above: microseconds matter only for small values.
fn fmt_ms(ms: f64) -> String {
    if ms.abs() < 10.0 {
        format!("{ms:.3}")
    } else {
        format!("{ms:.1}")
    }
}

fn opt_ms(ms: Option<f64>) -> String {
    ms.map_or_else(|| NONE.to_owned(), fmt_ms)
}

fn opt_count(count: Option<u64>) -> String {
    count.map_or_else(|| NONE.to_owned(), |count| count.to_string())
}

fn fmt_ratio(ratio: f64) -> String {
    if ratio.abs() < 10.0 {
        format!("{ratio:.2}×")
    } else {
        format!("{ratio:.1}×")
    }
}

/// Size of `latency.svg`, in pixels.
const SVG_SIZE: (u32, u32) = (1000, 620);

/// One contender's curve, ready to draw.
struct Curve {
    contender: Contender,
    /// Proven samples, including those not drawn.
    proven: usize,
    /// Samples of the contender's phases.
    watched: usize,
    /// The drawable points `(latency ms > 0, fraction of all samples proven by then)`.
    points: Vec<(f64, f64)>,
    /// The fraction proven at latencies <= 0 ms, which a log axis cannot show.
    fraction_before: f64,
}

/// `latency.svg`: the cumulative distribution of end-to-end latency per contender, on a log
/// x axis in ms.
///
/// The y value at latency `x` is the fraction of ALL the contender's samples (the units
/// killed in its phases, over every round) that it had proved gone within `x`, so a contender
/// that missed units never reaches 1. Contenders with no samples are left out and named in the subtitle; so is
/// the count of latencies <= 0 ms, which a log axis cannot draw. The x axis runs from half
/// the smallest drawn latency to twice the largest, widened down to a power of ten if it held
/// none, so that the axis always has a labelled tick.
pub fn render_svg(run: &BenchRun) -> Result<String, ReportError> {
    let mut curves = Vec::new();
    let mut not_plotted = Vec::new();
    let mut non_positive = 0;
    for contender in Contender::ALL {
        let e2e = stats::e2e_ms(&run.samples, contender);
        let watched = stats::watched_count(&run.samples, contender);
        // Scaling the CDF by proven / watched turns it into the fraction of all its samples.
        let scale = e2e.len() as f64 / watched.max(1) as f64;
        let (before, points): (Vec<_>, Vec<_>) = stats::cdf_points(&e2e)
            .into_iter()
            .map(|(ms, fraction)| (ms, fraction * scale))
            .partition(|&(ms, _)| ms <= 0.0);
        non_positive += before.len();
        if points.is_empty() {
            not_plotted.push(contender.name());
            continue;
        }
        curves.push(Curve {
            contender,
            proven: e2e.len(),
            watched,
            points,
            fraction_before: before.last().map_or(0.0, |&(_, fraction)| fraction),
        });
    }

    let mut notes = Vec::new();
    if !not_plotted.is_empty() {
        notes.push(format!("no latency to plot: {}", not_plotted.join(", ")));
    }
    if non_positive > 0 {
        let latencies = if non_positive == 1 {
            "latency"
        } else {
            "latencies"
        };
        notes.push(format!(
            "{non_positive} {latencies} <= 0 ms not drawn (log axis)"
        ));
    }
    let title = format!(
        "time to prove a killed unit gone: {} units × {} rounds, {}, {}",
        run.units,
        run.rounds,
        mode_words(run),
        kill_words(run)
    );

    let mut svg = String::new();
    draw_cdf(&mut svg, &title, &notes.join("; "), &curves)?;
    Ok(svg)
}

/// Height of one legend row under the plot, in pixels.
const LEGEND_ROW: u32 = 24;
/// Where legend rows start, in pixels from the left: under the plot's y axis.
const LEGEND_LEFT: i32 = 90;

/// Draws `curves` into `svg`, with the legend in a strip under the plot, where it can hide
/// no curve whatever their shape.
fn draw_cdf(
    svg: &mut String,
    title: &str,
    notes: &str,
    curves: &[Curve],
) -> Result<(), ReportError> {
    let root = SVGBackend::with_string(svg, SVG_SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let mut area = root.titled(title, ("sans-serif", 24)).map_err(plot_error)?;
    if !notes.is_empty() {
        area = area
            .titled(notes, ("sans-serif", 16).into_font().color(&RED))
            .map_err(plot_error)?;
    }
    let legend_height = LEGEND_ROW * curves.len() as u32;
    let (plot_area, legend_area) = area.split_vertically(area.dim_in_pixel().1 - legend_height);

    let (low, high) = x_range(curves);
    // A little headroom above 1 keeps the curves' plateaus off the frame's top edge.
    let mut chart = ChartBuilder::on(&plot_area)
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d((low..high).log_scale(), 0.0..1.02)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("end-to-end latency (ms, log scale)")
        .y_desc("fraction of units proven")
        .x_label_formatter(&|ms| axis_ms(*ms))
        .y_label_formatter(&|fraction| format!("{fraction:.1}"))
        .axis_desc_style(("sans-serif", 18))
        .label_style(("sans-serif", 15))
        .draw()
        .map_err(plot_error)?;

    let label_style = TextStyle::from(("sans-serif", 16).into_font()).pos(text_anchor::Pos::new(
        text_anchor::HPos::Left,
        text_anchor::VPos::Center,
    ));
    for (row, curve) in curves.iter().enumerate() {
        let style = curve_style(curve.contender);
        let steps = step_points(curve, high);
        let y = (LEGEND_ROW as i32) * (row as i32) + LEGEND_ROW as i32 / 2;
        let sample = vec![(LEGEND_LEFT, y), (LEGEND_LEFT + 36, y)];
        // systemd is dashed: it is the floor, and it often lies right on the agent's curve.
        if curve.contender == Contender::Systemd {
            chart
                .draw_series(DashedLineSeries::new(steps, 8, 5, style))
                .map_err(plot_error)?;
            legend_area
                .draw(&DashedPathElement::new(sample, 8, 5, style))
                .map_err(plot_error)?;
        } else {
            chart
                .draw_series(LineSeries::new(steps, style))
                .map_err(plot_error)?;
            legend_area
                .draw(&PathElement::new(sample, style))
                .map_err(plot_error)?;
        }
        let label = format!(
            "{} ({} of {} proven)",
            curve_name(curve.contender),
            curve.proven,
            curve.watched
        );
        legend_area
            .draw(&Text::new(label, (LEGEND_LEFT + 46, y), &label_style))
            .map_err(plot_error)?;
    }
    root.present().map_err(plot_error)
}

/// The legend name of a contender: its `bench.json` name first, then what it is.
fn curve_name(contender: Contender) -> String {
    let what = match contender {
        Contender::Event => "exitproof agent",
        Contender::Poll => "systemctl show per unit per interval",
        Contender::Systemd => "systemd's D-Bus signal",
    };
    format!("{}: {what}", contender.name())
}

fn curve_style(contender: Contender) -> ShapeStyle {
    let color = match contender {
        Contender::Event => BLUE,
        Contender::Poll => RED,
        Contender::Systemd => BLACK,
    };
    color.stroke_width(2)
}

/// The staircase through `curve`'s points, running on flat to `right_edge` so that a
/// contender that missed units shows where it stopped.
fn step_points(curve: &Curve, right_edge: f64) -> Vec<(f64, f64)> {
    let mut steps = Vec::with_capacity(curve.points.len() * 2 + 1);
    let mut below = curve.fraction_before;
    for &(ms, fraction) in &curve.points {
        steps.push((ms, below));
        steps.push((ms, fraction));
        below = fraction;
    }
    steps.push((right_edge, below));
    steps
}

/// The x axis range in ms: see [`render_svg`].
fn x_range(curves: &[Curve]) -> (f64, f64) {
    let drawn = curves
        .iter()
        .flat_map(|curve| &curve.points)
        .map(|&(ms, _)| ms);
    let smallest = drawn.clone().fold(f64::INFINITY, f64::min);
    let largest = drawn.fold(0.0, f64::max);
    if !smallest.is_finite() {
        // Nothing to draw: any decent range will do for an empty frame.
        return (0.1, 10_000.0);
    }
    let (low, high) = (smallest / 2.0, largest * 2.0);
    // plotters labels only powers of ten on a log axis.
    let decade_below_high = 10f64.powf(high.log10().floor());
    (low.min(decade_below_high), high)
}

/// An x axis label: milliseconds without trailing zeros (0.01, 1, 1000).
fn axis_ms(ms: f64) -> String {
    let text = format!("{ms:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn plot_error(error: impl fmt::Display) -> ReportError {
    ReportError::Plot {
        message: error.to_string(),
    }
}

/// Writes `bench.json`, `bench.md` and `latency.svg` into `dir`, creating it if missing.
pub fn write_reports(dir: &Path, run: &BenchRun) -> Result<(), ReportError> {
    std::fs::create_dir_all(dir).map_err(|source| ReportError::Io {
        path: dir.to_owned(),
        source,
    })?;
    let summary = stats::summarize(run);
    let mut json = serde_json::to_string_pretty(&bench_json(run, &summary))
        .map_err(|source| ReportError::Json { source })?;
    json.push('\n');
    let svg = render_svg(run)?;
    let files = [
        ("bench.json", json),
        ("bench.md", render_markdown(run, &summary)),
        ("latency.svg", svg),
    ];
    for (name, contents) in files {
        let path = dir.join(name);
        std::fs::write(&path, contents).map_err(|source| ReportError::Io { path, source })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::sample::{Phase, Resources, UnitSample};

    const MS: u64 = 1_000_000;

    /// A run of `units` units over `rounds` rounds with plausible, deterministic latencies
    /// (systemd ~1 ms, the agent a little later, the poller up to a poll interval later);
    /// `keep` decides which contenders proved which sample.
    fn run(units: usize, rounds: u32, keep: impl Fn(Contender, usize) -> bool) -> BenchRun {
        // A small linear congruential generator: the same "noise" on every run.
        let mut state: u64 = 0x2545_f491_4f6c_dd1d;
        let mut noise = move || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) as f64 / (1u64 << 31) as f64
        };
        let mut samples = Vec::new();
        for round in 0..rounds {
            for unit in 0..units {
                let index = samples.len();
                let kill = (u64::from(round) * 10_000 + unit as u64) * MS;
                let signal = kill + ((0.6 + 2.0 * noise()) * MS as f64) as u64;
                let cgroup = kill + ((0.5 + 2.0 * noise()) * MS as f64) as u64;
                let event = signal.max(cgroup) + ((0.05 + 0.5 * noise()) * MS as f64) as u64;
                let poll = cgroup + ((1000.0 * noise()) * MS as f64) as u64;
                let when = |contender, at| keep(contender, index).then_some(at);
                samples.push(UnitSample {
                    phase: Phase::Together,
                    round,
                    unit: format!("bench-{unit}.service"),
                    t_kill_ns: kill,
                    t_cgroup_ns: Some(cgroup),
                    t_signal_ns: when(Contender::Systemd, signal),
                    t_event_ns: when(Contender::Event, event),
                    t_poll_ns: when(Contender::Poll, poll),
                });
            }
        }
        BenchRun {
            units,
            rounds,
            mode: Mode::Together,
            kill_interval_ms: 0,
            seed: 3,
            poll_interval_ms: 1000,
            idle_ms: 10_000,
            machine: "test box, 2 cores".to_owned(),
            date: "2026-05-01".to_owned(),
            samples,
            event: Resources {
                idle_cpu_ms: 0.0,
                round_cpu_ms: 12.5,
                rss_kib: Some(4100),
                pss_kib: Some(2900),
                anon_kib: Some(1800),
                threads: Some(1),
                spawned_cpu_ms: None,
            },
            poll: Resources {
                idle_cpu_ms: 2400.0,
                round_cpu_ms: 3100.25,
                rss_kib: None,
                pss_kib: None,
                anon_kib: None,
                threads: None,
                spawned_cpu_ms: Some(5000.0),
            },
            state_dir: None,
            agent_loop: None,
        }
    }

    fn everything(_: Contender, _: usize) -> bool {
        true
    }

    #[test]
    fn markdown_has_a_row_per_contender_and_the_ratios() {
        let mut run = run(10, 2, |contender, index| {
            !(contender == Contender::Poll && index == 0)
        });
        run.event.idle_cpu_ms = 3.0;
        let summary = stats::summarize(&run);
        let md = render_markdown(&run, &summary);
        let row = |name: &str| {
            md.lines()
                .find(|line| line.starts_with(&format!("| {name} |")))
                .unwrap_or_else(|| panic!("no {name} row in:\n{md}"))
                .to_owned()
        };
        let expected_starts = [
            ("event", "| event | 20 | 0 | "),
            ("poll", "| poll | 19 | 1 | "),
            ("systemd", "| systemd | 20 | 0 | "),
        ];
        for (name, start) in expected_starts {
            assert!(row(name).starts_with(start), "{}", row(name));
        }
        let cases = [
            ("| 3.000 | 12.5 | 4100 | 2900 | 1800 | 1 |", row("event")),
            ("| 2400.0 | 3100.2 | — | — | — | — |", row("poll")),
            ("| — | — | — | — | — | — | — | — | — |", row("systemd")),
        ];
        for (wanted, row) in cases {
            assert!(row.ends_with(wanted), "{row} does not end with {wanted}");
        }
        let ratio = summary
            .ratios
            .p50_e2e_poll_over_event
            .expect("both contenders proved units");
        for wanted in [
            format!("- median end-to-end latency: {}", fmt_ratio(ratio)),
            "- CPU while idle: 800.0×".to_owned(),
            "5000.0 ms over the idle window".to_owned(),
            "- units: 10".to_owned(),
            "- rounds: 2".to_owned(),
            "- mode: together".to_owned(),
            "- kills: all at once (seed 3)".to_owned(),
            "## event over systemd's own signal, on the agent's units".to_owned(),
            "- poll interval: 1000 ms".to_owned(),
            "- idle window: 10000 ms".to_owned(),
            "- machine: test box, 2 cores".to_owned(),
            "- date: 2026-05-01".to_owned(),
        ] {
            assert!(md.contains(&wanted), "no {wanted:?} in:\n{md}");
        }
    }

    #[test]
    fn markdown_explains_ratios_it_cannot_give() {
        let run = run(3, 1, |contender, _| contender != Contender::Event);
        let md = render_markdown(&run, &stats::summarize(&run));
        for wanted in [
            "- median end-to-end latency: n/a (a contender proved no unit)",
            "- CPU while idle: n/a (event used no measurable CPU)",
        ] {
            assert!(md.contains(wanted), "no {wanted:?} in:\n{md}");
        }
    }

    #[test]
    fn numbers_have_sensible_precision() {
        let cases = [
            (0.0, "0.000"),
            (1.23456, "1.235"),
            (9.9994, "9.999"),
            (10.0, "10.0"),
            (1234.56, "1234.6"),
            (-0.5, "-0.500"),
            (-12.34, "-12.3"),
        ];
        for (ms, expected) in cases {
            assert_eq!(fmt_ms(ms), expected, "{ms}");
        }
        let axis_cases = [(0.01, "0.01"), (1.0, "1"), (1000.0, "1000"), (0.5, "0.5")];
        for (ms, expected) in axis_cases {
            assert_eq!(axis_ms(ms), expected, "{ms}");
        }
    }

    /// Parses `svg` as XML and returns every text it draws.
    fn svg_texts(svg: &str) -> Vec<String> {
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
        let document = roxmltree::Document::parse(svg).expect("latency.svg is well-formed XML");
        document
            .descendants()
            .filter(|node| node.has_tag_name("text"))
            .filter_map(|node| node.text().map(|text| text.trim().to_owned()))
            .collect()
    }

    /// Fails unless `texts` has every one of `wanted`.
    fn assert_draws(texts: &[String], wanted: &[&str]) {
        for wanted in wanted {
            assert!(
                texts.iter().any(|text| text == wanted),
                "no {wanted:?} in {texts:?}"
            );
        }
    }

    #[test]
    fn svg_is_well_formed_with_axes_title_and_legend() {
        let svg = render_svg(&run(100, 5, everything)).expect("the plot draws");
        let texts = svg_texts(&svg);
        let wanted = [
            "end-to-end latency (ms, log scale)",
            "fraction of units proven",
            "time to prove a killed unit gone: 100 units × 5 rounds, together, all at once",
            "event: exitproof agent (500 of 500 proven)",
            "poll: systemctl show per unit per interval (500 of 500 proven)",
            "systemd: systemd's D-Bus signal (500 of 500 proven)",
        ];
        assert_draws(&texts, &wanted);
        assert!(
            texts.iter().any(|text| text == "1"),
            "no 1 ms tick in {texts:?}"
        );
        assert!(
            !texts
                .iter()
                .any(|text| text.contains("not drawn") || text.contains("no latency"))
        );
    }

    #[test]
    fn in_separate_phases_each_contender_is_drawn_over_its_own_units() {
        let mut run = run(4, 1, everything);
        run.mode = Mode::Separate;
        run.kill_interval_ms = 20;
        for (index, sample) in run.samples.iter_mut().enumerate() {
            sample.phase = if index < 3 { Phase::Event } else { Phase::Poll };
        }
        let texts = svg_texts(&render_svg(&run).expect("the plot draws"));
        let wanted = [
            "time to prove a killed unit gone: 4 units × 1 rounds, separate phases, one every 20 ms",
            "event: exitproof agent (3 of 3 proven)",
            "poll: systemctl show per unit per interval (1 of 1 proven)",
            "systemd: systemd's D-Bus signal (4 of 4 proven)",
        ];
        assert_draws(&texts, &wanted);
        let md = render_markdown(&run, &stats::summarize(&run));
        for wanted in [
            "| event | 3 | 0 |",
            "| poll | 1 | 0 |",
            "- mode: separate phases",
            "- kills: one every 20 ms (seed 3)",
        ] {
            assert!(md.contains(wanted), "no {wanted:?} in:\n{md}");
        }
    }

    #[test]
    fn svg_names_what_it_could_not_draw() {
        let mut run = run(4, 1, |contender, _| contender != Contender::Poll);
        // The agent "proved" one unit before the kill, which a log axis cannot show.
        run.samples[0].t_event_ns = Some(run.samples[0].t_kill_ns);
        let texts = svg_texts(&render_svg(&run).expect("the plot draws"));
        let notes = "no latency to plot: poll; 1 latency <= 0 ms not drawn (log axis)";
        assert!(
            texts.iter().any(|text| text == notes),
            "no notes in {texts:?}"
        );
        assert!(
            !texts.iter().any(|text| text.starts_with("poll:")),
            "{texts:?}"
        );
    }

    #[test]
    fn svg_of_a_run_without_samples_still_draws() {
        let texts = svg_texts(&render_svg(&run(0, 0, everything)).expect("the plot draws"));
        let notes = "no latency to plot: event, poll, systemd";
        assert!(
            texts.iter().any(|text| text == notes),
            "no notes in {texts:?}"
        );
    }

    #[test]
    fn x_range_is_half_the_smallest_to_twice_the_largest() {
        let curve = |points: Vec<(f64, f64)>| Curve {
            contender: Contender::Event,
            proven: points.len(),
            watched: points.len(),
            points,
            fraction_before: 0.0,
        };
        let cases = [
            (vec![vec![(1.0, 0.5), (500.0, 1.0)]], (0.5, 1000.0)),
            (vec![vec![(2.0, 1.0)], vec![(40.0, 1.0)]], (1.0, 80.0)),
            // 2..8 holds no power of ten: widened down to 1.
            (vec![vec![(4.0, 1.0)]], (1.0, 8.0)),
            (vec![], (0.1, 10_000.0)),
        ];
        for (points, expected) in cases {
            let curves: Vec<Curve> = points.into_iter().map(curve).collect();
            assert_eq!(x_range(&curves), expected);
        }
    }

    #[test]
    fn write_reports_writes_all_three_files() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let reports = dir.path().join("not/yet/there");
        let run = run(5, 3, everything);
        write_reports(&reports, &run).expect("the reports are written");
        let json: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(reports.join("bench.json")).expect("bench.json"),
        )
        .expect("bench.json is JSON");
        // Compared as parsed back from text: serde_json's parser may differ from the float it
        // printed in the last bit.
        let expected: serde_json::Value =
            serde_json::from_str(&summary_json(&run).to_string()).expect("JSON");
        assert_eq!(json, expected);
        assert_eq!(json.pointer("/summary/event/proven"), Some(&15.into()));
        let samples = json.pointer("/run/samples").and_then(|s| s.as_array());
        assert_eq!(samples.map(Vec::len), Some(15));
        let md = std::fs::read_to_string(reports.join("bench.md")).expect("bench.md");
        assert!(md.contains("| event | 15 | 0 |"), "{md}");
        let svg = std::fs::read_to_string(reports.join("latency.svg")).expect("latency.svg");
        assert!(svg.starts_with("<svg"));
    }
}
