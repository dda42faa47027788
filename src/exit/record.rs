//! The exit record's content: parsing the bytes of a record and wording the proof's event line
//! from it. Pure: no I/O, no clock, and it never panics on any input.
//!
//! A record is tenant-writable text, so nothing in it may reach the event line unchecked: every
//! field passes through [`record_token`], which lets through only what systemd itself would
//! write. The record words the line and sets its level, and decides nothing else.

use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::proof::Level;

/// The most bytes a record may have; a longer file is not a record.
pub const RECORD_LIMIT: usize = 4096;

/// The longest field [`record_token`] lets through, in bytes.
const TOKEN_LIMIT: usize = 32;

/// The token that stands in for a field that is not what systemd would write.
const UNKNOWN_TOKEN: &str = "?";

/// How a unit's main process ended, as systemd tells an `ExecStopPost=` command.
///
/// Missing fields deserialize as empty strings and unknown fields are ignored, but read records
/// with [`parse_record`], which also refuses anything that is not a JSON object.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ExitRecord {
    /// `$SERVICE_RESULT`: `success`, `exit-code`, `signal`, `core-dump`, `timeout`, ...
    pub result: String,
    /// `$EXIT_CODE`: `exited`, `killed` or `dumped`.
    pub code: String,
    /// `$EXIT_STATUS`: the exit status for `exited`, the signal name (`KILL`) otherwise.
    pub status: String,
}

/// Parses the bytes of an exit record.
///
/// Returns `None` for more than [`RECORD_LIMIT`] bytes, invalid UTF-8, invalid JSON, JSON that
/// is not an object, or a known field that is not a string. Missing fields are empty strings;
/// unknown fields are ignored.
pub fn parse_record(bytes: &[u8]) -> Option<ExitRecord> {
    if bytes.len() > RECORD_LIMIT {
        return None;
    }
    let text = std::str::from_utf8(bytes).ok()?;
    // Decoding through a Value first, because serde would also accept a JSON array as a struct.
    let Value::Object(fields) = serde_json::from_str(text).ok()? else {
        return None;
    };
    ExitRecord::deserialize(Value::Object(fields)).ok()
}

/// Returns `field` if it is 1 to 32 bytes of `[A-Za-z0-9_-]` (what systemd itself writes),
/// else `"?"`, so a tenant cannot put arbitrary text or control characters into the event line.
pub fn record_token(field: &str) -> &str {
    let plain = field
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if plain && (1..=TOKEN_LIMIT).contains(&field.len()) {
        field
    } else {
        UNKNOWN_TOKEN
    }
}

/// Whether the record says the invocation ended cleanly: systemd's result `success` (a stop as
/// asked counts, whatever signal ended the main process), or an exit with status 0.
fn is_clean_exit(record: &ExitRecord) -> bool {
    record.result == "success" || (record.code == "exited" && record.status == "0")
}

/// Words the event line of an invocation that exited, from its exit record (`None`: there was
/// none, or it was not a record).
///
/// The line says only what the record says: a main process killed by a signal is worded by its
/// signal even when the result is `success` (a stop's SIGTERM), and a status is quoted only
/// with a code that gives it a meaning (`exited`, `killed`, `dumped`): systemd sets no code
/// when no main process ended (its `ExecMainCode` 0, "?"), and then its status 0 is no exit 0.
///
/// The caller reads the record once and hands the same value to this and to [`exit_level`], so
/// the line and its level cannot disagree the way two reads of a changing file could.
pub fn exit_line(record: Option<&ExitRecord>) -> String {
    match record {
        None => "instance exited (status unknown: no exit record)".to_owned(),
        Some(record) => match record.code.as_str() {
            "killed" | "dumped" => {
                format!("instance exited: signal {}", record_token(&record.status))
            }
            "exited" if record.status == "0" => "instance exited (exit 0)".to_owned(),
            "exited" => format!(
                "instance exited: exit {} ({})",
                record_token(&record.status),
                record_token(&record.result)
            ),
            _ => format!(
                "instance exited (status unknown: {})",
                record_token(&record.result)
            ),
        },
    }
}

/// The level of [`exit_line`]'s line: info for a clean exit, warn for anything else, including
/// no record. Give it the same record as `exit_line` (see there).
pub fn exit_level(record: Option<&ExitRecord>) -> Level {
    match record {
        Some(record) if is_clean_exit(record) => Level::Info,
        _ => Level::Warn,
    }
}

/// An exit record fit to publish: every field passed through [`record_token`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SanitizedRecord {
    /// systemd's `$SERVICE_RESULT`: `success`, `exit-code`, `signal`, `core-dump`, `timeout`…
    pub result: String,
    /// `$EXIT_CODE`: `exited`, `killed` or `dumped`.
    pub code: String,
    /// `$EXIT_STATUS`: an exit status (`3`) or a signal's name (`KILL`).
    pub status: String,
}

impl From<&ExitRecord> for SanitizedRecord {
    fn from(record: &ExitRecord) -> Self {
        SanitizedRecord {
            result: record_token(&record.result).to_owned(),
            code: record_token(&record.code).to_owned(),
            status: record_token(&record.status).to_owned(),
        }
    }
}

/// Names a signal the way systemd's `$EXIT_STATUS` does: `9` is `KILL`, `15` is `TERM`. A
/// number that is no signal known here is written as the number.
pub fn signal_name(signo: i32) -> String {
    match Signal::try_from(signo) {
        Ok(signal) => {
            let name = signal.as_str();
            name.strip_prefix("SIG").unwrap_or(name).to_owned()
        }
        Err(_) => signo.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(result: &str, code: &str, status: &str) -> ExitRecord {
        ExitRecord {
            result: result.to_owned(),
            code: code.to_owned(),
            status: status.to_owned(),
        }
    }

    #[test]
    fn record_token_lets_through_only_systemd_words() {
        let longest = "a".repeat(32);
        let too_long = "a".repeat(33);
        let cases: Vec<(&str, &str)> = vec![
            ("KILL", "KILL"),
            ("0", "0"),
            ("exit-code", "exit-code"),
            ("core_dump", "core_dump"),
            ("Az09_-", "Az09_-"),
            (&longest, &longest),
            (&too_long, "?"),
            ("", "?"),
            ("é", "?"),
            ("日本", "?"),
            ("ok\n", "?"),
            ("\u{1b}[31m", "?"),
            ("a/b", "?"),
            ("a b", "?"),
            ("\"", "?"),
            ("a\0", "?"),
            ("?", "?"),
        ];
        for (field, expected) in cases {
            assert_eq!(record_token(field), expected, "{field:?}");
        }
    }

    #[test]
    fn exit_line_and_level_cover_every_branch() {
        let cases = [
            (
                None,
                "instance exited (status unknown: no exit record)",
                Level::Warn,
            ),
            // No code: the status means nothing, whatever the result.
            (
                Some(record("success", "weird\ncode", "\u{1b}")),
                "instance exited (status unknown: success)",
                Level::Info,
            ),
            (
                Some(record("timeout", "", "0")),
                "instance exited (status unknown: timeout)",
                Level::Warn,
            ),
            // A stop's SIGTERM: a clean end, worded by its signal.
            (
                Some(record("success", "killed", "TERM")),
                "instance exited: signal TERM",
                Level::Info,
            ),
            (
                Some(record("", "exited", "0")),
                "instance exited (exit 0)",
                Level::Info,
            ),
            (
                Some(record("signal", "killed", "KILL")),
                "instance exited: signal KILL",
                Level::Warn,
            ),
            (
                Some(record("core-dump", "dumped", "SEGV")),
                "instance exited: signal SEGV",
                Level::Warn,
            ),
            (
                Some(record("exit-code", "exited", "3")),
                "instance exited: exit 3 (exit-code)",
                Level::Warn,
            ),
            (
                Some(record("timeout", "killed", "TERM\n\u{1b}[31mowned")),
                "instance exited: signal ?",
                Level::Warn,
            ),
            (
                Some(record("exit code", "exited", "日本")),
                "instance exited: exit ? (?)",
                Level::Warn,
            ),
            (
                Some(record("", "", "")),
                "instance exited (status unknown: ?)",
                Level::Warn,
            ),
            // "0" only means a clean exit with code "exited".
            (
                Some(record("signal", "killed", "0")),
                "instance exited: signal 0",
                Level::Warn,
            ),
        ];
        for (record, line, level) in cases {
            assert_eq!(exit_line(record.as_ref()), line, "{record:?}");
            assert_eq!(exit_level(record.as_ref()), level, "{record:?}");
        }
    }

    #[test]
    fn parse_record_accepts_objects_of_strings_only() {
        let frame = r#"{"result":"success","pad":""}"#;
        let at_limit = format!(
            r#"{{"result":"success","pad":"{}"}}"#,
            "x".repeat(RECORD_LIMIT - frame.len())
        );
        assert_eq!(at_limit.len(), RECORD_LIMIT);
        let over_limit = format!("{at_limit} ");
        let full = Some(record("exit-code", "exited", "3"));
        let cases: Vec<(&[u8], Option<ExitRecord>)> = vec![
            (
                br#"{"result":"exit-code","code":"exited","status":"3"}"#,
                full.clone(),
            ),
            (
                b"{\"result\":\"exit-code\",\"code\":\"exited\",\"status\":\"3\"}\n",
                full.clone(),
            ),
            (
                br#"{"status":"3","x":1,"result":"exit-code","y":{"z":[null]},"code":"exited"}"#,
                full,
            ),
            (br#"{"code":"killed"}"#, Some(record("", "killed", ""))),
            (b"{}", Some(ExitRecord::default())),
            (br#"{"result":"a","result":"b"}"#, Some(record("b", "", ""))),
            (
                br#"{"status":"\u001b[31m"}"#,
                Some(record("", "", "\u{1b}[31m")),
            ),
            (at_limit.as_bytes(), Some(record("success", "", ""))),
            (over_limit.as_bytes(), None),
            (br#"{"status":3}"#, None),
            (br#"{"status":null}"#, None),
            (br#"{"status":["3"]}"#, None),
            (br#"{"status":{"n":"3"}}"#, None),
            (br#"["success","exited","0"]"#, None),
            (b"null", None),
            (b"\"success\"", None),
            (b"", None),
            (b"{", None),
            (b"{} {}", None),
            (b"{\"result\":\"succ\xffess\"}", None),
            (b"\xef\xbb\xbf{}", None),
        ];
        for (bytes, expected) in cases {
            assert_eq!(parse_record(bytes), expected, "{}", bytes.escape_ascii());
        }
    }

    #[test]
    fn sanitized_record_tokenizes_every_field() {
        let sanitized = SanitizedRecord::from(&record("exit-code", "exi ted", "\n"));
        assert_eq!(
            sanitized,
            SanitizedRecord {
                result: "exit-code".to_owned(),
                code: "?".to_owned(),
                status: "?".to_owned(),
            }
        );
    }

    #[test]
    fn signal_names_match_systemd() {
        let cases = [
            (9, "KILL"),
            (15, "TERM"),
            (11, "SEGV"),
            (0, "0"),
            (-1, "-1"),
            (200, "200"),
        ];
        for (signo, name) in cases {
            assert_eq!(signal_name(signo), name, "{signo}");
        }
    }
}
