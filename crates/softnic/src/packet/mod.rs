//! The packet layer: InfiniBand transport headers as RoCEv2 puts them on the wire.
//!
//! A packet is `BTH [XRCETH] [DETH] [RETH] [AtomicETH] [ImmDt | IETH] [AETH] [AtomicAckETH]
//! payload pad ICRC`, every field big-endian, as in the IBTA specification (volume 1, chapter
//! 9). [`Headers::emit`] writes one into a byte buffer, [`Packet::parse`] checks and reads one
//! back (smoltcp's `new_checked` + `Repr` style: every malformed input is an error, never a
//! panic). The transport logic in `qp` only ever sees parsed headers, so a UDP wire (port 4791)
//! can carry these same bytes later.
//!
//! The ICRC here is a CRC-32 over the whole packet before it (the real one also covers masked
//! IP/UDP headers, which this fabric does not have); the receiver drops a packet whose ICRC does
//! not match, which is how injected corruption is detected.

/// IBTA base transport opcodes (the 8-bit BTH opcode: transport in the top 3 bits).
pub mod opcode {
    #![allow(missing_docs)]
    pub const RC_SEND_FIRST: u8 = 0x00;
    pub const RC_SEND_MIDDLE: u8 = 0x01;
    pub const RC_SEND_LAST: u8 = 0x02;
    pub const RC_SEND_LAST_IMM: u8 = 0x03;
    pub const RC_SEND_ONLY: u8 = 0x04;
    pub const RC_SEND_ONLY_IMM: u8 = 0x05;
    pub const RC_WRITE_FIRST: u8 = 0x06;
    pub const RC_WRITE_MIDDLE: u8 = 0x07;
    pub const RC_WRITE_LAST: u8 = 0x08;
    pub const RC_WRITE_LAST_IMM: u8 = 0x09;
    pub const RC_WRITE_ONLY: u8 = 0x0a;
    pub const RC_WRITE_ONLY_IMM: u8 = 0x0b;
    pub const RC_READ_REQUEST: u8 = 0x0c;
    pub const RC_READ_RESPONSE_FIRST: u8 = 0x0d;
    pub const RC_READ_RESPONSE_MIDDLE: u8 = 0x0e;
    pub const RC_READ_RESPONSE_LAST: u8 = 0x0f;
    pub const RC_READ_RESPONSE_ONLY: u8 = 0x10;
    pub const RC_ACKNOWLEDGE: u8 = 0x11;
    pub const RC_ATOMIC_ACKNOWLEDGE: u8 = 0x12;
    pub const RC_COMPARE_SWAP: u8 = 0x13;
    pub const RC_FETCH_ADD: u8 = 0x14;
    pub const RC_SEND_LAST_INV: u8 = 0x16;
    pub const RC_SEND_ONLY_INV: u8 = 0x17;
    /// RDMA FLUSH (IBTA 1.5): FETH and RETH, answered as a READ of no bytes, as rxe does.
    pub const RC_FLUSH: u8 = 0x1c;
    /// RDMA ATOMIC WRITE (IBTA 1.5): RETH and 8 bytes written at once, answered as a READ of
    /// no bytes (an RDMA READ Response Only with its AETH), as rxe does.
    pub const RC_ATOMIC_WRITE: u8 = 0x1d;
    /// UC opcodes are the RC SEND/WRITE ones with this transport prefix.
    pub const UC: u8 = 0x20;
    /// XRC opcodes are the RC ones with this transport prefix; its requests carry an XRCETH.
    pub const XRC: u8 = 0xa0;
    pub const UD_SEND_ONLY: u8 = 0x64;
    pub const UD_SEND_ONLY_IMM: u8 = 0x65;
    /// RoCEv2's congestion notification packet (Annex A17): BTH with BECN set, to the QP
    /// whose packet arrived marked, and 16 reserved bytes.
    pub const CNP: u8 = 0x81;
}

/// Bytes of each header.
pub const BTH_LEN: usize = 12;
/// RDMA extended transport header length.
pub const RETH_LEN: usize = 16;
/// Datagram extended transport header length.
pub const DETH_LEN: usize = 8;
/// ACK extended transport header length.
pub const AETH_LEN: usize = 4;
/// Immediate data length.
pub const IMM_LEN: usize = 4;
/// Invalidate extended transport header length.
pub const IETH_LEN: usize = 4;
/// Atomic extended transport header length.
pub const ATOMIC_ETH_LEN: usize = 28;
/// Atomic acknowledge extended transport header length.
pub const ATOMIC_ACK_ETH_LEN: usize = 8;
/// FLUSH extended transport header length.
pub const FETH_LEN: usize = 4;
/// XRC extended transport header length: the SRQ a request is for.
pub const XRCETH_LEN: usize = 4;
/// Invariant CRC length.
pub const ICRC_LEN: usize = 4;
/// The PSN space: 24 bits.
pub const PSN_MASK: u32 = 0x00ff_ffff;

/// AETH syndromes (top 3 bits: type; low 5 bits: credit count, RNR timer or NAK code).
pub mod syndrome {
    #![allow(missing_docs)]
    /// ACK with "unlimited" credits (credits are not modelled).
    pub const ACK: u8 = 0x1f;
    pub const TYPE_MASK: u8 = 0xe0;
    pub const TYPE_ACK: u8 = 0x00;
    pub const TYPE_RNR_NAK: u8 = 0x20;
    pub const TYPE_NAK: u8 = 0x60;
    pub const NAK_PSN_SEQ_ERR: u8 = 0x60;
    pub const NAK_INVALID_REQUEST: u8 = 0x61;
    pub const NAK_REMOTE_ACCESS: u8 = 0x62;
    pub const NAK_REMOTE_OP: u8 = 0x63;
}

/// Which extension headers an opcode carries and where it sits in a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// DETH present (UD).
    pub deth: bool,
    /// RETH present (first/only RDMA WRITE, READ request).
    pub reth: bool,
    /// Immediate data present.
    pub imm: bool,
    /// AETH present (ACK, read responses first/last/only, atomic acknowledge).
    pub aeth: bool,
    /// AtomicETH present (compare-and-swap, fetch-and-add).
    pub atomic: bool,
    /// AtomicAckETH present (atomic acknowledge).
    pub atomic_ack: bool,
    /// IETH present (SEND last or only with invalidate).
    pub ieth: bool,
    /// FETH present (FLUSH).
    pub feth: bool,
    /// XRCETH present (XRC requests).
    pub xrceth: bool,
    /// First packet of a message (or only).
    pub first: bool,
    /// Last packet of a message (or only).
    pub last: bool,
}

/// The layout of `op`, or `None` for an opcode this device does not implement.
pub fn layout(op: u8) -> Option<Layout> {
    LAYOUTS[usize::from(op)]
}

/// [`layout`] of every opcode, worked out at compile time: every packet built or parsed looks
/// its opcode up.
static LAYOUTS: [Option<Layout>; 256] = {
    let mut t = [None; 256];
    let mut op = 0;
    while op < 256 {
        t[op] = layout_of(op as u8);
        op += 1;
    }
    t
};

/// A layout of the BTH's extension headers but the rarer ones.
const fn l(deth: bool, reth: bool, imm: bool, aeth: bool, first: bool, last: bool) -> Layout {
    Layout {
        deth,
        reth,
        imm,
        aeth,
        atomic: false,
        atomic_ack: false,
        ieth: false,
        feth: false,
        xrceth: false,
        first,
        last,
    }
}

/// See [`layout`].
const fn layout_of(op: u8) -> Option<Layout> {
    use opcode::*;
    if op & 0xe0 == XRC {
        // XRC has RC's opcodes: its requests name the SRQ, its responses do not.
        let Some(rc) = layout_of(op & 0x1f) else {
            return None;
        };
        let response = matches!(op & 0x1f, RC_READ_RESPONSE_FIRST..=RC_ATOMIC_ACKNOWLEDGE);
        return Some(Layout {
            xrceth: !response,
            ..rc
        });
    }
    let base = if op & 0xe0 == UC { op & !UC } else { op };
    if op & 0xe0 == UC && base > RC_WRITE_ONLY_IMM {
        return None; // UC has SEND and WRITE only
    }
    Some(match base {
        RC_SEND_FIRST => l(false, false, false, false, true, false),
        RC_SEND_MIDDLE | RC_WRITE_MIDDLE => l(false, false, false, false, false, false),
        RC_SEND_LAST | RC_WRITE_LAST => l(false, false, false, false, false, true),
        RC_SEND_LAST_IMM | RC_WRITE_LAST_IMM => l(false, false, true, false, false, true),
        RC_SEND_ONLY => l(false, false, false, false, true, true),
        RC_SEND_ONLY_IMM => l(false, false, true, false, true, true),
        RC_WRITE_FIRST => l(false, true, false, false, true, false),
        RC_WRITE_ONLY | RC_READ_REQUEST | RC_ATOMIC_WRITE => {
            l(false, true, false, false, true, true)
        }
        RC_WRITE_ONLY_IMM => l(false, true, true, false, true, true),
        RC_READ_RESPONSE_FIRST => l(false, false, false, true, true, false),
        RC_READ_RESPONSE_MIDDLE => l(false, false, false, false, false, false),
        RC_READ_RESPONSE_LAST => l(false, false, false, true, false, true),
        RC_READ_RESPONSE_ONLY | RC_ACKNOWLEDGE => l(false, false, false, true, true, true),
        RC_ATOMIC_ACKNOWLEDGE => Layout {
            atomic_ack: true,
            ..l(false, false, false, true, true, true)
        },
        RC_FLUSH => Layout {
            feth: true,
            ..l(false, true, false, false, true, true)
        },
        RC_COMPARE_SWAP | RC_FETCH_ADD => Layout {
            atomic: true,
            ..l(false, false, false, false, true, true)
        },
        RC_SEND_LAST_INV | RC_SEND_ONLY_INV => Layout {
            ieth: true,
            ..l(false, false, false, false, base == RC_SEND_ONLY_INV, true)
        },
        UD_SEND_ONLY => l(true, false, false, false, true, true),
        UD_SEND_ONLY_IMM => l(true, false, true, false, true, true),
        CNP => l(false, false, false, false, true, true),
        _ => return None,
    })
}

/// The RDMA extended transport header: where an RDMA WRITE or READ goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reth {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Length of the whole RDMA operation in bytes.
    pub len: u32,
}

/// The datagram extended transport header (UD).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Deth {
    /// The Q_Key the receiver checks.
    pub qkey: u32,
    /// The sender's QP number (24 bits).
    pub src_qp: u32,
}

/// The ACK extended transport header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Aeth {
    /// ACK, RNR NAK or NAK, with its code ([`syndrome`]).
    pub syndrome: u8,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

/// The atomic extended transport header: what an atomic request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtomicEth {
    /// Remote virtual address (8-byte aligned).
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// The value to swap in (compare-and-swap) or to add (fetch-and-add).
    pub swap_add: u64,
    /// The value to compare with (compare-and-swap).
    pub compare: u64,
}

/// Every header field of one packet, parsed or to be emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Headers {
    /// BTH opcode.
    pub opcode: u8,
    /// Solicited event.
    pub se: bool,
    /// Partition key.
    pub pkey: u16,
    /// Destination QP number (24 bits).
    pub dest_qp: u32,
    /// Acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number (24 bits).
    pub psn: u32,
    /// DETH, for UD.
    pub deth: Option<Deth>,
    /// RETH, for RDMA WRITE first/only and READ requests.
    pub reth: Option<Reth>,
    /// Immediate data exactly as on the wire (the `__be32` of the API, unchanged).
    pub imm: Option<u32>,
    /// AETH, for ACKs, read responses and atomic acknowledges.
    pub aeth: Option<Aeth>,
    /// AtomicETH, for atomic requests.
    pub atomic: Option<AtomicEth>,
    /// AtomicAckETH: the original value at the remote address, for atomic acknowledges.
    pub atomic_ack: Option<u64>,
    /// IETH: the R_Key the responder invalidates, for SEND last or only with invalidate.
    pub ieth: Option<u32>,
    /// FETH, for FLUSH: the placement type in bits 3:0 (1 global visibility, 2 persistence)
    /// and the selectivity level in bits 5:4 (0 the RETH's range, 1 the whole region), as rxe
    /// lays it out.
    pub feth: Option<u32>,
    /// XRCETH, for XRC requests: the number of the SRQ (24 bits) the message is for.
    pub xrceth: Option<u32>,
}

/// Why a byte buffer is not a valid packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    /// Shorter than its headers and ICRC.
    Truncated,
    /// The ICRC does not match (corrupted in flight).
    BadIcrc,
    /// An opcode this device does not implement.
    UnknownOpcode(u8),
    /// The BTH transport version is not 0.
    BadVersion,
    /// Pad count larger than the payload.
    BadPad,
    /// The extension headers present do not match the opcode.
    HeaderMismatch,
}

impl Headers {
    /// Appends the packet `self` + `payload` (padded to 4 bytes) + ICRC to `out`.
    ///
    /// Returns [`WireError::HeaderMismatch`] if the extension headers do not match the opcode's
    /// layout, or [`WireError::UnknownOpcode`].
    pub fn emit(&self, payload: &[u8], out: &mut Vec<u8>) -> Result<(), WireError> {
        self.check_layout()?;
        let start = out.len();
        self.emit_unsealed(payload, out);
        seal(&mut out[start..]);
        Ok(())
    }

    /// Like [`emit`](Self::emit), leaving the ICRC zero: for frames that never leave this
    /// process unchanged (the fabric seals a frame before it corrupts one, see [`seal`]), so
    /// that the CRC of every byte of every packet is computed only where it can matter. For
    /// headers softnic built, which match their opcode (checked in debug builds).
    pub(crate) fn emit_unsealed(&self, payload: &[u8], out: &mut Vec<u8>) {
        self.emit_head(payload.len(), out);
        out.extend_from_slice(payload);
        Self::emit_tail(payload.len(), out);
    }

    /// Whether the extension headers present are those of the opcode's layout.
    fn check_layout(&self) -> Result<(), WireError> {
        let l = layout(self.opcode).ok_or(WireError::UnknownOpcode(self.opcode))?;
        if l.deth != self.deth.is_some()
            || l.reth != self.reth.is_some()
            || l.imm != self.imm.is_some()
            || l.aeth != self.aeth.is_some()
            || l.atomic != self.atomic.is_some()
            || l.atomic_ack != self.atomic_ack.is_some()
            || l.ieth != self.ieth.is_some()
            || l.feth != self.feth.is_some()
            || l.xrceth != self.xrceth.is_some()
        {
            return Err(WireError::HeaderMismatch);
        }
        Ok(())
    }

    /// The headers of a packet of `payload_len` payload bytes (the payload, then
    /// [`emit_tail`](Self::emit_tail), follow), for a caller that writes the payload in place:
    /// as [`emit_unsealed`](Self::emit_unsealed), headers softnic built (a packet is written
    /// per chunk: the check of its layout is the tests', not every packet's).
    #[inline(always)]
    pub(crate) fn emit_head(&self, payload_len: usize, out: &mut Vec<u8>) {
        debug_assert_eq!(
            self.check_layout(),
            Ok(()),
            "softnic built an inconsistent header: {self:?}"
        );
        let pad = pad_of(payload_len);
        // Laid out on the stack, then appended at once (one length check and copy, not one
        // per header).
        let mut h = HeadBuf::default();
        let [p0, p1] = self.pkey.to_be_bytes();
        let [_, q1, q2, q3] = self.dest_qp.to_be_bytes(); // resv8 = 0
        let [s0, s1, s2, s3] =
            ((u32::from(self.ack_req) << 31) | (self.psn & PSN_MASK)).to_be_bytes();
        let se_pad = (u8::from(self.se) << 7) | ((pad as u8) << 4); // SE, M=0, pad, TVer=0
        h.put([self.opcode, se_pad, p0, p1, 0, q1, q2, q3, s0, s1, s2, s3]);
        if let Some(srqn) = self.xrceth {
            h.put((srqn & 0x00ff_ffff).to_be_bytes());
        }
        if let Some(d) = self.deth {
            h.put(d.qkey.to_be_bytes());
            h.put((d.src_qp & 0x00ff_ffff).to_be_bytes());
        }
        if let Some(f) = self.feth {
            h.put(f.to_be_bytes());
        }
        if let Some(r) = self.reth {
            h.put(r.va.to_be_bytes());
            h.put(r.rkey.to_be_bytes());
            h.put(r.len.to_be_bytes());
        }
        if let Some(a) = self.atomic {
            h.put(a.va.to_be_bytes());
            h.put(a.rkey.to_be_bytes());
            h.put(a.swap_add.to_be_bytes());
            h.put(a.compare.to_be_bytes());
        }
        if let Some(imm) = self.imm {
            h.put(imm.to_ne_bytes()); // already big-endian in memory
        }
        if let Some(rkey) = self.ieth {
            h.put(rkey.to_be_bytes());
        }
        if let Some(a) = self.aeth {
            h.put(((u32::from(a.syndrome) << 24) | (a.msn & 0x00ff_ffff)).to_be_bytes());
        }
        if let Some(orig) = self.atomic_ack {
            h.put(orig.to_be_bytes());
        }
        out.extend_from_slice(h.bytes());
    }

    /// What follows a packet's `payload_len` payload bytes: the pad to 4 bytes and a zero
    /// ICRC.
    pub(crate) fn emit_tail(payload_len: usize, out: &mut Vec<u8>) {
        out.extend(std::iter::repeat_n(0, pad_of(payload_len)));
        out.extend_from_slice(&[0; ICRC_LEN]);
    }

    /// The length on the wire of a packet with these headers and `payload_len` bytes of payload.
    pub fn wire_len(&self, payload_len: usize) -> usize {
        BTH_LEN
            + self.xrceth.map_or(0, |_| XRCETH_LEN)
            + self.deth.map_or(0, |_| DETH_LEN)
            + self.feth.map_or(0, |_| FETH_LEN)
            + self.reth.map_or(0, |_| RETH_LEN)
            + self.imm.map_or(0, |_| IMM_LEN)
            + self.ieth.map_or(0, |_| IETH_LEN)
            + self.aeth.map_or(0, |_| AETH_LEN)
            + self.atomic.map_or(0, |_| ATOMIC_ETH_LEN)
            + self.atomic_ack.map_or(0, |_| ATOMIC_ACK_ETH_LEN)
            + payload_len.next_multiple_of(4)
            + ICRC_LEN
    }
}

/// Writes the ICRC of a frame built by [`Headers::emit_unsealed`] (its last 4 bytes: a CRC-32
/// of everything before them, little-endian).
pub(crate) fn seal(frame: &mut [u8]) {
    let Some(n) = frame.len().checked_sub(ICRC_LEN) else {
        return;
    };
    let icrc = crc32fast::hash(&frame[..n]);
    frame[n..].copy_from_slice(&icrc.to_le_bytes());
}

/// A checked, parsed packet: its headers and a view of its payload (pad removed). The
/// default is a packet with no headers set and no payload, to parse into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Packet<'a> {
    /// The headers.
    pub hdr: Headers,
    /// The payload bytes.
    pub payload: &'a [u8],
}

impl<'a> Packet<'a> {
    /// Checks the ICRC and every length, then reads the headers.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, WireError> {
        Self::parse_with(bytes, true)
    }

    /// Like [`parse`](Self::parse), checking the ICRC only if `check_icrc` (a frame this
    /// process built and nothing changed: every other check stays).
    pub(crate) fn parse_with(bytes: &'a [u8], check_icrc: bool) -> Result<Self, WireError> {
        let mut pkt = Packet::default();
        pkt.parse_into(bytes, check_icrc)?;
        Ok(pkt)
    }

    /// [`parse_with`](Self::parse_with) into this packet (its headers all `None` before):
    /// the headers are written where they stay, not built and moved.
    #[inline(always)]
    pub(crate) fn parse_into(
        &mut self,
        bytes: &'a [u8],
        check_icrc: bool,
    ) -> Result<(), WireError> {
        debug_assert_eq!(self.hdr, Headers::default(), "parsed into a fresh packet");
        if bytes.len() < BTH_LEN + ICRC_LEN {
            return Err(WireError::Truncated);
        }
        let (body, icrc) = bytes.split_at(bytes.len() - ICRC_LEN);
        let icrc = u32::from_le_bytes([icrc[0], icrc[1], icrc[2], icrc[3]]);
        if check_icrc && crc32fast::hash(body) != icrc {
            return Err(WireError::BadIcrc);
        }
        let be32 = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        let be64 = |b: &[u8]| u64::from(be32(&b[..4])) << 32 | u64::from(be32(&b[4..8]));
        let op = body[0];
        let l = layout(op).ok_or(WireError::UnknownOpcode(op))?;
        if body[1] & 0x0f != 0 {
            return Err(WireError::BadVersion);
        }
        let pad = usize::from((body[1] >> 4) & 0x3);
        let hdr = &mut self.hdr;
        hdr.opcode = op;
        hdr.se = body[1] & 0x80 != 0;
        hdr.pkey = u16::from_be_bytes([body[2], body[3]]);
        hdr.dest_qp = be32(&body[4..8]) & 0x00ff_ffff;
        hdr.ack_req = body[8] & 0x80 != 0;
        hdr.psn = be32(&body[8..12]) & PSN_MASK;
        let mut cur = Cursor(&body[BTH_LEN..]);
        if l.xrceth {
            hdr.xrceth = Some(be32(cur.take(XRCETH_LEN)?) & 0x00ff_ffff);
        }
        if l.deth {
            let d = cur.take(DETH_LEN)?;
            hdr.deth = Some(Deth {
                qkey: be32(&d[0..4]),
                src_qp: be32(&d[4..8]) & 0x00ff_ffff,
            });
        }
        if l.feth {
            hdr.feth = Some(be32(cur.take(FETH_LEN)?));
        }
        if l.reth {
            let r = cur.take(RETH_LEN)?;
            hdr.reth = Some(Reth {
                va: be64(&r[0..8]),
                rkey: be32(&r[8..12]),
                len: be32(&r[12..16]),
            });
        }
        if l.atomic {
            let a = cur.take(ATOMIC_ETH_LEN)?;
            hdr.atomic = Some(AtomicEth {
                va: be64(&a[0..8]),
                rkey: be32(&a[8..12]),
                swap_add: be64(&a[12..20]),
                compare: be64(&a[20..28]),
            });
        }
        if l.imm {
            let i = cur.take(IMM_LEN)?;
            hdr.imm = Some(u32::from_ne_bytes([i[0], i[1], i[2], i[3]]));
        }
        if l.ieth {
            hdr.ieth = Some(be32(cur.take(IETH_LEN)?));
        }
        if l.aeth {
            let w = be32(cur.take(AETH_LEN)?);
            hdr.aeth = Some(Aeth {
                syndrome: (w >> 24) as u8,
                msn: w & 0x00ff_ffff,
            });
        }
        if l.atomic_ack {
            hdr.atomic_ack = Some(be64(cur.take(ATOMIC_ACK_ETH_LEN)?));
        }
        let payload = cur.0;
        if pad > payload.len() {
            return Err(WireError::BadPad);
        }
        self.payload = &payload[..payload.len() - pad];
        Ok(())
    }
}

/// The pad after a payload of `payload_len` bytes, to a multiple of 4.
pub(crate) fn pad_of(payload_len: usize) -> usize {
    (4 - payload_len % 4) % 4
}

/// Reads headers off the front of a byte slice.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.0.len() < n {
            return Err(WireError::Truncated);
        }
        let (h, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(h)
    }
}

/// `a - b` in the 24-bit PSN space, as a signed distance (positive: `a` is after `b`).
pub fn psn_diff(a: u32, b: u32) -> i32 {
    ((a.wrapping_sub(b) & PSN_MASK) << 8) as i32 >> 8
}

/// `psn + n` in the 24-bit PSN space.
pub fn psn_add(psn: u32, n: u32) -> u32 {
    psn.wrapping_add(n) & PSN_MASK
}

/// A packet's headers as they are laid out, before they are appended to the frame: room for
/// every header at once (more than any opcode carries), so `put` never runs out.
struct HeadBuf {
    buf: [u8; HEADROOM],
    len: usize,
}

/// Every header's length added up: BTH, XRCETH, DETH, FETH, RETH, AtomicETH, ImmDt, IETH, AETH and
/// AtomicAckETH.
const HEADROOM: usize = BTH_LEN
    + XRCETH_LEN
    + DETH_LEN
    + FETH_LEN
    + RETH_LEN
    + ATOMIC_ETH_LEN
    + IMM_LEN
    + IETH_LEN
    + AETH_LEN
    + ATOMIC_ACK_ETH_LEN;

impl Default for HeadBuf {
    fn default() -> Self {
        HeadBuf {
            buf: [0; HEADROOM],
            len: 0,
        }
    }
}

impl HeadBuf {
    #[inline(always)]
    fn put<const N: usize>(&mut self, b: [u8; N]) {
        // Cannot run past the end: each header is put once at most (see `HEADROOM`).
        self.buf[self.len..self.len + N].copy_from_slice(&b);
        self.len += N;
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

#[cfg(test)]
mod tests;
