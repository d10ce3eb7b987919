//! The peer engines an engine talks to: where each one's ACKs go (its UD control QP, through an
//! address handle), found in O(1) by the GID, QP number and Q_Key its handshake gave, and freed
//! with the last connection to it (so a peer that connects from ever new QP numbers does not
//! grow the table).
//!
//! The Q_Key is part of a peer's address: an engine that restarted and was given the same UD QP
//! number comes back with another Q_Key, and is another peer than the one its old connections
//! (until they are reaped) were to; and a handshake that names a connected engine's UD QP with
//! another Q_Key than that engine's gets a peer of its own, whose messages that engine's QP
//! drops, rather than sharing the real one's.

use std::collections::HashMap;
use std::sync::Arc;

use verbs_safe::{Ah, Gid};

use crate::engine::Engine;
use crate::error::{EngineError, Result};

/// Another engine this one talks to: where its ACKs go (UC mode).
pub(crate) struct Peer {
    pub(crate) gid: Gid,
    pub(crate) ctrl_qpn: u32,
    /// Its UD QP's Q_Key (from its handshake).
    pub(crate) qkey: u32,
    pub(crate) ah: Arc<Ah>,
    /// The UD message staged for it (sent at the end of the round): its items, ACK headers
    /// and advertisements (see `proto::ud_items`).
    pub(crate) acks: Vec<u8>,
    /// The connections whose ACK is in `acks`.
    pub(crate) staged: Vec<u16>,
    /// Connections to it (it goes with the last).
    conns: u32,
}

/// The peers, by index (what a connection keeps) and by address.
#[derive(Default)]
pub(crate) struct Peers {
    slots: Vec<Option<Peer>>,
    free: Vec<usize>,
    by_addr: HashMap<(Gid, u32, u32), usize>,
}

impl Peers {
    /// Peers held now.
    pub(crate) fn len(&self) -> usize {
        self.by_addr.len()
    }
}

impl std::ops::Index<usize> for Peers {
    type Output = Peer;
    /// A peer a connection holds (live while the connection is).
    fn index(&self, i: usize) -> &Peer {
        self.slots[i].as_ref().expect("a connection's peer is held")
    }
}

impl std::ops::IndexMut<usize> for Peers {
    fn index_mut(&mut self, i: usize) -> &mut Peer {
        self.slots[i].as_mut().expect("a connection's peer is held")
    }
}

impl Engine {
    /// The connection of this engine that a handshake `h` would share its peer's UD messages
    /// with: one to the same UD QP and Q_Key, which the peer calls by the same id and whose
    /// ACK tag is the same. The peer tells them apart by nothing else, so what this engine
    /// sends there for the new one (advertisements of receives, ACKs) would be taken for the
    /// other's: a handshake that speaks for the engine at that address. (An engine gives each
    /// of its live connections an id of its own, and one that reuses the id of a connection it
    /// closed starts the new control QP at another PSN: its tag is another with 127 chances in
    /// 128.) Set-up only: a look at every connection.
    pub(crate) fn speaks_for(&self, h: &crate::proto::Hello) -> Option<crate::engine::ConnId> {
        let &peer = self.peers.by_addr.get(&(h.gid, h.ctrl_qpn, h.qkey))?;
        let tag = crate::setup::ack_tag(h.conn_psn);
        (self.conns.iter().flatten())
            .find(|c| c.peer == peer && c.peer_fid == h.fid && c.peer_tag == tag)
            .map(|c| c.id)
    }

    /// The peer engine at `gid`/`lid` with control QP `ctrl_qpn` of Q_Key `qkey`, added if
    /// new, held for one more connection (give it back with
    /// [`release_peer`](Self::release_peer)).
    pub(crate) fn hold_peer(
        &mut self,
        gid: Gid,
        lid: u16,
        ctrl_qpn: u32,
        qkey: u32,
    ) -> Result<usize> {
        if let Some(&i) = self.peers.by_addr.get(&(gid, ctrl_qpn, qkey)) {
            self.peers[i].conns += 1;
            return Ok(i);
        }
        let ah = self
            .io
            .pd
            .create_ah(self.io.from, lid, Some(gid))
            .map_err(EngineError::verbs("creating an address handle for a peer"))?;
        self.io.ctrl_qp.pin_ah(&ah);
        let peer = Peer {
            gid,
            ctrl_qpn,
            qkey,
            ah,
            acks: Vec::new(),
            staged: Vec::new(),
            conns: 1,
        };
        let p = &mut self.peers;
        let i = match p.free.pop() {
            Some(i) => {
                p.slots[i] = Some(peer);
                i
            }
            None => {
                p.slots.push(Some(peer));
                p.slots.len() - 1
            }
        };
        p.by_addr.insert((gid, ctrl_qpn, qkey), i);
        Ok(i)
    }

    /// A connection to peer `i` went: with the last one, the peer goes (its address handle is
    /// unpinned; the UD QP's table keeps it until the sends naming it are done).
    pub(crate) fn release_peer(&mut self, i: usize) {
        let p = &mut self.peers[i];
        p.conns -= 1;
        if p.conns > 0 {
            return;
        }
        let p = self.peers.slots[i].take().expect("held");
        self.peers.by_addr.remove(&(p.gid, p.ctrl_qpn, p.qkey));
        self.peers.free.push(i);
        self.io.ctrl_qp.pins().unpin_ah(&p.ah);
        // Its staged ACKs (holes its connections left) go with it.
        self.scratch.peers.retain(|&x| x != i);
    }
}
