//! The bytes every message carries: a pattern derived from the seed, the flow and the message
//! number, each 8-byte word also from its position, so that a byte out of place, missing,
//! duplicated or from another message shows.

/// The key of message `msg` of flow `flow` under `seed` (splitmix64 of the three, so that
/// neighbouring messages and flows get unrelated keys).
fn key(seed: u64, flow: u64, msg: u64) -> u64 {
    let mut z =
        seed ^ flow.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ msg.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The two keys of message `msg` of flow `flow` under `seed`.
fn keys(seed: u64, flow: u64, msg: u64) -> (u64, u64) {
    let k = key(seed, flow, msg);
    (k, key(k, flow, !msg))
}

/// An odd step: `lo + i * STEP` differs for every word of a message (up to 2^64 words).
const STEP: u64 = 0x9e37_79b9_7f4a_7c15;

/// The `i`-th 8-byte word of the message with keys `k`: `z ^ (z >> 29) ^ hi` with
/// `z = lo + i * STEP`, a value of its own for each position (STEP is odd, and the shift
/// folds high bits of long period into the low bytes, whose own period is short) and for
/// each message (its keys).
#[inline(always)]
fn word(k: (u64, u64), i: u64) -> [u8; 8] {
    mix(k.0.wrapping_add(i.wrapping_mul(STEP)), k.1)
}

/// The word at `z = lo + i * STEP` under high key `hi`. The loops below step `z` by `STEP`
/// from word to word instead of multiplying: an add, a shift and two exclusive ors a word,
/// which the compiler vectorizes with no 64-bit multiply (SSE2 has none: emulated, it took
/// half of a fill's time), so that filling and checking run at memory speed.
#[inline(always)]
fn mix(z: u64, hi: u64) -> [u8; 8] {
    (z ^ (z >> 29) ^ hi).to_le_bytes()
}

/// The bytes of one message (of a flow, under a seed), which a sender writes and a receiver
/// checks piece by piece: a piece of a few KiB stays in the first-level cache between the
/// pattern and the copy to or from the registered buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pattern {
    k: (u64, u64),
}

impl Pattern {
    /// The pattern of message `msg` of flow `flow` under `seed`.
    pub(crate) fn new(seed: u64, flow: u64, msg: u64) -> Pattern {
        Pattern {
            k: keys(seed, flow, msg),
        }
    }

    /// Fills `out` with the message's bytes from byte `at` on (`at` a multiple of 8).
    pub(crate) fn fill(&self, at: usize, out: &mut [u8]) {
        debug_assert!(at.is_multiple_of(8));
        let mut words = out.chunks_exact_mut(8);
        let mut z = self.k.0.wrapping_add(((at / 8) as u64).wrapping_mul(STEP));
        for w in &mut words {
            w.copy_from_slice(&mix(z, self.k.1));
            z = z.wrapping_add(STEP);
        }
        // `z` is the next word's: the bytes of it that are left.
        let rest = words.into_remainder();
        let n = rest.len();
        rest.copy_from_slice(&mix(z, self.k.1)[..n]);
    }

    /// The offset in the message of the first byte of `got`, the message's bytes from byte
    /// `at` on (`at` a multiple of 8), that is not the pattern's, if any.
    pub(crate) fn first_mismatch(&self, at: usize, got: &[u8]) -> Option<usize> {
        debug_assert!(at.is_multiple_of(8));
        let k = self.k;
        let words = got.chunks_exact(8);
        let rest = words.remainder();
        // Blocks of 64 words compared without branching on each, then the first bad one found.
        let mut at = at;
        let mut z = k.0.wrapping_add(((at / 8) as u64).wrapping_mul(STEP));
        for block in got[..got.len() - rest.len()].chunks(512) {
            let mut diff = 0u64;
            let mut zj = z;
            for w in block.chunks_exact(8) {
                let got = u64::from_le_bytes(w.try_into().expect("8 bytes"));
                diff |= got ^ u64::from_le_bytes(mix(zj, k.1));
                zj = zj.wrapping_add(STEP);
            }
            if diff != 0 {
                for (j, w) in block.chunks_exact(8).enumerate() {
                    let want = word(k, (at / 8 + j) as u64);
                    if let Some(b) = w.iter().zip(&want).position(|(a, b)| a != b) {
                        return Some(at + 8 * j + b);
                    }
                }
            }
            z = zj;
            at += block.len();
        }
        let want = mix(z, k.1);
        rest.iter()
            .zip(&want)
            .position(|(a, b)| a != b)
            .map(|i| at + i)
    }
}

/// Fills `out` with the bytes of message `msg` of flow `flow`.
#[cfg(test)]
fn fill(seed: u64, flow: u64, msg: u64, out: &mut [u8]) {
    Pattern::new(seed, flow, msg).fill(0, out);
}

/// The offset of the first byte of `got` that is not message `msg` of flow `flow`, if any.
#[cfg(test)]
fn first_mismatch(seed: u64, flow: u64, msg: u64, got: &[u8]) -> Option<usize> {
    Pattern::new(seed, flow, msg).first_mismatch(0, got)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_checks_against_itself_and_names_the_first_bad_byte() {
        for len in [0, 1, 7, 8, 9, 4096, 4099] {
            let mut b = vec![0u8; len];
            fill(3, 1, 2, &mut b);
            assert_eq!(first_mismatch(3, 1, 2, &b), None, "{len}");
            if len > 5 {
                b[5] ^= 1;
                assert_eq!(first_mismatch(3, 1, 2, &b), Some(5));
                b[5] ^= 1;
            }
            if len > 1 {
                b[len - 1] ^= 0x80;
                assert_eq!(first_mismatch(3, 1, 2, &b), Some(len - 1));
            }
        }
        // The loops step from word to word: the words are those `word` defines.
        let mut b = vec![0u8; 4096];
        fill(3, 1, 2, &mut b);
        for i in [0usize, 1, 2, 63, 64, 511] {
            assert_eq!(
                b[8 * i..8 * i + 8],
                word(keys(3, 1, 2), i as u64),
                "word {i}"
            );
        }
        let (mut a, mut b, mut c) = (vec![0u8; 64], vec![0u8; 64], vec![0u8; 64]);
        fill(3, 1, 2, &mut a);
        fill(3, 1, 3, &mut b);
        fill(3, 2, 2, &mut c);
        assert!(a != b && a != c && b != c, "messages and flows differ");
        assert!(first_mismatch(3, 1, 3, &a).is_some());
        // Words in another order (a chunk landed at another offset) show.
        let mut big = vec![0u8; 8192];
        fill(3, 1, 2, &mut big);
        big.copy_within(0..4096, 4096);
        assert_eq!(first_mismatch(3, 1, 2, &big), Some(4096));
    }

    #[test]
    fn a_message_filled_and_checked_in_pieces_is_the_message_whole() {
        let p = Pattern::new(9, 4, 7);
        for len in [8usize, 4096, 4099, 10_000] {
            let mut whole = vec![0u8; len];
            p.fill(0, &mut whole);
            for piece in [8usize, 64, 4096] {
                let mut pieces = vec![0u8; len];
                for (n, b) in pieces.chunks_mut(piece).enumerate() {
                    p.fill(n * piece, b);
                }
                assert_eq!(pieces, whole, "{len} in pieces of {piece}");
                for (n, b) in whole.chunks(piece).enumerate() {
                    assert_eq!(p.first_mismatch(n * piece, b), None);
                }
            }
            // A bad byte is named by its offset in the message.
            whole[len - 3] ^= 1;
            let at = (len - 3) / 64 * 64;
            assert_eq!(p.first_mismatch(at, &whole[at..]), Some(len - 3));
        }
    }
}
