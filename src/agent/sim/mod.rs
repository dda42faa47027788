//! Deterministic simulation of the agent against a model of systemd, D-Bus and the kernel.

mod bus;
mod kernel;
mod oracle;
mod rng;
mod service;
mod world;
#[cfg(test)]
mod world_tests;
