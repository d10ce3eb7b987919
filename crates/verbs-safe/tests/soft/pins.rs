//! Pin tables shared by many QPs, and unpinning that never frees memory a posted WR still
//! names: an unpinned buffer lives until the completion that retires its last WR is polled, or
//! its QP is reset or destroyed.

use std::sync::{Arc, Weak};

use crate::setup::*;
use verbs_safe::sys::{ibv_send_flags, ibv_wr_opcode};

/// `n` WRITE slots of 64 bytes of `src` into `dst`, the last one signaled.
fn writes(src: &DmaBuf, dst: &DmaBuf, n: u64) -> Vec<WrSlot<1>> {
    (0..n)
        .map(|i| {
            let mut s = WrSlot::<1>::default();
            s.wr.wr_id = i;
            s.wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
            s.wr.wr.rdma.remote_addr = dst.addr() + i * 64;
            s.wr.wr.rdma.rkey = dst.rkey();
            s.sges[0] = src.sge(i as usize * 64, 64).unwrap();
            s.wr.num_sge = 1;
            if i == n - 1 {
                s.wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
            }
            s
        })
        .collect()
}

/// A source buffer of `len` bytes on `a`, pinned to `pins`, and a weak handle to watch it go.
fn pinned_src(a: &Side, pins: &Pins, len: usize) -> (Arc<DmaBuf>, Weak<DmaBuf>) {
    let src = Arc::new(a.pd.alloc_dma(len, 64, AccessFlags::LOCAL_WRITE).unwrap());
    src.write_at(0, &vec![9; len]).unwrap();
    pins.pin(&src);
    let weak = Arc::downgrade(&src);
    (src, weak)
}

fn dst(b: &Side) -> Arc<DmaBuf> {
    Arc::new(b.pd.alloc_dma(4096, 64, AccessFlags::all()).unwrap())
}

/// The defect this guards: unpinning used not to exist (pins lived as long as the QP), and a
/// naive unpin would drop the buffer under WRs still posted. The buffer must outlive them.
#[test]
fn a_buffer_unpinned_with_writes_in_flight_lives_until_their_completion() {
    let (_f, _v, a, b) = fabric();
    let (qa, _qb) = rc_pair(&a, &b, QpCaps::default(), false);
    let dst = dst(&b);
    let (src, weak) = pinned_src(&a, qa.pins(), 1024);
    let mut slots = writes(&src, &dst, 16);
    let order: Vec<u32> = (0..16).collect();
    qa.post_slots(&mut slots, &order).unwrap();
    // The slots carry their own ids again once the post returns.
    assert_eq!(slots[15].wr.wr_id, 15);
    assert!(qa.pins().unpin(&src));
    drop(src);
    assert_eq!((qa.pins().pinned(), qa.pins().retiring()), (0, 1));
    assert!(weak.upgrade().is_some(), "16 WRITEs still name it");
    // A new slot naming it is refused at once.
    let again = weak.upgrade().unwrap();
    let e = qa
        .post_slots(&mut writes(&again, &dst, 1), &[0])
        .unwrap_err();
    assert!(e.to_string().contains("not inside a region pinned"), "{e}");
    drop(again);
    let done = drain(&a.cq, 1);
    assert_eq!((done[0].wr_id, done[0].status), (15, WcStatus::Success));
    assert!(weak.upgrade().is_none(), "released with the completion");
    assert_eq!(qa.pins().retiring(), 0);
    let mut got = vec![0u8; 1024];
    dst.read_at(0, &mut got).unwrap();
    assert_eq!(
        got,
        vec![9; 1024],
        "every WRITE read the buffer while it lived"
    );
}

/// One pin serves every QP of a shared table (registering costs one pin, not one per QP), and
/// an unpinned buffer waits for the WRs of every QP that named it.
#[test]
fn one_pin_serves_every_qp_of_a_table() {
    let (_f, _v, a, b) = fabric();
    let pins = Pins::new();
    let mut qps = Vec::new();
    for _ in 0..3 {
        let qa = a.qp::<Rc>(QpCaps::default(), false).with_pins(&pins);
        let (qa, qb) = connect_rc(&a, qa, &b, b.qp::<Rc>(QpCaps::default(), false));
        assert!(Arc::ptr_eq(qa.pins(), &pins));
        qps.push((qa, qb));
    }
    let dst = dst(&b);
    let (src, weak) = pinned_src(&a, &pins, 1024);
    assert_eq!(pins.pinned(), 1);
    for (qa, _) in &qps {
        qa.post_slots(&mut writes(&src, &dst, 4), &[0, 1, 2, 3])
            .unwrap();
    }
    pins.unpin(&src);
    drop(src);
    let mut seen = 0;
    while seen < 3 {
        assert!(weak.upgrade().is_some(), "{} of 3 QPs done", seen);
        seen += drain(&a.cq, 1).len();
    }
    assert!(weak.upgrade().is_none());
}

/// WRs that never complete (unsignaled, and nothing signaled after them) retire when their QP
/// is reset, or destroyed: the NIC drops them.
#[test]
fn a_reset_or_destroyed_qp_lets_go_of_what_it_named() {
    let (_f, _v, a, b) = fabric();
    let dst = dst(&b);
    for destroy in [false, true] {
        let (qa, _qb) = rc_pair(&a, &b, QpCaps::default(), false);
        let (src, weak) = pinned_src(&a, qa.pins(), 256);
        let mut slots = writes(&src, &dst, 4);
        for s in &mut slots {
            s.wr.send_flags = 0;
        }
        qa.post_slots(&mut slots, &[0, 1, 2, 3]).unwrap();
        qa.pins().unpin(&src);
        drop(src);
        assert!(drain(&a.cq, 1).is_empty(), "unsignaled");
        assert!(weak.upgrade().is_some(), "4 WRs name it");
        if destroy {
            drop(qa);
        } else {
            let qa = qa.reset().unwrap();
            assert_eq!(qa.pins().retiring(), 0);
        }
        assert!(weak.upgrade().is_none(), "destroy {destroy}");
    }
}

/// A chain the provider takes only part of (the send queue fills) counts only what it took.
#[test]
fn a_post_failing_half_way_counts_only_the_posted_wrs() {
    let (_f, _v, a, b) = fabric();
    let caps = QpCaps {
        max_send_wr: 4,
        ..QpCaps::default()
    };
    let (qa, _qb) = rc_pair(&a, &b, caps, false);
    let dst = dst(&b);
    let (src, weak) = pinned_src(&a, qa.pins(), 1024);
    let mut slots = writes(&src, &dst, 8);
    slots[1].wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
    let order: Vec<u32> = (0..8).collect();
    let e = qa.post_slots(&mut slots, &order).unwrap_err();
    assert!(matches!(e, Error::Post { index: 4, .. }), "{e}");
    assert!(slots.iter().all(|s| s.wr.wr_id < 8), "every id given back");
    qa.pins().unpin(&src);
    drop(src);
    // WRs 0-1 retire with WR 1's completion; 2-3 have no signaled WR after them.
    assert_eq!(drain(&a.cq, 1)[0].wr_id, 1);
    assert!(weak.upgrade().is_some(), "WRs 2 and 3 still name it");
    let mut tail = writes(&weak.upgrade().unwrap(), &dst, 1);
    tail[0].wr.wr_id = 99;
    // The buffer is unpinned: a signaled WR of another region retires what is left.
    let (other, _) = pinned_src(&a, qa.pins(), 64);
    tail[0].sges[0] = other.sge(0, 64).unwrap();
    qa.post_slots(&mut tail, &[0]).unwrap();
    assert_eq!(drain(&a.cq, 1)[0].wr_id, 99);
    assert!(
        weak.upgrade().is_none(),
        "the WRs the provider refused never counted"
    );
}

/// Each signaled WR of a chain retires what it and the WRs since the previous signaled one
/// named, and nothing after it (the marks of one post are filled in together).
#[test]
fn each_signaled_wr_of_a_chain_retires_what_came_before_it() {
    let (_f, _v, a, b) = fabric();
    let (qa, _qb) = rc_pair(&a, &b, QpCaps::default(), false);
    let dst = dst(&b);
    let (x, wx) = pinned_src(&a, qa.pins(), 1024);
    let (y, wy) = pinned_src(&a, qa.pins(), 1024);
    let mut slots = writes(&x, &dst, 8);
    for (i, s) in slots.iter_mut().enumerate() {
        if i >= 4 {
            s.sges[0] = y.sge(i * 64, 64).unwrap();
        }
        s.wr.send_flags = if i == 3 || i == 7 {
            ibv_send_flags::IBV_SEND_SIGNALED.0
        } else {
            0
        };
    }
    let order: Vec<u32> = (0..8).collect();
    qa.post_slots(&mut slots, &order).unwrap();
    qa.pins().unpin(&x);
    qa.pins().unpin(&y);
    drop((x, y));
    let first = drain(&a.cq, 1);
    assert_eq!(first[0].wr_id, 3);
    // WR 7 may have completed too; until it is polled, y is named.
    assert!(wx.upgrade().is_none(), "WRs 0-3 retired");
    assert!(wy.upgrade().is_some(), "WRs 4-7 still name it");
    assert_eq!(drain(&a.cq, 1)[0].wr_id, 7);
    assert!(wy.upgrade().is_none());
}

/// What the unsignaled WRs after a chain's last signaled one named is retired by the next
/// post's first signaled WR, whatever the order the chain named its buffers in.
#[test]
fn unsignaled_wrs_at_a_chains_end_wait_for_the_next_signaled_one() {
    let (_f, _v, a, b) = fabric();
    let (qa, _qb) = rc_pair(&a, &b, QpCaps::default(), false);
    let dst = dst(&b);
    let (x, wx) = pinned_src(&a, qa.pins(), 1024);
    let (y, wy) = pinned_src(&a, qa.pins(), 1024);
    let (z, wz) = pinned_src(&a, qa.pins(), 1024);
    // x y x [signaled] z y x, then z [signaled] alone.
    let mut slots = writes(&x, &dst, 6);
    for (i, s) in slots.iter_mut().enumerate() {
        let buf = [&x, &y, &x, &z, &y, &x][i];
        s.sges[0] = buf.sge(i * 64, 64).unwrap();
        s.wr.send_flags = if i == 2 {
            ibv_send_flags::IBV_SEND_SIGNALED.0
        } else {
            0
        };
    }
    let order: Vec<u32> = (0..6).collect();
    qa.post_slots(&mut slots, &order).unwrap();
    let mut last = writes(&z, &dst, 1);
    last[0].wr.wr_id = 6;
    qa.post_slots(&mut last, &[0]).unwrap();
    for (buf, name) in [(&x, "x"), (&y, "y"), (&z, "z")] {
        assert!(qa.pins().unpin(buf), "{name} was pinned");
    }
    drop((x, y, z));
    assert_eq!(drain(&a.cq, 1)[0].wr_id, 2);
    // WRs 0-2 retired; WRs 3-5 (z, y, x) wait for WR 6.
    assert!(wx.upgrade().is_some(), "WR 5 still names x");
    assert!(wy.upgrade().is_some(), "WR 4 still names y");
    assert!(wz.upgrade().is_some(), "WRs 3 and 6 still name z");
    assert_eq!(drain(&a.cq, 1)[0].wr_id, 6);
    assert!(wx.upgrade().is_none() && wy.upgrade().is_none() && wz.upgrade().is_none());
    assert_eq!(qa.pins().retiring(), 0);
}

/// A region a receive slot names is held until the QP is reset or destroyed, whatever is
/// unpinned meanwhile.
#[test]
fn receive_slots_hold_their_regions_until_reset() {
    let (_f, _v, a, b) = fabric();
    let (_qa, qb) = rc_pair(&a, &b, QpCaps::default(), true);
    let buf = Arc::new(b.pd.alloc_dma(256, 64, AccessFlags::LOCAL_WRITE).unwrap());
    qb.pin(&buf);
    let mut slots = vec![RecvSlot::<1>::default(); 2];
    for (i, s) in slots.iter_mut().enumerate() {
        s.wr.wr_id = i as u64;
        s.sges[0] = buf.sge(i * 128, 128).unwrap();
        s.wr.num_sge = 1;
    }
    qb.post_recv_slots(&mut slots, &[0, 1]).unwrap();
    let weak = Arc::downgrade(&buf);
    qb.pins().unpin(&buf);
    drop(buf);
    assert!(weak.upgrade().is_some(), "two receives may still fill it");
    let qb = qb.reset().unwrap();
    assert!(weak.upgrade().is_none());
    drop(qb);
}

/// UD slot posts name pinned address handles, counted like regions: an unpinned handle lives
/// until the sends naming it are done.
#[test]
fn an_unpinned_address_handle_lives_until_its_sends_are_done() {
    let (_f, _v, a, b) = fabric();
    let (da, db) = (ud_qp(&a), ud_qp(&b));
    let ah = a.pd.create_ah(FROM, 0, Some(b.gid)).unwrap();
    let src = Arc::new(a.pd.alloc_dma(64, 64, AccessFlags::LOCAL_WRITE).unwrap());
    da.pin(&src);
    da.pin_ah(&ah);
    let recv = b.pd.alloc_mr(128, 64, AccessFlags::LOCAL_WRITE).unwrap();
    db.post_recv_bufs(&mut [RecvWr::new(1).buf(recv, 0, 128)])
        .unwrap();
    let mut s = WrSlot::<1>::default();
    s.wr.wr_id = 5;
    s.wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
    s.wr.wr.ud.ah = ah.as_raw();
    s.wr.wr.ud.remote_qpn = db.qpn();
    s.wr.wr.ud.remote_qkey = QKEY;
    s.sges[0] = src.sge(0, 64).unwrap();
    s.wr.num_sge = 1;
    let mut slots = vec![s];
    da.post_slots(&mut slots, &[0]).unwrap();
    // An RDMA opcode on UD is refused: its remote address would overlay the handle.
    slots[0].wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
    let e = da.post_slots(&mut slots, &[0]).unwrap_err();
    assert!(e.to_string().contains("SENDs only"), "{e}");
    let weak = Arc::downgrade(&ah);
    assert!(da.pins().unpin_ah(&ah));
    drop(ah);
    assert!(weak.upgrade().is_some(), "a send names it");
    assert_eq!(drain(&a.cq, 1)[0].wr_id, 5);
    assert!(weak.upgrade().is_none());
    assert_eq!(drain(&b.cq, 1)[0].byte_len, 40 + 64);
}

/// A UD slot post names an address handle of its QP's protection domain only: a handle of
/// another PD (of the same device or another one; of another provider it would be a pointer
/// into the wrong driver) is refused, pinned or not, naming both PDs.
#[test]
fn an_address_handle_of_another_protection_domain_is_refused() {
    let (_f, _v, a, b) = fabric();
    let (da, db) = (ud_qp(&a), ud_qp(&b));
    let src = Arc::new(a.pd.alloc_dma(64, 64, AccessFlags::LOCAL_WRITE).unwrap());
    da.pin(&src);
    let other_pd = a.ctx.alloc_pd().unwrap();
    let foreign = [
        other_pd.create_ah(FROM, 0, Some(b.gid)).unwrap(),
        b.pd.create_ah(FROM, 0, Some(a.gid)).unwrap(),
    ];
    for (n, ah) in foreign.iter().enumerate() {
        da.pin_ah(ah);
        let mut s = [WrSlot::<1>::default()];
        s[0].wr.wr_id = 9;
        s[0].wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
        s[0].wr.wr.ud.ah = ah.as_raw();
        s[0].wr.wr.ud.remote_qpn = db.qpn();
        s[0].wr.wr.ud.remote_qkey = QKEY;
        s[0].sges[0] = src.sge(0, 64).unwrap();
        s[0].wr.num_sge = 1;
        let e = da.post_slots(&mut s, &[0]).unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(e, Error::InvalidWr { index: 0, .. })
                && msg.contains("address handle belongs to protection domain")
                && msg.contains("the QP's is protection domain"),
            "handle {n}: {msg}"
        );
        let device = if n == 0 { "soft0" } else { "soft1" };
        assert!(msg.contains(&format!("of {device}, the QP's")), "{msg}");
        assert_eq!(s[0].wr.wr_id, 9, "the slot keeps its id");
    }
    assert!(drain(&a.cq, 1).is_empty(), "nothing was posted");
    // The QP's own handle still goes.
    let own = a.pd.create_ah(FROM, 0, Some(b.gid)).unwrap();
    da.pin_ah(&own);
    let recv = b.pd.alloc_mr(128, 64, AccessFlags::LOCAL_WRITE).unwrap();
    db.post_recv_bufs(&mut [RecvWr::new(1).buf(recv, 0, 128)])
        .unwrap();
    let mut s = [WrSlot::<1>::default()];
    s[0].wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
    s[0].wr.wr.ud.ah = own.as_raw();
    s[0].wr.wr.ud.remote_qpn = db.qpn();
    s[0].wr.wr.ud.remote_qkey = QKEY;
    s[0].sges[0] = src.sge(0, 64).unwrap();
    s[0].wr.num_sge = 1;
    da.post_slots(&mut s, &[0]).unwrap();
    assert_eq!(drain(&a.cq, 1)[0].status, WcStatus::Success);
}
