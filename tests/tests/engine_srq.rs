//! The shared receive queue: refilled in one chained post once enough buffers are owed, and
//! at once when the device says it fell below its limit (`IBV_EVENT_SRQ_LIMIT_REACHED`).

use std::time::Duration;

use softnic::Faults;
use uccl_engine::{EngineConfig, Mode, connect_pair};
use uccl_integration::{Sim, pattern};

/// Runs engine `i` alone (the fabric moving on) for `rounds` rounds.
fn run_only(sim: &mut Sim, i: usize, rounds: usize) {
    for _ in 0..rounds {
        sim.engines[i].poll().unwrap();
        sim.advance_to_next(None);
    }
}

#[test]
fn a_receiver_that_falls_behind_is_refilled_on_the_srq_limit_event() {
    // 64 WQEs, refilled 8 at a time: senders may use 56, the limit is 28. No congestion
    // window: the receiver's grant alone bounds the sender.
    let mut cfg = EngineConfig {
        mode: Mode::Uc,
        qps_per_conn: 1,
        srq_depth: 64,
        srq_refill: 8,
        ..EngineConfig::default()
    };
    cfg.tx.target_delay_us = 0;
    let mut sim = Sim::new(21, 2, Faults::NONE, &cfg);
    let [a, b] = &mut sim.engines[..] else {
        unreachable!()
    };
    let (ca, cb) = connect_pair(a, b).unwrap();
    let len = 200 * cfg.tx.chunk_size as usize;
    let src = a.register(len).unwrap();
    let dst = b.register(len).unwrap();
    let data = pattern(21, 0, 0, len);
    src.write_at(0, &data).unwrap();
    let recv = b.recv(cb, &dst, 0, len as u64).unwrap();
    run_only(&mut sim, 1, 10);
    let a = &mut sim.engines[0];
    let send = a.send(ca, &src, 0, len as u64).unwrap();
    // The receiver stops polling: the sender uses its whole grant, and the SRQ falls below
    // its limit (but never runs dry: grants keep it above zero).
    run_only(&mut sim, 0, 400);
    assert_eq!(
        sim.engines[0].usage().unacked,
        56,
        "the sender used its grant, no more"
    );
    sim.run(Duration::from_secs(30), |_| {
        recv.test().is_some() && send.test().is_some()
    })
    .unwrap();
    assert_eq!(recv.test().unwrap().unwrap().len, len as u64);
    send.test().unwrap().unwrap();
    let mut got = vec![0u8; len];
    dst.read_at(0, &mut got).unwrap();
    assert!(got == data, "the bytes arrived intact");
    let s = sim.engines[1].stats();
    assert!(
        s.srq_limit_events >= 1,
        "the limit fired and was handled: {s:?}"
    );
    assert_eq!(
        s.chunks_received, 200,
        "no chunk was dropped for want of a WQE: {s:?}"
    );
    assert_eq!(sim.engines[0].stats().rto_retransmits, 0);
}
