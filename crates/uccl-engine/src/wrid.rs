//! The `wr_id`s of the control CQ: which queue completed, for which connection, which slot.
//! (Data send completions carry uccl-tx's own ids; SRQ receives carry their slot index.)
//! Bit 63 stays clear, as verbs-safe requires of plain ids.

const KIND_SHIFT: u32 = 56;
const CONN_SHIFT: u32 = 32;

/// What a control completion is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ctrl {
    /// A receive of the UD control QP (ACKs), slot.
    UdRecv(u32),
    /// A send of the UD control QP, slot.
    UdSend(u32),
    /// A receive of a connection's control QP: connection, slot.
    CtlRecv(u16, u32),
    /// A send of a connection's control QP: connection, slot.
    CtlSend(u16, u32),
}

fn id(kind: u64, conn: u16, slot: u32) -> u64 {
    (kind << KIND_SHIFT) | (u64::from(conn) << CONN_SHIFT) | u64::from(slot)
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

/// The control completion `wr_id` names, if it names one.
pub(crate) fn decode(wr_id: u64) -> Option<Ctrl> {
    let conn = (wr_id >> CONN_SHIFT) as u16;
    let slot = wr_id as u32;
    match wr_id >> KIND_SHIFT {
        1 => Some(Ctrl::UdRecv(slot)),
        2 => Some(Ctrl::UdSend(slot)),
        3 => Some(Ctrl::CtlRecv(conn, slot)),
        4 => Some(Ctrl::CtlSend(conn, slot)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_the_rest() {
        for c in [
            Ctrl::UdRecv(7),
            Ctrl::UdSend(u32::MAX),
            Ctrl::CtlRecv(4095, 3),
            Ctrl::CtlSend(1, 0),
        ] {
            let id = match c {
                Ctrl::UdRecv(s) => ud_recv(s),
                Ctrl::UdSend(s) => ud_send(s),
                Ctrl::CtlRecv(k, s) => ctl_recv(k, s),
                Ctrl::CtlSend(k, s) => ctl_send(k, s),
            };
            assert_eq!(id >> 63, 0);
            assert_eq!(decode(id), Some(c));
        }
        assert_eq!(decode(0), None);
        assert_eq!(decode(9 << KIND_SHIFT), None);
    }
}
