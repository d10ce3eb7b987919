//! 127.0.0.1, the host: where a connection to it goes when no device has that address. A
//! kernel's processes share the host's devices, and its CM resolves loopback to a local
//! device (`cma_resolve_loopback`), whose listener bound to the any address takes the
//! request. Each softnic process has a device of its own, at another address of 127.0.0.0/8
//! (softnic never gives a device 127.0.0.1 unless told to): so that `ib_write_bw -R 127.0.0.1`,
//! `rping -c -a 127.0.0.1` or `fi_pingpong 127.0.0.1` reach a server in another process, a
//! listener bound to the any address on the UDP link is announced to the host, by an abstract
//! Unix socket per device named `softnic-cm/<port space>/<port>/<device address>` (per network
//! namespace, as the link's sockets are). The listening id holds it: the name goes when the id
//! is destroyed or its process ends; a child forked without `exec` drops its copy (see
//! [`Bound`]). A resolver reads the names in `/proc/net/unix`, and takes the lowest address of
//! the port's whose device is up (a kernel would have refused a second listener the port).
//! Binding keeps the kernel's rule (`cma_any_addr`): a loopback address that no device of the
//! process has is the any address, and a listener bound there is announced too.

use std::net::{Ipv4Addr, Shutdown};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

use super::PortSpace;
use crate::fork::Bound;

/// The beginning of every name (the fork handler's check: see [`Bound`]).
pub(crate) const NAME_PREFIX: &[u8] = b"softnic-cm/";

/// The beginning of the names of port `port` of `ps`.
fn prefix(ps: PortSpace, port: u16) -> String {
    format!("softnic-cm/{:04x}/{port}/", ps.code())
}

/// A socket whose name announces a listener (see the module's documentation).
pub(crate) type Announcement = Bound<UnixDatagram>;

/// Announces a listener of port `port` of `ps` at each of `ips` (its devices' addresses on the
/// UDP link): the sockets that hold the names. A name taken already (or a socket that cannot
/// be made) is left out: the listener is still reached at its devices' own addresses.
pub(super) fn announce(
    ps: PortSpace,
    port: u16,
    ips: impl Iterator<Item = Ipv4Addr>,
) -> Vec<Announcement> {
    ips.filter_map(|ip| {
        let name = format!("{}{ip}", prefix(ps, port));
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).ok()?;
        Bound::bind(|| {
            let s = UnixDatagram::bind_addr(&addr)?;
            // Only a name: a datagram sent to it fails (EPIPE), nothing queues.
            s.shutdown(Shutdown::Read)?;
            Ok(s)
        })
        .ok()
    })
    .collect()
}

/// What a resolver of 127.0.0.1 reads of the host, before it takes the fabric's lock:
/// `/proc/net/unix` (the announcements) and `/proc/net/udp` (the devices), `None` where
/// unreadable. A name is bytes: a path that is not UTF-8 is read lossily.
pub(crate) struct Host {
    unix: Option<String>,
    udp: Option<String>,
}

impl Host {
    /// The two tables, as they are now.
    pub(crate) fn read() -> Host {
        Host::of(
            std::fs::read("/proc/net/unix").ok(),
            std::fs::read("/proc/net/udp").ok(),
        )
    }

    /// The tables of the bytes read (`None`: unreadable).
    fn of(unix: Option<Vec<u8>>, udp: Option<Vec<u8>>) -> Host {
        let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
        Host {
            unix: unix.map(text),
            udp: udp.map(text),
        }
    }

    /// Whether a device of the host has `ip` (a socket is bound to it on RoCEv2's UDP port);
    /// `None` if the table could not be read.
    pub(super) fn device_at(&self, ip: Ipv4Addr) -> Option<bool> {
        self.udp.as_deref().map(|t| bound_in(t, ip))
    }

    /// The device address of a listener of port `port` of `ps` announced on the host whose
    /// device is up (the lowest, if several processes listen there), if there is one.
    pub(super) fn listener(&self, ps: PortSpace, port: u16) -> Option<Ipv4Addr> {
        let mut at = listed(self.unix.as_deref()?, ps, port);
        at.sort_unstable();
        at.into_iter().find(|&ip| self.device_at(ip) == Some(true))
    }
}

/// The addresses announced for port `port` of `ps` in `table`, the text of `/proc/net/unix`
/// (the path, `@` and the name for an abstract socket, ends each line): unicast ones only.
fn listed(table: &str, ps: PortSpace, port: u16) -> Vec<Ipv4Addr> {
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
        .filter(|ip: &Ipv4Addr| !(ip.is_unspecified() || ip.is_multicast() || ip.is_broadcast()))
        .collect()
}

/// Whether `table`, the text of `/proc/net/udp`, has a socket bound to `ip` on RoCEv2's UDP
/// port: its local addresses are the bytes of the address in memory order, printed as a
/// native integer, then the port.
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

    /// `/proc/net/udp`'s lines of sockets at 127.0.0.3, .9, 127.0.0.2 and the any address
    /// (this host's byte order) on 4791, and 127.0.0.4 on another port.
    fn udp_table() -> String {
        let hex = |ip: [u8; 4], port: u16| format!("{:08X}:{port:04X}", u32::from_ne_bytes(ip));
        let line = |local: String| format!("   0: {local} 00000000:0000 07 00000000:00000000\n");
        let mut t = String::from("   sl  local_address rem_address   st\n");
        for ip in [[127, 0, 0, 3], [127, 0, 0, 9], [127, 0, 0, 2], [0, 0, 0, 0]] {
            t += &line(hex(ip, 4791));
        }
        t + &line(hex([127, 0, 0, 4], 4790))
    }

    #[test]
    fn the_lowest_announced_address_whose_device_is_up_is_found() {
        let names = [
            "@softnic-cm/0106/7000/127.0.0.9",
            "@softnic-cm/0106/7000/127.0.0.3",
            "@softnic-cm/0106/7000/127.0.0.1",
            "@softnic-cm/0111/7000/127.0.0.2",
            "@softnic-cm/0106/70000/127.0.0.2",
            "@softnic-cm/0106/7000/junk",
            "@softnic-cm/0106/7000/0.0.0.0",
            "/run/systemd/notify",
            "",
        ];
        let mut unix = String::from("Num       RefCount Protocol Flags    Type St Inode Path\n");
        for (inode, name) in names.iter().enumerate() {
            unix +=
                &format!("0000000000000000: 00000002 00000000 00000000 0002 01 {inode} {name}\n");
        }
        // A name that is not UTF-8 (the kernel prints a path's bytes as they are) hides none.
        let mut bytes =
            b"0000000000000000: 00000002 00000000 00000000 0002 01 0 /tmp/\xff\xfe\n".to_vec();
        bytes.extend_from_slice(unix.as_bytes());
        let host = Host::of(Some(bytes), Some(udp_table().into_bytes()));
        // 127.0.0.1's device is not up (a stale name): the next one.
        let at = |ps, port| host.listener(ps, port);
        assert_eq!(at(PortSpace::Tcp, 7000), Some(Ipv4Addr::new(127, 0, 0, 3)));
        assert_eq!(at(PortSpace::Udp, 7000), Some(Ipv4Addr::new(127, 0, 0, 2)));
        assert_eq!(at(PortSpace::Ib, 7000), None);
        assert_eq!(at(PortSpace::Tcp, 700), None);
        let unreadable = Host::of(None, None);
        assert_eq!(unreadable.listener(PortSpace::Tcp, 7000), None);
        assert_eq!(unreadable.device_at(Ipv4Addr::new(127, 0, 0, 3)), None);
    }

    #[test]
    fn a_device_is_an_address_bound_on_4791() {
        let t = udp_table();
        assert!(bound_in(&t, Ipv4Addr::new(127, 0, 0, 9)));
        assert!(!bound_in(&t, Ipv4Addr::new(127, 0, 0, 4)), "another port");
        assert!(!bound_in(&t, Ipv4Addr::new(127, 0, 0, 1)));
        // And this host's own table says so of a socket bound now.
        let ip = Ipv4Addr::new(127, 0, 61, 2);
        let s = std::net::UdpSocket::bind((ip, crate::roce::UDP_PORT)).unwrap();
        assert_eq!(Host::read().device_at(ip), Some(true));
        drop(s);
        assert_eq!(Host::read().device_at(ip), Some(false));
    }

    #[test]
    fn an_announcement_lasts_as_long_as_its_socket_and_takes_no_datagram() {
        let ip = Ipv4Addr::new(127, 0, 61, 1);
        let _device = std::net::UdpSocket::bind((ip, crate::roce::UDP_PORT)).unwrap();
        // A port of this process's own (the names are the host's).
        let port = 20_000 + (std::process::id() % 40_000) as u16;
        let held = announce(PortSpace::Ib, port, [ip].into_iter());
        assert_eq!(held.len(), 1);
        assert_eq!(Host::read().listener(PortSpace::Ib, port), Some(ip));
        // The same name again is taken.
        assert!(announce(PortSpace::Ib, port, [ip].into_iter()).is_empty());
        let name = format!("{}{ip}", prefix(PortSpace::Ib, port));
        let to = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let sender = UnixDatagram::unbound().unwrap();
        assert!(sender.send_to_addr(b"x", &to).is_err(), "nothing queues");
        drop(held);
        assert_eq!(Host::read().listener(PortSpace::Ib, port), None);
    }
}
