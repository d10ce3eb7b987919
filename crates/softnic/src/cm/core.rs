//! The CM protocol: MADs in and out of QP1, what each message does to a connection, and the
//! timers that send lost messages again or give up.

use super::ids::{CM_TIMER, Resend, St};
use super::mad::{self, IpHeader, MAD_LEN, Msg, Rej, Rep, private, reject};
use super::{CmEvent, CmEventKind, CmId, ConnParam, MAX_RETRIES, PortSpace, RESPONSE_TIMEOUT};
use crate::link::Frame;
use crate::packet::{Deth, Headers, Packet, opcode};
use crate::qp::Transport;
use crate::state::{State, World};

/// `-ETIMEDOUT`, the status of an exchange the peer never answered.
const TIMED_OUT: i32 = -libc::ETIMEDOUT;

impl World {
    /// Sends a MAD from device `dev`'s QP1 to QP1 of the port with GID `to`.
    pub(crate) fn send_mad(&mut self, dev: usize, to: &[u8; 16], mad: &[u8; MAD_LEN]) {
        self.cm.count(dev, |c| c.mads_sent += 1);
        let Some(dest) = self.route(dev, to) else {
            self.devices[dev].counters.packets_dropped += 1;
            return;
        };
        self.cm.gsi_psn = (self.cm.gsi_psn + 1) & crate::packet::PSN_MASK;
        let hdr = Headers {
            opcode: opcode::UD_SEND_ONLY,
            pkey: 0xffff,
            dest_qp: 1,
            psn: self.cm.gsi_psn,
            deth: Some(Deth {
                qkey: mad::GSI_QKEY,
                src_qp: 1,
            }),
            ..Headers::default()
        };
        let mut bytes = self.spare.take(hdr.wire_len(MAD_LEN));
        hdr.emit_unsealed(mad, &mut bytes);
        let frame = Frame {
            from: dev,
            to: dest,
            sport: self.sport(dev, 1),
            sgid: self.devices[dev].gid,
            bytes,
            sealed: false,
            gather: None,
            ecn: 0,
            at: None,
            mgid: None,
        };
        self.transmit(frame);
    }

    /// Sends `msg` for id `id` to its peer, and again every response timeout until answered
    /// (`resend`), or once.
    pub(crate) fn cm_send(&mut self, id: u32, msg: &Msg, resend: bool) {
        let Some(i) = self.cm.ids.get(&id) else {
            return;
        };
        let (Some(dev), peer, tid) = (i.dev, i.peer_gid, i.tid) else {
            return;
        };
        let mad = Box::new(msg.emit(tid));
        self.send_mad(dev, &peer, &mad);
        let i = self.cm.ids.get_mut(&id).expect("looked up above");
        if resend {
            let every_ns = 2 * super::ib_time_ns(RESPONSE_TIMEOUT);
            i.resend = Some(Resend {
                mad,
                left: MAX_RETRIES,
                every_ns,
            });
            let at = self.now + every_ns;
            self.cm_arm(id, at);
        } else {
            i.last = Some(mad);
        }
    }

    /// Arms id `id`'s timer for `at`.
    pub(crate) fn cm_arm(&mut self, id: u32, at: u64) {
        if let Some(i) = self.cm.ids.get_mut(&id) {
            i.due = Some(at);
            self.cm.timers.insert((at, id));
            self.timers.insert((at, CM_TIMER));
        }
    }

    /// Stops sending id `id`'s message again.
    pub(crate) fn cm_settle(&mut self, id: u32) {
        if let Some(i) = self.cm.ids.get_mut(&id) {
            i.resend = None;
            i.due = None;
        }
    }

    /// Answers a message that names no connection of ours, once, to `to` (no id).
    pub(super) fn answer(&mut self, dev: usize, to: &[u8; 16], tid: u64, msg: &Msg) {
        if matches!(msg, Msg::Rej(_)) {
            self.cm.count(dev, |c| c.rejects_sent += 1);
        }
        self.send_mad(dev, to, &msg.emit(tid));
    }

    /// The id of local communication ID `comm` on device `dev` talking to `from`.
    pub(super) fn conn(&mut self, dev: usize, from: &[u8; 16], comm: u32) -> Option<u32> {
        let id = *self.cm.by_comm.get(&comm)?;
        let i = &self.cm.ids[&id];
        if i.dev == Some(dev) && &i.peer_gid == from {
            Some(id)
        } else {
            None
        }
    }
}

impl State {
    /// A datagram to QP1 of device `dev`: a CM MAD, or counted as malformed and dropped.
    pub(crate) fn cm_receive(&mut self, dev: usize, pkt: &Packet<'_>, frame: &Frame) {
        let gsi = pkt.hdr.opcode == opcode::UD_SEND_ONLY
            && pkt.hdr.deth.is_some_and(|d| d.qkey == mad::GSI_QKEY);
        let parsed = if gsi {
            Msg::parse(pkt.payload).ok()
        } else {
            None
        };
        let Some((tid, msg)) = parsed else {
            self.w.cm.count(dev, |c| c.malformed += 1);
            return;
        };
        self.w.cm.count(dev, |c| c.mads_received += 1);
        let from = frame.sgid;
        let handled = match msg {
            Msg::Req(r) => self.on_req(dev, from, tid, &r),
            Msg::Rep(r) => self.on_rep(dev, from, &r),
            Msg::Rtu(l, r) => self.on_rtu(dev, from, l, r),
            Msg::Rej(r) => self.on_rej(dev, from, &r),
            Msg::Mra(_, r, what, t) => self.on_mra(dev, from, r, what, t),
            Msg::Dreq(l, r, _) => self.on_dreq(dev, from, tid, l, r),
            Msg::Drep(_, r) => self.on_drep(dev, from, r),
            Msg::SidrReq(rid, sid, p) => self.on_sidr_req(dev, from, tid, rid, sid, &p[..]),
            Msg::SidrRep(r) => self.on_sidr_rep(dev, from, &r),
        };
        if !handled {
            self.w.cm.count(dev, |c| c.unexpected += 1);
        }
    }

    /// The listener of device `dev` for `port` of `ps` at address `to`, if any.
    pub(super) fn listener(
        &self,
        dev: usize,
        ps: PortSpace,
        port: u16,
        to: std::net::Ipv4Addr,
    ) -> Option<u32> {
        self.w.cm.ids.iter().find_map(|(&id, i)| {
            let src = i.src?;
            let here = i.dev.is_none_or(|d| d == dev);
            // Bound to no device (the any address: 0.0.0.0, or loopback as the kernel takes
            // it), it listens at every address.
            let addr = i.dev.is_none() || *src.ip() == to;
            (i.st == St::Listen && i.ps == ps && src.port() == port && here && addr).then_some(id)
        })
    }

    /// A duplicate request: answered by what the id last sent (REP, SIDR REP) or an MRA for
    /// one still being decided. True if it was one.
    pub(super) fn duplicate_request(
        &mut self,
        dev: usize,
        from: [u8; 16],
        remote_comm: u32,
    ) -> bool {
        let Some(&id) = self.w.cm.by_remote.get(&(dev, from, remote_comm)) else {
            return false;
        };
        self.w.cm.count(dev, |c| c.duplicates += 1);
        let i = &self.w.cm.ids[&id];
        match (i.st, i.ps.transport()) {
            (St::ReqRcvd, Transport::Rc) => {
                let mra = Msg::Mra(i.local_comm, remote_comm, 0, RESPONSE_TIMEOUT + 2);
                self.w.cm_send(id, &mra, false);
            }
            (St::TimeWait | St::Done, Transport::Rc) => {
                // A request of a connection that is over: stale (IBTA 12.9.8.3.1).
                let rej = Msg::Rej(Box::new(Rej {
                    local_comm_id: i.local_comm,
                    remote_comm_id: remote_comm,
                    msg_rejected: 0,
                    reason: reject::STALE_CONN,
                    private: [0; private::REJ],
                }));
                let tid = i.tid;
                self.w.answer(dev, &from, tid, &rej);
            }
            (St::RepSent, _) | (St::Established, Transport::Ud) => {
                let last = i.resend.as_ref().map(|r| r.mad.clone()).or(i.last.clone());
                if let Some(m) = last {
                    self.w.send_mad(dev, &from, &m);
                }
            }
            _ => {}
        }
        true
    }

    /// A new connection request for `listener`: a new id on its channel, and the event.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new_request(
        &mut self,
        dev: usize,
        from: [u8; 16],
        tid: u64,
        listener: u32,
        remote_comm: u32,
        ip: IpHeader,
        peer: ConnParam,
        data: &[u8],
    ) -> u32 {
        let cm = &mut self.w.cm;
        let l = &cm.ids[&listener];
        let (chan, ps, port) = (l.chan, l.ps, l.src.map_or(0, |s| s.port()));
        let mut child = super::ids::Id::new(chan, ps);
        child.st = St::ReqRcvd;
        child.dev = Some(dev);
        let src = std::net::SocketAddrV4::new(ip.dst, port);
        let dst = std::net::SocketAddrV4::new(ip.src, ip.src_port);
        child.src = Some(src);
        child.dst = Some(dst);
        child.peer_gid = from;
        child.listener = Some(listener);
        child.tid = tid;
        child.remote_comm = remote_comm;
        child.local_comm = cm.comm_id();
        child.peer = peer;
        cm.next += 1;
        let id = cm.next;
        cm.by_comm.insert(child.local_comm, id);
        cm.by_remote.insert((dev, from, remote_comm), id);
        // A connection request's id shares its listener's port without holding it (as the
        // kernel's: the port can be bound again once the listener is gone).
        cm.ids.insert(id, child);
        if let Some(l) = cm.ids.get_mut(&listener) {
            l.queued += 1;
        }
        let ev = CmEvent {
            kind: CmEventKind::ConnectRequest,
            id: CmId(id),
            listen_id: Some(CmId(listener)),
            status: 0,
            private: data.get(mad::IP_HDR_LEN..).unwrap_or_default().to_vec(),
            param: peer,
            peer_gid: from,
            addrs: Some((src, dst)),
        };
        cm.push(listener, ev);
        id
    }

    fn on_req(&mut self, dev: usize, from: [u8; 16], tid: u64, r: &mad::Req) -> bool {
        if self.duplicate_request(dev, from, r.local_comm_id) {
            return true;
        }
        let rej = |reason| {
            Msg::Rej(Box::new(Rej {
                local_comm_id: 0,
                remote_comm_id: r.local_comm_id,
                msg_rejected: 0,
                reason,
                private: [0; private::REJ],
            }))
        };
        let ip = IpHeader::parse(&r.private);
        let listener = match (mad::split_service_id(r.service_id), ip) {
            (Some((code, port)), Some(ip)) if r.transport == 0 => PortSpace::from_code(code)
                .filter(|ps| ps.transport() == Transport::Rc)
                .and_then(|ps| self.listener(dev, ps, port, ip.dst)),
            _ => None,
        };
        let (Some(l), Some(ip)) = (listener, ip) else {
            self.w
                .answer(dev, &from, tid, &rej(reject::INVALID_SERVICE_ID));
            return true;
        };
        let li = &self.w.cm.ids[&l];
        if li.queued >= li.backlog {
            // Dropped, not rejected, as the kernel's CM does (rdma_ucm's handler says ENOMEM,
            // and ib_cm's `cm_destroy_id` does not reject "to allow future retries"): the
            // requester sends its REQ again after its timeout, and gets in once the listener
            // has taken a request off its backlog.
            self.w.cm.count(dev, |c| c.backlog_drops += 1);
            return true;
        }
        let peer = ConnParam {
            responder_resources: r.responder_resources,
            initiator_depth: r.initiator_depth,
            flow_control: r.flow_control,
            retry_count: r.retry_count,
            rnr_retry_count: r.rnr_retry,
            srq: r.srq,
            qp_num: r.qpn,
            qkey: 0,
        };
        let id = self.new_request(dev, from, tid, l, r.local_comm_id, ip, peer, &r.private);
        let port_mtu = super::ctl::mtu_code(self.w.cfg.mtu);
        let psn = self.w.cm.fresh() & crate::packet::PSN_MASK;
        let max = self.w.cfg.max_rd_atomic.min(255) as u8;
        let i = self.w.cm.ids.get_mut(&id).expect("just made");
        i.remote_qpn = r.qpn;
        i.remote_psn = r.starting_psn;
        i.mtu = r.mtu.min(port_mtu);
        // What `rdma_init_qp_attr` gives before the accept, as the kernel's CM keeps them from
        // the REQ (`cm_req_handler`): the PSN the REP will carry, the peer's retry counts, and
        // read depths that mirror the peer's, within the device's (a REQ may ask anything).
        // The accept narrows the depths.
        i.psn = psn;
        i.param = ConnParam {
            responder_resources: r.initiator_depth.min(max),
            initiator_depth: r.responder_resources.min(max),
            retry_count: r.retry_count,
            rnr_retry_count: r.rnr_retry,
            ..ConnParam::default()
        };
        true
    }

    fn on_rep(&mut self, dev: usize, from: [u8; 16], r: &Rep) -> bool {
        let Some(id) = self.w.conn(dev, &from, r.remote_comm_id) else {
            return false;
        };
        let i = &self.w.cm.ids[&id];
        match i.st {
            St::ReqSent if i.ps.transport() == Transport::Rc => {}
            St::Established | St::RepRcvd if r.local_comm_id == i.remote_comm => {
                let last = i.last.clone();
                self.w.cm.count(dev, |c| c.duplicates += 1);
                if let Some(m) = last {
                    self.w.send_mad(dev, &from, &m);
                }
                return true;
            }
            _ => return false,
        }
        self.w.cm_settle(id);
        let peer = ConnParam {
            responder_resources: r.responder_resources,
            initiator_depth: r.initiator_depth,
            flow_control: r.flow_control,
            retry_count: 0,
            rnr_retry_count: r.rnr_retry,
            srq: r.srq,
            qp_num: r.qpn,
            qkey: 0,
        };
        let i = self.w.cm.ids.get_mut(&id).expect("looked up above");
        i.remote_comm = r.local_comm_id;
        i.remote_qpn = r.qpn;
        i.remote_psn = r.starting_psn;
        i.peer = peer;
        i.param.responder_resources = i.param.responder_resources.min(r.initiator_depth);
        i.param.initiator_depth = i.param.initiator_depth.min(r.responder_resources);
        i.param.rnr_retry_count = r.rnr_retry;
        let has_qp = i.qp.is_some();
        i.st = St::RepRcvd;
        self.w.cm.by_remote.insert((dev, from, r.local_comm_id), id);
        let mut ev = CmEvent {
            kind: CmEventKind::ConnectResponse,
            id: CmId(id),
            listen_id: None,
            status: 0,
            private: r.private.to_vec(),
            param: peer,
            peer_gid: from,
            addrs: None,
        };
        if !has_qp {
            self.w.cm.push(id, ev);
            return true;
        }
        if self.cm_ready_qp(id).is_err() {
            let i = self.w.cm.ids.get_mut(&id).expect("there");
            i.st = St::Done;
            let rej = Msg::Rej(Box::new(Rej {
                local_comm_id: i.local_comm,
                remote_comm_id: i.remote_comm,
                msg_rejected: 1,
                reason: reject::CONSUMER_DEFINED,
                private: [0; private::REJ],
            }));
            self.w.cm.count(dev, |c| c.rejects_sent += 1);
            self.w.cm_send(id, &rej, false);
            ev.kind = CmEventKind::ConnectError;
            ev.status = -libc::EINVAL;
            self.w.cm.push(id, ev);
            return true;
        }
        self.cm_send_rtu(id);
        ev.kind = CmEventKind::Established;
        self.w.cm.push(id, ev);
        true
    }

    /// Sends the RTU of an active id whose QP is ready: the connection is up.
    pub(crate) fn cm_send_rtu(&mut self, id: u32) {
        let i = self.w.cm.ids.get_mut(&id).expect("a live id");
        i.st = St::Established;
        let rtu = Msg::Rtu(i.local_comm, i.remote_comm);
        self.w.cm_send(id, &rtu, false);
    }

    /// The connection of passive id `id`, whose REP went out, is up (its RTU came, or its
    /// user said the QP received: `rdma_notify`): ESTABLISHED, reported to its user.
    pub(crate) fn cm_passive_established(&mut self, id: u32) {
        self.w.cm_settle(id);
        let i = self.w.cm.ids.get_mut(&id).expect("a live id");
        i.st = St::Established;
        let ev = CmEvent {
            kind: CmEventKind::Established,
            id: CmId(id),
            listen_id: None,
            status: 0,
            private: Vec::new(),
            param: i.peer,
            peer_gid: i.peer_gid,
            addrs: None,
        };
        self.w.cm.push(id, ev);
    }

    fn on_rtu(&mut self, dev: usize, from: [u8; 16], local: u32, remote: u32) -> bool {
        let Some(id) = self.w.conn(dev, &from, remote) else {
            return false;
        };
        let i = &self.w.cm.ids[&id];
        if i.remote_comm != local {
            return false;
        }
        match i.st {
            St::RepSent => {
                self.cm_passive_established(id);
                true
            }
            St::Established | St::DreqSent | St::DreqRcvd | St::TimeWait => {
                self.w.cm.count(dev, |c| c.duplicates += 1);
                true
            }
            _ => false,
        }
    }

    fn on_rej(&mut self, dev: usize, from: [u8; 16], r: &Rej) -> bool {
        // A requester that gives up before it heard our REP (its id destroyed) never learnt
        // our communication ID: its timeout REJ names the request by its own (the kernel's
        // `cm_acquire_rejected_id` looks it up among the remote IDs for this reason).
        let found = if r.remote_comm_id == 0 && r.reason == reject::TIMEOUT {
            self.w
                .cm
                .by_remote
                .get(&(dev, from, r.local_comm_id))
                .copied()
        } else {
            self.w.conn(dev, &from, r.remote_comm_id)
        };
        let Some(id) = found else {
            return false;
        };
        let i = &self.w.cm.ids[&id];
        let ours = r.local_comm_id == 0 || i.remote_comm == 0 || r.local_comm_id == i.remote_comm;
        // A request waiting for `rdma_accept` (REQ_RCVD) is rejected too, as the kernel's
        // `cm_rej_handler` reports it.
        if !ours || !matches!(i.st, St::ReqSent | St::ReqRcvd | St::RepSent | St::RepRcvd) {
            return false;
        }
        self.w.cm_settle(id);
        self.cm_qp_error(id);
        self.w.cm.ids.get_mut(&id).expect("there").st = St::Done;
        let ev = CmEvent {
            kind: CmEventKind::Rejected,
            id: CmId(id),
            listen_id: None,
            status: i32::from(r.reason),
            private: r.private.to_vec(),
            param: ConnParam::default(),
            peer_gid: from,
            addrs: None,
        };
        self.w.cm.push(id, ev);
        true
    }

    fn on_mra(&mut self, dev: usize, from: [u8; 16], remote: u32, what: u8, t: u8) -> bool {
        let Some(id) = self.w.conn(dev, &from, remote) else {
            return false;
        };
        let i = self.w.cm.ids.get_mut(&id).expect("there");
        let waiting = matches!((i.st, what), (St::ReqSent, 0) | (St::RepSent, 1));
        let Some(r) = i.resend.as_mut().filter(|_| waiting) else {
            return false;
        };
        // The peer needs longer: wait as long as it says, on top of our own timeout.
        r.left = MAX_RETRIES;
        let at = self.w.now + super::ib_time_ns(t) + r.every_ns;
        self.w.cm_arm(id, at);
        true
    }

    fn on_dreq(&mut self, dev: usize, from: [u8; 16], tid: u64, local: u32, remote: u32) -> bool {
        let drep = Msg::Drep(remote, local);
        let Some(id) = self.w.conn(dev, &from, remote) else {
            // A connection we no longer know: its peer still deserves its DREP.
            self.w.answer(dev, &from, tid, &drep);
            return false;
        };
        let i = &self.w.cm.ids[&id];
        if i.remote_comm != local {
            return false;
        }
        match i.st {
            St::Established | St::RepSent | St::RepRcvd => {
                // DISCONNECTED, and nothing more until the caller disconnects: the DREP is the
                // consumer's to send (the kernel's `cm_dreq_handler` leaves it to
                // `rdma_disconnect` or the destroy), and the QP is left alone.
                self.w.cm_settle(id);
                let i = self.w.cm.ids.get_mut(&id).expect("there");
                (i.tid, i.st) = (tid, St::DreqRcvd);
                self.w.cm.event(id, CmEventKind::Disconnected, 0);
                true
            }
            St::DreqSent => {
                // Both ends disconnect at once: this one's QP is in ERROR already.
                self.w.cm_settle(id);
                self.w.cm.ids.get_mut(&id).expect("there").tid = tid;
                self.w.cm_send(id, &drep, false);
                self.cm_time_wait(id, Some(0));
                true
            }
            St::DreqRcvd => {
                // Sent again while the caller has not disconnected yet: its DREP is to come.
                self.w.cm.count(dev, |c| c.duplicates += 1);
                true
            }
            St::TimeWait => {
                self.w.cm.count(dev, |c| c.duplicates += 1);
                self.w.answer(dev, &from, tid, &drep);
                true
            }
            _ => false,
        }
    }

    fn on_drep(&mut self, dev: usize, from: [u8; 16], remote: u32) -> bool {
        let Some(id) = self.w.conn(dev, &from, remote) else {
            return false;
        };
        match self.w.cm.ids[&id].st {
            St::DreqSent => {
                self.w.cm_settle(id);
                self.cm_time_wait(id, Some(0));
                true
            }
            St::TimeWait => {
                self.w.cm.count(dev, |c| c.duplicates += 1);
                true
            }
            _ => false,
        }
    }

    /// The connection is down: DISCONNECTED with status `event` (if any), then time-wait
    /// until its timer.
    pub(crate) fn cm_time_wait(&mut self, id: u32, event: Option<i32>) {
        if self.w.cm.ids.get(&id).is_some_and(|i| i.orphan) {
            // Its goodbye is over, and nobody waits for its events.
            self.forget(id);
            return;
        }
        self.w.cm.ids.get_mut(&id).expect("a live id").st = St::TimeWait;
        if let Some(status) = event {
            self.w.cm.event(id, CmEventKind::Disconnected, status);
        }
        let at = self.w.now + super::ib_time_ns(RESPONSE_TIMEOUT);
        self.w.cm_arm(id, at);
    }

    /// The CM's timers due now: messages sent again, exchanges given up, time-waits ended.
    pub(crate) fn cm_timers(&mut self) {
        let now = self.w.now;
        while let Some(&(t, id)) = self.w.cm.timers.first() {
            if t > now {
                break;
            }
            self.w.cm.timers.pop_first();
            let Some(i) = self.w.cm.ids.get_mut(&id) else {
                continue;
            };
            if i.due != Some(t) {
                continue; // re-armed or settled since
            }
            i.due = None;
            let dev = i.dev.unwrap_or(0);
            if let Some(r) = i.resend.as_mut().filter(|r| r.left > 0) {
                r.left -= 1;
                let (mad, every, peer) = (r.mad.clone(), r.every_ns, i.peer_gid);
                self.w.cm.count(dev, |c| c.retransmits += 1);
                self.w.send_mad(dev, &peer, &mad);
                self.w.cm_arm(id, now + every);
                continue;
            }
            let gave_up = i.resend.take().is_some();
            let st = i.st;
            if gave_up {
                self.w.cm.count(dev, |c| c.timeouts += 1);
            }
            match st {
                St::ReqSent | St::RepSent => {
                    self.w.cm.ids.get_mut(&id).expect("there").st = St::Done;
                    self.cm_qp_error(id);
                    self.w.cm.event(id, CmEventKind::Unreachable, TIMED_OUT);
                }
                // A DREQ never answered: DISCONNECTED all the same, with -ETIMEDOUT (the
                // kernel's rdma_cm for IB_CM_DREQ_ERROR).
                St::DreqSent => self.cm_time_wait(id, Some(if gave_up { TIMED_OUT } else { 0 })),
                St::TimeWait => {
                    self.w.cm.ids.get_mut(&id).expect("there").st = St::Done;
                    self.w.cm.event(id, CmEventKind::TimewaitExit, 0);
                }
                _ => {}
            }
        }
    }
}
