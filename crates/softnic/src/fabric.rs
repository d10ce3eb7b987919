//! The fabric: devices on one simulated network, the virtual clock, and progress.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ibverbs_sys::{ibv_device, ibv_qp};

use crate::abi::{self, Kind, Shell};
use crate::counters::Counters;
use crate::faults::{Faults, PacketFilter, Rng};
use crate::net::{Frame, Net};
use crate::packet::{Packet, WireError};
use crate::state::{Device, State, World};

/// How a fabric is built. `FabricConfig::default()` gives two 100 Gb/s devices, 1 us latency,
/// 4096-byte MTU, no faults, seed 0.
#[derive(Debug, Clone, PartialEq)]
pub struct FabricConfig {
    /// Number of devices: `soft0`, `soft1`, ...
    pub devices: usize,
    /// Seed of the fault-injection RNG: the same seed and the same calls give the same run.
    pub seed: u64,
    /// The port MTU in bytes (256, 512, 1024, 2048 or 4096): the largest path MTU and the UD
    /// payload limit.
    pub mtu: u32,
    /// One-way latency of every link, in nanoseconds.
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
    /// Largest message in bytes.
    pub max_msg_size: u32,
    /// `poll_cq` on an empty CQ moves the virtual clock to the next pending event (so a
    /// busy-polling caller always makes progress, retransmission timeouts included).
    pub auto_advance: bool,
    /// [`Fabric::run_until_idle`] gives up after this much virtual time.
    pub idle_limit: Duration,
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
        }
    }
}

/// What the fabric's lock protects, and whether a bug broke it.
pub(crate) struct Shared {
    /// Distinguishes this fabric's registry entries.
    pub(crate) id: u64,
    state: Mutex<State>,
    /// Set when a call panicked inside softnic: every later call fails with EIO rather than
    /// working on state the panic may have left half-updated.
    broken: AtomicBool,
}

impl Drop for Shared {
    fn drop(&mut self) {
        abi::unregister_fabric(self.id);
    }
}

impl Shared {
    /// The state, unless a panic broke it.
    pub(crate) fn lock(&self) -> Option<MutexGuard<'_, State>> {
        if self.broken.load(Ordering::Relaxed) {
            return None;
        }
        Some(self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub(crate) fn mark_broken(&self) {
        self.broken.store(true, Ordering::Relaxed);
    }
}

/// A software RDMA fabric: devices, the network between them, the virtual clock.
///
/// Cloning gives another handle to the same fabric; when the last handle is dropped, the
/// fabric and every object on it are freed, and pointers to them fail as unknown (verbs-safe
/// objects hold a handle, so they keep their fabric alive). Nothing runs in the background: work
/// advances when a CQ is polled (which, with [`FabricConfig::auto_advance`], also moves the
/// virtual clock to the next event when the CQ is empty) or when [`step`](Self::step),
/// [`advance`](Self::advance) or [`run_until_idle`](Self::run_until_idle) is called.
#[derive(Clone)]
pub struct Fabric {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for Fabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fabric").finish_non_exhaustive()
    }
}

/// [`Fabric::run_until_idle`] hit its virtual-time limit with events still pending (an RC QP
/// retrying forever, for instance).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StillBusy {
    /// Virtual time when it gave up.
    pub now: Duration,
}

impl std::fmt::Display for StillBusy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "fabric still busy after running until {:?} of virtual time",
            self.now
        )
    }
}

impl std::error::Error for StillBusy {}

/// A device name that is not on this fabric.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownDevice(pub String);

impl std::fmt::Display for UnknownDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no device named {:?} on this fabric", self.0)
    }
}

impl std::error::Error for UnknownDevice {}

impl Default for Fabric {
    fn default() -> Self {
        Fabric::new(FabricConfig::default())
    }
}

impl Fabric {
    /// A fabric of `cfg.devices` devices named `soft0`, `soft1`, ...
    ///
    /// Each has one port (number 1) and one GID, `::ffff:10.0.0.<index + 1>` (IPv4-mapped, as
    /// a RoCEv2 port has); an unsupported MTU is rounded down to the nearest IB MTU.
    pub fn new(cfg: FabricConfig) -> Fabric {
        let mut cfg = cfg;
        cfg.mtu = [4096, 2048, 1024, 512, 256]
            .into_iter()
            .find(|&m| m <= cfg.mtu)
            .unwrap_or(256);
        let devices = (0..cfg.devices)
            .map(|i| {
                let name = format!("soft{i}");
                let mut gid = [0u8; 16];
                gid[10] = 0xff;
                gid[11] = 0xff;
                gid[12..16].copy_from_slice(&[10, 0, (i >> 8) as u8, (i & 0xff) as u8 + 1]);
                Device {
                    shell: Shell::new(crate::control::device_struct(&name), i as u32),
                    name,
                    gid,
                    counters: Counters::default(),
                    egress_free_at: 0,
                    tx_ready: BTreeSet::new(),
                    tx_last: 0,
                    qpns: BTreeMap::new(),
                    next_qpn: 0x11,
                    keys: HashMap::new(),
                    next_key: 0,
                }
            })
            .collect::<Vec<_>>();
        let w = World {
            rng: Rng::new(cfg.seed),
            cfg,
            now: 0,
            devices,
            contexts: BTreeMap::new(),
            pds: BTreeMap::new(),
            mrs: BTreeMap::new(),
            cqs: BTreeMap::new(),
            channels: BTreeMap::new(),
            srqs: BTreeMap::new(),
            ahs: BTreeMap::new(),
            ah_by_ptr: HashMap::new(),
            net: Net::default(),
            timers: BTreeSet::new(),
            faults: BTreeMap::new(),
            default_faults: Faults::NONE,
            filter: None,
            next_id: 0,
        };
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let shared = Arc::new(Shared {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            state: Mutex::new(State {
                qps: BTreeMap::new(),
                w,
            }),
            broken: AtomicBool::new(false),
        });
        let fabric = Fabric { shared };
        let mut st = fabric.lock();
        for d in &mut st.w.devices {
            let id = d.shell.id;
            abi::register(d.shell.ptr().cast(), Kind::Device, &fabric.shared, id);
        }
        drop(st);
        fabric
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The configuration (with the MTU as it was rounded).
    pub fn config(&self) -> FabricConfig {
        self.lock().w.cfg.clone()
    }

    /// Every device, as libibverbs `ibv_device` pointers, valid as long as the fabric lives.
    pub fn devices(&self) -> Vec<*mut ibv_device> {
        self.lock()
            .w
            .devices
            .iter_mut()
            .map(|d| d.shell.ptr())
            .collect()
    }

    /// The device named `name`.
    pub fn device(&self, name: &str) -> Option<*mut ibv_device> {
        let mut st = self.lock();
        st.w.devices
            .iter_mut()
            .find(|d| d.name == name)
            .map(|d| d.shell.ptr())
    }

    /// The names of the devices, in order.
    pub fn device_names(&self) -> Vec<String> {
        self.lock()
            .w
            .devices
            .iter()
            .map(|d| d.name.clone())
            .collect()
    }

    /// The current virtual time.
    pub fn now(&self) -> Duration {
        Duration::from_nanos(self.lock().w.now)
    }

    /// Processes everything due at the current virtual time. Returns whether anything happened.
    pub fn step(&self) -> bool {
        self.lock().progress()
    }

    /// Moves the virtual clock forward by `d`, processing every event on the way in order.
    pub fn advance(&self, d: Duration) {
        let mut st = self.lock();
        let end = st.w.now.saturating_add(d.as_nanos() as u64);
        st.progress();
        while let Some(t) = st.next_event().filter(|&t| t <= end) {
            st.w.now = st.w.now.max(t);
            st.progress();
        }
        st.w.now = end;
        st.progress();
    }

    /// Runs until nothing is pending (no packet in flight, no timer armed, nothing to send),
    /// moving the virtual clock from event to event, or until [`FabricConfig::idle_limit`] of
    /// virtual time has passed.
    pub fn run_until_idle(&self) -> Result<(), StillBusy> {
        let mut st = self.lock();
        let limit =
            st.w.now
                .saturating_add(st.w.cfg.idle_limit.as_nanos() as u64);
        loop {
            st.progress();
            match st.next_event() {
                None => return Ok(()),
                Some(t) if t > limit => {
                    st.w.now = limit;
                    return Err(StillBusy {
                        now: Duration::from_nanos(limit),
                    });
                }
                Some(t) => st.w.now = st.w.now.max(t),
            }
        }
    }

    /// Sets the faults on packets from device `from` to device `to`.
    pub fn set_faults(&self, from: &str, to: &str, faults: Faults) -> Result<(), UnknownDevice> {
        let mut st = self.lock();
        let index = |n: &str| {
            st.w.devices
                .iter()
                .position(|d| d.name == n)
                .ok_or_else(|| UnknownDevice(n.to_string()))
        };
        let key = (index(from)?, index(to)?);
        st.w.faults.insert(key, faults);
        Ok(())
    }

    /// Sets the faults of every direction that has none set of its own.
    pub fn set_default_faults(&self, faults: Faults) {
        self.lock().w.default_faults = faults;
    }

    /// Installs (or removes) a hook called on every packet sent, before the random faults.
    pub fn set_packet_filter(&self, filter: Option<PacketFilter>) {
        self.lock().w.filter = filter;
    }

    /// The counters of the device named `name`.
    pub fn device_counters(&self, name: &str) -> Option<Counters> {
        let st = self.lock();
        st.w.devices
            .iter()
            .find(|d| d.name == name)
            .map(|d| d.counters)
    }

    /// The counters of a QP of this fabric (`None` for a pointer that is not one).
    pub fn qp_counters(&self, qp: *const ibv_qp) -> Option<Counters> {
        let (shared, id) = abi::lookup(qp.cast(), Kind::Qp)?;
        if !Arc::ptr_eq(&shared, &self.shared) {
            return None;
        }
        self.lock().qps.get(&id).map(|q| q.counters)
    }

    /// Packets in flight now.
    pub fn in_flight(&self) -> usize {
        self.lock().w.net.len()
    }

    /// Starts a thread that drives this fabric in real time: whenever something is pending it
    /// moves the virtual clock to it and processes it, otherwise it sleeps briefly. For callers
    /// that sleep on a completion channel with nobody else polling. Runs are not deterministic
    /// while it is on; it stops when the handle is dropped.
    pub fn spawn_progress_thread(&self) -> ProgressThread {
        let stop = Arc::new(AtomicBool::new(false));
        let fabric = self.clone();
        let flag = Arc::clone(&stop);
        let handle = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                let busy = {
                    let mut st = fabric.lock();
                    let did = st.progress();
                    did || st.warp()
                };
                if !busy {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
        });
        ProgressThread {
            stop,
            handle: Some(handle),
        }
    }
}

/// The background progress of [`Fabric::spawn_progress_thread`]; stops when dropped.
#[derive(Debug)]
pub struct ProgressThread {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Drop for ProgressThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl State {
    /// Processes everything due now: arrivals, timers, transmissions, until nothing is left.
    pub(crate) fn progress(&mut self) -> bool {
        let mut any = false;
        loop {
            let mut did = self.deliver_due();
            did |= self.fire_timers();
            did |= self.transmit_ready();
            if !did {
                return any;
            }
            any = true;
        }
    }

    /// Moves the clock to the next pending event and processes it. False if nothing is pending.
    pub(crate) fn warp(&mut self) -> bool {
        match self.next_event() {
            Some(t) => {
                self.w.now = self.w.now.max(t);
                self.progress();
                true
            }
            None => false,
        }
    }

    /// The time of the next pending event.
    pub(crate) fn next_event(&self) -> Option<u64> {
        let w = &self.w;
        let ports = w
            .devices
            .iter()
            .filter(|d| !d.tx_ready.is_empty())
            .map(|d| d.egress_free_at.max(w.now));
        [w.net.next_at(), w.timers.first().map(|&(t, _)| t)]
            .into_iter()
            .flatten()
            .chain(ports)
            .min()
    }

    fn deliver_due(&mut self) -> bool {
        let mut did = false;
        while let Some(frame) = self.w.net.pop_due(self.w.now) {
            did = true;
            self.deliver(&frame);
        }
        did
    }

    fn deliver(&mut self, frame: &Frame) {
        let dev = frame.to;
        let pkt = match Packet::parse(&frame.bytes) {
            Ok(p) => p,
            Err(e) => {
                if e == WireError::BadIcrc {
                    self.w.devices[dev].counters.icrc_errors += 1;
                }
                return;
            }
        };
        let Some(&id) = self.w.devices[dev].qpns.get(&pkt.hdr.dest_qp) else {
            self.w.devices[dev].counters.messages_dropped += 1;
            return;
        };
        if let Some(qp) = self.qps.get_mut(&id) {
            qp.receive(&mut self.w, &pkt, frame);
        }
    }

    fn fire_timers(&mut self) -> bool {
        let mut did = false;
        while let Some(&(t, id)) = self.w.timers.first() {
            if t > self.w.now {
                break;
            }
            self.w.timers.pop_first();
            did = true;
            if let Some(qp) = self.qps.get_mut(&id)
                && qp.req.timer == Some(t)
            {
                qp.on_timer(&mut self.w);
            }
        }
        did
    }

    /// Each port that is free sends one packet of the next ready QP (round-robin).
    fn transmit_ready(&mut self) -> bool {
        let mut did = false;
        for dev in 0..self.w.devices.len() {
            while self.w.devices[dev].egress_free_at <= self.w.now {
                let d = &self.w.devices[dev];
                let Some(id) = d
                    .tx_ready
                    .range(d.tx_last.saturating_add(1)..)
                    .next()
                    .or_else(|| d.tx_ready.first())
                    .copied()
                else {
                    break;
                };
                let sent = self
                    .qps
                    .get_mut(&id)
                    .is_some_and(|qp| qp.next_tx(&mut self.w));
                let d = &mut self.w.devices[dev];
                if sent {
                    d.tx_last = id;
                    did = true;
                } else {
                    d.tx_ready.remove(&id);
                }
            }
        }
        did
    }
}
