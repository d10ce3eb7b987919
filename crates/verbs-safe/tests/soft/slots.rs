//! Safe chained posting from a pool of pre-initialised WR slots: one doorbell, no allocation,
//! every SGE checked against the regions pinned to the queue.

use std::sync::Arc;

use crate::setup::*;
use verbs_safe::sys::{ibv_sge, ibv_wr_opcode};

/// 16 WRITE slots over `src`, each to its own 64 bytes of `dst`.
fn write_slots(src: &DmaBuf, dst: &DmaBuf) -> Vec<WrSlot<2>> {
    (0..16)
        .map(|i| {
            let mut s = WrSlot::<2>::default();
            s.wr.wr_id = i;
            s.wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
            s.wr.wr.rdma.remote_addr = dst.addr() + i * 64;
            s.wr.wr.rdma.rkey = dst.rkey();
            s.sges[0] = src.sge(i as usize * 64, 64).unwrap();
            s.wr.num_sge = 1;
            s
        })
        .collect()
}

#[test]
fn a_chain_of_pool_slots_rings_once_and_keeps_selective_signaling() {
    let (f, _v, a, b) = fabric();
    let (qa, _qb) = rc_pair(&a, &b, QpCaps::default(), false);
    let src = Arc::new(a.pd.alloc_dma(1024, 64, AccessFlags::LOCAL_WRITE).unwrap());
    let dst = Arc::new(b.pd.alloc_dma(1024, 64, AccessFlags::all()).unwrap());
    src.write_at(0, &[5; 1024]).unwrap();
    qa.pin(&src);
    let mut slots = write_slots(&src, &dst);
    slots[15].wr.send_flags = verbs_safe::sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
    // The pool's order, not the array's: any permutation links as given.
    let order: Vec<u32> = (0..16).rev().collect();
    qa.post_slots(&mut slots, &order).unwrap();
    let done = drain(&a.cq, 16);
    assert_eq!(done.iter().map(|d| d.wr_id).collect::<Vec<_>>(), [15]);
    let c = f.qp_counters(qa.as_raw()).unwrap();
    assert_eq!((c.post_send_calls, c.send_wrs), (1, 16));
    let mut got = vec![0u8; 1024];
    dst.read_at(0, &mut got).unwrap();
    assert_eq!(got, [5; 1024]);
    // The slots can be posted again at once (the WRs were only read during the call).
    qa.post_slots(&mut slots, &[15]).unwrap();
    assert_eq!(drain(&a.cq, 1)[0].wr_id, 15);
}

#[test]
fn a_slot_breaking_a_rule_is_named_and_nothing_is_posted() {
    let (f, _v, a, b) = fabric();
    let (qa, _qb) = rc_pair(&a, &b, QpCaps::default(), true);
    let src = Arc::new(a.pd.alloc_dma(1024, 64, AccessFlags::LOCAL_WRITE).unwrap());
    let other = Arc::new(a.pd.alloc_dma(64, 64, AccessFlags::LOCAL_WRITE).unwrap());
    let dst = Arc::new(b.pd.alloc_dma(1024, 64, AccessFlags::all()).unwrap());
    qa.pin(&src);
    let base = write_slots(&src, &dst);
    let refused = |slots: &mut Vec<WrSlot<2>>, order: &[u32], at: usize, why: &str| {
        let e = qa.post_slots(slots, order).unwrap_err();
        match &e {
            Error::InvalidWr { index, reason } => {
                assert_eq!(*index, at, "{e}");
                assert!(reason.contains(why), "{e}");
            }
            _ => panic!("{e}"),
        }
    };
    // A region that is not pinned.
    let mut s = base.clone();
    s[3].sges[0] = other.sge(0, 64).unwrap();
    refused(&mut s, &[0, 1, 2, 3], 3, "not inside a region pinned");
    // A range running past the pinned region.
    let mut s = base.clone();
    s[1].sges[0] = ibv_sge {
        length: 128,
        ..src.sge(960, 64).unwrap()
    };
    refused(&mut s, &[0, 1], 1, "not inside");
    // The same, checked right after a good slot in the region (slots are checked from the
    // chain's end): what the good one found must not let the bad one through.
    refused(&mut s, &[1, 0], 0, "not inside");
    let mut s = base.clone();
    s[1].sges[0].lkey = other.lkey();
    refused(&mut s, &[1, 0], 0, "not inside");
    let mut s = base.clone();
    s[3].sges[0] = other.sge(0, 64).unwrap();
    refused(&mut s, &[3, 0], 0, "not inside");
    // An empty SGE, more SGEs than the slot has, a slot named twice, a slot that does not
    // exist, an id with the tracker's bit.
    let mut s = base.clone();
    s[2].sges[0].length = 0;
    refused(&mut s, &[2], 0, "empty SGE");
    let mut s = base.clone();
    s[0].wr.num_sge = 3;
    refused(&mut s, &[0], 0, "num_sge 3");
    let mut s = base.clone();
    refused(&mut s, &[4, 5, 4], 2, "twice");
    refused(&mut s, &[4, 99], 1, "no slot 99");
    s[6].wr.wr_id = WR_ID_TAG | 6;
    refused(&mut s, &[6], 0, "bit 63");
    f.run_until_idle().unwrap();
    assert_eq!(
        f.qp_counters(qa.as_raw()).unwrap().send_wrs,
        0,
        "nothing was posted"
    );
    // The refused chains left nothing linked: the good ones still post.
    qa.post_slots(&mut s, &[4, 5]).unwrap();
    assert_eq!(drain(&a.cq, 2).len(), 2);
}

/// A holder whose `AsMut` hands out a checked slot on its first call and another on the next:
/// what is posted must be what was checked.
struct Fickle {
    good: WrSlot<2>,
    bad: WrSlot<2>,
    calls: u32,
}

impl AsMut<WrSlot<2>> for Fickle {
    fn as_mut(&mut self) -> &mut WrSlot<2> {
        self.calls += 1;
        if self.calls % 2 == 1 {
            &mut self.good
        } else {
            &mut self.bad
        }
    }
}

#[test]
fn a_holder_that_changes_its_slot_between_calls_posts_nothing_unchecked() {
    let (f, _v, a, b) = fabric();
    let (qa, _qb) = rc_pair(&a, &b, QpCaps::default(), true);
    let src = Arc::new(a.pd.alloc_dma(1024, 64, AccessFlags::LOCAL_WRITE).unwrap());
    let unpinned = Arc::new(a.pd.alloc_dma(64, 64, AccessFlags::LOCAL_WRITE).unwrap());
    let dst = Arc::new(b.pd.alloc_dma(1024, 64, AccessFlags::all()).unwrap());
    qa.pin(&src);
    let base = write_slots(&src, &dst);
    let mut bad = base[1];
    bad.sges[0] = unpinned.sge(0, 64).unwrap();
    let mut holders = [Fickle {
        good: base[0],
        bad,
        calls: 0,
    }];
    let e = qa.post_slots(&mut holders, &[0]).unwrap_err();
    assert!(matches!(e, Error::InvalidWr { index: 0, .. }), "{e}");
    f.run_until_idle().unwrap();
    assert_eq!(
        f.qp_counters(qa.as_raw()).unwrap().send_wrs,
        0,
        "nothing posted"
    );
}

#[test]
fn only_data_operations_are_posted_and_never_inline() {
    let (f, _v, a, b) = fabric();
    let (qa, _qb) = rc_pair(&a, &b, QpCaps::default(), true);
    let src = Arc::new(a.pd.alloc_dma(1024, 64, AccessFlags::LOCAL_WRITE).unwrap());
    let dst = Arc::new(b.pd.alloc_dma(1024, 64, AccessFlags::all()).unwrap());
    qa.pin(&src);
    let mut s = write_slots(&src, &dst);
    // A memory-window bind would have the driver follow pointers no check covers.
    s[0].wr.opcode = ibv_wr_opcode::IBV_WR_BIND_MW;
    let e = qa.post_slots(&mut s, &[0]).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidWr { index: 0, reason } if reason.contains("opcode")),
        "{e}"
    );
    s[0].wr.opcode = ibv_wr_opcode::IBV_WR_LOCAL_INV;
    assert!(qa.post_slots(&mut s, &[0]).is_err());
    // Inline data would be copied on this thread while another may write the region.
    s[1].wr.send_flags = verbs_safe::sys::ibv_send_flags::IBV_SEND_INLINE.0;
    let e = qa.post_slots(&mut s, &[2, 1]).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidWr { index: 1, reason } if reason.contains("inline")),
        "{e}"
    );
    f.run_until_idle().unwrap();
    assert_eq!(
        f.qp_counters(qa.as_raw()).unwrap().send_wrs,
        0,
        "nothing posted"
    );
    s[1].wr.send_flags = 0;
    qa.post_slots(&mut s, &[2, 1]).unwrap();
}

#[test]
fn a_full_send_queue_names_the_first_wr_not_posted() {
    let (_f, _v, a, b) = fabric();
    let caps = QpCaps {
        max_send_wr: 4,
        ..QpCaps::default()
    };
    let (qa, _qb) = rc_pair(&a, &b, caps, true);
    let src = Arc::new(a.pd.alloc_dma(1024, 64, AccessFlags::LOCAL_WRITE).unwrap());
    let dst = Arc::new(b.pd.alloc_dma(1024, 64, AccessFlags::all()).unwrap());
    qa.pin(&src);
    let mut slots = write_slots(&src, &dst);
    let e = qa.post_slots(&mut slots, &[0, 1, 2, 3, 4, 5]).unwrap_err();
    assert!(matches!(e, Error::Post { index: 4, .. }), "{e}");
    assert_eq!(drain(&a.cq, 4).len(), 4);
}

#[test]
fn an_srq_is_refilled_with_one_chained_post() {
    let (f, _v, a, b) = fabric();
    let srq = Srq::new(&b.pd, 64, 1).unwrap();
    let bufs = Arc::new(
        b.pd.alloc_dma(32 * 64, 64, AccessFlags::LOCAL_WRITE)
            .unwrap(),
    );
    srq.pin(&bufs);
    let mut slots: Vec<RecvSlot<1>> = (0..32)
        .map(|i| {
            let mut s = RecvSlot::<1>::default();
            s.wr.wr_id = i;
            s.sges[0] = bufs.sge(i as usize * 64, 64).unwrap();
            s.wr.num_sge = 1;
            s
        })
        .collect();
    let order: Vec<u32> = (0..32).collect();
    srq.post_recv_slots(&mut slots, &order).unwrap();
    assert_eq!(f.device_counters("soft1").unwrap().post_srq_recv_calls, 1);
    let qa = a.qp::<Rc>(QpCaps::default(), true);
    let qb = b.qp_on::<Rc>(&b.cq, &b.cq, Some(&srq));
    let (qa, _qb) = connect_rc(&a, qa, &b, qb);
    let msg = Arc::new(a.pd.alloc_mr(8, 8, AccessFlags::LOCAL_WRITE).unwrap());
    qa.post_send_bufs(&mut [SendWr::new(1, SendOp::Send).buf(&msg, 0, 8)])
        .unwrap();
    let got = drain(&b.cq, 1);
    assert_eq!((got[0].wr_id, got[0].byte_len), (0, 8));
    // An unpinned region is refused for an SRQ too.
    let other = Arc::new(b.pd.alloc_dma(64, 64, AccessFlags::LOCAL_WRITE).unwrap());
    slots[0].sges[0] = other.sge(0, 64).unwrap();
    assert!(matches!(
        srq.post_recv_slots(&mut slots, &[0]),
        Err(Error::InvalidWr { index: 0, .. })
    ));
}

#[test]
fn ud_slots_need_a_pinned_address_handle() {
    let (_f, _v, a, b) = fabric();
    let (da, db) = (ud_qp(&a), ud_qp(&b));
    let src = Arc::new(a.pd.alloc_dma(64, 64, AccessFlags::LOCAL_WRITE).unwrap());
    let dst = Arc::new(b.pd.alloc_dma(1024, 64, AccessFlags::LOCAL_WRITE).unwrap());
    da.pin(&src);
    db.pin(&dst);
    let mut r = [RecvSlot::<1>::default()];
    r[0].sges[0] = dst.sge(0, 1024).unwrap();
    r[0].wr.num_sge = 1;
    db.post_recv_slots(&mut r, &[0]).unwrap();
    let ah = a.pd.create_ah(FROM, 0, Some(b.gid)).unwrap();
    let mut s = [WrSlot::<1>::default()];
    s[0].wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
    s[0].wr.wr.ud.ah = ah.as_raw();
    s[0].wr.wr.ud.remote_qpn = db.qpn();
    s[0].wr.wr.ud.remote_qkey = QKEY;
    s[0].sges[0] = src.sge(0, 64).unwrap();
    s[0].wr.num_sge = 1;
    assert!(matches!(
        da.post_slots(&mut s, &[0]),
        Err(Error::InvalidWr { index: 0, .. })
    ));
    da.pin_ah(&ah);
    da.post_slots(&mut s, &[0]).unwrap();
    drop(ah); // the QP keeps it alive
    assert_eq!(drain(&b.cq, 1)[0].byte_len, 40 + 64);
}
