//! The integration tests that need no systemd, as one test binary (each file of `tests/` is a
//! binary of its own, linked anew): the control socket and client, the zbus runtime on a
//! private bus, fuzzing, and the files the repository ships. `tests/real_systemd` (its own
//! harness) and `tests/threads.rs` (no harness: it counts the process's threads) stay apart.

#![allow(clippy::disallowed_methods, reason = "tests may read the clock")]

#[path = "../common/mod.rs"]
mod common;

// They check what the `exitproof` binary and its units ship, and its command line.
#[cfg(feature = "cli")]
mod command_line;
#[cfg(feature = "cli")]
mod contrib_units;
mod control_client;
mod control_server;
mod fuzz;
mod layering;
// `exitproof completions`, `exitproof man` and the package need the feature `docs`.
#[cfg(feature = "docs")]
mod generated_docs;
#[cfg(feature = "docs")]
mod package;
mod readme;
mod runtime_bus;
