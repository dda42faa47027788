//! exitproof: proves that every process of a systemd unit is gone.
pub mod agent;
pub mod cgroup;
pub mod proof;
pub mod systemd;
