//! Memory windows between two processes' devices over the UDP link: a bind, writes through
//! the window, a remote invalidation (the IETH on the wire), a new bind, a local
//! invalidation, and the write that then fails at the target's NIC.

use super::*;
use crate::udp::{poll_until, rc_across, udp_fabric};

/// Posts `wr` on `qp` and waits for its completion on `cq` (the link is real: time passes).
fn run_udp(qp: *mut ibv_qp, cq: *mut ibv_cq, wr: ibv_send_wr) -> Wc {
    post_send(qp, &mut [wr]).expect("post_send");
    poll_until(cq, 1)[0]
}

#[test]
fn bind_write_invalidate_over_udp() {
    let (fa, fb) = (udp_fabric(21), udp_fabric(22));
    let (a, qa, b, qb) = rc_across(&fa, &fb, 16);
    let mut src: Vec<u8> = (0..5000).map(|i| (i % 251) as u8).collect();
    let mut inbox = vec![0u8; 64];
    let mut dst = vec![0u8; 8192];
    let smr = a.reg(&mut src, ALL_ACCESS);
    let imr = b.reg(&mut inbox, ALL_ACCESS);
    let dmr = b.reg(&mut dst, BINDABLE);
    let base = dst.as_ptr() as u64;
    let mw = alloc_mw(&b, IBV_MW_TYPE_2);
    let k1 = inc_rkey(mw_rkey(mw));
    let wc = run_udp(
        qb,
        b.cq,
        bind_wr(1, mw, k1, info(&dst, dmr, 1000, 5000, REMOTE_WRITE)),
    );
    assert_eq!(st(&wc), (0, IBV_WC_BIND_MW));
    // Two packets' worth through the window.
    assert!(ok(&run_udp(
        qa,
        a.cq,
        write_key(2, &src, smr, base + 1000, k1)
    )));
    assert_eq!(dst[1000..6000], src[..]);
    // The peer invalidates it with its SEND.
    post_recv(qb, &mut [recv_wr(30, &[sge(&inbox, imr)])]).unwrap();
    let wc = run_udp(qa, a.cq, send_inv_wr(3, &[sge(&src[..64], smr)], k1));
    assert_eq!(st(&wc), (0, IBV_WC_SEND));
    let r = poll_until(b.cq, 1)[0];
    assert_eq!((st(&r), r.imm_data), ((0, IBV_WC_RECV), k1));
    assert_ne!(r.wc_flags & WITH_INV, 0);
    // Bound again with a new tag, written, invalidated locally.
    let k2 = inc_rkey(k1);
    let wc = run_udp(
        qb,
        b.cq,
        bind_wr(4, mw, k2, info(&dst, dmr, 0, 100, REMOTE_WRITE)),
    );
    assert!(ok(&wc));
    assert!(ok(&run_udp(
        qa,
        a.cq,
        write_key(5, &src[..100], smr, base, k2)
    )));
    assert_eq!(dst[..100], src[..100]);
    let wc = run_udp(qb, b.cq, local_inv_wr(6, k2));
    assert_eq!(st(&wc), (0, IBV_WC_LOCAL_INV));
    // Now the target's NIC refuses the key.
    let before = dst.clone();
    let wc = run_udp(qa, a.cq, write_key(7, &src[100..200], smr, base, k2));
    assert_eq!(wc.status, IBV_WC_REM_ACCESS_ERR);
    assert_eq!(dst, before, "memory untouched");
}
