//! What XRC QPs add to RC's (see `crate::xrc`): an initiator is an RC requester whose packets
//! carry XRC opcodes and, in each request, the XRCETH naming the remote SRQ; a target is an
//! RC responder whose requests each bind the SRQ they name, whose PD and CQ it then uses.
//! Packets in are read as RC's ([`as_rc`]), so the RC state machines serve both unchanged.

use super::{InMsg, Qp, WqeMeta};
use crate::packet::{Headers, Packet, opcode, psn_diff};
use crate::state::World;
use crate::xrc::{NONE, Role};

/// An XRC packet read as RC's: its opcode without the XRC prefix (its XRCETH kept), or `None`
/// if it is not an XRC packet.
pub(super) fn as_rc<'a>(pkt: &Packet<'a>) -> Option<Packet<'a>> {
    if pkt.hdr.opcode & 0xe0 != opcode::XRC {
        return None;
    }
    Some(Packet {
        hdr: Headers {
            opcode: pkt.hdr.opcode & 0x1f,
            ..pkt.hdr
        },
        payload: pkt.payload,
    })
}

impl Qp {
    /// An XRC target QP.
    pub(crate) fn is_xrc_target(&self) -> bool {
        matches!(self.xrc, Some(Role::Target { .. }))
    }

    /// The XRCETH of a request of `wqe`: the SRQ it names, if this is an XRC initiator.
    pub(super) fn xrceth(&self, wqe: &WqeMeta) -> Option<u32> {
        (self.xrc == Some(Role::Initiator)).then_some(wqe.srqn)
    }

    /// `hdr` as an XRC QP puts it on the wire, its RC opcode with the XRC prefix (`None`: as
    /// it is, for any other QP, and a CNP).
    pub(super) fn xrc_headers(&self, hdr: &Headers) -> Option<Headers> {
        if self.xrc.is_none() || hdr.opcode >= opcode::UC {
            return None;
        }
        Some(Headers {
            opcode: opcode::XRC | hdr.opcode,
            ..*hdr
        })
    }

    /// A target's request `pkt` (read as RC's), in sequence, binds the SRQ its XRCETH names:
    /// the SRQ its receives come from, whose PD its remote accesses are checked against and
    /// whose CQ they complete in. False if it names none that is an XRC SRQ of this QP's
    /// domain, or another than the message in progress took. A packet out of sequence binds
    /// nothing: a duplicate is answered from what it did (a READ's responses under the PD it
    /// was checked against), one ahead is dropped.
    #[inline(always)]
    pub(super) fn bind_srq(&mut self, w: &World, pkt: &Packet<'_>) -> bool {
        let Some(Role::Target { domain, .. }) = self.xrc else {
            return true;
        };
        if psn_diff(pkt.hdr.psn, self.resp.epsn) != 0 {
            return true;
        }
        let Some(srqn) = pkt.hdr.xrceth else {
            return false;
        };
        let bound = self.srq.and_then(|id| w.srqs.get(&id));
        if bound.is_some_and(|s| s.srqn == srqn) {
            // (Domain checked when it was bound; an SRQ destroyed unbinds.)
            return true;
        }
        let Some((id, s, x)) = w.devices[self.dev].srqns.get(&srqn).and_then(|&id| {
            let s = w.srqs.get(&id)?;
            Some((id, s, s.xrc.filter(|x| x.domain == domain)?))
        }) else {
            return false;
        };
        if !matches!(self.resp.cur, InMsg::Idle) {
            return false;
        }
        self.srq = Some(id);
        self.pd = s.pd;
        self.recv_cq = x.cq;
        true
    }

    /// An XRC target lets go of the SRQ it bound, which is being destroyed, and of a message
    /// in progress into it (its WQE goes with the SRQ).
    pub(crate) fn unbind_srq(&mut self) {
        self.srq = None;
        self.pd = NONE;
        self.recv_cq = NONE;
        if let InMsg::Send { from_srq: true, .. } = self.resp.cur {
            self.resp.cur = InMsg::Idle;
        }
    }
}
