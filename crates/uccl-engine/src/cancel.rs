//! Withdrawing requests: [`Request::cancel`](crate::Request::cancel), and deadlines
//! ([`Opts::timeout`]).
//!
//! What can be withdrawn without touching the connection: a send not yet matched with the
//! peer's receive buffer (it is dropped from the queue), a write none of whose chunks went out
//! (the transmit side drops it: the peer never sees it), and a receive the peer has not
//! matched with a send. A receive is the peer's to match, so the engine asks it
//! (`Ctl::Withdraw`): it drops the advertisement if no send took it yet (its next send takes
//! the next receive) and says so (`Ctl::Withdrawn`); only then is the receive's window unbound
//! and the receive reported. What cannot be withdrawn any more completes as it would have; a
//! request past its deadline that cannot be withdrawn fails its connection instead (a send
//! half written, a receive whose message is arriving: nothing else would end them).
//!
//! Deadlines wait in a heap (O(log n) each); a request that completes before its deadline
//! leaves its entry, which goes when it comes up, or at the next sweep (when the heap doubled
//! since the last one).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use crate::engine::Engine;
use crate::error::EngineError;
use crate::notes::Note;
use crate::proto::Ctl;
use crate::request::Request;

/// Options of a request ([`Engine::send_with`], [`Engine::recv_with`],
/// [`Engine::write_with`], [`Engine::read_with`], [`Engine::write_v_with`],
/// [`Engine::read_v_with`]). `Opts::default()` has none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Opts {
    /// How long the request may take, from the call, on the engine's clock (`None`: as long
    /// as it takes).
    pub timeout: Option<Duration>,
    /// The note a write carries to the target's application.
    note: Option<Note>,
}

impl Opts {
    /// A request that fails with [`EngineError::TimedOut`] if it has not completed within
    /// `timeout` (see each call for what then becomes of its connection).
    pub fn timeout(timeout: Duration) -> Opts {
        Opts::default().with_timeout(timeout)
    }

    /// These options with a `timeout` (see [`Opts::timeout`]).
    pub fn with_timeout(mut self, timeout: Duration) -> Opts {
        self.timeout = Some(timeout);
        self
    }

    /// These options with a note of `data` (at most [`MAX_NOTE`](crate::MAX_NOTE) bytes,
    /// else [`EngineError::Limit`]): a write, or the last block of a
    /// [`write_v`](Engine::write_v), carries it to the target engine, which delivers it to its
    /// application ([`Engine::notifications`]) once every byte of the write is in place, in
    /// order with the connection's other deliveries. Other requests refuse a note
    /// ([`EngineError::MisplacedNote`]). At most
    /// [`MAX_NOTED`](crate::MAX_NOTED) notified writes may be outstanding on a connection. A notified write is never withdrawn
    /// (its note may be on its way): [`Request::cancel`](crate::Request::cancel) leaves it to
    /// complete, and a deadline that passes fails the connection.
    pub fn note(mut self, data: &[u8]) -> Result<Opts, EngineError> {
        self.note = Some(Note::new(data).ok_or(EngineError::Limit {
            what: "bytes of a note",
            limit: crate::notes::MAX_NOTE as u64,
        })?);
        Ok(self)
    }

    /// Whether it carries a note.
    pub(crate) fn has_note(&self) -> bool {
        self.note.is_some()
    }

    /// Its note.
    pub(crate) fn the_note(&self) -> Option<&Note> {
        self.note.as_ref()
    }
}

/// Why a request is withdrawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Why {
    /// The application cancelled it.
    Cancel,
    /// Its deadline passed.
    Deadline,
}

impl Why {
    /// What the request fails with.
    pub(crate) fn error(self) -> EngineError {
        match self {
            Why::Cancel => EngineError::Cancelled,
            Why::Deadline => EngineError::TimedOut("withdrawn before it started"),
        }
    }
}

/// A request's deadline: ordered by time, then by arming order.
struct Timer {
    at: u64,
    seq: u64,
    req: Request,
}

impl PartialEq for Timer {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Timer {}
impl PartialOrd for Timer {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Timer {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// The deadlines of an engine's requests.
pub(crate) struct Deadlines {
    heap: BinaryHeap<Reverse<Timer>>,
    armed: u64,
    /// The heap's length at which entries of completed requests are swept out.
    sweep_at: usize,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            heap: BinaryHeap::new(),
            armed: 0,
            sweep_at: 64,
        }
    }
}

impl Deadlines {
    /// The earliest deadline (possibly of a request that completed meanwhile).
    pub(crate) fn next(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse(t)| t.at)
    }
}

impl Engine {
    /// Arms `req`'s deadline, if `opts` has one.
    pub(crate) fn arm_deadline(&mut self, req: &Request, opts: Opts, now: u64) {
        let Some(t) = opts.timeout else { return };
        let ns = u64::try_from(t.as_nanos()).unwrap_or(u64::MAX);
        let d = &mut self.deadlines;
        d.armed += 1;
        d.heap.push(Reverse(Timer {
            at: now.saturating_add(ns),
            seq: d.armed,
            req: req.clone(),
        }));
        // Entries of requests that completed go when the heap doubled since the last sweep:
        // amortised O(1) per deadline, and never more than twice what is live.
        if d.heap.len() > d.sweep_at {
            d.heap.retain(|Reverse(t)| !t.req.is_done());
            d.sweep_at = (2 * d.heap.len()).max(64);
        }
    }

    /// Withdraws the requests cancelled since the last round and those past their deadline.
    /// Whether any was cancelled.
    pub(crate) fn withdrawals(&mut self, now: u64) -> bool {
        // Empty almost always: two loads, not an empty `pop`'s fence.
        let cancelled = !self.cancels.is_empty();
        if cancelled {
            while let Some(req) = self.cancels.pop() {
                self.withdraw_request(&req, Why::Cancel);
            }
        }
        while let Some(Reverse(t)) = self.deadlines.heap.peek() {
            if t.at > now {
                break;
            }
            let Some(Reverse(t)) = self.deadlines.heap.pop() else {
                break;
            };
            self.withdraw_request(&t.req, Why::Deadline);
        }
        cancelled
    }

    /// Withdraws `req` if it can still be (see the module documentation).
    fn withdraw_request(&mut self, req: &Request, why: Why) {
        if req.is_done() {
            return;
        }
        let Some(conn) = req.conn() else { return };
        let ci = conn.index;
        let Some(c) = self
            .conns
            .get_mut(usize::from(ci))
            .and_then(Option::as_mut)
            .filter(|c| c.id == conn && c.is_open())
        else {
            // Gone: its requests failed with it.
            return;
        };
        if let Some(i) = c.sends.iter().position(|s| s.req.same(req)) {
            let s = c.sends.remove(i).expect("found");
            s.req.fail(why.error());
            return;
        }
        let slot = c
            .recvs
            .iter()
            .position(|r| r.as_ref().is_some_and(|r| r.req.same(req)));
        if slot.is_some_and(|s| c.recvs[s].as_ref().is_some_and(|r| r.read.is_some())) {
            // A read (UC): the peer takes it as served at once, so it is withdrawn only while
            // none of it was issued.
            self.withdraw_read(ci, req, why);
            return;
        }
        if let Some(slot) = slot {
            let r = c.recvs[slot].as_mut().expect("found");
            if r.ending.is_some() {
                return;
            }
            if !r.advertised {
                // Its window is still being bound: the peer has not seen it.
                self.end_recv(ci, slot, Err(why.error()));
                return;
            }
            if r.withdrawing.is_none() {
                c.ctl
                    .backlog
                    .push_back(Ctl::Withdraw { seq: r.seq }.to_bytes());
            }
            // A deadline that passes while a cancel is asked about wins: if the message is
            // arriving, the connection fails.
            let r = c.recvs[slot].as_mut().expect("found");
            if r.withdrawing != Some(Why::Deadline) {
                r.withdrawing = Some(why);
            }
            self.mark_ctl(ci);
            return;
        }
        let mut msgs = std::mem::take(&mut self.scratch.msgs);
        msgs.clear();
        msgs.extend(c.messages_of(req));
        let Some(&first) = msgs.first() else {
            self.scratch.msgs = msgs;
            self.withdraw_read(ci, req, why);
            return;
        };
        // A write (or every block of a vectored one: none reported yet) none of whose chunks
        // went out, and without a note (which may be on its way).
        let write = c.message(first).is_some_and(|m| m.write);
        let noted = msgs
            .iter()
            .any(|&m| c.message(m).is_some_and(|m| m.note.is_some()));
        let withdrawable = write
            && !noted
            && !req.any_part_done()
            && msgs.iter().all(|&m| self.tx.started(ci, m) == Some(false));
        if withdrawable {
            for &msg in &msgs {
                self.tx.cancel(ci, msg);
                let c = self.conns[usize::from(ci)].as_mut().expect("checked");
                c.message(msg).expect("tracked").withdrawn = Some(why);
            }
        }
        self.scratch.msgs = msgs;
        if withdrawable {
            return;
        }
        if why == Why::Deadline {
            req.fail(EngineError::TimedOut(
                "the peer was being written when it passed",
            ));
            let what = "a send or write passed its deadline after it started";
            self.fail_conn(ci, what, true);
        }
    }

    /// The peer withdraws its receive buffer `seq` on connection `ci`: dropped if no send took
    /// it yet; the answer says which.
    pub(crate) fn on_withdraw(&mut self, ci: u16, seq: u32) {
        let Some(c) = self.conns[usize::from(ci)].as_mut().filter(|c| c.is_open()) else {
            return;
        };
        // An honest peer withdraws at most the receives it has posted, and takes the answers.
        if c.ctl.backlog.len() >= 4 * crate::conn::RECV_IDS {
            let why = "the peer withdrew more receives at once than it can have posted";
            return self.fail_conn(ci, why, true);
        }
        let waiting = c.cts.len();
        let ok = c.cts_order.withdraw(seq, &mut c.cts);
        // The withdrawn one was the next to take: the advertisements that came after it (over
        // the UD QP, ahead of this message on the control QP) take their turn now, and a send
        // waiting for one is matched with it this round.
        let advanced = c.cts.len() > waiting;
        c.ctl
            .backlog
            .push_back(Ctl::Withdrawn { seq, ok }.to_bytes());
        self.mark_ctl(ci);
        if advanced {
            self.mark_ready(ci);
        }
    }

    /// The peer's answer about receive `seq` of connection `ci`: withdrawn (`ok`: it is
    /// reported, once its window is unbound), or a send took it (a cancel changes nothing; a
    /// deadline fails the connection).
    pub(crate) fn on_withdrawn(&mut self, ci: u16, seq: u32, ok: bool) {
        let Some(c) = self.conns[usize::from(ci)].as_mut() else {
            return;
        };
        let slot = seq as usize % crate::conn::RECV_IDS;
        let Some(r) = c.recvs[slot]
            .as_mut()
            .filter(|r| r.seq == seq && r.ending.is_none())
        else {
            // It completed meanwhile (the answer was no), or it is unknown.
            return;
        };
        let Some(why) = r.withdrawing.take() else {
            self.stats.dropped_invalid += 1;
            return;
        };
        if ok {
            self.end_recv(ci, slot, Err(why.error()));
        } else if why == Why::Deadline {
            r.req.fail(EngineError::TimedOut(
                "its message was arriving when it passed",
            ));
            let what = "a receive passed its deadline while its message was arriving";
            self.fail_conn(ci, what, true);
        }
    }
}
