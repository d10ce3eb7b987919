//! Completion queues, completion channels and their file descriptors.

use std::collections::VecDeque;

use ibverbs_sys::{ibv_comp_channel, ibv_cq, ibv_wc_status};

use crate::abi::{Shell, Wc};
use crate::state::{Element, UserPtr, World};

/// What polling a CQE gives back to the queue it came from: work-queue slots are reused only
/// once their completion has been polled, as on hardware.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reclaim {
    /// `n` send-queue slots of QP `qp` (this WR and the unsignaled ones before it), if the QP
    /// is still in epoch `epoch` (a reset empties its queues).
    Sq { qp: u32, epoch: u32, n: u32 },
    /// One receive-queue slot of QP `qp`.
    Rq { qp: u32, epoch: u32 },
    /// One slot of SRQ `srq`.
    Srq { srq: u32 },
}

/// How a CQ is armed for a completion event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arm {
    Off,
    Next,
    Solicited,
}

pub(crate) struct Cq {
    pub(crate) ctx: u32,
    pub(crate) channel: Option<u32>,
    pub(crate) capacity: usize,
    pub(crate) entries: VecDeque<(Wc, Reclaim)>,
    pub(crate) arm: Arm,
    /// A completion did not fit: the CQ is in error (CQ_ERR was raised).
    pub(crate) overflowed: bool,
    pub(crate) shell: Box<Shell<ibv_cq>>,
}

pub(crate) struct Channel {
    pub(crate) ctx: u32,
    pub(crate) fd: i32,
    /// Completion events not yet taken by `get_cq_event`: the CQ id and its context pointer.
    pub(crate) events: VecDeque<(u32, UserPtr)>,
    pub(crate) shell: Box<Shell<ibv_comp_channel>>,
}

/// A new event file descriptor counting events one by one (`EFD_SEMAPHORE`), or -1.
pub(crate) fn new_fd() -> i32 {
    // SAFETY: plain syscall wrapper, no pointers.
    unsafe { libc::eventfd(0, libc::EFD_SEMAPHORE | libc::EFD_CLOEXEC) }
}

/// Adds one event to an event file descriptor, making it readable.
pub(crate) fn signal_fd(fd: i32) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a valid local; an invalid fd just fails with EBADF.
    let _ = unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Takes one event from an event file descriptor; blocks unless the caller made it
/// non-blocking. `Err(errno)` on failure (EAGAIN when non-blocking and empty).
pub(crate) fn wait_fd(fd: i32) -> Result<(), i32> {
    let mut v: u64 = 0;
    loop {
        // SAFETY: reads 8 bytes into a valid local.
        let n = unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
        if n == 8 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
        if e != libc::EINTR {
            return Err(e);
        }
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        close_fd(self.fd);
    }
}

pub(crate) fn close_fd(fd: i32) {
    if fd >= 0 {
        // SAFETY: closes a descriptor this crate opened and owns.
        unsafe { libc::close(fd) };
    }
}

impl World {
    /// Appends a completion to CQ `cq`. Returns false if it did not fit: the CQ is then in
    /// error and `IBV_EVENT_CQ_ERR` has been raised; the caller moves its QP to ERROR.
    pub(crate) fn push_cqe(&mut self, cq: u32, wc: Wc, reclaim: Reclaim, solicited: bool) -> bool {
        let Some(c) = self.cqs.get_mut(&cq) else {
            return false;
        };
        if c.overflowed || c.entries.len() >= c.capacity {
            let first = !c.overflowed;
            c.overflowed = true;
            let ctx = c.ctx;
            if first {
                self.async_event(ctx, ibverbs_sys::IBV_EVENT_CQ_ERR, Element::Cq(cq));
            }
            return false;
        }
        c.entries.push_back((wc, reclaim));
        let fire = match c.arm {
            Arm::Off => false,
            Arm::Next => true,
            Arm::Solicited => solicited || wc.status != ibv_wc_status::IBV_WC_SUCCESS,
        };
        if fire {
            c.arm = Arm::Off;
            let user = c.shell.ibv.cq_context;
            if let Some(ch) = c.channel.and_then(|id| self.channels.get_mut(&id)) {
                ch.events.push_back((cq, user));
                signal_fd(ch.fd);
            }
        }
        true
    }
}
