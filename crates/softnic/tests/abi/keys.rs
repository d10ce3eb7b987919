//! Memory keys cannot be guessed: one key says nothing of the next (a keyed permutation per
//! device), yet a fabric on the virtual clock replays its keys from its seed.

use std::collections::HashSet;

use softnic::Clock;

use crate::common::*;

/// The lkeys of `n` MRs registered one after another on `soft0` of `fabric`.
fn keys_of(fabric: &Fabric, n: usize) -> Vec<u32> {
    let a = Node::open(fabric, "soft0");
    let mut buf = vec![0u8; 64];
    (0..n)
        .map(|_| {
            let mr = a.reg(&mut buf, ALL_ACCESS);
            // SAFETY: a live MR's `ibv_mr` is readable.
            let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
            assert_eq!(lkey, rkey);
            lkey
        })
        .collect()
}

fn fabric(seed: u64, clock: Clock) -> Fabric {
    Fabric::new(FabricConfig {
        seed,
        clock,
        ..Default::default()
    })
}

#[test]
fn a_key_tells_nothing_of_its_neighbours() {
    let keys = keys_of(&fabric(7, Clock::Virtual), 1000);
    assert!(
        keys.iter().all(|&k| k != 0 && k >> 8 != 0),
        "a zero key or index"
    );
    let indices: HashSet<u32> = keys.iter().map(|k| k >> 8).collect();
    assert_eq!(indices.len(), keys.len(), "an index handed out twice");
    let pairs = || keys.windows(2).map(|w| (w[0], w[1]));
    // No consecutive indices (a counter), in either direction.
    let adjacent = pairs()
        .filter(|&(a, b)| (a >> 8).abs_diff(b >> 8) <= 1)
        .count();
    assert_eq!(adjacent, 0, "consecutive keys with neighbouring indices");
    // No constant step between keys, nor in their indices or tags, nor a constant XOR.
    let distinct =
        |f: &dyn Fn(u32, u32) -> u32| pairs().map(|(a, b)| f(a, b)).collect::<HashSet<_>>().len();
    assert!(
        distinct(&|a, b| b.wrapping_sub(a)) > 990,
        "key steps repeat"
    );
    assert!(
        distinct(&|a, b| (b >> 8).wrapping_sub(a >> 8)) > 990,
        "index steps repeat"
    );
    assert!(distinct(&|a, b| a ^ b) > 990, "key differences repeat");
    assert!(
        distinct(&|a, b| (b & 0xff).wrapping_sub(a & 0xff) & 0xff) > 200,
        "tags step"
    );
    // Not sorted either way: about as many rises as falls.
    let rises = pairs().filter(|&(a, b)| b > a).count();
    assert!((350..650).contains(&rises), "{rises} rises of 999");
    // The indices spread over the whole 24-bit space.
    let high = keys.iter().filter(|&&k| k >> 31 == 1).count();
    assert!(
        (350..650).contains(&high),
        "{high} of 1000 in the upper half"
    );
}

#[test]
fn keys_replay_with_the_seed_on_the_virtual_clock() {
    let a = keys_of(&fabric(1, Clock::Virtual), 100);
    assert_eq!(
        a,
        keys_of(&fabric(1, Clock::Virtual), 100),
        "same seed, same keys"
    );
    let b = keys_of(&fabric(2, Clock::Virtual), 100);
    assert_ne!(a, b, "different seeds, different keys");
    let shared: HashSet<_> = a.iter().filter(|k| b.contains(k)).collect();
    assert!(
        shared.len() < 3,
        "seeds 1 and 2 share {} keys",
        shared.len()
    );
    // Two devices of one fabric draw from different secrets.
    let f = fabric(1, Clock::Virtual);
    let b0 = keys_of(&f, 20);
    let dev1 = Node::open(&f, "soft1");
    let mut buf = vec![0u8; 8];
    let k1: Vec<u32> = (0..20).map(|_| rkey(dev1.reg(&mut buf, 0))).collect();
    assert_ne!(b0, k1);
}

#[test]
fn keys_are_random_on_the_wall_clock() {
    let a = keys_of(&fabric(1, Clock::Wall), 50);
    let b = keys_of(&fabric(1, Clock::Wall), 50);
    assert_ne!(a, b, "the same seed on the wall clock gave the same keys");
}
