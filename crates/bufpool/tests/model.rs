//! Property tests: random alloc/free sequences, including double frees and foreign indices,
//! checked against a model of which slots are handed out. (Not under `--cfg loom`, where
//! proptest is not a dependency.)
#![cfg(not(loom))]

use std::collections::BTreeSet;

use bufpool::{IndexPool, LocalPool, ObjectPool, PoolError, Region, RegionPool, SharedPool};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Alloc,
    /// Free the n-th (modulo) slot handed out, if any.
    Free(usize),
    /// Free a slot that is not handed out (a double free when it was handed out before).
    FreeFree(u32),
    /// Free an index past the capacity.
    FreeForeign(u32),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        4 => Just(Op::Alloc),
        3 => any::<usize>().prop_map(Op::Free),
        1 => any::<u32>().prop_map(Op::FreeFree),
        1 => any::<u32>().prop_map(Op::FreeForeign),
    ];
    proptest::collection::vec(op, 0..400)
}

/// Drives `pool` through `ops`, asserting it agrees with the model after every step.
fn check<P: IndexPool>(pool: &P, requested: usize, ops: &[Op]) {
    let cap = pool.capacity();
    assert!(cap.is_power_of_two() && cap >= requested && cap / 2 < requested.max(1));
    let mut out: BTreeSet<u32> = BTreeSet::new();
    for op in ops {
        match *op {
            Op::Alloc => match pool.alloc() {
                Some(i) => {
                    assert!((i as usize) < cap, "slot {i} out of range");
                    assert!(out.insert(i), "slot {i} handed out twice");
                }
                None => assert_eq!(out.len(), cap, "None while slots were free"),
            },
            Op::Free(n) if !out.is_empty() => {
                let i = *out.iter().nth(n % out.len()).unwrap();
                pool.free(i).unwrap();
                out.remove(&i);
            }
            Op::Free(_) => {}
            Op::FreeFree(i) => {
                let i = i % cap as u32;
                if !out.contains(&i) {
                    assert_eq!(pool.free(i), Err(PoolError::DoubleFree { index: i }));
                }
            }
            Op::FreeForeign(i) => {
                let i = (i | cap as u32).max(cap as u32);
                assert_eq!(
                    pool.free(i),
                    Err(PoolError::Foreign {
                        index: i,
                        capacity: cap
                    })
                );
            }
        }
        assert_eq!(pool.len(), out.len());
        assert_eq!(pool.available(), cap - out.len());
        for &i in &out {
            assert!(pool.is_allocated(i));
        }
    }
    // Nothing lost: everything comes back, and then the pool is whole again.
    for i in std::mem::take(&mut out) {
        pool.free(i).unwrap();
    }
    assert_eq!(pool.available(), cap);
    let all: BTreeSet<u32> = std::iter::from_fn(|| pool.alloc()).collect();
    assert_eq!(all, (0..cap as u32).collect());
}

proptest! {
    #[test]
    fn local_pool_matches_model(cap in 1usize..70, ops in ops()) {
        check(&LocalPool::with_capacity(cap).unwrap(), cap, &ops);
    }

    #[test]
    fn shared_pool_matches_model(cap in 1usize..70, ops in ops()) {
        check(&SharedPool::with_capacity(cap).unwrap(), cap, &ops);
    }

    #[test]
    fn region_pool_matches_model(cap in 1usize..40, size in 1usize..100, ops in ops()) {
        let pool: RegionPool<(), SharedPool> =
            RegionPool::new(Region::for_slots(size, cap, 64).unwrap(), size, ()).unwrap();
        let mut out = BTreeSet::new();
        for op in &ops {
            match *op {
                Op::Alloc => if let Some(b) = pool.alloc() {
                    prop_assert_eq!(b.len, size);
                    prop_assert_eq!(pool.slot_of(b.addr), Ok(b.index));
                    prop_assert!(out.insert(b.addr));
                },
                Op::Free(n) if !out.is_empty() => {
                    let a = *out.iter().nth(n % out.len()).unwrap();
                    pool.free_addr(a).unwrap();
                    out.remove(&a);
                }
                Op::FreeFree(i) => {
                    let a = pool.region().addr() + (i as usize % pool.capacity()) * size;
                    if !out.contains(&a) {
                        assert!(matches!(pool.free_addr(a), Err(PoolError::DoubleFree { .. })));
                    }
                }
                Op::FreeForeign(i) if size > 1 => {
                    let a = pool.region().addr() + (i as usize % pool.region().len());
                    if !(a - pool.region().addr()).is_multiple_of(size) {
                        assert!(matches!(pool.free_addr(a), Err(PoolError::NotSlotStart { .. })));
                    }
                }
                _ => {}
            }
            prop_assert_eq!(pool.len(), out.len());
        }
    }

    #[test]
    fn object_pool_matches_model(cap in 1usize..50, ops in ops()) {
        let pool = ObjectPool::new(cap, |i, e: &mut usize| *e = i).unwrap();
        let mut out = BTreeSet::new();
        for op in &ops {
            match *op {
                Op::Alloc => if let Some(h) = pool.alloc() {
                    prop_assert_eq!(*pool.get(h).unwrap(), h.index() as usize);
                    prop_assert!(out.insert(h));
                },
                Op::Free(n) if !out.is_empty() => {
                    let h = *out.iter().nth(n % out.len()).unwrap();
                    pool.free(h).unwrap();
                    prop_assert!(pool.get(h).is_err());
                    prop_assert!(pool.handle_from_wr_id(h.to_wr_id()).is_err());
                    out.remove(&h);
                }
                _ => {}
            }
            for &h in &out {
                prop_assert_eq!(pool.handle_from_wr_id(h.to_wr_id()), Ok(h));
            }
        }
    }
}

#[test]
fn capacities_round_up_or_are_refused() {
    for (asked, got) in [(1, 1), (2, 2), (3, 4), (4096, 4096), (4097, 8192)] {
        assert_eq!(LocalPool::with_capacity(asked).unwrap().capacity(), got);
        assert_eq!(SharedPool::with_capacity(asked).unwrap().capacity(), got);
    }
    for bad in [0, bufpool::MAX_CAPACITY + 1, usize::MAX] {
        assert!(matches!(
            LocalPool::with_capacity(bad),
            Err(PoolError::Capacity { .. })
        ));
        assert!(SharedPool::with_capacity(bad).is_err());
        assert!(ObjectPool::new(bad, |_, _: &mut u8| {}).is_err());
    }
}
