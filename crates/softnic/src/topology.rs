//! Where the simulated link's devices meet: no switch (each port sends straight to the
//! receiving device, the default), one switch, or a two-tier leaf-spine fabric.
//!
//! A switch is output-queued, as the ns-3 switches of DCQCN's and HPCC's evaluations are: a
//! packet that arrives is routed to one egress port and waits in that port's FIFO behind the
//! bytes already queued there, then leaves at the port's rate and reaches the next hop a
//! link's propagation delay later. Each egress holds at most
//! [`SwitchConfig::buffer_bytes`]: a packet that does not fit is dropped (drop-tail). With
//! [`SwitchConfig::ecn`], a packet whose IPv4 header says ECN-capable (softnic's devices send
//! their QPs' packets ECT(0), as a RoCE NIC with ECN enabled does; CNPs go without) is marked
//! Congestion Experienced
//! with RED's probability on the queue it joins; the receiving device answers a marked packet
//! with a CNP to the sending QP, at most one per QP every [`CNP_INTERVAL_NS`], as RoCE NICs'
//! notification points do. CNPs are counted (`Counters::cnps_sent`, `cnps_received`); nothing
//! in softnic slows down on them (a NIC's DCQCN reaction point is not modelled).
//!
//! In a leaf-spine fabric, device `i` hangs off leaf `i % leaves` and every leaf is linked to
//! every spine; a leaf sends a packet for another leaf up to the spine an ECMP hash of the
//! packet's addresses and RoCEv2 UDP source port picks, so that a QP's path is its source
//! port, as on real fabrics. Packets that reach a switch in the same nanosecond are taken in
//! an order drawn from the seed (a fair arbiter; every other tie goes by sending sequence).
//! Everything runs on the fabric's clock and draws from its seed: a run replays bit for bit.
//!
//! A packet's size on every link is its RoCEv2 transport part, BTH to ICRC (what
//! [`Counters::bytes_sent`](crate::Counters::bytes_sent) counts): the Ethernet, IPv4 and UDP
//! headers, FCS, preamble and gap (66 bytes a frame on real Ethernet) are not modelled, so a
//! link carries about 1.5% more 4 KiB packets than real 100 GbE does, and buffers hold as
//! much more. The fabric's [`latency_ns`](crate::FabricConfig::latency_ns) is not used
//! between devices that meet at switches: each link takes [`SwitchConfig::latency_ns`]. Frames between processes (the UDP link) and a device's frames to
//! itself never pass a switch.
//!
//! ```
//! use softnic::{Fabric, FabricConfig, SwitchConfig, Topology};
//!
//! // 17 devices on one switch whose egress ports queue at most 1 MB each.
//! let fabric = Fabric::new(FabricConfig {
//!     devices: 17,
//!     topology: Topology::Star(SwitchConfig { buffer_bytes: 1 << 20, ..Default::default() }),
//!     ..Default::default()
//! });
//! assert!(fabric.switch_stats().iter().all(|p| p.drops == 0));
//! ```

use crate::Fabric;

/// The shortest time between two CNPs a device sends to one QP, in nanoseconds: a RoCE NIC's
/// notification point sends at most one per QP per such interval (mlx5's
/// `min_time_between_cnps`, 4 us by default).
pub const CNP_INTERVAL_NS: u64 = 4_000;

/// How the simulated link's devices are connected.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Topology {
    /// No switch: a device's port serialises its packets and each reaches its receiver
    /// [`FabricConfig::latency_ns`](crate::FabricConfig::latency_ns) later, whatever else
    /// arrives there (packets to one receiver never queue).
    #[default]
    Direct,
    /// Every device on one switch.
    Star(SwitchConfig),
    /// `leaves` leaf switches, each linked to each of `spines` spine switches; device `i` on
    /// leaf `i % leaves`.
    LeafSpine {
        /// Leaf switches (at least 1).
        leaves: usize,
        /// Spine switches (at least 1).
        spines: usize,
        /// Every switch's configuration.
        switch: SwitchConfig,
    },
}

/// One switch: its egress ports' buffer and marking, and the links from it.
#[derive(Debug, Clone, PartialEq)]
pub struct SwitchConfig {
    /// Bytes one egress port may hold queued (the packet leaving included); a packet that
    /// would exceed it is dropped. `u64::MAX`: no limit.
    pub buffer_bytes: u64,
    /// ECN marking on the egress queues; `None`: no marking.
    pub ecn: Option<Red>,
    /// The rate of every link from this switch (to devices and to other switches), in Gb/s.
    /// 0: the fabric's [`gbps`](crate::FabricConfig::gbps).
    pub gbps: u64,
    /// The propagation delay of every link (device to switch and switch to switch), in ns.
    pub latency_ns: u64,
}

impl Default for SwitchConfig {
    /// No buffer limit, no marking, the fabric's rate, 1 us per link.
    fn default() -> Self {
        SwitchConfig {
            buffer_bytes: u64::MAX,
            ecn: None,
            gbps: 0,
            latency_ns: 1_000,
        }
    }
}

/// RED-style ECN marking on the queue a packet joins (in bytes, itself not counted): never
/// below `kmin`, always above `kmax`, and with probability rising linearly from 0 to `pmax`
/// in between (DCQCN's and HPCC's switches).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Red {
    /// Queue below which nothing is marked.
    pub kmin: u64,
    /// Queue above which everything is marked.
    pub kmax: u64,
    /// Marking probability at `kmax`.
    pub pmax: f64,
}

impl Red {
    /// The marking probability on a queue of `queued` bytes.
    pub fn probability(&self, queued: u64) -> f64 {
        if queued <= self.kmin {
            0.0
        } else if queued > self.kmax {
            1.0
        } else {
            let span = (self.kmax - self.kmin).max(1) as f64;
            self.pmax * (queued - self.kmin) as f64 / span
        }
    }
}

/// Where an egress port leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortTo {
    /// The device of that index.
    Device(usize),
    /// The switch of that index (leaves first, then spines).
    Switch(usize),
}

/// What one egress port of a switch saw (since the fabric was made or the stats were last
/// [reset](crate::Fabric::reset_switch_stats)).
#[derive(Debug, Clone, PartialEq)]
pub struct PortStats {
    /// The switch (leaves first, then spines; the one switch of a star is 0).
    pub switch: usize,
    /// Where the port leads.
    pub to: PortTo,
    /// Packets that joined the queue (and will leave), and their bytes.
    pub packets: u64,
    /// Bytes of those packets.
    pub bytes: u64,
    /// Packets dropped for want of buffer.
    pub drops: u64,
    /// Packets marked Congestion Experienced.
    pub ecn_marks: u64,
    /// The queue each packet found when it arrived (bytes ahead of it, not yet sent): median.
    pub queue_p50: u64,
    /// The 99th percentile of the same.
    pub queue_p99: u64,
    /// The largest of the same.
    pub queue_max: u64,
}

impl Fabric {
    /// What each switch's egress ports saw ([`FabricConfig::topology`](crate::FabricConfig::topology);
    /// empty without switches), since the fabric was made or
    /// [`reset_switch_stats`](Self::reset_switch_stats).
    pub fn switch_stats(&self) -> Vec<PortStats> {
        self.shared.lock_any().w.switch_stats()
    }

    /// Starts the switches' statistics afresh (to measure a steady state after a warm-up).
    pub fn reset_switch_stats(&self) {
        if let Some(sw) = self.shared.lock_any().w.switches.as_mut() {
            sw.reset_stats();
        }
    }
}
