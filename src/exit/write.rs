//! The `record` helper's side: taking the exit status systemd hands an `ExecStopPost=` command
//! and writing it as an exit record, atomically. It never writes through a symlink, never leaves
//! a temporary file behind, and never leaves a half-written record under the final name.

use std::hash::{BuildHasher, RandomState};
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use super::beneath;
use super::record::ExitRecord;
use crate::atomic_file;
use crate::record_name::RecordName;

/// The mode of a written record: readable by the agent whatever user the unit runs as.
const RECORD_MODE: u32 = 0o644;

/// Why an exit record could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteRecordError {
    /// systemd did not set this environment variable.
    #[error(
        "environment variable {0} is not set: this command is meant to run as a unit's \
         ExecStopPost=, where systemd sets it"
    )]
    MissingVar(&'static str),
    /// The system call named by `action` failed on `path`.
    #[error("{action} {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The system call, e.g. `rename`.
        action: &'static str,
        /// Its error.
        source: io::Error,
    },
}

/// Builds the record from the variables systemd sets for `ExecStopPost=` (`SERVICE_RESULT`,
/// `EXIT_CODE`, `EXIT_STATUS`, all required), read through `get`, and returns it with
/// `INVOCATION_ID` when that is set and non-empty.
pub fn record_from_env(
    get: impl Fn(&str) -> Option<String>,
) -> Result<(ExitRecord, Option<String>), WriteRecordError> {
    let required = |var: &'static str| get(var).ok_or(WriteRecordError::MissingVar(var));
    let record = ExitRecord {
        result: required("SERVICE_RESULT")?,
        code: required("EXIT_CODE")?,
        status: required("EXIT_STATUS")?,
    };
    let invocation = get("INVOCATION_ID").filter(|id| !id.is_empty());
    Ok((record, invocation))
}

/// Writes `record` as `name` in `dir` and returns the record's path.
///
/// The record is written to a temporary file `.<name>.<pid>.<random>.tmp` in the same
/// directory (created exclusively, never through a symlink), set to mode 0644 whatever the
/// umask, synced, renamed over `name` (which replaces a symlink there rather than writing
/// through it), and the directory is synced. On any failure the temporary file is removed.
pub fn write_record(
    dir: &Path,
    name: &RecordName,
    record: &ExitRecord,
) -> Result<PathBuf, WriteRecordError> {
    let name = name.as_str();
    let io_error = |path: &Path, action, source: io::Error| WriteRecordError::Io {
        path: path.to_owned(),
        action,
        source,
    };
    let dirfd =
        beneath::open_dir(dir).map_err(|errno| io_error(dir, "open directory", errno.into()))?;
    let temp_name = format!(
        ".{name}.{}.{:016x}.tmp",
        std::process::id(),
        // RandomState is keyed from the OS's randomness, so no crate is needed for this.
        RandomState::new().hash_one(name)
    );
    let mut contents =
        serde_json::to_vec(record).map_err(|e| io_error(&dir.join(name), "encode", e.into()))?;
    contents.push(b'\n');
    atomic_file::replace(dirfd.as_fd(), dir, name, &temp_name, &contents, RECORD_MODE)
        .map_err(|e| io_error(&e.path, e.action, e.source))?;
    let path = dir.join(name);
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::fs;
    use std::os::unix::fs::{PermissionsExt, symlink};

    use crate::exit::record::parse_record;

    const NAME: &str = "exit-0123.json";

    fn name() -> RecordName {
        RecordName::parse(NAME).expect("a valid name")
    }

    fn record() -> ExitRecord {
        ExitRecord {
            result: "signal".to_owned(),
            code: "killed".to_owned(),
            status: "KILL".to_owned(),
        }
    }

    use crate::atomic_file::dir_entries as entries;

    #[test]
    fn writes_a_record_that_reads_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = write_record(dir.path(), &name(), &record()).expect("write");
        assert_eq!(path, dir.path().join(NAME));
        let bytes = fs::read(&path).expect("read");
        assert_eq!(
            bytes,
            b"{\"result\":\"signal\",\"code\":\"killed\",\"status\":\"KILL\"}\n"
        );
        assert_eq!(parse_record(&bytes), Some(record()));
        assert_eq!(entries(dir.path()), [NAME]);
    }

    #[test]
    fn the_record_is_0644_although_created_0600() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = write_record(dir.path(), &name(), &record()).expect("write");
        let mode = fs::metadata(path).expect("stat").permissions().mode();
        assert_eq!(mode & 0o7777, RECORD_MODE);
    }

    #[test]
    fn replaces_an_older_record() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::write(dir.path().join(NAME), b"old").expect("write old");
        let path = write_record(dir.path(), &name(), &record()).expect("write");
        assert_eq!(parse_record(&fs::read(path).expect("read")), Some(record()));
    }

    #[test]
    fn a_symlink_at_the_name_is_replaced_not_written_through() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("dir");
        fs::create_dir(&dir).expect("mkdir");
        let outside = root.path().join("outside");
        fs::write(&outside, b"keep").expect("write outside");
        symlink(&outside, dir.join(NAME)).expect("symlink");
        write_record(&dir, &name(), &record()).expect("write");
        let written = fs::symlink_metadata(dir.join(NAME)).expect("stat");
        assert!(written.file_type().is_file());
        assert_eq!(fs::read(&outside).expect("read outside"), b"keep");
        assert_eq!(entries(&dir), [NAME]);
    }

    #[test]
    fn a_missing_directory_fails_and_creates_nothing() {
        let root = tempfile::tempdir().expect("tempdir");
        let err =
            write_record(&root.path().join("missing"), &name(), &record()).expect_err("write");
        assert!(matches!(err, WriteRecordError::Io { .. }), "{err}");
        assert!(entries(root.path()).is_empty());
    }

    #[test]
    fn a_failed_rename_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::create_dir(dir.path().join(NAME)).expect("mkdir");
        fs::write(dir.path().join(NAME).join("inside"), b"").expect("fill");
        let err = write_record(dir.path(), &name(), &record()).expect_err("write");
        assert!(
            matches!(err, WriteRecordError::Io { action, .. } if action.starts_with("rename")),
            "{err}"
        );
        assert_eq!(entries(dir.path()), [NAME]);
    }

    #[test]
    fn record_from_env_requires_systemd_variables() {
        let systemd = [
            ("SERVICE_RESULT", "exit-code"),
            ("EXIT_CODE", "exited"),
            ("EXIT_STATUS", "3"),
        ];
        let record = ExitRecord {
            result: "exit-code".to_owned(),
            code: "exited".to_owned(),
            status: "3".to_owned(),
        };
        // (variables set besides `systemd`'s, a variable unset, the outcome)
        let cases: [(Option<&str>, Option<&str>, Result<_, &str>); 6] = [
            (
                Some("0123abcd"),
                None,
                Ok((record.clone(), Some("0123abcd"))),
            ),
            (None, None, Ok((record.clone(), None))),
            (Some(""), None, Ok((record, None))),
            (
                Some("0123abcd"),
                Some("SERVICE_RESULT"),
                Err("SERVICE_RESULT"),
            ),
            (None, Some("EXIT_CODE"), Err("EXIT_CODE")),
            (None, Some("EXIT_STATUS"), Err("EXIT_STATUS")),
        ];
        for (invocation, unset, expected) in cases {
            let mut vars: HashMap<&str, &str> = systemd.into_iter().collect();
            if let Some(invocation) = invocation {
                vars.insert("INVOCATION_ID", invocation);
            }
            if let Some(unset) = unset {
                vars.remove(unset);
            }
            let outcome = record_from_env(|var| vars.get(var).map(|value| value.to_string()));
            match (outcome, expected) {
                (Ok((record, invocation)), Ok((expected, expected_invocation))) => {
                    assert_eq!(record, expected);
                    assert_eq!(invocation.as_deref(), expected_invocation);
                }
                (Err(err), Err(missing)) => {
                    assert!(matches!(err, WriteRecordError::MissingVar(var) if var == missing));
                    let text = err.to_string();
                    assert!(
                        text.contains(missing) && text.contains("ExecStopPost="),
                        "{text}"
                    );
                }
                (outcome, expected) => panic!("{outcome:?}, expected {expected:?}"),
            }
        }
    }
}
