//! Exit records: how a unit's main process ended, written by the unit's own `ExecStopPost=`
//! command ([`mod@write`]) and read once by the agent to word the proof's event line ([`record`]).
//!
//! A record is advisory. It lives in a directory the tenant can write, so it is never evidence
//! that anything is over: the proof comes from systemd and the cgroup alone, and the record only
//! chooses the words and the level of the line that announces it. It is therefore read without
//! following symlinks, bounded, sanitised to systemd's own vocabulary before it reaches the
//! line ([`beneath`], [`record::record_token`]), and removed once read, so it can never be
//! mistaken for a later invocation's.

pub mod beneath;
pub mod record;
pub mod write;

use std::path::Path;

use crate::record_name::RecordName;

pub use beneath::{BeneathError, read_beneath, remove_beneath};
pub use record::{
    ExitRecord, RECORD_LIMIT, SanitizedRecord, exit_level, exit_line, parse_record, record_token,
    signal_name,
};
pub use write::{WriteRecordError, record_from_env, write_record};

/// Reads the exit record `name` beneath `dir`, once: hand the result to both
/// [`exit_line`] and [`exit_level`].
///
/// Returns `Ok(None)` when there is no such file or its content is not a record (both mean
/// "no exit record" to the line), and an error when the entry was refused or unreadable
/// (a symlink, a FIFO, a file over [`RECORD_LIMIT`] bytes...), which is worth a log line.
pub fn read_record(dir: &Path, name: &RecordName) -> Result<Option<ExitRecord>, BeneathError> {
    match read_beneath(dir, name.as_str(), RECORD_LIMIT) {
        Ok(bytes) => Ok(parse_record(&bytes)),
        Err(BeneathError::NotFound { .. }) => Ok(None),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn read_record_tells_absent_from_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let name = &RecordName::parse("exit-1.json").expect("a valid name");
        assert_eq!(read_record(dir.path(), name).expect("missing"), None);
        fs::write(dir.path().join(name.as_str()), b"not json").expect("write");
        assert_eq!(read_record(dir.path(), name).expect("garbage"), None);
        fs::write(dir.path().join(name.as_str()), br#"{"result":"success"}"#).expect("write");
        let record = read_record(dir.path(), name).expect("record");
        assert_eq!(record.map(|r| r.result), Some("success".to_owned()));
        fs::remove_file(dir.path().join(name.as_str())).expect("remove");
        std::os::unix::fs::symlink("/etc/hostname", dir.path().join(name.as_str()))
            .expect("symlink");
        let err = read_record(dir.path(), name).expect_err("symlink");
        assert!(matches!(err, BeneathError::Refused { .. }), "{err}");
    }
}
