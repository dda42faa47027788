//! The framing: a byte stream split into newline-terminated lines of bounded length (pure).

use crate::control::protocol::{ErrorKind, Request, RequestError, parse_request};

/// Turns one split line into a request or a request error; `None` for blank lines.
pub(super) fn parse_line(line: Line<'_>, max_line: usize) -> Option<Result<Request, RequestError>> {
    match line {
        Line::Complete(bytes) if bytes.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r')) => None,
        Line::Complete(bytes) => Some(parse_request(bytes)),
        Line::TooLong => Some(Err(RequestError {
            id: None,
            kind: ErrorKind::LineTooLong,
            message: format!("request line is longer than {max_line} bytes; it was discarded"),
        })),
    }
}

/// A line produced by [`LineSplitter`].
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Line<'a> {
    /// A whole line without its newline.
    Complete(&'a [u8]),
    /// A line exceeded the limit; reported once, as soon as detected, and the rest of it is skipped.
    TooLong,
}

/// Splits a byte stream into newline-terminated lines, holding at most `max_line` bytes of a partial
/// line.
#[derive(Debug)]
pub(super) struct LineSplitter {
    partial: Vec<u8>,
    /// Inside an overlong line: bytes are dropped until its newline.
    discarding: bool,
    max_line: usize,
}

impl LineSplitter {
    pub(super) fn new(max_line: usize) -> LineSplitter {
        LineSplitter {
            partial: Vec::new(),
            discarding: false,
            max_line,
        }
    }

    pub(super) fn feed(&mut self, mut chunk: &[u8], mut on_line: impl FnMut(Line<'_>)) {
        while let Some(newline) = chunk.iter().position(|&b| b == b'\n') {
            let segment = &chunk[..newline];
            chunk = &chunk[newline + 1..];
            if self.discarding {
                self.discarding = false;
            } else if self.partial.len() + segment.len() > self.max_line {
                self.partial.clear();
                on_line(Line::TooLong);
            } else if self.partial.is_empty() {
                on_line(Line::Complete(segment));
            } else {
                self.partial.extend_from_slice(segment);
                on_line(Line::Complete(&self.partial));
                self.partial.clear();
            }
        }
        if self.discarding || chunk.is_empty() {
            return;
        }
        if self.partial.len() + chunk.len() > self.max_line {
            self.partial = Vec::new();
            self.discarding = true;
            on_line(Line::TooLong);
        } else {
            self.partial.extend_from_slice(chunk);
        }
    }

    /// Ends the stream: a last line without a newline still counts.
    pub(super) fn finish(&mut self, mut on_line: impl FnMut(Line<'_>)) {
        if !self.discarding && !self.partial.is_empty() {
            on_line(Line::Complete(&self.partial));
        }
        self.partial = Vec::new();
        self.discarding = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(max_line: usize, chunks: &[&[u8]]) -> (Vec<Option<Vec<u8>>>, usize) {
        let mut splitter = LineSplitter::new(max_line);
        let mut lines = Vec::new();
        let mut most_buffered = 0;
        let mut collect = |line: Line<'_>| {
            lines.push(match line {
                Line::Complete(bytes) => Some(bytes.to_vec()),
                Line::TooLong => None,
            })
        };
        for chunk in chunks {
            splitter.feed(chunk, &mut collect);
            most_buffered = most_buffered.max(splitter.partial.len());
        }
        splitter.finish(&mut collect);
        (lines, most_buffered)
    }

    #[test]
    fn splits_lines_across_chunks() {
        let some = |s: &str| Some(s.as_bytes().to_vec());
        type Case<'a> = (usize, Vec<&'a [u8]>, Vec<Option<Vec<u8>>>);
        let cases: Vec<Case<'_>> = vec![
            (10, vec![b"a\nb\n"], vec![some("a"), some("b")]),
            (10, vec![b"ab", b"c\n"], vec![some("abc")]),
            (10, vec![b"\n\n"], vec![some(""), some("")]),
            (10, vec![b"tail"], vec![some("tail")]),
            (3, vec![b"abc\n"], vec![some("abc")]),
            (3, vec![b"abcd\nok\n"], vec![None, some("ok")]),
            (
                3,
                vec![b"ab", b"cd", b"ef", b"\nok\n"],
                vec![None, some("ok")],
            ),
            (3, vec![b"abcdefgh"], vec![None]),
            (3, vec![b"abcd", b"\n", b"xy"], vec![None, some("xy")]),
            (3, vec![b"abcd", b"efgh\nabcd\n"], vec![None, None]),
        ];
        for (max_line, chunks, expected) in cases {
            let (lines, most_buffered) = split(max_line, &chunks);
            assert_eq!(lines, expected, "{chunks:?}");
            assert!(
                most_buffered <= max_line,
                "{chunks:?} buffered {most_buffered}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn chunking_does_not_change_lines(
            data in proptest::collection::vec(proptest::sample::select(b"ab\n".to_vec()), 0..200),
            cuts in proptest::collection::vec(0usize..200, 0..10),
        ) {
            let mut cuts: Vec<usize> = cuts.into_iter().map(|cut| cut.min(data.len())).collect();
            cuts.sort_unstable();
            let mut chunks: Vec<&[u8]> = Vec::new();
            let mut start = 0;
            for cut in cuts {
                chunks.push(&data[start..cut]);
                start = cut;
            }
            chunks.push(&data[start..]);
            let (whole, _) = split(8, &[&data]);
            let (pieces, most_buffered) = split(8, &chunks);
            proptest::prop_assert_eq!(whole, pieces);
            proptest::prop_assert!(most_buffered <= 8);
        }
    }
}
