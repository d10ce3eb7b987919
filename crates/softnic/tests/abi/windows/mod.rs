//! Memory windows through the C ABI, as a libibverbs program uses them: `ibv_alloc_mw`,
//! `ibv_bind_mw` and `ibv_dealloc_mw` through `ibv_context.ops` (where rdma-core's inlines call
//! them), binds and invalidations as work requests through `ops.post_send`. Type 1 windows
//! ([`type1`]), type 2 windows and invalidation ([`type2`]), what rxe refuses ([`refused`]),
//! and the same over the UDP link ([`udp`]). This module holds the helpers and the device's
//! and the objects' own tests.

mod refused;
mod type1;
mod type2;
mod udp;

pub(crate) use std::ptr::null_mut;

pub(crate) use crate::common::*;
/// `IBV_WC_WITH_INV`: a receive completion's `imm_data` is the rkey it invalidated.
pub(crate) const WITH_INV: u32 = ibv_wc_flags::IBV_WC_WITH_INV.0;
pub(crate) const WITH_IMM: u32 = ibv_wc_flags::IBV_WC_WITH_IMM.0;
pub(crate) use ibv_wc_opcode::{
    IBV_WC_BIND_MW, IBV_WC_COMP_SWAP, IBV_WC_LOCAL_INV, IBV_WC_RDMA_READ, IBV_WC_RDMA_WRITE,
    IBV_WC_RECV, IBV_WC_SEND,
};
pub(crate) use ibv_wc_status::{
    IBV_WC_LOC_PROT_ERR, IBV_WC_LOC_QP_OP_ERR, IBV_WC_MW_BIND_ERR, IBV_WC_REM_ACCESS_ERR,
    IBV_WC_REM_INV_REQ_ERR, IBV_WC_SUCCESS, IBV_WC_WR_FLUSH_ERR,
};

pub(crate) const MW_BIND: u32 = ibv_access_flags::IBV_ACCESS_MW_BIND.0;
pub(crate) const REMOTE_ATOMIC: u32 = ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;
/// What a region windows are bound to is registered with.
pub(crate) const BINDABLE: u32 = ALL_ACCESS | MW_BIND;

/// `ibv_alloc_mw` through `pd`'s context's ops: the window or the errno.
pub(crate) fn try_alloc_mw(pd: *mut ibv_pd, ty: ibv_mw_type) -> Result<*mut ibv_mw, i32> {
    // SAFETY: a live PD's `ibv_pd` is readable; softnic checks the PD.
    let alloc = unsafe { ops((*pd).context).alloc_mw.expect("ops.alloc_mw is set") };
    // SAFETY: as above.
    let mw = unsafe { alloc(pd, ty) };
    if mw.is_null() {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(mw)
    }
}

/// A window of type `ty` in `n`'s PD.
pub(crate) fn alloc_mw(n: &Node, ty: ibv_mw_type) -> *mut ibv_mw {
    try_alloc_mw(n.pd, ty).expect("alloc_mw")
}

/// `ibv_dealloc_mw` through `ctx`'s ops.
pub(crate) fn dealloc_mw(ctx: *mut ibv_context, mw: *mut ibv_mw) -> i32 {
    // SAFETY: softnic checks the window.
    unsafe { ops(ctx).dealloc_mw.expect("ops.dealloc_mw is set")(mw) }
}

/// The window's key as its `ibv_mw` says.
pub(crate) fn mw_rkey(mw: *mut ibv_mw) -> u32 {
    // SAFETY: a live window's `ibv_mw` is readable.
    unsafe { (*mw).rkey }
}

/// rdma-core's `ibv_inc_rkey`: the next tag, the same index.
pub(crate) fn inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

/// What a bind binds: `len` bytes of `buf` from `offset` (in `mr`), with `access`.
pub(crate) fn info(
    buf: &[u8],
    mr: *mut ibv_mr,
    offset: usize,
    len: usize,
    access: u32,
) -> ibv_mw_bind_info {
    ibv_mw_bind_info {
        mr,
        addr: buf.as_ptr() as u64 + offset as u64,
        length: len as u64,
        mw_access_flags: access,
    }
}

/// An unbind (a bind of length 0, no region).
pub(crate) fn unbind_info() -> ibv_mw_bind_info {
    ibv_mw_bind_info {
        mr: null_mut(),
        addr: 0,
        length: 0,
        mw_access_flags: 0,
    }
}

/// `ibv_bind_mw` of a type 1 window through `qp`'s context's ops (signaled): 0 or the errno.
pub(crate) fn bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    wr_id: u64,
    bind_info: ibv_mw_bind_info,
) -> i32 {
    let mut b = ibv_mw_bind {
        wr_id,
        send_flags: SIGNALED,
        bind_info,
    };
    // SAFETY: a live QP's `ibv_qp` is readable; softnic checks the QP and the window.
    unsafe { ops((*qp).context).bind_mw.expect("ops.bind_mw is set")(qp, mw, &mut b) }
}

/// A signaled IBV_WR_BIND_MW of `mw` with the new key `rkey`.
pub(crate) fn bind_wr(
    wr_id: u64,
    mw: *mut ibv_mw,
    rkey: u32,
    bind_info: ibv_mw_bind_info,
) -> ibv_send_wr {
    let mut wr = send_wr(wr_id, ibv_wr_opcode::IBV_WR_BIND_MW, &[], SIGNALED);
    wr.__bindgen_anon_2.bind_mw = ibv_send_wr__bindgen_ty_4__bindgen_ty_1 {
        mw,
        rkey,
        bind_info,
    };
    wr
}

/// A signaled IBV_WR_LOCAL_INV of `rkey`.
pub(crate) fn local_inv_wr(wr_id: u64, rkey: u32) -> ibv_send_wr {
    let mut wr = send_wr(wr_id, ibv_wr_opcode::IBV_WR_LOCAL_INV, &[], SIGNALED);
    wr.__bindgen_anon_1.invalidate_rkey = rkey;
    wr
}

/// A signaled IBV_WR_SEND_WITH_INV of `sges` that invalidates `rkey` at the responder.
pub(crate) fn send_inv_wr(wr_id: u64, sges: &[ibv_sge], rkey: u32) -> ibv_send_wr {
    let mut wr = send_wr(wr_id, ibv_wr_opcode::IBV_WR_SEND_WITH_INV, sges, SIGNALED);
    wr.__bindgen_anon_1.invalidate_rkey = rkey;
    wr
}

/// A signaled RDMA WRITE of `src` (in `smr`) to `addr` under `rkey`.
pub(crate) fn write_key(
    wr_id: u64,
    src: &[u8],
    smr: *mut ibv_mr,
    addr: u64,
    rkey: u32,
) -> ibv_send_wr {
    let op = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
    with_rdma(send_wr(wr_id, op, &[sge(src, smr)], SIGNALED), addr, rkey)
}

/// A signaled RDMA READ into `dst` (in `dmr`) from `addr` under `rkey`.
pub(crate) fn read_key(
    wr_id: u64,
    dst: &[u8],
    dmr: *mut ibv_mr,
    addr: u64,
    rkey: u32,
) -> ibv_send_wr {
    let op = ibv_wr_opcode::IBV_WR_RDMA_READ;
    with_rdma(send_wr(wr_id, op, &[sge(dst, dmr)], SIGNALED), addr, rkey)
}

/// Posts one WR on `qp` and polls its one completion from `cq`.
pub(crate) fn run(qp: *mut ibv_qp, cq: *mut ibv_cq, wr: ibv_send_wr) -> Wc {
    post_send(qp, &mut [wr]).expect("post_send");
    let got = poll_n(cq, 1);
    assert_eq!(got.len(), 1, "no completion");
    got[0]
}

/// Another connected QP pair of type `ty` between `a` and `b` (their PDs and CQs).
pub(crate) fn connect(a: &Node, b: &Node, ty: ibv_qp_type::Type) -> (*mut ibv_qp, *mut ibv_qp) {
    let qa = a.qp(ty, cap(16, 16), true);
    let qb = b.qp(ty, cap(16, 16), true);
    bring_up(qa, ty, b.gid, qpn(qb), |_| {});
    bring_up(qb, ty, a.gid, qpn(qa), |_| {});
    (qa, qb)
}

/// `(status, opcode)` of a completion.
pub(crate) fn st(wc: &Wc) -> (u32, u32) {
    (wc.status, wc.opcode)
}

#[test]
fn the_device_says_it_has_type_1_and_2b_windows() {
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    let mut attr = ibv_device_attr::default();
    // SAFETY: a live context and a writable out-struct.
    assert_eq!(unsafe { (CONTROL.query_device)(a.ctx, &mut attr) }, 0);
    assert!(attr.max_mw > 0);
    let flags = IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
    assert_eq!(attr.device_cap_flags & flags, flags);
    let ops = ops(a.ctx);
    assert!(ops.alloc_mw.is_some() && ops.bind_mw.is_some() && ops.dealloc_mw.is_some());
}

#[test]
fn windows_are_objects_of_their_pd() {
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    let w1 = alloc_mw(&a, IBV_MW_TYPE_1);
    let w2 = alloc_mw(&a, IBV_MW_TYPE_2);
    // SAFETY: live windows' `ibv_mw`s are readable.
    unsafe {
        assert_eq!(
            ((*w1).context, (*w1).pd, (*w1).type_),
            (a.ctx, a.pd, IBV_MW_TYPE_1)
        );
        assert_eq!((*w2).type_, IBV_MW_TYPE_2);
    }
    assert_ne!(
        mw_rkey(w1) >> 8,
        mw_rkey(w2) >> 8,
        "each window has its own index"
    );
    assert_eq!(try_alloc_mw(a.pd, 3), Err(libc::EINVAL), "no type 3");
    // SAFETY: softnic checks the PD: null.
    assert!(unsafe { ops(a.ctx).alloc_mw.unwrap()(null_mut(), IBV_MW_TYPE_1) }.is_null());
    // The PD and the context are in use while windows are.
    // SAFETY: softnic checks the pointers.
    unsafe {
        assert_eq!((CONTROL.dealloc_pd)(a.pd), libc::EBUSY);
        assert_eq!((CONTROL.close_device)(a.ctx), libc::EBUSY);
    }
    assert_eq!(dealloc_mw(a.ctx, w1), 0);
    assert_eq!(dealloc_mw(a.ctx, w1), libc::EINVAL, "already deallocated");
    assert_eq!(dealloc_mw(a.ctx, a.pd.cast()), libc::EINVAL, "not a window");
    assert_eq!(dealloc_mw(a.ctx, w2), 0);
}

#[test]
fn closing_a_device_frees_its_windows_before_their_regions() {
    let f = Fabric::default();
    let (a, _qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    let mut buf = vec![0u8; 64];
    let mr = b.reg(&mut buf, BINDABLE);
    let w1 = alloc_mw(&b, IBV_MW_TYPE_1);
    assert_eq!(bind_mw(qb, w1, 1, info(&buf, mr, 0, 64, REMOTE_WRITE)), 0);
    let w2 = alloc_mw(&b, IBV_MW_TYPE_2);
    let bind = bind_wr(
        2,
        w2,
        inc_rkey(mw_rkey(w2)),
        info(&buf, mr, 0, 8, REMOTE_READ),
    );
    post_send(qb, &mut [bind]).unwrap();
    assert!(poll_n(b.cq, 2).iter().all(ok));
    // SAFETY: the contexts' objects are not used again.
    unsafe {
        assert_eq!(softnic::release_device(b.ctx), 0);
        assert_eq!(softnic::release_device(a.ctx), 0);
    }
}
