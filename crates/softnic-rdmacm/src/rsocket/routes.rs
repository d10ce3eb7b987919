//! Where a datagram socket's datagrams go: a route per address and port (the peer socket's QP
//! and Q_Key), found in constant time, and per address its AH's attributes, shared by its
//! ports' routes (an AH names a host, not a port). The AH itself is made at the first send
//! to that host: receiving makes none, so a flood of datagrams from many hosts or ports costs
//! no AH (softnic keeps every AH's shell once made). Beyond [`ROUTES`] the oldest route goes,
//! and its host's AH with its last route, once no send in flight names it.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};

use ibverbs_sys::{ibv_ah, ibv_ah_attr};

/// Routes kept (the oldest goes first).
pub(super) const ROUTES: usize = 256;

/// A host's AH (null until the first send there) and how many routes use it.
struct Ah {
    attr: ibv_ah_attr,
    ah: *mut ibv_ah,
    routes: u32,
}

#[derive(Default)]
pub(super) struct Routes {
    /// (IPv4 address, port), both in network order -> the peer's QP number and Q_Key.
    by: HashMap<(u32, u16), (u32, u32)>,
    /// The routes' keys, oldest first.
    order: VecDeque<(u32, u16)>,
    ahs: HashMap<u32, Ah>,
    /// Hosts whose AH no route uses any more, kept while a send in flight named it.
    orphans: Vec<u32>,
}

impl Routes {
    /// The peer socket (QP number, Q_Key) at `ip` and `port`.
    pub(super) fn get(&self, ip: u32, port: u16) -> Option<(u32, u32)> {
        self.by.get(&(ip, port)).copied()
    }

    /// The AH of host `ip` (which a route names), made by `make` from its attributes at the
    /// first call (null: none made, and the next call tries again).
    pub(super) fn ah(
        &mut self,
        ip: u32,
        make: impl FnOnce(&mut ibv_ah_attr) -> *mut ibv_ah,
    ) -> Option<*mut ibv_ah> {
        let a = self.ahs.get_mut(&ip)?;
        if a.ah.is_null() {
            a.ah = make(&mut a.attr);
        }
        (!a.ah.is_null()).then_some(a.ah)
    }

    /// Keeps the route to `ip` and `port`: to `qpn` from now on if it exists (the peer was
    /// made again), else new, its host's AH attributes from `attr` (`None`: not kept) if the
    /// host has none. Beyond [`ROUTES`] the oldest route goes; an AH no route uses goes by
    /// `drop` once `busy` (a send in flight names it) no longer says so.
    pub(super) fn learn(
        &mut self,
        (ip, port): (u32, u16),
        (qpn, qkey): (u32, u32),
        attr: impl FnOnce() -> Option<ibv_ah_attr>,
        busy: impl Fn(*mut ibv_ah) -> bool,
        mut drop: impl FnMut(*mut ibv_ah),
    ) {
        if let Some(r) = self.by.get_mut(&(ip, port)) {
            *r = (qpn, qkey);
            return;
        }
        let a = match self.ahs.entry(ip) {
            Entry::Occupied(a) => a.into_mut(),
            Entry::Vacant(v) => {
                let Some(attr) = attr() else {
                    return;
                };
                v.insert(Ah {
                    attr,
                    ah: std::ptr::null_mut(),
                    routes: 0,
                })
            }
        };
        a.routes += 1;
        self.orphans.retain(|&o| o != ip);
        self.by.insert((ip, port), (qpn, qkey));
        self.order.push_back((ip, port));
        if self.order.len() > ROUTES {
            let old = self.order.pop_front().expect("more than none");
            self.by.remove(&old);
            let a = self.ahs.get_mut(&old.0).expect("a route's host");
            a.routes -= 1;
            if a.routes == 0 {
                self.orphans.push(old.0);
            }
        }
        let ahs = &mut self.ahs;
        self.orphans.retain(|ip| match ahs.get(ip) {
            Some(a) if !a.ah.is_null() && busy(a.ah) => true,
            Some(a) => {
                if !a.ah.is_null() {
                    drop(a.ah);
                }
                ahs.remove(ip);
                false
            }
            None => false,
        });
    }

    /// Every AH made (to destroy with the socket).
    pub(super) fn ahs(&self) -> impl Iterator<Item = *mut ibv_ah> + '_ {
        self.ahs.values().map(|a| a.ah).filter(|a| !a.is_null())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ah(n: usize) -> *mut ibv_ah {
        std::ptr::without_provenance_mut(n * 8)
    }

    fn attr() -> Option<ibv_ah_attr> {
        Some(ibv_ah_attr::default())
    }

    #[test]
    fn the_ports_of_one_host_share_its_address_handle_made_at_the_first_send() {
        let mut r = Routes::default();
        for port in 0..ROUTES as u16 {
            r.learn(
                (7, port),
                (100 + u32::from(port), 1),
                attr,
                |_| false,
                |_| {},
            );
        }
        assert_eq!(r.ahs().count(), 0, "receiving makes no AH");
        assert_eq!(r.get(7, 3), Some((103, 1)));
        let mut made = 0;
        for _ in 0..3 {
            let a = r.ah(7, |_| {
                made += 1;
                ah(made)
            });
            assert_eq!(a, Some(ah(1)));
        }
        assert_eq!(made, 1, "one AH for the host's ports");
        // A sender made again on the same port: the route moves to its new QP.
        r.learn((7, 3), (999, 1), || unreachable!(), |_| false, |_| {});
        assert_eq!(r.get(7, 3), Some((999, 1)));
        assert_eq!(r.get(8, 3), None);
        assert_eq!(r.ah(8, |_| unreachable!()), None, "no route, no AH");
        // An AH that cannot be made now is tried again at the next send.
        r.learn((9, 1), (5, 1), attr, |_| false, |_| {});
        assert_eq!(r.ah(9, |_| std::ptr::null_mut()), None);
        assert_eq!(r.ah(9, |_| ah(9)), Some(ah(9)));
    }

    #[test]
    fn the_oldest_route_goes_and_its_handle_with_its_last_route_once_no_send_names_it() {
        let mut r = Routes::default();
        let mut dropped = Vec::new();
        // Host 1 has one route, the oldest, and an AH (a send went there); then hosts 2..
        // fill the table, host 2 with an AH too.
        r.learn((1, 1), (1, 1), attr, |_| false, |a| dropped.push(a));
        assert_eq!(r.ah(1, |_| ah(1)), Some(ah(1)));
        for host in 2..=ROUTES as u32 {
            r.learn((host, 1), (host, 1), attr, |_| false, |a| dropped.push(a));
        }
        assert_eq!(r.ah(2, |_| ah(2)), Some(ah(2)));
        assert!(dropped.is_empty());
        // One more: host 1's route goes, but a send in flight still names its AH.
        let busy = |a| a == ah(1);
        r.learn((1000, 1), (5, 1), attr, busy, |a| dropped.push(a));
        assert_eq!(r.get(1, 1), None);
        assert!(dropped.is_empty(), "kept while a send names it");
        assert_eq!(r.ahs().count(), 2);
        // The next route learnt finds it idle: it goes now, and so does host 2's route.
        r.learn((1001, 1), (6, 1), attr, |_| false, |a| dropped.push(a));
        assert_eq!(dropped, [ah(1), ah(2)]);
        assert_eq!(r.ahs().count(), 0);
        assert_eq!(r.get(1001, 1), Some((6, 1)));
        // Attributes that cannot be had keep no route.
        r.learn((2000, 1), (7, 1), || None, |_| false, |_| {});
        assert_eq!(r.get(2000, 1), None);
    }
}
