//! The options of incast and permutation runs on softnic's switches, and of the congestion
//! window (see `softnic::topology` and `uccl_tx`'s congestion control).

use crate::args::size;

/// softnic's fabric and the engines' congestion control.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Switches and congestion control (softnic)")]
pub(crate) struct FabricArgs {
    /// Incast: N sending engines (soft1..softN, each with --flows flows) into one receiving
    /// engine (soft0). 0: pairs of engines (--engines), flow f from pair f % engines.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub(crate) senders: u16,
    /// Where the devices meet: no switch (each port straight to its receiver), one switch, or
    /// a leaf-spine fabric (--leaves, --spines; device i on leaf i % leaves, ECMP on the UDP
    /// source port).
    #[arg(long, value_enum, default_value = "direct")]
    pub(crate) topology: TopologyArg,
    /// Leaf switches of --topology leaf-spine.
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub(crate) leaves: usize,
    /// Spine switches of --topology leaf-spine.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub(crate) spines: usize,
    /// Bytes each switch egress port may queue (drop-tail); default: no limit.
    #[arg(long, value_parser = size, value_name = "SIZE")]
    pub(crate) switch_buffer: Option<u64>,
    /// RED ECN marking at the switches: Kmin 100 KB, Kmax 400 KB, Pmax 0.2 (HPCC's 100 Gb/s
    /// settings); marked packets are answered with CNPs.
    #[arg(long)]
    pub(crate) ecn: bool,
    /// The congestion window's target queueing delay in microseconds (TxConfig's
    /// target_delay_us; the engine's default 50); 0: no congestion window.
    #[arg(long, value_name = "US")]
    pub(crate) target_delay_us: Option<u64>,
    /// Swift's flow-scaling range in microseconds (TxConfig's flow_scaling_us; default 0).
    #[arg(long, value_name = "US")]
    pub(crate) flow_scaling_us: Option<u64>,
    /// The fabric's RTT without queues in nanoseconds (TxConfig's base_rtt_ns; default 0:
    /// learnt).
    #[arg(long, value_name = "NS")]
    pub(crate) base_rtt_ns: Option<u64>,
    /// Swift's per-hop term of the target in nanoseconds, times the switches on the path
    /// (TxConfig's hop_delay_ns; default 0).
    #[arg(long, value_name = "NS")]
    pub(crate) hop_delay_ns: Option<u64>,
    /// Swift's additive increase in chunks per RTT (TxConfig's additive_increase; default 1).
    #[arg(long, value_name = "CHUNKS")]
    pub(crate) additive_increase: Option<f64>,
    /// The smallest congestion window in chunks (TxConfig's min_window; default 1): below one
    /// chunk a flow is paced.
    #[arg(long, value_name = "CHUNKS")]
    pub(crate) min_window: Option<f64>,
    /// The receiving engine's delayed ACK in microseconds (EngineConfig's ack_delay_us;
    /// default 40): a window covers the fabric's RTT and this.
    #[arg(long, value_name = "US")]
    pub(crate) ack_delay_us: Option<u32>,
    /// The window shrinks at the first RTT sample over its target (Swift's rule), not only
    /// once they stay over it for a smoothed RTT (TxConfig's persistent_delay, the default).
    #[arg(long)]
    pub(crate) swift_decrease: bool,
    /// A window below one chunk counts as one chunk in flight instead of pacing (the
    /// negative control of congestion control).
    #[arg(long)]
    pub(crate) no_pacing: bool,
    /// A timeout resends at once instead of asking the peer for an ACK first (TxConfig's
    /// ack_requests, on by default in the engine: a late ACK then looks like a loss; the
    /// negative control of the requests).
    #[arg(long)]
    pub(crate) no_ack_requests: bool,
    /// Virtual time before the steady-state measurement starts (switch, RTT and fairness
    /// statistics), in microseconds.
    #[arg(long, default_value_t = 100, value_name = "US")]
    pub(crate) warmup_us: u64,
}

/// `--topology`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum TopologyArg {
    Direct,
    Star,
    LeafSpine,
}

impl FabricArgs {
    /// The switches' configuration.
    pub(crate) fn topology(&self) -> softnic::Topology {
        let switch = softnic::SwitchConfig {
            buffer_bytes: self.switch_buffer.unwrap_or(u64::MAX),
            ecn: self.ecn.then_some(softnic::Red {
                kmin: 100_000,
                kmax: 400_000,
                pmax: 0.2,
            }),
            ..Default::default()
        };
        match self.topology {
            TopologyArg::Direct => softnic::Topology::Direct,
            TopologyArg::Star => softnic::Topology::Star(switch),
            TopologyArg::LeafSpine => softnic::Topology::LeafSpine {
                leaves: self.leaves,
                spines: self.spines,
                switch,
            },
        }
    }

    /// Refuses congestion-window values the engine cannot take, naming the option: the window
    /// is kept in 1/1024 chunks, and never below 1/1024 or, for the floor, above one chunk.
    pub(crate) fn check(&self) -> Result<(), String> {
        let chunks = [
            ("--additive-increase", self.additive_increase, f64::MAX),
            ("--min-window", self.min_window, 1.0),
        ];
        for (flag, value, most) in chunks {
            if let Some(v) = value
                && !(1.0 / 1024.0..=most).contains(&v)
            {
                let to = if most == 1.0 { " to 1" } else { "" };
                return Err(format!(
                    "{flag} {v}: must be a number of chunks from 1/1024 (0.0009765625){to}"
                ));
            }
        }
        Ok(())
    }

    /// Switches on the longest path: one on a star, three between two leaves (a flow within a
    /// leaf crosses one: its target is then a little generous).
    pub(crate) fn hops(&self) -> u8 {
        match self.topology {
            TopologyArg::Direct => 0,
            TopologyArg::Star => 1,
            TopologyArg::LeafSpine => 3,
        }
    }

    /// Sets the congestion window's parameters.
    pub(crate) fn apply(&self, cfg: &mut uccl_engine::EngineConfig) {
        if let Some(d) = self.ack_delay_us {
            cfg.ack_delay_us = d;
        }
        // Only what was given: the engine's defaults stand otherwise.
        let tx = &mut cfg.tx;
        let set = |field: &mut u64, value: Option<u64>| *field = value.unwrap_or(*field);
        set(&mut tx.target_delay_us, self.target_delay_us);
        set(&mut tx.flow_scaling_us, self.flow_scaling_us);
        set(&mut tx.hop_delay_ns, self.hop_delay_ns);
        set(&mut tx.base_rtt_ns, self.base_rtt_ns);
        if let Some(m) = self.min_window {
            tx.min_window = (m * 1024.0).round().clamp(1.0, 1024.0) as u32;
        }
        if let Some(ai) = self.additive_increase {
            tx.additive_increase = (ai * 1024.0).round().clamp(1.0, 1e9) as u32;
        }
        tx.hops = self.hops();
        tx.pacing &= !self.no_pacing;
        tx.ack_requests &= !self.no_ack_requests;
        tx.persistent_delay &= !self.swift_decrease;
    }

    /// Whether the run measures congestion (switches or an incast).
    pub(crate) fn measured(&self) -> bool {
        self.senders > 0
            || self.topology != TopologyArg::Direct
            || self.switch_buffer.is_some()
            || self.ecn
    }
}
