//! The `wr_id`s of the engine's one CQ, and which queue each completion belongs to.
//!
//! Every QP of an engine completes into one CQ, so a round polls once. The transmit side's
//! data sends carry uccl-tx's own ids ([`uccl_tx::WrId`]), whose bit 62 is clear because the
//! engine keeps the WR pool below 2^14 (checked with the configuration). Every other WR the
//! engine posts has bit 62 set, with what it is, its connection and its slot:
//!
//! ```text
//!  63  62  61    56 55     48 47         32 31          0
//! +---+---+--------+---------+-------------+-------------+
//! | 0 | 1 |  kind  |    0    | connection  |    slot     |
//! +---+---+--------+---------+-------------+-------------+
//! ```
//!
//! Bit 63 stays clear, as verbs-safe requires of plain ids. A failed completion carries no
//! valid opcode, so the `wr_id` is what tells a failed send from a failed receive.

/// Bit 62: one of the engine's own WRs, not the transmit side's.
const OWN: u64 = 1 << 62;
const KIND_SHIFT: u32 = 56;
const CONN_SHIFT: u32 = 32;

/// The most WR extensions an engine's transmit side may pool: their index (bits 48..62 of
/// uccl-tx's `wr_id`) then never reaches bit 62.
pub(crate) const MAX_TX_WR_POOL: usize = 1 << 14;

/// What a completion is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wr {
    /// A data send of the transmit side (its `wr_id` is uccl-tx's).
    Data,
    /// A receive of the SRQ (a chunk or a retransmission), slot.
    SrqRecv(u32),
    /// A receive of the UD control QP (ACKs), slot.
    UdRecv(u32),
    /// A send of the UD control QP, slot.
    UdSend(u32),
    /// A receive of a connection's control QP: connection, slot.
    CtlRecv(u16, u32),
    /// A send of a connection's control QP: connection, slot.
    CtlSend(u16, u32),
    /// A bind of a connection's receive window (on the window QP): connection, request id.
    MwBind(u16, u32),
    /// An unbind of a connection's receive window: connection, request id.
    MwUnbind(u16, u32),
    /// An RDMA READ (RC): connection, slot of the engine's reads in flight.
    Read(u16, u32),
}

fn id(kind: u64, conn: u16, slot: u32) -> u64 {
    OWN | (kind << KIND_SHIFT) | (u64::from(conn) << CONN_SHIFT) | u64::from(slot)
}

pub(crate) fn srq_recv(slot: u32) -> u64 {
    id(0, 0, slot)
}
pub(crate) fn ud_recv(slot: u32) -> u64 {
    id(1, 0, slot)
}
pub(crate) fn ud_send(slot: u32) -> u64 {
    id(2, 0, slot)
}
pub(crate) fn ctl_recv(conn: u16, slot: u32) -> u64 {
    id(3, conn, slot)
}
pub(crate) fn ctl_send(conn: u16, slot: u32) -> u64 {
    id(4, conn, slot)
}
pub(crate) fn mw_bind(conn: u16, slot: u32) -> u64 {
    id(5, conn, slot)
}
pub(crate) fn mw_unbind(conn: u16, slot: u32) -> u64 {
    id(6, conn, slot)
}
pub(crate) fn read(conn: u16, slot: u32) -> u64 {
    id(7, conn, slot)
}

/// What completion `wr_id` names, if it names one.
pub(crate) fn decode(wr_id: u64) -> Option<Wr> {
    if wr_id & OWN == 0 {
        return Some(Wr::Data);
    }
    let conn = (wr_id >> CONN_SHIFT) as u16;
    let slot = wr_id as u32;
    match (wr_id & !OWN) >> KIND_SHIFT {
        0 => Some(Wr::SrqRecv(slot)),
        1 => Some(Wr::UdRecv(slot)),
        2 => Some(Wr::UdSend(slot)),
        3 => Some(Wr::CtlRecv(conn, slot)),
        4 => Some(Wr::CtlSend(conn, slot)),
        5 => Some(Wr::MwBind(conn, slot)),
        6 => Some(Wr::MwUnbind(conn, slot)),
        7 => Some(Wr::Read(conn, slot)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_the_rest() {
        for c in [
            Wr::SrqRecv(0),
            Wr::SrqRecv(u32::MAX),
            Wr::UdRecv(7),
            Wr::UdSend(u32::MAX),
            Wr::CtlRecv(4095, 3),
            Wr::CtlSend(1, 0),
            Wr::MwBind(7, 127),
            Wr::MwUnbind(4095, 0),
            Wr::Read(3, u32::MAX),
        ] {
            let id = match c {
                Wr::Data => unreachable!(),
                Wr::SrqRecv(s) => srq_recv(s),
                Wr::UdRecv(s) => ud_recv(s),
                Wr::UdSend(s) => ud_send(s),
                Wr::CtlRecv(k, s) => ctl_recv(k, s),
                Wr::CtlSend(k, s) => ctl_send(k, s),
                Wr::MwBind(k, s) => mw_bind(k, s),
                Wr::MwUnbind(k, s) => mw_unbind(k, s),
                Wr::Read(k, s) => read(k, s),
            };
            assert_eq!(id >> 63, 0);
            assert_eq!(decode(id), Some(c));
        }
        assert_eq!(decode(OWN | (9 << KIND_SHIFT)), None);
    }

    #[test]
    fn the_transmit_sides_ids_are_data_sends() {
        use uccl_tx::{PathId, WrId};
        for (index, path, seq) in [(0, 0, 0), (MAX_TX_WR_POOL as u16 - 1, u16::MAX, u32::MAX)] {
            let raw = WrId {
                index,
                path: PathId(path),
                seq,
            }
            .to_raw();
            assert_eq!(decode(raw), Some(Wr::Data), "{raw:#x}");
        }
        // One index more would reach bit 62, and read as the engine's own.
        let over = WrId {
            index: MAX_TX_WR_POOL as u16,
            path: PathId(0),
            seq: 0,
        };
        assert_ne!(decode(over.to_raw()), Some(Wr::Data));
    }
}
