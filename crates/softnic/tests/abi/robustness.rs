//! Robustness: no livelock when a WR fails behind others, no undefined behaviour on zero-length
//! operations, destroyed pointers refused for good, blocking calls that a destroy wakes, and a
//! panic in the progress thread that breaks the fabric loudly.

use std::ptr::null_mut;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use softnic::{PacketInfo, Verdict};

use crate::common::*;

/// Point 4 of the review: a WR whose memory is deregistered after it started, found bad while
/// an earlier WR is still unacknowledged, is reported in order; the requester does not spin.
#[test]
fn a_gather_error_behind_an_unacked_wr_is_reported_not_spun_on() {
    let f = Fabric::default();
    let (a, qa, b, _qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 16);
    let mut src1 = vec![1u8; 8192];
    let mut src2 = vec![2u8; 8192];
    let mut dst = vec![0u8; 16384];
    let m1 = a.reg(&mut src1, LOCAL_WRITE);
    let m2 = a.reg(&mut src2, LOCAL_WRITE);
    let dmr = b.reg(&mut dst, ALL_ACCESS);
    // Lose the third data packet, and every ACK/NAK until told otherwise: recovery then comes
    // from the retransmission timeout, after the second WR's memory is gone.
    let quiet = Arc::new(AtomicBool::new(true));
    let data = Arc::new(AtomicUsize::new(0));
    let (q2, d2) = (quiet.clone(), data.clone());
    f.set_packet_filter(Some(Box::new(move |p: &PacketInfo| {
        if p.from == 1 && q2.load(Ordering::Relaxed) {
            return Verdict::Drop;
        }
        if p.from == 0 && d2.fetch_add(1, Ordering::Relaxed) == 2 {
            return Verdict::Drop;
        }
        Verdict::Pass
    })));
    let w1 = write_wr(1, &src1, m1, dst.as_ptr() as u64, dmr);
    let w2 = write_wr(2, &src2, m2, dst.as_ptr() as u64 + 8192, dmr);
    post_send(qa, &mut [w1, w2]).unwrap();
    f.advance(Duration::from_micros(50));
    assert_eq!(data.load(Ordering::Relaxed), 16, "both WRs went out once");
    // SAFETY: a live MR, deregistered once while a WR naming it is in flight.
    assert_eq!(unsafe { (CONTROL.dereg_mr)(m2) }, 0);
    quiet.store(false, Ordering::Relaxed);
    let cq = P(a.cq as usize);
    let wcs = within(20, "polling after the go-back-N", move || {
        poll_n(cq.0 as *mut ibv_cq, 2)
    });
    let got: Vec<(u64, u32)> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        got,
        [
            (1, ibv_wc_status::IBV_WC_SUCCESS),
            (2, ibv_wc_status::IBV_WC_LOC_PROT_ERR)
        ]
    );
    assert_eq!(state(qa), ibv_qp_state::IBV_QPS_ERR);
}

/// An RC pair on `f` (local ACK timeout `timeout`), a source of `len` ones and a destination
/// of zeros registered, and one signaled WRITE of the one into the other posted: its first
/// packet is on the wire. Returns the requester, its QP, the source and its MR, and the
/// destination.
fn one_write_posted(
    f: &Fabric,
    len: usize,
    timeout: u8,
) -> (Node, *mut ibv_qp, Vec<u8>, *mut ibv_mr, Vec<u8>) {
    let (a, qa, b, _qb) = pair_with(f, ibv_qp_type::IBV_QPT_RC, 8, |r| r.timeout = timeout);
    let mut src = vec![1u8; len];
    let mut dst = vec![0u8; len];
    let smr = a.reg(&mut src, LOCAL_WRITE);
    let dmr = b.reg(&mut dst, ALL_ACCESS);
    let w = write_wr(1, &src, smr, dst.as_ptr() as u64, dmr);
    post_send(qa, &mut [w]).unwrap();
    assert!(f.qp_counters(qa).unwrap().packets_sent >= 1);
    (a, qa, src, smr, dst)
}

/// An RC WRITE's payload is read from the requester's memory when its packet is delivered. A
/// region deregistered while its WRITE is on the wire is not read then: the packet is lost, and
/// the retry finds the memory gone (`LOC_PROT_ERR`). What the program writes into the buffer
/// after deregistering it never reaches the responder.
#[test]
fn memory_deregistered_under_a_write_on_the_wire_is_not_read() {
    let f = Fabric::default();
    let (a, _qa, mut src, smr, dst) = one_write_posted(&f, 3 * 4096, 8);
    // SAFETY: a live MR, deregistered once while a WR naming it is in flight.
    assert_eq!(unsafe { (CONTROL.dereg_mr)(smr) }, 0);
    src.fill(9);
    let wc = poll_n(a.cq, 1);
    assert_eq!(wc.len(), 1);
    assert_eq!(wc[0].status, ibv_wc_status::IBV_WC_LOC_PROT_ERR, "{wc:?}");
    f.run_until_idle().unwrap();
    assert!(!dst.contains(&9), "the responder read deregistered memory");
    assert!(f.device_counters("soft1").unwrap().packets_dropped > 0);
}

/// A WRITE flushed while its packets are on the wire (the requester QP moved to ERROR, its WR
/// completed with `WR_FLUSH_ERR`) leaves the buffer to the program at once: what the program
/// writes there afterwards never reaches the responder, though the responder still takes the
/// packets' PSNs.
#[test]
fn a_flushed_write_does_not_carry_what_the_program_wrote_after_the_flush() {
    let f = Fabric::default();
    let (a, qa, mut src, _smr, dst) = one_write_posted(&f, 3 * 4096, 14);
    let err = ibv_qp_attr {
        qp_state: ibv_qp_state::IBV_QPS_ERR,
        ..Default::default()
    };
    assert_eq!(modify(qa, &err, m(ibv_qp_attr_mask::IBV_QP_STATE)), 0);
    let wc = poll_n(a.cq, 1);
    assert_eq!(wc.len(), 1);
    assert_eq!(wc[0].status, ibv_wc_status::IBV_WC_WR_FLUSH_ERR, "{wc:?}");
    src.fill(9);
    f.run_until_idle().unwrap();
    assert!(
        !dst.contains(&9),
        "the responder read a flushed WR's buffer"
    );
}

/// A timer that stopped (everything acknowledged) leaves nothing pending: the fabric is idle
/// and its clock stays where the traffic ended.
#[test]
fn a_stopped_retransmission_timer_leaves_nothing_pending() {
    let f = Fabric::default();
    let (a, _qa, src, _smr, dst) = one_write_posted(&f, 4096, 14);
    assert!(ok(&poll_n(a.cq, 1)[0]));
    assert_eq!(f.next_event(), None, "nothing is pending");
    let done = f.now();
    f.run_until_idle().unwrap();
    assert_eq!(f.now(), done, "the clock stays where the traffic ended");
    assert_eq!(dst, src);
}

/// Point 5: zero bytes touch no memory, whatever address the WR or the wire names.
#[test]
fn zero_length_operations_touch_no_memory() {
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    // A zero-length WRITE to address 0 with rkey 0 (rxe checks no rkey for zero bytes).
    let w = with_rdma(
        send_wr(1, ibv_wr_opcode::IBV_WR_RDMA_WRITE, &[], SIGNALED),
        0,
        0,
    );
    post_send(qa, &mut [w]).unwrap();
    assert!(ok(&poll_n(a.cq, 1)[0]));
    // A zero-length inline SGE at address 0.
    post_recv(qb, &mut [recv_wr(5, &[])]).unwrap();
    let s = [ibv_sge {
        addr: 0,
        length: 0,
        lkey: 0,
    }];
    post_send(
        qa,
        &mut [send_wr(
            2,
            ibv_wr_opcode::IBV_WR_SEND,
            &s,
            SIGNALED | INLINE,
        )],
    )
    .unwrap();
    assert!(ok(&poll_n(a.cq, 1)[0]));
    let r = poll_n(b.cq, 1)[0];
    assert_eq!((r.wr_id, r.byte_len), (5, 0));
    // A zero-length READ from address 0 into no SGE.
    let rd = with_rdma(
        send_wr(3, ibv_wr_opcode::IBV_WR_RDMA_READ, &[], SIGNALED),
        0,
        0,
    );
    post_send(qa, &mut [rd]).unwrap();
    let wc = poll_n(a.cq, 1)[0];
    assert!(ok(&wc), "{wc:?}");
    assert_eq!(wc.byte_len, 0);
}

/// Point 8: an address softnic handed out is never handed out again, so a destroyed object's
/// pointer is refused for good, even after many objects of the same kind came and went.
#[test]
fn destroyed_pointers_never_come_back() {
    let f = Fabric::default();
    let n = Node::open(&f, "soft0");
    let mut seen = std::collections::BTreeSet::new();
    let mut mem = vec![0u8; 64];
    for _ in 0..64 {
        let q = n.qp(ibv_qp_type::IBV_QPT_RC, cap(4, 4), true);
        let cq = n.new_cq(4, null_mut());
        let mr = n.reg(&mut mem, LOCAL_WRITE);
        for p in [q as usize, cq as usize, mr as usize] {
            assert!(seen.insert(p), "address {p:#x} handed out twice");
        }
        // SAFETY: live objects, each destroyed once.
        unsafe {
            assert_eq!((CONTROL.destroy_qp)(q), 0);
            assert_eq!((CONTROL.destroy_cq)(cq), 0);
            assert_eq!((CONTROL.dereg_mr)(mr), 0);
        }
    }
    // A brand-new object of each kind still lands somewhere new, and the old ones stay dead.
    let q = n.qp(ibv_qp_type::IBV_QPT_RC, cap(4, 4), true);
    assert!(!seen.contains(&(q as usize)));
    for &p in &seen {
        // SAFETY: softnic checks every pointer it is given before using it.
        let rc = unsafe { (CONTROL.destroy_qp)(p as *mut ibv_qp) };
        assert_eq!(rc, libc::EINVAL);
    }
}

/// A CQ one thread polls, destroyed by another thread: the poller's next call is refused
/// (EINVAL), however recently it used that pointer; so is a call after the fabric is gone.
/// (Each thread remembers its recent lookups; any removal from the registry voids them.)
#[test]
fn a_pointer_used_recently_is_refused_once_another_thread_destroys_it() {
    let f = Fabric::default();
    let n = Node::open(&f, "soft0");
    // Called through the context's table: a destroyed CQ's pointer is never read here.
    let poll_cq = ops(n.ctx).poll_cq.unwrap();
    let poll = move |cq: usize| {
        let mut wc = [ibv_wc::default(); 1];
        // SAFETY: softnic checks the CQ pointer before using it; `wc` has room for one.
        unsafe { poll_cq(cq as *mut ibv_cq, 1, wc.as_mut_ptr()) }
    };
    let cq = n.new_cq(4, null_mut()) as usize;
    let (to_poller, polls) = std::sync::mpsc::channel::<()>();
    let (to_main, results) = std::sync::mpsc::channel::<i32>();
    let poller = std::thread::spawn(move || {
        for () in polls {
            to_main.send(poll(cq)).unwrap();
        }
    });
    for _ in 0..3 {
        to_poller.send(()).unwrap();
        assert_eq!(results.recv().unwrap(), 0);
    }
    // SAFETY: a live CQ, destroyed once; the poller's later call is refused.
    assert_eq!(unsafe { (CONTROL.destroy_cq)(cq as *mut ibv_cq) }, 0);
    to_poller.send(()).unwrap();
    assert_eq!(results.recv().unwrap(), -libc::EINVAL);
    drop(to_poller);
    poller.join().unwrap();
    // This thread polls a live CQ, then the fabric goes: refused too.
    let cq = n.new_cq(4, null_mut()) as usize;
    assert_eq!(poll(cq), 0);
    drop(f);
    assert_eq!(poll(cq), -libc::EINVAL);
}

/// A CQ destroyed while another thread polls it in a loop (a program error): the poller is
/// refused from then on (EINVAL), whenever the destroy came between its lookup and its turn at
/// the fabric; the fabric is not broken by it.
#[test]
fn a_destroy_racing_a_poll_loop_is_refused_not_a_broken_fabric() {
    let f = Fabric::default();
    let n = Node::open(&f, "soft0");
    let poll_cq = ops(n.ctx).poll_cq.unwrap();
    for _ in 0..50 {
        let cq = n.new_cq(4, null_mut()) as usize;
        let started = Arc::new(AtomicBool::new(false));
        let go = started.clone();
        let poller = std::thread::spawn(move || {
            let mut wc = [ibv_wc::default(); 1];
            loop {
                // SAFETY: softnic checks the CQ pointer; `wc` has room for one.
                let r = unsafe { poll_cq(cq as *mut ibv_cq, 1, wc.as_mut_ptr()) };
                go.store(true, Ordering::Release);
                if r != 0 {
                    return r;
                }
            }
        });
        while !started.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
        // SAFETY: a live CQ, destroyed once (the poller's calls are refused afterwards).
        assert_eq!(unsafe { (CONTROL.destroy_cq)(cq as *mut ibv_cq) }, 0);
        assert_eq!(poller.join().unwrap(), -libc::EINVAL);
        assert_eq!(f.broken(), None);
    }
}

/// Point 8: a thread blocked in `get_cq_event` while its channel is destroyed returns an error
/// promptly (it must not block forever, nor read a descriptor the destroy closed).
#[test]
fn destroying_a_channel_wakes_a_blocked_get_cq_event() {
    let f = Fabric::default();
    let n = Node::open(&f, "soft0");
    // SAFETY: a live context.
    let ch = unsafe { (CONTROL.create_comp_channel)(n.ctx) };
    assert!(!ch.is_null());
    let p = P(ch as usize);
    let waiter = std::thread::spawn(move || {
        let mut cq = null_mut();
        let mut ctx = null_mut();
        // SAFETY: softnic checks the channel; the out-pointers are valid.
        let rc = unsafe { (CONTROL.get_cq_event)(p.0 as *mut _, &mut cq, &mut ctx) };
        (rc, std::io::Error::last_os_error().raw_os_error())
    });
    std::thread::sleep(Duration::from_millis(50));
    // SAFETY: a live channel with no CQ on it, destroyed once.
    assert_eq!(unsafe { (CONTROL.destroy_comp_channel)(ch) }, 0);
    let (rc, errno) = within(5, "get_cq_event after the destroy", move || {
        waiter.join().unwrap()
    });
    assert_eq!((rc, errno), (-1, Some(libc::EINVAL)));
}

/// Point 9: a panic in the progress thread breaks the fabric: every later call fails with EIO
/// instead of working on state the panic may have left half-updated.
#[test]
fn a_panic_in_the_progress_thread_breaks_the_fabric() {
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    // Packets after the first are sent by whoever makes progress next: the progress thread,
    // as this thread only looks at whether the fabric is broken (a poll of its empty CQ would
    // move time and send them itself).
    let _bufs = send_into_a_panicking_progress_thread(&f, (&a, qa), (&b, qb));
    let _progress = f.spawn_progress_thread();
    let watched = f.clone();
    within(5, "waiting for the fabric to break", move || {
        while watched.broken().is_none() {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    assert_eq!(try_poll(a.cq, 1), Err(-libc::EIO));
    // Every verb fails with EIO now, whatever else is wrong with the call (no WR list).
    assert_eq!(post_send_raw(a.ctx, qa, null_mut()), libc::EIO);
}
