//! Connection set-up: each end creates its QPs and describes them in a handshake ([`Hello`]),
//! the two handshakes are exchanged out of band (over TCP, as rdma-core's pingpongs and
//! perftest do, without blocking the engine: see `dial.rs`; or in process), and each end
//! connects its QPs to the other's.

use std::collections::VecDeque;

use uccl_tx::PathId;
use verbs_safe::{AccessFlags, Init, Mtu, Qp, QpCaps, QpInit, Rc, Remote, Uc};

use crate::config::Mode;
use crate::conn::{self, Conn, Ctl, CtlQp, DataQp, RECV_IDS, State};
use crate::cts::CtsOrder;
use crate::engine::{ConnId, Engine};
use crate::error::{EngineError, Result};
use crate::io::{self, CONTROLLED_QKEY};
use crate::proto::{CTL_LEN, CTL_PACK, Hello, feature};
use crate::rx::RxFlow;

/// The QPs of a connection offered and not yet connected.
pub(crate) struct Offer {
    id: ConnId,
    hello: Hello,
    data: Vec<InitQp>,
    ctl: Qp<Rc, Init>,
}

enum InitQp {
    Uc(Qp<Uc, Init>),
    Rc(Qp<Rc, Init>),
}

/// The ACK tag of the connection whose control QP starts at `conn_psn`: its low 7 bits, which
/// both ends know from the handshake.
pub(crate) fn ack_tag(conn_psn: u32) -> u8 {
    (conn_psn & u32::from(uccl_tx::wire::MAX_TAG)) as u8
}

impl Engine {
    /// Creates the QPs of a new connection and returns its id and the handshake to send to the
    /// peer; [`complete`](Self::complete) it with the peer's. (For an exchange the caller runs
    /// itself; [`connect`](Self::connect) and [`accept`](Self::accept) do it over TCP.)
    pub fn offer(&mut self) -> Result<(ConnId, Vec<u8>)> {
        self.unsettle();
        let free =
            (0..self.conns.len()).find(|&i| self.conns[i].is_none() && self.offers[i].is_none());
        let index = match free {
            Some(i) => i,
            None if (self.conns.len() as u32) < self.cfg.max_conns => {
                self.conns.push(None);
                self.offers.push(None);
                self.conns.len() - 1
            }
            None => {
                return Err(EngineError::Limit {
                    what: "connections",
                    limit: self.cfg.max_conns.into(),
                });
            }
        };
        let (send_need, ctl_need) = self.cq_needs();
        self.io.send_credits.reserve(send_need)?;
        if let Err(e) = self.io.ctrl_credits.reserve(ctl_need) {
            self.io.send_credits.release(send_need);
            return Err(e);
        }
        match self.create_qps(index as u16) {
            Ok(offer) => {
                let hello = offer.hello.to_bytes();
                let id = offer.id;
                self.offers[index] = Some(offer);
                Ok((id, hello))
            }
            Err(e) => {
                self.io.send_credits.release(send_need);
                self.io.ctrl_credits.release(ctl_need);
                Err(e)
            }
        }
    }

    /// The completions a connection reserves of the CQ's send and control shares: every WR its
    /// queues can hold may complete (flushes included).
    pub(crate) fn cq_needs(&self) -> (u64, u64) {
        let send = u64::from(self.cfg.qps_per_conn) * u64::from(self.cfg.sq_depth);
        (send, 2 * u64::from(io::conn_ctrl_depth(&self.cfg)))
    }

    fn create_qps(&mut self, index: u16) -> Result<Offer> {
        let conn_psn = self.conn_psn(index);
        self.generation = self.generation.wrapping_add(1);
        let id = ConnId {
            engine: self.id,
            index,
            generation: self.generation,
        };
        let cfg = &self.cfg;
        let io = &self.io;
        let caps = QpCaps {
            max_send_wr: cfg.sq_depth,
            max_recv_wr: 0,
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let init = QpInit {
            send_cq: &io.cq,
            recv_cq: &io.cq,
            srq: Some(&io.srq),
            caps,
            sig_all: false,
        };
        let pins = &self.memory.pins;
        let verbs = EngineError::verbs("creating a data QP");
        // Peers write and (RC) read through the QP; what they reach is what the keys of exports
        // and receives grant, each with its own rights.
        let access = match cfg.mode {
            Mode::Uc => AccessFlags::REMOTE_WRITE,
            Mode::Rc => AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        };
        let mut data = Vec::with_capacity(usize::from(cfg.qps_per_conn));
        let mut qps = Vec::with_capacity(data.capacity());
        for _ in 0..cfg.qps_per_conn {
            // Every data QP checks its slots against the engine's one pin table: a buffer is
            // pinned once, whatever the number of connections.
            let q = match cfg.mode {
                Mode::Uc => {
                    let q = Qp::<Uc, _>::new(&io.pd, init.clone()).map_err(verbs)?;
                    InitQp::Uc(conn::init(q.with_pins(pins), cfg.port, access)?)
                }
                Mode::Rc => {
                    let q = Qp::<Rc, _>::new(&io.pd, init.clone()).map_err(verbs)?;
                    InitQp::Rc(conn::init(q.with_pins(pins), cfg.port, access)?)
                }
            };
            let qpn = match &q {
                InitQp::Uc(q) => q.qpn(),
                InitQp::Rc(q) => q.qpn(),
            };
            qps.push((qpn, self.rng.psn()));
            data.push(q);
        }
        let depth = io::conn_ctrl_depth(cfg);
        let ctl = Qp::<Rc, _>::new(
            &io.pd,
            QpInit {
                send_cq: &io.cq,
                recv_cq: &io.cq,
                srq: None,
                caps: QpCaps {
                    max_send_wr: depth,
                    max_recv_wr: depth,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sig_all: true,
            },
        )
        .map_err(EngineError::verbs("creating a connection's control QP"))?;
        let ctl = conn::init(ctl, cfg.port, AccessFlags::empty())?;
        let gid = io
            .ctx
            .query_gid(cfg.port, io.from.gid_index.into())
            .map_err(EngineError::verbs("reading the GID"))?;
        let lid = io
            .ctx
            .query_port(cfg.port)
            .map_err(EngineError::verbs("querying the port"))?
            .lid;
        let now = self.clock.now();
        let hello = Hello {
            features: if cfg.mode == Mode::Rc { feature::RC } else { 0 },
            max_chunk: cfg.tx.chunk_size,
            gid,
            lid,
            ctrl_qpn: io.ctrl_qp.qpn(),
            qkey: io.qkey,
            fid: index,
            credit: self.credits.open(index, now),
            conn_qpn: ctl.qpn(),
            conn_psn,
            qps,
        };
        Ok(Offer {
            id,
            hello,
            data,
            ctl,
        })
    }

    /// Connects offered connection `conn` to the peer whose handshake is `peer`. On an error
    /// the offer is withdrawn (its QPs destroyed).
    pub fn complete(&mut self, conn: ConnId, peer: &[u8]) -> Result<()> {
        self.unsettle();
        let offer = self
            .offers
            .get_mut(usize::from(conn.index))
            .and_then(|o| o.take_if(|o| o.id == conn))
            .ok_or(EngineError::NoConnection(conn))?;
        let r = self.connect_offer(offer, peer);
        // A connection that was built and then failed is torn down (and its reservations
        // returned) like any other; one that was never built returns them here.
        let built = self.conns[usize::from(conn.index)]
            .as_ref()
            .is_some_and(|c| c.id == conn);
        if r.is_err() && !built {
            let (send, ctl) = self.cq_needs();
            self.io.send_credits.release(send);
            self.io.ctrl_credits.release(ctl);
            self.credits.close(conn.index, self.clock.now());
        }
        r
    }

    fn connect_offer(&mut self, offer: Offer, peer: &[u8]) -> Result<()> {
        let _span = tracing::info_span!("connect", conn = offer.id.index).entered();
        let bad = |reason: String| EngineError::Handshake {
            peer: "peer".into(),
            reason,
        };
        let h = Hello::parse(peer).map_err(|e| bad(e.to_string()))?;
        let mine = &offer.hello;
        if h.features != mine.features {
            return Err(bad(format!(
                "the peer's data QPs are {}, this engine's {}",
                if h.features & feature::RC != 0 {
                    "RC"
                } else {
                    "UC"
                },
                if mine.features & feature::RC != 0 {
                    "RC"
                } else {
                    "UC"
                },
            )));
        }
        if h.qps.len() != offer.data.len() {
            return Err(bad(format!(
                "the peer offers {} data QPs, this engine {}",
                h.qps.len(),
                offer.data.len()
            )));
        }
        if self.cfg.mode == Mode::Uc && self.cfg.tx.chunk_size > h.max_chunk {
            return Err(bad(format!(
                "chunks of {} bytes do not fit the peer's {}-byte receive buffers",
                self.cfg.tx.chunk_size, h.max_chunk
            )));
        }
        if h.qkey & CONTROLLED_QKEY != 0 {
            return Err(bad(format!(
                "the peer's control Q_Key {:#x} is a controlled one",
                h.qkey
            )));
        }
        if let Some(other) = self.speaks_for(&h) {
            return Err(bad(format!(
                "it names the UD QP {:#x} (and Q_Key) of a connected engine, and that engine's \
                 id {} and ACK tag of a connection, which connection {other} of this engine has \
                 already: what this engine sends there would be taken for that connection's",
                h.ctrl_qpn, h.fid
            )));
        }
        let index = offer.id.index;
        let route = conn::Route {
            from: self.io.from,
            mtu: self.path_mtu()?,
            timeout: conn::rc_timeout(self.cfg.tx.max_silence_us),
        };
        let remote = |qpn, psn| Remote {
            qpn,
            psn,
            lid: h.lid,
            gid: Some(h.gid),
        };
        let mut qps = Vec::with_capacity(offer.data.len());
        for (lane, (q, &(qpn, their))) in offer.data.into_iter().zip(&h.qps).enumerate() {
            let ours = mine.qps[lane].1;
            qps.push(match q {
                InitQp::Uc(q) => DataQp::Uc(conn::bring_up(q, remote(qpn, their), &route, ours)?),
                InitQp::Rc(q) => DataQp::Rc(conn::bring_up(q, remote(qpn, their), &route, ours)?),
            });
        }
        let ctl = conn::bring_up(
            offer.ctl,
            remote(h.conn_qpn, h.conn_psn),
            &route,
            mine.conn_psn,
        )?;
        let depth = io::conn_ctrl_depth(&self.cfg);
        let recv = io::RecvRing::new(&self.io.pd, depth, CTL_PACK * CTL_LEN, |i| {
            crate::wrid::ctl_recv(index, i)
        })?;
        let send = io::SendRing::new(&self.io.pd, depth, CTL_PACK * CTL_LEN, |i| {
            crate::wrid::ctl_send(index, i)
        })?;
        ctl.pin(recv.buf.as_ref().expect("control buffers"));
        ctl.pin(&send.buf);
        let paths = self.take_paths(index, qps.len())?;
        if let Err(e) = self.tx.open_flow_to(index, h.fid, &paths, h.credit) {
            self.spare_paths.extend_from_slice(&paths);
            return Err(e.into());
        }
        let peer = match self.hold_peer(h.gid, h.lid, h.ctrl_qpn, h.qkey) {
            Ok(p) => p,
            Err(e) => {
                let _ = self.tx.close_flow(index);
                self.spare_paths.extend_from_slice(&paths);
                return Err(e);
            }
        };
        for (lane, q) in qps.iter().enumerate() {
            self.data_qpns
                .insert(q.qpn(), u32::from(index) << 8 | lane as u32);
        }
        let mut c = Conn {
            id: offer.id,
            state: State::Open,
            peer,
            peer_fid: h.fid,
            tag: ack_tag(mine.conn_psn),
            peer_tag: ack_tag(h.conn_psn),
            qps,
            paths,
            ctl: Ctl {
                qp: CtlQp::Live(ctl),
                recv,
                send,
                backlog: VecDeque::new(),
                ack: None,
                close_slot: None,
                completions: 0,
                probed: false,
                copies: vec![0; depth as usize].into_boxed_slice(),
            },
            rx: RxFlow::default(),
            police: crate::police::Police::new(mine.credit),
            recvs: (0..RECV_IDS).map(|_| None).collect(),
            windows: (0..RECV_IDS).map(|_| None).collect(),
            window_ops: 0,
            recvs_posted: 0,
            next_seq: 0,
            cts: VecDeque::new(),
            cts_order: CtsOrder::default(),
            sends: VecDeque::new(),
            inflight: VecDeque::new(),
            first_msg: 0,
            next_write: 0,
            reads: Default::default(),
            in_reads: false,
            read_lane: 0,
            next_note: 0,
            notes_done: 0,
            serving: 0,
            in_readers: false,
            inbox: Default::default(),
            in_ready: false,
            in_acks: false,
            ack_due: None,
            in_ctl: false,
            ack_slot: None,
            answer: None,
            acks_over_ctl_until: 0,
            heard: self.clock.now(),
            in_keepalive: false,
            in_ctl_probe: false,
            asks: Default::default(),
            closed: None,
        };
        let posted = c.ctl.flush(index);
        self.conns[usize::from(index)] = Some(c);
        if let Err(e) = posted {
            // Torn down as any connection: its QPs flush, then it goes.
            self.fail_conn(index, "posting its control receives failed", false);
            return Err(EngineError::verbs(
                "posting a connection's control receives",
            )(e));
        }
        self.arm_idle_keepalive(index, self.clock.now());
        tracing::debug!(
            conn = index,
            peer_fid = h.fid,
            qps = h.qps.len(),
            "connection open"
        );
        Ok(())
    }

    /// `n` paths for connection `index` (its lanes in order): the paths of connections that
    /// went first, new ones after. On an error none is taken.
    fn take_paths(&mut self, index: u16, n: usize) -> Result<Vec<PathId>> {
        let mut paths = Vec::with_capacity(n);
        for lane in 0..n {
            let p = match self.spare_paths.pop() {
                Some(p) => self.tx.reuse_path(p, self.cfg.sq_depth).map(|()| p),
                None => self.tx.add_path(self.cfg.sq_depth).inspect(|p| {
                    debug_assert_eq!(usize::from(p.0), self.paths.len());
                    self.paths.push((index, lane as u16));
                }),
            };
            match p {
                Ok(p) => {
                    self.paths[usize::from(p.0)] = (index, lane as u16);
                    paths.push(p);
                }
                Err(e) => {
                    self.spare_paths.extend_from_slice(&paths);
                    return Err(e.into());
                }
            }
        }
        Ok(paths)
    }

    /// The path MTU the engine's QPs use: the configured one, capped by the port's.
    fn path_mtu(&self) -> Result<Mtu> {
        let port = self
            .io
            .ctx
            .query_port(self.cfg.port)
            .map_err(EngineError::verbs("querying the port"))?;
        Ok(port.active_mtu.min(self.cfg.path_mtu))
    }

    /// A random first PSN for the control QP of a new connection in slot `index`, whose ACK tag
    /// (its low bits) differs from that of the connection before it in the slot: an ACK of the
    /// earlier connection still on the wire is then told apart (see `AckRepr::tag`).
    fn conn_psn(&mut self, index: u16) -> u32 {
        let slot = usize::from(index);
        if self.last_tags.len() <= slot {
            self.last_tags.resize(slot + 1, u8::MAX);
        }
        loop {
            let psn = self.rng.psn();
            if ack_tag(psn) != self.last_tags[slot] {
                self.last_tags[slot] = ack_tag(psn);
                return psn;
            }
        }
    }

    /// Withdraws an offer that will not complete (its peer is gone, or the out-of-band
    /// exchange failed): its QPs and reservations are returned. Nothing happens to an id that
    /// is not an outstanding offer.
    pub fn withdraw(&mut self, id: ConnId) {
        self.unsettle();
        if let Some(slot) = self.offers.get_mut(usize::from(id.index))
            && slot.take_if(|o| o.id == id).is_some()
        {
            let (send, ctl) = self.cq_needs();
            self.io.send_credits.release(send);
            self.io.ctrl_credits.release(ctl);
            self.credits.close(id.index, self.clock.now());
        }
    }
}

/// Connects `a` and `b`, two engines of one process, without TCP; returns each one's id of
/// the connection.
pub fn connect_pair(a: &mut Engine, b: &mut Engine) -> Result<(ConnId, ConnId)> {
    let (ca, ha) = a.offer()?;
    let (cb, hb) = match b.offer() {
        Ok(x) => x,
        Err(e) => {
            a.withdraw(ca);
            return Err(e);
        }
    };
    if let Err(e) = a.complete(ca, &hb) {
        b.withdraw(cb);
        return Err(e);
    }
    if let Err(e) = b.complete(cb, &ha) {
        a.fail_conn(
            ca.index,
            "the other end of the connection failed to connect",
            false,
        );
        return Err(e);
    }
    Ok((ca, cb))
}
