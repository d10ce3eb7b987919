//! Shared receive queues.

use std::sync::Arc;

use ibverbs_sys::{ibv_srq, ibv_srq_attr, ibv_srq_init_attr};

use crate::context::{Pd, destroyed};
use crate::error::{Errno, Error, Result};
use crate::post::{PostSrqRecvFn, RecvBatch, RecvTarget, RecvWr, chain_recv, post_recv_chain};

/// A shared receive queue: receive WQEs that many QPs take from.
pub struct Srq {
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
            Err(Error::ModifySrq { errno: Errno(rc) })
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

    /// A batch of caller-owned receive WRs for this SRQ.
    pub fn recv_batch<'a>(&self) -> RecvBatch<'a> {
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
}

impl Drop for Srq {
    fn drop(&mut self) {
        // SAFETY: every QP on this SRQ holds an `Arc` of it, so none is left.
        destroyed("shared receive queue", unsafe {
            (self.pd.ctx.verbs.ctl.destroy_srq)(self.raw)
        });
    }
}
