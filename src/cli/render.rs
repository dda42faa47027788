//! What the CLI prints: every result in a person's words by default, or as JSON lines with
//! `--json`. Pure: each result renders to a string, so the wording is tested without an agent.
//!
//! A subcommand with output gets its typed answer from the client, implements [`Render`] for
//! it (or for a small struct around it), and hands it to `cli::print`.

use std::fmt::Write as _;

use serde::Serialize;

use crate::control::wire::{
    AgentStats, EventAnswer, LatencySummary, ProofEvent, UnitStatus, Version, WatchView,
};
use crate::unit_name::UnitName;

/// A result the CLI prints.
pub(super) trait Render {
    /// The lines for a person, each ended by a newline.
    fn human(&self) -> String;
    /// The lines `--json` prints, each one JSON value ended by a newline.
    fn json(&self) -> String;
}

/// One JSON line for `value`, its keys sorted as the agent writes them.
fn json_line(value: &impl Serialize) -> String {
    // Through `Value`, whose maps are sorted, so the line is the agent's byte for byte.
    let mut line = serde_json::to_value(value)
        .map(|value| value.to_string())
        .unwrap_or_else(|e| format!("{{\"error\":\"cannot encode: {e}\"}}"));
    line.push('\n');
    line
}

/// How many hex digits of an invocation ID a person is shown; as many as git shows of a commit.
const SHORT_INVOCATION: usize = 8;

/// An invocation ID shortened for a person; `-` when there is none (yet).
fn short_invocation(invocation: Option<&str>) -> &str {
    match invocation {
        None | Some("") => "-",
        Some(id) => id.get(..SHORT_INVOCATION).unwrap_or(id),
    }
}

/// `active/running`, or `-` while unknown.
fn unit_state(view: &WatchView) -> String {
    match (&view.active_state, &view.sub_state) {
        (Some(active), Some(sub)) => format!("{active}/{sub}"),
        (Some(active), None) => active.clone(),
        _ => "-".to_owned(),
    }
}

fn populated(view: &WatchView) -> &'static str {
    match view.populated {
        Some(true) => "yes",
        Some(false) => "no",
        None => "-",
    }
}

/// A duration in nanoseconds, in its largest whole unit: `850ms`, `42s`, `5m`, `3h`, `2d`.
fn age(nanos: u64) -> String {
    let millis = nanos / 1_000_000;
    let seconds = millis / 1000;
    match seconds {
        0 => format!("{millis}ms"),
        1..60 => format!("{seconds}s"),
        60..3600 => format!("{}m", seconds / 60),
        3600..86_400 => format!("{}h", seconds / 3600),
        _ => format!("{}d", seconds / 86_400),
    }
}

/// What a person is told of a unit that had no invocation when it was watched: its proof says
/// only that nothing ran.
fn never_ran(unit: &str) -> String {
    format!(
        "{unit} is loaded but has not run since systemd started: nothing to prove yet; start it \
         with `exitproof start {unit}`\n"
    )
}

/// ` (now running invocation 0123abcd)` when systemd runs another invocation than the proven.
fn now_running(invocation: Option<&str>) -> String {
    invocation.map_or_else(String::new, |id| {
        format!(" (now running invocation {})", short_invocation(Some(id)))
    })
}

/// `watch`: one line saying what is watched and where it stands.
impl Render for WatchView {
    fn human(&self) -> String {
        let proven = self.proof.is_some();
        if proven && self.invocation.as_deref() == Some("") && self.now_running.is_none() {
            return never_ran(&self.unit);
        }
        let mut line = format!(
            "{} {} (invocation {}, {}, populated {})",
            self.phase.name(),
            self.unit,
            short_invocation(self.invocation.as_deref()),
            unit_state(self),
            populated(self),
        );
        if let Some(generation) = self.generation {
            let _ = write!(line, " gen {generation}");
        }
        if let Some(proof) = &self.proof {
            let _ = write!(line, ": {}", proof.message);
        }
        line.push_str(&now_running(self.now_running.as_deref()));
        line.push('\n');
        line
    }

    fn json(&self) -> String {
        json_line(self)
    }
}

/// `wait`, `stop` and each event of `events`: one line with the proof's wording.
impl Render for ProofEvent {
    fn human(&self) -> String {
        let mut line = format!(
            "proven {} (invocation {}",
            self.unit,
            short_invocation(Some(&self.invocation))
        );
        if let Some(generation) = self.generation {
            let _ = write!(line, ", gen {generation}");
        }
        let _ = writeln!(line, "): {}", self.message);
        line
    }

    fn json(&self) -> String {
        json_line(self)
    }
}

/// `wait` and `stop`: the proof's line, saying also when the unit runs another invocation
/// now, and which proven invocation a `stop` found over before it stopped the running one.
impl Render for EventAnswer {
    fn human(&self) -> String {
        let event = &self.event;
        if event.invocation.is_empty() && self.now_running.is_none() {
            return never_ran(&event.unit);
        }
        let mut text = String::new();
        if let Some(proven) = &self.moved_on_from {
            let _ = writeln!(
                text,
                "the proven invocation {} of {} is over; stopped the running invocation {}",
                short_invocation(Some(proven)),
                event.unit,
                short_invocation(Some(&event.invocation)),
            );
        }
        let line = event.human();
        text.push_str(line.trim_end_matches('\n'));
        text.push_str(&now_running(self.now_running.as_deref()));
        text.push('\n');
        text
    }

    /// The proof event's line, with `now_running` and `moved_on_from` beside its fields when
    /// the answer has them.
    fn json(&self) -> String {
        let mut value = serde_json::to_value(&self.event).unwrap_or_default();
        if let serde_json::Value::Object(fields) = &mut value {
            for (key, extra) in [
                ("now_running", &self.now_running),
                ("moved_on_from", &self.moved_on_from),
            ] {
                if let Some(invocation) = extra {
                    fields.insert(key.to_owned(), invocation.clone().into());
                }
            }
        }
        json_line(&value)
    }
}

/// `list`: a table for a person, one JSON line per unit with `--json`.
pub(super) struct Listing {
    /// The agent's answer.
    pub units: Vec<WatchView>,
    /// CLOCK_MONOTONIC now, in nanoseconds, from which the age of a proof is told.
    pub now_mono_ns: u64,
}

impl Render for Listing {
    fn human(&self) -> String {
        if self.units.is_empty() {
            return "no unit is watched\n".to_owned();
        }
        let header = ["UNIT", "INVOCATION", "PHASE", "STATE", "POPULATED", "AGE"];
        let rows: Vec<[String; 6]> = self
            .units
            .iter()
            .map(|view| {
                let proven_ago = view.proof.as_ref().map_or_else(
                    || "-".to_owned(),
                    |proof| age(self.now_mono_ns.saturating_sub(proof.proven_mono_ns)),
                );
                [
                    view.unit.clone(),
                    short_invocation(view.invocation.as_deref()).to_owned(),
                    view.phase.name().to_owned(),
                    unit_state(view),
                    populated(view).to_owned(),
                    proven_ago,
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for row in &rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut table = String::new();
        let header = header.map(str::to_owned);
        for row in std::iter::once(&header).chain(&rows) {
            let mut line = String::new();
            for (cell, width) in row.iter().zip(widths) {
                let _ = write!(line, "{cell:<width$}  ");
            }
            table.push_str(line.trim_end());
            table.push('\n');
        }
        for view in &self.units {
            if let (Some(proof), Some(running)) = (&view.proof, &view.now_running) {
                let _ = writeln!(
                    table,
                    "{}: the proven invocation {} is over; systemd now runs invocation {}",
                    view.unit,
                    short_invocation(Some(&proof.invocation)),
                    short_invocation(Some(running)),
                );
            }
        }
        let proven = self
            .units
            .iter()
            .filter(|view| view.proof.is_some())
            .count();
        let count = match self.units.len() {
            1 => "1 unit watched".to_owned(),
            n => format!("{n} units watched"),
        };
        let _ = writeln!(table, "\n{count}, {proven} proven");
        table
    }

    fn json(&self) -> String {
        self.units.iter().map(json_line).collect()
    }
}

/// `unwatch`: a line for a person; nothing with `--json`, where the exit code says it.
pub(super) struct Unwatched(pub UnitName);

impl Render for Unwatched {
    fn human(&self) -> String {
        format!("unwatched {}\n", self.0)
    }

    fn json(&self) -> String {
        String::new()
    }
}

/// `unwatch --proven`: a line per unit forgotten, or that there was none; with `--json` the
/// agent's answer, `{"unwatched":[…]}`.
pub(super) struct UnwatchedProven(pub Vec<String>);

impl Render for UnwatchedProven {
    fn human(&self) -> String {
        if self.0.is_empty() {
            return "no proven watch to unwatch\n".to_owned();
        }
        self.0
            .iter()
            .map(|unit| format!("unwatched {unit}\n"))
            .collect()
    }

    fn json(&self) -> String {
        json_line(&crate::control::wire::UnwatchedAnswer {
            unwatched: self.0.clone(),
        })
    }
}

/// `version`: this CLI's version and, when it could be asked, the agent's.
#[derive(Serialize)]
pub(super) struct Versions {
    /// This CLI's version.
    pub cli: &'static str,
    /// The agent's answer, `None` when it could not be asked.
    pub agent: Option<Version>,
}

impl Render for Versions {
    fn human(&self) -> String {
        match &self.agent {
            Some(agent) => format!(
                "cli {}, agent {} (protocol {})\n",
                self.cli, agent.agent, agent.protocol
            ),
            None => format!("cli {}, agent unknown\n", self.cli),
        }
    }

    fn json(&self) -> String {
        json_line(self)
    }
}

/// `stats`: the agent's figures, one per line for a person.
impl Render for AgentStats {
    fn human(&self) -> String {
        let core = &self.core;
        let (w, p) = (&core.watches, &core.proofs);
        let mut text = format!(
            "watches: {} watching, {} stopping, {} proven\n\
             blocked by remaining processes: {}\n\
             proofs: {} exited, {} replaced-after-stop, {} restarted-outside, {} rebooted\n",
            w.watching,
            w.stopping,
            w.proven,
            core.blocked,
            p.exited,
            p.replaced_after_stop,
            p.restarted_outside,
            p.rebooted,
        );
        let _ = writeln!(
            text,
            "proof latency: {}",
            latency_words(&core.proof_latency)
        );
        let own = &self.event_loop;
        if own.proof_latency.count > 0 {
            let _ = writeln!(
                text,
                "the agent's own time per proof: {}, max {}",
                latency_words(&own.proof_latency),
                micros(own.proof_latency_max_us)
            );
        }
        let _ = writeln!(
            text,
            "resyncs: {}; bus reconnects: {}; inotify: {} watches, {} overflows; journald: {} \
             dropped",
            core.resyncs,
            self.bus_reconnects,
            self.inotify.watches,
            self.inotify.overflows,
            self.journald.dropped
        );
        if let Some(error) = &self.systemd_error {
            let _ = writeln!(text, "systemd not heard: {error}");
        }
        text
    }

    fn json(&self) -> String {
        json_line(self)
    }
}

/// `status`: the watch's line, its cgroup and, when its proof is blocked, since when and by
/// which processes, as a table.
impl Render for UnitStatus {
    fn human(&self) -> String {
        let mut text = self.watch.human();
        let _ = writeln!(text, "cgroup: {}", self.cgroup.as_deref().unwrap_or("-"));
        if let Some(error) = &self.cgroup_error {
            let _ = writeln!(text, "cgroup error: {error}");
        }
        if !self.leftovers.is_empty() {
            let pids: Vec<String> = self.leftovers.iter().map(i32::to_string).collect();
            let _ = writeln!(text, "followed as possibly ours: {}", pids.join(" "));
        }
        if let Some(error) = &self.systemd_error {
            let _ = writeln!(text, "unprovable while systemd is not heard: {error}");
        }
        if !self.blocked {
            return text;
        }
        let since = self
            .terminal_for_ms
            .map_or_else(String::new, |ms| format!(" for {}", age(ms * 1_000_000)));
        let _ = writeln!(
            text,
            "blocked{since}: systemd says it ended, but its cgroup still holds {} process(es)",
            self.remaining_total
                .map_or_else(|| "?".to_owned(), |n| n.to_string())
        );
        if let Some(error) = &self.remaining_error {
            let _ = writeln!(text, "cannot list them: {error}");
        }
        if let Some(remaining) = &self.remaining {
            let _ = writeln!(text, "{:<8} {:<5} {:<16} CGROUP", "PID", "STATE", "COMMAND");
            for p in remaining {
                let _ = writeln!(
                    text,
                    "{:<8} {:<5} {:<16} {}",
                    p.pid, p.state, p.comm, p.cgroup
                );
            }
            let shown = remaining.len();
            if let Some(total) = self.remaining_total.filter(|total| *total > shown) {
                let _ = writeln!(text, "({} more not shown)", total - shown);
            }
        }
        text
    }

    fn json(&self) -> String {
        json_line(self)
    }
}

/// A latency histogram in a person's words: how many, their mean, and the bound under which
/// half and 99 % of them fell.
fn latency_words(summary: &LatencySummary) -> String {
    if summary.count == 0 {
        return "none yet".to_owned();
    }
    let within = |share: u64| {
        let needed = summary.count.saturating_mul(share).div_ceil(100);
        match summary.buckets.iter().find(|b| b.count >= needed) {
            Some(bucket) => bucket.le_us.map_or_else(
                || "over the largest bound".to_owned(),
                |us| format!("≤ {}", micros(us)),
            ),
            None => "-".to_owned(),
        }
    };
    format!(
        "{} proofs, mean {}, p50 {}, p99 {}",
        summary.count,
        micros(summary.sum_us / summary.count),
        within(50),
        within(99)
    )
}

/// Microseconds in a person's unit: `250us`, `2.5ms`, `1.2s`.
fn micros(us: u64) -> String {
    match us {
        0..1000 => format!("{us}us"),
        1000..1_000_000 => format!("{:.1}ms", us as f64 / 1e3),
        _ => format!("{:.1}s", us as f64 / 1e6),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::wire::{Cause, EventKind, Level, Phase, SanitizedRecord};

    const INVOCATION: &str = "c1a411bea0f8482a98b06f95dabafd31";
    const SECOND: u64 = 1_000_000_000;

    fn event(unit: &str, proven_mono_ns: u64) -> ProofEvent {
        ProofEvent {
            kind: EventKind::Proven,
            unit: unit.to_owned(),
            invocation: INVOCATION.to_owned(),
            level: Level::Warn,
            message: "instance exited: exit 3 (exit-code)".to_owned(),
            cause: Cause::Exited,
            proven_mono_ns,
            proven_realtime_us: None,
            stop_requested: false,
            systemd: Some(SanitizedRecord {
                result: "exit-code".to_owned(),
                code: "exited".to_owned(),
                status: "3".to_owned(),
            }),
            record: None,
            generation: None,
            launch_file: None,
        }
    }

    /// A watch as the agent sends it: the CLI renders what it decoded from such a line.
    fn view(unit: &str) -> WatchView {
        let line = serde_json::json!({
            "unit": unit,
            "invocation": INVOCATION,
            "active_state": "active",
            "sub_state": "running",
            "populated": true,
            "phase": "watching",
            "stop_requested": false,
            "run_dir": null,
            "record": null,
            "gen": null,
            "launch_file": null,
            "proof": null,
        });
        serde_json::from_value(line).expect("a watch view")
    }

    fn proven(unit: &str, proven_mono_ns: u64) -> WatchView {
        WatchView {
            active_state: Some("failed".to_owned()),
            sub_state: Some("failed".to_owned()),
            populated: None,
            phase: Phase::Proven,
            proof: Some(event(unit, proven_mono_ns)),
            ..view(unit)
        }
    }

    #[test]
    fn a_watch_is_one_line() {
        assert_eq!(
            view("web.service").human(),
            "watching web.service (invocation c1a411be, active/running, populated yes)\n"
        );
        let mut reading = view("new.service");
        reading.invocation = None;
        reading.active_state = None;
        reading.sub_state = None;
        reading.populated = None;
        reading.generation = Some(7);
        assert_eq!(
            reading.human(),
            "watching new.service (invocation -, -, populated -) gen 7\n"
        );
        assert_eq!(
            proven("backup.service", 0).human(),
            "proven backup.service (invocation c1a411be, failed/failed, populated -): instance \
             exited: exit 3 (exit-code)\n"
        );
    }

    #[test]
    fn a_proof_is_one_line() {
        assert_eq!(
            event("backup.service", 1).human(),
            "proven backup.service (invocation c1a411be): instance exited: exit 3 (exit-code)\n"
        );
        let mut unloaded = event("never-loaded.service", 1);
        unloaded.invocation = String::new();
        unloaded.generation = Some(3);
        assert_eq!(
            unloaded.human(),
            "proven never-loaded.service (invocation -, gen 3): instance exited: exit 3 \
             (exit-code)\n"
        );
    }

    #[test]
    fn the_list_is_a_table_with_a_header() {
        let listing = Listing {
            units: vec![
                proven("backup.service", 100 * SECOND),
                view("a-much-longer-name.service"),
            ],
            now_mono_ns: 342 * SECOND,
        };
        assert_eq!(
            listing.human(),
            "\
UNIT                        INVOCATION  PHASE     STATE           POPULATED  AGE
backup.service              c1a411be    proven    failed/failed   -          4m
a-much-longer-name.service  c1a411be    watching  active/running  yes        -

2 units watched, 1 proven
"
        );
        let empty = Listing {
            units: Vec::new(),
            now_mono_ns: 0,
        };
        assert_eq!(empty.human(), "no unit is watched\n");
    }

    #[test]
    fn ages_are_in_their_largest_whole_unit() {
        let cases = [
            (0, "0ms"),
            (850_000_000, "850ms"),
            (SECOND, "1s"),
            (59 * SECOND, "59s"),
            (60 * SECOND, "1m"),
            (3599 * SECOND, "59m"),
            (3600 * SECOND, "1h"),
            (86_400 * SECOND, "1d"),
            (u64::MAX, "213503d"),
        ];
        for (nanos, text) in cases {
            assert_eq!(age(nanos), text, "{nanos}");
        }
    }

    #[test]
    fn json_lines_are_the_agents_own_with_sorted_keys() {
        let line = view("web.service").json();
        assert_eq!(
            line,
            "{\"active_state\":\"active\",\"gen\":null,\"invocation\":\
             \"c1a411bea0f8482a98b06f95dabafd31\",\"launch_file\":null,\"phase\":\"watching\",\
             \"populated\":true,\"proof\":null,\"record\":null,\"run_dir\":null,\
             \"stop_requested\":false,\"sub_state\":\"running\",\"unit\":\"web.service\"}\n"
        );
        let listing = Listing {
            units: vec![view("a.service"), view("b.service")],
            now_mono_ns: 0,
        };
        assert_eq!(listing.json().lines().count(), 2);
        assert_eq!(Unwatched("a.service".parse().expect("valid")).json(), "");
        let versions = Versions {
            cli: "0.1.0",
            agent: Some(Version::CURRENT),
        };
        assert_eq!(
            versions.json(),
            format!(
                "{{\"agent\":{{\"agent\":\"{0}\",\"protocol\":1}},\"cli\":\"0.1.0\"}}\n",
                env!("CARGO_PKG_VERSION")
            )
        );
        let unknown = Versions {
            cli: "0.1.0",
            agent: None,
        };
        assert_eq!(unknown.json(), "{\"agent\":null,\"cli\":\"0.1.0\"}\n");
        assert_eq!(unknown.human(), "cli 0.1.0, agent unknown\n");
    }

    #[test]
    fn stats_read_as_lines_for_a_person_with_the_latency_in_words() {
        use crate::control::wire::{
            Bucket, CoreStats, InotifyStats, JournaldStats, LatencySummary, LoopStats, PhaseCounts,
            ProofCounts,
        };
        let stats = AgentStats {
            core: CoreStats {
                watches: PhaseCounts {
                    watching: 3,
                    stopping: 1,
                    proven: 2,
                },
                blocked: 1,
                proofs: ProofCounts {
                    exited: 2,
                    ..ProofCounts::default()
                },
                resyncs: 0,
                proof_latency: LatencySummary {
                    buckets: vec![
                        Bucket {
                            le_us: Some(500),
                            count: 1,
                        },
                        Bucket {
                            le_us: Some(2_500),
                            count: 2,
                        },
                        Bucket {
                            le_us: None,
                            count: 2,
                        },
                    ],
                    sum_us: 2_100,
                    count: 2,
                },
            },
            bus_reconnects: 1,
            systemd_error: None,
            inotify: InotifyStats {
                watches: 8,
                overflows: 0,
            },
            journald: JournaldStats { dropped: 0 },
            event_loop: LoopStats::default(),
        };
        assert_eq!(
            stats.human(),
            "watches: 3 watching, 1 stopping, 2 proven\n\
             blocked by remaining processes: 1\n\
             proofs: 2 exited, 0 replaced-after-stop, 0 restarted-outside, 0 rebooted\n\
             proof latency: 2 proofs, mean 1.1ms, p50 ≤ 500us, p99 ≤ 2.5ms\n\
             resyncs: 0; bus reconnects: 1; inotify: 8 watches, 0 overflows; journald: 0 \
             dropped\n"
        );
        let json: serde_json::Value = serde_json::from_str(&stats.json()).expect("one JSON line");
        assert_eq!(json["watches"]["watching"], 3);
        assert_eq!(json["inotify"]["watches"], 8);
    }

    #[test]
    fn a_blocked_status_says_since_when_and_lists_what_blocks_it() {
        use crate::control::wire::RemainingProcess;
        let status = UnitStatus {
            watch: view("web.service"),
            cgroup: Some("/app.slice/web.service".to_owned()),
            blocked: true,
            terminal_since_mono_ns: Some(SECOND),
            terminal_for_ms: Some(12_000),
            leftovers: vec![4242],
            remaining: Some(vec![RemainingProcess {
                pid: 4242,
                comm: "flush".to_owned(),
                state: "D".to_owned(),
                cgroup: "/app.slice/web.service/worker".to_owned(),
            }]),
            remaining_total: Some(3),
            remaining_error: None,
            cgroup_error: None,
            systemd_error: None,
        };
        let text = status.human();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], view("web.service").human().trim_end());
        assert_eq!(
            lines[1..],
            [
                "cgroup: /app.slice/web.service",
                "followed as possibly ours: 4242",
                "blocked for 12s: systemd says it ended, but its cgroup still holds 3 process(es)",
                "PID      STATE COMMAND          CGROUP",
                "4242     D     flush            /app.slice/web.service/worker",
                "(2 more not shown)",
            ]
        );
        let unblocked = UnitStatus {
            blocked: false,
            leftovers: Vec::new(),
            remaining: None,
            remaining_total: None,
            ..status
        };
        assert_eq!(
            unblocked.human().lines().count(),
            2,
            "{}",
            unblocked.human()
        );
        let unseen = UnitStatus {
            cgroup_error: Some("not found where systemd says (/x.service)".to_owned()),
            ..unblocked.clone()
        };
        assert!(
            unseen
                .human()
                .contains("\ncgroup error: not found where systemd says (/x.service)\n"),
            "{}",
            unseen.human()
        );
        let unheard = UnitStatus {
            systemd_error: Some("the bus connection closed".to_owned()),
            ..unblocked
        };
        assert_eq!(
            unheard.human().lines().last(),
            Some("unprovable while systemd is not heard: the bus connection closed")
        );
    }
}
