//! The sending side of a port on the UDP link: the datagrams waiting for the end of the round,
//! cut into runs (one GSO send each), sealed with their ICRCs and handed to the kernel in
//! batches.
//!
//! A WRITE's or SEND's payload may be left in the program's registered memory until the
//! datagram leaves ([`Lent`]): the kernel copies it from there, and the ICRC is computed over
//! it there, with no copy into the packet's own buffer first. That is sound only while the
//! memory is registered as it was when the packet was built, and the WR it belongs to cannot
//! have been reported complete: both hold within the round of progress that built the packet,
//! under the fabric's lock, at whose end the outbox is always sent. A packet that waits
//! longer, in the queue of frames in flight, has its payload copied first (see
//! [`World::transmit`](crate::state::World::transmit)); one left by a round a panic unwound is
//! forgotten by the next ([`UdpPort::forget_lent`](super::UdpPort::forget_lent)). A program
//! that writes a buffer while a WR that sends it is outstanding (which verbs leave undefined)
//! may have the packet dropped by its receiver's ICRC check rather than arrive with mixed
//! bytes. READ responses always carry their bytes: the responder's program may write the
//! region while a READ of it is answered, and what goes out must be what the ICRC covers.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::RawFd;

use super::{BATCH, GSO_BYTES};
use crate::packet::{ICRC_LEN, pad_of};
use crate::roce::{self, GSO_SEGMENTS};

/// A packet's payload left in registered memory until the packet leaves: `len` bytes at
/// `addr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lent {
    pub(crate) addr: u64,
    pub(crate) len: u32,
}

impl Lent {
    /// The bytes.
    ///
    /// # Safety
    /// `addr..addr + len` must be readable memory for as long as the slice is used: a
    /// registered region's, in the round of progress that checked it.
    unsafe fn bytes<'a>(&self) -> &'a [u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the caller guarantees the range is readable memory.
        unsafe { std::slice::from_raw_parts(self.addr as usize as *const u8, self.len as usize) }
    }
}

/// A datagram waiting to leave.
pub(super) struct Outgoing {
    pub(super) dst: SocketAddrV4,
    /// The packet; without its payload if that is [`lent`](Self::lent) (then its headers,
    /// pad and ICRC).
    pub(super) bytes: Vec<u8>,
    /// Its ICRC is already written (over identification 0): it is sent alone.
    pub(super) sealed: bool,
    /// Its payload, where it lies, if not in `bytes`.
    pub(super) lent: Option<Lent>,
}

impl Outgoing {
    /// The datagram's length.
    fn len(&self) -> usize {
        self.bytes.len() + self.lent.map_or(0, |l| l.len as usize)
    }

    /// How many bytes of `bytes` go before the lent payload (all of them if none is).
    fn head(&self) -> usize {
        match self.lent {
            Some(l) => self
                .bytes
                .len()
                .saturating_sub(pad_of(l.len as usize) + ICRC_LEN),
            None => self.bytes.len(),
        }
    }
}

/// An `iovec` that is `Send` (the outbox's scratch lives in the fabric's state): a `repr(C)`
/// address and length, laid out as `struct iovec` is.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct Iov {
    base: usize,
    len: usize,
}

const _: () = assert!(
    std::mem::size_of::<Iov>() == std::mem::size_of::<libc::iovec>()
        && std::mem::align_of::<Iov>() == std::mem::align_of::<libc::iovec>()
);

/// Writes the ICRC of every unsealed packet of `runs`: packet `k` of a run goes as segment
/// `k` of one GSO send, with IPv4 identification `k`.
pub(super) fn seal_runs(
    ip: Ipv4Addr,
    sport: u16,
    out: &mut [Outgoing],
    runs: &[std::ops::Range<usize>],
) {
    for run in runs {
        for (k, o) in out[run.clone()].iter_mut().enumerate() {
            let (dst, id) = (*o.dst.ip(), k as u16);
            match o.lent {
                _ if o.sealed => {}
                None => roce::seal_v4(ip, sport, dst, id, &mut o.bytes),
                Some(l) => {
                    let at = o.head();
                    // SAFETY: a lent payload is registered memory, checked in this round (see
                    // the module's docs).
                    let payload = unsafe { l.bytes() };
                    roce::seal_v4_around(ip, sport, dst, id, &mut o.bytes, at, payload);
                }
            }
        }
    }
}

/// Cuts `out` into the runs sent as one message each: with `gso`, consecutive unsealed
/// packets to one unicast destination, all as long as the first but the last (which may be
/// shorter), at most 64 and 65507 bytes; otherwise one packet each.
pub(super) fn cut_runs(out: &[Outgoing], gso: bool, runs: &mut Vec<std::ops::Range<usize>>) {
    runs.clear();
    let mut k = 0;
    while k < out.len() {
        let first = &out[k];
        let size = first.len();
        let (mut end, mut total) = (k + 1, size);
        // (A group's packets go alone: its sockets check the ICRC for identification 0.)
        if gso && !first.sealed && !first.dst.ip().is_multicast() {
            while let Some(o) = out.get(end) {
                let l = o.len();
                if o.sealed
                    || o.dst != first.dst
                    || l > size
                    || end - k == GSO_SEGMENTS
                    || total + l > GSO_BYTES
                {
                    break;
                }
                total += l;
                end += 1;
                if l < size {
                    break;
                }
            }
        }
        runs.push(k..end);
        k = end;
    }
}

/// Whether a refused send says the way out is full for now (the socket's buffer, the device's
/// queue, memory), not that the route cannot take the send as it was made: the datagrams are
/// dropped as a congested wire drops them, and a GSO send that met it is no reason to give up
/// GSO for good.
pub(super) fn congested(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
        || matches!(e.raw_os_error(), Some(libc::ENOBUFS | libc::ENOMEM))
}

/// Sends the runs `batch` of `out` from socket `fd` in one `sendmmsg`, a run of more than one
/// packet as one GSO send: how many runs left (`EAGAIN` if none could, the buffer being full).
/// `iovs` is scratch for the pieces of the packets (a packet's headers, its lent payload, its
/// pad and ICRC).
// Never inlined: its kilobytes of headers would be in the frame of every caller up to the
// progress loop, whose every call (in process too, where no datagram is ever sent) would then
// touch them (the stack probe).
#[inline(never)]
pub(super) fn send_batch(
    fd: RawFd,
    out: &[Outgoing],
    batch: &[std::ops::Range<usize>],
    iovs: &mut Vec<Iov>,
) -> io::Result<usize> {
    debug_assert!(batch.len() <= BATCH);
    // The pieces first (the vector does not move once they are all in it), each run's from
    // where the one before ended.
    iovs.clear();
    let mut starts = [0usize; BATCH + 1];
    for (i, run) in batch.iter().enumerate() {
        for o in &out[run.clone()] {
            let at = o.head();
            iovs.push(Iov {
                base: o.bytes.as_ptr() as usize,
                len: at,
            });
            if let Some(l) = o.lent {
                iovs.push(Iov {
                    base: l.addr as usize,
                    len: l.len as usize,
                });
                iovs.push(Iov {
                    base: o.bytes[at..].as_ptr() as usize,
                    len: o.bytes.len() - at,
                });
            }
        }
        starts[i + 1] = iovs.len();
    }
    const CTL: usize = 4; // u64 words: CMSG_SPACE(2) is 24 bytes on 64-bit Linux
    // SAFETY: all-zero `mmsghdr`, `sockaddr_in` and control words are valid values; each
    // header's `msg_iov` points at its run's pieces in `iovs` (`Iov` is laid out as `iovec`,
    // as asserted above), which is not touched again before the call returns; every piece
    // points into `out`'s buffers or at a lent payload, registered memory checked in this
    // round (see the module's docs), all readable until the call returns; the control
    // message is written inside its buffer through the CMSG macros, whose space the assertion
    // checks; the kernel only reads through the pointers.
    unsafe {
        let mut addrs: [libc::sockaddr_in; BATCH] = std::mem::zeroed();
        let mut hdrs: [libc::mmsghdr; BATCH] = std::mem::zeroed();
        let mut ctls: [[u64; CTL]; BATCH] = [[0; CTL]; BATCH];
        debug_assert!(libc::CMSG_SPACE(2) as usize <= CTL * 8);
        let iov_base = iovs.as_mut_ptr().cast::<libc::iovec>();
        for (i, run) in batch.iter().enumerate() {
            let first = &out[run.start];
            addrs[i].sin_family = libc::AF_INET as libc::sa_family_t;
            addrs[i].sin_port = first.dst.port().to_be();
            addrs[i].sin_addr.s_addr = u32::from(*first.dst.ip()).to_be();
            let h = &mut hdrs[i].msg_hdr;
            h.msg_name = (&raw mut addrs[i]).cast();
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
            h.msg_iov = iov_base.add(starts[i]);
            h.msg_iovlen = starts[i + 1] - starts[i];
            if run.len() > 1 {
                h.msg_control = ctls[i].as_mut_ptr().cast();
                h.msg_controllen = libc::CMSG_SPACE(2) as usize;
                let c = libc::CMSG_FIRSTHDR(h);
                (*c).cmsg_level = libc::SOL_UDP;
                (*c).cmsg_type = libc::UDP_SEGMENT;
                (*c).cmsg_len = libc::CMSG_LEN(2) as usize;
                let size = first.len() as u16;
                libc::CMSG_DATA(c).cast::<u16>().write_unaligned(size);
            }
        }
        // Never block under the fabric's lock: a full socket buffer is a congested wire.
        let n = libc::sendmmsg(
            fd,
            hdrs.as_mut_ptr(),
            batch.len() as u32,
            libc::MSG_DONTWAIT,
        );
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_buffer_is_congestion_not_a_route_that_refuses_gso() {
        for e in [libc::EAGAIN, libc::ENOBUFS, libc::ENOMEM] {
            assert!(congested(&io::Error::from_raw_os_error(e)), "errno {e}");
        }
        // What a route that cannot segment says (no checksum offload, a smaller MTU).
        for e in [libc::EIO, libc::EINVAL, libc::EMSGSIZE, libc::EOPNOTSUPP] {
            assert!(!congested(&io::Error::from_raw_os_error(e)), "errno {e}");
        }
    }
}
