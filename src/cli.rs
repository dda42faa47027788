//! The command line: `exitproof agent` runs the agent; every other subcommand is a thin client
//! of a running agent's control socket.
//!
//! A failure is one line on stderr (`exitproof: <message>`), or with `--json` one JSON line on
//! stdout, `{"error":{"kind":…,"message":…}}`, its kind the protocol's error kind or the CLI's
//! own (`no-agent`, `usage`, `failed`).
//!
//! | Exit | Meaning | `--json` kind |
//! |------|---------|---------------|
//! | 0    | done: proven (`wait`, `stop`), watched, unwatched, listed | |
//! | 1    | any other failure: the agent failed, the connection broke, an answer was bad, or (`--unit-status`, `run`) systemd gave no exit status | `failed`, `internal`, `busy`, ... |
//! | 2    | usage: the command line is wrong | `usage` |
//! | 3    | the unit is not watched | `not-watched` |
//! | 4    | systemd does not know the unit (as `systemctl`) | `not-found` |
//! | 69   | no agent listens on the socket | `no-agent` |
//! | 75   | not proven when `--timeout` passed; the unit stays watched | `still-running` |
//! | 77   | refused: the agent does not admit this user, or the socket does not let it connect | `forbidden` |
//! | N    | `wait`/`stop --unit-status`, `run`: the unit's own exit status (128 + a signal's number) | |

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

use crate::agent::{self, AgentConfig, Bus};
use crate::control::ControlError;
use crate::control::client::Client;
use crate::control::protocol::{WatchArgs, WatchSpec, parse_invocation_id};
use crate::control::wire::{EventAnswer, ProofEvent};
use crate::duration::{parse_duration, parse_timeout};
use crate::exit::write::{record_from_env, write_record};
use crate::record_name::RecordName;
use crate::transient;
use crate::unit_name::{self, UnitName};

#[cfg(feature = "docs")]
mod docs;
mod failure;
mod help;
#[cfg(all(test, feature = "docs"))]
mod man;
mod parse;
mod render;
mod spec;
#[cfg(test)]
mod tests;

use failure::{EXIT_USAGE, Failure, Kind};
use parse::{Matches, UsageError};
use render::{Listing, Render, Unwatched, UnwatchedProven, Versions};
use spec::Id;

/// A command line, typed: what `run` does. Its words, help and rules are the table's
/// (`cli/spec.rs`); this is what they mean.
#[derive(Debug)]
pub struct Cli {
    leading: LeadingArgs,
    command: Cmd,
}

/// The options given before the subcommand.
#[derive(Debug)]
struct LeadingArgs {
    user: bool,
    /// `--socket`, else `$EXITPROOF_SOCKET`.
    socket: Option<PathBuf>,
    json: bool,
}

impl Cli {
    /// The command line `args` (without the program's name) asks for: a command to run, or
    /// text to print (help, the version).
    fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Outcome, UsageError> {
        let (leading, command, matches) = match parse::parse(args)? {
            parse::Parsed::Run {
                leading,
                command,
                matches,
            } => (leading, command, matches),
            parse::Parsed::Print(text) => return Ok(Outcome::Print(text)),
        };
        Ok(Outcome::Run(Cli {
            leading: LeadingArgs {
                user: leading.flag("user"),
                socket: leading.path("socket")?,
                json: leading.flag("json"),
            },
            command: Cmd::from_matches(command.id, &matches)?,
        }))
    }

    /// The socket and output options, from before the subcommand and after it: a later
    /// `--socket` wins, a flag given in either place counts.
    fn options(&self) -> (SocketArgs, OutputArgs) {
        let (socket, output) = match &self.command {
            Cmd::Agent { socket, .. } => (Some(socket), None),
            Cmd::Watch { client, .. }
            | Cmd::Wait { client, .. }
            | Cmd::Stop { client, .. }
            | Cmd::Start { client, .. }
            | Cmd::Unwatch { client, .. }
            | Cmd::List { client }
            | Cmd::Events { client }
            | Cmd::Version { client }
            | Cmd::Stats { client }
            | Cmd::Status { client, .. }
            | Cmd::Run { client, .. } => (Some(&client.socket), Some(&client.output)),
            _ => (None, None),
        };
        (
            SocketArgs {
                user: self.leading.user || socket.is_some_and(|s| s.user),
                socket: socket
                    .and_then(|s| s.socket.clone())
                    .or_else(|| self.leading.socket.clone()),
            },
            OutputArgs {
                json: self.leading.json || output.is_some_and(|o| o.json),
            },
        )
    }
}

/// Where the agent's socket is.
#[derive(Debug)]
struct SocketArgs {
    /// The user manager and the session bus.
    user: bool,
    socket: Option<PathBuf>,
}

impl SocketArgs {
    fn from_matches(matches: &Matches) -> Result<SocketArgs, UsageError> {
        Ok(SocketArgs {
            user: matches.flag("user"),
            socket: matches.path("socket")?,
        })
    }

    fn bus(&self) -> Bus {
        if self.user { Bus::User } else { Bus::System }
    }

    fn path(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(|| default_socket(self.bus()))
    }
}

/// The options of a subcommand that asks the agent: where it is, how to print.
#[derive(Debug)]
struct ClientArgs {
    socket: SocketArgs,
    output: OutputArgs,
}

impl ClientArgs {
    fn from_matches(matches: &Matches) -> Result<ClientArgs, UsageError> {
        Ok(ClientArgs {
            socket: SocketArgs::from_matches(matches)?,
            output: OutputArgs {
                json: matches.flag("json"),
            },
        })
    }
}

/// How results are printed.
#[derive(Debug)]
struct OutputArgs {
    /// JSON lines instead of text for a person.
    json: bool,
}

impl OutputArgs {
    fn format(&self) -> Format {
        if self.json {
            Format::Json
        } else {
            Format::Human
        }
    }
}

/// How a result is printed ([`Render`]).
#[derive(Clone, Copy, Debug)]
enum Format {
    Human,
    Json,
}

/// The default state directory for `bus`.
pub fn default_state_dir(bus: Bus) -> PathBuf {
    match bus {
        Bus::System => PathBuf::from("/var/lib/exitproof"),
        Bus::User => std::env::var_os("XDG_STATE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
            .unwrap_or_else(|| PathBuf::from("/var/lib"))
            .join("exitproof"),
    }
}

/// The default control socket for `bus`.
pub fn default_socket(bus: Bus) -> PathBuf {
    match bus {
        Bus::System => PathBuf::from("/run/exitproof/exitproof.sock"),
        Bus::User => std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(format!("/run/user/{}", nix::unistd::getuid())))
            .join("exitproof.sock"),
    }
}

// A subcommand that asks the agent, with its output for people and for programs (--json):
// 1. the request: a `Command` variant in `control::protocol`, its answer's payload in
//    `control::wire` (the agent serializes it, the client reads it back);
// 2. a typed `Client` method in `control::client` returning that value;
// 3. its row in `cli/spec.rs` (name, help, options and arguments), a variant here typed from
//    them in `Cmd::from_matches`, and its arm in `run`: call the client, hand the result to
//    `print`;
// 4. `impl Render` for the result in `cli/render.rs`: its line(s) for a person, tested there, and
//    its JSON line(s), the agent's own values.
/// A subcommand with its arguments typed (what each means: its row in `cli/spec.rs`).
#[derive(Debug)]
enum Cmd {
    Agent {
        socket: SocketArgs,
        method_timeout: Duration,
        resync_interval: Duration,
        state_dir: Option<PathBuf>,
        allow_uids: Vec<u32>,
        allow_gids: Vec<u32>,
        socket_mode: u32,
        metrics_file: Option<PathBuf>,
    },
    Watch {
        client: ClientArgs,
        unit: UnitName,
        invocation: Option<String>,
        run_dir: Option<PathBuf>,
        record: Option<RecordName>,
        generation: Option<u64>,
        launch_file: Option<PathBuf>,
    },
    Start {
        client: ClientArgs,
        unit: UnitName,
    },
    Record {
        dir: PathBuf,
        name: Option<RecordName>,
    },
    Wait {
        client: ClientArgs,
        unit: UnitName,
        timeout: WaitTimeout,
        unit_status: bool,
    },
    Stop {
        client: ClientArgs,
        unit: UnitName,
        timeout: WaitTimeout,
        unit_status: bool,
    },
    /// `unit` is `None` with `--proven`.
    Unwatch {
        client: ClientArgs,
        unit: Option<UnitName>,
    },
    List {
        client: ClientArgs,
    },
    Events {
        client: ClientArgs,
    },
    Version {
        client: ClientArgs,
    },
    Stats {
        client: ClientArgs,
    },
    Status {
        client: ClientArgs,
        unit: UnitName,
    },
    Run {
        client: ClientArgs,
        unit: Option<UnitName>,
        properties: Vec<String>,
        method_timeout: Duration,
        command: Vec<String>,
    },
    #[cfg(feature = "docs")]
    Completions {
        shell: docs::Shell,
    },
    #[cfg(feature = "docs")]
    Man,
}

impl Cmd {
    /// The subcommand `id` with what its table row says was given, typed by each argument's
    /// parser.
    fn from_matches(id: Id, m: &Matches) -> Result<Cmd, UsageError> {
        let client = || ClientArgs::from_matches(m);
        Ok(match id {
            Id::Agent => Cmd::Agent {
                socket: SocketArgs::from_matches(m)?,
                method_timeout: m.required("method-timeout", parse_duration)?,
                resync_interval: m.required("resync-interval", parse_duration)?,
                state_dir: m.path("state-dir")?,
                allow_uids: m.values("allow-uid", u32::from_str)?,
                allow_gids: m.values("allow-gid", u32::from_str)?,
                socket_mode: m.required("socket-mode", parse_mode)?,
                metrics_file: m.path("metrics-file")?,
            },
            Id::Watch => Cmd::Watch {
                client: client()?,
                unit: m.required("UNIT", parse_unit)?,
                invocation: m.value("invocation", parse_invocation_id)?,
                run_dir: m.path("run-dir")?,
                record: m.value("record", RecordName::parse)?,
                generation: m.value("gen", parse_generation)?,
                launch_file: m.path("launch-file")?,
            },
            Id::Start => Cmd::Start {
                client: client()?,
                unit: m.required("UNIT", parse_unit)?,
            },
            Id::Record => Cmd::Record {
                dir: m.path("dir")?.ok_or_else(|| m.missing("dir"))?,
                name: m.value("name", RecordName::parse)?,
            },
            Id::Wait => Cmd::Wait {
                client: client()?,
                unit: m.required("UNIT", parse_unit)?,
                timeout: m.required("timeout", wait_timeout)?,
                unit_status: m.flag("unit-status"),
            },
            Id::Stop => Cmd::Stop {
                client: client()?,
                unit: m.required("UNIT", parse_unit)?,
                timeout: m.required("timeout", wait_timeout)?,
                unit_status: m.flag("unit-status"),
            },
            Id::Unwatch => Cmd::Unwatch {
                client: client()?,
                unit: m.value("UNIT", parse_unit)?,
            },
            Id::List => Cmd::List { client: client()? },
            Id::Events => Cmd::Events { client: client()? },
            Id::Version => Cmd::Version { client: client()? },
            Id::Stats => Cmd::Stats { client: client()? },
            Id::Status => Cmd::Status {
                client: client()?,
                unit: m.required("UNIT", parse_unit)?,
            },
            Id::Run => Cmd::Run {
                client: client()?,
                unit: m.value("unit", parse_service_name)?,
                properties: m.values("property", parse_text)?,
                method_timeout: m.required("method-timeout", parse_duration)?,
                command: m.values("COMMAND", parse_text)?,
            },
            #[cfg(feature = "docs")]
            Id::Completions => Cmd::Completions {
                shell: m.required("SHELL", docs::Shell::parse)?,
            },
            #[cfg(feature = "docs")]
            Id::Man => Cmd::Man,
        })
    }
}

/// Permission bits in octal, such as `600` or `0660`.
fn parse_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s, 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("{s:?} is not an octal mode such as 600"))
}

/// How long `wait` and `stop` wait; `None` is `infinity`.
#[derive(Clone, Copy, Debug)]
struct WaitTimeout(Option<Duration>);

fn wait_timeout(s: &str) -> Result<WaitTimeout, crate::duration::DurationError> {
    parse_timeout(s).map(WaitTimeout)
}

/// A generation: a number from 1.
fn parse_generation(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(0) => Err("generations are numbered from 1".to_owned()),
        Ok(generation) => Ok(generation),
        Err(e) => Err(e.to_string()),
    }
}

/// Any text, as it is.
fn parse_text(s: &str) -> Result<String, std::convert::Infallible> {
    Ok(s.to_owned())
}

fn parse_unit(s: &str) -> Result<UnitName, unit_name::InvalidUnitName> {
    unit_name::validate(s)
}

/// A service's name as `systemd-run --unit` takes it: `.service` added to a name that does not
/// end in a unit type (`unit_name_mangle_with_suffix` in systemd's src/basic/unit-name.c).
fn parse_service_name(s: &str) -> Result<UnitName, unit_name::InvalidUnitName> {
    unit_name::validate(s).or_else(|_| unit_name::validate(&format!("{s}.service")))
}

/// What a command line asks for.
#[derive(Debug)]
enum Outcome {
    Run(Cli),
    /// Help or the version, for stdout.
    Print(String),
}

/// Runs the command line and returns the process's exit code.
pub fn main() -> ExitCode {
    let cli = match Cli::parse(std::env::args_os().skip(1)) {
        Ok(Outcome::Run(cli)) => cli,
        Ok(Outcome::Print(text)) => {
            let mut out = std::io::stdout().lock();
            // Nothing is left to tell if stdout is gone.
            let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
            return ExitCode::SUCCESS;
        }
        Err(error) => return usage_error(&error),
    };
    let json = cli.options().1.json;
    match run(cli) {
        Ok(code) => code,
        Err(failure) => {
            report(&failure, json);
            failure.exit_code()
        }
    }
}

/// A command line the table (`cli/spec.rs`) rejects: in clap's layout on stderr, or with
/// `--json` anywhere on the line the failure's JSON line on stdout; exit 2 either way.
fn usage_error(error: &UsageError) -> ExitCode {
    let asked_json = std::env::args_os().any(|arg| arg == "--json");
    if asked_json {
        let failure = Failure {
            kind: Kind::Usage,
            message: error.message.clone(),
        };
        report(&failure, true);
    } else {
        let _ = std::io::stderr().lock().write_all(error.text.as_bytes());
    }
    ExitCode::from(EXIT_USAGE)
}

/// Tells a failure: on stdout as a JSON line with `--json`, where a program reads, else on
/// stderr. Best effort: there is no one left to tell if that fails.
fn report(failure: &Failure, json: bool) {
    let text = failure.text(json);
    let _ = if json {
        std::io::stdout().lock().write_all(text.as_bytes())
    } else {
        std::io::stderr().lock().write_all(text.as_bytes())
    };
}

fn run(cli: Cli) -> Result<ExitCode, Failure> {
    let (socket, output) = cli.options();
    let format = output.format();
    match cli.command {
        Cmd::Agent {
            method_timeout,
            resync_interval,
            state_dir,
            allow_uids,
            allow_gids,
            socket_mode,
            metrics_file,
            ..
        } => {
            crate::service::init_logging();
            let mut config = AgentConfig::new(socket.bus(), socket.path());
            config.method_timeout = method_timeout;
            config.resync_interval = (!resync_interval.is_zero()).then_some(resync_interval);
            config.state_dir = Some(state_dir.unwrap_or_else(|| default_state_dir(socket.bus())));
            config.server.allowed_uids = allow_uids;
            config.server.allowed_gids = allow_gids;
            config.server.mode = socket_mode;
            config.metrics_file = metrics_file;
            agent::run(config).map_err(failed)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Watch {
            unit,
            invocation,
            run_dir,
            record,
            generation,
            launch_file,
            ..
        } => {
            let args = WatchArgs {
                invocation,
                spec: WatchSpec {
                    run_dir: run_dir.map(|p| absolute("run_dir", p)).transpose()?,
                    record,
                    generation,
                    launch_file: launch_file
                        .map(|p| absolute("launch_file", p))
                        .transpose()?,
                },
                ..WatchArgs::new(unit)
            };
            let view = connect(&socket)?.watch(args)?;
            print(format, &view)
        }
        Cmd::Start { unit, .. } => {
            let view = connect(&socket)?.start(&unit)?;
            print(format, &view)
        }
        Cmd::Wait {
            unit,
            timeout,
            unit_status,
            ..
        } => {
            let answer = connect(&socket)?.wait(&unit, timeout.0);
            print_proof(format, answer, unit_status)
        }
        Cmd::Stop {
            unit,
            timeout,
            unit_status,
            ..
        } => {
            let answer = connect(&socket)?.stop(&unit, timeout.0);
            print_proof(format, answer, unit_status)
        }
        Cmd::Record { dir, name } => {
            let (record, invocation) =
                record_from_env(|var| std::env::var(var).ok()).map_err(failed)?;
            let name = match (name, invocation) {
                (Some(name), _) => name,
                (None, Some(invocation)) => {
                    RecordName::for_invocation(&invocation).map_err(failed)?
                }
                (None, None) => {
                    return Err("$INVOCATION_ID is not set: give --name, or run this from \
                                ExecStopPost= where systemd sets it"
                        .to_owned()
                        .into());
                }
            };
            write_record(&dir, &name, &record).map_err(failed)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Unwatch {
            unit: Some(unit), ..
        } => {
            connect(&socket)?.unwatch(&unit)?;
            print(format, &Unwatched(unit))
        }
        Cmd::Unwatch { unit: None, .. } => {
            let units = connect(&socket)?.unwatch_proven()?;
            print(format, &UnwatchedProven(units))
        }
        Cmd::List { .. } => {
            let units = connect(&socket)?.list()?;
            let listing = Listing {
                units,
                now_mono_ns: crate::clock::monotonic_ns(),
            };
            print(format, &listing)
        }
        Cmd::Events { .. } => {
            let events = connect(&socket)?.events()?;
            for event in events {
                print(format, &event?)?;
            }
            Err(Failure::failed("the agent closed the connection"))
        }
        Cmd::Version { .. } => {
            let agent = connect(&socket).and_then(|mut client| Ok(client.version()?));
            // The CLI's own version is worth printing even when the agent cannot be asked.
            let versions = Versions {
                cli: env!("CARGO_PKG_VERSION"),
                agent: agent.as_ref().ok().cloned(),
            };
            print(format, &versions)?;
            agent?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Status { unit, .. } => {
            let status = connect(&socket)?.status(&unit)?;
            print(format, &status)
        }
        Cmd::Run {
            unit,
            properties,
            method_timeout,
            command,
            ..
        } => run_command(&socket, format, unit, &properties, &command, method_timeout),
        Cmd::Stats { .. } => {
            let stats = connect(&socket)?.stats()?;
            print(format, &stats)
        }
        #[cfg(feature = "docs")]
        Cmd::Completions { shell } => write_stdout(&docs::Doc::Completions(shell).text()?),
        #[cfg(feature = "docs")]
        Cmd::Man => write_stdout(&docs::Doc::Man.text()?),
    }
}

#[cfg(feature = "docs")]
fn write_stdout(bytes: &[u8]) -> Result<ExitCode, Failure> {
    let mut out = std::io::stdout().lock();
    out.write_all(bytes)
        .and_then(|()| out.flush())
        .map_err(|e| format!("write to stdout: {e}"))?;
    Ok(ExitCode::SUCCESS)
}

/// The answer of `wait` or `stop`: the proof, and with `unit_status` the unit's own status as
/// the exit code; a timeout is the agent's `still-running`, exit 75.
fn print_proof(
    format: Format,
    answer: Result<EventAnswer, ControlError>,
    unit_status: bool,
) -> Result<ExitCode, Failure> {
    let answer = answer?;
    print(format, &answer)?;
    if !unit_status {
        return Ok(ExitCode::SUCCESS);
    }
    let event = &answer.event;
    let status = event.systemd.as_ref().and_then(|systemd| {
        transient::unit_status(&systemd.result, &systemd.code, &systemd.status)
    });
    status
        .map(ExitCode::from)
        .ok_or_else(|| no_exit_status(event))
}

/// A failure of no kind of its own, said by `error`.
fn failed(error: impl std::fmt::Display) -> Failure {
    Failure::failed(error.to_string())
}

/// A proof without the exit status its caller asked for.
fn no_exit_status(event: &ProofEvent) -> Failure {
    Failure::failed(format!(
        "{}: proven gone ({}), but systemd gave no exit status of its main process",
        event.unit,
        event.cause.name()
    ))
}

/// The agent wants absolute paths; a relative one means "from here".
fn absolute(field: &str, path: PathBuf) -> Result<PathBuf, String> {
    let absolute =
        std::path::absolute(&path).map_err(|e| format!("{field} {}: {e}", path.display()))?;
    if absolute.to_str().is_none() {
        return Err(format!("{field} {} is not UTF-8", path.display()));
    }
    Ok(absolute)
}

/// `exitproof run`: start, watch the invocation it began, wait for its proof.
fn run_command(
    socket: &SocketArgs,
    format: Format,
    unit: Option<UnitName>,
    properties: &[String],
    command: &[String],
    method_timeout: Duration,
) -> Result<ExitCode, Failure> {
    let properties = properties
        .iter()
        .map(|p| transient::property(p))
        .collect::<Result<Vec<_>, _>>()
        .map_err(failed)?;
    let unit = match unit {
        Some(unit) => unit,
        None => parse_unit(&transient::generated_unit_name().map_err(failed)?).map_err(failed)?,
    };
    // A program that is not there is refused before anything starts, as is a missing agent.
    let program =
        transient::program(command, std::env::var("PATH").ok().as_deref()).map_err(failed)?;
    let mut client = connect(socket)?;
    let started = transient::start(
        socket.bus(),
        &unit,
        properties,
        &program,
        command,
        method_timeout,
    )
    .map_err(failed)?;
    // systemd-run's words, on stderr, where they never mix with the proof.
    eprintln!(
        "Running as unit: {unit}; invocation ID: {}",
        started.invocation
    );
    let watch = WatchArgs {
        invocation: Some(started.invocation.clone()),
        ..WatchArgs::new(unit.clone())
    };
    client.watch(watch)?;
    let event = client.wait(&unit, None)?.event;
    print(format, &event)?;
    // The proof is answered: a watch of our own transient unit is no one else's business.
    if let Err(e) = client.unwatch(&unit) {
        eprintln!("exitproof: {unit} is proven but still watched: {e}");
    }
    let status = event
        .systemd
        .as_ref()
        .and_then(|systemd| transient::exit_status(&systemd.code, &systemd.status));
    drop(started);
    status
        .map(ExitCode::from)
        .ok_or_else(|| no_exit_status(&event))
}

fn connect(socket: &SocketArgs) -> Result<Client, Failure> {
    Ok(Client::connect(&socket.path())?)
}

/// Prints a subcommand's result in `format` and exits 0.
fn print(format: Format, result: &impl Render) -> Result<ExitCode, Failure> {
    let text = match format {
        Format::Human => result.human(),
        Format::Json => result.json(),
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| format!("write to stdout: {e}"))?;
    Ok(ExitCode::SUCCESS)
}
