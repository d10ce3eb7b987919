//! uccl-engine's connections come and go: closing in the middle of transfers (under faults)
//! fails what is in flight and gives every WR, header slot, credit and CQ reservation back;
//! connecting and closing over and over leaks nothing, so an engine serves connections for
//! ever, not just its first 65536 paths' worth.

use std::time::{Duration, Instant};

use softnic::Faults;
use uccl_engine::{EngineConfig, EngineError, Mode, Request};
use uccl_integration::Sim;
use uccl_integration::workload::{self, Kind, Op, Pacing};

fn lossy(p: f64) -> Faults {
    Faults {
        link_down: false,
        loss: p,
        corrupt: p,
        duplicate: p,
        reorder: p,
        reorder_delay_ns: 20_000,
    }
}

/// Transfers in both directions of `l` are under way when one end closes: every request
/// completes (most fail), both ends free the connection and return to their baseline, and a
/// new connection between them works.
fn close_mid_transfer(seed: u64, mode: Mode, faults: Faults) {
    let cfg = EngineConfig {
        mode,
        qps_per_conn: 3,
        max_conns: 4,
        ..EngineConfig::default()
    };
    let mut sim = Sim::new(seed, 2, faults, &cfg);
    let l = sim.connect(0, 1).unwrap();
    let big = 4 << 20;
    let mut reqs: Vec<Request> = Vec::new();
    for (s, cs, r, cr) in [(0, l.ca, 1, l.cb), (1, l.cb, 0, l.ca)] {
        let src = sim.engines[s].register(big).unwrap();
        let dst = sim.engines[r].register(2 * big).unwrap();
        let d = sim.engines[r].export(&dst, big as u64, big as u64).unwrap();
        for i in 0..4u64 {
            let len = big as u64 / 4;
            reqs.push(sim.engines[r].recv(cr, &dst, i * len, len).unwrap());
            reqs.push(sim.engines[s].send(cs, &src, i * len, len).unwrap());
            reqs.push(sim.engines[s].write(cs, &src, 0, len, &d, i * len).unwrap());
        }
    }
    sim.run(Duration::from_secs(5), |s| {
        s.engines.iter().all(|e| e.stats().chunks_received > 20)
    })
    .unwrap();
    assert!(
        reqs.iter().any(|q| q.test().is_none()),
        "seed {seed}: all done already"
    );
    sim.engines[(seed % 2) as usize]
        .close(if seed.is_multiple_of(2) { l.ca } else { l.cb })
        .unwrap();
    let r = sim.run(sim.fabric.now() + Duration::from_secs(10), |s| {
        reqs.iter().all(|q| q.test().is_some()) && (0..2).all(|i| workload::back_to_baseline(s, i))
    });
    assert!(
        r.is_ok(),
        "seed {seed}: {}: {} requests pending\n{}",
        r.unwrap_err(),
        reqs.iter().filter(|q| q.test().is_none()).count(),
        workload::usage_table(&sim)
    );
    let failed = reqs.iter().filter(|q| q.test().unwrap().is_err()).count();
    assert!(failed > 0, "seed {seed}: nothing failed");
    let l = sim.connect(0, 1).unwrap();
    let ops: Vec<Op> = (0..8)
        .map(|i| Op {
            link: 0,
            reverse: i % 2 == 0,
            kind: if i % 3 == 0 { Kind::Write } else { Kind::Send },
            len: 1 + i * 50_000,
            slack: i,
        })
        .collect();
    workload::run(&mut sim, &[l], &ops, Pacing::default()).unwrap();
    workload::drain(&mut sim, Duration::from_secs(10)).unwrap();
    workload::close_all(&mut sim, &[l], Duration::from_secs(10)).unwrap();
}

#[test]
fn uc_closing_mid_transfer_returns_everything() {
    close_mid_transfer(61, Mode::Uc, Faults::NONE);
    close_mid_transfer(62, Mode::Uc, lossy(0.05));
}

#[test]
fn rc_closing_mid_transfer_returns_everything() {
    close_mid_transfer(63, Mode::Rc, Faults::NONE);
    close_mid_transfer(64, Mode::Rc, lossy(0.03));
}

/// `cycles` times: connect engines 0 and 1, move a few messages (every `every`-th cycle),
/// close (alternating ends), run until both are back to their baseline.
fn churn(seed: u64, cfg: &EngineConfig, faults: Faults, cycles: usize, every: usize) {
    let t = Instant::now();
    let mut sim = Sim::new(seed, 2, faults, cfg);
    let buf = sim.engines[0].register(1).unwrap();
    let mut stale = None;
    for cycle in 0..cycles {
        let l = sim
            .connect(cycle % 2, 1 - cycle % 2)
            .unwrap_or_else(|e| panic!("cycle {cycle}: {e}"));
        // The previous connection's id names nothing now, though its slot is reused: a call
        // on it says how that connection ended (or, if it was never this engine's, that
        // there is no such connection), never reaching the new one.
        if let Some(old) = stale {
            let e = sim.engines[0].send(old, &buf, 0, 1).unwrap_err();
            assert!(
                matches!(&e, EngineError::NoConnection(c) | EngineError::ConnectionFailed { conn: c, .. } if *c == old),
                "seed {seed} cycle {cycle}: {e}"
            );
        }
        stale = Some(if l.a == 0 { l.ca } else { l.cb });
        let n = if cycle % every == 0 { 3 } else { 0 };
        let ops: Vec<Op> = (0..n)
            .map(|i| Op {
                link: 0,
                reverse: i == 1,
                kind: if (cycle + i) % 3 == 0 {
                    Kind::Write
                } else {
                    Kind::Send
                },
                len: [0, 100, 20_000][i],
                slack: 1,
            })
            .collect();
        if !ops.is_empty() {
            workload::run(&mut sim, &[l], &ops, Pacing::default())
                .unwrap_or_else(|e| panic!("cycle {cycle}: {e}"));
        }
        workload::drain(&mut sim, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("cycle {cycle}: {e}"));
        workload::close_all(&mut sim, &[l], Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("cycle {cycle}: {e}"));
    }
    eprintln!("seed {seed}: {cycles} cycles in {:?}", t.elapsed());
}

#[test]
fn uc_connection_churn_under_faults_leaks_nothing() {
    let cfg = EngineConfig {
        qps_per_conn: 4,
        max_conns: 2,
        ..EngineConfig::default()
    };
    churn(71, &cfg, lossy(0.03), 40, 1);
}

#[test]
fn rc_connection_churn_leaks_nothing() {
    let cfg = EngineConfig {
        mode: Mode::Rc,
        qps_per_conn: 4,
        max_conns: 2,
        ..EngineConfig::default()
    };
    churn(72, &cfg, Faults::NONE, 40, 1);
}

/// The transmit side numbers paths with 16 bits: connections of 256 paths each exhaust them
/// after 256 connections unless a closed connection's paths are reused.
#[test]
fn paths_of_closed_connections_are_reused() {
    let cfg = EngineConfig {
        qps_per_conn: 256,
        max_conns: 1,
        sq_depth: 2,
        ..EngineConfig::default()
    };
    churn(73, &cfg, Faults::NONE, 260, 16);
}

/// ACKs name a flow by its connection's index, and a new connection reuses the index of one
/// closed before: an ACK of the old connection still on the wire when the new one starts
/// must not acknowledge the new one's chunks. Here the receiver's ACKs of a first connection
/// are held back on the wire for 2 ms; the connection closes and a second one opens at once on
/// the same indices, whose first chunk is lost. The old ACKs arrive while only the sender
/// runs: taken as the new flow's, they would acknowledge that lost chunk, and it would never
/// be sent again.
#[test]
fn an_ack_of_a_closed_connection_does_not_acknowledge_the_next_one() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU8, Ordering};

    use softnic::{PacketInfo, Verdict};
    use uccl_engine::connect_pair;

    const UD_SEND_ONLY: u8 = 0x64;
    const PASS: u8 = 0;
    const HOLD_ACKS: u8 = 1;
    const DROP_DATA: u8 = 2;
    let cfg = EngineConfig {
        mode: Mode::Uc,
        qps_per_conn: 1,
        ..EngineConfig::default()
    };
    let chunk = cfg.tx.chunk_size as usize;
    let mut sim = Sim::new(71, 2, Faults::NONE, &cfg);
    let phase = Arc::new(AtomicU8::new(PASS));
    let dropped = Arc::new(AtomicU8::new(0));
    let (ph, dr) = (Arc::clone(&phase), Arc::clone(&dropped));
    sim.fabric
        .set_packet_filter(Some(Box::new(move |p: &PacketInfo| {
            let acks = p.from == 1 && p.to == 0 && p.opcode == UD_SEND_ONLY;
            let data = p.from == 0 && p.to == 1 && p.opcode & 0xe0 == 0x20; // UC
            match ph.load(Ordering::Relaxed) {
                HOLD_ACKS if acks => Verdict::Delay(2_000_000),
                // The new connection's first chunk (its packets) is lost.
                DROP_DATA if data && dr.fetch_add(1, Ordering::Relaxed) < 4 => Verdict::Drop,
                _ => Verdict::Pass,
            }
        })));
    let [a, b] = &mut sim.engines[..] else {
        unreachable!()
    };
    let (ca, cb) = connect_pair(a, b).unwrap();
    let src = sim.engines[0].register(16 * chunk).unwrap();
    let dst = sim.engines[1].register(16 * chunk).unwrap();
    let data = uccl_integration::pattern(71, 0, 0, 16 * chunk);
    src.write_at(0, &data).unwrap();
    // The first connection: a 4-chunk message arrives; its ACKs are held back (not the
    // advertisement of its receive buffer, which goes over the UD QP too: it goes first).
    let r = sim.engines[1].recv(cb, &dst, 0, 4 * chunk as u64).unwrap();
    let advertised = sim.fabric.now() + Duration::from_micros(20);
    sim.run(advertised + Duration::from_secs(1), |s| {
        s.fabric.now() >= advertised
    })
    .unwrap();
    phase.store(HOLD_ACKS, Ordering::Relaxed);
    let _s = sim.engines[0].send(ca, &src, 0, 4 * chunk as u64).unwrap();
    let start = sim.fabric.now();
    sim.run(start + Duration::from_secs(1), |_| r.test().is_some())
        .unwrap();
    assert_eq!(
        sim.engines[0].stats().cts_asks,
        0,
        "the advertisement was held back with the ACKs"
    );
    sim.engines[0].close(ca).unwrap();
    sim.run(start + Duration::from_secs(1), |s| {
        (0..2).all(|i| workload::back_to_baseline(s, i))
    })
    .unwrap();
    let teardown = sim.fabric.now() - start;
    assert!(
        teardown < Duration::from_millis(1),
        "the old ACKs are still held: {teardown:?}"
    );
    // The second connection, on the same indices: a 16-chunk message, its first chunk lost.
    phase.store(DROP_DATA, Ordering::Relaxed);
    let [a, b] = &mut sim.engines[..] else {
        unreachable!()
    };
    let (ca, cb) = connect_pair(a, b).unwrap();
    let r = sim.engines[1].recv(cb, &dst, 0, 16 * chunk as u64).unwrap();
    sim.engines[1].poll().unwrap(); // its buffer is advertised
    let s = sim.engines[0].send(ca, &src, 0, 16 * chunk as u64).unwrap();
    // Only the sender runs until the old ACKs have landed.
    while sim.fabric.now() < start + Duration::from_millis(3) {
        sim.engines[0].poll().unwrap();
        sim.advance_to_next(Some(Duration::from_micros(10)));
    }
    sim.run(sim.fabric.now() + Duration::from_secs(2), |_| {
        r.test().is_some() && s.test().is_some()
    })
    .unwrap();
    assert!(matches!(r.test(), Some(Ok(_))), "{:?}", r.test());
    let mut got = vec![0u8; 16 * chunk];
    dst.read_at(0, &mut got).unwrap();
    assert!(got == data, "the bytes differ");
    assert!(sim.engines[0].stats().stale_acks > 0, "no old ACK arrived");
}
