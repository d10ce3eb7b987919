//! A hostile peer contained: a peer that completes a normal handshake, then floods the victim
//! engine through its own raw verbs with WRITE_WITH_IMMs (zero bytes each: no key is checked,
//! every one takes a buffer of the victim's shared receive queue), either new chunk numbers
//! past its grant (and each twice) or one chunk number again and again. Each flood runs for
//! 20 us of virtual time while the victim's engine looks away, its NIC alone answering (an
//! attacker faster than the engine: in the simulation the engine's rounds take no virtual
//! time), then the engine looks. The victim's 8 honest connections keep >= 0.9 of the goodput
//! they have alone (both on the virtual clock, same seed), no honest request fails, and the
//! hostile connection fails, naming its credit. UC and RC. Without the enforcement (credits
//! only counted, as before) the hostile connection lives on, UC's honest messages fail with
//! TooManyRetransmits (their chunks find the SRQ empty) and RC's honest goodput falls to 0.78
//! (receiver-not-ready backoff).
//!
//! And the UD QP every peer's ACKs share, flooded by a connected peer (see the last test), and
//! a peer that names another's UD QP.

use std::collections::VecDeque;
use std::time::Duration;

use uccl_engine::{ConnId, EngineConfig, EngineError, Mode, Request};
use uccl_integration::pattern;
use uccl_integration::raw_peer::{RawPeer, SQ_DEPTH, sim_with_raw_devices};
use uccl_tx::wire::Imm;
use verbs_safe::SendOp;

const VICTIM: usize = 0;
const HONEST: usize = 1;
/// Honest connections, messages each, bytes each.
const CONNS: usize = 8;
const MSGS: u64 = 24;
const LEN: u64 = 256 << 10;
/// How long the flood runs each time before the victim's engine looks.
const SPAN: Duration = Duration::from_micros(20);

fn cfg(mode: Mode) -> EngineConfig {
    EngineConfig {
        mode,
        // 8 paths of the raw peer's send queues hold as many WRs as the SRQ has buffers.
        qps_per_conn: 8,
        max_conns: 16,
        ..EngineConfig::default()
    }
}

/// What the raw peer sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flood {
    /// New chunk numbers, past its grant, and each one twice.
    PastGrant,
    /// One chunk number, again and again.
    Duplicates,
}

/// What one run measured.
struct Run {
    /// Honest bytes over the virtual time they took.
    goodput_gbps: f64,
    /// The hostile connection's failure, if there was one.
    hostile: Option<EngineError>,
}

/// The honest workload (every honest engine's connection sends `MSGS` messages of `LEN` into
/// receives the victim posts, every byte checked), with a raw peer flooding if `flood` says
/// how.
fn run(mode: Mode, seed: u64, flood: Option<Flood>) -> Run {
    let dups = flood == Some(Flood::Duplicates);
    let flood = flood.is_some();
    let (mut sim, dev) = sim_with_raw_devices(seed, 2, 1, &cfg(mode));
    let fabric = sim.fabric.clone();
    let links: Vec<(ConnId, ConnId)> = (0..CONNS)
        .map(|_| {
            let l = sim.connect(VICTIM, HONEST).unwrap();
            (l.ca, l.cb)
        })
        .collect();
    let (mut peer, hostile) = RawPeer::connect(&fabric, &dev[0], &mut sim.engines[VICTIM], seed)
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    // A receive on the hostile connection: how it ends tells why the connection failed.
    let probe_buf = sim.engines[VICTIM].register(4096).unwrap();
    let probe = sim.engines[VICTIM]
        .recv(hostile, &probe_buf, 0, 4096)
        .unwrap();
    let total = CONNS as u64 * MSGS * LEN;
    let mut reqs: Vec<(Request, usize, u64)> = Vec::new();
    let mut dsts = Vec::new();
    for (k, &(cv, ch)) in links.iter().enumerate() {
        let src = sim.engines[HONEST].register((MSGS * LEN) as usize).unwrap();
        src.write_at(0, &pattern(seed, k as u64, 0, (MSGS * LEN) as usize))
            .unwrap();
        let dst = sim.engines[VICTIM].register((MSGS * LEN) as usize).unwrap();
        for m in 0..MSGS {
            let r = sim.engines[VICTIM].recv(cv, &dst, m * LEN, LEN).unwrap();
            reqs.push((r, k, m));
            let s = sim.engines[HONEST].send(ch, &src, m * LEN, LEN).unwrap();
            reqs.push((s, k, m));
        }
        dsts.push(dst);
    }
    let start = fabric.now();
    let done = |reqs: &[(Request, usize, u64)]| reqs.iter().all(|(r, _, _)| r.is_done());
    let paths = peer.paths();
    let mut csn = 0u16;
    while !done(&reqs) {
        if flood && sim.engines[VICTIM].is_open(hostile) {
            // For `SPAN` of virtual time the victim's engine looks away (its NIC alone
            // answers: an attacker faster than the engine) while the raw peer keeps every send
            // queue full: new chunk numbers past the grant, and each one again.
            let until = fabric.now() + SPAN;
            while fabric.now() < until {
                for i in peer.outstanding()..SQ_DEPTH as usize * paths {
                    let imm = Imm {
                        fid: peer.victim.fid,
                        rid: 0,
                        csn: csn % 2048,
                        last: false,
                    }
                    .encode()
                    .unwrap();
                    if i % 2 == 1 && !dups {
                        csn = csn.wrapping_add(1);
                    }
                    let op = SendOp::WriteWithImm {
                        remote_addr: 0,
                        rkey: 0,
                        imm,
                    };
                    if peer.post(i % paths, op, &[]).is_err() {
                        break;
                    }
                }
                // Until the queues have room again (on RC, receiver-not-ready may stop them).
                let left = until.saturating_sub(fabric.now());
                if peer
                    .drive(&fabric, left, |p| p.outstanding() < paths)
                    .is_err()
                {
                    break;
                }
            }
            // Then it looks, as long as it has anything to do.
            let mut busy = true;
            while busy {
                busy = false;
                for e in &mut sim.engines {
                    busy |= e.poll().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
                }
            }
        }
        peer.run(&mut sim, Duration::from_secs(30), |s, p| {
            done(&reqs) || (flood && s.engines[VICTIM].is_open(hostile) && p.outstanding() == 0)
        })
        .unwrap_or_else(|e| panic!("seed {seed} ({mode:?}, flood {flood}): {e}"));
    }
    let took = fabric.now() - start;
    for (r, k, m) in &reqs {
        let got = r.test().unwrap();
        assert!(
            got.is_ok(),
            "seed {seed} ({mode:?}, flood {flood}): honest connection {k}'s message {m}: {got:?}"
        );
    }
    for (k, dst) in dsts.iter().enumerate() {
        let mut got = vec![0u8; (MSGS * LEN) as usize];
        dst.read_at(0, &mut got).unwrap();
        let want = pattern(seed, k as u64, 0, (MSGS * LEN) as usize);
        assert!(
            got == want,
            "seed {seed} ({mode:?}): connection {k}'s bytes differ"
        );
    }
    if flood {
        peer.run(&mut sim, Duration::from_secs(5), |_, _| probe.is_done())
            .unwrap_or_else(|e| panic!("seed {seed} ({mode:?}): the hostile connection: {e}"));
    }
    Run {
        goodput_gbps: total as f64 * 8.0 / took.as_nanos() as f64,
        hostile: probe.test().and_then(Result::err),
    }
}

fn flood_is_contained(mode: Mode, how: Flood) {
    for seed in [1, 2] {
        let alone = run(mode, seed, None);
        assert!(
            alone.hostile.is_none(),
            "seed {seed} ({mode:?}): no flood, no failure"
        );
        let attacked = run(mode, seed, Some(how));
        let ratio = attacked.goodput_gbps / alone.goodput_gbps;
        eprintln!(
            "{mode:?} {how:?} seed {seed}: honest goodput {:.1} Gb/s alone, {:.1} under the flood ({ratio:.3})",
            alone.goodput_gbps, attacked.goodput_gbps
        );
        assert!(
            ratio >= 0.9,
            "seed {seed} ({mode:?}): honest goodput {:.1} Gb/s under the flood, {:.1} alone",
            attacked.goodput_gbps,
            alone.goodput_gbps
        );
        let why = attacked
            .hostile
            .unwrap_or_else(|| panic!("seed {seed} ({mode:?}): the hostile connection lives"))
            .to_string();
        assert!(
            why.contains("exceeded its receive credit by"),
            "seed {seed} ({mode:?}): {why}"
        );
    }
}

#[test]
fn a_flood_past_the_grant_is_throttled_then_failed_uc() {
    flood_is_contained(Mode::Uc, Flood::PastGrant);
}

#[test]
fn a_flood_past_the_grant_is_throttled_then_failed_rc() {
    flood_is_contained(Mode::Rc, Flood::PastGrant);
}

#[test]
fn a_flood_of_duplicates_is_throttled_then_failed_uc() {
    flood_is_contained(Mode::Uc, Flood::Duplicates);
}

#[test]
fn a_flood_of_duplicates_is_throttled_then_failed_rc() {
    flood_is_contained(Mode::Rc, Flood::Duplicates);
}

/// A peer that sends control messages each of which draws an answer (withdrawals of receives
/// it never posted) and takes none of the answers (its control QP posts no receive: the
/// victim's control sends wait on receiver-not-ready for ever) fails its connection once 512
/// answers wait, naming why: the victim's memory stays bounded, and its honest connection
/// goes on.
#[test]
fn a_flood_of_withdrawals_whose_answers_are_never_taken_fails_the_connection() {
    use uccl_integration::raw_peer::CTL_LEN;
    const WITHDRAW: u8 = 7;
    let seed = 9;
    let (mut sim, dev) = sim_with_raw_devices(seed, 2, 1, &cfg(Mode::Uc));
    let fabric = sim.fabric.clone();
    let honest = sim.connect(VICTIM, HONEST).unwrap();
    let (mut peer, hostile) =
        RawPeer::connect(&fabric, &dev[0], &mut sim.engines[VICTIM], seed).unwrap();
    let probe_buf = sim.engines[VICTIM].register(4096).unwrap();
    let probe = sim.engines[VICTIM]
        .recv(hostile, &probe_buf, 0, 4096)
        .unwrap();
    peer.hold_ctl = true;
    let step = |sim: &mut uccl_integration::Sim, peer: &mut RawPeer| {
        peer.poll().unwrap();
        for e in &mut sim.engines {
            e.poll().unwrap();
        }
        sim.advance_to_next(None);
    };
    let mut sent = 0u32;
    while sent < 4000 && !probe.is_done() {
        let mut m = [0u8; CTL_LEN];
        m[0] = WITHDRAW;
        m[4..8].copy_from_slice(&(1000 + sent).to_be_bytes());
        if peer.send_ctl(&m).is_ok() {
            sent += 1;
        } else {
            step(&mut sim, &mut peer);
        }
    }
    let limit = fabric.now() + Duration::from_secs(1);
    sim.run(limit, |_| probe.is_done()).unwrap();
    let why = probe.test().unwrap().unwrap_err().to_string();
    assert!(
        why.contains("withdrew more receives at once than it can have posted"),
        "after {sent} withdrawals: {why}"
    );
    assert!(sent > 512, "{sent} withdrawals");
    // The honest connection goes on.
    let src = sim.engines[HONEST].register(4096).unwrap();
    src.write_at(0, &[6; 4096]).unwrap();
    let dst = sim.engines[VICTIM].register(4096).unwrap();
    let r = sim.engines[VICTIM].recv(honest.ca, &dst, 0, 4096).unwrap();
    let s = sim.engines[HONEST].send(honest.cb, &src, 0, 4096).unwrap();
    let limit = fabric.now() + Duration::from_secs(1);
    sim.run(limit, |_| r.is_done() && s.is_done()).unwrap();
    assert!(matches!(r.test(), Some(Ok(_))), "{:?}", r.test());
    let mut got = [0u8; 4096];
    dst.read_at(0, &mut got).unwrap();
    assert!(got.iter().all(|&x| x == 6));
}

/// An engine's UD QP, which every connection's ACKs and advertisements share, takes messages
/// only under the Q_Key its handshake gave (drawn at random): one under the Q_Key all engines
/// had before is dropped by the device and never reaches the engine. And a Q_Key is part of a
/// peer's address: a handshake that names the UD QP of a connected peer with another Q_Key (an
/// engine that restarted and was given the same QP number, or one that names another's) is
/// another peer, whose UD messages go under its own Q_Key: the connected peer's QP never sees
/// them, and its own connection goes on as before.
#[test]
fn the_ud_qp_takes_only_its_own_q_key_and_another_q_key_is_another_peer() {
    const OLD_QKEY: u32 = 0x1cc1_0001;
    let seed = 12;
    let (mut sim, dev) = sim_with_raw_devices(seed, 1, 1, &cfg(Mode::Uc));
    let fabric = sim.fabric.clone();
    let (mut peer, conn) =
        RawPeer::connect(&fabric, &dev[0], &mut sim.engines[VICTIM], seed).unwrap();
    assert_ne!(peer.victim.qkey, OLD_QKEY);
    let garbage = [0xeeu8; 40];
    // A hundred rounds of both ends, the fabric moving on between them.
    let deliver = |sim: &mut uccl_integration::Sim, peer: &mut RawPeer| {
        for _ in 0..100 {
            peer.poll().unwrap();
            sim.engines[VICTIM].poll().unwrap();
            sim.advance_to_next(None);
        }
    };
    let invalid = |sim: &uccl_integration::Sim| sim.engines[VICTIM].stats().dropped_invalid;
    let before = invalid(&sim);
    peer.send_ud_keyed(&garbage, OLD_QKEY).unwrap();
    deliver(&mut sim, &mut peer);
    assert_eq!(invalid(&sim), before, "the old Q_Key reaches nothing");
    let qkey = peer.victim.qkey;
    peer.send_ud_keyed(&garbage, qkey).unwrap();
    deliver(&mut sim, &mut peer);
    assert_eq!(
        invalid(&sim),
        before + 1,
        "the engine's own Q_Key reaches it"
    );
    // Another handshake naming the raw peer's UD QP, with another Q_Key: accepted, as another
    // peer.
    let mut forged = peer.mine.clone();
    forged.qkey ^= 0x5a5a;
    let victim = &mut sim.engines[VICTIM];
    assert_eq!(victim.usage().peers, 1);
    let (offer, _) = victim.offer().unwrap();
    victim.complete(offer, &forged.to_bytes()).unwrap();
    assert_eq!(victim.usage().peers, 2, "another Q_Key, another peer");
    // A receive posted on a UC connection is advertised over the UD QP: the forged connection's
    // advertisement goes under the forged Q_Key and the raw peer's QP drops it; the raw peer's
    // own connection's reaches it.
    let buf = sim.engines[VICTIM].register(4096).unwrap();
    let heard = |sim: &mut uccl_integration::Sim, peer: &mut RawPeer, conn| {
        let (before, sent) = (peer.ud_received, sim.engines[VICTIM].stats().ud_adverts);
        let r = sim.engines[VICTIM].recv(conn, &buf, 0, 4096).unwrap();
        deliver(sim, peer);
        assert!(!r.is_done());
        assert!(
            sim.engines[VICTIM].stats().ud_adverts > sent,
            "the advertisement went"
        );
        peer.ud_received - before
    };
    assert_eq!(
        heard(&mut sim, &mut peer, offer),
        0,
        "the forged peer's Q_Key"
    );
    assert!(
        heard(&mut sim, &mut peer, conn) > 0,
        "the raw peer's own Q_Key"
    );
}

/// The UD flood's honest connections (the victim sends on them), and the messages each
/// connection's buffers hold (a run of more sends message `m` from and to slot `m % UD_MSGS`).
const UD_CONNS: usize = 4;
const UD_MSGS: u64 = 64;

/// The honest goodput (Gb/s, virtual time) of the victim's `msgs` sends on each connection,
/// every message checked.
fn ud_flood_run(seed: u64, flood: bool, msgs: u64) -> f64 {
    let cfg = EngineConfig {
        mode: Mode::Uc,
        max_conns: 16,
        ..EngineConfig::default()
    };
    let (mut sim, dev) = sim_with_raw_devices(seed, 2, 1, &cfg);
    let fabric = sim.fabric.clone();
    let links: Vec<_> = (0..UD_CONNS)
        .map(|_| sim.connect(VICTIM, HONEST).unwrap())
        .collect();
    let (mut peer, _hostile) =
        RawPeer::connect(&fabric, &dev[0], &mut sim.engines[VICTIM], seed).unwrap();
    let slots = UD_MSGS.min(msgs) * LEN;
    let (mut srcs, mut dsts) = (Vec::new(), Vec::new());
    for k in 0..UD_CONNS {
        let src = sim.engines[VICTIM].register(slots as usize).unwrap();
        src.write_at(0, &pattern(seed, k as u64, 0, slots as usize))
            .unwrap();
        srcs.push(src);
        dsts.push(sim.engines[HONEST].register(slots as usize).unwrap());
    }
    // Each connection's messages in flight (at most UD_MSGS: the receives a connection may
    // have posted), the next to post.
    let mut inflight: Vec<VecDeque<[Request; 2]>> = vec![VecDeque::new(); UD_CONNS];
    let mut next = [0u64; UD_CONNS];
    let mut top_up = |sim: &mut uccl_integration::Sim,
                      inflight: &mut Vec<VecDeque<[Request; 2]>>| {
        for (k, l) in links.iter().enumerate() {
            while let Some(r) = inflight[k]
                .front()
                .filter(|r| r.iter().all(Request::is_done))
            {
                for got in r.iter().map(Request::test) {
                    assert!(
                        matches!(got, Some(Ok(_))),
                        "seed {seed} (flood {flood}): connection {k}: {got:?}"
                    );
                }
                inflight[k].pop_front();
            }
            while (inflight[k].len() as u64) < UD_MSGS && next[k] < msgs {
                let at = next[k] % UD_MSGS * LEN;
                inflight[k].push_back([
                    sim.engines[HONEST].recv(l.cb, &dsts[k], at, LEN).unwrap(),
                    sim.engines[VICTIM].send(l.ca, &srcs[k], at, LEN).unwrap(),
                ]);
                next[k] += 1;
            }
        }
    };
    top_up(&mut sim, &mut inflight);
    let junk = [0xeeu8; 64];
    let start = fabric.now();
    let end = start + Duration::from_secs(10);
    let mut flooded = 0;
    while inflight.iter().any(|q| !q.is_empty()) {
        assert!(
            fabric.now() < end,
            "seed {seed} (flood {flood}): not done after 10 s of virtual time"
        );
        // The victim looks away; the honest engine, the NICs and the attacker go on.
        let until = fabric.now() + SPAN;
        while fabric.now() < until {
            if flood {
                flooded += peer.flood_ud(&junk).unwrap();
            }
            peer.poll().unwrap();
            while sim.engines[HONEST].poll().unwrap() {}
            let now = fabric.now();
            let next = (sim.engines[HONEST].next_deadline())
                .map(Duration::from_nanos)
                .into_iter()
                .chain(fabric.next_event())
                .min()
                .unwrap_or(until)
                .min(until);
            fabric.advance(next.saturating_sub(now).max(Duration::from_nanos(1)));
        }
        // Then it looks, until it has nothing left to do.
        let mut busy = true;
        while busy {
            busy = false;
            for e in &mut sim.engines {
                busy |= e.poll().unwrap();
            }
        }
        top_up(&mut sim, &mut inflight);
    }
    let took = fabric.now() - start;
    let len = slots as usize;
    let bytes = |b: &uccl_engine::Buffer| {
        let mut v = vec![0u8; len];
        b.read_at(0, &mut v).map(|()| v)
    };
    for (k, dst) in dsts.iter().enumerate() {
        assert!(
            bytes(dst).unwrap() == pattern(seed, k as u64, 0, len),
            "seed {seed}: connection {k}'s bytes differ"
        );
    }
    let stats = sim.engines[VICTIM].stats();
    let tx = sim.engines[VICTIM].tx_stats();
    eprintln!(
        "seed {seed} flood {flood}: {flooded} junk messages, {} dropped as invalid, {} ACKs \
         in, {} RTO and {} fast retransmissions, {} ACK requests, {:?}",
        stats.dropped_invalid,
        stats.acks_received,
        tx.rto_retransmits,
        tx.fast_retransmits,
        tx.ack_requests,
        took
    );
    if flood {
        assert!(
            flooded > 0 && stats.dropped_invalid > 0,
            "the flood reached it"
        );
    }
    (UD_CONNS as u64 * msgs * LEN) as f64 * 8.0 / took.as_nanos() as f64
}

/// A connected peer floods the UD QP that every peer's ACKs to an engine share (UC mode). Its
/// messages are junk under the right Q_Key (which its handshake gave it): the device takes each
/// into one of the QP's receives, which the engine drops and posts again. The victim engine
/// sends to an honest engine over 4 connections, looking away for 20 us of virtual time at a
/// stretch (an engine busy elsewhere, or an attacker faster than it), while the honest engine
/// and the attacker go on: the honest engine's ACKs arrive at a receive queue the flood keeps
/// empty. Every honest message must still complete, every byte checked, at no less than 0.7 of
/// the goodput of the same schedule without the flood (0.84 measured; 0.07 before the
/// engine's ACK requests asked for ACKs over the connection's control QP once its UD QP ran
/// dry: only the answers to its requests got through, one per timeout).
#[test]
fn a_flood_of_the_ud_qp_does_not_starve_the_honest_peers_acks() {
    assert_flood_keeps(1, UD_MSGS, 0.7);
}

/// Runs `msgs` messages a connection alone and under the UD flood (seed `seed`: the simulation
/// injects no faults, so it only names the run); under the flood the honest goodput must keep
/// `share` of its goodput alone or more.
fn assert_flood_keeps(seed: u64, msgs: u64, share: f64) {
    let alone = ud_flood_run(seed, false, msgs);
    let flooded = ud_flood_run(seed, true, msgs);
    let ratio = flooded / alone;
    eprintln!("seed {seed}: {alone:.1} Gb/s alone, {flooded:.1} under the flood ({ratio:.3})");
    assert!(
        ratio >= share,
        "seed {seed}, {msgs} messages: honest goodput {flooded:.1} Gb/s under the flood, \
         {alone:.1} alone"
    );
}

/// The flood above, going on for about 90 ms of virtual time (16 times the messages, a new
/// one posted as one completes): it outlives each 10 ms the peer sends the victim's ACKs over
/// the control QP, so each ends with ACKs lost on the UD QP until the victim's next timeout
/// asks again. That costs little: 0.987 of the goodput alone measured (55 ACK requests); a
/// hold that doubled while the flood went on asked half as often for 0.988, so holds stay
/// fixed. Soak only (about 15 s in a release build).
#[test]
#[ignore = "15 s in release: cargo xtask soak runs it"]
fn a_long_flood_of_the_ud_qp_costs_the_honest_peers_little() {
    assert_flood_keeps(2, 16 * UD_MSGS, 0.9);
}
