//! XRC (eXtended Reliable Connected): domains, and the SRQs and target QPs that belong to one.
//!
//! An XRC domain (`ibv_open_xrcd`) groups SRQs and target QPs (`IBV_QPT_XRC_RECV`). A sender's
//! initiator QP (`IBV_QPT_XRC_SEND`) is connected to one target QP, and each of its requests
//! names, in its XRCETH, the SRQ the message is for: any XRC SRQ of the target's domain. So one
//! connection reaches every SRQ of a domain, where RC needs a connection per receive queue.
//!
//! - Opening a domain with a file descriptor shares it: every open of the same file on the
//!   same device (in this process) reaches the same domain, as the kernel's `inode` lookup
//!   does (the domain holds the file open, as the kernel holds its inode); `O_CREAT` makes it
//!   if it does not exist yet, `O_EXCL` refuses one that does. A descriptor of -1 makes a
//!   domain of its own. Each open is its own `ibv_xrcd`, which cannot be closed (EBUSY) while
//!   an SRQ or target QP made through it lives; the domain lives until its last open is
//!   closed.
//! - An XRC SRQ (`ibv_create_srq_ex` with `IBV_SRQT_XRC`) has a PD, a domain and a CQ of its
//!   own: the receives of the messages that land in it complete there, with the target QP's
//!   number in `qp_num`. Its PD is the one remote accesses through a target QP are checked
//!   against when a request names it (IBTA's XRC memory protection).
//! - A target QP has no PD, CQs or queues of its own: each request binds the SRQ it names
//!   (see `qp/xrc.rs`), which must be an XRC SRQ of the QP's domain; one naming any other is
//!   answered with an Invalid Request NAK, and the QP goes to ERROR, as an RC QP does.

use ibverbs_sys::ibv_xrcd;

use crate::abi::Shell;
use crate::state::World;

/// An open of a domain: the `ibv_xrcd` a caller holds.
pub(crate) struct Xrcd {
    /// The context that opened it.
    pub(crate) ctx: u32,
    /// The domain it reaches.
    pub(crate) domain: u32,
    pub(crate) shell: Shell<ibv_xrcd>,
}

/// An XRC domain.
pub(crate) struct Domain {
    pub(crate) dev: usize,
    /// The file that names it (device and inode), if it was opened with one, and a
    /// descriptor of it held open (so that its inode is no other file's meanwhile).
    pub(crate) file: Option<((u64, u64), std::os::fd::OwnedFd)>,
    /// Its opens not closed yet.
    pub(crate) opens: u32,
}

/// What makes an SRQ an XRC SRQ.
#[derive(Debug, Clone, Copy)]
pub(crate) struct XrcSrq {
    pub(crate) domain: u32,
    /// The open it was made through (which cannot be closed while the SRQ lives).
    pub(crate) xrcd: u32,
    /// Where the receives of the messages that land in it complete.
    pub(crate) cq: u32,
}

/// An XRC QP's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// `IBV_QPT_XRC_SEND`: sends requests (an RC requester), each naming a remote SRQ.
    Initiator,
    /// `IBV_QPT_XRC_RECV`: takes requests (an RC responder) into the SRQs of its domain.
    Target {
        /// Its domain.
        domain: u32,
        /// The open it was made through (which cannot be closed while the QP lives).
        xrcd: u32,
    },
}

/// The id an XRC target QP holds for the PD and the receive CQ it has none of (until a
/// request binds an SRQ's), and an initiator for its receive CQ: no object has it.
pub(crate) const NONE: u32 = u32::MAX;

impl World {
    /// Whether an SRQ or a target QP made through the open `xrcd` still lives.
    pub(crate) fn xrcd_in_use(&self, xrcd: u32, qps: &crate::table::Table<crate::qp::Qp>) -> bool {
        let target =
            |q: &crate::qp::Qp| matches!(q.xrc, Some(Role::Target { xrcd: x, .. }) if x == xrcd);
        self.srqs
            .values()
            .any(|s| s.xrc.is_some_and(|x| x.xrcd == xrcd))
            || qps.values().any(target)
    }
}
