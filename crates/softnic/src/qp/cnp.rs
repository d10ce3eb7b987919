//! The notification point of RoCEv2's congestion control: a packet that arrives marked
//! Congestion Experienced is answered with a CNP to the QP that sent it (see
//! [`crate::topology`]).

use ibverbs_sys::ibv_qp_state;

use super::{Qp, Transport};
use crate::link::{Dest, Frame};
use crate::packet::{Headers, Packet, opcode};
use crate::state::World;
use crate::topology::CNP_INTERVAL_NS;

/// The BTH's BECN bit (byte 4, the byte before the destination QP).
const BECN: u8 = 0x40;
/// A CNP's reserved bytes after the BTH.
const RESERVED: [u8; 16] = [0; 16];

impl Qp {
    /// `pkt` arrived from device `from` marked Congestion Experienced: counts it, and sends a
    /// CNP to its sender unless this QP sent one within [`CNP_INTERVAL_NS`]. Only a QP that
    /// receives (RTR, RTS or SQD) answers; a connected QP answers its own peer (the QP and
    /// device of its address vector, whoever sent the packet), a UD QP the sender its DETH
    /// names on the device the packet came from.
    pub(crate) fn congestion_experienced(&mut self, w: &mut World, pkt: &Packet<'_>, from: usize) {
        self.count(w, |c| c.ecn_marked += 1);
        let receives = matches!(
            self.state,
            ibv_qp_state::IBV_QPS_RTR | ibv_qp_state::IBV_QPS_RTS | ibv_qp_state::IBV_QPS_SQD
        );
        if !receives
            || self
                .last_cnp
                .is_some_and(|t| w.now.saturating_sub(t) < CNP_INTERVAL_NS)
        {
            return;
        }
        let (dest_qp, to) = match self.transport {
            Transport::Ud => match pkt.hdr.deth {
                Some(d) => (d.src_qp, from),
                None => return,
            },
            _ => match self.dest_dev {
                Some(Dest::Local(d)) => (self.attr.dest_qp_num, d),
                // A peer on the UDP link: no switch between here and there marks.
                _ => return,
            },
        };
        let hdr = Headers {
            opcode: opcode::CNP,
            pkey: 0xffff,
            dest_qp,
            ..Headers::default()
        };
        let mut bytes = w.spare.take(hdr.wire_len(RESERVED.len()));
        hdr.emit_unsealed(&RESERVED, &mut bytes);
        bytes[4] |= BECN;
        self.last_cnp = Some(w.now);
        self.count(w, |c| {
            c.cnps_sent += 1;
            c.packets_sent += 1;
            c.bytes_sent += bytes.len() as u64;
        });
        let frame = Frame {
            from: self.dev,
            to: Dest::Local(to),
            sport: w.sport(self.dev, self.qpn),
            sgid: w.devices[self.dev].gid,
            bytes,
            sealed: false,
            gather: None,
            // Not ECN-capable, as NICs send CNPs.
            ecn: 0,
            at: None,
            mgid: None,
        };
        let fate = w.transmit(frame);
        self.count(w, |c| c.packets_dropped += u64::from(fate.dropped));
    }
}
