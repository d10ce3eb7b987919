//! Extended QPs: the `ibv_wr_*` work-request builders of rdma-core's new post API.
//!
//! Every QP shell is an `ibv_qp_ex`; one made by `ibv_create_qp_ex` with
//! `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` is handed out by `ibv_qp_to_qp_ex`. `wr_start` makes the
//! calling thread the QP's builder (waiting for another thread's batch, as a provider's
//! send-queue lock does), the builders ([`super::builders`]) append to a batch kept in the
//! shell, and `wr_complete` posts the whole batch with one post call, all or nothing: the
//! first error a builder met, or a WR the send queue refuses, fails it and posts none.
//! `wr_abort` drops it. Only the builder thread touches the batch: a builder called by
//! another thread (without its own `wr_start`) does nothing, and its `wr_complete` is EINVAL.
//! The batch's buffers are kept (up to a bound) for the next one, so a steady stream of
//! batches allocates only the queue's own copies.
//!
//! Inline data is copied into the batch when `wr_set_inline_data` is called, as the API
//! requires (the caller may reuse its buffer at once).

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicUsize, Ordering};

use ibverbs_sys::*;

use super::builders::{self as b, Batch};
use crate::abi::{self, Holds, Kind, set_errno};
use crate::control::try_with;
use crate::state::State;

/// The send opcodes each transport's extended QPs may be made with (`IBV_QP_EX_WITH_*`), as
/// rxe's provider has them, but for SEND_WITH_INV on UC, which has no opcode for it.
const UD_SEND_OPS: u32 = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
const UC_SEND_OPS: u32 = UD_SEND_OPS
    | IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_BIND_MW;
const RC_SEND_OPS: u32 = UC_SEND_OPS
    | IBV_QP_EX_WITH_RDMA_READ
    | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
    | IBV_QP_EX_WITH_LOCAL_INV
    | IBV_QP_EX_WITH_SEND_WITH_INV
    | IBV_QP_EX_WITH_ATOMIC_WRITE
    | IBV_QP_EX_WITH_FLUSH;

/// What a QP was made with that its builders check. Set before the QP is registered, never
/// changed.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// The `IBV_QP_EX_WITH_*` opcodes; 0 for a QP made by `ibv_create_qp`, which is not
    /// extended.
    pub(super) send_ops: u64,
    pub(super) max_sge: u32,
    pub(super) max_inline: u32,
}

/// A QP as callers see it: the `ibv_qp_ex` (whose head is the `ibv_qp`), then softnic's
/// builder state.
#[repr(C)]
pub(crate) struct QpEx {
    ex: ibv_qp_ex,
    limits: Limits,
    /// The token ([`me`]) of the thread building a batch, 0 if none.
    owner: AtomicUsize,
    /// Touched only by the thread `owner` names.
    batch: UnsafeCell<Batch>,
}

// rdma-core's layout of `ibv_qp_ex` (v44 and v55; v55 appends `wr_flush`).
const _: () = {
    use std::mem::offset_of;
    assert!(offset_of!(QpEx, ex) == 0);
    assert!(offset_of!(ibv_qp_ex, qp_base) == 0);
    assert!(offset_of!(ibv_qp_ex, wr_id) == 168);
    assert!(offset_of!(ibv_qp_ex, wr_flags) == 176);
    assert!(offset_of!(ibv_qp_ex, wr_start) == 320);
    assert!(offset_of!(ibv_qp_ex, wr_atomic_write) == 344);
};

// SAFETY: `QpEx` is `repr(C)` and starts with an `ibv_qp_ex`, which starts with its `ibv_qp`.
unsafe impl Holds<ibv_qp> for QpEx {
    const OFFSET: usize = 0;
}

impl QpEx {
    /// The shell around `qp`, made with `cap` and extended with `send_ops` (0: not extended).
    pub(crate) fn new(qp: ibv_qp, send_ops: u64, cap: &ibv_qp_cap) -> Self {
        QpEx {
            ex: ibv_qp_ex {
                qp_base: qp,
                wr_atomic_cmp_swp: Some(b::wr_atomic_cmp_swp),
                wr_atomic_fetch_add: Some(b::wr_atomic_fetch_add),
                wr_bind_mw: Some(b::wr_bind_mw),
                wr_local_inv: Some(b::wr_local_inv),
                wr_rdma_read: Some(b::wr_rdma_read),
                wr_rdma_write: Some(b::wr_rdma_write),
                wr_rdma_write_imm: Some(b::wr_rdma_write_imm),
                wr_send: Some(b::wr_send),
                wr_send_imm: Some(b::wr_send_imm),
                wr_send_inv: Some(b::wr_send_inv),
                wr_send_tso: Some(b::wr_send_tso),
                wr_set_ud_addr: Some(b::wr_set_ud_addr),
                wr_set_xrc_srqn: Some(b::wr_set_xrc_srqn),
                wr_set_inline_data: Some(b::wr_set_inline_data),
                wr_set_inline_data_list: Some(b::wr_set_inline_data_list),
                wr_set_sge: Some(b::wr_set_sge),
                wr_set_sge_list: Some(b::wr_set_sge_list),
                wr_start: Some(wr_start),
                wr_complete: Some(wr_complete),
                wr_abort: Some(wr_abort),
                wr_atomic_write: Some(b::wr_atomic_write),
                wr_flush: Some(b::wr_flush),
                ..Default::default()
            },
            limits: Limits {
                send_ops,
                max_sge: cap.max_send_sge,
                max_inline: cap.max_inline_data,
            },
            owner: AtomicUsize::new(0),
            batch: UnsafeCell::default(),
        }
    }
}

/// The calling thread's token: the address of a thread-local, distinct for live threads.
pub(super) fn me() -> usize {
    thread_local! {
        static TOKEN: u8 = const { 0 };
    }
    TOKEN.with(|t| t as *const u8 as usize)
}

/// `ibv_qp_to_qp_ex`: the extended QP of `qp`, or NULL with errno EOPNOTSUPP if it was not
/// made by `ibv_create_qp_ex` with send ops (EINVAL if it is not a live softnic QP).
///
/// # Safety
/// `qp` is any pointer: softnic refuses one it did not hand out without dereferencing it.
pub unsafe extern "C" fn qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    if abi::lookup(qp as *const c_void, Kind::Qp).is_none() {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    let shell = qp.cast::<QpEx>();
    // SAFETY: a live softnic QP's shell (never freed); `limits` never changes after the QP
    // is registered.
    if unsafe { (&raw const (*shell).limits).read() }.send_ops == 0 {
        set_errno(libc::EOPNOTSUPP);
        return null_mut();
    }
    shell.cast()
}

/// `verbs_context.create_qp_ex`: `ibv_create_qp` with a PD and, optionally, send ops (then
/// `ibv_qp_to_qp_ex` gives the builders), or an XRC target QP with its domain
/// (`IBV_QP_INIT_ATTR_XRCD`, no PD). TSO, RSS, indirection tables, source QPNs, creation
/// flags, and send ops the transport cannot carry or softnic does not serve (FLUSH on XRC, any
/// on a target, which sends nothing) are EOPNOTSUPP. Only the fields `comp_mask` names are
/// read, so a caller built against older headers, whose struct ends sooner, is served too.
pub(super) unsafe extern "C" fn create_qp_ex(
    context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    let fail = |e| {
        set_errno(e);
        null_mut()
    };
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    /// A field of the caller's struct, read alone.
    macro_rules! field {
        ($f:ident) => {
            // SAFETY: non-null, and (per the helper's contract) valid up to the fields its
            // `comp_mask` names; the fields before `comp_mask` and `pd` always exist.
            unsafe { (&raw const (*attr).$f).read() }
        };
    }
    let mask = field!(comp_mask);
    let served = IBV_QP_INIT_ATTR_PD
        | IBV_QP_INIT_ATTR_XRCD
        | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS
        | IBV_QP_INIT_ATTR_CREATE_FLAGS;
    let qp_type = field!(qp_type);
    let target = qp_type == ibv_qp_type::IBV_QPT_XRC_RECV;
    let needed = if target {
        IBV_QP_INIT_ATTR_XRCD
    } else {
        IBV_QP_INIT_ATTR_PD
    };
    if mask & needed == 0 {
        return fail(libc::EINVAL);
    }
    let creates = mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && field!(create_flags) != 0;
    if mask & !served != 0 || creates {
        return fail(libc::EOPNOTSUPP);
    }
    if target {
        if mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 {
            return fail(libc::EOPNOTSUPP);
        }
        // A target has no queues: its caps are zero.
        // SAFETY: as for `field!`; `cap` is writable (the caller learns the QP's caps).
        unsafe { (&raw mut (*attr).cap).write(ibv_qp_cap::default()) };
        return crate::control::create_target_qp(context, field!(xrcd), field!(qp_context));
    }
    let send_ops = if mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 {
        let ops = field!(send_ops_flags);
        let carried = match qp_type {
            ibv_qp_type::IBV_QPT_RC => RC_SEND_OPS,
            ibv_qp_type::IBV_QPT_UC => UC_SEND_OPS,
            // (A FLUSH's builder keeps its length where an XRC WR names its SRQ.)
            ibv_qp_type::IBV_QPT_XRC_SEND => RC_SEND_OPS & !IBV_QP_EX_WITH_FLUSH,
            _ => UD_SEND_OPS,
        };
        if ops == 0 {
            return fail(libc::EINVAL);
        }
        if ops & !u64::from(carried) != 0 {
            return fail(libc::EOPNOTSUPP);
        }
        ops
    } else {
        0
    };
    let mut cap = field!(cap);
    if send_ops != 0 && cap.max_inline_data > 0 && cap.max_send_sge == 0 {
        // Inline data travels as one SGE of the batch: room for it (a provider may give
        // more than asked).
        cap.max_send_sge = 1;
    }
    let mut init = ibv_qp_init_attr {
        qp_context: field!(qp_context),
        send_cq: field!(send_cq),
        recv_cq: field!(recv_cq),
        srq: field!(srq),
        cap,
        qp_type,
        sq_sig_all: field!(sq_sig_all),
    };
    let pd = field!(pd);
    // SAFETY: `init` is a valid init struct; the verb checks the PD and the PD's context.
    let qp = unsafe { crate::control::create_qp_with(pd, &mut init, Some(context), send_ops) };
    if !qp.is_null() {
        // SAFETY: as for `field!`; `cap` is writable (the caller learns the QP's caps).
        unsafe { (&raw mut (*attr).cap).write(init.cap) };
    }
    qp
}

/// A batch this thread is building, with what its builders read.
pub(super) struct Builder<'a> {
    pub(super) batch: &'a mut Batch,
    pub(super) limits: Limits,
    /// The caller's `ibv_qp_ex.wr_id` and `wr_flags`, for the next WR.
    pub(super) wr_id: u64,
    pub(super) wr_flags: u32,
}

/// The batch of `qp` if this thread is building one (since its `wr_start`).
///
/// # Safety
/// `qp` is a QP shell softnic made (never freed): the QP whose callback this is, as the
/// inline helpers call them (`qp->wr_x(qp, ...)`).
pub(super) unsafe fn building<'a>(qp: *mut ibv_qp_ex) -> Option<Builder<'a>> {
    let shell = qp.cast::<QpEx>();
    // SAFETY: a softnic shell, never freed; `owner` is an atomic outside the `ibv_qp` head
    // that softnic updates under its lock.
    let owner = unsafe { &(*shell).owner };
    if owner.load(Ordering::Acquire) != me() {
        return None;
    }
    // SAFETY: this thread is the builder, so nothing else touches the batch until it ends
    // it; `limits` never changes; `wr_id` and `wr_flags` are the caller's, which it sets on
    // this thread before each builder. None of these lies in the `ibv_qp` head.
    unsafe {
        Some(Builder {
            batch: &mut *(*shell).batch.get(),
            limits: (&raw const (*shell).limits).read(),
            wr_id: (&raw const (*shell).ex.wr_id).read(),
            wr_flags: (&raw const (*shell).ex.wr_flags).read(),
        })
    }
}

unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
    if abi::lookup(qp as *const c_void, Kind::Qp).is_none() {
        // Not a live softnic QP: nothing to build on. Its builders then do nothing and
        // `wr_complete` refuses it.
        return;
    }
    let shell = qp.cast::<QpEx>();
    // SAFETY: a live softnic QP's shell, never freed.
    let owner = unsafe { &(*shell).owner };
    let me = me();
    // Another thread's batch: wait for it, as a provider's send-queue lock does. This
    // thread's own unfinished batch is started again.
    while owner.load(Ordering::Relaxed) != me
        && owner
            .compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
    {
        std::thread::yield_now();
    }
    // SAFETY: this thread is now the builder.
    if let Some(b) = unsafe { building(qp) } {
        b.batch.clear();
    }
}

/// Ends this thread's batch on `qp`: clears it and gives up the builder's place.
///
/// # Safety
/// As for [`building`].
unsafe fn end(qp: *mut ibv_qp_ex) {
    // SAFETY: passed on from the caller.
    if let Some(b) = unsafe { building(qp) } {
        b.batch.clear();
        // SAFETY: as for `building`.
        unsafe { (*qp.cast::<QpEx>()).owner.store(0, Ordering::Release) };
    }
}

unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    if abi::lookup(qp as *const c_void, Kind::Qp).is_some() {
        // SAFETY: a live softnic QP.
        unsafe { end(qp) }
    }
}

unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    if abi::lookup(qp as *const c_void, Kind::Qp).is_none() {
        return libc::EINVAL;
    }
    // SAFETY: a live softnic QP.
    let Some(b) = (unsafe { building(qp) }) else {
        // No batch of this thread's (no `wr_start`).
        return libc::EINVAL;
    };
    // A batch a builder failed is dropped unlinked; an empty one posts nothing.
    let chain = if b.batch.error == 0 {
        b.batch.link()
    } else {
        null_mut()
    };
    let r = if chain.is_null() {
        b.batch.error
    } else {
        let r = try_with(qp as *const c_void, Kind::Qp, |shared, st, id| {
            let State { qps, w, .. } = st;
            let q = qps.get_mut(&id).ok_or(libc::EINVAL)?;
            // SAFETY: the chain's WRs, SGE lists and inline data live in the batch,
            // untouched until this call returns; the SGEs name the caller's memory.
            let r = unsafe { q.post_batch(w, chain) };
            st.progress_after_post();
            shared.posted_at(st.w.now);
            r
        });
        match r {
            Ok(Ok(())) => 0,
            Ok(Err(e)) | Err(e) => e,
        }
    };
    // SAFETY: as above.
    unsafe { end(qp) };
    r
}

/// Frees the batch buffers of a QP being destroyed (its shell stays, never freed), unless a
/// thread is building on it.
///
/// # Safety
/// `qp` is a QP shell softnic made.
pub(crate) unsafe fn release(qp: *mut ibv_qp) {
    let shell = qp.cast::<QpEx>();
    // SAFETY: a softnic shell, never freed.
    let owner = unsafe { &(*shell).owner };
    let me = me();
    if owner
        .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
        .is_ok()
    {
        // SAFETY: this thread is now the only one touching the batch.
        unsafe { *(*shell).batch.get() = Batch::default() };
        owner.store(0, Ordering::Release);
    }
}
