//! Receive windows ([`RecvKeys::Window`](crate::RecvKeys::Window)): a receive buffer is
//! advertised with the key of a memory window bound over exactly its range, so the peer
//! reaches that range only, and only while the receive is posted.
//!
//! - Each connection has a window per request id (allocated at the id's first receive, never
//!   shared with another connection, so a key a peer saw tells it nothing of another peer's).
//! - Binds and unbinds go on a QP of their own, which carries nothing else (so they complete
//!   at once, whatever the connections' queues hold): the window QP, connected to itself.
//! - A receive's advertisement leaves once its window's bind completed: the key works by the
//!   time the peer reads it. Binds complete in the order they were posted, so advertisements
//!   keep the order of the receives.
//! - A receive that ends (its message arrived, or it was refused) posts an unbind, and is
//!   reported only once the unbind completed: by then the peer can no longer write the buffer.
//! - A connection that fails deallocates its windows at once (their keys die with them).
//!
//! Type 1 windows, not type 2: a type-2 window works only through the QP that bound it, and a
//! connection's chunks arrive on all its data QPs.

use std::sync::Arc;

use verbs_safe::{
    AccessFlags, ConnInit, Cq, DeviceLimits, DmaBuf, LocalPort, Pd, Qp, QpCaps, QpInit, Rc, RcRtr,
    RcRts, Remote, Rts,
};

use crate::config::EngineConfig;
use crate::engine::Engine;
use crate::error::{EngineError, Result};
use crate::proto::Ctl;
use crate::request::Done;
use crate::round::Cqe;
use crate::wrid;

/// Window operations the window QP may have outstanding: one per receive every connection may
/// have posted (a receive's bind completes before its data arrives, its unbind after), at most
/// what the device allows.
pub(crate) fn depth(cfg: &EngineConfig, limits: &DeviceLimits) -> u32 {
    let want = u64::from(cfg.max_conns) * u64::from(cfg.max_recvs);
    want.min(u64::from(limits.max_qp_wr)) as u32
}

/// The QP receive windows are bound and unbound on.
pub(crate) struct WindowQp {
    qp: Qp<Rc, Rts>,
    depth: u32,
    /// Binds and unbinds posted and not completed.
    ops: u32,
}

impl WindowQp {
    /// An RC QP connected to itself (it never sends a packet: binds are local), with room for
    /// `depth` window operations, completing into `cq`.
    pub(crate) fn new(
        pd: &Arc<Pd>,
        cq: &Arc<Cq>,
        cfg: &EngineConfig,
        from: LocalPort,
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
        let qp = Qp::<Rc, _>::new(pd, init).map_err(up)?;
        let ctx = pd.context();
        let gid = ctx.query_gid(cfg.port, from.gid_index.into()).map_err(up)?;
        let lid = ctx.query_port(cfg.port).map_err(up)?.lid;
        let me = Remote {
            qpn: qp.qpn(),
            psn: 0,
            lid,
            gid: Some(gid),
        };
        let qp = qp
            .init(ConnInit {
                port: cfg.port,
                ..ConnInit::default()
            })
            .map_err(|e| up(e.error))?
            .rtr(RcRtr::new(me, from))
            .map_err(|e| up(e.error))?
            .rts(RcRts::new(0))
            .map_err(|e| up(e.error))?;
        Ok(WindowQp { qp, depth, ops: 0 })
    }
}

impl Engine {
    /// Binds the window of request id `slot` of connection `ci` over `len` bytes at `addr` of
    /// `mem`; returns its key. The receive is advertised once the bind completes.
    pub(crate) fn bind_window(
        &mut self,
        ci: u16,
        slot: usize,
        mem: &Arc<DmaBuf>,
        addr: u64,
        len: u64,
    ) -> Result<u32> {
        let w = self.io.windows.as_mut().expect("receive windows");
        if w.ops >= w.depth {
            return Err(EngineError::Limit {
                what: "receive windows being bound or unbound at once",
                limit: w.depth.into(),
            });
        }
        let c = self.conns[usize::from(ci)]
            .as_mut()
            .expect("an open connection");
        let mw = match &mut c.windows[slot] {
            Some(mw) => mw,
            none @ None => none.insert(
                self.io
                    .pd
                    .alloc_mw()
                    .map_err(EngineError::verbs("allocating a receive's memory window"))?,
            ),
        };
        let target = Some((mem, (addr - mem.addr()) as usize, len as usize));
        let rkey =
            w.qp.bind_mw(
                mw,
                wrid::mw_bind(ci, slot as u32),
                target,
                AccessFlags::REMOTE_WRITE,
            )
            .map_err(EngineError::verbs("binding a receive's memory window"))?;
        w.ops += 1;
        c.window_ops += 1;
        Ok(rkey)
    }

    /// Ends receive `slot` of connection `ci` with `result`: reported at once with buffer
    /// keys; with windows once its window is unbound.
    pub(crate) fn end_recv(&mut self, ci: u16, slot: usize, result: Result<Done>) {
        let Some(c) = self.conns[usize::from(ci)].as_mut() else {
            return;
        };
        let Some(r) = c.recvs[slot].as_mut().filter(|r| r.ending.is_none()) else {
            return;
        };
        let Some(w) = self.io.windows.as_mut() else {
            let r = c.recvs[slot].take().expect("checked");
            c.recvs_posted -= 1;
            r.req.complete(result);
            return;
        };
        r.ending = Some(result);
        let unbound = match &c.windows[slot] {
            Some(mw) => {
                w.qp.bind_mw(
                    mw,
                    wrid::mw_unbind(ci, slot as u32),
                    None,
                    AccessFlags::empty(),
                )
                .map_err(|e| e.to_string())
            }
            None => Err("it has no window".into()),
        };
        match unbound {
            Ok(_) => {
                w.ops += 1;
                c.window_ops += 1;
            }
            Err(why) => {
                // Its key must die before the receive is reported: the connection's windows
                // are deallocated with it.
                let why = format!("unbinding a receive's memory window failed: {why}");
                self.fail_conn(ci, why, true);
            }
        }
    }

    /// A bind (or, `unbind`, an unbind) of window `slot` of connection `ci` completed: a bound
    /// receive is advertised, an unbound one reported.
    pub(crate) fn on_window(&mut self, ci: u16, slot: u32, unbind: bool, e: Cqe) {
        if let Some(w) = self.io.windows.as_mut() {
            w.ops = w.ops.saturating_sub(1);
        }
        let Some(c) = self.conns.get_mut(usize::from(ci)).and_then(Option::as_mut) else {
            return;
        };
        c.window_ops = c.window_ops.saturating_sub(1);
        if !e.ok {
            if c.is_open() {
                let what = if unbind { "unbinding" } else { "binding" };
                let status = e
                    .status
                    .map_or("an unknown status".into(), |s| format!("{s:?}"));
                let why = format!("{what} a receive's memory window failed ({status})");
                self.fail_conn(ci, why, true);
            }
            return;
        }
        let Some(r) = c.recvs.get_mut(slot as usize).and_then(Option::as_mut) else {
            return;
        };
        if unbind {
            if r.ending.is_some() {
                let r = c.recvs[slot as usize].take().expect("checked");
                c.recvs_posted -= 1;
                r.req.complete(r.ending.expect("checked"));
            }
        } else if !r.advertised && r.ending.is_none() {
            r.advertised = true;
            let cts = Ctl::Cts {
                seq: r.seq,
                addr: r.addr,
                len: r.len,
                rkey: r.rkey,
            };
            c.ctl.backlog.push_back(cts.to_bytes());
            self.mark_ctl(ci);
        }
    }
}
