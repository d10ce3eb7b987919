//! The coalesced ACK/SACK a receiver sends back on its engine's UD control QP.

use super::{CSN_SPACE, MAX_FID, SACK_BITS, SACK_BYTES, WireError};

/// Bytes of an ACK.
pub const ACK_LEN: usize = 16 + SACK_BYTES;
/// The ACK format version (2: credit, 16-bit path, flags; 3: the connection tag).
pub const ACK_VERSION: u8 = 3;

/// Flag: the chunk that triggered the ACK arrived as a retransmission (a SEND through the
/// receiver's SRQ), not as its original RDMA WRITE_WITH_IMM.
const FLAG_RETX: u8 = 1;

/// The largest [`AckRepr::tag`] (7 bits, above the retransmission flag).
pub const MAX_TAG: u8 = 0x7f;

/// A coalesced ACK/SACK, sent on the engine's UD control QP (48 bytes; several are packed into
/// one UD message):
///
/// ```text
/// 0     1     2      4     6     8      10       12         16                      48
/// +-----+-----+------+-----+-----+------+--------+----------+-----------------------+
/// | ver |flags| path | fid | cum | echo | credit | queue_ns |  SACK bitmap (256 b)  |
/// +-----+-----+------+-----+-----+------+--------+----------+-----------------------+
/// ```
///
/// - `ver`: [`ACK_VERSION`];
/// - `flags`: bit 0 set means the triggering chunk arrived as a retransmission (a SEND), clear
///   means as its original WRITE_WITH_IMM; bits 1-7 are the `tag` (see [`AckRepr::tag`]);
/// - `path`: the index, in the flow's list of paths (the connection's QPs, in the order both
///   ends agreed on at connection time), of the QP the triggering chunk came on, or
///   [`ANSWER_PATH`] in an answer to an ACK request;
/// - `fid`: the flow (12 bits used);
/// - `cum`: chunks received in order, modulo 2^16: the low 11 bits are the next CSN expected
///   (every CSN before it arrived), the rest tell a stale ACK from a current one;
/// - `echo`: the CSN that triggered this ACK (with `path` and the flag it names the one
///   transmission that arrived: loss detection and RTT samples use it); in an answer, the
///   number of the ACK request it answers;
/// - `credit`: the receive window the receiver grants this flow, in WRs (chunks in flight); 0
///   means "send nothing now". An ACK that advances `cum` sets the sender's window; among ACKs
///   with the same `cum` (whose order the sender cannot tell) the largest credit wins, so a
///   delayed older ACK never shrinks a window a newer one opened;
/// - `queue_ns`: how long that chunk may have waited at the receiver: from the receiver's last
///   look at its completions before it found the chunk's, to the ACK (so at least as long as
///   it waited);
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
        check_ranges(a.fid(), a.echo())?;
        Ok(a)
    }

    fn be16(&self, at: usize) -> u16 {
        let b = self.buf.as_ref();
        u16::from_be_bytes([b[at], b[at + 1]])
    }

    /// Whether the triggering chunk arrived as a retransmission.
    pub fn retx(&self) -> bool {
        self.buf.as_ref()[1] & FLAG_RETX != 0
    }
    /// The tag of the connection the ACK is for.
    pub fn tag(&self) -> u8 {
        self.buf.as_ref()[1] >> 1
    }
    /// The index of the path the triggering chunk came on, in the flow's path list
    /// ([`ANSWER_PATH`] in an answer to an ACK request).
    pub fn path(&self) -> u16 {
        self.be16(2)
    }
    /// The flow.
    pub fn fid(&self) -> u16 {
        self.be16(4)
    }
    /// The cumulative ACK (16-bit count; the low 11 bits are the CSN).
    pub fn cum(&self) -> u16 {
        self.be16(6)
    }
    /// The CSN that triggered it.
    pub fn echo(&self) -> u16 {
        self.be16(8)
    }
    /// The receive window granted, in WRs.
    pub fn credit(&self) -> u16 {
        self.be16(10)
    }
    /// Receiver queueing time in nanoseconds.
    pub fn queue_ns(&self) -> u32 {
        let b = self.buf.as_ref();
        u32::from_be_bytes([b[12], b[13], b[14], b[15]])
    }
    /// The SACK bitmap.
    pub fn sack(&self) -> [u8; SACK_BYTES] {
        let mut s = [0u8; SACK_BYTES];
        s.copy_from_slice(&self.buf.as_ref()[16..ACK_LEN]);
        s
    }
}

fn check_ranges(fid: u16, echo: u16) -> Result<(), WireError> {
    if fid > MAX_FID {
        return Err(WireError::Range {
            field: "fid",
            value: fid.into(),
        });
    }
    if u32::from(echo) >= CSN_SPACE {
        return Err(WireError::Range {
            field: "echo",
            value: echo.into(),
        });
    }
    Ok(())
}

/// The [`AckRepr::path`] of an answer to an ACK request: the receiver's state when the
/// request reached it, triggered by no chunk (its `echo` is the request's number, not a CSN). A sender that asked
/// because a timeout expired takes what such an ACK leaves unacknowledged, of what it had
/// sent before asking, as lost (see [`TxConfig::ack_requests`](crate::TxConfig::ack_requests)).
pub const ANSWER_PATH: u16 = u16::MAX;

/// An ACK, parsed. `Default` is an ACK of nothing that grants no credit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AckRepr {
    /// The index of the path the triggering chunk came on, in the flow's path list, or
    /// [`ANSWER_PATH`] in an answer to an ACK request.
    pub path: u16,
    /// The flow.
    pub fid: u16,
    /// Chunks received in order, modulo 2^16 (low 11 bits: the next CSN expected).
    pub cum: u16,
    /// The CSN that triggered the ACK (in an answer, the request's number).
    pub echo: u16,
    /// The triggering chunk arrived as a retransmission (a SEND), not as its original WRITE.
    pub retx: bool,
    /// Which connection with this flow id the ACK is for (7 bits, at most [`MAX_TAG`]): flow
    /// ids are reused by later connections, so an ACK of an earlier one still on the wire
    /// would otherwise acknowledge chunks of the new one. The two ends agree on a tag at
    /// connection time (uccl-engine: the low bits of the connection's first control PSN), and
    /// the flow's sender drops ACKs with another: [`Tx::on_ack`](crate::Tx::on_ack) does not
    /// look at it, its caller must. 0 where unused.
    pub tag: u8,
    /// The receive window granted to the flow, in WRs in flight.
    pub credit: u16,
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
            retx: a.retx(),
            tag: a.tag(),
            credit: a.credit(),
            queue_ns: a.queue_ns(),
            sack: a.sack(),
        }
    }

    /// Parses bytes.
    pub fn from_bytes(b: &[u8]) -> Result<AckRepr, WireError> {
        Ack::new_checked(b).map(|a| AckRepr::parse(&a))
    }

    /// The 48 bytes; errors if a field does not fit.
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
        check_ranges(self.fid, self.echo)?;
        if self.tag > MAX_TAG {
            return Err(WireError::Range {
                field: "tag",
                value: self.tag.into(),
            });
        }
        out[0] = ACK_VERSION;
        out[1] = (self.tag << 1) | if self.retx { FLAG_RETX } else { 0 };
        for (at, v) in [
            (2, self.path),
            (4, self.fid),
            (6, self.cum),
            (8, self.echo),
            (10, self.credit),
        ] {
            out[at..at + 2].copy_from_slice(&v.to_be_bytes());
        }
        out[12..16].copy_from_slice(&self.queue_ns.to_be_bytes());
        out[16..ACK_LEN].copy_from_slice(&self.sack);
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
    fn the_layout_is_as_documented() {
        let mut a = AckRepr {
            path: 0x0102,
            fid: 0x0304,
            cum: 0x0506,
            echo: 0x0708,
            retx: true,
            credit: 0x090a,
            queue_ns: 0x0b0c_0d0e,
            ..AckRepr::default()
        };
        a.set_sacked(0);
        a.set_sacked(9);
        a.set_sacked(255);
        let b = a.to_bytes().unwrap();
        assert_eq!(
            b[..18],
            [
                3, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0b1, 0b10
            ]
        );
        assert_eq!(b[47], 0x80);
        assert_eq!(ACK_LEN, 48);
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
        v[0] = 2;
        assert_eq!(AckRepr::from_bytes(&v), Err(WireError::Version(2)));
        let mut f = good;
        f[4] = 0xff;
        assert!(matches!(
            AckRepr::from_bytes(&f),
            Err(WireError::Range { field: "fid", .. })
        ));
        let mut e = good;
        e[8] = 0x08;
        assert!(matches!(
            AckRepr::from_bytes(&e),
            Err(WireError::Range { field: "echo", .. })
        ));
        let mut r = good;
        r[1] = 0xfe;
        let tagged = AckRepr::from_bytes(&r).unwrap();
        assert!(!tagged.retx, "the tag is not the retransmission flag");
        assert_eq!(tagged.tag, MAX_TAG);
        assert!(
            AckRepr {
                tag: MAX_TAG + 1,
                ..AckRepr::default()
            }
            .to_bytes()
            .is_err()
        );
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
    }

    proptest! {
        #[test]
        fn ack_round_trips(
            path: u16, fid in 0..=MAX_FID, cum: u16, echo in 0u16..2048, retx: bool,
            tag in 0..=MAX_TAG, credit: u16, q: u32, sack: [u8; 32],
        ) {
            let a = AckRepr { path, fid, cum, echo, retx, tag, credit, queue_ns: q, sack };
            prop_assert_eq!(AckRepr::from_bytes(&a.to_bytes().unwrap()).unwrap(), a);
        }

        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(a) = AckRepr::from_bytes(&b) {
                let again = a.to_bytes().unwrap();
                prop_assert_eq!(&again[..], &b[..ACK_LEN]);
            }
        }
    }
}
