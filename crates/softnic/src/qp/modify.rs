//! `modify_qp` and `query_qp`: the transitions of the QP state machine, with the attribute masks
//! each needs per transport (the kernel's `qp_state_table`, which rxe enforces too).
//!
//! An invalid modify changes nothing (not even the state) and returns EINVAL.

use ibverbs_sys::{ibv_access_flags, ibv_qp_attr, ibv_qp_attr_mask, ibv_qp_state, ibv_qp_type};

use super::{Qp, Transport, mtu_bytes};
use crate::link::Dest;
use crate::packet::PSN_MASK;
use crate::state::World;
use crate::xrc::Role;

const STATE: u32 = ibv_qp_attr_mask::IBV_QP_STATE.0;
const CUR_STATE: u32 = ibv_qp_attr_mask::IBV_QP_CUR_STATE.0;
const EN_SQD_ASYNC_NOTIFY: u32 = ibv_qp_attr_mask::IBV_QP_EN_SQD_ASYNC_NOTIFY.0;
const ACCESS_FLAGS: u32 = ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS.0;
const PKEY_INDEX: u32 = ibv_qp_attr_mask::IBV_QP_PKEY_INDEX.0;
const PORT: u32 = ibv_qp_attr_mask::IBV_QP_PORT.0;
const QKEY: u32 = ibv_qp_attr_mask::IBV_QP_QKEY.0;
const AV: u32 = ibv_qp_attr_mask::IBV_QP_AV.0;
const PATH_MTU: u32 = ibv_qp_attr_mask::IBV_QP_PATH_MTU.0;
const TIMEOUT: u32 = ibv_qp_attr_mask::IBV_QP_TIMEOUT.0;
const RETRY_CNT: u32 = ibv_qp_attr_mask::IBV_QP_RETRY_CNT.0;
const RNR_RETRY: u32 = ibv_qp_attr_mask::IBV_QP_RNR_RETRY.0;
const RQ_PSN: u32 = ibv_qp_attr_mask::IBV_QP_RQ_PSN.0;
const MAX_QP_RD_ATOMIC: u32 = ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC.0;
const ALT_PATH: u32 = ibv_qp_attr_mask::IBV_QP_ALT_PATH.0;
const MIN_RNR_TIMER: u32 = ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER.0;
const SQ_PSN: u32 = ibv_qp_attr_mask::IBV_QP_SQ_PSN.0;
const MAX_DEST_RD_ATOMIC: u32 = ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC.0;
const PATH_MIG_STATE: u32 = ibv_qp_attr_mask::IBV_QP_PATH_MIG_STATE.0;
const DEST_QPN: u32 = ibv_qp_attr_mask::IBV_QP_DEST_QPN.0;
/// The responder's attributes, which an XRC initiator has none of, and the requester's, which
/// an XRC target has none of.
const RESPONDER: u32 = MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER;
const REQUESTER: u32 = RETRY_CNT | RNR_RETRY | MAX_QP_RD_ATOMIC;

/// The attribute masks of a transition: `(required, optional)` for `qp_type`, or `None` if the
/// transition `cur -> next` does not exist (or the type is not RC, UC, UD or XRC's).
/// `IBV_QP_STATE` is implied and in neither mask. XRC's are RC's, but that an initiator
/// (which takes no requests) neither needs nor takes the responder's attributes, and a target
/// (which sends no requests) the requester's (the kernel's table).
pub fn check_transition(
    cur: ibv_qp_state::Type,
    next: ibv_qp_state::Type,
    qp_type: ibv_qp_type::Type,
) -> Option<(u32, u32)> {
    use ibv_qp_state::*;
    let t = match qp_type {
        ibv_qp_type::IBV_QPT_UD => 0,
        ibv_qp_type::IBV_QPT_UC => 1,
        ibv_qp_type::IBV_QPT_RC => 2,
        ibv_qp_type::IBV_QPT_XRC_SEND => 3,
        ibv_qp_type::IBV_QPT_XRC_RECV => 4,
        _ => return None,
    };
    // Per transport: [UD, UC, RC, XRC initiator, XRC target].
    let by = |ud: u32, uc: u32, rc: u32| [ud, uc, rc, rc & !RESPONDER, rc & !REQUESTER][t];
    let none = (0, 0);
    let uc_rc_init = PKEY_INDEX | PORT | ACCESS_FLAGS;
    let to_rts_opt = by(
        CUR_STATE | QKEY,
        CUR_STATE | ALT_PATH | ACCESS_FLAGS | PATH_MIG_STATE,
        CUR_STATE | ALT_PATH | ACCESS_FLAGS | PATH_MIG_STATE | MIN_RNR_TIMER,
    );
    Some(match (cur, next) {
        (_, IBV_QPS_RESET) if cur <= IBV_QPS_ERR => none,
        (IBV_QPS_RESET, IBV_QPS_INIT) => (by(PKEY_INDEX | PORT | QKEY, uc_rc_init, uc_rc_init), 0),
        (IBV_QPS_INIT..=IBV_QPS_ERR, IBV_QPS_ERR) => none,
        (IBV_QPS_INIT, IBV_QPS_INIT) => (0, by(PKEY_INDEX | PORT | QKEY, uc_rc_init, uc_rc_init)),
        (IBV_QPS_INIT, IBV_QPS_RTR) => {
            let uc = AV | PATH_MTU | DEST_QPN | RQ_PSN;
            let opt = ALT_PATH | ACCESS_FLAGS | PKEY_INDEX;
            (
                by(0, uc, uc | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER),
                by(PKEY_INDEX | QKEY, opt, opt),
            )
        }
        (IBV_QPS_RTR, IBV_QPS_RTS) => (
            by(
                SQ_PSN,
                SQ_PSN,
                TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC,
            ),
            to_rts_opt,
        ),
        (IBV_QPS_RTS | IBV_QPS_SQD, IBV_QPS_RTS) => (0, to_rts_opt),
        (IBV_QPS_RTS, IBV_QPS_SQD) => (0, EN_SQD_ASYNC_NOTIFY),
        (IBV_QPS_SQD, IBV_QPS_SQD) => (
            0,
            by(
                PKEY_INDEX | QKEY,
                AV | ALT_PATH | ACCESS_FLAGS | PKEY_INDEX | PATH_MIG_STATE,
                PORT | AV
                    | TIMEOUT
                    | RETRY_CNT
                    | RNR_RETRY
                    | MAX_QP_RD_ATOMIC
                    | MAX_DEST_RD_ATOMIC
                    | ALT_PATH
                    | ACCESS_FLAGS
                    | PKEY_INDEX
                    | MIN_RNR_TIMER
                    | PATH_MIG_STATE,
            ),
        ),
        (IBV_QPS_SQE, IBV_QPS_RTS) => (0, by(CUR_STATE | QKEY, CUR_STATE | ACCESS_FLAGS, 0)),
        _ => return None,
    })
}

/// The access flags a QP takes: every flag of `ibv_access_flags`, the regions' ones too, which
/// the kernel passes on and ConnectX ignores (programs give a QP the flags of their regions,
/// `IBV_ACCESS_ON_DEMAND` among them); only the remote ones mean anything to a QP.
const KNOWN_ACCESS: u32 = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
    | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
    | ibv_access_flags::IBV_ACCESS_REMOTE_READ.0
    | ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0
    | ibv_access_flags::IBV_ACCESS_MW_BIND.0
    | ibv_access_flags::IBV_ACCESS_ZERO_BASED.0
    | ibv_access_flags::IBV_ACCESS_ON_DEMAND.0
    | ibv_access_flags::IBV_ACCESS_HUGETLB.0
    | ibv_access_flags::IBV_ACCESS_FLUSH_GLOBAL.0
    | ibv_access_flags::IBV_ACCESS_FLUSH_PERSISTENT.0
    | ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING.0
    // rdma-core's IBV_ACCESS_OPTIONAL_RANGE (flags a kernel without them masks off).
    | 0x3ff0_0000;

impl Qp {
    pub(crate) fn qp_type(&self) -> ibv_qp_type::Type {
        match (self.transport, self.xrc) {
            (_, Some(Role::Initiator)) => ibv_qp_type::IBV_QPT_XRC_SEND,
            (_, Some(Role::Target { .. })) => ibv_qp_type::IBV_QPT_XRC_RECV,
            (Transport::Rc, None) => ibv_qp_type::IBV_QPT_RC,
            (Transport::Uc, None) => ibv_qp_type::IBV_QPT_UC,
            (Transport::Ud, None) => ibv_qp_type::IBV_QPT_UD,
        }
    }

    /// `ibv_modify_qp`: 0, EINVAL, EOPNOTSUPP (a mask bit from `IBV_QP_RATE_LIMIT` on, which
    /// libibverbs' `ibv_cmd_modify_qp` refuses: the rate limit has a verb of its own), or
    /// ENETUNREACH (an address vector toward a GID the link cannot reach). On an error nothing
    /// has changed. An XRC QP's attributes of the side it does not have are ignored, as the
    /// kernel's `modify_qp_mask` drops them (programs such as perftest set RC's for both).
    pub(crate) fn modify(&mut self, w: &mut World, attr: &ibv_qp_attr, mask: u32) -> i32 {
        if mask & !(ibv_qp_attr_mask::IBV_QP_RATE_LIMIT.0 - 1) != 0 {
            return libc::EOPNOTSUPP;
        }
        let mask = match self.xrc {
            None => mask,
            Some(Role::Initiator) => mask & !RESPONDER,
            Some(Role::Target { .. }) => mask & !REQUESTER,
        };
        if self.validate(w, attr, mask).is_err() {
            return libc::EINVAL;
        }
        if mask & AV != 0 {
            let dgid = crate::abi::gid_bytes(&attr.ah_attr.grh.dgid);
            if let Err(e) = reachable(w, self.dev, &dgid) {
                return e;
            }
        }
        self.apply(w, attr, mask);
        0
    }

    fn validate(&self, w: &World, a: &ibv_qp_attr, mask: u32) -> Result<(), ()> {
        use ibv_qp_state::*;
        let cur = self.state;
        let next = if mask & STATE != 0 { a.qp_state } else { cur };
        if mask & CUR_STATE != 0
            && (a.cur_qp_state != cur
                || !matches!(cur, IBV_QPS_RTR | IBV_QPS_RTS | IBV_QPS_SQD | IBV_QPS_SQE))
        {
            return Err(());
        }
        let (req, opt) = check_transition(cur, next, self.qp_type()).ok_or(())?;
        if mask & req != req || mask & !(req | opt | STATE) != 0 {
            return Err(());
        }
        let has = |bit: u32| mask & bit != 0;
        let bad = (has(PORT) && a.port_num != 1)
            || (has(PKEY_INDEX) && a.pkey_index != 0)
            || (has(ACCESS_FLAGS) && a.qp_access_flags & !KNOWN_ACCESS != 0)
            || (has(PATH_MTU) && !(1..=5).contains(&a.path_mtu))
            || (has(PATH_MTU) && mtu_bytes(a.path_mtu) > w.cfg.mtu)
            || (has(AV)
                && (a.ah_attr.is_global != 1
                    || a.ah_attr.port_num != 1
                    || usize::from(a.ah_attr.grh.sgid_index)
                        >= w.devices[self.dev].gids().count()))
            || (has(DEST_QPN) && a.dest_qp_num > 0x00ff_ffff)
            || (has(TIMEOUT) && a.timeout > 31)
            || (has(RETRY_CNT) && a.retry_cnt > 7)
            || (has(RNR_RETRY) && a.rnr_retry > 7)
            || (has(MIN_RNR_TIMER) && a.min_rnr_timer > 31)
            || (has(MAX_QP_RD_ATOMIC) && u32::from(a.max_rd_atomic) > w.cfg.max_rd_atomic)
            || (has(MAX_DEST_RD_ATOMIC) && u32::from(a.max_dest_rd_atomic) > w.cfg.max_rd_atomic)
            || has(ALT_PATH)
            || has(PATH_MIG_STATE);
        if bad { Err(()) } else { Ok(()) }
    }

    fn apply(&mut self, w: &mut World, a: &ibv_qp_attr, mask: u32) {
        use ibv_qp_state::*;
        let has = |bit: u32| mask & bit != 0;
        let t = &mut self.attr;
        if has(ACCESS_FLAGS) {
            t.qp_access_flags = a.qp_access_flags;
        }
        if has(PKEY_INDEX) {
            t.pkey_index = a.pkey_index;
        }
        if has(PORT) {
            t.port_num = a.port_num;
        }
        if has(QKEY) {
            t.qkey = a.qkey;
        }
        if has(AV) {
            t.ah_attr = a.ah_attr;
        }
        if has(PATH_MTU) {
            t.path_mtu = a.path_mtu;
        }
        if has(TIMEOUT) {
            t.timeout = a.timeout;
        }
        if has(RETRY_CNT) {
            t.retry_cnt = a.retry_cnt;
        }
        if has(RNR_RETRY) {
            t.rnr_retry = a.rnr_retry;
        }
        if has(MIN_RNR_TIMER) {
            t.min_rnr_timer = a.min_rnr_timer;
        }
        if has(MAX_QP_RD_ATOMIC) {
            t.max_rd_atomic = a.max_rd_atomic;
        }
        if has(MAX_DEST_RD_ATOMIC) {
            t.max_dest_rd_atomic = a.max_dest_rd_atomic;
        }
        if has(DEST_QPN) {
            t.dest_qp_num = a.dest_qp_num;
        }
        if has(EN_SQD_ASYNC_NOTIFY) {
            t.en_sqd_async_notify = a.en_sqd_async_notify;
        }
        if has(RQ_PSN) {
            t.rq_psn = a.rq_psn & PSN_MASK;
            self.resp.epsn = t.rq_psn;
            self.resp.ack_psn = t.rq_psn;
        }
        if has(SQ_PSN) {
            t.sq_psn = a.sq_psn & PSN_MASK;
            self.req.psn = t.sq_psn;
            self.req.psn_high = t.sq_psn;
            self.req.comp_psn = t.sq_psn;
        }
        if has(AV) {
            let dgid = crate::abi::gid_bytes(&self.attr.ah_attr.grh.dgid);
            self.dest_dev = w.route(self.dev, &dgid);
            self.peer_gid = match self.dest_dev {
                Some(Dest::Local(d)) => Some(w.devices[d].gid),
                Some(Dest::Udp(to)) => Some(crate::roce::ipv4_gid(*to.ip())),
                None => None,
            };
        }
        if has(RETRY_CNT) || has(RNR_RETRY) {
            self.req.retry_cnt = self.attr.retry_cnt;
            self.req.rnr_retry = self.attr.rnr_retry;
        }
        if !has(STATE) || a.qp_state == self.state {
            return;
        }
        match a.qp_state {
            IBV_QPS_RESET => self.reset(w),
            IBV_QPS_ERR => self.move_to_error(w),
            next => {
                if next == IBV_QPS_RTS {
                    self.req.sqd_notified = false;
                    self.wake(w);
                }
                self.state = next;
                self.set_shell_state();
                if next == IBV_QPS_SQD {
                    self.note_drained(w);
                }
            }
        }
    }
}

/// Whether device `dev`'s link carries packets to `dgid`, as the kernel's address resolution
/// of a RoCE device finds out when a QP is given an address vector (rdma-core programs print a
/// routing diagnostic on its error): on the UDP link the GID must name an IPv4 address (the
/// wire is IPv4: an IPv4-mapped GID or softnic's `fe80::ffff:a.b.c.d`) to which the host has a
/// route from the device's address; else ENETUNREACH. The kernel's other answer, ETIMEDOUT
/// when no neighbour answers, has no counterpart: UDP finds no neighbour, RC's retries find a
/// silent peer. A device of this fabric is always reached; on the in-process network a GID of
/// no device is accepted, as before, its packets lost.
fn reachable(w: &World, dev: usize, dgid: &[u8; 16]) -> Result<(), i32> {
    let Some(port) = w.devices[dev].udp.as_ref() else {
        return Ok(());
    };
    if w.devices.iter().any(|d| d.gids().any(|g| &g == dgid)) {
        return Ok(());
    }
    let ip = crate::roce::gid_address(dgid).ok_or(libc::ENETUNREACH)?;
    // Connecting a datagram socket bound to the device's address looks the route up (a
    // loopback source toward another host has none: EINVAL) and sends nothing.
    std::net::UdpSocket::bind((port.ip, 0))
        .and_then(|s| s.connect((ip, crate::roce::UDP_PORT)))
        .map_err(|_| libc::ENETUNREACH)
}
