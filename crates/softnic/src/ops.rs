//! The hot path: the functions in `ibv_context.ops` (post, poll, notify), called by a caller
//! exactly as rdma-core's static inlines call a hardware provider's. The memory window verbs
//! rdma-core reaches through `ops` too (`ibv_alloc_mw`, `ibv_bind_mw`, `ibv_dealloc_mw`) are
//! in the control path (`control::windows`).

use std::ffi::c_int;
use std::sync::atomic::Ordering;

use ibverbs_sys::{ibv_context_ops, ibv_cq, ibv_qp, ibv_recv_wr, ibv_send_wr, ibv_srq, ibv_wc};

use crate::abi::{self, Kind};
use crate::control::{try_with, with_found};
use crate::cq::{Arm, Reclaim, Stamp};
use crate::qp::Qp;
use crate::srq::Srq;
use crate::state::State;
use crate::table::Table;

/// Events one `poll_cq` call may move the virtual clock through while its CQ stays empty.
const POLL_WARP_BUDGET: usize = 1024;

/// The `ops` table of a softnic context.
pub(crate) fn context_ops() -> ibv_context_ops {
    ibv_context_ops {
        post_send: Some(post_send),
        post_recv: Some(post_recv),
        post_srq_recv: Some(post_srq_recv),
        poll_cq: Some(poll_cq),
        req_notify_cq: Some(req_notify_cq),
        alloc_mw: Some(crate::control::alloc_mw),
        bind_mw: Some(crate::control::bind_mw),
        dealloc_mw: Some(crate::control::dealloc_mw),
        ..Default::default()
    }
}

unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    let r = try_with(qp.cast(), Kind::Qp, |shared, st, id| {
        let State { qps, w, .. } = st;
        if wr.is_null() {
            // No WR list: EINVAL with `bad_wr` null, as rxe (mlx5 posts nothing and says 0).
            return Err((libc::EINVAL, wr));
        }
        let q = qps.get_mut(&id).expect("registered QP exists");
        // SAFETY: the caller's chain is valid per the ibv_post_send contract.
        let r = unsafe { q.post_send(w, wr) };
        st.progress_after_post();
        shared.posted_at(st.w.now);
        r
    });
    // SAFETY: `bad_wr` is the caller's out-pointer, writable per the contract.
    unsafe { post_result(r.unwrap_or_else(|e| Err((e, wr))), bad_wr) }
}

unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    let r = try_with(qp.cast(), Kind::Qp, |_, st, id| {
        let State { qps, w, .. } = st;
        if wr.is_null() {
            // No WR list: EINVAL with `bad_wr` null, as rxe (mlx5 posts nothing and says 0).
            return Err((libc::EINVAL, wr));
        }
        let q = qps.get_mut(&id).expect("registered QP exists");
        // SAFETY: the caller's chain is valid per the ibv_post_recv contract.
        let r = unsafe { q.post_recv(w, wr) };
        st.progress();
        r
    });
    // SAFETY: `bad_wr` is the caller's out-pointer, writable per the contract.
    unsafe { post_result(r.unwrap_or_else(|e| Err((e, wr))), bad_wr) }
}

unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    let r = try_with(srq.cast(), Kind::Srq, |_, st, id| {
        // SAFETY: the caller's chain is valid per the ibv_post_srq_recv contract.
        let r = unsafe { st.w.post_srq_recv(id, wr) };
        st.progress();
        r
    });
    // SAFETY: `bad_wr` is the caller's out-pointer, writable per the contract.
    unsafe { post_result(r.unwrap_or_else(|e| Err((e, wr))), bad_wr) }
}

/// A post's return value: 0, or the errno with `*bad_wr` set to the WR that failed (when the
/// caller gave a place for it).
///
/// # Safety
/// `bad_wr` is null or writable.
unsafe fn post_result<W>(r: Result<(), (c_int, *mut W)>, bad_wr: *mut *mut W) -> c_int {
    match r {
        Ok(()) => 0,
        Err((e, bad)) => {
            if !bad_wr.is_null() {
                // SAFETY: non-null, and writable per this function's contract.
                unsafe { *bad_wr = bad };
            }
            e
        }
    }
}

/// Polls up to `num` completions into `wc`. Progress first (and, with auto-advance on the
/// virtual clock, time moves through pending events while the CQ is empty). Returns the number
/// written, or `-EINVAL` (unknown CQ, bad arguments), `-EIO` (broken fabric), or `-EOVERFLOW`
/// once a CQ that overflowed has been drained.
pub(crate) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, num: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: the caller's contract is `poll_cq`'s; no stamps asked.
    unsafe { poll_stamped(cq, num, wc, std::ptr::null_mut()) }
}

/// `poll_cq`, also writing each completion's [`Stamp`] to `stamps` unless it is null (the
/// extended CQ's timestamps).
///
/// # Safety
/// As `poll_cq`; `stamps` is null or has room for `num` stamps.
#[inline(always)]
pub(crate) unsafe fn poll_stamped(
    cq: *mut ibv_cq,
    num: c_int,
    wc: *mut ibv_wc,
    stamps: *mut Stamp,
) -> c_int {
    let Some(found) = abi::lookup(cq.cast(), Kind::Cq) else {
        abi::set_errno(libc::EINVAL);
        return -libc::EINVAL;
    };
    if num < 0 || (num > 0 && wc.is_null()) {
        return -libc::EINVAL;
    }
    // SAFETY: the registry found a CQ of softnic's at `cq`.
    let ready = unsafe { crate::extended::ready_flag(cq) };
    if found.fabric.quiet_now().is_some() && !ready.load(Ordering::Acquire) {
        // Nothing changed since the state was left with nothing due (with `auto_advance`,
        // nothing pending: no event to move time to): no progress to make and nothing to take
        // (what the locked path below would find), without the lock.
        // A progress thread asleep is woken as by any poll (a look at an atomic unless one
        // sleeps).
        found.fabric.wake_sleeper();
        return 0;
    }
    // SAFETY: as this function's contract; `num >= 0` was checked above.
    unsafe { poll_locked(&found, num, wc, stamps) }
}

/// [`poll_stamped`]'s work under the fabric's lock: progress, then the completions taken.
/// Out of line, so that an empty poll does not pay for what it skips.
///
/// # Safety
/// `found` is a CQ of softnic's; `num` is not negative, `wc` has room for `num` completions,
/// and `stamps` is null or has room for `num` stamps.
#[inline(never)]
unsafe fn poll_locked(
    found: &abi::Found,
    num: c_int,
    wc: *mut ibv_wc,
    stamps: *mut Stamp,
) -> c_int {
    let r = with_found(found, |shared, st, id| {
        // Left quiet by the last holder of the lock (see `Shared::quiet`): nothing is due.
        if !st.found_quiet {
            st.progress();
        }
        shared.polled_at(st.w.now);
        if st.w.cfg.auto_advance {
            let mut budget = POLL_WARP_BUDGET;
            while budget > 0 && st.w.cqs[&id].entries.is_empty() && st.warp() {
                budget -= 1;
            }
        }
        let State { qps, w, .. } = st;
        let c = w.cqs.get_mut(&id).expect("registered CQ exists");
        let mut n = 0;
        while n < num as usize {
            let Some((entry, reclaim, stamp)) = c.entries.pop_front() else {
                break;
            };
            // SAFETY: `wc` has room for `num` entries per the ibv_poll_cq contract.
            unsafe { wc.add(n).write(entry.to_ibv()) };
            if !stamps.is_null() {
                // SAFETY: non-null, room for `num` stamps per this function's contract.
                unsafe { stamps.add(n).write(stamp) };
            }
            n += 1;
            reclaim_slots(qps, &mut w.srqs, reclaim);
        }
        c.publish();
        let (empty, owed, overflowed) = (c.entries.is_empty(), c.owed.is_some(), c.overflowed);
        if empty && owed {
            // Polled empty: an event owed since the arming is withdrawn (`MISSED_EVENT_GRACE`).
            w.settle_owed(id);
        }
        if n == 0 && overflowed {
            return -libc::EOVERFLOW;
        }
        n as c_int
    });
    r.unwrap_or_else(|e| -e)
}

unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    let r = try_with(cq.cast(), Kind::Cq, |shared, st, id| {
        // The caller is about to sleep on the channel: the progress thread takes over now.
        shared.stopped_polling();
        let w = &mut st.w;
        let c = w.cqs.get_mut(&id).expect("registered CQ exists");
        c.arm = if solicited_only != 0 {
            Arm::Solicited
        } else {
            Arm::Next
        };
        // Armed for the next completion with completions not yet polled, the CQ owes its
        // event, as ConnectX NICs raise one (IBTA and rxe raise none until a new completion
        // comes): see `MISSED_EVENT_GRACE` for when it comes, and when not. Armed
        // solicited-only, it waits for a new solicited or failed completion, whatever is
        // queued (the queue does not keep which completions were solicited).
        if c.arm == Arm::Next && !c.entries.is_empty() {
            w.owe_event(id);
        } else {
            w.settle_owed(id);
        }
    });
    r.err().unwrap_or(0)
}

/// A polled completion frees the work-queue slots it covers.
fn reclaim_slots(qps: &mut Table<Qp>, srqs: &mut Table<Srq>, r: Reclaim) {
    match r {
        Reclaim::Sq { qp, epoch, n } => {
            if let Some(q) = qps.get_mut(&qp).filter(|q| q.epoch == epoch) {
                q.sq.unreclaimed = q.sq.unreclaimed.saturating_sub(n);
            }
        }
        Reclaim::Rq { qp, epoch } => {
            if let Some(q) = qps.get_mut(&qp).filter(|q| q.epoch == epoch) {
                q.rq.unreclaimed = q.rq.unreclaimed.saturating_sub(1);
            }
        }
        Reclaim::Srq { srq } => {
            if let Some(s) = srqs.get_mut(&srq) {
                s.unreclaimed = s.unreclaimed.saturating_sub(1);
            }
        }
    }
}
