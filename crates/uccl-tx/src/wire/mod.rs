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
//! - an ACK ([`AckRepr`]) carries the cumulative ACK `cum` (the next CSN expected) and a [`SACK_BITS`]
//!   (256) bit bitmap for `cum + 1 ..= cum + 256`: every chunk in flight is in it; `cum` is
//!   sent as a 16-bit count whose low 11 bits are the CSN, so a sender tells an ACK delayed
//!   by up to 32768 chunks from a current one (an 11-bit `cum` would wrap after 2048);
//! - CSNs are [`CSN_BITS`] (11) bits: 2048 values, at least twice the window, so an old
//!   duplicate can never be taken for a new chunk;
//! - request ids are [`RID_BITS`] (8) bits: a window of chunks holds at most 256 messages.
//!
//! (UCCL's 8-bit CSN with a 128-bit bitmap breaks once more than 128 chunks are in flight.)

use thiserror::Error;

mod ack;
mod imm;
mod retr;

pub use ack::{ACK_LEN, ACK_VERSION, ANSWER_PATH, Ack, AckRepr, MAX_TAG};
pub use imm::Imm;
pub use retr::{RETR_HDR_LEN, RetrHdr, RetrHdrRepr};

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csn_arithmetic_wraps() {
        assert_eq!(csn_add(2047, 1), 0);
        assert_eq!(csn_diff(0, 2047), 1);
        assert_eq!(csn_diff(2047, 0), -1);
        assert_eq!(csn_diff(5, 5), 0);
        assert_eq!(csn_diff(1023, 0), 1023);
        assert_eq!(csn_diff(1024, 0), -1024);
    }
}
