//! Datagram rsockets (`SOCK_DGRAM`, rdmacm-utils' `udpong`): a UD QP per socket, its port
//! served by an id of `RDMA_PS_UDP` that answers SIDR requests with the QP's number. The ids
//! of all datagram sockets listen on one channel of the process's, whose thread answers them
//! (a forked child has its own channel and thread): a socket's port is served while its
//! thread is elsewhere (in a send to another socket of the same thread, say, which waits for
//! that SIDR reply).
//!
//! A datagram goes in one UD SEND, after an 8-byte header that names the sender's port; the
//! receiver takes the sender's IPv4 address from the packet's IP header and its QP from the
//! completion, and keeps that route for replies (a later datagram from another QP with the
//! same address and port moves it: the sender was made again). As with UDP, address and
//! port are the packet's word: a process may claim another's port on its own host. A send
//! to an address it has no route to resolves one by SIDR first (waiting for it, as a
//! blocking call, for as long as the CM retries a silent host); a port of 127.0.0.1 (the
//! host) resolves to a device (another process's, whose socket listens there), whose
//! datagrams from that port are taken as from 127.0.0.1, as a kernel's loopback answers from
//! the address asked. Datagrams may be lost, as UDP's are; one longer than a slot fails with
//! `EMSGSIZE`, and a read of a shorter buffer than the datagram truncates it. A connected
//! socket drops datagrams from elsewhere.

use std::collections::BTreeMap;
use std::collections::{HashMap, VecDeque};
use std::ffi::c_int;
use std::ptr::null_mut;
use std::sync::{Mutex, OnceLock};

use ibverbs_sys as v;
use softnic::PerProcess;

use super::routes::Routes;
use super::slots::{Slots, Wc};
use crate::id;
use crate::types::*;

/// Bytes of one slot: the GRH (40) a UD receive begins with, the header, the datagram.
const SLOT: usize = 4096;
const GRH: usize = 40;
const HDR: usize = 8;
/// The longest datagram.
pub(super) const MAX: usize = SLOT - GRH - HDR;
const TX: usize = 32;
const RX: usize = 64;
const RX_TAG: u64 = 1 << 32;
/// The header's first two bytes.
const MAGIC: [u8; 2] = *b"rs";
/// Q_Key of `RDMA_PS_UDP` (librdmacm's `RDMA_UDP_QKEY`).
const QKEY: u32 = 0x0123_4567;

/// The sender's IPv4 address from the 40 bytes a UD receive begins with: on RoCEv2 over
/// IPv4 the packet's IPv4 header in their last 20 (as the kernel's rxe and rdma-core's
/// `ibv_init_ah_from_wc` have it), else a GRH whose source GID is IPv4-mapped.
fn source(grh: &[u8]) -> Option<u32> {
    let ip = |b: &[u8]| u32::from_ne_bytes(b.try_into().expect("4 bytes"));
    if grh[0] >> 4 == 6 {
        let sgid = &grh[8..24];
        return (sgid[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]).then(|| ip(&sgid[12..]));
    }
    (grh[20] >> 4 == 4).then(|| ip(&grh[32..36]))
}

/// A datagram received and not yet read.
struct Rx {
    slot: usize,
    len: usize,
    ip: u32,
    port: u16,
}

/// A datagram socket's verbs objects, slots (send slots first) and routes.
pub(super) struct Dgram {
    qp: *mut v::ibv_qp,
    s: Slots,
    free_tx: Vec<usize>,
    /// The AH each send slot's send in flight names (null when free).
    tx_ah: [*mut v::ibv_ah; TX],
    rx: VecDeque<Rx>,
    routes: Routes,
    /// The socket's port (network order), in every header.
    pub(super) port: u16,
    /// `rconnect`'s address: where `rsend` sends, the only source `rrecv` takes.
    pub(super) peer: Option<libc::sockaddr_in>,
    /// Port -> device address, network order, of the ports of 127.0.0.1 (the host) that SIDR
    /// resolved: sends there go to that device (its route and AH, each device's its own), and
    /// its datagrams from that port are taken as from 127.0.0.1, as a kernel's loopback
    /// answers from the address asked. The latest resolution of a port replaces the last
    /// (one entry a port at most).
    host_ports: HashMap<u16, u32>,
}

/// 127.0.0.1 as a `sockaddr_in` holds it.
const LOCALHOST: u32 = u32::from_ne_bytes([127, 0, 0, 1]);

impl Dgram {
    /// The UD QP and slots on the device of `id` (the first device for an id on none).
    pub(super) fn new(id: *mut rdma_cm_id) -> Result<Box<Dgram>, c_int> {
        // SAFETY: a live id of this library.
        let mut ctx = unsafe { (*id).verbs };
        if ctx.is_null() {
            ctx = crate::lib()?.ctx();
        }
        let mut d = Box::new(Dgram {
            qp: null_mut(),
            s: Slots::new(ctx, SLOT, TX + RX, TX + RX)?,
            free_tx: (0..TX).rev().collect(),
            tx_ah: [null_mut(); TX],
            rx: VecDeque::with_capacity(RX),
            routes: Routes::default(),
            port: 0,
            peer: None,
            host_ports: HashMap::new(),
        });
        let mut attr = d.s.qp_attr(v::ibv_qp_type::IBV_QPT_UD, TX, RX);
        // SAFETY: the device's PD and valid attributes.
        d.qp = unsafe { v::ibv_create_qp(d.s.pd, &mut attr) };
        if d.qp.is_null() {
            return Err(crate::errno());
        }
        use v::ibv_qp_attr_mask as m;
        let steps = [
            (
                v::ibv_qp_state::IBV_QPS_INIT,
                m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_QKEY,
            ),
            (v::ibv_qp_state::IBV_QPS_RTR, m::IBV_QP_STATE),
            (
                v::ibv_qp_state::IBV_QPS_RTS,
                m::IBV_QP_STATE | m::IBV_QP_SQ_PSN,
            ),
        ];
        for (state, mask) in steps {
            let mut a = v::ibv_qp_attr {
                qp_state: state,
                port_num: 1,
                qkey: QKEY,
                ..Default::default()
            };
            // SAFETY: the QP just made and valid attributes for the step.
            let e = unsafe { v::ibv_modify_qp(d.qp, &mut a, mask.0 as c_int) };
            if e != 0 {
                return Err(e);
            }
        }
        (0..RX).try_for_each(|rx| d.post_recv(rx))?;
        Ok(d)
    }

    /// The QP's number (what SIDR replies name).
    pub(super) fn qpn(&self) -> u32 {
        // SAFETY: the socket's live QP.
        unsafe { (*self.qp).qp_num }
    }

    /// The descriptor readable once a completion event came (after [`Dgram::arm`]).
    pub(super) fn fd(&self) -> c_int {
        self.s.fd()
    }

    fn post_recv(&mut self, rx: usize) -> Result<(), c_int> {
        self.s.post_recv(self.qp, TX + rx, RX_TAG | rx as u64)
    }

    /// Takes the completions waiting (a queue's worth at most: a flood does not hold the
    /// caller): datagrams queue, sent slots come free.
    pub(super) fn progress(&mut self) {
        let mut wc = [Wc::default(); 16];
        for _ in 0..(TX + RX).div_ceil(wc.len()) {
            let n = self.s.poll(&mut wc);
            if n <= 0 {
                return;
            }
            for w in &mut wc[..n as usize] {
                self.complete(w);
            }
        }
    }

    fn complete(&mut self, w: &mut Wc) {
        if w.wr_id & RX_TAG == 0 {
            let slot = (w.wr_id & 0xffff) as usize;
            self.tx_ah[slot] = null_mut();
            self.free_tx.push(slot);
            return;
        }
        let slot = (w.wr_id & 0xffff) as usize;
        let len = w.byte_len as usize;
        let at = self.s.at(TX + slot);
        let mut head = [0u8; GRH + HDR];
        if w.status == 0 && len >= head.len() && len <= SLOT {
            // SAFETY: a completed receive slot, read before it is posted again.
            unsafe { std::ptr::copy_nonoverlapping(at, head.as_mut_ptr(), head.len()) };
        }
        let (ip, hdr) = (source(&head[..GRH]), &head[GRH..]);
        let port = u16::from_ne_bytes([hdr[2], hdr[3]]);
        let ours = hdr[..2] == MAGIC;
        let peer = self
            .peer
            .map(|p| (self.via(p.sin_addr.s_addr, p.sin_port), p.sin_port));
        let from_peer = |ip: u32| peer.is_none_or(|p| p == (ip, port));
        let Some(ip) = ip.filter(|&ip| ours && from_peer(ip)) else {
            // Not a datagram of an rsocket, or not from the connected peer: dropped (a repost
            // fails only on a QP in error).
            let _ = self.post_recv(slot);
            return;
        };
        let (ctx, qpn) = (self.s.ctx, w.src_qp);
        let attr = || {
            let mut a = v::ibv_ah_attr::default();
            // SAFETY: the socket's device context; a completion (as `ibv_wc`) and its slot's
            // GRH, read only; `a` is written.
            let r =
                unsafe { v::ibv_init_ah_from_wc(ctx, 1, (w as *mut Wc).cast(), at.cast(), &mut a) };
            (r == 0).then_some(a)
        };
        self.learn((ip, port), (qpn, QKEY), attr);
        let len = len - GRH - HDR;
        // (Most sockets never resolve 127.0.0.1: no lookup per datagram then.)
        let ip = if !self.host_ports.is_empty() && self.host_ports.get(&port) == Some(&ip) {
            LOCALHOST
        } else {
            ip
        };
        self.rx.push_back(Rx {
            slot,
            len,
            ip,
            port,
        });
    }

    /// Connects: sends go to `to`, and only its datagrams are taken (those queued from
    /// elsewhere are dropped).
    pub(super) fn connect(&mut self, to: libc::sockaddr_in) -> Result<(), c_int> {
        self.resolve(&to)?;
        self.peer = Some(to);
        let (ip, port) = (to.sin_addr.s_addr, to.sin_port);
        for _ in 0..self.rx.len() {
            let d = self.rx.pop_front().expect("counted");
            if d.ip == ip && d.port == port {
                self.rx.push_back(d);
            } else {
                let _ = self.post_recv(d.slot);
            }
        }
        Ok(())
    }

    /// Keeps the route to an address and port (see [`Routes::learn`]): an AH goes once no
    /// route and no send in flight names it.
    fn learn(
        &mut self,
        to: (u32, u16),
        peer: (u32, u32),
        attr: impl FnOnce() -> Option<v::ibv_ah_attr>,
    ) {
        let tx_ah = &self.tx_ah;
        let busy = |ah| tx_ah.contains(&ah);
        // SAFETY: an AH of this socket's that no route and no send in flight names.
        let drop = |ah| unsafe {
            v::ibv_destroy_ah(ah);
        };
        self.routes.learn(to, peer, attr, busy, drop);
    }

    /// The address a send to `ip` and `port` goes to: `ip`, or for 127.0.0.1 the device SIDR
    /// resolved the port to (see `host_ports`).
    fn via(&self, ip: u32, port: u16) -> u32 {
        if ip != LOCALHOST {
            return ip;
        }
        self.host_ports.get(&port).copied().unwrap_or(ip)
    }

    /// A route to `to`, resolved by SIDR if none is kept (waiting for the reply).
    pub(super) fn resolve(&mut self, to: &libc::sockaddr_in) -> Result<(), c_int> {
        let port = to.sin_port;
        if self
            .routes
            .get(self.via(to.sin_addr.s_addr, port), port)
            .is_some()
        {
            return Ok(());
        }
        let mut ip = to.sin_addr.s_addr;
        let mut tid = null_mut();
        // SAFETY: an out-pointer; no channel: a synchronous id, each call waits.
        if unsafe { id::rdma_create_id(null_mut(), &mut tid, null_mut(), RDMA_PS_UDP) } != 0 {
            return Err(crate::errno());
        }
        let mut dst = *to;
        let mut p = super::conn_param();
        p.qp_num = self.qpn();
        // SAFETY: the synchronous id just made (destroyed below), an address and valid
        // parameters; after the connect, the id's event is its ESTABLISHED, with the route.
        let r = unsafe {
            let r = if id::rdma_resolve_addr(tid, null_mut(), (&raw mut dst).cast(), 2000) != 0
                || id::rdma_resolve_route(tid, 2000) != 0
            {
                Err(crate::errno())
            } else if id::rdma_connect(tid, &mut p) != 0 || (*tid).event.is_null() {
                // No socket serves that port (SIDR's reply refused it).
                Err(libc::ECONNREFUSED)
            } else {
                Ok((*(*tid).event).param.ud)
            };
            id::rdma_destroy_id(tid);
            r
        };
        let ud = r?;
        // SAFETY: every variant of the GID union is 16 plain bytes.
        let dgid = unsafe { ud.ah_attr.grh.dgid.raw };
        if ip == LOCALHOST && dgid[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff] {
            // The host: the device that answered, which its own route and AH name.
            ip = u32::from_ne_bytes([dgid[12], dgid[13], dgid[14], dgid[15]]);
            self.host_ports.insert(port, ip);
        }
        self.learn((ip, port), (ud.qp_num, ud.qkey), || Some(ud.ah_attr));
        Ok(())
    }

    /// Sends one datagram of `bufs` to `to` (resolving a route first): `EAGAIN` when no slot
    /// is free, `EMSGSIZE` when longer than [`MAX`].
    pub(super) fn send(&mut self, bufs: &[&[u8]], to: &libc::sockaddr_in) -> Result<usize, c_int> {
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        if len > MAX {
            return Err(libc::EMSGSIZE);
        }
        self.resolve(to)?;
        let slot = *self.free_tx.last().ok_or(libc::EAGAIN)?;
        let at = self.s.at(slot);
        let mut hdr = [0u8; HDR];
        hdr[..2].copy_from_slice(&MAGIC);
        hdr[2..4].copy_from_slice(&self.port.to_ne_bytes());
        // SAFETY: a free send slot (no WR reads it) of SLOT >= HDR + len bytes, apart from
        // the caller's buffers.
        unsafe {
            std::ptr::copy_nonoverlapping(hdr.as_ptr(), at, HDR);
            let mut n = HDR;
            for b in bufs {
                std::ptr::copy_nonoverlapping(b.as_ptr(), at.add(n), b.len());
                n += b.len();
            }
        }
        let port = to.sin_port;
        let ip = self.via(to.sin_addr.s_addr, port);
        let Some((qpn, qkey)) = self.routes.get(ip, port) else {
            return Err(libc::EHOSTUNREACH);
        };
        let pd = self.s.pd;
        // SAFETY: the socket's PD and the host's AH attributes (a SIDR reply's, or from a
        // datagram it sent).
        let make = |a: &mut v::ibv_ah_attr| unsafe { v::ibv_create_ah(pd, a) };
        let Some(ah) = self.routes.ah(ip, make) else {
            return Err(crate::errno());
        };
        let mut sge = self.s.sge(slot, 0, HDR + len);
        let mut wr = v::ibv_send_wr {
            wr_id: slot as u64,
            sg_list: &mut sge,
            num_sge: 1,
            opcode: v::ibv_wr_opcode::IBV_WR_SEND,
            send_flags: v::ibv_send_flags::IBV_SEND_SIGNALED.0,
            ..Default::default()
        };
        wr.wr.ud = v::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
            ah,
            remote_qpn: qpn,
            remote_qkey: qkey,
        };
        self.s.post_send(self.qp, &mut wr)?;
        self.tx_ah[slot] = ah;
        self.free_tx.pop();
        Ok(len)
    }

    /// Reads the next datagram into `bufs` (a connected socket keeps its peer's only: see
    /// [`Dgram::connect`]): its length copied and its source, or `None` when none waits. The
    /// rest of a longer one is lost.
    pub(super) fn recv(
        &mut self,
        bufs: &mut [&mut [u8]],
        peek: bool,
    ) -> Option<(usize, libc::sockaddr_in)> {
        let d = self.rx.front()?;
        let from = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: d.port,
            sin_addr: libc::in_addr { s_addr: d.ip },
            sin_zero: [0; 8],
        };
        let (slot, len) = (d.slot, d.len);
        // SAFETY: a completed receive slot, read before it is posted again.
        let src = unsafe { self.s.at(TX + slot).add(GRH + HDR) };
        let mut n = 0;
        for b in bufs.iter_mut() {
            let k = (len - n).min(b.len());
            // SAFETY: `k` bytes of the datagram, into the caller's buffer.
            unsafe { std::ptr::copy_nonoverlapping(src.add(n), b.as_mut_ptr(), k) };
            n += k;
        }
        if !peek {
            self.rx.pop_front();
            let _ = self.post_recv(slot);
        }
        Some((n, from))
    }

    pub(super) fn arm(&mut self) {
        self.s.arm();
    }

    pub(super) fn take_events(&mut self) {
        self.s.take_events();
    }

    pub(super) fn readable(&self) -> bool {
        !self.rx.is_empty()
    }

    pub(super) fn writable(&self) -> bool {
        !self.free_tx.is_empty()
    }
}

/// The process's answers to SIDR requests for its datagram sockets' ports. A forked child
/// has its own, with a thread of its own: its parent's thread is not there, and its parent's
/// channel is not the child's.
#[derive(Default)]
struct Service {
    /// The ids serving datagram sockets' ports (by address), and their QPs' numbers.
    served: Mutex<BTreeMap<usize, u32>>,
    /// The channel those ids listen on (its address), once its thread runs.
    channel: OnceLock<Result<usize, c_int>>,
}

/// This process's service, made with its first datagram socket's port.
static SERVICE: PerProcess<Service> = PerProcess::new();

/// Serves the port of the bound `id` (listening on the service's channel) with QP `qpn`.
pub(super) fn serve(id: *mut rdma_cm_id, qpn: u32) -> Result<(), c_int> {
    let service = SERVICE.get_or_init(Service::default);
    let ch = (*service.channel.get_or_init(|| {
        // SAFETY: no arguments.
        let ch = unsafe { id::rdma_create_event_channel() };
        if ch.is_null() {
            return Err(crate::errno());
        }
        let at = ch as usize;
        let run = std::thread::Builder::new().name("rsocket-sidr".into());
        run.spawn(move || answer_for_ever(service, at as *mut rdma_event_channel))
            .map(|_| at)
            .map_err(|_| libc::EAGAIN)
    }))?;
    service
        .served
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id as usize, qpn);
    // SAFETY: the socket's bound id, moved to the service's channel, then listening there.
    let e = unsafe {
        match id::rdma_migrate_id(id, ch as *mut rdma_event_channel) {
            0 => id::rdma_listen(id, 64),
            e => e,
        }
    };
    if e != 0 {
        let e = crate::errno();
        unserve(id);
        return Err(e);
    }
    Ok(())
}

/// Stops answering for `id` (before it is destroyed).
pub(super) fn unserve(id: *mut rdma_cm_id) {
    if let Some(service) = SERVICE.get() {
        service
            .served
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(id as usize));
    }
}

/// The service's thread: answers each SIDR request with the QP of the port it names, or
/// refuses it when that socket is gone.
fn answer_for_ever(service: &Service, ch: *mut rdma_event_channel) {
    loop {
        let mut ev = null_mut();
        // SAFETY: the service's channel (never destroyed) and an out-pointer.
        if unsafe { crate::event::rdma_get_cm_event(ch, &mut ev) } != 0 {
            std::thread::sleep(std::time::Duration::from_millis(10));
            continue;
        }
        // SAFETY: the event just taken (acked below, once).
        let (kind, req, listen) = unsafe { ((*ev).event, (*ev).id, (*ev).listen_id) };
        if kind == super::CONNECT_REQUEST {
            // Held across the answer: the listener's socket cannot go (its id's address be
            // taken again, its QP destroyed) between the look and the reply.
            let served = service.served.lock().unwrap_or_else(|p| p.into_inner());
            let qpn = served.get(&(listen as usize)).copied();
            let mut p = super::conn_param();
            p.qp_num = qpn.unwrap_or(0);
            // SAFETY: the request's id, the service's: answered once and destroyed (it stays
            // valid for its event until the ack).
            unsafe {
                if qpn.is_none() || id::rdma_accept(req, &mut p) != 0 {
                    id::rdma_reject(req, std::ptr::null(), 0);
                }
                id::rdma_destroy_id(req);
            }
            drop(served);
        }
        // SAFETY: the event taken above; its listener id stays valid until this ack.
        unsafe { crate::event::rdma_ack_cm_event(ev) };
    }
}

impl Drop for Dgram {
    fn drop(&mut self) {
        // SAFETY: the QP this socket made (null when not made) and its routes' AHs, no longer
        // used once the QP is gone (kept, leaked, if it could not be destroyed: a send in
        // flight may name them); the slots (CQ, memory) go after this, as a field.
        unsafe {
            if !self.qp.is_null() && v::ibv_destroy_qp(self.qp) != 0 {
                return;
            }
            for ah in self.routes.ahs() {
                v::ibv_destroy_ah(ah);
            }
        }
    }
}
