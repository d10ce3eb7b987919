//! Memory windows ([`Mw`], [`Qp::bind_mw`]): a key over part of a buffer, moved by bind work
//! requests. Every buffer a window's keys may still reach at the NIC stays alive: the target of
//! the last bind seen to succeed, and the targets of binds that failed, were flushed or were
//! dropped by a reset since, until a later bind succeeds or the window is deallocated.

use std::sync::{Arc, Weak};

use crate::setup::*;

const BINDABLE: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::MW_BIND);

fn bindable(s: &Side, len: usize) -> (Arc<DmaBuf>, Weak<DmaBuf>) {
    let b = Arc::new(s.pd.alloc_dma(len, 64, BINDABLE).unwrap());
    let w = Arc::downgrade(&b);
    (b, w)
}

/// `qp` (on `side`) WRITEs `data` to `remote_addr` through `rkey`; the WRITE's status.
fn write_through<S: CanPostSend>(
    side: &Side,
    qp: &Qp<Rc, S>,
    remote_addr: u64,
    rkey: u32,
    data: &[u8],
) -> WcStatus {
    let mut src = side
        .pd
        .alloc_mr(data.len(), 64, AccessFlags::LOCAL_WRITE)
        .unwrap();
    src.as_mut_slice().copy_from_slice(data);
    let op = SendOp::Write { remote_addr, rkey };
    qp.post_send_bufs(&mut [SendWr::new(77, op).buf(&Arc::new(src), 0, data.len() as u32)])
        .unwrap();
    let done = drain(&side.cq, 1);
    assert_eq!(done[0].wr_id, 77, "{done:?}");
    done[0].status
}

/// The completion of bind `wr_id` on `side`'s CQ.
fn bind_done(side: &Side, wr_id: u64) -> Done {
    let done = drain(&side.cq, 1);
    assert_eq!(done.len(), 1, "no bind completion");
    assert_eq!(done[0].wr_id, wr_id, "{done:?}");
    done[0]
}

fn bytes(buf: &DmaBuf, at: usize, n: usize) -> Vec<u8> {
    let mut v = vec![0; n];
    buf.read_at(at, &mut v).unwrap();
    v
}

/// Bind, write through the key, rebind, unbind: each key reaches its range while it is the
/// window's, the buffer a window left goes once the bind that moved it succeeded, and an
/// unbound window reaches nothing.
#[test]
fn a_window_reaches_its_range_while_bound_and_lets_go_of_what_it_left() {
    let (_f, _v, a, b) = fabric();
    let (qa, qb) = rc_pair(&a, &b, QpCaps::default(), true);
    let ((x, wx), (y, wy)) = (bindable(&a, 4096), bindable(&a, 4096));
    let mw = a.pd.alloc_mw().unwrap();
    assert!(!mw.is_bound());
    let k1 = qa
        .bind_mw(&mw, 1, Some((&x, 64, 128)), AccessFlags::REMOTE_WRITE)
        .unwrap();
    let done = bind_done(&a, 1);
    assert_eq!(
        (done.status, done.opcode),
        (WcStatus::Success, Some(WcOpcode::BindMw))
    );
    assert_eq!(mw.rkey(), k1);
    assert!(mw.is_bound());
    let msg = b"through the window";
    assert_eq!(
        write_through(&b, &qb, x.addr() + 64, k1, msg),
        WcStatus::Success
    );
    assert_eq!(bytes(&x, 64, msg.len()), msg);
    drop(x);
    assert!(wx.upgrade().is_some(), "the window reaches it");

    let k2 = qa
        .bind_mw(&mw, 2, Some((&y, 0, 4096)), AccessFlags::REMOTE_WRITE)
        .unwrap();
    assert_ne!(k2, k1);
    assert!(
        wx.upgrade().is_some(),
        "reachable until the rebind is seen to succeed"
    );
    assert_eq!(bind_done(&a, 2).status, WcStatus::Success);
    assert!(wx.upgrade().is_none(), "let go once the window moved");
    assert_eq!(mw.rkey(), k2);
    assert_eq!(
        write_through(&b, &qb, y.addr() + 4000, k2, msg),
        WcStatus::Success
    );
    assert_eq!(bytes(&y, 4000, msg.len()), msg);
    drop(y);

    qa.bind_mw(&mw, 3, None, AccessFlags::empty()).unwrap();
    assert!(wy.upgrade().is_some());
    assert_eq!(bind_done(&a, 3).status, WcStatus::Success);
    assert!(!mw.is_bound());
    assert!(wy.upgrade().is_none(), "an unbound window keeps nothing");
    // The last key reaches nothing now (and the peer's QP breaks on it).
    let dead = write_through(&b, &qb, 0, mw.rkey(), msg);
    assert_eq!(dead, WcStatus::RemAccessErr);
}

/// A rebind that never ran (flushed: the QP was in ERROR) leaves the window where it was: the
/// old key still reaches the old buffer, which must stay alive (it used to be dropped with the
/// flushed completion while a peer could still write it), and `rkey` reports that key. Dropping
/// the window lets go of both buffers, with nothing leaked.
#[test]
fn a_flushed_rebind_keeps_the_buffer_the_window_still_reaches() {
    let (_f, _v, a, b) = fabric();
    let (qa, _qb) = rc_pair(&a, &b, QpCaps::default(), true);
    let (qa2, qb2) = rc_pair(&a, &b, QpCaps::default(), true);
    let ((x, wx), (y, wy)) = (bindable(&a, 4096), bindable(&a, 4096));
    let mw = a.pd.alloc_mw().unwrap();
    let k1 = qa
        .bind_mw(&mw, 1, Some((&x, 0, 4096)), AccessFlags::REMOTE_WRITE)
        .unwrap();
    assert_eq!(bind_done(&a, 1).status, WcStatus::Success);
    drop(x);
    // A WRITE through a bad key drives the binding QP into ERROR.
    assert_ne!(
        write_through(&a, &qa, 0x1000, 0xdead_0000, b"x"),
        WcStatus::Success
    );
    let k2 = qa
        .bind_mw(&mw, 2, Some((&y, 0, 4096)), AccessFlags::REMOTE_WRITE)
        .unwrap();
    assert_ne!(k2, k1);
    drop(y);
    assert_eq!(bind_done(&a, 2).status, WcStatus::WrFlushErr);
    assert!(wx.upgrade().is_some(), "the window still reaches it");
    assert_eq!(mw.rkey(), k1, "the key that is valid");
    assert!(mw.is_bound());
    // A peer writes through the old key (over another connection: `qa` is in ERROR).
    let x = wx.upgrade().unwrap();
    let msg = b"old key, old buffer";
    assert_eq!(
        write_through(&b, &qb2, x.addr() + 8, k1, msg),
        WcStatus::Success
    );
    assert_eq!(bytes(&x, 8, msg.len()), msg);
    drop(x);
    // The new key never took.
    let y_addr = wy.upgrade().map(|y| y.addr());
    if let Some(addr) = y_addr {
        assert_eq!(
            write_through(&b, &qb2, addr, k2, b"no"),
            WcStatus::RemAccessErr
        );
    }
    let _serial = LEAKS.lock().unwrap_or_else(|e| e.into_inner());
    let before = leaks();
    drop(mw);
    assert!(wx.upgrade().is_none(), "released with the window");
    assert!(wy.upgrade().is_none(), "released with the window");
    assert_eq!(leaks(), before, "nothing leaked");
    drop((qa, qa2));
}

/// A bind the NIC refuses (MW_BIND_ERR: a region without MW_BIND access) changes nothing: the
/// window keeps its key and its buffer, and the refused target is let go with the window.
#[test]
fn a_refused_bind_changes_nothing() {
    let (_f, _v, a, b) = fabric();
    let (qa, _qb) = rc_pair(&a, &b, QpCaps::default(), true);
    let (qa2, qb2) = rc_pair(&a, &b, QpCaps::default(), true);
    let (x, wx) = bindable(&a, 4096);
    let plain = Arc::new(a.pd.alloc_dma(4096, 64, AccessFlags::LOCAL_WRITE).unwrap());
    let wp = Arc::downgrade(&plain);
    let mw = a.pd.alloc_mw().unwrap();
    let k1 = qa
        .bind_mw(&mw, 1, Some((&x, 0, 4096)), AccessFlags::REMOTE_WRITE)
        .unwrap();
    assert_eq!(bind_done(&a, 1).status, WcStatus::Success);
    drop(x);
    qa.bind_mw(&mw, 2, Some((&plain, 0, 64)), AccessFlags::REMOTE_WRITE)
        .unwrap();
    drop(plain);
    assert_eq!(bind_done(&a, 2).status, WcStatus::MwBindErr);
    assert_eq!(mw.rkey(), k1);
    assert!(mw.is_bound());
    let x = wx.upgrade().expect("the window still reaches it");
    assert_eq!(
        write_through(&b, &qb2, x.addr(), k1, b"still"),
        WcStatus::Success
    );
    assert_eq!(bytes(&x, 0, 5), b"still");
    drop(x);
    let _serial = LEAKS.lock().unwrap_or_else(|e| e.into_inner());
    let before = leaks();
    drop(mw);
    assert!(wx.upgrade().is_none() && wp.upgrade().is_none());
    assert_eq!(leaks(), before, "nothing leaked");
    drop((qa, qa2));
}

/// While a bind of a window is in flight on one QP, another QP may not bind it (the two could
/// run in either order): refused, naming both QPs. Once the completion is polled, it may.
#[test]
fn a_window_with_a_bind_in_flight_binds_on_that_qp_only() {
    let (_f, _v, a, b) = fabric();
    let (qa, _qb) = rc_pair(&a, &b, QpCaps::default(), true);
    let (qa2, _qb2) = rc_pair(&a, &b, QpCaps::default(), true);
    let (x, _) = bindable(&a, 4096);
    let mw = a.pd.alloc_mw().unwrap();
    qa.bind_mw(&mw, 1, Some((&x, 0, 64)), AccessFlags::REMOTE_WRITE)
        .unwrap();
    let e = qa2
        .bind_mw(&mw, 2, Some((&x, 64, 64)), AccessFlags::REMOTE_WRITE)
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("in flight on QP {:#x}", qa.qpn()))
            && msg.contains(&format!("{:#x}", qa2.qpn())),
        "{msg}"
    );
    assert_eq!(bind_done(&a, 1).status, WcStatus::Success);
    let k = qa2
        .bind_mw(&mw, 2, Some((&x, 64, 64)), AccessFlags::REMOTE_WRITE)
        .unwrap();
    assert_eq!(bind_done(&a, 2).status, WcStatus::Success);
    assert_eq!(mw.rkey(), k);
}

/// A reset drops a bind's completion: whether it ran is unknown, so the window keeps both
/// buffers until a later bind succeeds.
#[test]
fn a_bind_dropped_by_a_reset_keeps_both_buffers_until_a_bind_succeeds() {
    let (_f, _v, a, b) = fabric();
    let (qa, _qb) = rc_pair(&a, &b, QpCaps::default(), true);
    let (qa2, _qb2) = rc_pair(&a, &b, QpCaps::default(), true);
    let ((x, wx), (y, wy), (z, wz)) = (bindable(&a, 4096), bindable(&a, 4096), bindable(&a, 4096));
    let mw = a.pd.alloc_mw().unwrap();
    qa.bind_mw(&mw, 1, Some((&x, 0, 64)), AccessFlags::REMOTE_WRITE)
        .unwrap();
    assert_eq!(bind_done(&a, 1).status, WcStatus::Success);
    qa.bind_mw(&mw, 2, Some((&y, 0, 64)), AccessFlags::REMOTE_WRITE)
        .unwrap();
    drop((x, y));
    let qa = qa.reset().unwrap();
    assert!(
        wx.upgrade().is_some() && wy.upgrade().is_some(),
        "either may be reached"
    );
    // Its completion (if it was queued) is a plain one now.
    drain(&a.cq, 1);
    assert!(wx.upgrade().is_some() && wy.upgrade().is_some());
    qa2.bind_mw(&mw, 3, Some((&z, 0, 64)), AccessFlags::REMOTE_WRITE)
        .unwrap();
    assert_eq!(bind_done(&a, 3).status, WcStatus::Success);
    assert!(
        wx.upgrade().is_none() && wy.upgrade().is_none(),
        "the window moved on"
    );
    drop((z, mw));
    assert!(wz.upgrade().is_none());
    drop(qa);
}

/// A window may span 4 GiB or more (`ibv_mw_bind_info.length` is 64-bit): a peer writes past
/// the first 4 GiB through it. (It used to be refused as "outside the buffer".) The buffer's
/// 4 GiB are calloc'd (alignment 16), so untouched pages cost nothing; not under Miri, which
/// would hold them all.
#[test]
#[cfg_attr(miri, ignore)]
fn a_window_may_span_four_gib_or_more() {
    let (_f, _v, a, b) = fabric();
    let (qa, qb) = rc_pair(&a, &b, QpCaps::default(), true);
    let len = (4 << 30) + 4096;
    let x = Arc::new(a.pd.alloc_dma(len, 16, BINDABLE).unwrap());
    let mw = a.pd.alloc_mw().unwrap();
    let k = qa
        .bind_mw(&mw, 1, Some((&x, 0, len)), AccessFlags::REMOTE_WRITE)
        .unwrap();
    assert_eq!(bind_done(&a, 1).status, WcStatus::Success);
    let at = len - 100;
    assert_eq!(
        write_through(&b, &qb, x.addr() + at as u64, k, b"far"),
        WcStatus::Success
    );
    assert_eq!(bytes(&x, at, 3), b"far");
    // A range past the end is still refused, naming it.
    let e = qa
        .bind_mw(&mw, 2, Some((&x, 4096, len)), AccessFlags::REMOTE_WRITE)
        .unwrap_err();
    assert!(e.to_string().contains("outside the buffer"), "{e}");
}
