//! Giving memory back after a burst. A hash table or a queue never shrinks by itself, so one
//! burst of 10,000 watches would keep its slots for the life of the agent once they are
//! unwatched; and glibc's allocator keeps the pages of the heap it freed, unless asked.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hash};

/// Below this many slots a table or a queue is not worth reallocating: a busy turn fills that.
const SHRINK_MIN_CAPACITY: usize = 64;

/// Shrinks `map` to twice its length once it is less than a quarter full: the reallocation is
/// paid for by the removals that emptied it, and a map that grows again right away has room.
pub(crate) fn shrink_when_sparse<K: Eq + Hash, V, S: BuildHasher>(map: &mut HashMap<K, V, S>) {
    if map.capacity() > SHRINK_MIN_CAPACITY && map.len() < map.capacity() / 4 {
        map.shrink_to(map.len() * 2);
    }
}

/// Shrinks a drained `queue` that a burst grew: 10,000 proofs at once left the agent's queue
/// of bus messages 1.8 MiB of room, held for its life.
pub(crate) fn shrink_when_drained<T>(queue: &mut VecDeque<T>) {
    if queue.is_empty() && queue.capacity() > SHRINK_MIN_CAPACITY {
        queue.shrink_to(SHRINK_MIN_CAPACITY);
    }
}

/// Returns the free pages of the heap to the kernel (glibc's `malloc_trim`). glibc gives back
/// only the free top of the heap by itself; the free pages between live allocations stay
/// resident, and after a burst of proofs most of the heap is such pages.
pub(crate) fn trim_free_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks and releases the allocator's own free chunks.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mostly_empty_map_shrinks_and_a_full_one_keeps_its_room() {
        let mut map: HashMap<u32, u32> = (0..1000).map(|i| (i, i)).collect();
        let full = map.capacity();
        shrink_when_sparse(&mut map);
        assert_eq!(map.capacity(), full);
        map.retain(|k, _| *k < 100);
        shrink_when_sparse(&mut map);
        assert!(map.capacity() < full / 4, "{} of {full}", map.capacity());
        assert_eq!(map.len(), 100);
    }

    #[test]
    fn a_drained_queue_gives_back_what_a_burst_grew_and_a_busy_one_keeps_it() {
        let mut queue: VecDeque<u64> = (0..10_000).collect();
        let grown = queue.capacity();
        shrink_when_drained(&mut queue);
        assert_eq!(queue.capacity(), grown);
        queue.clear();
        shrink_when_drained(&mut queue);
        assert!(
            queue.capacity() < grown / 100,
            "{} of {grown}",
            queue.capacity()
        );
        queue.extend(0..3);
        shrink_when_drained(&mut queue);
        assert_eq!(queue.len(), 3);
    }
}
