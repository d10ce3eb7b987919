//! RC, UC and UD data paths, SRQ, shared CQs, inline, immediate data, selective signaling and
//! error completions, all on softnic.

use std::sync::Arc;

use crate::setup::*;

const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

#[test]
fn rc_send_write_imm_and_read() {
    let (_f, _v, a, b) = fabric();
    let (qa, qb) = rc_pair(&a, &b, QpCaps::default(), true);
    let mut src = a.pd.alloc_mr(8192, 64, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = b.pd.alloc_dma(8192, 64, RW).unwrap();
    for (i, x) in src.as_mut_slice().iter_mut().enumerate() {
        *x = (i % 251) as u8;
    }
    // SAFETY: the regions outlive the completions drained below.
    unsafe {
        qb.post_recv(&mut [
            RecvWr::new(1).sge(dst.sge(0, 4096).unwrap()),
            RecvWr::new(2),
        ])
        .unwrap();
        qa.post_send(&mut [
            SendWr::new(10, SendOp::SendWithImm(0xabcd)).sge(src.sge(0, 3000).unwrap()),
            SendWr::new(
                11,
                SendOp::WriteWithImm {
                    remote_addr: dst.addr() + 4096,
                    rkey: dst.rkey(),
                    imm: 7,
                },
            )
            .sge(src.sge(100, 4000).unwrap()),
        ])
        .unwrap();
    }
    let got = drain(&b.cq, 2);
    assert_eq!(got[0].opcode, Some(WcOpcode::Recv));
    assert_eq!(
        (got[0].wr_id, got[0].byte_len, got[0].imm),
        (1, 3000, Some(0xabcd))
    );
    assert_eq!(got[1].opcode, Some(WcOpcode::RecvRdmaWithImm));
    assert_eq!(
        (got[1].wr_id, got[1].byte_len, got[1].imm),
        (2, 4000, Some(7))
    );
    let mut got = vec![0u8; 8192];
    dst.read_at(0, &mut got).unwrap();
    assert_eq!(&got[..3000], &src.as_slice()[..3000]);
    assert_eq!(&got[4096..8096], &src.as_slice()[100..4100]);
    let sent = drain(&a.cq, 2);
    assert_eq!(
        sent.iter().map(|d| d.opcode).collect::<Vec<_>>(),
        [Some(WcOpcode::Send), Some(WcOpcode::RdmaWrite)]
    );

    // READ it back.
    let back = a.pd.alloc_mr(4000, 64, AccessFlags::LOCAL_WRITE).unwrap();
    // SAFETY: as above.
    unsafe {
        qa.post_send(&mut [SendWr::new(
            12,
            SendOp::Read {
                remote_addr: dst.addr() + 4096,
                rkey: dst.rkey(),
            },
        )
        .sge(back.sge(0, 4000).unwrap())])
            .unwrap();
    }
    let r = drain(&a.cq, 1)[0];
    assert_eq!((r.opcode, r.byte_len), (Some(WcOpcode::RdmaRead), 4000));
    assert_eq!(back.as_slice(), &src.as_slice()[100..4100]);
}

#[test]
fn remote_access_errors_arrive_as_typed_failures() {
    let (_f, _v, a, b) = fabric();
    let (qa, qb) = rc_pair(&a, &b, QpCaps::default(), true);
    let src = a.pd.alloc_mr(64, 64, AccessFlags::LOCAL_WRITE).unwrap();
    let ro = b.pd.alloc_mr(64, 64, AccessFlags::LOCAL_WRITE).unwrap(); // no remote write
    // SAFETY: as above.
    unsafe {
        qa.post_send(&mut [
            SendWr::new(
                1,
                SendOp::Write {
                    remote_addr: ro.addr(),
                    rkey: ro.rkey(),
                },
            )
            .sge(src.sge(0, 8).unwrap()),
            SendWr::new(2, SendOp::Send),
        ])
        .unwrap();
    }
    let got = drain(&a.cq, 2);
    assert_eq!((got[0].wr_id, got[0].status), (1, WcStatus::RemAccessErr));
    assert_eq!((got[1].wr_id, got[1].status), (2, WcStatus::WrFlushErr));
    assert_eq!(got[0].opcode, None, "a failure exposes no opcode");
    assert_eq!(qa.current_state().unwrap(), QpStateKind::Error);
    assert_eq!(qb.current_state().unwrap(), QpStateKind::Error);
}

#[test]
fn uc_and_ud_paths() {
    let (_f, _v, a, b) = fabric();
    let (ua, ub) = uc_pair(&a, &b);
    let mut src = a.pd.alloc_mr(2048, 64, AccessFlags::LOCAL_WRITE).unwrap();
    src.as_mut_slice().fill(9);
    let dst = b.pd.alloc_dma(4096, 64, RW).unwrap();
    // SAFETY: as above.
    unsafe {
        ub.post_recv(&mut [RecvWr::new(1).sge(dst.sge(0, 2048).unwrap())])
            .unwrap();
        ua.post_send(&mut [SendWr::new(1, SendOp::Send).sge(src.sge(0, 2048).unwrap())])
            .unwrap();
    }
    assert_eq!(drain(&b.cq, 1)[0].byte_len, 2048);
    drain(&a.cq, 1);

    let (da, db) = (ud_qp(&a), ud_qp(&b));
    let ah = a.pd.create_ah(FROM, 0, Some(b.gid)).unwrap();
    // SAFETY: as above; the AH lives until the completion.
    unsafe {
        db.post_recv(&mut [RecvWr::new(5).sge(dst.sge(0, 1024).unwrap())])
            .unwrap();
        da.post_send(&mut [SendWr::new(6, SendOp::SendWithImm(3))
            .sge(src.sge(0, 100).unwrap())
            .ud(&ah, db.qpn(), QKEY)])
            .unwrap();
    }
    let r = drain(&b.cq, 1)[0];
    assert_eq!((r.byte_len, r.src_qp, r.imm), (140, da.qpn(), Some(3)));
    let mut got = [0u8; 100];
    dst.read_at(40, &mut got).unwrap();
    assert_eq!(&got[..], &src.as_slice()[..100]);
}

#[test]
fn an_srq_feeds_many_qps_and_a_shared_cq_tells_them_apart() {
    let (_f, _v, a, b) = fabric();
    let srq = Srq::new(&b.pd, 64, 1).unwrap();
    let buf =
        b.pd.alloc_mr(64 * 256, 64, AccessFlags::LOCAL_WRITE)
            .unwrap();
    let mut wrs: Vec<RecvWr> = (0..64)
        .map(|i| RecvWr::new(100 + i).sge(buf.sge(i as usize * 256, 256).unwrap()))
        .collect();
    // SAFETY: `buf` outlives the completions.
    unsafe { srq.post_recv(&mut wrs).unwrap() };
    let over = srq.arm_limit(65).unwrap_err().to_string();
    assert!(
        over.contains("limit of SRQ") && over.contains("at 65 WQEs"),
        "{over}"
    );
    srq.arm_limit(60).unwrap();
    assert_eq!(srq.query().unwrap().limit, 60);
    let mut pairs = Vec::new();
    for _ in 0..3 {
        let qa = a.qp::<Rc>(QpCaps::default(), true);
        let qb = b.qp_on::<Rc>(&b.cq, &b.cq, Some(&srq));
        assert_eq!(qb.caps().max_recv_wr, 0);
        let (qa, qb) = connect_rc(&a, qa, &b, qb);
        pairs.push((qa, qb));
    }
    for (i, (qa, _)) in pairs.iter().enumerate() {
        for _ in 0..2 {
            // SAFETY: no buffers.
            unsafe {
                qa.post_send(&mut [SendWr::new(i as u64, SendOp::SendWithImm(i as u32))])
                    .unwrap()
            };
        }
    }
    let got = drain(&b.cq, 6);
    assert_eq!(got.len(), 6);
    for d in &got {
        let i = d.imm.unwrap() as usize;
        assert_eq!(d.qp_num, pairs[i].1.qpn(), "demultiplexed by QP number");
        assert!((100..164).contains(&d.wr_id));
    }
    assert_eq!(
        srq.query().unwrap().limit,
        0,
        "the limit fired and disarmed"
    );
    drop(pairs);
    drop(srq); // still referenced by nothing: fine in any order
}

#[test]
fn selective_signaling_and_inline() {
    let (_f, _v, a, b) = fabric();
    let (qa, qb) = rc_pair(
        &a,
        &b,
        QpCaps {
            max_send_wr: 4,
            ..QpCaps::default()
        },
        false,
    );
    let dst = b.pd.alloc_dma(64, 64, RW).unwrap();
    let scratch = [7u8; 16];
    // SAFETY: inline data is copied into the WRs; `dst` outlives the completions.
    unsafe {
        qb.post_recv(&mut [RecvWr::new(1).sge(dst.sge(0, 32).unwrap()), RecvWr::new(2)])
            .unwrap();
        qa.post_send(&mut [
            SendWr::new(
                1,
                SendOp::Write {
                    remote_addr: dst.addr() + 32,
                    rkey: dst.rkey(),
                },
            )
            .inline_data(&scratch),
            SendWr::new(2, SendOp::Send).inline_data(&scratch),
            SendWr::new(3, SendOp::Send).signaled(),
        ])
        .unwrap();
    }
    let sent = drain(&a.cq, 3);
    assert_eq!(
        sent.iter().map(|d| d.wr_id).collect::<Vec<_>>(),
        [3],
        "only the signaled WR completes"
    );
    let mut got = [0u8; 48];
    dst.read_at(0, &mut got).unwrap();
    assert_eq!(&got[32..48], &[7; 16]);
    assert_eq!(&got[..16], &[7; 16]);
    assert_eq!(drain(&b.cq, 2).len(), 2);
    // An inline payload over the QP's limit is refused before posting, naming the WR.
    // SAFETY: refused before anything is posted.
    let err = unsafe {
        qa.post_send(&mut [
            SendWr::new(4, SendOp::Send),
            SendWr::new(5, SendOp::Send).inline_data(&[7; 65]),
        ])
    }
    .unwrap_err();
    assert!(matches!(err, Error::InvalidWr { index: 1, .. }), "{err}");
    let _keep: Arc<Cq> = Arc::clone(&a.cq);
}
