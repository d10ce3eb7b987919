//! Shared receive queues and the receive WQE they (and plain receive queues) hold.

use std::collections::VecDeque;

use ibverbs_sys::ibv_srq;

use crate::abi::Shell;
use crate::state::{Element, World};

/// A posted receive: where an incoming message goes.
#[derive(Debug, Clone)]
pub(crate) struct RecvWqe {
    pub(crate) wr_id: u64,
    pub(crate) sges: crate::qp::SgeList,
}

impl RecvWqe {
    pub(crate) fn capacity(&self) -> u64 {
        self.sges.iter().map(|s| u64::from(s.length)).sum()
    }
}

pub(crate) struct Srq {
    pub(crate) ctx: u32,
    pub(crate) pd: u32,
    pub(crate) max_wr: u32,
    pub(crate) max_sge: u32,
    /// Armed limit (0: disarmed).
    pub(crate) limit: u32,
    /// Its number on its device (`ibv_get_srq_num`).
    pub(crate) srqn: u32,
    /// An XRC SRQ's domain and CQ (`None`: a basic SRQ).
    pub(crate) xrc: Option<crate::xrc::XrcSrq>,
    pub(crate) wqes: VecDeque<RecvWqe>,
    /// WQEs consumed whose completion has not been polled yet (they still hold a slot).
    pub(crate) unreclaimed: u32,
    /// Async events about the SRQ that `get_async_event` handed out (acknowledged ones are
    /// counted in its shell's `events_completed`).
    pub(crate) events_reported: u32,
    pub(crate) shell: Shell<ibv_srq>,
}

impl World {
    /// Takes the next receive WQE of SRQ `srq`; fires the one-shot limit event when the number
    /// of posted WQEs drops below an armed limit.
    #[inline(always)]
    pub(crate) fn take_srq_wqe(&mut self, srq: u32) -> Option<RecvWqe> {
        let s = self.srqs.get_mut(&srq)?;
        let wqe = s.wqes.pop_front()?;
        s.unreclaimed += 1;
        if s.limit > 0 && (s.wqes.len() as u32) < s.limit {
            s.limit = 0;
            let ctx = s.ctx;
            self.async_event(
                ctx,
                ibverbs_sys::IBV_EVENT_SRQ_LIMIT_REACHED,
                Element::Srq(srq),
            );
        }
        Some(wqe)
    }
}
