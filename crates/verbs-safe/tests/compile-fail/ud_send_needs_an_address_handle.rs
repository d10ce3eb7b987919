// A safe UD post takes only UdSendWr, which cannot be built without its address handle: a
// SendWr (no address, or an RDMA op whose remote address would overlay the AH) does not fit.
use std::sync::Arc;
use verbs_safe::{MrBuf, Qp, Rts, SendOp, SendWr, Ud};

fn post(qp: &Qp<Ud, Rts>, buf: &Arc<MrBuf>) {
    let _ = qp.post_send_bufs(&mut [SendWr::new(1, SendOp::Send).buf(buf, 0, 8)]);
    let write = SendOp::Write { remote_addr: 0x1000, rkey: 7 };
    let _ = qp.post_send_bufs(&mut [SendWr::new(2, write).buf(buf, 0, 8)]);
}

fn main() {}
