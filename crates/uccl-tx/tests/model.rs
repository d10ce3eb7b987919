//! Property tests: a flow driven through a model network with random loss of WRs, random ACK
//! delays (so reordering), duplication and loss, over one to three QPs of different latencies.
//!
//! Asserted: every message completes exactly once; the receiver never sees a chunk beyond the
//! SACK bitmap; a retransmission goes where the original went, as a SEND of
//! `[header, payload]`; every WR extension and header slot returns to its pool; no QP's send
//! queue is ever over-filled; no chain mixes QPs; fast retransmissions never exceed the WRs the
//! network really dropped (reordering across QPs never triggers one); with a clean network
//! there is no retransmission at all.

mod common;

use common::*;
use proptest::prelude::*;
use uccl_tx::TxConfig;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64)
}

#[derive(Debug, Clone)]
struct Scenario {
    seed: u64,
    paths: Vec<(u32, u64)>,
    loss: f64,
    ack_loss: f64,
    ack_dup: f64,
    ack_delay_max: u64,
    sizes: Vec<u64>,
    chunk: u32,
    window: u16,
    signal_every: u32,
    max_chain: u32,
    wr_pool: usize,
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        any::<u64>(),
        proptest::collection::vec((1u32..48, 1_000u64..60_000), 1..4),
        prop_oneof![Just(0.0), 0.0..0.2f64],
        prop_oneof![Just(0.0), 0.0..0.2f64],
        0.0..0.2f64,
        1u64..40_000,
        proptest::collection::vec(
            prop_oneof![Just(0u64), 1u64..20_000, 20_000u64..120_000],
            1..30,
        ),
        prop_oneof![Just(1000u32), 1u32..5000],
        1u16..=256,
        1u32..10,
        1u32..20,
        prop_oneof![Just(4096usize), 8usize..64],
    )
        .prop_map(
            |(
                seed,
                paths,
                loss,
                ack_loss,
                ack_dup,
                ack_delay_max,
                sizes,
                chunk,
                window,
                signal_every,
                max_chain,
                wr_pool,
            )| {
                Scenario {
                    seed,
                    paths,
                    loss,
                    ack_loss,
                    ack_dup,
                    ack_delay_max,
                    sizes,
                    chunk,
                    window,
                    signal_every,
                    max_chain,
                    wr_pool,
                }
            },
        )
}

fn run(s: &Scenario) -> Sim {
    let net = NetConfig {
        seed: s.seed,
        paths: s.paths.clone(),
        loss: s.loss,
        ack_loss: s.ack_loss,
        ack_dup: s.ack_dup,
        ack_delay_max: s.ack_delay_max,
        hdr_slots: 64,
    };
    let txc = TxConfig {
        chunk_size: s.chunk,
        flow_window: s.window,
        signal_every: s.signal_every,
        max_chain: s.max_chain,
        wr_pool: s.wr_pool,
        max_retransmits: 1000,
        max_silence_us: 60_000_000,
        seed: s.seed,
        ..TxConfig::default()
    };
    let mut sim = Sim::new(net, txc);
    let mut remote = 0x4000_0000u64;
    for &len in &s.sizes {
        sim.send(len, remote);
        remote += len + 64;
    }
    let finished = sim.run(2_000_000);
    assert!(
        finished,
        "did not finish: {s:?}\nstats {:?} unacked {}",
        sim.tx.stats(),
        sim.tx.unacked()
    );
    sim
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn every_message_completes_exactly_once_and_nothing_leaks(s in scenario()) {
        let sim = run(&s);
        prop_assert!(sim.failed.is_empty(), "{:?}", sim.failed);
        prop_assert_eq!(sim.done.len(), s.sizes.len());
        prop_assert!(sim.done.values().all(|&n| n == 1), "a message completed twice: {:?}", sim.done);
        prop_assert_eq!(sim.tx.wrs_in_use(), 0, "WR extensions leaked");
        prop_assert_eq!(sim.tx.hdrs_in_use(), 0, "header slots leaked");
        prop_assert!(sim.max_chain_seen <= s.max_chain);
        let st = sim.tx.stats();
        prop_assert!(st.fast_retransmits <= sim.dropped_wrs,
            "{} fast retransmits but only {} WRs were dropped", st.fast_retransmits, sim.dropped_wrs);
        prop_assert_eq!(st.bad_acks, 0);
        if s.loss == 0.0 && s.ack_loss == 0.0 {
            prop_assert_eq!(st.fast_retransmits, 0);
        }
    }
}

#[test]
fn a_clean_network_needs_no_retransmission_even_across_uneven_paths() {
    // Three QPs whose latencies differ by 50x: chunks overtake each other across QPs all
    // the time, and none of it may look like loss.
    let s = Scenario {
        seed: 1,
        paths: vec![(32, 1_000), (32, 50_000), (32, 7_000)],
        loss: 0.0,
        ack_loss: 0.0,
        ack_dup: 0.0,
        ack_delay_max: 100,
        sizes: vec![100_000; 20],
        chunk: 1000,
        window: 256,
        signal_every: 4,
        max_chain: 8,
        wr_pool: 4096,
    };
    let sim = run(&s);
    let st = sim.tx.stats();
    assert_eq!((st.fast_retransmits, st.rto_retransmits), (0, 0), "{st:?}");
    assert_eq!(sim.rx.duplicates, 0);
    assert_eq!(st.chunks, 2000);
    // 2000 chunks wrap the 2048-value CSN space.
    assert!(st.chains < st.wrs, "chains carry several WRs: {st:?}");
}
