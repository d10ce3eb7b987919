//! The resources one engine shares among all its connections (UCCL's `SharedIOContext`): one
//! CQ for every QP (data and control), one SRQ refilled in chained batches, one UD control QP
//! for ACKs with its buffers. The CQ is sized for everything that may complete into it, in
//! shares whose reservations are counted, so nothing is created that could overflow it.

use std::sync::Arc;
use verbs_safe::sys::{ibv_send_flags, ibv_wr_opcode};

use verbs_safe::{
    AccessFlags, Context, Cq, DmaBuf, LocalPort, Pd, Qp, QpCaps, QpInit, RecvSlot, Rts, SqPsn, Srq,
    Ud, UdInit, UdRtr, WrSlot,
};

use crate::config::{EngineConfig, Mode};
use crate::error::{EngineError, Result};

/// The high bit of a Q_Key: a controlled one (and in a send WR, "the QP's own").
pub(crate) const CONTROLLED_QKEY: u32 = 0x8000_0000;

/// The bytes of the GRH a UD receive buffer starts with.
pub(crate) const GRH: usize = 40;

/// Completions one share of the CQ may still take: every QP attached reserves, from the share
/// its queues belong to (data sends, control), the most they can ever produce (each posted WR
/// completes once, flushed ones included), so the CQ cannot overflow whoever polls slowly.
/// The SRQ's share is its depth, fixed at creation (each WQE completes once before it is
/// posted again).
#[derive(Debug)]
pub(crate) struct CqCredits {
    name: &'static str,
    capacity: u64,
    reserved: u64,
}

impl CqCredits {
    pub(crate) fn new(name: &'static str, capacity: u64) -> Self {
        CqCredits {
            name,
            capacity,
            reserved: 0,
        }
    }

    /// Reserves `n` completions, or refuses (nothing reserved).
    pub(crate) fn reserve(&mut self, n: u64) -> Result<()> {
        if self.reserved + n > self.capacity {
            return Err(EngineError::Limit {
                what: self.name,
                limit: self.capacity,
            });
        }
        self.reserved += n;
        Ok(())
    }

    pub(crate) fn release(&mut self, n: u64) {
        self.reserved = self.reserved.saturating_sub(n);
    }

    /// Completions reserved now.
    pub(crate) fn reserved(&self) -> u64 {
        self.reserved
    }
}

/// A pool of fixed-size slots in one pinned region, each with its receive WR.
pub(crate) struct RecvRing {
    pub(crate) buf: Option<Arc<DmaBuf>>,
    pub(crate) slot_size: usize,
    pub(crate) slots: Vec<RecvSlot<1>>,
    /// Slots consumed whose WR waits to be posted again.
    pub(crate) owed: Vec<u32>,
}

impl RecvRing {
    /// `n` slots of `slot_size` bytes in a new region of `pd` (none for `slot_size` 0: WRs
    /// that only catch an immediate); slot `i`'s WR has `wr_id` `id(i)`.
    pub(crate) fn new(
        pd: &Arc<Pd>,
        n: u32,
        slot_size: usize,
        id: impl Fn(u32) -> u64,
    ) -> Result<RecvRing> {
        let buf = if slot_size == 0 {
            None
        } else {
            let len = slot_size * n as usize;
            let access = AccessFlags::LOCAL_WRITE;
            Some(Arc::new(
                pd.alloc_dma(len, 64, access)
                    .map_err(EngineError::verbs("allocating receive buffers"))?,
            ))
        };
        let slots = (0..n)
            .map(|i| {
                let mut s = RecvSlot::<1>::default();
                s.wr.wr_id = id(i);
                if let Some(b) = &buf {
                    s.sges[0] = b
                        .sge(i as usize * slot_size, slot_size as u32)
                        .expect("inside the region");
                    s.wr.num_sge = 1;
                }
                s
            })
            .collect();
        Ok(RecvRing {
            buf,
            slot_size,
            slots,
            owed: (0..n).collect(),
        })
    }

    /// Reads `out.len()` bytes at `offset` of slot `i`.
    pub(crate) fn read(&self, i: u32, offset: usize, out: &mut [u8]) -> bool {
        match &self.buf {
            Some(b) if (i as usize) < self.slots.len() && offset + out.len() <= self.slot_size => {
                b.read_at(i as usize * self.slot_size + offset, out).is_ok()
            }
            _ => false,
        }
    }
}

/// Send slots of one pinned region, with their free list.
pub(crate) struct SendRing {
    pub(crate) buf: Arc<DmaBuf>,
    pub(crate) slot_size: usize,
    pub(crate) slots: Vec<WrSlot<1>>,
    pub(crate) free: Vec<u32>,
    /// Whether each slot is taken (so a repeated give-back cannot free it twice).
    busy: Vec<bool>,
}

impl SendRing {
    /// `n` slots of `slot_size` bytes in a new region of `pd`; slot `i`'s WR has `wr_id`
    /// `id(i)` until a post sets another.
    pub(crate) fn new(
        pd: &Arc<Pd>,
        n: u32,
        slot_size: usize,
        id: impl Fn(u32) -> u64,
    ) -> Result<SendRing> {
        let buf = Arc::new(
            pd.alloc_dma(slot_size * n as usize, 64, AccessFlags::LOCAL_WRITE)
                .map_err(EngineError::verbs("allocating control send buffers"))?,
        );
        let slots = (0..n)
            .map(|i| {
                let mut s = WrSlot::<1>::default();
                s.wr.wr_id = id(i);
                s.sges[0] = buf
                    .sge(i as usize * slot_size, slot_size as u32)
                    .expect("inside the region");
                s.wr.num_sge = 1;
                s.wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
                s.wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
                s
            })
            .collect();
        Ok(SendRing {
            buf,
            slot_size,
            slots,
            free: (0..n).rev().collect(),
            busy: vec![false; n as usize],
        })
    }

    /// Takes a free slot and fills it with `data` (at most `slot_size` bytes).
    pub(crate) fn take(&mut self, data: &[u8]) -> Option<u32> {
        let i = self.free.pop()?;
        let at = i as usize * self.slot_size;
        if data.len() > self.slot_size || self.buf.write_at(at, data).is_err() {
            self.free.push(i);
            return None;
        }
        self.slots[i as usize].sges[0].length = data.len() as u32;
        self.busy[i as usize] = true;
        Some(i)
    }

    /// The bytes in slot `i`, read into `out`, if the slot is taken (posted, not yet
    /// completed) and they fit.
    pub(crate) fn read_taken<'a>(&self, i: u32, out: &'a mut [u8]) -> Option<&'a [u8]> {
        let i = i as usize;
        let len = self.slots.get(i)?.sges[0].length as usize;
        let out = out.get_mut(..len)?;
        (self.busy[i] && self.buf.read_at(i * self.slot_size, out).is_ok()).then_some(&*out)
    }

    /// Slots in all (taken or free).
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Slots taken and not given back.
    pub(crate) fn in_use(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Gives slot `i` back (its send completed).
    pub(crate) fn give_back(&mut self, i: u32) {
        if let Some(b) = self.busy.get_mut(i as usize).filter(|b| **b) {
            *b = false;
            self.free.push(i);
        }
    }
}

/// The shared resources of an engine.
pub(crate) struct Io {
    pub(crate) ctx: Arc<Context>,
    pub(crate) pd: Arc<Pd>,
    pub(crate) from: LocalPort,
    /// The one CQ of every QP: data sends and receives (through the SRQ), the UD control QP
    /// and every connection's control QP. Its `wr_id`s tell them apart ([`crate::wrid`]).
    pub(crate) cq: Arc<Cq>,
    /// The share of the CQ the data QPs' send queues may fill.
    pub(crate) send_credits: CqCredits,
    /// The share of the CQ the control QPs may fill.
    pub(crate) ctrl_credits: CqCredits,
    pub(crate) srq: Arc<Srq>,
    pub(crate) srq_ring: RecvRing,
    /// The SRQ's low-water mark: below it the device raises `IBV_EVENT_SRQ_LIMIT_REACHED`
    /// and the engine refills at once whatever is owed.
    pub(crate) srq_limit: u32,
    /// Whether the limit is armed (it disarms when it fires).
    pub(crate) srq_armed: bool,
    /// The UD control QP: ACKs in and out.
    pub(crate) ctrl_qp: Qp<Ud, Rts>,
    /// Its Q_Key, drawn at random (never a controlled one): a UD message with another is
    /// dropped by the device, so a host that never shook hands with this engine cannot fill
    /// the QP's receive queue, which every connection's ACKs share.
    pub(crate) qkey: u32,
    pub(crate) ctrl_recv: RecvRing,
    pub(crate) ctrl_send: SendRing,
    /// The QP receive windows are bound and unbound on ([`RecvKeys::Window`](crate::RecvKeys)).
    pub(crate) windows: Option<crate::window::WindowQp>,
    /// Bytes one UD message may carry (its items: ACKs, advertisements).
    pub(crate) ud_payload: usize,
}

/// The index of the first IPv4-mapped GID of `port`'s table of `len` entries, else 0 (a
/// table with no IPv4 GID: InfiniBand, or RoCE over IPv6 only).
fn ipv4_gid_index(ctx: &Context, port: u8, len: u32) -> Result<u8> {
    for i in 0..len.min(u32::from(u8::MAX) + 1) {
        let gid = ctx
            .query_gid(port, i as i32)
            .map_err(EngineError::verbs("reading the GID table"))?;
        if gid.is_ipv4_mapped() {
            return Ok(i as u8);
        }
    }
    Ok(0)
}

/// The depth of the UD control QP's queues.
const CTRL_DEPTH: u32 = 256;

impl Io {
    /// `window_psn`: the window QP's first PSN (random: see `window.rs`); `qkey`: the UD
    /// control QP's Q_Key (random: only peers that shook hands with this engine learn it).
    pub(crate) fn new(
        ctx: &Arc<Context>,
        cfg: &EngineConfig,
        window_psn: u32,
        qkey: u32,
    ) -> Result<Io> {
        let pd = ctx
            .alloc_pd()
            .map_err(EngineError::verbs("allocating a PD"))?;
        let port = ctx.query_port(cfg.port).map_err(|_| EngineError::Config {
            field: "port",
            value: cfg.port.into(),
            reason: "not a port of the device (ibv_query_port refuses it)",
        })?;
        if u64::from(cfg.tx.chunk_size) > u64::from(port.max_msg_size) {
            return Err(EngineError::Config {
                field: "chunk_size",
                value: cfg.tx.chunk_size.into(),
                reason: "above the largest message the port carries (its max_msg_sz)",
            });
        }
        let mtu = port.active_mtu.bytes().min(cfg.path_mtu.bytes());
        let gid_index = match cfg.gid_index {
            Some(i) if u32::from(i) >= port.gid_table_len => {
                return Err(EngineError::Config {
                    field: "gid_index",
                    value: i.into(),
                    reason: "past the end of the port's GID table",
                });
            }
            Some(i) => i,
            None => ipv4_gid_index(ctx, cfg.port, port.gid_table_len)?,
        };
        let from = LocalPort::new(cfg.port, gid_index);
        // One CQ, in three shares that never overflow it: every WR of every data QP may
        // complete (flushes included); every SRQ WQE completes once; the UD control QP's two
        // queues and each connection's control QP.
        let send_cap =
            u64::from(cfg.max_conns) * u64::from(cfg.qps_per_conn) * u64::from(cfg.sq_depth);
        let conn_ctrl = 2 * u64::from(conn_ctrl_depth(cfg));
        let limits = ctx
            .query_device()
            .map_err(EngineError::verbs("querying the device"))?;
        let windows = crate::window::depth(cfg, &limits);
        let ctrl_cap = 2 * u64::from(CTRL_DEPTH) + u64::from(cfg.max_conns) * conn_ctrl;
        let entries = send_cap + u64::from(cfg.srq_depth) + ctrl_cap + u64::from(windows);
        for (field, depth, max) in [
            ("sq_depth", cfg.sq_depth, limits.max_qp_wr),
            ("srq_depth", cfg.srq_depth, limits.max_srq_wr),
        ] {
            if depth > max {
                return Err(EngineError::Config {
                    field,
                    value: depth.into(),
                    reason: "more than the device allows (max_qp_wr, max_srq_wr)",
                });
            }
        }
        let entries = u32::try_from(entries)
            .ok()
            .filter(|&n| n <= limits.max_cqe)
            .ok_or(EngineError::Config {
                field: "max_conns",
                value: cfg.max_conns.into(),
                reason: "needs a CQ larger than the device's max_cqe: max_conns x (qps_per_conn \
                         x sq_depth + twice a connection's control depth + max_recvs) + \
                         srq_depth + 512 entries",
            })?;
        let cq = Cq::new(ctx, entries, None).map_err(EngineError::verbs("creating the CQ"))?;
        let mut ctrl_credits = CqCredits::new("control share of the CQ", ctrl_cap);
        ctrl_credits.reserve(2 * u64::from(CTRL_DEPTH))?;
        let srq =
            Srq::new(&pd, cfg.srq_depth, 1).map_err(EngineError::verbs("creating the SRQ"))?;
        // UC: a retransmission arrives as a SEND of [header | chunk] into an SRQ buffer. RC:
        // nothing but immediates arrives, so the WQEs have no buffer.
        let srq_slot = match cfg.mode {
            Mode::Uc => cfg.tx.chunk_size as usize + uccl_tx::wire::RETR_HDR_LEN,
            Mode::Rc => 0,
        };
        let srq_ring = RecvRing::new(&pd, cfg.srq_depth, srq_slot, crate::wrid::srq_recv)?;
        if let Some(b) = &srq_ring.buf {
            srq.pin(b);
        }
        let caps = QpCaps {
            max_send_wr: CTRL_DEPTH,
            max_recv_wr: CTRL_DEPTH,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let ctrl_qp = Qp::<Ud, _>::new(
            &pd,
            QpInit {
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                caps,
                sig_all: true,
            },
        )
        .map_err(EngineError::verbs("creating the control QP"))?;
        let up = EngineError::verbs("bringing up the control QP");
        let ctrl_qp = ctrl_qp
            .init(UdInit {
                port: cfg.port,
                ..UdInit::new(qkey)
            })
            .map_err(|e| up(e.error))?
            .rtr(UdRtr)
            .map_err(|e| up(e.error))?
            .rts(SqPsn(0))
            .map_err(|e| up(e.error))?;
        let windows = match cfg.recv_keys {
            crate::RecvKeys::Window => Some(crate::window::WindowQp::new(
                &pd,
                &cq,
                cfg,
                (from, window_psn),
                windows,
            )?),
            crate::RecvKeys::Buffer => None,
        };
        let ctrl_recv = RecvRing::new(&pd, CTRL_DEPTH, GRH + mtu as usize, crate::wrid::ud_recv)?;
        let ctrl_send = SendRing::new(&pd, CTRL_DEPTH, mtu as usize, crate::wrid::ud_send)?;
        ctrl_qp.pin(ctrl_recv.buf.as_ref().expect("control buffers"));
        ctrl_qp.pin(&ctrl_send.buf);
        let mut io = Io {
            ctx: Arc::clone(ctx),
            pd,
            from,
            cq,
            send_credits: CqCredits::new("send share of the CQ", send_cap),
            ctrl_credits,
            windows,
            srq,
            srq_ring,
            srq_limit: ((cfg.srq_depth - cfg.srq_refill) / 2).max(1),
            srq_armed: false,
            ctrl_qp,
            qkey,
            ctrl_recv,
            ctrl_send,
            ud_payload: mtu as usize,
        };
        // The UD QP takes what peers send from the start (UC receive buffers are advertised
        // there): an engine that has not polled yet must not drop them.
        io.refill_ctrl()?;
        Ok(io)
    }

    /// Posts every owed SRQ WQE with one chained post, once at least `threshold` are owed.
    /// Returns the number posted.
    #[inline(always)]
    pub(crate) fn refill_srq(&mut self, threshold: usize) -> Result<usize> {
        let n = self.srq_ring.owed.len();
        if n == 0 || n < threshold {
            return Ok(0);
        }
        let r = self
            .srq
            .post_recv_slots(&mut self.srq_ring.slots, &self.srq_ring.owed);
        settle(&mut self.srq_ring.owed, r).map_err(EngineError::verbs("refilling the SRQ"))?;
        if !self.srq_armed {
            self.srq
                .arm_limit(self.srq_limit)
                .map_err(EngineError::verbs("arming the SRQ limit"))?;
            self.srq_armed = true;
        }
        Ok(n)
    }

    /// Posts every owed control receive with one chained post.
    #[inline(always)]
    pub(crate) fn refill_ctrl(&mut self) -> Result<()> {
        if self.ctrl_recv.owed.is_empty() {
            return Ok(());
        }
        let r = self
            .ctrl_qp
            .post_recv_slots(&mut self.ctrl_recv.slots, &self.ctrl_recv.owed);
        settle(&mut self.ctrl_recv.owed, r).map_err(EngineError::verbs("refilling the control QP"))
    }
}

/// Takes what a chained receive post `r` of `owed` posted out of `owed`: all of it, or on a
/// post error the WRs before the failing one (libibverbs `bad_wr`), so that no slot is ever
/// posted twice.
pub(crate) fn settle(owed: &mut Vec<u32>, r: verbs_safe::Result<()>) -> verbs_safe::Result<()> {
    match &r {
        Ok(()) => owed.clear(),
        Err(verbs_safe::Error::Post { index, .. }) => {
            owed.drain(..(*index).min(owed.len()));
        }
        Err(_) => {}
    }
    r
}

/// The depth of each queue of a connection's control QP: every receive buffer it may advertise
/// and a close.
pub(crate) fn conn_ctrl_depth(cfg: &EngineConfig) -> u32 {
    cfg.max_recvs + 2
}
