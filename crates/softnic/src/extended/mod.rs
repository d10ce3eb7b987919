//! rdma-core's extended verbs, which programs reach through the static inline helpers of
//! `<infiniband/verbs.h>` rather than through exported functions:
//!
//! - every context sits at the end of a `struct verbs_context` (this module) whose extended
//!   ops serve `ibv_query_port` (the full `ibv_port_attr`), `ibv_query_device_ex`,
//!   `ibv_create_cq_ex`, `ibv_create_qp_ex` and XRC's (`ibv_open_xrcd`, `ibv_close_xrcd`,
//!   `ibv_create_srq_ex`, `ibv_get_srq_num`: [`xrc`]); the ops softnic does not serve are null, and
//!   the helpers turn a null op into EOPNOTSUPP (`ibv_advise_mr`, `ibv_alloc_dm`, flows, ...);
//! - every CQ is an `ibv_cq_ex` ([`cq`]: `start_poll`/`next_poll`/`end_poll` and `read_*`);
//! - a QP made by `ibv_create_qp_ex` with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` is an `ibv_qp_ex`
//!   ([`qp`]: the `ibv_wr_*` builders of the new post API).
//!
//! The layouts are rdma-core's (identical from v44 to v55), checked by compile-time offset
//! asserts. `verbs_context` grows towards lower addresses and the helpers check its `sz`
//! before they use an op, so this one layout serves programs built against older headers.

mod builders;
mod cq;
mod qp;
mod xrc;

pub(crate) use xrc::close_xrcd;

pub(crate) use cq::{CqEx, ready_flag};
use qp::me;
pub use qp::qp_to_qp_ex;
pub(crate) use qp::{QpEx, release as release_qp};

use std::ffi::{c_int, c_void};

use ibverbs_sys::*;

use crate::abi::Holds;
use crate::control::CONTROL;

type QueryPort = unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int;
type QueryDeviceEx = unsafe extern "C" fn(
    *mut ibv_context,
    *const ibv_query_device_ex_input,
    *mut ibv_device_attr_ex,
    usize,
) -> c_int;
type CreateCqEx =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex;
type CreateQpEx = unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp;
type QueryRtValues = unsafe extern "C" fn(*mut ibv_context, *mut ibv_values_ex) -> c_int;
type AdviseMr = unsafe extern "C" fn(*mut ibv_pd, u32, u32, *mut ibv_sge, u32) -> c_int;
type GetSrqNum = unsafe extern "C" fn(*mut ibv_srq, *mut u32) -> c_int;
type CreateSrqEx =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_srq_init_attr_ex) -> *mut ibv_srq;
type OpenXrcd = unsafe extern "C" fn(*mut ibv_context, *mut ibv_xrcd_init_attr) -> *mut ibv_xrcd;
type CloseXrcd = unsafe extern "C" fn(*mut ibv_xrcd) -> c_int;

/// rdma-core's `struct verbs_context` (ibverbs-sys does not generate it): the extended ops,
/// then `sz`, then the `ibv_context` callers hold, which must be last. Ops softnic does not
/// serve are zero (null).
#[repr(C)]
pub(crate) struct VerbsContext {
    query_port: Option<QueryPort>,
    advise_mr: Option<AdviseMr>,
    /// `alloc_null_mr`, counters, device memory, flow actions, rate limits, parent and thread
    /// domains, `modify_cq`, `post_srq_ops`, work queues and indirection tables.
    unserved_a: [usize; 22],
    query_rt_values: Option<QueryRtValues>,
    create_cq_ex: Option<CreateCqEx>,
    /// `priv`: libibverbs' own; never read by the inline helpers.
    private: usize,
    query_device_ex: Option<QueryDeviceEx>,
    /// `ibv_destroy_flow`, a placeholder, `ibv_create_flow`, a placeholder, `open_qp`.
    unserved_b: [usize; 5],
    create_qp_ex: Option<CreateQpEx>,
    get_srq_num: Option<GetSrqNum>,
    create_srq_ex: Option<CreateSrqEx>,
    open_xrcd: Option<OpenXrcd>,
    close_xrcd: Option<CloseXrcd>,
    /// A placeholder.
    unserved_c: usize,
    /// The size of this struct: the helpers check it covers the op they want.
    sz: usize,
    context: ibv_context,
}

// Offsets from rdma-core's verbs.h (the same in v44, Debian 12's, and v55, ibverbs-sys's).
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(offset_of!(VerbsContext, advise_mr) == 8);
    assert!(offset_of!(VerbsContext, query_rt_values) == 192);
    assert!(offset_of!(VerbsContext, create_cq_ex) == 200);
    assert!(offset_of!(VerbsContext, private) == 208);
    assert!(offset_of!(VerbsContext, query_device_ex) == 216);
    assert!(offset_of!(VerbsContext, create_qp_ex) == 264);
    assert!(offset_of!(VerbsContext, get_srq_num) == 272);
    assert!(offset_of!(VerbsContext, close_xrcd) == 296);
    assert!(offset_of!(VerbsContext, sz) == 312);
    assert!(offset_of!(VerbsContext, context) == 320);
    assert!(size_of::<ibv_context>() == 328);
    assert!(size_of::<VerbsContext>() == 648);
};

// SAFETY: `VerbsContext` is `repr(C)` with an `ibv_context` field at this offset.
unsafe impl Holds<ibv_context> for VerbsContext {
    const OFFSET: usize = std::mem::offset_of!(VerbsContext, context);
}

/// rdma-core's `__VERBS_ABI_IS_EXTENDED`: `ibv_context.abi_compat` of a context inside a
/// `verbs_context`.
const ABI_IS_EXTENDED: *mut c_void = usize::MAX as *mut c_void;

impl VerbsContext {
    /// `context` inside a `verbs_context` with softnic's extended ops.
    pub(crate) fn new(context: ibv_context) -> Self {
        VerbsContext {
            query_port: Some(query_port),
            advise_mr: Some(advise_mr),
            unserved_a: [0; 22],
            query_rt_values: Some(query_rt_values),
            create_cq_ex: Some(cq::create_cq_ex),
            private: 0,
            query_device_ex: Some(query_device_ex),
            unserved_b: [0; 5],
            create_qp_ex: Some(qp::create_qp_ex),
            get_srq_num: Some(xrc::get_srq_num),
            create_srq_ex: Some(xrc::create_srq_ex),
            open_xrcd: Some(xrc::open_xrcd),
            close_xrcd: Some(xrc::close_xrcd),
            unserved_c: 0,
            sz: size_of::<VerbsContext>(),
            context: ibv_context {
                abi_compat: ABI_IS_EXTENDED,
                ..context
            },
        }
    }
}

/// Copies `src` to `dst`, which the caller sized `len` bytes: the first `len` bytes of `src`,
/// zeros after it if `len` is larger (a caller built against newer headers).
///
/// # Safety
/// `dst` is valid for writes of `len` bytes.
unsafe fn write_sized<T: Copy>(dst: *mut T, len: usize, src: &T) {
    let n = len.min(size_of::<T>());
    // SAFETY: `src` is `size_of::<T>()` readable bytes of a `Copy` struct, `dst` has room for
    // `len >= n` bytes (this function's contract), and the two cannot overlap (`src` is a
    // reference to softnic's own value).
    unsafe {
        std::ptr::copy_nonoverlapping((src as *const T).cast::<u8>(), dst.cast::<u8>(), n);
        std::ptr::write_bytes(dst.cast::<u8>().add(n), 0, len - n);
    }
}

/// `verbs_context.query_port`: the whole `ibv_port_attr` (what `ibv_query_port` reaches when
/// the context is extended), `len` bytes of it.
unsafe extern "C" fn query_port(
    context: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    if attr.is_null() {
        return libc::EINVAL;
    }
    let mut a = ibv_port_attr::default();
    // SAFETY: `a` is a writable `ibv_port_attr`; the context is checked by the verb.
    let r = unsafe { (CONTROL.query_port)(context, port, &mut a) };
    if r == 0 {
        // SAFETY: the caller gave `len` writable bytes at `attr` (the helper's contract).
        unsafe { write_sized(attr, len, &a) };
    }
    r
}

/// `verbs_context.query_device_ex`: `ibv_device_attr`, one port, completion timestamps (a
/// 64-bit counter at 1 GHz: `hca_core_clock` is in kHz), on-demand paging (explicit and
/// implicit; every operation of each transport), the other extended fields zero (no TSO, RSS,
/// tag matching, device memory).
unsafe extern "C" fn query_device_ex(
    context: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    len: usize,
) -> c_int {
    // SAFETY: `input` is null or a valid input struct (the helper's contract).
    if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
        return libc::EINVAL;
    }
    if attr.is_null() || len < size_of::<ibv_device_attr>() {
        return libc::EINVAL;
    }
    let mut a = ibv_device_attr_ex::default();
    // SAFETY: `orig_attr` is a writable `ibv_device_attr`; the context is checked by the verb.
    let r = unsafe { (CONTROL.query_device)(context, &mut a.orig_attr) };
    if r == 0 {
        a.device_cap_flags_ex =
            u64::from(a.orig_attr.device_cap_flags) | DEVICE_ATOMIC_WRITE | DEVICE_FLUSH_GLOBAL;
        a.phys_port_cnt_ex = u32::from(a.orig_attr.phys_port_cnt);
        a.completion_timestamp_mask = u64::MAX;
        a.hca_core_clock = CORE_CLOCK_KHZ;
        a.odp_caps.general_caps = u64::from(IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT);
        let (send, recv, srq) = (
            IBV_ODP_SUPPORT_SEND,
            IBV_ODP_SUPPORT_RECV,
            IBV_ODP_SUPPORT_SRQ_RECV,
        );
        let t = &mut a.odp_caps.per_transport_caps;
        t.rc_odp_caps = send
            | recv
            | srq
            | IBV_ODP_SUPPORT_WRITE
            | IBV_ODP_SUPPORT_READ
            | IBV_ODP_SUPPORT_ATOMIC;
        t.uc_odp_caps = send | recv | srq | IBV_ODP_SUPPORT_WRITE;
        t.ud_odp_caps = send | recv | srq;
        // SAFETY: the caller gave `len` writable bytes at `attr` (the helper's contract).
        unsafe { write_sized(attr, len, &a) };
    }
    r
}

/// The kernel's `IB_UVERBS_DEVICE_ATOMIC_WRITE` bit of `device_cap_flags_ex`: RDMA ATOMIC
/// WRITE is served (rxe sets it).
const DEVICE_ATOMIC_WRITE: u64 = 1 << 40;
/// The kernel's `IB_UVERBS_DEVICE_FLUSH_GLOBAL` bit: FLUSH to global visibility is served
/// (`_FLUSH_PERSISTENT`, bit 39, is not: softnic has no persistent memory).
const DEVICE_FLUSH_GLOBAL: u64 = 1 << 38;

/// The device clock's rate in kHz (`hca_core_clock`): 1 GHz, so that its ticks, the
/// completion timestamps, are the fabric's nanoseconds.
const CORE_CLOCK_KHZ: u64 = 1_000_000;

/// `verbs_context.query_rt_values` (`ibv_query_rt_values_ex`): the device clock now, in
/// `raw_clock` as mlx5 gives it (the ticks in `tv_nsec`, `tv_sec` 0) when
/// `IBV_VALUES_MASK_RAW_CLOCK` is asked; `comp_mask` says what was filled.
unsafe extern "C" fn query_rt_values(
    context: *mut ibv_context,
    values: *mut ibv_values_ex,
) -> c_int {
    if values.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: non-null, a valid `ibv_values_ex` (the helper's contract).
    let v = unsafe { &mut *values };
    let now = crate::control::try_with(context.cast(), crate::abi::Kind::Context, |_, st, _| {
        st.sync_clock();
        st.w.now
    });
    let now = match now {
        Ok(n) => n,
        Err(e) => return e,
    };
    let mut filled = 0;
    if v.comp_mask & IBV_VALUES_MASK_RAW_CLOCK != 0 {
        v.raw_clock = timespec {
            tv_sec: 0,
            tv_nsec: now as i64,
        };
        filled |= IBV_VALUES_MASK_RAW_CLOCK;
    }
    v.comp_mask = filled;
    0
}

/// `ibv_advise_mr`'s advice (`enum ibv_advise_mr_advice`) and flag.
const PREFETCH: u32 = 0;
const PREFETCH_WRITE: u32 = 1;
const PREFETCH_NO_FAULT: u32 = 2;
const ADVISE_FLAG_FLUSH: u32 = 1;

/// `verbs_context.advise_mr` (`ibv_advise_mr`): prefetches the pages of each SGE's range of a
/// region of `pd` (see `World::advise`), synchronously, so `IBV_ADVISE_MR_FLAG_FLUSH` is
/// honoured whatever it says. EINVAL for unknown flags or no SGEs, EOPNOTSUPP (ENOTSUP) for an
/// advice other than the three prefetches, EFAULT for a bad key or range or pages that cannot
/// be brought in.
unsafe extern "C" fn advise_mr(
    pd: *mut ibv_pd,
    advice: u32,
    flags: u32,
    sges: *mut ibv_sge,
    num: u32,
) -> c_int {
    if flags & !ADVISE_FLAG_FLUSH != 0 || sges.is_null() || num == 0 {
        return libc::EINVAL;
    }
    let (write, no_fault) = match advice {
        PREFETCH => (false, false),
        PREFETCH_WRITE => (true, false),
        PREFETCH_NO_FAULT => (false, true),
        _ => return libc::EOPNOTSUPP,
    };
    // SAFETY: `num` SGEs at `sges`, per the verb's contract.
    let sges = unsafe { std::slice::from_raw_parts(sges, num as usize) };
    let r = crate::control::try_with(pd.cast(), crate::abi::Kind::Pd, |_, st, pd_id| {
        let dev = st.w.contexts[&st.w.pds[&pd_id].ctx].dev;
        st.w.advise(dev, pd_id, sges, write, no_fault)
    });
    r.unwrap_or_else(|e| e)
}
