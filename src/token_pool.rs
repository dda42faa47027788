//! Hands out mio tokens from a range, fresh ones before freed ones, so a token is reused only
//! after the whole range has been used: an event still queued for a token's past owner then
//! almost never reaches a new one (and the owners check readiness again anyway).

use std::collections::VecDeque;
use std::ops::Range;

use mio::Token;

/// The tokens of one range: the never-used ones in order, then the freed ones oldest first.
#[derive(Debug)]
pub(crate) struct TokenPool {
    range: Range<usize>,
    next_fresh: usize,
    freed: VecDeque<usize>,
}

impl TokenPool {
    pub(crate) fn new(range: Range<usize>) -> Self {
        Self {
            next_fresh: range.start,
            range,
            freed: VecDeque::new(),
        }
    }

    /// A token no one holds, or `None` when every token of the range is held.
    pub(crate) fn take(&mut self) -> Option<Token> {
        if self.next_fresh < self.range.end {
            self.next_fresh += 1;
            Some(Token(self.next_fresh - 1))
        } else {
            self.freed.pop_front().map(Token)
        }
    }

    /// Returns a token taken from this pool.
    pub(crate) fn give_back(&mut self, token: Token) {
        self.freed.push_back(token.0);
    }

    /// Whether `token` lies in this pool's range (held or not).
    pub(crate) fn owns(&self, token: Token) -> bool {
        self.range.contains(&token.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_tokens_come_before_freed_ones_and_freed_ones_oldest_first() {
        let mut pool = TokenPool::new(10..13);
        assert_eq!(pool.take(), Some(Token(10)));
        assert_eq!(pool.take(), Some(Token(11)));
        pool.give_back(Token(10));
        assert_eq!(
            pool.take(),
            Some(Token(12)),
            "a fresh one before a freed one"
        );
        pool.give_back(Token(12));
        assert_eq!(pool.take(), Some(Token(10)), "the oldest freed one first");
        assert_eq!(pool.take(), Some(Token(12)));
        assert_eq!(pool.take(), None, "every token is held");
    }

    #[test]
    fn owns_exactly_its_range() {
        let pool = TokenPool::new(10..13);
        assert!(!pool.owns(Token(9)));
        assert!(pool.owns(Token(10)));
        assert!(pool.owns(Token(12)));
        assert!(!pool.owns(Token(13)));
    }

    #[test]
    fn an_empty_range_has_no_token() {
        assert_eq!(TokenPool::new(5..5).take(), None);
    }
}
