//! Events: taken from softnic's CM and laid out as `struct rdma_cm_event`.

use std::ffi::{c_char, c_int};
use std::ptr::null_mut;

use ibverbs_sys::ibv_ah_attr;
use softnic::cm::cabi::CEvent;

use std::sync::Arc;

use crate::id::{Channel, Id, id_by_cm, new_id, turn};
use crate::types::*;
use crate::{EVENT_NAMES, fail, lib};

/// An event as handed out: the struct programs read, then its private data and the ids it
/// names (kept until the event is acked, as librdmacm keeps a destroyed id for its events).
#[repr(C)]
struct Event {
    ev: rdma_cm_event,
    private: [u8; 256],
    ids: [Option<Arc<Id>>; 2],
}

const CONNECT_REQUEST: u32 = 4;
const MULTICAST_JOIN: u32 = 12;

export! {
    /// The next event of the channel: blocks until one comes, unless the channel's `fd` was
    /// made non-blocking (then -1 with `EAGAIN`).
    "RDMACM_1.0" fn rdma_get_cm_event(channel: *mut rdma_event_channel, event: *mut *mut rdma_cm_event) -> c_int {
        let l = match lib() {
            Ok(l) => l,
            Err(e) => return fail(e),
        };
        if channel.is_null() || event.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: a channel this library handed out, here or in a process this one was
        // forked from (never freed: see `Channel`), per the contract.
        let Some(ch) = (unsafe { Channel::of(l, channel) }) else {
            return fail(libc::EINVAL);
        };
        if ch.gone() {
            wait_for_ever();
        }
        let cm = ch.cm;
        // Events of ids destroyed meanwhile (by another thread) are passed over, as the
        // kernel drops them with the id; so is a request whose listener went (rejected).
        let mut c = CEvent::default();
        // Another thread may be calling on the same id meanwhile (rping's main thread on the
        // id its event thread takes events of), as with librdmacm: its fields are read in a
        // turn.
        let (id, listener) = loop {
            // SAFETY: a context of the fabric and a valid out-pointer; may block in the CM.
            let e = unsafe { (l.ops.get_event)(l.ctx(), cm, &mut c) };
            if e != 0 {
                // The channel was destroyed since the look above (its mark is set first).
                if ch.gone() {
                    wait_for_ever();
                }
                return fail(e);
            }
            if c.kind != CONNECT_REQUEST {
                match id_by_cm(c.id) {
                    Some(i) => break (i, None),
                    None => continue,
                }
            }
            let Some(lp) = id_by_cm(c.listen_id) else {
                // SAFETY: a context of the fabric; the request's id, never handed out.
                unsafe { (l.ops.destroy_id)(l.ctx(), c.id) };
                continue;
            };
            let (ps, ctx, chan, qp_type) = {
                let mut t = turn(&lp);
                let sync = t.calls.sync;
                let c = t.c();
                (c.ps, c.context, if sync { null_mut() } else { c.channel }, c.qp_type)
            };
            match new_id(l, chan, ctx, ps, Some(c.id)) {
                Ok(p) => {
                    let mut t = turn(&p);
                    // A request's id is of its listener's QP type (librdmacm's), an XRC
                    // listener's too.
                    t.c().qp_type = qp_type;
                    t.refresh(l);
                    drop(t);
                    break (p, Some(lp));
                }
                Err(e) => return fail(e),
            }
        };
        let (ps, verbs, join_context) = {
            let mut t = turn(&id);
            // A join's event hands back the context the join was given.
            let context = (t.calls.joins.iter())
                .find(|&&(g, _)| c.kind == MULTICAST_JOIN && g == c.peer_gid)
                .map(|&(_, k)| k);
            (t.c().ps, t.c().verbs, context)
        };
        let mut out = Box::new(Event {
            ev: rdma_cm_event {
                id: id.raw(),
                listen_id: listener.as_ref().map_or(null_mut(), |l| l.raw()),
                event: c.kind as c_int,
                status: c.status,
                param: rdma_cm_event_param {
                    ud: rdma_ud_param {
                        private_data: std::ptr::null(),
                        private_data_len: 0,
                        ah_attr: ibv_ah_attr::default(),
                        qp_num: 0,
                        qkey: 0,
                    },
                },
            },
            private: c.private,
            ids: [Some(id), listener],
        });
        let private = if c.private_len > 0 {
            out.private.as_ptr().cast()
        } else {
            std::ptr::null()
        };
        let len = c.private_len.min(255) as u8;
        if ps == RDMA_PS_UDP {
            let mut ah = ibv_ah_attr {
                is_global: 1,
                port_num: 1,
                ..Default::default()
            };
            ah.grh.dgid.raw = c.peer_gid;
            ah.grh.hop_limit = 64;
            ah.grh.sgid_index = if verbs.is_null() {
                0
            } else {
                crate::id::sgid_index(verbs)
            };
            out.ev.param.ud = rdma_ud_param {
                private_data: join_context.map_or(private, |k| k as *const std::ffi::c_void),
                private_data_len: len,
                ah_attr: ah,
                qp_num: c.param.qp_num,
                qkey: c.param.qkey,
            };
        } else {
            let p = c.param;
            out.ev.param.conn = rdma_conn_param {
                private_data: private,
                private_data_len: len,
                responder_resources: p.responder_resources,
                initiator_depth: p.initiator_depth,
                flow_control: u8::from(p.flow_control),
                retry_count: p.retry_count,
                rnr_retry_count: p.rnr_retry_count,
                srq: u8::from(p.srq),
                qp_num: p.qp_num,
            };
        }
        let raw = Box::into_raw(out);
        // SAFETY: `Event` starts with the `rdma_cm_event`; a valid out-pointer.
        unsafe { event.write(raw.cast()) };
        0
    }

    /// Frees an event.
    "RDMACM_1.0" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
        if event.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: an event rdma_get_cm_event handed out (an `Event` made by Box::into_raw).
        drop(unsafe { Box::from_raw(event.cast::<Event>()) });
        0
    }

    /// The name of an event type.
    "RDMACM_1.0" fn rdma_event_str(event: c_int) -> *const c_char {
        usize::try_from(event)
            .ok()
            .and_then(|e| EVENT_NAMES.get(e))
            .map_or(c"UNKNOWN EVENT".as_ptr(), |n| n.as_ptr())
    }
}

/// What a thread that calls `rdma_get_cm_event` on a destroyed channel does: it waits for
/// ever, as one that called a moment earlier does (a wait on a channel destroyed under it goes
/// on, as a read of the kernel CM's descriptor does when another thread closes it). Programs
/// destroy the channel under their event thread and exit: rping called `exit(-1)` on the
/// error this was, racing its main thread's `exit(0)`.
fn wait_for_ever() -> ! {
    loop {
        std::thread::park();
    }
}
