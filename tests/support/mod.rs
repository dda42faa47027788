//! Helpers shared by the integration test binaries.
//!
//! Test code only: nothing here may be used by the library or the agent, and nothing here may
//! leave processes, cgroups or files behind.

// Each test binary includes this module and uses only part of it.
#![allow(dead_code)]

pub mod agent;
pub mod impostor;
pub mod sandbox;

pub use sandbox::Sandbox;
