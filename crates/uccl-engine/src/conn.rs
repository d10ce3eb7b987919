//! A connection: its data QPs (one per path), its control QP (RC: receive-buffer
//! advertisements, and ACKs in RC mode and in UC mode while the peer asks so), the receive side
//! of its flow, and the requests in flight on it.

use std::collections::VecDeque;

use uccl_tx::PathId;
use verbs_safe::{
    ConnInit, Errored, Init, LocalPort, Mtu, Qp, Rc, RcRtr, RcRts, Remote, Reset, Rts, SqPsn,
    Transport, Uc, UcRtr,
};

use crate::ConnId;
use crate::cts::{Cts, CtsOrder};
use crate::error::{EngineError, Result};
use crate::io::{RecvRing, SendRing};
use crate::memory::BufUse;
use crate::proto::{CTL_LEN, CTL_PACK, Ctl as CtlMsg};
use crate::request::{Done, Request};
use crate::rx::RxFlow;

/// Receive buffers a connection may have advertised at once: request ids `0..128` name them.
pub(crate) const RECV_IDS: usize = 128;
/// Request ids from this one on are one-sided writes (no receive buffer is matched).
pub(crate) const WRITE_RID: u8 = 0x80;
/// Request ids from this one on are notified writes: `NOTE_RID | serial % 64` (see `notes.rs`).
pub(crate) const NOTE_RID: u8 = 0xc0;

/// A data QP in the connection's mode; kept after a failure until its flushes are polled.
pub(crate) enum DataQp {
    Uc(Qp<Uc, Rts>),
    Rc(Qp<Rc, Rts>),
    /// Moved to ERROR: its outstanding WRs complete as flushed, then it can go.
    UcErr(Qp<Uc, Errored>),
    RcErr(Qp<Rc, Errored>),
}

impl DataQp {
    pub(crate) fn qpn(&self) -> u32 {
        match self {
            DataQp::Uc(q) => q.qpn(),
            DataQp::Rc(q) => q.qpn(),
            DataQp::UcErr(q) => q.qpn(),
            DataQp::RcErr(q) => q.qpn(),
        }
    }

    /// Posts a chain of slots (see verbs-safe's `Qp::post_slots`); a failed QP refuses.
    pub(crate) fn post_slots<X: AsMut<verbs_safe::WrSlot<N>>, const N: usize>(
        &self,
        slots: &mut [X],
        order: &[u32],
    ) -> verbs_safe::Result<()> {
        match self {
            DataQp::Uc(q) => q.post_slots(slots, order),
            DataQp::Rc(q) => q.post_slots(slots, order),
            DataQp::UcErr(_) | DataQp::RcErr(_) => Err(verbs_safe::Error::Unsupported(
                "posting on a QP moved to ERROR",
            )),
        }
    }

    /// Moves the QP to ERROR (its outstanding WRs flush). Errors are logged, never fatal: the
    /// connection is going away anyway.
    pub(crate) fn fail(self) -> DataQp {
        let log = |e: &dyn std::fmt::Display| {
            tracing::warn!(error = %e, "moving a data QP to ERROR failed");
        };
        match self {
            DataQp::Uc(q) => match q.into_error() {
                Ok(q) => DataQp::UcErr(q),
                Err(e) => {
                    log(&e);
                    DataQp::Uc(e.qp)
                }
            },
            DataQp::Rc(q) => match q.into_error() {
                Ok(q) => DataQp::RcErr(q),
                Err(e) => {
                    log(&e);
                    DataQp::Rc(e.qp)
                }
            },
            other => other,
        }
    }
}

/// How a path is brought up, per transport.
pub(crate) trait Path: Transport<Init = ConnInit> {
    fn rtr(remote: Remote, from: LocalPort, mtu: Mtu) -> Self::Rtr;
    /// RTS attributes from `psn` on, an RC QP waiting `timeout` (an IB timeout code) for each
    /// ACK.
    fn rts(psn: u32, timeout: u8) -> Self::Rts;
}

/// The tries an RC QP makes before it fails: the first send and 7 retries.
const RC_TRIES: u64 = 8;
/// The shortest and the longest local ACK timeout of the engine's RC QPs, as IB codes
/// (4.096 us * 2^code): 67 ms (a descheduled peer is not retried at once) and 1.07 s (a tail
/// loss costs one timeout).
const RC_TIMEOUTS: std::ops::RangeInclusive<u8> = 14..=18;

/// The local ACK timeout (IB code) of the engine's RC QPs when a peer may stay silent for
/// `max_silence_us`: the shortest of [`RC_TIMEOUTS`] whose [`RC_TRIES`] cover it, so that an
/// RC QP gives a silent peer as long as a UC flow does (up to 8.6 s).
pub(crate) fn rc_timeout(max_silence_us: u64) -> u8 {
    let per_try_ns = max_silence_us.saturating_mul(1000).div_ceil(RC_TRIES);
    RC_TIMEOUTS
        .clone()
        .find(|&t| 4096u64 << t >= per_try_ns)
        .unwrap_or(*RC_TIMEOUTS.end())
}

impl Path for Uc {
    fn rtr(remote: Remote, from: LocalPort, mtu: Mtu) -> UcRtr {
        UcRtr {
            path_mtu: mtu,
            ..UcRtr::new(remote, from)
        }
    }
    fn rts(psn: u32, _timeout: u8) -> SqPsn {
        SqPsn(psn)
    }
}

impl Path for Rc {
    fn rtr(remote: Remote, from: LocalPort, mtu: Mtu) -> RcRtr {
        RcRtr {
            path_mtu: mtu,
            // Receivers post before they advertise: an RNR should never happen; wait little.
            min_rnr_timer: 1,
            ..RcRtr::new(remote, from)
        }
    }
    fn rts(psn: u32, timeout: u8) -> RcRts {
        RcRts {
            timeout,
            retry_cnt: (RC_TRIES - 1) as u8,
            // RNR retries forever: a zero-SGE SRQ that runs dry only delays.
            rnr_retry: 7,
            ..RcRts::new(psn)
        }
    }
}

/// How a QP is brought up: the peer's QP, the path to it and the local ACK timeout (RC).
pub(crate) struct Route {
    /// The local port and GID the QP sends from.
    pub(crate) from: LocalPort,
    /// The path MTU.
    pub(crate) mtu: Mtu,
    /// The local ACK timeout of an RC QP ([`rc_timeout`]).
    pub(crate) timeout: u8,
}

/// Brings a QP in INIT to RTS towards `remote`, sending from `psn`.
pub(crate) fn bring_up<T: Path>(
    qp: Qp<T, Init>,
    remote: Remote,
    route: &Route,
    psn: u32,
) -> Result<Qp<T, Rts>> {
    let verbs = |e: verbs_safe::Error| EngineError::verbs("connecting a QP")(e);
    let qp = qp
        .rtr(T::rtr(remote, route.from, route.mtu))
        .map_err(|e| verbs(e.error))?;
    qp.rts(T::rts(psn, route.timeout))
        .map_err(|e| verbs(e.error))
}

/// Moves a new QP to INIT, allowing peers `access`.
pub(crate) fn init<T: Path>(
    qp: Qp<T, Reset>,
    port: u8,
    access: verbs_safe::AccessFlags,
) -> Result<Qp<T, Init>> {
    qp.init(ConnInit {
        port,
        ..ConnInit::with_access(access)
    })
    .map_err(|e| EngineError::verbs("initialising a QP")(e.error))
}

/// A connection's control QP and its buffers.
pub(crate) struct Ctl {
    pub(crate) qp: CtlQp,
    pub(crate) recv: RecvRing,
    pub(crate) send: SendRing,
    /// Messages waiting for a free send slot.
    pub(crate) backlog: VecDeque<[u8; CTL_LEN]>,
    /// The latest ACK not sent yet (RC mode, or UC while the peer asks for ACKs here): sent
    /// after the backlog, replaced by a newer one.
    pub(crate) ack: Option<[u8; CTL_LEN]>,
    /// The send slot of a Close, once posted: its completion ends the connection.
    pub(crate) close_slot: Option<u32>,
    /// Sends completed so far (a control probe looks for progress).
    pub(crate) completions: u64,
    /// A probe ping went since the last completion (one per stall; see `keepalive.rs`).
    pub(crate) probed: bool,
    /// Rounds of copies sent over the UD QP of the advertisements in each send slot (see
    /// `keepalive.rs`).
    pub(crate) copies: Box<[u8]>,
}

/// The control QP, live or failed (kept until its flushes are polled).
pub(crate) enum CtlQp {
    Live(Qp<Rc, Rts>),
    /// Moved to ERROR, kept (never read) until its flushes are polled: dropping it would
    /// destroy it with WRs outstanding.
    #[allow(dead_code)]
    Failed(Qp<Rc, Errored>),
    /// Only while being replaced.
    Gone,
}

impl CtlQp {
    pub(crate) fn live(&self) -> Option<&Qp<Rc, Rts>> {
        match self {
            CtlQp::Live(q) => Some(q),
            _ => None,
        }
    }
}

impl Ctl {
    /// Moves the control QP to ERROR (its outstanding WRs flush).
    pub(crate) fn shut(&mut self) {
        self.qp = match std::mem::replace(&mut self.qp, CtlQp::Gone) {
            CtlQp::Live(q) => match q.into_error() {
                Ok(q) => CtlQp::Failed(q),
                Err(err) => CtlQp::Live(err.qp),
            },
            other => other,
        };
    }

    /// Posts a Close now, ahead of any backlog (dropped); whether it went.
    pub(crate) fn post_close(&mut self, conn: u16) -> bool {
        self.backlog.clear();
        self.ack = None;
        self.backlog.push_back(CtlMsg::Close.to_bytes());
        let posted = self.flush(conn).is_ok() && self.close_slot.is_some();
        self.backlog.clear();
        posted
    }

    /// Posts the owed receives, then the backlog and after it the pending ACK, up to
    /// [`CTL_PACK`] messages to a SEND, as far as there are free send slots; whether the ACK
    /// went in a SEND of its own (a packet for the ACK alone).
    pub(crate) fn flush(&mut self, conn: u16) -> verbs_safe::Result<bool> {
        let Some(qp) = self.qp.live() else {
            return Ok(false);
        };
        if !self.recv.owed.is_empty() {
            let r = qp.post_recv_slots(&mut self.recv.slots, &self.recv.owed);
            crate::io::settle(&mut self.recv.owed, r)?;
        }
        let mut alone = false;
        while !self.backlog.is_empty() || self.ack.is_some() {
            let mut pack = [0u8; CTL_PACK * CTL_LEN];
            let queued = self.backlog.len().min(CTL_PACK);
            let mut close = false;
            for (m, to) in self.backlog.iter().zip(pack.chunks_exact_mut(CTL_LEN)) {
                to.copy_from_slice(m);
                close |= CtlMsg::parse(m) == Some(CtlMsg::Close);
            }
            let ack = self
                .ack
                .filter(|_| queued == self.backlog.len() && queued < CTL_PACK);
            let n = queued + usize::from(ack.is_some());
            if let Some(a) = ack {
                pack[queued * CTL_LEN..n * CTL_LEN].copy_from_slice(&a);
            }
            let Some(i) = self.send.take(&pack[..n * CTL_LEN]) else {
                break;
            };
            self.backlog.drain(..queued);
            if ack.is_some() {
                self.ack = None;
                alone = queued == 0;
            }
            self.post(conn, i)?;
            if close {
                self.close_slot = Some(i);
            }
        }
        Ok(alone)
    }

    /// Posts send slot `i` (filled); on an error the slot is free again (it will not complete).
    fn post(&mut self, conn: u16, i: u32) -> verbs_safe::Result<()> {
        let Some(qp) = self.qp.live() else {
            self.send.give_back(i);
            return Ok(());
        };
        self.send.slots[i as usize].wr.wr_id = crate::wrid::ctl_send(conn, i);
        self.copies[i as usize] = 0;
        let r = qp.post_slots(&mut self.send.slots, &[i]);
        if r.is_err() {
            self.send.give_back(i);
        }
        r
    }
}

/// A receive buffer this end advertised.
pub(crate) struct PostedRecv {
    pub(crate) seq: u32,
    /// The buffer it lies in (held until the receive ends).
    pub(crate) use_: BufUse,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    /// The key it was advertised with (its window's, or the buffer's).
    pub(crate) rkey: u32,
    pub(crate) req: Request,
    /// Its window is bound and its advertisement queued (with buffer keys: at once).
    pub(crate) advertised: bool,
    /// Where its window is (with buffer keys: always `Idle`).
    pub(crate) window: Win,
    /// The peer was asked to drop its advertisement, and why (see `cancel.rs`).
    pub(crate) withdrawing: Option<crate::cancel::Why>,
    /// Ended with this result, waiting for its window to be unbound before it is reported.
    pub(crate) ending: Option<Result<Done>>,
    /// A read (UC): the peer's engine writes it from there (see `read.rs`); else a receive.
    pub(crate) read: Option<crate::read::ReadFrom>,
}

impl PostedRecv {
    /// What tells the peer of it: an advertisement, or a read.
    pub(crate) fn advert(&self) -> CtlMsg {
        match self.read {
            None => CtlMsg::Cts {
                seq: self.seq,
                addr: self.addr,
                len: self.len,
                rkey: self.rkey,
            },
            Some(from) => CtlMsg::Read {
                seq: self.seq,
                addr: self.addr,
                len: self.len,
                rkey: self.rkey,
                src: from.src,
                src_rkey: from.rkey,
            },
        }
    }
}

/// Where a receive's memory window is (see `window.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Win {
    /// Not bound to the receive, nothing in flight.
    Idle,
    /// Its bind is in flight.
    Binding,
    /// Bound over the receive.
    Bound,
    /// Its unbind is in flight.
    Unbinding,
}

/// A message handed to the transmit side.
pub(crate) struct InFlight {
    pub(crate) req: Request,
    pub(crate) len: u64,
    /// The transmit side completed it; it waits for the messages before it.
    pub(crate) done: bool,
    /// A one-sided write (a send took a peer's receive buffer: withdrawing it would leave
    /// that receive unfilled).
    pub(crate) write: bool,
    /// Withdrawn from the transmit side before it started, and why.
    pub(crate) withdrawn: Option<crate::cancel::Why>,
    /// The serial of its note, if it is a notified write (see `notes.rs`).
    pub(crate) note: Option<u32>,
    /// A peer's read this end serves (UC): the export's key, and the read's sequence number.
    pub(crate) served: Option<(u32, u32)>,
    /// The buffer it reads (held until it is reported).
    _use: BufUse,
}

/// A send waiting for the peer's next receive buffer.
pub(crate) struct PendingSend {
    pub(crate) local: u64,
    pub(crate) lkey: u32,
    pub(crate) len: u64,
    pub(crate) req: Request,
    pub(crate) use_: BufUse,
}

/// Where a connection is in its life.
#[derive(Debug, Clone)]
pub(crate) enum State {
    Open,
    /// Failed or closed: its QPs are in ERROR and their flushes are being polled.
    Draining(EngineError),
}

/// One connection.
pub(crate) struct Conn {
    pub(crate) id: ConnId,
    pub(crate) state: State,
    /// The peer engine (its control QP, where ACKs go in UC mode).
    pub(crate) peer: usize,
    /// The peer's id of this connection (what its ACKs carry, and what ours carry to it).
    pub(crate) peer_fid: u16,
    /// The ACK tags of this connection: the one the peer's ACKs carry (checked) and the one
    /// ours carry to it (see [`uccl_tx::wire::AckRepr::tag`]).
    pub(crate) tag: u8,
    pub(crate) peer_tag: u8,
    pub(crate) qps: Vec<DataQp>,
    pub(crate) paths: Vec<PathId>,
    pub(crate) ctl: Ctl,
    pub(crate) rx: RxFlow,
    /// What it took of the shared receive queue, against its grant (see `police.rs`).
    pub(crate) police: crate::police::Police,
    /// Posted receives by request id (`seq % 128`).
    pub(crate) recvs: Box<[Option<PostedRecv>]>,
    /// The memory window of each request id, allocated at its first receive
    /// ([`RecvKeys::Window`](crate::RecvKeys::Window)).
    pub(crate) windows: Box<[Option<verbs_safe::Mw>]>,
    /// Binds and unbinds of its windows posted and not completed (it is freed only once they
    /// are, so that none is taken for a later connection's).
    pub(crate) window_ops: u32,
    pub(crate) recvs_posted: u32,
    pub(crate) next_seq: u32,
    /// The peer's advertisements ready to match, in order, and the order they are taken in.
    pub(crate) cts: VecDeque<Cts>,
    pub(crate) cts_order: CtsOrder,
    pub(crate) sends: VecDeque<PendingSend>,
    /// Messages handed to the transmit side, by message id from `first_msg` (`None` once
    /// reported).
    pub(crate) inflight: VecDeque<Option<InFlight>>,
    pub(crate) first_msg: u64,
    pub(crate) next_write: u8,
    /// Reads waiting to be issued, in order (see `read.rs`), and whether the connection is
    /// in the engine's list of those with some.
    pub(crate) reads: VecDeque<crate::read::ReadPiece>,
    pub(crate) in_reads: bool,
    /// The path the next RDMA READ tries first (RC).
    pub(crate) read_lane: usize,
    /// Notes of writes: the serial of the next one sent, how many of those were reported,
    /// and those arriving (see `notes.rs`).
    pub(crate) next_note: u32,
    pub(crate) notes_done: u32,
    /// The peer's reads this end is serving (UC; at most [`RECV_IDS`]).
    pub(crate) serving: u32,
    /// Whether it is in the engine's list of connections that serve reads (`readers`).
    pub(crate) in_readers: bool,
    pub(crate) inbox: crate::notes::Inbox,
    /// Whether this connection is in the round's lists already.
    pub(crate) in_ready: bool,
    pub(crate) in_acks: bool,
    /// When its delayed ACK is due (an entry of the engine's `delayed` queue), if one is.
    pub(crate) ack_due: Option<u64>,
    pub(crate) in_ctl: bool,
    /// Where this connection's ACK sits in its peer's UD message (UC; a byte offset), if one
    /// does.
    pub(crate) ack_slot: Option<u16>,
    /// The peer asked for an ACK (UC), the number of its latest request: the next one sent
    /// answers it ([`ANSWER_PATH`](uccl_tx::wire::ANSWER_PATH), echoing the number).
    pub(crate) answer: Option<u16>,
    /// Until when its ACKs go over its control QP instead of the UD QP (UC; ns, 0: never):
    /// the peer asked for one, so it is not hearing them there (see `acks.rs`).
    pub(crate) acks_over_ctl_until: u64,
    /// When something last arrived from the peer (a chunk, an ACK, a control message).
    pub(crate) heard: u64,
    /// Whether its keep-alive timer is armed.
    pub(crate) in_keepalive: bool,
    /// Whether its control probe timer is armed.
    pub(crate) in_ctl_probe: bool,
    /// Its asks for advertisements the UD QP lost (UC; see `need.rs`).
    pub(crate) asks: crate::need::Asks,
    /// What [`Engine::close`](crate::Engine::close) returned (`Some`: a Close was asked for,
    /// and another is not sent): completed when the connection is freed.
    pub(crate) closed: Option<crate::Request<()>>,
}

impl Conn {
    /// Whether the connection is open (not offered, failed or closed).
    pub(crate) fn is_open(&self) -> bool {
        matches!(self.state, State::Open)
    }

    /// Whether a receive (or a read) can be posted now: fewer than `max` posted, and the
    /// request id of the next one free.
    pub(crate) fn recv_room(&self, max: u32) -> bool {
        self.recvs_posted < max && self.recvs[self.next_seq as usize % RECV_IDS].is_none()
    }

    /// Records the transmit side's message `msg` as request `req` of `len` bytes (a one-sided
    /// write if `write`), reading the buffer `use_` holds.
    pub(crate) fn track(
        &mut self,
        msg: u64,
        req: Request,
        (len, write): (u64, bool),
        use_: BufUse,
    ) -> &mut InFlight {
        if self.inflight.is_empty() {
            self.first_msg = msg;
        }
        let i = (msg - self.first_msg) as usize;
        while self.inflight.len() <= i {
            self.inflight.push_back(None);
        }
        self.inflight[i].insert(InFlight {
            req,
            len,
            done: false,
            write,
            withdrawn: None,
            note: None,
            served: None,
            _use: use_,
        })
    }

    /// Notes that the transmit side completed message `msg` (every chunk acknowledged). It is
    /// reported by [`Conn::pop_done`] once every earlier message is: the peer delivers in
    /// order, so a message after one that never arrives is never delivered either.
    pub(crate) fn mark_done(&mut self, msg: u64) {
        let Some(i) = msg
            .checked_sub(self.first_msg)
            .and_then(|i| usize::try_from(i).ok())
        else {
            return;
        };
        if let Some(Some(m)) = self.inflight.get_mut(i) {
            m.done = true;
        }
    }

    /// The oldest message, if the transmit side completed it: its request and length.
    pub(crate) fn pop_done(&mut self) -> Option<(Request, u64)> {
        let m = self.inflight.front_mut()?.take_if(|m| m.done)?;
        self.notes_done += u32::from(m.note.is_some());
        self.serving -= u32::from(m.served.is_some());
        self.drop_reported();
        Some((m.req, m.len))
    }

    /// The request of message `msg`, taken out (it failed), and why it was withdrawn if it was.
    pub(crate) fn untrack(&mut self, msg: u64) -> Option<(Request, Option<crate::cancel::Why>)> {
        let i = usize::try_from(msg.checked_sub(self.first_msg)?).ok()?;
        let m = self.inflight.get_mut(i)?.take()?;
        self.notes_done += u32::from(m.note.is_some());
        self.serving -= u32::from(m.served.is_some());
        self.drop_reported();
        Some((m.req, m.withdrawn))
    }

    /// The transmit side's ids of the messages of request `req` (one, or a vectored write's
    /// blocks).
    pub(crate) fn messages_of<'a>(&'a self, req: &'a Request) -> impl Iterator<Item = u64> + 'a {
        let first = self.first_msg;
        self.inflight.iter().enumerate().filter_map(move |(i, m)| {
            m.as_ref()
                .filter(|m| m.req.same(req))
                .map(|_| first + i as u64)
        })
    }

    /// Message `msg`, if it is tracked and not reported.
    pub(crate) fn message(&mut self, msg: u64) -> Option<&mut InFlight> {
        let i = usize::try_from(msg.checked_sub(self.first_msg)?).ok()?;
        self.inflight.get_mut(i)?.as_mut()
    }

    /// Moves `first_msg` past the messages reported.
    fn drop_reported(&mut self) {
        while matches!(self.inflight.front(), Some(None)) {
            self.inflight.pop_front();
            self.first_msg += 1;
        }
    }

    /// Fails every request of the connection with `e`. Its idle receive windows go first
    /// (their keys die at once), so a receive that had ended and waited for its window's
    /// unbind reports how it ended; a receive whose window has an operation in flight ends
    /// with `e` (or how it had ended) and is reported once the operation completed and the
    /// window is gone (see `Engine::on_window`). When the engine stops (`stopping`), every
    /// window goes at once and every request is reported.
    pub(crate) fn fail_requests(&mut self, e: &EngineError, stopping: bool) {
        let busy = |r: &Option<PostedRecv>| {
            !stopping
                && r.as_ref()
                    .is_some_and(|r| matches!(r.window, Win::Binding | Win::Unbinding))
        };
        for (w, r) in self.windows.iter_mut().zip(&self.recvs) {
            if !busy(r) {
                *w = None;
            }
        }
        if stopping && let Some(closed) = self.closed.take() {
            closed.fail(e.clone());
        }
        for s in self.sends.drain(..) {
            s.req.fail(e.clone());
        }
        for m in self.inflight.drain(..).flatten() {
            m.req.fail(e.clone());
        }
        for p in self.reads.drain(..) {
            p.fail(e.clone());
        }
        self.inbox = crate::notes::Inbox::default();
        let mut kept = 0;
        for slot in self.recvs.iter_mut() {
            if busy(slot) {
                let r = slot.as_mut().expect("busy");
                r.ending.get_or_insert_with(|| Err(e.clone()));
                kept += 1;
            } else if let Some(r) = slot.take() {
                r.req.complete(r.ending.unwrap_or_else(|| Err(e.clone())));
            }
        }
        self.recvs_posted = kept;
    }
}

#[cfg(test)]
mod tests {
    use super::rc_timeout;

    #[test]
    fn an_rc_qps_tries_cover_the_silence_a_peer_is_allowed() {
        // 8 tries of 67 ms (code 14) cover 0.54 s, of 134 ms (15) 1.07 s.
        assert_eq!(rc_timeout(50_000), 14);
        assert_eq!(rc_timeout(536_000), 14);
        assert_eq!(rc_timeout(1_000_000), 15);
        assert_eq!(rc_timeout(4_000_000), 17);
        assert_eq!(rc_timeout(8_000_000), 18);
        // Longer silences: 1.07 s a try at most, or a tail loss would stall for longer.
        assert_eq!(rc_timeout(60_000_000), 18);
        assert_eq!(rc_timeout(u64::MAX), 18);
    }
}
