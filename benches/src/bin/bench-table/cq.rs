//! Row 2: one shared CQ vs one CQ per QP, the cost of draining completions.
//!
//! N connected RC QP pairs in loopback (soft0 -> soft1) on softnic, built twice on one fabric:
//! set `shared` has every soft0 QP on one CQ, set `per-qp` gives each soft0 QP its own CQ.
//! A round posts one signaled 64-byte RDMA WRITE on every QP of a set, lets the fabric deliver
//! everything (`run_until_idle` on the virtual clock: the WRITEs, their ACKs, the send
//! completions), and then times only the drain: the shared CQ polled in batches (budget 64, as
//! the engine polls) until it gave N completions, or every one of the N CQs polled once
//! (budget 16). Rounds of the two sets alternate. The result is, per round, (drain time - the
//! cost of reading the clock twice) / N, averaged over the rounds without the slowest tenth.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use verbs_safe::sys::{ibv_send_flags, ibv_wr_opcode};
use verbs_safe::{
    AccessFlags, ConnInit, Context, Cq, DmaBuf, LocalPort, Pd, Poller, Qp, QpCaps, QpInit, Rc,
    RcRtr, RcRts, Remote, Rts, Verbs, WrSlot,
};

use super::{Out, Row};

/// One side of the loopback.
struct Side {
    ctx: Arc<Context>,
    pd: Arc<Pd>,
}

/// N QP pairs and the CQs of their soft0 ends.
struct QpSet {
    qps: Vec<Qp<Rc, Rts>>,
    _peers: Vec<Qp<Rc, Rts>>,
    cqs: Vec<Arc<Cq>>,
    slot: [WrSlot<1>; 1],
}

const FROM: LocalPort = LocalPort {
    port: 1,
    gid_index: 0,
};

fn remote(ctx: &Context, qpn: u32) -> Result<Remote, String> {
    Ok(Remote {
        qpn,
        psn: 0,
        lid: 0,
        gid: Some(ctx.query_gid(1, 0).map_err(|e| e.to_string())?),
    })
}

fn qp(pd: &Arc<Pd>, cq: &Arc<Cq>) -> Result<Qp<Rc, verbs_safe::Reset>, String> {
    Qp::new(
        pd,
        QpInit {
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            caps: QpCaps {
                max_send_wr: 4,
                max_recv_wr: 1,
                ..QpCaps::default()
            },
            sig_all: false,
        },
    )
    .map_err(|e| format!("creating a QP: {e}"))
}

/// Reset -> Init -> RTR -> RTS, connected to `peer`.
fn up(q: Qp<Rc, verbs_safe::Reset>, init: ConnInit, peer: Remote) -> Result<Qp<Rc, Rts>, String> {
    let bad = |e: &dyn std::fmt::Display| format!("connecting a QP: {e}");
    q.init(init)
        .map_err(|e| bad(&e))?
        .rtr(RcRtr::new(peer, FROM))
        .map_err(|e| bad(&e))?
        .rts(RcRts::new(0))
        .map_err(|e| bad(&e))
}

impl QpSet {
    /// `n` connected pairs; every soft0 QP on one CQ (`shared`) or on one CQ each.
    fn new(
        a: &Side,
        b: &Side,
        peer_cq: &Arc<Cq>,
        src: &Arc<DmaBuf>,
        dst: &DmaBuf,
        n: usize,
        shared: bool,
    ) -> Result<QpSet, String> {
        let e = |e: verbs_safe::Error| e.to_string();
        let mut cqs = Vec::new();
        if shared {
            cqs.push(Cq::new(&a.ctx, (2 * n).max(64) as u32, None).map_err(e)?);
        }
        let (mut qps, mut peers) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for _ in 0..n {
            if !shared {
                cqs.push(Cq::new(&a.ctx, 16, None).map_err(e)?);
            }
            let qa = qp(&a.pd, cqs.last().expect("a CQ"))?;
            let qb = qp(&b.pd, peer_cq)?;
            let (ra, rb) = (remote(&a.ctx, qa.qpn())?, remote(&b.ctx, qb.qpn())?);
            let qa = up(qa, ConnInit::default(), rb)?;
            let qb = up(qb, ConnInit::with_access(AccessFlags::REMOTE_WRITE), ra)?;
            qa.pin(src);
            qps.push(qa);
            peers.push(qb);
        }
        let mut s = WrSlot::<1>::default();
        s.wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
        s.wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        s.wr.wr.rdma.remote_addr = dst.addr();
        s.wr.wr.rdma.rkey = dst.rkey();
        s.sges[0] = src.sge(0, 64).ok_or("a 64-byte SGE")?;
        s.wr.num_sge = 1;
        Ok(QpSet {
            qps,
            _peers: peers,
            cqs,
            slot: [s],
        })
    }

    /// One signaled WRITE on every QP.
    fn post(&mut self) -> Result<(), String> {
        for (i, q) in self.qps.iter().enumerate() {
            self.slot[0].wr.wr_id = i as u64;
            q.post_slots(&mut self.slot, &[0])
                .map_err(|e| format!("posting: {e}"))?;
        }
        Ok(())
    }

    /// Drains every completion (one per QP); the time it took and how many there were.
    fn drain(&self, poller: &mut Poller, sink: &mut u64) -> Result<(Duration, usize), String> {
        let n = self.qps.len();
        let (mut got, mut bad) = (0usize, 0usize);
        let mut take = |c: verbs_safe::Completion<'_>| {
            got += 1;
            bad += usize::from(!c.is_ok());
            *sink = sink.wrapping_add(u64::from(c.qp_num()) ^ c.wr_id());
        };
        let t0 = Instant::now();
        if let [cq] = &self.cqs[..] {
            loop {
                let p = poller
                    .poll(cq, 64, &mut take)
                    .map_err(|e| format!("poll_cq: {e}"))?;
                if !p.more {
                    break;
                }
            }
        } else {
            for cq in &self.cqs {
                poller
                    .poll(cq, 16, &mut take)
                    .map_err(|e| format!("poll_cq: {e}"))?;
            }
        }
        let d = t0.elapsed();
        if got != n || bad != 0 {
            return Err(format!(
                "drained {got} completions ({bad} failed), {n} expected"
            ));
        }
        Ok((d, got))
    }
}

/// The median cost of two `Instant::now()` around nothing.
fn clock_overhead() -> Duration {
    let mut v: Vec<Duration> = (0..10_001)
        .map(|_| {
            let t = Instant::now();
            black_box(t).elapsed()
        })
        .collect();
    v.sort();
    v[v.len() / 2]
}

/// What one QP count measured: ns per completion, shared CQ and one CQ per QP.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PollCost {
    pub(crate) qps: usize,
    pub(crate) shared_ns: f64,
    pub(crate) per_qp_ns: f64,
    pub(crate) rounds: usize,
}

/// The share of rounds, slowest first, left out of the mean (preemptions, page faults).
pub(crate) const TRIM_PERCENT: usize = 10;

/// The mean of `v` without its slowest [`TRIM_PERCENT`] %. (Not the median: the clock ticks
/// in steps of tens of ns on this VM, and one completion takes about that long.)
fn trimmed_mean(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let keep = (v.len() * (100 - TRIM_PERCENT) / 100).max(1);
    v[..keep].iter().sum::<f64>() / keep as f64
}

/// Measures `n` QPs: both sets on one fabric, rounds alternating.
pub(crate) fn measure(n: usize, completions: usize) -> Result<PollCost, String> {
    let fabric = softnic::Fabric::new(softnic::FabricConfig {
        // Nothing may move the clock inside a timed drain.
        auto_advance: false,
        ..Default::default()
    });
    let verbs = Verbs::soft(&fabric);
    let open = |name: &str| -> Result<Side, String> {
        let ctx = Context::open_by_name(&verbs, name).map_err(|e| e.to_string())?;
        let pd = ctx.alloc_pd().map_err(|e| e.to_string())?;
        Ok(Side { ctx, pd })
    };
    let (a, b) = (open("soft0")?, open("soft1")?);
    let e = |e: verbs_safe::Error| e.to_string();
    let peer_cq = Cq::new(&b.ctx, 64, None).map_err(e)?;
    let src = Arc::new(
        a.pd.alloc_dma(64, 64, AccessFlags::LOCAL_WRITE)
            .map_err(e)?,
    );
    let dst =
        b.pd.alloc_dma(64, 64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .map_err(e)?;
    let mut sets = [
        QpSet::new(&a, &b, &peer_cq, &src, &dst, n, true)?,
        QpSet::new(&a, &b, &peer_cq, &src, &dst, n, false)?,
    ];
    let overhead = clock_overhead();
    let rounds = (completions / n).max(64);
    let mut per = [Vec::with_capacity(rounds), Vec::with_capacity(rounds)];
    let mut poller = Poller::new();
    let mut sink = 0u64;
    for r in 0..rounds + 2 {
        // Alternate which set goes first.
        for k in [r % 2, 1 - r % 2] {
            sets[k].post()?;
            fabric
                .run_until_idle()
                .map_err(|e| format!("fabric: {e}"))?;
            let (d, got) = sets[k].drain(&mut poller, &mut sink)?;
            // The first two rounds warm up (CQ arrays, caches).
            if r >= 2 {
                per[k].push(d.saturating_sub(overhead).as_nanos() as f64 / got as f64);
            }
        }
    }
    black_box(sink);
    let [mut s, mut p] = per;
    Ok(PollCost {
        qps: n,
        shared_ns: trimmed_mean(&mut s),
        per_qp_ns: trimmed_mean(&mut p),
        rounds,
    })
}

/// Row 2: one shared CQ vs a CQ per QP.
pub(super) fn rows(out: &mut Out) -> Result<(), String> {
    let mut rounds = Vec::new();
    for n in [1, 16, 256, 1024] {
        eprintln!("  {n} QPs");
        let c = measure(n, 65_536)?;
        out.rows.push(Row::new(
            "2",
            "poll ns per completion: a CQ per QP vs **one shared CQ**",
            format!(
                "{n} QP{}, one completion each",
                if n == 1 { "" } else { "s" }
            ),
            format!("{:.1}", c.per_qp_ns),
            format!("{:.1}", c.shared_ns),
            c.shared_ns / c.per_qp_ns,
            "",
        ));
        rounds.push(format!("{}: {}", c.qps, c.rounds));
    }
    out.notes.push(format!(
        "Row 2: N RC QP pairs soft0 -> soft1, one signaled 64-byte WRITE per QP per round, \
         `run_until_idle`, then only the drain is timed (shared: `Poller::poll` budget 64 until \
         empty; per QP: every CQ polled once, budget 16); per round (drain time - the cost of \
         reading the clock) / N, the slowest {}% of rounds dropped (preemptions), the rest \
         averaged (rounds per N: {}); the two sets live on one fabric, rounds alternate.",
        TRIM_PERCENT,
        rounds.join(", ")
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn both_cq_layouts_drain_every_completion() {
        let c = super::measure(8, 8 * 64).unwrap();
        assert_eq!((c.qps, c.rounds), (8, 64));
        for ns in [c.shared_ns, c.per_qp_ns] {
            assert!(ns.is_finite() && ns >= 0.0, "{c:?}");
        }
    }
}
