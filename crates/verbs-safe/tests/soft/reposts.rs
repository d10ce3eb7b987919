//! What a safe post may not be given twice or at all: a WR whose buffers went with its post
//! (posting it again would hand the NIC buffers the caller gets back), an empty range (0 bytes
//! is 2 GiB to some NICs), an atomic whose local target is not the 8 bytes the NIC writes.

use std::sync::Arc;

use crate::setup::*;
use verbs_safe::sys::ibv_wr_opcode;

const LW: AccessFlags = AccessFlags::LOCAL_WRITE;

/// The reason of an `InvalidWr` at position 0.
fn invalid(e: Error) -> String {
    match e {
        Error::InvalidWr { index: 0, reason } => reason,
        e => panic!("{e}"),
    }
}

#[test]
fn a_wr_whose_buffers_went_with_its_post_is_not_posted_again() {
    let (_f, _v, a, b) = fabric();
    let (qa, qb) = rc_pair(&a, &b, QpCaps::default(), true);
    // A receive: its buffer is the NIC's until the completion gives it back.
    let mut recv = [RecvWr::new(1).buf(b.pd.alloc_mr(64, 64, LW).unwrap(), 0, 64)];
    qb.post_recv_bufs(&mut recv).unwrap();
    let why = invalid(qb.post_recv_bufs(&mut recv).unwrap_err());
    assert!(why.contains("posted"), "{why}");
    assert_eq!(
        b.ctx.posts_in_flight(),
        1,
        "the second post left nothing behind"
    );
    // A READ's target, and a SEND's shared source.
    let remote = b.pd.alloc_dma(64, 64, AccessFlags::all()).unwrap();
    let read = SendOp::Read {
        remote_addr: remote.addr(),
        rkey: remote.rkey(),
    };
    let mut wrs = [SendWr::new(2, read).target(a.pd.alloc_mr(64, 64, LW).unwrap(), 0, 8)];
    qa.post_send_bufs(&mut wrs).unwrap();
    invalid(qa.post_send_bufs(&mut wrs).unwrap_err());
    let src = Arc::new(a.pd.alloc_mr(64, 64, LW).unwrap());
    let mut wrs = [SendWr::new(3, SendOp::Send).buf(&src, 0, 8)];
    qa.post_send_bufs(&mut wrs).unwrap();
    invalid(qa.post_send_bufs(&mut wrs).unwrap_err());
    // Inline bytes are the WR's own: it may go as often as the caller likes.
    for id in 5..7 {
        let buf = b.pd.alloc_mr(64, 64, LW).unwrap();
        qb.post_recv_bufs(&mut [RecvWr::new(id).buf(buf, 0, 64)])
            .unwrap();
    }
    let mut inline = [SendWr::new(4, SendOp::Send).inline_data(b"again")];
    for _ in 0..2 {
        qa.post_send_bufs(&mut inline).unwrap();
    }
    let mut p = Poller::new();
    let mut done = Vec::new();
    for _ in 0..100 {
        p.poll(&a.cq, 8, |c| done.push(c.wr_id())).unwrap();
    }
    done.sort_unstable();
    assert_eq!(done, [2, 3, 4, 4], "one completion a post");
}

#[test]
fn an_empty_range_is_refused() {
    let (_f, _v, a, b) = fabric();
    let (qa, qb) = rc_pair(&a, &b, QpCaps::default(), true);
    let mut recv = [RecvWr::new(1).buf(b.pd.alloc_mr(64, 64, LW).unwrap(), 0, 0)];
    let why = invalid(qb.post_recv_bufs(&mut recv).unwrap_err());
    assert!(why.contains("empty"), "{why}");
    assert_eq!(recv[0].take_bufs().len(), 1, "the buffer stays with the WR");
    let src = Arc::new(a.pd.alloc_mr(64, 64, LW).unwrap());
    let mut send = [SendWr::new(2, SendOp::Send).buf(&src, 64, 0)];
    invalid(qa.post_send_bufs(&mut send).unwrap_err());
    let dma = Arc::new(a.pd.alloc_dma(64, 64, LW).unwrap());
    let mut send = [SendWr::new(3, SendOp::Send).dma_buf(&dma, 0, 0)];
    invalid(qa.post_send_bufs(&mut send).unwrap_err());
    assert_eq!((a.ctx.posts_in_flight(), b.ctx.posts_in_flight()), (0, 0));
}

#[test]
fn an_atomic_s_local_target_is_the_eight_bytes_it_returns() {
    let (_f, _v, a, b) = fabric();
    let (qa, _qb) = rc_pair(&a, &b, QpCaps::default(), true);
    let remote = b.pd.alloc_dma(64, 64, AccessFlags::all()).unwrap();
    let add = SendOp::FetchAdd {
        remote_addr: remote.addr(),
        rkey: remote.rkey(),
        add: 1,
    };
    // The last byte of a buffer: the NIC would write 7 bytes past it.
    let target = a.pd.alloc_mr(64, 8, LW).unwrap();
    let mut wrs = [SendWr::new(1, add).target(target, 63, 1)];
    let why = invalid(qa.post_send_bufs(&mut wrs).unwrap_err());
    assert!(why.contains("8 bytes"), "{why}");
    let target = wrs[0].take_bufs().pop().unwrap();
    let mut wrs = [SendWr::new(2, add).target(target, 0, 16)];
    invalid(qa.post_send_bufs(&mut wrs).unwrap_err());
    // From a pool slot: one SGE of 8 bytes too.
    let pinned = Arc::new(a.pd.alloc_dma(64, 64, LW).unwrap());
    qa.pin(&pinned);
    let mut s = WrSlot::<2>::default();
    s.wr.wr_id = 3;
    s.wr.opcode = ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD;
    s.wr.wr.atomic.remote_addr = remote.addr();
    s.wr.wr.atomic.rkey = remote.rkey();
    s.sges[0] = pinned.sge(60, 4).unwrap();
    s.wr.num_sge = 1;
    let why = invalid(qa.post_slots(&mut [s], &[0]).unwrap_err());
    assert!(why.contains("8 bytes"), "{why}");
    assert_eq!(a.ctx.posts_in_flight(), 0);
}
