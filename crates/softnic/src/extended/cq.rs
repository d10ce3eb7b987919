//! Extended CQs: every softnic CQ is an `ibv_cq_ex`, so `ibv_cq_ex_to_cq` and
//! `ibv_poll_cq` work on one made by `ibv_create_cq_ex`, and the polling callbacks work on any.
//!
//! `start_poll` makes the calling thread the CQ's poller when it finds a completion (waiting
//! for another thread's `end_poll`, as a provider's CQ lock does; an empty CQ returns ENOENT
//! and the caller must not call `end_poll` then), `next_poll` moves to the next completion,
//! `end_poll` ends it. The completion in hand is kept in the shell, written only by the
//! poller; `read_*` return its fields.

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use ibverbs_sys::*;

use crate::abi::{self, Holds, Kind, Wc, set_errno};
use crate::control::CONTROL;
use crate::cq::Stamp;
use crate::ops::poll_stamped;

/// The completion fields softnic reports (`IBV_WC_EX_WITH_*`; the timestamps in ticks of the
/// device's `hca_core_clock`, 1 GHz, and in real nanoseconds); asking for others (CVLAN, flow
/// tag, tag matching) is EOPNOTSUPP.
const SUPPORTED_WC_FLAGS: u64 = (IBV_WC_EX_WITH_BYTE_LEN
    | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP
    | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK
    | IBV_WC_EX_WITH_IMM
    | IBV_WC_EX_WITH_QP_NUM
    | IBV_WC_EX_WITH_SRC_QP
    | IBV_WC_EX_WITH_SLID
    | IBV_WC_EX_WITH_SL
    | IBV_WC_EX_WITH_DLID_PATH_BITS) as u64;

/// A CQ as callers see it: the `ibv_cq_ex` (whose head is the `ibv_cq`), then the polling
/// state, which only the thread holding the poll lock touches.
#[repr(C)]
pub(crate) struct CqEx {
    ex: ibv_cq_ex,
    /// The token of the thread polling (from a `start_poll` that found a completion to the
    /// `end_poll` after it), 0 if none.
    poller: AtomicUsize,
    /// The completion in hand.
    current: UnsafeCell<Wc>,
    /// When it was made.
    stamp: UnsafeCell<Stamp>,
    /// The CQ holds completions or has overflowed: written under the fabric's lock whenever
    /// either changes, read without it by a poll that finds the fabric quiet (nothing due),
    /// which then has nothing to do.
    ready: AtomicBool,
}

// The head of `ibv_cq_ex` is `ibv_cq`, field for field.
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(offset_of!(ibv_cq_ex, context) == offset_of!(ibv_cq, context));
    assert!(offset_of!(ibv_cq_ex, channel) == offset_of!(ibv_cq, channel));
    assert!(offset_of!(ibv_cq_ex, cq_context) == offset_of!(ibv_cq, cq_context));
    assert!(offset_of!(ibv_cq_ex, handle) == offset_of!(ibv_cq, handle));
    assert!(offset_of!(ibv_cq_ex, cqe) == offset_of!(ibv_cq, cqe));
    assert!(offset_of!(ibv_cq_ex, mutex) == offset_of!(ibv_cq, mutex));
    assert!(offset_of!(ibv_cq_ex, cond) == offset_of!(ibv_cq, cond));
    assert!(
        offset_of!(ibv_cq_ex, comp_events_completed) == offset_of!(ibv_cq, comp_events_completed)
    );
    assert!(
        offset_of!(ibv_cq_ex, async_events_completed) == offset_of!(ibv_cq, async_events_completed)
    );
    assert!(size_of::<ibv_cq>() == offset_of!(ibv_cq_ex, comp_mask));
    // rdma-core v44's offsets.
    assert!(offset_of!(ibv_cq_ex, start_poll) == 144);
    assert!(offset_of!(CqEx, ex) == 0);
};

// SAFETY: `CqEx` is `repr(C)`, starting with an `ibv_cq_ex` whose head is laid out exactly as
// `ibv_cq` (asserted above).
unsafe impl Holds<ibv_cq> for CqEx {
    const OFFSET: usize = 0;
}

impl CqEx {
    /// The extended CQ around `cq`.
    pub(crate) fn new(cq: ibv_cq) -> Self {
        CqEx {
            ex: ibv_cq_ex {
                context: cq.context,
                channel: cq.channel,
                cq_context: cq.cq_context,
                handle: cq.handle,
                cqe: cq.cqe,
                start_poll: Some(start_poll),
                next_poll: Some(next_poll),
                end_poll: Some(end_poll),
                read_opcode: Some(read_opcode),
                read_vendor_err: Some(read_vendor_err),
                read_byte_len: Some(read_byte_len),
                read_imm_data: Some(read_imm_data),
                read_qp_num: Some(read_qp_num),
                read_src_qp: Some(read_src_qp),
                read_wc_flags: Some(read_wc_flags),
                read_slid: Some(read_slid),
                read_sl: Some(read_sl),
                read_dlid_path_bits: Some(read_dlid_path_bits),
                read_completion_ts: Some(read_completion_ts),
                read_completion_wallclock_ns: Some(read_completion_wallclock_ns),
                ..Default::default()
            },
            poller: AtomicUsize::new(0),
            current: UnsafeCell::new(Wc::default()),
            stamp: UnsafeCell::new(Stamp::default()),
            ready: AtomicBool::new(false),
        }
    }
}

/// The flag of CQ `cq` saying whether it holds completions or has overflowed (see
/// [`CqEx::ready`]).
///
/// # Safety
/// `cq` is a CQ shell softnic made (a `CqEx`, never freed): found in the registry, or a
/// [`crate::cq::Cq`]'s own.
pub(crate) unsafe fn ready_flag<'a>(cq: *const ibv_cq) -> &'a AtomicBool {
    // SAFETY: per the contract the allocation is a `CqEx` (whose `ibv_cq` is at offset 0)
    // that lives forever; the reference covers only the atomic field, which nothing accesses
    // but through shared references.
    unsafe { &(*cq.cast::<CqEx>()).ready }
}

/// `verbs_context.create_cq_ex`: a CQ like `ibv_create_cq`'s, with the fields of `wc_flags`.
pub(super) unsafe extern "C" fn create_cq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    if attr.is_null() {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    /// A field of the caller's struct, read alone: only those its `comp_mask` names exist
    /// past `comp_mask` (a caller built against older headers has a shorter struct).
    macro_rules! field {
        ($f:ident) => {
            // SAFETY: non-null, and valid up to the fields `comp_mask` names (the helper's
            // contract); the fields up to `comp_mask` always exist.
            unsafe { (&raw const (*attr).$f).read() }
        };
    }
    let mask = field!(comp_mask);
    let known_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD;
    if mask & !known_mask != 0 {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    let flags = if mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 {
        field!(flags)
    } else {
        0
    };
    // A parent domain, ignoring overruns, or completion fields softnic has not: unsupported.
    if mask & IBV_CQ_INIT_ATTR_MASK_PD != 0
        || flags & !IBV_CREATE_CQ_ATTR_SINGLE_THREADED != 0
        || field!(wc_flags) & !SUPPORTED_WC_FLAGS != 0
    {
        set_errno(libc::EOPNOTSUPP);
        return null_mut();
    }
    let (Ok(cqe), Ok(vector)) = (
        c_int::try_from(field!(cqe)),
        c_int::try_from(field!(comp_vector)),
    ) else {
        set_errno(libc::EINVAL);
        return null_mut();
    };
    let (user, channel) = (field!(cq_context), field!(channel));
    // SAFETY: the verb checks the context and channel pointers itself.
    let cq = unsafe { (CONTROL.create_cq)(context, cqe, user, channel, vector) };
    if !cq.is_null()
        && field!(wc_flags) & u64::from(IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK) != 0
    {
        crate::control::with(cq.cast(), Kind::Cq, (), |_, st, id| {
            if let Some(c) = st.w.cqs.get_mut(&id) {
                c.wallclock = true;
            }
        });
    }
    cq.cast()
}

/// The shell of a CQ pointer softnic handed out, or None (never dereferenced then).
fn shell_of(cq: *mut ibv_cq_ex) -> Option<*mut CqEx> {
    abi::lookup(cq as *const c_void, Kind::Cq).map(|_| cq.cast())
}

/// Polls one completion into the shell: 0, ENOENT if there is none, or an errno value.
///
/// # Safety
/// `shell` is a CQ shell softnic made and the calling thread is its poller.
unsafe fn poll_one(shell: *mut CqEx) -> c_int {
    let mut wc = Wc::default().to_ibv();
    let mut stamp = Stamp::default();
    // SAFETY: `wc` and `stamp` have room for one completion; the verb checks the CQ pointer.
    let n = unsafe { poll_stamped(shell.cast(), 1, &mut wc, &mut stamp) };
    match n {
        1 => {
            let wc = *Wc::from_ibv(&wc);
            // SAFETY: the shell lives forever; this thread is its poller, the only one
            // touching `current`, `stamp`, `status` and `wr_id` (outside the `ibv_cq` head
            // softnic updates under its fabric lock).
            unsafe {
                *(*shell).current.get() = wc;
                *(*shell).stamp.get() = stamp;
                (&raw mut (*shell).ex.status).write(wc.status);
                (&raw mut (*shell).ex.wr_id).write(wc.wr_id);
            }
            0
        }
        0 => libc::ENOENT,
        n => -n,
    }
}

unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    // SAFETY: `attr` is null or valid per the helper's contract.
    if !attr.is_null() && unsafe { (*attr).comp_mask } != 0 {
        return libc::EINVAL;
    }
    let Some(shell) = shell_of(cq) else {
        return libc::EINVAL;
    };
    // SAFETY: a live softnic CQ's shell, never freed.
    let poller = unsafe { &(*shell).poller };
    let me = super::me();
    // Another thread's poll: wait for its end_poll, as a provider's CQ lock does. This
    // thread's own (an end_poll forgotten) goes on.
    while poller.load(Ordering::Relaxed) != me
        && poller
            .compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
    {
        std::thread::yield_now();
    }
    // SAFETY: a softnic CQ, and this thread is now its poller.
    let r = unsafe { poll_one(shell) };
    if r != 0 {
        // No end_poll follows a failed start_poll.
        poller.store(0, Ordering::Release);
    }
    r
}

unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    let shell = cq.cast::<CqEx>();
    // SAFETY: called as `cq->next_poll(cq)`: a softnic shell, never freed.
    if unsafe { &(*shell).poller }.load(Ordering::Acquire) != super::me() {
        // No start_poll of this thread's.
        return libc::EINVAL;
    }
    // SAFETY: a softnic CQ (the verb checks it is live), and this thread is its poller.
    unsafe { poll_one(shell) }
}

unsafe extern "C" fn end_poll(cq: *mut ibv_cq_ex) {
    let shell = cq.cast::<CqEx>();
    // SAFETY: called as `cq->end_poll(cq)`: a softnic shell, never freed.
    let poller = unsafe { &(*shell).poller };
    if poller.load(Ordering::Relaxed) == super::me() {
        poller.store(0, Ordering::Release);
    }
}

/// The completion in hand.
///
/// # Safety
/// `cq` is the CQ whose callback this is (`cq->read_x(cq)`, as the inline helpers call it:
/// a softnic shell, never freed), and this thread is its poller (since its `start_poll`).
unsafe fn current(cq: *mut ibv_cq_ex) -> Wc {
    // SAFETY: per this function's contract, the shell is softnic's and this thread is its
    // poller, the only one writing `current`.
    unsafe { *(*cq.cast::<CqEx>()).current.get() }
}

macro_rules! readers {
    ($($name:ident -> $ty:ty = |$wc:ident| $value:expr;)*) => {$(
        #[doc = concat!("`ibv_cq_ex.", stringify!($name), "`.")]
        unsafe extern "C" fn $name(cq: *mut ibv_cq_ex) -> $ty {
            // SAFETY: called as `cq->read_x(cq)` by the thread polling `cq`.
            let $wc = unsafe { current(cq) };
            $value
        }
    )*};
}

readers! {
    read_opcode -> ibv_wc_opcode::Type = |wc| wc.opcode;
    read_vendor_err -> u32 = |wc| wc.vendor_err;
    read_byte_len -> u32 = |wc| wc.byte_len;
    read_imm_data -> __be32 = |wc| wc.imm_data;
    read_qp_num -> u32 = |wc| wc.qp_num;
    read_src_qp -> u32 = |wc| wc.src_qp;
    read_wc_flags -> std::ffi::c_uint = |wc| wc.wc_flags;
    read_slid -> u32 = |wc| u32::from(wc.slid);
    read_sl -> u8 = |wc| wc.sl;
    read_dlid_path_bits -> u8 = |wc| wc.dlid_path_bits;
}

/// `ibv_cq_ex.read_completion_ts`: the fabric's clock when the completion was made (1 GHz
/// ticks: nanoseconds, virtual on the virtual clock).
unsafe extern "C" fn read_completion_ts(cq: *mut ibv_cq_ex) -> u64 {
    // SAFETY: called as `cq->read_completion_ts(cq)` by the thread polling `cq` (a softnic
    // shell, never freed), the only one writing `stamp`.
    unsafe { (*(*cq.cast::<CqEx>()).stamp.get()).at }
}

/// `ibv_cq_ex.read_completion_wallclock_ns`: the real time the completion was made
/// (nanoseconds since the epoch).
unsafe extern "C" fn read_completion_wallclock_ns(cq: *mut ibv_cq_ex) -> u64 {
    // SAFETY: as `read_completion_ts`.
    unsafe { (*(*cq.cast::<CqEx>()).stamp.get()).wall }
}
