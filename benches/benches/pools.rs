//! bufpool: alloc+free pairs, single-threaded and with a second thread hammering the same pool,
//! for the local pool, the lock-free shared pool, the same double-free-checked pool built on
//! crossbeam-queue's `ArrayQueue`, and a bare `ArrayQueue` (no misuse checks), side by side.
//! (The pools and the pair are in `uccl_benches::pools`, shared with `bench-table`.)
//!
//! `cargo xtask bench -- pools`

use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use bufpool::{IndexPool, LocalPool, SharedPool};
use criterion::{Criterion, criterion_group, criterion_main};
use uccl_benches::pools::{
    ArrayQueuePool, CAP, HELD, Pool, bare_array_queue, local_pair, time_contended,
};

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
        b.iter_custom(|iters| time_contended(&pool, iters))
    });
}

fn local(c: &mut Criterion) {
    let pool = LocalPool::with_capacity(CAP).unwrap();
    let mut held = VecDeque::with_capacity(HELD + 1);
    c.bench_function("pool/1thread/local", |b| {
        b.iter(|| local_pair(&pool, black_box(&mut held)))
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
