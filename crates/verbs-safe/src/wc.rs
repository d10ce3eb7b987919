//! Work completions, typed: [`Completion`] is a successful [`Success`] (opcode, length,
//! immediate data) or a [`Failure`] (status, QP number and vendor error only), with the status
//! and opcode as enums ([`WcStatus`], [`WcOpcode`]) and a safe post's buffers given back.

use ibverbs_sys::{ibv_wc, ibv_wc_flags, ibv_wc_opcode as op, ibv_wc_status as st};
use softnic::Wc;

use crate::error::{Error, Result};
use crate::memory::MrBuf;

/// The status of a work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(missing_docs)] // the IBV_WC_* names say it
pub enum WcStatus {
    Success,
    LocLenErr,
    LocQpOpErr,
    LocEecOpErr,
    LocProtErr,
    WrFlushErr,
    MwBindErr,
    BadRespErr,
    LocAccessErr,
    RemInvReqErr,
    RemAccessErr,
    RemOpErr,
    RetryExcErr,
    RnrRetryExcErr,
    LocRddViolErr,
    RemInvRdReqErr,
    RemAbortErr,
    InvEecnErr,
    InvEecStateErr,
    FatalErr,
    RespTimeoutErr,
    GeneralErr,
}

impl TryFrom<u32> for WcStatus {
    type Error = Error;
    fn try_from(v: u32) -> Result<Self> {
        use WcStatus::*;
        Ok(match v {
            st::IBV_WC_SUCCESS => Success,
            st::IBV_WC_LOC_LEN_ERR => LocLenErr,
            st::IBV_WC_LOC_QP_OP_ERR => LocQpOpErr,
            st::IBV_WC_LOC_EEC_OP_ERR => LocEecOpErr,
            st::IBV_WC_LOC_PROT_ERR => LocProtErr,
            st::IBV_WC_WR_FLUSH_ERR => WrFlushErr,
            st::IBV_WC_MW_BIND_ERR => MwBindErr,
            st::IBV_WC_BAD_RESP_ERR => BadRespErr,
            st::IBV_WC_LOC_ACCESS_ERR => LocAccessErr,
            st::IBV_WC_REM_INV_REQ_ERR => RemInvReqErr,
            st::IBV_WC_REM_ACCESS_ERR => RemAccessErr,
            st::IBV_WC_REM_OP_ERR => RemOpErr,
            st::IBV_WC_RETRY_EXC_ERR => RetryExcErr,
            st::IBV_WC_RNR_RETRY_EXC_ERR => RnrRetryExcErr,
            st::IBV_WC_LOC_RDD_VIOL_ERR => LocRddViolErr,
            st::IBV_WC_REM_INV_RD_REQ_ERR => RemInvRdReqErr,
            st::IBV_WC_REM_ABORT_ERR => RemAbortErr,
            st::IBV_WC_INV_EECN_ERR => InvEecnErr,
            st::IBV_WC_INV_EEC_STATE_ERR => InvEecStateErr,
            st::IBV_WC_FATAL_ERR => FatalErr,
            st::IBV_WC_RESP_TIMEOUT_ERR => RespTimeoutErr,
            st::IBV_WC_GENERAL_ERR => GeneralErr,
            other => return Err(Error::UnknownStatus(other)),
        })
    }
}

/// What a successful work completion completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WcOpcode {
    /// A SEND (with or without immediate) left.
    Send,
    /// An RDMA WRITE (with or without immediate) completed.
    RdmaWrite,
    /// An RDMA READ completed.
    RdmaRead,
    /// An atomic compare-and-swap completed.
    CompSwap,
    /// An atomic fetch-and-add completed.
    FetchAdd,
    /// A memory-window bind completed.
    BindMw,
    /// A local invalidate completed.
    LocalInv,
    /// A SEND arrived in a receive WQE.
    Recv,
    /// An RDMA WRITE with immediate arrived (consuming a receive WQE).
    RecvRdmaWithImm,
}

impl TryFrom<u32> for WcOpcode {
    type Error = Error;
    fn try_from(v: u32) -> Result<Self> {
        use WcOpcode::*;
        Ok(match v {
            op::IBV_WC_SEND => Send,
            op::IBV_WC_RDMA_WRITE => RdmaWrite,
            op::IBV_WC_RDMA_READ => RdmaRead,
            op::IBV_WC_COMP_SWAP => CompSwap,
            op::IBV_WC_FETCH_ADD => FetchAdd,
            op::IBV_WC_BIND_MW => BindMw,
            op::IBV_WC_LOCAL_INV => LocalInv,
            op::IBV_WC_RECV => Recv,
            op::IBV_WC_RECV_RDMA_WITH_IMM => RecvRdmaWithImm,
            other => return Err(Error::UnknownOpcode(other)),
        })
    }
}

/// A completion, successful or failed. Only the fields valid for its kind are reachable: a
/// failed completion has no opcode, length or immediate data. A completion of a safe post
/// reports the caller's `wr_id` and gives back the buffers the post took
/// ([`take_bufs`](Self::take_bufs)).
#[derive(Debug)]
pub struct Completion<'a> {
    pub(crate) wc: &'a Wc,
    pub(crate) wr_id: u64,
    pub(crate) bufs: Vec<MrBuf>,
}

/// A successful completion.
#[derive(Debug, Clone, Copy)]
pub struct Success<'a> {
    wc: &'a Wc,
    wr_id: u64,
}

/// A failed completion: `wr_id`, status, QP number and vendor error only.
#[derive(Debug, Clone, Copy)]
pub struct Failure<'a> {
    wc: &'a Wc,
    wr_id: u64,
}

impl<'a> Completion<'a> {
    /// Views a C work completion (its `wr_id` as it is).
    pub fn new(wc: &'a ibv_wc) -> Completion<'a> {
        let wc = Wc::from_ibv(wc);
        Completion {
            wc,
            wr_id: wc.wr_id,
            bufs: Vec::new(),
        }
    }

    /// The WR's id: the one the caller gave (for a WR that carried a [`CompletionContext`](crate::CompletionContext),
    /// that context's [`wr_id`](crate::CompletionContext::wr_id)).
    pub fn wr_id(&self) -> u64 {
        self.wr_id
    }

    /// The local QP number.
    pub fn qp_num(&self) -> u32 {
        self.wc.qp_num
    }

    /// Whether it succeeded.
    pub fn is_ok(&self) -> bool {
        self.wc.status == st::IBV_WC_SUCCESS
    }

    /// The status.
    pub fn status(&self) -> Result<WcStatus> {
        WcStatus::try_from(self.wc.status)
    }

    /// The successful completion, or the failed one as the error.
    pub fn ok(&self) -> std::result::Result<Success<'a>, Failure<'a>> {
        let (wc, wr_id) = (self.wc, self.wr_id);
        if self.is_ok() {
            Ok(Success { wc, wr_id })
        } else {
            Err(Failure { wc, wr_id })
        }
    }

    /// The buffers a safe post moved in (receive buffers, READ and atomic targets), given back
    /// now that the NIC is done with them, in the order the WR named them. Empty for other
    /// completions, and after the first call.
    pub fn take_bufs(&mut self) -> Vec<MrBuf> {
        std::mem::take(&mut self.bufs)
    }
}

impl Success<'_> {
    /// The WR's id.
    pub fn wr_id(&self) -> u64 {
        self.wr_id
    }
    /// The local QP number (on a shared CQ, which QP this was).
    pub fn qp_num(&self) -> u32 {
        self.wc.qp_num
    }
    /// What completed.
    pub fn opcode(&self) -> Result<WcOpcode> {
        WcOpcode::try_from(self.wc.opcode)
    }
    /// Bytes transferred (a UD receive counts the 40-byte GRH).
    pub fn byte_len(&self) -> u32 {
        self.wc.byte_len
    }
    /// The immediate data, in host order, if the message carried one.
    pub fn imm(&self) -> Option<u32> {
        (self.wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0)
            .then(|| u32::from_be(self.wc.imm_data))
    }
    /// The sending QP (UD receives).
    pub fn src_qp(&self) -> u32 {
        self.wc.src_qp
    }
    /// Whether a GRH fills the first 40 bytes of the receive buffer (UD).
    pub fn has_grh(&self) -> bool {
        self.wc.wc_flags & ibv_wc_flags::IBV_WC_GRH.0 != 0
    }
}

impl Failure<'_> {
    /// The WR's id.
    pub fn wr_id(&self) -> u64 {
        self.wr_id
    }
    /// The local QP number.
    pub fn qp_num(&self) -> u32 {
        self.wc.qp_num
    }
    /// Why it failed.
    pub fn status(&self) -> Result<WcStatus> {
        WcStatus::try_from(self.wc.status)
    }
    /// The vendor's error syndrome.
    pub fn vendor_err(&self) -> u32 {
        self.wc.vendor_err
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_values_are_errors_not_panics() {
        assert!(matches!(
            WcStatus::try_from(999),
            Err(Error::UnknownStatus(999))
        ));
        assert!(matches!(
            WcOpcode::try_from(77),
            Err(Error::UnknownOpcode(77))
        ));
        assert_eq!(
            WcStatus::try_from(st::IBV_WC_RETRY_EXC_ERR).unwrap(),
            WcStatus::RetryExcErr
        );
        assert_eq!(
            WcOpcode::try_from(op::IBV_WC_RECV_RDMA_WITH_IMM).unwrap(),
            WcOpcode::RecvRdmaWithImm
        );
    }

    #[test]
    fn failed_completions_expose_only_valid_fields() {
        let wc = Wc {
            wr_id: 5,
            status: st::IBV_WC_WR_FLUSH_ERR,
            opcode: 99,
            byte_len: 1234,
            qp_num: 7,
            vendor_err: 3,
            ..Wc::default()
        }
        .to_ibv();
        let c = Completion::new(&wc);
        assert!(!c.is_ok());
        let f = c.ok().unwrap_err();
        assert_eq!((f.wr_id(), f.qp_num(), f.vendor_err()), (5, 7, 3));
        assert_eq!(f.status().unwrap(), WcStatus::WrFlushErr);
    }
}
