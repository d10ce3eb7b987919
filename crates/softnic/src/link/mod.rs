//! Links: where the transport's packets go once built, in the shape of smoltcp's
//! `phy::Device`. The QPs (`crate::qp`) hand a [`Frame`] to [`World::transmit`] and are handed
//! arrived frames by `State::deliver`; they know nothing else of the network.
//!
//! Every frame first passes the faults of its direction (seeded loss, corruption, duplication,
//! reordering, link down, a packet filter), then goes onto one of two links:
//! - [`sim`]: the in-process simulated network, packets in flight ordered by arrival time
//!   (each device's port serialises a packet for `bytes * 8 / gbps` and it arrives
//!   `latency_ns` after it left, or, with [`switch`]es, at the first switch a link's delay
//!   later, where it queues for its next link); on the virtual clock, replayed bit for bit;
//! - [`udp`]: a device's UDP socket, RoCEv2 to another process or host.
//!
//! A frame for the UDP link waits in the same queue (so reordering faults delay it) and leaves
//! when due, without the simulated serialisation and latency.

pub(crate) mod groups;
pub(crate) mod sim;
pub(crate) mod switch;
pub(crate) mod udp;

use std::net::SocketAddrV4;

pub(crate) use sim::Net;

use crate::faults::{PacketInfo, Verdict};
use crate::packet::PSN_MASK;
use crate::state::World;

/// Where a packet goes: a device of this fabric, or an address on the UDP link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dest {
    /// The device of that index.
    Local(usize),
    /// A RoCEv2 port elsewhere (another process or host), reached through the sending
    /// device's [UDP port](crate::link::udp::UdpPort).
    Udp(SocketAddrV4),
}

/// The IPv4 header's ECN field: ECN-capable transport (every packet softnic sends).
pub(crate) const ECT0: u8 = 0b10;
/// The IPv4 header's ECN field: Congestion Experienced (a switch marked it).
pub(crate) const CE: u8 = 0b11;

/// A packet on the wire: its bytes and where it goes.
#[derive(Debug, Clone)]
pub(crate) struct Frame {
    pub(crate) from: usize,
    pub(crate) to: Dest,
    /// The UDP source port (the sending QP's flow entropy; covered by a RoCEv2 ICRC).
    pub(crate) sport: u16,
    /// The sending device's GID (the source address a UD receiver sees in its GRH).
    pub(crate) sgid: [u8; 16],
    /// The packet (empty in the frame a packet from the UDP link is delivered as: its bytes
    /// are read where they came in, beside it).
    pub(crate) bytes: Vec<u8>,
    /// Whether `bytes` end in a real ICRC (a frame from outside, or one the fabric corrupted:
    /// the receiver checks it). A frame softnic built and nothing changed is valid by
    /// construction and carries a zero ICRC until it leaves on the UDP link: the CRC of every
    /// byte of an in-process frame would only be overhead.
    pub(crate) sealed: bool,
    /// The payload, when it is not in `bytes` (which then hold the headers, the pad and the
    /// ICRC, the payload's place between them left out): see [`Gather`].
    pub(crate) gather: Option<Gather>,
    /// The ECN field of its IPv4 header ([`ECT0`], [`CE`], or 0 for not ECN-capable).
    pub(crate) ecn: u8,
    /// The switch it arrives at next (`None`: its destination device).
    pub(crate) at: Option<u16>,
    /// The multicast group it goes to, if it goes to one (destination QP `0xFFFFFF`). Boxed:
    /// every frame moves through the queue of frames in flight, and few go to a group.
    pub(crate) mgid: Option<Box<[u8; 16]>>,
}

impl Frame {
    /// The frame's length on the wire, its payload included wherever it is.
    pub(crate) fn wire_len(&self) -> usize {
        self.bytes.len() + self.gather.map_or(0, |g| g.len as usize)
    }
}

/// The payload of a packet left in the requester's registered memory, so that it is copied
/// once, not into a frame and out again: from the requester's memory into the responder's
/// (an RDMA WRITE between two devices of this fabric), or into the kernel as the datagram
/// leaves (a WRITE or SEND on the UDP link, at the end of the round that built it: see
/// `udp::send`).
///
/// Between two devices of this fabric, only where reading the memory late cannot be told
/// apart from reading it when the packet left: RC, whose requester may not touch the buffer
/// before the WRITE's completion, which comes after the delivery (UC and UD complete as the
/// packet leaves, and the memory may then be reused at once); and any WRITE when payload
/// copies are off ([`FabricConfig::copy_payload`](crate::FabricConfig::copy_payload)), where
/// the data is never read. A frame for the UDP link that cannot leave at once, or one being
/// corrupted, takes its payload in first ([`World::materialize`]). The memory is checked
/// again before it is read: a packet whose payload went away (an MR deregistered under an
/// outstanding WR) is dropped as if lost.
///
/// A packet whose payload spans two SGEs carries its bytes as usual. (A loopback WRITE of several
/// packets whose source and destination overlap reads what earlier packets placed, where
/// reading at transmit would not: IBTA leaves such overlaps undefined.)
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gather {
    /// The requester's device and PD (what the lkey is checked against).
    pub(crate) dev: usize,
    pub(crate) pd: u32,
    /// The payload: `len` bytes at `addr`, in the requester's MR of `lkey`.
    pub(crate) lkey: u32,
    pub(crate) addr: u64,
    pub(crate) len: u32,
    /// The requester QP and its `wire_gen` when the packet left: once its WRs have been
    /// flushed or dropped, the memory is the program's again and the packet is lost.
    pub(crate) qp: u32,
    pub(crate) wire_gen: u32,
}

impl Gather {
    /// The payload as an SGE (what the checks of local memory take).
    pub(crate) fn sge(&self) -> ibverbs_sys::ibv_sge {
        ibverbs_sys::ibv_sge {
            addr: self.addr,
            length: self.len,
            lkey: self.lkey,
        }
    }
}

/// Frame buffers delivered and ready for the next packets: steady traffic then allocates none
/// per packet (and the allocator does not gather up the freed small ACK buffers whenever a
/// data frame is allocated, as glibc's did: 8% of a 4 KiB RC WRITE's profile).
#[derive(Debug, Default)]
pub(crate) struct Spare {
    /// Buffers of at most [`SMALL`] bytes (ACKs, requests without payload).
    small: Vec<Vec<u8>>,
    large: Vec<Vec<u8>>,
}

/// The largest frame that takes a small buffer.
const SMALL: usize = 256;
/// Buffers kept per size class; a large buffer holds an MTU of 4096 with every header.
const KEEP: usize = 256;
const LARGE: usize = 4096 + 128;

impl Spare {
    /// An empty buffer for a frame of `len` bytes.
    #[inline]
    pub(crate) fn take(&mut self, len: usize) -> Vec<u8> {
        let (stack, size) = if len <= SMALL {
            (&mut self.small, SMALL)
        } else {
            (&mut self.large, len.max(LARGE))
        };
        match stack.pop() {
            Some(b) if b.capacity() >= len => b,
            _ => Vec::with_capacity(size),
        }
    }

    /// Keeps the buffer of a frame that was delivered (or drops it if enough are kept).
    pub(crate) fn give(&mut self, mut b: Vec<u8>) {
        let stack = match b.capacity() {
            0 => return,
            c if c <= SMALL => &mut self.small,
            c if c <= 2 * LARGE => &mut self.large,
            _ => return,
        };
        if stack.len() < KEEP {
            b.clear();
            stack.push(b);
        }
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
        let to = match frame.to {
            Dest::Local(d) => d,
            Dest::Udp(_) => usize::MAX,
        };
        let wire_len = frame.wire_len();
        let info = PacketInfo {
            seq,
            from: frame.from,
            to,
            opcode: b[0],
            psn: u32::from_be_bytes([b[8], b[9], b[10], b[11]]) & PSN_MASK,
            dest_qp: u32::from_be_bytes([b[4], b[5], b[6], b[7]]) & 0x00ff_ffff,
            len: wire_len,
        };
        let verdict = self.filter.as_mut().map_or(Verdict::Pass, |f| f(&info));
        let faults = self.faults_for(frame.from, to);
        // A frame for the UDP link leaves at once: the real network between here and there
        // has its own speed and latency.
        // A frame to another device goes to its first switch if there are switches.
        let (wire_ns, latency) = match frame.to {
            Dest::Local(d) => {
                let wire_ns = (wire_len as u64 * 8).div_ceil(self.cfg.gbps.max(1));
                match self.switches.as_ref().filter(|_| d != frame.from) {
                    Some(sw) => {
                        let (first, latency) = sw.first_hop(frame.from);
                        frame.at = Some(first);
                        (wire_ns, latency)
                    }
                    None => (wire_ns, self.cfg.latency_ns),
                }
            }
            Dest::Udp(_) => (0, 0),
        };
        let port = &mut self.devices[frame.from];
        port.egress_free_at = port.egress_free_at.max(self.now) + wire_ns;
        let mut at = port.egress_free_at + latency;

        let pass = verdict == Verdict::Pass;
        if faults.link_down || verdict == Verdict::Drop || (pass && self.rng.chance(faults.loss)) {
            fate.dropped = true;
            return fate;
        }
        if verdict == Verdict::Corrupt || (pass && self.rng.chance(faults.corrupt)) {
            if !self.materialize(&mut frame) {
                fate.dropped = true;
                return fate;
            }
            self.seal(&mut frame);
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
        let duplicate =
            verdict == Verdict::Duplicate || (pass && self.rng.chance(faults.duplicate));
        fate.duplicated = duplicate;
        if let Dest::Udp(dst) = frame.to {
            fate.dropped = !self.transmit_udp(dst, at, frame, duplicate);
            return fate;
        }
        if duplicate {
            self.send_on(at + 1, frame.clone());
        }
        self.send_on(at, frame);
        fate
    }

    /// The end of [`transmit`](Self::transmit) for a frame to `dst` on the UDP link, arriving
    /// at `at` (a copy too, a nanosecond later, if `duplicate`). Due now, and nothing in
    /// flight due before it, it goes straight to its port's outbox, where the next round's
    /// `deliver_due` would move it (the outbox is sent at the end of every round), without the
    /// trip through the queue of frames in flight (a push and a pop per packet); its payload,
    /// if left in memory, is read as the outbox goes, at the end of this round (see
    /// `udp::send`). A frame that waits may wait past this round, after which the program may
    /// have taken that memory back: it takes a copy now (and is lost if the memory is gone
    /// already: false then).
    // Never inlined: the in-process path of `transmit` does not grow by it (bench row 13).
    #[inline(never)]
    fn transmit_udp(
        &mut self,
        dst: SocketAddrV4,
        at: u64,
        mut frame: Frame,
        duplicate: bool,
    ) -> bool {
        if duplicate {
            let mut copy = frame.clone();
            if self.materialize(&mut copy) {
                self.send_on(at + 1, copy);
            }
        }
        if at <= self.now && self.net.next_at().is_none_or(|t| t > self.now) {
            let lent = frame.gather.map(|g| udp::Lent {
                addr: g.addr,
                len: g.len,
            });
            if let Some(port) = self.devices[frame.from].udp.as_mut() {
                port.queue(frame.sport, dst, frame.bytes, frame.sealed, lent);
            }
        } else if self.materialize(&mut frame) {
            self.send_on(at, frame);
        } else {
            return false;
        }
        true
    }

    /// Puts a frame in flight to its next hop, arriving at `at`. Ties go by sending sequence,
    /// except at a switch: the packets that reach one in the same nanosecond (from different
    /// ports) are taken in an order drawn from the fabric's seed, as a fair arbiter takes
    /// them. Engines that poll in lockstep on the virtual clock send at the same instants, and
    /// an order by sending sequence would queue the same senders last every time.
    pub(crate) fn send_on(&mut self, at: u64, frame: Frame) {
        if frame.at.is_some() {
            let tie = self.rng.next_u64();
            self.net.push_ordered(at, tie, frame);
        } else {
            self.net.push(at, frame);
        }
    }

    /// Puts a frame's payload into its bytes if it is still elsewhere ([`Gather`]). False if
    /// that memory went away (the frame is then to be dropped).
    pub(crate) fn materialize(&mut self, frame: &mut Frame) -> bool {
        let Some(g) = frame.gather.take() else {
            return true;
        };
        let tail = crate::packet::pad_of(g.len as usize) + crate::packet::ICRC_LEN;
        let head = frame.bytes.len() - tail;
        let mut bytes = self.spare.take(frame.bytes.len() + g.len as usize);
        bytes.extend_from_slice(&frame.bytes[..head]);
        if !self.cfg.copy_payload {
            // Nothing is read: zeros, as a packet built without copies carries.
            bytes.resize(bytes.len() + g.len as usize, 0);
        } else if self
            .gather(g.dev, g.pd, &[g.sge()], (0, g.len.into()), true, &mut bytes)
            .is_err()
        {
            return false;
        }
        bytes.extend_from_slice(&frame.bytes[head..]);
        let built = std::mem::replace(&mut frame.bytes, bytes);
        self.spare.give(built);
        true
    }

    /// Writes the ICRC a receiver will check: the RoCEv2 one for the UDP link, softnic's
    /// in-process one (a CRC-32 of the packet) otherwise.
    fn seal(&self, frame: &mut Frame) {
        if frame.sealed {
            return;
        }
        match (frame.to, &self.devices[frame.from].udp) {
            (Dest::Udp(dst), Some(port)) => {
                crate::roce::seal_v4(port.ip, frame.sport, *dst.ip(), 0, &mut frame.bytes);
            }
            _ => crate::packet::seal(&mut frame.bytes),
        }
        frame.sealed = true;
    }
}
