//! Queue pairs: the state machine, the send queue and its requester, the receive side and its
//! responder.
//!
//! - `modify`: the attribute masks per transition and transport (the kernel's table).
//! - `post`: turning posted `ibv_send_wr`/`ibv_recv_wr` chains into queued WQEs.
//! - `requester`: packets out of the send queue.
//! - `local`: the work requests the requester executes itself (memory window binds, local
//!   invalidations).
//! - `completer`: ACKs, NAKs, read responses, atomic acknowledges and timers back in (RC).
//! - `complete`: completion entries, and the ways a QP fails (ERROR, SQE).
//! - `responder`: request packets in; writes, receives and ACKs out (`ud`: datagrams).
//! - `rd_atomic`: the responder's READ responses and atomics, and the resources that answer
//!   their duplicates.
//! - `xrc`: what XRC QPs add to RC's (the XRC opcodes, and the SRQ each request binds).

mod cnp;
mod complete;
mod completer;
mod local;
mod modify;
mod post;
mod rd_atomic;
mod requester;
mod responder;
mod ud;
mod xrc;

use std::collections::VecDeque;

use ibverbs_sys::{
    ibv_qp, ibv_qp_attr, ibv_qp_cap, ibv_qp_state, ibv_sge, ibv_wc_status, ibv_wr_opcode,
};

pub use modify::check_transition;

use crate::abi::Shell;
use crate::counters::Counters;
use crate::link::{Dest, Frame, Gather};
use crate::packet::{Headers, Packet};
use crate::srq::RecvWqe;
use crate::state::World;

/// The transport of a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    Rc,
    Uc,
    Ud,
}

/// The SGEs of a WR: up to two held inline, so a usual post allocates nothing.
pub(crate) type SgeList = smallvec::SmallVec<[ibv_sge; 2]>;

// A list that did not spill owns nothing: a sent WQE's is forgotten, not dropped
// (`Qp::complete_front`).
const _: () = assert!(!std::mem::needs_drop::<ibv_sge>());

/// Where a send WR's data comes from.
#[derive(Debug, Clone)]
pub(crate) enum Payload {
    /// Gathered from registered memory when each packet is built.
    Sges(SgeList),
    /// Copied at post time (`IBV_SEND_INLINE`).
    Inline(Vec<u8>),
}

/// A UD send's destination, from its address handle.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UdDest {
    pub(crate) dgid: [u8; 16],
    pub(crate) remote_qpn: u32,
    pub(crate) qkey: u32,
}

/// The operands of an atomic WR.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AtomicArgs {
    /// The value to compare with (compare-and-swap) or to add (fetch-and-add).
    pub(crate) compare_add: u64,
    /// The value to swap in (compare-and-swap).
    pub(crate) swap: u64,
}

/// A posted send WR and how far it has got: its data, and everything else ([`WqeMeta`], which
/// it dereferences to).
#[derive(Debug, Clone)]
pub(crate) struct SendWqe {
    pub(crate) meta: WqeMeta,
    pub(crate) payload: Payload,
}

impl std::ops::Deref for SendWqe {
    type Target = WqeMeta;
    fn deref(&self) -> &WqeMeta {
        &self.meta
    }
}

impl std::ops::DerefMut for SendWqe {
    fn deref_mut(&mut self) -> &mut WqeMeta {
        &mut self.meta
    }
}

/// Everything of a posted send WR but its data: what building a packet needs, copied out of
/// the queue (plain data, one copy) so that the QP is not borrowed while the packet is built;
/// the data is read from the queue in place.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WqeMeta {
    pub(crate) seq: u64,
    pub(crate) wr_id: u64,
    pub(crate) opcode: ibv_wr_opcode::Type,
    pub(crate) signaled: bool,
    pub(crate) fence: bool,
    pub(crate) solicited: bool,
    pub(crate) len: u64,
    pub(crate) imm: Option<u32>,
    pub(crate) remote_addr: u64,
    pub(crate) rkey: u32,
    /// What its opcode carries beyond its data, if anything.
    pub(crate) extra: Extra,
    /// SEND_WITH_INV: the rkey the responder invalidates (the IETH of the last packet).
    pub(crate) invalidate: Option<u32>,
    /// PSNs assigned (the first packet was built), or a local operation executed.
    pub(crate) started: bool,
    pub(crate) first_psn: u32,
    pub(crate) npkts: u32,
    /// An error found when starting it, to be reported in order.
    pub(crate) error: Option<ibv_wc_status::Type>,
    /// XRC: the remote SRQ its messages are for (`qp_type.xrc.remote_srqn`).
    pub(crate) srqn: u32,
}

/// What a send WR carries beyond its data: one at most, as the opcodes that carry them
/// exclude each other (kept in one field, the WQE stays small: it is moved as it is posted,
/// and its metadata copied for each packet).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Extra {
    /// Nothing (SENDs and RDMA WRITEs and READs on RC and UC).
    None,
    /// A UD send's destination.
    Ud(UdDest),
    /// An atomic's operands (zeros for an ATOMIC WRITE, whose 8 bytes are its data).
    Atomic(AtomicArgs),
    /// A FLUSH's placement type (`IBV_FLUSH_GLOBAL`, `_PERSISTENT`) and selectivity level
    /// (`IBV_FLUSH_RANGE`, `_MR`); its range is `remote_addr`, `rkey` and `len`.
    Flush(u8, u8),
    /// A work request the requester executes itself (BIND_MW, LOCAL_INV): no packets, no
    /// PSNs; `started` once it was executed.
    Local(crate::mw::LocalOp),
}

impl WqeMeta {
    /// A UD send's destination.
    pub(crate) fn ud(&self) -> Option<UdDest> {
        match self.extra {
            Extra::Ud(d) => Some(d),
            _ => None,
        }
    }

    /// An atomic's operands (an ATOMIC WRITE's are zeros).
    pub(crate) fn atomic(&self) -> Option<AtomicArgs> {
        match self.extra {
            Extra::Atomic(a) => Some(a),
            _ => None,
        }
    }

    /// A FLUSH's placement type and selectivity level.
    pub(crate) fn flush(&self) -> Option<(u8, u8)> {
        match self.extra {
            Extra::Flush(t, l) => Some((t, l)),
            _ => None,
        }
    }

    /// A local operation's.
    pub(crate) fn local(&self) -> Option<crate::mw::LocalOp> {
        match self.extra {
            Extra::Local(op) => Some(op),
            _ => None,
        }
    }

    pub(crate) fn is_read(&self) -> bool {
        self.opcode == ibv_wr_opcode::IBV_WR_RDMA_READ
    }

    /// A READ or an atomic (an ATOMIC WRITE too): answered by a response of its own, counted
    /// against `max_rd_atomic`, and never acknowledged by a plain ACK.
    pub(crate) fn is_rd_atomic(&self) -> bool {
        self.is_read() || matches!(self.extra, Extra::Atomic(_) | Extra::Flush(..))
    }

    /// An ATOMIC WRITE or a FLUSH: answered by a READ response of no bytes.
    pub(crate) fn answered_empty(&self) -> bool {
        self.is_atomic_write() || matches!(self.extra, Extra::Flush(..))
    }

    /// An RDMA ATOMIC WRITE: 8 bytes of its data written at once at the remote address,
    /// answered by a READ response of no bytes.
    pub(crate) fn is_atomic_write(&self) -> bool {
        self.opcode == ibv_wr_opcode::IBV_WR_ATOMIC_WRITE
    }

    /// A BIND_MW or LOCAL_INV, which the requester executes itself.
    pub(crate) fn is_local(&self) -> bool {
        matches!(self.extra, Extra::Local(_))
    }

    /// A started WQE whose PSNs matter: one that sent packets (not a local operation).
    pub(crate) fn on_wire(&self) -> bool {
        self.started && !self.is_local()
    }

    /// A local operation executed successfully, waiting only for its turn to complete.
    pub(crate) fn done_locally(&self) -> bool {
        self.started && self.is_local() && self.error.is_none()
    }

    pub(crate) fn last_psn(&self) -> u32 {
        crate::packet::psn_add(self.first_psn, self.npkts.max(1) - 1)
    }
}

#[derive(Debug, Default)]
pub(crate) struct SendQueue {
    /// Posted WRs not yet completed, oldest first.
    pub(crate) wqes: VecDeque<SendWqe>,
    pub(crate) next_seq: u64,
    /// Completed WRs whose slot is still held until a completion covering them is polled.
    pub(crate) unreclaimed: u32,
    /// Completed unsignaled WRs since the last completion entry.
    pub(crate) unsignaled: u32,
}

impl SendQueue {
    /// The sequence number of the oldest WR held. WRs are numbered as they are queued, and
    /// leave from the front (or all at once), so those held are the last `len` numbered.
    pub(crate) fn head_seq(&self) -> u64 {
        let head = self.next_seq - self.wqes.len() as u64;
        debug_assert_eq!(head, self.wqes.front().map_or(self.next_seq, |w| w.seq));
        head
    }

    pub(crate) fn get(&self, seq: u64) -> Option<&SendWqe> {
        let i = seq.checked_sub(self.head_seq())?;
        self.wqes.get(usize::try_from(i).ok()?)
    }

    pub(crate) fn get_mut(&mut self, seq: u64) -> Option<&mut SendWqe> {
        let i = seq.checked_sub(self.head_seq())?;
        self.wqes.get_mut(usize::try_from(i).ok()?)
    }

    pub(crate) fn occupied(&self) -> usize {
        self.wqes.len() + self.unreclaimed as usize
    }
}

#[derive(Debug, Default)]
pub(crate) struct RecvQueue {
    pub(crate) wqes: VecDeque<RecvWqe>,
    pub(crate) unreclaimed: u32,
}

/// Requester (send side) progress.
#[derive(Debug, Default)]
pub(crate) struct Requester {
    /// Next PSN to send.
    pub(crate) psn: u32,
    /// One past the highest PSN sent so far (retransmissions are below it).
    pub(crate) psn_high: u32,
    /// Seq of the WQE being sent, and the next packet of it.
    pub(crate) cur: u64,
    pub(crate) cur_pkt: u32,
    /// RC: oldest PSN not yet acknowledged.
    pub(crate) comp_psn: u32,
    pub(crate) retry_cnt: u8,
    pub(crate) rnr_retry: u8,
    /// The armed timer: the retransmission timeout, or the end of an RNR wait.
    pub(crate) timer: Option<u64>,
    pub(crate) rnr_wait: Option<u32>,
    /// The PSN the last go-back-N restarted from, until progress is made past it.
    pub(crate) retrying_from: Option<u32>,
    /// RDMA READs started and not yet completed.
    pub(crate) rd_outstanding: u32,
    /// Packets sent since the last one that asked for an ACK.
    pub(crate) noack: u32,
    pub(crate) sqd_notified: bool,
}

/// The message a responder is in the middle of.
#[derive(Debug, Clone)]
pub(crate) enum InMsg {
    Idle,
    Send {
        wqe: RecvWqe,
        from_srq: bool,
        offset: u64,
    },
    Write {
        va: u64,
        resid: u64,
        total: u32,
        rkey: u32,
    },
}

/// A READ or atomic the responder executed, kept to answer a duplicate request (a READ is
/// read again; an atomic is answered from its saved result, never executed twice).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Resource {
    Read {
        first_psn: u32,
        last_psn: u32,
        va: u64,
        rkey: u32,
        len: u32,
        /// The PD it was checked against (an XRC target's changes with the SRQ each
        /// request names: its responses, and a duplicate's, are read under the READ's).
        pd: u32,
    },
    Atomic {
        psn: u32,
        orig: u64,
    },
    /// An ATOMIC WRITE or a FLUSH executed: a duplicate gets its (empty) response again.
    EmptyReply {
        psn: u32,
    },
}

/// READ response packets still to send.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadReply {
    pub(crate) res_first_psn: u32,
    pub(crate) psn: u32,
    pub(crate) last_psn: u32,
    pub(crate) va: u64,
    pub(crate) rkey: u32,
    pub(crate) remaining: u64,
    /// The MSN the READ's AETHs carry (the responder's MSN once it executed the READ).
    pub(crate) msn: u32,
    /// The answer to a duplicate request of a READ executed already.
    pub(crate) replay: bool,
    /// The PD the READ was checked against (see [`Resource::Read`]).
    pub(crate) pd: u32,
}

/// Responder (receive side) progress.
#[derive(Debug)]
pub(crate) struct Responder {
    /// Expected PSN.
    pub(crate) epsn: u32,
    /// One past the last SEND, WRITE or atomic executed (not advanced by READs, as in rxe): a
    /// duplicate SEND/WRITE is acknowledged with `ack_psn - 1`, which never covers a READ.
    pub(crate) ack_psn: u32,
    pub(crate) msn: u32,
    pub(crate) sent_nak: bool,
    /// UC: the current message lost a packet; drop until the next first packet.
    pub(crate) drop_msg: bool,
    pub(crate) cur: InMsg,
    pub(crate) resources: VecDeque<Resource>,
    /// READ response packets still to send, in PSN order.
    pub(crate) replies: VecDeque<ReadReply>,
    /// Request packets that arrived while READ responses were still going out: executed, in
    /// order, only once they are all sent (rxe's request queue), so nothing a later request
    /// does (its ACK, its write) overtakes the READ.
    pub(crate) deferred: VecDeque<Frame>,
    pub(crate) comm_est: bool,
}

impl Default for Responder {
    fn default() -> Self {
        Responder {
            epsn: 0,
            ack_psn: 0,
            msn: 0,
            sent_nak: false,
            drop_msg: false,
            cur: InMsg::Idle,
            resources: VecDeque::new(),
            replies: VecDeque::new(),
            deferred: VecDeque::new(),
            comm_est: false,
        }
    }
}

pub(crate) struct Qp {
    pub(crate) id: u32,
    pub(crate) ctx: u32,
    pub(crate) dev: usize,
    pub(crate) pd: u32,
    pub(crate) send_cq: u32,
    pub(crate) recv_cq: u32,
    /// The SRQ receives come from (an XRC target's: the one its last request bound).
    pub(crate) srq: Option<u32>,
    /// An XRC QP's role (`None`: not XRC).
    pub(crate) xrc: Option<crate::xrc::Role>,
    pub(crate) qpn: u32,
    pub(crate) transport: Transport,
    pub(crate) state: ibv_qp_state::Type,
    pub(crate) cap: ibv_qp_cap,
    pub(crate) sq_sig_all: bool,
    /// Async events about the QP that `get_async_event` handed out (acknowledged ones are
    /// counted in its shell's `events_completed`).
    pub(crate) events_reported: u32,
    /// Current attributes (what `query_qp` returns).
    pub(crate) attr: ibv_qp_attr,
    /// The device the AV of an RC/UC QP points to.
    pub(crate) dest_dev: Option<Dest>,
    /// The source GID of a packet from there (the device's own, or the IPv4-mapped one of the
    /// address on the UDP link): an RC or UC packet with another is foreign.
    pub(crate) peer_gid: Option<[u8; 16]>,
    /// Bumped by every reset, so completions polled later do not reclaim slots of the new life.
    pub(crate) epoch: u32,
    pub(crate) sq: SendQueue,
    pub(crate) rq: RecvQueue,
    pub(crate) req: Requester,
    pub(crate) resp: Responder,
    pub(crate) counters: Counters,
    pub(crate) shell: Shell<ibv_qp, crate::extended::QpEx>,
    /// The QP's entry in the fabric's timer set, if it has one: at or before `req.timer`
    /// (see [`Qp::set_timer`]).
    pub(crate) timer_entry: Option<u64>,
    /// Whether the QP is in its device's ready queue (`Device::tx_ready`).
    pub(crate) tx_queued: bool,
    /// Bumped whenever send WRs end other than through the responder (flushed by an error,
    /// dropped by a reset or a destroy): a [`Gather`] of an older generation still on the wire
    /// is not read, since the program may reuse that memory now.
    pub(crate) wire_gen: u32,
    /// When the QP last sent a CNP (see [`crate::topology::CNP_INTERVAL_NS`]).
    pub(crate) last_cnp: Option<u64>,
}

/// Bytes of an `ibv_mtu` value.
pub(crate) fn mtu_bytes(mtu: u32) -> u32 {
    match mtu {
        1..=5 => 128 << mtu,
        _ => 256,
    }
}

impl Qp {
    /// Marks this QP as possibly having a packet to send: it joins the back of its device's
    /// ready queue unless it is in it already.
    pub(crate) fn wake(&mut self, w: &mut World) {
        if !self.tx_queued {
            self.tx_queued = true;
            w.devices[self.dev].tx_ready.push_back(self.id);
        }
    }

    /// What remote accesses arriving at this QP are checked for: its device, PD and id (see
    /// [`World::check_remote`]).
    pub(crate) fn at(&self) -> (usize, u32, u32) {
        (self.dev, self.pd, self.id)
    }

    /// Increments a counter of this QP and of its device.
    #[inline(always)]
    pub(crate) fn count(&mut self, w: &mut World, f: impl Fn(&mut Counters)) {
        f(&mut self.counters);
        f(&mut w.devices[self.dev].counters);
    }

    /// The path MTU in bytes (the port's MTU for UD).
    pub(crate) fn mtu(&self, w: &World) -> u32 {
        match self.transport {
            Transport::Ud => w.cfg.mtu,
            _ => mtu_bytes(self.attr.path_mtu).min(w.cfg.mtu),
        }
    }

    /// Mirrors the state into the `ibv_qp` callers read.
    pub(crate) fn set_shell_state(&self) {
        let state = self.state;
        self.shell.update(|q| q.state = state);
    }

    pub(crate) fn is_sending_state(&self) -> bool {
        matches!(
            self.state,
            ibv_qp_state::IBV_QPS_RTS | ibv_qp_state::IBV_QPS_SQD
        )
    }

    /// Builds a packet and puts it on the wire towards device `to` (nowhere if `None`: the
    /// packet is counted as sent and dropped, as when a route does not exist).
    pub(crate) fn send_packet(
        &mut self,
        w: &mut World,
        to: Option<Dest>,
        hdr: &Headers,
        payload: &[u8],
    ) {
        self.send_built(w, to, hdr, payload.len(), |b| b.extend_from_slice(payload));
    }

    /// [`send_packet`](Self::send_packet) of `n` payload bytes that `fill` appends to the
    /// frame, after its headers (a READ response reads them from memory straight into it).
    pub(crate) fn send_built(
        &mut self,
        w: &mut World,
        to: Option<Dest>,
        hdr: &Headers,
        n: usize,
        fill: impl FnOnce(&mut Vec<u8>),
    ) {
        let xrc = self.xrc_headers(hdr);
        let hdr = xrc.as_ref().unwrap_or(hdr);
        // A spare frame buffer: no allocation per packet.
        let mut bytes = w.spare.take(hdr.wire_len(n));
        hdr.emit_head(n, &mut bytes);
        fill(&mut bytes);
        Headers::emit_tail(n, &mut bytes);
        self.send_frame(w, to, bytes, None);
    }

    /// Sends a packet already laid out (headers, payload, pad and a zero ICRC; or the payload
    /// left in memory, `gather`) to `to` (`None`: no route; the packet is counted and dropped).
    #[inline(always)]
    pub(crate) fn send_frame(
        &mut self,
        w: &mut World,
        to: Option<Dest>,
        bytes: Vec<u8>,
        gather: Option<Gather>,
    ) {
        let len = (bytes.len() + gather.map_or(0, |g| g.len as usize)) as u64;
        self.count(w, |c| {
            c.packets_sent += 1;
            c.bytes_sent += len;
        });
        let Some(to) = to else {
            self.count(w, |c| c.packets_dropped += 1);
            return;
        };
        self.transmit(w, to, bytes, gather, None);
    }

    /// Puts a packet counted as sent on the wire to `to` (a member device of group `mgid`, or
    /// its address on the UDP link, if it goes to a group), and counts what the faults did.
    /// (Inlined: a call would move the frame's parts once more, for every packet sent.)
    #[inline(always)]
    pub(super) fn transmit(
        &mut self,
        w: &mut World,
        to: Dest,
        bytes: Vec<u8>,
        gather: Option<Gather>,
        mgid: Option<Box<[u8; 16]>>,
    ) {
        let sgid = w.devices[self.dev].gid;
        let sport = w.sport(self.dev, self.qpn);
        let fate = w.transmit(Frame {
            from: self.dev,
            to,
            sport,
            sgid,
            bytes,
            sealed: false,
            gather,
            ecn: crate::link::ECT0,
            at: None,
            mgid,
        });
        self.count(w, |c| {
            c.packets_dropped += u64::from(fate.dropped);
            c.packets_corrupted += u64::from(fate.corrupted);
            c.packets_duplicated += u64::from(fate.duplicated);
            c.packets_reordered += u64::from(fate.reordered);
        });
    }

    /// Back to RESET: everything queued is discarded without completions.
    pub(crate) fn reset(&mut self, w: &mut World) {
        self.let_go_of_the_wire(w);
        if let Some(srq) = self.srq.and_then(|id| w.srqs.get_mut(&id))
            && let InMsg::Send { from_srq: true, .. } = self.resp.cur
        {
            srq.unreclaimed = srq.unreclaimed.saturating_sub(1);
        }
        self.epoch += 1;
        self.sq = SendQueue {
            next_seq: self.sq.next_seq,
            ..SendQueue::default()
        };
        self.rq = RecvQueue::default();
        self.req = Requester {
            cur: self.sq.next_seq,
            ..Requester::default()
        };
        self.resp = Responder::default();
        self.dest_dev = None;
        self.peer_gid = None;
        self.state = ibv_qp_state::IBV_QPS_RESET;
        self.set_shell_state();
        // Its completions not yet polled go too, as ConnectX's provider cleans them from the
        // CQs (`mlx5_cq_clean`): a QP reset for reuse leaves none of its earlier life's, and a
        // destroyed one none whose `wr_id` its program has freed since.
        w.clean_cqs(self.qpn, [self.send_cq, self.recv_cq]);
    }

    /// Sends the next packet this QP has (read responses first, then requests). Returns false
    /// if it has nothing to send now.
    #[inline(always)]
    pub(crate) fn next_tx(&mut self, w: &mut World) -> bool {
        self.send_read_reply(w) || self.send_request(w)
    }

    /// Receives a packet addressed to this QP: `pkt` parsed from `wire`, the bytes of
    /// `frame` (which holds them too, unless it came from the UDP link).
    #[inline(always)]
    pub(crate) fn receive(&mut self, w: &mut World, pkt: &Packet<'_>, frame: &Frame, wire: &[u8]) {
        self.count(w, |c| c.packets_received += 1);
        if !self.sent_by_peer(pkt, frame) {
            self.count(w, |c| c.foreign_packets += 1);
            return;
        }
        let rc;
        let pkt = match self.xrc {
            None => pkt,
            Some(_) => match xrc::as_rc(pkt) {
                Some(p) => {
                    rc = p;
                    &rc
                }
                None => {
                    self.count(w, |c| c.foreign_packets += 1);
                    return;
                }
            },
        };
        use crate::packet::opcode::*;
        match pkt.hdr.opcode {
            RC_ACKNOWLEDGE
            | RC_ATOMIC_ACKNOWLEDGE
            | RC_READ_RESPONSE_FIRST..=RC_READ_RESPONSE_ONLY => {
                if self.transport == Transport::Rc && !self.is_xrc_target() {
                    self.on_response(w, pkt);
                }
            }
            _ => self.on_request(w, pkt, frame, wire),
        }
        if self.may_transmit() {
            self.wake(w);
        }
    }

    /// Whether a packet may concern this QP at all (rxe's `check_keys` and `check_addr`): it
    /// names the default partition (of which every QP is a member), and if this QP is
    /// connected (RC, UC), it comes from the address its AV names; anyone may send to a UD QP
    /// (its Q_Key is checked on delivery).
    fn sent_by_peer(&self, pkt: &Packet<'_>, frame: &Frame) -> bool {
        pkt.hdr.pkey & 0x7fff == 0x7fff
            && (self.transport == Transport::Ud || self.peer_gid == Some(frame.sgid))
    }

    /// Whether [`next_tx`](Self::next_tx) could do anything: a READ or atomic reply queued, a
    /// WR at the send queue's current position, or a drained send queue to note (SQD). A
    /// packet received by a QP with none of these (a UC or RC responder that only takes
    /// writes and sends) leaves the ready queue alone: its ACKs go out as it receives.
    fn may_transmit(&self) -> bool {
        !self.resp.replies.is_empty()
            || self.sq.get(self.req.cur).is_some()
            || self.state == ibv_qp_state::IBV_QPS_SQD
    }
}
