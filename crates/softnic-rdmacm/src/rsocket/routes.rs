//! Where a datagram socket's datagrams go: a route per address and port (the peer socket's QP
//! and Q_Key), found in constant time, and one address handle per address, shared by its
//! ports' routes (an AH names a host, not a port). So a flood from many ports of one host
//! costs no AH each (softnic keeps every AH's shell once made), and the routes kept are
//! bounded: beyond [`ROUTES`] the oldest goes, and its address's AH with its last route,
//! once no send in flight names it.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};

use ibverbs_sys::ibv_ah;

/// Routes kept (the oldest goes first).
pub(super) const ROUTES: usize = 256;

/// The peer socket at an address and port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Route {
    pub(super) ah: *mut ibv_ah,
    pub(super) qpn: u32,
    pub(super) qkey: u32,
}

/// An address's AH and how many routes use it.
struct Ah {
    ah: *mut ibv_ah,
    routes: u32,
}

#[derive(Default)]
pub(super) struct Routes {
    /// (IPv4 address, port), both in network order.
    by: HashMap<(u32, u16), (u32, u32)>,
    /// The routes' keys, oldest first.
    order: VecDeque<(u32, u16)>,
    ahs: HashMap<u32, Ah>,
    /// Addresses whose AH no route uses any more, kept while a send in flight named it.
    orphans: Vec<u32>,
}

impl Routes {
    /// The route to `ip` and `port`.
    pub(super) fn get(&self, ip: u32, port: u16) -> Option<Route> {
        let &(qpn, qkey) = self.by.get(&(ip, port))?;
        Some(Route {
            ah: self.ahs.get(&ip)?.ah,
            qpn,
            qkey,
        })
    }

    /// Keeps the route to `ip` and `port`: to `qpn` from now on if it exists (the peer was
    /// made again), else new, its address's AH made by `make` (null: not kept) if it has
    /// none. Beyond [`ROUTES`] the oldest route goes; an AH no route uses goes by `drop` once
    /// `busy` (a send in flight names it) no longer says so.
    pub(super) fn learn(
        &mut self,
        (ip, port): (u32, u16),
        (qpn, qkey): (u32, u32),
        make: impl FnOnce() -> *mut ibv_ah,
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
                let ah = make();
                if ah.is_null() {
                    return;
                }
                v.insert(Ah { ah, routes: 0 })
            }
        };
        a.routes += 1;
        self.orphans.retain(|&o| o != ip);
        self.by.insert((ip, port), (qpn, qkey));
        self.order.push_back((ip, port));
        if self.order.len() > ROUTES {
            let old = self.order.pop_front().expect("more than none");
            self.by.remove(&old);
            let a = self.ahs.get_mut(&old.0).expect("a route's AH");
            a.routes -= 1;
            if a.routes == 0 {
                self.orphans.push(old.0);
            }
        }
        let ahs = &mut self.ahs;
        self.orphans.retain(|ip| match ahs.get(ip) {
            Some(a) if busy(a.ah) => true,
            Some(a) => {
                drop(a.ah);
                ahs.remove(ip);
                false
            }
            None => false,
        });
    }

    /// Every AH kept (to destroy with the socket).
    pub(super) fn ahs(&self) -> impl Iterator<Item = *mut ibv_ah> + '_ {
        self.ahs.values().map(|a| a.ah)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ah(n: usize) -> *mut ibv_ah {
        std::ptr::without_provenance_mut(n * 8)
    }

    #[test]
    fn the_ports_of_one_host_share_its_address_handle() {
        let mut r = Routes::default();
        let mut made = 0;
        for port in 0..ROUTES as u16 {
            let make = || {
                made += 1;
                ah(made)
            };
            r.learn(
                (7, port),
                (100 + u32::from(port), 1),
                make,
                |_| false,
                |_| {},
            );
        }
        assert_eq!(made, 1);
        assert_eq!(
            r.get(7, 3),
            Some(Route {
                ah: ah(1),
                qpn: 103,
                qkey: 1
            })
        );
        // A sender made again on the same port: the route moves to its new QP.
        r.learn((7, 3), (999, 1), || unreachable!(), |_| false, |_| {});
        assert_eq!(r.get(7, 3).map(|x| x.qpn), Some(999));
        assert_eq!(r.get(8, 3), None);
    }

    #[test]
    fn the_oldest_route_goes_and_its_handle_with_its_last_route_once_no_send_names_it() {
        let mut r = Routes::default();
        let mut dropped = Vec::new();
        // Host 1 has one route, the oldest; then hosts 2.. fill the table.
        r.learn((1, 1), (1, 1), || ah(1), |_| false, |a| dropped.push(a));
        for host in 2..=ROUTES as u32 {
            r.learn(
                (host, 1),
                (host, 1),
                || ah(host as usize),
                |_| false,
                |a| dropped.push(a),
            );
        }
        assert!(dropped.is_empty());
        // One more: host 1's route goes, but a send in flight still names its AH.
        let busy = |a| a == ah(1);
        r.learn((1000, 1), (5, 1), || ah(1000), busy, |a| dropped.push(a));
        assert_eq!(r.get(1, 1), None);
        assert!(dropped.is_empty(), "kept while a send names it");
        assert_eq!(r.ahs().count(), ROUTES + 1);
        // The next route learnt finds it idle: it goes now, and so does host 2's route.
        r.learn(
            (1001, 1),
            (6, 1),
            || ah(1001),
            |_| false,
            |a| dropped.push(a),
        );
        assert_eq!(dropped, [ah(1), ah(2)]);
        assert_eq!(r.ahs().count(), ROUTES);
        assert_eq!(r.get(1001, 1).map(|x| x.qpn), Some(6));
        // A failed AH keeps no route.
        r.learn((2000, 1), (7, 1), std::ptr::null_mut, |_| false, |_| {});
        assert_eq!(r.get(2000, 1), None);
    }
}
