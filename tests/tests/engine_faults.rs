//! uccl-engine under a faulty fabric: many connections between three engines, several paths
//! each, messages from 0 B to 8 MiB, two-sided and one-sided mixed, UC and RC, with per-packet
//! loss, reordering, duplication and corruption up to 10%. Every message arrives exactly once,
//! in order, byte-exact and nowhere else; every pool, credit and CQ reservation comes back;
//! and a tiny SRQ shared by many connections still converges.

use std::time::{Duration, Instant};

use softnic::Faults;
use uccl_engine::{EngineConfig, Mode};
use uccl_integration::Sim;
use uccl_integration::workload::{self, Kind, Link, Op, Pacing};

/// The engines' configuration: `qps` paths per connection, and enough retransmissions and
/// patience that 10% of every fault together never exhausts them (that would be a correct
/// failure: on UC a duplicated or reordered packet costs its whole message, so a 5-packet
/// retransmission of a 16 KiB chunk gets through only about one time in eight).
fn cfg(mode: Mode, qps: u16) -> EngineConfig {
    let mut c = EngineConfig {
        mode,
        qps_per_conn: qps,
        max_conns: 16,
        ..EngineConfig::default()
    };
    c.tx.max_retransmits = 1000;
    c.tx.max_silence_us = 60_000_000;
    c
}

/// Every fault at rate `p` (reordered packets held back up to 20 us).
fn all_faults(p: f64) -> Faults {
    Faults {
        link_down: false,
        loss: p,
        corrupt: p,
        duplicate: p,
        reorder: p,
        reorder_delay_ns: 20_000,
    }
}

/// The sizes around a chunk of `chunk` bytes, and a few more.
fn sizes(chunk: usize) -> Vec<usize> {
    vec![
        0,
        1,
        100,
        chunk - 1,
        chunk,
        chunk + 1,
        3 * chunk + 7,
        64 * 1024,
        200 * 1000,
    ]
}

/// A mixed workload over `links`: every size in both directions of every link, alternating
/// two-sided and one-sided, some with slack; plus `big` messages of 8 MiB (one per link
/// among the first `big`, alternating kinds).
fn mixed(links: &[Link], chunk: usize, big: usize) -> Vec<Op> {
    let mut ops = Vec::new();
    let sizes = sizes(chunk);
    for (i, len) in sizes.iter().enumerate() {
        for link in 0..links.len() {
            for reverse in [false, true] {
                let k = i + link + usize::from(reverse);
                ops.push(Op {
                    link,
                    reverse,
                    kind: if k % 2 == 0 { Kind::Send } else { Kind::Write },
                    len: *len,
                    slack: [0, 1, 4096 + 3][k % 3],
                });
            }
        }
    }
    for b in 0..big {
        ops.insert(
            ops.len() / 2,
            Op {
                link: b % links.len(),
                reverse: b % 2 == 1,
                kind: if b % 2 == 0 { Kind::Send } else { Kind::Write },
                len: 8 << 20,
                slack: 5,
            },
        );
    }
    ops
}

/// Three engines, `per_pair` connections between each pair, the mixed workload under
/// `faults`; then drain, close everything, and check the engines are back to their baseline.
fn many(seed: u64, mode: Mode, qps: u16, per_pair: usize, faults: Faults, big: usize) {
    let t = Instant::now();
    let cfg = cfg(mode, qps);
    let chunk = cfg.tx.chunk_size as usize;
    let mut sim = Sim::new(seed, 3, faults, &cfg);
    let links = sim.connect_all(per_pair).unwrap();
    let ops = mixed(&links, chunk, big);
    let report = workload::run(&mut sim, &links, &ops, Pacing::default()).unwrap();
    workload::drain(&mut sim, Duration::from_secs(10)).unwrap();
    // The faults were really there.
    if faults.loss > 0.0 {
        let c = sim.fabric.device_counters("soft0").unwrap();
        assert!(
            c.packets_dropped > 0 && c.packets_received > 0,
            "seed {seed}: {c:?}"
        );
    }
    workload::close_all(&mut sim, &links, Duration::from_secs(10)).unwrap();
    let s = &report.stats;
    eprintln!(
        "seed {seed} {mode:?} qps {qps}: {} ops in {:?} virtual, {} rounds, {:?} wall; \
         sender completions out of order {}, retransmits {:?}, duplicates dropped {:?}",
        ops.len(),
        report.virtual_time,
        report.rounds,
        t.elapsed(),
        report.sender_out_of_order,
        s.iter().map(|s| s.retransmits()).collect::<Vec<_>>(),
        s.iter().map(|s| s.dropped_duplicate).collect::<Vec<_>>(),
    );
}

#[test]
fn uc_one_path_many_connections_under_loss() {
    many(11, Mode::Uc, 1, 2, Faults::loss(0.05), 1);
}

#[test]
fn uc_four_paths_every_fault_at_ten_percent() {
    many(12, Mode::Uc, 4, 2, all_faults(0.1), 2);
}

#[test]
fn uc_three_paths_every_fault_at_three_percent() {
    many(13, Mode::Uc, 3, 3, all_faults(0.03), 1);
}

#[test]
fn rc_two_paths_every_fault_at_ten_percent() {
    many(14, Mode::Rc, 2, 2, all_faults(0.1), 2);
}

#[test]
fn rc_one_path_under_loss_and_reordering() {
    let f = Faults {
        reorder: 0.1,
        reorder_delay_ns: 50_000,
        ..Faults::loss(0.05)
    };
    many(15, Mode::Rc, 1, 2, f, 1);
}

#[test]
fn no_faults_four_paths_both_modes() {
    many(16, Mode::Uc, 4, 2, Faults::NONE, 1);
    many(16, Mode::Rc, 4, 2, Faults::NONE, 1);
}

/// Engine 0 receives from `senders` connections (from engines 1..), each sending `per_conn`
/// messages, with an SRQ of `srq_depth` WQEs refilled every `srq_refill`.
fn tiny_srq(seed: u64, mode: Mode, srq_depth: u32, srq_refill: u32, faults: Faults) {
    let t = Instant::now();
    let cfg = EngineConfig {
        srq_depth,
        srq_refill,
        max_conns: 32,
        ..cfg(mode, 2)
    };
    cfg.validate().unwrap();
    let mut sim = Sim::new(seed, 3, faults, &cfg);
    let senders = 16;
    let links: Vec<Link> = (0..senders)
        .map(|i| sim.connect(1 + i % 2, 0).unwrap())
        .collect();
    let chunk = cfg.tx.chunk_size as usize;
    let mut ops = Vec::new();
    for m in 0..4 {
        for link in 0..senders {
            ops.push(Op {
                link,
                reverse: false,
                kind: if (m + link) % 3 == 2 {
                    Kind::Write
                } else {
                    Kind::Send
                },
                len: [1, chunk + 1, 3 * chunk, 0][m],
                slack: 0,
            });
        }
    }
    let report = workload::run(&mut sim, &links, &ops, Pacing::default()).unwrap();
    workload::drain(&mut sim, Duration::from_secs(10)).unwrap();
    let u = sim.engines[0].usage();
    // On UC the grants never exceed the SRQ (RC needs no receiver credits: an empty SRQ only
    // makes the NIC retry).
    assert!(
        mode == Mode::Rc || u.credits_granted <= srq_depth - srq_refill,
        "seed {seed}: granted {} with an SRQ of {srq_depth}",
        u.credits_granted
    );
    workload::close_all(&mut sim, &links, Duration::from_secs(10)).unwrap();
    let c = sim.fabric.device_counters("soft0").unwrap();
    eprintln!(
        "seed {seed} {mode:?} srq {srq_depth}/{srq_refill}: {:?} virtual, {:?} wall, \
         credit stalls {:?}, UC messages dropped at soft0 {}",
        report.virtual_time,
        t.elapsed(),
        report
            .stats
            .iter()
            .map(|s| s.credit_stalls)
            .collect::<Vec<_>>(),
        c.messages_dropped
    );
    if mode == Mode::Uc && faults.loss == 0.0 {
        // Credits keep every sender within the SRQ: UC never drops a message for want of a
        // receive WQE.
        assert_eq!(c.messages_dropped, 0, "seed {seed}: {c:?}");
    }
}

#[test]
fn uc_tiny_srq_of_8_converges_with_16_connections() {
    tiny_srq(21, Mode::Uc, 8, 4, Faults::NONE);
}

#[test]
fn uc_smallest_srq_converges_with_16_connections() {
    tiny_srq(22, Mode::Uc, 2, 1, Faults::NONE);
}

#[test]
fn uc_tiny_srq_converges_under_loss() {
    tiny_srq(23, Mode::Uc, 8, 4, all_faults(0.05));
}

#[test]
fn rc_tiny_srq_of_8_converges_with_16_connections() {
    tiny_srq(24, Mode::Rc, 8, 4, Faults::NONE);
}

/// Without faults no retransmission timer fires, even with four connections of eight QPs
/// each pushing 1 MiB messages at once through one 100 Gb/s link: their congestion windows
/// keep the link's queue, and with it the RTT, short. (With only the receivers' credits
/// bounding them, queues of hundreds of microseconds made timeouts fire spuriously: 2 in this
/// run with `target_delay_us: 0`.)
#[test]
fn a_lossless_fabric_under_load_sees_no_timeout() {
    let cfg = cfg(Mode::Uc, 8);
    let mut sim = Sim::new(17, 2, Faults::NONE, &cfg);
    let links: Vec<Link> = (0..4).map(|_| sim.connect(0, 1).unwrap()).collect();
    let ops: Vec<Op> = (0..32)
        .map(|i| Op {
            link: i % 4,
            reverse: false,
            kind: Kind::Send,
            len: 1 << 20,
            slack: 0,
        })
        .collect();
    workload::run(&mut sim, &links, &ops, Pacing::default()).unwrap();
    let s = sim.engines[0].stats();
    assert_eq!(s.rto_retransmits, 0, "{s:?}");
    assert!(
        s.window_stalls > 0,
        "the windows did bound the flows: {s:?}"
    );
}
