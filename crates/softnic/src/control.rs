//! The control path: `extern "C"` functions with the libibverbs signatures, gathered in
//! [`CONTROL`].
//!
//! Conventions are libibverbs': functions returning a pointer return NULL and set `errno` on
//! failure; functions returning `int` return 0 or an errno value; `get_cq_event` and
//! `get_async_event` return -1 and set `errno`. A pointer softnic did not hand out (NULL,
//! foreign, or already destroyed) is never dereferenced: it fails with EINVAL. Destroying an
//! object still in use by another fails with EBUSY.

use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::null_mut;
use std::sync::Arc;

use ibverbs_sys::*;

use crate::abi::{self, Kind, Shell, gid_bytes, set_errno};
use crate::cq::{Arm, Channel, Cq, EventFd};
use crate::fabric::Shared;
use crate::mr::Mr;
use crate::qp::{Qp, RecvQueue, Requester, Responder, SendQueue, Transport};
use crate::srq::Srq;
use crate::state::{Ah, Context, Element, Pd, State};

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
    let fail = |e| {
        set_errno(e);
        Err(e)
    };
    let Some((shared, id)) = abi::lookup(ptr, kind) else {
        return fail(libc::EINVAL);
    };
    let Some(mut st) = shared.lock() else {
        return fail(libc::EIO);
    };
    let r = catch_unwind(AssertUnwindSafe(|| f(&shared, &mut st, id)));
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

/// [`try_with`] for functions that return an errno value: EINVAL for unknown pointers, EIO on
/// a broken fabric or after a panic.
fn with_status(
    ptr: *const c_void,
    kind: Kind,
    f: impl FnOnce(&Arc<Shared>, &mut State, u32) -> c_int,
) -> c_int {
    try_with(ptr, kind, f).unwrap_or_else(|e| e)
}

/// The `ibv_device` of a device of a fabric.
pub(crate) fn device_struct(name: &str) -> ibv_device {
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

unsafe extern "C" fn get_device_name(device: *mut ibv_device) -> *const c_char {
    with(
        device.cast(),
        Kind::Device,
        std::ptr::null(),
        |_, st, idx| {
            // SAFETY: the device shell lives forever; its name is a NUL-terminated array.
            unsafe { (*st.w.devices[idx as usize].shell.ptr()).name.as_ptr() }
        },
    )
}

unsafe extern "C" fn open_device(device: *mut ibv_device) -> *mut ibv_context {
    with(
        device.cast(),
        Kind::Device,
        null_mut(),
        |shared, st, idx| {
            let Some(fd) = EventFd::new() else {
                return null_mut();
            };
            let id = st.w.alloc_id();
            let ops = crate::ops::context_ops();
            let ctx = ibv_context {
                device: st.w.devices[idx as usize].shell.ptr(),
                ops,
                cmd_fd: -1,
                async_fd: fd.raw(),
                num_comp_vectors: 1,
                ..Default::default()
            };
            let shell = Shell::new(ctx, id);
            let p = shell.ptr();
            st.w.contexts.insert(
                id,
                Context {
                    dev: idx as usize,
                    shell,
                    async_fd: fd,
                    events: VecDeque::new(),
                },
            );
            abi::register(p.cast(), Kind::Context, shared, id);
            p
        },
    )
}

unsafe extern "C" fn close_device(context: *mut ibv_context) -> c_int {
    with_status(context.cast(), Kind::Context, |_, st, id| {
        let w = &st.w;
        let busy = w.pds.values().any(|o| o.ctx == id)
            || w.cqs.values().any(|o| o.ctx == id)
            || w.channels.values().any(|o| o.ctx == id)
            || w.srqs.values().any(|o| o.ctx == id)
            || w.ahs.values().any(|o| o.ctx == id)
            || w.mrs.values().any(|o| o.ctx == id)
            || st.qps.values().any(|o| o.ctx == id);
        if busy {
            return libc::EBUSY;
        }
        if let Some(c) = st.w.contexts.remove(&id) {
            abi::unregister(c.shell.ptr().cast());
            // A thread blocked in get_async_event wakes, finds the context gone, and fails.
            c.async_fd.wake_all();
        }
        0
    })
}

/// Closes `context` after destroying every object still made on it (QPs, address handles,
/// memory regions, SRQs, CQs, completion channels, PDs, in that order), as the kernel does
/// when a process closes its device file: what a drop-in libibverbs's `ibv_close_device`
/// does, whereas [`CONTROL`]'s `close_device` refuses a context still in use (EBUSY).
/// Returns 0, or the errno of what could not be destroyed or closed.
///
/// # Safety
///
/// `context` is any pointer (softnic refuses one it did not make, EINVAL); no other thread
/// uses the context's objects meanwhile (they are freed).
pub unsafe extern "C" fn release_device(context: *mut ibv_context) -> c_int {
    type Shells = (
        Vec<*mut ibv_qp>,
        Vec<*mut ibv_ah>,
        Vec<*mut ibv_mr>,
        Vec<*mut ibv_srq>,
        Vec<*mut ibv_cq>,
        Vec<*mut ibv_comp_channel>,
        Vec<*mut ibv_pd>,
    );
    let found: Result<Shells, c_int> = try_with(context.cast(), Kind::Context, |_, st, id| {
        let w = &mut st.w;
        (
            st.qps
                .values_mut()
                .filter(|o| o.ctx == id)
                .map(|o| o.shell.ptr())
                .collect(),
            w.ahs
                .values_mut()
                .filter(|o| o.ctx == id)
                .map(|o| o.shell.ptr())
                .collect(),
            w.mrs
                .values_mut()
                .filter(|o| o.ctx == id)
                .map(|o| o.shell.ptr())
                .collect(),
            w.srqs
                .values_mut()
                .filter(|o| o.ctx == id)
                .map(|o| o.shell.ptr())
                .collect(),
            w.cqs
                .values_mut()
                .filter(|o| o.ctx == id)
                .map(|o| o.shell.ptr())
                .collect(),
            w.channels
                .values_mut()
                .filter(|o| o.ctx == id)
                .map(|o| o.shell.ptr())
                .collect(),
            w.pds
                .values_mut()
                .filter(|o| o.ctx == id)
                .map(|o| o.shell.ptr())
                .collect(),
        )
    });
    let (qps, ahs, mrs, srqs, cqs, channels, pds) = match found {
        Ok(f) => f,
        Err(e) => return e,
    };
    let mut first = 0;
    let mut keep = |r: c_int| {
        if first == 0 {
            first = r;
        }
    };
    // SAFETY: each pointer is a live object of this context, as softnic made it; the destroy
    // verbs check them again.
    unsafe {
        qps.into_iter().for_each(|p| keep(destroy_qp(p)));
        ahs.into_iter().for_each(|p| keep(destroy_ah(p)));
        mrs.into_iter().for_each(|p| keep(dereg_mr(p)));
        srqs.into_iter().for_each(|p| keep(destroy_srq(p)));
        cqs.into_iter().for_each(|p| keep(destroy_cq(p)));
        channels
            .into_iter()
            .for_each(|p| keep(destroy_comp_channel(p)));
        pds.into_iter().for_each(|p| keep(dealloc_pd(p)));
        keep(close_device(context));
    }
    first
}

unsafe extern "C" fn query_device(context: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int {
    with_status(context.cast(), Kind::Context, |_, st, id| {
        if attr.is_null() {
            return libc::EINVAL;
        }
        let c = &st.w.cfg;
        let dev = st.w.contexts[&id].dev;
        let mut a = ibv_device_attr {
            node_guid: (0x0200_0000_0000_0000u64 | dev as u64).to_be(),
            sys_image_guid: (0x0200_0000_0000_0000u64 | dev as u64).to_be(),
            max_mr_size: u64::MAX,
            page_size_cap: 0xffff_f000,
            vendor_id: 0x1_5f,
            vendor_part_id: 0x50f7,
            hw_ver: 1,
            max_qp: 1 << 16,
            max_qp_wr: c.max_qp_wr as i32,
            max_sge: c.max_sge as i32,
            max_sge_rd: c.max_sge as i32,
            max_cq: 1 << 16,
            max_cqe: c.max_cqe as i32,
            max_mr: 1 << 20,
            max_pd: 1 << 16,
            max_qp_rd_atom: c.max_rd_atomic as i32,
            max_res_rd_atom: (c.max_rd_atomic as i32) << 16,
            max_qp_init_rd_atom: c.max_rd_atomic as i32,
            atomic_cap: ibverbs_sys::IBV_ATOMIC_HCA,
            max_ah: 1 << 16,
            max_srq: 1 << 16,
            max_srq_wr: c.max_srq_wr as i32,
            max_srq_sge: c.max_sge as i32,
            max_pkeys: 1,
            local_ca_ack_delay: 15,
            phys_port_cnt: 1,
            ..Default::default()
        };
        for (d, b) in a.fw_ver.iter_mut().zip(b"softnic 0.1".iter()) {
            *d = *b as c_char;
        }
        // SAFETY: `attr` is non-null and, per the libibverbs contract, points to a writable
        // `ibv_device_attr`.
        unsafe { *attr = a };
        0
    })
}

/// The `ibv_mtu` of a byte count.
fn mtu_enum(bytes: u32) -> ibv_mtu {
    match bytes {
        4096 => ibverbs_sys::IBV_MTU_4096,
        2048 => ibverbs_sys::IBV_MTU_2048,
        1024 => ibverbs_sys::IBV_MTU_1024,
        512 => ibverbs_sys::IBV_MTU_512,
        _ => ibverbs_sys::IBV_MTU_256,
    }
}

unsafe extern "C" fn query_port(
    context: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    with_status(context.cast(), Kind::Context, |_, st, id| {
        if port != 1 || attr.is_null() {
            return libc::EINVAL;
        }
        let mtu = mtu_enum(st.w.cfg.mtu);
        let dev = st.w.contexts[&id].dev;
        let a = ibv_port_attr {
            state: ibv_port_state::IBV_PORT_ACTIVE,
            max_mtu: mtu,
            active_mtu: mtu,
            gid_tbl_len: st.w.devices[dev].gids().count() as i32,
            max_msg_sz: st.w.cfg.max_msg_size,
            pkey_tbl_len: 1,
            active_width: 2,  // 4x
            active_speed: 32, // EDR: 25 Gb/s per lane
            phys_state: 5,    // LinkUp
            link_layer: IBV_LINK_LAYER_ETHERNET as u8,
            ..Default::default()
        };
        // SAFETY: non-null, and points to a writable `ibv_port_attr` per the contract.
        unsafe { *attr = a };
        0
    })
}

unsafe extern "C" fn query_gid(
    context: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    with_status(context.cast(), Kind::Context, |_, st, id| {
        let dev = st.w.contexts[&id].dev;
        let raw = usize::try_from(index)
            .ok()
            .and_then(|i| st.w.devices[dev].gids().nth(i));
        let Some(raw) = raw.filter(|_| port == 1 && !gid.is_null()) else {
            return libc::EINVAL;
        };
        // SAFETY: non-null, and points to a writable `ibv_gid` per the contract.
        unsafe { *gid = ibv_gid { raw } };
        0
    })
}

unsafe extern "C" fn alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    with(
        context.cast(),
        Kind::Context,
        null_mut(),
        |shared, st, ctx| {
            let id = st.w.alloc_id();
            let pd = ibv_pd {
                context,
                handle: id,
            };
            let shell = Shell::new(pd, id);
            let p = shell.ptr();
            st.w.pds.insert(id, Pd { ctx, shell });
            abi::register(p.cast(), Kind::Pd, shared, id);
            p
        },
    )
}

unsafe extern "C" fn dealloc_pd(pd: *mut ibv_pd) -> c_int {
    with_status(pd.cast(), Kind::Pd, |_, st, id| {
        let w = &st.w;
        let busy = w.mrs.values().any(|o| o.pd == id)
            || w.srqs.values().any(|o| o.pd == id)
            || w.ahs.values().any(|o| o.pd == id)
            || st.qps.values().any(|o| o.pd == id);
        if busy {
            return libc::EBUSY;
        }
        if let Some(o) = st.w.pds.remove(&id) {
            abi::unregister(o.shell.ptr().cast());
        }
        0
    })
}

const MR_ACCESS: u32 = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
    | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
    | ibv_access_flags::IBV_ACCESS_REMOTE_READ.0
    | ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0
    | ibv_access_flags::IBV_ACCESS_MW_BIND.0
    | ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING.0;

unsafe extern "C" fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    with(pd.cast(), Kind::Pd, null_mut(), |shared, st, pd_id| {
        let access = access as u32;
        let needs_local_write = ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
            | ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;
        let local_write = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        let bad = access & !MR_ACCESS != 0
            || (access & needs_local_write != 0 && access & local_write == 0)
            || (addr.is_null() && length > 0)
            || (addr as usize).checked_add(length).is_none();
        if bad {
            set_errno(libc::EINVAL);
            return null_mut();
        }
        let ctx = st.w.pds[&pd_id].ctx;
        let dev = st.w.contexts[&ctx].dev;
        let id = st.w.alloc_id();
        let d = &mut st.w.devices[dev];
        d.next_key += 1;
        let n = d.next_key;
        // Unique per device (the counter in the high bits), not guessable from the index alone.
        let key = (n << 8) | (n.wrapping_mul(0x9d) & 0xff);
        d.keys.insert(key, id);
        let context = st.w.context_ptr(ctx);
        let mr = ibv_mr {
            context,
            pd,
            addr,
            length,
            handle: id,
            lkey: key,
            rkey: key,
        };
        let shell = Shell::new(mr, id);
        let p = shell.ptr();
        st.w.mrs.insert(
            id,
            Mr {
                ctx,
                pd: pd_id,
                dev,
                addr: addr as u64,
                len: length as u64,
                access,
                key,
                shell,
            },
        );
        abi::register(p.cast(), Kind::Mr, shared, id);
        p
    })
}

unsafe extern "C" fn dereg_mr(mr: *mut ibv_mr) -> c_int {
    with_status(mr.cast(), Kind::Mr, |_, st, id| {
        if let Some(m) = st.w.mrs.remove(&id) {
            st.w.devices[m.dev].keys.remove(&m.key);
            abi::unregister(m.shell.ptr().cast());
        }
        0
    })
}

unsafe extern "C" fn create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel {
    with(
        context.cast(),
        Kind::Context,
        null_mut(),
        |shared, st, ctx| {
            let Some(fd) = EventFd::new() else {
                return null_mut();
            };
            let id = st.w.alloc_id();
            let ch = ibv_comp_channel {
                context,
                fd: fd.raw(),
                refcnt: 0,
            };
            let shell = Shell::new(ch, id);
            let p = shell.ptr();
            st.w.channels.insert(
                id,
                Channel {
                    ctx,
                    fd,
                    events: VecDeque::new(),
                    shell,
                },
            );
            abi::register(p.cast(), Kind::Channel, shared, id);
            p
        },
    )
}

unsafe extern "C" fn destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    with_status(channel.cast(), Kind::Channel, |_, st, id| {
        if st.w.cqs.values().any(|c| c.channel == Some(id)) {
            return libc::EBUSY;
        }
        if let Some(c) = st.w.channels.remove(&id) {
            abi::unregister(c.shell.ptr().cast());
            // A thread blocked in get_cq_event wakes, finds the channel gone, and fails.
            c.fd.wake_all();
        }
        0
    })
}

unsafe extern "C" fn create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    let ch = if channel.is_null() {
        None
    } else {
        match abi::lookup(channel.cast(), Kind::Channel) {
            Some((_, id)) => Some(id),
            None => {
                set_errno(libc::EINVAL);
                return null_mut();
            }
        }
    };
    with(
        context.cast(),
        Kind::Context,
        null_mut(),
        |shared, st, ctx| {
            let channel_ok = ch.is_none_or(|c| st.w.channels.get(&c).is_some_and(|c| c.ctx == ctx));
            if cqe < 1 || cqe as u32 > st.w.cfg.max_cqe || comp_vector != 0 || !channel_ok {
                set_errno(libc::EINVAL);
                return null_mut();
            }
            let id = st.w.alloc_id();
            let cq = ibv_cq {
                context,
                channel,
                cq_context,
                handle: id,
                cqe,
                ..Default::default()
            };
            let shell = Shell::new(cq, id);
            let p = shell.ptr();
            st.w.cqs.insert(
                id,
                Cq {
                    ctx,
                    channel: ch,
                    capacity: cqe as usize,
                    entries: VecDeque::new(),
                    arm: Arm::Off,
                    overflowed: false,
                    shell,
                },
            );
            abi::register(p.cast(), Kind::Cq, shared, id);
            p
        },
    )
}

unsafe extern "C" fn destroy_cq(cq: *mut ibv_cq) -> c_int {
    with_status(cq.cast(), Kind::Cq, |_, st, id| {
        if st.qps.values().any(|q| q.send_cq == id || q.recv_cq == id) {
            return libc::EBUSY;
        }
        if let Some(c) = st.w.cqs.remove(&id) {
            abi::unregister(c.shell.ptr().cast());
            if let Some(ch) = c.channel.and_then(|ch| st.w.channels.get_mut(&ch)) {
                ch.events.retain(|&(cq, _)| cq != id);
            }
        }
        0
    })
}

unsafe extern "C" fn get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    if cq.is_null() || cq_context.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    let Ok(fd) = try_with(channel.cast(), Kind::Channel, |shared, st, id| {
        // The caller may sleep now: a progress thread leaving the link to pollers takes over.
        shared.stopped_polling();
        Arc::clone(&st.w.channels[&id].fd)
    }) else {
        return -1;
    };
    // Wait without holding the fabric's lock: another thread drives progress meanwhile. The
    // descriptor stays open while this thread holds it, even if the channel is destroyed.
    if let Err(e) = fd.wait() {
        set_errno(e);
        return -1;
    }
    with(channel.cast(), Kind::Channel, -1, |_, st, id| {
        let Some((cq_id, user)) =
            st.w.channels
                .get_mut(&id)
                .and_then(|c| c.events.pop_front())
        else {
            set_errno(libc::EAGAIN);
            return -1;
        };
        let p =
            st.w.cqs
                .get_mut(&cq_id)
                .map_or(null_mut(), |c| c.shell.ptr());
        // SAFETY: both out-pointers were checked non-null and, per the contract, are writable.
        unsafe {
            *cq = p;
            *cq_context = user;
        }
        0
    })
}

unsafe extern "C" fn ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) {
    with(cq.cast(), Kind::Cq, (), |_, st, id| {
        if let Some(c) = st.w.cqs.get_mut(&id) {
            c.shell.update(|cq| {
                cq.comp_events_completed = cq.comp_events_completed.wrapping_add(nevents)
            });
        }
    })
}

unsafe extern "C" fn create_srq(pd: *mut ibv_pd, init: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    with(pd.cast(), Kind::Pd, null_mut(), |shared, st, pd_id| {
        if init.is_null() {
            set_errno(libc::EINVAL);
            return null_mut();
        }
        // SAFETY: non-null, and points to a valid `ibv_srq_init_attr` per the contract.
        let init = unsafe { &mut *init };
        let a = init.attr;
        let c = &st.w.cfg;
        if a.max_wr == 0
            || a.max_wr > c.max_srq_wr
            || a.max_sge > c.max_sge
            || a.srq_limit > a.max_wr
        {
            set_errno(libc::EINVAL);
            return null_mut();
        }
        let max_sge = a.max_sge.max(1);
        init.attr.max_sge = max_sge;
        let ctx = st.w.pds[&pd_id].ctx;
        let context = st.w.context_ptr(ctx);
        let id = st.w.alloc_id();
        let srq = ibv_srq {
            context,
            srq_context: init.srq_context,
            pd,
            handle: id,
            ..Default::default()
        };
        let shell = Shell::new(srq, id);
        let p = shell.ptr();
        st.w.srqs.insert(
            id,
            Srq {
                ctx,
                pd: pd_id,
                max_wr: a.max_wr,
                max_sge,
                limit: a.srq_limit,
                wqes: VecDeque::new(),
                unreclaimed: 0,
                shell,
            },
        );
        abi::register(p.cast(), Kind::Srq, shared, id);
        p
    })
}

unsafe extern "C" fn modify_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> c_int {
    with_status(srq.cast(), Kind::Srq, |_, st, id| {
        let max_wr_bit = ibverbs_sys::IBV_SRQ_MAX_WR as c_int;
        let limit_bit = ibverbs_sys::IBV_SRQ_LIMIT as c_int;
        if attr.is_null() || mask & !(max_wr_bit | limit_bit) != 0 {
            return libc::EINVAL;
        }
        // SAFETY: non-null, and points to a valid `ibv_srq_attr` per the contract.
        let a = unsafe { *attr };
        let max = st.w.cfg.max_srq_wr;
        let s = st.w.srqs.get_mut(&id).expect("registered SRQ exists");
        let max_wr = if mask & max_wr_bit != 0 {
            a.max_wr
        } else {
            s.max_wr
        };
        let in_use = s.wqes.len() as u32 + s.unreclaimed;
        if max_wr == 0 || max_wr > max || max_wr < in_use {
            return libc::EINVAL;
        }
        if mask & limit_bit != 0 && a.srq_limit > max_wr {
            return libc::EINVAL;
        }
        s.max_wr = max_wr;
        if mask & limit_bit != 0 {
            s.limit = a.srq_limit;
        }
        0
    })
}

unsafe extern "C" fn query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    with_status(srq.cast(), Kind::Srq, |_, st, id| {
        if attr.is_null() {
            return libc::EINVAL;
        }
        let s = &st.w.srqs[&id];
        // SAFETY: non-null, and points to a writable `ibv_srq_attr` per the contract.
        unsafe {
            *attr = ibv_srq_attr {
                max_wr: s.max_wr,
                max_sge: s.max_sge,
                srq_limit: s.limit,
            }
        };
        0
    })
}

unsafe extern "C" fn destroy_srq(srq: *mut ibv_srq) -> c_int {
    with_status(srq.cast(), Kind::Srq, |_, st, id| {
        if st.qps.values().any(|q| q.srq == Some(id)) {
            return libc::EBUSY;
        }
        if let Some(s) = st.w.srqs.remove(&id) {
            abi::unregister(s.shell.ptr().cast());
        }
        0
    })
}

unsafe extern "C" fn create_qp(pd: *mut ibv_pd, init: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    if init.is_null() {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    // SAFETY: non-null, and points to a valid `ibv_qp_init_attr` per the contract.
    let ia = unsafe { &mut *init };
    let send_cq = abi::lookup(ia.send_cq.cast(), Kind::Cq).map(|(_, id)| id);
    let recv_cq = abi::lookup(ia.recv_cq.cast(), Kind::Cq).map(|(_, id)| id);
    let srq = if ia.srq.is_null() {
        Ok(None)
    } else {
        abi::lookup(ia.srq.cast(), Kind::Srq)
            .map(|(_, id)| Some(id))
            .ok_or(())
    };
    with(pd.cast(), Kind::Pd, null_mut(), |shared, st, pd_id| {
        let ctx = st.w.pds[&pd_id].ctx;
        let same_ctx = |cq: Option<u32>| {
            cq.and_then(|c| st.w.cqs.get(&c))
                .is_some_and(|c| c.ctx == ctx)
        };
        let srq_ok = match srq {
            Ok(None) => true,
            Ok(Some(s)) => st.w.srqs.get(&s).is_some_and(|s| s.ctx == ctx),
            Err(()) => false,
        };
        let transport = match ia.qp_type {
            ibv_qp_type::IBV_QPT_RC => Some(Transport::Rc),
            ibv_qp_type::IBV_QPT_UC => Some(Transport::Uc),
            ibv_qp_type::IBV_QPT_UD => Some(Transport::Ud),
            _ => None,
        };
        let c = &st.w.cfg;
        let mut cap = ia.cap;
        let with_srq = matches!(srq, Ok(Some(_)));
        if with_srq {
            cap.max_recv_wr = 0;
            cap.max_recv_sge = 0;
        }
        let caps_ok = cap.max_send_wr <= c.max_qp_wr
            && cap.max_recv_wr <= c.max_qp_wr
            && cap.max_send_sge <= c.max_sge
            && cap.max_recv_sge <= c.max_sge
            && cap.max_inline_data <= c.max_inline_data;
        let (Some(transport), true, true, true, true) = (
            transport,
            same_ctx(send_cq),
            same_ctx(recv_cq),
            srq_ok,
            caps_ok,
        ) else {
            set_errno(libc::EINVAL);
            return null_mut();
        };
        ia.cap = cap;
        let dev = st.w.contexts[&ctx].dev;
        let d = &mut st.w.devices[dev];
        let mut qpn = d.next_qpn;
        while d.qpns.contains_key(&qpn) || qpn < 0x11 {
            qpn = (qpn + 1) & 0x00ff_ffff;
        }
        d.next_qpn = (qpn + 1) & 0x00ff_ffff;
        let id = st.w.alloc_id();
        let context = st.w.context_ptr(ctx);
        let qp = ibv_qp {
            context,
            qp_context: ia.qp_context,
            pd,
            send_cq: ia.send_cq,
            recv_cq: ia.recv_cq,
            srq: if with_srq { ia.srq } else { null_mut() },
            handle: id,
            qp_num: qpn,
            state: ibv_qp_state::IBV_QPS_RESET,
            qp_type: ia.qp_type,
            ..Default::default()
        };
        let shell = Shell::new(qp, id);
        let p = shell.ptr();
        let attr = ibv_qp_attr {
            qp_state: ibv_qp_state::IBV_QPS_RESET,
            path_mtu: ibverbs_sys::IBV_MTU_1024,
            port_num: 1,
            cap,
            ..Default::default()
        };
        st.w.devices[dev].qpns.insert(qpn, id);
        st.qps.insert(
            id,
            Qp {
                id,
                ctx,
                dev,
                pd: pd_id,
                send_cq: send_cq.expect("checked above"),
                recv_cq: recv_cq.expect("checked above"),
                srq: srq.ok().flatten(),
                qpn,
                transport,
                state: ibv_qp_state::IBV_QPS_RESET,
                cap,
                sq_sig_all: ia.sq_sig_all != 0,
                attr,
                dest_dev: None,
                epoch: 0,
                sq: SendQueue::default(),
                rq: RecvQueue::default(),
                req: Requester::default(),
                resp: Responder::default(),
                counters: Default::default(),
                shell,
            },
        );
        abi::register(p.cast(), Kind::Qp, shared, id);
        p
    })
}

unsafe extern "C" fn modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    with_status(qp.cast(), Kind::Qp, |_, st, id| {
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: non-null, and points to a valid `ibv_qp_attr` per the contract.
        let a = unsafe { &*attr };
        let State { qps, w } = st;
        let q = qps.get_mut(&id).expect("registered QP exists");
        let r = q.modify(w, a, mask as u32);
        st.progress();
        r
    })
}

unsafe extern "C" fn query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    with_status(qp.cast(), Kind::Qp, |_, st, id| {
        if attr.is_null() || init.is_null() {
            return libc::EINVAL;
        }
        let q = &st.qps[&id];
        let mut a = q.attr;
        a.qp_state = q.state;
        a.cur_qp_state = q.state;
        a.cap = q.cap;
        a.sq_draining =
            u8::from(q.state == ibv_qp_state::IBV_QPS_SQD && q.sq.wqes.iter().any(|w| w.started));
        let shell = q.shell.get();
        let i = ibv_qp_init_attr {
            qp_context: shell.qp_context,
            send_cq: shell.send_cq,
            recv_cq: shell.recv_cq,
            srq: shell.srq,
            cap: q.cap,
            qp_type: q.qp_type(),
            sq_sig_all: c_int::from(q.sq_sig_all),
        };
        // SAFETY: both non-null, and point to writable structs per the contract.
        unsafe {
            *attr = a;
            *init = i;
        }
        0
    })
}

unsafe extern "C" fn destroy_qp(qp: *mut ibv_qp) -> c_int {
    with_status(qp.cast(), Kind::Qp, |_, st, id| {
        let Some(mut q) = st.qps.remove(&id) else {
            return libc::EINVAL;
        };
        q.reset(&mut st.w);
        st.w.devices[q.dev].qpns.remove(&q.qpn);
        st.w.devices[q.dev].tx_ready.remove(&id);
        abi::unregister(q.shell.ptr().cast());
        0
    })
}

unsafe extern "C" fn create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    with(pd.cast(), Kind::Pd, null_mut(), |shared, st, pd_id| {
        if attr.is_null() {
            set_errno(libc::EINVAL);
            return null_mut();
        }
        // SAFETY: non-null, and points to a valid `ibv_ah_attr` per the contract.
        let a = unsafe { *attr };
        let ctx = st.w.pds[&pd_id].ctx;
        let gids = st.w.devices[st.w.contexts[&ctx].dev].gids().count();
        if a.is_global != 1 || a.port_num != 1 || usize::from(a.grh.sgid_index) >= gids {
            set_errno(libc::EINVAL);
            return null_mut();
        }
        let context = st.w.context_ptr(ctx);
        let id = st.w.alloc_id();
        let shell = Shell::new(
            ibv_ah {
                context,
                pd,
                handle: id,
            },
            id,
        );
        let p = shell.ptr();
        st.w.ahs.insert(
            id,
            Ah {
                ctx,
                pd: pd_id,
                dgid: gid_bytes(&a.grh.dgid),
                shell,
            },
        );
        st.w.ah_by_ptr.insert(p as usize, id);
        abi::register(p.cast(), Kind::Ah, shared, id);
        p
    })
}

unsafe extern "C" fn destroy_ah(ah: *mut ibv_ah) -> c_int {
    with_status(ah.cast(), Kind::Ah, |_, st, id| {
        if let Some(a) = st.w.ahs.remove(&id) {
            let p = a.shell.ptr();
            st.w.ah_by_ptr.remove(&(p as usize));
            abi::unregister(p.cast());
        }
        0
    })
}

unsafe extern "C" fn get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    if event.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    let Ok(fd) = try_with(context.cast(), Kind::Context, |_, st, id| {
        Arc::clone(&st.w.contexts[&id].async_fd)
    }) else {
        return -1;
    };
    // As in get_cq_event: the descriptor outlives a concurrent close_device.
    if let Err(e) = fd.wait() {
        set_errno(e);
        return -1;
    }
    with(context.cast(), Kind::Context, -1, |_, st, id| {
        let Some(ev) =
            st.w.contexts
                .get_mut(&id)
                .and_then(|c| c.events.pop_front())
        else {
            set_errno(libc::EAGAIN);
            return -1;
        };
        let element = match ev.element {
            Element::Cq(c) => ibv_async_event__bindgen_ty_1 {
                cq: st.w.cqs.get_mut(&c).map_or(null_mut(), |c| c.shell.ptr()),
            },
            Element::Qp(q) => ibv_async_event__bindgen_ty_1 {
                qp: st.qps.get_mut(&q).map_or(null_mut(), |q| q.shell.ptr()),
            },
            Element::Srq(s) => ibv_async_event__bindgen_ty_1 {
                srq: st.w.srqs.get_mut(&s).map_or(null_mut(), |s| s.shell.ptr()),
            },
        };
        // SAFETY: checked non-null; writable per the contract.
        unsafe {
            *event = ibv_async_event {
                element,
                event_type: ev.kind,
            }
        };
        0
    })
}

unsafe extern "C" fn ack_async_event(event: *mut ibv_async_event) {
    if event.is_null() {
        return;
    }
    // SAFETY: non-null, and points to an event `get_async_event` filled, per the contract.
    let ev = unsafe { *event };

    match ev.event_type {
        IBV_EVENT_CQ_ERR => {
            // SAFETY: for this event type the union holds the CQ pointer.
            let p = unsafe { ev.element.cq };
            with(p.cast(), Kind::Cq, (), |_, st, id| {
                if let Some(c) = st.w.cqs.get_mut(&id) {
                    c.shell.update(|cq| cq.async_events_completed += 1);
                }
            });
        }
        IBV_EVENT_SRQ_LIMIT_REACHED | IBV_EVENT_SRQ_ERR => {
            // SAFETY: for these event types the union holds the SRQ pointer.
            let p = unsafe { ev.element.srq };
            with(p.cast(), Kind::Srq, (), |_, st, id| {
                if let Some(s) = st.w.srqs.get_mut(&id) {
                    s.shell.update(|s| s.events_completed += 1);
                }
            });
        }
        IBV_EVENT_PORT_ACTIVE
        | IBV_EVENT_PORT_ERR
        | IBV_EVENT_LID_CHANGE
        | IBV_EVENT_PKEY_CHANGE
        | IBV_EVENT_SM_CHANGE
        | IBV_EVENT_CLIENT_REREGISTER
        | IBV_EVENT_GID_CHANGE
        | IBV_EVENT_DEVICE_FATAL => {}
        _ => {
            // SAFETY: every other event type is about a QP.
            let p = unsafe { ev.element.qp };
            with(p.cast(), Kind::Qp, (), |_, st, id| {
                if let Some(q) = st.qps.get_mut(&id) {
                    q.shell.update(|q| q.events_completed += 1);
                }
            });
        }
    }
}
