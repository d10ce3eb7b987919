//! RoCEv2 encapsulation: the IP and UDP headers an InfiniBand packet travels under, and the
//! invariant CRC computed over them as IBTA Annex A17 (and the kernel's `rxe_icrc.c`) has it.
//!
//! On the wire a RoCEv2 packet is `IP | UDP (destination port 4791) | BTH ... payload pad |
//! ICRC`. The ICRC is a CRC-32 (the Ethernet polynomial, seeded with all ones, inverted at the
//! end, stored little-endian) over 8 bytes of ones (the masked LRH of native InfiniBand), the
//! IP header with the fields routers may change masked to ones (IPv4: type of service, TTL,
//! header checksum; IPv6: traffic class, flow label, hop limit), the UDP header with its
//! checksum masked, the BTH with its reserved byte `resv8a` masked, and everything after the
//! BTH up to the ICRC.
//!
//! ```
//! use softnic::roce;
//! // A CNP captured from a ConnectX-4 Lx: IPv4 and UDP headers, BTH, 16 bytes of padding.
//! let ip_udp = [
//!     0x45, 0xc2, 0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0x91, 0x61,
//!     0x0a, 0x00, 0x11, 0x01, 0x0a, 0x00, 0x12, 0x01,
//!     0x00, 0x00, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00,
//! ];
//! let mut ib = vec![0x81, 0x00, 0xff, 0xff, 0x40, 0x00, 0x01, 0x18, 0, 0, 0, 0];
//! ib.extend_from_slice(&[0; 16]);
//! assert_eq!(roce::icrc(&ip_udp, &ib).to_le_bytes(), [0x82, 0xfd, 0x00, 0x2a]);
//! ```

use std::net::Ipv4Addr;

/// The UDP destination port of RoCEv2.
pub const UDP_PORT: u16 = 4791;
/// IPv4 header length (no options).
pub const IPV4_LEN: usize = 20;
/// IPv6 header length.
pub const IPV6_LEN: usize = 40;
/// UDP header length.
pub const UDP_LEN: usize = 8;

/// The ICRC of a RoCEv2 packet: `ip_udp` is its IP header (IPv4 without options, or IPv6)
/// followed by its UDP header, exactly as on the wire; `ib` is the InfiniBand part from the
/// BTH up to, not including, the ICRC. Store the result with `to_le_bytes`.
///
/// An `ip_udp` of the wrong length for its IP version, or an `ib` shorter than a BTH, gives
/// the CRC of what is there (which no correct packet carries): never a panic.
pub fn icrc(ip_udp: &[u8], ib: &[u8]) -> u32 {
    icrc_of_pieces(ip_udp, ib, &[])
}

/// [`icrc`] of a packet whose InfiniBand part is `ib` followed by the `more` pieces (a
/// payload left where it lies, then the pad): the BTH is in `ib`.
fn icrc_of_pieces(ip_udp: &[u8], ib: &[u8], more: &[&[u8]]) -> u32 {
    // The 8 bytes of ones are the same for every packet: start from their CRC. The masked
    // headers go in as one piece, then the rest: two updates (each small one costs about as
    // much as a few hundred bytes of the payload).
    let mut h = crc32fast::Hasher::new_with_initial(ONES_CRC);
    let mut head = [0u8; IPV6_LEN + UDP_LEN + crate::packet::BTH_LEN];
    let n = ip_udp.len().min(IPV6_LEN + UDP_LEN);
    head[..n].copy_from_slice(&ip_udp[..n]);
    let ip_len = match head[0] >> 4 {
        4 => {
            head[1] = 0xff; // type of service
            head[8] = 0xff; // TTL
            head[10..12].copy_from_slice(&[0xff, 0xff]); // header checksum
            IPV4_LEN
        }
        _ => {
            head[0] |= 0x0f; // traffic class (high half)
            head[1] = 0xff; // traffic class (low half) and flow label
            head[2..4].copy_from_slice(&[0xff, 0xff]); // flow label
            head[7] = 0xff; // hop limit
            IPV6_LEN
        }
    };
    if n >= ip_len + UDP_LEN {
        head[ip_len + 6..ip_len + 8].copy_from_slice(&[0xff, 0xff]); // UDP checksum
    }
    let bth = ib.len().min(crate::packet::BTH_LEN);
    head[n..n + bth].copy_from_slice(&ib[..bth]);
    if bth > 4 {
        head[n + 4] = 0xff; // resv8a
    }
    h.update(&head[..n + bth]);
    h.update(&ib[bth..]);
    for piece in more {
        h.update(piece);
    }
    h.finalize()
}

/// The CRC-32 of the 8 bytes of ones an ICRC starts with (checked by a test).
const ONES_CRC: u32 = 0x2144_df1c;

/// Segments one GSO send may carry (the kernel's `UDP_MAX_SEGMENTS`): the IPv4
/// identifications its segments get are 0 to 63.
pub const GSO_SEGMENTS: usize = 64;

/// The IPv4 and UDP headers softnic's UDP link sends an `ib_len`-byte InfiniBand packet
/// under, as the kernel builds them for an unconnected socket with the don't-fragment bit
/// set: identification `id` (0 for a datagram sent alone, `k` for segment `k` of a GSO send),
/// TTL 64, type of service 0, UDP checksum 0 (the fields the ICRC masks do not matter; the
/// others must be exactly what goes on the wire).
pub fn ipv4_udp_header(
    src: Ipv4Addr,
    sport: u16,
    dst: Ipv4Addr,
    dport: u16,
    ib_len: usize,
    id: u16,
) -> [u8; IPV4_LEN + UDP_LEN] {
    let udp_len = UDP_LEN + ib_len;
    let mut h = [0u8; IPV4_LEN + UDP_LEN];
    h[0] = 0x45; // version 4, 5 words
    h[2..4].copy_from_slice(&((IPV4_LEN + udp_len) as u16).to_be_bytes());
    h[4..6].copy_from_slice(&id.to_be_bytes());
    h[6] = 0x40; // don't fragment
    h[8] = 64; // TTL
    h[9] = 17; // UDP
    h[12..16].copy_from_slice(&src.octets());
    h[16..20].copy_from_slice(&dst.octets());
    let sum = h[..IPV4_LEN]
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum::<u32>();
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = (sum & 0xffff) + (sum >> 16);
    h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    h[20..22].copy_from_slice(&sport.to_be_bytes());
    h[22..24].copy_from_slice(&dport.to_be_bytes());
    h[24..26].copy_from_slice(&(udp_len as u16).to_be_bytes());
    h
}

/// The IPv4 address in an IPv4-mapped GID (`::ffff:a.b.c.d`), if it is one.
pub fn gid_ipv4(gid: &[u8; 16]) -> Option<Ipv4Addr> {
    (gid[..10].iter().all(|&b| b == 0) && gid[10..12] == [0xff, 0xff])
        .then(|| Ipv4Addr::new(gid[12], gid[13], gid[14], gid[15]))
}

/// The link-local GID softnic gives a device on the UDP link at `ip` (`fe80::ffff:a.b.c.d`,
/// index 1 of its GID table after the IPv4-mapped one, as rxe has a `fe80::` GID). Packets
/// to either travel over IPv4.
pub fn link_local_gid(ip: Ipv4Addr) -> [u8; 16] {
    let mut gid = ipv4_gid(ip);
    gid[..2].copy_from_slice(&[0xfe, 0x80]);
    gid
}

/// The IPv4 address a GID reaches on the UDP link: an IPv4-mapped GID's, or one of
/// [`link_local_gid`]'s form.
pub fn gid_address(gid: &[u8; 16]) -> Option<Ipv4Addr> {
    let mut g = *gid;
    if g[..2] == [0xfe, 0x80] {
        g[..2].copy_from_slice(&[0, 0]);
    }
    gid_ipv4(&g)
}

/// The IPv4 group address a multicast GID's packets travel to on softnic's UDP link: the
/// address itself when the GID is IPv4-mapped; for an IPv6 group (the link is IPv4) an address
/// of the organization-local scope `239.192.0.0/14` from a hash of the GID, the same in every
/// process.
pub fn group_address(gid: &[u8; 16]) -> Ipv4Addr {
    if let Some(ip) = gid_ipv4(gid).filter(Ipv4Addr::is_multicast) {
        return ip;
    }
    // FNV-1a.
    let h = gid.iter().fold(0x811c_9dc5u32, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    Ipv4Addr::from(u32::from(Ipv4Addr::new(239, 192, 0, 0)) | (h & 0x0003_ffff))
}

/// The IPv4-mapped GID of `ip`.
pub fn ipv4_gid(ip: Ipv4Addr) -> [u8; 16] {
    let mut gid = [0u8; 16];
    gid[10] = 0xff;
    gid[11] = 0xff;
    gid[12..].copy_from_slice(&ip.octets());
    gid
}

/// Writes the ICRC of a packet softnic sends from `src:sport` to `dst` port 4791 with IPv4
/// identification `id` into the packet's last 4 bytes (`frame` is the InfiniBand part, ICRC
/// included).
pub(crate) fn seal_v4(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, id: u16, frame: &mut [u8]) {
    let at = frame.len().saturating_sub(crate::packet::ICRC_LEN);
    seal_v4_around(src, sport, dst, id, frame, at, &[]);
}

/// [`seal_v4`] for a packet whose payload lies elsewhere: `frame` holds its headers (the first
/// `at` bytes), then its pad and ICRC; `payload` goes between them on the wire.
pub(crate) fn seal_v4_around(
    src: Ipv4Addr,
    sport: u16,
    dst: Ipv4Addr,
    id: u16,
    frame: &mut [u8],
    at: usize,
    payload: &[u8],
) {
    let Some(n) = frame
        .len()
        .checked_sub(crate::packet::ICRC_LEN)
        .filter(|&n| at <= n)
    else {
        return;
    };
    let len = frame.len() + payload.len();
    let ip_udp = ipv4_udp_header(src, sport, dst, UDP_PORT, len, id);
    let (head, pad) = frame[..n].split_at(at);
    let c = icrc_of_pieces(&ip_udp, head, &[payload, pad]);
    frame[n..].copy_from_slice(&c.to_le_bytes());
}

/// The ICRC a packet from `src:sport` to `dst` port 4791 would carry with IPv4
/// identification 0, XORed with the one it carries: 0 if it was sent alone and is intact,
/// [`id_delta`]`(len, k)` if it was segment `k` of a GSO send (a receiving socket does not
/// see the IP header), anything else if it was damaged. `None` if shorter than an ICRC.
pub(crate) fn icrc_residue_v4(
    src: Ipv4Addr,
    sport: u16,
    dst: Ipv4Addr,
    frame: &[u8],
) -> Option<u32> {
    let n = frame.len().checked_sub(crate::packet::ICRC_LEN)?;
    let head = ipv4_udp_header(src, sport, dst, UDP_PORT, frame.len(), 0);
    let wire = u32::from_le_bytes(frame[n..].try_into().ok()?);
    Some(icrc(&head, &frame[..n]) ^ wire)
}

/// How the ICRC of a `frame_len`-byte packet (InfiniBand part, ICRC included) changes when
/// its IPv4 identification goes from 0 to `id`. A CRC is affine, so for inputs of one length
/// the change depends on the changed bits alone: `crc(a) ^ crc(b) = crc(a ^ b) ^ crc(0...0)`.
pub(crate) fn id_delta(frame_len: usize, id: u16) -> u32 {
    // The ICRC's input: 8 bytes of ones, the IPv4 and UDP headers, the packet before its ICRC;
    // the identification is at bytes 4..6 of the IPv4 header.
    let n = 8 + IPV4_LEN + UDP_LEN + frame_len.saturating_sub(crate::packet::ICRC_LEN);
    let mut d = vec![0u8; n];
    let zeros = crc32fast::hash(&d);
    d[12..14].copy_from_slice(&id.to_be_bytes());
    crc32fast::hash(&d) ^ zeros
}

#[cfg(test)]
mod tests {
    use super::*;

    /// scapy's RoCE test packet (UC SEND only): ICRC 0x78f353f3 big-endian on the wire.
    #[test]
    fn scapy_uc_send_vector() {
        let mut ip_udp = ipv4_udp_header(
            Ipv4Addr::new(192, 168, 0, 7),
            49152,
            Ipv4Addr::new(192, 168, 0, 7),
            UDP_PORT,
            36,
            0,
        );
        ip_udp[1] = 0x01; // tos
        ip_udp[4..6].copy_from_slice(&1144u16.to_be_bytes()); // id
        let mut ib = vec![0x24, 0x60, 0xff, 0xff, 0x00, 0x00, 0x00, 0xd3];
        ib.extend_from_slice(&(13571856u32).to_be_bytes());
        ib.extend_from_slice(b"F0\x81\x8b\xe2\x895\xd9\x0e\x9a\x95PT\x01\xbe\x88^P\x00\x00");
        assert_eq!(
            icrc(&ip_udp, &ib).to_le_bytes(),
            0x78f3_53f3u32.to_be_bytes()
        );
    }

    #[test]
    fn masked_fields_do_not_change_the_icrc_and_others_do() {
        let a = Ipv4Addr::new(127, 0, 0, 2);
        let b = Ipv4Addr::new(127, 0, 0, 3);
        let ib = [0x04, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 1, 9, 9, 9, 9];
        let head = ipv4_udp_header(a, 50000, b, UDP_PORT, ib.len() + 4, 0);
        let base = icrc(&head, &ib);
        let mut masked = head;
        masked[1] = 0x2e; // DSCP/ECN
        masked[8] = 3; // TTL
        masked[10] ^= 0x55; // checksum
        masked[26] = 0x12; // UDP checksum
        let mut ib2 = ib;
        ib2[4] = 0x7f; // resv8a
        assert_eq!(icrc(&masked, &ib2), base);
        let mut moved = head;
        moved[20] ^= 1; // source port
        assert_ne!(icrc(&moved, &ib), base);
        let mut body = ib;
        body[12] ^= 1;
        assert_ne!(icrc(&head, &body), base);
        let mut frame = ib.to_vec();
        frame.extend_from_slice(&[0; 4]);
        seal_v4(a, 50000, b, 0, &mut frame);
        assert_eq!(icrc_residue_v4(a, 50000, b, &frame), Some(0));
        assert_ne!(icrc_residue_v4(a, 50001, b, &frame), Some(0));
        assert_ne!(icrc_residue_v4(b, 50000, a, &frame), Some(0));
    }

    #[test]
    fn the_ones_prefix_crc_is_right() {
        assert_eq!(crc32fast::hash(&[0xff; 8]), ONES_CRC);
    }

    /// `icrc` against the definition written out: one CRC over the ones, the masked IP and
    /// UDP headers, the masked BTH and the rest, for whole and cut inputs of both versions.
    #[test]
    fn icrc_is_the_crc_of_the_masked_bytes() {
        let reference = |ip_udp: &[u8], ib: &[u8]| {
            let mut all = vec![0xffu8; 8];
            let mut head = ip_udp.to_vec();
            let ip_len = if head.first().is_some_and(|b| b >> 4 == 4) {
                for i in [1, 8, 10, 11] {
                    if let Some(b) = head.get_mut(i) {
                        *b = 0xff;
                    }
                }
                IPV4_LEN
            } else {
                if let Some(b) = head.first_mut() {
                    *b |= 0x0f;
                }
                for i in [1, 2, 3, 7] {
                    if let Some(b) = head.get_mut(i) {
                        *b = 0xff;
                    }
                }
                IPV6_LEN
            };
            head.truncate(IPV6_LEN + UDP_LEN);
            if head.len() >= ip_len + UDP_LEN {
                head[ip_len + 6] = 0xff;
                head[ip_len + 7] = 0xff;
            }
            all.extend_from_slice(&head);
            let mut ib = ib.to_vec();
            if ib.len() > 4 {
                ib[4] = 0xff;
            }
            all.extend_from_slice(&ib);
            crc32fast::hash(&all)
        };
        let v4 = ipv4_udp_header(
            Ipv4Addr::new(10, 0, 0, 1),
            49152,
            Ipv4Addr::new(10, 0, 0, 2),
            UDP_PORT,
            4112,
            3,
        );
        let mut v6 = [0x6bu8; IPV6_LEN + UDP_LEN];
        v6[0] = 0x62;
        let ib: Vec<u8> = (0..4108u32).map(|i| (i * 7 + 3) as u8).collect();
        for head in [&v4[..], &v6[..]] {
            for h in [0, 1, 5, 12, 20, 27, head.len()] {
                for n in [0, 3, 5, 12, 13, 100, ib.len()] {
                    let (hh, bb) = (&head[..h.min(head.len())], &ib[..n]);
                    assert_eq!(icrc(hh, bb), reference(hh, bb), "{h} {n}");
                }
            }
        }
    }

    #[test]
    fn short_inputs_do_not_panic() {
        let _ = icrc(&[], &[]);
        let _ = icrc(&[0x45], &[1, 2]);
        let _ = icrc(&[0x60; 60], &[0; 3]);
        assert_eq!(
            icrc_residue_v4(Ipv4Addr::LOCALHOST, 1, Ipv4Addr::LOCALHOST, &[0; 3]),
            None
        );
    }

    /// Segment `k` of a GSO send carries the ICRC over identification `k`; the receiver, who
    /// sees no IP header, finds `k` from the residue.
    #[test]
    fn a_gso_segment_is_recognised_by_its_identification_delta() {
        let (a, b) = (Ipv4Addr::new(127, 0, 0, 5), Ipv4Addr::new(127, 0, 0, 6));
        let mut frame = vec![0x0a, 0, 0xff, 0xff, 0, 0, 0, 0x12, 0, 0, 0, 7];
        frame.extend((0..4100u32).map(|i| i as u8));
        for k in [0u16, 1, 2, 37, 63] {
            seal_v4(a, 40000, b, k, &mut frame);
            let r = icrc_residue_v4(a, 40000, b, &frame).unwrap();
            let want = if k == 0 { 0 } else { id_delta(frame.len(), k) };
            assert_eq!(r, want, "segment {k}");
            let mut head = ipv4_udp_header(a, 40000, b, UDP_PORT, frame.len(), k);
            head[1] = 0xb8; // a router's DSCP does not matter
            let n = frame.len() - 4;
            assert_eq!(icrc(&head, &frame[..n]).to_le_bytes(), frame[n..], "{k}");
        }
    }
}
