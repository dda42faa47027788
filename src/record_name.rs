//! The file name of an exit record in its run directory: one path component, checked once
//! where it comes in (a request, the command line, the state file), so every use of it (the
//! protocol, the agent, reading and removing the record beneath its directory) holds a name
//! that cannot leave the directory.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The longest file name Linux accepts, in bytes.
const NAME_MAX: usize = 255;

/// An exit record's file name: non-empty, no `/`, no NUL, not `.` or `..`, at most 255 bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordName(String);

/// Why a string is not a record name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid file name \"{}\": {reason}",
    .name.chars().take(64).collect::<String>().escape_debug()
)]
pub struct InvalidRecordName {
    /// The name as given.
    pub name: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl RecordName {
    /// `name` if it is a single path component.
    pub fn parse(name: &str) -> Result<RecordName, InvalidRecordName> {
        let reason = if name.is_empty() {
            "empty"
        } else if name == "." || name == ".." {
            "a reference to a directory"
        } else if name.contains('/') {
            "contains '/'"
        } else if name.contains('\0') {
            "contains a NUL byte"
        } else if name.len() > NAME_MAX {
            "longer than 255 bytes"
        } else {
            return Ok(RecordName(name.to_owned()));
        };
        Err(InvalidRecordName {
            name: name.to_owned(),
            reason,
        })
    }

    /// The record's name when none is given: `exit-<invocation>.json`.
    pub fn for_invocation(invocation: &str) -> Result<RecordName, InvalidRecordName> {
        RecordName::parse(&format!("exit-{invocation}.json"))
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RecordName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for RecordName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for RecordName {
    type Err = InvalidRecordName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RecordName::parse(s)
    }
}

impl Serialize for RecordName {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for RecordName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        RecordName::parse(&name).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_name_is_one_path_component() {
        let long = "a".repeat(NAME_MAX + 1);
        for (name, reason) in [
            ("", "empty"),
            (".", "a reference to a directory"),
            ("..", "a reference to a directory"),
            ("a/b", "contains '/'"),
            ("/", "contains '/'"),
            ("../outside", "contains '/'"),
            ("a\0b", "contains a NUL byte"),
            (&long, "longer than 255 bytes"),
        ] {
            let err = RecordName::parse(name).expect_err(name);
            assert_eq!(err.reason, reason, "{name:?}");
        }
        for name in [
            "exit-0123.json",
            "a",
            "..a",
            ".hidden",
            &"a".repeat(NAME_MAX),
        ] {
            assert_eq!(RecordName::parse(name).expect(name).as_str(), name);
        }
    }

    #[test]
    fn the_message_quotes_the_name_escaped_and_says_why() {
        let err = RecordName::parse("a/\u{1b}").expect_err("a slash");
        assert_eq!(
            err.to_string(),
            "invalid file name \"a/\\u{1b}\": contains '/'"
        );
    }

    #[test]
    fn the_default_name_is_the_invocations() {
        let name = RecordName::for_invocation("0123abcd").expect("a hex invocation");
        assert_eq!(name.as_str(), "exit-0123abcd.json");
        assert!(RecordName::for_invocation("../x").is_err());
    }

    #[test]
    fn serde_round_trip_validates() {
        let name = RecordName::parse("r.json").expect("valid");
        let json = serde_json::to_string(&name).expect("serialize");
        assert_eq!(json, "\"r.json\"");
        assert_eq!(
            serde_json::from_str::<RecordName>(&json).expect("valid"),
            name
        );
        let err = serde_json::from_str::<RecordName>("\"a/b\"").expect_err("a slash");
        assert!(err.to_string().contains("contains '/'"), "{err}");
    }
}
