//! The static inline verbs of `<infiniband/verbs.h>` this library calls (`ibv_create_qp_ex`,
//! `ibv_create_srq_ex`, `ibv_open_xrcd`): libibverbs exports none of them; the helpers call
//! the op of the `struct verbs_context` in front of the context (softnic's contexts have one),
//! and so does this module, with the helpers' checks.

use std::ffi::c_int;
use std::ptr::null_mut;

use ibverbs_sys::{
    ibv_context, ibv_qp, ibv_qp_init_attr_ex, ibv_srq, ibv_srq_init_attr_ex, ibv_xrcd,
    ibv_xrcd_init_attr,
};

/// rdma-core's `offsetof(struct verbs_context, create_qp_ex)`.
const CREATE_QP_EX: usize = 264;
/// rdma-core's `offsetof(struct verbs_context, create_srq_ex)`.
const CREATE_SRQ_EX: usize = 280;
/// rdma-core's `offsetof(struct verbs_context, open_xrcd)`.
const OPEN_XRCD: usize = 288;
/// rdma-core's `offsetof(struct verbs_context, context)`.
const CONTEXT: usize = 320;

/// The op at offset `op` of the `verbs_context` in front of `ctx`, as `verbs_get_ctx_op`
/// finds it: none for a context that is not extended, one whose `sz` does not reach the op,
/// or a null op.
///
/// # Safety
///
/// `ctx` is null or a live context of libibverbs, and `F` is the type of the op at `op`.
unsafe fn op<F: Copy>(ctx: *mut ibv_context, op: usize) -> Option<F> {
    // SAFETY: a live context's `abi_compat` is readable; one whose `abi_compat` says extended
    // sits at the end of a `verbs_context`, whose words before it (`sz`, then the ops) are
    // readable, as the inline helper reads them; the caller says what type the op has.
    unsafe {
        if ctx.is_null() || (*ctx).abi_compat as usize != usize::MAX {
            return None;
        }
        let base = ctx.cast::<u8>().sub(CONTEXT);
        let sz = base.add(CONTEXT - 8).cast::<usize>().read();
        (sz >= CONTEXT + size_of::<ibv_context>() - op)
            .then(|| base.add(op).cast::<Option<F>>().read())
            .flatten()
    }
}

/// The op's result, or null with `errno` EOPNOTSUPP (the helpers' answer) when there is none.
fn or_unsupported<T>(r: Option<*mut T>) -> *mut T {
    r.unwrap_or_else(|| {
        crate::set_errno(libc::EOPNOTSUPP);
        null_mut()
    })
}

/// `ibv_create_qp_ex(ctx, attr)`.
pub(crate) fn create_qp_ex(ctx: *mut ibv_context, attr: &mut ibv_qp_init_attr_ex) -> *mut ibv_qp {
    type F = unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp;
    // SAFETY: `ctx` is an id's live context (or null); the op's type is rdma-core's.
    let f = unsafe { op::<F>(ctx, CREATE_QP_EX) };
    // SAFETY: the context's own op, with the caller's valid attributes.
    or_unsupported(f.map(|f| unsafe { f(ctx, attr) }))
}

/// `ibv_create_srq_ex(ctx, attr)`.
pub(crate) fn create_srq_ex(
    ctx: *mut ibv_context,
    attr: &mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    type F = unsafe extern "C" fn(*mut ibv_context, *mut ibv_srq_init_attr_ex) -> *mut ibv_srq;
    // SAFETY: as in `create_qp_ex`.
    let f = unsafe { op::<F>(ctx, CREATE_SRQ_EX) };
    // SAFETY: the context's own op, with the caller's valid attributes.
    or_unsupported(f.map(|f| unsafe { f(ctx, attr) }))
}

/// `ibv_open_xrcd(ctx, attr)` of a domain of its own (no file), as librdmacm opens the
/// default domain of a device.
pub(crate) fn open_own_xrcd(ctx: *mut ibv_context) -> *mut ibv_xrcd {
    type F = unsafe extern "C" fn(*mut ibv_context, *mut ibv_xrcd_init_attr) -> *mut ibv_xrcd;
    let mut attr = ibv_xrcd_init_attr {
        comp_mask: ibverbs_sys::IBV_XRCD_INIT_ATTR_FD | ibverbs_sys::IBV_XRCD_INIT_ATTR_OFLAGS,
        fd: -1,
        oflags: libc::O_CREAT as c_int,
    };
    // SAFETY: as in `create_qp_ex`.
    let f = unsafe { op::<F>(ctx, OPEN_XRCD) };
    // SAFETY: the context's own op, with valid attributes.
    or_unsupported(f.map(|f| unsafe { f(ctx, &mut attr) }))
}
