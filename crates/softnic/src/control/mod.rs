//! The control path: `extern "C"` functions with the libibverbs signatures, gathered in
//! [`CONTROL`].
//!
//! Conventions are libibverbs': functions returning a pointer return NULL and set `errno` on
//! failure; functions returning `int` return 0 or an errno value; `get_cq_event` and
//! `get_async_event` return -1 and set `errno`. A pointer softnic did not hand out (NULL,
//! foreign, or already destroyed) is never dereferenced: it fails with EINVAL. Destroying an
//! object still in use by another fails with EBUSY. Destroying a CQ, QP or SRQ waits until
//! every event handed out about it (`get_cq_event`, `get_async_event`) is acknowledged, as
//! rdma-core's destroy verbs do; [`release_device`] waits for none.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use ibverbs_sys::*;

use crate::abi::{self, Kind, set_errno};

mod cq;
mod device;
mod groups;
mod memory;
mod queues;
mod srqs;
mod windows;

use crate::fabric::Shared;
use crate::state::State;
pub use cq::resize_cq;
use cq::*;
pub use device::release_device;
use device::*;
pub use groups::{attach_mcast, detach_mcast};
use memory::*;
use queues::*;
pub(crate) use queues::{create_qp_with, create_target_qp};
pub(crate) use srqs::create_srq_with;
use srqs::*;
pub(crate) use windows::{alloc_mw, bind_mw, dealloc_mw};

/// The control path of a libibverbs provider, as a table of functions with the libibverbs
/// signatures. [`CONTROL`] is softnic's; verbs-safe builds the same table from the system
/// libibverbs.
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)] // each field is the libibverbs function of the same name
pub struct ControlPath {
    pub get_device_name: unsafe extern "C" fn(*mut ibv_device) -> *const c_char,
    pub open_device: unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context,
    pub close_device: unsafe extern "C" fn(*mut ibv_context) -> c_int,
    pub query_device: unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int,
    pub query_port: unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int,
    pub query_gid: unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int,
    pub alloc_pd: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd,
    pub dealloc_pd: unsafe extern "C" fn(*mut ibv_pd) -> c_int,
    pub reg_mr: unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr,
    pub dereg_mr: unsafe extern "C" fn(*mut ibv_mr) -> c_int,
    pub rereg_mr:
        unsafe extern "C" fn(*mut ibv_mr, c_int, *mut ibv_pd, *mut c_void, usize, c_int) -> c_int,
    pub create_comp_channel: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel,
    pub destroy_comp_channel: unsafe extern "C" fn(*mut ibv_comp_channel) -> c_int,
    pub create_cq: unsafe extern "C" fn(
        *mut ibv_context,
        c_int,
        *mut c_void,
        *mut ibv_comp_channel,
        c_int,
    ) -> *mut ibv_cq,
    pub destroy_cq: unsafe extern "C" fn(*mut ibv_cq) -> c_int,
    pub get_cq_event:
        unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int,
    pub ack_cq_events: unsafe extern "C" fn(*mut ibv_cq, c_uint),
    pub create_srq: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_srq_init_attr) -> *mut ibv_srq,
    pub modify_srq: unsafe extern "C" fn(*mut ibv_srq, *mut ibv_srq_attr, c_int) -> c_int,
    pub query_srq: unsafe extern "C" fn(*mut ibv_srq, *mut ibv_srq_attr) -> c_int,
    pub destroy_srq: unsafe extern "C" fn(*mut ibv_srq) -> c_int,
    pub create_qp: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp,
    pub modify_qp: unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int,
    pub query_qp:
        unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int, *mut ibv_qp_init_attr) -> c_int,
    pub destroy_qp: unsafe extern "C" fn(*mut ibv_qp) -> c_int,
    pub create_ah: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_ah_attr) -> *mut ibv_ah,
    pub destroy_ah: unsafe extern "C" fn(*mut ibv_ah) -> c_int,
    pub get_async_event: unsafe extern "C" fn(*mut ibv_context, *mut ibv_async_event) -> c_int,
    pub ack_async_event: unsafe extern "C" fn(*mut ibv_async_event),
}

/// softnic's control path.
pub static CONTROL: ControlPath = ControlPath {
    get_device_name,
    open_device,
    close_device,
    query_device,
    query_port,
    query_gid,
    alloc_pd,
    dealloc_pd,
    reg_mr,
    dereg_mr,
    rereg_mr,
    create_comp_channel,
    destroy_comp_channel,
    create_cq,
    destroy_cq,
    get_cq_event,
    ack_cq_events,
    create_srq,
    modify_srq,
    query_srq,
    destroy_srq,
    create_qp,
    modify_qp,
    query_qp,
    destroy_qp,
    create_ah,
    destroy_ah,
    get_async_event,
    ack_async_event,
};

/// Runs `f` on the fabric state of the live object of `kind` at `ptr`. An unknown pointer
/// (null, foreign, destroyed) is `Err(EINVAL)` and never dereferenced; a broken fabric is
/// `Err(EIO)`; a panic inside `f` (a softnic bug) breaks the fabric and is `Err(EIO)` rather
/// than unwinding into C. errno is set to the error. A sleeping progress thread is woken
/// afterwards, since `f` may have given it work.
pub(crate) fn try_with<R>(
    ptr: *const c_void,
    kind: Kind,
    f: impl FnOnce(&Arc<Shared>, &mut State, u32) -> R,
) -> Result<R, c_int> {
    let Some(found) = abi::lookup(ptr, kind) else {
        set_errno(libc::EINVAL);
        return Err(libc::EINVAL);
    };
    with_found(&found, f)
}

/// [`try_with`] for an object already looked up.
pub(crate) fn with_found<R>(
    found: &abi::Found,
    f: impl FnOnce(&Arc<Shared>, &mut State, u32) -> R,
) -> Result<R, c_int> {
    let fail = |e| {
        set_errno(e);
        Err(e)
    };
    let (shared, id) = (&found.fabric, found.id);
    let Some(mut st) = shared.lock() else {
        return fail(libc::EIO);
    };
    if !found.still_there() {
        // Destroyed by another thread since the lookup.
        drop(st);
        return fail(libc::EINVAL);
    }
    let r = catch_unwind(AssertUnwindSafe(|| f(shared, &mut st, id)));
    if r.is_ok() {
        shared.leave_quiet(&st);
    }
    shared.wake_sleeper();
    match r {
        Ok(r) => Ok(r),
        Err(payload) => {
            let why = crate::fabric::panic_message(payload.as_ref());
            shared.mark_broken(format!("a verb panicked: {why}"));
            fail(libc::EIO)
        }
    }
}

/// [`try_with`] for functions that return a pointer or a count: `fail` on error (errno set).
pub(crate) fn with<R>(
    ptr: *const c_void,
    kind: Kind,
    fail: R,
    f: impl FnOnce(&Arc<Shared>, &mut State, u32) -> R,
) -> R {
    try_with(ptr, kind, f).unwrap_or(fail)
}

/// For the destroy verbs of objects that events name (CQs, QPs, SRQs): runs `f` under the lock
/// until it gives a status. `f` answers `None` while an event it handed out about the object is
/// unacknowledged, and the call then waits, without the lock, for an acknowledgement: as
/// rdma-core's destroy commands wait until the object's `events_completed` reaches the
/// kernel's `events_reported`, so that a thread that took an event may use the object until
/// it acknowledges it (ibv_get_cq_event(3)). Fails as [`with_status`] does.
fn destroy_when_acked(
    ptr: *const c_void,
    kind: Kind,
    mut f: impl FnMut(&Arc<Shared>, &mut State, u32) -> Option<c_int>,
) -> c_int {
    let Some(found) = abi::lookup(ptr, kind) else {
        set_errno(libc::EINVAL);
        return libc::EINVAL;
    };
    let shared = Arc::clone(&found.fabric);
    let mut gate = shared.acks.lock().unwrap_or_else(PoisonError::into_inner);
    shared.ack_waiters.fetch_add(1, Ordering::SeqCst);
    let status = loop {
        match with_found(&found, &mut f) {
            Ok(Some(status)) => break status,
            Err(e) => break e,
            // The timeout only bounds how late a broken fabric is noticed: acknowledgements
            // wake the wait (`Shared::acknowledged`).
            Ok(None) => {
                gate = (shared.acked)
                    .wait_timeout(gate, Duration::from_millis(100))
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            }
        }
    };
    shared.ack_waiters.fetch_sub(1, Ordering::SeqCst);
    status
}

/// [`try_with`] for functions that return an errno value: EINVAL for unknown pointers, EIO on
/// a broken fabric or after a panic.
pub(crate) fn with_status(
    ptr: *const c_void,
    kind: Kind,
    f: impl FnOnce(&Arc<Shared>, &mut State, u32) -> c_int,
) -> c_int {
    try_with(ptr, kind, f).unwrap_or_else(|e| e)
}

/// A device as programs and the libibverbs providers they may link see it: the `ibv_device`,
/// then zeros where rdma-core's `struct verbs_device` goes on (a provider asked about a device
/// reads its `ops` there: null, so not one of its own).
#[repr(C)]
pub(crate) struct DeviceShell {
    pub(crate) dev: ibv_device,
    rest: [u64; 32],
}

/// The `ibv_device` of a device of a fabric, in its shell.
pub(crate) fn device_shell(name: &str) -> DeviceShell {
    DeviceShell {
        dev: device_struct(name),
        rest: [0; 32],
    }
}

/// The `ibv_device` of a device of a fabric.
fn device_struct(name: &str) -> ibv_device {
    let mut d = ibv_device {
        node_type: ibverbs_sys::IBV_NODE_CA,
        transport_type: ibverbs_sys::IBV_TRANSPORT_IB,
        ..Default::default()
    };
    let copy = |dst: &mut [c_char], s: &str| {
        let room = dst.len() - 1;
        for (d, b) in dst.iter_mut().zip(s.bytes().take(room)) {
            *d = b as c_char;
        }
    };
    copy(&mut d.name, name);
    copy(&mut d.dev_name, &format!("uverbs-{name}"));
    copy(
        &mut d.dev_path,
        &format!("/sys/class/infiniband_verbs/uverbs-{name}"),
    );
    copy(&mut d.ibdev_path, &format!("/sys/class/infiniband/{name}"));
    d
}
