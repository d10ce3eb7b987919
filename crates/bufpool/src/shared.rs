//! The lock-free multi-producer multi-consumer pool.
//!
//! A bounded ring in the style of Dmitry Vyukov's MPMC queue, specialised for slot indices: each
//! cell is one `AtomicU64` holding a 32-bit stamp and the 32-bit slot index, so a cell is read and
//! written in one atomic access and the ring needs no `unsafe`. Positions are `usize` counters
//! that only grow; a position's cell is `cells[pos & mask]`.
//!
//! Cell protocol, for position `p` (stamps compared modulo 2^32 by signed difference):
//! - stamp `p`: empty, ready for the push at `p`;
//! - stamp `p + 1`: full, ready for the pop at `p`, which leaves stamp `p + capacity`.
//!
//! A pop claims its position by a CAS on `head` (backing off exponentially when it loses), a
//! push by a `fetch_add` on `tail`; each then publishes the cell with a release store, and the
//! next user of that cell acquires it.
//!
//! A push never finds the pool full and never retries: a slot is pushed only after its
//! handed-out flag went from set to clear, so at most `capacity` slots are ever free, and the pop
//! of the previous lap at the claimed cell has always claimed its position already; if that pop
//! has not vacated the cell yet, the push waits for its store.
//!
//! A pop that finds its cell not yet full reports "empty" only if `tail` still equals its
//! position; the claims and that check are `SeqCst`, so the check cannot read a `tail` older than
//! the claims the pop already observed through `head`. (loom found that with acquire/release
//! alone a pop could report empty a pool that held a slot whose free had finished.) On x86 a
//! `SeqCst` RMW or load costs what a relaxed one does.
//!
//! Measured against the same double-free-checked pool built on crossbeam-queue's `ArrayQueue`
//! (benches/benches/pools.rs), this ring is as fast on one thread and faster under two-thread
//! contention, needs no `unsafe`, and is small enough to model-check with loom.

use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};

use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Backoff, spin};
use crate::{IndexPool, PoolError, capacity_for, check_index};

/// Slot indices shared between threads, lock-free, with double-free detection.
///
/// ```
/// use std::sync::Arc;
/// use bufpool::{IndexPool, SharedPool};
///
/// let pool = Arc::new(SharedPool::with_capacity(1024)?);
/// let p = Arc::clone(&pool);
/// let t = std::thread::spawn(move || {
///     for _ in 0..1000 {
///         let i = p.alloc().unwrap();
///         p.free(i).unwrap();
///     }
/// });
/// let mine = pool.alloc().unwrap();
/// t.join().unwrap();
/// assert_eq!(pool.len(), 1);
/// pool.free(mine)?;
/// # Ok::<(), bufpool::PoolError>(())
/// ```
#[derive(Debug)]
pub struct SharedPool {
    head: Padded<AtomicUsize>,
    tail: Padded<AtomicUsize>,
    cells: Box<[AtomicU64]>,
    allocated: Box<[AtomicBool]>,
}

/// Keeps `head` and `tail` on cache lines of their own (128 bytes: adjacent-line prefetch).
#[derive(Debug)]
#[repr(align(128))]
struct Padded<T>(T);

#[inline]
fn cell(stamp: usize, index: u32) -> u64 {
    (u64::from(stamp as u32) << 32) | u64::from(index)
}

#[inline]
fn stamp_minus(word: u64, pos: usize) -> i32 {
    ((word >> 32) as u32).wrapping_sub(pos as u32) as i32
}

impl SharedPool {
    /// Pushes a slot that was just taken back from its user. Never fails and never retries a
    /// claim: at most `capacity` slots are ever free, so the claimed cell's previous pop has
    /// already claimed it too, and at worst this waits for that pop's store.
    #[inline]
    fn push(&self, index: u32) {
        let mask = self.cells.len() - 1;
        let pos = self.tail.0.fetch_add(1, SeqCst);
        let c = &self.cells[pos & mask];
        while stamp_minus(c.load(Acquire), pos) != 0 {
            spin();
        }
        c.store(cell(pos.wrapping_add(1), index), Release);
    }

    #[inline]
    fn pop(&self) -> Option<u32> {
        let mask = self.cells.len() - 1;
        let cap = self.cells.len();
        let mut pos = self.head.0.load(SeqCst);
        let mut backoff = Backoff::default();
        loop {
            let c = &self.cells[pos & mask];
            let word = c.load(Acquire);
            let diff = stamp_minus(word, pos.wrapping_add(1));
            if diff == 0 {
                match self
                    .head
                    .0
                    .compare_exchange_weak(pos, pos.wrapping_add(1), SeqCst, SeqCst)
                {
                    Ok(_) => {
                        c.store(cell(pos.wrapping_add(cap), 0), Release);
                        return Some(word as u32);
                    }
                    Err(now) => {
                        // Lost the race for this position: back off before trying the next, so
                        // two threads do not keep stealing the line from each other.
                        backoff.spin();
                        pos = now;
                    }
                }
            } else if diff < 0 {
                if self.tail.0.load(SeqCst) == pos {
                    return None; // really empty
                }
                // A push claimed this position and has not published the cell yet.
                spin();
                pos = self.head.0.load(SeqCst);
            } else {
                pos = self.head.0.load(SeqCst);
            }
        }
    }
}

impl IndexPool for SharedPool {
    fn with_capacity(capacity: usize) -> Result<Self, PoolError> {
        let cap = capacity_for(capacity)?;
        // As if `cap` pushes of 0, 1, 2, ... happened at positions 0..cap.
        let cells = (0..cap).map(|p| AtomicU64::new(cell(p + 1, p as u32)));
        Ok(Self {
            head: Padded(AtomicUsize::new(0)),
            tail: Padded(AtomicUsize::new(cap)),
            cells: cells.collect(),
            allocated: (0..cap).map(|_| AtomicBool::new(false)).collect(),
        })
    }

    #[inline]
    fn alloc(&self) -> Option<u32> {
        let index = self.pop()?;
        // Only this thread knows `index` until it returns it; a free racing with this store is a
        // free of a slot nobody was given, and is reported as a double free.
        self.allocated[index as usize].store(true, Relaxed);
        Some(index)
    }

    #[inline]
    fn free(&self, index: u32) -> Result<(), PoolError> {
        let i = check_index(index, self.cells.len())?;
        self.allocated[i]
            .compare_exchange(true, false, AcqRel, Relaxed)
            .map_err(|_| PoolError::DoubleFree { index })?;
        self.push(index);
        Ok(())
    }

    #[inline]
    fn is_allocated(&self, index: u32) -> bool {
        check_index(index, self.cells.len()).is_ok_and(|i| self.allocated[i].load(Acquire))
    }

    fn capacity(&self) -> usize {
        self.cells.len()
    }

    fn available(&self) -> usize {
        let head = self.head.0.load(Acquire);
        let tail = self.tail.0.load(Acquire);
        tail.wrapping_sub(head).min(self.cells.len())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn fresh_pool_hands_out_every_slot_once() {
        let p = SharedPool::with_capacity(8).unwrap();
        let mut got: Vec<u32> = std::iter::from_fn(|| p.alloc()).collect();
        got.sort_unstable();
        assert_eq!(got, (0..8).collect::<Vec<_>>());
        assert_eq!(p.available(), 0);
        assert_eq!(p.alloc(), None);
    }

    #[test]
    fn positions_wrap_around_many_laps() {
        let p = SharedPool::with_capacity(2).unwrap();
        for round in 0..10_000u32 {
            let a = p.alloc().unwrap();
            let b = p.alloc().unwrap();
            assert_eq!(p.alloc(), None, "round {round}");
            p.free(b).unwrap();
            p.free(a).unwrap();
            assert_eq!(p.available(), 2);
        }
    }

    #[test]
    fn stamps_compare_across_the_u32_wrap() {
        assert_eq!(stamp_minus(cell(0, 0), usize::MAX), 1);
        assert_eq!(stamp_minus(cell(u32::MAX as usize, 0), 0), -1);
    }
}
