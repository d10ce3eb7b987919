//! Row 4: bufpool's pools against crossbeam's `ArrayQueue` (alloc+free pairs, one thread and
//! two).

use std::sync::Arc;
use std::time::Duration;

use bufpool::{IndexPool, LocalPool, SharedPool};
use uccl_benches::pools::{self, ArrayQueuePool, CAP};

use super::{Out, Row, perf};

/// Row 4: alloc+free pairs, each pool timed in turn, rounds alternating; medians.
pub(super) fn rows(out: &mut Out) -> Result<(), String> {
    const ITERS: u64 = 2_000_000;
    const ITERS_2T: u64 = 500_000;
    const REPS: usize = 5;
    let e = |e: bufpool::PoolError| e.to_string();
    let local = LocalPool::with_capacity(CAP).map_err(e)?;
    let shared = SharedPool::with_capacity(CAP).map_err(e)?;
    let checked = ArrayQueuePool::new(CAP);
    let bare = pools::bare_array_queue();
    let shared2 = Arc::new(SharedPool::with_capacity(CAP).map_err(e)?);
    let checked2 = Arc::new(ArrayQueuePool::new(CAP));
    let bare2 = Arc::new(pools::bare_array_queue());
    let ns = |d: Duration, iters: u64| d.as_nanos() as f64 / iters as f64;
    let mut t: [Vec<f64>; 7] = Default::default();
    for _ in 0..REPS {
        t[0].push(ns(pools::time_local(&local, ITERS), ITERS));
        t[1].push(ns(pools::time_single(&shared, ITERS), ITERS));
        t[2].push(ns(pools::time_single(&checked, ITERS), ITERS));
        t[3].push(ns(pools::time_single(&bare, ITERS), ITERS));
        t[4].push(ns(pools::time_contended(&shared2, ITERS_2T), ITERS_2T));
        t[5].push(ns(pools::time_contended(&checked2, ITERS_2T), ITERS_2T));
        t[6].push(ns(pools::time_contended(&bare2, ITERS_2T), ITERS_2T));
    }
    let m: Vec<f64> = t.iter().map(|v| perf::median(v)).collect();
    // Under contention the rounds spread widely on this VM: show the range.
    let range = |v: &[f64]| {
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, 0.0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        format!("{lo:.0}-{hi:.0}")
    };
    let row = |case: String, base: &str, b: f64, ours: &str, o: f64| {
        Row::new(
            "4",
            format!("alloc+free ns: {base} vs **{ours}**"),
            case,
            format!("{b:.1}"),
            format!("{o:.1}"),
            o / b,
            "",
        )
    };
    let checked = "ArrayQueue + double-free check";
    let two = |base: usize| {
        format!(
            "2 threads, one pool (rounds ranged {} vs {})",
            range(&t[base]),
            range(&t[4])
        )
    };
    out.rows.extend([
        row("1 thread".into(), checked, m[2], "bufpool SharedPool", m[1]),
        row(
            "1 thread".into(),
            "bare ArrayQueue",
            m[3],
            "bufpool SharedPool",
            m[1],
        ),
        row("1 thread".into(), checked, m[2], "bufpool LocalPool", m[0]),
        row(two(5), checked, m[5], "bufpool SharedPool", m[4]),
        row(two(6), "bare ArrayQueue", m[6], "bufpool SharedPool", m[4]),
    ]);
    out.notes.push(format!(
        "Row 4: the pools of the `pools` criterion bench (`uccl_benches::pools`), {CAP} slots, \
         {} held in flight (freed FIFO); one pair = one alloc + one free; 1 thread: {ITERS} \
         pairs per timing, 2 threads: {ITERS_2T} pairs on each thread, time until both are done \
         / pairs per thread; median of {REPS} rounds, the pools alternating.",
        pools::HELD
    ));
    Ok(())
}
