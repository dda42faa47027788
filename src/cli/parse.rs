//! Reads the command line against its table (`spec.rs`), with lexopt for the words' syntax
//! (`--name value`, `--name=value`, `-p value`, `-pvalue`, `--`): the options before the
//! subcommand, the subcommand, and the words given for each of its options and arguments,
//! checked against what the table says (required, given twice, requires, conflicts with). The
//! subcommand's code (`cli.rs`) then types the words ([`Matches`]).

use std::ffi::{OsStr, OsString};
use std::fmt::Display;
use std::path::PathBuf;

use lexopt::Arg as Word;

use super::help;
use super::spec::{self, Arg, COMMANDS, Command, Kind, LEADING, Required};

/// What the command line asks for.
#[derive(Debug)]
pub(super) enum Parsed {
    /// A subcommand to run: the options before it, and its own.
    Run {
        leading: Matches,
        command: &'static Command,
        matches: Matches,
    },
    /// Text to print on stdout, and done: help or the version.
    Print(String),
}

/// A command line that is wrong: what `--json` reports, and what stderr is told.
#[derive(Debug)]
pub(super) struct UsageError {
    /// What is wrong, in one line.
    pub(super) message: String,
    /// The text for stderr: the message, a tip, the usage line, a pointer to `--help`.
    pub(super) text: String,
}

impl UsageError {
    /// As clap wrote its errors: the message, a tip if there is one, the usage line of the
    /// subcommand (or with `None` of `exitproof`), and a pointer to `--help`.
    fn new(message: String, tip: Option<String>, command: Option<&Command>) -> UsageError {
        let mut text = format!("error: {message}\n\n");
        if let Some(tip) = tip {
            text.push_str(&format!("  tip: {tip}\n\n"));
        }
        text.push_str(&format!("Usage: {}\n\n", help::usage(command)));
        text.push_str("For more information, try '--help'.\n");
        UsageError { message, text }
    }

    /// A value its argument's parser refused, with the parser's reason (without a usage line,
    /// as clap wrote it: the value is what is wrong).
    fn invalid(arg: &Arg, value: &OsStr, reason: &dyn Display) -> UsageError {
        let value = value.to_string_lossy();
        let message = format!("invalid value '{value}' for '{}': {reason}", arg.display());
        let text = format!("error: {message}\n\nFor more information, try '--help'.\n");
        UsageError { message, text }
    }
}

/// The words given for each option and argument of a command (`exitproof`'s own before the
/// subcommand, or a subcommand's), read by name.
#[derive(Debug)]
pub(super) struct Matches {
    /// The subcommand; `None`: `exitproof`'s own options.
    command: Option<&'static Command>,
    /// Each argument the command takes, with the words given for it; a flag has an empty word
    /// for each time it is given.
    given: Vec<(&'static Arg, Vec<OsString>)>,
}

impl Matches {
    fn new(command: Option<&'static Command>) -> Matches {
        let given = match command {
            Some(command) => command.args().map(|arg| (arg, Vec::new())).collect(),
            None => LEADING.iter().map(|arg| (arg, Vec::new())).collect(),
        };
        Matches { command, given }
    }

    /// The argument called `name` and its words. A name that is not in the table is a bug of
    /// the code that reads it, which every subcommand's test would show: it reads as not given.
    fn get(&self, name: &str) -> Option<&(&'static Arg, Vec<OsString>)> {
        let found = self.given.iter().find(|(arg, _)| arg.name == name);
        debug_assert!(found.is_some(), "no argument {name} in the table");
        found
    }

    /// Whether the flag `name` is given.
    pub(super) fn flag(&self, name: &str) -> bool {
        self.get(name).is_some_and(|(_, words)| !words.is_empty())
    }

    /// The word for `name`: given, else from its environment variable, else its default.
    fn word(&self, name: &str) -> Result<Option<(&'static Arg, OsString)>, UsageError> {
        let Some(&(arg, ref words)) = self.get(name) else {
            return Ok(None);
        };
        if let Some(word) = words.last() {
            return Ok(Some((arg, word.clone())));
        }
        if let Some(word) = arg.env.and_then(std::env::var_os) {
            accept(arg, &word)?;
            return Ok(Some((arg, word)));
        }
        Ok(arg.default.map(|word| (arg, OsString::from(word))))
    }

    /// The value of `name` (given, from the environment, or its default) typed by `parse`.
    pub(super) fn value<T, E: Display>(
        &self,
        name: &str,
        parse: fn(&str) -> Result<T, E>,
    ) -> Result<Option<T>, UsageError> {
        self.word(name)?
            .map(|(arg, word)| typed(arg, &word, parse))
            .transpose()
    }

    /// As [`Matches::value`], for an argument that is required or has a default.
    pub(super) fn required<T, E: Display>(
        &self,
        name: &str,
        parse: fn(&str) -> Result<T, E>,
    ) -> Result<T, UsageError> {
        self.value(name, parse)?.ok_or_else(|| self.missing(name))
    }

    /// The error of `name` not given when it must be (which the table's rules find first).
    pub(super) fn missing(&self, name: &str) -> UsageError {
        let message = format!(
            "the following required arguments were not provided: {}",
            self.shown(name)
        );
        UsageError::new(message, None, self.command)
    }

    /// How errors name the argument `name`: `--socket <SOCKET>`, `<UNIT>`.
    fn shown(&self, name: &str) -> String {
        self.get(name)
            .map_or_else(|| name.to_owned(), |(arg, _)| arg.display())
    }

    /// Every value given for `name`, in order, typed by `parse`.
    pub(super) fn values<T, E: Display>(
        &self,
        name: &str,
        parse: fn(&str) -> Result<T, E>,
    ) -> Result<Vec<T>, UsageError> {
        let Some((arg, words)) = self.get(name) else {
            return Ok(Vec::new());
        };
        words.iter().map(|word| typed(arg, word, parse)).collect()
    }

    /// The path given for `name`, or from its environment variable.
    pub(super) fn path(&self, name: &str) -> Result<Option<PathBuf>, UsageError> {
        Ok(self.word(name)?.map(|(_, word)| PathBuf::from(word)))
    }

    fn is_given(&self, name: &str) -> bool {
        self.given
            .iter()
            .any(|(arg, words)| arg.name == name && !words.is_empty())
    }

    /// The table's rules for a complete command line: no two arguments that conflict, every
    /// required one given, and what each given one requires.
    fn check(&self) -> Result<(), UsageError> {
        for (arg, words) in &self.given {
            if let Some(other) = arg.conflicts_with
                && !words.is_empty()
                && let Some((other, _)) = self
                    .given
                    .iter()
                    .find(|(a, w)| a.name == other && !w.is_empty())
            {
                let message = format!(
                    "the argument '{}' cannot be used with '{}'",
                    arg.display(),
                    other.display()
                );
                return Err(UsageError::new(message, None, self.command));
            }
        }
        let missing: Vec<String> = self
            .given
            .iter()
            .filter(|(arg, words)| {
                let needed = match arg.required {
                    Required::No => false,
                    Required::Yes => true,
                    Required::Unless(other) => !self.is_given(other),
                };
                let required_by_another = self
                    .given
                    .iter()
                    .any(|(other, given)| other.requires == Some(arg.name) && !given.is_empty());
                (needed || required_by_another) && words.is_empty() && arg.env.is_none()
            })
            .map(|(arg, _)| match arg.required {
                Required::Unless(other) => format!("{} (or {})", arg.display(), self.shown(other)),
                _ => arg.display(),
            })
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let message = format!(
            "the following required arguments were not provided: {}",
            missing.join(", ")
        );
        Err(UsageError::new(message, None, self.command))
    }

    /// Takes `option` (from after the dashes) and its value, if it has one, from `parser`.
    fn option(&mut self, option: &Flag, parser: &mut lexopt::Parser) -> Result<(), UsageError> {
        let command = self.command;
        let found = self.given.iter().position(|(arg, _)| match option {
            Flag::Long(long) => !arg.positional && arg.name == long.as_str(),
            Flag::Short(short) => arg.short == Some(*short),
        });
        let Some(found) = found else {
            let names = self
                .given
                .iter()
                .filter(|(arg, _)| !arg.positional)
                .map(|(arg, _)| arg.name);
            return Err(unknown_option(option, names, command));
        };
        let (arg, words) = &mut self.given[found];
        if !words.is_empty() && !arg.many {
            let message = format!(
                "the argument '{}' cannot be used multiple times",
                arg.display()
            );
            return Err(UsageError::new(message, None, command));
        }
        let word = match arg.value {
            None => OsString::new(),
            Some(_) => value(parser).ok_or_else(|| {
                let message = format!(
                    "a value is required for '{}' but none was supplied",
                    arg.display()
                );
                UsageError::new(message, None, command)
            })?,
        };
        if arg.value.is_some() {
            accept(arg, &word)?;
        }
        words.push(word);
        Ok(())
    }

    /// Takes `word`, a positional argument, for the first positional argument not yet given;
    /// one that takes the rest takes every word left, as it is.
    fn positional(
        &mut self,
        word: OsString,
        parser: &mut lexopt::Parser,
    ) -> Result<(), UsageError> {
        let command = self.command;
        let Some((arg, words)) = self
            .given
            .iter_mut()
            .find(|(arg, words)| arg.positional && words.is_empty())
        else {
            let message = format!("unexpected argument '{}' found", word.to_string_lossy());
            return Err(UsageError::new(message, None, command));
        };
        accept(arg, &word)?;
        words.push(word);
        if arg.many {
            // Nothing is pending after a positional word, so the rest is there to take.
            for word in parser.try_raw_args().into_iter().flatten() {
                accept(arg, &word)?;
                words.push(word);
            }
        }
        Ok(())
    }
}

/// An option as the command line names it.
#[derive(Debug)]
enum Flag {
    Long(String),
    Short(char),
}

impl Flag {
    fn display(&self) -> String {
        match self {
            Flag::Long(long) => format!("--{long}"),
            Flag::Short(short) => format!("-{short}"),
        }
    }
}

/// Whether `word` is a value of `arg`'s kind, as the command line gives it: UTF-8 text, a
/// path of any bytes but none, or one of its words.
fn accept(arg: &Arg, word: &OsStr) -> Result<(), UsageError> {
    let reason = match arg.kind {
        Kind::Text if word.to_str().is_none() => "not UTF-8".to_owned(),
        Kind::Path if word.is_empty() => "an empty path names no file".to_owned(),
        #[cfg(feature = "docs")]
        Kind::OneOf(words) if !words.iter().any(|w| word == *w) => {
            format!("possible values: {}", words.join(", "))
        }
        _ => return Ok(()),
    };
    Err(UsageError::invalid(arg, word, &reason))
}

/// `word` typed by `parse`, which must be UTF-8 unless its argument is a path.
fn typed<T, E: Display>(
    arg: &Arg,
    word: &OsStr,
    parse: fn(&str) -> Result<T, E>,
) -> Result<T, UsageError> {
    let text = word
        .to_str()
        .ok_or_else(|| UsageError::invalid(arg, word, &"not UTF-8"))?;
    parse(text).map_err(|reason| UsageError::invalid(arg, word, &reason))
}

/// An option's value: attached to it (`--name=value`, `-pvalue`), or the next word, unless
/// that is an option itself, as clap took it (`--timeout --json` lacks a value).
fn value(parser: &mut lexopt::Parser) -> Option<OsString> {
    if let Some(value) = parser.optional_value() {
        return Some(value);
    }
    let looks_like_option = |word: &OsStr| word.len() > 1 && word.as_encoded_bytes()[0] == b'-';
    parser
        .try_raw_args()?
        .next_if(|word| !looks_like_option(word))
}

/// Reads `args` (without the program's name).
pub(super) fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Parsed, UsageError> {
    let mut parser = lexopt::Parser::from_args(args);
    let mut leading = Matches::new(None);
    let name = loop {
        let option = match next(&mut parser, None)? {
            None => return Err(no_command()),
            Some(Word::Long("help") | Word::Short('h')) => return Ok(Parsed::Print(help::top())),
            Some(Word::Long("version") | Word::Short('V')) => {
                let version = format!("{} {}\n", spec::NAME, env!("CARGO_PKG_VERSION"));
                return Ok(Parsed::Print(version));
            }
            Some(Word::Value(name)) => break name,
            Some(Word::Long(long)) => Flag::Long(long.to_owned()),
            Some(Word::Short(short)) => Flag::Short(short),
        };
        leading.option(&option, &mut parser)?;
    };
    if name == "help" {
        // `exitproof help [COMMAND]`, as clap had it.
        return match next(&mut parser, None)? {
            Some(Word::Value(name)) => Ok(Parsed::Print(help::command(subcommand(&name)?))),
            _ => Ok(Parsed::Print(help::top())),
        };
    }
    let command = subcommand(&name)?;
    let mut matches = Matches::new(Some(command));
    while let Some(word) = next(&mut parser, Some(command))? {
        let option = match word {
            Word::Long("help") | Word::Short('h') => {
                return Ok(Parsed::Print(help::command(command)));
            }
            Word::Value(word) => {
                matches.positional(word, &mut parser)?;
                continue;
            }
            Word::Long(long) => Flag::Long(long.to_owned()),
            Word::Short(short) => Flag::Short(short),
        };
        matches.option(&option, &mut parser)?;
    }
    leading.check()?;
    matches.check()?;
    Ok(Parsed::Run {
        leading,
        command,
        matches,
    })
}

/// The next word, or lexopt's complaint about a flag given a value (`--json=yes`).
fn next<'p>(
    parser: &'p mut lexopt::Parser,
    command: Option<&Command>,
) -> Result<Option<Word<'p>>, UsageError> {
    parser.next().map_err(|error| {
        let message = match error {
            lexopt::Error::UnexpectedValue { option, value } => format!(
                "unexpected value '{}' for '{option}' found; no more were expected",
                value.to_string_lossy()
            ),
            other => other.to_string(),
        };
        UsageError::new(message, None, command)
    })
}

/// The subcommand called `name`.
fn subcommand(name: &OsStr) -> Result<&'static Command, UsageError> {
    if let Some(command) = COMMANDS.iter().find(|command| name == command.name) {
        return Ok(command);
    }
    let name = name.to_string_lossy();
    let names = COMMANDS.iter().map(|command| command.name);
    let tip = suggest(&name, names, "", ["subcommand", "subcommands"]);
    Err(UsageError::new(
        format!("unrecognized subcommand '{name}'"),
        tip,
        None,
    ))
}

fn unknown_option<'a>(
    option: &Flag,
    names: impl Iterator<Item = &'a str>,
    command: Option<&Command>,
) -> UsageError {
    let tip = match option {
        Flag::Long(long) => suggest(long, names, "--", ["argument", "arguments"]),
        Flag::Short(_) => None,
    };
    let message = format!("unexpected argument '{}' found", option.display());
    UsageError::new(message, tip, command)
}

/// No subcommand: the top-level help on stderr, as clap had it, which lists them.
fn no_command() -> UsageError {
    let names: Vec<&str> = COMMANDS.iter().map(|command| command.name).collect();
    UsageError {
        message: format!("a subcommand is required: {}", names.join(", ")),
        text: help::top(),
    }
}

/// A tip naming the `names` close to `word` (a typo's few edits away), in their order, each
/// written after `prefix`; `[one, some]` says what they are.
fn suggest<'a>(
    word: &str,
    names: impl Iterator<Item = &'a str>,
    prefix: &str,
    [one, some]: [&str; 2],
) -> Option<String> {
    let close: Vec<String> = names
        .filter(|name| edit_distance(word, name) * 3 <= word.chars().count() + 2)
        .map(|name| format!("'{prefix}{name}'"))
        .collect();
    match close.len() {
        0 => None,
        1 => Some(format!("a similar {one} exists: {}", close[0])),
        _ => Some(format!("some similar {some} exist: {}", close.join(", "))),
    }
}

/// Levenshtein's distance between `a` and `b`: the fewest characters inserted, deleted or
/// replaced to make one the other.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, a) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, b) in b.iter().enumerate() {
            let replaced = diagonal + usize::from(a != *b);
            diagonal = row[j + 1];
            row[j + 1] = replaced.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_insertions_deletions_and_replacements() {
        assert_eq!(edit_distance("", ""), 0);
        assert_eq!(edit_distance("wath", "watch"), 1);
        assert_eq!(edit_distance("wath", "wait"), 2);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("abc", ""), 3);
    }

    #[test]
    fn a_tip_names_only_close_words() {
        let names = ["watch", "wait", "unwatch", "list"];
        let kinds = ["subcommand", "subcommands"];
        assert_eq!(
            suggest("wath", names.into_iter(), "", kinds).as_deref(),
            Some("some similar subcommands exist: 'watch', 'wait'")
        );
        assert_eq!(
            suggest("lst", names.into_iter(), "--", kinds).as_deref(),
            Some("a similar subcommand exists: '--list'")
        );
        assert_eq!(suggest("frobnicate", names.into_iter(), "", kinds), None);
    }
}
