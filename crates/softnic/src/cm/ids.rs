//! The CM's tables: ids, channels, communication IDs, ports, timers and counters.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddrV4;

use super::{CmEvent, CmEventKind, ConnParam, PortSpace};
use crate::cq::Events;

/// The id softnic's CM uses in the fabric's timer set (no QP id reaches it: see `table.rs`).
pub(crate) const CM_TIMER: u32 = u32::MAX;

/// What the CM did, per device: for tests and for a peer's misbehaviour to be seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmCounters {
    /// MADs sent (retransmissions included).
    pub mads_sent: u64,
    /// MADs taken in that parsed.
    pub mads_received: u64,
    /// MADs sent again after a timeout.
    pub retransmits: u64,
    /// Datagrams to QP1 that were no CM MAD (bad length, class, method, attribute, field,
    /// Q_Key), dropped.
    pub malformed: u64,
    /// MADs that parsed but named no connection of this device, came from another peer than
    /// the connection's, or did not fit its state: dropped (answered where the IBTA says so).
    pub unexpected: u64,
    /// Duplicates taken: answered (MRA for a REQ being decided, REP or RTU again, DREP for a
    /// DREQ in time-wait) or not yet (a DREQ whose DREP waits for this end's caller).
    pub duplicates: u64,
    /// REJs sent (nobody listening, the application's reject).
    pub rejects_sent: u64,
    /// Connection requests dropped for a listener's full backlog (the requester sends them
    /// again after its timeout).
    pub backlog_drops: u64,
    /// Exchanges given up after every retry (REQ, REP, DREQ, SIDR REQ).
    pub timeouts: u64,
}

/// Where an id is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum St {
    Idle,
    Bound,
    AddrResolved,
    RouteResolved,
    Listen,
    /// Active: REQ (or SIDR REQ) sent, waiting for REP.
    ReqSent,
    /// Active without a QP: REP in, waiting for the caller's establish.
    RepRcvd,
    /// Passive: connection request handed to the application.
    ReqRcvd,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    Established,
    DreqSent,
    /// The peer's DREQ came and DISCONNECTED was reported; the QP is left to its owner, as
    /// by the kernel's CM. The DREP waits for the caller's `rdma_disconnect` (which moves the
    /// QP to ERROR) or destroy.
    DreqRcvd,
    TimeWait,
    /// Rejected, unreachable, or out of time-wait: only destroy is left.
    Done,
}

/// A message to send again until answered.
#[derive(Debug, Clone)]
pub(crate) struct Resend {
    pub(crate) mad: Box<[u8; super::mad::MAD_LEN]>,
    pub(crate) left: u8,
    pub(crate) every_ns: u64,
}

/// One CM id.
#[derive(Debug)]
pub(crate) struct Id {
    pub(crate) chan: u32,
    pub(crate) ps: PortSpace,
    pub(crate) st: St,
    pub(crate) dev: Option<usize>,
    /// The bound (or resolved) local address.
    pub(crate) src: Option<SocketAddrV4>,
    pub(crate) dst: Option<SocketAddrV4>,
    /// The peer's GID (where MADs go).
    pub(crate) peer_gid: [u8; 16],
    /// A child's listener.
    pub(crate) listener: Option<u32>,
    /// A listener's backlog and its connection requests not yet taken from the channel.
    pub(crate) backlog: u32,
    pub(crate) queued: u32,
    /// The attached QP (its id) and number.
    pub(crate) qp: Option<u32>,
    pub(crate) qpn: u32,
    pub(crate) local_comm: u32,
    pub(crate) remote_comm: u32,
    pub(crate) remote_qpn: u32,
    pub(crate) remote_qkey: u32,
    /// The PSN this side sends from, and the peer's.
    pub(crate) psn: u32,
    pub(crate) remote_psn: u32,
    /// Path MTU code.
    pub(crate) mtu: u8,
    /// This side's parameters (what its QP gets).
    pub(crate) param: ConnParam,
    /// The peer's, from its REQ or REP.
    pub(crate) peer: ConnParam,
    /// The transaction of the exchange under way.
    pub(crate) tid: u64,
    pub(crate) resend: Option<Resend>,
    pub(crate) due: Option<u64>,
    /// The last REP or RTU sent, for duplicates.
    pub(crate) last: Option<Box<[u8; super::mad::MAD_LEN]>>,
    /// Destroyed by its caller while its DREQ is unanswered: it lives on until answered.
    pub(crate) orphan: bool,
    /// The multicast groups it joined.
    pub(crate) groups: Vec<super::groups::Joined>,
    /// A listener bound to the any address on the UDP link: the names that announce it to
    /// the host's other processes (see [`loopback`](super::loopback)).
    pub(crate) announced: Vec<super::loopback::Announcement>,
}

impl Id {
    pub(crate) fn new(chan: u32, ps: PortSpace) -> Id {
        Id {
            chan,
            ps,
            st: St::Idle,
            dev: None,
            src: None,
            dst: None,
            peer_gid: [0; 16],
            listener: None,
            backlog: 0,
            queued: 0,
            qp: None,
            qpn: 0,
            local_comm: 0,
            remote_comm: 0,
            remote_qpn: 0,
            remote_qkey: 0,
            psn: 0,
            remote_psn: 0,
            mtu: 5,
            param: ConnParam::default(),
            peer: ConnParam::default(),
            tid: 0,
            resend: None,
            due: None,
            last: None,
            orphan: false,
            groups: Vec::new(),
            announced: Vec::new(),
        }
    }
}

/// An event channel.
pub(crate) struct Channel {
    pub(crate) events: Events<CmEvent>,
}

/// The connection manager of a fabric (every device's).
#[derive(Default)]
pub(crate) struct Cm {
    pub(crate) ids: BTreeMap<u32, Id>,
    pub(crate) channels: BTreeMap<u32, Channel>,
    pub(crate) next: u32,
    /// Local communication ID -> id.
    pub(crate) by_comm: BTreeMap<u32, u32>,
    /// (device, peer GID, peer's communication ID) -> id, for duplicate REQs.
    pub(crate) by_remote: BTreeMap<(usize, [u8; 16], u32), u32>,
    /// (port space, port) taken, and by how many ids.
    pub(crate) ports: BTreeMap<(PortSpace, u16), u32>,
    /// (due, id) of every id waiting for a timer.
    pub(crate) timers: BTreeSet<(u64, u32)>,
    /// Per device.
    pub(crate) counters: BTreeMap<usize, CmCounters>,
    /// Where communication IDs, PSNs and transaction IDs come from.
    pub(crate) secret: u64,
    pub(crate) serial: u64,
    pub(crate) gsi_psn: u32,
}

impl Cm {
    /// A fresh 32-bit value no peer can predict from the ones before (SplitMix64 of a counter
    /// under the fabric's secret; seeded on the virtual clock, so runs replay).
    pub(crate) fn fresh(&mut self) -> u32 {
        self.serial += 1;
        let mut z = self.secret ^ self.serial.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) as u32
    }

    /// A communication ID not in use (never 0).
    pub(crate) fn comm_id(&mut self) -> u32 {
        loop {
            let c = self.fresh();
            if c != 0 && !self.by_comm.contains_key(&c) {
                return c;
            }
        }
    }

    pub(crate) fn count(&mut self, dev: usize, f: impl FnOnce(&mut CmCounters)) {
        f(self.counters.entry(dev).or_default());
    }

    /// Queues an event on the id's channel and wakes its descriptor.
    pub(crate) fn event(&mut self, id: u32, kind: CmEventKind, status: i32) {
        let ev = CmEvent {
            kind,
            id: super::CmId(id),
            listen_id: None,
            status,
            private: Vec::new(),
            param: ConnParam::default(),
            peer_gid: [0; 16],
            addrs: None,
        };
        self.push(id, ev);
    }

    /// Queues a full event on the channel of id `on`.
    pub(crate) fn push(&mut self, on: u32, ev: CmEvent) {
        let Some(chan) = self.ids.get(&on).map(|i| i.chan) else {
            return;
        };
        if let Some(c) = self.channels.get_mut(&chan) {
            c.events.push(ev);
        }
    }

    /// Takes a port for an id: `port` itself (EADDRINUSE if taken, unless `share`), or a
    /// free ephemeral one for 0.
    pub(crate) fn take_port(&mut self, ps: PortSpace, port: u16) -> Option<u16> {
        if port != 0 {
            if self.ports.contains_key(&(ps, port)) {
                return None;
            }
            self.ports.insert((ps, port), 1);
            return Some(port);
        }
        let start = 32768 + (self.fresh() % 28000) as u16;
        let free = (0..28000u16)
            .map(|i| 32768 + (start - 32768 + i) % 28000)
            .find(|p| !self.ports.contains_key(&(ps, *p)))?;
        self.ports.insert((ps, free), 1);
        Some(free)
    }

    /// Gives a port back.
    pub(crate) fn release_port(&mut self, ps: PortSpace, port: u16) {
        if let Some(n) = self.ports.get_mut(&(ps, port)) {
            *n -= 1;
            if *n == 0 {
                self.ports.remove(&(ps, port));
            }
        }
    }
}
