//! RDMA ATOMIC WRITE (IBTA 1.5, as rxe has it): 8 bytes stored at once at an 8-byte aligned
//! remote address of a region with remote write access, on RC only; the request carries a
//! RETH and the 8 bytes (opcode 0x1d), the responder answers with an RDMA READ Response Only
//! of no bytes, a duplicate is answered again, the requester completes it with
//! `IBV_WC_ATOMIC_WRITE`. Posted with `ibv_post_send` (the bytes from the WR's one SGE or
//! inline) and with `ibv_wr_atomic_write`. And RDMA FLUSH (opcode 0x1c, FETH and RETH),
//! answered the same way, through `ibv_wr_flush`.

use std::sync::{Arc, Mutex};

use softnic::{PacketInfo, Verdict};

use crate::common::*;
use crate::extended::{ALL_SEND_OPS, ex_pair, next_wr, poll_ex};

/// An ATOMIC WRITE of the bytes of `data` (8 of them) to `(remote_addr, rkey)`.
fn atomic_write(
    wr_id: u64,
    data: &[u8],
    lmr: *mut ibv_mr,
    remote_addr: u64,
    rkey: u32,
) -> ibv_send_wr {
    with_rdma(
        send_wr(
            wr_id,
            ibv_wr_opcode::IBV_WR_ATOMIC_WRITE,
            &[sge(data, lmr)],
            SIGNALED,
        ),
        remote_addr,
        rkey,
    )
}

/// Every request and every response is seen twice, and the first two responses to each
/// request are lost: the value lands, each WR completes once with `IBV_WC_ATOMIC_WRITE`.
#[test]
fn atomic_writes_land_whole_and_complete_once_through_duplicates_and_losses() {
    let f = Fabric::default();
    let (a, qa, b, _qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 32);
    f.set_packet_filter(Some(duplicate_and_lose_twice(&[0x1d], 0x10)));
    let mut remote = aligned(8 * 4);
    let mut values = aligned(8 * 4);
    for (i, v) in values.chunks_mut(8).enumerate() {
        v.copy_from_slice(&(0x1111_2222_3333_0000_u64 + i as u64).to_ne_bytes());
    }
    let rmr = b.reg(&mut remote, LOCAL_WRITE | REMOTE_WRITE);
    let lmr = a.reg(&mut values, LOCAL_WRITE);
    let base = remote.as_ptr() as u64;
    let mut wrs: Vec<_> = values
        .chunks(8)
        .enumerate()
        .map(|(i, v)| atomic_write(i as u64, v, lmr, base + 8 * i as u64, rkey(rmr)))
        .collect();
    post_send(qa, &mut wrs).unwrap();
    let wcs = poll_n(a.cq, 4);
    assert_eq!(wcs.len(), 4);
    for (i, c) in wcs.iter().enumerate() {
        assert!(ok(c), "{c:?}");
        assert_eq!(
            (c.wr_id, c.opcode),
            (i as u64, ibv_wc_opcode::IBV_WC_ATOMIC_WRITE)
        );
    }
    assert_eq!(&remote[..], &values[..]);
    assert!(
        f.qp_counters(qa).unwrap().retransmits > 0,
        "lost responses were retried"
    );
    // Nothing arrives at the responder's CQ: an ATOMIC WRITE consumes no receive.
    assert!(poll(b.cq, 4).is_empty());
}

/// What is refused: at post, a length other than 8 or a misaligned address (EINVAL), and the
/// opcode on UC; at the responder, a region without remote write access (a remote access
/// error, the responder's QP in ERROR, nothing written).
#[test]
fn atomic_write_misuse_is_refused_at_post_or_by_the_responder() {
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 32);
    let mut remote = aligned(16);
    let mut value = aligned(16);
    let rmr = b.reg(&mut remote, LOCAL_WRITE | REMOTE_READ);
    let lmr = a.reg(&mut value, LOCAL_WRITE);
    let at = remote.as_ptr() as u64;
    let long = atomic_write(1, &value[..16], lmr, at, rkey(rmr));
    let misaligned = atomic_write(2, &value[..8], lmr, at + 4, rkey(rmr));
    for wr in [long, misaligned] {
        assert_eq!(post_send(qa, &mut [wr]), Err((libc::EINVAL, 0)));
    }
    let (_c, uqa, _d, _uqb) = pair(&f, ibv_qp_type::IBV_QPT_UC, 8);
    let uc = atomic_write(3, &value[..8], lmr, at, rkey(rmr));
    assert!(post_send(uqa, &mut [uc]).is_err(), "no ATOMIC WRITE on UC");

    // The region grants reads only: a remote access error, the QP in ERROR.
    post_send(qa, &mut [atomic_write(4, &value[..8], lmr, at, rkey(rmr))]).unwrap();
    let c = poll_n(a.cq, 1)[0];
    assert_eq!(c.status, ibv_wc_status::IBV_WC_REM_ACCESS_ERR, "{c:?}");
    assert_eq!(state(qb), ibv_qp_state::IBV_QPS_ERR);
    assert!(remote.iter().all(|&x| x == 0));
}

/// `ibv_wr_atomic_write` on an extended QP made with `IBV_QP_EX_WITH_ATOMIC_WRITE`: the 8
/// bytes are copied when the builder is called (the caller's buffer may change after).
#[test]
fn the_wr_builder_writes_the_bytes_it_was_given() {
    let f = Fabric::default();
    let ops = ALL_SEND_OPS | u64::from(ibverbs_sys::IBV_QP_EX_WITH_ATOMIC_WRITE);
    let p = ex_pair(&f, ops);
    let mut remote = aligned(8);
    let rmr = p.b.reg(&mut remote, LOCAL_WRITE | REMOTE_WRITE);
    let mut value = 0x0123_4567_89ab_cdef_u64.to_ne_bytes();
    // SAFETY: a live extended QP; the builders are called in order between start and complete.
    unsafe {
        let x = &*p.xa;
        x.wr_start.unwrap()(p.xa);
        next_wr(p.xa, 77, ibv_send_flags::IBV_SEND_SIGNALED.0);
        x.wr_atomic_write.unwrap()(
            p.xa,
            rkey(rmr),
            remote.as_ptr() as u64,
            value.as_ptr().cast(),
        );
        value.fill(0);
        assert_eq!(x.wr_complete.unwrap()(p.xa), 0);
    }
    let got = poll_ex(p.cqa, 1);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].status, ibv_wc_status::IBV_WC_SUCCESS);
    assert_eq!(got[0].opcode, ibv_wc_opcode::IBV_WC_ATOMIC_WRITE);
    assert_eq!(&remote[..], &0x0123_4567_89ab_cdef_u64.to_ne_bytes());
}

const FLUSH_GLOBAL: u32 = ibv_access_flags::IBV_ACCESS_FLUSH_GLOBAL.0;

/// Builds and posts one FLUSH on `p`'s requester; `wr_complete`'s result.
fn flush(
    p: &crate::extended::ExPair,
    wr_id: u64,
    rkey: u32,
    at: (u64, usize),
    how: (u8, u8),
) -> i32 {
    // SAFETY: a live extended QP; the builders are called in order between start and complete.
    unsafe {
        let x = &*p.xa;
        x.wr_start.unwrap()(p.xa);
        next_wr(p.xa, wr_id, ibv_send_flags::IBV_SEND_SIGNALED.0);
        x.wr_flush.unwrap()(p.xa, rkey, at.0, at.1, how.0, how.1);
        x.wr_complete.unwrap()(p.xa)
    }
}

/// RDMA FLUSH (`ibv_wr_flush`), as rxe has it: to global visibility, of a range or of the
/// whole region (whose range is then not checked), through a region granting
/// `IBV_ACCESS_FLUSH_GLOBAL`, answered as a READ of no bytes and completed as
/// `IBV_WC_FLUSH`, once, through duplicated requests and lost responses. Refused: a region
/// without the flush right (remote access error), persistence (no region may grant it:
/// softnic has no persistent memory), an unknown type or level, and `ibv_post_send` (its WR
/// cannot say the type).
#[test]
fn flush_makes_writes_visible_and_is_refused_where_rxe_refuses_it() {
    let f = Fabric::default();
    let ops = ALL_SEND_OPS | u64::from(ibverbs_sys::IBV_QP_EX_WITH_FLUSH);
    let p = ex_pair(&f, ops);
    let seen = Arc::new(Mutex::new(std::collections::BTreeMap::<u32, u32>::new()));
    f.set_packet_filter(Some(Box::new(move |pk: &PacketInfo| match pk.opcode {
        0x1c => Verdict::Duplicate,
        0x10 => {
            let mut seen = seen.lock().unwrap();
            let n = seen.entry(pk.psn).or_default();
            *n += 1;
            if *n == 1 {
                Verdict::Drop
            } else {
                Verdict::Pass
            }
        }
        _ => Verdict::Pass,
    })));
    let mut remote = vec![0u8; 4096];
    let rmr =
        p.b.reg(&mut remote, LOCAL_WRITE | REMOTE_WRITE | FLUSH_GLOBAL);
    let at = remote.as_ptr() as u64;
    let (global, persistent, range, whole) = (1, 2, 0, 1);
    assert_eq!(flush(&p, 1, rkey(rmr), (at + 64, 1024), (global, range)), 0);
    assert_eq!(
        flush(&p, 2, rkey(rmr), (at + (1 << 40), 64), (global, whole)),
        0
    );
    let got = poll_ex(p.cqa, 2);
    assert_eq!(got.len(), 2, "{got:?}");
    for (i, c) in got.iter().enumerate() {
        assert_eq!(c.status, ibv_wc_status::IBV_WC_SUCCESS, "{c:?}");
        assert_eq!(
            (c.wr_id, c.opcode),
            (i as u64 + 1, ibv_wc_opcode::IBV_WC_FLUSH)
        );
    }
    // Unknown type or level: the batch is refused at wr_complete.
    assert_eq!(flush(&p, 3, rkey(rmr), (at, 64), (4, range)), libc::EINVAL);
    assert_eq!(flush(&p, 4, rkey(rmr), (at, 64), (global, 2)), libc::EINVAL);
    // ibv_post_send cannot carry a FLUSH.
    let mut legacy = with_rdma(
        send_wr(5, ibverbs_sys::ibv_wr_opcode::IBV_WR_FLUSH, &[], SIGNALED),
        at,
        rkey(rmr),
    );
    assert_eq!(
        post_send(p.qa, std::slice::from_mut(&mut legacy)),
        Err((libc::EINVAL, 0))
    );
    // No region grants persistence.
    let mut other = vec![0u8; 64];
    let both = (LOCAL_WRITE | ibv_access_flags::IBV_ACCESS_FLUSH_PERSISTENT.0) as i32;
    // SAFETY: a live PD and buffer.
    let mr = unsafe { (CONTROL.reg_mr)(p.b.pd, other.as_mut_ptr().cast(), other.len(), both) };
    assert!(mr.is_null());
    // Persistence asked of a region that grants global visibility only: a remote access error.
    assert_eq!(flush(&p, 6, rkey(rmr), (at, 64), (persistent, range)), 0);
    let c = poll_ex(p.cqa, 1);
    assert_eq!(c[0].status, ibv_wc_status::IBV_WC_REM_ACCESS_ERR, "{c:?}");
}

/// A region without the flush right refuses a FLUSH (a remote access error).
#[test]
fn a_region_without_the_flush_right_refuses_it() {
    let f = Fabric::default();
    let ops = ALL_SEND_OPS | u64::from(ibverbs_sys::IBV_QP_EX_WITH_FLUSH);
    let p = ex_pair(&f, ops);
    let mut remote = vec![0u8; 64];
    let rmr = p.b.reg(&mut remote, LOCAL_WRITE | REMOTE_WRITE);
    assert_eq!(
        flush(&p, 1, rkey(rmr), (remote.as_ptr() as u64, 64), (1, 0)),
        0
    );
    let c = poll_ex(p.cqa, 1);
    assert_eq!(c[0].status, ibv_wc_status::IBV_WC_REM_ACCESS_ERR, "{c:?}");
}
