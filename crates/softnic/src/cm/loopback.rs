//! Loopback destinations: where a connection to `127.0.0.1` (a loopback address no device
//! has) goes. On a kernel every process of a host shares its devices, and the CM resolves
//! loopback to a local device (`cma_resolve_loopback`), whose listener bound to the any
//! address takes the request: `ib_write_bw -R 127.0.0.1`, `rping -c -a 127.0.0.1` and
//! `fi_pingpong 127.0.0.1` reach a server on the same host. With softnic each process has its
//! own device, so a listener bound to the any address on the UDP link is announced to the
//! host: an abstract Unix socket named `softnic-cm/<port space>/<port>/<device address>`
//! per device, held by the listening id (its name goes when the id is destroyed or its
//! process ends; a child forked without `exec` keeps a copy, and the name, until it exits).
//! A resolver finds the names in `/proc/net/unix`.

use std::net::Ipv4Addr;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

use super::PortSpace;

/// The beginning of the names of port `port` of `ps`.
fn prefix(ps: PortSpace, port: u16) -> String {
    format!("softnic-cm/{:04x}/{port}/", ps.code())
}

/// Announces a listener of port `port` of `ps` at each of `ips` (its devices' addresses on the
/// UDP link): the sockets that hold the names. A name taken already (or a socket that cannot
/// be made) is left out: the listener is still reached at its devices' own addresses.
pub(super) fn announce(
    ps: PortSpace,
    port: u16,
    ips: impl Iterator<Item = Ipv4Addr>,
) -> Vec<UnixDatagram> {
    ips.filter_map(|ip| {
        let name = format!("{}{ip}", prefix(ps, port));
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).ok()?;
        UnixDatagram::bind_addr(&addr).ok()
    })
    .collect()
}

/// The device address of a listener of port `port` of `ps` announced on this host (the
/// lowest, if several processes listen there), if there is one.
pub(super) fn announced(ps: PortSpace, port: u16) -> Option<Ipv4Addr> {
    let table = std::fs::read_to_string("/proc/net/unix").ok()?;
    listed(&table, ps, port)
}

/// [`announced`] in `table`, the text of `/proc/net/unix` (the path, `@` and the name for an
/// abstract socket, ends each line).
fn listed(table: &str, ps: PortSpace, port: u16) -> Option<Ipv4Addr> {
    let prefix = format!("@{}", prefix(ps, port));
    table
        .lines()
        .filter_map(|l| {
            l.split_whitespace()
                .last()?
                .strip_prefix(&prefix)?
                .parse()
                .ok()
        })
        .min()
}

/// Whether a socket of this host is bound to `ip` on RoCEv2's UDP port (`/proc/net/udp`): a
/// device of another process (or fabric) has that address.
pub(super) fn device_at(ip: Ipv4Addr) -> bool {
    std::fs::read_to_string("/proc/net/udp").is_ok_and(|t| bound_in(&t, ip))
}

/// [`device_at`] in `table`, the text of `/proc/net/udp`: its local addresses are the bytes of
/// the address in memory order, printed as a native integer, then the port.
fn bound_in(table: &str, ip: Ipv4Addr) -> bool {
    table.lines().skip(1).any(|l| {
        let Some((addr, port)) = l.split_whitespace().nth(1).and_then(|a| a.split_once(':')) else {
            return false;
        };
        let at = u32::from_str_radix(addr, 16).map(|n| Ipv4Addr::from(n.to_ne_bytes()));
        at == Ok(ip) && u16::from_str_radix(port, 16) == Ok(crate::roce::UDP_PORT)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_announced_address_of_the_port_space_and_port_is_found() {
        let table = "Num       RefCount Protocol Flags    Type St Inode Path\n\
            0000000000000000: 00000002 00000000 00000000 0002 01 1 @softnic-cm/0106/7000/127.0.0.9\n\
            0000000000000000: 00000002 00000000 00000000 0002 01 2 @softnic-cm/0106/7000/127.0.0.3\n\
            0000000000000000: 00000002 00000000 00000000 0002 01 3 @softnic-cm/0111/7000/127.0.0.2\n\
            0000000000000000: 00000002 00000000 00000000 0002 01 4 @softnic-cm/0106/70000/127.0.0.1\n\
            0000000000000000: 00000002 00000000 00000000 0002 01 5 @softnic-cm/0106/7000/junk\n\
            0000000000000000: 00000003 00000000 00000000 0001 03 6 /run/systemd/notify\n\
            0000000000000000: 00000003 00000000 00000000 0001 03 7\n";
        let at = |ps, port| listed(table, ps, port);
        assert_eq!(at(PortSpace::Tcp, 7000), Some(Ipv4Addr::new(127, 0, 0, 3)));
        assert_eq!(at(PortSpace::Udp, 7000), Some(Ipv4Addr::new(127, 0, 0, 2)));
        assert_eq!(at(PortSpace::Ib, 7000), None);
        assert_eq!(at(PortSpace::Tcp, 700), None);
    }

    #[test]
    fn a_device_is_found_by_the_address_its_socket_is_bound_to() {
        let ip = Ipv4Addr::new(127, 0, 61, 2);
        assert!(!device_at(ip));
        let s = std::net::UdpSocket::bind((ip, crate::roce::UDP_PORT)).unwrap();
        assert!(device_at(ip));
        // Another port at the address is not a device's.
        let other = std::net::UdpSocket::bind((Ipv4Addr::new(127, 0, 61, 3), 4790)).unwrap();
        assert!(!device_at(Ipv4Addr::new(127, 0, 61, 3)));
        drop((s, other));
        assert!(!device_at(ip));
    }

    #[test]
    fn an_announcement_lasts_as_long_as_its_socket() {
        let ip = Ipv4Addr::new(127, 0, 61, 1);
        // A port no other test announces.
        let held = announce(PortSpace::Ib, 61_061, [ip].into_iter());
        assert_eq!(held.len(), 1);
        assert_eq!(announced(PortSpace::Ib, 61_061), Some(ip));
        // The same name again is taken.
        assert!(announce(PortSpace::Ib, 61_061, [ip].into_iter()).is_empty());
        drop(held);
        assert_eq!(announced(PortSpace::Ib, 61_061), None);
    }
}
