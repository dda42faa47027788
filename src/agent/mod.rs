//! The agent: one mio loop that owns the drivers and the units.
pub mod facts;
