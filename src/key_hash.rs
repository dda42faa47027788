//! The hasher of tables keyed by numbers the agent or the kernel hands out (a watch's
//! [`UnitKey`](crate::agent::core), an inotify watch descriptor), never by a tenant's text.
//!
//! std's default, SipHash with a random key, defends a table against keys chosen to collide;
//! no one outside the agent chooses these, and SipHash cost about 150 instructions a lookup,
//! some 50 lookups a proof (callgrind, 1,000-unit spread). This is FxHash's round: a rotate,
//! an xor and a multiply by a constant with its high bits mixed, so sequential keys spread
//! over both the bits hashbrown probes with (the low ones) and those it filters with (the top
//! seven).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` keyed by numbers no tenant chooses.
pub(crate) type KeyMap<K, V> = HashMap<K, V, BuildHasherDefault<KeyHasher>>;

/// FxHash's multiplier: 2^64 divided by the golden ratio, odd.
const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

/// See the module's documentation.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct KeyHasher(u64);

impl KeyHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_i32(&mut self, n: i32) {
        // Sign-extended: -1 and 0xffff_ffff stay apart.
        self.add(i64::from(n) as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use super::*;

    fn hash<T: std::hash::Hash>(value: T) -> u64 {
        BuildHasherDefault::<KeyHasher>::default().hash_one(value)
    }

    #[test]
    fn sequential_keys_differ_in_the_top_seven_bits_hashbrown_filters_by() {
        let tops: std::collections::BTreeSet<u64> = (0..1000u64).map(|k| hash(k) >> 57).collect();
        assert!(
            tops.len() > 100,
            "only {} of 128 top-bit patterns",
            tops.len()
        );
    }

    #[test]
    fn a_map_of_keys_finds_each_key_and_no_other() {
        let mut map: KeyMap<u64, u64> = KeyMap::default();
        for k in 0..10_000 {
            map.insert(k, k * 2);
        }
        assert!((0..10_000).all(|k| map.get(&k) == Some(&(k * 2))));
        assert_eq!(map.get(&10_000), None);
    }
}
