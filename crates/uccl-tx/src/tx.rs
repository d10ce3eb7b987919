//! The transmit side: its state, paths and flows (open, close, credit, send), send
//! completions, and the lists of flows that wait for something.

use std::collections::VecDeque;

use bufpool::{Handle, LocalPool, Memory, ObjectPool, RegionPool};
use verbs_safe::sys::ibv_wr_opcode;

use crate::config::TxConfig;
use crate::error::TxError;
use crate::events::{Event, TxStats};
use crate::flow::{Flow, Lane, Msg, Status, open_mut};
use crate::path::{Path, PathId};
use crate::timers::{PROBE, Timers};
use crate::tracking::{NIL, State};
use crate::wire::{MAX_FID, RETR_HDR_LEN};
use crate::wr::{Kind, WrEx, WrId};

/// The retransmission header slots, over whatever memory the caller registered.
pub(crate) type HdrPool = RegionPool<u32, LocalPool, Box<dyn Memory + Send>>;

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

/// A snapshot of one flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct FlowInfo {
    /// The receive window granted, in chunks in flight.
    pub credit: u16,
    /// Chunks in flight: posted, neither acknowledged nor declared lost.
    pub inflight: u16,
    /// The congestion window, in chunks, which bounds `inflight` with a target delay (see
    /// [`TxConfig::target_delay_us`]); `u16::MAX` without one.
    pub window: u16,
    /// Chunks sent and not yet acknowledged cumulatively (the SACK window in use).
    pub span: u32,
    /// Messages not yet reported complete or failed.
    pub messages: usize,
    /// The flow failed or was closed (it is draining its WRs).
    pub failed: bool,
}

/// The largest RTT sample [`Tx::rtt_samples`] tells apart, in ns (a minute).
pub const RTT_RANGE_NS: u64 = 60_000_000_000;

/// The transmit side of an engine: sans-IO. It never calls a verb and never reads a clock;
/// the caller feeds it time, ACKs and send completions, and posts the chains it hands out.
/// See the [crate documentation](crate) for the protocol.
pub struct Tx {
    pub(crate) cfg: TxConfig,
    pub(crate) wrs: ObjectPool<WrEx>,
    pub(crate) hdrs: HdrPool,
    pub(crate) paths: Vec<Path>,
    pub(crate) flows: Vec<Option<Flow>>,
    /// Generations handed to flows so far.
    epochs: u32,
    /// Flows that may have something to send, served round-robin: (fid, generation).
    pub(crate) active: VecDeque<(u16, u32)>,
    /// Flows with new chunks waiting for the engine window.
    pub(crate) engine_waiters: VecDeque<u16>,
    pub(crate) timers: Timers,
    pub(crate) events: VecDeque<Event>,
    /// Chunks of all flows sent and not acknowledged (the engine window in use).
    pub(crate) unacked: u32,
    pub(crate) rng: u64,
    /// Chunks of a flow per path choice ([`TxConfig::burst_chunks`], worked out once).
    pub(crate) burst: u32,
    /// Paths with WRs staged by the current `poll_transmit`, in staging order.
    pub(crate) staged_paths: Vec<u16>,
    /// Paths that owe a signaled WR.
    pub(crate) owing: Vec<u16>,
    /// Lanes given a delivery mark by the ACK being processed.
    pub(crate) marks: Vec<u16>,
    /// Paths in back-off that the ACK being processed left with nothing in flight, whose
    /// waiters it wakes once its chunks are acknowledged.
    pub(crate) emptied: Vec<u16>,
    /// The time of the current `poll_transmit`.
    pub(crate) now: u64,
    /// Calls of `poll_transmit` so far (wrapping): a flow's burst lasts one call at most.
    pub(crate) calls: u32,
    pub(crate) stats: TxStats,
    /// Inner-loop steps taken (the cost test counts them).
    #[cfg(test)]
    pub(crate) work: u64,
    /// Flows paced below one chunk, by their next send time.
    pub(crate) pacer: crate::wheel::Wheel,
    /// Scratch: the paced flows due in one `handle_timeout` (its room reused).
    pub(crate) paced_due: Vec<(u64, u16)>,
    /// Every RTT sample (ns, the receiver's hold time out), for [`Tx::rtt_samples`].
    pub(crate) rtts: hdrhistogram::Histogram<u64>,
}

impl std::fmt::Debug for Tx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tx")
            .field("paths", &self.paths.len())
            .field("active", &self.active.len())
            .field("unacked", &self.unacked)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Tx {
    /// A transmit side with `cfg`, retransmission headers taken from `hdrs` (slots of at least
    /// [`RETR_HDR_LEN`] bytes in a region registered with lkey `*hdrs.key()`: a bufpool
    /// [`Region`](bufpool::Region), or registered memory through [`bufpool::Memory`]).
    pub fn new<M: Memory + Send + 'static>(
        cfg: TxConfig,
        hdrs: RegionPool<u32, LocalPool, M>,
    ) -> Result<Tx, TxError> {
        let hdrs = hdrs.boxed();
        cfg.validate()?;
        if hdrs.slot_size() < RETR_HDR_LEN {
            return Err(TxError::Config {
                field: "hdrs.slot_size",
                value: hdrs.slot_size() as u64,
                reason: "must hold a 16-byte retransmission header",
            });
        }
        let wrs = ObjectPool::new(cfg.wr_pool, |_, e: &mut WrEx| {
            e.slot.point_sges(1);
            e.slot.wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
        })?;
        Ok(Tx {
            rng: cfg.seed | 1,
            burst: cfg.burst_chunks(),
            cfg,
            wrs,
            hdrs,
            paths: Vec::new(),
            flows: Vec::new(),
            epochs: 0,
            active: VecDeque::new(),
            engine_waiters: VecDeque::new(),
            timers: Timers::default(),
            events: VecDeque::new(),
            unacked: 0,
            staged_paths: Vec::new(),
            owing: Vec::new(),
            marks: Vec::new(),
            emptied: Vec::new(),
            now: 0,
            calls: 0,
            stats: TxStats::default(),
            pacer: crate::wheel::Wheel::default(),
            paced_due: Vec::new(),
            rtts: hdrhistogram::Histogram::new_with_bounds(1, RTT_RANGE_NS, 2)
                .expect("valid bounds"),
            #[cfg(test)]
            work: 0,
        })
    }

    /// Adds a QP with a send queue of `sq_depth` WRs; WRs for it carry the returned path.
    pub fn add_path(&mut self, sq_depth: u32) -> Result<PathId, TxError> {
        if self.paths.len() > usize::from(u16::MAX) || sq_depth == 0 || sq_depth > 1 << 20 {
            return Err(TxError::Config {
                field: "paths",
                value: self.paths.len() as u64,
                reason: "at most 65536 paths, each with a send queue of 1..=2^20 WRs",
            });
        }
        self.paths.push(Path::new(
            sq_depth,
            self.cfg.first_wr_seq,
            self.spare(sq_depth),
        ));
        Ok(PathId((self.paths.len() - 1) as u16))
    }

    /// Makes `path` new for another QP with a send queue of `sq_depth` WRs: its WR sequence,
    /// RTT estimate, back-off and failure start over. Only a path that no flow uses and that
    /// has no WR outstanding (every completion fed back, as after a flow closed and drained)
    /// can be reused; so a long-lived engine recycles the paths of the connections that went
    /// instead of adding new ones.
    pub fn reuse_path(&mut self, path: PathId, sq_depth: u32) -> Result<(), TxError> {
        let busy = |reason| TxError::PathBusy {
            path: path.0,
            reason,
        };
        if sq_depth == 0 || sq_depth > 1 << 20 {
            return Err(busy("a send queue must hold 1..=2^20 WRs"));
        }
        let (first, spare) = (self.cfg.first_wr_seq, self.spare(sq_depth));
        let p = self
            .paths
            .get_mut(usize::from(path.0))
            .ok_or(busy("no such path"))?;
        if !p.users.is_empty() {
            return Err(busy("a flow still uses it"));
        }
        if !p.is_idle() {
            return Err(busy("WRs posted on it have not completed"));
        }
        *p = Path::new(sq_depth, first, spare);
        Ok(())
    }

    /// Opens flow `fid` over `paths` (the QPs connected to the flow's peer, in the order both
    /// ends agreed on: an ACK names a path by its index in this list) with an initial receive
    /// window of `credit` chunks in flight (the grant of the handshake; later ones come in
    /// ACKs or through [`set_credit`](Self::set_credit)).
    pub fn open_flow(&mut self, fid: u16, paths: &[PathId], credit: u16) -> Result<(), TxError> {
        self.open_flow_to(fid, fid, paths, credit)
    }

    /// Like [`open_flow`](Self::open_flow), for a flow the receiver knows as `wire_fid`: the
    /// id its chunks' immediates carry (two ends number their flows independently; ACKs still
    /// name the flow by `fid`).
    pub fn open_flow_to(
        &mut self,
        fid: u16,
        wire_fid: u16,
        paths: &[PathId],
        credit: u16,
    ) -> Result<(), TxError> {
        let bad = |reason| Err(TxError::Paths { fid, reason });
        if wire_fid > MAX_FID {
            return Err(TxError::Config {
                field: "wire_fid",
                value: wire_fid.into(),
                reason: "flow ids are 12 bits",
            });
        }
        if fid > MAX_FID {
            return Err(TxError::Config {
                field: "fid",
                value: fid.into(),
                reason: "flow ids are 12 bits",
            });
        }
        if paths.is_empty() || paths.len() >= usize::from(PROBE) {
            return bad("1..32767 paths");
        }
        if paths.iter().any(|p| usize::from(p.0) >= self.paths.len()) {
            return bad("unknown path");
        }
        let mut sorted = paths.to_vec();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            return bad("a path listed twice");
        }
        if paths.iter().all(|p| self.paths[usize::from(p.0)].failed) {
            return bad("every path failed");
        }
        let i = usize::from(fid);
        if self.flows.len() <= i {
            self.flows.resize_with(i + 1, || None);
        }
        match &self.flows[i] {
            Some(f) if f.status == Status::Closed => return Err(TxError::Draining(fid)),
            Some(_) => return Err(TxError::FlowExists(fid)),
            None => {}
        }
        let mut lanes = Vec::with_capacity(paths.len());
        let mut live = Vec::with_capacity(paths.len());
        for (l, &p) in paths.iter().enumerate() {
            let path = &mut self.paths[usize::from(p.0)];
            if !path.failed {
                live.push(l as u16);
            }
            path.users.push((fid, l as u16));
            lanes.push(Lane {
                path: p,
                head: NIL,
                tail: NIL,
                armed: None,
                probe: None,
                mark: None,
                asked: None,
                user: (path.users.len() - 1) as u32,
            });
        }
        self.epochs = self.epochs.wrapping_add(1);
        let mut f = Flow::new(
            self.epochs,
            lanes.into(),
            live,
            self.cfg.flow_window,
            credit,
        );
        f.wire_fid = wire_fid;
        self.flows[i] = Some(f);
        Ok(())
    }

    /// Sets the receive window of flow `fid` (chunks in flight; 0: send nothing).
    pub fn set_credit(&mut self, fid: u16, window: u16) -> Result<(), TxError> {
        let f = self.open_flow_mut(fid).ok_or(TxError::NoFlow(fid))?;
        f.credit = window;
        self.activate(fid);
        Ok(())
    }

    /// Closes flow `fid`: its credit and engine-window share return at once; its pending
    /// messages fail with [`TxError::Closed`], each reported once no WR naming it is
    /// outstanding. Its WRs already posted stay in use (in [`wrs_in_use`](Self::wrs_in_use)
    /// and [`hdrs_in_use`](Self::hdrs_in_use)) until the caller feeds back the completions
    /// that cover them, as for any WR; then the id can be opened again
    /// ([`TxError::Draining`] before).
    pub fn close_flow(&mut self, fid: u16) -> Result<(), TxError> {
        let status = self.flow(fid).map(|f| f.status);
        match status {
            None | Some(Status::Closed) => return Err(TxError::NoFlow(fid)),
            Some(Status::Open) => self.fail_flow(fid, TxError::Closed(fid), false),
            Some(Status::Failed) => {}
        }
        let f = self.flows[usize::from(fid)].as_mut().expect("checked");
        f.status = Status::Closed;
        for l in 0..f.lanes.len() {
            let f = self.flows[usize::from(fid)].as_ref().expect("checked");
            let (p, at) = (f.lanes[l].path, f.lanes[l].user as usize);
            let users = &mut self.paths[usize::from(p.0)].users;
            users.swap_remove(at);
            // The entry moved into `at` belongs to another flow (a flow lists a path once).
            if let Some(&(mf, ml)) = users.get(at)
                && let Some(m) = self.flows[usize::from(mf)].as_mut()
            {
                m.lanes[usize::from(ml)].user = at as u32;
            }
        }
        self.drop_if_drained(fid);
        Ok(())
    }

    /// Queues a message on flow `fid`; returns its id (the flow's message sequence number).
    pub fn send(&mut self, fid: u16, m: Message) -> Result<u64, TxError> {
        self.queue(fid, m, None)
    }

    /// Like [`send`](Self::send), with `rid` as the request id in its chunks' immediates (the
    /// receiver's way to match the message with what it expects; `send` uses the message id's
    /// low 8 bits).
    pub fn send_as(&mut self, fid: u16, m: Message, rid: u8) -> Result<u64, TxError> {
        self.queue(fid, m, Some(rid))
    }

    fn queue(&mut self, fid: u16, m: Message, rid: Option<u8>) -> Result<u64, TxError> {
        match self.flow(fid).map(|f| f.status) {
            Some(Status::Open) => {}
            Some(Status::Failed) => return Err(TxError::FlowFailed(fid)),
            None | Some(Status::Closed) => return Err(TxError::NoFlow(fid)),
        }
        if m.local_addr.checked_add(m.len).is_none() || m.remote_addr.checked_add(m.len).is_none() {
            return Err(TxError::BadMessage {
                len: m.len,
                local: m.local_addr,
                remote: m.remote_addr,
            });
        }
        let f = self.open_flow_mut(fid).expect("checked");
        let mut msg = Msg::new(m.local_addr, m.lkey, m.len, m.remote_addr, m.rkey);
        msg.rid = rid;
        let id = f.msgs.push(msg);
        self.activate(fid);
        Ok(id)
    }

    /// Whether message `msg` of flow `fid` has started: a chunk of it was cut (handed out to
    /// be posted). `None` for a message this flow does not hold (reported already, or never).
    pub fn started(&self, fid: u16, msg: u64) -> Option<bool> {
        let m = self.flow(fid)?.msgs.get(msg)?;
        Some(m.chunks > 0 || m.failed)
    }

    /// Cancels message `msg` of flow `fid` if none of its chunks went out yet: it never will,
    /// and it is reported as failed with [`TxError::Cancelled`] (the messages after it go out
    /// as if it had never been queued: the receiver sees nothing of it). Returns whether it
    /// was cancelled (false once it started, or for a message this flow does not hold).
    pub fn cancel(&mut self, fid: u16, msg: u64) -> bool {
        let Some(f) = crate::flow::open_mut(&mut self.flows, fid) else {
            return false;
        };
        if !f.msgs.may_cancel(msg) {
            return false;
        }
        f.msgs.cancel(msg);
        let error = TxError::Cancelled { fid, msg };
        f.msgs.settle(msg, fid, Some(&error), &mut self.events);
        true
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Counters.
    pub fn stats(&self) -> TxStats {
        self.stats
    }

    /// WR extensions handed out: staged, or posted and not yet covered by a completion.
    pub fn wrs_in_use(&self) -> usize {
        self.wrs.len()
    }

    /// Retransmission header slots in use (their WRs not yet covered by a completion).
    pub fn hdrs_in_use(&self) -> usize {
        self.hdrs.len()
    }

    /// Free send-queue slots of `path` (with NIC probes on, less the one kept for a probe).
    pub fn path_room(&self, path: PathId) -> u32 {
        self.paths.get(usize::from(path.0)).map_or(0, Path::room)
    }

    /// Whether `path` exists and holds nothing: every WR posted on it covered by a completion
    /// fed back, nothing staged, no slot reserved (as [`reuse_path`](Self::reuse_path) wants).
    pub fn path_is_idle(&self, path: PathId) -> bool {
        self.paths
            .get(usize::from(path.0))
            .is_some_and(Path::is_idle)
    }

    /// Takes `n` send-queue slots of `path` for WRs the caller posts itself (an RDMA READ, say):
    /// the transmit side leaves them free until [`unreserve`](Self::unreserve). False (nothing
    /// taken) if the path has fewer free slots, or failed.
    pub fn reserve(&mut self, path: PathId, n: u32) -> bool {
        match self.paths.get_mut(usize::from(path.0)) {
            Some(p) if !p.failed && p.room() >= n => {
                p.reserved += n;
                true
            }
            _ => false,
        }
    }

    /// Gives back `n` slots of `path` taken with [`reserve`](Self::reserve) (their WRs
    /// completed); flows waiting for room on it are woken.
    pub fn unreserve(&mut self, path: PathId, n: u32) {
        let p = usize::from(path.0);
        if let Some(q) = self.paths.get_mut(p) {
            q.reserved = q.reserved.saturating_sub(n);
            self.path_changed(p);
        }
    }

    /// The smoothed RTT of `path` in ns, once there was a sample.
    pub fn path_srtt(&self, path: PathId) -> Option<u64> {
        self.paths
            .get(usize::from(path.0))
            .and_then(|p| p.rtt.srtt())
    }

    /// Chunks of all flows sent and not yet acknowledged.
    pub fn unacked(&self) -> u32 {
        self.unacked
    }

    /// Where chunk `csn` of flow `fid` goes, while it is tracked (sent, not yet
    /// acknowledged): the remote address it is written to and the rkey it names.
    pub fn chunk_target(&self, fid: u16, csn: u16) -> Option<(u64, u32)> {
        let f = self.flow(fid)?;
        let t = f.track.get(csn)?;
        let m = f.msgs.get(t.msg)?;
        Some((m.remote.checked_add(t.offset)?, m.rkey))
    }

    /// Flow `fid`, if it is open (or failed, or closed and still draining).
    pub fn flow_info(&self, fid: u16) -> Option<FlowInfo> {
        self.flow(fid).map(|f| FlowInfo {
            credit: f.credit,
            inflight: f.inflight,
            window: if self.cfg.target_delay_us > 0 {
                f.cc.chunks()
            } else {
                u16::MAX
            },
            span: f.track.span(),
            messages: f.msgs.len(),
            failed: f.status != Status::Open,
        })
    }

    /// A send completion (`success` false for an error or flush): every WR of its path up to
    /// it is done, their WR extensions and header slots return to their pools, and messages
    /// waiting only for them are reported. An error fails the path (as
    /// [`fail_path`](Self::fail_path)).
    pub fn on_send_completion(&mut self, wr_id: u64, success: bool) {
        let id = WrId::from_raw(wr_id);
        let p = usize::from(id.path.0);
        let Some(path) = self.paths.get(p) else {
            self.stats.bad_completions += 1;
            return;
        };
        let seq = path
            .decode(id.seq)
            .filter(|&s| path.at(s).is_some_and(|h| h.index() == u32::from(id.index)));
        match seq {
            Some(seq) => {
                while self.paths[p].completed <= seq {
                    if let Some(h) = self.paths[p].retire_next() {
                        self.retire(h);
                    }
                }
            }
            None => self.stats.bad_completions += 1,
        }
        if !success {
            self.fail_path(id.path);
        }
        self.path_changed(p);
    }

    /// A WR is done (completed, or never posted): its header slot and extension go back, and
    /// its message learns it.
    pub(crate) fn retire(&mut self, h: Handle) {
        let Ok(e) = self.wrs.get(h) else { return };
        let (kind, fid, epoch, msg, hdr) = (e.kind, e.fid, e.epoch, e.msg, e.hdr);
        let (csn, seq) = (e.csn, WrId::from_raw(e.slot.wr.wr_id).seq);
        if let Some(slot) = hdr {
            let _ = self.hdrs.free(slot);
        }
        let _ = self.wrs.free(h);
        if kind != Kind::Chunk {
            return;
        }
        let Some(f) = self.flows[usize::from(fid)]
            .as_mut()
            .filter(|f| f.epoch == epoch)
        else {
            return;
        };
        // The chunk left the NIC by now (its completion, or a later WR's on its QP, came): if
        // this WR is its latest transmission and still unacknowledged, its RTT and its
        // retransmission timeout count from here, not from the post: time spent in the send
        // queue behind earlier WRs is the sender's, not the network's, and must not look like
        // a loss (a descheduled NIC, or a long chain of large chunks).
        let now = self.now;
        if let Some(t) = f
            .track
            .get_mut(csn)
            .filter(|t| t.state == State::InFlight && t.last.seq == seq)
        {
            t.last.at = t.last.at.max(now);
            if t.sends == 1 {
                t.first.at = t.last.at;
            }
        }
        if let Some(m) = f.msgs.get_mut(msg) {
            m.wrs -= 1;
            // Only a message with no WR outstanding may be done.
            if m.wrs == 0 {
                f.msgs.settle(msg, fid, f.error.as_ref(), &mut self.events);
            }
        }
        if drained(f) {
            self.flows[usize::from(fid)] = None;
        }
    }

    /// Frees the slot of a closed flow once nothing of it is outstanding.
    fn drop_if_drained(&mut self, fid: u16) {
        let slot = &mut self.flows[usize::from(fid)];
        if slot.as_ref().is_some_and(drained) {
            *slot = None;
        }
    }

    pub(crate) fn flow(&self, fid: u16) -> Option<&Flow> {
        self.flows.get(usize::from(fid)).and_then(Option::as_ref)
    }

    pub(crate) fn open_flow_mut(&mut self, fid: u16) -> Option<&mut Flow> {
        open_mut(&mut self.flows, fid)
    }

    /// Puts flow `fid` on the active list (if open and not there yet).
    pub(crate) fn activate(&mut self, fid: u16) {
        if let Some(f) = self.open_flow_mut(fid)
            && !f.active
        {
            f.active = true;
            let epoch = f.epoch;
            self.active.push_back((fid, epoch));
        }
    }

    /// Path `p` may have become usable (room freed, its probe resolved, its back-off reset, or
    /// it failed): wakes as many flows waiting for it as it could now take WRs.
    pub(crate) fn path_changed(&mut self, p: usize) {
        let path = &self.paths[p];
        let n = if path.failed {
            path.waiters.len()
        } else if !path.usable() {
            0
        } else if path.backoff > 0 {
            1
        } else {
            path.room() as usize
        };
        for _ in 0..n {
            let Some(fid) = self.paths[p].waiters.pop_front() else {
                break;
            };
            if let Some(f) = self.open_flow_mut(fid)
                && f.parked == Some(PathId(p as u16))
            {
                f.parked = None;
                self.activate(fid);
            }
        }
    }

    /// Wakes flows waiting for the engine window, as many as it has room for.
    pub(crate) fn engine_changed(&mut self) {
        while self.unacked < self.cfg.engine_window {
            let Some(fid) = self.engine_waiters.pop_front() else {
                break;
            };
            if let Some(f) = self.open_flow_mut(fid)
                && f.waits_engine
            {
                f.waits_engine = false;
                self.activate(fid);
            }
        }
    }

    /// The retransmission timeout of path `p` (ns), backed off.
    pub(crate) fn rto(&self, p: PathId) -> u64 {
        let c = &self.cfg;
        let path = &self.paths[usize::from(p.0)];
        let max = c.rto_max_us * 1000;
        path.rtt
            .rto(c.rto_initial_us * 1000, c.rto_min_us * 1000, max)
            .saturating_mul(1 << path.backoff.min(20))
            .min(max)
            .saturating_add(c.peer_ack_delay_us * 1000)
    }

    /// The tail-loss probe timeout of path `p`: two smoothed RTTs (RFC 8985's PTO), or more
    /// when the RTT varies (`srtt + 4 rttvar`, the RTO's allowance without its floor), plus the
    /// peer's ACK delay, at most `rto` (the path's retransmission timeout, which the caller
    /// has at hand); none before an RTT sample, on a path backed off by a timeout, or without
    /// [`TxConfig::tail_probes`](crate::TxConfig::tail_probes).
    pub(crate) fn pto(&self, p: PathId, rto: u64) -> Option<u64> {
        let path = &self.paths[usize::from(p.0)];
        if !self.cfg.tail_probes || path.backoff > 0 {
            return None;
        }
        let srtt = path.rtt.srtt()?;
        let pto = srtt
            .saturating_mul(2)
            .max(srtt.saturating_add(4 * path.rtt.rttvar()))
            .saturating_add(self.cfg.peer_ack_delay_us * 1000);
        Some(pto.min(rto))
    }
}

/// Whether `f` is closed with nothing of it outstanding (its slot may go).
fn drained(f: &Flow) -> bool {
    f.status == Status::Closed && f.msgs.is_empty()
}

/// The next number of the xorshift generator whose state is `rng` (never 0).
pub(crate) fn xorshift(rng: &mut u64) -> u64 {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    *rng
}
