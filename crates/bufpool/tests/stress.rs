//! Multi-threaded stress of the lock-free pool: threads allocate, write a signature into the
//! slot they own, check it, and free; no slot is ever owned by two threads, none is lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bufpool::{IndexPool, SharedPool};

fn run(capacity: usize, threads: u64, rounds: u64, hold: usize) {
    let pool = Arc::new(SharedPool::with_capacity(capacity).unwrap());
    let owner: Arc<Vec<AtomicU64>> = Arc::new((0..capacity).map(|_| AtomicU64::new(0)).collect());
    let handles: Vec<_> = (1..=threads)
        .map(|me| {
            let (pool, owner) = (Arc::clone(&pool), Arc::clone(&owner));
            std::thread::spawn(move || {
                let mut held = Vec::with_capacity(hold);
                for r in 0..rounds {
                    while held.len() < hold {
                        match pool.alloc() {
                            Some(i) => {
                                let prev = owner[i as usize].swap(me, Ordering::Relaxed);
                                assert_eq!(prev, 0, "slot {i} owned by {prev} and {me}");
                                held.push(i);
                            }
                            None => break,
                        }
                    }
                    if let Some(i) =
                        (!held.is_empty()).then(|| held.swap_remove(r as usize % held.len()))
                    {
                        assert_eq!(owner[i as usize].swap(0, Ordering::Relaxed), me);
                        pool.free(i).unwrap();
                    }
                }
                for i in held {
                    assert_eq!(owner[i as usize].swap(0, Ordering::Relaxed), me);
                    pool.free(i).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(pool.available(), capacity);
    assert_eq!(std::iter::from_fn(|| pool.alloc()).count(), capacity);
}

#[test]
fn contended_small_pool() {
    // Fewer slots than threads want: `alloc` returns None often, cells wrap many laps.
    run(4, 4, 50_000, 2);
}

#[test]
fn many_slots_many_threads() {
    run(1024, 4, 20_000, 64);
}

#[test]
fn concurrent_double_free_is_caught_exactly_once() {
    // Two threads race to free the same slot: exactly one wins, the other gets DoubleFree.
    let pool = Arc::new(SharedPool::with_capacity(2).unwrap());
    for _ in 0..2_000 {
        let i = pool.alloc().unwrap();
        let racers: Vec<_> = (0..2)
            .map(|_| {
                let pool = Arc::clone(&pool);
                std::thread::spawn(move || pool.free(i).is_ok())
            })
            .collect();
        let wins = racers
            .into_iter()
            .map(|t| t.join().unwrap())
            .filter(|&ok| ok)
            .count();
        assert_eq!(wins, 1);
        assert_eq!(pool.available(), 2);
    }
}
