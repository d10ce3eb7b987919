//! Multicast: UD QPs attached to groups (`ibv_attach_mcast`), as rxe has them. A UD send to a
//! multicast GID (`ff00::/8`, or an IPv4-mapped `224.0.0.0/4` address as RoCEv2 programs use)
//! goes to every device of the fabric with a QP in the group, and on the UDP link to the
//! group's IPv4 address ([`group_ipv4`]), which every process whose device joined it hears; a
//! device hands a copy to each of its QPs in the group (destination QP `0xFFFFFF`), checked as
//! any UD receive (state, Q_Key, a receive WQE), its GRH naming the group as destination. On
//! the UDP link a group is its IPv4 address: groups at one address (two IPv6 MGIDs that hash
//! alike, or one and the IPv4-mapped group of that address) are one group there, and their
//! members get each datagram once, its GRH naming the first of them.

use std::net::Ipv4Addr;

use smallvec::SmallVec;

use crate::hash::FastMap;

/// The destination QP number of a multicast packet (IBTA 9.6.1.5).
pub(crate) const MULTICAST_QPN: u32 = 0x00ff_ffff;
/// Groups a device may have (rxe's `RXE_MAX_MCAST_GRP`).
pub(crate) const MAX_GROUPS: u32 = 8192;
/// QPs one group may have on a device (rxe's `RXE_MAX_MCAST_QP_ATTACH`).
pub(crate) const MAX_QPS_PER_GROUP: u32 = 56;
/// Attachments a device may have in all (rxe's `RXE_MAX_TOT_MCAST_QP_ATTACH`).
pub(crate) const MAX_ATTACHMENTS: u32 = 0x70000;

/// Whether `gid` is a multicast address, as the kernel's `rdma_is_multicast_addr` says: an
/// IPv6 multicast address, or an IPv4-mapped IPv4 multicast one.
pub(crate) fn is_multicast(gid: &[u8; 16]) -> bool {
    gid[0] == 0xff || crate::roce::gid_ipv4(gid).is_some_and(|ip| ip.is_multicast())
}

pub(crate) use crate::roce::group_address as group_ipv4;

/// The QP numbers of a group's members on one device.
pub(crate) type Members = SmallVec<[u32; 4]>;

/// A device's multicast groups and the QPs attached to each.
#[derive(Debug, Default)]
pub(crate) struct Groups {
    groups: FastMap<[u8; 16], Members>,
    attachments: u32,
}

impl Groups {
    /// Attaches QP `qpn` to group `gid`: 0 (also if it already is), or ENOMEM past a limit.
    pub(crate) fn attach(&mut self, gid: [u8; 16], qpn: u32) -> i32 {
        if self.groups.get(&gid).is_some_and(|m| m.contains(&qpn)) {
            return 0;
        }
        if self.attachments >= MAX_ATTACHMENTS
            || (!self.groups.contains_key(&gid) && self.groups.len() as u32 >= MAX_GROUPS)
            || self
                .groups
                .get(&gid)
                .is_some_and(|m| m.len() as u32 >= MAX_QPS_PER_GROUP)
        {
            return libc::ENOMEM;
        }
        self.groups.entry(gid).or_default().push(qpn);
        self.attachments += 1;
        0
    }

    /// Detaches QP `qpn` from group `gid`: 0, or EINVAL if it was not attached (as rxe).
    /// Returns also whether the group has no member left (and is gone).
    pub(crate) fn detach(&mut self, gid: &[u8; 16], qpn: u32) -> (i32, bool) {
        let Some(m) = self.groups.get_mut(gid) else {
            return (libc::EINVAL, false);
        };
        let Some(k) = m.iter().position(|&q| q == qpn) else {
            return (libc::EINVAL, false);
        };
        m.swap_remove(k);
        self.attachments -= 1;
        let empty = m.is_empty();
        if empty {
            self.groups.remove(gid);
        }
        (0, empty)
    }

    /// The members of group `gid` (none if it has none here).
    pub(crate) fn members(&self, gid: &[u8; 16]) -> Members {
        self.groups.get(gid).cloned().unwrap_or_default()
    }

    /// The groups here whose packets travel to `ip` on the UDP link ([`group_ipv4`]).
    pub(crate) fn at_address(&self, ip: Ipv4Addr) -> SmallVec<[[u8; 16]; 1]> {
        (self.groups.keys())
            .filter(|g| group_ipv4(g) == ip)
            .copied()
            .collect()
    }

    /// The members of the groups here whose packets travel to `ip` on the UDP link, each once.
    pub(crate) fn members_at(&self, ip: Ipv4Addr) -> Members {
        let mut all = Members::new();
        for (g, m) in &self.groups {
            if group_ipv4(g) == ip {
                for &q in m {
                    if !all.contains(&q) {
                        all.push(q);
                    }
                }
            }
        }
        all
    }

    /// Whether QP `qpn` is in any group here.
    pub(crate) fn holds(&self, qpn: u32) -> bool {
        self.groups.values().any(|m| m.contains(&qpn))
    }

    /// Whether group `gid` has a member here.
    pub(crate) fn has(&self, gid: &[u8; 16]) -> bool {
        self.groups.contains_key(gid)
    }
}

impl crate::state::State {
    /// Attaches QP `qpn` of device `dev` to group `mgid`: 0 or an errno value (ENOMEM past a
    /// limit; on the UDP link, what joining the group's address failed with). The caller
    /// wakes a sleeping progress thread ([`Shared::wake`](crate::fabric::Shared::wake)): it
    /// has a socket more to poll.
    pub(crate) fn mcast_attach(&mut self, dev: usize, qpn: u32, mgid: [u8; 16]) -> i32 {
        let d = &mut self.w.devices[dev];
        let new = !d.groups.has(&mgid);
        let r = d.groups.attach(mgid, qpn);
        if r != 0 || !new {
            return r;
        }
        if let Some(port) = d.udp.as_mut() {
            let ip = port.ip;
            if let Err(e) = port.groups.join(group_ipv4(&mgid), ip) {
                d.groups.detach(&mgid, qpn);
                return e.raw_os_error().unwrap_or(libc::EIO);
            }
        }
        0
    }

    /// Detaches QP `qpn` of device `dev` from group `mgid`: 0, or EINVAL if it was not
    /// attached. A group left with no member here is left on the UDP link too; the caller then
    /// wakes a sleeping progress thread.
    pub(crate) fn mcast_detach(&mut self, dev: usize, qpn: u32, mgid: [u8; 16]) -> i32 {
        let d = &mut self.w.devices[dev];
        let (r, gone) = d.groups.detach(&mgid, qpn);
        if gone && let Some(port) = d.udp.as_mut() {
            port.groups.leave(group_ipv4(&mgid));
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multicast_gids_are_ipv6_groups_or_ipv4_mapped_groups() {
        let mut v6 = [0u8; 16];
        v6[0] = 0xff;
        v6[1] = 0x01;
        assert!(is_multicast(&v6));
        let g = crate::roce::ipv4_gid(Ipv4Addr::new(239, 1, 1, 1));
        assert!(is_multicast(&g));
        assert_eq!(group_ipv4(&g), Ipv4Addr::new(239, 1, 1, 1));
        assert!(!is_multicast(&crate::roce::ipv4_gid(Ipv4Addr::new(
            127, 0, 0, 1
        ))));
        assert!(!is_multicast(&[0u8; 16]));
        let ip = group_ipv4(&v6);
        assert!(ip.is_multicast() && ip.octets()[0] == 239 && ip.octets()[1] & 0xfc == 192);
        v6[15] = 1;
        assert_ne!(group_ipv4(&v6), ip, "another group, another address");
    }

    #[test]
    fn attach_and_detach_keep_count_and_limits() {
        let mut g = Groups::default();
        let a = [0xffu8; 16];
        assert_eq!(g.attach(a, 5), 0);
        assert_eq!(g.attach(a, 5), 0, "twice is once");
        assert_eq!(g.members(&a).as_slice(), &[5]);
        assert_eq!(g.detach(&a, 6), (libc::EINVAL, false));
        assert_eq!(g.detach(&[0u8; 16], 5), (libc::EINVAL, false));
        for q in 6..6 + MAX_QPS_PER_GROUP - 1 {
            assert_eq!(g.attach(a, q), 0);
        }
        assert_eq!(g.attach(a, 1000), libc::ENOMEM, "a full group");
        let mut b = a;
        b[15] = 0;
        assert_eq!(g.attach(b, 5), 0);
        assert_eq!(g.detach(&b, 5), (0, true), "b is left empty");
        assert_eq!(g.detach(&a, 5), (0, false), "a is not");
        assert!(g.has(&a) && !g.has(&b));
        assert_eq!(g.detach(&a, 5), (libc::EINVAL, false));
        for q in 6..6 + MAX_QPS_PER_GROUP - 1 {
            assert_eq!(g.detach(&a, q).0, 0);
        }
        assert!(!g.has(&a));
        assert_eq!(g.attachments, 0);
    }
}
