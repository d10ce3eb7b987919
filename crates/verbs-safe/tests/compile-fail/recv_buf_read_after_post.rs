// A receive buffer moves into the safe post: it cannot be read while the NIC may write it.
use verbs_safe::{MrBuf, Qp, Rc, RecvWr, Rts};

fn receive(qp: &Qp<Rc, Rts>, buf: MrBuf) -> u8 {
    qp.post_recv_bufs(&mut [RecvWr::new(1).buf(buf, 0, 64)]).unwrap();
    buf.as_slice()[0]
}

fn main() {}
