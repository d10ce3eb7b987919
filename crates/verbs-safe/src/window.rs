//! Memory windows (type 1): a key over part of a [`DmaBuf`], bound and unbound through a
//! connected QP's send queue (`ibv_bind_mw`), dead at once when deallocated.
//!
//! A window is cheaper to move than a registration (a bind is one work request, no system
//! call), so it suits keys that live as long as one transfer: a receive buffer advertised to
//! a peer, say. The buffer's own region must allow binds ([`AccessFlags::MW_BIND`]) and needs
//! no remote access of its own: then the window's key is the only way in, over exactly its
//! range, and only while it is bound.

use std::sync::{Arc, Mutex};

use ibverbs_sys::{ibv_mw, ibv_mw_bind, ibv_mw_bind_info, ibv_send_flags};

use crate::context::{Pd, leaked};
use crate::error::{Errno, Error, Result};
use crate::flags::AccessFlags;
use crate::memory::DmaBuf;
use crate::post::post_error;
use crate::qp::{CanPostSend, Connected, Qp};
use crate::track::{Entry, Posted};

type DeallocFn = unsafe extern "C" fn(*mut ibv_mw) -> i32;

/// A type-1 memory window of a protection domain ([`Pd::alloc_mw`]). Its key
/// ([`rkey`](Self::rkey)) reaches nothing until [`Qp::bind_mw`] binds it to part of a
/// [`DmaBuf`]; binding it again moves it, an unbind (a bind to nothing) closes it, and dropping
/// it deallocates it (its key is dead at once).
pub struct Mw {
    pd: Arc<Pd>,
    raw: *mut ibv_mw,
    dealloc: DeallocFn,
    /// The buffer it is bound to (its region cannot be deregistered meanwhile, and a peer may
    /// write it through the window).
    bound: Mutex<Option<Arc<DmaBuf>>>,
}

// SAFETY: the window is only changed through the provider's thread-safe verbs; `bound` is
// behind a lock.
unsafe impl Send for Mw {}
// SAFETY: as above.
unsafe impl Sync for Mw {}

impl std::fmt::Debug for Mw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mw")
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .finish()
    }
}

impl Pd {
    /// A new type-1 memory window (`ibv_alloc_mw`). Fails with [`Error::Unsupported`] where
    /// the provider has no memory windows.
    pub fn alloc_mw(self: &Arc<Self>) -> Result<Mw> {
        // SAFETY: reading the ops table of a live context.
        let ops = unsafe { (*self.ctx.raw).ops };
        let (Some(alloc), Some(dealloc), Some(_)) = (ops.alloc_mw, ops.dealloc_mw, ops.bind_mw)
        else {
            return Err(Error::Unsupported("memory windows (alloc_mw/bind_mw)"));
        };
        // SAFETY: live PD.
        let raw = unsafe { alloc(self.raw, ibverbs_sys::IBV_MW_TYPE_1) };
        if raw.is_null() {
            return Err(Error::Create {
                what: "memory window",
                device: self.ctx.name().to_string(),
                detail: "type 1".into(),
                errno: Errno::last(),
            });
        }
        Ok(Mw {
            pd: Arc::clone(self),
            raw,
            dealloc,
            bound: Mutex::new(None),
        })
    }
}

impl Mw {
    /// The window's remote key now (it changes with every bind).
    pub fn rkey(&self) -> u32 {
        let _no_bind = self.bound.lock().unwrap_or_else(|e| e.into_inner());
        self.rkey_locked()
    }

    /// The rkey, read while `bound` is locked (binds, which change it, hold that lock).
    fn rkey_locked(&self) -> u32 {
        // SAFETY: a live window's struct is readable; the provider writes it only during a
        // bind, and the caller holds the lock every bind holds.
        unsafe { (*self.raw).rkey }
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    /// Whether it is bound to a buffer now.
    pub fn is_bound(&self) -> bool {
        self.bound
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        // SAFETY: a live window, deallocated once.
        let rc = unsafe { (self.dealloc)(self.raw) };
        if rc != 0 {
            // Its key may still reach the buffer: keep the buffer.
            leaked("memory window", rc, 0);
            let bound = self.bound.get_mut().unwrap_or_else(|e| e.into_inner());
            std::mem::forget(bound.take());
        }
    }
}

impl<T: Connected, S: CanPostSend> Qp<T, S> {
    /// Binds `mw` to `len` bytes at `offset` of `buf` with `access` (a subset of
    /// `REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC`), or unbinds it (`to` is `None`), with a
    /// bind work request on this QP's send queue (`ibv_bind_mw`). Returns the window's new
    /// rkey, valid once the bind has run (the QP runs it before any WR posted after it, so a
    /// SEND posted next that carries the key reaches the peer after it). The bind completes
    /// (signaled) with `wr_id` and [`WcOpcode::BindMw`](crate::WcOpcode::BindMw); the buffer
    /// the window left is kept alive until then.
    ///
    /// `buf`'s region must allow binds ([`AccessFlags::MW_BIND`], and `LOCAL_WRITE` for a
    /// writable window) and belong to the window's protection domain. A `wr_id` with bit 63
    /// set is refused.
    pub fn bind_mw(
        &self,
        mw: &Mw,
        wr_id: u64,
        to: Option<(&Arc<DmaBuf>, usize, usize)>,
        access: AccessFlags,
    ) -> Result<u32> {
        let bad = |reason: &str| {
            Err(Error::InvalidWr {
                index: 0,
                reason: reason.into(),
            })
        };
        if wr_id & crate::WR_ID_TAG != 0 {
            return bad("a bind's wr_id has bit 63 set, which marks ids this crate issues");
        }
        if !AccessFlags::remote().contains(access) {
            return bad("a window grants remote access only");
        }
        if !Arc::ptr_eq(self.pd_ref(), &mw.pd) {
            return bad("the QP and the window belong to different protection domains");
        }
        let info = match to {
            Some((buf, offset, len)) => {
                if !Arc::ptr_eq(buf.pd(), &mw.pd) {
                    return bad("the buffer and the window belong to different protection domains");
                }
                let Some(sge) = u32::try_from(len).ok().and_then(|l| buf.sge(offset, l)) else {
                    return bad("the range lies outside the buffer");
                };
                ibv_mw_bind_info {
                    mr: buf.as_raw(),
                    addr: sge.addr,
                    length: len as u64,
                    mw_access_flags: access.bits(),
                }
            }
            None => ibv_mw_bind_info {
                mr: std::ptr::null_mut(),
                addr: 0,
                length: 0,
                mw_access_flags: 0,
            },
        };
        let ctx = &self.pd_ref().ctx;
        // SAFETY: reading the ops of a live context.
        let Some(bind) = (unsafe { (*ctx.raw).ops.bind_mw }) else {
            return Err(Error::Unsupported("bind_mw"));
        };
        let mut bound = mw.bound.lock().unwrap_or_else(|e| e.into_inner());
        // What the window leaves stays alive until the bind has run: the tracker holds it
        // under the bind's wr_id, and its completion (always signaled) releases it.
        let left: Vec<Arc<dyn std::any::Any + Send + Sync>> =
            bound.iter().map(|b| Arc::clone(b) as _).collect();
        let key = ctx.tracker.insert(Entry::Posted(Posted {
            wr_id,
            owner: self.owner(),
            shared: left,
            owned: Vec::new(),
        }));
        let mut wr = ibv_mw_bind {
            wr_id: key,
            send_flags: ibv_send_flags::IBV_SEND_SIGNALED.0,
            bind_info: info,
        };
        // SAFETY: a live QP and window of one context, and a valid bind whose region (if any)
        // is the buffer's own, kept alive by the window while bound; the provider reads `wr`
        // during the call only.
        let rc = unsafe { bind(self.as_raw(), mw.raw, &mut wr) };
        if rc != 0 {
            ctx.tracker.remove(key);
            return Err(post_error("bind_mw", self.qpn(), 0, rc));
        }
        *bound = to.map(|(b, _, _)| Arc::clone(b));
        Ok(mw.rkey_locked())
    }
}
