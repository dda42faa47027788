//! The metrics file (`--metrics-file`): the agent's figures in the Prometheus text exposition
//! format, for node_exporter's textfile collector, replaced atomically. It is refreshed from a
//! timer of the loop, at most once per [`REFRESH_INTERVAL`] and only after something happened,
//! so an idle agent is never woken for it.

use std::fmt::Write as _;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::{self, OFlag};
use nix::sys::stat::Mode;

use crate::control::wire::{AgentStats, Cause, LatencySummary, Phase};

use crate::atomic_file;

/// The least time between two refreshes of the file.
pub(super) const REFRESH_INTERVAL: Duration = Duration::from_secs(5);
/// Readable by node_exporter, whatever user it runs as.
const FILE_MODE: u32 = 0o644;

/// Renders `stats` in the Prometheus text exposition format (version 0.0.4).
pub(super) fn render(stats: &AgentStats) -> String {
    let core = &stats.core;
    let mut out = String::new();
    let watches = [
        (Phase::Watching.name(), core.watches.watching),
        (Phase::Stopping.name(), core.watches.stopping),
        (Phase::Proven.name(), core.watches.proven),
    ];
    family(
        &mut out,
        "exitproof_watches",
        "gauge",
        "Watched units by phase (proven ones are retained for a while).",
        labelled("phase", watches),
    );
    family(
        &mut out,
        "exitproof_units_blocked",
        "gauge",
        "Units terminal for systemd whose cgroup still holds processes.",
        [(String::new(), core.blocked)],
    );
    let proofs = [
        (Cause::Exited.name(), core.proofs.exited),
        (
            Cause::ReplacedAfterStop.name(),
            core.proofs.replaced_after_stop,
        ),
        (
            Cause::RestartedOutside.name(),
            core.proofs.restarted_outside,
        ),
        (Cause::Rebooted.name(), core.proofs.rebooted),
    ];
    family(
        &mut out,
        "exitproof_proofs_total",
        "counter",
        "Proofs made since the agent started, by cause.",
        labelled("cause", proofs),
    );
    let counters = [
        (
            "exitproof_resyncs_total",
            "Safety-net relists of every watched unit.",
            core.resyncs,
        ),
        (
            "exitproof_bus_reconnects_total",
            "Connections to the bus taken into use after the first.",
            stats.bus_reconnects,
        ),
        (
            "exitproof_inotify_overflows_total",
            "Times the kernel dropped inotify events.",
            stats.inotify.overflows,
        ),
        (
            "exitproof_journald_dropped_total",
            "Log records dropped because journald's socket was full.",
            stats.journald.dropped,
        ),
    ];
    for (name, help, value) in counters {
        family(&mut out, name, "counter", help, [(String::new(), value)]);
    }
    family(
        &mut out,
        "exitproof_inotify_watches",
        "gauge",
        "inotify watches held.",
        [(String::new(), stats.inotify.watches)],
    );
    family(
        &mut out,
        "exitproof_systemd_heard",
        "gauge",
        "1 while systemd itself is heard on the bus; 0 while the bus is lost or the owner of \
         org.freedesktop.systemd1 is not systemd (no watch can be proven meanwhile).",
        [(String::new(), u64::from(stats.systemd_error.is_none()))],
    );
    histogram(
        &mut out,
        "exitproof_proof_latency_seconds",
        "From the agent learning of systemd's terminal state of an invocation to its proof.",
        &core.proof_latency,
    );
    let event_loop = &stats.event_loop;
    histogram(
        &mut out,
        "exitproof_loop_proof_latency_seconds",
        "The agent's own time per proof: from the loop's receipt of the message or notice that \
         decided it to the proof written to its subscribers.",
        &event_loop.proof_latency,
    );
    let work = &event_loop.work;
    family(
        &mut out,
        "exitproof_loop_turns_total",
        "counter",
        "Turns of the agent's loop.",
        [(String::new(), event_loop.turns)],
    );
    family(
        &mut out,
        "exitproof_loop_work_total",
        "counter",
        "What the loop's turns did, by kind of work.",
        labelled(
            "work",
            [
                ("save", work.saves),
                ("sync", work.syncs),
                ("cgroup-read", work.cgroup_reads),
                ("trim", work.trims),
            ],
        ),
    );
    family(
        &mut out,
        "exitproof_loop_work_microseconds_total",
        "counter",
        "The time the loop's turns spent on each kind of work, in microseconds.",
        labelled(
            "work",
            [
                ("save", work.save_us),
                ("sync", work.sync_us),
                ("cgroup-read", work.cgroup_read_us),
                ("trim", work.trim_us),
                ("census", work.census_us),
                ("bus", work.bus_us),
                ("rules", work.rules_us),
                ("tell", work.tell_us),
                ("log", work.log_us),
            ],
        ),
    );
    out
}

/// Samples with one label, `label="value"` each.
fn labelled<const N: usize>(label: &str, values: [(&str, u64); N]) -> [(String, u64); N] {
    values.map(|(value, n)| (format!("{{{label}=\"{value}\"}}"), n))
}

/// One metric family: its HELP and TYPE lines, then a sample per label set.
fn family(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    samples: impl IntoIterator<Item = (String, u64)>,
) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, value) in samples {
        let _ = writeln!(out, "{name}{labels} {value}");
    }
}

fn histogram(out: &mut String, name: &str, help: &str, summary: &LatencySummary) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
    for bucket in &summary.buckets {
        let le = bucket.le_us.map_or_else(|| "+Inf".to_owned(), seconds);
        let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {}", bucket.count);
    }
    let _ = writeln!(out, "{name}_sum {}", seconds(summary.sum_us));
    let _ = writeln!(out, "{name}_count {}", summary.count);
}

/// Microseconds as seconds, exactly: `100` is `0.0001`, `5000000` is `5`.
fn seconds(us: u64) -> String {
    let whole = us / 1_000_000;
    let fraction = us % 1_000_000;
    if fraction == 0 {
        return whole.to_string();
    }
    let digits = format!("{fraction:06}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

/// The file and when it is next refreshed.
#[derive(Debug)]
pub(super) struct MetricsFile {
    dir: PathBuf,
    name: String,
    last_text: Option<String>,
    last_refresh: Option<Instant>,
    due: Option<Instant>,
}

impl MetricsFile {
    /// The file at `path`, to be written first at `now`. Its directory must exist.
    pub(super) fn new(path: &Path, now: Instant) -> Result<MetricsFile, String> {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| format!("metrics file {}: no UTF-8 file name", path.display()))?;
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
            _ => PathBuf::from("."),
        };
        Ok(MetricsFile {
            dir,
            name: name.to_owned(),
            last_text: None,
            last_refresh: None,
            due: Some(now),
        })
    }

    /// Something happened at `now`: refresh once the interval since the last refresh allows.
    pub(super) fn changed(&mut self, now: Instant) {
        if self.due.is_none() {
            let earliest = self.last_refresh.map_or(now, |at| at + REFRESH_INTERVAL);
            self.due = Some(earliest.max(now));
        }
    }

    /// When the loop must call [`MetricsFile::refresh_if_due`].
    pub(super) fn due(&self) -> Option<Instant> {
        self.due
    }

    /// Writes `stats` if the refresh is due and they differ from what the file holds.
    pub(super) fn refresh_if_due(&mut self, now: Instant, stats: impl FnOnce() -> AgentStats) {
        if self.due.is_none_or(|at| at > now) {
            return;
        }
        self.due = None;
        self.last_refresh = Some(now);
        let text = render(&stats());
        if self.last_text.as_ref() == Some(&text) {
            return;
        }
        match self.write(&text) {
            Ok(()) => self.last_text = Some(text),
            Err(e) => log::warn!("metrics file: {e}"),
        }
    }

    fn write(&self, text: &str) -> Result<(), String> {
        let dir = fcntl::open(
            &self.dir,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| format!("open directory {}: {e}", self.dir.display()))?;
        // Not `*.prom`, so the textfile collector never reads a half-written file.
        let temp_name = format!(".{}.{}.tmp", self.name, std::process::id());
        // Left by an agent of the same pid killed mid-write, it would fail the exclusive create.
        let _ = nix::unistd::unlinkat(
            dir.as_fd(),
            temp_name.as_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        );
        atomic_file::replace(
            dir.as_fd(),
            &self.dir,
            &self.name,
            &temp_name,
            text.as_bytes(),
            FILE_MODE,
        )
        .map_err(|e| format!("{} {}: {}", e.action, e.path.display(), e.source))
    }
}

#[cfg(test)]
mod tests;
