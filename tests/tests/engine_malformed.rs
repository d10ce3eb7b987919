//! uccl-engine against malformed input from the wire: while transfers run, frames are
//! injected at the engines' devices (`Fabric::inject`): garbage that fails the ICRC, frames
//! with a valid ICRC that do not parse, well-formed packets for unknown QPs, garbage ACK
//! messages on the UD control QP, and (UC) retransmission SENDs into the SRQ whose header
//! points outside the receive buffer it names. None may panic, copy out of bounds or disturb
//! the transfers: they are counted and dropped, and every message still arrives byte-exact.
//! (The receiver notes each refused retransmission to the sender, which finds that it did
//! not send that chunk there and ignores the note: an injected frame cannot fail a
//! connection.)

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use softnic::packet::{Deth, Headers, Reth, layout, opcode};
use softnic::{Faults, PacketInfo, Verdict};
use uccl_engine::{EngineConfig, Mode};
use uccl_integration::workload::{self, Kind, Op, Pacing};
use uccl_integration::{Sim, pattern};

/// A flow id no connection has (the engines hold few connections).
const NO_FLOW: u32 = 0xfff;

/// SplitMix64: the injected frames' randomness, from the test's seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// CRC-32 (IEEE, reflected), softnic's ICRC.
fn crc32(b: &[u8]) -> u32 {
    let mut c = !0u32;
    for &x in b {
        c ^= u32::from(x);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xedb8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// An immediate (host order) whose flow id is `fid`, the other bits random.
fn imm_with_fid(rng: &mut Rng, fid: u32) -> u32 {
    (rng.next() as u32 & !(0xfff << 19)) | (fid << 19)
}

/// The QPs seen on the wire: (receiving device, BTH opcode, destination QPN).
type Seen = Arc<Mutex<BTreeSet<(usize, u8, u32)>>>;

fn frame(h: Headers, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    h.emit(payload, &mut out).expect("a consistent header");
    out
}

/// The Q_Key of `e`'s UD control QP (drawn at random), as its handshake says it.
fn control_qkey(e: &mut uccl_engine::Engine) -> u32 {
    let (id, hello) = e.offer().unwrap();
    e.withdraw(id);
    uccl_integration::raw_peer::Hello::parse(&hello)
        .unwrap()
        .qkey
}

/// One injected frame for device `dev`, whose engine's UD QP has Q_Key `qkey`: its bytes and
/// what kind it is.
fn garbage(
    rng: &mut Rng,
    mode: Mode,
    (dev, qkey): (usize, u32),
    seen: &Seen,
    victim: u64,
) -> (Vec<u8>, usize) {
    let seen = seen.lock().unwrap().clone();
    let qpns = |f: &dyn Fn(u8) -> bool| -> Vec<u32> {
        seen.iter()
            .filter(|&&(d, op, _)| d == dev && f(op))
            .map(|&(_, _, q)| q)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    };
    let known: BTreeSet<u32> = seen.iter().map(|&(_, _, q)| q).collect();
    let ud = qpns(&|op| op == opcode::UD_SEND_ONLY);
    let data = qpns(&|op| op & 0xe0 == opcode::UC);
    let unknown = loop {
        let q = rng.below(1 << 24) as u32;
        if !known.contains(&q) {
            break q;
        }
    };
    let kinds = if mode == Mode::Uc { 6 } else { 3 };
    let kind = match rng.below(kinds) as usize {
        3 if ud.is_empty() => 0,
        4 | 5 if data.is_empty() => 0,
        k => k,
    };
    let bytes = match kind {
        // Garbage: the ICRC fails (or it is too short to have one).
        0 => {
            let n = rng.below(120) as usize;
            rng.bytes(n)
        }
        // A valid ICRC over garbage: it does not parse (or names no QP).
        1 => {
            let n = 16 + rng.below(100) as usize;
            let mut b = rng.bytes(n);
            let icrc = crc32(&b);
            b.extend_from_slice(&icrc.to_le_bytes());
            b
        }
        // A well-formed packet for a QP that does not exist.
        2 => {
            let op = [
                opcode::UD_SEND_ONLY,
                opcode::RC_SEND_ONLY,
                opcode::UC | opcode::RC_WRITE_ONLY_IMM,
            ][rng.below(3) as usize];
            let l = layout(op).expect("known");
            let n = rng.below(200) as usize;
            let h = Headers {
                opcode: op,
                pkey: 0xffff,
                dest_qp: unknown,
                psn: rng.below(1 << 24) as u32,
                deth: l.deth.then_some(Deth {
                    qkey,
                    src_qp: unknown,
                }),
                reth: l.reth.then(|| Reth {
                    va: rng.next(),
                    rkey: rng.next() as u32,
                    len: n as u32,
                }),
                imm: l.imm.then(|| imm_with_fid(rng, NO_FLOW).to_be()),
                ..Headers::default()
            };
            frame(h, &rng.bytes(n))
        }
        // UC: a UD message of garbage "ACKs" on the control QP, from a QP that is no peer's.
        3 => {
            let n = rng.below(4096) as usize;
            let mut p = rng.bytes(n);
            // Some look like ACKs (version 2) for a flow that does not exist.
            for a in p.chunks_mut(48) {
                if a.len() >= 6 && rng.below(2) == 0 {
                    a[0] = 2;
                    a[4..6].copy_from_slice(&(0xff0 | rng.below(16) as u16).to_be_bytes());
                }
            }
            let h = Headers {
                opcode: opcode::UD_SEND_ONLY,
                pkey: 0xffff,
                dest_qp: ud[rng.below(ud.len() as u64) as usize],
                deth: Some(Deth {
                    qkey: if rng.below(8) == 0 {
                        rng.next() as u32
                    } else {
                        qkey
                    },
                    src_qp: unknown,
                }),
                ..Headers::default()
            };
            frame(h, &p)
        }
        // UC: a zero-byte WRITE with an immediate naming no flow, on a data QP (zero-byte
        // writes need no valid rkey).
        4 => {
            let h = Headers {
                opcode: opcode::UC | opcode::RC_WRITE_ONLY_IMM,
                pkey: 0xffff,
                dest_qp: data[rng.below(data.len() as u64) as usize],
                psn: rng.below(1 << 24) as u32,
                reth: Some(Reth {
                    va: rng.next(),
                    rkey: rng.next() as u32,
                    len: 0,
                }),
                imm: Some(imm_with_fid(rng, NO_FLOW).to_be()),
                ..Headers::default()
            };
            frame(h, &[])
        }
        // UC: a "retransmission" SEND into the SRQ for the connection's flow (0), for a
        // receive (request id < 128), whose header points into the victim region (registered
        // and exported, but no receive buffer) or anywhere: it must never be copied.
        5 => {
            let mut imm = imm_with_fid(rng, 0);
            imm &= !(0x80 << 11); // a receive's request id
            let addr = match rng.below(3) {
                0 => victim + rng.below(60_000),
                1 => rng.next(),
                _ => u64::MAX - rng.below(1000),
            };
            let n = rng.below(3000) as usize;
            let mut p = addr.to_be_bytes().to_vec();
            p.extend_from_slice(&imm.to_be_bytes());
            p.extend(rng.bytes(n));
            let h = Headers {
                opcode: opcode::UC | opcode::RC_SEND_ONLY,
                pkey: 0xffff,
                dest_qp: data[rng.below(data.len() as u64) as usize],
                psn: rng.below(1 << 24) as u32,
                ..Headers::default()
            };
            frame(h, &p)
        }
        _ => unreachable!(),
    };
    (bytes, kind)
}

fn malformed(seed: u64, mode: Mode) {
    let cfg = EngineConfig {
        mode,
        qps_per_conn: 2,
        max_conns: 8,
        ..EngineConfig::default()
    };
    let mut sim = Sim::new(seed, 2, Faults::loss(0.01), &cfg);
    let seen: Seen = Arc::default();
    let s2 = Arc::clone(&seen);
    sim.fabric
        .set_packet_filter(Some(Box::new(move |p: &PacketInfo| {
            s2.lock().unwrap().insert((p.to, p.opcode, p.dest_qp));
            Verdict::Pass
        })));
    let link = sim.connect(0, 1).unwrap();
    let qkeys: Vec<u32> = sim.engines.iter_mut().map(control_qkey).collect();
    // A registered, exported region at each engine that no message targets.
    let mut victims = Vec::new();
    for e in &mut sim.engines {
        let v = e.register(64 * 1024).unwrap();
        v.write_at(0, &pattern(seed, 99, 99, v.len())).unwrap();
        let d = e.export(&v, 0, v.len() as u64).unwrap();
        victims.push((v, d.addr));
    }
    let chunk = cfg.tx.chunk_size as usize;
    let ops: Vec<Op> = (0..40)
        .map(|i| Op {
            link: 0,
            reverse: i % 2 == 1,
            kind: if i % 5 == 4 { Kind::Write } else { Kind::Send },
            len: [0, 1, chunk - 1, chunk + 1, 5 * chunk, 300_000, 4096][i % 7],
            slack: i % 3,
        })
        .collect();
    let mut rng = Rng(seed);
    let mut kinds = [0u64; 6];
    let before: Vec<_> = (0..2)
        .map(|i| sim.fabric.device_counters(&format!("soft{i}")).unwrap())
        .collect();
    let report = workload::run_with(&mut sim, &[link], &ops, Pacing::default(), |sim, round| {
        if round % 3 != 0 || kinds.iter().sum::<u64>() >= 3000 {
            return;
        }
        let dev = (round / 3 % 2) as usize;
        let (bytes, kind) = garbage(&mut rng, mode, (dev, qkeys[dev]), &seen, victims[dev].1);
        kinds[kind] += 1;
        // Mostly from the peer's address, which is what gets past the NIC to the engine;
        // the rest from anywhere (softnic drops them as foreign to the connected QPs).
        let sgid = if rng.below(4) == 0 {
            rng.bytes(16).try_into().unwrap()
        } else {
            sim.fabric.gid(&format!("soft{}", 1 - dev)).unwrap()
        };
        sim.fabric
            .inject(&format!("soft{dev}"), sgid, &bytes)
            .unwrap();
    })
    .unwrap();
    workload::drain(&mut sim, Duration::from_secs(5)).unwrap();
    assert!(
        sim.fabric.broken().is_none(),
        "seed {seed}: {:?}",
        sim.fabric.broken()
    );
    for (i, (v, _)) in victims.iter().enumerate() {
        let mut got = vec![0u8; v.len()];
        v.read_at(0, &mut got).unwrap();
        let at = got
            .iter()
            .zip(pattern(seed, 99, 99, v.len()))
            .position(|(g, w)| *g != w);
        assert_eq!(
            at, None,
            "seed {seed}: engine {i}'s victim region was written"
        );
    }
    let after: Vec<_> = (0..2)
        .map(|i| sim.fabric.device_counters(&format!("soft{i}")).unwrap())
        .collect();
    let icrc: u64 = (0..2)
        .map(|i| after[i].icrc_errors - before[i].icrc_errors)
        .sum();
    let bad: u64 = (0..2)
        .map(|i| after[i].malformed - before[i].malformed)
        .sum();
    let invalid: Vec<u64> = report.stats.iter().map(|s| s.dropped_invalid).collect();
    eprintln!(
        "seed {seed} {mode:?}: injected {kinds:?}; ICRC errors {icrc}, malformed {bad}, \
         engines' dropped_invalid {invalid:?}, {:?} virtual",
        report.virtual_time
    );
    assert!(icrc > 0 && bad > 0, "seed {seed}: {after:?}");
    if mode == Mode::Uc {
        assert!(
            invalid.iter().all(|&d| d > 0),
            "seed {seed}: garbage reached no engine: {invalid:?}"
        );
    }
    workload::close_all(&mut sim, &[link], Duration::from_secs(5)).unwrap();
}

#[test]
fn uc_malformed_frames_are_dropped_and_transfers_complete() {
    malformed(51, Mode::Uc);
}

#[test]
fn rc_malformed_frames_are_dropped_and_transfers_complete() {
    malformed(52, Mode::Rc);
}

/// One message from engine 1 to engine 0 over `link`, byte-exact, or why not.
fn one_message(sim: &mut Sim, link: &workload::Link, n: u64) -> Result<(), String> {
    let len = 5000 + n as usize;
    let data = pattern(sim.seed, 0x51, n, len);
    let dst = sim.engines[0].register(len).unwrap();
    let src = sim.engines[1].register(len).unwrap();
    src.write_at(0, &data).unwrap();
    let recv = sim.engines[0].recv(link.ca, &dst, 0, len as u64).unwrap();
    let send = sim.engines[1].send(link.cb, &src, 0, len as u64).unwrap();
    let limit = sim.fabric.now() + Duration::from_secs(10);
    sim.run(limit, |_| recv.is_done() && send.is_done())?;
    recv.test()
        .unwrap()
        .map_err(|e| format!("the receive: {e}"))?;
    send.test().unwrap().map_err(|e| format!("the send: {e}"))?;
    let mut got = vec![0u8; len];
    dst.read_at(0, &mut got).unwrap();
    (got == data).then_some(()).ok_or("the bytes differ".into())
}

/// Well-formed packets at every QP number an engine's device may have given out (RC and UC
/// WRITEs with any key and SENDs, at PSN 0 and at random PSNs), from no peer: the engine's
/// own QPs include the one its receive windows are bound on, which the first such WRITE used
/// to move to ERROR (an RC responder's access error), failing every receive after it on
/// every connection. Receives keep working on the connection there was and on a new one.
fn stray_packets(seed: u64, mode: Mode) {
    let cfg = EngineConfig {
        mode,
        qps_per_conn: 2,
        max_conns: 8,
        ..EngineConfig::default()
    };
    let mut sim = Sim::new(seed, 2, Faults::default(), &cfg);
    let link = sim.connect(0, 1).unwrap();
    one_message(&mut sim, &link, 0).unwrap_or_else(|e| panic!("seed {seed}: before: {e}"));
    let mut rng = Rng(seed);
    for qpn in 0..1024u32 {
        for op in [
            opcode::RC_WRITE_ONLY,
            opcode::UC | opcode::RC_WRITE_ONLY,
            opcode::RC_SEND_ONLY,
        ] {
            for psn in [0, rng.below(1 << 24) as u32] {
                let l = layout(op).expect("known");
                let h = Headers {
                    opcode: op,
                    pkey: 0xffff,
                    dest_qp: qpn,
                    psn,
                    reth: l.reth.then(|| Reth {
                        va: rng.next(),
                        rkey: rng.next() as u32,
                        len: 8,
                    }),
                    ..Headers::default()
                };
                // Mostly from the peer's address, which is what gets past the NIC to the engine;
                // the rest from anywhere (softnic drops them as foreign to the connected QPs).
                let sgid = if rng.below(4) == 0 {
                    rng.bytes(16).try_into().unwrap()
                } else {
                    sim.fabric.gid("soft1").unwrap()
                };
                sim.fabric
                    .inject("soft0", sgid, &frame(h, &rng.bytes(8)))
                    .unwrap();
            }
        }
        sim.engines[0].poll().unwrap();
    }
    for n in 1..4 {
        one_message(&mut sim, &link, n)
            .unwrap_or_else(|e| panic!("seed {seed} ({mode:?}): message {n} after: {e}"));
    }
    let fresh = sim.connect(0, 1).unwrap();
    one_message(&mut sim, &fresh, 9)
        .unwrap_or_else(|e| panic!("seed {seed} ({mode:?}): a new connection: {e}"));
}

#[test]
fn uc_stray_packets_at_every_qp_leave_receives_working() {
    stray_packets(53, Mode::Uc);
}

#[test]
fn rc_stray_packets_at_every_qp_leave_receives_working() {
    stray_packets(54, Mode::Rc);
}
