//! Devices, contexts, protection domains and async events.

use std::ffi::{c_char, c_int};
use std::ptr::null_mut;
use std::sync::Arc;

use ibverbs_sys::*;

use super::{try_with, with, with_status};
use crate::abi::{self, Kind, Shell, set_errno};
use crate::cq::EventFd;
use crate::fabric::Shared;
use crate::state::{Context, Element, Pd};

use super::cq::{destroy_comp_channel, destroy_cq};
use super::memory::dereg_mr;
use super::queues::{destroy_ah, destroy_qp};
use super::srqs::destroy_srq;

pub(super) unsafe extern "C" fn get_device_name(device: *mut ibv_device) -> *const c_char {
    with(
        device.cast(),
        Kind::Device,
        std::ptr::null(),
        |_, st, idx| {
            // SAFETY: the device shell lives forever; its name is a NUL-terminated array.
            unsafe { (*st.w.devices[idx as usize].shell.ptr()).dev.name.as_ptr() }
        },
    )
}

pub(super) unsafe extern "C" fn open_device(device: *mut ibv_device) -> *mut ibv_context {
    with(
        device.cast(),
        Kind::Device,
        null_mut(),
        |shared, st, idx| {
            let Some(fd) = EventFd::new() else {
                return null_mut();
            };
            // The kernel's `cmd_fd` is the open device file; softnic's is a descriptor of its
            // own (an event descriptor nothing signals), so that `dup` and `fcntl` on it work
            // as on any device's; importing it elsewhere (`ibv_import_device`) is EOPNOTSUPP.
            let Some(cmd) = EventFd::new() else {
                return null_mut();
            };
            let id = st.w.alloc_id();
            let ops = crate::ops::context_ops();
            let ctx = ibv_context {
                device: st.w.devices[idx as usize].shell.ptr().cast(),
                ops,
                cmd_fd: cmd.raw(),
                async_fd: fd.raw(),
                num_comp_vectors: 1,
                ..Default::default()
            };
            let shell = Shell::wrapped(crate::extended::VerbsContext::new(ctx), id);
            let p = shell.ptr();
            st.w.contexts.insert(
                id,
                Context {
                    dev: idx as usize,
                    shell,
                    _cmd_fd: cmd,
                    events: crate::cq::Events::new(fd),
                },
            );
            abi::register(p.cast(), Kind::Context, shared, id);
            p
        },
    )
}

pub(super) unsafe extern "C" fn close_device(context: *mut ibv_context) -> c_int {
    with_status(context.cast(), Kind::Context, |_, st, id| {
        let w = &st.w;
        let busy = w.pds.values().any(|o| o.ctx == id)
            || w.cqs.values().any(|o| o.ctx == id)
            || w.channels.values().any(|o| o.ctx == id)
            || w.srqs.values().any(|o| o.ctx == id)
            || w.ahs.values().any(|o| o.ctx == id)
            || w.mrs.values().any(|o| o.ctx == id)
            || w.mws.values().any(|o| o.ctx == id)
            || w.xrcds.values().any(|o| o.ctx == id)
            || st.qps.values().any(|o| o.ctx == id);
        if busy {
            return libc::EBUSY;
        }
        if let Some(c) = st.w.contexts.remove(&id) {
            abi::unregister(c.shell.ptr().cast());
            // A thread blocked in get_async_event wakes, finds the context gone, and fails.
            c.events.fd().wake_all();
        }
        0
    })
}

/// Closes `context` after destroying every object still made on it (QPs, address handles,
/// memory windows, memory regions, SRQs, CQs, completion channels, PDs, in that order), as the kernel does
/// when a process closes its device file: what a drop-in libibverbs's `ibv_close_device`
/// does, whereas [`CONTROL`](crate::CONTROL)'s `close_device` refuses a context still in use (EBUSY).
/// Returns 0, or the errno of what could not be destroyed or closed (an object another
/// thread destroyed meanwhile is EINVAL; one it made meanwhile leaves the context open,
/// EBUSY). In a forked child, a context of its parent's is closed as the child's copy of the
/// kernel's device file would be: 0, and the parent's objects are left to the parent.
///
/// # Safety
///
/// `context` is any pointer (softnic refuses one it did not make, EINVAL); the caller is done
/// with the context's objects (they are destroyed: their pointers are refused from then on).
pub unsafe extern "C" fn release_device(context: *mut ibv_context) -> c_int {
    if abi::take_inherited(context.cast(), Kind::Context) {
        return 0;
    }
    type Shells = (
        Vec<*mut ibv_qp>,
        Vec<*mut ibv_ah>,
        Vec<*mut ibv_mw>,
        Vec<*mut ibv_mr>,
        Vec<*mut ibv_srq>,
        Vec<*mut ibv_xrcd>,
        Vec<*mut ibv_cq>,
        Vec<*mut ibv_comp_channel>,
        Vec<*mut ibv_pd>,
    );
    let found: Result<Shells, c_int> = try_with(context.cast(), Kind::Context, |_, st, id| {
        // Released, nothing waits for the acknowledgement of an event (the kernel's release of
        // a closed descriptor does not): what was handed out is forgotten.
        for (_, c) in st.w.cqs.iter_mut().filter(|(_, c)| c.ctx == id) {
            let shell = c.shell.get();
            c.comp_reported = shell.comp_events_completed;
            c.async_reported = shell.async_events_completed;
        }
        for (_, q) in st.qps.iter_mut().filter(|(_, q)| q.ctx == id) {
            q.events_reported = q.shell.get().events_completed;
        }
        for (_, s) in st.w.srqs.iter_mut().filter(|(_, s)| s.ctx == id) {
            s.events_reported = s.shell.get().events_completed;
        }
        // The shell pointers of the objects of a table that belong to this context, in id
        // order whatever the table's own, so that closing replays alike.
        macro_rules! of_context {
            ($table:expr) => {{
                let mut v: Vec<_> = $table
                    .iter_mut()
                    .filter(|(_, o)| o.ctx == id)
                    .map(|(&k, o)| (k, o.shell.ptr()))
                    .collect();
                v.sort_unstable_by_key(|&(k, _)| k);
                v.into_iter().map(|(_, p)| p).collect()
            }};
        }
        let w = &mut st.w;
        (
            of_context!(st.qps),
            of_context!(w.ahs),
            of_context!(w.mws),
            of_context!(w.mrs),
            of_context!(w.srqs),
            of_context!(w.xrcds),
            of_context!(w.cqs),
            of_context!(w.channels),
            of_context!(w.pds),
        )
    });
    let (qps, ahs, mws, mrs, srqs, xrcds, cqs, channels, pds) = match found {
        Ok(f) => f,
        Err(e) => return e,
    };
    let mut first = 0;
    let mut keep = |r: c_int| {
        if first == 0 {
            first = r;
        }
    };
    // SAFETY: each pointer is one softnic handed out for this context; the destroy verbs look
    // each up again and refuse one destroyed meanwhile (EINVAL) without touching it.
    unsafe {
        qps.into_iter().for_each(|p| keep(destroy_qp(p)));
        ahs.into_iter().for_each(|p| keep(destroy_ah(p)));
        mws.into_iter().for_each(|p| keep(super::dealloc_mw(p)));
        mrs.into_iter().for_each(|p| keep(dereg_mr(p)));
        srqs.into_iter().for_each(|p| keep(destroy_srq(p)));
        xrcds
            .into_iter()
            .for_each(|p| keep(crate::extended::close_xrcd(p)));
        cqs.into_iter().for_each(|p| keep(destroy_cq(p)));
        channels
            .into_iter()
            .for_each(|p| keep(destroy_comp_channel(p)));
        pds.into_iter().for_each(|p| keep(dealloc_pd(p)));
        keep(close_device(context));
    }
    first
}

pub(super) unsafe extern "C" fn query_device(
    context: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    with_status(context.cast(), Kind::Context, |_, st, id| {
        if attr.is_null() {
            return libc::EINVAL;
        }
        let c = &st.w.cfg;
        let dev = st.w.contexts[&id].dev;
        let mut a = ibv_device_attr {
            node_guid: st.w.devices[dev].node_guid(dev).to_be(),
            sys_image_guid: st.w.devices[dev].node_guid(dev).to_be(),
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
            max_mw: 1 << 20,
            // Memory windows of type 1 and 2B, as rxe reports them, and XRC.
            device_cap_flags: IBV_DEVICE_MEM_WINDOW
                | IBV_DEVICE_MEM_WINDOW_TYPE_2B
                | IBV_DEVICE_XRC,
            max_pd: 1 << 16,
            max_qp_rd_atom: c.max_rd_atomic as i32,
            max_res_rd_atom: (c.max_rd_atomic as i32) << 16,
            max_qp_init_rd_atom: c.max_rd_atomic as i32,
            atomic_cap: ibverbs_sys::IBV_ATOMIC_HCA,
            max_ah: 1 << 16,
            max_mcast_grp: crate::mcast::MAX_GROUPS as i32,
            max_mcast_qp_attach: crate::mcast::MAX_QPS_PER_GROUP as i32,
            max_total_mcast_qp_attach: crate::mcast::MAX_ATTACHMENTS as i32,
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
pub(super) fn mtu_enum(bytes: u32) -> ibv_mtu {
    match bytes {
        4096 => ibverbs_sys::IBV_MTU_4096,
        2048 => ibverbs_sys::IBV_MTU_2048,
        1024 => ibverbs_sys::IBV_MTU_1024,
        512 => ibverbs_sys::IBV_MTU_512,
        _ => ibverbs_sys::IBV_MTU_256,
    }
}

pub(super) unsafe extern "C" fn query_port(
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

pub(super) unsafe extern "C" fn query_gid(
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

pub(super) unsafe extern "C" fn alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
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

pub(super) unsafe extern "C" fn dealloc_pd(pd: *mut ibv_pd) -> c_int {
    with_status(pd.cast(), Kind::Pd, |_, st, id| {
        let w = &st.w;
        let busy = w.mrs.values().any(|o| o.pd == id)
            || w.mws.values().any(|o| o.pd == id)
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

pub(super) unsafe extern "C" fn get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    if event.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // The descriptor counts the events queued (a destroyed object's go with it): an event
    // is taken with its count under the fabric's lock, and with none queued the caller
    // sleeps until one comes (EAGAIN if it made the descriptor non-blocking), outside it.
    loop {
        let Ok(taken) = try_with(context.cast(), Kind::Context, |_, st, id| {
            let c = st.w.contexts.get_mut(&id).ok_or(None)?;
            let Some(ev) = c.events.pop() else {
                return Err(Some(Arc::clone(c.events.fd())));
            };
            // Counted as handed out: destroying the object waits for its acknowledgement. (A
            // destroyed object's events went with it: the look-ups find their objects.)
            let element = match ev.element {
                Element::Cq(c) => {
                    let c = st.w.cqs.get_mut(&c).ok_or(None)?;
                    c.async_reported = c.async_reported.wrapping_add(1);
                    ibv_async_event__bindgen_ty_1 { cq: c.shell.ptr() }
                }
                Element::Qp(q) => {
                    let q = st.qps.get_mut(&q).ok_or(None)?;
                    q.events_reported = q.events_reported.wrapping_add(1);
                    ibv_async_event__bindgen_ty_1 { qp: q.shell.ptr() }
                }
                Element::Srq(s) => {
                    let s = st.w.srqs.get_mut(&s).ok_or(None)?;
                    s.events_reported = s.events_reported.wrapping_add(1);
                    ibv_async_event__bindgen_ty_1 { srq: s.shell.ptr() }
                }
            };
            // SAFETY: checked non-null; writable per the contract.
            unsafe {
                *event = ibv_async_event {
                    element,
                    event_type: ev.kind,
                }
            };
            Ok(())
        }) else {
            return -1;
        };
        let fd = match taken {
            Ok(()) => return 0,
            // The object of the event taken is gone (or the context: the next look-up fails,
            // or finds the context now at that address).
            Err(None) => continue,
            Err(Some(fd)) => fd,
        };
        // As in get_cq_event: the descriptor outlives a concurrent close_device (which wakes
        // it; the look-up above then fails).
        if let Err(e) = fd.wait_readable() {
            set_errno(e);
            return -1;
        }
    }
}

pub(super) unsafe extern "C" fn ack_async_event(event: *mut ibv_async_event) {
    if event.is_null() {
        return;
    }
    // SAFETY: non-null, and points to an event `get_async_event` filled, per the contract.
    let ev = unsafe { *event };
    let shared = |shared: &Arc<Shared>| Some(Arc::clone(shared));
    let acked = match ev.event_type {
        IBV_EVENT_CQ_ERR => {
            // SAFETY: for this event type the union holds the CQ pointer.
            let p = unsafe { ev.element.cq };
            with(p.cast(), Kind::Cq, None, |sh, st, id| {
                let c = st.w.cqs.get_mut(&id)?;
                c.shell.update(|cq| {
                    cq.async_events_completed = cq.async_events_completed.wrapping_add(1)
                });
                shared(sh)
            })
        }
        IBV_EVENT_SRQ_LIMIT_REACHED | IBV_EVENT_SRQ_ERR => {
            // SAFETY: for these event types the union holds the SRQ pointer.
            let p = unsafe { ev.element.srq };
            with(p.cast(), Kind::Srq, None, |sh, st, id| {
                let s = st.w.srqs.get_mut(&id)?;
                s.shell
                    .update(|s| s.events_completed = s.events_completed.wrapping_add(1));
                shared(sh)
            })
        }
        IBV_EVENT_PORT_ACTIVE
        | IBV_EVENT_PORT_ERR
        | IBV_EVENT_LID_CHANGE
        | IBV_EVENT_PKEY_CHANGE
        | IBV_EVENT_SM_CHANGE
        | IBV_EVENT_CLIENT_REREGISTER
        | IBV_EVENT_GID_CHANGE
        | IBV_EVENT_DEVICE_FATAL => None,
        _ => {
            // SAFETY: every other event type is about a QP.
            let p = unsafe { ev.element.qp };
            with(p.cast(), Kind::Qp, None, |sh, st, id| {
                let q = st.qps.get_mut(&id)?;
                q.shell
                    .update(|q| q.events_completed = q.events_completed.wrapping_add(1));
                shared(sh)
            })
        }
    };
    if let Some(shared) = acked {
        shared.acknowledged();
    }
}
