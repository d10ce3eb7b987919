//! A connected rsocket's data path: an RC QP on the socket's id whose messages are SENDs of at
//! most one slot, copied through slots of one registered buffer.
//!
//! Flow control is the receiver's posted slots: a slot is posted again once the program has
//! read all of it, and a SEND that finds none posted is NAKed receiver-not-ready and sent
//! again by the NIC (the QP retries that for ever, `rnr_retry` 7). A sender has at most
//! [`TX`] messages in flight, each in a send slot of its own until it completes. An empty
//! SEND is the end of the stream (`rshutdown` for writing); data messages are never empty.
//!
//! I/O mapping (`riomap`): a mapped buffer is registered for remote writes (its key reaches
//! that buffer only, until `riounmap`), and its offset, address, length and key go to the peer
//! in a SEND with immediate data ([`MAP`]; [`UNMAP`] takes it back). The peer's `riowrite` to
//! an offset it holds is an RDMA WRITE from one of its send slots.

use std::collections::VecDeque;
use std::ffi::c_int;
use std::ptr::null_mut;

use ibverbs_sys as v;

use super::slots::{Slots, Wc};
use crate::types::rdma_cm_id;

/// Bytes one message carries at most.
const SLOT: usize = 64 << 10;
/// Send slots: messages in flight from one end.
const TX: usize = 8;
/// Receive slots posted at each end.
const RX: usize = 16;
/// Tag of a receive's `wr_id` (its slot is below it).
const RX_TAG: u64 = 1 << 32;
/// `wr_id` of the end-of-stream SEND.
const FIN_ID: u64 = 1 << 33;
/// Immediate data of a message that maps: offset, address, length (u64 each, little-endian)
/// and key (u32) of a buffer the peer may write.
pub(super) const MAP: u32 = 1;
/// Immediate data of a message that unmaps: the offset (u64).
pub(super) const UNMAP: u32 = 2;
/// Mappings kept of a peer's (more are not: writes to them fail with `EINVAL`).
const PEER_MAPS: usize = 64;

/// A mapped buffer: this end's (`mr` null when not writable by the peer) or the peer's.
pub(super) struct Map {
    pub(super) offset: u64,
    pub(super) addr: u64,
    pub(super) len: u64,
    pub(super) mr: *mut v::ibv_mr,
    rkey: u32,
}

impl Map {
    /// This end's mapping of `len` bytes at `buf` (`mr` null: not for the peer to write).
    pub(super) fn local(offset: u64, buf: *mut u8, len: usize, mr: *mut v::ibv_mr) -> Map {
        Map {
            offset,
            addr: buf as u64,
            len: len as u64,
            mr,
            rkey: 0,
        }
    }

    /// The peer's mapping a map message names: none when its ends overflow (the arithmetic
    /// on it would).
    fn of_message(body: &[u8; 28]) -> Option<Map> {
        let u64_at = |i: usize| u64::from_le_bytes(body[i..i + 8].try_into().expect("8 bytes"));
        let (offset, addr, len) = (u64_at(0), u64_at(8), u64_at(16));
        (offset.checked_add(len).is_some() && addr.checked_add(len).is_some()).then(|| Map {
            offset,
            addr,
            len,
            mr: null_mut(),
            rkey: u32::from_le_bytes(body[24..28].try_into().expect("4 bytes")),
        })
    }

    /// Whether `len` bytes at `offset` lie in the mapping (its offset and length are the
    /// peer's word for the peer's: checked against overflow when they came).
    fn holds(&self, offset: u64, len: u64) -> bool {
        offset >= self.offset
            && offset
                .checked_add(len)
                .is_some_and(|end| end <= self.offset + self.len)
    }
}

/// A received message the program has not read all of.
struct Rx {
    slot: usize,
    len: usize,
    /// Bytes of it already read.
    off: usize,
}

/// The verbs objects and slots of one connection (send slots first, then receive slots).
pub(super) struct Conn {
    id: *mut rdma_cm_id,
    qp: *mut v::ibv_qp,
    s: Slots,
    free_tx: Vec<usize>,
    rx: VecDeque<Rx>,
    /// The peer ended its stream (an empty SEND arrived).
    pub(super) peer_fin: bool,
    /// The end-of-stream SEND was posted.
    pub(super) fin_sent: bool,
    fin_pending: bool,
    /// The QP is in error: a receive was flushed (the peer disconnected) or a send failed.
    pub(super) down: bool,
    /// A send failed other than by a flush: what it sent may not have arrived.
    pub(super) broken: bool,
    /// This end's mapped buffers.
    pub(super) maps: Vec<Map>,
    /// The peer's.
    peer_maps: Vec<Map>,
}

impl Conn {
    /// Creates the CQ, QP and slots on `id` (which has its device) and posts the receives.
    pub(super) fn new(id: *mut rdma_cm_id) -> Result<Box<Conn>, c_int> {
        // SAFETY: `id` is a live id of this library, resolved to its device.
        let ctx = unsafe { (*id).verbs };
        if ctx.is_null() {
            return Err(libc::EINVAL);
        }
        let mut c = Box::new(Conn {
            id,
            qp: null_mut(),
            s: Slots::new(ctx, SLOT, TX + RX, TX + RX + 1)?,
            free_tx: (0..TX).rev().collect(),
            rx: VecDeque::with_capacity(RX),
            peer_fin: false,
            fin_sent: false,
            fin_pending: false,
            down: false,
            broken: false,
            maps: Vec::new(),
            peer_maps: Vec::new(),
        });
        let mut attr = c.s.qp_attr(v::ibv_qp_type::IBV_QPT_RC, TX + 1, RX);
        // SAFETY: a live id without a QP, its device's PD and valid attributes; the CM moves
        // the QP from now.
        if unsafe { crate::qp::rdma_create_qp(id, c.s.pd, &mut attr) } != 0 {
            return Err(crate::errno());
        }
        // SAFETY: the id's QP, just set by `rdma_create_qp`.
        c.qp = unsafe { (*id).qp };
        (0..RX).try_for_each(|rx| c.post_recv(rx))?;
        Ok(c)
    }

    /// The descriptor that is readable once a completion event came (after [`Conn::arm`]).
    pub(super) fn fd(&self) -> c_int {
        self.s.fd()
    }

    fn post_recv(&mut self, rx: usize) -> Result<(), c_int> {
        self.s.post_recv(self.qp, TX + rx, RX_TAG | rx as u64)
    }

    /// Posts a SEND of `len` bytes of send slot `slot` (none: an empty SEND); with `imm`, a
    /// SEND with immediate data; with `to` (address, key), an RDMA WRITE there.
    fn post_send(
        &mut self,
        wr_id: u64,
        slot: Option<usize>,
        len: usize,
        imm: Option<u32>,
        to: Option<(u64, u32)>,
    ) -> Result<(), c_int> {
        let mut sge = self.s.sge(slot.unwrap_or(0), 0, len);
        let mut wr = v::ibv_send_wr {
            wr_id,
            sg_list: &mut sge,
            num_sge: i32::from(slot.is_some()),
            opcode: v::ibv_wr_opcode::IBV_WR_SEND,
            send_flags: v::ibv_send_flags::IBV_SEND_SIGNALED.0,
            ..Default::default()
        };
        if let Some(imm) = imm {
            wr.opcode = v::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM;
            wr.__bindgen_anon_1.imm_data = imm;
        }
        if let Some((remote_addr, rkey)) = to {
            wr.opcode = v::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
            wr.wr.rdma = v::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
        }
        self.s.post_send(self.qp, &mut wr)
    }

    /// Takes the completions waiting (a queue's worth at most: a peer's stream of control
    /// messages does not hold the caller): read messages queue, sent slots come free.
    pub(super) fn progress(&mut self) {
        let mut wc = [Wc::default(); 16];
        for _ in 0..(TX + RX + 1).div_ceil(wc.len()) {
            let n = self.s.poll(&mut wc);
            if n <= 0 {
                if n < 0 {
                    self.down = true;
                    self.broken = true;
                }
                return;
            }
            for w in &wc[..n as usize] {
                self.complete(w);
            }
        }
    }

    fn complete(&mut self, w: &Wc) {
        let ok = w.status == 0;
        let len = (w.byte_len as usize).min(SLOT);
        if w.wr_id & RX_TAG != 0 {
            let slot = (w.wr_id & 0xffff) as usize;
            if !ok {
                self.down = true;
            } else if let Some(kind) = w.imm() {
                self.control(kind, slot, len);
                if self.post_recv(slot).is_err() {
                    self.down = true;
                }
            } else if len == 0 {
                self.peer_fin = true;
            } else {
                self.rx.push_back(Rx { slot, len, off: 0 });
            }
            return;
        }
        if w.wr_id == FIN_ID {
            self.fin_pending = false;
        } else {
            self.free_tx.push((w.wr_id & 0xffff) as usize);
            // What it carried may not have arrived.
            self.broken |= !ok;
        }
        self.down |= !ok;
    }

    /// Arms the CQ: the next completion makes [`Conn::fd`] readable.
    pub(super) fn arm(&mut self) {
        self.s.arm();
    }

    /// Takes (and acks) the completion events that came.
    pub(super) fn take_events(&mut self) {
        self.s.take_events();
    }

    /// Whether a read would not wait: data, the end of the stream, or a connection gone.
    pub(super) fn readable(&self) -> bool {
        !self.rx.is_empty() || self.peer_fin || self.down
    }

    /// Whether received data waits to be read.
    pub(super) fn pending(&self) -> bool {
        !self.rx.is_empty()
    }

    /// Whether a send slot is free.
    pub(super) fn writable(&self) -> bool {
        !self.free_tx.is_empty()
    }

    /// Whether everything posted has completed.
    pub(super) fn idle(&self) -> bool {
        self.free_tx.len() == TX && !self.fin_pending
    }

    /// Copies from `data` into free send slots and sends them (or, with `to`, writes them to
    /// the peer's mapping at that offset, which must hold all of `data`): the bytes taken.
    pub(super) fn send(&mut self, data: &[u8], to: Option<u64>) -> Result<usize, c_int> {
        let mut n = 0;
        while n < data.len() {
            let remote = match to {
                None => None,
                Some(o) => {
                    let m = self
                        .peer_maps
                        .iter()
                        .find(|m| m.holds(o, data.len() as u64));
                    let m = m.ok_or(libc::EINVAL)?;
                    Some((m.addr + (o - m.offset) + n as u64, m.rkey))
                }
            };
            let Some(slot) = self.free_tx.pop() else {
                break;
            };
            let k = (data.len() - n).min(SLOT);
            // SAFETY: a free send slot (no WR reads it) of SLOT >= k bytes, apart from `data`.
            unsafe { std::ptr::copy_nonoverlapping(data[n..].as_ptr(), self.s.at(slot), k) };
            if let Err(e) = self.post_send(slot as u64, Some(slot), k, None, remote) {
                self.free_tx.push(slot);
                return if n > 0 { Ok(n) } else { Err(e) };
            }
            n += k;
        }
        Ok(n)
    }

    /// Sends the end of the stream (once).
    pub(super) fn send_fin(&mut self) -> Result<(), c_int> {
        if self.fin_sent {
            return Ok(());
        }
        self.post_send(FIN_ID, None, 0, None, None)?;
        self.fin_sent = true;
        self.fin_pending = true;
        Ok(())
    }

    /// Sends a control message (`kind`, the immediate data, and `body`) from a free slot:
    /// `EAGAIN` when none is free.
    pub(super) fn send_control(&mut self, kind: u32, body: &[u8]) -> Result<(), c_int> {
        let slot = self.free_tx.pop().ok_or(libc::EAGAIN)?;
        // SAFETY: a free send slot (no WR reads it), longer than any control message.
        unsafe { std::ptr::copy_nonoverlapping(body.as_ptr(), self.s.at(slot), body.len()) };
        let sent = self.post_send(slot as u64, Some(slot), body.len(), Some(kind), None);
        if sent.is_err() {
            self.free_tx.push(slot);
        }
        sent
    }

    /// A control message from the peer, in receive slot `slot`.
    fn control(&mut self, kind: u32, slot: usize, len: usize) {
        let mut body = [0u8; 28];
        let n = len.min(body.len());
        // SAFETY: a completed receive slot, read before it is posted again.
        unsafe { std::ptr::copy_nonoverlapping(self.s.at(TX + slot), body.as_mut_ptr(), n) };
        let offset = u64::from_le_bytes(body[..8].try_into().expect("8 bytes"));
        self.peer_maps.retain(|m| m.offset != offset);
        let map = Map::of_message(&body).filter(|_| kind == MAP && n == body.len());
        if let Some(m) = map.filter(|_| self.peer_maps.len() < PEER_MAPS) {
            self.peer_maps.push(m);
        }
    }

    /// Registers `len` bytes at `buf` for the peer to write (the map message is then to be
    /// sent with [`Conn::map_message`]).
    pub(super) fn register(&mut self, buf: *mut u8, len: usize) -> Result<*mut v::ibv_mr, c_int> {
        let access = v::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
            | v::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        // SAFETY: the connection's PD; the caller's buffer, which its riomap contract gives
        // to the peer to write until riounmap.
        let mr = unsafe { v::ibv_reg_mr((*self.id).pd, buf.cast(), len, access as c_int) };
        if mr.is_null() {
            Err(crate::errno())
        } else {
            Ok(mr)
        }
    }

    /// The map message of `m`.
    pub(super) fn map_message(m: &Map) -> [u8; 28] {
        let mut b = [0u8; 28];
        b[..8].copy_from_slice(&m.offset.to_le_bytes());
        b[8..16].copy_from_slice(&m.addr.to_le_bytes());
        b[16..24].copy_from_slice(&m.len.to_le_bytes());
        // SAFETY: a registered MR.
        b[24..].copy_from_slice(&unsafe { (*m.mr).rkey }.to_le_bytes());
        b
    }

    /// Whether the peer's mappings hold `len` bytes at `offset`.
    pub(super) fn peer_holds(&self, offset: u64, len: u64) -> bool {
        self.peer_maps.iter().any(|m| m.holds(offset, len))
    }

    /// Copies what was received into `out`, past the first `skip` bytes; consumed unless
    /// `peek` (a slot read to its end is posted again). The bytes copied.
    pub(super) fn recv(&mut self, out: &mut [u8], skip: usize, peek: bool) -> usize {
        let (mut n, mut skip) = (0, skip);
        let mut i = 0;
        while n < out.len() && i < self.rx.len() {
            let (slot, len, off) = (self.rx[i].slot, self.rx[i].len, self.rx[i].off);
            let avail = len - off;
            if skip >= avail {
                skip -= avail;
                i += 1;
                continue;
            }
            let from = off + skip;
            skip = 0;
            let k = (len - from).min(out.len() - n);
            // SAFETY: a completed receive slot: the NIC writes it only once it is posted
            // again, after this read; `out` is the caller's, apart from the slots.
            unsafe {
                let src = self.s.at(TX + slot).add(from);
                std::ptr::copy_nonoverlapping(src, out[n..].as_mut_ptr(), k);
            }
            n += k;
            if peek {
                i += 1;
                continue;
            }
            self.rx[i].off = from + k;
            if from + k == len {
                self.rx.pop_front();
                if self.post_recv(slot).is_err() {
                    self.down = true;
                }
            }
        }
        n
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // SAFETY: the QP goes first (through the CM, which made it), then the mappings'
        // registrations; the slots (CQ, memory) go after this, as a field.
        unsafe {
            if !self.qp.is_null() {
                crate::qp::rdma_destroy_qp(self.id);
            }
            for m in &self.maps {
                if !m.mr.is_null() {
                    v::ibv_dereg_mr(m.mr);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(offset: u64, addr: u64, len: u64) -> [u8; 28] {
        let mut b = [0u8; 28];
        b[..8].copy_from_slice(&offset.to_le_bytes());
        b[8..16].copy_from_slice(&addr.to_le_bytes());
        b[16..24].copy_from_slice(&len.to_le_bytes());
        b[24..].copy_from_slice(&7u32.to_le_bytes());
        b
    }

    /// A peer's map message is its word: one whose ends overflow names no mapping, and what
    /// a mapping holds is reckoned without overflow, whatever is asked.
    #[test]
    fn a_peer_s_mapping_that_overflows_is_none() {
        assert!(Map::of_message(&message(u64::MAX, 0, 2)).is_none());
        assert!(Map::of_message(&message(0, u64::MAX - 1, 2)).is_none());
        let m = Map::of_message(&message(100, 0x1000, 50)).expect("a mapping");
        assert_eq!((m.offset, m.addr, m.len, m.rkey), (100, 0x1000, 50, 7));
        assert!(m.holds(100, 50) && m.holds(120, 30));
        assert!(!m.holds(99, 1) && !m.holds(120, 31) && !m.holds(149, u64::MAX));
        assert!(!m.holds(u64::MAX, u64::MAX));
    }
}
