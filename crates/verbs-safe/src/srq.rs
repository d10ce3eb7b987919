//! Shared receive queues.

use std::sync::Arc;

use ibverbs_sys::{ibv_srq, ibv_srq_attr, ibv_srq_init_attr};

use crate::context::{Pd, leaked};
use crate::error::{Errno, Error, Result};
use crate::kept::post_tracked;
use crate::memory::DmaBuf;
use crate::pins::Pins;
use crate::post::{PostSrqRecvFn, RecvBatch, RecvTarget, post_recv_chain};
use crate::slots::{RecvSlot, check_slot, link};
use crate::track::{Owner, new_owner_id};
use crate::wr::{RecvWr, chain_recv};

/// A shared receive queue: receive WQEs that many QPs take from.
pub struct Srq {
    /// Regions slot posts may name, kept alive with the SRQ (its own table: nothing unpins).
    pinned: Arc<Pins>,
    /// Who owns its safe posts in the context's tracker.
    owner: u64,
    pd: Arc<Pd>,
    raw: *mut ibv_srq,
    post: PostSrqRecvFn,
    max_sge: u32,
}

// SAFETY: `post_srq_recv` and the SRQ verbs are thread-safe.
unsafe impl Send for Srq {}
// SAFETY: as above.
unsafe impl Sync for Srq {}

impl std::fmt::Debug for Srq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Srq")
            .field("max_sge", &self.max_sge)
            .finish_non_exhaustive()
    }
}

/// An SRQ's sizes and limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqAttr {
    /// Depth.
    pub max_wr: u32,
    /// SGEs per WR.
    pub max_sge: u32,
    /// Armed limit (0: disarmed; it reads 0 again once the limit event fired).
    pub limit: u32,
}

impl Srq {
    /// A new SRQ of `max_wr` WQEs with up to `max_sge` SGEs each.
    pub fn new(pd: &Arc<Pd>, max_wr: u32, max_sge: u32) -> Result<Arc<Srq>> {
        let ctx = pd.context();
        // SAFETY: reading the ops of a live context.
        let Some(post) = (unsafe { (*ctx.raw).ops.post_srq_recv }) else {
            return Err(Error::Unsupported("post_srq_recv"));
        };
        let mut init = ibv_srq_init_attr {
            srq_context: std::ptr::null_mut(),
            attr: ibv_srq_attr {
                max_wr,
                max_sge,
                srq_limit: 0,
            },
        };
        // SAFETY: live PD; `init` is valid.
        let raw = unsafe { (ctx.verbs.ctl.create_srq)(pd.raw, &mut init) };
        if raw.is_null() {
            return Err(Error::Create {
                what: "shared receive queue",
                device: ctx.name().to_string(),
                detail: format!("max_wr {max_wr}, max_sge {max_sge}"),
                errno: Errno::last(),
            });
        }
        Ok(Arc::new(Srq {
            pinned: Pins::new(),
            owner: new_owner_id(),
            pd: Arc::clone(pd),
            raw,
            post,
            max_sge: init.attr.max_sge,
        }))
    }

    /// The raw SRQ.
    pub fn as_raw(&self) -> *mut ibv_srq {
        self.raw
    }

    /// Arms the one-shot `SRQ_LIMIT_REACHED` event for when fewer than `limit` WQEs are posted.
    pub fn arm_limit(&self, limit: u32) -> Result<()> {
        let mut a = ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: limit,
        };
        // SAFETY: live SRQ; `a` is valid.
        let rc = unsafe {
            (self.pd.ctx.verbs.ctl.modify_srq)(self.raw, &mut a, ibverbs_sys::IBV_SRQ_LIMIT as i32)
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(Error::ModifySrq {
                // SAFETY: a live SRQ's `ibv_srq` is readable.
                srq: unsafe { (*self.raw).handle },
                limit,
                errno: Errno(rc),
            })
        }
    }

    /// Sizes and the armed limit.
    pub fn query(&self) -> Result<SrqAttr> {
        let mut a = ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: 0,
        };
        // SAFETY: live SRQ; `a` is writable.
        let rc = unsafe { (self.pd.ctx.verbs.ctl.query_srq)(self.raw, &mut a) };
        if rc != 0 {
            return Err(Error::Query {
                what: "ibv_query_srq",
                object: "SRQ".into(),
                errno: Errno(rc),
            });
        }
        Ok(SrqAttr {
            max_wr: a.max_wr,
            max_sge: a.max_sge,
            limit: a.srq_limit,
        })
    }

    /// A batch of caller-owned receive WRs for this SRQ (borrowing it until submitted).
    pub fn recv_batch<'a>(&'a self) -> RecvBatch<'a> {
        RecvBatch::new(RecvTarget::Srq(self.raw, self.post))
    }

    /// Posts `wrs` with one `post_srq_recv`.
    ///
    /// # Safety
    /// As for [`RecvBatch::submit`].
    pub unsafe fn post_recv(&self, wrs: &mut [RecvWr]) -> Result<()> {
        for (i, w) in wrs.iter().enumerate() {
            if w.num_sge() > self.max_sge as usize {
                return Err(Error::InvalidWr {
                    index: i,
                    reason: format!("{} SGEs, the SRQ takes {}", w.num_sge(), self.max_sge),
                });
            }
        }
        let head = chain_recv(wrs);
        // SAFETY: the chain lives in `wrs`; the caller upholds the buffer contract.
        unsafe { post_recv_chain(RecvTarget::Srq(self.raw, self.post), head) }
    }

    /// Pins `buf` to this SRQ: [`post_recv_slots`](Self::post_recv_slots) may name its bytes,
    /// and it stays alive as long as the SRQ does.
    pub fn pin(&self, buf: &Arc<DmaBuf>) {
        self.pinned.pin(buf);
    }

    /// Posts the receive slots `order` names, linked in that order, with one doorbell and no
    /// allocation (UCCL's batched SRQ refill); the rules of
    /// [`Qp::post_slots`](crate::Qp::post_slots) apply, with regions pinned to this SRQ.
    pub fn post_recv_slots<X: AsMut<RecvSlot<N>>, const N: usize>(
        &self,
        slots: &mut [X],
        order: &[u32],
    ) -> Result<()> {
        let pins = self.pinned.checker();
        let head = link(slots, order, |k, s: &mut RecvSlot<N>| {
            check_slot(&pins, k, s, self.max_sge, |_| {})
        })?;
        if head.is_null() {
            return Ok(());
        }
        // SAFETY: a chain linked here over borrowed slots whose SGEs lie in regions this SRQ
        // keeps alive and that safe code only reaches by copies.
        unsafe { post_recv_chain(RecvTarget::Srq(self.raw, self.post), head.cast()) }
    }

    /// Posts receive `wrs` safely, with one doorbell: see
    /// [`Qp::post_recv_bufs`](crate::Qp::post_recv_bufs). A buffer comes back with the
    /// completion of whichever QP's message filled it.
    pub fn post_recv_bufs(&self, wrs: &mut [RecvWr]) -> Result<()> {
        post_tracked(&self.pd.ctx.tracker, Owner::Srq(self.owner), wrs, |wrs| {
            // SAFETY: every WR passed the safe checks: its buffers are held by the tracker
            // until its completion is polled or the SRQ is destroyed.
            unsafe { self.post_recv(wrs) }
        })
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        // SAFETY: every QP on this SRQ holds an `Arc` of it, so none is left.
        let rc = unsafe { (self.pd.ctx.verbs.ctl.destroy_srq)(self.raw) };
        if rc != 0 {
            // Its WQEs may still be filled: keep what they name (pinned regions, posts).
            leaked("shared receive queue", rc, 0);
            std::mem::forget(Arc::clone(&self.pinned));
            return;
        }
        // With the SRQ gone, the buffers of its uncompleted safe posts may go.
        crate::track::release(self.pd.ctx.tracker.purge(Owner::Srq(self.owner)));
    }
}
