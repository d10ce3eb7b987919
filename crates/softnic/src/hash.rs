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
}
