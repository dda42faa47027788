//! exitproof: proves that every process of a systemd unit is gone, so whatever the unit held
//! (a lease, a port, a volume, a name) can be released, and never over a writer that may still
//! exist.
//!
//! The proof comes from two facts a tenant cannot forge: systemd's state of the unit
//! (ActiveState and InvocationID, from D-Bus `PropertiesChanged` signals) and the emptiness of
//! the unit's cgroup v2 (`cgroup.events`, watched with inotify). The decision is a pure state
//! machine, [`proof::UnitProof`]; the [`agent`] is one single-threaded mio loop that feeds it.
//! See ARCHITECTURE.md for the map.

pub mod activation;
pub mod agent;
pub mod atomic_file;
#[cfg(feature = "bench")]
pub mod bench;
pub mod cgroup;
pub mod cli;
pub mod control;
pub mod duration;
pub mod exit;
pub mod journald;
pub mod memory;
pub mod proof;
#[cfg(any(test, feature = "bench"))]
mod rng;
pub mod service;
pub mod systemd;
pub mod transient;
pub mod unit_name;
