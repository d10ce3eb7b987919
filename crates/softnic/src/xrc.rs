//! XRC (eXtended Reliable Connected): domains, and the SRQs and target QPs that belong to one.
//!
//! An XRC domain (`ibv_open_xrcd`) groups SRQs and target QPs (`IBV_QPT_XRC_RECV`). A sender's
//! initiator QP (`IBV_QPT_XRC_SEND`) is connected to one target QP, and each of its requests
//! names, in its XRCETH, the SRQ the message is for: any XRC SRQ of the target's domain. So one
//! connection reaches every SRQ of a domain, where RC needs a connection per receive queue.
//!
//! - Opening a domain with a file descriptor shares it: every open of the same file on the
//!   same device (in this process) reaches the same domain, as the kernel's `inode` lookup
//!   does; `O_CREAT` makes it if it does not exist yet, `O_EXCL` refuses one that does. A
//!   descriptor of -1 makes a domain of its own. Each open is its own `ibv_xrcd`; the domain
//!   lives until the last is closed, and closing the last one while SRQs or target QPs still
//!   belong to it fails with EBUSY.
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
    /// The file that names it (device and inode), if it was opened with one.
    pub(crate) file: Option<(u64, u64)>,
    /// Its opens not closed yet.
    pub(crate) opens: u32,
}

/// What makes an SRQ an XRC SRQ.
#[derive(Debug, Clone, Copy)]
pub(crate) struct XrcSrq {
    pub(crate) domain: u32,
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
    },
}

/// The id an XRC target QP holds for the PD and the receive CQ it has none of (until a
/// request binds an SRQ's), and an initiator for its receive CQ: no object has it.
pub(crate) const NONE: u32 = u32::MAX;

impl World {
    /// Whether an SRQ or a target QP still belongs to domain `domain`.
    pub(crate) fn domain_in_use(
        &self,
        domain: u32,
        qps: &crate::table::Table<crate::qp::Qp>,
    ) -> bool {
        self.srqs
            .values()
            .any(|s| s.xrc.is_some_and(|x| x.domain == domain))
            || qps.values().any(|q| q.xrc == Some(Role::Target { domain }))
    }
}
