//! The pools the `pools` criterion bench and the `bench-table` side-by-side table compare:
//! bufpool's pools against crossbeam-queue's `ArrayQueue`, behind one alloc+free interface.

use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use bufpool::{IndexPool, LocalPool, SharedPool};
use crossbeam_queue::ArrayQueue;

/// Slots in every pool under test.
pub const CAP: usize = 4096;
/// Slots each side holds while it works, so alloc and free touch a moving window of cells.
pub const HELD: usize = 32;

/// The shared pool's contract (alloc, free with double-free detection) on top of `ArrayQueue`:
/// the alternative base the issue asks to measure against.
#[derive(Debug)]
pub struct ArrayQueuePool {
    q: ArrayQueue<u32>,
    allocated: Box<[AtomicBool]>,
}

impl ArrayQueuePool {
    /// A pool of `cap` slots, all free.
    pub fn new(cap: usize) -> Self {
        let q = ArrayQueue::new(cap);
        for i in 0..cap as u32 {
            q.push(i).unwrap();
        }
        Self {
            q,
            allocated: (0..cap).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// Takes a free slot, if any.
    pub fn alloc(&self) -> Option<u32> {
        let i = self.q.pop()?;
        self.allocated[i as usize].store(true, Ordering::Relaxed);
        Some(i)
    }

    /// Gives slot `i` back; an error for a slot that is not allocated (a double free) or not
    /// of this pool.
    #[allow(clippy::result_unit_err)]
    pub fn free(&self, i: u32) -> Result<(), ()> {
        let flag = self.allocated.get(i as usize).ok_or(())?;
        flag.compare_exchange(true, false, Ordering::AcqRel, Ordering::Relaxed)
            .map_err(|_| ())?;
        self.q.push(i).map_err(|_| ())
    }
}

/// A pool under test: take a slot, give one back.
pub trait Pool: Sync + Send + 'static {
    /// Takes a slot, if any is free.
    fn take(&self) -> Option<u32>;
    /// Gives slot `i` back (panics on misuse: the benchmarks never misuse).
    fn give(&self, i: u32);

    /// One alloc+free pair, keeping `HELD` slots in flight, returned FIFO.
    #[inline]
    fn pair(&self, held: &mut VecDeque<u32>) {
        if let Some(i) = self.take() {
            held.push_back(i);
        }
        if held.len() > HELD {
            self.give(held.pop_front().unwrap());
        }
    }
}

impl Pool for SharedPool {
    #[inline]
    fn take(&self) -> Option<u32> {
        self.alloc()
    }
    #[inline]
    fn give(&self, i: u32) {
        self.free(i).unwrap()
    }
}

impl Pool for ArrayQueuePool {
    #[inline]
    fn take(&self) -> Option<u32> {
        self.alloc()
    }
    #[inline]
    fn give(&self, i: u32) {
        self.free(i).unwrap()
    }
}

impl Pool for ArrayQueue<u32> {
    #[inline]
    fn take(&self) -> Option<u32> {
        self.pop()
    }
    #[inline]
    fn give(&self, i: u32) {
        self.push(i).unwrap()
    }
}

/// A bare `ArrayQueue` of `CAP` slot numbers, all free (no misuse checks).
pub fn bare_array_queue() -> ArrayQueue<u32> {
    let q = ArrayQueue::new(CAP);
    for i in 0..CAP as u32 {
        q.push(i).unwrap();
    }
    q
}

/// One alloc+free pair on the engine-local pool (not `Sync`, so not a [`Pool`]), keeping
/// `HELD` slots in flight.
#[inline]
pub fn local_pair(pool: &LocalPool, held: &mut VecDeque<u32>) {
    if let Some(i) = pool.alloc() {
        held.push_back(i);
    }
    if held.len() > HELD {
        pool.free(held.pop_front().unwrap()).unwrap();
    }
}

/// The time of `iters` pairs on one thread.
pub fn time_single<P: Pool>(pool: &P, iters: u64) -> Duration {
    let mut held = VecDeque::with_capacity(HELD + 1);
    let t0 = Instant::now();
    for _ in 0..iters {
        pool.pair(black_box(&mut held));
    }
    let d = t0.elapsed();
    for i in held {
        pool.give(i);
    }
    d
}

/// The time of `iters` pairs on the engine-local pool.
pub fn time_local(pool: &LocalPool, iters: u64) -> Duration {
    let mut held = VecDeque::with_capacity(HELD + 1);
    let t0 = Instant::now();
    for _ in 0..iters {
        local_pair(pool, black_box(&mut held));
    }
    let d = t0.elapsed();
    for i in held {
        pool.free(i).unwrap();
    }
    d
}

/// Two threads each run `iters` pairs on the same pool from a common start; the time is until
/// both are done, so it is the cost of a pair under contention (aggregate throughput x2).
pub fn time_contended<P: Pool>(pool: &Arc<P>, iters: u64) -> Duration {
    let start = Arc::new(Barrier::new(3));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (pool, start) = (Arc::clone(pool), Arc::clone(&start));
            std::thread::spawn(move || {
                let mut held = VecDeque::with_capacity(HELD + 1);
                start.wait();
                for _ in 0..iters {
                    pool.pair(black_box(&mut held));
                }
                held
            })
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    let held: Vec<VecDeque<u32>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let elapsed = t0.elapsed();
    for i in held.into_iter().flatten() {
        pool.give(i);
    }
    elapsed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arrayqueue_pool_keeps_the_shared_pools_contract() {
        let p = ArrayQueuePool::new(4);
        let a = p.alloc().unwrap();
        assert_eq!(p.free(a), Ok(()));
        assert_eq!(p.free(a), Err(()), "a double free is refused");
        assert_eq!(p.free(99), Err(()), "a foreign slot is refused");
        let all: Vec<u32> = (0..4).map(|_| p.alloc().unwrap()).collect();
        assert_eq!(p.alloc(), None);
        for i in all {
            p.free(i).unwrap();
        }
    }

    #[test]
    fn timed_loops_give_every_slot_back() {
        let shared = SharedPool::with_capacity(CAP).unwrap();
        time_single(&shared, 1000);
        let local = LocalPool::with_capacity(CAP).unwrap();
        time_local(&local, 1000);
        let q = Arc::new(ArrayQueuePool::new(CAP));
        time_contended(&q, 1000);
        for n in [shared.available(), local.available(), q.q.len()] {
            assert_eq!(n, CAP);
        }
    }
}
