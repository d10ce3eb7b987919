//! rdma_cm's multicast (`rdma_join_multicast`, `rdma_leave_multicast`) on a RoCE port, as the
//! kernel's `cma_iboe_join_multicast` does it: nothing goes on the wire; the group's GID is
//! the IPv4-mapped address (RoCEv2), the id's UD QP is attached to it (unless it joined to
//! send only; at the join, or when the id gets a QP after it), and `MULTICAST_JOIN` says where
//! to send: the group's GID, QP `0xFFFFFF`, and the Q_Key of `RDMA_PS_UDP` ids.

use std::net::Ipv4Addr;

use super::ids::St;
use super::mad::UDP_QKEY;
use super::{CmError, CmEvent, CmEventKind, CmId, ConnParam, err};
use crate::mcast::MULTICAST_QPN;
use crate::qp::Transport;
use crate::state::State;

/// A group an id joined.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Joined {
    pub(crate) mgid: [u8; 16],
    /// Joined to send only: its QPs are not attached.
    pub(crate) send_only: bool,
    /// The QP (its number) attached to the group for the id, if one is.
    pub(crate) attached: Option<u32>,
}

impl State {
    /// `rdma_join_multicast`: id `id` (of `RDMA_PS_UDP`, bound to a device or resolved) joins
    /// group `group`; its QP is attached to it unless `send_only`. `MULTICAST_JOIN` follows.
    pub(crate) fn cm_join(
        &mut self,
        id: u32,
        group: Ipv4Addr,
        send_only: bool,
    ) -> Result<(), CmError> {
        if !group.is_multicast() {
            return err(
                libc::EINVAL,
                "joining an address that is not a multicast group",
            );
        }
        let mgid = crate::roce::ipv4_gid(group);
        let i = self.cm_id(id)?;
        if i.ps.transport() != Transport::Ud {
            return err(
                libc::EINVAL,
                "joining a group on an id whose QPs are not UD",
            );
        }
        let Some(dev) = i
            .dev
            .filter(|_| matches!(i.st, St::Bound | St::AddrResolved))
        else {
            return err(
                libc::EINVAL,
                "joining a group on an id not bound to a device",
            );
        };
        if i.groups.iter().any(|j| j.mgid == mgid) {
            return err(libc::EADDRINUSE, "joining a group the id joined already");
        }
        let attached = i.qp.map(|_| i.qpn).filter(|_| !send_only);
        if let Some(qpn) = attached {
            let r = self.mcast_attach(dev, qpn, mgid);
            if r != 0 {
                return err(r, "attaching the id's QP to the group");
            }
        }
        self.cm_id(id)?.groups.push(Joined {
            mgid,
            send_only,
            attached,
        });
        let ev = CmEvent {
            kind: CmEventKind::MulticastJoin,
            id: CmId(id),
            listen_id: None,
            status: 0,
            private: Vec::new(),
            param: ConnParam {
                qp_num: MULTICAST_QPN,
                qkey: UDP_QKEY,
                ..ConnParam::default()
            },
            peer_gid: mgid,
            addrs: None,
        };
        self.w.cm.push(id, ev);
        Ok(())
    }

    /// `rdma_leave_multicast`: id `id` leaves group `group` (its QP is detached);
    /// EADDRNOTAVAIL if it had not joined it.
    pub(crate) fn cm_leave(&mut self, id: u32, group: Ipv4Addr) -> Result<(), CmError> {
        let mgid = crate::roce::ipv4_gid(group);
        let i = self.cm_id(id)?;
        let Some(k) = i.groups.iter().position(|j| j.mgid == mgid) else {
            return err(libc::EADDRNOTAVAIL, "leaving a group the id did not join");
        };
        let joined = i.groups.swap_remove(k);
        let dev = i.dev;
        self.detach_joined(dev, &[joined]);
        Ok(())
    }

    /// The id's QP (number `qpn`) joins the groups the id joined to receive before it had it.
    pub(crate) fn cm_attach_joined(&mut self, id: u32, qpn: u32) -> Result<(), CmError> {
        let i = self.cm_id(id)?;
        let (dev, groups) = (i.dev, std::mem::take(&mut i.groups));
        let mut failed = 0;
        let groups: Vec<Joined> = (groups.into_iter())
            .map(|mut j| {
                if let Some(dev) = dev.filter(|_| !j.send_only && j.attached.is_none()) {
                    match self.mcast_attach(dev, qpn, j.mgid) {
                        0 => j.attached = Some(qpn),
                        r => failed = r,
                    }
                }
                j
            })
            .collect();
        self.cm_id(id)?.groups = groups;
        match failed {
            0 => Ok(()),
            r => err(r, "attaching the id's QP to a group it joined"),
        }
    }

    /// The id's QP goes (`rdma_destroy_qp`): it leaves the groups it was attached to for the id.
    pub(crate) fn cm_detach_joined(&mut self, id: u32) {
        let Ok(i) = self.cm_id(id) else { return };
        let dev = i.dev;
        let attached: Vec<Joined> = (i.groups.iter_mut())
            .filter_map(|j| j.attached.is_some().then_some(*j))
            .collect();
        i.groups.iter_mut().for_each(|j| j.attached = None);
        self.detach_joined(dev, &attached);
    }

    /// Detaches the QPs attached for `joined` on device `dev`.
    fn detach_joined(&mut self, dev: Option<usize>, joined: &[Joined]) {
        for j in joined {
            if let (Some(dev), Some(qpn)) = (dev, j.attached) {
                self.mcast_detach(dev, qpn, j.mgid);
            }
        }
    }

    /// A destroyed id leaves every group it joined.
    pub(crate) fn cm_leave_all(&mut self, id: u32) {
        let Ok(i) = self.cm_id(id) else { return };
        let (dev, groups) = (i.dev, std::mem::take(&mut i.groups));
        self.detach_joined(dev, &groups);
    }
}
