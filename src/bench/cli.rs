//! The command line of `exitproof-bench`: runs the benchmark against the systemd manager on
//! the bus, or (hidden, `--observer`) is the bench's own observer process.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use super::run::{BenchConfig, run, summary_value};
use super::sample::Mode;
use crate::duration::parse_duration;
use crate::systemd::Bus;

/// Benchmarks termination latency against the systemd manager on the bus: exitproof's agent,
/// the polling design it replaces, and systemd's own signal, on the same kill schedule.
#[derive(Debug, Parser)]
#[command(name = "exitproof-bench", version, about)]
pub struct BenchCli {
    /// The systemd user manager and the session bus, instead of the system ones.
    #[arg(long)]
    user: bool,
    /// Transient units started and killed per round (and per phase).
    #[arg(long, default_value_t = 100)]
    units: usize,
    /// Kill rounds per phase.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// The polling contender's interval (the replaced design polled every second).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    poll_interval: Duration,
    /// The idle window, all units watched, over which idle CPU is measured (`0`: none).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    idle: Duration,
    /// Kill one unit every DUR, at a random instant within it (`0`: all at once).
    #[arg(long, default_value = "0", value_parser = parse_duration)]
    kill_interval: Duration,
    /// The seed of the kill instants' jitter [default: from the clock; bench.json records it].
    #[arg(long)]
    seed: Option<u64>,
    /// Run both contenders at once on the same units, instead of each in a phase of its own.
    #[arg(long)]
    together: bool,
    /// The exitproof binary to benchmark [default: `exitproof` beside this binary].
    #[arg(long)]
    agent: Option<PathBuf>,
    /// Where bench.json, bench.md and latency.svg are written.
    #[arg(long, default_value = ".")]
    out: PathBuf,
    /// The agent's state directory, to measure it on another filesystem [default: `state` in
    /// the bench's temporary directory]. Emptied before the run; each phase's agent starts anew.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Be the bench's observer process (the bench starts it itself).
    #[arg(long, hide = true)]
    observer: bool,
}

/// Runs the command line and returns the process's exit code.
pub fn main() -> ExitCode {
    let cli = BenchCli::parse();
    let bus = if cli.user { Bus::User } else { Bus::System };
    let outcome = if cli.observer {
        super::observer::observe(bus).map_err(|e| format!("observer: {e}"))
    } else {
        bench(cli, bus)
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("exitproof-bench: {message}");
            ExitCode::FAILURE
        }
    }
}

fn bench(cli: BenchCli, bus: Bus) -> Result<(), String> {
    let agent_binary = match cli.agent {
        Some(path) => path,
        None => std::env::current_exe()
            .map_err(|e| format!("find this binary: {e}"))?
            .with_file_name("exitproof"),
    };
    let work_dir = std::env::temp_dir().join(format!("exitproof-bench-{}", std::process::id()));
    let config = BenchConfig {
        bus,
        units: cli.units,
        rounds: cli.rounds,
        poll_interval: cli.poll_interval,
        idle: cli.idle,
        kill_interval: cli.kill_interval,
        seed: cli.seed.unwrap_or_else(crate::clock::monotonic_ns),
        mode: if cli.together {
            Mode::Together
        } else {
            Mode::Separate
        },
        agent_binary,
        // By a path that works even where this binary's own path is hidden (a mount namespace
        // with another /tmp): the child's /proc/self/exe is ours.
        bench_binary: PathBuf::from("/proc/self/exe"),
        work_dir: work_dir.clone(),
        state_dir: cli.state_dir,
    };
    let run = run(&config)
        .map_err(|e| format!("{e} (agent log: {})", work_dir.join("agent.log").display()))?;
    super::report::write_reports(&cli.out, &run).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&work_dir);
    println!("{}", summary_value(&run));
    eprintln!(
        "exitproof-bench: wrote bench.json, bench.md and latency.svg in {}",
        cli.out.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_kill_interval_is_a_clear_usage_error() {
        let error = BenchCli::try_parse_from(["exitproof-bench", "--kill-interval", "abc"])
            .expect_err("abc is no duration");
        assert_eq!(error.kind(), clap::error::ErrorKind::ValueValidation);
        let message = error.to_string();
        assert!(
            message.contains("--kill-interval") && message.contains("expected a number at \"abc\""),
            "{message}"
        );
    }

    #[test]
    fn defaults_are_separate_phases_and_one_burst() {
        let cli = BenchCli::try_parse_from(["exitproof-bench"]).expect("no argument is needed");
        assert!(!cli.together && !cli.observer);
        assert_eq!(cli.kill_interval, Duration::ZERO);
        let cli = BenchCli::try_parse_from([
            "exitproof-bench",
            "--kill-interval",
            "20ms",
            "--together",
            "--seed",
            "7",
        ])
        .expect("valid arguments");
        assert!(cli.together);
        assert_eq!(cli.kill_interval, Duration::from_millis(20));
        assert_eq!(cli.seed, Some(7));
    }
}
