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

// The doc comments of the command line are clap's help text, plain text where `<invocation>`
// is no HTML tag.
#![allow(rustdoc::invalid_html_tags)]

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

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
#[cfg(all(test, feature = "docs"))]
mod man;
mod render;

use failure::{EXIT_USAGE, Failure, Kind};
use render::{Listing, Render, Unwatched, UnwatchedProven, Versions};

/// Proves that every process of a systemd unit is gone.
#[derive(Debug, Parser)]
#[command(name = "exitproof", version, about, max_term_width = 80)]
pub struct Cli {
    // Before the subcommand, these serve the subcommands that use them (as the tests and
    // scripts written for the global options place them); each such subcommand takes them
    // after its name too, and only those show them.
    #[command(flatten)]
    leading: LeadingArgs,
    #[command(subcommand)]
    command: Cmd,
}

/// The options given before the subcommand.
#[derive(Debug, Args)]
struct LeadingArgs {
    /// The systemd user manager and the session bus, instead of the system ones.
    #[arg(long)]
    user: bool,
    /// The control socket [default: $XDG_RUNTIME_DIR/exitproof.sock with --user,
    /// else /run/exitproof/exitproof.sock].
    // The environment is read here alone, so that a --socket given before the subcommand
    // wins over it.
    #[arg(long, env = "EXITPROOF_SOCKET")]
    socket: Option<PathBuf>,
    /// Print JSON lines, the agent's own values, instead of text for a person.
    #[arg(long)]
    json: bool,
}

impl Cli {
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
#[derive(Debug, Args)]
struct SocketArgs {
    /// The systemd user manager and the session bus, instead of the system ones.
    #[arg(long)]
    user: bool,
    /// The control socket [default: $EXITPROOF_SOCKET, else $XDG_RUNTIME_DIR/exitproof.sock
    /// with --user, else /run/exitproof/exitproof.sock].
    #[arg(long)]
    socket: Option<PathBuf>,
}

impl SocketArgs {
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
#[derive(Debug, Args)]
struct ClientArgs {
    #[command(flatten)]
    socket: SocketArgs,
    #[command(flatten)]
    output: OutputArgs,
}

/// How results are printed.
#[derive(Debug, Args)]
struct OutputArgs {
    /// Print JSON lines, the agent's own values, instead of text for a person.
    #[arg(long)]
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
// 3. a variant here, and its arm in `run`: call the client, hand the result to `print`;
// 4. `impl Render` for the result in `cli/render.rs`: its line(s) for a person, tested there, and
//    its JSON line(s), the agent's own values.
#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the agent in the foreground (logs to stderr; RUST_LOG sets the level).
    Agent {
        #[command(flatten)]
        socket: SocketArgs,
        /// The deadline of every D-Bus call, StopUnit included.
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        method_timeout: Duration,
        /// How often every watched unit is read again as a safety net (`0` disables it).
        /// Proofs come from events; this only catches what an event could have missed.
        #[arg(long, default_value = "5m", value_parser = parse_duration)]
        resync_interval: Duration,
        /// Where the watch set is kept across restarts [default: /var/lib/exitproof, or
        /// $XDG_STATE_HOME/exitproof with --user].
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Also let this uid use the control socket (repeatable); the socket's mode must let
        /// it connect too (--socket-mode).
        #[arg(long = "allow-uid")]
        allow_uids: Vec<u32>,
        /// Also let peers of this primary gid use the control socket (repeatable).
        #[arg(long = "allow-gid")]
        allow_gids: Vec<u32>,
        /// The control socket's permission bits, in octal.
        #[arg(long, default_value = "600", value_parser = parse_mode)]
        socket_mode: u32,
        /// Write the agent's figures to this file in the Prometheus text format (for
        /// node_exporter's textfile collector), at most every 5 s and only when they changed.
        #[arg(long)]
        metrics_file: Option<PathBuf>,
    },
    /// Start watching a unit and print the watch.
    Watch {
        #[command(flatten)]
        client: ClientArgs,
        /// The unit, by its full name (web.service).
        #[arg(value_parser = parse_unit)]
        unit: UnitName,
        /// Our invocation (32 hex digits) [default: the unit's current InvocationID].
        #[arg(long, value_parser = parse_invocation_id)]
        invocation: Option<String>,
        /// The run directory holding the unit's advisory exit record.
        #[arg(long)]
        run_dir: Option<PathBuf>,
        /// The exit record's file name in the run directory [default: exit-<invocation>.json].
        #[arg(long, requires = "run_dir")]
        record: Option<RecordName>,
        /// The generation (> 0) this invocation belongs to; never reused.
        #[arg(long = "gen", value_parser = clap::value_parser!(u64).range(1..))]
        generation: Option<u64>,
        /// The generation's launch file, removed once the generation is proven gone.
        #[arg(long, requires = "generation")]
        launch_file: Option<PathBuf>,
    },
    /// Start a unit (as `systemctl start`) through the agent and watch the invocation its start
    /// job began; print the watch.
    Start {
        #[command(flatten)]
        client: ClientArgs,
        /// The unit, by its full name (web.service).
        #[arg(value_parser = parse_unit)]
        unit: UnitName,
    },
    /// Write an exit record from systemd's $SERVICE_RESULT, $EXIT_CODE and $EXIT_STATUS (for
    /// ExecStopPost=), atomically, named after $INVOCATION_ID unless --name is given.
    Record {
        /// The run directory to write into.
        #[arg(long)]
        dir: PathBuf,
        /// The file name [default: exit-$INVOCATION_ID.json].
        #[arg(long)]
        name: Option<RecordName>,
    },
    /// Wait for a unit's proof (watching it first if needed) and print the proof event.
    Wait {
        #[command(flatten)]
        client: ClientArgs,
        /// The unit, by its full name (web.service).
        #[arg(value_parser = parse_unit)]
        unit: UnitName,
        /// Give up after this long (e.g. 500ms, 10s, 2min, 1min 30s) and exit 75.
        #[arg(long, default_value = "infinity", value_parser = wait_timeout)]
        timeout: WaitTimeout,
        /// Exit with the unit's own status, as `systemd-run --wait`: 0 if systemd calls its
        /// result a success, else its main process's exit status, or 128 + the number of the
        /// signal that ended it.
        #[arg(long)]
        unit_status: bool,
    },
    /// Stop a unit (stop requested, then StopUnit) and wait for its proof.
    Stop {
        #[command(flatten)]
        client: ClientArgs,
        /// The unit, by its full name (web.service).
        #[arg(value_parser = parse_unit)]
        unit: UnitName,
        /// Give up waiting after this long and exit 75; the unit stays watched and stopping.
        #[arg(long, default_value = "infinity", value_parser = wait_timeout)]
        timeout: WaitTimeout,
        /// Exit with the unit's own status, as `wait --unit-status`.
        #[arg(long)]
        unit_status: bool,
    },
    /// Stop watching a unit, or with --proven every proven unit.
    Unwatch {
        #[command(flatten)]
        client: ClientArgs,
        /// The unit, by the name it was watched by.
        #[arg(value_parser = parse_unit, required_unless_present = "proven")]
        unit: Option<UnitName>,
        /// Forget every proven watch and its retained proof, and print the units forgotten.
        #[arg(long, conflicts_with = "unit")]
        proven: bool,
    },
    /// Print the watched units: a table, or one JSON line per unit with --json.
    List {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Print every event as it comes, until interrupted.
    Events {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Print this CLI's version and the running agent's (its version and protocol version).
    Version {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Print the agent's counters and gauges: a line each, or one JSON line with --json.
    Stats {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Print a watched unit's watch, its facts and what blocks its proof: lines and a table of
    /// the blocking processes, or one JSON line with --json.
    Status {
        #[command(flatten)]
        client: ClientArgs,
        /// The unit, by its full name (web.service).
        #[arg(value_parser = parse_unit)]
        unit: UnitName,
    },
    /// Start CMD as a transient service, wait until every process of it is gone, print the
    /// proof and exit with its main process's exit status (128 + the signal's number if a
    /// signal ended it).
    Run {
        #[command(flatten)]
        client: ClientArgs,
        /// The service's name, `.service` added to a name without a unit type
        /// [default: exitproof-run-<random>.service].
        #[arg(long, value_parser = parse_service_name)]
        unit: Option<UnitName>,
        /// A property of the service (repeatable): KillMode=process, Environment=VAR=value,
        /// RuntimeMaxSec=5m, ... (see the README for the ones it can set).
        #[arg(short = 'p', long = "property", value_name = "NAME=VALUE")]
        properties: Vec<String>,
        /// The deadline of each D-Bus call.
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        method_timeout: Duration,
        /// The command and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Print the completion script for a shell, generated from this command line's definition.
    #[cfg(feature = "docs")]
    Completions {
        /// The shell.
        shell: docs::Shell,
    },
    /// Print the man page (roff), generated from this command line's definition.
    #[cfg(feature = "docs")]
    Man,
}

/// Permission bits in octal, such as `600` or `0660`.
fn parse_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s, 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("{s:?} is not an octal mode such as 600"))
}

/// How long `wait` and `stop` wait; `None` is `infinity`. Its own type, since clap reads an
/// `Option` field as an optional argument.
#[derive(Clone, Copy, Debug)]
struct WaitTimeout(Option<Duration>);

fn wait_timeout(s: &str) -> Result<WaitTimeout, crate::duration::DurationError> {
    parse_timeout(s).map(WaitTimeout)
}

fn parse_unit(s: &str) -> Result<UnitName, unit_name::InvalidUnitName> {
    unit_name::validate(s)
}

/// A service's name as `systemd-run --unit` takes it: `.service` added to a name that does not
/// end in a unit type (`unit_name_mangle_with_suffix` in systemd's src/basic/unit-name.c).
fn parse_service_name(s: &str) -> Result<UnitName, unit_name::InvalidUnitName> {
    unit_name::validate(s).or_else(|_| unit_name::validate(&format!("{s}.service")))
}

/// Runs the command line and returns the process's exit code.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return usage_error(error),
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

/// A command line clap rejects: clap's own words and exit code, or with `--json` the failure's
/// JSON line. `--help` and `--version` are clap's too.
fn usage_error(error: clap::Error) -> ExitCode {
    let asked_json = std::env::args_os().any(|arg| arg == "--json");
    if !asked_json || !error.use_stderr() {
        error.exit();
    }
    let rendered = error.render().to_string();
    let first = rendered.lines().next().unwrap_or_default();
    let failure = Failure {
        kind: Kind::Usage,
        message: first.strip_prefix("error: ").unwrap_or(first).to_owned(),
    };
    report(&failure, true);
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
