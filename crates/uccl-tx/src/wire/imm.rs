//! The immediate data of a chunk's RDMA WRITE_WITH_IMM.

use super::{CSN_BITS, CSN_SPACE, MAX_FID, RID_BITS, WireError};

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
    }
}
