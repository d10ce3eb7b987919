//! The UDP link: a device's port on a real network, carrying RoCEv2 (InfiniBand packets in
//! UDP datagrams to port 4791) between processes or hosts.
//!
//! A port is one receiving socket bound to `ip:4791` and a few sending sockets bound to
//! `ip:<ephemeral>`: a QP always sends from the same one, so its UDP source port is a function
//! of the QP (the flow entropy mlx5 and rxe put there for ECMP), and the receiver never
//! depends on it. Datagrams go out in batches (`sendmmsg`) at the end of each round of
//! progress and come in in batches (`recvmmsg`); the sending sockets set don't-fragment, so
//! the kernel puts identification 0 in their IPv4 headers and the ICRC (which covers them,
//! see [`roce`](crate::roce)) is known before the datagram leaves.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use crate::roce::{self, UDP_PORT};

/// Sending sockets per port (distinct UDP source ports for the QPs to spread over).
const TX_SOCKETS: usize = 4;
/// Datagrams per `sendmmsg` / `recvmmsg`.
const BATCH: usize = 32;
/// The largest datagram taken in: a 4096-byte MTU packet and every header softnic sends fit.
const RX_BUF: usize = 4096 + 256;
/// Socket buffer sizes asked for (root may exceed the system maximum).
const RCVBUF: i32 = 32 << 20;
const SNDBUF: i32 = 4 << 20;

/// A datagram waiting to leave.
struct Outgoing {
    dst: SocketAddrV4,
    bytes: Vec<u8>,
}

/// A datagram that came in.
pub(crate) struct Incoming {
    /// Who sent it.
    pub(crate) src: SocketAddrV4,
    /// The InfiniBand packet (BTH to ICRC).
    pub(crate) bytes: Vec<u8>,
    /// It was longer than any packet softnic takes (and was cut).
    pub(crate) truncated: bool,
}

/// One device's port on the UDP link.
pub(crate) struct UdpPort {
    /// The address the port is bound to (its GID is the IPv4-mapped one).
    pub(crate) ip: Ipv4Addr,
    rx: UdpSocket,
    /// Sending sockets and their source ports.
    tx: Vec<(UdpSocket, u16)>,
    /// Per sending socket, what waits for the next flush.
    outbox: Vec<Vec<Outgoing>>,
    rx_bufs: Box<[[u8; RX_BUF]; BATCH]>,
    /// Fabric time before which the receiving socket, last found empty, is not read again.
    pub(crate) idle_until: u64,
}

impl std::fmt::Debug for UdpPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpPort")
            .field("ip", &self.ip)
            .finish_non_exhaustive()
    }
}

impl UdpPort {
    /// A port bound to `ip:4791`. Fails (EADDRINUSE, EADDRNOTAVAIL...) as `bind` does.
    pub(crate) fn bind(ip: Ipv4Addr) -> io::Result<UdpPort> {
        let rx = UdpSocket::bind(SocketAddrV4::new(ip, UDP_PORT))?;
        rx.set_nonblocking(true)?;
        set_buffer(&rx, libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, RCVBUF);
        let tx = (0..TX_SOCKETS)
            .map(|_| {
                let s = UdpSocket::bind(SocketAddrV4::new(ip, 0))?;
                set_int(
                    &s,
                    libc::IPPROTO_IP,
                    libc::IP_MTU_DISCOVER,
                    libc::IP_PMTUDISC_DO,
                )?;
                set_buffer(&s, libc::SO_SNDBUFFORCE, libc::SO_SNDBUF, SNDBUF);
                let port = s.local_addr()?.port();
                Ok((s, port))
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(UdpPort {
            ip,
            rx,
            outbox: (0..tx.len()).map(|_| Vec::new()).collect(),
            tx,
            rx_bufs: Box::new([[0; RX_BUF]; BATCH]),
            idle_until: 0,
        })
    }

    /// A port on the first free address of 127.0.0.2 to 127.0.0.254 (port 4791 not bound
    /// there by anybody, this process included), skipping `skip`.
    pub(crate) fn bind_free(skip: &[Ipv4Addr]) -> io::Result<UdpPort> {
        let mut last = io::Error::from_raw_os_error(libc::EADDRINUSE);
        for n in 2..=254 {
            let ip = Ipv4Addr::new(127, 0, 0, n);
            if skip.contains(&ip) {
                continue;
            }
            match UdpPort::bind(ip) {
                Ok(p) => return Ok(p),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The descriptor that becomes readable when datagrams arrive.
    pub(crate) fn rx_fd(&self) -> RawFd {
        self.rx.as_raw_fd()
    }

    /// The UDP source port of QP number `qpn`'s packets.
    pub(crate) fn sport(&self, qpn: u32) -> u16 {
        self.tx[qpn as usize % self.tx.len()].1
    }

    /// Queues a packet from source port `sport` to `dst`, sealing it with its RoCEv2 ICRC
    /// unless `sealed` (it already carries one: it was corrupted after sealing).
    pub(crate) fn queue(
        &mut self,
        sport: u16,
        dst: SocketAddrV4,
        mut bytes: Vec<u8>,
        sealed: bool,
    ) {
        if !sealed {
            roce::seal_v4(self.ip, sport, *dst.ip(), &mut bytes);
        }
        let i = self.tx.iter().position(|t| t.1 == sport).unwrap_or(0);
        self.outbox[i].push(Outgoing { dst, bytes });
    }

    /// Whether packets wait to be sent.
    pub(crate) fn has_outgoing(&self) -> bool {
        self.outbox.iter().any(|o| !o.is_empty())
    }

    /// Sends everything queued. Returns how many datagrams the kernel refused (dropped: the
    /// transports recover as they do from loss).
    pub(crate) fn flush(&mut self) -> u64 {
        let mut failed = 0;
        for (i, out) in self.outbox.iter_mut().enumerate() {
            let fd = self.tx[i].0.as_raw_fd();
            let mut sent = 0;
            while sent < out.len() {
                match send_batch(fd, &out[sent..(sent + BATCH).min(out.len())]) {
                    Ok(n) => sent += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        // The first datagram of the batch was refused: drop it, go on.
                        failed += 1;
                        sent += 1;
                    }
                }
            }
            out.clear();
        }
        failed
    }

    /// Takes in up to one batch of datagrams that have arrived, appending them to `into`.
    /// Returns how many came.
    pub(crate) fn receive(&mut self, into: &mut Vec<Incoming>) -> usize {
        // SAFETY: all-zero `mmsghdr`, `iovec` and `sockaddr_in` are valid values (null
        // pointers, zero lengths); every pointer set below points into locals or `rx_bufs`,
        // which outlive the call, with the lengths of what they point to.
        unsafe {
            let mut addrs: [libc::sockaddr_in; BATCH] = std::mem::zeroed();
            let mut iovs: [libc::iovec; BATCH] = std::mem::zeroed();
            let mut hdrs: [libc::mmsghdr; BATCH] = std::mem::zeroed();
            let bufs = self.rx_bufs.as_mut_ptr();
            for i in 0..BATCH {
                iovs[i].iov_base = bufs.add(i).cast();
                iovs[i].iov_len = RX_BUF;
                hdrs[i].msg_hdr.msg_name = (&raw mut addrs[i]).cast();
                hdrs[i].msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
                hdrs[i].msg_hdr.msg_iov = &raw mut iovs[i];
                hdrs[i].msg_hdr.msg_iovlen = 1;
            }
            let n = libc::recvmmsg(
                self.rx.as_raw_fd(),
                hdrs.as_mut_ptr(),
                BATCH as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            );
            if n <= 0 {
                return 0;
            }
            let n = n as usize;
            for i in 0..n {
                let a = &addrs[i];
                let len = (hdrs[i].msg_len as usize).min(RX_BUF);
                into.push(Incoming {
                    src: SocketAddrV4::new(
                        Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                        u16::from_be(a.sin_port),
                    ),
                    bytes: self.rx_bufs[i][..len].to_vec(),
                    truncated: hdrs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
                });
            }
            n
        }
    }
}

/// Sends `batch` from socket `fd` in one `sendmmsg`: how many left.
fn send_batch(fd: RawFd, batch: &[Outgoing]) -> io::Result<usize> {
    debug_assert!(batch.len() <= BATCH);
    // SAFETY: all-zero `mmsghdr`, `iovec` and `sockaddr_in` are valid values; every pointer
    // set below points into these locals or into `batch`'s buffers, which outlive the call,
    // and the kernel only reads through them.
    unsafe {
        let mut addrs: [libc::sockaddr_in; BATCH] = std::mem::zeroed();
        let mut iovs: [libc::iovec; BATCH] = std::mem::zeroed();
        let mut hdrs: [libc::mmsghdr; BATCH] = std::mem::zeroed();
        for (i, o) in batch.iter().enumerate() {
            addrs[i].sin_family = libc::AF_INET as libc::sa_family_t;
            addrs[i].sin_port = o.dst.port().to_be();
            addrs[i].sin_addr.s_addr = u32::from(*o.dst.ip()).to_be();
            iovs[i].iov_base = o.bytes.as_ptr().cast_mut().cast();
            iovs[i].iov_len = o.bytes.len();
            hdrs[i].msg_hdr.msg_name = (&raw mut addrs[i]).cast();
            hdrs[i].msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
            hdrs[i].msg_hdr.msg_iov = &raw mut iovs[i];
            hdrs[i].msg_hdr.msg_iovlen = 1;
        }
        let n = libc::sendmmsg(fd, hdrs.as_mut_ptr(), batch.len() as u32, 0);
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
}

/// Sleeps until one of `fds` is readable or `timeout` has passed (a signal ends it early).
pub(crate) fn wait_readable(fds: &[RawFd], timeout: Duration) {
    let mut polls: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: `polls` and `ts` are valid for the call and sized as passed; no signal mask.
    unsafe {
        libc::ppoll(
            polls.as_mut_ptr(),
            polls.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    };
}

/// Sets an integer socket option.
fn set_int(s: &UdpSocket, level: i32, name: i32, value: i32) -> io::Result<()> {
    // SAFETY: passes a valid `c_int` and its size.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            name,
            (&raw const value).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Asks for a socket buffer of `bytes`: beyond the system maximum if allowed (`force`, as
/// root), else as much as it grants. Neither failing is an error: the buffer stays smaller.
fn set_buffer(s: &UdpSocket, force: i32, plain: i32, bytes: i32) {
    if set_int(s, libc::SOL_SOCKET, force, bytes).is_err() {
        let _ = set_int(s, libc::SOL_SOCKET, plain, bytes);
    }
}
