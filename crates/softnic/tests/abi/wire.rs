//! Anything may come from a wire: frames injected with `Fabric::inject` (well-formed headers
//! with hostile values, or garbage) are checked, counted and dropped or NAKed, never a panic,
//! never a wrapped address.

use proptest::prelude::*;
use softnic::packet::{Aeth, AtomicEth, Deth, Headers, Reth, layout, opcode, syndrome};

use crate::common::*;

/// A duplicate READ request whose RETH range wraps the address space: dropped (it is not
/// inside the READ it claims to repeat), not an overflow.
#[test]
fn a_duplicate_read_with_a_wrapping_range_is_dropped() {
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    let mut remote = vec![7u8; 2048];
    let mut local = vec![0u8; 2048];
    let rmr = b.reg(&mut remote, ALL_ACCESS);
    let lmr = a.reg(&mut local, LOCAL_WRITE);
    let read = read_wr(1, &local, lmr, remote.as_ptr() as u64, rmr);
    post_send(qa, &mut [read]).unwrap();
    assert!(ok(&poll_n(a.cq, 1)[0]));
    // The READ used PSNs 100 and 101 (the pair starts at 100). Repeat it with a hostile range.
    let dup = Headers {
        opcode: opcode::RC_READ_REQUEST,
        pkey: 0xffff,
        dest_qp: qpn(qb),
        ack_req: true,
        psn: 101,
        reth: Some(Reth {
            va: u64::MAX - 8,
            rkey: rkey(rmr),
            len: 4096,
        }),
        ..Headers::default()
    };
    // SAFETY: reading raw GID bytes.
    let sgid = unsafe { a.gid.raw };
    f.inject("soft1", sgid, &frame(dup, &[])).unwrap();
    f.run_until_idle().unwrap();
    assert_eq!(f.broken(), None);
    assert_eq!(
        state(qb),
        ibv_qp_state::IBV_QPS_RTS,
        "a dropped duplicate changes nothing"
    );
    assert_eq!(f.qp_counters(qb).unwrap().duplicates_received, 1);
}

/// A READ completes only on responses of the IBA's shapes, which rxe's completer checks too:
/// FIRST (or MIDDLE after it) of a full MTU before the last, then a LAST or ONLY carrying
/// exactly what is left (a FIRST may start again in the middle: a READ re-issued from there).
/// Forged responses out of that shape (a MIDDLE, ONLY or LAST first, an ONLY or LAST in the
/// middle, a FIRST or MIDDLE last, a short LAST) are dropped as malformed and complete
/// nothing; the right ones then complete the READ with every byte.
#[test]
fn read_responses_out_of_shape_complete_nothing() {
    // Time moves only when told (a poll of an empty CQ would move it to the READ's timeout).
    let f = still();
    let (a, qa, b, _qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    // The READ's request never reaches its peer: every response is forged.
    let down = Faults {
        link_down: true,
        ..Faults::NONE
    };
    f.set_faults("soft0", "soft1", down).unwrap();
    let mut remote = vec![0u8; 3000];
    let rmr = b.reg(&mut remote, ALL_ACCESS);
    let mut local = vec![0u8; 3000];
    let lmr = a.reg(&mut local, LOCAL_WRITE);
    let read = read_wr(7, &local, lmr, remote.as_ptr() as u64, rmr);
    post_send(qa, &mut [read]).unwrap();
    // PSNs 100 to 102 (the pair starts at 100), 1024-byte MTU: 1024, 1024 and 952 bytes.
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 1) as u8).collect();
    let part = |k: u32| &data[(k as usize * 1024)..(data.len()).min((k as usize + 1) * 1024)];
    // SAFETY: reading raw GID bytes.
    let from = unsafe { b.gid.raw };
    let respond = |op: u8, k: u32, payload: &[u8]| {
        let aeth = (op != opcode::RC_READ_RESPONSE_MIDDLE).then_some(Aeth {
            syndrome: syndrome::ACK,
            msn: 1,
        });
        let h = Headers {
            opcode: op,
            pkey: 0xffff,
            dest_qp: qpn(qa),
            psn: 100 + k,
            aeth,
            ..Headers::default()
        };
        f.inject("soft0", from, &frame(h, payload)).unwrap();
    };
    use opcode::{
        RC_READ_RESPONSE_FIRST as FIRST, RC_READ_RESPONSE_LAST as LAST,
        RC_READ_RESPONSE_MIDDLE as MIDDLE, RC_READ_RESPONSE_ONLY as ONLY,
    };
    // At each PSN in turn (so that none looks lost and asks again): what does not fit there,
    // then what does. The last is owed 952 bytes: a LAST of 10 does not fit.
    let wrong: [&[u8]; 3] = [&[MIDDLE, ONLY, LAST], &[ONLY, LAST], &[FIRST, MIDDLE]];
    let right = [FIRST, MIDDLE];
    for k in 0..3u32 {
        for &op in wrong[k as usize] {
            respond(op, k, part(k));
        }
        if let Some(&op) = right.get(k as usize) {
            respond(op, k, part(k));
        }
    }
    respond(LAST, 2, &part(2)[..10]);
    f.step();
    let early = poll(a.cq, 4);
    assert!(early.is_empty(), "completed on forged responses: {early:?}");
    assert_eq!(f.qp_counters(qa).unwrap().malformed, 8);
    // The right last response completes it, every byte in place.
    respond(LAST, 2, part(2));
    let wc = poll_n(a.cq, 1)[0];
    assert!(ok(&wc) && wc.wr_id == 7, "{wc:?}");
    assert!(local == data, "the READ's bytes");
}

/// Garbage is counted and dropped.
#[test]
fn garbage_frames_are_counted_and_dropped() {
    let f = Fabric::default();
    let (_a, _qa, _b, _qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    let g = [0u8; 16];
    f.inject("soft1", g, &[]).unwrap();
    f.inject("soft1", g, &[1, 2, 3]).unwrap();
    f.inject("soft1", g, &[0xab; 64]).unwrap();
    // A valid ICRC over an unknown opcode.
    let mut bad = vec![0x1f, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 0];
    let icrc = crc32fast_hash(&bad);
    bad.extend_from_slice(&icrc.to_le_bytes());
    f.inject("soft1", g, &bad).unwrap();
    let c = f.device_counters("soft1").unwrap();
    // Two too short for a BTH and an ICRC, one unknown opcode; one with a bad ICRC.
    assert_eq!((c.malformed, c.icrc_errors), (3, 1), "{c:?}");
    assert!(matches!(
        f.inject("soft9", g, &bad),
        Err(softnic::Error::UnknownDevice(_))
    ));
}

/// The ICRC softnic uses over its frames (a CRC-32 of everything before it).
fn crc32fast_hash(b: &[u8]) -> u32 {
    // Emit any valid packet and compare: the ICRC is the last 4 bytes, little-endian, of a
    // CRC-32 (IEEE) over the rest; compute it bitwise here to stay independent.
    let mut crc = !0u32;
    for &byte in b {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

const OPCODES: &[u8] = &[
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
    0x10, 0x11, 0x12, 0x13, 0x14, 0x16, 0x17, 0x1c, 0x1d, 0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26,
    0x27, 0x28, 0x29, 0x2a, 0x2b, 0x64, 0x65, 0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8,
    0xa9, 0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf, 0xb0, 0xb1, 0xb2, 0xb3, 0xb4, 0xb6, 0xb7, 0xbc, 0xbd,
];

/// Well-formed headers carrying arbitrary values, aimed at a QP or at a random number.
fn hostile() -> impl Strategy<Value = (Headers, Vec<u8>, bool)> {
    (
        proptest::sample::select(OPCODES),
        any::<(u32, bool, u64, u32, u32, u64, u64, u8, u32)>(),
        proptest::collection::vec(any::<u8>(), 0..300),
        any::<bool>(),
    )
        .prop_map(
            |(op, (psn, se, va, rkey, len, swap, cmp, syn, imm), payload, to_qp)| {
                let l = layout(op).unwrap();
                let h = Headers {
                    opcode: op,
                    se,
                    pkey: 0xffff,
                    dest_qp: 0,
                    ack_req: psn & 1 == 0,
                    psn: psn & 0x00ff_ffff,
                    deth: l.deth.then_some(Deth {
                        qkey: 0x1111_1111,
                        src_qp: 0x11,
                    }),
                    reth: l.reth.then_some(Reth { va, rkey, len }),
                    imm: l.imm.then_some(imm),
                    aeth: l.aeth.then_some(softnic::packet::Aeth {
                        syndrome: syn,
                        msn: psn >> 8,
                    }),
                    atomic: l.atomic.then_some(AtomicEth {
                        va,
                        rkey,
                        swap_add: swap,
                        compare: cmp,
                    }),
                    atomic_ack: l.atomic_ack.then_some(swap),
                    ieth: l.ieth.then_some(rkey),
                    feth: l.feth.then_some(imm),
                    xrceth: l.xrceth.then_some(len & 0xff_ffff),
                };
                (h, payload, to_qp)
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// RC, UC, UD and XRC target QPs in RTS, with memory registered, take any sequence of
    /// hostile packets without a panic; a PSN near the expected one is used half the time so
    /// the packets get past the sequence checks and reach the access checks (and, at the
    /// target, name its SRQ).
    #[test]
    fn hostile_packets_never_break_the_fabric(
        seed in any::<u64>(),
        pkts in proptest::collection::vec(hostile(), 1..40),
    ) {
        let f = Fabric::new(FabricConfig { seed, ..Default::default() });
        let mut mems = Vec::new();
        let mut qps = Vec::new();
        for ty in [ibv_qp_type::IBV_QPT_RC, ibv_qp_type::IBV_QPT_UC, ibv_qp_type::IBV_QPT_UD] {
            let (a, qa, b, qb) = pair(&f, ty, 16);
            let mut mem = vec![0u8; 8192];
            let mr = b.reg(&mut mem, ALL_ACCESS);
            let mut rq: Vec<ibv_recv_wr> = mem.chunks(1024).map(|c| recv_wr(0, &[sge(c, mr)])).collect();
            let _ = post_recv(qb, &mut rq);
            let _ = qa;
            qps.push((qpn(qb), rkey(mr), mem.as_ptr() as u64, 0));
            mems.push((a, b, mem));
        }
        // An XRC target, its SRQ's receives posted.
        let x = crate::xrc::xrc_pair(&f);
        let mut mem = vec![0u8; 8192];
        let mr = x.b.reg(&mut mem, ALL_ACCESS);
        let srq = crate::xrc::xrc_srq(&x.b, x.b.pd, x.xrcd, x.b.cq).unwrap();
        for c in mem.chunks(1024) {
            let _ = post_srq_recv(srq, &mut [recv_wr(0, &[sge(c, mr)])]);
        }
        let srqn = crate::xrc::srq_num(&x.b, srq);
        qps.push((qpn(x.tgt), rkey(mr), mem.as_ptr() as u64, srqn));
        mems.push((x.a, x.b, mem));
        // SAFETY: reading raw GID bytes.
        let sgid = unsafe { mems[0].0.gid.raw };
        for (i, (mut h, payload, to_qp)) in pkts.into_iter().enumerate() {
            let (qb, rk, base, srqn) = qps[i % 4];
            h.dest_qp = if to_qp { qb } else { h.dest_qp.wrapping_add(h.psn) & 0xff_ffff };
            if to_qp && i % 2 == 0 {
                h.psn = 100 + (h.psn % 4);
                if let Some(r) = h.reth.as_mut() { r.rkey = rk; r.va = base.wrapping_add(r.va % 9000); }
                if let Some(a) = h.atomic.as_mut() { a.rkey = rk; a.va = base.wrapping_add(a.va % 9000); }
                if let Some(s) = h.xrceth.as_mut() { *s = srqn; }
            }
            let mut bytes = Vec::new();
            h.emit(&payload, &mut bytes).unwrap();
            f.inject("soft1", sgid, &bytes).unwrap();
        }
        let _ = f.run_until_idle();
        prop_assert_eq!(f.broken(), None, "seed {}", seed);
        for (_, b, _) in &mems {
            prop_assert!(poll(b.cq, 64).len() <= 64);
        }
    }
}
