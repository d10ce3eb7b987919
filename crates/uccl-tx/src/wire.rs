//! Wire formats shared by the transmit side (here) and the receive side (uccl-engine), each a
//! checked view over bytes plus a parsed representation (smoltcp's `Packet::new_checked` and
//! `Repr` style). Parsing rejects malformed input with an error, never a panic.
//!
//! # Sizing
//!
//! The chunk sequence number (CSN), the SACK bitmap and the in-flight window are sized
//! together, and the relation is checked at compile time:
//!
//! - at most [`MAX_WINDOW`] (256) chunks of a flow are unacknowledged at once;
//! - an ACK carries the cumulative ACK `cum` (the next CSN expected) and a [`SACK_BITS`]
//!   (256) bit bitmap for `cum + 1 ..= cum + 256`: every chunk in flight is in it; `cum` is
//!   sent as a 16-bit count whose low 11 bits are the CSN, so a sender tells an ACK delayed
//!   by up to 32768 chunks from a current one (an 11-bit `cum` would wrap after 2048);
//! - CSNs are [`CSN_BITS`] (11) bits: 2048 values, at least twice the window, so an old
//!   duplicate can never be taken for a new chunk;
//! - request ids are [`RID_BITS`] (8) bits: a window of chunks holds at most 256 messages.
//!
//! (UCCL's 8-bit CSN with a 128-bit bitmap breaks once more than 128 chunks are in flight.)

use thiserror::Error;

/// Bits of a chunk sequence number.
pub const CSN_BITS: u32 = 11;
/// Bits of a request (message) id.
pub const RID_BITS: u32 = 8;
/// Bits of a flow id.
pub const FID_BITS: u32 = 12;
/// CSN values.
pub const CSN_SPACE: u32 = 1 << CSN_BITS;
/// Bits of the SACK bitmap of an ACK.
pub const SACK_BITS: usize = 256;
/// Bytes of the SACK bitmap.
pub const SACK_BYTES: usize = SACK_BITS / 8;
/// The most chunks of one flow unacknowledged at once.
pub const MAX_WINDOW: u16 = 256;
/// The largest flow id.
pub const MAX_FID: u16 = (1 << FID_BITS) - 1;

const _: () = {
    assert!(
        CSN_BITS + RID_BITS + FID_BITS + 1 == 32,
        "the immediate is 32 bits"
    );
    assert!(
        MAX_WINDOW as usize <= SACK_BITS,
        "the window must fit the SACK bitmap"
    );
    assert!(
        2 * MAX_WINDOW as u32 <= CSN_SPACE,
        "the window must be at most half the CSN space"
    );
    assert!(
        MAX_WINDOW as u32 <= 1 << RID_BITS,
        "a window of single-chunk messages needs distinct ids"
    );
    assert!(SACK_BITS.is_multiple_of(8));
};

/// What is wrong with a wire structure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum WireError {
    /// Shorter than the structure.
    #[error("buffer of {len} bytes is shorter than the {need}-byte structure")]
    Truncated {
        /// Bytes given.
        len: usize,
        /// Bytes needed.
        need: usize,
    },
    /// A version this code does not speak.
    #[error("unknown version {0}")]
    Version(u8),
    /// A field out of its range.
    #[error("field {field} = {value} is out of range")]
    Range {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
}

/// `a - b` in the CSN space, as a signed distance.
pub fn csn_diff(a: u16, b: u16) -> i32 {
    let d = (u32::from(a).wrapping_sub(u32::from(b))) & (CSN_SPACE - 1);
    if d >= CSN_SPACE / 2 {
        d as i32 - CSN_SPACE as i32
    } else {
        d as i32
    }
}

/// `csn + n` in the CSN space.
pub fn csn_add(csn: u16, n: u32) -> u16 {
    ((u32::from(csn) + n) & (CSN_SPACE - 1)) as u16
}

/// The 32-bit immediate data of a chunk's RDMA WRITE_WITH_IMM, in host order (the verbs layer
/// turns it big-endian):
///
/// ```text
///  31  30        19 18       11 10          0
/// +----+-----------+-----------+-------------+
/// |last|  fid (12) |  rid (8)  |  csn (11)   |
/// +----+-----------+-----------+-------------+
/// ```
///
/// - `csn`: the chunk's sequence number in its flow;
/// - `rid`: the message (request) it belongs to, modulo 256;
/// - `fid`: the flow;
/// - `last`: the message's last chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Imm {
    /// Flow id (12 bits).
    pub fid: u16,
    /// Request id (8 bits).
    pub rid: u8,
    /// Chunk sequence number (11 bits).
    pub csn: u16,
    /// Last chunk of its message.
    pub last: bool,
}

impl Imm {
    /// The 32-bit value; errors if a field does not fit its bits.
    pub fn encode(&self) -> Result<u32, WireError> {
        if self.fid > MAX_FID {
            return Err(WireError::Range {
                field: "fid",
                value: self.fid.into(),
            });
        }
        if u32::from(self.csn) >= CSN_SPACE {
            return Err(WireError::Range {
                field: "csn",
                value: self.csn.into(),
            });
        }
        Ok((u32::from(self.last) << 31)
            | (u32::from(self.fid) << (CSN_BITS + RID_BITS))
            | (u32::from(self.rid) << CSN_BITS)
            | u32::from(self.csn))
    }

    /// Every 32-bit value is an immediate.
    pub fn decode(v: u32) -> Imm {
        Imm {
            last: v >> 31 != 0,
            fid: ((v >> (CSN_BITS + RID_BITS)) & u32::from(MAX_FID)) as u16,
            rid: ((v >> CSN_BITS) & ((1 << RID_BITS) - 1)) as u8,
            csn: (v & (CSN_SPACE - 1)) as u16,
        }
    }
}

/// Bytes of a retransmission header.
pub const RETR_HDR_LEN: usize = 12;

/// The header in front of a retransmitted chunk's payload (a SEND to the receiver's SRQ):
///
/// ```text
/// 0               8       12
/// +---------------+-------+-----------
/// | remote_addr   |  imm  | payload...
/// +---------------+-------+-----------
/// ```
///
/// both big-endian: where the chunk belongs and the immediate it first carried.
#[derive(Debug, Clone, Copy)]
pub struct RetrHdr<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> RetrHdr<T> {
    /// A view, after checking the length.
    pub fn new_checked(buf: T) -> Result<Self, WireError> {
        let len = buf.as_ref().len();
        if len < RETR_HDR_LEN {
            return Err(WireError::Truncated {
                len,
                need: RETR_HDR_LEN,
            });
        }
        Ok(RetrHdr { buf })
    }

    /// Where the chunk goes in the receiver's memory.
    pub fn remote_addr(&self) -> u64 {
        let b = self.buf.as_ref();
        u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
    }

    /// The chunk's original immediate data.
    pub fn imm(&self) -> u32 {
        let b = self.buf.as_ref();
        u32::from_be_bytes([b[8], b[9], b[10], b[11]])
    }

    /// The bytes after the header.
    pub fn payload(&self) -> &[u8] {
        &self.buf.as_ref()[RETR_HDR_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> RetrHdr<T> {
    /// Sets the remote address.
    pub fn set_remote_addr(&mut self, v: u64) {
        self.buf.as_mut()[..8].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the immediate.
    pub fn set_imm(&mut self, v: u32) {
        self.buf.as_mut()[8..12].copy_from_slice(&v.to_be_bytes());
    }
}

/// A retransmission header, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RetrHdrRepr {
    /// Where the chunk goes.
    pub remote_addr: u64,
    /// Its immediate data (host order).
    pub imm: u32,
}

impl RetrHdrRepr {
    /// Reads a checked header.
    pub fn parse<T: AsRef<[u8]>>(h: &RetrHdr<T>) -> RetrHdrRepr {
        RetrHdrRepr {
            remote_addr: h.remote_addr(),
            imm: h.imm(),
        }
    }

    /// The 12 bytes.
    pub fn to_bytes(&self) -> [u8; RETR_HDR_LEN] {
        let mut b = [0u8; RETR_HDR_LEN];
        let mut h = RetrHdr { buf: &mut b[..] };
        h.set_remote_addr(self.remote_addr);
        h.set_imm(self.imm);
        b
    }
}

/// Bytes of an ACK.
pub const ACK_LEN: usize = 12 + SACK_BYTES;
/// The ACK format version.
pub const ACK_VERSION: u8 = 1;

/// A coalesced ACK/SACK, sent on the engine's UD control QP:
///
/// ```text
/// 0   1   2     4     6     8          12                     44
/// +---+---+-----+-----+-----+----------+----------------------+
/// |ver|pth| fid | cum |echo | queue_ns |  SACK bitmap (256 b) |
/// +---+---+-----+-----+-----+----------+----------------------+
/// ```
///
/// - `ver`: [`ACK_VERSION`];
/// - `pth`: the path (QP index) the chunk that triggered this ACK came on;
/// - `fid`: the flow (12 bits used);
/// - `cum`: chunks received in order, modulo 2^16: the low 11 bits are the next CSN expected
///   (every CSN before it arrived), the rest tell a stale ACK from a current one;
/// - `echo`: the CSN that triggered this ACK (for an RTT sample);
/// - `queue_ns`: how long that chunk waited at the receiver;
/// - bitmap: bit `i` (byte `i / 8`, bit `i % 8`, LSB first) set means CSN `cum + 1 + i`
///   arrived.
///
/// Multi-byte fields are big-endian.
#[derive(Debug, Clone, Copy)]
pub struct Ack<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Ack<T> {
    /// A view, after checking the length, version and field ranges.
    pub fn new_checked(buf: T) -> Result<Self, WireError> {
        let b = buf.as_ref();
        if b.len() < ACK_LEN {
            return Err(WireError::Truncated {
                len: b.len(),
                need: ACK_LEN,
            });
        }
        if b[0] != ACK_VERSION {
            return Err(WireError::Version(b[0]));
        }
        let a = Ack { buf };
        for (field, v, max) in [
            ("fid", u32::from(a.fid()), u32::from(MAX_FID)),
            ("echo", u32::from(a.echo()), CSN_SPACE - 1),
        ] {
            if v > max {
                return Err(WireError::Range {
                    field,
                    value: v.into(),
                });
            }
        }
        Ok(a)
    }

    fn be16(&self, at: usize) -> u16 {
        let b = self.buf.as_ref();
        u16::from_be_bytes([b[at], b[at + 1]])
    }

    /// The path.
    pub fn path(&self) -> u8 {
        self.buf.as_ref()[1]
    }
    /// The flow.
    pub fn fid(&self) -> u16 {
        self.be16(2)
    }
    /// The cumulative ACK (16-bit count; the low 11 bits are the CSN).
    pub fn cum(&self) -> u16 {
        self.be16(4)
    }
    /// The CSN that triggered it.
    pub fn echo(&self) -> u16 {
        self.be16(6)
    }
    /// Receiver queueing time in nanoseconds.
    pub fn queue_ns(&self) -> u32 {
        let b = self.buf.as_ref();
        u32::from_be_bytes([b[8], b[9], b[10], b[11]])
    }
    /// The SACK bitmap.
    pub fn sack(&self) -> [u8; SACK_BYTES] {
        let mut s = [0u8; SACK_BYTES];
        s.copy_from_slice(&self.buf.as_ref()[12..ACK_LEN]);
        s
    }
}

/// An ACK, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AckRepr {
    /// The path the triggering chunk came on.
    pub path: u8,
    /// The flow.
    pub fid: u16,
    /// Chunks received in order, modulo 2^16 (low 11 bits: the next CSN expected).
    pub cum: u16,
    /// The CSN that triggered the ACK.
    pub echo: u16,
    /// Receiver queueing time (ns).
    pub queue_ns: u32,
    /// Bit `i` set: CSN `cum + 1 + i` arrived.
    pub sack: [u8; SACK_BYTES],
}

impl AckRepr {
    /// Reads a checked ACK.
    pub fn parse<T: AsRef<[u8]>>(a: &Ack<T>) -> AckRepr {
        AckRepr {
            path: a.path(),
            fid: a.fid(),
            cum: a.cum(),
            echo: a.echo(),
            queue_ns: a.queue_ns(),
            sack: a.sack(),
        }
    }

    /// Parses bytes.
    pub fn from_bytes(b: &[u8]) -> Result<AckRepr, WireError> {
        Ack::new_checked(b).map(|a| AckRepr::parse(&a))
    }

    /// The 44 bytes; errors if a field does not fit.
    pub fn to_bytes(&self) -> Result<[u8; ACK_LEN], WireError> {
        let mut b = [0u8; ACK_LEN];
        self.emit(&mut b)?;
        Ok(b)
    }

    /// Writes into `out` (at least [`ACK_LEN`] bytes).
    pub fn emit(&self, out: &mut [u8]) -> Result<(), WireError> {
        if out.len() < ACK_LEN {
            return Err(WireError::Truncated {
                len: out.len(),
                need: ACK_LEN,
            });
        }
        if self.fid > MAX_FID {
            return Err(WireError::Range {
                field: "fid",
                value: self.fid.into(),
            });
        }
        if u32::from(self.echo) >= CSN_SPACE {
            return Err(WireError::Range {
                field: "echo",
                value: self.echo.into(),
            });
        }
        out[0] = ACK_VERSION;
        out[1] = self.path;
        out[2..4].copy_from_slice(&self.fid.to_be_bytes());
        out[4..6].copy_from_slice(&self.cum.to_be_bytes());
        out[6..8].copy_from_slice(&self.echo.to_be_bytes());
        out[8..12].copy_from_slice(&self.queue_ns.to_be_bytes());
        out[12..ACK_LEN].copy_from_slice(&self.sack);
        Ok(())
    }

    /// The next CSN expected (the low bits of `cum`).
    pub fn cum_csn(&self) -> u16 {
        (u32::from(self.cum) & (CSN_SPACE - 1)) as u16
    }

    /// Whether CSN `cum + 1 + i` is marked received.
    pub fn sacked(&self, i: usize) -> bool {
        i < SACK_BITS && self.sack[i / 8] & (1 << (i % 8)) != 0
    }

    /// Marks CSN `cum + 1 + i` received (`i` below [`SACK_BITS`]).
    pub fn set_sacked(&mut self, i: usize) {
        if i < SACK_BITS {
            self.sack[i / 8] |= 1 << (i % 8);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn imm_layout_is_as_documented() {
        let v = Imm {
            fid: 0xabc,
            rid: 0x5a,
            csn: 0x7ff,
            last: true,
        }
        .encode()
        .unwrap();
        assert_eq!(v, (1 << 31) | (0xabc << 19) | (0x5a << 11) | 0x7ff);
        assert!(
            Imm {
                fid: 0x1000,
                ..Imm::default()
            }
            .encode()
            .is_err()
        );
        assert!(
            Imm {
                csn: 2048,
                ..Imm::default()
            }
            .encode()
            .is_err()
        );
    }

    #[test]
    fn csn_arithmetic_wraps() {
        assert_eq!(csn_add(2047, 1), 0);
        assert_eq!(csn_diff(0, 2047), 1);
        assert_eq!(csn_diff(2047, 0), -1);
        assert_eq!(csn_diff(5, 5), 0);
        assert_eq!(csn_diff(1023, 0), 1023);
        assert_eq!(csn_diff(1024, 0), -1024);
    }

    #[test]
    fn malformed_acks_are_errors() {
        let good = AckRepr {
            fid: 7,
            cum: 3,
            echo: 2,
            ..AckRepr::default()
        }
        .to_bytes()
        .unwrap();
        for n in 0..ACK_LEN {
            assert!(matches!(
                AckRepr::from_bytes(&good[..n]),
                Err(WireError::Truncated { .. })
            ));
        }
        let mut v = good;
        v[0] = 9;
        assert_eq!(AckRepr::from_bytes(&v), Err(WireError::Version(9)));
        let mut f = good;
        f[2] = 0xff;
        assert!(matches!(
            AckRepr::from_bytes(&f),
            Err(WireError::Range { field: "fid", .. })
        ));
        let mut e = good;
        e[6] = 0x08;
        assert!(matches!(
            AckRepr::from_bytes(&e),
            Err(WireError::Range { field: "echo", .. })
        ));
        assert!(
            AckRepr {
                echo: 2048,
                ..AckRepr::default()
            }
            .to_bytes()
            .is_err()
        );
        assert_eq!(
            AckRepr {
                cum: 2048 + 5,
                ..AckRepr::default()
            }
            .cum_csn(),
            5
        );
        assert!(RetrHdr::new_checked(&[0u8; 11][..]).is_err());
    }

    proptest! {
        #[test]
        fn imm_round_trips(fid in 0..=MAX_FID, rid: u8, csn in 0u16..2048, last: bool) {
            let i = Imm { fid, rid, csn, last };
            prop_assert_eq!(Imm::decode(i.encode().unwrap()), i);
        }

        #[test]
        fn every_u32_decodes_and_re_encodes(v: u32) {
            prop_assert_eq!(Imm::decode(v).encode().unwrap(), v);
        }

        #[test]
        fn ack_round_trips(path: u8, fid in 0..=MAX_FID, cum: u16, echo in 0u16..2048, q: u32, sack: [u8; 32]) {
            let a = AckRepr { path, fid, cum, echo, queue_ns: q, sack };
            prop_assert_eq!(AckRepr::from_bytes(&a.to_bytes().unwrap()).unwrap(), a);
        }

        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = AckRepr::from_bytes(&b);
            if let Ok(h) = RetrHdr::new_checked(&b[..]) {
                let r = RetrHdrRepr::parse(&h);
                prop_assert_eq!(&r.to_bytes()[..], &b[..RETR_HDR_LEN]);
            }
        }
    }
}
