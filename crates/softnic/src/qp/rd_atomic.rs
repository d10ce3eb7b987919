//! The responder's READ and atomic side: READ responses sent in PSN order, atomics executed
//! once, and both remembered (rxe's responder resources) so that a duplicate request is
//! answered again without being executed twice.

use ibverbs_sys::ibv_qp_state;

use super::{Qp, ReadReply, Resource};
use crate::mr::{REMOTE_ATOMIC, REMOTE_READ, REMOTE_WRITE, atomic_op, atomic_store, read_mem};
use crate::packet::{Aeth, Headers, Packet, opcode, psn_add, psn_diff, syndrome};
use crate::state::World;

/// READs and atomics remembered for answering duplicates (at least; more if the QP's
/// `max_dest_rd_atomic` is larger).
const RESOURCE_HISTORY: usize = 16;

impl Qp {
    /// Keeps a READ or atomic for answering its duplicates, forgetting the oldest beyond the
    /// history's size.
    pub(super) fn remember(&mut self, r: Resource) {
        let cap = RESOURCE_HISTORY.max(usize::from(self.attr.max_dest_rd_atomic));
        if self.resp.resources.len() >= cap {
            self.resp.resources.pop_front();
        }
        self.resp.resources.push_back(r);
    }

    pub(super) fn start_read(&mut self, w: &mut World, pkt: &Packet<'_>) {
        let psn = pkt.hdr.psn;
        let Some(reth) = pkt.hdr.reth else {
            return;
        };
        if self.attr.qp_access_flags & REMOTE_READ == 0 || self.attr.max_dest_rd_atomic == 0 {
            return self.fatal_nak(w, syndrome::NAK_INVALID_REQUEST, psn);
        }
        let len = u64::from(reth.len);
        if len > super::responder::MAX_RDMA {
            return self.fatal_nak(w, syndrome::NAK_INVALID_REQUEST, psn);
        }
        // A zero-byte READ names no memory (C9-88): neither address nor rkey is checked.
        if len > 0 && !w.check_remote(self.at(), reth.rkey, reth.va, len, REMOTE_READ) {
            return self.fatal_nak(w, syndrome::NAK_REMOTE_ACCESS, psn);
        }
        let npkts = len.div_ceil(u64::from(self.mtu(w))).max(1) as u32;
        let last_psn = psn_add(psn, npkts - 1);
        self.remember(Resource::Read {
            first_psn: psn,
            last_psn,
            va: reth.va,
            rkey: reth.rkey,
            len: reth.len,
            pd: self.pd,
        });
        self.resp.epsn = psn_add(last_psn, 1);
        self.resp.msn = psn_add(self.resp.msn, 1);
        self.resp.replies.push_back(ReadReply {
            res_first_psn: psn,
            psn,
            last_psn,
            va: reth.va,
            rkey: reth.rkey,
            remaining: len,
            msn: self.resp.msn,
            replay: false,
            pd: self.pd,
        });
        self.wake(w);
    }

    /// A duplicate READ request (its responses, or some of them, were lost): send them again
    /// from its PSN, if it asks for a part of a READ still remembered, with the same rkey and
    /// inside the original range. Anything else is dropped (rxe's class D).
    pub(super) fn replay_read(&mut self, w: &mut World, pkt: &Packet<'_>) {
        let psn = pkt.hdr.psn;
        let Some(reth) = pkt.hdr.reth else {
            return;
        };
        let found = self.resp.resources.iter().find_map(|r| match *r {
            Resource::Read {
                first_psn,
                last_psn,
                va,
                rkey,
                len,
                pd,
            } if psn_diff(psn, first_psn) >= 0 && psn_diff(psn, last_psn) <= 0 => {
                Some((first_psn, last_psn, va, rkey, len, pd))
            }
            _ => None,
        });
        let Some((first_psn, last_psn, va, rkey, len, pd)) = found else {
            return;
        };
        // Everything comes from the wire: checked arithmetic, and a bad range is dropped.
        let end = reth.va.checked_add(u64::from(reth.len));
        let res_end = va.checked_add(u64::from(len));
        let inside =
            reth.rkey == rkey && reth.va >= va && end.zip(res_end).is_some_and(|(e, r)| e <= r);
        if !inside {
            return;
        }
        self.resp.replies.retain(|r| r.res_first_psn != first_psn);
        self.resp.replies.push_back(ReadReply {
            res_first_psn: first_psn,
            psn,
            last_psn,
            va: reth.va,
            rkey: reth.rkey,
            remaining: u64::from(reth.len),
            msn: self.resp.msn,
            replay: true,
            pd,
        });
        self.wake(w);
    }

    /// Executes a compare-and-swap or fetch-and-add: 8 aligned bytes of an MR with remote
    /// atomic access, changed atomically; the original value goes back in the acknowledge
    /// and is kept for answering a duplicate.
    pub(super) fn start_atomic(&mut self, w: &mut World, pkt: &Packet<'_>) {
        let psn = pkt.hdr.psn;
        let Some(a) = pkt.hdr.atomic else {
            return;
        };
        // rxe: no remote atomic right on the QP, or a misaligned address, is an invalid
        // request; a bad rkey or range is a remote access error.
        if self.attr.qp_access_flags & REMOTE_ATOMIC == 0
            || self.attr.max_dest_rd_atomic == 0
            || a.va % 8 != 0
        {
            return self.fatal_nak(w, syndrome::NAK_INVALID_REQUEST, psn);
        }
        if !w.check_remote(self.at(), a.rkey, a.va, 8, REMOTE_ATOMIC) {
            return self.fatal_nak(w, syndrome::NAK_REMOTE_ACCESS, psn);
        }
        let swap = pkt.hdr.opcode == opcode::RC_COMPARE_SWAP;
        // SAFETY: `va..va + 8` lies in a live MR with remote atomic access and is 8-byte
        // aligned (both checked just above); registration promised the memory stays valid.
        let orig = unsafe { atomic_op(a.va, swap, a.swap_add, a.compare) };
        self.remember(Resource::Atomic { psn, orig });
        self.resp.epsn = psn_add(psn, 1);
        self.resp.ack_psn = self.resp.epsn;
        self.resp.msn = psn_add(self.resp.msn, 1);
        self.send_atomic_ack(w, psn, orig);
    }

    /// A duplicate atomic: answered from the saved result, never executed again; dropped if
    /// it is no longer remembered.
    pub(super) fn replay_atomic(&mut self, w: &mut World, pkt: &Packet<'_>) {
        let psn = pkt.hdr.psn;
        let orig = self.resp.resources.iter().find_map(|r| match *r {
            Resource::Atomic { psn: p, orig } if p == psn => Some(orig),
            _ => None,
        });
        if let Some(orig) = orig {
            self.send_atomic_ack(w, psn, orig);
        }
    }

    /// Executes an RDMA ATOMIC WRITE as rxe's `atomic_write_reply` does: its 8 bytes stored at
    /// once (a release store, after everything before it) at an 8-byte aligned address of a
    /// region with remote write access, on a QP that grants remote writes; answered by a READ
    /// response of no bytes, and remembered so that a duplicate is answered, not executed.
    pub(super) fn start_atomic_write(&mut self, w: &mut World, pkt: &Packet<'_>) {
        let psn = pkt.hdr.psn;
        let Some(reth) = pkt.hdr.reth else {
            return;
        };
        let value = <[u8; 8]>::try_from(pkt.payload).ok();
        let Some(value) = value.filter(|_| {
            self.attr.qp_access_flags & REMOTE_WRITE != 0
                && self.attr.max_dest_rd_atomic > 0
                && reth.len == 8
                && reth.va % 8 == 0
        }) else {
            return self.fatal_nak(w, syndrome::NAK_INVALID_REQUEST, psn);
        };
        if !w.check_remote(self.at(), reth.rkey, reth.va, 8, REMOTE_WRITE) {
            return self.fatal_nak(w, syndrome::NAK_REMOTE_ACCESS, psn);
        }
        // SAFETY: `va..va + 8` lies in a live MR with remote write access and is 8-byte
        // aligned (both checked just above); registration promised the memory stays valid.
        unsafe { atomic_store(reth.va, u64::from_ne_bytes(value)) };
        self.remember(Resource::EmptyReply { psn });
        self.resp.epsn = psn_add(psn, 1);
        self.resp.ack_psn = self.resp.epsn;
        self.resp.msn = psn_add(self.resp.msn, 1);
        self.send_empty_read_response(w, psn);
    }

    /// A duplicate ATOMIC WRITE or FLUSH: its response again if it is remembered (never
    /// executed twice), else dropped.
    pub(super) fn replay_empty(&mut self, w: &mut World, pkt: &Packet<'_>) {
        let psn = pkt.hdr.psn;
        let known = self
            .resp
            .resources
            .iter()
            .any(|r| matches!(*r, Resource::EmptyReply { psn: p } if p == psn));
        if known {
            self.send_empty_read_response(w, psn);
        }
    }

    /// Executes a FLUSH as rxe's `process_flush` does: its key must name a region of this
    /// QP's PD granting the flush asked for (`IBV_ACCESS_FLUSH_GLOBAL`; no region grants
    /// persistence, softnic has no persistent memory), holding the range unless the whole
    /// region is asked for; then everything written before is made visible (a fence: softnic's
    /// writes are in memory when executed) and the FLUSH is answered as an ATOMIC WRITE is.
    pub(super) fn start_flush(&mut self, w: &mut World, pkt: &Packet<'_>) {
        let psn = pkt.hdr.psn;
        let (Some(reth), Some(feth)) = (pkt.hdr.reth, pkt.hdr.feth) else {
            return;
        };
        let (ptype, level) = ((feth & 0xf) as u8, ((feth >> 4) & 0x3) as u8);
        if self.attr.max_dest_rd_atomic == 0 || !(1..=3).contains(&ptype) || level > 1 {
            return self.fatal_nak(w, syndrome::NAK_INVALID_REQUEST, psn);
        }
        let (va, len) = (reth.va, u64::from(reth.len));
        if !w.check_flush(self.at(), reth.rkey, (va, len), ptype, level == 1) {
            return self.fatal_nak(w, syndrome::NAK_REMOTE_ACCESS, psn);
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        self.remember(Resource::EmptyReply { psn });
        self.resp.epsn = psn_add(psn, 1);
        self.resp.ack_psn = self.resp.epsn;
        self.resp.msn = psn_add(self.resp.msn, 1);
        self.send_empty_read_response(w, psn);
    }

    /// The response to an ATOMIC WRITE or a FLUSH: an RDMA READ Response Only of no bytes,
    /// with its AETH.
    fn send_empty_read_response(&mut self, w: &mut World, psn: u32) {
        let hdr = self.response(opcode::RC_READ_RESPONSE_ONLY, psn);
        self.send_packet(w, self.dest_dev, &hdr, &[]);
    }

    /// The headers of a response of `op` to the request with PSN `psn`: its AETH says ACK.
    fn response(&self, op: u8, psn: u32) -> Headers {
        Headers {
            opcode: op,
            pkey: 0xffff,
            dest_qp: self.attr.dest_qp_num,
            psn,
            aeth: Some(Aeth {
                syndrome: syndrome::ACK,
                msn: self.resp.msn,
            }),
            ..Headers::default()
        }
    }

    fn send_atomic_ack(&mut self, w: &mut World, psn: u32, orig: u64) {
        let hdr = Headers {
            atomic_ack: Some(orig),
            ..self.response(opcode::RC_ATOMIC_ACKNOWLEDGE, psn)
        };
        self.send_packet(w, self.dest_dev, &hdr, &[]);
    }

    /// Sends the next READ response packet, if any is queued; once the last one is out, the
    /// requests that waited behind them are executed.
    pub(super) fn send_read_reply(&mut self, w: &mut World) -> bool {
        use ibv_qp_state::*;
        if !matches!(self.state, IBV_QPS_RTR | IBV_QPS_RTS | IBV_QPS_SQD) {
            return false;
        }
        let mtu = u64::from(self.mtu(w));
        let Some(r) = self.resp.replies.front().copied() else {
            return false;
        };
        let chunk = r.remaining.min(mtu);
        let first = r.psn == r.res_first_psn;
        let last = r.psn == r.last_psn || r.remaining <= mtu;
        let op = match (first, last) {
            (true, true) => opcode::RC_READ_RESPONSE_ONLY,
            (true, false) => opcode::RC_READ_RESPONSE_FIRST,
            (false, true) => opcode::RC_READ_RESPONSE_LAST,
            (false, false) => opcode::RC_READ_RESPONSE_MIDDLE,
        };
        if chunk > 0 && !w.check_remote((self.dev, r.pd, self.id), r.rkey, r.va, chunk, REMOTE_READ)
        {
            if r.replay {
                // The answer to a duplicate of a READ answered already, whose region went
                // since: the requester has its bytes (or asks again and times out), and this
                // end's QP stays up (rxe replays from the resource, which holds the region).
                self.resp.replies.pop_front();
                return true;
            }
            // The region was deregistered under an executing READ.
            self.fatal_nak(w, syndrome::NAK_REMOTE_ACCESS, r.psn);
            return true;
        }
        let hdr = Headers {
            opcode: op,
            pkey: 0xffff,
            dest_qp: self.attr.dest_qp_num,
            psn: r.psn,
            aeth: (first || last).then_some(Aeth {
                syndrome: syndrome::ACK,
                msn: r.msn,
            }),
            ..Headers::default()
        };
        self.send_payload(w, &hdr, r, chunk);
        if last {
            self.resp.replies.pop_front();
            self.run_deferred(w);
        } else if let Some(front) = self.resp.replies.front_mut() {
            front.psn = psn_add(front.psn, 1);
            front.va += chunk;
            front.remaining -= chunk;
        }
        true
    }

    /// Sends a READ response packet with headers `hdr` and the `chunk` bytes at the front of
    /// `r` (checked), read straight into the frame. Never left in the region until the
    /// datagram leaves, as a WRITE's payload is on the UDP link: the responder's program may
    /// write the region while a READ of it is answered, and the bytes must be those the ICRC
    /// was computed over.
    // Never inlined: the loop that sends every QP's packets stays small for the WRITEs and
    // SENDs that go through it most (bench row 13).
    #[inline(never)]
    fn send_payload(&mut self, w: &mut World, hdr: &Headers, r: ReadReply, chunk: u64) {
        let n = chunk as usize;
        let copy = w.cfg.copy_payload;
        self.send_built(w, self.dest_dev, hdr, n, |bytes| {
            if copy {
                // SAFETY: inside a live MR with remote read access (checked by the caller).
                unsafe { read_mem(r.va, n, bytes) };
            } else {
                bytes.resize(bytes.len() + n, 0);
            }
        });
    }

    /// Executes, in order, the requests that arrived while READ responses were going out,
    /// until one of them is a READ with responses of its own to send.
    fn run_deferred(&mut self, w: &mut World) {
        while self.resp.replies.is_empty() {
            let Some(frame) = self.resp.deferred.pop_front() else {
                return;
            };
            // Checked when it arrived.
            // (An XRC target's, read as RC's as when it arrived.)
            let pkt = Packet::parse_with(&frame.bytes, false).ok().and_then(|p| {
                if self.xrc.is_some() {
                    super::xrc::as_rc(&p)
                } else {
                    Some(p)
                }
            });
            if let Some(pkt) = pkt {
                self.on_request(w, &pkt, &frame, &frame.bytes);
            }
        }
    }
}
