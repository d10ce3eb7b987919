//! Completion channels, completion queues and their events.

use std::collections::VecDeque;
use std::ffi::{c_int, c_uint, c_void};
use std::ptr::null_mut;
use std::sync::Arc;

use ibverbs_sys::*;

use super::{destroy_when_acked, try_with, with, with_status};
use crate::abi::{self, Kind, Shell, set_errno};
use crate::cq::{Arm, Channel, Cq, EventFd, Events};

pub(super) unsafe extern "C" fn create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
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
                    events: Events::new(fd),
                    shell,
                },
            );
            abi::register(p.cast(), Kind::Channel, shared, id);
            p
        },
    )
}

pub(super) unsafe extern "C" fn destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    with_status(channel.cast(), Kind::Channel, |_, st, id| {
        if st.w.cqs.values().any(|c| c.channel == Some(id)) {
            return libc::EBUSY;
        }
        if let Some(c) = st.w.channels.remove(&id) {
            abi::unregister(c.shell.ptr().cast());
            // A thread blocked in get_cq_event wakes, finds the channel gone, and fails.
            c.events.fd().wake_all();
        }
        0
    })
}

pub(super) unsafe extern "C" fn create_cq(
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
            Some(found) => Some(found),
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
            // Ids are per fabric: another fabric's channel must not pass for one of this.
            let channel_ok = ch.as_ref().is_none_or(|c| {
                Arc::ptr_eq(&c.fabric, shared)
                    && st.w.channels.get(&c.id).is_some_and(|c| c.ctx == ctx)
            });
            if cqe < 1 || cqe as u32 > st.w.cfg.max_cqe || comp_vector != 0 || !channel_ok {
                set_errno(libc::EINVAL);
                return null_mut();
            }
            let Some(id) = st.w.cqs.next_id() else {
                // Every slot of the table is taken (over a million CQs).
                set_errno(libc::ENOMEM);
                return null_mut();
            };
            let cq = ibv_cq {
                context,
                channel,
                cq_context,
                handle: id,
                cqe,
                ..Default::default()
            };
            let shell = Shell::wrapped(crate::extended::CqEx::new(cq), id);
            let p = shell.ptr();
            st.w.cqs.insert(
                id,
                Cq {
                    ctx,
                    channel: ch.as_ref().map(|c| c.id),
                    capacity: cqe as usize,
                    entries: VecDeque::new(),
                    wallclock: false,
                    arm: Arm::Off,
                    owed: None,
                    overflowed: false,
                    comp_reported: 0,
                    async_reported: 0,
                    shell,
                },
            );
            abi::register(p.cast(), Kind::Cq, shared, id);
            p
        },
    )
}

pub(super) unsafe extern "C" fn destroy_cq(cq: *mut ibv_cq) -> c_int {
    destroy_when_acked(cq.cast(), Kind::Cq, |_, st, id| {
        let for_srq =
            st.w.srqs
                .values()
                .any(|s| s.xrc.is_some_and(|x| x.cq == id));
        if for_srq || st.qps.values().any(|q| q.send_cq == id || q.recv_cq == id) {
            return Some(libc::EBUSY);
        }
        if st.w.cqs.get(&id).is_some_and(Cq::unacked) {
            return None;
        }
        st.w.settle_owed(id);
        if let Some(c) = st.w.cqs.remove(&id) {
            abi::unregister(c.shell.ptr().cast());
            st.w.drop_async_events(crate::state::Element::Cq(id));
            if let Some(ch) = c.channel.and_then(|ch| st.w.channels.get_mut(&ch)) {
                ch.events.take_if(|&(cq, _)| cq == id);
            }
        }
        Some(0)
    })
}

/// `ibv_resize_cq`: gives `cq` room for at least `cqe` completions (exactly `cqe`). 0, or
/// EINVAL for an unknown CQ, a size outside 1..=`max_cqe`, or one smaller than the number of
/// completions the CQ holds.
///
/// # Safety
///
/// `cq` is any pointer: softnic refuses one it did not make without dereferencing it.
pub unsafe extern "C" fn resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    with_status(cq.cast(), Kind::Cq, |_, st, id| {
        let max = st.w.cfg.max_cqe;
        let Some(c) = st.w.cqs.get_mut(&id) else {
            return libc::EINVAL;
        };
        match usize::try_from(cqe) {
            Ok(n) if n >= 1 && n <= max as usize && n >= c.entries.len() => {
                c.capacity = n;
                c.shell.update(|cq| cq.cqe = cqe);
                0
            }
            _ => libc::EINVAL,
        }
    })
}

pub(super) unsafe extern "C" fn get_cq_event(
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
        Arc::clone(st.w.channels[&id].events.fd())
    }) else {
        return -1;
    };
    loop {
        let taken = with(channel.cast(), Kind::Channel, Some(-1), |_, st, id| {
            if st.w.channels[&id].events.is_empty() {
                // The program waits: the events its CQs owe come now (`MISSED_EVENT_GRACE`).
                st.w.owed_events_waited(id);
            }
            let ch =
                st.w.channels
                    .get_mut(&id)
                    .expect("registered channel exists");
            let (cq_id, user) = ch.events.pop()?;
            let p = st.w.cqs.get_mut(&cq_id).map_or(null_mut(), |c| {
                c.comp_reported = c.comp_reported.wrapping_add(1);
                c.shell.ptr()
            });
            // SAFETY: both out-pointers were checked non-null and, per the contract, are
            // writable.
            unsafe {
                *cq = p;
                *cq_context = user;
            }
            Some(0)
        });
        if let Some(r) = taken {
            return r;
        }
        // None waits: sleep until one comes (EAGAIN if the caller made the descriptor non-
        // blocking), without holding the fabric's lock: another thread drives progress
        // meanwhile. The descriptor stays open while this thread holds it, even if the
        // channel is destroyed (then it wakes, and the look-up above fails).
        if let Err(e) = fd.wait_readable() {
            set_errno(e);
            return -1;
        }
    }
}

pub(super) unsafe extern "C" fn ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) {
    let shared = with(cq.cast(), Kind::Cq, None, |shared, st, id| {
        let c = st.w.cqs.get_mut(&id)?;
        c.shell
            .update(|cq| cq.comp_events_completed = cq.comp_events_completed.wrapping_add(nevents));
        Some(Arc::clone(shared))
    });
    if let Some(shared) = shared {
        shared.acknowledged();
    }
}
