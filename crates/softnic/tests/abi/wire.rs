//! Anything may come from a wire: frames injected with `Fabric::inject` (well-formed headers
//! with hostile values, or garbage) are checked, counted and dropped or NAKed, never a panic,
//! never a wrapped address.

use proptest::prelude::*;
use softnic::packet::{AtomicEth, Deth, Headers, Reth, layout, opcode};

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
    let read = with_rdma(
        send_wr(
            1,
            ibv_wr_opcode::IBV_WR_RDMA_READ,
            &[sge(&local, lmr)],
            SIGNALED,
        ),
        remote.as_ptr() as u64,
        rkey(rmr),
    );
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
    0x27, 0x28, 0x29, 0x2a, 0x2b, 0x64, 0x65,
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
                };
                (h, payload, to_qp)
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// RC, UC and UD QPs in RTS, with memory registered, take any sequence of hostile packets
    /// without a panic; a PSN near the expected one is used half the time so the packets get
    /// past the sequence checks and reach the access checks.
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
            qps.push((qpn(qb), rkey(mr), mem.as_ptr() as u64));
            mems.push((a, b, mem));
        }
        // SAFETY: reading raw GID bytes.
        let sgid = unsafe { mems[0].0.gid.raw };
        for (i, (mut h, payload, to_qp)) in pkts.into_iter().enumerate() {
            let (qb, rk, base) = qps[i % 3];
            h.dest_qp = if to_qp { qb } else { h.dest_qp.wrapping_add(h.psn) & 0xff_ffff };
            if to_qp && i % 2 == 0 {
                h.psn = 100 + (h.psn % 4);
                if let Some(r) = h.reth.as_mut() { r.rkey = rk; r.va = base.wrapping_add(r.va % 9000); }
                if let Some(a) = h.atomic.as_mut() { a.rkey = rk; a.va = base.wrapping_add(a.va % 9000); }
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
