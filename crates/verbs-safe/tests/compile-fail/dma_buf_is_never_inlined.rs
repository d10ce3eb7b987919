// Inline data is taken by value: there is no way to ask the driver to copy a DmaBuf's bytes
// (which a peer, the NIC or write_at may be changing) at post time.
use std::sync::Arc;
use verbs_safe::{DmaBuf, Qp, Rc, Rts, SendOp, SendWr};

fn post(qp: &Qp<Rc, Rts>, buf: &Arc<DmaBuf>) {
    let _ = qp.post_send_bufs(&mut [SendWr::new(1, SendOp::Send).dma_buf(buf, 0, 8).inline()]);
}

fn main() {}
