//! The termination-latency benchmark: exitproof's agent, the polling design it replaces, and
//! systemd's own signal, side by side on the same units.
pub mod sample;
