//! exitproof: proves that every process of a systemd unit is gone, so whatever the unit held
//! (a lease, a port, a volume, a name) can be released, and never over a writer that may still
//! exist.
//!
//! The proof comes from two facts a tenant cannot forge: systemd's state of the unit
//! (ActiveState and InvocationID, from D-Bus `PropertiesChanged` signals) and the emptiness of
//! the unit's cgroup v2 (`cgroup.events`, watched with inotify). The decision is a pure state
//! machine, [`proof::UnitProof`]; the [`agent`] is one single-threaded mio loop that feeds it.
//! See ARCHITECTURE.md for the map.

#![warn(missing_docs)]
#![warn(unreachable_pub)]
// Tests may read the clock. The library's own code is linted without cfg(test), where
// clippy.toml's disallowed-methods keeps the clock to `clock`.
#![cfg_attr(
    test,
    allow(clippy::disallowed_methods, reason = "tests may read the clock")
)]

pub mod activation;
pub mod agent;
pub(crate) mod atomic_file;
// The binaries' own code, public only so that `src/main.rs` and `src/bin/` can call it: not API.
#[cfg(feature = "bench")]
#[doc(hidden)]
pub mod bench;
pub(crate) mod cgroup;
#[cfg(feature = "cli")]
#[doc(hidden)]
pub mod cli;
pub mod clock;
pub mod control;
// `DUR` arguments of the command lines.
#[cfg(feature = "cli")]
pub(crate) mod duration;
pub mod exit;
// The CLI's logger writes to journald; the library logs through whatever logger its user set.
#[cfg(feature = "cli")]
pub(crate) mod journald;
pub(crate) mod key_hash;
pub(crate) mod memory;
pub mod proof;
pub mod record_name;
#[cfg(any(test, feature = "bench"))]
mod rng;
pub(crate) mod service;
pub mod systemd;
pub(crate) mod token_pool;
#[cfg(feature = "cli")]
pub(crate) mod transient;
pub mod unit_name;
