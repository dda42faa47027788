//! What the agent tells its clients about a unit: the proof event and the watch view (their
//! wire types are `control::wire`'s), and how a terminal proof is worded from the exit record
//! and systemd's own exit status.

pub(crate) use crate::control::wire::{EventKind, ProofEvent, WatchView};
use crate::exit::record::{ExitRecord, exit_level, exit_line, signal_name};
use crate::proof::Level;
use crate::systemd::snapshot::ServiceExit;

/// systemd's exit status in the vocabulary of an exit record (`$SERVICE_RESULT`, `$EXIT_CODE`,
/// `$EXIT_STATUS`): a code of `exited`, `killed` or `dumped`, and a signal by name.
pub(super) fn systemd_record(exit: &ServiceExit) -> ExitRecord {
    let code = match exit.exec_main_code {
        Some(1) => "exited",
        Some(2) => "killed",
        Some(3) => "dumped",
        _ => "",
    };
    // With no code systemd recorded no end of a main process: its status (0) is no status.
    let status = match (code, exit.exec_main_status) {
        ("killed" | "dumped", Some(signo)) => signal_name(signo),
        ("exited", Some(status)) => status.to_string(),
        _ => String::new(),
    };
    ExitRecord {
        result: exit.result.clone().unwrap_or_default(),
        code: code.to_owned(),
        status,
    }
}

/// The wording of a terminal proof: from the record when the watch names one, whatever its
/// read gave (a missing or unreadable record is worded as such, never replaced by systemd's
/// status), else from systemd's own exit status. Level and message come from the same value,
/// so they cannot disagree.
pub(super) fn terminal_wording(
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
            // A stop's SIGTERM of the main process: systemd's result is success.
            (
                exit("success", 2, 15),
                Level::Info,
                "instance exited: signal TERM",
            ),
            // No main process ever ended (ExecStartPre= timed out): ExecMainCode 0, "?".
            (
                exit("timeout", 0, 0),
                Level::Warn,
                "instance exited (status unknown: timeout)",
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
