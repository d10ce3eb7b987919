//! A fast hasher for softnic's internal maps, looked up on every verb and packet: their keys
//! are softnic's own addresses and numbers (object addresses, memory keys), which nobody picks to
//! collide; the standard SipHash would cost more than the lookup it serves.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` with [`FastHasher`].
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// One multiply per integer key; the product's high half folded down, so that both the low
/// bits (the table's index) and the high bits (its tags) depend on every key bit.
#[derive(Default)]
pub(crate) struct FastHasher(u64);

const K: u64 = 0x9e37_79b9_7f4a_7c15;

impl FastHasher {
    fn mix(&mut self, n: u64) {
        let x = (self.0 ^ n).wrapping_mul(K);
        self.0 = x ^ (x >> 32);
    }
}

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.mix(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.mix(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.mix(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }
}

/// Slots of a [`NumberMap`]'s front (a power of two).
const FRONT: usize = 256;

/// A map of the numbers softnic hands out (QP numbers, memory key indices) to ids, looked up
/// on every packet: a direct-mapped front, whose slot `n % 256` holds the live key of that
/// remainder inserted last (until it is removed), answers without the hash; the map behind it
/// holds every entry. (Numbers given out in sequence, as QP numbers are, fill distinct slots:
/// 256 QPs created one after the other are all found in front.)
#[derive(Debug)]
pub(crate) struct NumberMap {
    /// Slot `s`: `(key, id)` of a live entry, or, empty, `(s + 1, 0)`: a key no look-up in
    /// slot `s` asks for.
    front: Box<[(u32, u32); FRONT]>,
    all: FastMap<u32, u32>,
}

impl Default for NumberMap {
    fn default() -> Self {
        NumberMap {
            front: Box::new(std::array::from_fn(|s| (s as u32 + 1, 0))),
            all: FastMap::default(),
        }
    }
}

impl NumberMap {
    /// The id of `key`.
    #[inline(always)]
    pub(crate) fn get(&self, key: u32) -> Option<u32> {
        match self.front[key as usize % FRONT] {
            (k, id) if k == key => Some(id),
            _ => self.all.get(&key).copied(),
        }
    }

    /// Whether `key` has an id.
    pub(crate) fn contains(&self, key: u32) -> bool {
        self.get(key).is_some()
    }

    /// Gives `key` the id `id`.
    pub(crate) fn insert(&mut self, key: u32, id: u32) {
        self.all.insert(key, id);
        self.front[key as usize % FRONT] = (key, id);
    }

    /// Forgets `key`.
    pub(crate) fn remove(&mut self, key: u32) {
        self.all.remove(&key);
        let s = key as usize % FRONT;
        if self.front[s].0 == key {
            self.front[s] = (s as u32 + 1, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_addresses_spread_over_the_low_bits() {
        let mut low = std::collections::BTreeSet::new();
        for i in 0..64usize {
            let mut h = FastHasher::default();
            h.write_usize(0x7f00_0000_0000 + i * 4096);
            low.insert(h.finish() & 63);
        }
        assert!(low.len() > 32, "{}", low.len());
    }

    #[test]
    fn a_number_map_finds_what_it_holds_in_front_or_behind_it() {
        let mut m = NumberMap::default();
        // 0x11 and 0x111 share a front slot: the later one is in front, the other behind it.
        m.insert(0x11, 1);
        m.insert(0x111, 2);
        m.insert(0x12, 3);
        assert_eq!(
            (m.get(0x11), m.get(0x111), m.get(0x12)),
            (Some(1), Some(2), Some(3))
        );
        assert_eq!(m.get(0x211), None);
        // Empty slots answer no key, whatever its number.
        assert!(!m.contains(u32::MAX) && !m.contains(0x13) && !m.contains(0) && !m.contains(1));
        // Removing the one behind leaves the one in front, and the other way round.
        m.remove(0x11);
        assert_eq!((m.get(0x11), m.get(0x111)), (None, Some(2)));
        m.insert(0x11, 4);
        m.remove(0x111);
        assert_eq!((m.get(0x11), m.get(0x111)), (Some(4), None));
        m.remove(0x11);
        assert!(!m.contains(0x11) && m.contains(0x12));
    }
}
