//! uccl-engine end to end on softnic: two-sided messages of every size, one-sided writes,
//! in-order completion, refusals, closing; UC and RC.

use std::time::Duration;

use softnic::Faults;
use uccl_engine::{ConnId, EngineConfig, EngineError, Mode, connect_pair};
use uccl_integration::{Sim, pattern};

fn cfg(mode: Mode) -> EngineConfig {
    EngineConfig {
        mode,
        qps_per_conn: 2,
        max_conns: 8,
        ..EngineConfig::default()
    }
}

/// Sends each size in turn from engine 0 to engine 1 and checks every byte.
fn sizes(mode: Mode, sizes: &[usize]) {
    let mut sim = Sim::new(1, 2, Faults::NONE, &cfg(mode));
    let [a, b] = &mut sim.engines[..] else {
        unreachable!()
    };
    let (ca, cb) = connect_pair(a, b).unwrap();
    let max = *sizes.iter().max().unwrap();
    let src = a.register(max.max(1)).unwrap();
    let dst = b.register(max.max(1)).unwrap();
    for (i, &len) in sizes.iter().enumerate() {
        let data = pattern(1, 0, i as u64, len);
        src.write_at(0, &data).unwrap();
        let [a, b] = &mut sim.engines[..] else {
            unreachable!()
        };
        let recv = b.recv(cb, &dst, 0, max as u64).unwrap();
        let send = a.send(ca, &src, 0, len as u64).unwrap();
        sim.run(Duration::from_secs(10), |_| {
            recv.test().is_some() && send.test().is_some()
        })
        .unwrap();
        assert_eq!(
            recv.test().unwrap().unwrap().len,
            len as u64,
            "{mode:?} {len}"
        );
        assert_eq!(send.test().unwrap().unwrap().len, len as u64);
        let mut got = vec![0u8; len];
        dst.read_at(0, &mut got).unwrap();
        assert!(got == data, "{mode:?}: {len} bytes differ");
    }
    let u = sim.engines[0].usage();
    assert_eq!((u.wrs_in_use, u.hdrs_in_use, u.unacked), (0, 0, 0), "{u:?}");
}

const SIZES: &[usize] = &[
    0,
    1,
    100,
    16 * 1024 - 1,
    16 * 1024,
    16 * 1024 + 1,
    1 << 20,
    8 << 20,
];

#[test]
fn uc_messages_of_every_size_arrive_byte_exact() {
    sizes(Mode::Uc, SIZES);
}

#[test]
fn rc_messages_of_every_size_arrive_byte_exact() {
    sizes(Mode::Rc, SIZES);
}

#[test]
fn receives_complete_in_order_and_one_sided_writes_land() {
    for mode in [Mode::Uc, Mode::Rc] {
        let mut sim = Sim::new(2, 2, Faults::NONE, &cfg(mode));
        let [a, b] = &mut sim.engines[..] else {
            unreachable!()
        };
        let (ca, cb) = connect_pair(a, b).unwrap();
        let src = a.register(64 * 1024).unwrap();
        let dst = b.register(64 * 1024).unwrap();
        src.write_at(0, &pattern(2, 0, 0, 64 * 1024)).unwrap();
        // Ten receives of 4 KiB, ten sends of 1..10 KiB? No: of 1..=10 hundred bytes.
        let recvs: Vec<_> = (0..10)
            .map(|i| b.recv(cb, &dst, i * 4096, 4096).unwrap())
            .collect();
        let sends: Vec<_> = (0..10)
            .map(|i| a.send(ca, &src, i * 100, (i + 1) * 100).unwrap())
            .collect();
        // A one-sided write into an exported region, between them.
        let target = b.register(8192).unwrap();
        let desc = b.export(&target, 4096, 4096).unwrap();
        let a = &mut sim.engines[0];
        let w = a.write(ca, &src, 1000, 3000, &desc, 1000).unwrap();
        sim.run(Duration::from_secs(10), |_| {
            recvs.iter().chain(&sends).all(|r| r.test().is_some()) && w.test().is_some()
        })
        .unwrap();
        for (i, r) in recvs.iter().enumerate() {
            assert_eq!(r.test().unwrap().unwrap().len, (i as u64 + 1) * 100);
            let mut got = vec![0u8; (i + 1) * 100];
            dst.read_at(i * 4096, &mut got).unwrap();
            let mut want = vec![0u8; 64 * 1024];
            src.read_at(0, &mut want).unwrap();
            assert!(
                got[..] == want[i * 100..i * 100 + (i + 1) * 100],
                "{mode:?} message {i}"
            );
        }
        let mut got = vec![0u8; 3000];
        target.read_at(5096, &mut got).unwrap();
        let mut want = vec![0u8; 3000];
        src.read_at(1000, &mut want).unwrap();
        assert_eq!(got, want, "{mode:?}: the write landed at its offset");
        assert_eq!(sim.engines[1].stats().writes_received, 1);
        // A write past the exported region is refused at once.
        let a = &mut sim.engines[0];
        assert!(matches!(
            a.write(ca, &src, 0, 10, &desc, 4090),
            Err(EngineError::BadRange(_))
        ));
    }
}

#[test]
fn a_message_larger_than_the_receive_buffer_fails_both_ends() {
    let mut sim = Sim::new(3, 2, Faults::NONE, &cfg(Mode::Uc));
    let [a, b] = &mut sim.engines[..] else {
        unreachable!()
    };
    let (ca, cb) = connect_pair(a, b).unwrap();
    let src = a.register(8192).unwrap();
    let dst = b.register(8192).unwrap();
    let recv = b.recv(cb, &dst, 0, 100).unwrap();
    let send = a.send(ca, &src, 0, 101).unwrap();
    // The next pair still matches.
    let recv2 = b.recv(cb, &dst, 0, 8192).unwrap();
    let send2 = a.send(ca, &src, 0, 8000).unwrap();
    sim.run(Duration::from_secs(10), |_| {
        [&recv, &send, &recv2, &send2]
            .iter()
            .all(|r| r.test().is_some())
    })
    .unwrap();
    assert!(matches!(
        send.test().unwrap(),
        Err(EngineError::TooLarge {
            len: 101,
            room: 100
        })
    ));
    assert!(recv.test().unwrap().is_err());
    assert_eq!(recv2.test().unwrap().unwrap().len, 8000);
    assert!(send2.test().unwrap().is_ok());
}

#[test]
fn misuse_is_an_error_not_a_panic() {
    let mut sim = Sim::new(4, 3, Faults::NONE, &cfg(Mode::Uc));
    let [a, b, c] = &mut sim.engines[..] else {
        unreachable!()
    };
    let (ca, _cb) = connect_pair(a, b).unwrap();
    let mine = a.register(100).unwrap();
    let theirs = c.register(100).unwrap();
    assert!(matches!(
        a.send(ca, &mine, 50, 51),
        Err(EngineError::BadRange(_))
    ));
    assert!(matches!(
        a.send(ca, &mine, u64::MAX, 2),
        Err(EngineError::BadRange(_))
    ));
    assert!(matches!(
        a.send(ca, &theirs, 0, 1),
        Err(EngineError::BadRange(_))
    ));
    assert!(matches!(
        a.recv(ca, &mine, 0, 101),
        Err(EngineError::BadRange(_))
    ));
    // A handshake that is garbage, or from an engine of the other mode, is refused.
    let (pending, _) = a.offer().unwrap();
    assert!(matches!(
        a.complete(pending, b"nonsense"),
        Err(EngineError::Handshake { .. })
    ));
    let mut rc = Sim::new(5, 1, Faults::NONE, &cfg(Mode::Rc));
    let (_, rc_hello) = rc.engines[0].offer().unwrap();
    let (pending, _) = a.offer().unwrap();
    let e = a.complete(pending, &rc_hello).unwrap_err();
    assert!(e.to_string().contains("RC"), "{e}");
    // The refused offers released their slots: a connection still fits.
    let (_, cc) = connect_pair(a, c).unwrap();
    // An id of one engine never names a connection of another (even in the same slot).
    let theirs_buf = c.register(100).unwrap();
    assert!(matches!(
        c.send(ca, &theirs_buf, 0, 1),
        Err(EngineError::NoConnection(_))
    ));
    assert!(matches!(a.close(cc), Err(EngineError::NoConnection(_))));
}

#[test]
fn closing_fails_what_is_in_flight_and_tells_the_peer() {
    let mut sim = Sim::new(6, 2, Faults::NONE, &cfg(Mode::Uc));
    let [a, b] = &mut sim.engines[..] else {
        unreachable!()
    };
    let (ca, cb) = connect_pair(a, b).unwrap();
    let dst = b.register(100).unwrap();
    let pending = b.recv(cb, &dst, 0, 100).unwrap();
    a.close(ca).unwrap();
    sim.run(Duration::from_secs(5), |s| {
        pending.test().is_some() && s.engines.iter().all(|e| e.usage().connections == 0)
    })
    .unwrap();
    assert!(matches!(
        pending.test().unwrap(),
        Err(EngineError::ConnectionFailed { .. })
    ));
    assert!(!sim.engines[0].is_open(ca));
    // Freed on both ends: a later call on either says how it ended, not that there is no
    // such connection.
    for (e, c, why) in [(0, ca, "closed by this end"), (1, cb, "the peer closed it")] {
        let buf = sim.engines[e].register(10).unwrap();
        match sim.engines[e].send(c, &buf, 0, 10) {
            Err(EngineError::ConnectionFailed { conn, reason }) => {
                assert_eq!((conn, &*reason), (c, why))
            }
            other => panic!("a send on a closed connection: {other:?}"),
        }
    }
}

/// `close` returns a request that completes once the connection is gone from this end: the
/// peer told, every WR of it flushed and polled, its slot free (`usage` counts nothing of it).
/// A second close shares it; a close whose peer is gone completes when the control QP's retries
/// run out; dropping the engine first fails it with `Stopped`.
#[test]
fn a_close_completes_once_the_connection_is_gone() {
    let (mut sim, ca) = connected(7, Mode::Uc);
    let a = &mut sim.engines[0];
    let src = a.register(1 << 20).unwrap();
    let sending = a.send(ca, &src, 0, 1 << 20).unwrap();
    let closed = a.close(ca).unwrap();
    let again = a.close(ca).unwrap();
    assert!(closed.test().is_none(), "not gone yet");
    sim.run(sim.fabric.now() + Duration::from_secs(5), |_| {
        closed.test().is_some()
    })
    .unwrap();
    assert!(matches!(closed.test(), Some(Ok(()))), "{:?}", closed.test());
    assert!(matches!(again.test(), Some(Ok(()))), "{:?}", again.test());
    assert!(sending.test().is_some_and(|r| r.is_err()));
    let u = sim.engines[0].usage();
    assert_eq!((u.connections, u.draining), (0, 0), "{u:?}");

    // The peer is gone: the close is done when its Close runs out of retries.
    let (mut sim, ca) = connected(8, Mode::Rc);
    let _ = sim.run(sim.fabric.now() + Duration::from_millis(10), |_| false);
    drop(sim.engines.remove(1));
    let closed = sim.engines[0].close(ca).unwrap();
    sim.run(sim.fabric.now() + Duration::from_secs(5), |_| {
        closed.test().is_some()
    })
    .unwrap();
    assert!(matches!(closed.test(), Some(Ok(()))), "{:?}", closed.test());
    assert_eq!(sim.engines[0].usage().draining, 0);

    // The engine goes before the close is done.
    let (mut sim, ca) = connected(9, Mode::Uc);
    let closed = sim.engines[0].close(ca).unwrap();
    drop(sim.engines.remove(0));
    assert!(
        matches!(closed.test(), Some(Err(EngineError::Stopped))),
        "{:?}",
        closed.test()
    );
}

/// Two engines on a lossless fabric, connected: the simulation and engine 0's end.
fn connected(seed: u64, mode: Mode) -> (Sim, ConnId) {
    let mut sim = Sim::new(seed, 2, Faults::NONE, &cfg(mode));
    let [a, b] = &mut sim.engines[..] else {
        unreachable!()
    };
    let (ca, _cb) = connect_pair(a, b).unwrap();
    (sim, ca)
}

/// Sends one 1 MiB message of 4 KiB chunks from engine 0 to engine 1 with `tweak` applied
/// to the configuration; returns the receiver's ACKs, the chunks sent, the sender's
/// retransmissions, and the virtual time it took.
fn one_mib_of_small_chunks(tweak: impl Fn(&mut EngineConfig)) -> (u64, u64, u64, Duration) {
    let mut c = cfg(Mode::Uc);
    c.tx.chunk_size = 4096;
    tweak(&mut c);
    let mut sim = Sim::new(3, 2, Faults::NONE, &c);
    let [a, b] = &mut sim.engines[..] else {
        unreachable!()
    };
    let (ca, cb) = connect_pair(a, b).unwrap();
    let len = 1 << 20;
    let (src, dst) = (a.register(len).unwrap(), b.register(len).unwrap());
    let data = pattern(3, 0, 0, len);
    src.write_at(0, &data).unwrap();
    let recv = b.recv(cb, &dst, 0, len as u64).unwrap();
    let send = a.send(ca, &src, 0, len as u64).unwrap();
    let start = sim.fabric.now();
    sim.run(Duration::from_secs(10), |_| {
        recv.test().is_some() && send.test().is_some()
    })
    .unwrap();
    let mut got = vec![0u8; len];
    dst.read_at(0, &mut got).unwrap();
    assert!(got == data, "the bytes differ");
    let took = sim.fabric.now() - start;
    let sender = sim.engines[0].stats();
    (
        sim.engines[1].stats().acks_sent,
        sender.chunks_sent,
        sender.retransmits(),
        took,
    )
}

#[test]
fn an_ack_covers_several_small_chunks() {
    // Up to 16 chunks or 64 KiB per ACK (16 chunks of 4 KiB), at most 40 us late.
    let (delayed, chunks, _, _) = one_mib_of_small_chunks(|c| {
        c.ack_every = 16;
        c.ack_bytes = 64 * 1024;
        c.ack_delay_us = 40;
    });
    assert_eq!(chunks, 256);
    assert!(
        delayed <= chunks / 16 + 8,
        "{delayed} ACKs for {chunks} chunks"
    );
    // Without a delay, every round that received something ACKs it.
    let (immediate, _, _, _) = one_mib_of_small_chunks(|c| c.ack_delay_us = 0);
    assert!(
        immediate > 2 * delayed,
        "{immediate} ACKs without a delay, {delayed} with one"
    );
}

#[test]
fn a_chunk_waits_for_its_ack_no_longer_than_the_delay() {
    // A window of 12 chunks, fewer than an ACK covers: only the delay timer brings each
    // window's ACK (the message goes on, so nothing is urgent). Without the timer the
    // transfer would stall; with it each window waits about the delay.
    let window = |ack_delay_us| {
        one_mib_of_small_chunks(|c| {
            c.ack_every = 16;
            c.ack_bytes = 1 << 30;
            c.ack_delay_us = ack_delay_us;
            c.tx.flow_window = 12;
        })
    };
    let (_, chunks, retx, short) = window(10);
    let (_, _, retx_long, long) = window(200);
    assert_eq!(chunks, 256);
    // The timer, not a retransmission timeout, brought every ACK.
    assert_eq!((retx, retx_long), (0, 0));
    // 256 / 12 windows: about 21 delays each time.
    assert!(
        long - short >= Duration::from_micros(20 * 150),
        "a 200 us delay took {long:?}, a 10 us one {short:?}"
    );
}

/// An engine's one CQ must hold everything its connections may complete: a configuration
/// that needs more than the device's largest CQ is refused with the field to change, not a
/// verbs error from deep inside (softnic's `max_cqe` is 2^20: 1024 connections of 8 QPs of 128
/// WRs need exactly that for data sends alone, and the SRQ and control need more).
#[test]
fn a_cq_larger_than_the_device_allows_is_a_config_error() {
    use uccl_engine::{Clock, Engine};
    use verbs_safe::{Context, Verbs};
    let fabric = softnic::Fabric::new(softnic::FabricConfig::default());
    let ctx = Context::open_by_name(&Verbs::soft(&fabric), "soft0").unwrap();
    let max_cqe = ctx.query_device().unwrap().max_cqe;
    let base = EngineConfig {
        qps_per_conn: 8,
        sq_depth: 128,
        ..EngineConfig::default()
    };
    let per_conn = u32::from(base.qps_per_conn) * base.sq_depth;
    let fits = EngineConfig {
        max_conns: (max_cqe / 2) / per_conn,
        ..base.clone()
    };
    assert!(Engine::new(&ctx, fits, Clock::Fabric(fabric.clone())).is_ok());
    let too_big = EngineConfig {
        max_conns: max_cqe / per_conn,
        ..base
    };
    match Engine::new(&ctx, too_big, Clock::Fabric(fabric.clone())) {
        Err(EngineError::Config { field, reason, .. }) => {
            assert_eq!(field, "max_conns");
            assert!(reason.contains("max_cqe"), "{reason}");
        }
        Err(e) => panic!("not a config error: {e}"),
        Ok(_) => panic!("an engine whose CQ needs more than max_cqe {max_cqe} was built"),
    }
}

/// What one round has for the peer goes as one SEND on the control QP, up to four messages: six
/// receives posted at once are advertised in two SENDs (four, then two), not six, and the six
/// messages still meet them in order, byte-exact.
#[test]
fn the_advertisements_of_one_round_share_a_send() {
    use softnic::{PacketInfo, Verdict};
    use std::sync::{Arc, Mutex};
    const RC_SEND_ONLY: u8 = 0x04;
    const N: usize = 6;
    const LEN: usize = 4096;
    let cfg = EngineConfig {
        mode: Mode::Rc,
        qps_per_conn: 1,
        recv_keys: uccl_engine::RecvKeys::Buffer,
        ..EngineConfig::default()
    };
    let mut sim = Sim::new(5, 2, Faults::NONE, &cfg);
    let l = sim.connect(0, 1).unwrap();
    let (ca, cb) = (l.ca, l.cb);
    let sends = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&sends);
    sim.fabric
        .set_packet_filter(Some(Box::new(move |p: &PacketInfo| {
            if p.from == 1 && p.to == 0 && p.opcode == RC_SEND_ONLY {
                seen.lock().unwrap().push(p.len);
            }
            Verdict::Pass
        })));
    let src = sim.engines[0].register(N * LEN).unwrap();
    src.write_at(0, &pattern(5, 0, 0, N * LEN)).unwrap();
    let dst = sim.engines[1].register(N * LEN).unwrap();
    let recvs: Vec<_> = (0..N as u64)
        .map(|k| {
            sim.engines[1]
                .recv(cb, &dst, k * LEN as u64, LEN as u64)
                .unwrap()
        })
        .collect();
    sim.engines[1].poll().unwrap();
    let start = sim.fabric.now();
    let sent: Vec<_> = (0..N as u64)
        .map(|k| {
            sim.engines[0]
                .send(ca, &src, k * LEN as u64, LEN as u64)
                .unwrap()
        })
        .collect();
    sim.run(start + Duration::from_secs(1), |_| {
        sent.iter().chain(&recvs).all(|r| r.test().is_some())
    })
    .unwrap();
    for r in sent.iter().chain(&recvs) {
        assert!(matches!(r.test(), Some(Ok(_))), "{:?}", r.test());
    }
    // The first two control SENDs of the receiver are the six advertisements (the second may
    // carry the round's ACK too); the later ones carry its ACKs, one message each.
    let lens = sends.lock().unwrap().clone();
    assert!(lens.len() >= 3, "control SENDs: {lens:?}");
    let one = lens[lens.len() - 1];
    let messages = |l: usize| 1 + (l - one) / 64;
    assert_eq!(messages(lens[0]), 4, "{lens:?}");
    assert!(matches!(messages(lens[1]), 2 | 3), "{lens:?}");
    assert!(lens[2..].iter().all(|&l| l == one), "{lens:?}");
    let mut got = vec![0u8; N * LEN];
    dst.read_at(0, &mut got).unwrap();
    assert!(got == pattern(5, 0, 0, N * LEN), "the bytes differ");
}
