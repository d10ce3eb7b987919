//! The UDP link: a device's port on a real network, carrying RoCEv2 (InfiniBand packets in
//! UDP datagrams to port 4791) between processes or hosts.
//!
//! A port is one receiving socket bound to `ip:4791` (and one more for each multicast group its
//! device joined: see [`groups`](super::groups)) and a few sending sockets bound to
//! `ip:<ephemeral>`: a QP always sends from the same one, so its UDP source port is a function
//! of the QP (the flow entropy mlx5 and rxe put there for ECMP), and the receiver never
//! depends on it. The sending sockets set don't-fragment, so the kernel puts identification
//! 0 in the IPv4 header of a datagram sent alone, and the ICRC (which covers it, see
//! [`roce`]) is known before the datagram leaves.
//!
//! Datagrams go out at the end of each round of progress, in batches (`sendmmsg`), and runs of
//! same-sized packets to one destination (the middle packets of a message) as one GSO send
//! (`UDP_SEGMENT`): the kernel cuts it into datagrams after the socket layer, so a 64 KiB
//! message costs a few system calls' worth of kernel work instead of sixteen. Segment `k` of
//! a GSO send gets IPv4 identification `k`, and its ICRC is computed over that. Datagrams come
//! in in batches (`recvmmsg`); as a receiving socket sees no IP header, a packet's ICRC is
//! checked against identification 0 and, failing that, the 63 a GSO segment may have.
//! `SOFTNIC_GSO=0` in the environment sends every packet alone (a capture on the loopback
//! interface sees a GSO send before it is cut, as one frame).
//!
//! Bytes are copied as few times as the kernel allows: the payload of a WRITE or SEND packet
//! (in one SGE of a region that is not on demand) goes from the registered memory straight
//! into the kernel as the datagram leaves (see [`send`]); a packet that came in is checked
//! (its ICRC) just before it is delivered, so that the copy into registered memory reads it
//! from the cache.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use crate::fork::Bound;
use crate::hash::FastMap;
use crate::roce::{self, GSO_SEGMENTS, UDP_PORT};

mod send;

pub(crate) use send::Lent;
use send::{Iov, Outgoing};

/// Sending sockets per port (distinct UDP source ports for the QPs to spread over).
const TX_SOCKETS: usize = 4;
/// Packets a port sends per round of progress, at most (4 MiB at the 4096-byte MTU): the
/// rest of a long message (a READ response of many MiB, a window sent again after a NAK)
/// goes in the next rounds, after the sockets were read and this batch went out. A packet for
/// the UDP link takes no wire time here, so nothing else would stop a QP from putting a whole
/// message into one batch, holding the fabric's lock and a buffer per packet for all of it
/// while the peer's socket overflows.
pub(crate) const BURST: u32 = 1024;
/// Messages (datagrams or GSO sends) per `sendmmsg`, datagrams per `recvmmsg`.
const BATCH: usize = 32;
/// The largest datagram taken in: a GRO batch of packets (each is at most a 4096-byte MTU
/// packet and its headers) fits.
const RX_BUF: usize = 65_536;
/// The largest packet: a 4096-byte MTU packet and every header softnic sends.
const MAX_PACKET: usize = 4096 + 256;
/// The most bytes one GSO send may carry (a UDP datagram's largest payload over IPv4).
const GSO_BYTES: usize = 65_507;
/// Socket buffer sizes asked for (root may exceed the system maximum).
pub(super) const RCVBUF: i32 = 32 << 20;
const SNDBUF: i32 = 4 << 20;

/// What is wrong with a datagram that came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Damage {
    /// Too short for a BTH and an ICRC, or longer than any packet (cut).
    Malformed,
    /// The ICRC matches none of the identifications it may have been sent with.
    BadIcrc,
}

/// A packet that came in (a datagram, or one packet of a GRO batch): where it lies in the
/// port's receive buffers ([`UdpPort::take_rx_bufs`]) until the next [`UdpPort::receive`].
pub(crate) struct Incoming {
    /// Who sent it.
    pub(crate) src: SocketAddrV4,
    /// The InfiniBand packet (BTH to ICRC): `len` bytes at `at` in the receive buffers.
    pub(crate) at: usize,
    pub(crate) len: usize,
    /// Why it must be dropped, if it must.
    pub(crate) damage: Option<Damage>,
}

impl Incoming {
    /// The packet's bytes, in `bufs` (the receive buffers it came into).
    pub(crate) fn bytes<'a>(&self, bufs: &'a [u8]) -> &'a [u8] {
        bufs.get(self.at..self.at + self.len).unwrap_or_default()
    }
}

/// One device's port on the UDP link.
pub(crate) struct UdpPort {
    /// The address the port is bound to (its GID is the IPv4-mapped one).
    pub(crate) ip: Ipv4Addr,
    /// Bound to `ip:4791`: a forked child gives the address back.
    rx: Bound<UdpSocket>,
    /// Sending sockets and their source ports.
    tx: Vec<(UdpSocket, u16)>,
    /// Per sending socket, what waits for the next flush.
    outbox: Vec<Vec<Outgoing>>,
    /// Runs of the outbox sent as one message each (scratch, kept for its allocation).
    runs: Vec<std::ops::Range<usize>>,
    /// The pieces of a batch's packets (scratch, kept for its allocation).
    iovs: Vec<Iov>,
    /// Whether same-sized runs go as one GSO send.
    gso: bool,
    /// `BATCH` buffers of `RX_BUF` bytes, one after the other: where a batch of datagrams
    /// comes in and stays, read in place, until the next batch.
    rx_bufs: Vec<u8>,
    /// Whether the receiving socket hands over GRO batches (`UDP_GRO`).
    gro: bool,
    /// Per datagram length, the ICRC residues of identifications 1 to 63 (built on first use).
    gso_residues: FastMap<usize, Box<[u32]>>,
    /// Fabric time before which the receiving socket, last found empty, is not read again.
    pub(crate) idle_until: u64,
    /// Fabric time the receiving socket was last read.
    pub(crate) read_at: u64,
    /// Packets the port may still send in this round of progress ([`BURST`] at its start).
    pub(crate) burst_left: u32,
    /// The multicast groups its device's QPs joined.
    pub(crate) groups: super::groups::Groups,
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
        // A device is one host's address: not "any", a broadcast or a group.
        if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() {
            return Err(io::Error::from_raw_os_error(libc::EADDRNOTAVAIL));
        }
        let rx = Bound::bind(|| UdpSocket::bind(SocketAddrV4::new(ip, UDP_PORT)))?;
        rx.set_nonblocking(true)?;
        let gro = gso_allowed() && set_int(&rx, libc::SOL_UDP, libc::UDP_GRO, 1).is_ok();
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
                // Group packets leave where the port is (a kernel that refuses sends them by
                // its routes).
                let _ = super::groups::set_multicast_if(&s, ip);
                let port = s.local_addr()?.port();
                Ok((s, port))
            })
            .collect::<io::Result<Vec<_>>>()?;
        // A kernel without UDP GSO (before 4.18) refuses the option: send packets alone.
        let gso = gso_allowed() && set_int(&tx[0].0, libc::SOL_UDP, libc::UDP_SEGMENT, 0).is_ok();
        Ok(UdpPort {
            ip,
            rx,
            outbox: (0..tx.len()).map(|_| Vec::new()).collect(),
            tx,
            runs: Vec::new(),
            iovs: Vec::new(),
            gso,
            rx_bufs: vec![0; RX_BUF * BATCH],
            gro,
            gso_residues: FastMap::default(),
            idle_until: 0,
            read_at: 0,
            burst_left: BURST,
            groups: Default::default(),
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

    /// Queues a packet from source port `sport` to `dst`; `sealed` if it already carries its
    /// ICRC (it was corrupted after sealing), else it is sealed when it leaves. Its payload is
    /// `lent` if it was left in registered memory (then `bytes` are its headers, pad and ICRC):
    /// only in the round of progress that checked that memory, as the outbox is sent at its
    /// end (see [`send`]).
    pub(crate) fn queue(
        &mut self,
        sport: u16,
        dst: SocketAddrV4,
        bytes: Vec<u8>,
        sealed: bool,
        lent: Option<Lent>,
    ) {
        debug_assert!(
            !(sealed && lent.is_some()),
            "a sealed packet carries its payload"
        );
        let i = self.tx.iter().position(|t| t.1 == sport).unwrap_or(0);
        self.outbox[i].push(Outgoing {
            dst,
            bytes,
            sealed,
            lent,
        });
    }

    /// Forgets the packets of a round that never ended (a panic unwound it before its outbox
    /// went) whose payload was lent: that memory may be the program's again by now. Returns
    /// how many (lost, as on the wire).
    pub(crate) fn forget_lent(&mut self) -> u64 {
        let mut lost = 0;
        for out in &mut self.outbox {
            if !out.is_empty() {
                let before = out.len();
                out.retain(|o| o.lent.is_none());
                lost += (before - out.len()) as u64;
            }
        }
        lost
    }

    /// Whether packets wait to be sent.
    pub(crate) fn has_outgoing(&self) -> bool {
        self.outbox.iter().any(|o| !o.is_empty())
    }

    /// Seals and sends everything queued, and keeps the sent packets' buffers in `spare` for
    /// the next ones. Returns how many datagrams the kernel refused (dropped: the transports
    /// recover as they do from loss).
    pub(crate) fn flush(&mut self, spare: &mut crate::link::Spare) -> u64 {
        let mut failed = 0;
        for (i, out) in self.outbox.iter_mut().enumerate() {
            if out.is_empty() {
                continue;
            }
            let (sport, fd) = (self.tx[i].1, self.tx[i].0.as_raw_fd());
            send::cut_runs(out, self.gso, &mut self.runs);
            send::seal_runs(self.ip, sport, out, &self.runs);
            let mut sent = 0;
            while sent < self.runs.len() {
                let batch = &self.runs[sent..(sent + BATCH).min(self.runs.len())];
                match send::send_batch(fd, out, batch, &mut self.iovs) {
                    Ok(n) => sent += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e)
                        if batch[0].len() > 1
                            && !send::congested(&e)
                            && e.raw_os_error() != Some(libc::EFAULT) =>
                    {
                        // The route cannot take GSO sends (no checksum offload, an MTU below
                        // the segment size, IPsec): this run and every packet from now on go
                        // alone, sealed again as such.
                        if self.gso {
                            eprintln!(
                                "softnic: {}: GSO sends refused ({e}); sending packets one by one",
                                self.ip
                            );
                            self.gso = false;
                        }
                        let run = batch[0].clone();
                        let n = run.len();
                        self.runs.splice(sent..=sent, run.map(|k| k..k + 1));
                        send::seal_runs(self.ip, sport, out, &self.runs[sent..sent + n]);
                    }
                    Err(_) => {
                        // The first message was refused (a full buffer: EAGAIN, ENOBUFS; or
                        // memory the kernel could not read, EFAULT: a lent payload another
                        // thread of the program unmapped since it was sealed): dropped, as on
                        // a congested wire; the transports recover.
                        failed += batch[0].len() as u64;
                        sent += 1;
                    }
                }
            }
            for o in out.drain(..) {
                spare.give(o.bytes);
            }
        }
        failed
    }

    /// The receive buffers the last batch came into (see [`Incoming::bytes`]), lent out so
    /// that the packets are read in place while the fabric state is changed; give them back
    /// with [`UdpPort::give_rx_bufs`] before the next [`UdpPort::receive`].
    pub(crate) fn take_rx_bufs(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.rx_bufs)
    }

    /// Gives back what [`UdpPort::take_rx_bufs`] lent.
    pub(crate) fn give_rx_bufs(&mut self, bufs: Vec<u8>) {
        self.rx_bufs = bufs;
    }

    /// Takes in up to one batch of datagrams that have arrived (a GRO batch counts as one and
    /// is cut back into its packets) and puts them in `into` (cleared first), each to be
    /// checked before it is taken ([`damage`](Self::damage)). They lie in the receive buffers
    /// until the next call. Returns how many packets came, and whether more may be waiting
    /// (the batch was full: a shorter one emptied the socket).
    pub(crate) fn receive(&mut self, into: &mut Vec<Incoming>) -> (usize, bool) {
        const CTL: usize = 4; // u64 words: CMSG_SPACE(4) is 24 bytes on 64-bit Linux
        into.clear();
        let full;
        if self.rx_bufs.len() != RX_BUF * BATCH {
            // Not given back (a panic while they were lent): fresh ones.
            self.rx_bufs = vec![0; RX_BUF * BATCH];
        }
        // SAFETY: all-zero `mmsghdr`, `iovec`, `sockaddr_in` and control words are valid
        // values (null pointers, zero lengths); every pointer set below points into locals or
        // `rx_bufs`, which outlive the call, with the lengths of what they point to; the
        // control messages are read through the CMSG macros within the length the kernel
        // wrote.
        unsafe {
            let mut addrs: [libc::sockaddr_in; BATCH] = std::mem::zeroed();
            let mut iovs: [libc::iovec; BATCH] = std::mem::zeroed();
            let mut hdrs: [libc::mmsghdr; BATCH] = std::mem::zeroed();
            let mut ctls: [[u64; CTL]; BATCH] = [[0; CTL]; BATCH];
            let bufs = self.rx_bufs.as_mut_ptr();
            let buf_len = if self.gro { RX_BUF } else { MAX_PACKET };
            for i in 0..BATCH {
                iovs[i].iov_base = bufs.add(i * RX_BUF).cast();
                iovs[i].iov_len = buf_len;
                let h = &mut hdrs[i].msg_hdr;
                h.msg_name = (&raw mut addrs[i]).cast();
                h.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
                h.msg_iov = &raw mut iovs[i];
                h.msg_iovlen = 1;
                h.msg_control = ctls[i].as_mut_ptr().cast();
                h.msg_controllen = CTL * 8;
            }
            let n = libc::recvmmsg(
                self.rx.as_raw_fd(),
                hdrs.as_mut_ptr(),
                BATCH as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            );
            if n <= 0 {
                return (0, false);
            }
            full = n as usize == BATCH;
            for i in 0..n as usize {
                let a = &addrs[i];
                let src = SocketAddrV4::new(
                    Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                    u16::from_be(a.sin_port),
                );
                let h = &hdrs[i].msg_hdr;
                let len = (hdrs[i].msg_len as usize).min(buf_len);
                let mut seg = len;
                let mut c = libc::CMSG_FIRSTHDR(h);
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == libc::UDP_GRO {
                        let s = libc::CMSG_DATA(c).cast::<i32>().read_unaligned();
                        seg = usize::try_from(s).unwrap_or(len).clamp(1, len.max(1));
                    }
                    c = libc::CMSG_NXTHDR(h, c);
                }
                let cut = h.msg_flags & libc::MSG_TRUNC != 0;
                let seg = seg.max(1);
                let mut at = 0;
                while at < len {
                    let p = seg.min(len - at);
                    into.push(Incoming {
                        src,
                        at: i * RX_BUF + at,
                        len: p,
                        damage: (cut || p > MAX_PACKET).then_some(Damage::Malformed),
                    });
                    at += p;
                }
            }
        }
        (into.len(), full)
    }

    /// What is wrong with `d`, a packet of the last batch, whose buffers are `bufs`: checked
    /// (its ICRC) packet by packet as each is taken, so that the check leaves the packet in
    /// the cache for its delivery to copy from, not a whole batch later.
    pub(crate) fn damage(&mut self, d: &Incoming, bufs: &[u8]) -> Option<Damage> {
        d.damage
            .or_else(|| check(self.ip, &mut self.gso_residues, d.src, d.bytes(bufs)))
    }
}

/// Whether GSO and GRO may be used (`SOFTNIC_GSO=0` says no).
fn gso_allowed() -> bool {
    std::env::var_os("SOFTNIC_GSO").is_none_or(|v| v != "0")
}

/// What is wrong with `bytes` from `src` to `ip` port 4791, if anything.
pub(super) fn check(
    ip: Ipv4Addr,
    residues: &mut FastMap<usize, Box<[u32]>>,
    src: SocketAddrV4,
    bytes: &[u8],
) -> Option<Damage> {
    if bytes.len() < crate::packet::BTH_LEN + crate::packet::ICRC_LEN {
        return Some(Damage::Malformed);
    }
    let r = roce::icrc_residue_v4(*src.ip(), src.port(), ip, bytes)?;
    if r == 0 {
        return None;
    }
    let len = bytes.len();
    let known = residues.entry(len).or_insert_with(|| {
        (1..GSO_SEGMENTS as u16)
            .map(|k| roce::id_delta(len, k))
            .collect()
    });
    (!known.contains(&r)).then_some(Damage::BadIcrc)
}

/// Sleeps until one of `fds` is readable or `timeout` (at most a second) has passed (a signal
/// ends it early).
pub(crate) fn wait_readable(fds: &[RawFd], timeout: Duration) {
    let mut polls: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let timeout = timeout.min(Duration::from_secs(1));
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
pub(super) fn set_buffer(s: &UdpSocket, force: i32, plain: i32, bytes: i32) {
    if set_int(s, libc::SOL_SOCKET, force, bytes).is_err() {
        let _ = set_int(s, libc::SOL_SOCKET, plain, bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_that_never_ended_leaves_no_lent_payload_behind() {
        let mut port = UdpPort::bind_free(&[]).expect("a free address in 127.0.0.2-254");
        let to = SocketAddrV4::new(port.ip, UDP_PORT);
        let payload = [7u8; 64];
        let lent = Lent {
            addr: payload.as_ptr() as u64,
            len: 64,
        };
        port.queue(port.sport(1), to, vec![0; 32], false, Some(lent));
        port.queue(port.sport(1), to, vec![0; 96], false, None);
        assert_eq!(port.forget_lent(), 1);
        let left: Vec<_> = port
            .outbox
            .iter()
            .flatten()
            .map(|o| o.bytes.len())
            .collect();
        assert_eq!(left, [96], "the packet with its own bytes stays");
        assert_eq!(port.forget_lent(), 0);
        assert!(port.has_outgoing());
    }

    #[test]
    fn a_batch_that_is_not_full_says_the_socket_was_emptied() {
        let mut port = UdpPort::bind_free(&[]).expect("a free address in 127.0.0.2-254");
        let to = SocketAddrV4::new(port.ip, UDP_PORT);
        let from = UdpSocket::bind("127.0.0.1:0").unwrap();
        let n = BATCH + 3;
        for i in 0..n {
            from.send_to(&[i as u8; 64], to).unwrap();
        }
        let mut into = Vec::new();
        // Loopback datagrams are queued on the socket by the time `send_to` returns; a slow
        // machine still gets a few seconds.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut batches = Vec::new();
        let mut got = 0;
        while got < n && std::time::Instant::now() < deadline {
            let (k, more) = port.receive(&mut into);
            assert_eq!(k, into.len());
            if k > 0 {
                batches.push((k, more));
            }
            got += k;
        }
        assert_eq!(batches, [(BATCH, true), (3, false)]);
        // Not RoCEv2 (no valid ICRC): each is counted as damaged, never delivered.
        let bufs = port.take_rx_bufs();
        assert!(
            into.iter()
                .all(|d| port.damage(d, &bufs) == Some(Damage::BadIcrc))
        );
        port.give_rx_bufs(bufs);
        assert_eq!(port.receive(&mut into), (0, false));
    }
}
