//! The systemd side: decoding its signals and calling its manager over D-Bus.
pub mod manager;
pub mod runtime;
pub mod signal;
