//! Typed flags and small enums over the libibverbs integer constants.

use ibverbs_sys::{ibv_access_flags, ibv_qp_attr_mask};

bitflags::bitflags! {
    /// Memory and QP access flags (`IBV_ACCESS_*`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AccessFlags: u32 {
        /// The local NIC may write (needed for receive buffers and READ targets).
        const LOCAL_WRITE = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        /// Peers may RDMA WRITE (requires `LOCAL_WRITE`).
        const REMOTE_WRITE = ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        /// Peers may RDMA READ.
        const REMOTE_READ = ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
        /// Peers may use atomics (requires `LOCAL_WRITE`).
        const REMOTE_ATOMIC = ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;
        /// Memory windows may be bound to the region ([`Qp::bind_mw`](crate::Qp::bind_mw)):
        /// it grants no remote access itself, its windows do.
        const MW_BIND = ibv_access_flags::IBV_ACCESS_MW_BIND.0;
    }
}

impl AccessFlags {
    /// Every flag that lets a peer reach memory: `REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC`.
    pub const fn remote() -> AccessFlags {
        AccessFlags::REMOTE_WRITE
            .union(AccessFlags::REMOTE_READ)
            .union(AccessFlags::REMOTE_ATOMIC)
    }
}

bitflags::bitflags! {
    /// `ibv_modify_qp` attribute mask bits (`IBV_QP_*`), named in errors.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct QpAttrMask: u32 {
        /// `IBV_QP_STATE`.
        const STATE = ibv_qp_attr_mask::IBV_QP_STATE.0;
        /// `IBV_QP_CUR_STATE`.
        const CUR_STATE = ibv_qp_attr_mask::IBV_QP_CUR_STATE.0;
        /// `IBV_QP_EN_SQD_ASYNC_NOTIFY`.
        const EN_SQD_ASYNC_NOTIFY = ibv_qp_attr_mask::IBV_QP_EN_SQD_ASYNC_NOTIFY.0;
        /// `IBV_QP_ACCESS_FLAGS`.
        const ACCESS_FLAGS = ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS.0;
        /// `IBV_QP_PKEY_INDEX`.
        const PKEY_INDEX = ibv_qp_attr_mask::IBV_QP_PKEY_INDEX.0;
        /// `IBV_QP_PORT`.
        const PORT = ibv_qp_attr_mask::IBV_QP_PORT.0;
        /// `IBV_QP_QKEY`.
        const QKEY = ibv_qp_attr_mask::IBV_QP_QKEY.0;
        /// `IBV_QP_AV`.
        const AV = ibv_qp_attr_mask::IBV_QP_AV.0;
        /// `IBV_QP_PATH_MTU`.
        const PATH_MTU = ibv_qp_attr_mask::IBV_QP_PATH_MTU.0;
        /// `IBV_QP_TIMEOUT`.
        const TIMEOUT = ibv_qp_attr_mask::IBV_QP_TIMEOUT.0;
        /// `IBV_QP_RETRY_CNT`.
        const RETRY_CNT = ibv_qp_attr_mask::IBV_QP_RETRY_CNT.0;
        /// `IBV_QP_RNR_RETRY`.
        const RNR_RETRY = ibv_qp_attr_mask::IBV_QP_RNR_RETRY.0;
        /// `IBV_QP_RQ_PSN`.
        const RQ_PSN = ibv_qp_attr_mask::IBV_QP_RQ_PSN.0;
        /// `IBV_QP_MAX_QP_RD_ATOMIC`.
        const MAX_QP_RD_ATOMIC = ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC.0;
        /// `IBV_QP_ALT_PATH`.
        const ALT_PATH = ibv_qp_attr_mask::IBV_QP_ALT_PATH.0;
        /// `IBV_QP_MIN_RNR_TIMER`.
        const MIN_RNR_TIMER = ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER.0;
        /// `IBV_QP_SQ_PSN`.
        const SQ_PSN = ibv_qp_attr_mask::IBV_QP_SQ_PSN.0;
        /// `IBV_QP_MAX_DEST_RD_ATOMIC`.
        const MAX_DEST_RD_ATOMIC = ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC.0;
        /// `IBV_QP_PATH_MIG_STATE`.
        const PATH_MIG_STATE = ibv_qp_attr_mask::IBV_QP_PATH_MIG_STATE.0;
        /// `IBV_QP_CAP`.
        const CAP = ibv_qp_attr_mask::IBV_QP_CAP.0;
        /// `IBV_QP_DEST_QPN`.
        const DEST_QPN = ibv_qp_attr_mask::IBV_QP_DEST_QPN.0;
    }
}

/// A path MTU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    #[default]
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl Mtu {
    /// The MTU in bytes.
    pub fn bytes(self) -> u32 {
        128 << (self as u32)
    }

    /// The MTU of an `ibv_mtu` value.
    pub fn from_raw(raw: u32) -> Option<Mtu> {
        Some(match raw {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            4 => Mtu::Mtu2048,
            5 => Mtu::Mtu4096,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_round_trips() {
        for m in [
            Mtu::Mtu256,
            Mtu::Mtu512,
            Mtu::Mtu1024,
            Mtu::Mtu2048,
            Mtu::Mtu4096,
        ] {
            assert_eq!(Mtu::from_raw(m as u32), Some(m));
        }
        assert_eq!(Mtu::Mtu4096.bytes(), 4096);
        assert_eq!(Mtu::from_raw(9), None);
    }

    #[test]
    fn masks_name_their_bits() {
        let m = QpAttrMask::from_bits_truncate(
            ibv_qp_attr_mask::IBV_QP_QKEY.0 | ibv_qp_attr_mask::IBV_QP_PORT.0,
        );
        let s = format!("{m:?}");
        assert!(s.contains("QKEY") && s.contains("PORT"), "{s}");
    }
}
