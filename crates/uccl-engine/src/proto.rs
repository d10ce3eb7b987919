//! The engine's own wire formats: the connection handshake exchanged out of band, and the
//! messages of a connection's control QP. Big-endian, fixed layouts, checked parsing: any
//! input is an error or a value, never a panic.

use verbs_safe::Gid;

/// The handshake's magic and version: `b"UCCLRS"` then the version.
const MAGIC: &[u8; 6] = b"UCCLRS";
/// Bumped on any change of the handshake or of the data-path formats (2: ACK tags, control
/// messages copied over the UD QP; 3: Refuse carries the length; 4: receives withdrawn; 5:
/// reads, notes; 6: ACK requests and their answers: a peer that ignored them would never be
/// asked to resend; 7: a control SEND carries up to [`CTL_PACK`] messages; 8: UC receive
/// buffers are advertised over the UD QP, in UD messages of several items; 9: each engine's UD
/// QP has a Q_Key of its own, drawn at random, which its handshake says; 10: UC ACKs go over
/// the control QP for a while after their peer asked for one).
pub(crate) const VERSION: u16 = 10;

/// Feature bits both ends must agree on.
pub(crate) mod feature {
    /// The data QPs are RC (else UC with software reliability).
    pub(crate) const RC: u32 = 1;
}

/// Fixed part of a handshake, in bytes.
const HELLO_FIXED: usize = 6 + 2 + 4 + 4 + 16 + 2 + 4 + 4 + 2 + 2 + 4 + 4 + 2;
/// Bytes per data QP in a handshake.
const HELLO_PER_QP: usize = 8;

/// One end of a connection, as its peer needs to know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hello {
    /// Feature bits ([`feature`]).
    pub(crate) features: u32,
    /// The largest chunk the sender may send (the receiver's SRQ buffers hold it).
    pub(crate) max_chunk: u32,
    /// The engine's GID and LID.
    pub(crate) gid: Gid,
    pub(crate) lid: u16,
    /// The engine's UD control QP (ACKs go there) and its Q_Key.
    pub(crate) ctrl_qpn: u32,
    pub(crate) qkey: u32,
    /// The flow id this end gave the connection: what the peer puts in its immediates and
    /// expects in ACKs.
    pub(crate) fid: u16,
    /// The initial receive window granted (WRs in flight).
    pub(crate) credit: u16,
    /// The connection's control QP (RC) and its first PSN.
    pub(crate) conn_qpn: u32,
    pub(crate) conn_psn: u32,
    /// The data QPs and their first PSNs, in path order.
    pub(crate) qps: Vec<(u32, u32)>,
}

/// Why a handshake was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HelloError {
    Truncated,
    NotUccl,
    Version(u16),
    TooManyQps(u16),
}

impl std::fmt::Display for HelloError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HelloError::Truncated => write!(f, "the handshake is truncated"),
            HelloError::NotUccl => write!(f, "the peer is not a uccl-rs engine"),
            HelloError::Version(v) => {
                write!(f, "the peer speaks version {v}, this engine {VERSION}")
            }
            HelloError::TooManyQps(n) => write!(f, "the peer offers {n} data QPs (at most 256)"),
        }
    }
}

impl Hello {
    /// The encoded handshake.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HELLO_FIXED + self.qps.len() * HELLO_PER_QP);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_be_bytes());
        b.extend_from_slice(&self.features.to_be_bytes());
        b.extend_from_slice(&self.max_chunk.to_be_bytes());
        b.extend_from_slice(&self.gid.0);
        b.extend_from_slice(&self.lid.to_be_bytes());
        b.extend_from_slice(&self.ctrl_qpn.to_be_bytes());
        b.extend_from_slice(&self.qkey.to_be_bytes());
        b.extend_from_slice(&self.fid.to_be_bytes());
        b.extend_from_slice(&self.credit.to_be_bytes());
        b.extend_from_slice(&self.conn_qpn.to_be_bytes());
        b.extend_from_slice(&self.conn_psn.to_be_bytes());
        b.extend_from_slice(&(self.qps.len() as u16).to_be_bytes());
        for &(qpn, psn) in &self.qps {
            b.extend_from_slice(&qpn.to_be_bytes());
            b.extend_from_slice(&psn.to_be_bytes());
        }
        b
    }

    /// The length of a handshake whose fixed part is `fixed` (to read the rest of it).
    pub(crate) fn total_len(fixed: &[u8; HELLO_FIXED_LEN]) -> Result<usize, HelloError> {
        // What is not a uccl-rs engine, or not of this version, is refused at once.
        if &fixed[..6] != MAGIC {
            return Err(HelloError::NotUccl);
        }
        let version = u16::from_be_bytes([fixed[6], fixed[7]]);
        if version != VERSION {
            return Err(HelloError::Version(version));
        }
        let n = u16::from_be_bytes([fixed[HELLO_FIXED - 2], fixed[HELLO_FIXED - 1]]);
        if n > 256 {
            return Err(HelloError::TooManyQps(n));
        }
        Ok(HELLO_FIXED + usize::from(n) * HELLO_PER_QP)
    }

    /// Reads a handshake.
    pub(crate) fn parse(b: &[u8]) -> Result<Hello, HelloError> {
        let mut r = Reader(b);
        if r.take(6)? != MAGIC {
            return Err(HelloError::NotUccl);
        }
        let version = r.u16()?;
        if version != VERSION {
            return Err(HelloError::Version(version));
        }
        let features = r.u32()?;
        let max_chunk = r.u32()?;
        let mut gid = [0u8; 16];
        gid.copy_from_slice(r.take(16)?);
        let lid = r.u16()?;
        let ctrl_qpn = r.u32()?;
        let qkey = r.u32()?;
        let fid = r.u16()?;
        let credit = r.u16()?;
        let conn_qpn = r.u32()?;
        let conn_psn = r.u32()?;
        let n = r.u16()?;
        if n > 256 {
            return Err(HelloError::TooManyQps(n));
        }
        let qps = (0..n)
            .map(|_| Ok((r.u32()?, r.u32()?)))
            .collect::<Result<Vec<_>, HelloError>>()?;
        Ok(Hello {
            features,
            max_chunk,
            gid: Gid(gid),
            lid,
            ctrl_qpn,
            qkey,
            fid,
            credit,
            conn_qpn,
            conn_psn,
            qps,
        })
    }
}

/// Bytes of a handshake's fixed part (read first, to learn the whole length).
pub(crate) const HELLO_FIXED_LEN: usize = HELLO_FIXED;

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], HelloError> {
        if self.0.len() < n {
            return Err(HelloError::Truncated);
        }
        let (h, t) = self.0.split_at(n);
        self.0 = t;
        Ok(h)
    }
    fn u16(&mut self) -> Result<u16, HelloError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, HelloError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, HelloError> {
        Ok(u64::from(self.u32()?) << 32 | u64::from(self.u32()?))
    }
}

use uccl_tx::wire::{ACK_LEN, AckRepr};

/// Bytes of a control message.
pub(crate) const CTL_LEN: usize = 64;

/// Control messages one SEND on a connection's control QP carries at most: what one round has
/// for the peer (advertisements of the receives posted since the last, the ACK) goes as one
/// packet, and one packet of the peer's NIC acknowledges it, not one each.
pub(crate) const CTL_PACK: usize = 4;

/// The control messages in a SEND of `b` (a whole number of them, 1 to [`CTL_PACK`]), in
/// order; `None` for any other length.
pub(crate) fn ctl_pack(b: &[u8]) -> Option<std::slice::ChunksExact<'_, u8>> {
    (!b.is_empty() && b.len() <= CTL_PACK * CTL_LEN && b.len().is_multiple_of(CTL_LEN))
        .then(|| b.chunks_exact(CTL_LEN))
}

/// A message on a connection's control QP (reliable and ordered: RC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ctl {
    /// Clear to send: a receive buffer, the `seq`-th this end posted on the connection.
    Cts {
        seq: u32,
        addr: u64,
        len: u64,
        rkey: u32,
    },
    /// The peer closes the connection.
    Close,
    /// The peer's message for receive buffer `seq` (`len` bytes) does not fit it: that
    /// receive fails.
    Refuse { seq: u32, len: u64 },
    /// A retransmitted chunk `csn` named memory this end did not offer (`remote`, `rkey`:
    /// outside the receive buffer or exported region it belongs to, or another buffer's rkey);
    /// it was dropped. The sender fails the connection if that is where it sent the chunk (a
    /// frame injected with a forged header names another place, and changes nothing).
    Unplaceable { csn: u16, remote: u64, rkey: u32 },
    /// An ACK: RC mode's (the control QP is reliable and nothing is retransmitted), and UC
    /// mode's while the receiving end's ACK requests ask for them here (its UD QP is short of
    /// receives).
    Ack(AckRepr),
    /// The receiver withdraws its receive buffer `seq` (cancelled, or past its deadline), if no
    /// send took it yet.
    Withdraw { seq: u32 },
    /// The sender's answer to a [`Ctl::Withdraw`]: whether the advertisement was dropped before
    /// a send took it (`ok`), or a send is writing into it.
    Withdrawn { seq: u32, ok: bool },
    /// Nothing: sent when a connection waits for its peer and has heard nothing for a while.
    /// Its delivery is acknowledged by the peer's NIC; a peer that is gone fails it (the RC
    /// retries run out), and with it the connection.
    Ping,
    /// A read (UC, where the engine serves them): the peer's export `src..src + len` with key
    /// `src_rkey` is to be written into this end's receive buffer `seq` (`addr`, `rkey`), a
    /// message of its own in the peer's flow. The buffer is advertised by this message (it
    /// takes the sequence number of an advertisement, and is never matched with a send).
    Read {
        seq: u32,
        addr: u64,
        len: u64,
        rkey: u32,
        src: u64,
        src_rkey: u32,
    },
    /// The answer to a [`Ctl::Read`] this end will not serve, and why
    /// ([`ReadRefusal`](crate::memory::ReadRefusal)'s code).
    ReadRefused { seq: u32, why: u8 },
    /// The sender asks for the advertisements from `seq` on again, over the control QP (UC,
    /// where they come over the UD QP, which may lose them): it has a send waiting for one, or
    /// took a later one first.
    NeedCts { seq: u32 },
    /// A fragment of the note of notified write `serial` (see `notes.rs`): `len` bytes of
    /// `data`, the last fragment if `last`.
    Note {
        serial: u32,
        last: bool,
        len: u8,
        data: [u8; NOTE_FRAGMENT],
    },
}

/// Bytes of a note in one control message.
pub(crate) const NOTE_FRAGMENT: usize = CTL_LEN - 8;

impl Ctl {
    /// The encoded message.
    pub(crate) fn to_bytes(self) -> [u8; CTL_LEN] {
        let mut b = [0u8; CTL_LEN];
        match self {
            Ctl::Cts {
                seq,
                addr,
                len,
                rkey,
            } => {
                b[0] = 1;
                b[4..8].copy_from_slice(&seq.to_be_bytes());
                b[8..16].copy_from_slice(&addr.to_be_bytes());
                b[16..24].copy_from_slice(&len.to_be_bytes());
                b[24..28].copy_from_slice(&rkey.to_be_bytes());
            }
            Ctl::Close => b[0] = 2,
            Ctl::Unplaceable { csn, remote, rkey } => {
                b[0] = 6;
                b[4..6].copy_from_slice(&csn.to_be_bytes());
                b[8..16].copy_from_slice(&remote.to_be_bytes());
                b[16..20].copy_from_slice(&rkey.to_be_bytes());
            }
            Ctl::Ping => b[0] = 5,
            Ctl::Withdraw { seq } => {
                b[0] = 7;
                b[4..8].copy_from_slice(&seq.to_be_bytes());
            }
            Ctl::Withdrawn { seq, ok } => {
                b[0] = 8;
                b[4..8].copy_from_slice(&seq.to_be_bytes());
                b[8] = u8::from(ok);
            }
            Ctl::Refuse { seq, len } => {
                b[0] = 3;
                b[4..8].copy_from_slice(&seq.to_be_bytes());
                b[8..16].copy_from_slice(&len.to_be_bytes());
            }
            Ctl::Read {
                seq,
                addr,
                len,
                rkey,
                src,
                src_rkey,
            } => {
                b[0] = 9;
                b[4..8].copy_from_slice(&seq.to_be_bytes());
                b[8..16].copy_from_slice(&addr.to_be_bytes());
                b[16..24].copy_from_slice(&len.to_be_bytes());
                b[24..28].copy_from_slice(&rkey.to_be_bytes());
                b[28..36].copy_from_slice(&src.to_be_bytes());
                b[36..40].copy_from_slice(&src_rkey.to_be_bytes());
            }
            Ctl::NeedCts { seq } => {
                b[0] = 12;
                b[4..8].copy_from_slice(&seq.to_be_bytes());
            }
            Ctl::ReadRefused { seq, why } => {
                b[0] = 10;
                b[4..8].copy_from_slice(&seq.to_be_bytes());
                b[8] = why;
            }
            Ctl::Note {
                serial,
                last,
                len,
                data,
            } => {
                b[0] = 11;
                b[1] = u8::from(last);
                b[2] = len;
                b[4..8].copy_from_slice(&serial.to_be_bytes());
                b[8..].copy_from_slice(&data);
            }
            Ctl::Ack(a) => {
                b[0] = 4;
                // An AckRepr always encodes (its fields are within range by construction).
                if let Ok(ack) = a.to_bytes() {
                    b[4..4 + ACK_LEN].copy_from_slice(&ack);
                }
            }
        }
        b
    }

    /// Reads a message; `None` for anything malformed.
    pub(crate) fn parse(b: &[u8]) -> Option<Ctl> {
        if b.len() != CTL_LEN {
            return None;
        }
        let mut r = Reader(&b[4..]);
        match b[0] {
            1 => Some(Ctl::Cts {
                seq: r.u32().ok()?,
                addr: r.u64().ok()?,
                len: r.u64().ok()?,
                rkey: r.u32().ok()?,
            }),
            2 => Some(Ctl::Close),
            3 => Some(Ctl::Refuse {
                seq: r.u32().ok()?,
                len: r.u64().ok()?,
            }),
            4 => AckRepr::from_bytes(&b[4..4 + ACK_LEN]).ok().map(Ctl::Ack),
            5 => Some(Ctl::Ping),
            6 => Some(Ctl::Unplaceable {
                csn: u16::from_be_bytes([b[4], b[5]]),
                remote: u64::from_be_bytes(b[8..16].try_into().ok()?),
                rkey: u32::from_be_bytes(b[16..20].try_into().ok()?),
            }),
            7 => Some(Ctl::Withdraw { seq: r.u32().ok()? }),
            9 => Some(Ctl::Read {
                seq: r.u32().ok()?,
                addr: r.u64().ok()?,
                len: r.u64().ok()?,
                rkey: r.u32().ok()?,
                src: r.u64().ok()?,
                src_rkey: r.u32().ok()?,
            }),
            10 => Some(Ctl::ReadRefused {
                seq: r.u32().ok()?,
                why: b[8],
            }),
            12 => Some(Ctl::NeedCts { seq: r.u32().ok()? }),
            11 if b[1] <= 1 && usize::from(b[2]) <= NOTE_FRAGMENT => Some(Ctl::Note {
                serial: r.u32().ok()?,
                last: b[1] == 1,
                len: b[2],
                data: b[8..].try_into().ok()?,
            }),
            8 => Some(Ctl::Withdrawn {
                seq: r.u32().ok()?,
                ok: match b[8] {
                    0 => false,
                    1 => true,
                    _ => return None,
                },
            }),
            _ => None,
        }
    }
}

/// The first byte of a control message copied over the UD QP (an ACK packet's first byte is
/// its version, 3). Not `0xC_`: Wireshark takes a UD payload starting so for a Mellanox EoIB
/// header, and a short one for a malformed Ethernet frame (a capture found an ACK request
/// that started with 0xc2).
pub(crate) const CTL_COPY: u8 = 0x5c;

/// The first byte of an ACK request on the UD QP (see [`ack_request`]).
pub(crate) const ACK_ASK: u8 = 0x5a;

/// Bytes of an ACK request: `[ACK_ASK, tag, fid (2), seq (2)]` (big-endian), where `fid` is
/// the receiver's id of the connection, `tag` its ACK tag and `seq` the request's number,
/// which the answer echoes.
pub(crate) const ACK_ASK_LEN: usize = 6;

/// The bit of an ACK request's number that asks for ACKs over the control QP: the asking end's
/// UD QP ran out of receives lately (see `acks.rs`). Numbers are below
/// [`CSN_SPACE`](uccl_tx::wire::CSN_SPACE), far below it.
const ASK_OVER_CTL: u16 = 0x8000;

/// ACK request `seq` for connection `fid` (the peer's id) with ACK tag `tag`: a timeout of
/// this end expired, and the peer answers with an ACK at once; with `over_ctl`, over the
/// connection's control QP, as its ACKs for a while after.
pub(crate) fn ack_request(fid: u16, tag: u8, seq: u16, over_ctl: bool) -> [u8; ACK_ASK_LEN] {
    let seq = if over_ctl { seq | ASK_OVER_CTL } else { seq };
    let (f, s) = (fid.to_be_bytes(), seq.to_be_bytes());
    [ACK_ASK, tag, f[0], f[1], s[0], s[1]]
}

/// Reads an ACK request: its connection, tag, number and whether it asks for ACKs over the
/// control QP; `None` if malformed (a number an ACK's `echo` cannot carry included).
pub(crate) fn parse_ack_request(b: &[u8]) -> Option<(u16, u8, u16, bool)> {
    match *b {
        [ACK_ASK, tag, f0, f1, s0, s1] => {
            let s = u16::from_be_bytes([s0, s1]);
            let seq = s & !ASK_OVER_CTL;
            (u32::from(seq) < uccl_tx::wire::CSN_SPACE).then(|| {
                (
                    u16::from_be_bytes([f0, f1]),
                    tag,
                    seq,
                    s & ASK_OVER_CTL != 0,
                )
            })
        }
        _ => None,
    }
}

/// Bytes of a copied control message: `[CTL_COPY, tag, fid (2, big-endian), 0 (4), message
/// (CTL_LEN)]`, where `fid` is the receiver's id of the connection and `tag` its ACK tag.
pub(crate) const CTL_COPY_LEN: usize = 8 + CTL_LEN;

/// Control message `msg` of connection `fid` (its receiver's id) with ACK tag `tag`, as a copy
/// for the UD QP.
pub(crate) fn ctl_copy(fid: u16, tag: u8, msg: &[u8; CTL_LEN]) -> [u8; CTL_COPY_LEN] {
    let mut b = [0u8; CTL_COPY_LEN];
    b[0] = CTL_COPY;
    b[1] = tag;
    b[2..4].copy_from_slice(&fid.to_be_bytes());
    b[8..].copy_from_slice(msg);
    b
}

/// One item of a UD message: a UD message is a run of them, each saying by its first byte what
/// it is, and so how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UdItem<'a> {
    /// An ACK (`ACK_LEN` bytes, first byte the ACK version).
    Ack(&'a [u8]),
    /// An ACK taken back before its message went (`ACK_LEN` zero bytes): nothing.
    Void,
    /// A control message of a connection ([`ctl_copy`]): an advertisement, or a copy of one
    /// the control QP holds back.
    Ctl(&'a [u8]),
    /// An ACK request ([`ack_request`]).
    Ask(&'a [u8]),
}

/// The items of UD message `b`, in order; `None` ends it at the first byte that starts no item
/// or an item cut short (what came before it stands).
pub(crate) fn ud_items(mut b: &[u8]) -> impl Iterator<Item = Option<UdItem<'_>>> {
    std::iter::from_fn(move || {
        let &first = b.first()?;
        let len = match first {
            uccl_tx::wire::ACK_VERSION | 0 => ACK_LEN,
            CTL_COPY => CTL_COPY_LEN,
            ACK_ASK => ACK_ASK_LEN,
            _ => usize::MAX,
        };
        let Some((this, rest)) = b.split_at_checked(len) else {
            b = &[];
            return Some(None);
        };
        b = rest;
        Some(Some(match first {
            0 => UdItem::Void,
            CTL_COPY => UdItem::Ctl(this),
            ACK_ASK => UdItem::Ask(this),
            _ => UdItem::Ack(this),
        }))
    })
}

/// Reads a copied control message: its connection, tag and message; `None` if malformed.
pub(crate) fn parse_ctl_copy(b: &[u8]) -> Option<(u16, u8, Ctl)> {
    if b.len() != CTL_COPY_LEN || b[0] != CTL_COPY {
        return None;
    }
    let fid = u16::from_be_bytes([b[2], b[3]]);
    Some((fid, b[1], Ctl::parse(&b[8..])?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ud_message_is_read_item_by_item_until_one_is_not() {
        let ack = [ACK_VERSION_BYTE; ACK_LEN];
        let copy = ctl_copy(1, 2, &Ctl::Ping.to_bytes());
        let ask = ack_request(1, 2, 3, false);
        let mut b = Vec::new();
        for item in [
            &ack[..],
            &[0; ACK_LEN],
            &copy,
            &ask,
            &ack,
            &[0xee, 1, 2],
            &ack,
        ] {
            b.extend_from_slice(item);
        }
        let got: Vec<_> = ud_items(&b).collect();
        assert_eq!(
            got,
            [
                Some(UdItem::Ack(&ack[..])),
                Some(UdItem::Void),
                Some(UdItem::Ctl(&copy[..])),
                Some(UdItem::Ask(&ask[..])),
                Some(UdItem::Ack(&ack[..])),
                None,
            ],
            "what follows a byte that starts no item is not read"
        );
        let cut: Vec<_> = ud_items(&copy[..CTL_COPY_LEN - 1]).collect();
        assert_eq!(cut, [None], "an item cut short");
        assert_eq!(ud_items(&[]).count(), 0);
    }

    #[test]
    fn a_control_send_carries_one_to_four_whole_messages() {
        let b = [0u8; 5 * CTL_LEN];
        for n in 1..=CTL_PACK {
            assert_eq!(ctl_pack(&b[..n * CTL_LEN]).map(Iterator::count), Some(n));
        }
        for len in [0, 1, CTL_LEN - 1, CTL_LEN + 1, 5 * CTL_LEN] {
            assert!(ctl_pack(&b[..len]).is_none(), "{len} bytes");
        }
    }

    #[test]
    fn a_copied_control_message_round_trips_and_garbage_is_none() {
        let cts = Ctl::Cts {
            seq: 3,
            addr: 0x1000,
            len: 4096,
            rkey: 9,
        };
        let b = ctl_copy(0x0123, 0x45, &cts.to_bytes());
        assert_eq!(parse_ctl_copy(&b), Some((0x0123, 0x45, cts)));
        assert_eq!(parse_ctl_copy(&b[..CTL_COPY_LEN - 1]), None);
        let mut other = b;
        other[0] = ACK_VERSION_BYTE;
        assert_eq!(parse_ctl_copy(&other), None);
        let mut bad = b;
        bad[8] = 0;
        assert_eq!(parse_ctl_copy(&bad), None);
    }

    #[test]
    fn an_ack_request_round_trips_and_garbage_is_none() {
        let b = ack_request(0x0abc, 0x7f, 2047, false);
        assert_eq!(parse_ack_request(&b), Some((0x0abc, 0x7f, 2047, false)));
        let c = ack_request(0x0abc, 0x7f, 2047, true);
        assert_eq!(parse_ack_request(&c), Some((0x0abc, 0x7f, 2047, true)));
        assert_eq!(parse_ack_request(&b[..ACK_ASK_LEN - 1]), None, "short");
        assert_eq!(
            parse_ack_request(&[b.as_slice(), &[0]].concat()),
            None,
            "long"
        );
        let mut other = b;
        other[0] = CTL_COPY;
        assert_eq!(parse_ack_request(&other), None, "another kind");
        // A number an ACK's echo cannot carry: the answer could not be sent.
        assert_eq!(parse_ack_request(&ack_request(1, 1, 2048, false)), None);
        assert_eq!(parse_ack_request(&ack_request(1, 1, 2048, true)), None);
    }

    const ACK_VERSION_BYTE: u8 = uccl_tx::wire::ACK_VERSION;

    fn hello() -> Hello {
        Hello {
            features: feature::RC,
            max_chunk: 65536,
            gid: Gid([7; 16]),
            lid: 3,
            ctrl_qpn: 0x1234,
            qkey: 0x1111,
            fid: 42,
            credit: 100,
            conn_qpn: 0x77,
            conn_psn: 5,
            qps: vec![(0x20, 1), (0x21, 2)],
        }
    }

    #[test]
    fn a_handshake_round_trips_and_garbage_is_refused() {
        let h = hello();
        let b = h.to_bytes();
        assert_eq!(Hello::parse(&b), Ok(h));
        let fixed: [u8; HELLO_FIXED_LEN] = b[..HELLO_FIXED_LEN].try_into().unwrap();
        assert_eq!(Hello::total_len(&fixed), Ok(b.len()));
        for n in 0..b.len() {
            assert_eq!(Hello::parse(&b[..n]), Err(HelloError::Truncated), "{n}");
        }
        let mut other = b.clone();
        other[0] = b'X';
        assert_eq!(Hello::parse(&other), Err(HelloError::NotUccl));
        let mut newer = b.clone();
        newer[7] = (VERSION + 1) as u8;
        assert_eq!(Hello::parse(&newer), Err(HelloError::Version(VERSION + 1)));
        let mut many = b;
        many[HELLO_FIXED_LEN - 2] = 0xff;
        assert!(matches!(
            Hello::parse(&many),
            Err(HelloError::TooManyQps(_))
        ));
    }

    #[test]
    fn control_messages_round_trip_and_garbage_is_none() {
        for c in [
            Ctl::Cts {
                seq: 9,
                addr: u64::MAX - 3,
                len: 1 << 40,
                rkey: 0xdead,
            },
            Ctl::Close,
            Ctl::Ping,
            Ctl::Unplaceable {
                csn: 0x7ff,
                remote: u64::MAX - 7,
                rkey: 0xfeed_beef,
            },
            Ctl::Refuse {
                seq: 77,
                len: u64::MAX - 1,
            },
            Ctl::Withdraw { seq: u32::MAX },
            Ctl::NeedCts { seq: 7 },
            Ctl::Read {
                seq: 3,
                addr: u64::MAX,
                len: 1 << 33,
                rkey: 0xabcd,
                src: 0x1234_5678_9abc,
                src_rkey: u32::MAX,
            },
            Ctl::ReadRefused { seq: 9, why: 2 },
            Ctl::Note {
                serial: 77,
                last: true,
                len: NOTE_FRAGMENT as u8,
                data: [0x5a; NOTE_FRAGMENT],
            },
            Ctl::Withdrawn { seq: 5, ok: true },
            Ctl::Withdrawn { seq: 6, ok: false },
            Ctl::Ack(AckRepr {
                fid: 3,
                cum: 9,
                credit: 4,
                ..AckRepr::default()
            }),
        ] {
            assert_eq!(Ctl::parse(&c.to_bytes()), Some(c));
        }
        assert_eq!(Ctl::parse(&[0; CTL_LEN]), None);
        // A note fragment longer than a fragment, or with a bad flag, is garbage.
        let mut note = [0u8; CTL_LEN];
        note[0] = 11;
        note[2] = NOTE_FRAGMENT as u8 + 1;
        assert_eq!(Ctl::parse(&note), None);
        note[2] = 1;
        note[1] = 2;
        assert_eq!(Ctl::parse(&note), None);
        assert_eq!(Ctl::parse(&[1; 5]), None);
    }
}
