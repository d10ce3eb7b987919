//! `ibv_rereg_mr`: a region's translation, PD or access changed in place (its keys stay), with
//! the return codes and errno of ibv_rereg_mr(3); refused while memory windows are bound.

use std::ffi::c_void;
use std::ptr::null_mut;

use crate::common::*;
use crate::windows::{BINDABLE, alloc_mw, bind_mw, info, unbind_info};

const TRANSLATION: i32 = IBV_REREG_MR_CHANGE_TRANSLATION as i32;
const PD: i32 = IBV_REREG_MR_CHANGE_PD as i32;
const ACCESS: i32 = IBV_REREG_MR_CHANGE_ACCESS as i32;

/// `ibv_rereg_mr`: its return code and errno (0 when it succeeded).
fn rereg(
    mr: *mut ibv_mr,
    flags: i32,
    pd: *mut ibv_pd,
    buf: Option<&mut [u8]>,
    access: u32,
) -> (i32, i32) {
    let (addr, len) = buf.map_or((null_mut(), 0), |b| {
        (b.as_mut_ptr().cast::<c_void>(), b.len())
    });
    // SAFETY: softnic checks the pointers; the memory is the test's, alive while registered.
    let r = unsafe { (CONTROL.rereg_mr)(mr, flags, pd, addr, len, access as i32) };
    let errno = if r == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    };
    (r, errno)
}

const INPUT: i32 = IBV_REREG_MR_ERR_INPUT;
const CMD: i32 = IBV_REREG_MR_ERR_CMD;

#[test]
fn access_changes_in_place() {
    let f = Fabric::default();
    let (a, qa, b, _qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    let mut src = vec![8u8; 32];
    let mut dst = vec![0u8; 32];
    let smr = a.reg(&mut src, LOCAL_WRITE);
    let dmr = b.reg(&mut dst, LOCAL_WRITE);
    let key = rkey(dmr);
    assert_eq!(rereg(dmr, ACCESS, null_mut(), None, ALL_ACCESS), (0, 0));
    assert_eq!(rkey(dmr), key, "the keys stay");
    post_send(qa, &mut [write_wr(1, &src, smr, dst.as_ptr() as u64, dmr)]).unwrap();
    assert!(ok(&poll_n(a.cq, 1)[0]));
    assert_eq!(dst, src);
    // And back: the next WRITE is refused.
    assert_eq!(rereg(dmr, ACCESS, null_mut(), None, LOCAL_WRITE), (0, 0));
    dst.fill(0);
    post_send(qa, &mut [write_wr(2, &src, smr, dst.as_ptr() as u64, dmr)]).unwrap();
    assert_eq!(
        poll_n(a.cq, 1)[0].status,
        ibv_wc_status::IBV_WC_REM_ACCESS_ERR
    );
    assert!(dst.iter().all(|&x| x == 0));
}

#[test]
fn a_new_translation_moves_what_the_keys_reach() {
    let f = Fabric::default();
    let (a, qa, b, _qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    let mut src = vec![6u8; 32];
    let mut old = vec![0u8; 32];
    let mut new = vec![0u8; 64];
    let smr = a.reg(&mut src, LOCAL_WRITE);
    let dmr = b.reg(&mut old, ALL_ACCESS);
    let key = rkey(dmr);
    assert_eq!(
        rereg(dmr, TRANSLATION, null_mut(), Some(&mut new), 0),
        (0, 0)
    );
    // SAFETY: a live MR's `ibv_mr` is readable.
    let (addr, len, lkey) = unsafe { ((*dmr).addr, (*dmr).length, (*dmr).lkey) };
    assert_eq!((addr, len, lkey), (new.as_mut_ptr().cast(), 64, key));
    post_send(
        qa,
        &mut [write_wr(1, &src, smr, new.as_ptr() as u64 + 32, dmr)],
    )
    .unwrap();
    assert!(ok(&poll_n(a.cq, 1)[0]));
    assert_eq!(new[32..], src[..]);
    // The old memory is no longer the region's.
    post_send(qa, &mut [write_wr(2, &src, smr, old.as_ptr() as u64, dmr)]).unwrap();
    assert_eq!(
        poll_n(a.cq, 1)[0].status,
        ibv_wc_status::IBV_WC_REM_ACCESS_ERR
    );
    assert!(old.iter().all(|&x| x == 0));
}

#[test]
fn a_region_moves_to_another_pd_of_its_context() {
    let f = Fabric::default();
    let (a, qa, b, _qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    let mut src = vec![2u8; 16];
    let mut dst = vec![0u8; 16];
    let smr = a.reg(&mut src, ALL_ACCESS);
    let dmr = b.reg(&mut dst, ALL_ACCESS);
    // SAFETY: a live context.
    let pd2 = unsafe { (CONTROL.alloc_pd)(b.ctx) };
    assert_eq!(rereg(dmr, PD, pd2, None, 0), (0, 0));
    // SAFETY: a live MR's `ibv_mr` is readable.
    assert_eq!(unsafe { (*dmr).pd }, pd2);
    // The responder QP is in the first PD: the region is no longer its.
    post_send(qa, &mut [write_wr(1, &src, smr, dst.as_ptr() as u64, dmr)]).unwrap();
    assert_eq!(
        poll_n(a.cq, 1)[0].status,
        ibv_wc_status::IBV_WC_REM_ACCESS_ERR
    );
    assert!(dst.iter().all(|&x| x == 0));
    // The first PD is free of it, the second is not.
    // SAFETY: softnic checks the pointers.
    unsafe {
        assert_eq!((CONTROL.dealloc_pd)(pd2), libc::EBUSY);
        assert_eq!((CONTROL.dereg_mr)(dmr), 0);
        assert_eq!((CONTROL.dealloc_pd)(pd2), 0);
    }
    // A PD of another context is refused.
    let dmr = b.reg(&mut dst, ALL_ACCESS);
    assert_eq!(rereg(dmr, PD, a.pd, None, 0), (CMD, libc::EINVAL));
    // SAFETY: a live MR's `ibv_mr` is readable.
    assert_eq!(unsafe { (*dmr).pd }, b.pd, "unchanged");
}

#[test]
fn what_ibv_rereg_mr_refuses() {
    let f = Fabric::default();
    let (_a, _qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    let mut dst = vec![0u8; 64];
    let mut other = vec![0u8; 64];
    let mr = b.reg(&mut dst, BINDABLE);
    let einval =
        |r: (i32, i32), code: i32, what: &str| assert_eq!(r, (code, libc::EINVAL), "{what}");
    // Detected before the command (libibverbs' own checks): IBV_REREG_MR_ERR_INPUT.
    einval(rereg(mr, 8, null_mut(), None, 0), INPUT, "unknown flags");
    einval(
        rereg(mr, TRANSLATION, null_mut(), None, 0),
        INPUT,
        "a translation of nothing",
    );
    einval(
        rereg(mr, TRANSLATION, null_mut(), Some(&mut other[..0]), 0),
        INPUT,
        "of length 0",
    );
    einval(
        rereg(mr, PD, b.pd, None, ALL_ACCESS),
        INPUT,
        "access without CHANGE_ACCESS",
    );
    einval(
        rereg(b.cq.cast(), ACCESS, null_mut(), None, 0),
        INPUT,
        "not a region",
    );
    // Refused by the command: IBV_REREG_MR_ERR_CMD, the region unchanged.
    einval(rereg(mr, 0, null_mut(), None, 0), CMD, "no flags");
    einval(
        rereg(mr, ACCESS, null_mut(), None, REMOTE_WRITE),
        CMD,
        "remote write without local",
    );
    einval(
        rereg(mr, ACCESS, null_mut(), None, 1 << 30),
        CMD,
        "unknown access bits",
    );
    einval(rereg(mr, PD, b.cq.cast(), None, 0), CMD, "not a PD");
    // While a window is bound: EBUSY; once it is unbound, fine.
    let mw = alloc_mw(&b, IBV_MW_TYPE_1);
    assert_eq!(bind_mw(qb, mw, 1, info(&dst, mr, 0, 64, REMOTE_READ)), 0);
    assert!(ok(&poll_n(b.cq, 1)[0]));
    assert_eq!(
        rereg(mr, ACCESS, null_mut(), None, ALL_ACCESS),
        (CMD, libc::EBUSY)
    );
    assert_eq!(
        rereg(mr, TRANSLATION, null_mut(), Some(&mut other), 0),
        (CMD, libc::EBUSY)
    );
    assert_eq!(bind_mw(qb, mw, 2, unbind_info()), 0);
    assert!(ok(&poll_n(b.cq, 1)[0]));
    let all = TRANSLATION | ACCESS;
    assert_eq!(
        rereg(mr, all, null_mut(), Some(&mut other), LOCAL_WRITE),
        (0, 0)
    );
    // SAFETY: a live MR's `ibv_mr` is readable; softnic checks the pointer.
    unsafe {
        assert_eq!(((*mr).addr, (*mr).length), (other.as_mut_ptr().cast(), 64));
        assert_eq!((CONTROL.dereg_mr)(mr), 0);
    }
}
