//! exitproof: proves that every process of a systemd unit is gone.
pub mod cgroup;
pub mod proof;
