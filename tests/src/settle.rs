//! After a workload: draining until every engine is quiet, closing every connection, and the
//! checks that each engine gave back every pool slot, credit and CQ reservation.

use std::time::Duration;

use uccl_engine::Usage;

use crate::Sim;
use crate::workload::Link;

/// Every engine's [`Usage`], one line each (for failure messages).
pub fn usage_table(sim: &Sim) -> String {
    sim.engines
        .iter()
        .enumerate()
        .map(|(i, e)| format!("  engine {i}: {:?}\n", e.usage()))
        .collect()
}

/// Whether `u` holds nothing a finished transfer should still hold: no WR, header slot,
/// unacknowledged chunk or control send.
pub fn quiet(u: &Usage) -> bool {
    u.wrs_in_use == 0 && u.hdrs_in_use == 0 && u.unacked == 0 && u.ctrl_sends_in_use == 0
}

/// Runs until every engine is [`quiet`] (all traffic drained), failing (with the seed and
/// every engine's usage) if that takes more than `limit` more virtual time.
pub fn drain(sim: &mut Sim, limit: Duration) -> Result<(), String> {
    let limit = sim.fabric.now() + limit;
    sim.run(limit, |s| s.engines.iter().all(|e| quiet(&e.usage())))
        .map_err(|e| format!("{e}: not drained\n{}", usage_table(sim)))
}

/// The property tests' workload: `ops` over `links`, `window` operations in flight per stream
/// and at most ten minutes of virtual time, every invariant checked
/// ([`workload::run`](crate::workload::run)); then drained (at most a minute more).
pub fn run_and_drain(
    sim: &mut Sim,
    links: &[Link],
    ops: &[crate::workload::Op],
    window: usize,
) -> Result<(), String> {
    let pacing = crate::workload::Pacing {
        window,
        limit: Duration::from_secs(600),
    };
    crate::workload::run(sim, links, ops, pacing)?;
    drain(sim, Duration::from_secs(60))
}

/// Whether engine `i` holds what it held before its first connection: no connection, nothing
/// draining, no CQ reservation beyond its own control QP's, no credit granted, no peer engine
/// held, and [`quiet`].
pub fn back_to_baseline(sim: &Sim, i: usize) -> bool {
    let (u, b) = (sim.engines[i].usage(), sim.baseline[i]);
    quiet(&u)
        && u.connections == 0
        && u.draining == 0
        && u.send_cq_reserved == b.send_cq_reserved
        && u.ctrl_cq_reserved == b.ctrl_cq_reserved
        && u.credits_granted == 0
        && u.peers == 0
}

/// Whether engine `i` holds the memory it held when it was built: no buffer, export or pin
/// beyond its own, nothing retiring.
pub fn memory_back_to_baseline(sim: &Sim, i: usize) -> bool {
    let (u, b) = (sim.engines[i].usage(), sim.baseline[i]);
    u.buffers == b.buffers && u.exports == b.exports && u.pinned == b.pinned && u.pins_retiring == 0
}

/// Closes every link (from `a`'s end for even indices, `b`'s for odd ones; from the other
/// end if that one is gone already, as after a failure the peer could not be told of), then
/// runs until every engine is [`back_to_baseline`], failing (with the seed and every engine's
/// usage) after `limit` more virtual time.
pub fn close_all(sim: &mut Sim, links: &[Link], limit: Duration) -> Result<(), String> {
    for (k, l) in links.iter().enumerate() {
        let ends = if k % 2 == 0 {
            [(l.a, l.ca), (l.b, l.cb)]
        } else {
            [(l.b, l.cb), (l.a, l.ca)]
        };
        if let Some(&(e, c)) = ends.iter().find(|&&(e, c)| sim.engines[e].is_open(c)) {
            sim.engines[e]
                .close(c)
                .map_err(|e| format!("seed {}: closing link {k}: {e}", sim.seed))?;
        }
    }
    let limit = sim.fabric.now() + limit;
    let n = sim.engines.len();
    sim.run(limit, |s| (0..n).all(|i| back_to_baseline(s, i)))
        .map_err(|e| {
            format!(
                "{e}: not back to the baseline after closing everything\n{}baseline: {:?}",
                usage_table(sim),
                sim.baseline
            )
        })
}
