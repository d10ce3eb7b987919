//! bufpool: alloc+free pairs, single-threaded and with a second thread hammering the same pool,
//! for the local pool, the lock-free shared pool, the same double-free-checked pool built on
//! crossbeam-queue's `ArrayQueue`, and a bare `ArrayQueue` (no misuse checks), side by side.
//!
//! `cargo xtask bench -- pools`

use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use bufpool::{IndexPool, LocalPool, SharedPool};
use criterion::{Criterion, criterion_group, criterion_main};
use crossbeam_queue::ArrayQueue;

const CAP: usize = 4096;
/// Slots each side holds while it works, so alloc and free touch a moving window of cells.
const HELD: usize = 32;

/// The shared pool's contract (alloc, free with double-free detection) on top of `ArrayQueue`:
/// the alternative base the issue asks to measure against.
struct ArrayQueuePool {
    q: ArrayQueue<u32>,
    allocated: Box<[AtomicBool]>,
}

impl ArrayQueuePool {
    fn new(cap: usize) -> Self {
        let q = ArrayQueue::new(cap);
        for i in 0..cap as u32 {
            q.push(i).unwrap();
        }
        Self {
            q,
            allocated: (0..cap).map(|_| AtomicBool::new(false)).collect(),
        }
    }
    fn alloc(&self) -> Option<u32> {
        let i = self.q.pop()?;
        self.allocated[i as usize].store(true, Ordering::Relaxed);
        Some(i)
    }
    fn free(&self, i: u32) -> Result<(), ()> {
        let flag = self.allocated.get(i as usize).ok_or(())?;
        flag.compare_exchange(true, false, Ordering::AcqRel, Ordering::Relaxed)
            .map_err(|_| ())?;
        self.q.push(i).map_err(|_| ())
    }
}

/// A pool under test: take a slot, give one back.
trait Pool: Sync + Send + 'static {
    fn take(&self) -> Option<u32>;
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

fn bare_array_queue() -> ArrayQueue<u32> {
    let q = ArrayQueue::new(CAP);
    for i in 0..CAP as u32 {
        q.push(i).unwrap();
    }
    q
}

fn single<P: Pool>(c: &mut Criterion, name: &str, pool: P) {
    let mut held = VecDeque::with_capacity(HELD + 1);
    c.bench_function(&format!("pool/1thread/{name}"), |b| {
        b.iter(|| pool.pair(black_box(&mut held)))
    });
}

/// Two threads each run `iters` pairs on the same pool from a common start; the time is until
/// both are done, so it is the cost of a pair under contention (aggregate throughput x2).
fn contended<P: Pool>(c: &mut Criterion, name: &str, pool: P) {
    let pool = Arc::new(pool);
    c.bench_function(&format!("pool/2threads/{name}"), |b| {
        b.iter_custom(|iters| {
            let start = Arc::new(Barrier::new(3));
            let workers: Vec<_> = (0..2)
                .map(|_| {
                    let (pool, start) = (Arc::clone(&pool), Arc::clone(&start));
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
        })
    });
}

fn local(c: &mut Criterion) {
    let pool = LocalPool::with_capacity(CAP).unwrap();
    let mut held = VecDeque::with_capacity(HELD + 1);
    c.bench_function("pool/1thread/local", |b| {
        b.iter(|| {
            if let Some(i) = pool.alloc() {
                held.push_back(i);
            }
            if held.len() > HELD {
                pool.free(held.pop_front().unwrap()).unwrap();
            }
        })
    });
}

fn pools(c: &mut Criterion) {
    local(c);
    single(c, "shared", SharedPool::with_capacity(CAP).unwrap());
    single(c, "arrayqueue-checked", ArrayQueuePool::new(CAP));
    single(c, "arrayqueue-bare", bare_array_queue());
    contended(c, "shared", SharedPool::with_capacity(CAP).unwrap());
    contended(c, "arrayqueue-checked", ArrayQueuePool::new(CAP));
    contended(c, "arrayqueue-bare", bare_array_queue());
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = pools
}
criterion_main!(benches);
