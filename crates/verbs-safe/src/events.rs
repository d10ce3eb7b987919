//! Asynchronous events of a device (`ibv_get_async_event`): a QP that failed, an SRQ below
//! its limit, a port that went down. Read without blocking, acknowledged at once.

use std::sync::atomic::Ordering;

use ibverbs_sys as sys;
use ibverbs_sys::{ibv_async_event, ibv_async_event__bindgen_ty_1, ibv_event_type};

use crate::context::Context;
use crate::error::{Errno, Error, Result};

/// What an asynchronous event is about. Objects are named by identity only (a QP by its
/// number, a CQ or SRQ by its address as [`Cq::as_raw`](crate::Cq::as_raw) or
/// [`Srq::as_raw`](crate::Srq::as_raw) give it): the event does not keep them alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncElement {
    /// A QP, by number.
    QpNum(u32),
    /// A CQ, by address.
    CqAddr(usize),
    /// An SRQ, by address.
    SrqAddr(usize),
    /// A port.
    Port(u8),
    /// The device itself.
    Device,
}

/// One asynchronous event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    /// The event (`IBV_EVENT_*`).
    pub kind: ibv_event_type,
    /// What it is about.
    pub element: AsyncElement,
}

impl Context {
    /// The next asynchronous event of the device, if one is pending (never blocks: the
    /// context's event file descriptor is made non-blocking the first time). The event is
    /// acknowledged before it is returned, so it never holds up the destruction of the object
    /// it names.
    pub fn next_async_event(&self) -> Result<Option<AsyncEvent>> {
        if !self.async_nonblocking.swap(true, Ordering::AcqRel) {
            // SAFETY: `raw` is a live context (owned by `self`); its `async_fd` is an open
            // descriptor of the context. fcntl only changes the descriptor's flags.
            let rc = unsafe {
                let fd = (*self.raw).async_fd;
                let fl = libc::fcntl(fd, libc::F_GETFL);
                if fl < 0 {
                    fl
                } else {
                    libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK)
                }
            };
            if rc < 0 {
                self.async_nonblocking.store(false, Ordering::Release);
                return Err(self.event_err(Errno::last()));
            }
        }
        let mut ev = ibv_async_event {
            element: ibv_async_event__bindgen_ty_1 { port_num: 0 },
            event_type: 0,
        };
        // SAFETY: a live context and an out-struct of the right type.
        let rc = unsafe { (self.verbs.ctl.get_async_event)(self.raw, &mut ev) };
        if rc != 0 {
            let e = Errno::last();
            return match e.0 {
                libc::EAGAIN => Ok(None),
                _ => Err(self.event_err(e)),
            };
        }
        let element = element_of(&ev);
        // SAFETY: `ev` came from get_async_event on this context and is acknowledged once.
        unsafe { (self.verbs.ctl.ack_async_event)(&mut ev) };
        Ok(Some(AsyncEvent {
            kind: ev.event_type,
            element,
        }))
    }

    fn event_err(&self, errno: Errno) -> Error {
        Error::Query {
            what: "ibv_get_async_event",
            object: self.name().to_string(),
            errno,
        }
    }
}

/// The element an event names, read before the event is acknowledged (until then its object
/// cannot be destroyed: `ibv_destroy_*` waits for the acknowledgement).
fn element_of(ev: &ibv_async_event) -> AsyncElement {
    match ev.event_type {
        sys::IBV_EVENT_QP_FATAL
        | sys::IBV_EVENT_QP_REQ_ERR
        | sys::IBV_EVENT_QP_ACCESS_ERR
        | sys::IBV_EVENT_COMM_EST
        | sys::IBV_EVENT_SQ_DRAINED
        | sys::IBV_EVENT_PATH_MIG
        | sys::IBV_EVENT_PATH_MIG_ERR
        | sys::IBV_EVENT_QP_LAST_WQE_REACHED => {
            // SAFETY: QP events carry the QP pointer in the union (a plain pointer read).
            let qp = unsafe { ev.element.qp };
            let qpn = if qp.is_null() {
                0
            } else {
                // SAFETY: the event is not acknowledged yet, and until it is the QP cannot be
                // destroyed (`ibv_destroy_qp` waits for the acknowledgement): it is readable.
                unsafe { (*qp).qp_num }
            };
            AsyncElement::QpNum(qpn)
        }
        // SAFETY: CQ events carry the CQ pointer (only its address is kept).
        sys::IBV_EVENT_CQ_ERR => AsyncElement::CqAddr(unsafe { ev.element.cq } as usize),
        sys::IBV_EVENT_SRQ_ERR | sys::IBV_EVENT_SRQ_LIMIT_REACHED => {
            // SAFETY: SRQ events carry the SRQ pointer (only its address is kept).
            AsyncElement::SrqAddr(unsafe { ev.element.srq } as usize)
        }
        sys::IBV_EVENT_PORT_ACTIVE
        | sys::IBV_EVENT_PORT_ERR
        | sys::IBV_EVENT_LID_CHANGE
        | sys::IBV_EVENT_PKEY_CHANGE
        | sys::IBV_EVENT_SM_CHANGE
        | sys::IBV_EVENT_CLIENT_REREGISTER
        | sys::IBV_EVENT_GID_CHANGE => {
            // SAFETY: port events carry the port number (a plain integer).
            AsyncElement::Port(unsafe { ev.element.port_num } as u8)
        }
        _ => AsyncElement::Device,
    }
}
