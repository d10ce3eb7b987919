//! The wire format of InfiniBand Communication Management (IBTA Vol. 1, chapter 12): 256-byte
//! MADs of management class 0x07 sent as UD datagrams to QP1, and the "RDMA IP CM Service"
//! header (IBTA Annex A11) that rdma_cm puts first in a REQ's (or SIDR REQ's) private data.
//!
//! Every message is a MAD: the 24-byte common MAD header, then the CM attribute's 232
//! bytes. [`Msg::parse`] reads one from untrusted bytes (anything malformed is an error, never a
//! panic); [`Msg::emit`] writes one. Field offsets are those of the IBTA tables (the kernel's
//! `ibta_vol1_c12.h` has the same), so tshark decodes what softnic sends.

use std::net::Ipv4Addr;

/// The length of every MAD.
pub const MAD_LEN: usize = 256;
/// The length of the common MAD header.
pub const HDR_LEN: usize = 24;
/// Management class of Communication Management.
pub const CLASS_CM: u8 = 0x07;
/// The CM class version rdma_cm speaks.
pub const CLASS_VERSION: u8 = 2;
/// The method of every CM message but ClassPortInfo: Send.
pub const METHOD_SEND: u8 = 0x03;
/// The Q_Key of the general services interface (QP1).
pub const GSI_QKEY: u32 = 0x8001_0000;
/// The Q_Key rdma_cm gives UD QPs of `RDMA_PS_UDP`.
pub const UDP_QKEY: u32 = 0x0123_4567;

/// CM attribute IDs.
pub mod attr {
    /// ConnectRequest.
    pub const REQ: u16 = 0x0010;
    /// MsgRcptAck.
    pub const MRA: u16 = 0x0011;
    /// ConnectReject.
    pub const REJ: u16 = 0x0012;
    /// ConnectReply.
    pub const REP: u16 = 0x0013;
    /// ReadyToUse.
    pub const RTU: u16 = 0x0014;
    /// DisconnectRequest.
    pub const DREQ: u16 = 0x0015;
    /// DisconnectReply.
    pub const DREP: u16 = 0x0016;
    /// ServiceIDResReq.
    pub const SIDR_REQ: u16 = 0x0017;
    /// ServiceIDResReqResp.
    pub const SIDR_REP: u16 = 0x0018;
}

/// REJ reasons (IBTA table 112) softnic sends.
pub mod reject {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// Invalid service ID: nobody listens there.
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Stale connection.
    pub const STALE_CONN: u16 = 10;
    /// Timeout (the sender gave up waiting).
    pub const TIMEOUT: u16 = 26;
    /// Consumer-defined: the application (or its connection manager) said no.
    pub const CONSUMER_DEFINED: u16 = 28;
}

/// Private data sizes of each message (IBTA chapter 12).
pub mod private {
    /// REQ.
    pub const REQ: usize = 92;
    /// REP.
    pub const REP: usize = 196;
    /// REJ.
    pub const REJ: usize = 148;
    /// RTU, DREP.
    pub const RTU: usize = 224;
    /// DREQ.
    pub const DREQ: usize = 220;
    /// MRA.
    pub const MRA: usize = 222;
    /// SIDR REQ.
    pub const SIDR_REQ: usize = 216;
    /// SIDR REP.
    pub const SIDR_REP: usize = 136;
}

/// The IP CM service header's length (Annex A11; rdma_cm's `struct cma_hdr`).
pub const IP_HDR_LEN: usize = 36;

/// rdma_cm port spaces, the upper bits of a service ID: `0x0000000001060000 | port`.
pub mod ps {
    /// `RDMA_PS_TCP`: RC connections.
    pub const TCP: u16 = 0x0106;
    /// `RDMA_PS_UDP`: UD, resolved by SIDR.
    pub const UDP: u16 = 0x0111;
    /// `RDMA_PS_IB`.
    pub const IB: u16 = 0x013f;
    /// `RDMA_PS_IPOIB`.
    pub const IPOIB: u16 = 0x0002;
}

/// The service ID of `port` in port space `ps`.
pub fn service_id(ps: u16, port: u16) -> u64 {
    (u64::from(ps) << 16) | u64::from(port)
}

/// The port space and port of an rdma_cm service ID (`None` for one rdma_cm never sends).
pub fn split_service_id(sid: u64) -> Option<(u16, u16)> {
    (sid >> 32 == 0 && (sid >> 16) & 0xffff != 0).then_some(((sid >> 16) as u16, sid as u16))
}

/// Why bytes are not a CM MAD softnic takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MadError {
    /// Not 256 bytes.
    Length(usize),
    /// Base version not 1, class not CM, or class version not 2.
    NotCm,
    /// A method other than Send.
    Method(u8),
    /// An attribute softnic does not take (LAP, APR, ClassPortInfo...).
    Attribute(u16),
    /// A field out of its range (an MTU code, a REQ's transport type...).
    Field(&'static str),
}

/// A connection request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Req {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The service the request is for.
    pub service_id: u64,
    /// The sender's CA GUID.
    pub ca_guid: u64,
    /// The sender's QP number.
    pub qpn: u32,
    /// RDMA READs the sender's QP answers at once.
    pub responder_resources: u8,
    /// RDMA READs the sender's QP issues at once.
    pub initiator_depth: u8,
    /// The sender's CM response timeout (4.096 us * 2^t).
    pub remote_cm_timeout: u8,
    /// Transport: 0 RC, 1 UC.
    pub transport: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// The first PSN the sender sends.
    pub starting_psn: u32,
    /// How long the receiver waits for the sender's answer (4.096 us * 2^t).
    pub local_cm_timeout: u8,
    /// Transport retries.
    pub retry_count: u8,
    /// Path MTU code (1 = 256 ... 5 = 4096).
    pub mtu: u8,
    /// RNR retries.
    pub rnr_retry: u8,
    /// How often the sender retries the REQ.
    pub max_cm_retries: u8,
    /// Whether the sender uses an SRQ.
    pub srq: bool,
    /// The sender's GID.
    pub local_gid: [u8; 16],
    /// The receiver's GID.
    pub remote_gid: [u8; 16],
    /// The path's local ACK timeout.
    pub ack_timeout: u8,
    /// Private data (92 bytes; rdma_cm's IP header first).
    pub private: [u8; private::REQ],
}

/// A connection reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rep {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The REQ's sender's communication ID.
    pub remote_comm_id: u32,
    /// The sender's QP number.
    pub qpn: u32,
    /// The first PSN the sender sends.
    pub starting_psn: u32,
    /// RDMA READs the sender's QP answers at once.
    pub responder_resources: u8,
    /// RDMA READs the sender's QP issues at once.
    pub initiator_depth: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// RNR retries.
    pub rnr_retry: u8,
    /// Whether the sender uses an SRQ.
    pub srq: bool,
    /// The sender's CA GUID.
    pub ca_guid: u64,
    /// Private data.
    pub private: [u8; private::REP],
}

/// A reject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rej {
    /// The sender's communication ID (0 if it never had one).
    pub local_comm_id: u32,
    /// The rejected side's communication ID.
    pub remote_comm_id: u32,
    /// What is rejected: 0 REQ, 1 REP, 2 other.
    pub msg_rejected: u8,
    /// Why ([`reject`]).
    pub reason: u16,
    /// Private data.
    pub private: [u8; private::REJ],
}

/// A CM message, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// ConnectRequest.
    Req(Box<Req>),
    /// MsgRcptAck: `(local, remote, msg_mraed, service_timeout)`.
    Mra(u32, u32, u8, u8),
    /// ConnectReject.
    Rej(Box<Rej>),
    /// ConnectReply.
    Rep(Box<Rep>),
    /// ReadyToUse: `(local, remote)`.
    Rtu(u32, u32),
    /// DisconnectRequest: `(local, remote, remote_qpn)`.
    Dreq(u32, u32, u32),
    /// DisconnectReply: `(local, remote)`.
    Drep(u32, u32),
    /// SIDR request: `(request_id, service_id, private data)`.
    SidrReq(u32, u64, Box<[u8; private::SIDR_REQ]>),
    /// SIDR reply.
    SidrRep(Box<SidrRep>),
}

/// A SIDR reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrRep {
    /// The request's ID.
    pub request_id: u32,
    /// 0 valid; 1 no such service; 2 rejected; 3 no QP.
    pub status: u8,
    /// The UD QP serving it.
    pub qpn: u32,
    /// The service.
    pub service_id: u64,
    /// The QP's Q_Key.
    pub qkey: u32,
    /// Private data.
    pub private: [u8; private::SIDR_REP],
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    (u64::from(be32(b, at)) << 32) | u64::from(be32(b, at + 4))
}

fn be24(b: &[u8], at: usize) -> u32 {
    be32(b, at) >> 8
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

/// 24 bits then 8.
fn put24(b: &mut [u8], at: usize, v24: u32, low8: u8) {
    put32(b, at, ((v24 & 0xff_ffff) << 8) | u32::from(low8));
}

fn array<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[..N]);
    a
}

impl Msg {
    /// The message's attribute ID.
    pub fn attr(&self) -> u16 {
        match self {
            Msg::Req(_) => attr::REQ,
            Msg::Mra(..) => attr::MRA,
            Msg::Rej(_) => attr::REJ,
            Msg::Rep(_) => attr::REP,
            Msg::Rtu(..) => attr::RTU,
            Msg::Dreq(..) => attr::DREQ,
            Msg::Drep(..) => attr::DREP,
            Msg::SidrReq(..) => attr::SIDR_REQ,
            Msg::SidrRep(_) => attr::SIDR_REP,
        }
    }

    /// Decodes a MAD from untrusted bytes: `(transaction id, message)`.
    pub fn parse(mad: &[u8]) -> Result<(u64, Msg), MadError> {
        if mad.len() != MAD_LEN {
            return Err(MadError::Length(mad.len()));
        }
        if mad[0] != 1 || mad[1] != CLASS_CM || mad[2] != CLASS_VERSION {
            return Err(MadError::NotCm);
        }
        if mad[3] != METHOD_SEND {
            return Err(MadError::Method(mad[3]));
        }
        let tid = be64(mad, 8);
        let id = u16::from_be_bytes([mad[16], mad[17]]);
        let d = &mad[HDR_LEN..];
        let msg = match id {
            attr::REQ => {
                let transport = (d[43] >> 1) & 3;
                let mtu = d[50] >> 4;
                if transport > 1 {
                    return Err(MadError::Field("REQ transport service type"));
                }
                if !(1..=5).contains(&mtu) {
                    return Err(MadError::Field("REQ path MTU"));
                }
                Msg::Req(Box::new(Req {
                    local_comm_id: be32(d, 0),
                    service_id: be64(d, 8),
                    ca_guid: be64(d, 16),
                    qpn: be24(d, 32),
                    responder_resources: d[35],
                    initiator_depth: d[39],
                    remote_cm_timeout: d[43] >> 3,
                    transport,
                    flow_control: d[43] & 1 != 0,
                    starting_psn: be24(d, 44),
                    local_cm_timeout: d[47] >> 3,
                    retry_count: d[47] & 7,
                    mtu,
                    rnr_retry: d[50] & 7,
                    max_cm_retries: d[51] >> 4,
                    srq: d[51] & 0x08 != 0,
                    local_gid: array(&d[56..]),
                    remote_gid: array(&d[72..]),
                    ack_timeout: d[95] >> 3,
                    private: array(&d[140..]),
                }))
            }
            attr::MRA => Msg::Mra(be32(d, 0), be32(d, 4), d[8] >> 6, d[9] >> 3),
            attr::REJ => Msg::Rej(Box::new(Rej {
                local_comm_id: be32(d, 0),
                remote_comm_id: be32(d, 4),
                msg_rejected: d[8] >> 6,
                reason: u16::from_be_bytes([d[10], d[11]]),
                private: array(&d[84..]),
            })),
            attr::REP => Msg::Rep(Box::new(Rep {
                local_comm_id: be32(d, 0),
                remote_comm_id: be32(d, 4),
                qpn: be24(d, 12),
                starting_psn: be24(d, 20),
                responder_resources: d[24],
                initiator_depth: d[25],
                flow_control: d[26] & 1 != 0,
                rnr_retry: d[27] >> 5,
                srq: d[27] & 0x10 != 0,
                ca_guid: be64(d, 28),
                private: array(&d[36..]),
            })),
            attr::RTU => Msg::Rtu(be32(d, 0), be32(d, 4)),
            attr::DREQ => Msg::Dreq(be32(d, 0), be32(d, 4), be24(d, 8)),
            attr::DREP => Msg::Drep(be32(d, 0), be32(d, 4)),
            attr::SIDR_REQ => Msg::SidrReq(be32(d, 0), be64(d, 8), Box::new(array(&d[16..]))),
            attr::SIDR_REP => Msg::SidrRep(Box::new(SidrRep {
                request_id: be32(d, 0),
                status: d[4],
                qpn: be24(d, 8),
                service_id: be64(d, 12),
                qkey: be32(d, 20),
                private: array(&d[96..]),
            })),
            other => return Err(MadError::Attribute(other)),
        };
        Ok((tid, msg))
    }

    /// Encodes the message as a MAD of transaction `tid`.
    pub fn emit(&self, tid: u64) -> [u8; MAD_LEN] {
        let mut mad = [0u8; MAD_LEN];
        mad[0] = 1;
        mad[1] = CLASS_CM;
        mad[2] = CLASS_VERSION;
        mad[3] = METHOD_SEND;
        put64(&mut mad, 8, tid);
        mad[16..18].copy_from_slice(&self.attr().to_be_bytes());
        let d = &mut mad[HDR_LEN..];
        match self {
            Msg::Req(r) => {
                put32(d, 0, r.local_comm_id);
                put64(d, 8, r.service_id);
                put64(d, 16, r.ca_guid);
                put24(d, 32, r.qpn, r.responder_resources);
                put24(d, 36, 0, r.initiator_depth);
                d[43] =
                    (r.remote_cm_timeout << 3) | ((r.transport & 3) << 1) | r.flow_control as u8;
                put24(
                    d,
                    44,
                    r.starting_psn,
                    (r.local_cm_timeout << 3) | (r.retry_count & 7),
                );
                d[48..50].copy_from_slice(&0xffffu16.to_be_bytes());
                d[50] = (r.mtu << 4) | (r.rnr_retry & 7);
                d[51] = (r.max_cm_retries << 4) | ((r.srq as u8) << 3);
                // LIDs: the permissive LID on RoCE, as the kernel sends.
                d[52..54].copy_from_slice(&0xffffu16.to_be_bytes());
                d[54..56].copy_from_slice(&0xffffu16.to_be_bytes());
                d[56..72].copy_from_slice(&r.local_gid);
                d[72..88].copy_from_slice(&r.remote_gid);
                d[91] = 16; // packet rate: 100 Gb/s
                d[93] = 64; // hop limit
                d[94] = 0x08; // subnet local
                d[95] = r.ack_timeout << 3;
                d[140..].copy_from_slice(&r.private);
            }
            Msg::Mra(l, r, what, t) => {
                put32(d, 0, *l);
                put32(d, 4, *r);
                d[8] = what << 6;
                d[9] = t << 3;
            }
            Msg::Rej(r) => {
                put32(d, 0, r.local_comm_id);
                put32(d, 4, r.remote_comm_id);
                d[8] = r.msg_rejected << 6;
                d[10..12].copy_from_slice(&r.reason.to_be_bytes());
                d[84..].copy_from_slice(&r.private);
            }
            Msg::Rep(r) => {
                put32(d, 0, r.local_comm_id);
                put32(d, 4, r.remote_comm_id);
                put24(d, 12, r.qpn, 0);
                put24(d, 20, r.starting_psn, 0);
                d[24] = r.responder_resources;
                d[25] = r.initiator_depth;
                d[26] = r.flow_control as u8;
                d[27] = (r.rnr_retry << 5) | ((r.srq as u8) << 4);
                put64(d, 28, r.ca_guid);
                d[36..].copy_from_slice(&r.private);
            }
            Msg::Rtu(l, r) | Msg::Drep(l, r) => {
                put32(d, 0, *l);
                put32(d, 4, *r);
            }
            Msg::Dreq(l, r, qpn) => {
                put32(d, 0, *l);
                put32(d, 4, *r);
                put24(d, 8, *qpn, 0);
            }
            Msg::SidrReq(id, sid, private) => {
                put32(d, 0, *id);
                d[4..6].copy_from_slice(&0xffffu16.to_be_bytes());
                put64(d, 8, *sid);
                d[16..].copy_from_slice(&private[..]);
            }
            Msg::SidrRep(r) => {
                put32(d, 0, r.request_id);
                d[4] = r.status;
                put24(d, 8, r.qpn, 0);
                put64(d, 12, r.service_id);
                put32(d, 20, r.qkey);
                d[96..].copy_from_slice(&r.private);
            }
        }
        mad
    }
}

/// The IP CM service header (Annex A11): the connecting side's address and port, and the
/// address it connects to (the port is the service ID's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpHeader {
    /// The sender's address.
    pub src: Ipv4Addr,
    /// The sender's port.
    pub src_port: u16,
    /// The address connected to.
    pub dst: Ipv4Addr,
}

impl IpHeader {
    /// Writes the header (36 bytes) at the start of `out`.
    pub fn emit(&self, out: &mut [u8]) {
        out[..IP_HDR_LEN].fill(0);
        out[0] = 0x00; // CM version 0.0
        out[1] = 4 << 4; // IP version 4
        out[2..4].copy_from_slice(&self.src_port.to_be_bytes());
        out[16..20].copy_from_slice(&self.src.octets());
        out[32..36].copy_from_slice(&self.dst.octets());
    }

    /// Reads one from the start of a REQ's private data (`None`: not version 0.0 over IPv4).
    pub fn parse(b: &[u8]) -> Option<IpHeader> {
        if b.len() < IP_HDR_LEN || b[0] != 0 || b[1] >> 4 != 4 {
            return None;
        }
        Some(IpHeader {
            src_port: u16::from_be_bytes([b[2], b[3]]),
            src: Ipv4Addr::new(b[16], b[17], b[18], b[19]),
            dst: Ipv4Addr::new(b[32], b[33], b[34], b[35]),
        })
    }
}

impl Default for Req {
    /// An RC REQ of nothing: zeros, the 4096-byte MTU, no private data.
    fn default() -> Req {
        Req {
            local_comm_id: 0,
            service_id: 0,
            ca_guid: 0,
            qpn: 0,
            responder_resources: 0,
            initiator_depth: 0,
            remote_cm_timeout: 0,
            transport: 0,
            flow_control: false,
            starting_psn: 0,
            local_cm_timeout: 0,
            retry_count: 0,
            mtu: 5,
            rnr_retry: 0,
            max_cm_retries: 0,
            srq: false,
            local_gid: [0; 16],
            remote_gid: [0; 16],
            ack_timeout: 0,
            private: [0; private::REQ],
        }
    }
}

impl Default for Rep {
    /// A REP of zeros.
    fn default() -> Rep {
        Rep {
            local_comm_id: 0,
            remote_comm_id: 0,
            qpn: 0,
            starting_psn: 0,
            responder_resources: 0,
            initiator_depth: 0,
            flow_control: false,
            rnr_retry: 0,
            srq: false,
            ca_guid: 0,
            private: [0; private::REP],
        }
    }
}

#[cfg(test)]
#[path = "mad_tests.rs"]
mod tests;
