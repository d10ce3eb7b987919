//! A property test of uccl-engine on softnic's switches: any seed, one switch or a leaf-spine
//! fabric, small or unlimited buffers (drop-tail; on RC at least 64 KiB, see `fabric_of`),
//! ECN marking on or off, the congestion
//! window on or off (pacing too), UC or RC, 1 to 4 paths, light faults on top, and a mix of
//! sends, writes and reads between 2 to 5 engines. Every message still arrives exactly once,
//! in order and byte-exact, and the engines give everything back once drained and closed:
//! whatever the switches drop, queue or mark, delivery holds.
//!
//! 12 cases by default; `PROPTEST_CASES=1000` for a soak.

use std::time::Duration;

use proptest::prelude::*;
use softnic::{Faults, Red, SwitchConfig, Topology};
use uccl_engine::{EngineConfig, Mode};
use uccl_integration::Sim;
use uccl_integration::workload::{self, Kind, Op};

fn switch() -> impl Strategy<Value = SwitchConfig> {
    (
        prop_oneof![
            Just(u64::MAX),
            Just(1 << 20),
            Just(64 * 1024),
            Just(16 * 1024)
        ],
        any::<bool>(),
        prop_oneof![Just(0u64), Just(25)],
        prop_oneof![Just(100u64), Just(1_000)],
    )
        .prop_map(|(buffer_bytes, ecn, gbps, latency_ns)| SwitchConfig {
            buffer_bytes,
            ecn: ecn.then_some(Red {
                kmin: 8 * 1024,
                kmax: 32 * 1024,
                pmax: 0.3,
            }),
            gbps,
            latency_ns,
        })
}

fn topology() -> impl Strategy<Value = Topology> {
    prop_oneof![
        switch().prop_map(Topology::Star),
        (1usize..=3, 1usize..=4, switch()).prop_map(|(leaves, spines, switch)| {
            Topology::LeafSpine {
                leaves,
                spines,
                switch,
            }
        }),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    seed: u64,
    mode: Mode,
    qps: u16,
    engines: usize,
    topology: Topology,
    /// The congestion window's target delay (0: none), whether it paces, and its floor.
    cc: (u64, bool, u32),
    loss: f64,
    /// (link, reverse, kind 0..4, bytes)
    msgs: Vec<(usize, bool, u8, usize)>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        any::<u64>(),
        prop_oneof![Just(Mode::Uc), Just(Mode::Rc)],
        1u16..=4,
        2usize..=5,
        topology(),
        (
            prop_oneof![Just(0u64), Just(2), Just(20)],
            any::<bool>(),
            prop_oneof![Just(16u32), Just(1024)],
        ),
        prop_oneof![Just(0.0), Just(0.01)],
        prop::collection::vec(
            (any::<usize>(), any::<bool>(), 0u8..4, 0usize..200_000),
            1..16,
        ),
    )
        .prop_map(
            |(seed, mode, qps, engines, topology, cc, loss, msgs)| Case {
                seed,
                mode,
                qps,
                engines,
                topology,
                cc,
                loss,
                msgs,
            },
        )
}

/// The case's topology; on RC, switch buffers of at least 64 KiB. An RC NIC gives up after 7
/// retries in a row without progress (IBTA's retry count; rxe's too), which synchronised
/// go-back-N bursts of a 3:1 incast into a 16 KiB (4-packet) buffer can exhaust (a soak
/// found it, seed 6983842654911886307): the QP then fails, as it would on such a fabric,
/// which RoCE deployments avoid with deeper buffers or PFC. UC, whose retransmission is the
/// engine's own, keeps every buffer size.
fn fabric_of(c: &Case) -> Topology {
    let deepen = |s: &SwitchConfig| SwitchConfig {
        buffer_bytes: s.buffer_bytes.max(64 * 1024),
        ..s.clone()
    };
    match (&c.topology, c.mode) {
        (Topology::Star(s), Mode::Rc) => Topology::Star(deepen(s)),
        (
            Topology::LeafSpine {
                leaves,
                spines,
                switch,
            },
            Mode::Rc,
        ) => Topology::LeafSpine {
            leaves: *leaves,
            spines: *spines,
            switch: deepen(switch),
        },
        (t, _) => t.clone(),
    }
}

fn check(c: &Case) -> Result<(), String> {
    let mut cfg = EngineConfig {
        mode: c.mode,
        qps_per_conn: c.qps,
        max_conns: 16,
        ..EngineConfig::default()
    };
    cfg.tx.chunk_size = 4096;
    cfg.tx.target_delay_us = c.cc.0;
    cfg.tx.pacing = c.cc.1;
    cfg.tx.min_window = c.cc.2;
    cfg.tx.flow_scaling_us = c.cc.0;
    // Drops at a small buffer are losses like any other: retransmissions must not run out.
    cfg.tx.max_retransmits = 1000;
    cfg.tx.max_silence_us = 60_000_000;
    let faults = Faults {
        loss: c.loss,
        ..Faults::NONE
    };
    let mut sim = Sim::with_topology(c.seed, c.engines, faults, &cfg, fabric_of(c));
    // Engine 0 is everyone's peer (an incast when they all send to it), and the others pair
    // up too when there are several.
    let mut links = Vec::new();
    for i in 1..c.engines {
        links.push(sim.connect(i, 0)?);
        if i + 1 < c.engines {
            links.push(sim.connect(i, i + 1)?);
        }
    }
    let ops: Vec<Op> = c
        .msgs
        .iter()
        .map(|&(link, reverse, kind, len)| Op {
            link: link % links.len(),
            reverse,
            kind: [Kind::Send, Kind::Write, Kind::WriteV, Kind::Read][usize::from(kind)],
            len,
            slack: 3,
        })
        .collect();
    workload::run_and_drain(&mut sim, &links, &ops, 6)?;
    workload::close_all(&mut sim, &links, Duration::from_secs(60))
}

proptest! {
    #![proptest_config(uccl_integration::proptest_config(12, 32))]

    #[test]
    fn every_message_arrives_once_through_any_switches(c in case()) {
        let r = check(&c);
        prop_assert!(r.is_ok(), "seed {} on {:?}: {}", c.seed, c.topology, r.unwrap_err());
    }
}
