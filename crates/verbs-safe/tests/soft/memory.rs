//! The memory model: safe code never holds a reference to bytes the NIC or a peer may write.
//! Safe posts move what the NIC writes into the post and give it back with the completion,
//! share what it only reads, and refuse what they cannot vouch for; remotely accessible
//! memory is reached by copies.

use std::sync::Arc;

use crate::setup::*;

const LW: AccessFlags = AccessFlags::LOCAL_WRITE;

/// Polls `cq` until one completion arrives; returns its id, status and the buffers it gave
/// back.
fn one(cq: &Cq) -> (u64, WcStatus, Vec<MrBuf>) {
    let mut p = Poller::new();
    for _ in 0..100 {
        let mut got = None;
        p.poll(cq, 1, |mut c| {
            got = Some((c.wr_id(), c.status().unwrap(), c.take_bufs()))
        })
        .unwrap();
        if let Some(g) = got {
            return g;
        }
    }
    panic!("no completion");
}

#[test]
fn a_receive_buffer_moves_into_the_post_and_comes_back_with_its_data() {
    let (_f, _v, a, b) = fabric();
    let (qa, qb) = rc_pair(&a, &b, QpCaps::default(), true);
    let dst = b.pd.alloc_mr(64, 64, AccessFlags::LOCAL_WRITE).unwrap();
    qb.post_recv_bufs(&mut [RecvWr::new(1).buf(dst, 0, 64)])
        .unwrap();
    // `dst` is gone from here: nothing can read it while the NIC may be writing it (the
    // compile-fail test `recv_buf_read_after_post` shows the old misuse).
    let mut src = a.pd.alloc_mr(64, 64, AccessFlags::LOCAL_WRITE).unwrap();
    src.as_mut_slice()[..5].copy_from_slice(b"safe!");
    let src = Arc::new(src);
    qa.post_send_bufs(&mut [SendWr::new(2, SendOp::Send).buf(&src, 0, 5)])
        .unwrap();
    assert_eq!(b.ctx.posts_in_flight(), 1);
    let (id, st, mut bufs) = one(&b.cq);
    assert_eq!(
        (id, st, bufs.len()),
        (1, WcStatus::Success, 1),
        "the caller's id"
    );
    let back = bufs.pop().unwrap();
    assert_eq!(&back.as_slice()[..5], b"safe!");
    // The send shared `src` until its completion: no one could write it meanwhile.
    assert!(Arc::strong_count(&src) >= 2, "held by the post");
    let (id, st, bufs) = one(&a.cq);
    assert_eq!((id, st, bufs.len()), (2, WcStatus::Success, 0));
    assert_eq!(Arc::strong_count(&src), 1, "released by its completion");
    let mut src = Arc::try_unwrap(src).unwrap();
    src.as_mut_slice()[0] = b'S';
    assert_eq!((a.ctx.posts_in_flight(), b.ctx.posts_in_flight()), (0, 0));
}

#[test]
fn read_and_atomic_targets_are_moved_in_and_given_back() {
    let (_f, _v, a, b) = fabric();
    let (qa, _qb) = rc_pair(&a, &b, QpCaps::default(), true);
    let remote = b.pd.alloc_dma(64, 64, AccessFlags::all()).unwrap();
    remote.write_at(0, b"read me").unwrap();
    remote.write_at(8, &41u64.to_ne_bytes()).unwrap();
    let target = a.pd.alloc_mr(16, 8, AccessFlags::LOCAL_WRITE).unwrap();
    let read = SendOp::Read {
        remote_addr: remote.addr(),
        rkey: remote.rkey(),
    };
    qa.post_send_bufs(&mut [SendWr::new(1, read).target(target, 0, 7)])
        .unwrap();
    let (_, st, mut bufs) = one(&a.cq);
    assert_eq!(st, WcStatus::Success);
    let target = bufs.pop().unwrap();
    assert_eq!(&target.as_slice()[..7], b"read me");
    let add = SendOp::FetchAdd {
        remote_addr: remote.addr() + 8,
        rkey: remote.rkey(),
        add: 1,
    };
    qa.post_send_bufs(&mut [SendWr::new(2, add).target(target, 8, 8)])
        .unwrap();
    let (_, st, mut bufs) = one(&a.cq);
    assert_eq!(st, WcStatus::Success);
    let target = bufs.pop().unwrap();
    assert_eq!(
        target.as_slice()[8..16],
        41u64.to_ne_bytes(),
        "the value before"
    );
    let mut now = [0u8; 8];
    remote.read_at(8, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 42);
}

#[test]
fn safe_posts_refuse_what_they_cannot_vouch_for() {
    let (_f, _v, a, b) = fabric();
    let (qa, _qb) = rc_pair(&a, &b, QpCaps::default(), true);
    let shared = Arc::new(a.pd.alloc_mr(64, 64, AccessFlags::LOCAL_WRITE).unwrap());
    let refused = |mut w: SendWr| {
        let e = qa.post_send_bufs(std::slice::from_mut(&mut w)).unwrap_err();
        assert!(matches!(e, Error::InvalidWr { index: 0, .. }), "{e}");
        e.to_string()
    };
    // A raw SGE, a range outside its buffer, a plain id with bit 63 set.
    refused(SendWr::new(3, SendOp::Send).sge(shared.sge(0, 1).unwrap()));
    refused(SendWr::new(4, SendOp::Send).buf(&shared, 60, 8));
    refused(SendWr::new(WR_ID_TAG | 5, SendOp::Send));
    // A shared buffer as the target of a READ (the NIC would write what others may read).
    let read = SendOp::Read {
        remote_addr: 0,
        rkey: 0,
    };
    let why = refused(SendWr::new(6, read).buf(&shared, 0, 8));
    assert!(why.contains("target"), "{why}");
    // A completion context of another device context.
    let other = CompletionContext::new(&b.ctx, |_| {});
    refused(SendWr::new(7, SendOp::Send).context(&other));
    // Inline data next to a DmaBuf (the driver would copy bytes a peer may be writing), in
    // either order, and inline data on a READ.
    let dma = Arc::new(a.pd.alloc_dma(64, 64, AccessFlags::LOCAL_WRITE).unwrap());
    let why = refused(
        SendWr::new(8, SendOp::Send)
            .dma_buf(&dma, 0, 8)
            .inline_data(b"x"),
    );
    assert!(why.contains("inline data from a DmaBuf"), "{why}");
    refused(
        SendWr::new(9, SendOp::Send)
            .inline_data(b"x")
            .dma_buf(&dma, 0, 8),
    );
    let why = refused(SendWr::new(10, read).inline_data(b"x"));
    assert!(why.contains("only SENDs and WRITEs"), "{why}");
    // A UD destination on a connected QP: UD sends are UdSendWrs, posted on UD QPs.
    let ah = a.pd.create_ah(FROM, 0, Some(b.gid)).unwrap();
    refused(SendWr::new(11, SendOp::Send).ud(&ah, 1, QKEY));
    assert_eq!(
        a.ctx.posts_in_flight(),
        0,
        "nothing was posted or left behind"
    );
}

/// Inline data is taken by value: the WR owns its bytes, and a safe post sends them.
#[test]
fn inline_data_is_sent_from_the_wr_itself() {
    let (_f, _v, a, b) = fabric();
    let (qa, qb) = rc_pair(&a, &b, QpCaps::default(), true);
    let recv = b.pd.alloc_mr(64, 64, AccessFlags::LOCAL_WRITE).unwrap();
    qb.post_recv_bufs(&mut [RecvWr::new(1).buf(recv, 0, 64)])
        .unwrap();
    let mut data = *b"inline bytes";
    let mut wr = [SendWr::new(2, SendOp::Send).inline_data(&data)];
    data.fill(0);
    qa.post_send_bufs(&mut wr).unwrap();
    assert_eq!(one(&a.cq).1, WcStatus::Success);
    let (_, status, mut bufs) = one(&b.cq);
    assert_eq!(status, WcStatus::Success);
    assert_eq!(&bufs.pop().unwrap().as_slice()[..12], b"inline bytes");
}

/// The safe UD post takes UdSendWrs, each with its address handle (of the QP's PD), which the
/// post keeps alive until the completion.
#[test]
fn a_ud_send_carries_its_address_handle() {
    let (_f, _v, a, b) = fabric();
    let (da, db) = (ud_qp(&a), ud_qp(&b));
    let ah = a.pd.create_ah(FROM, 0, Some(b.gid)).unwrap();
    let recv = b.pd.alloc_mr(128, 64, AccessFlags::LOCAL_WRITE).unwrap();
    db.post_recv_bufs(&mut [RecvWr::new(1).buf(recv, 0, 128)])
        .unwrap();
    let weak = Arc::downgrade(&ah);
    let mut wr = [UdSendWr::new(3, &ah, db.qpn(), QKEY)
        .imm(77)
        .inline_data(b"datagram")];
    drop(ah);
    da.post_send_bufs(&mut wr).unwrap();
    drop(wr);
    assert!(
        weak.upgrade().is_some(),
        "the post holds the address handle"
    );
    assert_eq!(one(&a.cq).1, WcStatus::Success);
    assert!(weak.upgrade().is_none(), "released with the completion");
    let (_, status, mut bufs) = one(&b.cq);
    assert_eq!(status, WcStatus::Success);
    assert_eq!(&bufs.pop().unwrap().as_slice()[40..48], b"datagram");
    // An address handle of another protection domain is refused before anything is posted.
    let other_pd = a.ctx.alloc_pd().unwrap();
    let foreign = other_pd.create_ah(FROM, 0, Some(b.gid)).unwrap();
    let e = da
        .post_send_bufs(&mut [UdSendWr::new(4, &foreign, db.qpn(), QKEY)])
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("address handle belongs to protection domain"),
        "{e}"
    );
}

/// A range of a DmaBuf registered on its own: its rkey reaches exactly that range, and nothing
/// once the range is dropped.
#[test]
fn a_registered_range_reaches_exactly_its_bytes() {
    let (_f, _v, a, b) = fabric();
    let (qa, _qb) = rc_pair(&a, &b, QpCaps::default(), true);
    let src = Arc::new(a.pd.alloc_mr(64, 64, AccessFlags::LOCAL_WRITE).unwrap());
    let dst = Arc::new(b.pd.alloc_dma(4096, 64, AccessFlags::LOCAL_WRITE).unwrap());
    let range = dst
        .register_range(
            1024,
            512,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    assert_eq!((range.addr(), range.len()), (dst.addr() + 1024, 512));
    assert_ne!(range.rkey(), dst.rkey());
    let write = |at: u64, rkey: u32| {
        let op = SendOp::Write {
            remote_addr: at,
            rkey,
        };
        qa.post_send_bufs(&mut [SendWr::new(1, op).buf(&src, 0, 64)])
            .unwrap();
        one(&a.cq).1
    };
    assert_eq!(write(range.addr() + 448, range.rkey()), WcStatus::Success);
    assert!(
        dst.register_range(4000, 100, AccessFlags::LOCAL_WRITE)
            .is_err()
    );
    let weak = Arc::downgrade(&dst);
    drop(dst);
    assert!(weak.upgrade().is_some(), "the range keeps its buffer");
    let rkey = range.rkey();
    let past = range.addr() + 449;
    drop(range);
    assert!(weak.upgrade().is_none());
    // A dropped range's key reaches nothing (the QP fails, as RC does on an access error).
    assert_eq!(write(past, rkey), WcStatus::RemAccessErr);
}

#[test]
fn a_post_failing_half_way_gives_the_rest_their_buffers_back() {
    let (_f, _v, a, b) = fabric();
    let caps = QpCaps {
        max_send_wr: 2,
        ..QpCaps::default()
    };
    let (qa, _qb) = rc_pair(&a, &b, caps, true);
    let remote = b.pd.alloc_dma(64, 64, AccessFlags::all()).unwrap();
    let read = SendOp::Read {
        remote_addr: remote.addr(),
        rkey: remote.rkey(),
    };
    let mut wrs: Vec<SendWr> = (0..4)
        .map(|i| {
            let t = a.pd.alloc_mr(8, 8, AccessFlags::LOCAL_WRITE).unwrap();
            SendWr::new(i, read).target(t, 0, 8)
        })
        .collect();
    let e = qa.post_send_bufs(&mut wrs).unwrap_err();
    assert!(matches!(e, Error::Post { index: 2, .. }), "{e}");
    // The two posted ones hold their buffers; the two refused by the send queue have theirs.
    assert_eq!(a.ctx.posts_in_flight(), 2);
    assert_eq!(
        wrs.iter_mut()
            .map(|w| w.take_bufs().len())
            .collect::<Vec<_>>(),
        [0, 0, 1, 1]
    );
    assert_eq!(
        wrs.iter().map(|w| w.wr_id()).collect::<Vec<_>>(),
        [0, 1, 2, 3],
        "the caller's ids are left in the WRs"
    );
    let (id, _, bufs) = one(&a.cq);
    assert_eq!((id, bufs.len()), (0, 1));
}

#[test]
fn destroying_a_qp_releases_what_its_uncompleted_posts_held() {
    let (_f, _v, a, b) = fabric();
    let (_qa, qb) = rc_pair(&a, &b, QpCaps::default(), true);
    let bufs: Vec<MrBuf> = (0..3)
        .map(|_| b.pd.alloc_mr(64, 64, AccessFlags::LOCAL_WRITE).unwrap())
        .collect();
    let mut wrs: Vec<RecvWr> = bufs
        .into_iter()
        .enumerate()
        .map(|(i, m)| RecvWr::new(i as u64).buf(m, 0, 64))
        .collect();
    qb.post_recv_bufs(&mut wrs).unwrap();
    assert_eq!(b.ctx.posts_in_flight(), 3);
    drop(qb);
    assert_eq!(
        b.ctx.posts_in_flight(),
        0,
        "freed with the QP, after the NIC let go"
    );
}

/// A QP the provider refuses to destroy may still run its WRs: the buffers its posts hold and
/// the regions its slots named stay, counted as leaked. They used to be freed anyway.
#[test]
fn a_qp_that_will_not_go_keeps_what_its_posts_hold() {
    unsafe extern "C" fn refuse(_: *mut verbs_safe::sys::ibv_qp) -> i32 {
        libc::EBUSY
    }
    // Held to the end: what this test leaks is counted while no other test counts.
    let _serial = LEAKS.lock().unwrap_or_else(|e| e.into_inner());
    let f = softnic::Fabric::default();
    let ctl = softnic::ControlPath {
        destroy_qp: refuse,
        ..softnic::CONTROL
    };
    // SAFETY: softnic's control path, with a destroy_qp that fails and does nothing.
    let v = unsafe { Verbs::soft_with_control(&f, ctl) };
    let (a, b) = (Side::open(&v, "soft0"), Side::open(&v, "soft1"));
    let (_qa, qb) = rc_pair(&a, &b, QpCaps::default(), true);
    qb.post_recv_bufs(&mut [RecvWr::new(1).buf(b.pd.alloc_mr(64, 64, LW).unwrap(), 0, 64)])
        .unwrap();
    let region = Arc::new(b.pd.alloc_dma(64, 64, LW).unwrap());
    qb.pin(&region);
    let mut slot = [RecvSlot::<1>::default()];
    slot[0].sges[0] = region.sge(0, 64).unwrap();
    slot[0].wr.num_sge = 1;
    qb.post_recv_slots(&mut slot, &[0]).unwrap();
    let weak = Arc::downgrade(&region);
    drop(region);
    let before = leaks();
    drop(qb);
    assert_eq!(leaks().objects - before.objects, 1, "counted");
    assert_eq!(b.ctx.posts_in_flight(), 1, "the receive buffer is kept");
    assert!(weak.upgrade().is_some(), "the pinned region is kept");
}

#[test]
fn a_forged_tagged_wr_id_is_a_plain_completion_not_a_pointer() {
    let (f, _v, a, b) = fabric();
    let (qa, qb) = rc_pair(&a, &b, QpCaps::default(), true);
    let ctx = CompletionContext::new(&a.ctx, |_| panic!("not this one"));
    let forged = [
        WR_ID_TAG | 0xdead_beef,
        u64::MAX,
        ctx.wr_id() ^ (1 << 33), // the right slot, the wrong generation
    ];
    // SAFETY: no buffers; the contract asks for tags from CompletionContext, and this test
    // checks that breaking it still cannot reach memory through the id.
    unsafe {
        qb.post_recv(&mut [RecvWr::new(1), RecvWr::new(2), RecvWr::new(3)])
            .unwrap();
        qa.post_send(&mut forged.map(|id| SendWr::new(id, SendOp::Send)))
            .unwrap();
    }
    f.run_until_idle().unwrap();
    let mut p = Poller::new();
    let mut plain = Vec::new();
    p.poll(&a.cq, 16, |c| plain.push(c.wr_id())).unwrap();
    assert_eq!(plain, forged, "each delivered as it was, to the caller");
    drop(ctx);
}

#[test]
fn remote_memory_is_reached_by_copies() {
    let (_f, _v, _a, b) = fabric();
    let r =
        b.pd.alloc_dma(32, 8, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
    r.write_at(30, b"ok").unwrap();
    let mut out = [0u8; 4];
    r.read_at(28, &mut out).unwrap();
    assert_eq!(&out, b"\0\0ok");
    assert!(r.write_at(31, b"no").is_err(), "outside the buffer");
    assert!(r.read_at(usize::MAX, &mut out).is_err());
}

#[test]
fn a_qp_grants_peers_no_access_unless_asked() {
    let (_f, _v, a, b) = fabric();
    let (qa, qb) = (
        a.qp::<Rc>(QpCaps::default(), true),
        b.qp::<Rc>(QpCaps::default(), true),
    );
    let (ra, rb) = (remote(&a, &qa), remote(&b, &qb));
    let qa = qa
        .init(ConnInit::default())
        .unwrap()
        .rtr(RcRtr::new(rb, FROM))
        .unwrap()
        .rts(RcRts::new(0))
        .unwrap();
    let qb = qb
        .init(ConnInit::default())
        .unwrap()
        .rtr(RcRtr::new(ra, FROM))
        .unwrap()
        .rts(RcRts::new(0))
        .unwrap();
    let dst = Arc::new(
        b.pd.alloc_dma(64, 64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap(),
    );
    let src = Arc::new(a.pd.alloc_mr(8, 8, AccessFlags::LOCAL_WRITE).unwrap());
    let write = SendOp::Write {
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
    };
    qa.post_send_bufs(&mut [SendWr::new(1, write).buf(&src, 0, 8)])
        .unwrap();
    let (_, st, _) = one(&a.cq);
    assert_eq!(
        st,
        WcStatus::RemInvReqErr,
        "the region allows it, the QP does not"
    );
    let _ = qb;
}

#[test]
fn the_source_gid_index_and_the_lid_reach_the_provider() {
    let (_f, _v, a, b) = fabric();
    let (qa, qb) = (
        a.qp::<Rc>(QpCaps::default(), true),
        b.qp::<Rc>(QpCaps::default(), true),
    );
    let rb = remote(&b, &qb);
    // softnic's port has one GID: index 1 does not exist.
    let qa = qa.init(open_access()).unwrap();
    let e = qa.rtr(RcRtr::new(rb, LocalPort::new(1, 1))).unwrap_err();
    assert!(e.to_string().contains("errno 22"), "{e}");
    // A RoCE port needs a GRH: a LID-only path (InfiniBand) is refused by it.
    let lid_only = Remote {
        gid: None,
        lid: 7,
        ..rb
    };
    let e = e.qp.rtr(RcRtr::new(lid_only, FROM)).unwrap_err();
    assert!(e.to_string().contains("errno 22"), "{e}");
    assert!(e.qp.rtr(RcRtr::new(rb, FROM)).is_ok());
    assert!(
        a.pd.create_ah(FROM, 7, None).is_err(),
        "an address handle without a GID on RoCE"
    );
    assert!(a.pd.create_ah(FROM, 0, Some(b.gid)).is_ok());
}

/// An empty buffer registers (its region covers one byte of its own: the kernel refuses to
/// register none) and says it has no bytes: nothing can be read or written in it.
#[test]
fn an_empty_buffer_registers_one_byte_of_its_own_and_holds_none() {
    let (_f, _v, a, _b) = fabric();
    let mut m = a.pd.alloc_mr(0, 64, LW).unwrap();
    assert!(m.is_empty() && m.as_mut_slice().is_empty());
    let mr: &Mr = &m;
    assert_eq!(mr.len(), 1);
    let access = LW | AccessFlags::REMOTE_WRITE;
    let d = a.pd.alloc_dma(0, 64, access).unwrap();
    assert_eq!((d.len(), d.is_empty()), (0, true));
    assert!(d.write_at(0, &[1]).is_err() && d.read_at(0, &mut [0]).is_err());
    let mr: &Mr = &d;
    assert_eq!(mr.len(), 1);
    // A WR may name nothing of it, the region's byte included.
    let (qa, _qb) = rc_pair(&a, &_b, QpCaps::default(), true);
    let e = qa.post_recv_bufs(&mut [RecvWr::new(1).buf(m, 0, 1)]);
    assert!(
        e.unwrap_err()
            .to_string()
            .contains("0+1 is outside a 0-byte buffer")
    );
    let d = Arc::new(d);
    let e = qa.post_send_bufs(&mut [SendWr::new(2, SendOp::Send).dma_buf(&d, 0, 1)]);
    assert!(
        e.unwrap_err()
            .to_string()
            .contains("0+1 is outside a 0-byte buffer")
    );
}

/// An allocation the host cannot make says what made it impossible: an alignment no memory
/// has room for names the alignment, not the length. Not under Miri, which refuses an
/// alignment above its own maximum as an unsupported operation instead of failing the
/// allocation.
#[test]
#[cfg_attr(miri, ignore)]
fn an_allocation_that_fails_names_its_cause() {
    let (_f, _v, a, _b) = fabric();
    let e = a.pd.alloc_dma(4096, 1 << 40, LW).unwrap_err().to_string();
    assert!(e.contains("align") && !e.contains("len"), "{e}");
}
