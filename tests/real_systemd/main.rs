//! Integration tests against a real systemd user manager, each in its own sandbox.
//!
//! A custom libtest-mimic harness, so that where a sandbox cannot run (no root, no cgroup v2,
//! no systemd) every test is reported as ignored, with the reason printed loudly: these tests
//! must never count as passed when they did not run.

#![allow(clippy::disallowed_methods, reason = "tests may read the clock")]

#[path = "../support/mod.rs"]
mod support;

mod agent;
#[cfg(feature = "bench")]
mod bench;
mod boundaries;
mod cli;
mod dynamics;
mod faults;
mod impostor;
mod operability;
mod proof_defects;
mod records;
mod run;
mod sandbox_smoke;
mod scale;
mod truth;

use libtest_mimic::{Arguments, Completion, Trial};
use support::Sandbox;

/// A named test: it panics to fail.
pub type Test = (&'static str, fn());

/// Every suite (a submodule) with its tests.
const SUITES: &[(&str, &[Test])] = &[
    ("sandbox_smoke", sandbox_smoke::TESTS),
    ("agent", agent::TESTS),
    ("records", records::TESTS),
    ("faults", faults::TESTS),
    ("impostor", impostor::TESTS),
    ("dynamics", dynamics::TESTS),
    ("cli", cli::TESTS),
    ("operability", operability::TESTS),
    ("run", run::TESTS),
    ("proof_defects", proof_defects::TESTS),
    ("boundaries", boundaries::TESTS),
    ("truth", truth::TESTS),
];

/// The benchmark's suite, built with the `bench` feature only (scripts/test enables it).
#[cfg(feature = "bench")]
const BENCH: &[(&str, &[Test])] = &[("bench", bench::TESTS)];
#[cfg(not(feature = "bench"))]
const BENCH: &[(&str, &[Test])] = &[];

/// Suites too slow for every run: reported as ignored unless asked for with `--ignored`.
const ON_REQUEST: &[(&str, &[Test])] = &[("scale", scale::TESTS)];

fn main() {
    let arguments = Arguments::from_args();
    let availability = Sandbox::availability();
    if let Err(reason) = &availability {
        eprintln!();
        eprintln!("==================================================================");
        eprintln!("REAL-SYSTEMD TESTS SKIPPED: a sandbox cannot run on this machine:");
        eprintln!("  {reason}");
        eprintln!("They are reported as ignored. They did NOT pass.");
        eprintln!("==================================================================");
        eprintln!();
    }
    let on_request = ON_REQUEST.iter().map(|suite| (suite, true));
    let trials = SUITES
        .iter()
        .chain(BENCH)
        .map(|suite| (suite, false))
        .chain(on_request)
        .flat_map(|((suite, tests), slow)| {
            tests
                .iter()
                .map(move |(name, test)| (format!("{suite}::{name}"), *test, slow))
        })
        .map(|(name, test, slow)| match &availability {
            Ok(()) => Trial::test(name, move || {
                test();
                Ok(())
            })
            .with_ignored_flag(slow),
            Err(reason) => {
                // Ignored up front; and should --include-ignored run it anyway, it still only
                // reports itself ignored, with the reason.
                let reason = reason.clone();
                Trial::ignorable_test(name, move || Ok(Completion::ignored_with(reason)))
                    .with_ignored_flag(true)
            }
        })
        .collect();
    libtest_mimic::run(&arguments, trials).exit();
}
