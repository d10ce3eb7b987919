//! Transports and the attributes each transition takes for each of them (VERBS-SEMANTICS.md):
//!
//! | transport | RESET->INIT | INIT->RTR | RTR->RTS |
//! |---|---|---|---|
//! | UD | [`UdInit`] (Q_Key) | [`UdRtr`] (nothing) | [`SqPsn`] |
//! | UC | [`ConnInit`] (access) | [`UcRtr`] (AV, MTU, dest QPN, RQ PSN) | [`SqPsn`] |
//! | RC | [`ConnInit`] | [`RcRtr`] (+ read resources, RNR timer) | [`RcRts`] (+ timeout, retries) |

use ibverbs_sys::{ibv_qp_attr, ibv_qp_type};

use crate::context::{Gid, LocalPort, ah_attr};
use crate::error::{Error, Result};
use crate::flags::{AccessFlags, Mtu, QpAttrMask};

mod sealed {
    pub trait Sealed {}
}

/// Attributes of one transition: validated, then written into an `ibv_qp_attr`.
pub trait Attrs: sealed::Sealed {
    /// Checks the values and writes them; returns the mask bits written.
    #[doc(hidden)]
    fn apply(&self, a: &mut ibv_qp_attr) -> Result<QpAttrMask>;
}

/// A QP transport, known to the QP's type.
pub trait Transport: sealed::Sealed + Send + Sync + 'static {
    /// `ibv_qp_type`.
    const QP_TYPE: ibv_qp_type::Type;
    /// For messages.
    const NAME: &'static str;
    /// What RESET->INIT takes.
    type Init: Attrs;
    /// What INIT->RTR takes.
    type Rtr: Attrs;
    /// What RTR->RTS takes.
    type Rts: Attrs;
}

/// A connected transport (RC, UC): WRs name their peer by the connection, never by an address
/// handle, so RDMA WRITEs (and on RC, READs and atomics) can be posted on it.
pub trait Connected: Transport {}

impl Connected for Rc {}
impl Connected for Uc {}

/// Reliable connected.
#[derive(Debug)]
pub enum Rc {}
/// Unreliable connected.
#[derive(Debug)]
pub enum Uc {}
/// Unreliable datagram.
#[derive(Debug)]
pub enum Ud {}

impl sealed::Sealed for Rc {}
impl sealed::Sealed for Uc {}
impl sealed::Sealed for Ud {}

impl Transport for Rc {
    const QP_TYPE: ibv_qp_type::Type = ibv_qp_type::IBV_QPT_RC;
    const NAME: &'static str = "RC";
    type Init = ConnInit;
    type Rtr = RcRtr;
    type Rts = RcRts;
}

impl Transport for Uc {
    const QP_TYPE: ibv_qp_type::Type = ibv_qp_type::IBV_QPT_UC;
    const NAME: &'static str = "UC";
    type Init = ConnInit;
    type Rtr = UcRtr;
    type Rts = SqPsn;
}

impl Transport for Ud {
    const QP_TYPE: ibv_qp_type::Type = ibv_qp_type::IBV_QPT_UD;
    const NAME: &'static str = "UD";
    type Init = UdInit;
    type Rtr = UdRtr;
    type Rts = SqPsn;
}

fn range(name: &'static str, value: u64, max: u64, reason: &'static str) -> Result<()> {
    if value > max {
        Err(Error::InvalidAttr {
            name,
            value,
            reason,
        })
    } else {
        Ok(())
    }
}

fn psn(name: &'static str, value: u32) -> Result<u32> {
    range(name, value.into(), 0x00ff_ffff, "PSNs are 24 bits")?;
    Ok(value)
}

/// RESET->INIT of a connected QP (RC, UC): what peers may do to its memory.
///
/// The default grants peers nothing (least privilege): a QP that is to take RDMA WRITEs,
/// READs or atomics says so ([`ConnInit::with_access`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnInit {
    /// Remote access allowed through this QP (`REMOTE_WRITE`, `REMOTE_READ`, `REMOTE_ATOMIC`);
    /// each region's own access flags apply as well.
    pub access: AccessFlags,
    /// The port (1-based).
    pub port: u8,
    /// The P_Key index.
    pub pkey_index: u16,
}

impl Default for ConnInit {
    /// No remote access, port 1, P_Key index 0.
    fn default() -> Self {
        ConnInit {
            access: AccessFlags::empty(),
            port: 1,
            pkey_index: 0,
        }
    }
}

impl ConnInit {
    /// The default, allowing peers `access`.
    pub fn with_access(access: AccessFlags) -> Self {
        ConnInit {
            access,
            ..ConnInit::default()
        }
    }
}

impl sealed::Sealed for ConnInit {}
impl Attrs for ConnInit {
    fn apply(&self, a: &mut ibv_qp_attr) -> Result<QpAttrMask> {
        a.qp_access_flags = self.access.bits();
        a.port_num = self.port;
        a.pkey_index = self.pkey_index;
        Ok(QpAttrMask::ACCESS_FLAGS | QpAttrMask::PORT | QpAttrMask::PKEY_INDEX)
    }
}

/// RESET->INIT of a UD QP: its Q_Key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdInit {
    /// The Q_Key datagrams must carry to be accepted.
    pub qkey: u32,
    /// The port (1-based).
    pub port: u8,
    /// The P_Key index.
    pub pkey_index: u16,
}

impl UdInit {
    /// Port 1, P_Key index 0, Q_Key `qkey`.
    pub fn new(qkey: u32) -> Self {
        UdInit {
            qkey,
            port: 1,
            pkey_index: 0,
        }
    }
}

impl sealed::Sealed for UdInit {}
impl Attrs for UdInit {
    fn apply(&self, a: &mut ibv_qp_attr) -> Result<QpAttrMask> {
        range(
            "qkey",
            self.qkey.into(),
            0x7fff_ffff,
            "Q_Keys with the high bit set are reserved",
        )?;
        a.qkey = self.qkey;
        a.port_num = self.port;
        a.pkey_index = self.pkey_index;
        Ok(QpAttrMask::QKEY | QpAttrMask::PORT | QpAttrMask::PKEY_INDEX)
    }
}

/// The other end of a connection, as exchanged out of band.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remote {
    /// Its QP number.
    pub qpn: u32,
    /// The first PSN it will send (our receive PSN).
    pub psn: u32,
    /// Its port's LID: how InfiniBand routes inside a subnet (0 on RoCE, which routes by GID).
    pub lid: u16,
    /// Its GID: required on RoCE and between InfiniBand subnets; `None` routes by the LID
    /// alone (no GRH).
    pub gid: Option<Gid>,
}

fn path(a: &mut ibv_qp_attr, remote: &Remote, mtu: Mtu, from: LocalPort) -> Result<QpAttrMask> {
    range(
        "dest_qp_num",
        remote.qpn.into(),
        0x00ff_ffff,
        "QP numbers are 24 bits",
    )?;
    a.dest_qp_num = remote.qpn;
    a.rq_psn = psn("rq_psn", remote.psn)?;
    a.path_mtu = mtu as u32;
    a.ah_attr = ah_attr(from, remote.lid, remote.gid);
    Ok(QpAttrMask::AV | QpAttrMask::PATH_MTU | QpAttrMask::DEST_QPN | QpAttrMask::RQ_PSN)
}

/// INIT->RTR of an RC QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcRtr {
    /// The peer.
    pub remote: Remote,
    /// LocalPort MTU (at most the port's active MTU).
    pub path_mtu: Mtu,
    /// RDMA READs the peer may have outstanding at this QP.
    pub max_dest_rd_atomic: u8,
    /// The RNR NAK timer code (0-31) sent when no receive is posted.
    pub min_rnr_timer: u8,
    /// The local port and source GID the path leaves from.
    pub from: LocalPort,
}

impl RcRtr {
    /// Towards `remote` from `from` (the local port and GID index: on RoCE v2 the index of
    /// the port's RoCE v2 GID, often 1 or 3, see `show_gids`): MTU 1024, 16 outstanding READs
    /// and atomics, RNR timer 12 (0.64 ms).
    pub fn new(remote: Remote, from: LocalPort) -> Self {
        RcRtr {
            remote,
            path_mtu: Mtu::Mtu1024,
            max_dest_rd_atomic: 16,
            min_rnr_timer: 12,
            from,
        }
    }
}

impl sealed::Sealed for RcRtr {}
impl Attrs for RcRtr {
    fn apply(&self, a: &mut ibv_qp_attr) -> Result<QpAttrMask> {
        range(
            "min_rnr_timer",
            self.min_rnr_timer.into(),
            31,
            "the RNR timer code is 5 bits",
        )?;
        let mask = path(a, &self.remote, self.path_mtu, self.from)?;
        a.max_dest_rd_atomic = self.max_dest_rd_atomic;
        a.min_rnr_timer = self.min_rnr_timer;
        Ok(mask | QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER)
    }
}

/// INIT->RTR of a UC QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UcRtr {
    /// The peer.
    pub remote: Remote,
    /// LocalPort MTU.
    pub path_mtu: Mtu,
    /// The local port and source GID the path leaves from.
    pub from: LocalPort,
}

impl UcRtr {
    /// Towards `remote` from `from` (see [`RcRtr::new`]): MTU 1024.
    pub fn new(remote: Remote, from: LocalPort) -> Self {
        UcRtr {
            remote,
            path_mtu: Mtu::Mtu1024,
            from,
        }
    }
}

impl sealed::Sealed for UcRtr {}
impl Attrs for UcRtr {
    fn apply(&self, a: &mut ibv_qp_attr) -> Result<QpAttrMask> {
        path(a, &self.remote, self.path_mtu, self.from)
    }
}

/// INIT->RTR of a UD QP: nothing but the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UdRtr;

impl sealed::Sealed for UdRtr {}
impl Attrs for UdRtr {
    fn apply(&self, _: &mut ibv_qp_attr) -> Result<QpAttrMask> {
        Ok(QpAttrMask::empty())
    }
}

/// RTR->RTS of a UC or UD QP: the first PSN it sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SqPsn(pub u32);

impl sealed::Sealed for SqPsn {}
impl Attrs for SqPsn {
    fn apply(&self, a: &mut ibv_qp_attr) -> Result<QpAttrMask> {
        a.sq_psn = psn("sq_psn", self.0)?;
        Ok(QpAttrMask::SQ_PSN)
    }
}

/// RTR->RTS of an RC QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcRts {
    /// The first PSN it sends.
    pub sq_psn: u32,
    /// Local ACK timeout code: 4.096 us * 2^timeout (0: forever).
    pub timeout: u8,
    /// Retries after a timeout or sequence NAK (0-7).
    pub retry_cnt: u8,
    /// Retries after an RNR NAK (0-7, 7: forever).
    pub rnr_retry: u8,
    /// RDMA READs and atomics this QP may have outstanding.
    pub max_rd_atomic: u8,
}

impl RcRts {
    /// Starting at `sq_psn`: timeout 14 (67 ms), 7 retries, RNR retries forever, 16 READs.
    pub fn new(sq_psn: u32) -> Self {
        RcRts {
            sq_psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 16,
        }
    }
}

impl sealed::Sealed for RcRts {}
impl Attrs for RcRts {
    fn apply(&self, a: &mut ibv_qp_attr) -> Result<QpAttrMask> {
        range(
            "timeout",
            self.timeout.into(),
            31,
            "the timeout code is 5 bits",
        )?;
        range(
            "retry_cnt",
            self.retry_cnt.into(),
            7,
            "the retry count is 3 bits",
        )?;
        range(
            "rnr_retry",
            self.rnr_retry.into(),
            7,
            "the RNR retry count is 3 bits",
        )?;
        a.sq_psn = psn("sq_psn", self.sq_psn)?;
        a.timeout = self.timeout;
        a.retry_cnt = self.retry_cnt;
        a.rnr_retry = self.rnr_retry;
        a.max_rd_atomic = self.max_rd_atomic;
        Ok(QpAttrMask::SQ_PSN
            | QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::MAX_QP_RD_ATOMIC)
    }
}
