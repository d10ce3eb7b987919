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
/// each message (its keys). An add, a shift and two exclusive ors, which the compiler
/// vectorizes: filling and checking run at memory speed (two multiplications per word,
/// before, took a quarter of a receiving process's CPU in two-process runs).
#[inline(always)]
fn word(k: (u64, u64), i: u64) -> [u8; 8] {
    let z = k.0.wrapping_add(i.wrapping_mul(STEP));
    (z ^ (z >> 29) ^ k.1).to_le_bytes()
}

/// Fills `out` with the bytes of message `msg` of flow `flow`.
pub(crate) fn fill(seed: u64, flow: u64, msg: u64, out: &mut [u8]) {
    let k = keys(seed, flow, msg);
    let i = (out.len() / 8) as u64;
    let mut words = out.chunks_exact_mut(8);
    for (i, w) in (&mut words).enumerate() {
        w.copy_from_slice(&word(k, i as u64));
    }
    let rest = words.into_remainder();
    let n = rest.len();
    rest.copy_from_slice(&word(k, i)[..n]);
}

/// The offset of the first byte of `got` that is not message `msg` of flow `flow`, if any.
pub(crate) fn first_mismatch(seed: u64, flow: u64, msg: u64, got: &[u8]) -> Option<usize> {
    let k = keys(seed, flow, msg);
    let words = got.chunks_exact(8);
    let rest = words.remainder();
    // Blocks of 64 words compared without branching on each, then the first bad one found.
    let mut at = 0usize;
    for block in got[..got.len() - rest.len()].chunks(512) {
        let mut diff = 0u64;
        for (j, w) in block.chunks_exact(8).enumerate() {
            let got = u64::from_le_bytes(w.try_into().expect("8 bytes"));
            diff |= got ^ u64::from_le_bytes(word(k, (at / 8 + j) as u64));
        }
        if diff != 0 {
            for (j, w) in block.chunks_exact(8).enumerate() {
                let want = word(k, (at / 8 + j) as u64);
                if let Some(b) = w.iter().zip(&want).position(|(a, b)| a != b) {
                    return Some(at + 8 * j + b);
                }
            }
        }
        at += block.len();
    }
    let want = word(k, (got.len() / 8) as u64);
    rest.iter()
        .zip(&want)
        .position(|(a, b)| a != b)
        .map(|i| at + i)
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
}
