//! A 256-bit set in four words: the SACK bitmap compared with what is already known a word at
//! a time, so an ACK costs O(chunks it newly acknowledges), not O(window).

use crate::wire::SACK_BYTES;

const WORDS: usize = 4;

/// Bits `0..256`; bit `i` is bit `i % 64` of word `i / 64`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Bits256([u64; WORDS]);

impl Bits256 {
    /// The ACK bitmap layout: bit `i` is byte `i / 8`, bit `i % 8`.
    pub(crate) fn from_lsb_bytes(b: &[u8; SACK_BYTES]) -> Self {
        let mut w = [0u64; WORDS];
        for (i, word) in w.iter_mut().enumerate() {
            let mut le = [0u8; 8];
            le.copy_from_slice(&b[i * 8..i * 8 + 8]);
            *word = u64::from_le_bytes(le);
        }
        Bits256(w)
    }

    /// Bits `0..n` set (`n` at most 256).
    pub(crate) fn low(n: u32) -> Self {
        let mut w = [0u64; WORDS];
        for (i, word) in w.iter_mut().enumerate() {
            let lo = i as u32 * 64;
            *word = match n.saturating_sub(lo) {
                0 => 0,
                k if k >= 64 => u64::MAX,
                k => (1u64 << k) - 1,
            };
        }
        Bits256(w)
    }

    #[cfg(test)]
    pub(crate) fn get(&self, i: u32) -> bool {
        i < 256 && self.0[(i / 64) as usize] >> (i % 64) & 1 != 0
    }

    pub(crate) fn set(&mut self, i: u32) {
        if i < 256 {
            self.0[(i / 64) as usize] |= 1 << (i % 64);
        }
    }

    /// Bit `i + n` becomes bit `i` (the low `n` bits fall off).
    pub(crate) fn shr(self, n: u32) -> Self {
        let mut w = [0u64; WORDS];
        let (words, bits) = ((n / 64) as usize, n % 64);
        for (i, out) in w.iter_mut().enumerate() {
            let lo = self.0.get(i + words).copied().unwrap_or(0);
            let hi = self.0.get(i + words + 1).copied().unwrap_or(0);
            *out = if bits == 0 {
                lo
            } else {
                (lo >> bits) | (hi << (64 - bits))
            };
        }
        Bits256(w)
    }

    /// Bit `i` becomes bit `i + n` (bits past 255 fall off).
    pub(crate) fn shl(self, n: u32) -> Self {
        let mut w = [0u64; WORDS];
        let (words, bits) = ((n / 64) as usize, n % 64);
        for (i, out) in w.iter_mut().enumerate() {
            let lo = i.checked_sub(words + 1).map_or(0, |j| self.0[j]);
            let hi = i.checked_sub(words).map_or(0, |j| self.0[j]);
            *out = if bits == 0 {
                hi
            } else {
                (hi << bits) | (lo >> (64 - bits))
            };
        }
        Bits256(w)
    }

    pub(crate) fn and(self, o: Self) -> Self {
        Bits256(std::array::from_fn(|i| self.0[i] & o.0[i]))
    }

    pub(crate) fn and_not(self, o: Self) -> Self {
        Bits256(std::array::from_fn(|i| self.0[i] & !o.0[i]))
    }

    /// The set bits, lowest first.
    pub(crate) fn ones(self) -> impl Iterator<Item = u32> {
        let mut w = self.0;
        let mut i = 0usize;
        std::iter::from_fn(move || {
            while i < WORDS {
                if w[i] != 0 {
                    let b = w[i].trailing_zeros();
                    w[i] &= w[i] - 1;
                    return Some(i as u32 * 64 + b);
                }
                i += 1;
            }
            None
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn model(b: Bits256) -> Vec<u32> {
        (0..256).filter(|&i| b.get(i)).collect()
    }

    proptest! {
        #[test]
        fn word_operations_match_bit_by_bit(bytes: [u8; 32], n in 0u32..=256, m in 0u32..=256) {
            let b = Bits256::from_lsb_bytes(&bytes);
            let bits: Vec<u32> = (0..256).filter(|&i| bytes[i as usize / 8] >> (i % 8) & 1 != 0).collect();
            prop_assert_eq!(model(b), bits.clone());
            prop_assert_eq!(b.ones().collect::<Vec<_>>(), bits.clone());
            let shr: Vec<u32> = bits.iter().filter(|&&i| i >= n).map(|&i| i - n).collect();
            prop_assert_eq!(model(b.shr(n)), shr);
            let shl: Vec<u32> = bits.iter().map(|&i| i + n).filter(|&i| i < 256).collect();
            prop_assert_eq!(model(b.shl(n)), shl);
            prop_assert_eq!(model(Bits256::low(n)), (0..n).collect::<Vec<_>>());
            let masked: Vec<u32> = bits.iter().copied().filter(|&i| i < n && i >= m).collect();
            prop_assert_eq!(model(b.and(Bits256::low(n)).and_not(Bits256::low(m))), masked);
            let mut s = Bits256::default();
            s.set(n.min(255));
            prop_assert_eq!(model(s), vec![n.min(255)]);
        }
    }
}
