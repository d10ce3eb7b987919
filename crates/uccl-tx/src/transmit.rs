//! The posting window: [`Transmit`] hands out the staged WRs as chains, one path at a time,
//! and learns from each [`Chain`] how much of it was posted; what was not posted is taken
//! back (the WR extensions return to the pool, the chunks are sent again later).

use bufpool::Handle;
use verbs_safe::WrSlot;
use verbs_safe::sys::{ibv_send_wr, ibv_wr_opcode};

use crate::flow::{IDLE, open_mut};
use crate::path::{PathId, Staged};
use crate::timers::{PROBE, SILENCE};
use crate::tracking::{Cause, NIL, Sent, State};
use crate::tx::Tx;
use crate::wire::{RETR_HDR_LEN, RetrHdr, RetrHdrRepr};
use crate::wr::{Kind, WrEx, WrId};

/// The WRs [`Tx::poll_transmit`] staged, handed out as chains. It borrows the transmit side:
/// nothing else happens to it until every chain is resolved, so a chain's WRs cannot change
/// or be freed while the caller posts them. Dropping it takes back every chain not yet handed
/// out.
///
/// ```text
/// let mut t = tx.poll_transmit(now);
/// while let Some(chain) = t.next_chain() {
///     let (qp, len) = (&qps[usize::from(chain.path().0)], chain.len());
///     // SAFETY: the chain's buffers stay registered until their completions are fed back.
///     match unsafe { qp.post_send_chain(chain.head()) } {
///         Ok(()) => chain.posted(len),
///         Err(verbs_safe::Error::Post { index, .. }) => chain.posted(index as u32),
///         Err(_) => chain.posted(0),
///     }
/// }
/// ```
///
/// The borrow is what keeps the protocol: while a chain is out, nothing else can touch the
/// transmit side (and so nothing can free or rewrite the WRs it points to),
///
/// ```compile_fail,E0499
/// # use bufpool::{Region, RegionPool};
/// # use uccl_tx::{Tx, TxConfig};
/// # let hdrs = RegionPool::new(Region::for_slots(16, 16, 64).unwrap(), 16, 0).unwrap();
/// # let mut tx = Tx::new(TxConfig::default(), hdrs).unwrap();
/// let mut t = tx.poll_transmit(0);
/// let chain = t.next_chain();
/// tx.on_send_completion(0, false); // error: `tx` is borrowed until the chain is resolved
/// drop(chain);
/// ```
///
/// and a chain cannot outlive its `Transmit`:
///
/// ```compile_fail,E0597
/// # use bufpool::{Region, RegionPool};
/// # use uccl_tx::{Tx, TxConfig};
/// # let hdrs = RegionPool::new(Region::for_slots(16, 16, 64).unwrap(), 16, 0).unwrap();
/// # let mut tx = Tx::new(TxConfig::default(), hdrs).unwrap();
/// let chain = {
///     let mut t = tx.poll_transmit(0);
///     t.next_chain() // error: `t` does not live long enough
/// };
/// ```
#[derive(Debug)]
pub struct Transmit<'a> {
    tx: &'a mut Tx,
    /// Index into the staged paths of the path being handed out.
    at: usize,
}

impl<'a> Transmit<'a> {
    pub(crate) fn new(tx: &'a mut Tx) -> Self {
        Transmit { tx, at: 0 }
    }

    /// The next chain: up to `max_chain` WRs for one path, linked through `next`. Report what
    /// was posted with [`Chain::posted`]; a chain dropped unreported was not posted.
    pub fn next_chain(&mut self) -> Option<Chain<'_>> {
        let max = self.tx.cfg.max_chain;
        loop {
            let p = usize::from(*self.tx.staged_paths.get(self.at)?);
            let staged = self.tx.paths[p].staged;
            let Some(first) = staged.head.filter(|_| staged.len > 0) else {
                self.at += 1;
                continue;
            };
            let len = staged.len.min(max);
            let mut h = first;
            for k in 1..=len {
                let next = self.tx.wrs.get(h).expect("staged").next;
                let ptr = match next {
                    Some(n) if k < len => self.tx.wrs.as_ptr(n).expect("staged").cast(),
                    _ => std::ptr::null_mut(),
                };
                self.tx.wrs.get_mut(h).expect("staged").slot.wr.next = ptr;
                if k < len {
                    h = next.expect("counted");
                }
            }
            let rest = self.tx.wrs.get(h).expect("staged").next;
            let s = &mut self.tx.paths[p].staged;
            s.len -= len;
            s.head = rest.filter(|_| s.len > 0);
            return Some(Chain {
                tx: self.tx,
                path: PathId(p as u16),
                first,
                len,
                resolved: false,
            });
        }
    }

    /// WRs not yet handed out.
    pub fn wrs_left(&self) -> u32 {
        self.tx.staged_paths[self.at.min(self.tx.staged_paths.len())..]
            .iter()
            .map(|&p| self.tx.paths[usize::from(p)].staged.len)
            .sum()
    }

    /// Whether every WR was handed out.
    pub fn is_empty(&self) -> bool {
        self.wrs_left() == 0
    }
}

impl Drop for Transmit<'_> {
    fn drop(&mut self) {
        let paths = std::mem::take(&mut self.tx.staged_paths);
        for &p in &paths[self.at.min(paths.len())..] {
            let p = usize::from(p);
            if let Some(first) = self.tx.paths[p].staged.head {
                self.tx.take_back(p, first, 0);
            }
        }
        self.tx.staged_paths = paths;
        self.tx.staged_paths.clear();
    }
}

/// Up to `max_chain` WRs for one path, linked through `next`: post them with one
/// `ibv_post_send` (verbs-safe's `Qp::post_send_chain`) on the QP of [`path`](Self::path),
/// then say how many the provider accepted with [`posted`](Self::posted). A chain dropped
/// without that was not posted: its WRs and chunks are taken back.
#[derive(Debug)]
pub struct Chain<'t> {
    tx: &'t mut Tx,
    path: PathId,
    first: Handle,
    len: u32,
    resolved: bool,
}

impl Chain<'_> {
    /// The path (QP) to post on.
    pub fn path(&self) -> PathId {
        self.path
    }

    /// WRs in the chain (at least 1).
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Never true: a chain has at least one WR.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first WR, what `post_send` takes. It stays valid, and so do the WRs linked from it,
    /// until this chain is resolved ([`posted`](Self::posted) or dropped); the borrow of the
    /// transmit side guarantees nothing changes them meanwhile. Posting it is the caller's
    /// `unsafe`: every buffer it names must stay registered until the WR's completion is fed
    /// back to [`Tx::on_send_completion`].
    pub fn head(&self) -> *mut ibv_send_wr {
        self.tx.wrs.as_ptr(self.first).expect("staged").cast()
    }

    /// The chain's WRs and their SGEs, in order (for inspection).
    pub fn wrs(&self) -> impl Iterator<Item = &WrSlot<2>> + '_ {
        let mut next = Some(self.first);
        (0..self.len).filter_map(move |_| {
            let e = self.tx.wrs.get(next?).ok()?;
            next = e.next;
            Some(&e.slot)
        })
    }

    /// The retransmission header a WR of this chain carries (its first SGE), read back from
    /// the header region: `None` for a WR that is not a retransmission.
    pub fn retransmission_header(&self, wr: &WrSlot<2>) -> Option<RetrHdrRepr> {
        if wr.wr.opcode != ibv_wr_opcode::IBV_WR_SEND || wr.wr.num_sge == 0 {
            return None;
        }
        let hdrs = &self.tx.hdrs;
        let slot = hdrs.slot_of(wr.sges[0].addr as usize).ok()?;
        let mut b = [0u8; RETR_HDR_LEN];
        hdrs.read(slot, 0, &mut b).ok()?;
        Some(RetrHdrRepr::parse(&RetrHdr::new_checked(&b[..]).ok()?))
    }

    /// The provider accepted the first `n` WRs (all of them: [`len`](Self::len); a failed
    /// post: the index of `bad_wr`, as verbs-safe's `Error::Post { index }` reports it). The
    /// rest, and the WRs still to come for this path in this [`Transmit`], are taken back.
    pub fn posted(mut self, n: u32) {
        self.resolve(n);
    }

    /// Posts the chain through `post`, which gets the pool's WR slots and the indices of this
    /// chain's WRs among them, in chain order (what verbs-safe's safe `Qp::post_slots` takes),
    /// and reports what was posted: all on success; on `Error::Post { index }`, the WRs before
    /// `index`; on any other error, none. `order` is a buffer of the caller's, reused to spare
    /// an allocation per chain.
    pub fn post(
        mut self,
        order: &mut Vec<u32>,
        post: impl FnOnce(&mut [WrEx], &[u32]) -> Result<(), verbs_safe::Error>,
    ) -> Result<(), verbs_safe::Error> {
        order.clear();
        let mut h = Some(self.first);
        for _ in 0..self.len {
            let cur = h.expect("counted");
            order.push(cur.index());
            h = self.tx.wrs.get(cur).expect("staged").next;
        }
        let r = post(self.tx.wrs.as_mut_slice(), order);
        let n = match &r {
            Ok(()) => self.len,
            Err(verbs_safe::Error::Post { index, .. }) => *index as u32,
            Err(_) => 0,
        };
        self.resolve(n);
        r
    }

    fn resolve(&mut self, n: u32) {
        if !self.resolved {
            self.resolved = true;
            let p = usize::from(self.path.0);
            self.tx.resolve(p, self.first, self.len, n);
        }
    }
}

impl Drop for Chain<'_> {
    fn drop(&mut self) {
        self.resolve(0);
    }
}

impl Tx {
    /// `n` of the `len` WRs of a chain from `first` on path `p` were posted.
    fn resolve(&mut self, p: usize, first: Handle, len: u32, n: u32) {
        let n = n.min(len);
        if n > 0 {
            self.stats.chains += 1;
        }
        // Every WR of the chain goes on path `p`: its timeouts are the same for all of them.
        let rto = self.rto(PathId(p as u16));
        let timeouts = (rto, self.pto(PathId(p as u16), rto));
        let mut h = Some(first);
        for _ in 0..n {
            h = self.commit(h.expect("counted"), p, timeouts);
        }
        if n < len {
            self.take_back(p, h.expect("counted"), len - n);
        }
    }

    /// WR `h` was posted on path `p`: its chunk is in flight from now on, with the path's
    /// retransmission and probe timeouts `(rto, pto)`. Returns the WR staged after it.
    fn commit(&mut self, h: Handle, p: usize, (rto, pto): (u64, Option<u64>)) -> Option<Handle> {
        let e = self.wrs.get(h).expect("staged");
        let (kind, fid, epoch, lane, csn) = (e.kind, e.fid, e.epoch, e.lane, e.csn);
        let (seq, next) = (WrId::from_raw(e.slot.wr.wr_id).seq, e.next);
        self.stats.wrs += 1;
        if self.cfg.nic_probe_us > 0 {
            self.nic_probe_posted(p);
        }
        if kind == Kind::Signal {
            self.stats.signals += 1;
            return next;
        }
        let (now, silence) = (self.now, self.cfg.max_silence_us * 1000);
        let Some(f) = open_mut(&mut self.flows, fid).filter(|f| f.epoch == epoch) else {
            return next;
        };
        let tail = f.lanes[usize::from(lane)].tail;
        let Some(t) = f.track.get_mut(csn).filter(|t| t.state == State::Staged) else {
            return next;
        };
        let sent = Sent { lane, seq, at: now };
        // A probe is not probed again, nor is a timeout's retransmission (the path is backed
        // off: the timeout, not a probe, paces it): if it is lost too, the timeout follows.
        let probe = t.sends > 0 && matches!(t.cause, Cause::Probe | Cause::Rto);
        if t.sends == 0 {
            t.first = sent;
            self.stats.chunks += 1;
        } else {
            *match t.cause {
                Cause::Rto => &mut self.stats.rto_retransmits,
                Cause::Fast => &mut self.stats.fast_retransmits,
                Cause::Failover => &mut self.stats.failover_retransmits,
                Cause::Probe => &mut self.stats.probe_retransmits,
            } += 1;
        }
        t.moved |= lane != t.first.lane;
        t.last = sent;
        t.sends += 1;
        t.state = State::InFlight;
        (t.prev, t.next) = (tail, NIL);
        f.append(lane, csn);
        if f.last_progress == IDLE {
            f.last_progress = now;
        }
        if f.silence.is_none() {
            f.silence = Some(now + silence);
            self.timers.arm(now + silence, fid, SILENCE);
        }
        debug_assert_eq!(
            f.lanes[usize::from(lane)].path.0 as usize,
            p,
            "a lane's WR on its path"
        );
        // The lane's timers, armed here (the flow is at hand).
        let l = &mut f.lanes[usize::from(lane)];
        self.timers.arm_by(&mut l.armed, now + rto, fid, lane);
        if let Some(pto) = pto.filter(|_| !probe) {
            self.timers
                .arm_by(&mut l.probe, now + pto, fid, lane | PROBE);
        }
        next
    }

    /// Arms the probe timer of `lane` of flow `fid` at `at`, unless it is armed earlier
    /// already (it re-arms itself from the lane's newest transmission when it fires).
    pub(crate) fn arm_probe(&mut self, fid: u16, lane: u16, at: u64) {
        let Some(f) = open_mut(&mut self.flows, fid) else {
            return;
        };
        let l = &mut f.lanes[usize::from(lane)];
        self.timers.arm_by(&mut l.probe, at, fid, lane | PROBE);
    }

    /// Arms the retransmission timer of `lane` of flow `fid` at `at`, unless it is armed
    /// earlier already.
    pub(crate) fn arm_lane(&mut self, fid: u16, lane: u16, at: u64) {
        let Some(f) = open_mut(&mut self.flows, fid) else {
            return;
        };
        let l = &mut f.lanes[usize::from(lane)];
        self.timers.arm_by(&mut l.armed, at, fid, lane);
    }

    /// Takes back `in_chain` WRs from `first` on path `p` and every WR still staged there:
    /// their send-queue slots, WR extensions and header slots return; their chunks wait to be
    /// sent again.
    pub(crate) fn take_back(&mut self, p: usize, first: Handle, in_chain: u32) {
        let path = &mut self.paths[p];
        let total = in_chain + path.staged.len;
        path.staged = Staged::default();
        let from = path.posted - u64::from(total);
        let mut h = Some(first);
        for _ in 0..total {
            let cur = h.expect("counted");
            h = self.wrs.get(cur).expect("staged").next;
            self.undo(p, cur);
        }
        self.paths[p].untake_from(from);
        // A WR posted last and unsignaled has no completion coming: it owes one.
        let path = &self.paths[p];
        let tail = (path.posted > path.completed)
            .then(|| path.at(path.posted - 1))
            .flatten();
        if let Some(last) = tail
            && !self.wrs.get(last).is_ok_and(|e| e.signaled())
            && !path.failed
            && !path.owe_signal
        {
            self.paths[p].owe_signal = true;
            self.owing.push(p as u16);
        }
    }

    /// WR `h` (staged on path `p`) was not posted.
    fn undo(&mut self, p: usize, h: Handle) {
        let e = self.wrs.get(h).expect("staged");
        let (kind, fid, epoch, csn, msg, hdr) = (e.kind, e.fid, e.epoch, e.csn, e.msg, e.hdr);
        self.stats.taken_back += 1;
        if let Some(slot) = hdr {
            let _ = self.hdrs.free(slot);
        }
        let _ = self.wrs.free(h);
        if kind == Kind::Signal {
            // The stall it was to probe may be probed again.
            self.paths[p].probed = None;
            return;
        }
        self.paths[p].inflight -= 1;
        let Some(f) = self.open_flow_mut(fid).filter(|f| f.epoch == epoch) else {
            return;
        };
        if let Some(t) = f.track.get_mut(csn) {
            t.state = State::Queued;
            f.retx.push_back(csn);
            f.inflight -= 1;
        }
        if let Some(m) = f.msgs.get_mut(msg) {
            m.wrs -= 1;
        }
        self.activate(fid);
    }
}
