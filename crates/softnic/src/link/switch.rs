//! The simulated link's switches (see [`crate::topology`]): output-queued, one FIFO per
//! egress port, drop-tail, RED marking, ECMP on the UDP source port.
//!
//! A frame on its way carries the switch it arrives at next ([`Frame::at`]); when it arrives
//! (the network pops it in arrival order, with its arrival time: on the wall clock perhaps a
//! little after it), [`World::forward`] routes it to an egress port. Packets arrive at a
//! switch in time order, so a port's queue is a single number, the time its link is free again:
//! a packet leaves when every byte ahead of it has, and the bytes ahead of it are that time's
//! distance from the packet's arrival at the port's rate. Nothing per packet is allocated.

use hdrhistogram::Histogram;

use super::{CE, Dest, ECT0, Frame};
use crate::state::World;
use crate::topology::{PortStats, PortTo, Red, SwitchConfig, Topology};

/// The largest queue the statistics tell apart (bytes); larger ones count as this.
const QUEUE_RANGE: u64 = 1 << 40;

/// One egress port.
#[derive(Debug)]
struct Egress {
    switch: usize,
    to: PortTo,
    /// When its link is free to send the next packet.
    free_at: u64,
    packets: u64,
    bytes: u64,
    drops: u64,
    marks: u64,
    /// The queue each packet found, in bytes.
    queue: Histogram<u64>,
}

/// Every switch of a fabric and its ports.
#[derive(Debug)]
pub(crate) struct Switches {
    cfg: SwitchConfig,
    devices: usize,
    leaves: usize,
    spines: usize,
    /// Devices' ports (port `d` leads to device `d`), then each leaf's uplinks (leaf `l` to
    /// spine `k` at `devices + l * spines + k`), then each spine's downlinks (spine `k` to
    /// leaf `l` at `devices + leaves * spines + k * leaves + l`).
    ports: Vec<Egress>,
    /// The ECMP hash's salt (from the fabric's seed).
    salt: u64,
}

impl Switches {
    /// The switches of `topology` for `devices` devices whose ports run at `gbps`; `None` for
    /// no switch.
    pub(crate) fn new(topology: &Topology, devices: usize, gbps: u64, seed: u64) -> Option<Self> {
        let (leaves, spines, cfg) = match topology {
            Topology::Direct => return None,
            Topology::Star(cfg) => (1, 0, cfg),
            Topology::LeafSpine {
                leaves,
                spines,
                switch,
            } => ((*leaves).max(1), (*spines).max(1), switch),
        };
        let mut cfg = cfg.clone();
        if cfg.gbps == 0 {
            cfg.gbps = gbps.max(1);
        }
        let port = |switch, to| Egress {
            switch,
            to,
            free_at: 0,
            packets: 0,
            bytes: 0,
            drops: 0,
            marks: 0,
            queue: Histogram::new_with_bounds(1, QUEUE_RANGE, 2).expect("valid bounds"),
        };
        let mut ports = Vec::with_capacity(devices + 2 * leaves * spines);
        ports.extend((0..devices).map(|d| port(d % leaves, PortTo::Device(d))));
        for l in 0..leaves {
            ports.extend((0..spines).map(|k| port(l, PortTo::Switch(leaves + k))));
        }
        for k in 0..spines {
            ports.extend((0..leaves).map(|l| port(leaves + k, PortTo::Switch(l))));
        }
        Some(Switches {
            cfg,
            devices,
            leaves,
            spines,
            ports,
            salt: seed ^ 0x9e37_79b9_7f4a_7c15,
        })
    }

    /// The switch a device's packets go to first (its leaf), and the link's delay there.
    pub(crate) fn first_hop(&self, dev: usize) -> (u16, u64) {
        ((dev % self.leaves) as u16, self.cfg.latency_ns)
    }

    /// The egress port of switch `s` for a packet from device `src` to device `dst` with UDP
    /// source port `sport`.
    fn route(&self, s: usize, src: usize, dst: usize, sport: u16) -> usize {
        let leaf = dst % self.leaves;
        if s == leaf {
            dst
        } else if s < self.leaves {
            let k = ecmp(self.salt, src, dst, sport) % self.spines as u64;
            self.devices + s * self.spines + k as usize
        } else {
            let k = s - self.leaves;
            self.devices + self.leaves * self.spines + k * self.leaves + leaf
        }
    }

    /// What every port saw.
    pub(crate) fn stats(&self) -> Vec<PortStats> {
        self.ports
            .iter()
            .map(|p| PortStats {
                switch: p.switch,
                to: p.to,
                packets: p.packets,
                bytes: p.bytes,
                drops: p.drops,
                ecn_marks: p.marks,
                queue_p50: p.queue.value_at_quantile(0.5),
                queue_p99: p.queue.value_at_quantile(0.99),
                queue_max: p.queue.max(),
            })
            .collect()
    }

    /// Zeroes every port's counts and samples (not its queue).
    pub(crate) fn reset_stats(&mut self) {
        for p in &mut self.ports {
            (p.packets, p.bytes, p.drops, p.marks) = (0, 0, 0, 0);
            p.queue.reset();
        }
    }
}

/// What an egress port does with a packet of `len` bytes arriving at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admit {
    /// Queued: it leaves the port (its last bit on the link) at this time.
    Leaves {
        at: u64,
        mark: bool,
    },
    Dropped,
}

impl Egress {
    /// Queues a packet of `len` bytes at `now` on a port of `cfg`, marking it (if it is
    /// ECN-capable) with `red`'s probability drawn by `chance`.
    fn admit(
        &mut self,
        cfg: &SwitchConfig,
        now: u64,
        len: u64,
        capable: bool,
        chance: impl FnOnce(f64) -> bool,
    ) -> Admit {
        // The bytes ahead of it: what the link has yet to send.
        let queued = self
            .free_at
            .saturating_sub(now)
            .saturating_mul(cfg.gbps)
            .div_ceil(8);
        if queued.saturating_add(len) > cfg.buffer_bytes {
            self.drops += 1;
            return Admit::Dropped;
        }
        let mark = capable
            && cfg
                .ecn
                .is_some_and(|red: Red| match red.probability(queued) {
                    p if p >= 1.0 => true,
                    p if p <= 0.0 => false,
                    p => chance(p),
                });
        self.marks += u64::from(mark);
        self.packets += 1;
        self.bytes += len;
        self.queue.saturating_record(queued.min(QUEUE_RANGE));
        self.free_at = self.free_at.max(now) + (len * 8).div_ceil(cfg.gbps);
        Admit::Leaves {
            at: self.free_at,
            mark,
        }
    }
}

/// The ECMP hash of a packet's flow: its end points and UDP source port (the rest of a RoCEv2
/// 5-tuple is the same for every packet), salted.
fn ecmp(salt: u64, src: usize, dst: usize, sport: u16) -> u64 {
    let mut h = salt ^ ((src as u64) << 40) ^ ((dst as u64) << 16) ^ u64::from(sport);
    // splitmix64's finaliser.
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

impl World {
    /// A frame arrived at the switch it names at time `arrived` (on the wall clock this may be
    /// a little before now): it joins its egress queue as of then (or is dropped) and goes on
    /// to the next hop.
    pub(crate) fn forward(&mut self, arrived: u64, mut frame: Frame) {
        let (Some(s), Some(sw), Dest::Local(dst)) = (frame.at, self.switches.as_mut(), frame.to)
        else {
            return;
        };
        let port = sw.route(usize::from(s), frame.from, dst, frame.sport);
        let len = frame.wire_len() as u64;
        let rng = &mut self.rng;
        let egress = &mut sw.ports[port];
        let to = egress.to;
        match egress.admit(&sw.cfg, arrived, len, frame.ecn & ECT0 != 0, |p| {
            rng.chance(p)
        }) {
            Admit::Dropped => self.spare.give(frame.bytes),
            Admit::Leaves { at, mark } => {
                if mark {
                    frame.ecn = CE;
                }
                frame.at = match to {
                    PortTo::Device(_) => None,
                    PortTo::Switch(next) => Some(next as u16),
                };
                let at = at + sw.cfg.latency_ns;
                self.send_on(at, frame);
            }
        }
    }

    /// Every switch port's statistics (empty without switches).
    pub(crate) fn switch_stats(&self) -> Vec<PortStats> {
        self.switches
            .as_ref()
            .map_or_else(Vec::new, Switches::stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn star(buffer_bytes: u64, ecn: Option<Red>) -> Switches {
        let cfg = SwitchConfig {
            buffer_bytes,
            ecn,
            gbps: 8, // a byte a nanosecond
            latency_ns: 0,
        };
        Switches::new(&Topology::Star(cfg), 4, 100, 1).expect("a switch")
    }

    #[test]
    fn a_port_is_a_fifo_at_its_rate() {
        let mut sw = star(u64::MAX, None);
        let cfg = sw.cfg.clone();
        let p = &mut sw.ports[0];
        // Three packets at once leave one after another; a later one waits only for what is
        // still ahead of it.
        let at = |a| match a {
            Admit::Leaves { at, .. } => at,
            Admit::Dropped => panic!("dropped"),
        };
        assert_eq!(at(p.admit(&cfg, 0, 100, true, |_| false)), 100);
        assert_eq!(at(p.admit(&cfg, 0, 100, true, |_| false)), 200);
        assert_eq!(at(p.admit(&cfg, 50, 10, true, |_| false)), 210);
        assert_eq!(at(p.admit(&cfg, 1_000, 10, true, |_| false)), 1_010);
        // It found 0, 100, 150 and 0 bytes queued.
        assert_eq!(p.queue.max(), 150);
        assert_eq!((p.packets, p.bytes, p.drops), (4, 220, 0));
    }

    #[test]
    fn a_full_buffer_drops_the_tail() {
        let mut sw = star(250, None);
        let cfg = sw.cfg.clone();
        let p = &mut sw.ports[1];
        assert!(matches!(
            p.admit(&cfg, 0, 100, true, |_| false),
            Admit::Leaves { .. }
        ));
        assert!(matches!(
            p.admit(&cfg, 0, 100, true, |_| false),
            Admit::Leaves { .. }
        ));
        // 200 queued + 100 > 250.
        assert_eq!(p.admit(&cfg, 0, 100, true, |_| false), Admit::Dropped);
        // Once 60 bytes have left, 140 + 100 fits.
        assert!(matches!(
            p.admit(&cfg, 60, 100, true, |_| false),
            Admit::Leaves { .. }
        ));
        assert_eq!((p.packets, p.drops), (3, 1));
    }

    #[test]
    fn red_marks_within_its_thresholds_only() {
        let red = Red {
            kmin: 100,
            kmax: 300,
            pmax: 0.5,
        };
        assert_eq!(red.probability(0), 0.0);
        assert_eq!(red.probability(100), 0.0);
        assert_eq!(red.probability(200), 0.25);
        assert_eq!(red.probability(300), 0.5);
        assert_eq!(red.probability(301), 1.0);
        let mut sw = star(u64::MAX, Some(red));
        let cfg = sw.cfg.clone();
        let p = &mut sw.ports[2];
        let mark = |a| matches!(a, Admit::Leaves { mark: true, .. });
        // Queue 0 and 100: never (the draw is not even asked for).
        assert!(!mark(p.admit(&cfg, 0, 100, true, |_| panic!("no draw"))));
        assert!(!mark(p.admit(&cfg, 0, 100, true, |_| panic!("no draw"))));
        // Queue 200: with the draw at 0.25.
        assert!(mark(p.admit(&cfg, 0, 100, true, |p| p == 0.25)));
        // Queue 300 then 400: the draw, then always.
        assert!(!mark(p.admit(&cfg, 0, 100, true, |_| false)));
        assert!(mark(p.admit(&cfg, 0, 100, true, |_| panic!("no draw"))));
        // Not ECN-capable: never marked, however long the queue.
        assert!(!mark(p.admit(&cfg, 0, 100, false, |_| true)));
        assert_eq!(p.marks, 2);
    }

    #[test]
    fn leaf_spine_routes_up_by_source_port_and_down_to_the_leaf() {
        let cfg = SwitchConfig::default();
        let sw = Switches::new(
            &Topology::LeafSpine {
                leaves: 2,
                spines: 4,
                switch: cfg,
            },
            8,
            100,
            7,
        )
        .expect("switches");
        // Device 3 is on leaf 1, device 5 too: leaf 1 sends straight down.
        assert_eq!(sw.first_hop(3).0, 1);
        assert_eq!(sw.route(1, 3, 5, 0xc001), 5);
        // Device 2 (leaf 0) to device 5: up to a spine the source port picks, always the same
        // for one port, and spread over the spines by many.
        let up = |sport| sw.route(0, 2, 5, sport);
        assert_eq!(up(0xc001), up(0xc001));
        let spines: std::collections::BTreeSet<_> = (0..64).map(|p| up(0xc000 + p)).collect();
        assert_eq!(spines.len(), 4);
        for &port in &spines {
            let PortTo::Switch(spine) = sw.ports[port].to else {
                panic!("an uplink")
            };
            assert!((2..6).contains(&spine));
            // The spine sends it down to leaf 1.
            let down = sw.route(spine, 2, 5, 0);
            assert_eq!(sw.ports[down].to, PortTo::Switch(1));
            assert_eq!(sw.ports[down].switch, spine);
        }
    }
}
