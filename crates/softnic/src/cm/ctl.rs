//! What a caller asks of the CM (rdma_cm's calls), and the QP transitions it does for them.

use std::net::{Ipv4Addr, SocketAddrV4};

use ibverbs_sys::{ibv_access_flags, ibv_qp_attr, ibv_qp_attr_mask, ibv_qp_state};

use super::ids::{Id, St};
use super::loopback::Host;
use super::mad::{self, IpHeader, Msg, Rej, Rep, SidrRep, private, reject};
use super::{CmError, CmEventKind, ConnParam, MAX_RETRIES, QP_TIMEOUT, RESPONSE_TIMEOUT, err};
use crate::qp::Transport;
use crate::state::State;

/// The path MTU code (`ibv_mtu`) of `bytes`.
pub(crate) fn mtu_code(bytes: u32) -> u8 {
    match bytes {
        4096.. => 5,
        2048.. => 4,
        1024.. => 3,
        512.. => 2,
        _ => 1,
    }
}

impl State {
    pub(crate) fn cm_id(&mut self, id: u32) -> Result<&mut Id, CmError> {
        // A destroyed id that lingers for its DREQ is no longer its caller's.
        let live = self.w.cm.ids.get_mut(&id).filter(|i| !i.orphan);
        live.ok_or(CmError {
            errno: libc::EINVAL,
            what: "no such CM id",
        })
    }

    /// The IPv4 address of device `dev`.
    pub(crate) fn dev_ip(&self, dev: usize) -> Ipv4Addr {
        crate::roce::gid_ipv4(&self.w.devices[dev].gid).unwrap_or(Ipv4Addr::UNSPECIFIED)
    }

    fn dev_of_ip(&self, ip: Ipv4Addr) -> Option<usize> {
        (0..self.w.devices.len()).find(|&d| self.dev_ip(d) == ip)
    }

    /// Whether `ip` is the any address: unspecified, or a loopback address no device has (the
    /// kernel's `cma_any_addr` takes loopback as any).
    fn any_addr(&self, ip: Ipv4Addr) -> bool {
        ip.is_unspecified() || (ip.is_loopback() && self.dev_of_ip(ip).is_none())
    }

    /// `rdma_bind_addr`: to the device of the address, or to none for the any address.
    pub(crate) fn cm_bind(&mut self, id: u32, addr: SocketAddrV4) -> Result<(), CmError> {
        let i = self.cm_id(id)?;
        if i.st != St::Idle {
            return err(libc::EINVAL, "binding an id that is bound already");
        }
        let ps = i.ps;
        let dev = if self.any_addr(*addr.ip()) {
            None
        } else {
            match self.dev_of_ip(*addr.ip()) {
                Some(d) => Some(d),
                None => return err(libc::EADDRNOTAVAIL, "binding an address no device has"),
            }
        };
        let Some(port) = self.w.cm.take_port(ps, addr.port()) else {
            return err(libc::EADDRINUSE, "binding a port in use");
        };
        let i = self.cm_id(id)?;
        i.st = St::Bound;
        i.dev = dev;
        i.src = Some(SocketAddrV4::new(*addr.ip(), port));
        Ok(())
    }

    /// `rdma_resolve_addr`: the device and the peer's GID; `ADDR_RESOLVED`, or `ADDR_ERROR`
    /// with `-EHOSTUNREACH` for an address the link does not reach. A multicast group is
    /// reached from any device (a join follows: see `groups.rs`). The unspecified address is
    /// loopback, as the kernel's `cma_resolve_loopback`: the bound device's own address (the
    /// first device's if unbound). 127.0.0.1, unless a device has it, is the host too: its
    /// request goes where [`peer_gid`](Self::peer_gid) says (`host`: what the caller read of
    /// the host for it, before it took the lock).
    pub(crate) fn cm_resolve_addr(
        &mut self,
        id: u32,
        src: Option<SocketAddrV4>,
        dst: SocketAddrV4,
        host: Option<&Host>,
    ) -> Result<(), CmError> {
        if dst.ip().is_broadcast() {
            return err(libc::EINVAL, "resolving the broadcast address");
        }
        if self.cm_id(id)?.st == St::Idle {
            let any = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0);
            self.cm_bind(id, src.unwrap_or(any))?;
        }
        let i = self.cm_id(id)?;
        if i.st != St::Bound {
            return err(libc::EINVAL, "resolving an address on an id in use");
        }
        let bound = i.dev;
        let dst = if dst.ip().is_unspecified() {
            SocketAddrV4::new(self.dev_ip(bound.unwrap_or(0)), dst.port())
        } else {
            dst
        };
        let dev = bound.or_else(|| self.dev_of_ip(*dst.ip())).unwrap_or(0);
        let gid = self.peer_gid(id, dev, dst, host);
        if !dst.ip().is_multicast() && self.w.route(dev, &gid).is_none() {
            self.w
                .cm
                .event(id, CmEventKind::AddrError, -libc::EHOSTUNREACH);
            return Ok(());
        }
        let ip = self.dev_ip(dev);
        let i = self.cm_id(id)?;
        i.dev = Some(dev);
        let port = i.src.map_or(0, |s| s.port());
        i.src = Some(SocketAddrV4::new(ip, port));
        i.dst = Some(dst);
        i.peer_gid = gid;
        i.st = St::AddrResolved;
        self.w.cm.event(id, CmEventKind::AddrResolved, 0);
        Ok(())
    }

    /// `rdma_resolve_route`.
    pub(crate) fn cm_resolve_route(&mut self, id: u32) -> Result<(), CmError> {
        let i = self.cm_id(id)?;
        if i.st != St::AddrResolved {
            return err(libc::EINVAL, "resolving a route before the address");
        }
        if i.dst.is_some_and(|d| d.ip().is_multicast()) {
            // A group has no route to connect over: it is joined (`rdma_join_multicast`).
            return err(libc::EINVAL, "resolving a route to a multicast group");
        }
        i.st = St::RouteResolved;
        self.w.cm.event(id, CmEventKind::RouteResolved, 0);
        Ok(())
    }

    /// `rdma_listen` (a backlog of 0 or over 1024 is 1024, as the kernel's).
    pub(crate) fn cm_listen(&mut self, id: u32, backlog: i32) -> Result<(), CmError> {
        if self.cm_id(id)?.st == St::Idle {
            self.cm_bind(id, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0))?;
        }
        let i = self.cm_id(id)?;
        if i.st != St::Bound {
            return err(libc::EINVAL, "listening on an id in use");
        }
        i.st = St::Listen;
        i.backlog = if (1..=1024).contains(&backlog) {
            backlog as u32
        } else {
            1024
        };
        let (ps, port, any) = (i.ps, i.src.map_or(0, |s| s.port()), i.dev.is_none());
        if any {
            // Reached from the host's other processes at 127.0.0.1 too.
            let ips: Vec<Ipv4Addr> = (0..self.w.devices.len())
                .filter(|&d| self.w.devices[d].udp.is_some())
                .map(|d| self.dev_ip(d))
                .collect();
            if !ips.is_empty() {
                self.cm_id(id)?.announced = super::loopback::announce(ps, port, ips.into_iter());
            }
        }
        Ok(())
    }

    /// The GID a request to `dst` from device `dev` for id `id` goes to: `dst`'s own, unless
    /// it is 127.0.0.1 and no device has it (in this fabric, nor on the host's UDP link, as
    /// `host` read before the lock says): then it is the host, as a kernel's CM takes
    /// loopback (`cma_resolve_loopback`), where a device listening at the any address on
    /// `dst`'s port takes the request: `dev` itself if this fabric listens there, else a
    /// device another process announced (see [`loopback`](super::loopback)), else `dev`
    /// itself, which rejects the request (nobody listens).
    fn peer_gid(&self, id: u32, dev: usize, dst: SocketAddrV4, host: Option<&Host>) -> [u8; 16] {
        let ip = *dst.ip();
        let own = crate::roce::ipv4_gid(ip);
        if ip != Ipv4Addr::LOCALHOST || self.dev_of_ip(ip).is_some() {
            return own;
        }
        let on_udp = self.w.devices[dev].udp.is_some();
        // Another process's device there (or no telling): that device.
        if on_udp && host.and_then(|h| h.device_at(ip)) != Some(false) {
            return own;
        }
        let Some(ps) = self.w.cm.ids.get(&id).map(|i| i.ps) else {
            return own;
        };
        let listens_here = self.w.cm.ids.values().any(|i| {
            i.st == St::Listen
                && i.ps == ps
                && i.dev.is_none()
                && i.src.is_some_and(|s| s.port() == dst.port())
        });
        if !listens_here
            && on_udp
            && let Some(at) = host.and_then(|h| h.listener(ps, dst.port()))
        {
            return crate::roce::ipv4_gid(at);
        }
        self.w.devices[dev].gid
    }

    /// Attaches QP id `qp` (in RESET, of the id's device and the port space's type) and
    /// moves it as `rdma_create_qp` does: INIT for RC, RTS for UD.
    pub(crate) fn cm_attach_qp(&mut self, id: u32, qp: u32) -> Result<u32, CmError> {
        let i = self.cm_id(id)?;
        let (dev, ps) = (i.dev, i.ps);
        let Some(q) = self.qps.get(&qp) else {
            return err(libc::EINVAL, "attaching a QP that is not one");
        };
        if Some(q.dev) != dev || q.transport != ps.transport() {
            return err(libc::EINVAL, "attaching a QP of another device or type");
        }
        if q.state != ibv_qp_state::IBV_QPS_RESET {
            return err(libc::EINVAL, "attaching a QP that is not in RESET");
        }
        let qpn = q.qpn;
        let i = self.cm_id(id)?;
        i.qp = Some(qp);
        i.qpn = qpn;
        self.cm_move(id, ibv_qp_state::IBV_QPS_INIT)?;
        if ps.transport() == Transport::Ud {
            self.cm_move(id, ibv_qp_state::IBV_QPS_RTR)?;
            self.cm_move(id, ibv_qp_state::IBV_QPS_RTS)?;
            self.cm_attach_joined(id, qpn)?;
        }
        Ok(qpn)
    }

    /// `rdma_destroy_qp`: the id forgets its QP (which leaves the groups it joined for the id).
    pub(crate) fn cm_detach_qp(&mut self, id: u32) -> Result<(), CmError> {
        self.cm_detach_joined(id);
        self.cm_id(id)?.qp = None;
        Ok(())
    }

    /// `rdma_init_qp_attr`: the attributes and mask that move the id's QP to `state`.
    pub(crate) fn cm_qp_attr(
        &mut self,
        id: u32,
        state: ibv_qp_state::Type,
    ) -> Result<(ibv_qp_attr, u32), CmError> {
        use ibv_qp_attr_mask as m;
        let i = self.cm_id(id)?;
        let (ps, st) = (i.ps, i.st);
        let (peer, remote_qpn, remote_psn, psn, mtu, p) = (
            i.peer_gid,
            i.remote_qpn,
            i.remote_psn,
            i.psn,
            i.mtu,
            i.param,
        );
        let Some(dev) = i.dev else {
            return err(libc::EINVAL, "QP attributes of an id on no device");
        };
        let mut a = ibv_qp_attr {
            qp_state: state,
            ..Default::default()
        };
        let connected = matches!(
            st,
            St::RepRcvd | St::ReqRcvd | St::RepSent | St::Established
        );
        let mask = match (state, ps.transport()) {
            (ibv_qp_state::IBV_QPS_INIT, Transport::Rc) => {
                a.port_num = 1;
                a.qp_access_flags = (ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
                    | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
                    | ibv_access_flags::IBV_ACCESS_REMOTE_READ
                    | ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC)
                    .0;
                m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS
            }
            (ibv_qp_state::IBV_QPS_INIT, Transport::Ud) => {
                a.port_num = 1;
                a.qkey = mad::UDP_QKEY;
                m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_QKEY
            }
            (ibv_qp_state::IBV_QPS_RTR, Transport::Rc) if connected => {
                a.ah_attr.is_global = 1;
                a.ah_attr.port_num = 1;
                a.ah_attr.grh.dgid.raw = peer;
                a.ah_attr.grh.hop_limit = 64;
                a.ah_attr.grh.sgid_index = (self.w.devices[dev].gids().count() - 1) as u8;
                a.path_mtu = u32::from(mtu);
                a.dest_qp_num = remote_qpn;
                a.rq_psn = remote_psn;
                a.max_dest_rd_atomic = p.responder_resources;
                a.min_rnr_timer = 12;
                m::IBV_QP_STATE
                    | m::IBV_QP_AV
                    | m::IBV_QP_PATH_MTU
                    | m::IBV_QP_DEST_QPN
                    | m::IBV_QP_RQ_PSN
                    | m::IBV_QP_MAX_DEST_RD_ATOMIC
                    | m::IBV_QP_MIN_RNR_TIMER
            }
            (ibv_qp_state::IBV_QPS_RTS, Transport::Rc) if connected => {
                a.timeout = QP_TIMEOUT;
                a.retry_cnt = p.retry_count.min(7);
                a.rnr_retry = p.rnr_retry_count.min(7);
                a.sq_psn = psn;
                a.max_rd_atomic = p.initiator_depth;
                m::IBV_QP_STATE
                    | m::IBV_QP_TIMEOUT
                    | m::IBV_QP_RETRY_CNT
                    | m::IBV_QP_RNR_RETRY
                    | m::IBV_QP_SQ_PSN
                    | m::IBV_QP_MAX_QP_RD_ATOMIC
            }
            (ibv_qp_state::IBV_QPS_RTR, Transport::Ud) => m::IBV_QP_STATE,
            (ibv_qp_state::IBV_QPS_RTS, Transport::Ud) => m::IBV_QP_STATE | m::IBV_QP_SQ_PSN,
            (ibv_qp_state::IBV_QPS_ERR | ibv_qp_state::IBV_QPS_RESET, _) => m::IBV_QP_STATE,
            _ => {
                return err(
                    libc::EINVAL,
                    "QP attributes for a state the id is not ready for",
                );
            }
        };
        Ok((a, mask.0))
    }

    /// Moves the id's QP to `state` with the attributes the CM has.
    fn cm_move(&mut self, id: u32, state: ibv_qp_state::Type) -> Result<(), CmError> {
        let (a, mask) = self.cm_qp_attr(id, state)?;
        let Some(qp) = self.cm_id(id)?.qp else {
            return Ok(());
        };
        let State { qps, w, .. } = self;
        let Some(q) = qps.get_mut(&qp) else {
            return err(libc::EINVAL, "the id's QP is gone");
        };
        if q.modify(w, &a, mask) != 0 {
            return err(libc::EINVAL, "moving the id's QP");
        }
        Ok(())
    }

    /// RTR then RTS: the QP of a connection whose REQ and REP are both known.
    pub(crate) fn cm_ready_qp(&mut self, id: u32) -> Result<(), CmError> {
        self.cm_move(id, ibv_qp_state::IBV_QPS_RTR)?;
        self.cm_move(id, ibv_qp_state::IBV_QPS_RTS)
    }

    /// The id's QP (if any) to ERROR, as a disconnect does.
    pub(crate) fn cm_qp_error(&mut self, id: u32) {
        let _ = self.cm_move(id, ibv_qp_state::IBV_QPS_ERR);
    }

    /// The device's limits on `p` for id `id`: callers ask for `RDMA_MAX_RESP_RES` and
    /// `RDMA_MAX_INIT_DEPTH` (255) to mean as many as the device has; on RC any other value
    /// above the device's `max_qp_rd_atom` is EINVAL, as librdmacm's `ucma_valid_param`
    /// answers on `RDMA_PS_TCP` (softnic on `RDMA_PS_IB` too, RC as well; UD has no reads:
    /// its values are not looked at).
    fn clamp(&mut self, id: u32, p: ConnParam) -> Result<ConnParam, CmError> {
        let max = self.w.cfg.max_rd_atomic.min(255) as u8;
        let over = |v: u8| v != 255 && v > max;
        if self.cm_id(id)?.ps.transport() == Transport::Rc
            && (over(p.responder_resources) || over(p.initiator_depth))
        {
            return err(
                libc::EINVAL,
                "responder resources or initiator depth above the device's max_qp_rd_atom",
            );
        }
        Ok(ConnParam {
            responder_resources: p.responder_resources.min(max),
            initiator_depth: p.initiator_depth.min(max),
            ..p
        })
    }

    /// `rdma_connect`: a REQ (RC) or SIDR REQ (UD) with `data` after the IP header.
    pub(crate) fn cm_connect(&mut self, id: u32, p: ConnParam, data: &[u8]) -> Result<(), CmError> {
        let p = self.clamp(id, p)?;
        let psn = self.w.cm.fresh() & crate::packet::PSN_MASK;
        let comm = self.w.cm.comm_id();
        let tid = u64::from(self.w.cm.fresh());
        let mtu = mtu_code(self.w.cfg.mtu);
        let i = self.cm_id(id)?;
        if i.st != St::RouteResolved {
            return err(libc::EINVAL, "connecting before the route is resolved");
        }
        let room = match i.ps.transport() {
            Transport::Ud => private::SIDR_REQ,
            _ => private::REQ,
        } - mad::IP_HDR_LEN;
        if data.len() > room {
            return err(libc::EINVAL, "private data longer than a REQ carries");
        }
        let (Some(src), Some(dst), Some(dev)) = (i.src, i.dst, i.dev) else {
            return err(libc::EINVAL, "connecting an id with no address");
        };
        let qpn = if i.qp.is_some() { i.qpn } else { p.qp_num };
        i.param = p;
        i.psn = psn;
        i.local_comm = comm;
        i.tid = tid;
        i.mtu = mtu;
        i.st = St::ReqSent;
        let ps = i.ps;
        self.w.cm.by_comm.insert(comm, id);
        let mut private = [0u8; private::SIDR_REQ];
        IpHeader {
            src: *src.ip(),
            src_port: src.port(),
            dst: *dst.ip(),
        }
        .emit(&mut private);
        private[mad::IP_HDR_LEN..][..data.len()].copy_from_slice(data);
        let sid = mad::service_id(ps.code(), dst.port());
        let msg = match ps.transport() {
            Transport::Ud => Msg::SidrReq(comm, sid, Box::new(private)),
            _ => Msg::Req(Box::new(mad::Req {
                local_comm_id: comm,
                service_id: sid,
                ca_guid: self.w.devices[dev].node_guid(dev),
                qpn,
                responder_resources: p.responder_resources,
                initiator_depth: p.initiator_depth,
                remote_cm_timeout: RESPONSE_TIMEOUT,
                transport: 0,
                flow_control: p.flow_control,
                starting_psn: psn,
                local_cm_timeout: RESPONSE_TIMEOUT,
                retry_count: p.retry_count.min(7),
                mtu,
                rnr_retry: p.rnr_retry_count.min(7),
                max_cm_retries: MAX_RETRIES,
                srq: p.srq,
                local_gid: self.w.devices[dev].gid,
                remote_gid: self.w.cm.ids[&id].peer_gid,
                ack_timeout: QP_TIMEOUT,
                private: private[..private::REQ].try_into().expect("92 of 216 bytes"),
            })),
        };
        self.w.cm_send(id, &msg, true);
        Ok(())
    }

    /// `rdma_accept`: RTR and RTS, then the REP (RC); the SIDR REP (UD).
    pub(crate) fn cm_accept(&mut self, id: u32, p: ConnParam, data: &[u8]) -> Result<(), CmError> {
        let p = self.clamp(id, p)?;
        let i = self.cm_id(id)?;
        // The PSN chosen when the request came (`rdma_init_qp_attr` may have given it already).
        let psn = i.psn;
        if i.st != St::ReqRcvd {
            return err(libc::EINVAL, "accepting an id with no connection request");
        }
        let room = match i.ps.transport() {
            Transport::Ud => private::SIDR_REP,
            _ => private::REP,
        };
        if data.len() > room {
            // The kernel's rdma_accept, when the reply cannot be sent: the QP to ERROR and the
            // request rejected, so the client hears at once.
            self.cm_qp_error(id);
            self.cm_reject(id, &[])?;
            return err(libc::EINVAL, "private data longer than a REP carries");
        }
        let qpn = if i.qp.is_some() { i.qpn } else { p.qp_num };
        let peer = i.peer;
        i.param = ConnParam {
            responder_resources: p.responder_resources.min(peer.initiator_depth),
            initiator_depth: p.initiator_depth.min(peer.responder_resources),
            retry_count: peer.retry_count,
            rnr_retry_count: peer.rnr_retry_count,
            ..p
        };
        let (local, remote, ps, dev) = (i.local_comm, i.remote_comm, i.ps, i.dev.unwrap_or(0));
        let param = i.param;
        if ps.transport() == Transport::Ud {
            let mut private = [0u8; private::SIDR_REP];
            private[..data.len()].copy_from_slice(data);
            let sid = mad::service_id(ps.code(), i.src.map_or(0, |s| s.port()));
            i.st = St::Established;
            let qkey = if p.qkey != 0 { p.qkey } else { mad::UDP_QKEY };
            let rep = Msg::SidrRep(Box::new(SidrRep {
                request_id: remote,
                status: 0,
                qpn,
                service_id: sid,
                qkey,
                private,
            }));
            self.w.cm_send(id, &rep, false);
            return Ok(());
        }
        if self.cm_id(id)?.qp.is_some()
            && let Err(e) = self.cm_ready_qp(id)
        {
            self.cm_qp_error(id);
            self.cm_reject(id, &[])?;
            return Err(e);
        }
        let mut private = [0u8; private::REP];
        private[..data.len()].copy_from_slice(data);
        let rep = Msg::Rep(Box::new(Rep {
            local_comm_id: local,
            remote_comm_id: remote,
            qpn,
            starting_psn: psn,
            responder_resources: param.responder_resources,
            initiator_depth: param.initiator_depth,
            flow_control: p.flow_control,
            rnr_retry: p.rnr_retry_count.min(7),
            srq: p.srq,
            ca_guid: self.w.devices[dev].node_guid(dev),
            private,
        }));
        self.cm_id(id)?.st = St::RepSent;
        self.w.cm_send(id, &rep, true);
        Ok(())
    }

    /// `rdma_reject`: a REJ, consumer-defined (RC), or a SIDR REP "rejected" (UD).
    pub(crate) fn cm_reject(&mut self, id: u32, data: &[u8]) -> Result<(), CmError> {
        let i = self.cm_id(id)?;
        if i.st != St::ReqRcvd {
            return err(libc::EINVAL, "rejecting an id with no connection request");
        }
        let room = match i.ps.transport() {
            Transport::Ud => private::SIDR_REP,
            _ => private::REJ,
        };
        if data.len() > room {
            return err(libc::EINVAL, "private data longer than a REJ carries");
        }
        i.st = St::Done;
        let (local, remote, ps, dev) = (i.local_comm, i.remote_comm, i.ps, i.dev.unwrap_or(0));
        let port = i.src.map_or(0, |s| s.port());
        let msg = match ps.transport() {
            Transport::Rc | Transport::Uc => {
                let mut private = [0u8; private::REJ];
                private[..data.len()].copy_from_slice(data);
                Msg::Rej(Box::new(Rej {
                    local_comm_id: local,
                    remote_comm_id: remote,
                    msg_rejected: 0,
                    reason: reject::CONSUMER_DEFINED,
                    private,
                }))
            }
            Transport::Ud => {
                let mut private = [0u8; private::SIDR_REP];
                private[..data.len()].copy_from_slice(data);
                Msg::SidrRep(Box::new(SidrRep {
                    request_id: remote,
                    status: 2,
                    qpn: 0,
                    service_id: mad::service_id(ps.code(), port),
                    qkey: 0,
                    private,
                }))
            }
        };
        self.w.cm.count(dev, |c| c.rejects_sent += 1);
        self.w.cm_send(id, &msg, false);
        Ok(())
    }

    /// `rdma_establish`: the RTU of an active id whose caller moved its own QP.
    pub(crate) fn cm_establish(&mut self, id: u32) -> Result<(), CmError> {
        if self.cm_id(id)?.st != St::RepRcvd {
            return err(libc::EINVAL, "establishing an id with no REP");
        }
        self.cm_send_rtu(id);
        Ok(())
    }

    /// `rdma_notify`: an event of the id's QP the CM acts on, as the kernel's `ib_cm_notify`.
    /// `IBV_EVENT_COMM_EST` (the QP received before the RTU came) establishes a passive
    /// connection whose REP went out, EISCONN on one established; `IBV_EVENT_PATH_MIG` is
    /// taken on an established connection (softnic's paths have no alternate to migrate to).
    /// EINVAL for any other event, or an id in any other state (not connected over the CM, or
    /// a UDP id).
    pub(crate) fn cm_notify(&mut self, id: u32, event: u32) -> Result<(), CmError> {
        let i = self.cm_id(id)?;
        match (event, i.st, i.ps.transport()) {
            (_, _, Transport::Ud) => err(libc::EINVAL, "notifying a UDP id"),
            (ibverbs_sys::IBV_EVENT_COMM_EST, St::RepSent, _) => {
                self.cm_passive_established(id);
                Ok(())
            }
            (ibverbs_sys::IBV_EVENT_COMM_EST, St::Established, _) => {
                err(libc::EISCONN, "the connection is established")
            }
            (ibverbs_sys::IBV_EVENT_PATH_MIG, St::Established, _) => Ok(()),
            (ibverbs_sys::IBV_EVENT_COMM_EST | ibverbs_sys::IBV_EVENT_PATH_MIG, ..) => err(
                libc::EINVAL,
                "notifying an id in a state that takes no such event",
            ),
            _ => err(libc::EINVAL, "an event the CM does not take"),
        }
    }

    /// `rdma_disconnect`: the QP to ERROR and a DREQ, or, once the peer's DREQ came, the
    /// DREP that answers it.
    pub(crate) fn cm_disconnect(&mut self, id: u32) -> Result<(), CmError> {
        let i = self.cm_id(id)?;
        match (i.st, i.ps.transport()) {
            (St::Established | St::RepSent | St::RepRcvd, Transport::Rc) => {}
            (St::DreqRcvd, _) => {
                let drep = Msg::Drep(i.local_comm, i.remote_comm);
                self.cm_qp_error(id);
                self.w.cm_send(id, &drep, false);
                // DISCONNECTED was reported when the DREQ came.
                self.cm_time_wait(id, None);
                return Ok(());
            }
            (St::DreqSent | St::TimeWait | St::Done, _) | (St::Established, Transport::Ud) => {
                return Ok(());
            }
            _ => return err(libc::EINVAL, "disconnecting an id that is not connected"),
        }
        let dreq = Msg::Dreq(i.local_comm, i.remote_comm, i.remote_qpn);
        i.st = St::DreqSent;
        self.cm_qp_error(id);
        self.w.cm_settle(id);
        self.w.cm_send(id, &dreq, true);
        Ok(())
    }
}
