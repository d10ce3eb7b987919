//! The fabric: devices on one simulated network, the virtual clock, and progress.

use std::collections::{BTreeMap, VecDeque};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ibverbs_sys::{ibv_device, ibv_qp};

use crate::abi::{self, Kind, Shell};
use crate::counters::Counters;
use crate::cq::EventFd;
use crate::faults::{Faults, InvalidFaults, PacketFilter, Rng};
use crate::link::udp::UdpPort;
use crate::link::{Dest, Frame, Net};
pub(crate) use crate::shared::{Shared, panic_message};
use crate::state::{Device, State, World};
use crate::topology::Topology;

/// Which clock a fabric runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Clock {
    /// Virtual time: nothing happens between calls, and time jumps from event to event when
    /// asked to ([`Fabric::run_until_idle`], [`Fabric::advance`], or a poll of an empty CQ with
    /// [`FabricConfig::auto_advance`]). The same seed and the same calls give the same run, bit
    /// for bit. For simulations driven by one thread.
    #[default]
    Virtual,
    /// Real time: the fabric's clock is the time elapsed since it was created, and never runs
    /// ahead of it, so a retransmission or RNR timer takes as long as it says even when the
    /// peer is merely slow (the local ACK timeout is at least 4 ms, as rxe's, whatever the
    /// QP's `timeout` says: a software NIC shares its cores with the programs it serves). For
    /// two threads (or a progress thread) driving the two ends. Not deterministic.
    Wall,
}

/// The network a fabric's devices are on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Link {
    /// The in-process simulated network (latency, port speed, seeded faults; on the virtual
    /// clock, replayed bit for bit). Devices are `::ffff:10.0.0.<index + 1>`.
    #[default]
    Simulated,
    /// A real network: each device binds a UDP socket on its own IPv4 address, port 4791,
    /// its GID is that address IPv4-mapped, and it reaches any other RoCEv2 port (another
    /// process's softnic device, on this host or another) by sending it real RoCEv2
    /// datagrams, the ICRC included (see [`roce`](crate::roce)). Devices of the same fabric
    /// still talk in-process. The fabric runs on the wall clock with its own progress thread
    /// (timers, retransmissions and arrivals move while nobody polls; it sleeps in `ppoll`
    /// when there is nothing to do). The seeded faults apply to what is sent.
    ///
    /// A receiving socket does not see the IPv4 header, whose identification the ICRC covers:
    /// softnic checks a packet's ICRC against identification 0 and the 63 the segments of a
    /// GSO send carry, so it takes packets from softnic and from any sender that sends with
    /// identification 0, and counts as ICRC errors those of senders that pick others (rxe and
    /// most hardware do). Sending to any RoCEv2 port works.
    ///
    /// Same-sized packets to one destination leave as one GSO send (the kernel cuts them into
    /// datagrams), and arrive as GRO batches; `SOFTNIC_GSO=0` in the environment sends every
    /// packet alone, for a capture on the loopback interface, which sees a GSO send uncut.
    Udp {
        /// The first device's address (the next ones take the following addresses); `None`
        /// takes free ones in 127.0.0.2 to 127.0.0.254 (see [`Fabric::udp_addr`] for which).
        addr: Option<Ipv4Addr>,
    },
}

/// How a fabric is built. `FabricConfig::default()` gives two 100 Gb/s devices, 1 us latency,
/// 4096-byte MTU, no faults, seed 0, on the virtual clock.
#[derive(Debug, Clone, PartialEq)]
pub struct FabricConfig {
    /// Number of devices: `soft0`, `soft1`, ...
    pub devices: usize,
    /// Seed of the fault-injection RNG: the same seed and the same calls give the same run.
    pub seed: u64,
    /// The port MTU in bytes (256, 512, 1024, 2048 or 4096): the largest path MTU and the UD
    /// payload limit.
    pub mtu: u32,
    /// One-way latency of every link, in nanoseconds (without switches; with them, each link
    /// takes [`SwitchConfig::latency_ns`](crate::SwitchConfig::latency_ns)).
    pub latency_ns: u64,
    /// Port speed in Gb/s (a packet occupies its port for `bytes * 8 / gbps` ns).
    pub gbps: u64,
    /// Device limit on send/receive queue depth.
    pub max_qp_wr: u32,
    /// Device limit on SGEs per WR.
    pub max_sge: u32,
    /// Device limit on CQ entries.
    pub max_cqe: u32,
    /// Device limit on inline data per send WR.
    pub max_inline_data: u32,
    /// Device limit on SRQ depth.
    pub max_srq_wr: u32,
    /// Device limit on outstanding RDMA READs per QP (initiator and responder).
    pub max_rd_atomic: u32,
    /// Largest message in bytes. An RDMA READ or WRITE moves 2 GiB at most whatever this
    /// says (the IBTA's limit: a responder refuses a longer one as an invalid request).
    pub max_msg_size: u32,
    /// `poll_cq` on an empty CQ moves the virtual clock to the next pending event (so a
    /// busy-polling caller always makes progress, retransmission timeouts included). Ignored
    /// on the wall clock, which nothing moves but time itself.
    pub auto_advance: bool,
    /// [`Fabric::run_until_idle`] gives up after this much (virtual or real) time.
    pub idle_limit: Duration,
    /// The clock: [`Clock::Virtual`] (deterministic) or [`Clock::Wall`].
    pub clock: Clock,
    /// Whether the data of one-sided operations moves (true, the default). False makes the
    /// NIC skip its payload copies, to measure what the software around it costs: the data
    /// of RDMA WRITEs (with immediate or not) and READ responses is neither read from the
    /// source memory (packets carry zeros of the right length) nor written to the
    /// destination memory, which keeps whatever it held. Everything else stays real: headers,
    /// immediates, keys, access and bounds checks on every SGE and remote range, lengths,
    /// PSNs, ACKs, faults and completions. SENDs (and atomics) still move their bytes, as the
    /// software that receives them reads them (control messages, retransmission headers).
    pub copy_payload: bool,
    /// The network: the in-process [simulation](Link::Simulated) (the default) or
    /// [UDP](Link::Udp) between processes.
    pub link: Link,
    /// Where the devices meet on the in-process network: [no switch](Topology::Direct) (the
    /// default), one switch, or a leaf-spine fabric (see [`crate::topology`]).
    pub topology: Topology,
}

impl Default for FabricConfig {
    fn default() -> Self {
        FabricConfig {
            devices: 2,
            seed: 0,
            mtu: 4096,
            latency_ns: 1000,
            gbps: 100,
            max_qp_wr: 16384,
            max_sge: 32,
            max_cqe: 1 << 20,
            max_inline_data: 256,
            max_srq_wr: 16384,
            max_rd_atomic: 16,
            max_msg_size: 1 << 31,
            auto_advance: true,
            idle_limit: Duration::from_secs(60),
            clock: Clock::Virtual,
            copy_payload: true,
            link: Link::Simulated,
            topology: Topology::Direct,
        }
    }
}

/// What can go wrong with a fabric as a whole.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// [`Fabric::run_until_idle`] hit [`FabricConfig::idle_limit`] with events still pending
    /// (an RC QP retrying forever, for instance).
    StillBusy {
        /// Fabric time when it gave up.
        now: Duration,
    },
    /// A panic inside softnic (a bug, or a panicking packet filter) left the state possibly
    /// half-updated: the fabric refuses all further work.
    Broken {
        /// What panicked, and where.
        reason: String,
    },
    /// No device of that name is on this fabric.
    UnknownDevice(String),
    /// A fault probability is not a number in `0.0..=1.0`.
    InvalidFaults(InvalidFaults),
    /// The system refused what a fabric on the UDP link needs (an eventfd, a thread).
    System {
        /// What was being done.
        what: &'static str,
        /// The system's reason, with its errno.
        reason: String,
    },
    /// A device's UDP socket could not be bound ([`Link::Udp`]): the address is in use (by
    /// another fabric or process), not local, or none of 127.0.0.2-254 was free.
    Bind {
        /// The address asked for (`None`: any free one).
        addr: Option<Ipv4Addr>,
        /// The system's reason, with its errno.
        reason: String,
    },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::StillBusy { now } => {
                write!(f, "fabric still busy after running until {now:?}")
            }
            Error::Broken { reason } => write!(f, "fabric broken by an earlier panic: {reason}"),
            Error::UnknownDevice(name) => write!(f, "no device named {name:?} on this fabric"),
            Error::InvalidFaults(e) => e.fmt(f),
            Error::System { what, reason } => write!(f, "{what}: {reason}"),
            Error::Bind {
                addr: Some(a),
                reason,
            } => write!(f, "binding softnic's RoCEv2 port {a}:4791: {reason}"),
            Error::Bind { addr: None, reason } => write!(
                f,
                "no free address for softnic's RoCEv2 port in 127.0.0.2-254 (port 4791): {reason}"
            ),
        }
    }
}

impl std::error::Error for Error {}

impl From<InvalidFaults> for Error {
    fn from(e: InvalidFaults) -> Self {
        Error::InvalidFaults(e)
    }
}

/// A software RDMA fabric: devices, the network between them, the clock.
///
/// Cloning gives another handle to the same fabric; when the last handle is dropped, the
/// fabric and every object on it are freed, and pointers to them fail as unknown (verbs-safe
/// objects hold a handle, so they keep their fabric alive). Work advances when a CQ is polled
/// or a verb is called, when [`step`](Self::step), [`advance`](Self::advance) or
/// [`run_until_idle`](Self::run_until_idle) is called, or in a
/// [progress thread](Self::spawn_progress_thread); see [`Clock`] for how time moves.
#[derive(Clone)]
pub struct Fabric {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for Fabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fabric").finish_non_exhaustive()
    }
}

impl Default for Fabric {
    fn default() -> Self {
        Fabric::new(FabricConfig::default())
    }
}

impl Fabric {
    /// A fabric of `cfg.devices` devices named `soft0`, `soft1`, ...
    ///
    /// Each has one port (number 1) and one GID, `::ffff:10.0.0.<index + 1>` (IPv4-mapped, as
    /// a RoCEv2 port has) on the simulated link, its address on the [UDP link](Link::Udp);
    /// an unsupported MTU is rounded down to the nearest IB MTU.
    ///
    /// # Panics
    ///
    /// If a device of a [`Link::Udp`] fabric cannot bind its socket: use
    /// [`try_new`](Self::try_new) there. A simulated fabric never fails.
    pub fn new(cfg: FabricConfig) -> Fabric {
        Fabric::try_new(cfg).unwrap_or_else(|e| panic!("softnic: {e}"))
    }

    /// Like [`new`](Self::new), with [`Error::Bind`] when a device on the UDP link cannot
    /// bind its address.
    pub fn try_new(cfg: FabricConfig) -> Result<Fabric, Error> {
        let mut cfg = cfg;
        cfg.mtu = [4096, 2048, 1024, 512, 256]
            .into_iter()
            .find(|&m| m <= cfg.mtu)
            .unwrap_or(256);
        let mut ports = Vec::with_capacity(cfg.devices);
        if let Link::Udp { addr } = cfg.link {
            cfg.clock = Clock::Wall;
            for i in 0..cfg.devices {
                let port = match addr {
                    Some(a) => {
                        let a = Ipv4Addr::from(u32::from(a).wrapping_add(i as u32));
                        UdpPort::bind(a).map_err(|e| Error::Bind {
                            addr: Some(a),
                            reason: e.to_string(),
                        })?
                    }
                    None => {
                        let taken = ports.iter().map(|p: &UdpPort| p.ip).collect::<Vec<_>>();
                        UdpPort::bind_free(&taken).map_err(|e| Error::Bind {
                            addr: None,
                            reason: e.to_string(),
                        })?
                    }
                };
                ports.push(port);
            }
        }
        let mut ports = ports.into_iter();
        let devices = (0..cfg.devices)
            .map(|i| {
                let name = format!("soft{i}");
                let udp = ports.next();
                let gid = match &udp {
                    Some(p) => crate::roce::ipv4_gid(p.ip),
                    None => crate::roce::ipv4_gid(Ipv4Addr::new(
                        10,
                        0,
                        (i >> 8) as u8,
                        (i & 0xff) as u8 + 1,
                    )),
                };
                Device {
                    shell: Shell::new(crate::control::device_shell(&name), i as u32),
                    name,
                    gid,
                    counters: Counters::default(),
                    egress_free_at: 0,
                    tx_ready: VecDeque::new(),
                    qpns: Default::default(),
                    groups: Default::default(),
                    next_qpn: 0x11,
                    srqns: Default::default(),
                    next_srqn: 1,
                    keys: crate::keys::Keys::new(match cfg.clock {
                        Clock::Virtual => crate::keys::KeySecret::seeded(cfg.seed, i),
                        Clock::Wall => crate::keys::KeySecret::random(),
                    }),
                    udp,
                }
            })
            .collect::<Vec<_>>();
        let mut poll_fds = devices
            .iter()
            .filter_map(|d| d.udp.as_ref().map(UdpPort::rx_fd))
            .collect::<Vec<_>>();
        let waker = if poll_fds.is_empty() {
            None
        } else {
            let w = EventFd::new_waker().ok_or_else(|| Error::System {
                what: "creating the progress thread's eventfd",
                reason: std::io::Error::last_os_error().to_string(),
            })?;
            poll_fds.push(w.raw());
            Some(w)
        };
        let switches =
            crate::link::switch::Switches::new(&cfg.topology, cfg.devices, cfg.gbps, cfg.seed);
        let w = World {
            switches,
            on_udp: devices.iter().any(|d| d.udp.is_some()),
            rng: Rng::new(cfg.seed),
            cfg,
            now: 0,
            started: Instant::now(),
            devices,
            contexts: BTreeMap::new(),
            pds: BTreeMap::new(),
            mrs: BTreeMap::new(),
            mws: BTreeMap::new(),
            cqs: Default::default(),
            channels: BTreeMap::new(),
            srqs: Default::default(),
            xrcds: BTreeMap::new(),
            domains: BTreeMap::new(),
            ahs: BTreeMap::new(),
            ah_by_ptr: Default::default(),
            net: Net::default(),
            spare: Default::default(),
            udp_in: Vec::new(),
            group_in: Default::default(),
            timers: Default::default(),
            alarms: Default::default(),
            owed_events: Default::default(),
            faults: BTreeMap::new(),
            default_faults: Faults::NONE,
            filter: None,
            next_id: 0,
            cm: Default::default(),
        };
        let started = w.started;
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let shared = Arc::new(Shared {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            state: Mutex::new(State {
                qps: Default::default(),
                w,
                found_quiet: false,
            }),
            broken: AtomicBool::new(false),
            why: Mutex::new(None),
            wakeup: Condvar::new(),
            sleeper: AtomicBool::new(false),
            waker,
            poll_fds,
            started,
            last_poll: std::sync::atomic::AtomicU64::new(0),
            quiet: std::sync::atomic::AtomicU64::new(0),
            waiting: Default::default(),
            served: Default::default(),
            acks: Mutex::new(()),
            acked: Condvar::new(),
            ack_waiters: Default::default(),
        });
        let fabric = Fabric { shared };
        let st = fabric.shared.lock_any();
        for d in &st.w.devices {
            abi::register(
                d.shell.ptr().cast(),
                Kind::Device,
                &fabric.shared,
                d.shell.id,
            );
        }
        let udp = st.w.devices.iter().any(|d| d.udp.is_some());
        drop(st);
        if udp {
            crate::progress::spawn_udp_progress(&fabric.shared).map_err(|e| Error::System {
                what: "spawning the UDP progress thread",
                reason: e.to_string(),
            })?;
        }
        Ok(fabric)
    }

    /// The state for work, or [`Error::Broken`].
    fn live(&self) -> Result<MutexGuard<'_, State>, Error> {
        self.shared.lock().ok_or_else(|| self.shared.broken_error())
    }

    /// Why the fabric is broken (a panic inside softnic, reported once on standard error), or
    /// `None` while it works. Every verb on a broken fabric fails with EIO.
    pub fn broken(&self) -> Option<String> {
        self.shared.broken()
    }

    /// The configuration (with the MTU as it was rounded).
    pub fn config(&self) -> FabricConfig {
        self.shared.read(|st| st.w.cfg.clone())
    }

    /// Every device, as libibverbs `ibv_device` pointers, valid as long as the fabric lives.
    pub fn devices(&self) -> Vec<*mut ibv_device> {
        self.shared
            .read(|st| st.w.devices.iter().map(|d| d.shell.ptr().cast()).collect())
    }

    /// The device named `name`.
    pub fn device(&self, name: &str) -> Option<*mut ibv_device> {
        self.shared.read(|st| {
            st.w.devices
                .iter()
                .find(|d| d.name == name)
                .map(|d| d.shell.ptr().cast())
        })
    }

    /// The IPv4 address of device `name`'s port on the [UDP link](Link::Udp) (`None` on the
    /// simulated link, or for no such device).
    pub fn udp_addr(&self, name: &str) -> Option<Ipv4Addr> {
        self.shared.read(|st| {
            let d = st.w.devices.iter().find(|d| d.name == name)?;
            d.udp.as_ref().map(|p| p.ip)
        })
    }

    /// The node GUID of device `name` (host order; `ibv_query_device` gives it big-endian):
    /// on the [UDP link](Link::Udp) a modified EUI-64 of its address, else `02:00::` and the
    /// device's index.
    pub fn node_guid(&self, name: &str) -> Option<u64> {
        self.shared.read(|st| {
            let (i, d) =
                st.w.devices
                    .iter()
                    .enumerate()
                    .find(|(_, d)| d.name == name)?;
            Some(d.node_guid(i))
        })
    }

    /// The IPv4-mapped GID of device `name`: index 0 of its GID table on the in-process
    /// network, index 1 on the UDP link (after the link-local GID, as rxe's table is).
    pub fn gid(&self, name: &str) -> Option<[u8; 16]> {
        self.shared
            .read(|st| st.w.devices.iter().find(|d| d.name == name).map(|d| d.gid))
    }

    /// The names of the devices, in order.
    pub fn device_names(&self) -> Vec<String> {
        self.shared
            .read(|st| st.w.devices.iter().map(|d| d.name.clone()).collect())
    }

    /// The current fabric time (virtual, or elapsed real time on the wall clock).
    pub fn now(&self) -> Duration {
        Duration::from_nanos(self.now_ns())
    }

    /// [`now`](Self::now) in nanoseconds, for a caller that keeps time as a number (a
    /// `Duration` costs a division to make).
    ///
    /// ```
    /// let fabric = softnic::Fabric::default();
    /// assert_eq!(u128::from(fabric.now_ns()), fabric.now().as_nanos());
    /// ```
    #[inline]
    pub fn now_ns(&self) -> u64 {
        if let Some(now) = self.shared.quiet_now() {
            return now;
        }
        let mut st = self.shared.lock_any();
        st.sync_clock();
        st.w.now
    }

    /// Processes everything due now (on the UDP link a port sends 1 024 packets a step at
    /// most; what is left is due at once). Returns whether anything happened (false on a
    /// broken fabric).
    pub fn step(&self) -> bool {
        self.live().is_ok_and(|mut st| st.progress())
    }

    /// Moves time forward by `d`, processing every event on the way in order. On the virtual
    /// clock this takes no real time; on the wall clock it sleeps between events until `d`
    /// has passed. Does nothing on a broken fabric.
    // Never inlined: bench row 13 counts the event loop's instructions as those of this
    // function's calls (callgrind's `--toggle-collect`), which a caller that inlined it (a
    // link-time optimised build) would take into its own.
    #[inline(never)]
    pub fn advance(&self, d: Duration) {
        let Ok(mut st) = self.live() else { return };
        let end = st.w.now.saturating_add(d.as_nanos() as u64);
        if st.w.cfg.clock == Clock::Wall {
            drop(st);
            let _ = self.run_wall(end, |_| false);
            return;
        }
        // Left quiet by the last holder of the lock: nothing is due now.
        if !st.found_quiet {
            st.progress();
        }
        while let Some(t) = st.next_event().filter(|&t| t <= end) {
            st.w.now = st.w.now.max(t);
            st.progress();
        }
        st.w.now = end;
        // Nothing is due at `end` (the next event is later), but datagrams may have come.
        if st.w.on_udp {
            st.progress();
        }
        self.shared.leave_quiet(&st);
    }

    /// Runs until nothing is pending (no packet in flight, no timer armed, nothing to send):
    /// on the virtual clock by moving it from event to event, on the wall clock by sleeping
    /// until each is due. Gives up with [`Error::StillBusy`] after
    /// [`FabricConfig::idle_limit`].
    pub fn run_until_idle(&self) -> Result<(), Error> {
        let mut st = self.live()?;
        let limit =
            st.w.now
                .saturating_add(st.w.cfg.idle_limit.as_nanos() as u64);
        if st.w.cfg.clock == Clock::Wall {
            drop(st);
            return self.run_wall(limit, |st| st.next_event().is_none());
        }
        loop {
            st.progress();
            match st.next_event() {
                None => return Ok(()),
                Some(t) if t > limit => {
                    st.w.now = limit;
                    return Err(Error::StillBusy {
                        now: Duration::from_nanos(limit),
                    });
                }
                Some(t) => st.w.now = st.w.now.max(t),
            }
        }
    }

    /// Wall clock: makes progress, sleeping until each next event, until `done` holds (then
    /// `Ok`) or time `end` is reached (then `StillBusy`, unless `done` is never asked for).
    fn run_wall(&self, end: u64, done: impl Fn(&State) -> bool) -> Result<(), Error> {
        loop {
            let mut st = self.live()?;
            st.progress();
            if done(&st) {
                return Ok(());
            }
            if st.w.now >= end {
                return Err(Error::StillBusy {
                    now: Duration::from_nanos(st.w.now),
                });
            }
            let next = st.next_event().unwrap_or(end).min(end);
            let nap = Duration::from_nanos(next.saturating_sub(st.w.now));
            drop(st);
            std::thread::sleep(nap.max(Duration::from_micros(1)));
        }
    }

    /// Hands `bytes` to device `to` as a frame that arrived from the wire, sent by GID `sgid`
    /// (for UD, the source a receiver sees in its GRH). Anything may come from a wire: a frame
    /// that does not parse is counted (`icrc_errors`, `malformed`) and dropped, and a parsed
    /// one is checked like any other packet. For fuzzing and for links softnic does not own.
    pub fn inject(&self, to: &str, sgid: [u8; 16], bytes: &[u8]) -> Result<(), Error> {
        let mut st = self.live()?;
        let dev =
            st.w.devices
                .iter()
                .position(|d| d.name == to)
                .ok_or_else(|| Error::UnknownDevice(to.to_string()))?;
        let frame = Frame {
            from: dev,
            to: Dest::Local(dev),
            sport: 0,
            sgid,
            bytes: bytes.to_vec(),
            sealed: true,
            gather: None,
            ecn: 0,
            at: None,
            mgid: None,
        };
        st.deliver(&frame);
        st.progress();
        Ok(())
    }

    /// Sets the faults on packets from device `from` to device `to`. A probability that is not
    /// a number in `0.0..=1.0` is refused ([`Error::InvalidFaults`]), and the faults set before
    /// stay.
    pub fn set_faults(&self, from: &str, to: &str, faults: Faults) -> Result<(), Error> {
        faults.check()?;
        let mut st = self.shared.lock_any();
        let index = |n: &str| {
            st.w.devices
                .iter()
                .position(|d| d.name == n)
                .ok_or_else(|| Error::UnknownDevice(n.to_string()))
        };
        let key = (index(from)?, index(to)?);
        st.w.faults.insert(key, faults);
        Ok(())
    }

    /// Sets the faults of every direction that has none set of its own. A probability that is
    /// not a number in `0.0..=1.0` is refused ([`Error::InvalidFaults`]), and the faults set
    /// before stay.
    pub fn set_default_faults(&self, faults: Faults) -> Result<(), Error> {
        faults.check()?;
        self.shared.lock_any().w.default_faults = faults;
        Ok(())
    }

    /// Installs (or removes) a hook called on every packet sent, before the random faults.
    pub fn set_packet_filter(&self, filter: Option<PacketFilter>) {
        self.shared.lock_any().w.filter = filter;
    }

    /// The counters of the device named `name`.
    pub fn device_counters(&self, name: &str) -> Option<Counters> {
        self.shared.read(|st| {
            st.w.devices
                .iter()
                .find(|d| d.name == name)
                .map(|d| d.counters)
        })
    }

    /// The counters of a QP of this fabric (`None` for a pointer that is not one).
    pub fn qp_counters(&self, qp: *const ibv_qp) -> Option<Counters> {
        let found = abi::lookup(qp.cast(), Kind::Qp)?;
        if !Arc::ptr_eq(&found.fabric, &self.shared) {
            return None;
        }
        self.shared
            .read(|st| st.qps.get(&found.id).map(|q| q.counters))
    }

    /// When the next pending event (a packet's arrival, a timer, a port free to send) is due,
    /// on the fabric's clock; `None` when nothing is pending. For drivers that move the
    /// virtual clock themselves ([`advance`](Self::advance)).
    pub fn next_event(&self) -> Option<Duration> {
        self.shared
            .read(|st| st.next_event())
            .map(Duration::from_nanos)
    }

    /// Packets in flight now (on links and in switch queues).
    pub fn in_flight(&self) -> usize {
        self.shared.read(|st| st.w.net.len())
    }
}
