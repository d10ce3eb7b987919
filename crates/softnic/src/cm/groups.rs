//! rdma_cm's multicast (`rdma_join_multicast`, `rdma_leave_multicast`) on a RoCE port, as the
//! kernel's `cma_iboe_join_multicast` does it: nothing goes on the wire; the group's GID is
//! the IPv4-mapped address (RoCEv2), the id's UD QP is attached to it (unless it joined to
//! send only), and `MULTICAST_JOIN` says where to send: the group's GID, QP `0xFFFFFF`, and
//! the Q_Key of `RDMA_PS_UDP` ids.

use std::net::Ipv4Addr;

use super::ids::St;
use super::mad::UDP_QKEY;
use super::{CmError, CmEvent, CmEventKind, CmId, ConnParam, PortSpace, err};
use crate::mcast::MULTICAST_QPN;
use crate::state::State;

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
        if i.ps != PortSpace::Udp {
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
        if i.groups.iter().any(|&(g, _)| g == mgid) {
            return err(libc::EADDRINUSE, "joining a group the id joined already");
        }
        let qp = i.qp.map(|_| i.qpn).filter(|_| !send_only);
        if let Some(qpn) = qp {
            let r = self.mcast_attach(dev, qpn, mgid);
            if r != 0 {
                return err(r, "attaching the id's QP to the group");
            }
        }
        self.cm_id(id)?.groups.push((mgid, qp.is_some()));
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
        let Some(k) = i.groups.iter().position(|&(g, _)| g == mgid) else {
            return err(libc::EADDRNOTAVAIL, "leaving a group the id did not join");
        };
        let (_, attached) = i.groups.swap_remove(k);
        let (dev, qpn) = (i.dev, i.qpn);
        if let Some(dev) = dev.filter(|_| attached) {
            // (Its QP may have been destroyed since, and left every group then.)
            self.mcast_detach(dev, qpn, Some(mgid));
        }
        Ok(())
    }

    /// A destroyed id leaves every group it joined.
    pub(crate) fn cm_leave_all(&mut self, id: u32) {
        let groups = self.cm_id(id).map(|i| std::mem::take(&mut i.groups));
        let Ok(groups) = groups else { return };
        let (dev, qpn) = self.cm_id(id).map_or((None, 0), |i| (i.dev, i.qpn));
        for (mgid, attached) in groups {
            if let Some(dev) = dev.filter(|_| attached) {
                self.mcast_detach(dev, qpn, Some(mgid));
            }
        }
    }
}
