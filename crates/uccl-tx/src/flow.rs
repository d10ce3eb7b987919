//! A flow: its paths (lanes), its chunks in flight, its credit window and its queue of
//! messages, with the rule for when a message is finished.

use std::collections::VecDeque;

use crate::cc::Window;
use crate::error::TxError;
use crate::events::Event;
use crate::path::PathId;
use crate::tracking::{NIL, Tracking};

/// `last_progress` of a flow with nothing outstanding.
pub(crate) const IDLE: u64 = u64::MAX;

/// One of the flow's paths. Its chunks in flight (whose latest transmission went on it) form
/// a list in transmission order, linked through their tracks: a QP delivers in order, so the
/// head is the oldest, the first to time out, and every chunk before one known delivered was
/// lost.
#[derive(Debug)]
pub(crate) struct Lane {
    pub(crate) path: PathId,
    pub(crate) head: u16,
    pub(crate) tail: u16,
    /// The deadline of this lane's live timer entry.
    pub(crate) armed: Option<u64>,
    /// The deadline of this lane's live probe timer entry.
    pub(crate) probe: Option<u64>,
    /// While one ACK is processed: the latest transmission on this lane known delivered.
    pub(crate) mark: Option<u32>,
    /// An ACK request for this lane awaits its answer.
    pub(crate) asked: Option<Asked>,
    /// Index of `(fid, lane)` in the path's user list.
    pub(crate) user: u32,
}

/// A lane's ACK request awaiting its answer (see `TxConfig::ack_requests`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Asked {
    /// The latest request's number: its answer, or a later one's, resolves the lane.
    pub(crate) seq: u16,
    /// The path's completed WR count when asked: only transmissions before it (they had
    /// left the NIC) may be declared lost by the answer.
    pub(crate) completed: u32,
    /// And only those sent by then, as old as the timeout that asked: a younger one could
    /// still be on its way behind the request (another path's order).
    pub(crate) sent_by: u64,
    /// A retransmission timeout asked (not only a probe): a loss the answer shows backs the
    /// path off.
    pub(crate) rto: bool,
    /// Requests since the lane's last answer or delivery: their timer backs off.
    pub(crate) times: u8,
}

/// Whether the flow takes messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Open,
    /// Failed: messages are refused; the slot stays until the flow is closed.
    Failed,
    /// Closed: the slot stays only until the WRs naming its messages have completed.
    Closed,
}

/// A message waiting to be sent, acknowledged, or released by the NIC.
#[derive(Debug)]
pub(crate) struct Msg {
    pub(crate) local: u64,
    pub(crate) lkey: u32,
    pub(crate) len: u64,
    pub(crate) remote: u64,
    pub(crate) rkey: u32,
    /// The request id its chunks' immediates carry (`None`: the message id's low 8 bits).
    pub(crate) rid: Option<u8>,
    /// Bytes cut into chunks so far, chunks cut, chunks acknowledged.
    pub(crate) cut: u64,
    pub(crate) chunks: u32,
    pub(crate) acked: u32,
    /// WRs naming its bytes that the NIC may still read (handed out, not yet completed).
    pub(crate) wrs: u32,
    pub(crate) failed: bool,
    reported: bool,
}

impl Msg {
    pub(crate) fn new(local: u64, lkey: u32, len: u64, remote: u64, rkey: u32) -> Msg {
        Msg {
            local,
            lkey,
            len,
            remote,
            rkey,
            rid: None,
            cut: 0,
            chunks: 0,
            acked: 0,
            wrs: 0,
            failed: false,
            reported: false,
        }
    }

    fn cut_whole(&self) -> bool {
        self.cut == self.len && self.chunks > 0
    }
}

/// The messages of a flow, by flow-local sequence number.
#[derive(Debug, Default)]
pub(crate) struct Msgs {
    q: VecDeque<Msg>,
    /// Sequence number of `q[0]`.
    front: u64,
    /// The first message with bytes left to cut.
    cutting: u64,
}

impl Msgs {
    pub(crate) fn push(&mut self, m: Msg) -> u64 {
        self.q.push_back(m);
        self.front + self.q.len() as u64 - 1
    }

    pub(crate) fn get(&self, id: u64) -> Option<&Msg> {
        let i = id.checked_sub(self.front)?;
        self.q.get(usize::try_from(i).ok()?)
    }

    pub(crate) fn get_mut(&mut self, id: u64) -> Option<&mut Msg> {
        let i = id.checked_sub(self.front)?;
        self.q.get_mut(usize::try_from(i).ok()?)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    /// Messages not yet reported.
    pub(crate) fn len(&self) -> usize {
        self.q.len()
    }

    /// The message to cut the next chunk from.
    pub(crate) fn to_cut(&self) -> Option<u64> {
        (self.cutting < self.front + self.q.len() as u64).then_some(self.cutting)
    }

    /// The message to cut the next chunk from, with its sequence number.
    pub(crate) fn cutting_mut(&mut self) -> Option<(u64, &mut Msg)> {
        let id = self.cutting;
        Some((id, self.get_mut(id)?))
    }

    /// The message being cut got its last chunk: the next one to cut is the one after it,
    /// or the first after that not cancelled.
    pub(crate) fn cut_done(&mut self) {
        self.cutting += 1;
        self.skip_cancelled();
    }

    /// Moves `cutting` past messages cancelled before they started.
    fn skip_cancelled(&mut self) {
        while self
            .get(self.cutting)
            .is_some_and(|m| m.failed && m.chunks == 0)
        {
            self.cutting += 1;
        }
    }

    /// Whether message `id` has not started (no chunk of it cut) and may still be cancelled.
    pub(crate) fn may_cancel(&self, id: u64) -> bool {
        self.get(id).is_some_and(|m| !m.failed && m.chunks == 0)
    }

    /// Cancels message `id`, which has not started: it will never be cut.
    pub(crate) fn cancel(&mut self, id: u64) {
        if let Some(m) = self.get_mut(id) {
            m.failed = true;
        }
        self.skip_cancelled();
    }

    /// Reports message `id` if it is finished: completed (whole, every chunk acknowledged)
    /// or failed, and in both cases no WR naming its bytes outstanding, so the NIC will not
    /// read its buffer again. O(1) amortised.
    pub(crate) fn settle(
        &mut self,
        id: u64,
        fid: u16,
        error: Option<&TxError>,
        events: &mut VecDeque<Event>,
    ) {
        let Some(m) = self.get_mut(id) else { return };
        if m.reported || m.wrs > 0 {
            return;
        }
        let event = if m.failed {
            Event::MessageFailed {
                fid,
                msg: id,
                error: error.cloned().unwrap_or(TxError::Closed(fid)),
            }
        } else if m.cut_whole() && m.acked == m.chunks {
            Event::MessageComplete { fid, msg: id }
        } else {
            return;
        };
        m.reported = true;
        events.push_back(event);
        while self.q.front().is_some_and(|m| m.reported) {
            self.q.pop_front();
            self.front += 1;
        }
        self.cutting = self.cutting.max(self.front);
    }

    /// Every message not yet reported fails (reported once its WRs completed).
    pub(crate) fn fail_all(&mut self, fid: u16, error: &TxError, events: &mut VecDeque<Event>) {
        let ids = self.front..self.front + self.q.len() as u64;
        for m in &mut self.q {
            m.failed = true;
        }
        self.cutting = ids.end;
        for id in ids {
            self.settle(id, fid, Some(error), events);
        }
    }
}

/// A flow.
#[derive(Debug)]
pub(crate) struct Flow {
    /// Distinguishes this flow from an earlier one with the same id.
    pub(crate) epoch: u32,
    /// The flow id the immediates carry: the receiver's id of the flow.
    pub(crate) wire_fid: u16,
    pub(crate) status: Status,
    pub(crate) error: Option<TxError>,
    /// One per path given at open, in that order (an ACK names a lane by its index).
    pub(crate) lanes: Box<[Lane]>,
    /// Lanes whose path has not failed.
    pub(crate) live: Vec<u16>,
    pub(crate) track: Tracking,
    pub(crate) msgs: Msgs,
    /// Chunks to send again (lost, or handed out and not posted); stale entries are skipped.
    pub(crate) retx: VecDeque<u16>,
    /// The receive window granted, and chunks holding a part of it.
    pub(crate) credit: u16,
    pub(crate) inflight: u16,
    /// The congestion window (used with a target delay).
    pub(crate) cc: Window,
    /// The deadline of its pacing timer's live entry (a window below one chunk).
    pub(crate) paced: Option<u64>,
    /// The last ACK progress, or [`IDLE`].
    pub(crate) last_progress: u64,
    /// The deadline of the silence timer's live entry.
    pub(crate) silence: Option<u64>,
    /// In the transmit side's active list.
    pub(crate) active: bool,
    /// Waiting for this path to become usable.
    pub(crate) parked: Option<PathId>,
    /// Waiting for the engine window.
    pub(crate) waits_engine: bool,
    /// The lane of the current burst, the chunks it may still take, and the
    /// `poll_transmit` call it belongs to (a burst does not outlive its call: the next call's
    /// chunks start a burst of their own, so they make one chain).
    pub(crate) burst: (u16, u32, u32),
    /// When the flow last asked its peer for an ACK ([`u64::MAX`]: never).
    pub(crate) asked_at: u64,
    /// The number of the flow's latest ACK request.
    pub(crate) ask_seq: u16,
    /// Its lanes awaiting an answer (an answer finds none at once when this is 0).
    pub(crate) asking: u16,
}

impl Flow {
    /// The index of the path `lane` goes on.
    pub(crate) fn path_of(&self, lane: u16) -> usize {
        usize::from(self.lanes[usize::from(lane)].path.0)
    }

    pub(crate) fn new(
        epoch: u32,
        lanes: Box<[Lane]>,
        live: Vec<u16>,
        window: u16,
        credit: u16,
    ) -> Flow {
        Flow {
            epoch,
            wire_fid: 0,
            status: Status::Open,
            error: None,
            lanes,
            live,
            track: Tracking::new(window),
            msgs: Msgs::default(),
            retx: VecDeque::with_capacity(2 * usize::from(window)),
            credit,
            inflight: 0,
            cc: Window::new(window),
            paced: None,
            last_progress: IDLE,
            silence: None,
            active: false,
            parked: None,
            waits_engine: false,
            burst: (0, 0, 0),
            asked_at: u64::MAX,
            ask_seq: 0,
            asking: 0,
        }
    }

    /// Appends chunk `csn` to the list of `lane` (its latest transmission went there), the
    /// chunk's own links already set by the caller: `prev` to the lane's tail (as it was
    /// before this call), `next` to [`NIL`].
    pub(crate) fn append(&mut self, lane: u16, csn: u16) {
        let Flow { lanes, track, .. } = self;
        let l = &mut lanes[usize::from(lane)];
        let tail = std::mem::replace(&mut l.tail, csn);
        debug_assert!(
            track
                .get(csn)
                .is_none_or(|t| (t.prev, t.next) == (tail, NIL)),
            "chunk {csn}'s own links are set before it is appended"
        );
        if tail == NIL {
            l.head = csn;
        } else if let Some(t) = track.get_mut(tail) {
            t.next = csn;
        }
    }

    /// Takes a chunk with neighbours `prev` and `next` out of the list of `lane`.
    #[inline(always)]
    pub(crate) fn unlink(&mut self, lane: u16, prev: u16, next: u16) {
        let l = usize::from(lane);
        if prev == NIL {
            self.lanes[l].head = next;
        } else if let Some(t) = self.track.get_mut(prev) {
            t.next = next;
        }
        if next == NIL {
            self.lanes[l].tail = prev;
        } else if let Some(t) = self.track.get_mut(next) {
            t.prev = prev;
        }
    }
}

/// Flow `fid` in `flows` if it is open (a function, so the caller may borrow other fields).
pub(crate) fn open_mut(flows: &mut [Option<Flow>], fid: u16) -> Option<&mut Flow> {
    flows
        .get_mut(usize::from(fid))
        .and_then(Option::as_mut)
        .filter(|f| f.status == Status::Open)
}
