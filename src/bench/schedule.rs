//! When each unit of a round is killed: unit `i` at `i × interval` plus a uniform random jitter
//! in `[0, interval)`, from a seed. The jitter makes the kill instants independent of the
//! polling contender's phase, so its latency is spread over its interval as in production; the
//! seed makes every phase and round use the very same schedule, and a run replayable.

use std::time::Duration;

use crate::rng::Rng;

/// The offset of each of `units` kills from the start of the round, ascending; all zero (one
/// burst) when `interval` is zero.
pub fn kill_offsets(units: usize, interval: Duration, seed: u64) -> Vec<Duration> {
    let mut rng = Rng::new(seed);
    // Nanoseconds fit in u64 for any interval a run could last (584 years).
    let slot_ns = u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX);
    (0..units as u64)
        .map(|i| {
            if slot_ns == 0 {
                return Duration::ZERO;
            }
            let jitter = rng.next_u64() % slot_ns;
            Duration::from_nanos(i.saturating_mul(slot_ns).saturating_add(jitter))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kill_falls_in_its_own_slot() {
        let interval = Duration::from_millis(20);
        let offsets = kill_offsets(1000, interval, 7);
        assert_eq!(offsets.len(), 1000);
        for (i, offset) in offsets.iter().enumerate() {
            let slot = interval * i as u32;
            assert!(
                slot <= *offset && *offset < slot + interval,
                "kill {i} at {offset:?}"
            );
        }
        assert!(offsets.is_sorted());
        // Uniform within the slot: over 1000 slots, both halves are well used.
        let early = offsets
            .iter()
            .enumerate()
            .filter(|(i, o)| **o - interval * (*i as u32) < interval / 2)
            .count();
        assert!(
            (400..600).contains(&early),
            "{early} of 1000 in the early half"
        );
    }

    #[test]
    fn the_seed_decides_the_schedule() {
        let interval = Duration::from_millis(5);
        assert_eq!(kill_offsets(50, interval, 1), kill_offsets(50, interval, 1));
        assert_ne!(kill_offsets(50, interval, 1), kill_offsets(50, interval, 2));
    }

    #[test]
    fn no_interval_is_one_burst() {
        assert_eq!(kill_offsets(3, Duration::ZERO, 9), vec![Duration::ZERO; 3]);
        assert!(kill_offsets(0, Duration::from_secs(1), 9).is_empty());
    }
}
