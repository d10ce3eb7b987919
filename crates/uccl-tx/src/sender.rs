//! The sender: picks the flows that may send (an active list, round-robin), cuts their
//! messages into chunks or takes their chunks to send again, picks a path for each, and stages
//! the WRs per path for [`Transmit`] to hand out as chains.

use verbs_safe::sys::{ibv_send_wr, ibv_sge, ibv_wr_opcode};

use crate::flow::{Flow, open_mut};
use crate::path::{Path, PathId};
use crate::tracking::{Cause, NIL, State, Track};
use crate::transmit::Transmit;
use crate::tx::{Tx, xorshift};
use crate::wire::{Imm, RETR_HDR_LEN, RetrHdrRepr};
use crate::wr::{Kind, WrEx, WrId};

/// What one staging attempt for a flow came to.
enum Outcome {
    /// A WR was staged; the flow goes to the back of the list.
    Staged,
    /// The flow cannot send until something it waits for happens (an ACK, a credit, a loss,
    /// a path or the engine window); it leaves the list and whatever it waits for puts it
    /// back.
    Idle,
    /// A pool ran dry: stop for this call; the flow stays first in line.
    Stop,
    /// The flow is closed, or its id names a later flow: its entry is dropped.
    Gone,
}

/// Why no path can take a WR of a flow now.
enum NoPath {
    /// This path will wake the flow (a completion frees room, or its probe resolves).
    Wait(usize),
    /// The flow has no live path left.
    None,
}

/// What to put in a WR.
enum Send {
    New,
    Again(u16),
}

impl Tx {
    /// Hands out the WRs to post now, as a [`Transmit`] that borrows the transmit side until
    /// every chain it yields is reported posted (or taken back when it drops). Chunks to send
    /// again come before new ones within a flow; flows take turns, one WR each; each path's
    /// WRs are cut into chains of at most `max_chain` (one doorbell each); a path never gets
    /// more WRs than its send queue has room for, and no flow more chunks in flight than its
    /// credit or, with a target delay, its congestion window.
    pub fn poll_transmit(&mut self, now: u64) -> Transmit<'_> {
        self.now = now;
        self.calls = self.calls.wrapping_add(1);
        while let Some((fid, epoch)) = self.active.pop_front() {
            #[cfg(test)]
            {
                self.work += 1;
            }
            // The only flow with something to send takes its next turn at once: the same as
            // going to the back of an empty queue and coming out again, without the queue.
            let outcome = loop {
                let outcome = self.stage_one(fid, epoch);
                if !matches!(outcome, Outcome::Staged) || !self.active.is_empty() {
                    break outcome;
                }
                #[cfg(test)]
                {
                    self.work += 1;
                }
            };
            match outcome {
                Outcome::Staged => self.active.push_back((fid, epoch)),
                Outcome::Idle => {
                    if let Some(f) = self.open_flow_mut(fid) {
                        f.active = false;
                    }
                }
                Outcome::Stop => {
                    self.active.push_front((fid, epoch));
                    break;
                }
                Outcome::Gone => {}
            }
        }
        self.stage_signals();
        // The last WR staged on a path is signaled, so every WR posted has a completion
        // coming after it.
        for i in 0..self.staged_paths.len() {
            let p = usize::from(self.staged_paths[i]);
            if let Some(h) = self.paths[p].staged.tail
                && let Ok(e) = self.wrs.get_mut(h)
            {
                e.set_signaled(true);
            }
        }
        Transmit::new(self)
    }

    /// On each path that owes a signaled WR and got nothing else in this call (whose last WR
    /// would be signaled), stages a zero-length signaled WRITE, if it has room.
    fn stage_signals(&mut self) {
        let mut i = 0;
        while i < self.owing.len() {
            let p = usize::from(self.owing[i]);
            let path = &mut self.paths[p];
            if path.staged.len > 0 {
                path.owe_signal = false;
            }
            if path.failed || !path.owe_signal {
                self.owing.swap_remove(i);
                continue;
            }
            if path.probe_room() == 0 {
                i += 1;
                continue;
            }
            let Some(h) = self.wrs.alloc() else { return };
            let e = self.wrs.get_mut(h).expect("fresh handle");
            e.kind = Kind::Signal;
            e.hdr = None;
            e.slot.point_sges(0);
            e.slot.wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
            e.slot.wr.wr.rdma.remote_addr = 0;
            e.slot.wr.wr.rdma.rkey = 0;
            self.stage_wr(p, h, true);
            self.paths[p].owe_signal = false;
            self.owing.swap_remove(i);
        }
    }

    /// Tries to stage one WR of flow `fid` of generation `epoch`.
    fn stage_one(&mut self, fid: u16, epoch: u32) -> Outcome {
        let (flow_window, engine_window) =
            (u32::from(self.cfg.flow_window), self.cfg.engine_window);
        let unacked = self.unacked;
        let congestion = self.cfg.target_delay_us > 0;
        let (pacing, now) = (congestion && self.cfg.pacing, self.now);
        let Some(f) = open_mut(&mut self.flows, fid).filter(|f| f.epoch == epoch) else {
            return Outcome::Gone;
        };
        // Entries of chunks acknowledged since they were queued are stale.
        while let Some(&csn) = f.retx.front() {
            if f.track.get(csn).is_some_and(|t| t.state == State::Queued) {
                break;
            }
            f.retx.pop_front();
        }
        let span = f.track.span();
        let what = match f.retx.front() {
            Some(&csn) => Send::Again(csn),
            None if f.msgs.to_cut().is_some() && span < flow_window => Send::New,
            None => return Outcome::Idle,
        };
        if f.inflight >= f.credit {
            self.stats.credit_stalls += 1;
            return Outcome::Idle;
        }
        if congestion && f.inflight >= f.cc.chunks() {
            self.stats.window_stalls += 1;
            return Outcome::Idle;
        }
        if pacing && let Some(at) = f.cc.paced_until(now) {
            let arm = f.paced.is_none_or(|p| p != at);
            f.paced = Some(at);
            self.stats.pacing_stalls += 1;
            if arm {
                self.pacer.arm(at, fid);
            }
            return Outcome::Idle;
        }
        // (Staging leaves the window as it is: whether it paces is known now.)
        let paced = pacing && f.cc.paced();
        if matches!(what, Send::New) && unacked >= engine_window {
            if !f.waits_engine {
                f.waits_engine = true;
                self.engine_waiters.push_back(fid);
            }
            return Outcome::Idle;
        }
        // The engine window is shared: a flow takes a new chunk from it only while it holds
        // fewer than are left free (a dynamic threshold, as switches share their buffers), so
        // flows whose peers stop acknowledging hold at most n/(n + 1) of it between n of
        // them, never all of it, and the others go on meanwhile. (One flow alone may hold half.)
        // A flow over its share has that many chunks unacknowledged: the next ACK of them
        // looks again (no wake-up of every such flow at every ACK of another).
        if matches!(what, Send::New) && span >= engine_window - unacked {
            return Outcome::Idle;
        }
        let lane = match self
            .probe_lane(fid, &what)
            .map_or_else(|| self.pick_lane(fid), Ok)
        {
            Ok(lane) => lane,
            Err(NoPath::Wait(p)) => {
                let f = self.open_flow_mut(fid).expect("checked");
                if f.parked != Some(PathId(p as u16)) {
                    f.parked = Some(PathId(p as u16));
                    self.paths[p].waiters.push_back(fid);
                }
                return Outcome::Idle;
            }
            Err(NoPath::None) => return Outcome::Idle,
        };
        let Some(h) = self.wrs.alloc() else {
            self.stats.wr_pool_empty += 1;
            return Outcome::Stop;
        };
        let staged = match what {
            Send::New => self.fill_new(fid, lane, h),
            Send::Again(csn) => self.fill_again(fid, csn, lane, h),
        };
        if !staged {
            let _ = self.wrs.free(h);
            self.stats.hdr_pool_empty += 1;
            return Outcome::Stop;
        }
        // Only a window below one chunk paces (the path's RTT is looked up only then).
        if paced {
            let srtt = self.lane_srtt(fid, lane);
            if let Some(f) = self.open_flow_mut(fid) {
                f.cc.on_send(now, srtt);
            }
        }
        Outcome::Staged
    }

    /// The lane a tail-loss probe goes on (its chunk's latest), if its path can take a WR now.
    fn probe_lane(&self, fid: u16, what: &Send) -> Option<u16> {
        let Send::Again(csn) = *what else {
            return None;
        };
        let f = self.flow(fid)?;
        let t = f.track.get(csn).filter(|t| t.cause == Cause::Probe)?;
        let p = usize::from(f.lanes[usize::from(t.last.lane)].path.0);
        self.paths[p].usable().then_some(t.last.lane)
    }

    /// The lane of the flow's current burst while it lasts and its path can take a WR; else
    /// power of two choices among the flow's live paths that can take a WR now: two at random,
    /// the better ranked (lower smoothed RTT, or the initial RTO without a sample, doubled per
    /// timeout since the path's last delivery; then more room), which starts a burst. Only
    /// when neither can take a WR are the flow's other paths looked at.
    fn pick_lane(&mut self, fid: u16) -> Result<u16, NoPath> {
        let Tx {
            flows,
            paths,
            rng,
            cfg,
            calls,
            burst,
            ..
        } = self;
        let f = open_mut(flows, fid).expect("caller checked");
        let (lane, left, call) = f.burst;
        if left > 0 && call == *calls {
            let p = f.path_of(lane);
            if paths[p].usable() {
                f.burst.1 = left - 1;
                return Ok(lane);
            }
        }
        let lane = choose_lane(f, paths, rng, cfg.rto_initial_us * 1000)?;
        f.burst = (lane, *burst - 1, *calls);
        Ok(lane)
    }

    /// Cuts the next chunk of flow `fid` into WR `h` on `lane`.
    #[inline(always)]
    fn fill_new(&mut self, fid: u16, lane: u16, h: bufpool::Handle) -> bool {
        let chunk = u64::from(self.cfg.chunk_size);
        let f = self.open_flow_mut(fid).expect("checked");
        let (id, m) = f.msgs.cutting_mut().expect("checked");
        let offset = m.cut;
        let len = (m.len - offset).min(chunk);
        m.cut += len;
        m.chunks += 1;
        m.wrs += 1;
        let last = m.cut == m.len;
        let (local, lkey, remote, rkey) = (m.local, m.lkey, m.remote, m.rkey);
        let rid = m.rid.unwrap_or(id as u8);
        if last {
            f.msgs.cut_done();
        }
        let csn = f.track.next;
        let imm = Imm {
            fid: f.wire_fid,
            rid,
            csn,
            last,
        }
        .encode()
        .expect("fields are in range");
        f.track.push(Track {
            msg: id,
            offset,
            len: len as u32,
            imm,
            state: State::Staged,
            prev: NIL,
            next: NIL,
            ..Track::default()
        });
        f.inflight += 1;
        let (epoch, p) = (f.epoch, f.path_of(lane));
        self.unacked += 1;
        let e = self.stage_chunk(p, h, false);
        (e.kind, e.fid, e.epoch, e.lane, e.csn, e.msg, e.hdr) =
            (Kind::Chunk, fid, epoch, lane, csn, id, None);
        write_imm(&mut e.slot.wr, imm, remote + offset, rkey);
        e.slot.sges[0] = ibv_sge {
            addr: local + offset,
            length: len as u32,
            lkey,
        };
        e.slot.point_sges(usize::from(len > 0));
        true
    }

    /// Puts chunk `csn` of flow `fid` into WR `h` on `lane` again: as its original WRITE if it
    /// was never posted, else as a SEND of `[retransmission header, payload]`. False if no
    /// header slot is free.
    fn fill_again(&mut self, fid: u16, csn: u16, lane: u16, h: bufpool::Handle) -> bool {
        let f = self.open_flow_mut(fid).expect("checked");
        let t = *f.track.get(csn).expect("queued chunk is tracked");
        let m = f.msgs.get_mut(t.msg).expect("its message waits for it");
        let (data, lkey, remote, rkey) = (m.local + t.offset, m.lkey, m.remote + t.offset, m.rkey);
        let hdr = if t.sends == 0 {
            None
        } else {
            let Some(slot) = self.hdrs.alloc() else {
                return false;
            };
            let bytes = RetrHdrRepr {
                remote_addr: remote,
                imm: t.imm,
                rkey,
            }
            .to_bytes();
            self.hdrs
                .write(slot.index, 0, &bytes)
                .expect("a fresh slot holds a header");
            Some(slot)
        };
        let f = self.open_flow_mut(fid).expect("checked");
        f.retx.pop_front();
        f.inflight += 1;
        f.msgs.get_mut(t.msg).expect("checked").wrs += 1;
        f.track.get_mut(csn).expect("checked").state = State::Staged;
        let (epoch, p) = (f.epoch, f.path_of(lane));
        let hkey = *self.hdrs.key();
        let e = self.wrs.get_mut(h).expect("fresh handle");
        (e.kind, e.fid, e.epoch, e.lane, e.csn, e.msg) =
            (Kind::Chunk, fid, epoch, lane, csn, t.msg);
        let payload = ibv_sge {
            addr: data,
            length: t.len,
            lkey,
        };
        match hdr {
            None => {
                e.hdr = None;
                write_imm(&mut e.slot.wr, t.imm, remote, rkey);
                e.slot.sges[0] = payload;
                // An empty message carries no SGE (an empty one reads as 2 GiB on some NICs).
                e.slot.point_sges(usize::from(t.len > 0));
            }
            Some(slot) => {
                // A SEND whose SGL is [header, payload]: one message, no copy.
                e.hdr = Some(slot.index);
                e.slot.wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
                e.slot.sges[0] = ibv_sge {
                    addr: slot.addr as u64,
                    length: RETR_HDR_LEN as u32,
                    lkey: hkey,
                };
                e.slot.sges[1] = payload;
                e.slot.point_sges(1 + usize::from(t.len > 0));
            }
        }
        self.stage_chunk(p, h, t.sends > 0);
        true
    }

    /// Stages chunk WR `h` on path `p` (its lane's): see [`stage_wr`](Self::stage_wr).
    #[inline(always)]
    fn stage_chunk(&mut self, p: usize, h: bufpool::Handle, signal: bool) -> &mut WrEx {
        self.paths[p].inflight += 1;
        self.stage_wr(p, h, signal)
    }

    /// Gives WR `h` the next slot of path `p` and appends it to the path's staged WRs; returns
    /// it, with its id, link and signaled flag set, for the rest to be filled in.
    #[inline(always)]
    fn stage_wr(&mut self, p: usize, h: bufpool::Handle, signal: bool) -> &mut WrEx {
        let every = u64::from(self.cfg.signal_every);
        let path = &mut self.paths[p];
        let seq = path.take(h);
        let tail = path.staged.tail.replace(h).filter(|_| path.staged.len > 0);
        if path.staged.len == 0 {
            path.staged.head = Some(h);
            self.staged_paths.push(p as u16);
        }
        path.staged.len += 1;
        if let Some(t) = tail {
            self.wrs.get_mut(t).expect("staged").next = Some(h);
        }
        let e = self.wrs.get_mut(h).expect("fresh handle");
        e.next = None;
        e.slot.wr.wr_id = WrId {
            index: h.index() as u16,
            path: PathId(p as u16),
            seq: seq as u32,
        }
        .to_raw();
        e.set_signaled(signal || below(seq + 1, every) == 0);
        e
    }
}

/// Power of two choices (see [`Tx::pick_lane`]) among the live lanes of `f`, drawing from
/// `rng`; `init` is the initial RTO, a path's rank before it has an RTT sample.
fn choose_lane(f: &Flow, paths: &[Path], rng: &mut u64, init: u64) -> Result<u16, NoPath> {
    let n = f.live.len();
    if n == 0 {
        return Err(NoPath::None);
    }
    let (i, j) = if n <= 2 {
        (0, n - 1)
    } else {
        let i = below(xorshift(rng), n as u64) as usize;
        let j = below(xorshift(rng), n as u64 - 1) as usize;
        (i, if j >= i { j + 1 } else { j })
    };
    let path_of = |k: usize| usize::from(f.lanes[usize::from(f.live[k])].path.0);
    let ok = |k: usize| paths[path_of(k)].usable();
    let rank = |k: usize| paths[path_of(k)].rank(init);
    let best = match (ok(i), ok(j)) {
        (true, true) => Some(if rank(j) < rank(i) { j } else { i }),
        (true, false) => Some(i),
        (false, true) => Some(j),
        (false, false) => (0..n).filter(|&k| ok(k)).min_by_key(|&k| rank(k)),
    };
    if let Some(k) = best {
        return Ok(f.live[k]);
    }
    // A full path has a completion coming; a suspect one the outcome of its probe.
    (0..n)
        .map(path_of)
        .find(|&p| paths[p].room() == 0)
        .or_else(|| (0..n).map(path_of).find(|&p| paths[p].inflight > 0))
        .map_or(Err(NoPath::None), |p| Err(NoPath::Wait(p)))
}

/// `x % n` (`n` > 0), without a division when `n` is a power of two.
#[inline(always)]
pub(crate) fn below(x: u64, n: u64) -> u64 {
    if n.is_power_of_two() {
        x & (n - 1)
    } else {
        x % n
    }
}

/// Makes `wr` an RDMA WRITE_WITH_IMM of `imm` to `remote`.
fn write_imm(wr: &mut ibv_send_wr, imm: u32, remote: u64, rkey: u32) {
    wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.__bindgen_anon_1.imm_data = imm.to_be();
    wr.wr.rdma.remote_addr = remote;
    wr.wr.rdma.rkey = rkey;
}

#[cfg(test)]
mod tests {
    use super::below;

    #[test]
    fn below_is_the_remainder_with_or_without_a_division() {
        let xs = [0, 1, 2, 7, 8, 63, 64, 1 << 40, u64::MAX - 1, u64::MAX];
        for n in (1..=70).chain([1 << 20, (1 << 20) + 1, u64::MAX]) {
            for x in xs {
                assert_eq!(below(x, n), x % n, "{x} % {n}");
            }
        }
    }
}
