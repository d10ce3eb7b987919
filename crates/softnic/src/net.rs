//! The simulated network: packets in flight, ordered by arrival time, with the faults of their
//! direction applied when they are sent.
//!
//! Each device has one port; a packet occupies the sending port for its serialisation time
//! (`bytes * 8 / gbps`) and arrives `latency_ns` after it has left.

use std::collections::BinaryHeap;

use crate::faults::{PacketInfo, Verdict};
use crate::packet::PSN_MASK;
use crate::state::World;

/// A packet on the wire: its bytes and where it goes.
#[derive(Debug, Clone)]
pub(crate) struct Frame {
    pub(crate) from: usize,
    pub(crate) to: usize,
    /// The sending device's GID (the source address a UD receiver sees in its GRH).
    pub(crate) sgid: [u8; 16],
    pub(crate) bytes: Vec<u8>,
    /// Whether `bytes` end in a real ICRC (a frame from outside, or one the fabric corrupted:
    /// the receiver checks it). A frame softnic built and nothing changed is valid by
    /// construction and carries a zero ICRC: the CRC of every byte would only be overhead.
    pub(crate) sealed: bool,
}

#[derive(Debug)]
struct InFlight {
    at: u64,
    seq: u64,
    frame: Frame,
}

impl PartialEq for InFlight {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for InFlight {
    /// Reversed, so the max-heap pops the earliest arrival (ties by send order).
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

#[derive(Debug, Default)]
pub(crate) struct Net {
    heap: BinaryHeap<InFlight>,
    /// Transmissions so far (the fault filter's sequence number).
    pub(crate) sent: u64,
    seq: u64,
}

impl Net {
    /// The arrival time of the next packet.
    pub(crate) fn next_at(&self) -> Option<u64> {
        self.heap.peek().map(|p| p.at)
    }

    /// The next packet that has arrived by `now`.
    pub(crate) fn pop_due(&mut self, now: u64) -> Option<Frame> {
        if self.heap.peek()?.at <= now {
            self.heap.pop().map(|p| p.frame)
        } else {
            None
        }
    }

    fn push(&mut self, at: u64, frame: Frame) {
        self.seq += 1;
        self.heap.push(InFlight {
            at,
            seq: self.seq,
            frame,
        });
    }

    /// Packets in flight.
    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }
}

/// How the faults treated one packet, for the sender's counters.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Fate {
    pub(crate) dropped: bool,
    pub(crate) corrupted: bool,
    pub(crate) duplicated: bool,
    pub(crate) reordered: bool,
}

impl World {
    /// Sends `frame` from its device's port: serialisation, faults, then into flight.
    pub(crate) fn transmit(&mut self, mut frame: Frame) -> Fate {
        let mut fate = Fate::default();
        let seq = self.net.sent;
        self.net.sent += 1;
        let b = &frame.bytes;
        let info = PacketInfo {
            seq,
            from: frame.from,
            to: frame.to,
            opcode: b[0],
            psn: u32::from_be_bytes([b[8], b[9], b[10], b[11]]) & PSN_MASK,
            dest_qp: u32::from_be_bytes([b[4], b[5], b[6], b[7]]) & 0x00ff_ffff,
            len: b.len(),
        };
        let verdict = self.filter.as_mut().map_or(Verdict::Pass, |f| f(&info));
        let faults = self.faults_for(frame.from, frame.to);
        let wire_ns = (frame.bytes.len() as u64 * 8).div_ceil(self.cfg.gbps.max(1));
        let port = &mut self.devices[frame.from];
        port.egress_free_at = port.egress_free_at.max(self.now) + wire_ns;
        let mut at = port.egress_free_at + self.cfg.latency_ns;

        let pass = verdict == Verdict::Pass;
        if faults.link_down || verdict == Verdict::Drop || (pass && self.rng.chance(faults.loss)) {
            fate.dropped = true;
            return fate;
        }
        if verdict == Verdict::Corrupt || (pass && self.rng.chance(faults.corrupt)) {
            if !frame.sealed {
                crate::packet::seal(&mut frame.bytes);
                frame.sealed = true;
            }
            let bit = self.rng.below(frame.bytes.len() as u64 * 8) as usize;
            frame.bytes[bit / 8] ^= 1 << (bit % 8);
            fate.corrupted = true;
        }
        if let Verdict::Delay(d) = verdict {
            at += d;
            fate.reordered = true;
        } else if pass && self.rng.chance(faults.reorder) {
            at += 1 + self.rng.below(faults.reorder_delay_ns.max(1));
            fate.reordered = true;
        }
        if verdict == Verdict::Duplicate || (pass && self.rng.chance(faults.duplicate)) {
            self.net.push(at + 1, frame.clone());
            fate.duplicated = true;
        }
        self.net.push(at, frame);
        fate
    }
}
