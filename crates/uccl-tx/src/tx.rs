//! The transmit side: flows of messages cut into chunks, posted as chains of pooled WRs,
//! tracked until acknowledged, retransmitted when lost.

use std::collections::VecDeque;
use std::sync::Arc;

use bufpool::{Handle, LocalPool, ObjectPool, RegionPool};
use verbs_safe::WrSlot;
use verbs_safe::sys::{ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wr_opcode};

use crate::config::TxConfig;
use crate::error::TxError;
use crate::path::{Path, PathId};
use crate::tracking::{Track, Tracking};
use crate::wire::{AckRepr, Imm, MAX_FID, RETR_HDR_LEN, RetrHdrRepr, SACK_BITS, csn_add, csn_diff};

/// A work-request extension: the WR, its two SGEs (data; or retransmission header and data),
/// and what the transmit side needs to find the chunk again. Pool elements never move, so the
/// WR's `sg_list` points at its own SGEs for the pool's whole life.
#[repr(C)]
#[derive(Debug, Default)]
pub struct WrEx {
    /// The WR and its SGEs (first: a pointer to the `WrEx` is a pointer to its WR).
    pub slot: WrSlot<2>,
    /// The chunk's flow.
    pub fid: u16,
    /// The chunk's sequence number.
    pub csn: u16,
    /// The next WR of the chain this one was last put in.
    pub next: Option<Handle>,
}

/// A chain of WRs for one QP, linked through `next`, to be posted with one doorbell.
#[derive(Debug, Clone, Copy)]
pub struct Chain {
    /// The QP.
    pub path: PathId,
    /// The first WR: what `post_send` takes.
    pub head: *mut ibv_send_wr,
    /// WRs in the chain.
    pub len: u32,
    /// The first WR's extension (walk the rest with [`Tx::chain`]).
    pub first: Handle,
}

/// Something the caller should know.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// Every chunk of the message was acknowledged.
    MessageComplete {
        /// The flow.
        fid: u16,
        /// The message, as [`Tx::send`] returned it.
        msg: u64,
    },
    /// The message cannot complete.
    MessageFailed {
        /// The flow.
        fid: u16,
        /// The message.
        msg: u64,
        /// Why.
        error: TxError,
    },
    /// The flow failed; its messages failed with it.
    FlowFailed {
        /// The flow.
        fid: u16,
        /// Why.
        error: TxError,
    },
    /// A QP reported an error completion: no more WRs go to it.
    PathFailed {
        /// The QP.
        path: PathId,
    },
}

/// Counters of the transmit side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxStats {
    /// Chunks sent for the first time.
    pub chunks: u64,
    /// Chains handed out (doorbells).
    pub chains: u64,
    /// WRs handed out.
    pub wrs: u64,
    /// Retransmissions after a timeout.
    pub rto_retransmits: u64,
    /// Retransmissions after a later chunk on the same QP was acknowledged.
    pub fast_retransmits: u64,
    /// Retransmission timeouts that fired.
    pub timeouts: u64,
    /// ACKs taken.
    pub acks: u64,
    /// ACKs ignored as impossible (unknown flow, acknowledging chunks never sent).
    pub bad_acks: u64,
    /// ACKs ignored as stale (a newer one already moved the cumulative ACK past them; the
    /// receiver's state only grows, so they carry nothing new).
    pub stale_acks: u64,
    /// Times a chunk waited because the WR pool was empty.
    pub wr_pool_empty: u64,
    /// Times a retransmission waited because the header pool was empty.
    pub hdr_pool_empty: u64,
}

/// A message waiting to be sent or acknowledged.
#[derive(Debug)]
struct Msg {
    local: u64,
    lkey: u32,
    len: u64,
    remote: u64,
    rkey: u32,
    /// Bytes cut into chunks so far.
    cut: u64,
    chunks: u64,
    acked: u64,
    done: bool,
}

/// What [`Tx::send`] takes: a registered local buffer and where it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message {
    /// Local address of the data.
    pub local_addr: u64,
    /// Its memory region's lkey.
    pub lkey: u32,
    /// Bytes (0 is a message of one empty chunk).
    pub len: u64,
    /// Where it goes at the receiver.
    pub remote_addr: u64,
    /// The receiver region's rkey.
    pub rkey: u32,
}

#[derive(Debug)]
struct Flow {
    /// Shared so the per-chunk path choice can hold it while borrowing the engine mutably.
    paths: Arc<[PathId]>,
    track: Tracking,
    msgs: VecDeque<Msg>,
    /// Sequence number of `msgs[0]`.
    front: u64,
    /// Chunks (s)acked or not: unacknowledged count.
    unacked: u32,
    retx: VecDeque<u16>,
    /// Highest sequence number per path that the peer has acknowledged.
    delivered: Vec<(PathId, u64)>,
    backoff: u32,
    last_progress: u64,
    failed: bool,
}

/// Flow `fid` if it is open and has not failed.
fn live_flow(flows: &mut [Option<Flow>], fid: u16) -> Option<&mut Flow> {
    flows
        .get_mut(usize::from(fid))
        .and_then(|f| f.as_mut())
        .filter(|f| !f.failed)
}

impl Flow {
    fn note_delivered(&mut self, p: PathId, seq: u64) {
        match self.delivered.iter_mut().find(|(q, _)| *q == p) {
            Some((_, s)) => *s = (*s).max(seq),
            None => self.delivered.push((p, seq)),
        }
    }

    /// The next message with bytes left to cut, by sequence number.
    fn cutting(&self) -> Option<u64> {
        self.msgs
            .iter()
            .position(|m| m.cut < m.len || m.chunks == 0)
            .map(|i| self.front + i as u64)
    }
}

/// wr_id layout: bits 48..63 the WR-extension index (bit 63 stays clear: verbs-safe's
/// completion-context tag), 40..48 the path, 0..40 the WR's sequence number on its path.
fn wr_id(index: u32, path: PathId, seq: u64) -> u64 {
    (u64::from(index) << 48) | (u64::from(path.0) << 40) | (seq & ((1 << 40) - 1))
}

fn split_wr_id(id: u64) -> (u32, PathId, u64) {
    (
        ((id >> 48) & 0x7fff) as u32,
        PathId((id >> 40) as u8),
        id & ((1 << 40) - 1),
    )
}

/// The transmit side of an engine: sans-IO. It never calls a verb and never reads a clock;
/// the caller feeds it time, ACKs and send completions, and posts the chains it hands out.
pub struct Tx {
    cfg: TxConfig,
    wrs: ObjectPool<WrEx>,
    hdrs: RegionPool<u32, LocalPool>,
    paths: Vec<Path>,
    flows: Vec<Option<Flow>>,
    /// Open flow ids, served round-robin.
    order: Vec<u16>,
    turn: usize,
    events: VecDeque<Event>,
    unacked: u32,
    rng: u64,
    staged: Vec<Vec<Handle>>,
    freed_hdrs: Vec<u32>,
    /// Scratch for the chunks one ACK finds lost (kept to spare an allocation per ACK).
    lost: Vec<u16>,
    stats: TxStats,
}

impl std::fmt::Debug for Tx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tx")
            .field("paths", &self.paths.len())
            .field("flows", &self.order.len())
            .field("unacked", &self.unacked)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Tx {
    /// A transmit side with `cfg`, retransmission headers taken from `hdrs` (slots of at least
    /// [`RETR_HDR_LEN`] bytes in a region registered with lkey `*hdrs.key()`).
    pub fn new(cfg: TxConfig, hdrs: RegionPool<u32, LocalPool>) -> Result<Tx, TxError> {
        cfg.validate()?;
        if hdrs.slot_size() < RETR_HDR_LEN {
            return Err(TxError::Config {
                field: "hdrs.slot_size",
                value: hdrs.slot_size() as u64,
                reason: "must hold a 12-byte retransmission header",
            });
        }
        let wrs = ObjectPool::new(cfg.wr_pool, |_, e: &mut WrEx| {
            e.slot.point_sges(1);
            e.slot.wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
        })?;
        Ok(Tx {
            rng: cfg.seed | 1,
            cfg,
            wrs,
            hdrs,
            paths: Vec::new(),
            flows: Vec::new(),
            order: Vec::new(),
            turn: 0,
            events: VecDeque::new(),
            unacked: 0,
            staged: Vec::new(),
            freed_hdrs: Vec::new(),
            lost: Vec::new(),
            stats: TxStats::default(),
        })
    }

    /// Adds a QP with a send queue of `sq_depth` WRs; WRs for it carry the returned path.
    pub fn add_path(&mut self, sq_depth: u32) -> Result<PathId, TxError> {
        if self.paths.len() > u8::MAX as usize || sq_depth == 0 {
            return Err(TxError::Config {
                field: "paths",
                value: self.paths.len() as u64,
                reason: "at most 256 paths, each with a non-empty send queue",
            });
        }
        self.paths.push(Path::new(sq_depth));
        self.staged.push(Vec::new());
        Ok(PathId((self.paths.len() - 1) as u8))
    }

    /// Opens flow `fid` over `paths` (the QPs connected to the flow's peer).
    pub fn open_flow(&mut self, fid: u16, paths: &[PathId], now: u64) -> Result<(), TxError> {
        let bad = |reason| Err(TxError::Paths { fid, reason });
        if fid > MAX_FID {
            return Err(TxError::Config {
                field: "fid",
                value: fid.into(),
                reason: "flow ids are 12 bits",
            });
        }
        if paths.is_empty() {
            return bad("no path");
        }
        if paths.iter().any(|p| usize::from(p.0) >= self.paths.len()) {
            return bad("unknown path");
        }
        let i = usize::from(fid);
        if self.flows.len() <= i {
            self.flows.resize_with(i + 1, || None);
        }
        if self.flows[i].is_some() {
            return Err(TxError::FlowExists(fid));
        }
        self.flows[i] = Some(Flow {
            paths: paths.into(),
            track: Tracking::new(),
            msgs: VecDeque::new(),
            front: 0,
            unacked: 0,
            retx: VecDeque::new(),
            delivered: Vec::new(),
            backoff: 0,
            last_progress: now,
            failed: false,
        });
        self.order.push(fid);
        Ok(())
    }

    /// Closes flow `fid`: its pending messages fail with [`TxError::Closed`].
    pub fn close_flow(&mut self, fid: u16) -> Result<(), TxError> {
        let open = self
            .flows
            .get(usize::from(fid))
            .is_some_and(|f| f.is_some());
        if !open {
            return Err(TxError::NoFlow(fid));
        }
        self.fail_flow(fid, TxError::Closed(fid), false);
        self.flows[usize::from(fid)] = None;
        self.order.retain(|&f| f != fid);
        Ok(())
    }

    /// Queues a message on flow `fid`; returns its id (the flow's message sequence number).
    pub fn send(&mut self, fid: u16, m: Message) -> Result<u64, TxError> {
        let f = self
            .flows
            .get_mut(usize::from(fid))
            .and_then(|f| f.as_mut())
            .ok_or(TxError::NoFlow(fid))?;
        if f.failed {
            return Err(TxError::FlowFailed(fid));
        }
        if m.local_addr.checked_add(m.len).is_none() || m.remote_addr.checked_add(m.len).is_none() {
            return Err(TxError::BadMessage {
                len: m.len,
                local: m.local_addr,
                remote: m.remote_addr,
            });
        }
        f.msgs.push_back(Msg {
            local: m.local_addr,
            lkey: m.lkey,
            len: m.len,
            remote: m.remote_addr,
            rkey: m.rkey,
            cut: 0,
            chunks: 0,
            acked: 0,
            done: false,
        });
        Ok(f.front + f.msgs.len() as u64 - 1)
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Counters.
    pub fn stats(&self) -> TxStats {
        self.stats
    }

    /// The WR extension `h` (for inspecting a chain).
    pub fn wr(&self, h: Handle) -> Option<&WrEx> {
        self.wrs.get(h).ok()
    }

    /// The WR extensions of a chain, in order.
    pub fn chain(&self, c: &Chain) -> impl Iterator<Item = (Handle, &WrEx)> + '_ {
        let mut next = Some(c.first);
        std::iter::from_fn(move || {
            let h = next?;
            let e = self.wrs.get(h).ok()?;
            next = e.next;
            Some((h, e))
        })
    }

    /// The retransmission header a retransmission WR carries (its first SGE), read back from
    /// the header region: `None` for a WR that is not a retransmission.
    pub fn retransmission_header(&self, h: Handle) -> Option<RetrHdrRepr> {
        let e = self.wrs.get(h).ok()?;
        if e.slot.wr.opcode != ibv_wr_opcode::IBV_WR_SEND || e.slot.wr.num_sge != 2 {
            return None;
        }
        let slot = self.hdrs.slot_of(e.slot.sges[0].addr as usize).ok()?;
        let mut b = [0u8; RETR_HDR_LEN];
        self.hdrs.read(slot, 0, &mut b).ok()?;
        let view = crate::wire::RetrHdr::new_checked(&b[..]).ok()?;
        Some(RetrHdrRepr::parse(&view))
    }

    /// WR extensions handed out (in flight or queued for retransmission).
    pub fn wrs_in_use(&self) -> usize {
        self.wrs.len()
    }

    /// Retransmission header slots in use (waiting for their send completion).
    pub fn hdrs_in_use(&self) -> usize {
        self.hdrs.len()
    }

    /// Free send-queue slots of `path`.
    pub fn path_room(&self, path: PathId) -> u32 {
        self.paths.get(usize::from(path.0)).map_or(0, Path::room)
    }

    /// The smoothed RTT of `path` in ns, once there was a sample.
    pub fn path_srtt(&self, path: PathId) -> Option<u64> {
        self.paths
            .get(usize::from(path.0))
            .and_then(|p| p.rtt.srtt())
    }

    /// Chunks not yet acknowledged, all flows.
    pub fn unacked(&self) -> u32 {
        self.unacked
    }

    fn rand(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Power of two choices among the flow's usable paths with room: the lower smoothed RTT
    /// (a path without a sample counts as the best), then the more room.
    fn pick_path(&mut self, candidates: &[PathId]) -> Option<PathId> {
        let usable = |t: &Tx, p: &PathId| {
            let path = &t.paths[usize::from(p.0)];
            !path.failed
                && path.room() > 0
                && (t.staged[usize::from(p.0)].len() as u32) < t.cfg.max_chain
        };
        let n = candidates.iter().filter(|p| usable(self, p)).count();
        let pick = |t: &mut Tx| {
            let k = (t.rand() % n as u64) as usize;
            *candidates
                .iter()
                .filter(|p| usable(t, p))
                .nth(k)
                .expect("k < n")
        };
        match n {
            0 => None,
            1 => Some(pick(self)),
            _ => {
                let a = pick(self);
                let mut b = pick(self);
                if a == b {
                    b = *candidates
                        .iter()
                        .filter(|p| usable(self, p))
                        .find(|&&p| p != a)
                        .expect("n >= 2");
                }
                let key = |t: &Tx, p: PathId| {
                    let path = &t.paths[usize::from(p.0)];
                    (path.rtt.srtt().unwrap_or(0), u32::MAX - path.room())
                };
                Some(if key(self, b) < key(self, a) { b } else { a })
            }
        }
    }

    /// Hands out the WRs to post now: retransmissions first, then new chunks, flows served
    /// round-robin, each QP's WRs linked into one chain (one doorbell). Never more WRs for a QP
    /// than its send queue has room for.
    pub fn poll_transmit(&mut self, now: u64, out: &mut Vec<Chain>) {
        out.clear();
        if self.order.is_empty() {
            return;
        }
        let n = self.order.len();
        let start = self.turn % n;
        self.turn = self.turn.wrapping_add(1);
        for k in 0..n {
            let fid = self.order[(start + k) % n];
            self.stage_retransmits(fid, now);
        }
        // New chunks: one per flow per round, so flows share the paths and the engine window.
        loop {
            let mut any = false;
            for k in 0..n {
                let fid = self.order[(start + k) % n];
                any |= self.stage_new_chunk(fid, now);
            }
            if !any {
                break;
            }
        }
        self.link(out);
    }

    fn flow_mut(&mut self, fid: u16) -> Option<&mut Flow> {
        live_flow(&mut self.flows, fid)
    }

    /// Takes a send-queue slot on `p` for WR extension `h` and stages it.
    fn take_slot(&mut self, p: PathId, h: Handle, force_signal: bool) -> (u64, bool) {
        let every = self.cfg.signal_every;
        let (seq, signaled) = self.paths[usize::from(p.0)].take(every, force_signal);
        let id = wr_id(h.index(), p, seq);
        let e = self.wrs.get_mut(h).expect("handle in use");
        e.slot.wr.wr_id = id;
        e.slot.wr.send_flags = if signaled {
            ibv_send_flags::IBV_SEND_SIGNALED.0
        } else {
            0
        };
        self.staged[usize::from(p.0)].push(h);
        self.stats.wrs += 1;
        (seq, signaled)
    }

    fn stage_retransmits(&mut self, fid: u16, now: u64) {
        loop {
            let Some(f) = self.flow_mut(fid) else { return };
            let Some(&csn) = f.retx.front() else { return };
            let paths = Arc::clone(&f.paths);
            let live = f
                .track
                .get_mut(csn)
                .filter(|t| !t.sacked)
                .map(|t| (t.wr, t.msg, t.offset, t.len, t.imm));
            let Some((Some(h), msg, offset, len, imm)) = live else {
                // Acknowledged meanwhile: nothing to resend.
                f.retx.pop_front();
                if let Some(t) = f.track.get_mut(csn) {
                    t.lost = false;
                }
                continue;
            };
            let m = &f.msgs[(msg - f.front) as usize];
            let (data, lkey, remote) = (m.local + offset, m.lkey, m.remote + offset);
            let Some(p) = self.pick_path(&paths) else {
                return;
            };
            let Some(hdr) = self.hdrs.alloc() else {
                self.stats.hdr_pool_empty += 1;
                return;
            };
            let bytes = RetrHdrRepr {
                remote_addr: remote,
                imm,
            }
            .to_bytes();
            self.hdrs
                .write(hdr.index, 0, &bytes)
                .expect("a fresh slot holds a header");
            let hkey = *self.hdrs.key();
            let e = self.wrs.get_mut(h).expect("tracked WR is in use");
            // The original WR becomes a SEND whose SGL is [header, payload]: one message, no copy.
            e.slot.sges[0] = ibv_sge {
                addr: hdr.addr as u64,
                length: RETR_HDR_LEN as u32,
                lkey: hkey,
            };
            e.slot.sges[1] = ibv_sge {
                addr: data,
                length: len,
                lkey,
            };
            e.slot.point_sges(2);
            e.slot.wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
            let (seq, _) = self.take_slot(p, h, true);
            self.paths[usize::from(p.0)]
                .hdrs
                .push_back((seq, hdr.index));
            let f = self.flow_mut(fid).expect("flow checked above");
            f.retx.pop_front();
            if let Some(t) = f.track.get_mut(csn) {
                t.lost = false;
                t.path = p;
                t.path_seq = seq;
                t.sent_at = now;
            }
        }
    }

    /// Stages the next new chunk of flow `fid`, if the windows, a path and the pool allow.
    fn stage_new_chunk(&mut self, fid: u16, now: u64) -> bool {
        let flow_window = u32::from(self.cfg.flow_window);
        let chunk = u64::from(self.cfg.chunk_size);
        if self.unacked >= self.cfg.engine_window {
            return false;
        }
        let Some(f) = self.flow_mut(fid) else {
            return false;
        };
        if f.track.span() >= flow_window {
            return false;
        }
        let Some(seq) = f.cutting() else { return false };
        let paths = Arc::clone(&f.paths);
        let Some(p) = self.pick_path(&paths) else {
            return false;
        };
        let Some(h) = self.wrs.alloc() else {
            self.stats.wr_pool_empty += 1;
            return false;
        };
        let f = self.flow_mut(fid).expect("flow checked above");
        let i = (seq - f.front) as usize;
        let m = &mut f.msgs[i];
        let offset = m.cut;
        let len = (m.len - offset).min(chunk);
        m.cut += len;
        m.chunks += 1;
        let last = m.cut == m.len;
        let (data, lkey, remote, rkey) = (m.local + offset, m.lkey, m.remote + offset, m.rkey);
        let csn = f.track.next;
        let imm = Imm {
            fid,
            rid: seq as u8,
            csn,
            last,
        }
        .encode()
        .expect("fields are in range");
        let e = self.wrs.get_mut(h).expect("fresh handle");
        e.fid = fid;
        e.csn = csn;
        e.slot.sges[0] = ibv_sge {
            addr: data,
            length: len as u32,
            lkey,
        };
        e.slot.point_sges(1);
        e.slot.wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
        e.slot.wr.__bindgen_anon_1.imm_data = imm.to_be();
        e.slot.wr.wr.rdma.remote_addr = remote;
        e.slot.wr.wr.rdma.rkey = rkey;
        let (path_seq, _) = self.take_slot(p, h, false);
        let f = self.flow_mut(fid).expect("flow checked above");
        f.track.push(Track {
            wr: Some(h),
            msg: seq,
            offset,
            len: len as u32,
            imm,
            path: p,
            path_seq,
            sent_at: now,
            retransmits: 0,
            sacked: false,
            lost: false,
        });
        if f.unacked == 0 {
            f.last_progress = now;
        }
        f.unacked += 1;
        self.unacked += 1;
        self.stats.chunks += 1;
        true
    }

    /// Links each QP's staged WRs into a chain.
    fn link(&mut self, out: &mut Vec<Chain>) {
        for (i, staged) in self.staged.iter_mut().enumerate() {
            let Some(&first) = staged.first() else {
                continue;
            };
            for w in 0..staged.len() {
                let next = staged.get(w + 1).copied();
                let next_ptr = next.map_or(std::ptr::null_mut(), |h| {
                    self.wrs
                        .as_ptr(h)
                        .expect("staged handle in use")
                        .cast::<ibv_send_wr>()
                });
                let e = self.wrs.get_mut(staged[w]).expect("staged handle in use");
                e.slot.wr.next = next_ptr;
                e.next = next;
            }
            let head = self
                .wrs
                .as_ptr(first)
                .expect("staged handle in use")
                .cast::<ibv_send_wr>();
            out.push(Chain {
                path: PathId(i as u8),
                head,
                len: staged.len() as u32,
                first,
            });
            self.stats.chains += 1;
            staged.clear();
        }
    }

    /// A send completion (`success` false for an error or flush). Frees the send-queue slots
    /// it covers and the retransmission headers among them; an error marks its QP failed and
    /// the chunks on it lost.
    pub fn on_send_completion(&mut self, wr_id: u64, success: bool) {
        let (_, p, seq) = split_wr_id(wr_id);
        let Some(path) = self.paths.get_mut(usize::from(p.0)) else {
            return;
        };
        path.complete(seq, &mut self.freed_hdrs);
        for slot in self.freed_hdrs.drain(..) {
            let _ = self.hdrs.free(slot);
        }
        if !success && !path.failed {
            path.failed = true;
            self.events.push_back(Event::PathFailed { path: p });
            self.path_failed(p);
        }
    }

    fn path_failed(&mut self, p: PathId) {
        let fids: Vec<u16> = self.order.clone();
        for fid in fids {
            let Some(f) = self.flow_mut(fid) else {
                continue;
            };
            if !f.paths.contains(&p) {
                continue;
            }
            let mut lost = Vec::new();
            for (csn, t) in f.track.iter_mut() {
                if t.path == p && !t.sacked && !t.lost {
                    t.lost = true;
                    lost.push(csn);
                }
            }
            f.retx.extend(lost);
            let flow_paths = Arc::clone(&f.paths);
            let dead = flow_paths
                .iter()
                .all(|q| self.paths[usize::from(q.0)].failed);
            if dead {
                self.fail_flow(fid, TxError::NoPath(fid), true);
            }
        }
    }

    /// An ACK from the peer: frees what it acknowledges (cumulatively and selectively),
    /// completes messages, samples the RTT, and marks lost what it proves lost.
    pub fn on_ack(&mut self, now: u64, ack: &AckRepr) {
        self.stats.acks += 1;
        let fid = ack.fid;
        let Some(f) = live_flow(&mut self.flows, fid) else {
            self.stats.bad_acks += 1;
            return;
        };
        let ahead = ack.cum.wrapping_sub(f.track.acked) as i16;
        if ahead < 0 {
            self.stats.stale_acks += 1;
            return;
        }
        // Nothing can acknowledge a chunk that was never sent.
        if ahead as u32 > f.track.span() {
            self.stats.bad_acks += 1;
            return;
        }
        let cum = ack.cum_csn();
        // Each chunk this ACK acknowledges for the first time: its WR goes back to the pool,
        // its path and message learn of it, and it may give an RTT sample.
        let (mut freed, mut rtt, mut progress) = (0u32, None, false);
        let mut acknowledge = |f: &mut Flow, csn: u16, t: &Track| {
            if let Some(h) = t.wr {
                let _ = self.wrs.free(h);
            }
            f.note_delivered(t.path, t.path_seq);
            // Karn: only a chunk sent once gives an RTT sample.
            if csn == ack.echo && t.retransmits == 0 {
                rtt = Some((t.path, now.saturating_sub(t.sent_at)));
            }
            if let Some(m) = f.msgs.get_mut((t.msg - f.front) as usize) {
                m.acked += 1;
            }
            freed += 1;
        };
        while csn_diff(cum, f.track.base) > 0 {
            let Some((csn, t)) = f.track.pop_base() else {
                break;
            };
            progress = true;
            if !t.sacked {
                acknowledge(f, csn, &t);
            }
        }
        for i in 0..SACK_BITS {
            if !ack.sacked(i) {
                continue;
            }
            let csn = csn_add(cum, 1 + i as u32);
            if csn_diff(csn, f.track.next) >= 0 {
                break;
            }
            if let Some(t) = f.track.get_mut(csn).filter(|t| !t.sacked) {
                t.sacked = true;
                let before = *t;
                t.wr = None;
                acknowledge(f, csn, &before);
                progress = true;
            }
        }
        f.unacked -= freed;
        self.unacked -= freed;
        if progress {
            f.backoff = 0;
            f.last_progress = now;
        }
        // Loss: a QP delivers in order, so a chunk is lost once a chunk sent after it on the
        // same QP was delivered. Chunks on different QPs overtaking each other prove nothing.
        let mut lost = std::mem::take(&mut self.lost);
        lost.clear();
        let Flow {
            track, delivered, ..
        } = f;
        for (csn, t) in track.iter_mut() {
            if t.sacked || t.lost {
                continue;
            }
            let seen = delivered
                .iter()
                .find(|(p, _)| *p == t.path)
                .map(|&(_, s)| s);
            if seen.is_some_and(|s| s > t.path_seq) {
                t.lost = true;
                lost.push(csn);
            }
        }
        if let Some((p, sample)) = rtt {
            self.paths[usize::from(p.0)].rtt.sample(sample);
        }
        self.stats.fast_retransmits += lost.len() as u64;
        self.queue_retransmits(fid, &lost);
        self.lost = lost;
        self.complete_messages(fid);
    }

    /// Queues `csns` of flow `fid` for retransmission, failing the flow if one has been
    /// retransmitted too often.
    fn queue_retransmits(&mut self, fid: u16, csns: &[u16]) {
        let max = self.cfg.max_retransmits;
        let Some(f) = self.flow_mut(fid) else { return };
        let mut over = None;
        for &csn in csns {
            if let Some(t) = f.track.get_mut(csn) {
                t.retransmits += 1;
                if t.retransmits > max {
                    over = Some((csn, t.retransmits));
                }
                f.retx.push_back(csn);
            }
        }
        if let Some((csn, times)) = over {
            self.fail_flow(
                fid,
                TxError::TooManyRetransmits {
                    fid,
                    csn,
                    times: times - 1,
                },
                true,
            );
        }
    }

    fn complete_messages(&mut self, fid: u16) {
        let Some(f) = live_flow(&mut self.flows, fid) else {
            return;
        };
        for (i, m) in f.msgs.iter_mut().enumerate() {
            if !m.done && m.cut == m.len && m.chunks > 0 && m.acked == m.chunks {
                m.done = true;
                let msg = f.front + i as u64;
                self.events.push_back(Event::MessageComplete { fid, msg });
            }
        }
        while f.msgs.front().is_some_and(|m| m.done) {
            f.msgs.pop_front();
            f.front += 1;
        }
    }

    fn fail_flow(&mut self, fid: u16, error: TxError, announce: bool) {
        let Some(f) = self
            .flows
            .get_mut(usize::from(fid))
            .and_then(|f| f.as_mut())
        else {
            return;
        };
        if f.failed {
            return;
        }
        f.failed = true;
        while let Some((_, t)) = f.track.pop_base() {
            if let Some(h) = t.wr {
                let _ = self.wrs.free(h);
            }
        }
        self.unacked -= f.unacked;
        f.unacked = 0;
        f.retx.clear();
        for (i, m) in f.msgs.iter().enumerate() {
            if !m.done {
                let msg = f.front + i as u64;
                self.events.push_back(Event::MessageFailed {
                    fid,
                    msg,
                    error: error.clone(),
                });
            }
        }
        f.front += f.msgs.len() as u64;
        f.msgs.clear();
        if announce {
            self.events.push_back(Event::FlowFailed { fid, error });
        }
    }

    fn rto(&self, f: &Flow, p: PathId) -> u64 {
        let c = &self.cfg;
        let base = self.paths[usize::from(p.0)].rtt.rto(
            c.rto_initial_us * 1000,
            c.rto_min_us * 1000,
            c.rto_max_us * 1000,
        );
        base.saturating_mul(1 << f.backoff.min(20))
            .min(c.rto_max_us * 1000)
    }

    /// When [`handle_timeout`](Self::handle_timeout) must next be called (ns), if ever.
    pub fn poll_timeout(&self) -> Option<u64> {
        let mut next: Option<u64> = None;
        for f in self
            .flows
            .iter()
            .flatten()
            .filter(|f| !f.failed && f.unacked > 0)
        {
            let mut consider = |t: u64| next = Some(next.map_or(t, |n| n.min(t)));
            consider(
                f.last_progress
                    .saturating_add(self.cfg.max_silence_us * 1000),
            );
            // Walking the window: at most 256 chunks, only for flows with chunks in flight.
            let mut track_deadline = None::<u64>;
            let base = f.track.base;
            for i in 0..f.track.span() {
                let csn = csn_add(base, i);
                if let Some(t) = f.track.get(csn).filter(|t| !t.sacked && !t.lost) {
                    let d = t.sent_at.saturating_add(self.rto(f, t.path));
                    track_deadline = Some(track_deadline.map_or(d, |x| x.min(d)));
                }
            }
            if let Some(d) = track_deadline {
                consider(d);
            }
        }
        next
    }

    /// Time passed: chunks whose retransmission timeout expired are queued again (the flow's
    /// timeouts back off exponentially up to the ceiling); a flow silent too long fails.
    pub fn handle_timeout(&mut self, now: u64) {
        let fids: Vec<u16> = self.order.clone();
        for fid in fids {
            let silent_ns = self.cfg.max_silence_us * 1000;
            let Some(f) = self
                .flows
                .get(usize::from(fid))
                .and_then(|f| f.as_ref())
                .filter(|f| !f.failed)
            else {
                continue;
            };
            if f.unacked == 0 {
                continue;
            }
            if now.saturating_sub(f.last_progress) >= silent_ns {
                let silent_us = (now - f.last_progress) / 1000;
                self.fail_flow(fid, TxError::PeerSilent { fid, silent_us }, true);
                continue;
            }
            let mut expired = Vec::new();
            let base = f.track.base;
            for i in 0..f.track.span() {
                let csn = csn_add(base, i);
                if let Some(t) = f.track.get(csn).filter(|t| !t.sacked && !t.lost)
                    && t.sent_at.saturating_add(self.rto(f, t.path)) <= now
                {
                    expired.push(csn);
                }
            }
            if expired.is_empty() {
                continue;
            }
            self.stats.timeouts += 1;
            self.stats.rto_retransmits += expired.len() as u64;
            let f = self.flow_mut(fid).expect("flow checked above");
            for &csn in &expired {
                if let Some(t) = f.track.get_mut(csn) {
                    t.lost = true;
                }
            }
            f.backoff = (f.backoff + 1).min(20);
            self.queue_retransmits(fid, &expired);
        }
    }
}
