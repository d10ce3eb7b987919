//! Property tests: random traffic over RC under random faults delivers every message exactly
//! once, byte-exact, in order; UC under loss never completes a message with a missing packet.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use softnic::{PacketInfo, Verdict};

use crate::common::*;

fn faults() -> impl Strategy<Value = Faults> {
    (0.0..0.15f64, 0.0..0.15f64, 0.0..0.1f64, 0.0..0.05f64).prop_map(
        |(loss, reorder, duplicate, corrupt)| Faults {
            loss,
            reorder,
            reorder_delay_ns: 30_000,
            duplicate,
            corrupt,
            link_down: false,
        },
    )
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(24)
}

proptest! {
    // 24 cases per run in CI; `PROPTEST_CASES=5000` for a soak.
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn rc_delivers_exactly_once_in_order_under_faults(
        seed in any::<u64>(),
        faults in faults(),
        sizes in proptest::collection::vec(0usize..6000, 1..24),
        writes in proptest::collection::vec(any::<bool>(), 24),
    ) {
        let f = Fabric::new(FabricConfig { seed, ..Default::default() });
        f.set_default_faults(faults).unwrap();
        let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 64);
        let total: usize = sizes.iter().sum();
        let mut src: Vec<u8> = (0..total).map(|i| (i as u64).wrapping_mul(seed | 1) as u8).collect();
        let mut dst = vec![0u8; total];
        let smr = a.reg(&mut src, LOCAL_WRITE);
        let dmr = b.reg(&mut dst, ALL_ACCESS);
        let mut off = 0;
        let mut rs = Vec::new();
        let mut ss = Vec::new();
        for &len in &sizes {
            rs.push([sge(&dst[off..off + len], dmr)]);
            ss.push([sge(&src[off..off + len], smr)]);
            off += len;
        }
        let mut rw: Vec<ibv_recv_wr> = rs.iter_mut().enumerate().map(|(i, s)| recv_wr(i as u64, s)).collect();
        post_recv(qb, &mut rw).unwrap();
        let mut off = 0;
        let mut sw = Vec::new();
        for (i, s) in ss.iter_mut().enumerate() {
            let len = sizes[i];
            // Either a SEND into the i-th receive, or a WRITE_WITH_IMM straight to the spot.
            let wr = if writes[i] {
                let w = send_wr(i as u64, ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM, s, SIGNALED);
                with_imm(with_rdma(w, dst.as_ptr() as u64 + off as u64, rkey(dmr)), i as u32)
            } else {
                with_imm(send_wr(i as u64, ibv_wr_opcode::IBV_WR_SEND_WITH_IMM, s, SIGNALED), i as u32)
            };
            sw.push(wr);
            off += len;
        }
        post_send(qa, &mut sw).unwrap();
        let n = sizes.len();
        let sent = poll_n(a.cq, n);
        prop_assert_eq!(sent.len(), n, "seed {}", seed);
        // RC gives up after retry_cnt (7) retries of the same packet: with this much loss that
        // can legitimately happen. Then exactly one WR fails with RETRY_EXC_ERR, in order, and
        // the rest are flushed; at light loss it must not happen at all.
        let k = sent.iter().position(|w| !ok(w)).unwrap_or(n);
        if k < n {
            prop_assert!(faults.loss + faults.corrupt >= 0.07, "retries exhausted at light loss; seed {}", seed);
            prop_assert_eq!(sent[k].status, ibv_wc_status::IBV_WC_RETRY_EXC_ERR, "seed {}", seed);
            prop_assert!(sent[k + 1..].iter().all(|w| w.status == ibv_wc_status::IBV_WC_WR_FLUSH_ERR));
        }
        let got = poll_n(b.cq, n);
        let imms: Vec<u32> = got.iter().map(|w| u32::from_be(w.imm_data)).collect();
        // Delivered: every message before the failed one, maybe the failed one (if only its
        // ACKs were lost), nothing after it; in order, once each.
        let m = imms.len();
        prop_assert!(m == n || (k < n && (m == k || m == k + 1)), "{} delivered, failure at {}; seed {}", m, k, seed);
        prop_assert_eq!(imms, (0..m as u32).collect::<Vec<_>>(), "in order, once each; seed {}", seed);
        let mut off = 0;
        for (w, &len) in got.iter().zip(&sizes) {
            prop_assert!(ok(w));
            prop_assert_eq!(w.byte_len as usize, len);
            prop_assert!(dst[off..off + len] == src[off..off + len], "bytes differ; seed {}", seed);
            off += len;
        }
        f.run_until_idle().unwrap();
        prop_assert!(poll(b.cq, 8).is_empty(), "a duplicate completion; seed {}", seed);
    }

    #[test]
    fn uc_completes_exactly_the_messages_that_lost_no_packet(
        seed in any::<u64>(),
        loss in 0.0..0.3f64,
        sizes in proptest::collection::vec(1usize..5000, 1..24),
    ) {
        let f = Fabric::new(FabricConfig { seed, ..Default::default() });
        // The test decides the losses itself (seeded), so it knows exactly which PSNs were lost.
        let lost: Arc<Mutex<BTreeSet<u32>>> = Arc::default();
        let log = Arc::clone(&lost);
        let mut x = seed | 1;
        f.set_packet_filter(Some(Box::new(move |p: &PacketInfo| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let draw = (x >> 11) as f64 / (1u64 << 53) as f64;
            if p.from == 0 && draw < loss {
                log.lock().unwrap().insert(p.psn);
                Verdict::Drop
            } else {
                Verdict::Pass
            }
        })));
        let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_UC, 64);
        let total: usize = sizes.iter().sum();
        // No byte of any message is 0, so a byte a lost packet did not write shows.
        let mut src: Vec<u8> = (0..total).map(|i| (i % 253) as u8 + 1).collect();
        let smr = a.reg(&mut src, LOCAL_WRITE);
        let max = *sizes.iter().max().unwrap();
        let mut rbuf = vec![0u8; max * sizes.len()];
        let rmr = b.reg(&mut rbuf, LOCAL_WRITE);
        let rw: Vec<ibv_recv_wr> = rbuf.chunks(max).enumerate().map(|(i, c)| recv_wr(i as u64, &[sge(c, rmr)])).collect();
        post_recv(qb, &mut rw.clone()).unwrap();
        let mut off = 0;
        let mut sw = Vec::new();
        let mut first_psn = Vec::new();
        let mut psn = 100u32;
        for (i, &len) in sizes.iter().enumerate() {
            let w = send_wr(i as u64, ibv_wr_opcode::IBV_WR_SEND_WITH_IMM, &[sge(&src[off..off + len], smr)], SIGNALED);
            sw.push(with_imm(w, i as u32));
            first_psn.push(psn);
            psn += len.div_ceil(1024) as u32;
            off += len;
        }
        post_send(qa, &mut sw).unwrap();
        prop_assert_eq!(poll_n(a.cq, sizes.len()).len(), sizes.len(), "UC completes every send");
        f.run_until_idle().unwrap();
        let got = poll(b.cq, 64);
        let lost = lost.lock().unwrap().clone();
        let intact: BTreeSet<u32> = (0..sizes.len())
            .filter(|&i| {
                let n = sizes[i].div_ceil(1024) as u32;
                (first_psn[i]..first_psn[i] + n).all(|p| !lost.contains(&p))
            })
            .map(|i| i as u32)
            .collect();
        let delivered: BTreeSet<u32> = got.iter().map(|w| u32::from_be(w.imm_data)).collect();
        prop_assert_eq!(&delivered, &intact, "seed {}", seed);
        prop_assert_eq!(delivered.len(), got.len(), "a message completed twice; seed {}", seed);
        let mut starts = vec![0];
        for len in &sizes {
            starts.push(starts.last().unwrap() + len);
        }
        for w in &got {
            let i = u32::from_be(w.imm_data) as usize;
            prop_assert!(ok(w));
            prop_assert_eq!(w.byte_len as usize, sizes[i]);
            let at = w.wr_id as usize * max;
            prop_assert!(rbuf[at..at + sizes[i]] == src[starts[i]..starts[i + 1]], "message {} corrupted; seed {}", i, seed);
        }
        prop_assert_eq!(f.qp_counters(qb).unwrap().packets_received as usize, (psn - 100) as usize - lost.len());
    }
}

/// One WR of the mixed RC stream.
#[derive(Debug, Clone, Copy)]
enum Op {
    Send(usize),
    WriteImm(usize),
    Read(usize),
    FetchAdd(u64),
    CmpSwap,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0usize..5000).prop_map(Op::Send),
        (0usize..5000).prop_map(Op::WriteImm),
        (0usize..9000).prop_map(Op::Read),
        (1u64..1000).prop_map(Op::FetchAdd),
        Just(Op::CmpSwap),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// SENDs, WRITEs with immediate, READs, fetch-and-adds and compare-and-swaps mixed on one RC
    /// QP under loss, reordering, duplication and corruption: every WR completes in order;
    /// SENDs and WRITEs are delivered once each, byte-exact; READs bring back the right bytes;
    /// each atomic is applied exactly once, in order (so each sees the value left by the ones
    /// before it).
    #[test]
    fn rc_reads_and_atomics_mixed_in_under_faults(
        seed in any::<u64>(),
        faults in faults(),
        ops in proptest::collection::vec(op(), 1..24),
    ) {
        let f = Fabric::new(FabricConfig { seed, ..Default::default() });
        f.set_default_faults(faults).unwrap();
        let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 64);
        let atomic = ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;
        let flags = ibv_qp_attr { qp_access_flags: ALL_ACCESS | atomic, ..Default::default() };
        prop_assert_eq!(modify(qb, &flags, m(ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS)), 0);
        let n = ops.len();
        // a: one source/destination slot of 9000 bytes per WR; b: a receive slot per WR, a
        // write area per WR, a read-only pattern, and two counters.
        let mut src: Vec<u8> = (0..n * 9000).map(|i| (i as u64).wrapping_mul(seed | 1) as u8).collect();
        let mut rbuf = vec![0u8; n * 5000];
        let mut wbuf = vec![0u8; n * 5000];
        let mut pattern: Vec<u8> = (0..9000).map(|i| (i * 7 + 3) as u8).collect();
        let mut counters = aligned(16);
        let smr = a.reg(&mut src, LOCAL_WRITE);
        let rmr = b.reg(&mut rbuf, LOCAL_WRITE);
        let wmr = b.reg(&mut wbuf, ALL_ACCESS);
        let pmr = b.reg(&mut pattern, ALL_ACCESS);
        let cmr = b.reg(&mut counters, LOCAL_WRITE | atomic);
        let sends = ops.iter().filter(|o| matches!(o, Op::Send(_))).count();
        let mut rw: Vec<ibv_recv_wr> = (0..n)
            .map(|i| recv_wr(i as u64, &[sge(&rbuf[i * 5000..(i + 1) * 5000], rmr)]))
            .collect();
        post_recv(qb, &mut rw).unwrap();
        let counter = counters.as_ptr() as u64;
        let mut wrs = Vec::new();
        for (i, o) in ops.iter().enumerate() {
            let slot = &src[i * 9000..(i + 1) * 9000];
            let id = i as u64;
            let wr = match *o {
                Op::Send(len) => with_imm(
                    send_wr(id, ibv_wr_opcode::IBV_WR_SEND_WITH_IMM, &[sge(&slot[..len], smr)], SIGNALED),
                    i as u32,
                ),
                Op::WriteImm(len) => with_imm(
                    with_rdma(
                        send_wr(id, ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM, &[sge(&slot[..len], smr)], SIGNALED),
                        wbuf.as_ptr() as u64 + (i * 5000) as u64,
                        rkey(wmr),
                    ),
                    i as u32,
                ),
                Op::Read(len) => with_rdma(
                    send_wr(id, ibv_wr_opcode::IBV_WR_RDMA_READ, &[sge(&slot[..len], smr)], SIGNALED),
                    pattern.as_ptr() as u64,
                    rkey(pmr),
                ),
                Op::FetchAdd(add) => {
                    let mut w = send_wr(id, ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD, &[sge(&slot[..8], smr)], SIGNALED);
                    w.wr.atomic = ibv_send_wr__bindgen_ty_2__bindgen_ty_2 { remote_addr: counter, compare_add: add, swap: 0, rkey: rkey(cmr) };
                    w
                }
                Op::CmpSwap => {
                    // Each swap expects the count of swaps before it: only an exactly-once,
                    // in-order execution makes every one of them succeed.
                    let k = ops[..i].iter().filter(|o| matches!(o, Op::CmpSwap)).count() as u64;
                    let mut w = send_wr(id, ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP, &[sge(&slot[..8], smr)], SIGNALED);
                    w.wr.atomic = ibv_send_wr__bindgen_ty_2__bindgen_ty_2 { remote_addr: counter + 8, compare_add: k, swap: k + 1, rkey: rkey(cmr) };
                    w
                }
            };
            wrs.push(wr);
        }
        // The READs and atomics write into `src`: keep the expected bytes of the rest.
        let expect_src = src.clone();
        post_send(qa, &mut wrs).unwrap();
        let done = poll_n(a.cq, n);
        prop_assert_eq!(done.len(), n, "seed {}", seed);
        let k = done.iter().position(|w| !ok(w)).unwrap_or(n);
        if k < n {
            prop_assert!(faults.loss + faults.corrupt >= 0.07, "retries exhausted at light loss; seed {}", seed);
            prop_assert_eq!(done[k].status, ibv_wc_status::IBV_WC_RETRY_EXC_ERR, "seed {}", seed);
        }
        prop_assert_eq!(done.iter().map(|w| w.wr_id).collect::<Vec<_>>(), (0..n as u64).collect::<Vec<_>>());
        let mut adds = 0u64;
        let mut swaps = 0u64;
        for (i, o) in ops.iter().enumerate().take(k) {
            let slot = &src[i * 9000..(i + 1) * 9000];
            let old = u64::from_ne_bytes(slot[..8].try_into().unwrap());
            match *o {
                Op::Read(len) => prop_assert!(slot[..len] == pattern[..len], "READ {} data; seed {}", i, seed),
                Op::FetchAdd(add) => {
                    prop_assert_eq!(old, adds, "fetch-add {} saw the sum before it; seed {}", i, seed);
                    adds += add;
                }
                Op::CmpSwap => {
                    prop_assert_eq!(old, swaps, "compare-and-swap {}; seed {}", i, seed);
                    swaps += 1;
                }
                Op::Send(_) | Op::WriteImm(_) => prop_assert!(slot == &expect_src[i * 9000..(i + 1) * 9000]),
            }
        }
        f.run_until_idle().unwrap();
        let got = poll(b.cq, 2 * n);
        let mut seen = std::collections::BTreeSet::new();
        for w in &got {
            prop_assert!(ok(w), "{:?}; seed {}", w, seed);
            let i = u32::from_be(w.imm_data) as usize;
            prop_assert!(seen.insert(i), "message {} delivered twice; seed {}", i, seed);
            let src_i = &expect_src[i * 9000..];
            match ops[i] {
                Op::Send(len) => {
                    prop_assert_eq!(w.byte_len as usize, len);
                    let at = w.wr_id as usize * 5000;
                    prop_assert!(rbuf[at..at + len] == src_i[..len], "SEND {} bytes; seed {}", i, seed);
                }
                Op::WriteImm(len) => {
                    prop_assert_eq!(w.byte_len as usize, len);
                    prop_assert!(wbuf[i * 5000..i * 5000 + len] == src_i[..len], "WRITE {} bytes; seed {}", i, seed);
                }
                _ => prop_assert!(false, "a completion for a READ or atomic at the responder"),
            }
        }
        // Everything before the failure was delivered (and maybe the failed one).
        let delivered_needed = ops[..k].iter().filter(|o| matches!(o, Op::Send(_) | Op::WriteImm(_))).count();
        prop_assert!(seen.len() >= delivered_needed, "seed {}", seed);
        if k == n {
            let c = u64::from_ne_bytes(counters[..8].try_into().unwrap());
            prop_assert_eq!(c, adds, "each fetch-add applied once; seed {}", seed);
            let s = u64::from_ne_bytes(counters[8..].try_into().unwrap());
            prop_assert_eq!(s, swaps, "each swap applied once; seed {}", seed);
        }
        let _ = sends;
    }
}
