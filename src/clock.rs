//! The clock: every reading of it outside tests and the benchmark is one of these.
//!
//! Only the driver reads the clock: the pure cores (`proof`, `agent::core`) are handed `now`,
//! which lets their tests and the simulator run in virtual time. `clippy.toml` disallows the
//! raw readings (`Instant::now`, `SystemTime::now`, `clock_gettime` through nix or libc)
//! everywhere but here, so a new kind of reading comes here and says what it is for.

#![allow(
    clippy::disallowed_methods,
    reason = "the one module that reads the clock"
)]

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use nix::time::{ClockId, clock_gettime};

/// The loop's time, for deadlines: the driver hands it to the cores as `now`, and the zbus
/// runtime's timers wait for it.
pub(crate) fn now() -> Instant {
    Instant::now()
}

/// CLOCK_MONOTONIC now, in nanoseconds (0 if it cannot be read): comparable across
/// processes, as a proof event's `proven_mono_ns` is.
pub fn monotonic_ns() -> u64 {
    match clock_gettime(ClockId::CLOCK_MONOTONIC) {
        Ok(ts) => {
            u64::try_from(ts.tv_sec()).unwrap_or(0) * 1_000_000_000
                + u64::try_from(ts.tv_nsec()).unwrap_or(0)
        }
        Err(_) => 0,
    }
}

/// An instant and CLOCK_MONOTONIC at it, for timestamps other processes can compare (a proof's
/// `proven_mono_ns`) without reading the clock twice at each: of three back-to-back readings, the
/// tightest. The first reading of a clock in a process can take 15 us (the agent's proofs were
/// all stamped that much late when the pair was read once, apart).
pub(crate) fn anchor() -> (Instant, u64) {
    let reading = || {
        let before = monotonic_ns();
        let instant = Instant::now();
        let after = monotonic_ns();
        (
            after.saturating_sub(before),
            instant,
            before / 2 + after / 2,
        )
    };
    let mut best = reading();
    for _ in 0..2 {
        let next = reading();
        if next.0 < best.0 {
            best = next;
        }
    }
    (best.1, best.2)
}

/// Seconds since the epoch (0 before it), for the names of corrupt files moved aside; never a
/// decision.
pub(crate) fn wall_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

/// The CPU time the calling thread has used, in nanoseconds (0 if it cannot be read).
pub(crate) fn thread_cpu_ns() -> u64 {
    clock_ns(ClockId::CLOCK_THREAD_CPUTIME_ID).map_or(0, |ns| u64::try_from(ns).unwrap_or(0))
}

/// `clock` now, in nanoseconds: processes' start times are placed against CLOCK_BOOTTIME and
/// CLOCK_MONOTONIC, which `Instant` does not tell apart.
pub(crate) fn clock_ns(clock: ClockId) -> nix::Result<i128> {
    let time = clock_gettime(clock)?;
    Ok(i128::from(time.tv_sec()) * 1_000_000_000 + i128::from(time.tv_nsec()))
}

/// CLOCK_REALTIME minus CLOCK_MONOTONIC now, in nanoseconds (`None` if either cannot be read):
/// what turns a monotonic timestamp into wall-clock time as of now.
pub(crate) fn realtime_minus_monotonic_ns() -> Option<i128> {
    let read = |clock| {
        clock_gettime(clock)
            .ok()
            .map(|ts| i128::from(ts.tv_sec()) * 1_000_000_000 + i128::from(ts.tv_nsec()))
    };
    let mono = read(ClockId::CLOCK_MONOTONIC)?;
    let wall = read(ClockId::CLOCK_REALTIME)?;
    Some(wall - mono)
}
