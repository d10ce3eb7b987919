//! A UDP port's multicast groups: for each IPv4 group a QP of the device joined
//! ([`mcast::group_ipv4`](crate::mcast::group_ipv4)), a socket bound to the group's address and
//! port 4791 that joined it on the port's interface, so that every process whose device joined
//! hears what is sent to it (the port's own socket, bound to its unicast address, does not).
//! The sending sockets name the port's interface for multicast ([`set_multicast_if`]), so that
//! a group's packets leave where the port is (loopback included) and come back to this host's
//! members too.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};

use crate::hash::FastMap;
use crate::roce::UDP_PORT;

use super::udp::{Damage, RCVBUF, check, set_buffer};

/// Datagrams taken from one group's socket per look, at most.
const PER_LOOK: usize = 64;

/// The largest datagram a group's socket takes (a 4096-byte MTU packet and its headers).
const MAX_DATAGRAM: usize = 4096 + 256;

/// One group's socket and how many of the device's groups use it.
struct Group {
    ip: Ipv4Addr,
    sock: UdpSocket,
    users: u32,
}

/// A datagram a group's socket took in: `len` bytes at `at` of the buffer it was read into.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Got {
    /// The group's address.
    pub(crate) ip: Ipv4Addr,
    /// Who sent it.
    pub(crate) src: SocketAddrV4,
    pub(crate) at: usize,
    pub(crate) len: usize,
    /// Why it must be dropped, if it must.
    pub(crate) damage: Option<Damage>,
}

/// A UDP port's group sockets.
#[derive(Default)]
pub(crate) struct Groups {
    groups: Vec<Group>,
    /// ICRC residues of GSO segments, as the port keeps them (group packets go alone, so only
    /// a damaged one needs them).
    residues: FastMap<usize, Box<[u32]>>,
    /// Which sockets are readable (kept for its allocation).
    polls: Vec<libc::pollfd>,
}

impl Groups {
    /// Joins group `ip` on interface `iface` (a socket bound to `ip:4791`), or counts one more
    /// user of the socket it has. Fails as `socket`, `bind` or `IP_ADD_MEMBERSHIP` do (the
    /// interface cannot take multicast, no route...).
    pub(crate) fn join(&mut self, ip: Ipv4Addr, iface: Ipv4Addr) -> io::Result<()> {
        if let Some(g) = self.groups.iter_mut().find(|g| g.ip == ip) {
            g.users += 1;
            return Ok(());
        }
        let sock = group_socket(ip, iface)?;
        self.groups.push(Group { ip, sock, users: 1 });
        Ok(())
    }

    /// One user of group `ip`'s socket less: the last closes it (leaving the group).
    pub(crate) fn leave(&mut self, ip: Ipv4Addr) {
        if let Some(k) = self.groups.iter().position(|g| g.ip == ip) {
            self.groups[k].users -= 1;
            if self.groups[k].users == 0 {
                self.groups.swap_remove(k);
            }
        }
    }

    /// The descriptors of the group sockets (a progress thread sleeps on them too).
    pub(crate) fn fds(&self) -> impl Iterator<Item = RawFd> + '_ {
        self.groups.iter().map(|g| g.sock.as_raw_fd())
    }

    /// Whether the port joined any group.
    pub(crate) fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Takes in what the readable group sockets hold (up to [`PER_LOOK`] datagrams each) into
    /// `buf`, each described in `got` (both cleared first): one system call a socket that
    /// has something, and one `poll` to find them when there are several.
    pub(crate) fn receive(&mut self, got: &mut Vec<Got>, buf: &mut Vec<u8>) {
        got.clear();
        buf.clear();
        if self.groups.len() > 1 {
            self.polls.clear();
            self.polls.extend(self.groups.iter().map(|g| libc::pollfd {
                fd: g.sock.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }));
            // SAFETY: `polls` holds `len` valid entries for the call; no waiting.
            let n =
                unsafe { libc::poll(self.polls.as_mut_ptr(), self.polls.len() as libc::nfds_t, 0) };
            if n <= 0 {
                return;
            }
        }
        for (k, g) in self.groups.iter().enumerate() {
            if self.groups.len() > 1 && self.polls[k].revents == 0 {
                continue;
            }
            for _ in 0..PER_LOOK {
                let at = buf.len();
                buf.resize(at + MAX_DATAGRAM + 1, 0);
                let Ok((len, from)) = g.sock.recv_from(&mut buf[at..]) else {
                    buf.truncate(at);
                    break;
                };
                buf.truncate(at + len.min(MAX_DATAGRAM + 1));
                let std::net::SocketAddr::V4(src) = from else {
                    continue;
                };
                let damage = if len > MAX_DATAGRAM {
                    Some(Damage::Malformed)
                } else {
                    check(g.ip, &mut self.residues, src, &buf[at..])
                };
                got.push(Got {
                    ip: g.ip,
                    src,
                    at,
                    len: buf.len() - at,
                    damage,
                });
            }
        }
    }
}

/// A non-blocking socket bound to `ip:4791` (shared with other processes' members), member of
/// group `ip` on interface `iface`, hearing only that group.
fn group_socket(ip: Ipv4Addr, iface: Ipv4Addr) -> io::Result<UdpSocket> {
    // SAFETY: a plain `socket` call; its result is checked before use.
    let fd = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a socket just opened here and owned by nothing else.
    let sock = unsafe { UdpSocket::from_raw_fd(fd) };
    set_opt(&sock, libc::SOL_SOCKET, libc::SO_REUSEADDR, &1i32)?;
    // As deep as the port's own: a burst to the group waits there for a sleeping thread.
    set_buffer(&sock, libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, RCVBUF);
    // Only the group bound to: not every group some socket of the host joined.
    set_opt(&sock, libc::IPPROTO_IP, libc::IP_MULTICAST_ALL, &0i32)?;
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: UDP_PORT.to_be(),
        sin_addr: in_addr(ip),
        sin_zero: [0; 8],
    };
    // SAFETY: `addr` is a valid `sockaddr_in` of the size passed.
    let r = unsafe {
        libc::bind(
            fd,
            (&raw const addr).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let mreq = libc::ip_mreq {
        imr_multiaddr: in_addr(ip),
        imr_interface: in_addr(iface),
    };
    set_opt(&sock, libc::IPPROTO_IP, libc::IP_ADD_MEMBERSHIP, &mreq)?;
    Ok(sock)
}

/// Makes `s` send multicast out of the interface of address `iface` (and hear its own group
/// packets back: `IP_MULTICAST_LOOP`, on by default).
pub(crate) fn set_multicast_if(s: &UdpSocket, iface: Ipv4Addr) -> io::Result<()> {
    set_opt(s, libc::IPPROTO_IP, libc::IP_MULTICAST_IF, &in_addr(iface))
}

fn in_addr(ip: Ipv4Addr) -> libc::in_addr {
    libc::in_addr {
        s_addr: u32::from(ip).to_be(),
    }
}

/// Sets socket option `name` of `level` to `value`.
fn set_opt<T>(s: &UdpSocket, level: i32, name: i32, value: &T) -> io::Result<()> {
    // SAFETY: `value` is a valid `T` for the call, and its size is passed with it.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two ports on loopback addresses join one group; a datagram sent to it from a third
    /// address (naming its interface) reaches both, and after one leaves, only the other.
    #[test]
    fn every_port_that_joined_hears_the_group_until_it_leaves() {
        // (Outside the 239.192.0.0/14 that IPv6 groups are hashed to: other tests use those.)
        let group = Ipv4Addr::new(239, 255, 77, 7);
        let (a, b) = (Ipv4Addr::new(127, 0, 77, 1), Ipv4Addr::new(127, 0, 77, 2));
        let (mut ga, mut gb) = (Groups::default(), Groups::default());
        ga.join(group, a).unwrap();
        gb.join(group, b).unwrap();
        gb.join(group, b).unwrap();
        let from = UdpSocket::bind("127.0.77.3:0").unwrap();
        set_multicast_if(&from, Ipv4Addr::new(127, 0, 77, 3)).unwrap();
        // Only this sender's datagrams count: the same test in another process (a second
        // `cargo test` at once) sends to the same group.
        let std::net::SocketAddr::V4(me) = from.local_addr().unwrap() else {
            unreachable!("bound to an IPv4 address")
        };
        let heard = |g: &mut Groups, want: usize| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            let (mut got, mut buf, mut n) = (Vec::new(), Vec::new(), 0);
            while n < want && std::time::Instant::now() < deadline {
                g.receive(&mut got, &mut buf);
                for d in got.iter().filter(|d| d.src == me) {
                    assert_eq!((d.ip, d.len), (group, 64));
                    assert_eq!(d.damage, Some(Damage::BadIcrc), "not RoCEv2");
                    n += 1;
                }
            }
            n
        };
        from.send_to(&[0u8; 64], SocketAddrV4::new(group, UDP_PORT))
            .unwrap();
        assert_eq!((heard(&mut ga, 1), heard(&mut gb, 1)), (1, 1));
        ga.leave(group);
        gb.leave(group);
        assert!(ga.is_empty() && !gb.is_empty(), "b joined twice");
        from.send_to(&[0u8; 64], SocketAddrV4::new(group, UDP_PORT))
            .unwrap();
        assert_eq!(heard(&mut gb, 1), 1);
        gb.leave(group);
        assert!(gb.is_empty() && gb.fds().count() == 0);
    }
}
