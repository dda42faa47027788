//! `--help`, written from the command line's table (`spec.rs`) as clap laid it out: the about
//! text, a usage line, then sections of two columns (what to type, what it does) wrapped to 80
//! columns, the second column on lines of its own when the first is too wide to leave it room.

use super::spec::{self, Arg, COMMANDS, Command, LEADING, Required};

/// The width help is wrapped to (clap's `max_term_width` was 80).
const WIDTH: usize = 80;
/// The indent of each row.
const INDENT: &str = "  ";
/// Where a row's description starts when it goes on lines of its own.
const NEXT_LINE_INDENT: usize = 10;

/// `exitproof --help`.
pub(super) fn top() -> String {
    let commands: Vec<Row> = COMMANDS
        .iter()
        .map(|command| Row::plain(command.name, command.about))
        .chain([Row::plain(
            "help",
            "Print this message or the help of the given subcommand(s)",
        )])
        .collect();
    let options: Vec<Row> = LEADING
        .iter()
        .map(Row::of)
        .chain([
            Row::plain("-h, --help", "Print help"),
            Row::plain("-V, --version", "Print version"),
        ])
        .collect();
    let mut text = page(spec::ABOUT, None);
    text.push_str(&section("Commands", &commands));
    text.push_str(&section("Options", &options));
    text
}

/// `exitproof COMMAND --help`.
pub(super) fn command(command: &Command) -> String {
    let (positionals, options): (Vec<&Arg>, Vec<&Arg>) =
        command.args().partition(|arg| arg.positional);
    let positionals: Vec<Row> = positionals.into_iter().map(Row::of).collect();
    let options: Vec<Row> = options
        .into_iter()
        .map(Row::of)
        .chain([Row::plain("-h, --help", "Print help")])
        .collect();
    let mut text = page(command.about, Some(command));
    if !positionals.is_empty() {
        text.push_str(&section("Arguments", &positionals));
    }
    text.push_str(&section("Options", &options));
    text
}

/// The usage line of `command`, or with `None` of `exitproof`: `exitproof wait [OPTIONS]
/// <UNIT>`.
pub(super) fn usage(command: Option<&Command>) -> String {
    let Some(command) = command else {
        return format!("{} [OPTIONS] <COMMAND>", spec::NAME);
    };
    let mut words = vec![spec::NAME.to_owned(), command.name.to_owned()];
    let mut args = command.args().filter(|arg| !arg.positional);
    if args.clone().any(|arg| arg.required == Required::No) {
        words.push("[OPTIONS]".to_owned());
    }
    words.extend(
        args.by_ref()
            .filter(|arg| arg.required != Required::No)
            .map(Arg::display),
    );
    words.extend(
        command
            .args()
            .filter(|arg| arg.positional)
            .map(Arg::display),
    );
    words.join(" ")
}

/// The about text and the usage line.
fn page(about: &str, command: Option<&Command>) -> String {
    format!("{}\n\nUsage: {}\n", wrap(about, WIDTH, 0), usage(command))
}

/// A row of a section: what to type (`-p, --property <NAME=VALUE>`, `<UNIT>`, `watch`) and
/// what it does.
struct Row {
    typed: String,
    help: String,
    /// The environment variable, default and possible values, after the help.
    notes: Vec<String>,
}

impl Row {
    fn plain(typed: &str, help: &str) -> Row {
        Row {
            typed: typed.to_owned(),
            help: help.to_owned(),
            notes: Vec::new(),
        }
    }

    fn of(arg: &Arg) -> Row {
        let typed = match (arg.positional, arg.short) {
            (true, _) => arg.display(),
            (false, Some(short)) => format!("-{short}, {}", arg.display()),
            (false, None) => format!("    {}", arg.display()),
        };
        let mut notes = Vec::new();
        if let Some(variable) = arg.env {
            let value = std::env::var_os(variable).unwrap_or_default();
            notes.push(format!("[env: {variable}={}]", value.to_string_lossy()));
        }
        if let Some(default) = arg.default {
            notes.push(format!("[default: {default}]"));
        }
        // Only `exitproof completions` has possible values.
        #[cfg(feature = "docs")]
        if let spec::Kind::OneOf(words) = arg.kind {
            notes.push(format!("[possible values: {}]", words.join(", ")));
        }
        Row {
            typed,
            help: arg.help.to_owned(),
            notes,
        }
    }

    /// The description's width as clap weighed it: the notes without the spaces between them.
    fn width(&self) -> usize {
        let notes: usize = self.notes.iter().map(|note| note.chars().count()).sum();
        self.help.chars().count() + notes
    }

    /// The help and the notes.
    fn description(&self) -> String {
        std::iter::once(self.help.as_str())
            .chain(self.notes.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// A titled section of rows. The descriptions line up after the widest row, or, as clap
/// decided, go on lines of their own when that column would take over two fifths of the width
/// and some description does not fit beside it.
fn section(title: &str, rows: &[Row]) -> String {
    let widest = rows
        .iter()
        .map(|row| row.typed.chars().count())
        .max()
        .unwrap_or(0);
    let column = INDENT.len() + widest + INDENT.len();
    let next_line = column * 5 > WIDTH * 2
        && rows
            .iter()
            .any(|row| row.width() > WIDTH.saturating_sub(column));
    let mut text = format!("\n{title}:\n");
    for row in rows {
        text.push_str(INDENT);
        text.push_str(&row.typed);
        let description = row.description();
        if next_line {
            text.push('\n');
            text.push_str(&" ".repeat(NEXT_LINE_INDENT));
            text.push_str(&wrap(
                &description,
                WIDTH - NEXT_LINE_INDENT,
                NEXT_LINE_INDENT,
            ));
        } else {
            let padding = widest - row.typed.chars().count() + INDENT.len();
            text.push_str(&" ".repeat(padding));
            text.push_str(&wrap(&description, WIDTH - column, column));
        }
        text.push('\n');
    }
    text
}

/// `text` in lines of at most `width` columns (a longer word alone on its line), each line
/// after the first indented by `indent` spaces.
fn wrap(text: &str, width: usize, indent: usize) -> String {
    let mut wrapped = String::new();
    let mut line = 0;
    for word in text.split(' ').filter(|word| !word.is_empty()) {
        let length = word.chars().count();
        if line > 0 && line + 1 + length > width {
            wrapped.push('\n');
            wrapped.push_str(&" ".repeat(indent));
            line = 0;
        } else if line > 0 {
            wrapped.push(' ');
            line += 1;
        }
        wrapped.push_str(word);
        line += length;
    }
    wrapped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_breaks_between_words_and_indents_the_lines_after_the_first() {
        assert_eq!(wrap("one two three", 7, 2), "one two\n  three");
        assert_eq!(wrap("a verylongword b", 4, 0), "a\nverylongword\nb");
        assert_eq!(wrap("", 10, 0), "");
    }

    #[test]
    fn every_line_of_every_help_fits_80_columns() {
        let texts = std::iter::once(top()).chain(COMMANDS.iter().map(command));
        for text in texts {
            for line in text.lines() {
                assert!(line.chars().count() <= WIDTH, "{line}\n{text}");
            }
        }
    }

    #[test]
    fn usage_lines_name_required_options_and_arguments() {
        let usage_of = |name: &str| usage(COMMANDS.iter().find(|command| command.name == name));
        assert_eq!(usage(None), "exitproof [OPTIONS] <COMMAND>");
        assert_eq!(usage_of("wait"), "exitproof wait [OPTIONS] <UNIT>");
        assert_eq!(usage_of("record"), "exitproof record [OPTIONS] --dir <DIR>");
        assert_eq!(usage_of("unwatch"), "exitproof unwatch [OPTIONS] [UNIT]");
        assert_eq!(usage_of("run"), "exitproof run [OPTIONS] <COMMAND>...");
        assert_eq!(usage_of("list"), "exitproof list [OPTIONS]");
    }
}
