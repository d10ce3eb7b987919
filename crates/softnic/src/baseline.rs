//! The software limit of a NIC that copies every byte: what a single-threaded `memcpy` moves,
//! measured in the same run as what it is compared with (softnic's goodput, in `uccl-perf` and
//! the benchmark table).

use std::time::Instant;

/// Gb/s of a single-threaded copy of `bytes` (at most 1 GiB) in `piece`-byte pieces, round a
/// `working`-byte set of buffers (small: the copy stays in cache; large: it streams memory).
/// The destination is touched first, so page faults are not timed.
pub fn memcpy_gbps(bytes: u64, piece: u64, working: u64) -> f64 {
    let bytes = bytes.min(1 << 30);
    let piece = piece.clamp(1, working.max(1)) as usize;
    let slots = (working as usize / piece).max(1);
    let src = vec![0x5au8; piece * slots];
    let mut dst = vec![0u8; piece * slots];
    dst.iter_mut().step_by(4096).for_each(|b| *b = 1);
    let n = bytes.div_ceil(piece as u64);
    let t = Instant::now();
    for i in 0..n {
        let k = (i as usize % slots) * piece;
        dst[k..k + piece].copy_from_slice(&src[k..k + piece]);
        std::hint::black_box(&mut dst);
    }
    let s = t.elapsed().as_secs_f64();
    if s == 0.0 {
        0.0
    } else {
        (n * piece as u64) as f64 * 8.0 / s / 1e9
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn copies_in_cache_and_round_a_large_set() {
        assert!(super::memcpy_gbps(1 << 20, 4096, 4096) > 0.0);
        assert!(super::memcpy_gbps(1 << 20, 4096, 1 << 20) > 0.0);
        assert!(
            super::memcpy_gbps(10, 0, 0) >= 0.0,
            "degenerate sizes do not panic"
        );
    }
}
