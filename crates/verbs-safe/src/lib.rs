//! verbs-safe: the safe RDMA verbs layer every other crate programs against.
//!
//! - A provider table, [`Verbs`]: [`Verbs::system()`] binds the system libibverbs through
//!   `ibverbs-sys` (real NICs, rxe, siw), [`Verbs::soft()`] binds softnic. Device listing and
//!   opening go through it; the hot path (post, poll, notify) calls the context's `ops` for both,
//!   exactly as rdma-core's inline functions do.
//! - RAII objects: [`Context`], [`Pd`], [`Mr`]/[`MrBuf`], [`Cq`], [`CompChannel`], [`Srq`],
//!   [`Ah`], [`Qp`]. Each destroys its C object on drop; children hold an `Arc` of what they
//!   depend on, so no drop order fails with EBUSY.
//! - A typestate QP, `Qp<Transport, State>`: each transition asks for exactly the attributes
//!   its transport needs ([`UdInit`] has a Q_Key, [`RcRts`] the retry counts...), consumes the
//!   QP, and on failure hands it back with the mask bits named. Posting a send before RTS does
//!   not compile.
//! - Posting: [`SendBatch`]/[`RecvBatch`] chain caller-owned WRs (a pre-initialised pool) with
//!   one doorbell; [`SendWr`]/[`RecvWr`] build one-off WRs. Submitting is the one `unsafe` step.
//! - The kernel's CQ abstraction: [`Poller`] polls in batches of 16, dispatches to per-WR
//!   [`CompletionContext`] handlers, stops at a budget, re-arms without losing completions, and
//!   polls several CQs fairly; [`CompChannel::wait`] sleeps on the channel's descriptor.
//!
//! Bringing an RC pair to RTS and doing one RDMA WRITE with immediate, on softnic:
//!
//! ```no_run
//! use std::sync::Arc;
//! use verbs_safe::*;
//!
//! # fn main() -> Result<()> {
//! let fabric = softnic::Fabric::default();
//! let verbs = Verbs::soft(&fabric);
//! let (a, b) = (Context::open_by_name(&verbs, "soft0")?, Context::open_by_name(&verbs, "soft1")?);
//! let (pa, pb) = (a.alloc_pd()?, b.alloc_pd()?);
//! let (ca, cb) = (Cq::new(&a, 64, None)?, Cq::new(&b, 64, None)?);
//! let qa = Qp::<Rc, _>::new(&pa, QpInit { send_cq: &ca, recv_cq: &ca, srq: None, caps: QpCaps::default(), sig_all: true })?;
//! let qb = Qp::<Rc, _>::new(&pb, QpInit { send_cq: &cb, recv_cq: &cb, srq: None, caps: QpCaps::default(), sig_all: true })?;
//! // Exchanged out of band in a real program (QP number, first PSN, GID).
//! let ra = Remote { qpn: qa.qpn(), psn: 0, gid: a.query_gid(1, 0)? };
//! let rb = Remote { qpn: qb.qpn(), psn: 0, gid: b.query_gid(1, 0)? };
//! let qa = qa.init(ConnInit::default())?.rtr(RcRtr::new(rb))?.rts(RcRts::new(0))?;
//! let qb = qb.init(ConnInit::default())?.rtr(RcRtr::new(ra))?.rts(RcRts::new(0))?;
//!
//! let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
//! let mut src = pa.alloc_mr(4096, 64, AccessFlags::LOCAL_WRITE)?;
//! let dst = pb.alloc_mr(4096, 64, access)?;
//! src.as_mut_slice()[..5].copy_from_slice(b"hello");
//! // SAFETY: both regions live until the completions are polled below.
//! unsafe {
//!     qb.post_recv(&mut [RecvWr::new(1)])?;
//!     let op = SendOp::WriteWithImm { remote_addr: dst.addr(), rkey: dst.rkey(), imm: 42 };
//!     qa.post_send(&mut [SendWr::new(7, op).sge(src.sge(0, 5).unwrap())])?;
//! }
//! let mut poller = Poller::new();
//! let mut imm = None;
//! while imm.is_none() {
//!     poller.poll(&cb, 16, |c| imm = c.ok().ok().and_then(|s| s.imm()))?;
//! }
//! assert_eq!(imm, Some(42));
//! assert_eq!(&dst.as_slice()[..5], b"hello");
//! # Ok(()) }
//! ```

mod context;
mod cq;
mod error;
mod flags;
mod post;
mod provider;
mod qp;
mod srq;

pub use context::{Ah, Context, DeviceLimits, Gid, Mr, MrBuf, Pd, PortInfo};
pub use cq::{
    BATCH, CONTEXT_TAG, CompChannel, Completion, CompletionContext, Cq, Failure, Polled, Poller,
    Success, WcOpcode, WcStatus,
};
pub use error::{Errno, Error, Result};
pub use flags::{AccessFlags, Mtu, QpAttrMask};
pub use post::{RecvBatch, RecvWr, SendBatch, SendOp, SendWr, WrSlot};
pub use provider::{Device, Verbs};
pub use qp::{
    Attrs, CanPostRecv, CanPostSend, ConnInit, Errored, Init, Qp, QpCaps, QpInit, QpState,
    QpStateKind, Rc, RcRtr, RcRts, Remote, Reset, Rtr, Rts, SqPsn, Sqd, TransitionError, Transport,
    Uc, UcRtr, Ud, UdInit, UdRtr, diagnose_mask,
};
pub use srq::{Srq, SrqAttr};

/// Re-exported so users need not depend on `ibverbs-sys` for the WR and SGE structs.
pub use ibverbs_sys as sys;
