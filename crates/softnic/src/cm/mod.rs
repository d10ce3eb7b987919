//! The connection manager: what the kernel's `ib_cm` and `rdma_cm` are for a real device.
//!
//! Every device has a GSI QP (QP1) that sends and takes Communication Management MADs (REQ,
//! MRA, REJ, REP, RTU, DREQ, DREP, SIDR REQ/REP; [`mad`]) over the link, simulated or UDP, as
//! the kernel's CM sends them over rxe; faults apply to them as to any packet. Above it, the
//! address-level connection manager of librdmacm: ids bound to an IPv4 address and port of a
//! port space (`RDMA_PS_TCP` and `RDMA_PS_IB` for RC, `RDMA_PS_UDP` for UD), listeners with a
//! backlog, address and route resolution, connect/accept/reject/disconnect with private data,
//! and the QP transitions rdma_cm does for its caller (INIT when a QP is attached, RTR and RTS
//! with the PSNs, path MTU, responder resources and initiator depth the messages carry, ERROR
//! on the caller's disconnect; the peer's DREQ reports DISCONNECTED and leaves the QP alone,
//! its DREP waiting for the caller's disconnect or destroy, as in the kernel). Events queue on
//! channels whose file descriptors are readable while events wait ([`CmEvent`]).
//!
//! Lost MADs are sent again after the CM response timeout ([`RESPONSE_TIMEOUT`], up to
//! [`MAX_RETRIES`] times), duplicates are answered as the IBTA says (a REQ being decided gets an
//! MRA, an established connection's duplicate REP its RTU again, a DREQ for a connection gone
//! a DREP), and anything malformed, unexpected or from a stranger is counted
//! ([`CmCounters`]) and dropped, never a panic.
//!
//! ```
//! use softnic::{CONTROL, Fabric, FabricConfig, cm::{CmEventKind, PortSpace}};
//! use std::net::{Ipv4Addr, SocketAddrV4};
//!
//! let fabric = Fabric::new(FabricConfig::default());
//! let server = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 7174);
//! let ch = fabric.cm_create_channel().unwrap();
//! let listener = fabric.cm_create_id(ch, PortSpace::Tcp).unwrap();
//! fabric.cm_bind(listener, server).unwrap();
//! fabric.cm_listen(listener, 8).unwrap();
//! let client = fabric.cm_create_id(ch, PortSpace::Tcp).unwrap();
//! fabric.cm_resolve_addr(client, None, server).unwrap();
//! assert_eq!(fabric.cm_poll_event(ch).unwrap().kind, CmEventKind::AddrResolved);
//! ```

pub mod mad;

mod api;
mod bye;
pub mod cabi;
mod core;
mod ctl;
mod groups;
mod ids;
pub(crate) mod loopback;
mod sidr;

use crate::qp::Transport;
use std::net::SocketAddrV4;

pub use ids::CmCounters;
pub(crate) use ids::{CM_TIMER, Cm};

/// The CM response timeout softnic sends and waits for, as the IBTA encodes it
/// (4.096 us * 2^t: 18 is about 1.07 s; the kernel's rdma_cm uses 20, about 4.3 s).
pub const RESPONSE_TIMEOUT: u8 = 18;
/// How many times a REQ, REP or DREQ is sent again before the CM gives up (rdma_cm's 15).
pub const MAX_RETRIES: u8 = 15;
/// The local ACK timeout of the QPs the CM connects (4.096 us * 2^14, about 67 ms).
pub const QP_TIMEOUT: u8 = 14;

/// The nanoseconds of an IBTA time code.
pub(crate) fn ib_time_ns(code: u8) -> u64 {
    4096u64 << code.min(31)
}

/// An rdma_cm port space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PortSpace {
    /// `RDMA_PS_TCP`: reliable connections (RC QPs).
    Tcp,
    /// `RDMA_PS_UDP`: unreliable datagrams (UD QPs), resolved by SIDR.
    Udp,
    /// `RDMA_PS_IB`: any QP type in the kernel's CM; RC connections in softnic's. Its own
    /// ports and service IDs, otherwise as `RDMA_PS_TCP` (IPv4 addresses, a CMA header in the
    /// private data).
    Ib,
}

impl PortSpace {
    /// The port space's code, the upper half of its service IDs.
    pub fn code(self) -> u16 {
        match self {
            PortSpace::Tcp => mad::ps::TCP,
            PortSpace::Udp => mad::ps::UDP,
            PortSpace::Ib => mad::ps::IB,
        }
    }

    /// The port space of a code (`RDMA_PS_TCP` 0x0106, `RDMA_PS_UDP` 0x0111, `RDMA_PS_IB`
    /// 0x013f).
    pub fn from_code(code: u16) -> Option<PortSpace> {
        match code {
            mad::ps::TCP => Some(PortSpace::Tcp),
            mad::ps::UDP => Some(PortSpace::Udp),
            mad::ps::IB => Some(PortSpace::Ib),
            _ => None,
        }
    }

    /// The QPs its ids connect: UD (resolved by SIDR) or RC (REQ, REP, RTU).
    pub(crate) fn transport(self) -> Transport {
        match self {
            PortSpace::Udp => Transport::Ud,
            PortSpace::Tcp | PortSpace::Ib => Transport::Rc,
        }
    }
}

/// An event channel: a queue of [`CmEvent`]s and a file descriptor readable while it holds
/// any.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChannelId(pub u32);

/// A CM id (an `rdma_cm_id`): an address, a listener, or one end of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CmId(pub u32);

/// The kind of an event, numbered as `enum rdma_cm_event_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum CmEventKind {
    /// Address resolved: the id is on a device.
    AddrResolved = 0,
    /// Address resolution failed.
    AddrError = 1,
    /// Route resolved.
    RouteResolved = 2,
    /// Route resolution failed.
    RouteError = 3,
    /// A connection request to a listener; the event's id is the new id.
    ConnectRequest = 4,
    /// A REP to an id without a QP: the caller moves its QP and calls establish.
    ConnectResponse = 5,
    /// Connecting failed after the exchange began.
    ConnectError = 6,
    /// The peer did not answer (timeout), or SIDR found no service.
    Unreachable = 7,
    /// The peer rejected (status: the REJ's reason).
    Rejected = 8,
    /// The connection is up.
    Established = 9,
    /// The connection is down.
    Disconnected = 10,
    /// A multicast group was joined: the event's GID and parameters say where to send.
    MulticastJoin = 12,
    /// The connection's time-wait is over: its QP may be reused.
    TimewaitExit = 15,
}

/// Connection parameters (`struct rdma_conn_param`) and what a UD peer answered.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConnParam {
    /// RDMA READs this side answers at once (its QP's `max_dest_rd_atomic`).
    pub responder_resources: u8,
    /// RDMA READs this side issues at once (its QP's `max_rd_atomic`).
    pub initiator_depth: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// Transport retries.
    pub retry_count: u8,
    /// RNR retries (7: forever).
    pub rnr_retry_count: u8,
    /// Whether the QP uses an SRQ.
    pub srq: bool,
    /// The QP number (of the sender, in events: the peer's), when no QP is attached.
    pub qp_num: u32,
    /// The peer's Q_Key (UD).
    pub qkey: u32,
}

/// An event taken from a channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmEvent {
    /// What happened.
    pub kind: CmEventKind,
    /// The id it happened to (for a connection request: the new id).
    pub id: CmId,
    /// The listener, for a connection request.
    pub listen_id: Option<CmId>,
    /// 0, or a REJ reason (`Rejected`), or a negative errno (`-ETIMEDOUT`, `-EHOSTUNREACH`...).
    pub status: i32,
    /// The peer's private data (rdma_cm's IP header taken off a REQ's).
    pub private: Vec<u8>,
    /// The peer's parameters (connection request, established, connect response).
    pub param: ConnParam,
    /// The peer's GID (the address a UD sender sends to).
    pub peer_gid: [u8; 16],
    /// The id's local and remote addresses, for a connection request.
    pub addrs: Option<(SocketAddrV4, SocketAddrV4)>,
}

/// Why a CM call failed: the errno librdmacm would set, and what was being done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmError {
    /// The errno (EINVAL, EADDRINUSE, EHOSTUNREACH, ENODEV, EAGAIN...).
    pub errno: i32,
    /// What failed.
    pub what: &'static str,
}

impl std::fmt::Display for CmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let e = std::io::Error::from_raw_os_error(self.errno);
        write!(f, "{}: {e}", self.what)
    }
}

impl std::error::Error for CmError {}

pub(crate) fn err<T>(errno: i32, what: &'static str) -> Result<T, CmError> {
    Err(CmError { errno, what })
}
