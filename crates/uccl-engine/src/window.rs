//! Receive windows ([`RecvKeys::Window`](crate::RecvKeys::Window)): a receive buffer is
//! advertised with the key of a memory window bound over exactly its range, so the peer
//! reaches that range only, and only while the receive is posted.
//!
//! - Each connection has a window per request id (allocated at the id's first receive, never
//!   shared with another connection, so a key a peer saw tells it nothing of another peer's).
//! - Binds and unbinds go on a QP of their own, which carries nothing else (so they complete
//!   at once, whatever the connections' queues hold): the window QP, a UC QP connected to
//!   itself at a random PSN. UC, so that no packet can move it to ERROR: a UC responder drops
//!   what it refuses, where an RC one (rxe, softnic) fails the QP for every connection.
//! - A receive's advertisement leaves once its window's bind completed: the key works by the
//!   time the peer reads it. Binds complete in the order they were posted, so advertisements
//!   keep the order of the receives.
//! - A receive has at most one window operation in flight. One that ends (its message
//!   arrived, it was refused or withdrawn) posts an unbind, once its bind completed, and is
//!   reported only once the unbind completed: by then the peer can no longer write the buffer.
//! - A connection that fails deallocates its idle windows at once (their keys die with them),
//!   the others as their operation completes, and reports each receive then.
//! - A window operation that fails leaves the QP in ERROR (the ones after it are flushed):
//!   each window it concerned is deallocated (so its key is dead whatever the NIC did), an
//!   ended receive reported, a receive still to be advertised bound again, once every
//!   operation in flight has completed and the QP is back up (RESET to RTS, a new PSN). Other
//!   connections see a late advertisement, nothing else.
//!
//! Type 1 windows, not type 2: a type-2 window works only through the QP that bound it, and a
//! connection's chunks arrive on all its data QPs.

use std::collections::VecDeque;
use std::sync::Arc;

use verbs_safe::{
    AccessFlags, ConnInit, Cq, DeviceLimits, LocalPort, Pd, Qp, QpCaps, QpInit, Remote, Rts, SqPsn,
    Uc, UcRtr,
};

use crate::config::EngineConfig;
use crate::conn::Win;
use crate::engine::Engine;
use crate::error::{EngineError, Result};
use crate::proto::Ctl;
use crate::request::Done;
use crate::round::Cqe;
use crate::wrid;

/// Window operations the window QP may have outstanding: one per receive every connection may
/// have posted (a receive's bind completes before its unbind is posted), at most what the
/// device allows (more binds than that wait their turn).
pub(crate) fn depth(cfg: &EngineConfig, limits: &DeviceLimits) -> u32 {
    let want = u64::from(cfg.max_conns) * u64::from(cfg.max_recvs);
    want.min(u64::from(limits.max_qp_wr)) as u32
}

/// The QP receive windows are bound and unbound on.
pub(crate) struct WindowQp {
    /// `None` once it could not be brought back after a failure.
    qp: Option<Qp<Uc, Rts>>,
    /// Itself, as its own peer (the PSN changes when it is brought back).
    me: Remote,
    from: LocalPort,
    port: u8,
    depth: u32,
    /// Binds and unbinds posted and not completed.
    ops: u32,
    /// An operation failed: the QP is in ERROR until every operation in flight completed and
    /// it is brought back.
    broken: bool,
    /// Receives to bind once it is back: connection, request id, receive sequence number.
    rebind: VecDeque<(u16, usize, u32)>,
    /// Receives to bind once it has room (more were posted at once than it takes), in the
    /// order they were posted (their windows are advertised in that order): as `rebind`.
    queued: VecDeque<(u16, usize, u32)>,
    /// Why it could not be brought back.
    dead: Option<EngineError>,
}

impl WindowQp {
    /// A UC QP connected to itself at PSN `psn` (it never sends a packet: binds are local),
    /// with room for `depth` window operations, completing into `cq`.
    pub(crate) fn new(
        pd: &Arc<Pd>,
        cq: &Arc<Cq>,
        cfg: &EngineConfig,
        (from, psn): (LocalPort, u32),
        depth: u32,
    ) -> Result<WindowQp> {
        let up = EngineError::verbs("bringing up the memory-window QP");
        let init = QpInit {
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            caps: QpCaps {
                max_send_wr: depth,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sig_all: true,
        };
        let qp = Qp::<Uc, _>::new(pd, init).map_err(up)?;
        let ctx = pd.context();
        let gid = ctx.query_gid(cfg.port, from.gid_index.into()).map_err(up)?;
        let lid = ctx.query_port(cfg.port).map_err(up)?.lid;
        let me = Remote {
            qpn: qp.qpn(),
            psn,
            lid,
            gid: Some(gid),
        };
        let mut w = WindowQp {
            qp: None,
            me,
            from,
            port: cfg.port,
            depth,
            ops: 0,
            broken: false,
            rebind: VecDeque::new(),
            queued: VecDeque::new(),
            dead: None,
        };
        w.qp = Some(w.up(qp)?);
        Ok(w)
    }

    /// RESET -> RTS, connected to itself.
    fn up(&self, qp: Qp<Uc, verbs_safe::Reset>) -> Result<Qp<Uc, Rts>> {
        let up = EngineError::verbs("bringing up the memory-window QP");
        qp.init(ConnInit {
            port: self.port,
            ..ConnInit::default()
        })
        .map_err(|e| up(e.error))?
        // It carries binds only, no data: the smallest MTU, which every port takes.
        .rtr(UcRtr {
            path_mtu: verbs_safe::Mtu::Mtu256,
            ..UcRtr::new(self.me, self.from)
        })
        .map_err(|e| up(e.error))?
        .rts(SqPsn(self.me.psn))
        .map_err(|e| up(e.error))
    }

    /// Whether a bind may be posted: room is kept for the unbinds of receives that end, so
    /// that they keep their windows (a refused unbind deallocates the window instead, which
    /// costs a new one at the slot's next receive).
    fn has_room(&self) -> bool {
        self.ops + self.depth / 8 < self.depth
    }

    /// Brings the QP back after a failure, at PSN `psn`.
    fn recover(&mut self, psn: u32) -> Result<()> {
        let qp = self.qp.take().expect("a QP to bring back");
        let reset = qp
            .reset()
            .map_err(|e| EngineError::verbs("resetting the memory-window QP")(e.error))?;
        self.me.psn = psn;
        self.qp = Some(self.up(reset)?);
        Ok(())
    }
}

impl Engine {
    /// Binds the window of receive `slot` of connection `ci` over the receive's range, and
    /// records the key it is to be advertised with; the advertisement leaves once the bind
    /// completed. While the window QP is being brought back, or has no room (more receives
    /// were posted at once than the device lets it take), the bind waits its turn.
    pub(crate) fn bind_window(&mut self, ci: u16, slot: usize) -> Result<()> {
        let seq = self.conns[usize::from(ci)]
            .as_ref()
            .and_then(|c| c.recvs[slot].as_ref())
            .expect("a posted receive")
            .seq;
        let w = self.io.windows.as_mut().expect("receive windows");
        if w.dead.is_none() && (w.broken || !w.has_room() || !w.queued.is_empty()) {
            // Bound in turn as operations in flight complete, or once the QP is back, after
            // the binds that failed (`bind_queued`).
            w.queued.push_back((ci, slot, seq));
            return Ok(());
        }
        self.post_bind(ci, slot)
    }

    /// Posts the bind of receive `slot`'s window (there is room on the window QP), unless the
    /// QP could not be brought back.
    fn post_bind(&mut self, ci: u16, slot: usize) -> Result<()> {
        let w = self.io.windows.as_mut().expect("receive windows");
        if let Some(e) = &w.dead {
            return Err(e.clone());
        }
        let c = self.conns[usize::from(ci)]
            .as_mut()
            .expect("an open connection");
        let r = c.recvs[slot].as_mut().expect("a posted receive");
        let mw = match &mut c.windows[slot] {
            Some(mw) => mw,
            none @ None => none.insert(
                self.io
                    .pd
                    .alloc_mw()
                    .map_err(EngineError::verbs("allocating a receive's memory window"))?,
            ),
        };
        let mem = &r.use_.mem;
        let target = Some((mem, (r.addr - mem.addr()) as usize, r.len as usize));
        let qp = w.qp.as_ref().expect("a live window QP");
        r.rkey = qp
            .bind_mw(
                mw,
                wrid::mw_bind(ci, slot as u32),
                target,
                AccessFlags::REMOTE_WRITE,
            )
            .map_err(EngineError::verbs("binding a receive's memory window"))?;
        r.window = Win::Binding;
        w.ops += 1;
        c.window_ops += 1;
        Ok(())
    }

    /// Ends receive `slot` of connection `ci` with `result`: reported at once with buffer
    /// keys, and with windows once its window is unbound (or was never bound).
    pub(crate) fn end_recv(&mut self, ci: u16, slot: usize, result: Result<Done>) {
        let Some(c) = self.conns[usize::from(ci)].as_mut() else {
            return;
        };
        let open = c.is_open();
        let Some(r) = c.recvs[slot].as_mut().filter(|r| r.ending.is_none()) else {
            return;
        };
        if !r.advertised && open {
            // It took a sequence number the peer never heard of (its window was still being
            // bound): the peer is told to skip it, or its sends would wait for it for ever.
            let seq = r.seq;
            c.ctl.backlog.push_back(Ctl::Withdraw { seq }.to_bytes());
            self.mark_ctl(ci);
        }
        let c = self.conns[usize::from(ci)].as_mut().expect("checked");
        let r = c.recvs[slot].as_mut().expect("checked");
        r.ending = Some(result);
        match r.window {
            // Unbound once its bind completes.
            Win::Binding | Win::Unbinding => {}
            Win::Bound => self.unbind_window(ci, slot),
            Win::Idle => self.report_recv(ci, slot),
        }
    }

    /// Posts the unbind of receive `slot`'s window (bound, no operation in flight: there is
    /// room, the receive's own); if it cannot be posted, the window is deallocated instead.
    fn unbind_window(&mut self, ci: u16, slot: usize) {
        let w = self.io.windows.as_mut().expect("receive windows");
        let c = self.conns[usize::from(ci)].as_mut().expect("checked");
        let r = c.recvs[slot].as_mut().expect("checked");
        let posted = match (&w.qp, &c.windows[slot], w.broken) {
            (Some(qp), Some(mw), false) => qp
                .bind_mw(
                    mw,
                    wrid::mw_unbind(ci, slot as u32),
                    None,
                    AccessFlags::empty(),
                )
                .is_ok(),
            _ => false,
        };
        if posted {
            r.window = Win::Unbinding;
            w.ops += 1;
            c.window_ops += 1;
        } else {
            // Its key dies with it.
            c.windows[slot] = None;
            r.window = Win::Idle;
            self.report_recv(ci, slot);
        }
    }

    /// Reports receive `slot` of connection `ci`, which ended and whose window no longer
    /// reaches it.
    fn report_recv(&mut self, ci: u16, slot: usize) {
        let Some(c) = self.conns[usize::from(ci)].as_mut() else {
            return;
        };
        if let Some(r) = c.recvs[slot].take() {
            c.recvs_posted -= 1;
            debug_assert!(r.ending.is_some(), "a receive reported that had not ended");
            r.req
                .complete(r.ending.unwrap_or(Err(EngineError::Stopped)));
        }
    }

    /// A bind (or, `unbind`, an unbind) of window `slot` of connection `ci` completed: a bound
    /// receive is advertised (or unbound, if it ended meanwhile), an unbound one reported.
    pub(crate) fn on_window(&mut self, ci: u16, slot: u32, unbind: bool, e: Cqe) {
        let slot = slot as usize;
        let Some(w) = self.io.windows.as_mut() else {
            return;
        };
        w.ops = w.ops.saturating_sub(1);
        if !e.ok {
            w.broken = true;
        }
        let broken = w.broken;
        let op_of = |c: &crate::conn::Conn| {
            c.recvs
                .get(slot)
                .and_then(Option::as_ref)
                .is_some_and(|r| matches!(r.window, Win::Binding | Win::Unbinding))
        };
        if let Some(c) = self.conns.get_mut(usize::from(ci)).and_then(Option::as_mut)
            && op_of(c)
        {
            c.window_ops = c.window_ops.saturating_sub(1);
            let open = c.is_open();
            let r = c.recvs[slot].as_mut().expect("checked");
            if !e.ok {
                // Whatever the NIC did, the key dies with the window.
                c.windows[slot] = None;
                r.window = Win::Idle;
                let status = e
                    .status
                    .map_or("an unknown status".into(), |s| format!("{s:?}"));
                let what = if unbind { "an unbind" } else { "a bind" };
                tracing::warn!(
                    conn = ci,
                    slot,
                    "{what} of a receive window failed: {status}"
                );
                if !unbind && open && r.ending.is_none() {
                    let seq = r.seq;
                    let w = self.io.windows.as_mut().expect("checked");
                    w.rebind.push_back((ci, slot, seq));
                } else {
                    self.report_recv(ci, slot);
                }
            } else if unbind {
                r.window = Win::Idle;
                self.report_recv(ci, slot);
            } else {
                r.window = Win::Bound;
                if !open {
                    c.windows[slot] = None;
                    r.window = Win::Idle;
                    self.report_recv(ci, slot);
                } else if r.ending.is_some() || broken {
                    // Ended while it was being bound (or the QP failed since: deallocated).
                    self.unbind_window(ci, slot);
                } else {
                    r.advertised = true;
                    let advert = r.advert();
                    self.advertise(ci, advert);
                }
            }
        }
        let w = self.io.windows.as_ref().expect("checked");
        if w.broken && w.ops == 0 {
            self.recover_windows();
        }
        self.bind_queued();
    }

    /// Binds the receives that wait for room on the window QP, in order, while it has room.
    fn bind_queued(&mut self) {
        loop {
            let Some(w) = self.io.windows.as_mut() else {
                return;
            };
            if w.broken || w.dead.is_some() || !w.has_room() {
                return;
            }
            let Some((ci, slot, seq)) = w.queued.pop_front() else {
                return;
            };
            self.bind_waiting(ci, slot, seq);
        }
    }

    /// Binds receive `slot` of connection `ci` (sequence `seq`), which waited for the window
    /// QP, if it still waits; one that ended meanwhile is reported, and if the bind cannot be
    /// posted its connection fails.
    fn bind_waiting(&mut self, ci: u16, slot: usize, seq: u32) {
        // Only the receive that waited, and only while it waits (no bind of it in flight): the
        // slot may hold a later receive since, or the connection may be another one.
        let Some(c) = self.conns[usize::from(ci)].as_mut() else {
            return;
        };
        let Some(r) = c.recvs[slot]
            .as_ref()
            .filter(|r| r.seq == seq && r.window == Win::Idle)
        else {
            return;
        };
        if r.ending.is_some() {
            self.report_recv(ci, slot);
        } else if !c.is_open() {
            // Its connection's teardown ends it.
        } else if let Err(e) = self.post_bind(ci, slot) {
            let why = format!("binding a receive's memory window failed: {e}");
            self.fail_conn(ci, why, true);
        }
    }

    /// Brings the window QP back once every operation in flight completed after a failure, and
    /// binds the receives that wait for it; if it cannot come back, their connections fail.
    fn recover_windows(&mut self) {
        let psn = self.rng.psn();
        self.stats.window_qp_recoveries += 1;
        let w = self.io.windows.as_mut().expect("receive windows");
        w.broken = false;
        let back = w.recover(psn);
        // The receives whose binds failed were posted before those still queued.
        let mut waiting = std::mem::take(&mut w.rebind);
        waiting.append(&mut w.queued);
        if let Err(e) = &back {
            tracing::error!("the memory-window QP could not be brought back: {e}");
            w.dead = Some(e.clone());
            for (ci, slot, seq) in waiting {
                self.bind_waiting(ci, slot, seq);
            }
            return;
        }
        w.queued = waiting;
        self.bind_queued();
    }
}

#[cfg(test)]
mod tests {
    use softnic::{Fabric, FabricConfig};

    use super::*;

    impl Engine {
        /// Posts a bind the device refuses (a region without `MW_BIND` access) on the window
        /// QP, for no connection: the QP goes to ERROR, as any failed window operation leaves
        /// it.
        fn break_window_qp(&mut self) {
            let mw = self.io.pd.alloc_mw().unwrap();
            let bad = self
                .io
                .pd
                .alloc_dma(4096, 64, AccessFlags::LOCAL_WRITE)
                .unwrap();
            let w = self.io.windows.as_mut().unwrap();
            let qp = w.qp.as_ref().unwrap();
            let wr = wrid::mw_bind(u16::MAX >> 4, 0);
            qp.bind_mw(
                &mw,
                wr,
                Some((&Arc::new(bad), 0, 64)),
                AccessFlags::REMOTE_WRITE,
            )
            .unwrap();
            w.ops += 1;
            std::mem::forget(mw);
        }
    }

    /// More receives posted at once than the window QP takes (the device's `max_qp_wr`, less
    /// the room kept for unbinds) wait their turn to be bound: every message arrives, where
    /// the receive beyond the QP's room used to fail with a limit. With `cancel`, receives
    /// still waiting are withdrawn and the window QP fails with binds waiting (it is brought
    /// back and binds them after the binds that failed): the others still take every message,
    /// in order.
    fn beyond_the_window_qps_room(cancel: bool) {
        let fabric = Fabric::new(FabricConfig {
            devices: 2,
            seed: 7,
            max_qp_wr: 256,
            auto_advance: false,
            ..Default::default()
        });
        // Room for 3 x 127 receives; the window QP takes 256 operations.
        let cfg = EngineConfig {
            max_conns: 3,
            max_recvs: 127,
            sq_depth: 64,
            srq_depth: 64,
            srq_refill: 16,
            ..EngineConfig::default()
        };
        let (a, b, ca, cb) = crate::test_pair(&fabric, &cfg);
        let mut e = [a, b];
        let mut conns = vec![(ca, cb)];
        for _ in 0..2 {
            let (x, y) = e.split_at_mut(1);
            conns.push(crate::connect_pair(&mut x[0], &mut y[0]).unwrap());
        }
        let (per, len) = (100u64, 64u64);
        let n = per * conns.len() as u64;
        let dst = e[0].register((n * len) as usize).unwrap();
        let src = e[1].register((n * len) as usize).unwrap();
        for k in 0..n {
            src.write_at((k * len) as usize, &[k as u8; 64]).unwrap();
        }
        let conn = |k: u64| conns[(k / per) as usize];
        let recvs: Vec<_> = (0..n)
            .map(|k| e[0].recv(conn(k).0, &dst, k * len, len).unwrap())
            .collect();
        // Receives 250-259 of the last connection wait for room (the first 224 binds took it).
        let cancelled = if cancel { 250..260 } else { 0..0 };
        for k in cancelled.clone() {
            recvs[k as usize].cancel();
        }
        if cancel {
            e[0].poll().unwrap();
            e[0].break_window_qp();
        }
        // Each connection's sends take its receives in order, skipping the withdrawn ones.
        let mut sends = Vec::new();
        let mut expect = vec![None; n as usize];
        for c in 0..conns.len() as u64 {
            let mut next = c * per;
            for k in c * per..(c + 1) * per {
                if cancelled.contains(&k) {
                    continue;
                }
                sends.push(e[1].send(conn(k).1, &src, next * len, len).unwrap());
                expect[k as usize] = Some(next as u8);
                next += 1;
            }
        }
        let end = fabric.now() + std::time::Duration::from_secs(5);
        while !recvs.iter().chain(&sends).all(|r| r.is_done()) {
            assert!(fabric.now() < end, "not done: {:?}", e[0].stats());
            let busy = e.iter_mut().fold(false, |b, e| e.poll().unwrap() | b);
            if !busy {
                fabric.advance(std::time::Duration::from_micros(1));
            }
        }
        for (k, r) in recvs.iter().enumerate() {
            let got = r.test().unwrap();
            if cancelled.contains(&(k as u64)) {
                assert!(matches!(got, Err(EngineError::Cancelled)), "{k}: {got:?}");
            } else {
                assert!(got.is_ok(), "{k}: {got:?}");
            }
        }
        assert!(sends.iter().all(|r| matches!(r.test(), Some(Ok(_)))));
        let mut got = vec![0; (n * len) as usize];
        dst.read_at(0, &mut got).unwrap();
        for (k, m) in got.chunks(len as usize).enumerate() {
            if let Some(x) = expect[k] {
                assert!(m.iter().all(|&b| b == x), "receive {k}: {:?}", &m[..4]);
            }
        }
        assert_eq!(e[0].stats().window_qp_recoveries, u64::from(cancel));
    }

    #[test]
    fn receives_beyond_the_window_qps_room_wait_their_turn() {
        beyond_the_window_qps_room(false);
    }

    #[test]
    fn receives_waiting_for_room_can_be_withdrawn_and_survive_a_failed_window_qp() {
        beyond_the_window_qps_room(true);
    }

    /// A window operation that fails (and the ones flushed after it) costs no receive: the
    /// QP is brought back, the receives whose bind did not run are bound again and
    /// advertised, in order, and every message arrives.
    #[test]
    fn a_failed_window_operation_is_recovered_from() {
        let fabric = Fabric::new(FabricConfig {
            devices: 2,
            seed: 7,
            auto_advance: false,
            ..Default::default()
        });
        let (a, b, ca, cb) = crate::test_pair(&fabric, &EngineConfig::default());
        let mut e = [a, b];
        let dst = e[0].register(64 << 10).unwrap();
        let src = e[1].register(64 << 10).unwrap();
        src.write_at(0, &[0x5a; 64 << 10]).unwrap();
        let mut reqs = Vec::new();
        for k in 0..16u64 {
            if k == 4 {
                e[0].break_window_qp();
            }
            reqs.push(e[0].recv(ca, &dst, k * 4096, 4096).unwrap());
        }
        for k in 0..16u64 {
            reqs.push(e[1].send(cb, &src, k * 4096, 4096).unwrap());
        }
        let end = fabric.now() + std::time::Duration::from_secs(5);
        while !reqs.iter().all(|r| r.is_done()) {
            assert!(fabric.now() < end, "not done: {:?}", e[0].stats());
            let busy = e.iter_mut().fold(false, |b, e| e.poll().unwrap() | b);
            if !busy {
                fabric.advance(std::time::Duration::from_micros(1));
            }
        }
        for r in &reqs {
            assert!(r.test().unwrap().is_ok(), "{:?}", r.test());
        }
        assert_eq!(e[0].stats().window_qp_recoveries, 1);
        let mut got = vec![0; 64 << 10];
        dst.read_at(0, &mut got).unwrap();
        assert!(got.iter().all(|&x| x == 0x5a));
    }
}
