//! What the agent tells its clients about a unit: the proof event and the watch view, and how
//! a terminal proof is worded from the exit record and systemd's own exit status.

use serde::{Deserialize, Serialize};

use crate::exit::record::{ExitRecord, SanitizedRecord, exit_level, exit_line, signal_name};
use crate::proof::{Cause, Level, Phase};
use crate::systemd::manager::ServiceExit;

/// The kind of an event; a field so that other kinds can join the stream later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    Proven,
}

/// The one event a proof produces, as clients receive it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProofEvent {
    /// Always `"proven"`.
    #[serde(rename = "type")]
    pub kind: EventKind,
    pub unit: String,
    /// Our invocation, the one proven over (empty if the unit had none when watched).
    pub invocation: String,
    pub level: Level,
    pub message: String,
    pub cause: Cause,
    /// CLOCK_MONOTONIC at the proof, in nanoseconds, for latency measured in another process.
    pub proven_mono_ns: u64,
    pub stop_requested: bool,
    /// How the main process ended, as systemd itself reported it (terminal proofs of services).
    pub systemd: Option<SanitizedRecord>,
    /// The advisory exit record, sanitized, when the watch names one and it could be read.
    pub record: Option<SanitizedRecord>,
    #[serde(rename = "gen")]
    pub generation: Option<u64>,
    pub launch_file: Option<String>,
}

/// One watched unit as `watch` and `list` show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WatchView {
    pub unit: String,
    /// Our invocation; absent while the first read of the unit is under way.
    pub invocation: Option<String>,
    pub active_state: Option<String>,
    pub sub_state: Option<String>,
    /// What the last cgroup read said: true, false, or null when gone, unread or unreadable.
    pub populated: Option<bool>,
    pub phase: Phase,
    pub stop_requested: bool,
    pub run_dir: Option<String>,
    pub record: Option<String>,
    #[serde(rename = "gen")]
    pub generation: Option<u64>,
    pub launch_file: Option<String>,
    /// The proof event, once proven.
    pub proof: Option<ProofEvent>,
}

/// systemd's exit status in the vocabulary of an exit record (`$SERVICE_RESULT`, `$EXIT_CODE`,
/// `$EXIT_STATUS`): a code of `exited`, `killed` or `dumped`, and a signal by name.
pub fn systemd_record(exit: &ServiceExit) -> ExitRecord {
    let code = match exit.exec_main_code {
        Some(1) => "exited",
        Some(2) => "killed",
        Some(3) => "dumped",
        _ => "",
    };
    let status = match (code, exit.exec_main_status) {
        ("killed" | "dumped", Some(signo)) => signal_name(signo),
        (_, Some(status)) => status.to_string(),
        (_, None) => String::new(),
    };
    ExitRecord {
        result: exit.result.clone().unwrap_or_default(),
        code: code.to_owned(),
        status,
    }
}

/// The wording of a terminal proof: from the record when the watch names one (whatever the
/// read gave, the seed's rule), else from systemd's own exit status. Level and message come
/// from the same value, so they cannot disagree.
pub fn terminal_wording(
    names_record: bool,
    record: Option<&ExitRecord>,
    systemd: Option<&ExitRecord>,
) -> (Level, String) {
    let source = if names_record { record } else { systemd };
    (exit_level(source), exit_line(source))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(result: &str, code: i32, status: i32) -> ServiceExit {
        ServiceExit {
            result: Some(result.into()),
            exec_main_code: Some(code),
            exec_main_status: Some(status),
        }
    }

    #[test]
    fn systemd_values_are_worded_like_a_record() {
        let cases = [
            (
                exit("success", 1, 0),
                Level::Info,
                "instance exited (exit 0)",
            ),
            (
                exit("exit-code", 1, 3),
                Level::Warn,
                "instance exited: exit 3 (exit-code)",
            ),
            (
                exit("signal", 2, 9),
                Level::Warn,
                "instance exited: signal KILL",
            ),
            (
                exit("core-dump", 3, 11),
                Level::Warn,
                "instance exited: signal SEGV",
            ),
        ];
        for (exit, level, line) in cases {
            let record = systemd_record(&exit);
            assert_eq!(
                terminal_wording(false, None, Some(&record)),
                (level, line.to_owned())
            );
        }
        assert_eq!(
            terminal_wording(false, None, None).1,
            "instance exited (status unknown: no exit record)"
        );
    }

    #[test]
    fn a_named_record_decides_the_wording_even_when_it_is_missing() {
        let systemd = systemd_record(&exit("success", 1, 0));
        let record = ExitRecord {
            result: "exit-code".into(),
            code: "exited".into(),
            status: "7".into(),
        };
        assert_eq!(
            terminal_wording(true, Some(&record), Some(&systemd)).1,
            "instance exited: exit 7 (exit-code)"
        );
        assert_eq!(
            terminal_wording(true, None, Some(&systemd)),
            (
                Level::Warn,
                "instance exited (status unknown: no exit record)".to_owned()
            )
        );
    }
}
