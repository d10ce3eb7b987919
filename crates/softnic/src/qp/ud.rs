//! UD: a datagram into the next receive WQE, behind the 40-byte network header of the frame
//! it came in; a datagram to a multicast group ([`crate::mcast`]) to each of its members.

use std::net::SocketAddrV4;

use ibverbs_sys::{ibv_wc_flags, ibv_wc_opcode, ibv_wc_status};
use smallvec::SmallVec;

use super::Qp;
use super::complete::Received;
use crate::link::{Dest, Frame};
use crate::packet::Packet;
use crate::roce;
use crate::state::World;

/// The bytes of the GRH a UD receive buffer gets in front of the payload.
pub(crate) const GRH_LEN: usize = 40;

/// The `sl` of a UD completion whose GRH area holds an IPv4 header, as mlx5 reports it on
/// RoCE (the CQE's packet type: bit 3, a UDP header followed (RoCEv2); bits 2:0, the network
/// header, 1 IPv6 and 2 IPv4). UCX's UD transport reads it there to know where the destination
/// address is in the area (the last 4 bytes for IPv4, else the last 16) and drops a datagram
/// whose address is not its own; rxe leaves it 0, which UCX takes for IPv6.
pub(crate) const SL_ROCE_V2_IPV4: u8 = 0x8 | 0x2;
/// The `sl` of a UD completion whose GRH area holds an IPv6 header (as above).
pub(crate) const SL_ROCE_V2_IPV6: u8 = 0x8 | 0x1;

/// What a UD receive buffer gets in its first 40 bytes: the network header of the RoCEv2
/// frame the datagram came in (rxe's `union rdma_network_hdr`), and the completion's `sl` that
/// says which it is. Between IPv4-mapped GIDs that is 20 zero bytes then the IPv4 header;
/// otherwise the IPv6 header. `ib_len` is the length of the InfiniBand part (BTH to ICRC)
/// under the 8-byte UDP header.
fn network_header(sgid: &[u8; 16], dgid: &[u8; 16], ib_len: usize) -> ([u8; GRH_LEN], u8) {
    let udp_len = 8 + ib_len;
    let mut grh = [0u8; GRH_LEN];
    if let (Some(src), Some(dst)) = (roce::gid_ipv4(sgid), roce::gid_ipv4(dgid)) {
        let head = roce::ipv4_udp_header(src, 0, dst, roce::UDP_PORT, ib_len, 0);
        grh[20..].copy_from_slice(&head[..roce::IPV4_LEN]);
        (grh, SL_ROCE_V2_IPV4)
    } else {
        grh[0] = 0x60; // IP version 6
        grh[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        grh[6] = 17; // next header: UDP
        grh[7] = 64; // hop limit
        grh[8..24].copy_from_slice(sgid);
        grh[24..40].copy_from_slice(dgid);
        (grh, SL_ROCE_V2_IPV6)
    }
}

impl Qp {
    /// Sends a UD packet to multicast group `mgid`: on the UDP link one to the group's address
    /// (which every member device hears, this process's included: the kernel loops it back),
    /// else a copy to each device of this fabric with a QP in the group. Counted as one packet
    /// sent (none is lost for want of a member: a group may have none).
    pub(super) fn send_group(&mut self, w: &mut World, mgid: [u8; 16], bytes: Vec<u8>) {
        self.count(w, |c| {
            c.packets_sent += 1;
            c.bytes_sent += bytes.len() as u64;
        });
        let to: SmallVec<[Dest; 4]> = if w.devices[self.dev].udp.is_some() {
            let group = SocketAddrV4::new(crate::mcast::group_ipv4(&mgid), crate::roce::UDP_PORT);
            [Dest::Udp(group)].into_iter().collect()
        } else {
            (0..w.devices.len())
                .filter(|&d| w.devices[d].groups.has(&mgid))
                .map(Dest::Local)
                .collect()
        };
        let Some((&last, others)) = to.split_last() else {
            w.spare.give(bytes);
            return;
        };
        // (A datagram for the UDP link leaves as bytes: its receivers know the group by the
        // socket it comes to.)
        let group = |d: Dest| matches!(d, Dest::Local(_)).then(|| Box::new(mgid));
        for &d in others {
            let mut copy = w.spare.take(bytes.len());
            copy.extend_from_slice(&bytes);
            self.transmit(w, d, copy, None, group(d));
        }
        self.transmit(w, last, bytes, None, group(last));
    }

    pub(super) fn ud_receive(
        &mut self,
        w: &mut World,
        pkt: &Packet<'_>,
        frame: &Frame,
        wire_len: usize,
    ) {
        let Some(deth) = pkt.hdr.deth else {
            return;
        };
        if deth.qkey != self.attr.qkey {
            self.count(w, |c| c.messages_dropped += 1);
            return;
        }
        let Some((wqe, from_srq)) = self.take_recv(w) else {
            self.count(w, |c| c.messages_dropped += 1);
            return;
        };
        let needed = (GRH_LEN + pkt.payload.len()) as u64;
        if wqe.capacity() < needed {
            self.count(w, |c| c.messages_dropped += 1);
            if from_srq {
                let st = ibv_wc_status::IBV_WC_REM_INV_REQ_ERR;
                if !self.complete_recv(w, &wqe, true, st, &Received::default(), false) {
                    self.enter_error(w);
                }
            } else {
                self.untake_recv(w, wqe, false);
            }
            return;
        }
        let dgid = frame
            .mgid
            .as_deref()
            .copied()
            .unwrap_or(w.devices[self.dev].gid);
        let (grh, sl) = network_header(&frame.sgid, &dgid, wire_len);
        let written = w
            .scatter(self.dev, self.pd, &wqe.sges, 0, &grh, true)
            .and_then(|()| {
                w.scatter(
                    self.dev,
                    self.pd,
                    &wqe.sges,
                    GRH_LEN as u64,
                    pkt.payload,
                    true,
                )
            });
        let status = written.err().unwrap_or(ibv_wc_status::IBV_WC_SUCCESS);
        let r = Received {
            opcode: ibv_wc_opcode::IBV_WC_RECV,
            byte_len: needed as u32,
            imm: pkt.hdr.imm,
            src_qp: deth.src_qp,
            flags: ibv_wc_flags::IBV_WC_GRH.0,
            sl,
            ..Received::default()
        };
        let ok = self.complete_recv(w, &wqe, from_srq, status, &r, pkt.hdr.se);
        if !ok || written.is_err() {
            self.enter_error(w);
        }
    }
}
