//! What a peer is given of an exported region: its [`Descriptor`], and what it may do there
//! ([`Access`]).

use std::fmt;

/// What a peer may do through an export: read it ([`Engine::read`](crate::Engine::read)),
/// write it ([`Engine::write`](crate::Engine::write)), or both.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Access(u8);

impl Access {
    /// Peers may read the region.
    pub const READ: Access = Access(1);
    /// Peers may write the region.
    pub const WRITE: Access = Access(2);
    /// Peers may read and write the region.
    pub const READ_WRITE: Access = Access(3);

    /// Whether every right of `other` is in `self`.
    pub fn allows(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// The encoded bits (1: read, 2: write).
    pub fn bits(self) -> u8 {
        self.0
    }

    /// Access from its bits: `None` for none (0) or unknown bits.
    pub fn from_bits(bits: u8) -> Option<Access> {
        (1..=3).contains(&bits).then_some(Access(bits))
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            1 => "READ",
            2 => "WRITE",
            _ => "READ_WRITE",
        })
    }
}

/// An exported region: what a peer needs to write into it or read from it. Send it out of
/// band ([`to_bytes`](Self::to_bytes)). Its key reaches exactly `addr..addr + len`, with the
/// rights `access` says, until the owner withdraws it
/// ([`Engine::withdraw_export`](crate::Engine::withdraw_export)). The owner's engine checks
/// every right itself (a forged descriptor gains nothing); the peer's engine checks the range
/// and the rights first, so a misuse fails at once, before anything moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptor {
    /// The first byte's address at the owner.
    pub addr: u64,
    /// The length.
    pub len: u64,
    /// The owner's rkey for it.
    pub rkey: u32,
    /// What peers may do there.
    pub access: Access,
}

/// Bytes of an encoded [`Descriptor`].
pub const DESCRIPTOR_LEN: usize = 21;

impl Descriptor {
    /// [`DESCRIPTOR_LEN`] bytes: address, length, rkey (big-endian), then the access bits.
    pub fn to_bytes(&self) -> [u8; DESCRIPTOR_LEN] {
        let mut b = [0u8; DESCRIPTOR_LEN];
        b[..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..16].copy_from_slice(&self.len.to_be_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_be_bytes());
        b[20] = self.access.bits();
        b
    }

    /// Reads one back: `None` unless exactly [`DESCRIPTOR_LEN`] bytes with known access bits.
    pub fn from_bytes(b: &[u8]) -> Option<Descriptor> {
        let b: &[u8; DESCRIPTOR_LEN] = b.try_into().ok()?;
        Some(Descriptor {
            addr: u64::from_be_bytes(b[..8].try_into().ok()?),
            len: u64::from_be_bytes(b[8..16].try_into().ok()?),
            rkey: u32::from_be_bytes(b[16..20].try_into().ok()?),
            access: Access::from_bits(b[20])?,
        })
    }

    /// The address of `offset..offset + len` of the region, if that lies inside it; else why
    /// not.
    pub(crate) fn place(&self, offset: u64, len: u64) -> Result<u64, String> {
        let range = || format!("{len} bytes at offset {offset}");
        if offset.checked_add(len).is_none_or(|e| e > self.len) {
            let of = format!("the {}-byte export with rkey {:#x}", self.len, self.rkey);
            return Err(format!("{} run past {of}", range()));
        }
        self.addr
            .checked_add(offset)
            .filter(|a| a.checked_add(len).is_some())
            .ok_or_else(|| format!("{} of the export run past the address space", range()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_round_trips_and_garbage_is_none() {
        for access in [Access::READ, Access::WRITE, Access::READ_WRITE] {
            let d = Descriptor {
                addr: u64::MAX - 7,
                len: 1 << 40,
                rkey: 0xdead_beef,
                access,
            };
            assert_eq!(Descriptor::from_bytes(&d.to_bytes()), Some(d));
        }
        let mut b = Descriptor {
            addr: 1,
            len: 2,
            rkey: 3,
            access: Access::READ,
        }
        .to_bytes();
        assert_eq!(Descriptor::from_bytes(&b[..20]), None);
        b[20] = 0;
        assert_eq!(Descriptor::from_bytes(&b), None);
        b[20] = 4;
        assert_eq!(Descriptor::from_bytes(&b), None);
    }

    #[test]
    fn rights_and_ranges_are_checked() {
        assert!(
            Access::READ_WRITE.allows(Access::READ) && Access::READ_WRITE.allows(Access::WRITE)
        );
        assert!(!Access::WRITE.allows(Access::READ) && !Access::READ.allows(Access::WRITE));
        let d = Descriptor {
            addr: u64::MAX - 100,
            len: 100,
            rkey: 1,
            access: Access::READ,
        };
        assert_eq!(d.place(10, 90), Ok(u64::MAX - 90));
        assert!(d.place(10, 91).is_err() && d.place(u64::MAX, 2).is_err());
        let wrap = Descriptor { len: 1000, ..d };
        assert!(wrap.place(200, 10).is_err(), "wraps the address space");
    }
}
