//! ACKs: built per flow from its receive state, coalesced per round, packed several to a
//! UD message per peer (UC) or sent over the connection's control QP (RC, and UC while the
//! peer asks so: see [`ACKS_OVER_CTL_NS`]); and ACKs arriving from peers, checked to come from
//! the connection's peer before the transmit side sees them.

use uccl_tx::wire::{ACK_LEN, ANSWER_PATH, AckRepr};

use verbs_safe::Gid;

use crate::config::Mode;
use crate::engine::Engine;
use crate::error::Result;
use crate::io::GRH;
use crate::proto::{
    Ctl, UdItem, ack_request, ctl_copy, parse_ack_request, parse_ctl_copy, ud_items,
};
use crate::round::Cqe;
use crate::wrid;

/// How long a UC connection's ACKs go over its control QP after the peer asked for them so.
///
/// The UD QP they take otherwise is shared by every peer of the engine they go to: a peer that
/// floods it (or many at once, or an engine slower than its peers) uses up its receives, and
/// the device drops what finds none, so every other peer's ACKs are lost with the flood. The
/// engine sees it: a quarter of the receives a round can take or more were used in one round
/// (see [`ud_short`]). For [`DRY_NS`] after, its ACK requests (a timeout expired without an
/// ACK) ask for the ACKs over the connection's control QP, which has receives of its own and
/// is reliable, and the peer sends them there for this long. They cost more there (a SEND
/// each, and the RC ACK of the peer's NIC; under random loss far more, as RC recovers a lost
/// packet slowly), so only then: a UD QP that loses an ACK to the network does not ask.
pub(crate) const ACKS_OVER_CTL_NS: u64 = 10_000_000;

/// How long after its UD QP ran dry an engine's ACK requests ask for ACKs over the control QP.
pub(crate) const DRY_NS: u64 = 10_000_000;

/// Whether the engine's UD QP, which took `used` of its `depth` receives in one round, is short
/// of them: a round takes at most `budget` completions (shared with the data QPs'), and a few
/// UD messages, one a peer; a quarter of what a round can take or more is a flood.
pub(crate) fn ud_short(used: usize, depth: usize, budget: usize) -> bool {
    used > 0 && used >= depth.min(budget) / 4
}

impl Engine {
    /// A UD message arrived: its items, in order ([`ud_items`]): ACK headers (UC mode),
    /// advertisements or copies of control messages (see [`on_ud_ctl`](Self::on_ud_ctl)),
    /// ACK requests.
    pub(crate) fn on_ack_packet(&mut self, slot: u32, e: Cqe, now: u64) {
        self.io.ctrl_recv.owed.push(slot);
        if !e.ok || (e.byte_len as usize) < GRH {
            return;
        }
        let mut grh = [0u8; GRH];
        if !self.io.ctrl_recv.read(slot, 0, &mut grh) {
            self.stats.dropped_invalid += 1;
            return;
        }
        let from = AckSource::Ud {
            qpn: e.src_qp,
            gid: source_gid(&grh),
        };
        let len = e.byte_len as usize - GRH;
        let mut bytes = std::mem::take(&mut self.scratch.bytes);
        bytes.resize(len, 0);
        if !self.io.ctrl_recv.read(slot, GRH, &mut bytes) {
            self.stats.dropped_invalid += 1;
        } else {
            for item in ud_items(&bytes) {
                match item {
                    Some(UdItem::Ack(a)) => match AckRepr::from_bytes(a) {
                        Ok(ack) => self.on_ack(ack, from, now),
                        Err(_) => self.stats.dropped_invalid += 1,
                    },
                    Some(UdItem::Ctl(b)) => self.on_ud_ctl(b, from, now),
                    Some(UdItem::Ask(b)) => self.on_ack_request(b, from, now),
                    Some(UdItem::Void) | None => self.stats.dropped_invalid += 1,
                }
            }
        }
        self.scratch.bytes = bytes;
    }

    /// An advertisement over the UD QP: how a UC peer advertises its receive buffers (see
    /// `need.rs`), or a copy of one (or of a read) its control QP holds back (see
    /// `keepalive.rs`). It is taken, like one from the connection's control QP, if it comes
    /// from the connection's peer with the connection's tag (an earlier connection with the
    /// same id has another).
    fn on_ud_ctl(&mut self, b: &[u8], from: AckSource, now: u64) {
        let Some((fid, tag, msg)) = parse_ctl_copy(b) else {
            self.stats.dropped_invalid += 1;
            return;
        };
        if self.tag_from_peer(fid, from) != Some(tag) {
            self.stats.dropped_invalid += 1;
            return;
        }
        self.take_advert(fid, msg, now);
    }

    /// The peer asks for an ACK of connection `fid` (a timeout of its expired, UC): the
    /// connection's next ACK, staged this round, answers it. Only from the connection's peer
    /// with its tag; however many come, one ACK per connection per round goes back.
    fn on_ack_request(&mut self, b: &[u8], from: AckSource, now: u64) {
        let Some((fid, tag, seq, over_ctl)) =
            parse_ack_request(b).filter(|_| self.cfg.mode == Mode::Uc)
        else {
            self.stats.dropped_invalid += 1;
            return;
        };
        if self.tag_from_peer(fid, from) != Some(tag) {
            self.stats.dropped_invalid += 1;
            return;
        }
        let Some(c) = self.conns[usize::from(fid)].as_mut() else {
            return;
        };
        c.answer = Some(seq);
        if over_ctl {
            c.acks_over_ctl_until = now.saturating_add(ACKS_OVER_CTL_NS);
        }
        if c.ack_slot.is_some() {
            // An ACK staged before the request is older than it: built again in its place,
            // as the answer (it may go out before this round ends).
            self.stage_ack(fid, now);
        } else {
            self.mark_ack(fid);
        }
    }

    /// A timeout of connection `ci`'s flow expired: asks the peer for an ACK (UC), request
    /// `seq`, over the control QP if this engine's UD QP ran dry lately. A request that finds
    /// no UD send slot is dropped: the next expiry asks again.
    pub(crate) fn ask_for_ack(&mut self, ci: u16, seq: u16, now: u64) {
        let dry = (self.ud_dry_at).is_some_and(|t| now.saturating_sub(t) < DRY_NS);
        let Some(c) = self.conns.get(usize::from(ci)).and_then(Option::as_ref) else {
            return;
        };
        if self.cfg.mode != Mode::Uc || !c.is_open() {
            return;
        }
        let bytes = ack_request(c.peer_fid, c.peer_tag, seq, dry);
        let peer = c.peer;
        self.send_ud(peer, &bytes);
    }

    /// The ACK tag of open connection `fid`, if `from` is its peer (the peer engine's UD QP and
    /// GID, or the connection's own control QP).
    fn tag_from_peer(&self, fid: u16, from: AckSource) -> Option<u8> {
        let c = self.conns.get(usize::from(fid))?.as_ref()?;
        let p = &self.peers[c.peer];
        let peer = match from {
            AckSource::Ud { qpn, gid } => p.ctrl_qpn == qpn && p.gid == gid,
            AckSource::Conn(ci) => ci == fid,
        };
        (c.is_open() && peer).then_some(c.tag)
    }

    /// An ACK for flow `ack.fid`, arrived `from`. An ACK that does not come from the flow's
    /// peer (its control QP and GID, or the connection's own control QP) is counted and
    /// dropped: a peer can only acknowledge its own connections. One that does but carries
    /// another tag than the connection's is an earlier connection's with the same flow id,
    /// still on the wire: counted as stale and dropped.
    pub(crate) fn on_ack(&mut self, ack: AckRepr, from: AckSource, now: u64) {
        match self.tag_from_peer(ack.fid, from) {
            None => {
                self.stats.dropped_invalid += 1;
                return;
            }
            Some(tag) if tag != ack.tag => {
                self.stats.stale_acks += 1;
                return;
            }
            Some(_) => {}
        }
        self.stats.acks_received += 1;
        if let Some(c) = self.conns[usize::from(ack.fid)].as_mut() {
            c.heard = now;
        }
        self.tx.on_ack_seen(now, self.scratch.seen_since, &ack);
    }

    /// Builds the ACK of connection `ci` now and stages it for its peer, in place of one staged
    /// earlier and not sent yet (an ACK supersedes the ones before it), so what waits for a
    /// send slot is bounded by the connections, never by the chunks.
    pub(crate) fn stage_ack(&mut self, ci: u16, now: u64) {
        let grant = self.credits.grant(ci);
        let Some(c) = self.conns[usize::from(ci)].as_mut() else {
            return;
        };
        if !c.is_open() {
            return;
        }
        let mut ack = AckRepr {
            tag: c.peer_tag,
            ..c.rx.ack(c.peer_fid, grant, now)
        };
        if let Some(seq) = c.answer {
            // Kept until the ACK goes out: a later one staged in its place answers too.
            ack.path = ANSWER_PATH;
            ack.echo = seq;
        }
        let (next, beyond) = c.rx.ack_point();
        c.police.acked(grant, next, beyond);
        c.ack_due = None;
        self.stats.acks_sent += 1;
        if self.cfg.mode == Mode::Rc || now < c.acks_over_ctl_until {
            // The answer (if any) is kept until the ACK goes out (`flush_ctl`): an ACK staged
            // again before that answers too.
            c.ctl.ack = Some(Ctl::Ack(ack).to_bytes());
            // One staged ACK a connection: a UD copy of an older one goes (UC, switching).
            self.retire_ud_ack(ci);
            self.mark_ctl(ci);
            return;
        }
        // Back on the UD QP: an older ACK still waiting on the control QP goes.
        c.ctl.ack = None;
        let Ok(bytes) = ack.to_bytes() else { return };
        let (peer, slot) = (c.peer, c.ack_slot);
        if let Some(at) = slot {
            let at = usize::from(at);
            self.peers[peer].acks[at..at + ACK_LEN].copy_from_slice(&bytes);
            return;
        }
        let Some(at) = self.stage_ud(peer, &bytes) else {
            // No send slot free: this ACK is built again next round.
            self.mark_ack(ci);
            return;
        };
        self.peers[peer].staged.push(ci);
        if let Some(c) = self.conns[usize::from(ci)].as_mut() {
            c.ack_slot = Some(at);
        }
    }

    /// Appends `item` to peer `p`'s UD message, which goes at the end of the round (sent
    /// first if `item` does not fit); where it lies in it, or `None` if the message was full
    /// and no send slot was free to send it.
    fn stage_ud(&mut self, p: usize, item: &[u8]) -> Option<u16> {
        if self.peers[p].acks.len() + item.len() > self.io.ud_payload {
            self.send_ack_packet(p);
            if !self.peers[p].acks.is_empty() {
                return None;
            }
        }
        let peer = &mut self.peers[p];
        if peer.acks.is_empty() {
            self.scratch.peers.push(p);
        }
        let at = peer.acks.len() as u16;
        peer.acks.extend_from_slice(item);
        Some(at)
    }

    /// Tells the peer of connection `ci` of a receive buffer: over the UD QP on UC (in the
    /// message of the round, with the ACKs), where a lost one is asked for again
    /// ([`Ctl::NeedCts`]); over the control QP otherwise, for reads, when the peer asked and
    /// this end had nothing to send (see `need.rs`), or if the UD message is full and no UD
    /// send slot is free to send it.
    pub(crate) fn advertise(&mut self, ci: u16, msg: Ctl) {
        let bytes = msg.to_bytes();
        let ud = self.cfg.mode == Mode::Uc && matches!(msg, Ctl::Cts { .. });
        if ud && !self.advertise_reliably(ci) {
            let Some(c) = self.conns[usize::from(ci)].as_mut() else {
                return;
            };
            let (peer, copy) = (c.peer, ctl_copy(c.peer_fid, c.peer_tag, &bytes));
            if self.stage_ud(peer, &copy).is_some() {
                self.stats.ud_adverts += 1;
                return;
            }
        }
        if let Some(c) = self.conns[usize::from(ci)].as_mut() {
            c.ctl.backlog.push_back(bytes);
            self.mark_ctl(ci);
        }
    }

    /// Queues connection `ci` for an ACK at the end of the round.
    pub(crate) fn mark_ack(&mut self, ci: u16) {
        if let Some(c) = self.conns[usize::from(ci)].as_mut()
            && !c.in_acks
        {
            c.in_acks = true;
            self.scratch.acks.push(ci);
        }
    }

    /// Takes connection `ci`'s staged ACK back (it is going away).
    pub(crate) fn unstage_ack(&mut self, ci: u16) {
        self.retire_ud_ack(ci);
        if let Some(c) = self.conns[usize::from(ci)].as_mut() {
            c.ctl.ack = None;
        }
    }

    /// Takes connection `ci`'s ACK out of its peer's UD message, if one is there: the bytes
    /// become an ACK of no version, which the peer counts and drops.
    fn retire_ud_ack(&mut self, ci: u16) {
        let Some(c) = self.conns[usize::from(ci)].as_mut() else {
            return;
        };
        if let Some(at) = c.ack_slot.take() {
            let p = &mut self.peers[c.peer];
            let at = usize::from(at);
            p.acks[at..at + ACK_LEN].fill(0);
            p.staged.retain(|&x| x != ci);
        }
    }

    /// ACKs for every connection that received something this round, and window updates for
    /// those whose grant changed; then the staged ACK packets go out.
    pub(crate) fn send_acks(&mut self, now: u64) -> Result<()> {
        while let Some(&(due, ci)) = self.scratch.delayed.front() {
            if due > now {
                break;
            }
            self.scratch.delayed.pop_front();
            if self.conns[usize::from(ci)]
                .as_ref()
                .is_some_and(|c| c.ack_due == Some(due))
            {
                self.mark_ack(ci);
            }
        }
        let mut changed = std::mem::take(&mut self.scratch.changed);
        self.credits.take_changed(&mut changed);
        for &ci in &changed {
            self.mark_ack(ci);
        }
        changed.clear();
        self.scratch.changed = changed;
        let acks = std::mem::take(&mut self.scratch.acks);
        for &ci in &acks {
            if let Some(c) = self.conns[usize::from(ci)].as_mut() {
                c.in_acks = false;
                self.stage_ack(ci, now);
            }
        }
        let mut acks = acks;
        acks.clear();
        // ACKs that found no send slot were queued again for the next round: keep them.
        if self.scratch.acks.is_empty() {
            self.scratch.acks = acks;
        }
        let peers = std::mem::take(&mut self.scratch.peers);
        for &p in &peers {
            self.send_ack_packet(p);
        }
        let mut peers = peers;
        peers.retain(|&p| !self.peers[p].acks.is_empty());
        self.scratch.peers = peers;
        Ok(())
    }

    /// Sends what is staged for peer `p` (ACKs, advertisements) as one UD message (if a send
    /// slot is free; else it waits for the next round).
    pub(crate) fn send_ack_packet(&mut self, p: usize) {
        if self.peers[p].acks.is_empty() {
            return;
        }
        let acks = std::mem::take(&mut self.peers[p].acks);
        let sent = self.send_ud(p, &acks);
        self.peers[p].acks = acks;
        if !sent {
            return;
        }
        self.stats.ack_packets += 1;
        let peer = &mut self.peers[p];
        peer.acks.clear();
        for &ci in &peer.staged {
            if let Some(c) = self.conns[usize::from(ci)].as_mut() {
                c.ack_slot = None;
                if c.answer.take().is_some() {
                    self.stats.ack_answers += 1;
                }
            }
        }
        peer.staged.clear();
    }

    /// Sends `bytes` to peer `p`'s UD QP as one message; false if no send slot was free or the
    /// post failed (what it carries is repeated later: ACKs by the next ones, copied control
    /// messages at the next probe).
    pub(crate) fn send_ud(&mut self, p: usize, bytes: &[u8]) -> bool {
        let Some(i) = self.io.ctrl_send.take(bytes) else {
            return false;
        };
        let peer = &self.peers[p];
        let s = &mut self.io.ctrl_send.slots[i as usize];
        s.wr.wr_id = wrid::ud_send(i);
        s.wr.wr.ud.ah = peer.ah.as_raw();
        s.wr.wr.ud.remote_qpn = peer.ctrl_qpn;
        s.wr.wr.ud.remote_qkey = peer.qkey;
        match self
            .io
            .ctrl_qp
            .post_slots(&mut self.io.ctrl_send.slots, &[i])
        {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "a send on the UD QP failed");
                self.io.ctrl_send.give_back(i);
                false
            }
        }
    }
}

/// Where an ACK came from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum AckSource {
    /// A UD message from control QP `qpn` at `gid` (UC mode).
    Ud { qpn: u32, gid: Gid },
    /// Connection `ci`'s own control QP (RC mode, and UC while this end asks for ACKs there).
    Conn(u16),
}

/// The source GID of a UD message, from the 40 bytes before its payload: a GRH (IPv6: the
/// source at bytes 8..24), or on RoCEv2 over IPv4 20 unused bytes then the IPv4 header (the
/// source address at bytes 32..36, as the IPv4-mapped GID `::ffff:a.b.c.d`).
pub(crate) fn source_gid(grh: &[u8; GRH]) -> Gid {
    let mut g = [0u8; 16];
    if grh[..20].iter().all(|&b| b == 0) && grh[20] >> 4 == 4 {
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&grh[32..36]);
    } else {
        g.copy_from_slice(&grh[8..24]);
    }
    Gid(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_source_gid_is_read_from_a_grh_or_an_ipv4_header() {
        let mut v6 = [0u8; GRH];
        v6[0] = 0x60;
        v6[8..24].copy_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(source_gid(&v6).0[..2], [0xfe, 0x80]);
        assert_eq!(source_gid(&v6).0[15], 8);
        let mut v4 = [0u8; GRH];
        v4[20] = 0x45;
        v4[32..36].copy_from_slice(&[10, 0, 0, 7]);
        let g = source_gid(&v4).0;
        assert_eq!(g[..12], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
        assert_eq!(g[12..], [10, 0, 0, 7]);
    }
}
