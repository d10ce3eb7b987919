//! The crate's error type: one variant per verb, with the errno and the object it was about.

use std::fmt;

use crate::flags::QpAttrMask;
use crate::qp::QpStateKind;

/// An errno value, displayed with its name and message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (errno {})",
            std::io::Error::from_raw_os_error(self.0),
            self.0
        )
    }
}

impl Errno {
    /// The calling thread's `errno` now (or EIO if it is 0: a failure must have a cause).
    pub(crate) fn last() -> Errno {
        match std::io::Error::last_os_error().raw_os_error() {
            Some(0) | None => Errno(libc::EIO),
            Some(e) => Errno(e),
        }
    }
}

/// What a verb call failed on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Listing the devices of a provider failed.
    #[error("listing RDMA devices failed: {errno}")]
    DeviceList {
        /// The error.
        errno: Errno,
    },
    /// No device of that name.
    #[error("no RDMA device named {name:?} (devices: {available:?})")]
    NoSuchDevice {
        /// The name asked for.
        name: String,
        /// The devices there are.
        available: Vec<String>,
    },
    /// `ibv_open_device` failed.
    #[error("opening device {device}: {errno}")]
    OpenDevice {
        /// The device.
        device: String,
        /// The error.
        errno: Errno,
    },
    /// A query (`ibv_query_device`, `_port`, `_gid`, `_qp`, `_srq`) failed.
    #[error("{what} on {object}: {errno}")]
    Query {
        /// Which query.
        what: &'static str,
        /// The object queried.
        object: String,
        /// The error.
        errno: Errno,
    },
    /// Creating an object (PD, CQ, channel, SRQ, AH, QP) failed.
    #[error("creating {what} on {device}: {errno} ({detail})")]
    Create {
        /// The kind of object.
        what: &'static str,
        /// The device.
        device: String,
        /// The attributes asked for.
        detail: String,
        /// The error.
        errno: Errno,
    },
    /// `ibv_reg_mr` failed.
    #[error("registering {len} bytes at {addr:#x} with access {access:?} on {device}: {errno}")]
    RegMr {
        /// The device.
        device: String,
        /// Address of the region.
        addr: usize,
        /// Length of the region.
        len: usize,
        /// Access flags asked for.
        access: crate::AccessFlags,
        /// The error.
        errno: Errno,
    },
    /// `ibv_modify_qp` refused a transition. The QP is unchanged.
    #[error(
        "QP {qpn:#x} {from:?} -> {to:?} with mask {mask:?}: {errno}; missing {missing:?}, not allowed {unexpected:?}"
    )]
    ModifyQp {
        /// The QP number.
        qpn: u32,
        /// Its state.
        from: QpStateKind,
        /// The state asked for.
        to: QpStateKind,
        /// The attribute mask sent.
        mask: QpAttrMask,
        /// Required attributes the mask lacks for this transport and transition.
        missing: QpAttrMask,
        /// Attributes in the mask that this transition does not take.
        unexpected: QpAttrMask,
        /// The error.
        errno: Errno,
    },
    /// An attribute value out of its range, refused before calling the provider.
    #[error("attribute {name} = {value} is invalid: {reason}")]
    InvalidAttr {
        /// The attribute.
        name: &'static str,
        /// Its value.
        value: u64,
        /// Why.
        reason: &'static str,
    },
    /// `ibv_modify_srq` failed (arming the SRQ's limit).
    #[error("arming the limit of SRQ {srq} at {limit} WQEs: {errno}")]
    ModifySrq {
        /// The SRQ's number (`ibv_srq.handle`).
        srq: u32,
        /// The limit asked for.
        limit: u32,
        /// The error (EINVAL for a limit over the SRQ's depth).
        errno: Errno,
    },
    /// A post call failed at WR `index` of its chain; the `index` WRs before it were posted.
    #[error("{queue} on QP {qpn:#x} failed at WR {index} ({index} before it posted): {errno}")]
    Post {
        /// `post_send`, `post_recv` or `post_srq_recv`.
        queue: &'static str,
        /// The QP number (0 for an SRQ).
        qpn: u32,
        /// Index of the failing WR in the chain.
        index: usize,
        /// The error.
        errno: Errno,
    },
    /// A work request the builder refuses before posting (too many SGEs, inline too long).
    #[error("work request {index} is invalid: {reason}")]
    InvalidWr {
        /// Index in the batch.
        index: usize,
        /// Why.
        reason: String,
    },
    /// `poll_cq` returned an error (for softnic: the CQ overflowed).
    #[error("polling the CQ: {errno}")]
    PollCq {
        /// The error.
        errno: Errno,
    },
    /// Arming a CQ or waiting for its event failed.
    #[error("{what}: {errno}")]
    Event {
        /// The call.
        what: &'static str,
        /// The error.
        errno: Errno,
    },
    /// The provider lacks a function this crate needs (an `ops` entry is NULL).
    #[error("the provider does not implement {0}")]
    Unsupported(&'static str),
    /// A work-completion status this crate does not know.
    #[error("unknown work completion status {0}")]
    UnknownStatus(u32),
    /// A work-completion opcode this crate does not know.
    #[error("unknown work completion opcode {0}")]
    UnknownOpcode(u32),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
