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
//!   one doorbell and borrow their QP; [`SendWr`]/[`RecvWr`] build one-off WRs ([`UdSendWr`]
//!   on UD QPs: it cannot be built without its address handle). Posting raw WRs is `unsafe`;
//!   posting builder WRs whose buffers came through the builders is safe
//!   ([`Qp::post_send_bufs`], [`Qp::post_recv_bufs`], [`Srq::post_recv_bufs`]). The fast path
//!   is [`Qp::post_slots`]: a chain of pre-initialised [`WrSlot`]s checked against a [`Pins`]
//!   table that any number of QPs share; [`Pins::unpin`] takes a buffer back, and the table
//!   lets go of it once the WRs that name it are done.
//! - The kernel's CQ abstraction: [`Poller`] polls in batches of 16, dispatches to per-WR
//!   [`CompletionContext`] handlers, stops at a budget, re-arms without losing completions, and
//!   polls several CQs fairly; [`CompChannel::wait`] sleeps on the channel's descriptor. A
//!   tracked `wr_id` ([`WR_ID_TAG`]) is a slot index and a generation in a per-context table,
//!   never an address: no `wr_id` can be forged into a pointer.
//! - Addressing is explicit: a path leaves from a [`LocalPort`] (port and source GID index:
//!   the right index matters on RoCE v2) and reaches a [`Remote`] by LID (InfiniBand) and/or
//!   GID (RoCE). Connected QPs grant peers no access unless [`ConnInit`] says so.
//!
//! # Memory model
//!
//! Safe code never holds a reference (`&[u8]`, `&mut [u8]`) to bytes that the NIC or a peer
//! may be accessing:
//! - [`MrBuf`] is registered for local access only, so no peer can reach it. A safe post that
//!   lets the NIC write it (a receive, a READ or atomic target) takes it by value and gives it
//!   back with the completion ([`Completion::take_bufs`]), the io-uring owned-buffer model; a
//!   safe post that lets the NIC read it (a send, a WRITE) shares it through an `Arc`, which
//!   rules out `&mut` until the completion releases it.
//! - [`DmaBuf`] is registered for remote access, so a peer may write it at any time: safe
//!   code copies in and out ([`DmaBuf::read_at`], [`DmaBuf::write_at`]) through raw
//!   pointers, as a DMA engine does; a reference is `unsafe`, with the contract spelled out.
//! - [`Mr`] over caller memory ([`Pd::register`]) and raw posts are `unsafe`: the caller
//!   promises what the types above guarantee.
//! - Keys that reach exactly what is offered: [`DmaBuf::register_range`] registers part of a
//!   buffer on its own ([`DmaRange`]), and a memory window ([`Mw`], [`Qp::bind_mw`]) is a key
//!   over part of a buffer that moves with one work request and dies when unbound. A window
//!   keeps alive every buffer its keys may still reach: what it left until the bind that moved
//!   it is seen to succeed (a failed or flushed bind leaves it where it was), what it moved to
//!   until a later bind is seen to succeed or the window is dropped.
//! - Memory is freed only once the NIC cannot reach it: a deregistration or destroy the
//!   provider refuses keeps the memory it may reach, and counts it ([`leaks`]).
//!
//! Bringing an RC pair to RTS and doing one RDMA WRITE with immediate, on softnic:
//!
//! ```
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
//! // Exchanged out of band in a real program (QP number, first PSN, LID, GID).
//! let ra = Remote { qpn: qa.qpn(), psn: 0, lid: 0, gid: Some(a.query_gid(1, 0)?) };
//! let rb = Remote { qpn: qb.qpn(), psn: 0, lid: 0, gid: Some(b.query_gid(1, 0)?) };
//! let from = LocalPort::new(1, 0); // port 1, GID index 0 (softnic's only GID)
//! let qa = qa.init(ConnInit::default())?.rtr(RcRtr::new(rb, from))?.rts(RcRts::new(0))?;
//! let writable = ConnInit::with_access(AccessFlags::REMOTE_WRITE);
//! let qb = qb.init(writable)?.rtr(RcRtr::new(ra, from))?.rts(RcRts::new(0))?;
//!
//! let mut src = pa.alloc_mr(4096, 64, AccessFlags::LOCAL_WRITE)?;
//! src.as_mut_slice()[..5].copy_from_slice(b"hello");
//! let src = Arc::new(src);
//! let dst = pb.alloc_dma(4096, 64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
//! qb.post_recv_bufs(&mut [RecvWr::new(1)])?;
//! let op = SendOp::WriteWithImm { remote_addr: dst.addr(), rkey: dst.rkey(), imm: 42 };
//! qa.post_send_bufs(&mut [SendWr::new(7, op).buf(&src, 0, 5)])?;
//! let mut poller = Poller::new();
//! let mut imm = None;
//! while imm.is_none() {
//!     poller.poll(&cb, 16, |c| imm = c.ok().ok().and_then(|s| s.imm()))?;
//! }
//! assert_eq!(imm, Some(42));
//! let mut got = [0u8; 5];
//! dst.read_at(0, &mut got)?;
//! assert_eq!(&got, b"hello");
//! # Ok(()) }
//! ```

mod context;
mod cq;
mod error;
mod events;
mod flags;
mod kept;
mod memory;
mod pins;
mod post;
mod provider;
mod qp;
mod slots;
mod srq;
mod track;
mod wc;
mod window;
mod wr;

pub use context::{Ah, Context, DeviceLimits, Gid, Leaks, LocalPort, Pd, PortInfo, leaks};
pub use cq::{BATCH, CompChannel, CompletionContext, Cq, Polled, Poller};
pub use error::{Errno, Error, Result};
pub use events::{AsyncElement, AsyncEvent};
pub use flags::{AccessFlags, Mtu, QpAttrMask};
pub use memory::{DmaBuf, DmaRange, Mr, MrBuf};
pub use pins::Pins;
pub use post::{RecvBatch, SendBatch};
pub use provider::{Device, Verbs};
pub use qp::{
    Attrs, CanPostRecv, CanPostSend, ConnInit, Connected, Errored, Init, Qp, QpCaps, QpInit,
    QpState, QpStateKind, Rc, RcRtr, RcRts, Remote, Reset, Rtr, Rts, SqPsn, Sqd, TransitionError,
    Transport, Uc, UcRtr, Ud, UdInit, UdRtr, diagnose_mask,
};
pub use slots::{RecvSlot, WrSlot};
pub use srq::{Srq, SrqAttr};
pub use track::WR_ID_TAG;
pub use wc::{Completion, Failure, Success, WcOpcode, WcStatus};
pub use window::Mw;
pub use wr::{RecvWr, SendOp, SendWr, UdSendWr};

/// Re-exported so users need not depend on `ibverbs-sys` for the WR and SGE structs.
pub use ibverbs_sys as sys;
