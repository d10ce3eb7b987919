//! The header in front of a retransmitted chunk.

use super::WireError;

/// Bytes of a retransmission header.
pub const RETR_HDR_LEN: usize = 16;

/// The header in front of a retransmitted chunk's payload (a SEND to the receiver's SRQ):
///
/// ```text
/// 0               8       12      16
/// +---------------+-------+-------+-----------
/// | remote_addr   |  imm  | rkey  | payload...
/// +---------------+-------+-------+-----------
/// ```
///
/// all big-endian: where the chunk belongs, the immediate it first carried, and the rkey its
/// first transmission wrote with (so a receiver that copies a retransmission into place can
/// check it as the NIC checked the original).
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

    /// The rkey of the chunk's original WRITE.
    pub fn rkey(&self) -> u32 {
        let b = self.buf.as_ref();
        u32::from_be_bytes([b[12], b[13], b[14], b[15]])
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

    /// Sets the rkey.
    pub fn set_rkey(&mut self, v: u32) {
        self.buf.as_mut()[12..16].copy_from_slice(&v.to_be_bytes());
    }
}

/// A retransmission header, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RetrHdrRepr {
    /// Where the chunk goes.
    pub remote_addr: u64,
    /// Its immediate data (host order).
    pub imm: u32,
    /// The rkey of its original WRITE.
    pub rkey: u32,
}

impl RetrHdrRepr {
    /// Reads a checked header.
    pub fn parse<T: AsRef<[u8]>>(h: &RetrHdr<T>) -> RetrHdrRepr {
        RetrHdrRepr {
            remote_addr: h.remote_addr(),
            imm: h.imm(),
            rkey: h.rkey(),
        }
    }

    /// The 16 bytes.
    pub fn to_bytes(&self) -> [u8; RETR_HDR_LEN] {
        let mut b = [0u8; RETR_HDR_LEN];
        let mut h = RetrHdr { buf: &mut b[..] };
        h.set_remote_addr(self.remote_addr);
        h.set_imm(self.imm);
        h.set_rkey(self.rkey);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn short_headers_are_errors() {
        assert!(RetrHdr::new_checked(&[0u8; 15][..]).is_err());
        let h = RetrHdrRepr {
            remote_addr: 0x0102_0304_0506_0708,
            imm: 0x0a0b_0c0d,
            rkey: 0x1112_1314,
        };
        assert_eq!(
            h.to_bytes(),
            [
                1, 2, 3, 4, 5, 6, 7, 8, 0xa, 0xb, 0xc, 0xd, 0x11, 0x12, 0x13, 0x14
            ]
        );
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(h) = RetrHdr::new_checked(&b[..]) {
                let r = RetrHdrRepr::parse(&h);
                prop_assert_eq!(&r.to_bytes()[..], &b[..RETR_HDR_LEN]);
                prop_assert_eq!(h.payload(), &b[RETR_HDR_LEN..]);
            }
        }
    }
}
