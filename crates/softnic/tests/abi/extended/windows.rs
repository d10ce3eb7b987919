//! Memory windows through the extended post API: `ibv_wr_bind_mw`, `ibv_wr_local_inv` and
//! `ibv_wr_send_inv`, and the device's window capabilities as `ibv_query_device_ex` reports
//! them.

use super::*;
use crate::windows::{
    BINDABLE, IBV_WC_BIND_MW, IBV_WC_LOCAL_INV, IBV_WC_RECV, IBV_WC_REM_ACCESS_ERR, WITH_INV,
    alloc_mw, bind_wr, inc_rkey, info, mw_rkey, write_key,
};

type QueryDeviceEx = unsafe extern "C" fn(
    *mut ibv_context,
    *const ibv_query_device_ex_input,
    *mut ibv_device_attr_ex,
    usize,
) -> c_int;

#[test]
fn query_device_ex_reports_type_1_and_2b_windows() {
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    let q: QueryDeviceEx = vctx_op(a.ctx, 216);
    let mut attr = ibv_device_attr_ex::default();
    let size = size_of_val(&attr);
    // SAFETY: a live context and a writable struct of the size given.
    let r = unsafe { q(a.ctx, std::ptr::null(), &mut attr, size) };
    assert_eq!(r, 0);
    let flags = u64::from(IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B);
    assert_eq!(attr.device_cap_flags_ex & flags, flags);
    assert!(attr.orig_attr.max_mw > 0);
}

#[test]
fn builders_bind_invalidate_and_send_with_invalidate() {
    let f = Fabric::default();
    let ops = ALL_SEND_OPS
        | u64::from(
            IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_SEND_WITH_INV,
        );
    let p = ex_pair(&f, ops);
    let x = p.xa;
    let mut mine = vec![0u8; 128];
    let mut theirs = vec![0u8; 64];
    let mut inbox = vec![0u8; 64];
    let mut src: Vec<u8> = (1..=64).collect();
    let mmr = p.a.reg(&mut mine, BINDABLE);
    let tmr = p.b.reg(&mut theirs, BINDABLE);
    let imr = p.b.reg(&mut inbox, ALL_ACCESS);
    let smr = p.b.reg(&mut src, ALL_ACCESS);
    let asrc = p.a.reg(&mut src, ALL_ACCESS);

    // `a` binds a type 2 window over its own memory with ibv_wr_bind_mw.
    let mw = alloc_mw(&p.a, IBV_MW_TYPE_2);
    let key = inc_rkey(mw_rkey(mw));
    let bind = info(&mine, mmr, 64, 64, REMOTE_WRITE);
    wr!(x, wr_start);
    next_wr(x, 1, SIGNALED);
    wr!(x, wr_bind_mw, mw, key, &bind);
    assert_eq!(wr!(x, wr_complete), 0);
    let c = poll_ex(p.cqa, 1);
    assert_eq!(
        (c[0].wr_id, c[0].status, c[0].opcode),
        (1, 0, IBV_WC_BIND_MW)
    );
    // `b` writes through it.
    let addr = mine.as_ptr() as u64 + 64;
    post_send(p.qb, &mut [write_key(2, &src, smr, addr, key)]).unwrap();
    assert_eq!(poll_ex(p.cqb, 1)[0].status, 0);
    assert_eq!(mine[64..], src[..]);

    // `b` binds one of its own; `a` invalidates it with ibv_wr_send_inv.
    let theirs_mw = alloc_mw(&p.b, IBV_MW_TYPE_2);
    let tkey = inc_rkey(mw_rkey(theirs_mw));
    let tbind = info(&theirs, tmr, 0, 64, REMOTE_WRITE);
    post_send(p.qb, &mut [bind_wr(3, theirs_mw, tkey, tbind)]).unwrap();
    assert_eq!(poll_ex(p.cqb, 1)[0].opcode, IBV_WC_BIND_MW);
    post_recv(p.qb, &mut [recv_wr(4, &[sge(&inbox, imr)])]).unwrap();
    wr!(x, wr_start);
    next_wr(x, 5, SIGNALED);
    wr!(x, wr_send_inv, tkey);
    wr!(x, wr_set_sge, rkey_l(asrc), src.as_ptr() as u64, 16);
    assert_eq!(wr!(x, wr_complete), 0);
    assert_eq!(poll_ex(p.cqa, 1)[0].status, 0);
    let r = poll_ex(p.cqb, 1)[0];
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.byte_len),
        (4, 0, IBV_WC_RECV, 16)
    );
    assert_eq!((r.flags & WITH_INV, r.imm), (WITH_INV, tkey));

    // `a` invalidates its own with ibv_wr_local_inv; `b`'s next write through it fails.
    wr!(x, wr_start);
    next_wr(x, 6, SIGNALED);
    wr!(x, wr_local_inv, key);
    assert_eq!(wr!(x, wr_complete), 0);
    let c = poll_ex(p.cqa, 1);
    assert_eq!(
        (c[0].wr_id, c[0].status, c[0].opcode),
        (6, 0, IBV_WC_LOCAL_INV)
    );
    mine.fill(0);
    post_send(p.qb, &mut [write_key(7, &src, smr, addr, key)]).unwrap();
    assert_eq!(poll_ex(p.cqb, 1)[0].status, IBV_WC_REM_ACCESS_ERR);
    assert!(mine.iter().all(|&v| v == 0));

    // No bind information: the batch fails, nothing posted.
    wr!(x, wr_start);
    wr!(x, wr_bind_mw, mw, key, std::ptr::null());
    assert_eq!(wr!(x, wr_complete), libc::EINVAL);
}
