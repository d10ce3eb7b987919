//! Loom models of the lock-free pool's alloc (pop) and free (push).
//!
//! Run by `cargo xtask test` as
//! `RUSTFLAGS="--cfg loom" cargo test -p bufpool --test loom --profile loom`, exhaustively (no
//! preemption bound), in a target directory of its own.
#![cfg(loom)]

use bufpool::{IndexPool, PoolError, SharedPool};
use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::thread;

/// Two threads each alloc and free on a pool of `cap`: a slot is never held by both, a thread
/// gets `None` only when the other holds everything, and all slots come back.
fn alloc_free_race(cap: usize) {
    loom::model(move || {
        let pool = Arc::new(SharedPool::with_capacity(cap).unwrap());
        let held: Arc<Vec<AtomicBool>> =
            Arc::new((0..cap).map(|_| AtomicBool::new(false)).collect());
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let (pool, held) = (Arc::clone(&pool), Arc::clone(&held));
                thread::spawn(move || {
                    if let Some(i) = pool.alloc() {
                        assert!(
                            !held[i as usize].swap(true, Ordering::Relaxed),
                            "slot {i} held twice"
                        );
                        held[i as usize].store(false, Ordering::Relaxed);
                        pool.free(i).unwrap();
                        true
                    } else {
                        false
                    }
                })
            })
            .collect();
        let got = workers
            .into_iter()
            .map(|w| w.join().unwrap())
            .filter(|&g| g)
            .count();
        if cap >= 2 {
            assert_eq!(
                got, 2,
                "a pool with a free slot for each thread returned None"
            );
        } else {
            assert!(got >= 1);
        }
        assert_eq!(pool.available(), cap);
        let mut all: Vec<u32> = std::iter::from_fn(|| pool.alloc()).collect();
        all.sort_unstable();
        assert_eq!(all, (0..cap as u32).collect::<Vec<_>>());
    });
}

#[test]
fn alloc_free_race_one_slot() {
    alloc_free_race(1);
}

#[test]
fn alloc_free_race_two_slots() {
    alloc_free_race(2);
}

#[test]
fn free_waits_for_a_pop_that_has_not_vacated_its_cell() {
    // cap 1: one thread frees the slot while the other allocates it again and frees it, so
    // pushes land on a cell whose previous pop may still be in flight.
    loom::model(|| {
        let pool = Arc::new(SharedPool::with_capacity(1).unwrap());
        let i = pool.alloc().unwrap();
        let p2 = Arc::clone(&pool);
        let t = thread::spawn(move || {
            if let Some(j) = p2.alloc() {
                p2.free(j).unwrap();
            }
        });
        pool.free(i).unwrap();
        t.join().unwrap();
        assert_eq!(pool.available(), 1);
    });
}

#[test]
fn alloc_after_own_free_never_sees_an_empty_pool() {
    // Both slots handed out; each thread frees one and allocates again. When a thread allocates,
    // its own free is complete, so the pool holds at least one slot: `None` would be a pop that
    // mistook the other thread's half-done push (tail claimed, cell not yet published) for empty.
    loom::model(|| {
        let pool = Arc::new(SharedPool::with_capacity(2).unwrap());
        let (a, b) = (pool.alloc().unwrap(), pool.alloc().unwrap());
        let p2 = Arc::clone(&pool);
        let t = thread::spawn(move || {
            p2.free(b).unwrap();
            p2.alloc().expect("T2 found the pool empty")
        });
        pool.free(a).unwrap();
        let mine = pool.alloc().expect("T1 found the pool empty");
        let theirs = t.join().unwrap();
        assert_ne!(mine, theirs);
        assert_eq!(pool.available(), 0);
    });
}

#[test]
fn racing_double_free_is_caught_exactly_once() {
    loom::model(|| {
        let pool = Arc::new(SharedPool::with_capacity(2).unwrap());
        let i = pool.alloc().unwrap();
        let p2 = Arc::clone(&pool);
        let t = thread::spawn(move || p2.free(i));
        let mine = pool.free(i);
        let theirs = t.join().unwrap();
        assert!(
            matches!(
                (mine, theirs),
                (Ok(()), Err(PoolError::DoubleFree { .. }))
                    | (Err(PoolError::DoubleFree { .. }), Ok(()))
            ),
            "{mine:?} {theirs:?}"
        );
        assert_eq!(pool.available(), 2);
    });
}
