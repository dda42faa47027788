//! Parsing of the command line's DUR arguments: a whole number followed by one unit (`500ms`, `10s`,
//! `2m`, `1h`). It never guesses a unit for a bare number and never saturates on overflow.

use std::time::Duration;

/// Why a DUR argument was rejected; each variant carries the text as given.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DurationError {
    /// The text is empty.
    #[error("duration is empty (write e.g. 10s)")]
    Empty,
    /// The text is a bare number; a unit is required.
    #[error(
        "duration \"{}\" has no unit: add one of ms, s, m, h (e.g. {}s)",
        .0.escape_debug(),
        .0.escape_debug()
    )]
    MissingUnit(String),
    /// The text does not start with a decimal number.
    #[error("duration \"{}\" must start with a whole number (e.g. 10s)", .0.escape_debug())]
    MissingNumber(String),
    /// The text after the number is not a known unit.
    #[error("duration \"{}\" has an unknown unit: use one of ms, s, m, h", .0.escape_debug())]
    UnknownUnit(String),
    /// The value does not fit in a `Duration`.
    #[error("duration \"{}\" is too large", .0.escape_debug())]
    Overflow(String),
}

/// Parses `<digits><unit>` with unit one of `ms`, `s`, `m`, `h`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    if text.is_empty() {
        return Err(DurationError::Empty);
    }
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    if digits.is_empty() {
        return Err(DurationError::MissingNumber(text.to_owned()));
    }
    if unit.is_empty() {
        return Err(DurationError::MissingUnit(text.to_owned()));
    }
    // None means milliseconds, the one unit finer than a second.
    let seconds_per_unit = match unit {
        "ms" => None,
        "s" => Some(1),
        "m" => Some(60),
        "h" => Some(3600),
        _ => return Err(DurationError::UnknownUnit(text.to_owned())),
    };
    // Only digits reach here, so the sole parse failure is a value beyond u64.
    let overflow = || DurationError::Overflow(text.to_owned());
    let value: u64 = digits.parse().map_err(|_| overflow())?;
    match seconds_per_unit {
        None => Ok(Duration::from_millis(value)),
        Some(seconds) => value
            .checked_mul(seconds)
            .map(Duration::from_secs)
            .ok_or_else(overflow),
    }
}

/// A duration as [`parse_duration`] reads it, or a bare `0` for zero ("never", "at once").
pub(crate) fn parse_interval(text: &str) -> Result<Duration, DurationError> {
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    parse_duration(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_unit() {
        let cases = [
            ("500ms", Duration::from_millis(500)),
            ("0ms", Duration::ZERO),
            ("10s", Duration::from_secs(10)),
            ("0s", Duration::ZERO),
            ("2m", Duration::from_secs(120)),
            ("1h", Duration::from_secs(3600)),
            ("007s", Duration::from_secs(7)),
            ("18446744073709551615ms", Duration::from_millis(u64::MAX)),
            ("18446744073709551615s", Duration::from_secs(u64::MAX)),
            (
                "5124095576030431h",
                Duration::from_secs(5_124_095_576_030_431 * 3600),
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_duration(text), Ok(expected), "{text}");
        }
    }

    #[test]
    fn rejects_with_reasons() {
        let owned = |s: &str| s.to_owned();
        let cases = [
            ("", DurationError::Empty),
            ("10", DurationError::MissingUnit(owned("10"))),
            ("s", DurationError::MissingNumber(owned("s"))),
            ("-5s", DurationError::MissingNumber(owned("-5s"))),
            ("+5s", DurationError::MissingNumber(owned("+5s"))),
            (" 5s", DurationError::MissingNumber(owned(" 5s"))),
            ("1.5s", DurationError::UnknownUnit(owned("1.5s"))),
            ("5 s", DurationError::UnknownUnit(owned("5 s"))),
            ("5S", DurationError::UnknownUnit(owned("5S"))),
            ("5sec", DurationError::UnknownUnit(owned("5sec"))),
            ("1h30m", DurationError::UnknownUnit(owned("1h30m"))),
            ("5s ", DurationError::UnknownUnit(owned("5s "))),
            ("5µs", DurationError::UnknownUnit(owned("5µs"))),
            (
                "18446744073709551616ms",
                DurationError::Overflow(owned("18446744073709551616ms")),
            ),
            (
                "99999999999999999999999h",
                DurationError::Overflow(owned("99999999999999999999999h")),
            ),
            (
                "5124095576030432h",
                DurationError::Overflow(owned("5124095576030432h")),
            ),
            (
                "307445734561825861m",
                DurationError::Overflow(owned("307445734561825861m")),
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_duration(text), Err(expected), "{text:?}");
        }
    }

    #[test]
    fn an_interval_may_be_a_bare_zero() {
        assert_eq!(parse_interval("0"), Ok(Duration::ZERO));
        assert_eq!(parse_interval("20ms"), Ok(Duration::from_millis(20)));
        assert_eq!(
            parse_interval("5"),
            Err(DurationError::MissingUnit("5".to_owned()))
        );
        assert_eq!(
            parse_interval("abc"),
            Err(DurationError::MissingNumber("abc".to_owned()))
        );
    }

    #[test]
    fn bare_number_message_suggests_a_unit() {
        let message = parse_duration("30").expect_err("bare number").to_string();
        assert_eq!(
            message,
            "duration \"30\" has no unit: add one of ms, s, m, h (e.g. 30s)"
        );
    }
}
