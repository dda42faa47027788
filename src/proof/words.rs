//! The words systemd says of a unit's state (ActiveState, SubState, Result), kept without an
//! allocation: every watch holds several, and almost all are a few known words.

use std::ops::Deref;

/// A state word of systemd's (ActiveState, SubState, Result). One of the words it is known to
/// say is kept as its index in the list, so the common case costs a watch no allocation and
/// 16 bytes (a `Cow<'static, str>` was 24, four of them a watch).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Word(Spelled);

#[derive(Clone, Debug, PartialEq, Eq)]
enum Spelled {
    Known(u8),
    /// A word this list does not have (a newer systemd's), behind a thin pointer.
    #[expect(
        clippy::box_collection,
        reason = "a thin pointer keeps every word 16 bytes"
    )]
    Other(Box<String>),
}

impl Deref for Word {
    type Target = str;

    fn deref(&self) -> &str {
        match &self.0 {
            Spelled::Known(i) => KNOWN_WORDS[usize::from(*i)],
            Spelled::Other(word) => word,
        }
    }
}

/// The words systemd says in ActiveState, SubState and Result, sorted for a binary search.
const KNOWN_WORDS: &[&str] = &[
    "abandoned",
    "activating",
    "active",
    "auto-restart",
    "auto-restart-queued",
    "cleaning",
    "condition",
    "core-dump",
    "deactivating",
    "dead",
    "dependency",
    "elapsed",
    "exec-condition",
    "exit-code",
    "exited",
    "failed",
    "final-sigkill",
    "final-sigterm",
    "final-watchdog",
    "inactive",
    "listening",
    "maintenance",
    "mounted",
    "oom-kill",
    "plugged",
    "protocol",
    "refreshing",
    "reload",
    "reload-notify",
    "reload-signal",
    "reloading",
    "resources",
    "running",
    "signal",
    "start",
    "start-limit-hit",
    "start-post",
    "start-pre",
    "stop",
    "stop-post",
    "stop-sigkill",
    "stop-sigterm",
    "stop-watchdog",
    "success",
    "timeout",
    "waiting",
    "watchdog",
];

/// `word` as the index of a word systemd is known to say, else a copy.
pub(crate) fn word(word: &str) -> Word {
    match KNOWN_WORDS
        .binary_search(&word)
        .ok()
        .and_then(|i| u8::try_from(i).ok())
    {
        Some(i) => Word(Spelled::Known(i)),
        None => Word(Spelled::Other(Box::new(word.to_owned()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_words_are_sorted_so_that_each_is_found() {
        assert!(KNOWN_WORDS.windows(2).all(|w| w[0] < w[1]));
        for known in KNOWN_WORDS {
            assert!(matches!(word(known).0, Spelled::Known(_)), "{known}");
            assert_eq!(&*word(known), *known);
        }
        let other = word("a-state-of-a-newer-systemd");
        assert!(matches!(other.0, Spelled::Other(_)));
        assert_eq!(&*other, "a-state-of-a-newer-systemd");
        assert_eq!(std::mem::size_of::<Option<Word>>(), 16);
    }
}
