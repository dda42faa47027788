//! Parsing of the command line's durations as systemd parses a time span (systemd.time(7),
//! `parse_time` in systemd's src/basic/time-util.c with seconds as the default unit, as
//! `parse_sec` does): `2min`, `1min 30s`, `1.5s`, `100us`, a bare `30` (seconds), `infinity`.
//! Microseconds are the finest unit, as in systemd; nothing saturates, and each error names
//! what was wrong.

use std::time::Duration;

/// Microseconds in a second.
const SECOND: u64 = 1_000_000;

/// The units systemd accepts, in `extract_multiplier`'s order: the first prefix that matches
/// wins, so a longer unit comes before its own prefix (`ms` before `m`, `min` before `m`).
const UNITS: [(&str, u64); 30] = [
    ("seconds", SECOND),
    ("second", SECOND),
    ("sec", SECOND),
    ("s", SECOND),
    ("minutes", 60 * SECOND),
    ("minute", 60 * SECOND),
    ("min", 60 * SECOND),
    ("months", MONTH),
    ("month", MONTH),
    ("M", MONTH),
    ("msec", 1000),
    ("ms", 1000),
    ("m", 60 * SECOND),
    ("hours", 3600 * SECOND),
    ("hour", 3600 * SECOND),
    ("hr", 3600 * SECOND),
    ("h", 3600 * SECOND),
    ("days", DAY),
    ("day", DAY),
    ("d", DAY),
    ("weeks", 7 * DAY),
    ("week", 7 * DAY),
    ("w", 7 * DAY),
    ("years", YEAR),
    ("year", YEAR),
    ("y", YEAR),
    ("usec", 1),
    ("us", 1),
    ("\u{3bc}s", 1),
    ("\u{b5}s", 1),
];
const DAY: u64 = 86_400 * SECOND;
/// systemd's month and year: 30.44 and 365.25 days.
const MONTH: u64 = 2_629_800 * SECOND;
const YEAR: u64 = 31_557_600 * SECOND;

/// What a time span says: a length, or `infinity`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Timespan {
    /// A length of time, whole microseconds.
    Finite(Duration),
    /// `infinity`: no limit.
    Infinity,
}

/// Why a duration was rejected; each variant carries the text as given.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DurationError {
    /// The text is empty or only white space.
    #[error("duration is empty (write e.g. 10s, 2min or 1min 30s)")]
    Empty,
    /// A number is negative.
    #[error("duration \"{}\" is negative", .0.escape_debug())]
    Negative(String),
    /// Where a number should start, something else does.
    #[error(
        "duration \"{}\": expected a number at \"{}\"",
        .text.escape_debug(),
        .at.escape_debug()
    )]
    MissingNumber {
        /// The whole text.
        text: String,
        /// The rest of it, from where the number should be.
        at: String,
    },
    /// The text after a number is not a unit systemd knows.
    #[error(
        "duration \"{}\": unknown unit \"{}\" (use us, ms, s, min, h, d, w, M or y)",
        .text.escape_debug(),
        .unit.escape_debug()
    )]
    UnknownUnit {
        /// The whole text.
        text: String,
        /// The rest of it, from where the unit should be.
        unit: String,
    },
    /// A decimal point with no digit after it (`3.s`).
    #[error("duration \"{}\": a decimal point needs a digit after it", .0.escape_debug())]
    BareDecimalPoint(String),
    /// `infinity` followed by more than white space.
    #[error("duration \"{}\": \"infinity\" stands alone", .0.escape_debug())]
    InfinityWithMore(String),
    /// The value does not fit in 2^64-1 microseconds, systemd's own limit.
    #[error("duration \"{}\" is too large", .0.escape_debug())]
    Overflow(String),
    /// `infinity` where a finite duration is needed.
    #[error("duration \"{}\" must be finite", .0.escape_debug())]
    Infinite(String),
}

/// White space as systemd's `WHITESPACE`.
fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

/// Parses a time span as systemd's `parse_sec`: a sum of `<number>[.<digits>][ ]<unit>`
/// terms, a term without a unit in seconds, or `infinity` alone.
pub(crate) fn parse_timespan(text: &str) -> Result<Timespan, DurationError> {
    let start = text.trim_start_matches(is_space);
    if let Some(after) = start.strip_prefix("infinity") {
        return if after.chars().all(is_space) {
            Ok(Timespan::Infinity)
        } else {
            Err(DurationError::InfinityWithMore(text.to_owned()))
        };
    }
    let overflow = || DurationError::Overflow(text.to_owned());
    let mut total: u64 = 0;
    let mut rest = start;
    let mut something = false;
    loop {
        rest = rest.trim_start_matches(is_space);
        if rest.is_empty() {
            break;
        }
        if rest.starts_with('-') {
            return Err(DurationError::Negative(text.to_owned()));
        }
        // strtoll's optional sign; systemd takes `+5s`.
        let number = rest.strip_prefix('+').unwrap_or(rest);
        let whole_len = number
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(number.len());
        let (whole, after_whole) = number.split_at(whole_len);
        let (fraction, after_number) = match after_whole.strip_prefix('.') {
            Some(after_point) => {
                let len = after_point
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(after_point.len());
                (Some(&after_point[..len]), &after_point[len..])
            }
            // systemd takes `.5s` (strtoll reads nothing, then the fraction), but not `s`.
            None if whole.is_empty() => {
                return Err(DurationError::MissingNumber {
                    text: text.to_owned(),
                    at: rest.to_owned(),
                });
            }
            None => (None, after_whole),
        };
        let unit_start = after_number.trim_start_matches(is_space);
        let (multiplier, after_unit) = match UNITS
            .iter()
            .find_map(|(unit, usec)| unit_start.strip_prefix(unit).map(|after| (*usec, after)))
        {
            Some(found) => found,
            // No unit: seconds, as long as the end or another number follows after white
            // space (`12.34.56` is no span, `12.34 .56` is two; systemd would fail on the
            // next number of `5 parsecs`, which is an unknown unit to a person).
            None if after_number.is_empty()
                || (after_number.starts_with(is_space)
                    && (unit_start.is_empty()
                        || unit_start
                            .starts_with(|c: char| c.is_ascii_digit() || ".+-".contains(c)))) =>
            {
                (SECOND, after_number)
            }
            None => {
                return Err(DurationError::UnknownUnit {
                    text: text.to_owned(),
                    unit: unit_start.to_owned(),
                });
            }
        };
        let whole: u64 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| overflow())?
        };
        let mut term = whole.checked_mul(multiplier).ok_or_else(overflow)?;
        if let Some(fraction) = fraction {
            if fraction.is_empty() {
                return Err(DurationError::BareDecimalPoint(text.to_owned()));
            }
            // Each digit a tenth of the one before, down to a microsecond, as systemd.
            let mut place = multiplier / 10;
            for digit in fraction.bytes() {
                term = term
                    .checked_add(u64::from(digit - b'0') * place)
                    .ok_or_else(overflow)?;
                place /= 10;
            }
        }
        // u64::MAX microseconds is systemd's USEC_INFINITY, never a length.
        total = total
            .checked_add(term)
            .filter(|total| *total < u64::MAX)
            .ok_or_else(overflow)?;
        something = true;
        rest = after_unit;
    }
    if !something {
        return Err(DurationError::Empty);
    }
    Ok(Timespan::Finite(Duration::from_micros(total)))
}

/// A finite duration as [`parse_timespan`] reads it.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    match parse_timespan(text)? {
        Timespan::Finite(duration) => Ok(duration),
        Timespan::Infinity => Err(DurationError::Infinite(text.to_owned())),
    }
}

/// A timeout as [`parse_timespan`] reads it: `None` for `infinity`, no limit.
pub(crate) fn parse_timeout(text: &str) -> Result<Option<Duration>, DurationError> {
    Ok(match parse_timespan(text)? {
        Timespan::Finite(duration) => Some(duration),
        Timespan::Infinity => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1000;

    fn micros(us: u64) -> Result<Timespan, DurationError> {
        Ok(Timespan::Finite(Duration::from_micros(us)))
    }

    #[test]
    fn parses_what_systemd_parses() {
        let cases = [
            ("30", micros(30 * SECOND)),
            ("0", micros(0)),
            ("500ms", micros(500 * MS)),
            ("10s", micros(10 * SECOND)),
            ("2min", micros(120 * SECOND)),
            ("2m", micros(120 * SECOND)),
            ("1min 30s", micros(90 * SECOND)),
            ("1min30s", micros(90 * SECOND)),
            ("1.5s", micros(1500 * MS)),
            ("1.5", micros(1500 * MS)),
            (".5s", micros(500 * MS)),
            ("100us", micros(100)),
            ("100usec", micros(100)),
            ("100\u{b5}s", micros(100)),
            ("100\u{3bc}s", micros(100)),
            ("5 s", micros(5 * SECOND)),
            ("  7sec ", micros(7 * SECOND)),
            ("+5s", micros(5 * SECOND)),
            ("1h", micros(3600 * SECOND)),
            ("2hr", micros(7200 * SECOND)),
            ("1d", micros(DAY)),
            ("1w", micros(7 * DAY)),
            ("1M", micros(MONTH)),
            ("1y", micros(YEAR)),
            ("1 2", micros(3 * SECOND)),
            ("12.34 .56", micros(12_900 * MS)),
            ("1.0000001s", micros(SECOND)),
            ("3 minutes 2 seconds", micros(182 * SECOND)),
            ("1h30min", micros(5400 * SECOND)),
            ("infinity", Ok(Timespan::Infinity)),
            (" infinity ", Ok(Timespan::Infinity)),
            ("18446744073709551614us", micros(u64::MAX - 1)),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_timespan(text), expected, "{text:?}");
        }
    }

    #[test]
    fn rejects_what_systemd_rejects_and_says_why() {
        let cases = [
            ("", "duration is empty (write e.g. 10s, 2min or 1min 30s)"),
            (
                "   ",
                "duration is empty (write e.g. 10s, 2min or 1min 30s)",
            ),
            ("-5s", "duration \"-5s\" is negative"),
            ("1s -1s", "duration \"1s -1s\" is negative"),
            ("s", "duration \"s\": expected a number at \"s\""),
            ("5s x", "duration \"5s x\": expected a number at \"x\""),
            ("5sx", "duration \"5sx\": expected a number at \"x\""),
            (
                "5 parsecs",
                "duration \"5 parsecs\": unknown unit \"parsecs\" (use us, ms, s, min, h, d, \
                 w, M or y)",
            ),
            (
                "5S",
                "duration \"5S\": unknown unit \"S\" (use us, ms, s, min, h, d, w, M or y)",
            ),
            (
                "12.34.56",
                "duration \"12.34.56\": unknown unit \".56\" (use us, ms, s, min, h, d, w, M \
                 or y)",
            ),
            (
                "3.s",
                "duration \"3.s\": a decimal point needs a digit after it",
            ),
            (
                "infinityx",
                "duration \"infinityx\": \"infinity\" stands alone",
            ),
            (
                "infinity 5s",
                "duration \"infinity 5s\": \"infinity\" stands alone",
            ),
            (
                "18446744073709551615us",
                "duration \"18446744073709551615us\" is too large",
            ),
            (
                "99999999999999999999999s",
                "duration \"99999999999999999999999s\" is too large",
            ),
            ("584555y", "duration \"584555y\" is too large"),
        ];
        for (text, expected) in cases {
            let error = parse_timespan(text).expect_err(text);
            assert_eq!(error.to_string(), expected, "{text:?}");
        }
    }

    #[test]
    fn a_timeout_may_be_infinite_a_duration_may_not() {
        assert_eq!(parse_timeout("infinity"), Ok(None));
        assert_eq!(parse_timeout("2min"), Ok(Some(Duration::from_secs(120))));
        assert_eq!(
            parse_duration("infinity"),
            Err(DurationError::Infinite("infinity".to_owned()))
        );
        assert_eq!(
            parse_duration("infinity")
                .expect_err("infinite")
                .to_string(),
            "duration \"infinity\" must be finite"
        );
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
    }
}
