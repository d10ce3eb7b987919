//! The receive path of a round: chunks written by peers (WRITE_WITH_IMM into the posted
//! buffer) or retransmitted into SRQ buffers (checked, then copied into place), tracked per
//! flow, and the messages they complete.

use uccl_tx::wire::{Imm, RETR_HDR_LEN, RetrHdr, RetrHdrRepr};
use verbs_safe::WcOpcode;

use crate::config::Mode;
use crate::conn::WRITE_RID;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::police::Taken;
use crate::proto::Ctl;
use crate::request::Done;
use crate::round::Cqe;
use crate::rx::{Arrival, Delivered};

/// A refused chunk is noted to the peer only while the control backlog is shorter than this.
const REFUSALS_QUEUED: usize = 4;

impl Engine {
    /// A receive completion of a data QP, in SRQ slot `slot`: a chunk written
    /// (WRITE_WITH_IMM), or a retransmitted chunk sent into an SRQ buffer (SEND of header and
    /// payload).
    pub(crate) fn on_data_recv(&mut self, slot: u32, e: Cqe, now: u64) {
        if slot >= self.cfg.srq_depth {
            self.stats.dropped_invalid += 1;
            return;
        }
        self.io.srq_ring.owed.push(slot);
        if !e.ok {
            self.stats.dropped_invalid += 1;
            return;
        }
        let Some(v) = self.data_qpns.get(e.qpn) else {
            self.stats.dropped_invalid += 1;
            return;
        };
        let (ci, lane) = ((v >> 8) as u16, (v & 0xff) as u16);
        // Whatever it is, it took a buffer of the shared queue: judged against its grant, as
        // what it turns out to be (see `police.rs`).
        match (e.opcode, e.imm, self.cfg.mode) {
            (Some(WcOpcode::RecvRdmaWithImm), Some(imm), _) => {
                self.chunk(ci, lane, Imm::decode(imm), e.byte_len, None, now);
            }
            (Some(WcOpcode::Recv), None, Mode::Uc) => {
                let mut h = [0u8; RETR_HDR_LEN];
                let hdr = (e.byte_len as usize >= RETR_HDR_LEN)
                    .then(|| self.io.srq_ring.read(slot, 0, &mut h))
                    .filter(|&read| read)
                    .and_then(|_| RetrHdr::new_checked(&h[..]).ok())
                    .map(|v| RetrHdrRepr::parse(&v));
                match hdr {
                    Some(h) => {
                        let len = e.byte_len - RETR_HDR_LEN as u32;
                        let copy = Some(Retransmitted {
                            slot,
                            remote: h.remote_addr,
                            rkey: h.rkey,
                        });
                        self.chunk(ci, lane, Imm::decode(h.imm), len, copy, now);
                    }
                    None => self.malformed(ci, now),
                }
            }
            _ => self.malformed(ci, now),
        }
    }

    /// Connection `ci` sent something that is no chunk.
    fn malformed(&mut self, ci: u16, now: u64) {
        self.stats.dropped_invalid += 1;
        self.took_buffer(ci, Taken::Waste, now);
    }

    /// One chunk of connection `ci` arrived on lane `lane`. A retransmission (`copy`: its SRQ
    /// slot and target address) is copied to its place first, once the target is checked to
    /// lie inside the receive buffer or exported region it belongs to.
    #[inline(always)]
    pub(crate) fn chunk(
        &mut self,
        ci: u16,
        lane: u16,
        imm: Imm,
        len: u32,
        copy: Option<Retransmitted>,
        now: u64,
    ) {
        let Some(c) = self.conns[usize::from(ci)]
            .as_ref()
            .filter(|c| c.is_open() && imm.fid == ci)
        else {
            return self.malformed(ci, now);
        };
        if let Some(Retransmitted { slot, remote, rkey }) = copy
            && c.rx.expects(imm.csn)
        {
            let Some((dst, off)) = self.target(ci, imm.rid, (remote, len), rkey) else {
                self.refuse_chunk(ci, imm.csn, remote, rkey);
                return self.malformed(ci, now);
            };
            let ring = &self.io.srq_ring;
            let at = slot as usize * ring.slot_size + RETR_HDR_LEN;
            let src = ring.buf.as_ref().expect("UC SRQ buffers");
            if src.copy_to(at, dst, off, len as usize).is_err() {
                return self.malformed(ci, now);
            }
        }
        // The chunk may have waited for this end since its last look: the ACK says it was held
        // from then, so that the sender's RTT sample leaves this host's delays out.
        let Engine {
            conns,
            scratch,
            stats,
            credits,
            cfg,
            ..
        } = self;
        let delivered = &mut scratch.delivered;
        delivered.clear();
        let c = conns[usize::from(ci)].as_mut().expect("checked");
        c.heard = now;
        let a =
            c.rx.on_chunk(imm, len, (lane, copy.is_some(), scratch.seen_since), |d| {
                delivered.push(d)
            });
        let taken = match a {
            Arrival::New => {
                stats.chunks_received += 1;
                credits.arrived(ci, now);
                Taken::New(imm.csn)
            }
            Arrival::Duplicate => {
                stats.dropped_duplicate += 1;
                Taken::Waste
            }
            Arrival::OutOfWindow => {
                stats.dropped_out_of_window += 1;
                Taken::Waste
            }
        };
        // The buffer it took, judged as `took_buffer` judges it, with the connection at hand
        // (open: checked on the way in, and nothing since closes it).
        let verdict = c.police.took(taken, now, cfg.tx.rto_min_us * 1000);
        self.judged(ci, verdict, now);
        let Some(c) = self.conns[usize::from(ci)].as_mut().filter(|c| c.is_open()) else {
            // Failed for it: what it delivered goes with the connection's requests.
            return;
        };
        // An ACK now once it covers enough; this round if the sender needs the news (a
        // message done, a retransmission or duplicate seen); else it may wait a little for
        // more chunks to cover (a gap is no hurry: chunks of several paths interleave, and a
        // loss still shows within `ack_delay_us`).
        let (chunks, bytes) = c.rx.since_ack();
        let urgent =
            self.cfg.ack_delay_us == 0 || a != Arrival::New || !self.scratch.delivered.is_empty();
        if chunks >= self.cfg.ack_every || bytes >= u64::from(self.cfg.ack_bytes) {
            self.stage_ack(ci, now);
        } else if urgent {
            if !c.in_acks {
                c.in_acks = true;
                self.scratch.acks.push(ci);
            }
        } else if c.ack_due.is_none() {
            let due = now + u64::from(self.cfg.ack_delay_us) * 1000;
            c.ack_due = Some(due);
            self.scratch.delayed.push_back((due, ci));
        }
        // (By index: delivering needs the engine, and adds nothing to the list.)
        let mut k = 0;
        while let Some(&d) = self.scratch.delivered.get(k) {
            self.deliver(ci, d);
            k += 1;
        }
    }

    /// Tells the peer of connection `ci` that its retransmitted chunk `csn` named memory this
    /// end did not offer. At most a few such notes wait at once: a flood of injected frames
    /// cannot grow the backlog.
    fn refuse_chunk(&mut self, ci: u16, csn: u16, remote: u64, rkey: u32) {
        let Some(c) = self.conns[usize::from(ci)].as_mut() else {
            return;
        };
        if c.ctl.backlog.len() < REFUSALS_QUEUED {
            let note = Ctl::Unplaceable { csn, remote, rkey };
            c.ctl.backlog.push_back(note.to_bytes());
            self.mark_ctl(ci);
        }
    }

    /// Where `len` bytes for `remote` of message `rid` go: inside the receive buffer posted for
    /// it (and not ended), or inside a region this engine exported, and only with the key that
    /// receive was advertised with or that export has (as the NIC checked the original WRITE).
    /// The buffer and the offset in it, or `None` for a target the sender may not write.
    pub(crate) fn target(
        &self,
        ci: u16,
        rid: u8,
        (remote, len): (u64, u32),
        rkey: u32,
    ) -> Option<(&verbs_safe::DmaBuf, usize)> {
        let end = remote.checked_add(u64::from(len))?;
        let mem = if rid < WRITE_RID {
            let c = self.conns[usize::from(ci)].as_ref()?;
            let r = c.recvs[usize::from(rid)].as_ref()?;
            let inside = remote >= r.addr && end <= r.addr.checked_add(r.len)?;
            (inside && r.advertised && r.rkey == rkey && r.ending.is_none())
                .then_some(&r.use_.mem)?
        } else {
            self.memory
                .export_holding(rkey, (remote, end), crate::Access::WRITE)?
                .region
                .buf()
        };
        let off = remote.checked_sub(mem.addr())?;
        Some((mem, usize::try_from(off).ok()?))
    }

    /// A message of connection `ci` arrived whole, and nothing holds it back (see `notes.rs`).
    pub(crate) fn deliver_now(&mut self, ci: u16, d: Delivered) {
        if d.rid >= WRITE_RID {
            self.stats.writes_received += 1;
            return;
        }
        let c = self.conns[usize::from(ci)].as_mut().expect("open");
        let slot = usize::from(d.rid);
        let Some(r) = c.recvs[slot].as_ref().filter(|r| r.ending.is_none()) else {
            self.stats.dropped_invalid += 1;
            return;
        };
        let result = if r.read.is_some() && d.bytes != r.len {
            Err(EngineError::ReadRefused(
                "the peer served another length than was read",
            ))
        } else if d.bytes > r.len {
            Err(EngineError::TooLarge {
                len: d.bytes,
                room: r.len,
            })
        } else {
            if r.read.is_some() {
                self.stats.bytes_read += d.bytes;
            } else {
                self.stats.messages_received += 1;
                self.stats.bytes_received += d.bytes;
            }
            Ok(Done { len: d.bytes })
        };
        self.end_recv(ci, slot, result);
    }
}

/// A retransmitted chunk waiting in an SRQ buffer: its slot, and where its header says it goes
/// (address and the rkey its original WRITE carried).
#[derive(Debug, Clone)]
pub(crate) struct Retransmitted {
    slot: u32,
    remote: u64,
    rkey: u32,
}

#[cfg(test)]
mod tests {
    use crate::{Engine, EngineConfig, test_pair};

    /// A retransmitted chunk is copied only where its original WRITE could have gone: inside
    /// the receive buffer or exported range, and with the key it was given.
    #[test]
    fn a_retransmission_needs_the_rkey_of_its_target() {
        let fabric = softnic::Fabric::default();
        let (_a, mut b, _ca, cb) = test_pair(&fabric, &EngineConfig::default());
        let (exported, posted) = (b.register(8192).unwrap(), b.register(8192).unwrap());
        let d = b.export(&exported, 4096, 4096).unwrap();
        let _r = b.recv(cb, &posted, 0, 8192).unwrap();
        let ci = cb.index;
        // Advertised (so reachable) once its window's bind completed.
        let advertised = |b: &Engine| {
            b.conns[usize::from(ci)].as_ref().unwrap().recvs[0]
                .as_ref()
                .is_some_and(|r| r.advertised)
        };
        assert!(!advertised(&b));
        while !advertised(&b) {
            b.poll().unwrap();
        }
        let w = super::WRITE_RID;
        let at = |t: Option<(&verbs_safe::DmaBuf, usize)>| t.map(|(m, off)| (m.addr(), off));
        let r = b.conns[usize::from(ci)].as_ref().unwrap().recvs[0].as_ref();
        let (addr, recv_key) = r.map(|r| (r.addr, r.rkey)).unwrap();
        // One-sided: inside the export with its key; not with another key, nor outside.
        let (buf, off) = at(b.target(ci, w, (d.addr + 10, 100), d.rkey)).unwrap();
        assert_eq!((buf + off as u64), d.addr + 10);
        assert_eq!(at(b.target(ci, w, (d.addr + 10, 100), recv_key)), None);
        assert_eq!(
            at(b.target(ci, w, (d.addr - 10, 100), d.rkey)),
            None,
            "before"
        );
        assert_eq!(
            at(b.target(ci, w, (d.addr + 4000, 100), d.rkey)),
            None,
            "past"
        );
        // Two-sided: receive 0 of the connection, with the key it was advertised with only.
        assert_eq!(at(b.target(ci, 0, (addr, 8192), recv_key)), Some((addr, 0)));
        assert_eq!(at(b.target(ci, 0, (addr, 8192), d.rkey)), None);
        assert_eq!(at(b.target(ci, 0, (addr, 8193), recv_key)), None, "past it");
        assert_eq!(
            at(b.target(ci, 1, (addr, 10), recv_key)),
            None,
            "no receive 1"
        );
        // Every key is its own: the export's and the receive's.
        assert_ne!(recv_key, d.rkey);
        drop((exported, posted));
    }
}
