//! The fabric's state behind its one lock: devices, every object table, the network, timers.
//!
//! QPs live apart from everything else (`State::qps` and `State::w`), so a QP can be borrowed
//! mutably together with the rest of the world it acts on (CQs, MRs, SRQs, the network).

use std::collections::{BTreeMap, VecDeque};
use std::ffi::c_void;

use ibverbs_sys::{ibv_ah, ibv_context, ibv_event_type, ibv_mr, ibv_mw, ibv_pd};

use crate::abi::{self, Kind, Shell};
use crate::counters::Counters;
use crate::cq::{Channel, Cq};
use crate::fabric::FabricConfig;
use crate::faults::{Faults, PacketFilter, Rng};
use crate::link::{Dest, Net};
use crate::mr::Mr;
use crate::qp::Qp;
use crate::srq::Srq;

/// One port's device.
pub(crate) struct Device {
    pub(crate) name: String,
    pub(crate) gid: [u8; 16],
    pub(crate) shell: Shell<crate::control::DeviceShell>,
    /// Counters of the device (the QPs' plus what belongs to no QP).
    pub(crate) counters: Counters,
    /// Virtual time at which the port can start serialising the next packet.
    pub(crate) egress_free_at: u64,
    /// QPs that may have a packet to send, served round-robin: the front sends one packet and
    /// goes to the back, or leaves if it had nothing (see [`Qp::wake`](crate::qp::Qp::wake)).
    pub(crate) tx_ready: VecDeque<u32>,
    /// QP number -> QP id.
    pub(crate) qpns: crate::hash::NumberMap,
    pub(crate) next_qpn: u32,
    /// SRQ number (24 bits, what XRC requests name) -> SRQ id.
    pub(crate) srqns: crate::hash::FastMap<u32, u32>,
    pub(crate) next_srqn: u32,
    /// The memory keys of the device's MRs and memory windows, and what every access through
    /// each is checked against.
    pub(crate) keys: crate::keys::Keys,
    /// The device's port on the UDP link (`None` on the in-process network only).
    pub(crate) udp: Option<crate::link::udp::UdpPort>,
    /// Its multicast groups and their QPs.
    pub(crate) groups: crate::mcast::Groups,
}

impl Device {
    /// Its node GUID (host order): on the UDP link a modified EUI-64 of its address (as rxe's
    /// is of its MAC), so that each process's device has its own; else `02:00::` and the
    /// device's index.
    pub(crate) fn node_guid(&self, index: usize) -> u64 {
        match &self.udp {
            Some(p) => {
                let ip = p.ip.octets();
                u64::from_be_bytes([0x02, 0, ip[0], 0xff, 0xfe, ip[1], ip[2], ip[3]])
            }
            None => 0x0200_0000_0000_0000 | index as u64,
        }
    }

    /// The GID table of the device's port: on the in-process network its IPv4-mapped GID; on
    /// the UDP link rxe's table on a RoCE port, the link-local GID (`fe80::ffff:a.b.c.d`)
    /// then the IPv4-mapped one. Both reach the device. Packets travel over IPv4 either way,
    /// so the source a receiver sees in a GRH is always the IPv4-mapped GID: programs that
    /// compare it pick the IPv4 GID (index 1), as they do on RoCE hardware.
    pub(crate) fn gids(&self) -> impl Iterator<Item = [u8; 16]> + '_ {
        let link_local = self.udp.as_ref().map(|p| crate::roce::link_local_gid(p.ip));
        link_local.into_iter().chain(std::iter::once(self.gid))
    }
}

/// An async event waiting in a context's queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AsyncEvent {
    pub(crate) kind: ibv_event_type,
    pub(crate) element: Element,
}

/// What an async event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Element {
    Cq(u32),
    Qp(u32),
    Srq(u32),
}

pub(crate) struct Context {
    pub(crate) dev: usize,
    pub(crate) shell: Shell<ibv_context, crate::extended::VerbsContext>,
    /// The descriptor `ibv_context.cmd_fd` names: held, never read, so that it is closed
    /// with the context.
    pub(crate) _cmd_fd: std::sync::Arc<crate::cq::EventFd>,
    /// Async events not yet taken, counted on `ibv_context.async_fd`.
    pub(crate) events: crate::cq::Events<AsyncEvent>,
}

pub(crate) struct Pd {
    pub(crate) ctx: u32,
    pub(crate) shell: Shell<ibv_pd>,
}

pub(crate) struct Ah {
    pub(crate) ctx: u32,
    pub(crate) pd: u32,
    pub(crate) dgid: [u8; 16],
    pub(crate) shell: Shell<ibv_ah>,
}

/// Everything but the QPs.
pub(crate) struct World {
    pub(crate) cfg: FabricConfig,
    /// Fabric time in nanoseconds (virtual, or real time since `started` on the wall clock).
    pub(crate) now: u64,
    /// When the fabric was created (the origin of the wall clock).
    pub(crate) started: std::time::Instant,
    pub(crate) rng: Rng,
    pub(crate) devices: Vec<Device>,
    pub(crate) contexts: BTreeMap<u32, Context>,
    pub(crate) pds: BTreeMap<u32, Pd>,
    pub(crate) mrs: BTreeMap<u32, Mr>,
    pub(crate) mws: BTreeMap<u32, crate::mw::Mw>,
    pub(crate) cqs: crate::table::Table<Cq>,
    pub(crate) channels: BTreeMap<u32, Channel>,
    pub(crate) srqs: crate::table::Table<Srq>,
    /// XRC domains' opens (`ibv_xrcd`s), by id.
    pub(crate) xrcds: BTreeMap<u32, crate::xrc::Xrcd>,
    /// XRC domains, by id.
    pub(crate) domains: BTreeMap<u32, crate::xrc::Domain>,
    pub(crate) ahs: BTreeMap<u32, Ah>,
    /// Address-handle pointer (as posted in UD WRs) -> AH id.
    pub(crate) ah_by_ptr: crate::hash::FastMap<usize, u32>,
    pub(crate) net: Net,
    /// The switches of the in-process network (`None`: none, each port sends straight on).
    pub(crate) switches: Option<crate::link::switch::Switches>,
    /// Buffers of delivered frames, for the next ones.
    pub(crate) spare: crate::link::Spare,
    /// Whether any device is on the UDP link (else progress never looks at sockets).
    pub(crate) on_udp: bool,
    /// Scratch for datagrams taken in from the UDP link (kept to reuse its allocation).
    pub(crate) udp_in: Vec<crate::link::udp::Incoming>,
    /// The same for datagrams taken in from multicast groups, and their bytes.
    pub(crate) group_in: (Vec<crate::link::groups::Got>, Vec<u8>),
    /// (time, qp id) of every QP's timer entry (at or before its deadline; see
    /// [`Qp::set_timer`](crate::qp::Qp::set_timer)).
    pub(crate) timers: crate::timers::Timers,
    /// The deadlines of the fabric's users (see `alarm.rs`).
    pub(crate) alarms: crate::alarm::Alarms,
    /// (due time, CQ id) of the completion events CQs owe (see [`Cq::owed`]), in order of due
    /// time; each also has a [`CQ_TIMER`](crate::cq::CQ_TIMER) entry in `timers`.
    ///
    /// [`Cq::owed`]: crate::cq::Cq::owed
    pub(crate) owed_events: std::collections::VecDeque<(u64, u32)>,
    pub(crate) faults: BTreeMap<(usize, usize), Faults>,
    pub(crate) default_faults: Faults,
    pub(crate) filter: Option<PacketFilter>,
    pub(crate) next_id: u32,
    /// The connection manager (QP1 of every device, and rdma_cm's ids above it).
    pub(crate) cm: crate::cm::Cm,
}

pub(crate) struct State {
    pub(crate) qps: crate::table::Table<Qp>,
    pub(crate) w: World,
    /// Whether the state was left quiet ([`Shared::quiet`](crate::shared::Shared::quiet)) when
    /// the lock was taken: nothing is due, so a round of progress would find nothing.
    pub(crate) found_quiet: bool,
}

// SAFETY: the raw pointers inside (the `ibv_*` shells and the caller's opaque context pointers)
// are addresses only; softnic dereferences its own shells under this state's lock and never
// dereferences a caller's context pointer, so the state may move between threads.
unsafe impl Send for State {}

impl World {
    /// The id of the live object of `kind` at `p`, if it is one of this fabric's (`shell`
    /// gives the shell pointer of an id, from the kind's table). Never dereferences `p`.
    fn own_id(
        &self,
        p: *const c_void,
        kind: Kind,
        shell: impl Fn(u32) -> Option<usize>,
    ) -> Option<u32> {
        let id = abi::lookup(p, kind)?.id;
        (shell(id)? == p as usize).then_some(id)
    }

    /// The id of the live PD of this fabric at `p`.
    pub(crate) fn pd_id(&self, p: *mut ibv_pd) -> Option<u32> {
        self.own_id(p.cast(), Kind::Pd, |id| {
            self.pds.get(&id).map(|o| o.shell.ptr() as usize)
        })
    }

    /// The id of the live memory region of this fabric at `p`.
    pub(crate) fn region_id(&self, p: *mut ibv_mr) -> Option<u32> {
        self.own_id(p.cast(), Kind::Mr, |id| {
            self.mrs.get(&id).map(|o| o.shell.ptr() as usize)
        })
    }

    /// The id of the live memory window of this fabric at `p`.
    pub(crate) fn window_id(&self, p: *mut ibv_mw) -> Option<u32> {
        self.own_id(p.cast(), Kind::Mw, |id| {
            self.mws.get(&id).map(|o| o.shell.ptr() as usize)
        })
    }

    pub(crate) fn alloc_id(&mut self) -> u32 {
        self.next_id += 1;
        self.next_id
    }

    /// Where packets of device `from` to GID `gid` go: the device of this fabric with that
    /// GID, else (if `from` is on the UDP link and `gid` is IPv4-mapped) that address's
    /// RoCEv2 port; `None` if nowhere.
    pub(crate) fn route(&self, from: usize, gid: &[u8; 16]) -> Option<Dest> {
        if let Some(d) = self
            .devices
            .iter()
            .position(|d| d.gids().any(|g| &g == gid))
        {
            return Some(Dest::Local(d));
        }
        self.devices[from].udp.as_ref()?;
        let ip = crate::roce::gid_address(gid)?;
        Some(Dest::Udp(std::net::SocketAddrV4::new(
            ip,
            crate::roce::UDP_PORT,
        )))
    }

    /// The UDP source port of QP number `qpn` of device `dev` (its flow entropy).
    pub(crate) fn sport(&self, dev: usize, qpn: u32) -> u16 {
        match &self.devices[dev].udp {
            Some(p) => p.sport(qpn),
            None => 0xc000 | (qpn & 0x3fff) as u16,
        }
    }

    /// The faults on the direction `from -> to`.
    pub(crate) fn faults_for(&self, from: usize, to: usize) -> Faults {
        self.faults
            .get(&(from, to))
            .copied()
            .unwrap_or(self.default_faults)
    }

    /// Queues an async event on context `ctx` and wakes its file descriptor.
    pub(crate) fn async_event(&mut self, ctx: u32, kind: ibv_event_type, element: Element) {
        if let Some(c) = self.contexts.get_mut(&ctx) {
            c.events.push(AsyncEvent { kind, element });
        }
    }

    /// Takes the events about `gone`, an object being destroyed, off every context's queue
    /// with their counts, as the kernel drops a destroyed object's events (none is then
    /// handed out naming it, or a later object given its id).
    pub(crate) fn drop_async_events(&mut self, gone: Element) {
        for c in self.contexts.values_mut() {
            c.events.take_if(|e| e.element == gone);
        }
    }

    /// The context pointer of a shell as libibverbs callers see it.
    pub(crate) fn context_ptr(&mut self, ctx: u32) -> *mut ibv_context {
        self.contexts
            .get_mut(&ctx)
            .map_or(std::ptr::null_mut(), |c| c.shell.ptr())
    }
}

/// The opaque user pointer type of libibverbs.
pub(crate) type UserPtr = *mut c_void;
