//! The CM as [`Fabric`] methods: what librdmacm's calls become.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;

use ibverbs_sys::{ibv_qp, ibv_qp_attr, ibv_qp_state};

use super::ids::{Channel, Id};
use super::{
    ChannelId, CmCounters, CmError, CmEvent, CmEventKind, CmId, ConnParam, PortSpace, err,
};
use crate::abi::{self, Kind};
use crate::cq::{EventFd, Events};
use crate::fabric::Fabric;
use crate::state::State;

/// How long the at-exit calls ([`Fabric::cm_close_all`], [`Fabric::cm_lingering`]) wait for
/// the fabric's lock before they give up.
const AT_EXIT_PATIENCE: std::time::Duration = std::time::Duration::from_millis(200);

/// An id's device (its index), local and remote addresses, and the GID its messages go to.
pub(crate) type IdRoute = (
    Option<usize>,
    Option<SocketAddrV4>,
    Option<SocketAddrV4>,
    [u8; 16],
);

impl Fabric {
    /// Runs `f` on the state, then makes progress (what `f` sent leaves).
    fn cm<R>(&self, f: impl FnOnce(&mut State) -> Result<R, CmError>) -> Result<R, CmError> {
        let Some(mut st) = self.shared.lock() else {
            return err(libc::EIO, "the fabric is broken");
        };
        let r = f(&mut st);
        st.progress();
        drop(st);
        self.shared.wake_sleeper();
        r
    }

    /// A new event channel (`rdma_create_event_channel`).
    pub fn cm_create_channel(&self) -> Result<ChannelId, CmError> {
        let Some(fd) = EventFd::new() else {
            return err(libc::EMFILE, "creating an event channel's eventfd");
        };
        self.cm(|st| {
            let cm = &mut st.w.cm;
            if cm.secret == 0 {
                cm.secret = match st.w.cfg.clock {
                    crate::Clock::Virtual => st.w.cfg.seed ^ 0x636d_5f73_6563_7265,
                    crate::Clock::Wall => {
                        use std::hash::BuildHasher;
                        std::collections::hash_map::RandomState::new()
                            .hash_one(std::time::SystemTime::now())
                            | 1
                    }
                };
            }
            cm.next += 1;
            let id = cm.next;
            cm.channels.insert(
                id,
                Channel {
                    events: Events::new(fd),
                },
            );
            Ok(ChannelId(id))
        })
    }

    /// The channel's file descriptor: readable while an event waits (as long as the channel
    /// lives).
    pub fn cm_channel_fd(&self, ch: ChannelId) -> Result<i32, CmError> {
        self.cm(|st| match st.w.cm.channels.get(&ch.0) {
            Some(c) => Ok(c.events.fd().raw()),
            None => err(libc::EINVAL, "no such event channel"),
        })
    }

    /// Destroys a channel (`rdma_destroy_event_channel`): EBUSY while ids are on it. A thread
    /// blocked in [`cm_get_event`](Self::cm_get_event) stays blocked, as one blocked in
    /// librdmacm's does when the kernel's channel is closed under it (programs such as rping
    /// destroy the channel under their event thread, then exit).
    pub fn cm_destroy_channel(&self, ch: ChannelId) -> Result<(), CmError> {
        self.cm(|st| {
            if st.w.cm.ids.values().any(|i| i.chan == ch.0) {
                return err(libc::EBUSY, "destroying an event channel ids are on");
            }
            match st.w.cm.channels.remove(&ch.0) {
                Some(_) => Ok(()),
                None => err(libc::EINVAL, "no such event channel"),
            }
        })
    }

    /// A new id on channel `ch` (`rdma_create_id`).
    pub fn cm_create_id(&self, ch: ChannelId, ps: PortSpace) -> Result<CmId, CmError> {
        self.cm(|st| {
            let cm = &mut st.w.cm;
            if !cm.channels.contains_key(&ch.0) {
                return err(libc::EINVAL, "no such event channel");
            }
            cm.next += 1;
            cm.ids.insert(cm.next, Id::new(ch.0, ps));
            Ok(CmId(cm.next))
        })
    }

    /// Moves an id (and its waiting events) to another channel (`rdma_migrate_id`).
    pub fn cm_migrate_id(&self, id: CmId, ch: ChannelId) -> Result<(), CmError> {
        self.cm(|st| {
            let cm = &mut st.w.cm;
            if !cm.channels.contains_key(&ch.0) {
                return err(libc::EINVAL, "no such event channel");
            }
            let Some(i) = cm.ids.get_mut(&id.0) else {
                return err(libc::EINVAL, "no such CM id");
            };
            let old = std::mem::replace(&mut i.chan, ch.0);
            let moved = cm
                .channels
                .get_mut(&old)
                .map(|c| c.events.take_if(|e| e.id == id))
                .unwrap_or_default();
            let to = cm.channels.get_mut(&ch.0).expect("checked above");
            for e in moved {
                to.events.push(e);
            }
            Ok(())
        })
    }

    /// Binds an id to an address (`rdma_bind_addr`): the unspecified address is every device;
    /// port 0 takes a free one.
    pub fn cm_bind(&self, id: CmId, addr: SocketAddrV4) -> Result<(), CmError> {
        self.cm(|st| st.cm_bind(id.0, addr))
    }

    /// Resolves `dst` (`rdma_resolve_addr`): `ADDR_RESOLVED` (or `ADDR_ERROR`) on the channel.
    /// 127.0.0.1, unless a device has it, is the host, as a kernel's CM takes loopback: a
    /// device listening at the any address on its port takes the request, in this fabric or
    /// another process's on the UDP link (read from `/proc/net/unix` and `/proc/net/udp`,
    /// before the fabric's lock is taken), else the id's own device, which rejects it.
    pub fn cm_resolve_addr(
        &self,
        id: CmId,
        src: Option<SocketAddrV4>,
        dst: SocketAddrV4,
    ) -> Result<(), CmError> {
        let host = (*dst.ip() == std::net::Ipv4Addr::LOCALHOST).then(super::loopback::Host::read);
        self.cm(|st| st.cm_resolve_addr(id.0, src, dst, host.as_ref()))
    }

    /// Resolves the route (`rdma_resolve_route`): `ROUTE_RESOLVED`.
    pub fn cm_resolve_route(&self, id: CmId) -> Result<(), CmError> {
        self.cm(|st| st.cm_resolve_route(id.0))
    }

    /// Joins multicast group `group` (`rdma_join_multicast`): the id's UD QP is attached to
    /// it unless `send_only`; `MULTICAST_JOIN` on the channel, whose GID and parameters
    /// (QP `0xFFFFFF`, the Q_Key) say where to send.
    pub fn cm_join_multicast(
        &self,
        id: CmId,
        group: Ipv4Addr,
        send_only: bool,
    ) -> Result<(), CmError> {
        self.cm(|st| st.cm_join(id.0, group, send_only))
    }

    /// Leaves multicast group `group` (`rdma_leave_multicast`); EADDRNOTAVAIL if the id had
    /// not joined it.
    pub fn cm_leave_multicast(&self, id: CmId, group: Ipv4Addr) -> Result<(), CmError> {
        self.cm(|st| st.cm_leave(id.0, group))
    }

    /// Listens (`rdma_listen`). An RC connection request that finds `backlog` requests not yet
    /// taken from the channel is dropped (the requester sends it again after its timeout), as
    /// the kernel's CM does; a UD one (SIDR) is rejected. An id bound to the any address on
    /// the UDP link is announced to the host's other processes (a Unix socket per device, with
    /// an abstract name, held until the id is destroyed), which reach it at 127.0.0.1.
    pub fn cm_listen(&self, id: CmId, backlog: i32) -> Result<(), CmError> {
        self.cm(|st| st.cm_listen(id.0, backlog))
    }

    /// Gives the id its QP (`rdma_create_qp` does it with the QP it made): the QP, in RESET,
    /// of the id's device, RC for `RDMA_PS_TCP` and `RDMA_PS_IB`, UD for `RDMA_PS_UDP`, goes to
    /// INIT (RC) or
    /// RTS (UD), and the CM moves it from then on. Returns the QP number.
    pub fn cm_attach_qp(&self, id: CmId, qp: *mut ibv_qp) -> Result<u32, CmError> {
        let found = abi::lookup(qp.cast(), Kind::Qp)
            .filter(|f| Arc::ptr_eq(&f.fabric, &self.shared))
            .ok_or(CmError {
                errno: libc::EINVAL,
                what: "attaching a QP that is not one of this fabric's",
            })?;
        self.cm(|st| st.cm_attach_qp(id.0, found.id))
    }

    /// The id forgets its QP (`rdma_destroy_qp`, before the QP is destroyed).
    pub fn cm_detach_qp(&self, id: CmId) -> Result<(), CmError> {
        self.cm(|st| st.cm_detach_qp(id.0))
    }

    /// The attributes and mask that move the id's QP to `state` (`rdma_init_qp_attr`).
    pub fn cm_init_qp_attr(
        &self,
        id: CmId,
        state: ibv_qp_state::Type,
    ) -> Result<(ibv_qp_attr, u32), CmError> {
        self.cm(|st| st.cm_qp_attr(id.0, state))
    }

    /// Connects (`rdma_connect`): REQ or SIDR REQ with `private` (at most 56 or 180 bytes).
    pub fn cm_connect(&self, id: CmId, param: ConnParam, private: &[u8]) -> Result<(), CmError> {
        self.cm(|st| st.cm_connect(id.0, param, private))
    }

    /// Accepts a connection request (`rdma_accept`).
    pub fn cm_accept(&self, id: CmId, param: ConnParam, private: &[u8]) -> Result<(), CmError> {
        self.cm(|st| st.cm_accept(id.0, param, private))
    }

    /// Rejects a connection request (`rdma_reject`).
    pub fn cm_reject(&self, id: CmId, private: &[u8]) -> Result<(), CmError> {
        self.cm(|st| st.cm_reject(id.0, private))
    }

    /// Sends the RTU after a `CONNECT_RESPONSE` (`rdma_establish`).
    pub fn cm_establish(&self, id: CmId) -> Result<(), CmError> {
        self.cm(|st| st.cm_establish(id.0))
    }

    /// Tells the CM of an event of the id's QP (`rdma_notify`): `IBV_EVENT_COMM_EST` when the
    /// QP of a passive id received before the RTU came establishes the connection (EISCONN
    /// once established); `IBV_EVENT_PATH_MIG` is taken on an established connection; EINVAL
    /// otherwise.
    pub fn cm_notify(&self, id: CmId, event: u32) -> Result<(), CmError> {
        self.cm(|st| st.cm_notify(id.0, event))
    }

    /// Disconnects (`rdma_disconnect`): the QP to ERROR and a DREQ, or, after the peer's DREQ
    /// (DISCONNECTED reported, the QP left alone until now), the DREP that answers it.
    pub fn cm_disconnect(&self, id: CmId) -> Result<(), CmError> {
        self.cm(|st| st.cm_disconnect(id.0))
    }

    /// Destroys an id (`rdma_destroy_id`).
    pub fn cm_destroy_id(&self, id: CmId) -> Result<(), CmError> {
        self.cm(|st| st.cm_destroy_id(id.0))
    }

    /// The device (its index) and the local and remote addresses of an id.
    #[allow(clippy::type_complexity)]
    pub fn cm_id_addrs(
        &self,
        id: CmId,
    ) -> Result<(Option<usize>, Option<SocketAddrV4>, Option<SocketAddrV4>), CmError> {
        self.cm_id_route(id)
            .map(|(dev, src, dst, _)| (dev, src, dst))
    }

    /// [`cm_id_addrs`](Self::cm_id_addrs), and the GID the id's messages and QP go to
    /// (`route.addr.ibaddr.dgid`: its peer's, or the device 127.0.0.1 was resolved to; zeros
    /// before its address is resolved or a request came), all at once.
    pub(crate) fn cm_id_route(&self, id: CmId) -> Result<IdRoute, CmError> {
        self.cm(|st| {
            let i = st.cm_id(id.0)?;
            Ok((i.dev, i.src, i.dst, i.peer_gid))
        })
    }

    /// The next event of a channel, if one waits; EAGAIN if none. Never blocks.
    pub fn cm_poll_event(&self, ch: ChannelId) -> Result<CmEvent, CmError> {
        let fd = self.cm(|st| match st.w.cm.channels.get(&ch.0) {
            Some(c) if !c.events.is_empty() => Ok(c.events.fd().clone()),
            Some(_) => err(libc::EAGAIN, "no event waits"),
            None => err(libc::EINVAL, "no such event channel"),
        })?;
        self.cm_take_event(ch, &fd)
    }

    /// The next event of a channel (`rdma_get_cm_event`): blocks until one comes unless the
    /// channel's descriptor was made non-blocking (then EAGAIN). EINVAL for a channel that is
    /// not there when called; one destroyed during the wait leaves the caller waiting.
    pub fn cm_get_event(&self, ch: ChannelId) -> Result<CmEvent, CmError> {
        let fd = self.cm(|st| match st.w.cm.channels.get(&ch.0) {
            Some(c) => Ok(c.events.fd().clone()),
            None => err(libc::EINVAL, "no such event channel"),
        })?;
        self.cm_take_event(ch, &fd)
    }

    fn cm_take_event(&self, ch: ChannelId, fd: &EventFd) -> Result<CmEvent, CmError> {
        loop {
            let ev = self.cm(|st| {
                let cm = &mut st.w.cm;
                let Some(c) = cm.channels.get_mut(&ch.0) else {
                    return Ok(None);
                };
                let Some(ev) = c.events.pop() else {
                    return Ok(Some(None));
                };
                if ev.kind == CmEventKind::ConnectRequest
                    && let Some(l) = ev.listen_id.and_then(|l| cm.ids.get_mut(&l.0))
                {
                    l.queued = l.queued.saturating_sub(1);
                }
                Ok(Some(Some(ev)))
            })?;
            let waited = match ev {
                Some(Some(ev)) => return Ok(ev),
                // None waits: sleep until one comes (EAGAIN if the descriptor was made
                // non-blocking), without the fabric's lock.
                Some(None) => fd.wait_readable(),
                // Destroyed while this thread waited: it waits on (for ever unless the
                // descriptor is non-blocking), as over the kernel's CM, where closing a
                // channel does not end a read blocked on it. Programs (rping) destroy the
                // channel under their event thread, then exit.
                None => fd.wait(),
            };
            if let Err(e) = waited {
                return err(e, "waiting for a CM event");
            }
        }
    }

    /// How many destroyed ids still send their DREQ (unanswered so far): a process about to
    /// exit waits for them (softnic's librdmacm does, at exit), as the kernel's CM would go
    /// on sending them after the process. 0 if the fabric's lock stays held for 200 ms (see
    /// [`cm_close_all`](Self::cm_close_all)).
    pub fn cm_lingering(&self) -> usize {
        self.shared
            .lock_within(AT_EXIT_PATIENCE)
            .map_or(0, |st| st.cm_lingering())
    }

    /// Destroys every id still held, as [`cm_destroy_id`](Self::cm_destroy_id) does: what a
    /// process does as it exits, as the kernel's CM does for a process whose descriptor
    /// closes (its connections' DREQs then linger: [`cm_lingering`](Self::cm_lingering)).
    /// Returns how many ids there were. If the fabric's lock stays held for 200 ms (a signal
    /// handler that called `exit` stopped this thread in a verb, and the lock is never given
    /// back), nothing is done and 0 returned: the process exits without its goodbyes rather
    /// than hang. Nor on a broken fabric (a verb panicked): its state is not to be run.
    pub fn cm_close_all(&self) -> usize {
        if self.shared.broken().is_some() {
            return 0;
        }
        self.shared
            .lock_within(AT_EXIT_PATIENCE)
            .map_or(0, |mut st| st.cm_close_all())
    }

    /// Every device's name, counters and CM counters, read in one look at the fabric: what
    /// `SOFTNIC_STATS=1` prints at exit. `None` if the fabric's lock stays held for 200 ms (a
    /// signal handler that called `exit` stopped this thread in a verb; see
    /// [`cm_close_all`](Self::cm_close_all)).
    pub fn counters_at_exit(&self) -> Option<Vec<(String, crate::Counters, CmCounters)>> {
        let st = self.shared.lock_within(AT_EXIT_PATIENCE)?;
        let all = st.w.devices.iter().enumerate().map(|(i, d)| {
            let cm = st.w.cm.counters.get(&i).copied().unwrap_or_default();
            (d.name.clone(), d.counters, cm)
        });
        Some(all.collect())
    }

    /// The CM counters of device `name`.
    pub fn cm_counters(&self, name: &str) -> Option<CmCounters> {
        let st = self.shared.lock_any();
        let dev = st.w.devices.iter().position(|d| d.name == name)?;
        Some(st.w.cm.counters.get(&dev).copied().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FabricConfig;

    /// A thread blocked in `rdma_get_cm_event` when the program destroys the channel under it
    /// (rping does, and exits without joining it) stays blocked, as over the kernel's CM: a
    /// wake-up left behind by an event of a destroyed id, taken after the channel went, is
    /// not an error (it was EINVAL, and rping's event thread then called `exit(-1)` while its
    /// main thread was tearing down: the interop flake).
    #[test]
    fn a_waiter_whose_channel_is_destroyed_under_it_stays_waiting() {
        let fabric = Fabric::new(FabricConfig::default());
        let ch = fabric.cm_create_channel().unwrap();
        let lookup = |f: &Fabric| {
            f.cm(|st| Ok(st.w.cm.channels.get(&ch.0).map(|c| c.events.fd().clone())))
                .unwrap()
        };
        let fd = lookup(&fabric).unwrap();
        // What the waiter sees: the wake-up of an event whose id was destroyed, and the
        // channel gone when it looks.
        fd.signal();
        fabric.cm_destroy_channel(ch).unwrap();
        assert!(lookup(&fabric).is_none());
        // Non-blocking, it finds nothing to take: EAGAIN, as a read of an empty channel.
        // SAFETY: fcntl on the channel's eventfd, which `fd` keeps open.
        let r = unsafe { libc::fcntl(fd.raw(), libc::F_SETFL, libc::O_NONBLOCK) };
        assert_ne!(r, -1);
        assert_eq!(
            fabric.cm_take_event(ch, &fd).unwrap_err().errno,
            libc::EAGAIN
        );
        // Blocking, it waits on.
        // SAFETY: as above.
        let r = unsafe { libc::fcntl(fd.raw(), libc::F_SETFL, 0) };
        assert_ne!(r, -1);
        fd.signal();
        let (f2, fd2) = (fabric.clone(), fd.clone());
        let waiter = std::thread::spawn(move || f2.cm_take_event(ch, &fd2));
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!waiter.is_finished(), "{:?}", waiter.join());
    }

    /// A process's goodbyes at exit are on the wire when `cm_close_all` returns: a REJ or a
    /// DREP is sent once, and a process that exits next takes its progress thread with it
    /// (the REJ waited in the UDP link's outbox, and a peer's DREQ went unanswered: the peer
    /// lingered at its own exit, 5 s, for a DREP that never came).
    #[test]
    fn goodbyes_are_on_the_wire_when_close_all_returns() {
        let f = Fabric::try_new(FabricConfig {
            devices: 1,
            link: crate::Link::Udp { addr: None },
            ..Default::default()
        })
        .expect("a free address in 127.0.0.2-254");
        let ch = f.cm_create_channel().unwrap();
        let id = f.cm_create_id(ch, PortSpace::Tcp).unwrap();
        // Nobody listens there: the REQ goes out and waits for an answer.
        let to = std::net::SocketAddrV4::new(std::net::Ipv4Addr::new(127, 0, 27, 1), 9);
        f.cm_resolve_addr(id, None, to).unwrap();
        let next = |kind| {
            let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
            loop {
                match f.cm_poll_event(ch) {
                    Ok(ev) => break assert_eq!(ev.kind, kind),
                    Err(_) if std::time::Instant::now() < end => {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                    Err(e) => panic!("no {kind:?}: {e}"),
                }
            }
        };
        next(CmEventKind::AddrResolved);
        f.cm_resolve_route(id).unwrap();
        next(CmEventKind::RouteResolved);
        let p = ConnParam {
            qp_num: 0x100,
            ..Default::default()
        };
        f.cm_connect(id, p, &[]).unwrap();
        // Held: the progress thread sends nothing meanwhile.
        let mut st = f.shared.lock().unwrap();
        let sent = st.w.cm.counters.get(&0).map_or(0, |c| c.mads_sent);
        assert_eq!(st.cm_close_all(), 1);
        assert_eq!(
            st.w.cm.counters.get(&0).map_or(0, |c| c.mads_sent),
            sent + 1,
            "the REJ"
        );
        let port = st.w.devices[0].udp.as_ref().unwrap();
        assert!(!port.has_outgoing(), "the REJ still waits to be sent");
    }

    /// A process that exits from a signal handler which interrupted a verb (libfabric's PSM
    /// provider calls `exit` on SIGTERM) runs softnic's at-exit goodbye (and, with
    /// `SOFTNIC_STATS=1`, its counters' print) while the interrupted verb holds the fabric's
    /// lock: each gives up after a moment, none waits for a lock that is never given back (the
    /// process hung until SIGKILL).
    #[test]
    fn the_goodbye_at_exit_does_not_wait_for_a_lock_never_given_back() {
        let fabric = Fabric::new(FabricConfig::default());
        fabric
            .cm_create_id(fabric.cm_create_channel().unwrap(), PortSpace::Tcp)
            .unwrap();
        let held = fabric.shared.lock_any();
        let f2 = fabric.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send((f2.cm_close_all(), f2.cm_lingering()));
        });
        let f3 = fabric.clone();
        let (tx3, rx3) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx3.send(f3.counters_at_exit().is_none());
        });
        let done = rx.recv_timeout(std::time::Duration::from_secs(10));
        let stats = rx3.recv_timeout(std::time::Duration::from_secs(10));
        drop(held);
        assert_eq!(done, Ok((0, 0)), "gave up, closing nothing");
        assert_eq!(stats, Ok(true), "gave up, printing nothing");
        let names: Vec<String> = fabric
            .counters_at_exit()
            .unwrap()
            .into_iter()
            .map(|d| d.0)
            .collect();
        assert_eq!(names, ["soft0", "soft1"]);
        // With the lock free, the goodbye is said.
        assert_eq!(fabric.cm_close_all(), 1);
    }
}
