//! The wire formats a raw peer speaks, restated from uccl-engine's `proto.rs` (they are a wire
//! protocol): the connection handshake and the messages of a connection's control QP.

/// The Q_Key of a raw peer's own UD QP (an engine draws one at random; its handshake says
/// which, [`Hello::qkey`]).
pub const QKEY: u32 = 0x1cc1_0001;
/// Bytes of a control message on a connection's control QP.
pub const CTL_LEN: usize = 64;
/// Control messages one SEND carries at most (uccl-engine's `proto::CTL_PACK`).
pub const CTL_PACK: usize = 4;
/// The handshake's magic and version (uccl-engine's `proto::VERSION`).
const MAGIC: &[u8; 6] = b"UCCLRS";
const VERSION: u16 = 10;
/// The feature bit of RC data QPs.
const FEATURE_RC: u32 = 1;
/// Bytes of a handshake before its data QPs.
const HELLO_FIXED: usize = 56;

/// One end of a connection as its peer learns it: uccl-engine's handshake (`proto::Hello`),
/// big-endian, fixed layout, then `(qpn, psn)` per data QP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Feature bits: 1 means RC data QPs (else UC).
    pub features: u32,
    /// The largest chunk its SRQ buffers hold.
    pub max_chunk: u32,
    /// Its GID.
    pub gid: [u8; 16],
    /// Its LID (0 on RoCE).
    pub lid: u16,
    /// Its UD control QP (where ACKs go).
    pub ctrl_qpn: u32,
    /// Its UD control QP's Q_Key: what a UD message to it must carry.
    pub qkey: u32,
    /// Its id of the connection: the flow id the other end's immediates carry.
    pub fid: u16,
    /// The receive window it grants at first.
    pub credit: u16,
    /// The connection's control QP (RC).
    pub conn_qpn: u32,
    /// The control QP's first PSN.
    pub conn_psn: u32,
    /// The data QPs and their first PSNs, in path order.
    pub qps: Vec<(u32, u32)>,
}

impl Hello {
    /// Whether the data QPs are RC.
    pub fn rc(&self) -> bool {
        self.features & FEATURE_RC != 0
    }

    /// The encoded handshake.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HELLO_FIXED + 8 * self.qps.len());
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_be_bytes());
        b.extend_from_slice(&self.features.to_be_bytes());
        b.extend_from_slice(&self.max_chunk.to_be_bytes());
        b.extend_from_slice(&self.gid);
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

    /// Reads a handshake.
    pub fn parse(b: &[u8]) -> Result<Hello, String> {
        let mut at = 0;
        let mut take = |n: usize| -> Result<&[u8], String> {
            let s = b.get(at..at + n).ok_or("a truncated handshake")?;
            at += n;
            Ok(s)
        };
        if take(6)? != MAGIC {
            return Err("not a uccl-rs handshake".into());
        }
        let u16_of = |s: &[u8]| u16::from_be_bytes([s[0], s[1]]);
        let u32_of = |s: &[u8]| u32::from_be_bytes([s[0], s[1], s[2], s[3]]);
        let version = u16_of(take(2)?);
        if version != VERSION {
            return Err(format!(
                "handshake version {version}, this peer speaks {VERSION}"
            ));
        }
        let mut h = Hello {
            features: u32_of(take(4)?),
            max_chunk: u32_of(take(4)?),
            gid: take(16)?.try_into().expect("16 bytes"),
            lid: u16_of(take(2)?),
            ctrl_qpn: u32_of(take(4)?),
            qkey: u32_of(take(4)?),
            fid: u16_of(take(2)?),
            credit: u16_of(take(2)?),
            conn_qpn: u32_of(take(4)?),
            conn_psn: u32_of(take(4)?),
            qps: Vec::new(),
        };
        for _ in 0..u16_of(take(2)?) {
            h.qps.push((u32_of(take(4)?), u32_of(take(4)?)));
        }
        Ok(h)
    }
}

/// A receive buffer the victim advertised ([`CtlMsg::Cts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cts {
    /// Its sequence number on the connection (its request id is `seq % 128`).
    pub seq: u32,
    /// Its first byte's address at the victim.
    pub addr: u64,
    /// Its length.
    pub len: u64,
    /// The key it is advertised with.
    pub rkey: u32,
}

/// A message the victim sent on the connection's control QP (uccl-engine's `proto::Ctl`: byte 0
/// the kind, big-endian fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtlMsg {
    /// Kind 1, clear to send: a receive buffer (seq at byte 4, addr 8, len 16, rkey 24).
    Cts(Cts),
    /// Kind 6: the retransmitted chunk `csn` named memory the victim did not offer (`remote`,
    /// `rkey`, as its header said), and was dropped.
    Unplaceable {
        /// The chunk's sequence number.
        csn: u16,
        /// The address its header named.
        remote: u64,
        /// The key its header named.
        rkey: u32,
    },
    /// Any other kind (2 close, 3 refuse, 4 ACK, 5 ping, or garbage).
    Other(u8),
}

impl CtlMsg {
    /// Reads a control message.
    pub fn parse(b: &[u8; CTL_LEN]) -> CtlMsg {
        let u16_at = |i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        match b[0] {
            1 => CtlMsg::Cts(Cts {
                seq: u32_at(4),
                addr: u64_at(8),
                len: u64_at(16),
                rkey: u32_at(24),
            }),
            6 => CtlMsg::Unplaceable {
                csn: u16_at(4),
                remote: u64_at(8),
                rkey: u32_at(16),
            },
            k => CtlMsg::Other(k),
        }
    }
}

/// The advertisements in a UD message of the victim (uccl-engine's `proto::ud_items`): a run
/// of items, each saying by its first byte what it is and so how long: an ACK (the ACK version
/// 3, or 0 for one taken back: 48 bytes), a control message (0x5c, a tag, the flow id, four
/// zero bytes, then the 64-byte message: 72 bytes), an ACK request (0x5a: 6 bytes).
pub(super) fn ud_adverts(mut b: &[u8]) -> Vec<Cts> {
    let mut out = Vec::new();
    while let Some(&first) = b.first() {
        let len = match first {
            3 | 0 => 48,
            0x5c => 8 + CTL_LEN,
            0x5a => 6,
            _ => break,
        };
        let Some((item, rest)) = b.split_at_checked(len) else {
            break;
        };
        if first == 0x5c
            && let CtlMsg::Cts(c) = CtlMsg::parse(item[8..].try_into().expect("a message"))
        {
            out.push(c);
        }
        b = rest;
    }
    out
}
