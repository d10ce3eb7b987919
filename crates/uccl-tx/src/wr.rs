//! Work-request extensions (the pool's elements) and the `wr_id` layout.

use bufpool::Handle;
use verbs_safe::WrSlot;
use verbs_safe::sys::ibv_send_flags;

use crate::path::PathId;

/// What a WR carries.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A chunk (first transmission or retransmission).
    #[default]
    Chunk,
    /// A zero-length signaled RDMA WRITE that only asks for a completion (after a post failed
    /// half-way and left unsignaled WRs with nothing after them).
    Signal,
}

/// A work-request extension: the WR, its two SGEs (data; or retransmission header and data),
/// and what the transmit side needs to find its chunk and message again. Pool elements never
/// move, so the WR's `sg_list` points at its own SGEs for the pool's whole life.
///
/// Public only as what [`Chain::post`](crate::Chain::post) hands a poster: the pool's WR slots
/// ([`AsMut<WrSlot<2>>`](AsMut), what verbs-safe's `Qp::post_slots` takes) and the order of the
/// chain's WRs among them. Its bookkeeping is private.
#[repr(C)]
#[derive(Debug, Default)]
pub struct WrEx {
    /// The WR and its SGEs (first: a pointer to the `WrEx` is a pointer to its WR).
    pub(crate) slot: WrSlot<2>,
    pub(crate) kind: Kind,
    /// The chunk's flow, the flow's generation (a reopened flow id is another flow), the lane
    /// (index of the path in the flow's list), the chunk's sequence number and its message.
    pub(crate) fid: u16,
    pub(crate) epoch: u32,
    pub(crate) lane: u16,
    pub(crate) csn: u16,
    pub(crate) msg: u64,
    /// The retransmission header slot this WR's first SGE names.
    pub(crate) hdr: Option<u32>,
    /// The next WR staged on the same path.
    pub(crate) next: Option<Handle>,
}

impl AsMut<WrSlot<2>> for WrEx {
    fn as_mut(&mut self) -> &mut WrSlot<2> {
        &mut self.slot
    }
}

impl WrEx {
    pub(crate) fn signaled(&self) -> bool {
        self.slot.wr.send_flags & ibv_send_flags::IBV_SEND_SIGNALED.0 != 0
    }

    pub(crate) fn set_signaled(&mut self, on: bool) {
        let f = ibv_send_flags::IBV_SEND_SIGNALED.0;
        if on {
            self.slot.wr.send_flags |= f;
        } else {
            self.slot.wr.send_flags &= !f;
        }
    }
}

/// The `wr_id` of every WR the transmit side hands out:
///
/// ```text
///  63  62        48 47        32 31                 0
/// +---+------------+------------+--------------------+
/// | 0 | index (15) |  path (16) |  sequence (32)     |
/// +---+------------+------------+--------------------+
/// ```
///
/// - bit 63 is clear: verbs-safe reserves it for completion contexts;
/// - `index`: the WR extension in the pool (so [`MAX_WR_POOL`](crate::MAX_WR_POOL) is 2^15);
/// - `path`: the QP it was posted on;
/// - `sequence`: the low 32 bits of the WR's sequence number on its path. The transmit side
///   decodes it relative to the oldest WR still outstanding on that path (at most the send
///   queue's depth behind the newest), so the sequence may run on forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WrId {
    /// Index of the WR extension in the pool.
    pub index: u16,
    /// The path (QP).
    pub path: PathId,
    /// Low 32 bits of the WR's sequence number on its path.
    pub seq: u32,
}

impl WrId {
    /// The 64-bit `wr_id`.
    pub fn to_raw(self) -> u64 {
        (u64::from(self.index & 0x7fff) << 48)
            | (u64::from(self.path.0) << 32)
            | u64::from(self.seq)
    }

    /// Splits a `wr_id` (bit 63 is ignored).
    pub fn from_raw(id: u64) -> WrId {
        WrId {
            index: ((id >> 48) & 0x7fff) as u16,
            path: PathId((id >> 32) as u16),
            seq: id as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wr_id_layout_keeps_bit_63_clear() {
        let id = WrId {
            index: 0x7fff,
            path: PathId(0xffff),
            seq: u32::MAX,
        };
        assert_eq!(id.to_raw(), u64::MAX >> 1);
        assert_eq!(WrId::from_raw(id.to_raw()), id);
        let small = WrId {
            index: 3,
            path: PathId(2),
            seq: 1,
        };
        assert_eq!(small.to_raw(), (3 << 48) | (2 << 32) | 1);
    }
}
