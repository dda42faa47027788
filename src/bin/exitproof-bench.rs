//! The `exitproof-bench` binary (feature `bench`): the termination-latency benchmark, kept out
//! of the agent's binary.
fn main() -> std::process::ExitCode {
    exitproof::bench::cli::main()
}
