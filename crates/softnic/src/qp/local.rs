//! Local operations: the work requests the requester executes itself, in send-queue order,
//! without a packet (rxe's `rxe_do_local_ops`): BIND_MW binds a memory window, LOCAL_INV
//! invalidates one. Each completes in order with the WRs before it (`IBV_WC_BIND_MW`,
//! `IBV_WC_LOCAL_INV`); a refused bind completes with `IBV_WC_MW_BIND_ERR`, a refused
//! invalidation with `IBV_WC_LOC_QP_OP_ERR`, and either moves the QP to ERROR, RC or UC.

use ibverbs_sys::{ibv_qp_state, ibv_wc_status};

use super::Qp;
use crate::mw::LocalOp;
use crate::state::World;

impl Qp {
    /// Executes the local operation at the send queue's position `cur`, if it may run now.
    /// Returns false if it must wait (a fence, SQD, an error waiting for its turn).
    pub(super) fn run_local(&mut self, w: &mut World, cur: u64) -> bool {
        let Some(wqe) = self.sq.get(cur) else {
            return false;
        };
        let (op, fence) = (wqe.local(), wqe.fence);
        if wqe.started {
            // Executed before a go-back-N brought the requester back past it: never twice.
            self.advance_wqe();
            return true;
        }
        if self.state == ibv_qp_state::IBV_QPS_SQD {
            self.note_drained(w);
            return false;
        }
        let Some(op) = op.filter(|_| !fence || self.req.rd_outstanding == 0) else {
            return false;
        };
        let (done, failed) = match op {
            LocalOp::Bind(b) => (
                w.bind_window(self.at(), &b),
                ibv_wc_status::IBV_WC_MW_BIND_ERR,
            ),
            LocalOp::Invalidate(rkey) => (
                w.invalidate(self.at(), rkey, false),
                ibv_wc_status::IBV_WC_LOC_QP_OP_ERR,
            ),
        };
        let head = self.sq.head_seq() == cur;
        match (done, head) {
            (Some(()), _) => {
                if let Some(q) = self.sq.get_mut(cur) {
                    q.started = true;
                }
                self.advance_wqe();
                // Completed now if nothing before it is outstanding, else right after the
                // WR before it (see `complete_send`).
                if head && !self.complete_send(w, ibv_wc_status::IBV_WC_SUCCESS) {
                    self.enter_error(w);
                }
            }
            (None, true) => self.fail_send(w, failed),
            (None, false) => {
                // Reported in order, once every WR before it has completed.
                if let Some(q) = self.sq.get_mut(cur) {
                    q.error = Some(failed);
                }
            }
        }
        true
    }
}
