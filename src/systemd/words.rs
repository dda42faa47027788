//! The words systemd says of a unit's state (ActiveState, SubState, Result), kept without an
//! allocation: every watch holds several, and almost all are a few known words.

use std::borrow::Cow;

/// A state word of systemd's (ActiveState, SubState, Result): one of the words it is known to
/// say is kept as a static string, so the common case costs a watch no allocation.
pub(crate) type Word = Cow<'static, str>;

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

/// `word` as a static string if systemd is known to say it, else a copy.
pub(crate) fn word(word: &str) -> Word {
    match KNOWN_WORDS.binary_search(&word) {
        Ok(i) => Cow::Borrowed(KNOWN_WORDS[i]),
        Err(_) => Cow::Owned(word.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_words_are_sorted_so_that_each_is_found() {
        assert!(KNOWN_WORDS.windows(2).all(|w| w[0] < w[1]));
        assert!(matches!(word("inactive"), Cow::Borrowed("inactive")));
        assert_eq!(
            word("a-state-of-a-newer-systemd"),
            "a-state-of-a-newer-systemd"
        );
    }
}
