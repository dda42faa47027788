//! Validation of systemd unit names, following systemd's `unit_name_is_valid()` (src/basic/unit-name.c).
//!
//! Only names of units that can actually exist are accepted: plain names (`foo.service`) and template
//! instances (`foo@bar.service`). A bare template (`foo@.service`) is rejected because no unit of that
//! name ever runs. This module never talks to systemd; it only checks text.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The longest unit name systemd accepts, in bytes (`UNIT_NAME_MAX` is 256 including the NUL).
pub const UNIT_NAME_MAX_BYTES: usize = 255;

/// The unit type suffixes systemd knows (`unit_type_from_string()`), without the dot.
const UNIT_TYPES: [&str; 11] = [
    "service",
    "socket",
    "target",
    "device",
    "mount",
    "automount",
    "swap",
    "timer",
    "path",
    "slice",
    "scope",
];

/// How many characters of a rejected name an error message quotes, so a hostile name cannot flood a log.
const QUOTED_NAME_CHARS: usize = 80;

/// A syntactically valid name of a unit that can exist: `prefix.type` or `prefix@instance.type`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UnitName(String);

impl UnitName {
    /// Returns the name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Returns the owned name.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for UnitName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for UnitName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for UnitName {
    type Err = InvalidUnitName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        validate(s)
    }
}

impl Serialize for UnitName {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for UnitName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct UnitNameVisitor;

        impl serde::de::Visitor<'_> for UnitNameVisitor {
            type Value = UnitName;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a systemd unit name such as foo.service")
            }

            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<UnitName, E> {
                validate(s).map_err(E::custom)
            }
        }

        deserializer.deserialize_str(UnitNameVisitor)
    }
}

/// Why a string is not a usable unit name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UnitNameProblem {
    /// The string is empty.
    Empty,
    /// The string is longer than [`UNIT_NAME_MAX_BYTES`]; carries its length in bytes.
    TooLong(usize),
    /// There is no `.type` suffix, or nothing before it.
    MissingSuffix,
    /// The text after the last dot is not a unit type; carries that text.
    UnknownSuffix(String),
    /// A character outside `[A-Za-z0-9:_.\-]` (plus `@` as the template separator and in instances).
    InvalidCharacter(char),
    /// The name starts with `@`, so the template prefix is empty.
    EmptyTemplatePrefix,
    /// The name is a template (`foo@.service`) with no instance; no such unit ever runs.
    TemplateWithoutInstance,
}

impl fmt::Display for UnitNameProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnitNameProblem::Empty => f.write_str("unit name is empty"),
            UnitNameProblem::TooLong(len) => write!(
                f,
                "unit name is {len} bytes long, the limit is {UNIT_NAME_MAX_BYTES}"
            ),
            UnitNameProblem::MissingSuffix => {
                f.write_str("unit name must end with a unit type suffix such as .service")
            }
            UnitNameProblem::UnknownSuffix(suffix) => write!(
                f,
                "unit name ends with .{}, which is not a unit type (expected one of .{})",
                suffix.escape_debug(),
                UNIT_TYPES.join(", .")
            ),
            UnitNameProblem::InvalidCharacter(c) => write!(
                f,
                "unit name contains an invalid character '{}'",
                c.escape_debug()
            ),
            UnitNameProblem::EmptyTemplatePrefix => {
                f.write_str("unit name must not start with '@'")
            }
            UnitNameProblem::TemplateWithoutInstance => f.write_str(
                "unit name is a template without an instance (write prefix@instance.type)",
            ),
        }
    }
}

/// The error for a string that is not a usable unit name: the offending name and the reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct InvalidUnitName {
    /// The rejected text, as given.
    pub name: String,
    /// Why it was rejected.
    pub problem: UnitNameProblem,
}

impl fmt::Display for InvalidUnitName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let quoted: String = self.name.chars().take(QUOTED_NAME_CHARS).collect();
        let ellipsis = if quoted.len() < self.name.len() {
            "..."
        } else {
            ""
        };
        write!(
            f,
            "invalid unit name \"{}{ellipsis}\": {}",
            quoted.escape_debug(),
            self.problem
        )
    }
}

/// Checks `name` the way systemd's `unit_name_is_valid(name, UNIT_NAME_PLAIN | UNIT_NAME_INSTANCE)` does,
/// returning the validated name or the first problem found (in systemd's order of checks).
pub fn validate(name: &str) -> Result<UnitName, InvalidUnitName> {
    check(name)
        .map(|()| UnitName(name.to_owned()))
        .map_err(|problem| InvalidUnitName {
            name: name.to_owned(),
            problem,
        })
}

fn check(name: &str) -> Result<(), UnitNameProblem> {
    if name.is_empty() {
        return Err(UnitNameProblem::Empty);
    }
    if name.len() > UNIT_NAME_MAX_BYTES {
        return Err(UnitNameProblem::TooLong(name.len()));
    }
    // Like systemd, the suffix is whatever follows the LAST dot; dots before it belong to the prefix.
    let (stem, suffix) = match name.rsplit_once('.') {
        Some((stem, suffix)) if !stem.is_empty() => (stem, suffix),
        _ => return Err(UnitNameProblem::MissingSuffix),
    };
    if !UNIT_TYPES.contains(&suffix) {
        return Err(UnitNameProblem::UnknownSuffix(suffix.to_owned()));
    }
    if let Some(bad) = stem.chars().find(|&c| !is_valid_char(c) && c != '@') {
        return Err(UnitNameProblem::InvalidCharacter(bad));
    }
    // The first '@' separates prefix from instance; later ones are part of the instance.
    match stem.find('@') {
        None => Ok(()),
        Some(0) => Err(UnitNameProblem::EmptyTemplatePrefix),
        Some(at) if at + 1 == stem.len() => Err(UnitNameProblem::TemplateWithoutInstance),
        Some(_) => Ok(()),
    }
}

/// systemd's `VALID_CHARS`: ASCII letters and digits plus `:-_.\`.
fn is_valid_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, ':' | '-' | '_' | '.' | '\\')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_valid_names() {
        let long_valid = format!(
            "{}.service",
            "a".repeat(UNIT_NAME_MAX_BYTES - ".service".len())
        );
        let cases = [
            "x.service",
            "a@b.service",
            "getty@tty1.service",
            "a@b@c.service",
            "systemd-fsck@dev-disk-by\\x2duuid-1234.service",
            "user-1000.slice",
            "run-r0123456789abcdef.scope",
            "-.mount",
            "a.b.c.timer",
            "foo:bar_baz.socket",
            "..service",
            "x.automount",
            "x.device",
            "x.swap",
            "x.path",
            "x.target",
            long_valid.as_str(),
        ];
        for name in cases {
            let unit = validate(name).unwrap_or_else(|e| panic!("{name:?} rejected: {e}"));
            assert_eq!(unit.as_str(), name);
            assert_eq!(unit.to_string(), name);
        }
    }

    #[test]
    fn rejects_invalid_names_with_reasons() {
        let too_long = format!("{}.service", "a".repeat(256 - ".service".len()));
        let cases: Vec<(&str, UnitNameProblem)> = vec![
            ("", UnitNameProblem::Empty),
            (too_long.as_str(), UnitNameProblem::TooLong(256)),
            ("x", UnitNameProblem::MissingSuffix),
            (".service", UnitNameProblem::MissingSuffix),
            ("x.", UnitNameProblem::UnknownSuffix(String::new())),
            ("x.servic", UnitNameProblem::UnknownSuffix("servic".into())),
            (
                "x.SERVICE",
                UnitNameProblem::UnknownSuffix("SERVICE".into()),
            ),
            ("../x.service", UnitNameProblem::InvalidCharacter('/')),
            ("a b.service", UnitNameProblem::InvalidCharacter(' ')),
            ("café.service", UnitNameProblem::InvalidCharacter('é')),
            ("a\0.service", UnitNameProblem::InvalidCharacter('\0')),
            ("a\n.service", UnitNameProblem::InvalidCharacter('\n')),
            ("@b.service", UnitNameProblem::EmptyTemplatePrefix),
            ("@.service", UnitNameProblem::EmptyTemplatePrefix),
            ("a@.service", UnitNameProblem::TemplateWithoutInstance),
            (
                "x.service/a",
                UnitNameProblem::UnknownSuffix("service/a".into()),
            ),
        ];
        for (name, problem) in cases {
            let err = validate(name).expect_err(name);
            assert_eq!(err.problem, problem, "{name:?}");
            assert_eq!(err.name, name);
        }
    }

    #[test]
    fn messages_say_why() {
        let cases = [
            (
                "x",
                "invalid unit name \"x\": unit name must end with a unit type suffix such as .service",
            ),
            (
                "../x.service",
                "invalid unit name \"../x.service\": unit name contains an invalid character '/'",
            ),
            (
                "a@.service",
                "invalid unit name \"a@.service\": unit name is a template without an instance \
                 (write prefix@instance.type)",
            ),
            ("", "invalid unit name \"\": unit name is empty"),
            (
                "a\n.service",
                "invalid unit name \"a\\n.service\": unit name contains an invalid character '\\n'",
            ),
        ];
        for (name, message) in cases {
            assert_eq!(validate(name).expect_err(name).to_string(), message);
        }
    }

    #[test]
    fn long_names_are_quoted_truncated() {
        let message = validate(&"/".repeat(10_000))
            .expect_err("slashes")
            .to_string();
        assert!(message.len() < 300, "{message}");
        assert!(message.contains("...\""), "{message}");
    }

    #[test]
    fn serde_round_trip_validates() {
        let unit: UnitName = serde_json::from_str("\"a@b.service\"").expect("valid name");
        assert_eq!(
            serde_json::to_string(&unit).expect("serialize"),
            "\"a@b.service\""
        );
        let err = serde_json::from_str::<UnitName>("\"a/b.service\"").expect_err("slash");
        assert!(err.to_string().contains("invalid character '/'"), "{err}");
        assert!(serde_json::from_str::<UnitName>("42").is_err());
    }
}
