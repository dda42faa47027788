//! The command line as data: every subcommand, option and argument of `exitproof`, with its
//! help. This table is its one definition: the parser (`parse.rs`) reads the command line
//! against it, the help text (`help.rs`) is written from it, and in tests the clap command that
//! clap_complete and the man page are generated from (`docs.rs`) is built from it.

/// The program's name.
pub(super) const NAME: &str = "exitproof";

/// What `exitproof --help` opens with.
pub(super) const ABOUT: &str = env!("CARGO_PKG_DESCRIPTION");

/// The options given before the subcommand, for the subcommands that use them (as the tests
/// and scripts written for global options place them). The environment is read for this
/// `--socket` alone, so that one given before the subcommand wins over it.
pub(super) const LEADING: &[Arg] = &[
    USER,
    Arg::option(
        "socket",
        "SOCKET",
        "The control socket [default: $XDG_RUNTIME_DIR/exitproof.sock with --user, else \
         /run/exitproof/exitproof.sock]",
    )
    .path()
    .env("EXITPROOF_SOCKET"),
    JSON,
];

/// The subcommands, in the order help lists them.
pub(super) const COMMANDS: &[Command] = &[
    Command {
        id: Id::Agent,
        name: "agent",
        about: "Run the agent in the foreground (logs to stderr; RUST_LOG sets the level)",
        client: Client::Socket,
        args: &[
            Arg::option(
                "method-timeout",
                "METHOD_TIMEOUT",
                "The deadline of every D-Bus call, StopUnit included",
            )
            .default("10s"),
            Arg::option(
                "resync-interval",
                "RESYNC_INTERVAL",
                "How often every watched unit is read again as a safety net (`0` disables \
                 it). Proofs come from events; this only catches what an event could have \
                 missed",
            )
            .default("5m"),
            Arg::option(
                "state-dir",
                "STATE_DIR",
                "Where the watch set is kept across restarts [default: /var/lib/exitproof, \
                 or $XDG_STATE_HOME/exitproof with --user]",
            )
            .path(),
            Arg::option(
                "allow-uid",
                "ALLOW_UIDS",
                "Also let this uid use the control socket (repeatable); the socket's mode \
                 must let it connect too (--socket-mode)",
            )
            .many(),
            Arg::option(
                "allow-gid",
                "ALLOW_GIDS",
                "Also let peers of this primary gid use the control socket (repeatable)",
            )
            .many(),
            Arg::option(
                "socket-mode",
                "SOCKET_MODE",
                "The control socket's permission bits, in octal",
            )
            .default("600"),
            Arg::option(
                "metrics-file",
                "METRICS_FILE",
                "Write the agent's figures to this file in the Prometheus text format (for \
                 node_exporter's textfile collector), at most every 5 s and only when they \
                 changed",
            )
            .path(),
        ],
    },
    Command {
        id: Id::Watch,
        name: "watch",
        about: "Start watching a unit and print the watch",
        client: Client::Full,
        args: &[
            UNIT,
            Arg::option(
                "invocation",
                "INVOCATION",
                "Our invocation (32 hex digits) [default: the unit's current InvocationID]",
            ),
            Arg::option(
                "run-dir",
                "RUN_DIR",
                "The run directory holding the unit's advisory exit record",
            )
            .path(),
            Arg::option(
                "record",
                "RECORD",
                "The exit record's file name in the run directory [default: \
                 exit-<invocation>.json]",
            )
            .requires("run-dir"),
            Arg::option(
                "gen",
                "GENERATION",
                "The generation (> 0) this invocation belongs to; never reused",
            ),
            Arg::option(
                "launch-file",
                "LAUNCH_FILE",
                "The generation's launch file, removed once the generation is proven gone",
            )
            .path()
            .requires("gen"),
        ],
    },
    Command {
        id: Id::Start,
        name: "start",
        about: "Start a unit (as `systemctl start`) through the agent and watch the invocation \
                its start job began; print the watch",
        client: Client::Full,
        args: &[UNIT],
    },
    Command {
        id: Id::Record,
        name: "record",
        about: "Write an exit record from systemd's $SERVICE_RESULT, $EXIT_CODE and \
                $EXIT_STATUS (for ExecStopPost=), atomically, named after $INVOCATION_ID \
                unless --name is given",
        client: Client::None,
        args: &[
            Arg::option("dir", "DIR", "The run directory to write into")
                .path()
                .required(),
            Arg::option(
                "name",
                "NAME",
                "The file name [default: exit-$INVOCATION_ID.json]",
            ),
        ],
    },
    Command {
        id: Id::Wait,
        name: "wait",
        about: "Wait for a unit's proof (watching it first if needed) and print the proof event",
        client: Client::Full,
        args: &[
            UNIT,
            Arg::option(
                "timeout",
                "TIMEOUT",
                "Give up after this long (e.g. 500ms, 10s, 2min, 1min 30s) and exit 75",
            )
            .default("infinity"),
            Arg::flag(
                "unit-status",
                "Exit with the unit's own status, as `systemd-run --wait`: 0 if systemd calls \
                 its result a success, else its main process's exit status, or 128 + the \
                 number of the signal that ended it",
            ),
        ],
    },
    Command {
        id: Id::Stop,
        name: "stop",
        about: "Stop a unit (stop requested, then StopUnit) and wait for its proof",
        client: Client::Full,
        args: &[
            UNIT,
            Arg::option(
                "timeout",
                "TIMEOUT",
                "Give up waiting after this long and exit 75; the unit stays watched and \
                 stopping",
            )
            .default("infinity"),
            Arg::flag(
                "unit-status",
                "Exit with the unit's own status, as `wait --unit-status`",
            ),
        ],
    },
    Command {
        id: Id::Unwatch,
        name: "unwatch",
        about: "Stop watching a unit, or with --proven every proven unit",
        client: Client::Full,
        args: &[
            Arg::positional("UNIT", "The unit, by the name it was watched by")
                .required_unless("proven"),
            Arg::flag(
                "proven",
                "Forget every proven watch and its retained proof, and print the units \
                 forgotten",
            )
            .conflicts_with("UNIT"),
        ],
    },
    Command {
        id: Id::List,
        name: "list",
        about: "Print the watched units: a table, or one JSON line per unit with --json",
        client: Client::Full,
        args: &[],
    },
    Command {
        id: Id::Events,
        name: "events",
        about: "Print every event as it comes, until interrupted",
        client: Client::Full,
        args: &[],
    },
    Command {
        id: Id::Version,
        name: "version",
        about: "Print this CLI's version and the running agent's (its version and protocol \
                version)",
        client: Client::Full,
        args: &[],
    },
    Command {
        id: Id::Stats,
        name: "stats",
        about: "Print the agent's counters and gauges: a line each, or one JSON line with \
                --json",
        client: Client::Full,
        args: &[],
    },
    Command {
        id: Id::Status,
        name: "status",
        about: "Print a watched unit's watch, its facts and what blocks its proof: lines and a \
                table of the blocking processes, or one JSON line with --json",
        client: Client::Full,
        args: &[UNIT],
    },
    Command {
        id: Id::Run,
        name: "run",
        about: "Start CMD as a transient service, wait until every process of it is gone, \
                print the proof and exit with its main process's exit status (128 + the \
                signal's number if a signal ended it)",
        client: Client::Full,
        args: &[
            Arg::option(
                "unit",
                "UNIT",
                "The service's name, `.service` added to a name without a unit type \
                 [default: exitproof-run-<random>.service]",
            ),
            Arg::option(
                "property",
                "NAME=VALUE",
                "A property of the service (repeatable): KillMode=process, \
                 Environment=VAR=value, RuntimeMaxSec=5m, ... (see the README for the ones \
                 it can set)",
            )
            .short('p')
            .many(),
            Arg::option(
                "method-timeout",
                "METHOD_TIMEOUT",
                "The deadline of each D-Bus call",
            )
            .default("10s"),
            Arg::positional("COMMAND", "The command and its arguments").many(),
        ],
    },
    #[cfg(feature = "docs")]
    Command {
        id: Id::Completions,
        name: "completions",
        about: "Print the completion script for a shell, generated from this command line's \
                definition",
        client: Client::None,
        args: &[Arg::positional("SHELL", "The shell").one_of(SHELLS)],
    },
    #[cfg(feature = "docs")]
    Command {
        id: Id::Man,
        name: "man",
        about: "Print the man page (roff), generated from this command line's definition",
        client: Client::None,
        args: &[],
    },
];

/// The shells `exitproof completions` has a script for: clap_complete's, in its order.
#[cfg(feature = "docs")]
pub(super) const SHELLS: &[&str] = &["bash", "elvish", "fish", "powershell", "zsh"];

const USER: Arg = Arg::flag(
    "user",
    "The systemd user manager and the session bus, instead of the system ones",
);

const JSON: Arg = Arg::flag(
    "json",
    "Print JSON lines, the agent's own values, instead of text for a person",
);

const UNIT: Arg = Arg::positional("UNIT", "The unit, by its full name (web.service)");

/// Which subcommand a row of [`COMMANDS`] is, for the code that types its arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Id {
    Agent,
    Watch,
    Start,
    Record,
    Wait,
    Stop,
    Unwatch,
    List,
    Events,
    Version,
    Stats,
    Status,
    Run,
    #[cfg(feature = "docs")]
    Completions,
    #[cfg(feature = "docs")]
    Man,
}

/// A subcommand.
#[derive(Debug)]
pub(super) struct Command {
    pub(super) id: Id,
    pub(super) name: &'static str,
    /// What it does: one paragraph, without a final period (as clap's help has it).
    pub(super) about: &'static str,
    /// Which options of where the agent is and how to print it takes, before its own.
    pub(super) client: Client,
    /// Its own options and arguments, in the order help lists them.
    pub(super) args: &'static [Arg],
}

impl Command {
    /// Every option and argument it takes: the client's, then its own.
    pub(super) fn args(&self) -> impl Iterator<Item = &'static Arg> + Clone {
        let client: &'static [Arg] = match self.client {
            Client::None => &[],
            Client::Socket => &CLIENT[..2],
            Client::Full => CLIENT,
        };
        client.iter().chain(self.args)
    }
}

/// The options of a subcommand that asks the agent: where it is, how to print.
const CLIENT: &[Arg] = &[
    USER,
    Arg::option(
        "socket",
        "SOCKET",
        "The control socket [default: $EXITPROOF_SOCKET, else $XDG_RUNTIME_DIR/exitproof.sock \
         with --user, else /run/exitproof/exitproof.sock]",
    )
    .path(),
    JSON,
];

/// Which of the client's options a subcommand takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Client {
    /// None: it does not ask the agent.
    None,
    /// `--user` and `--socket`: the agent itself, which prints no results.
    Socket,
    /// `--user`, `--socket` and `--json`.
    Full,
}

/// An option (`--name`, with a value or not) or a positional argument.
#[derive(Debug)]
pub(super) struct Arg {
    /// An option's long name, without its dashes; a positional argument's name in help
    /// (`UNIT`).
    pub(super) name: &'static str,
    pub(super) short: Option<char>,
    pub(super) positional: bool,
    /// The name of its value in help (`SOCKET` in `--socket <SOCKET>`); `None`: a flag.
    pub(super) value: Option<&'static str>,
    pub(super) help: &'static str,
    pub(super) kind: Kind,
    /// An option given more than once, or a positional argument that takes every word left,
    /// verbatim.
    pub(super) many: bool,
    pub(super) required: Required,
    /// The value when it is not given.
    pub(super) default: Option<&'static str>,
    /// The environment variable read when the option is not given.
    pub(super) env: Option<&'static str>,
    /// Another argument (by name) this one is meaningless without.
    pub(super) requires: Option<&'static str>,
    /// Another argument (by name) this one cannot be given with.
    pub(super) conflicts_with: Option<&'static str>,
}

/// What a value is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// UTF-8 text, typed by the subcommand's code.
    Text,
    /// A path: any bytes but none.
    Path,
    /// One of these words.
    #[cfg(feature = "docs")]
    OneOf(&'static [&'static str]),
}

/// Whether an argument must be given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Required {
    No,
    Yes,
    /// Unless the argument of this name is given.
    Unless(&'static str),
}

impl Arg {
    const fn flag(name: &'static str, help: &'static str) -> Arg {
        Arg {
            name,
            short: None,
            positional: false,
            value: None,
            help,
            kind: Kind::Text,
            many: false,
            required: Required::No,
            default: None,
            env: None,
            requires: None,
            conflicts_with: None,
        }
    }

    const fn option(name: &'static str, value: &'static str, help: &'static str) -> Arg {
        Arg {
            value: Some(value),
            ..Arg::flag(name, help)
        }
    }

    /// A positional argument, required unless said otherwise.
    const fn positional(name: &'static str, help: &'static str) -> Arg {
        Arg {
            positional: true,
            value: Some(name),
            required: Required::Yes,
            ..Arg::flag(name, help)
        }
    }

    const fn short(self, short: char) -> Arg {
        Arg {
            short: Some(short),
            ..self
        }
    }

    const fn path(self) -> Arg {
        Arg {
            kind: Kind::Path,
            ..self
        }
    }

    #[cfg(feature = "docs")]
    const fn one_of(self, words: &'static [&'static str]) -> Arg {
        Arg {
            kind: Kind::OneOf(words),
            ..self
        }
    }

    /// An option that may be given more than once; a positional argument that takes the rest
    /// of the command line as it is, from its first word on (or from after `--`).
    const fn many(self) -> Arg {
        Arg { many: true, ..self }
    }

    const fn required(self) -> Arg {
        Arg {
            required: Required::Yes,
            ..self
        }
    }

    const fn required_unless(self, other: &'static str) -> Arg {
        Arg {
            required: Required::Unless(other),
            ..self
        }
    }

    const fn default(self, value: &'static str) -> Arg {
        Arg {
            default: Some(value),
            ..self
        }
    }

    const fn env(self, variable: &'static str) -> Arg {
        Arg {
            env: Some(variable),
            ..self
        }
    }

    const fn requires(self, other: &'static str) -> Arg {
        Arg {
            requires: Some(other),
            ..self
        }
    }

    const fn conflicts_with(self, other: &'static str) -> Arg {
        Arg {
            conflicts_with: Some(other),
            ..self
        }
    }

    /// How help and errors name it: `--socket <SOCKET>`, `--json`, `<UNIT>`, `[UNIT]`,
    /// `<COMMAND>...`.
    pub(super) fn display(&self) -> String {
        match (self.positional, self.value) {
            (true, _) => {
                let dots = if self.many { "..." } else { "" };
                if self.required == Required::Yes {
                    format!("<{}>{dots}", self.name)
                } else {
                    format!("[{}]{dots}", self.name)
                }
            }
            (false, Some(value)) => format!("--{} <{value}>", self.name),
            (false, None) => format!("--{}", self.name),
        }
    }
}

/// The table as a clap command, with the help texts, value names, defaults and relations the
/// derive that defined the command line before gave it, for clap_complete and the man page.
#[cfg(all(test, feature = "docs"))]
pub(super) fn clap_command() -> clap::Command {
    let mut command = clap::Command::new(NAME)
        .version(env!("CARGO_PKG_VERSION"))
        .about(ABOUT)
        .subcommand_required(true)
        .arg_required_else_help(true);
    for arg in LEADING {
        command = command.arg(clap_arg(arg));
    }
    for sub in COMMANDS {
        let mut subcommand = clap::Command::new(sub.name).about(sub.about);
        for arg in sub.args() {
            subcommand = subcommand.arg(clap_arg(arg));
        }
        command = command.subcommand(subcommand);
    }
    command
}

#[cfg(all(test, feature = "docs"))]
fn clap_arg(arg: &Arg) -> clap::Arg {
    use clap::ArgAction;

    let id = |name: &str| name.to_lowercase();
    let mut clap_arg = clap::Arg::new(id(arg.name)).help(arg.help);
    clap_arg = match (arg.positional, arg.value) {
        (true, _) => clap_arg.value_name(arg.name),
        (false, Some(value)) => clap_arg.long(arg.name).value_name(value),
        (false, None) => clap_arg.long(arg.name).action(ArgAction::SetTrue),
    };
    if let Some(short) = arg.short {
        clap_arg = clap_arg.short(short);
    }
    clap_arg = match arg.kind {
        Kind::Text => clap_arg,
        Kind::Path => clap_arg.value_parser(clap::value_parser!(std::path::PathBuf)),
        Kind::OneOf(words) => clap_arg.value_parser(words.to_vec()),
    };
    if arg.many && arg.positional {
        clap_arg = clap_arg
            .num_args(1..)
            .trailing_var_arg(true)
            .allow_hyphen_values(true);
    } else if arg.many {
        clap_arg = clap_arg.action(ArgAction::Append);
    }
    clap_arg = match arg.required {
        Required::No => clap_arg.required(false),
        Required::Yes => clap_arg.required(true),
        Required::Unless(other) => clap_arg.required_unless_present(id(other)),
    };
    if let Some(default) = arg.default {
        clap_arg = clap_arg.default_value(default);
    }
    if let Some(variable) = arg.env {
        clap_arg = clap_arg.env(variable);
    }
    if let Some(other) = arg.requires {
        clap_arg = clap_arg.requires(id(other));
    }
    if let Some(other) = arg.conflicts_with {
        clap_arg = clap_arg.conflicts_with(id(other));
    }
    clap_arg
}
