//! Parses the cgroup v2 `cgroup.events` file. Pure: no I/O here, and a malformed file must never be
//! read as "empty", because "empty" is the proof this agent gives. What one read showed is the
//! proof's input, [`crate::proof::CgroupReading`], which the proof owns.

/// Why the contents of a `cgroup.events` file were rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum EventsParseError {
    /// The contents are not UTF-8.
    #[error("cgroup.events is not utf-8")]
    NotUtf8,
    /// A line is not of the form `key value`.
    #[error("malformed line in cgroup.events: {0:?}")]
    MalformedLine(String),
    /// No `populated` line was found.
    #[error("cgroup.events has no populated key")]
    MissingPopulated,
    /// More than one `populated` line was found.
    #[error("cgroup.events has more than one populated key")]
    DuplicatePopulated,
    /// The `populated` value is neither `0` nor `1`.
    #[error("cgroup.events has populated value {0:?}, expected 0 or 1")]
    BadPopulatedValue(String),
}

/// Returns the `populated` flag of a `cgroup.events` file's contents.
///
/// The format is one `key value` pair per line, such as `"populated 1\nfrozen 0\n"`. Exactly one
/// `populated` key with value `0` or `1` is required; other keys are ignored but must still be
/// well-formed lines. Any deviation is an error, never "empty".
pub(crate) fn parse_populated(contents: &[u8]) -> Result<bool, EventsParseError> {
    let text = std::str::from_utf8(contents).map_err(|_| EventsParseError::NotUtf8)?;
    let mut populated = None;
    // split_terminator rather than lines(): lines() would silently accept "\r\n" endings.
    for line in text.split_terminator('\n') {
        let mut words = line.split(' ');
        let (Some(key), Some(value), None) = (words.next(), words.next(), words.next()) else {
            return Err(EventsParseError::MalformedLine(line.to_owned()));
        };
        if key.is_empty() || value.is_empty() {
            return Err(EventsParseError::MalformedLine(line.to_owned()));
        }
        if key != "populated" {
            continue;
        }
        if populated.is_some() {
            return Err(EventsParseError::DuplicatePopulated);
        }
        populated = Some(match value {
            "0" => false,
            "1" => true,
            other => return Err(EventsParseError::BadPopulatedValue(other.to_owned())),
        });
    }
    populated.ok_or(EventsParseError::MissingPopulated)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_populated_accepts_only_well_formed_files() {
        use EventsParseError::*;
        let cases: &[(&[u8], Result<bool, EventsParseError>)] = &[
            (b"populated 1\nfrozen 0\n", Ok(true)),
            (b"populated 0\nfrozen 0\n", Ok(false)),
            (b"frozen 1\npopulated 0\n", Ok(false)),
            (b"populated 1", Ok(true)),
            (b"populated 0\nfrozen 0\nnewkey 42\n", Ok(false)),
            (b"", Err(MissingPopulated)),
            (b"frozen 0\n", Err(MissingPopulated)),
            (b"populated 1\npopulated 1\n", Err(DuplicatePopulated)),
            (b"populated 0\npopulated 1\n", Err(DuplicatePopulated)),
            (b"populated 2\n", Err(BadPopulatedValue("2".into()))),
            (b"populated yes\n", Err(BadPopulatedValue("yes".into()))),
            (b"populated 01\n", Err(BadPopulatedValue("01".into()))),
            (b"populated\n", Err(MalformedLine("populated".into()))),
            (b"populated  1\n", Err(MalformedLine("populated  1".into()))),
            (
                b"populated 1 0\n",
                Err(MalformedLine("populated 1 0".into())),
            ),
            (b" populated 1\n", Err(MalformedLine(" populated 1".into()))),
            (
                b"populated 1\n\nfrozen 0\n",
                Err(MalformedLine(String::new())),
            ),
            (b"populated\t1\n", Err(MalformedLine("populated\t1".into()))),
            (b"populated 1\r\n", Err(BadPopulatedValue("1\r".into()))),
            (b"\n", Err(MalformedLine(String::new()))),
            (b"populated 0\xff\n", Err(NotUtf8)),
            (b"\x00\x00\x00", Err(MalformedLine("\0\0\0".into()))),
        ];
        for (contents, expected) in cases {
            assert_eq!(
                &parse_populated(contents),
                expected,
                "contents {:?}",
                String::from_utf8_lossy(contents)
            );
        }
    }

    #[test]
    fn parse_errors_display_in_lower_case() {
        let errors = [
            EventsParseError::NotUtf8,
            EventsParseError::MalformedLine("x".into()),
            EventsParseError::MissingPopulated,
            EventsParseError::DuplicatePopulated,
            EventsParseError::BadPopulatedValue("2".into()),
        ];
        for error in errors {
            let message = error.to_string();
            assert!(message.starts_with("cgroup.events") || message.starts_with("malformed"));
            assert!(!message.ends_with('.'), "{message}");
        }
    }
}
