//! Atomics and spinning: `std` normally, `loom`'s models under `--cfg loom`.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};

/// Waits a moment for another thread to finish the step it is inside.
#[inline]
pub(crate) fn spin() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}

/// Exponential back-off after a lost CAS: 1, 2, 4, ... up to 64 spins.
#[derive(Default)]
pub(crate) struct Backoff(u32);

impl Backoff {
    #[inline]
    pub(crate) fn spin(&mut self) {
        for _ in 0..1u32 << self.0 {
            spin();
        }
        self.0 = (self.0 + 1).min(6);
    }
}
