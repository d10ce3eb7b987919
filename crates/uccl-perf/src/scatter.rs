//! Where the blocks of a vectored message (`--op writev|readv`) lie: `--iov` blocks of
//! `--block-size` bytes, at places in each buffer's slot drawn from the seed (two
//! permutations), so that a block put in the wrong place shows.

use uccl_engine::{Block, Buffer, Descriptor};

/// The layout of every vectored message of a run.
pub(crate) struct Scatter {
    /// Bytes per block.
    size: u64,
    /// Block `k`'s place (in blocks) in the local slot and in the remote one.
    local: Vec<u64>,
    remote: Vec<u64>,
    /// Whether the local side is the source (writev) or the destination (readv).
    writes: bool,
}

/// A permutation of `0..n` drawn from `seed` (Fisher-Yates over splitmix64).
fn shuffle(n: u64, mut seed: u64) -> Vec<u64> {
    let mut next = || {
        seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut p: Vec<u64> = (0..n).collect();
    for i in (1..p.len()).rev() {
        p.swap(i, (next() % (i as u64 + 1)) as usize);
    }
    p
}

impl Scatter {
    /// `n` blocks of `size` bytes, placed as `seed` says; `writes`: the local blocks are
    /// written to the remote ones (else read from them).
    pub(crate) fn new(n: u64, size: u64, seed: u64, writes: bool) -> Scatter {
        Scatter {
            size,
            local: shuffle(n, seed ^ 0x5ca7),
            remote: shuffle(n, seed ^ 0x7e7e),
            writes,
        }
    }

    /// The blocks of a message whose local slot starts at `local_at` of `buf` and whose remote
    /// slot starts at `remote_at` of `remote`, into `out` (cleared first).
    pub(crate) fn blocks(
        &self,
        (buf, local_at): (&Buffer, u64),
        (remote, remote_at): (&Descriptor, u64),
        out: &mut Vec<Block>,
    ) {
        out.clear();
        out.extend(self.local.iter().zip(&self.remote).map(|(&l, &r)| Block {
            buf: buf.clone(),
            offset: local_at + l * self.size,
            remote: *remote,
            remote_offset: remote_at + r * self.size,
            len: self.size,
        }));
    }

    /// Puts the bytes of a destination slot (`got`) back in the source's order, into `out`.
    pub(crate) fn gather(&self, got: &[u8], out: &mut [u8]) {
        let s = self.size as usize;
        let (src, dst) = match self.writes {
            true => (&self.local, &self.remote),
            false => (&self.remote, &self.local),
        };
        for (&from, &to) in src.iter().zip(dst) {
            let (from, to) = (from as usize * s, to as usize * s);
            out[from..from + s].copy_from_slice(&got[to..to + s]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_undoes_the_scatter_and_places_differ() {
        for writes in [true, false] {
            let sc = Scatter::new(8, 4, 3, writes);
            assert_ne!(sc.local, sc.remote);
            let mut sorted = sc.local.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..8).collect::<Vec<_>>());
            let src: Vec<u8> = (0..32).collect();
            // Move each block as the engine would: source place to destination place.
            let (from, to) = if writes {
                (&sc.local, &sc.remote)
            } else {
                (&sc.remote, &sc.local)
            };
            let mut dst = vec![0u8; 32];
            for (&f, &t) in from.iter().zip(to) {
                let (f, t) = (f as usize * 4, t as usize * 4);
                dst[t..t + 4].copy_from_slice(&src[f..f + 4]);
            }
            let mut back = vec![0u8; 32];
            sc.gather(&dst, &mut back);
            assert_eq!(back, src);
        }
    }
}
