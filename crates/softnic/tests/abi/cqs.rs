//! Point 6: Completion queues: shared by many QPs, bounded (overflow raises CQ_ERR, never a silent
//! loss), completion channels with a real file descriptor.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::common::*;

#[test]
fn one_cq_serves_many_qps() {
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    let b = Node::open(&f, "soft1");
    let ty = ibv_qp_type::IBV_QPT_RC;
    let mut pairs = Vec::new();
    for _ in 0..4 {
        let x = a.qp(ty, cap(8, 8), true);
        let y = b.qp(ty, cap(8, 8), true);
        bring_up(x, ty, b.gid, qpn(y), |_| {});
        bring_up(y, ty, a.gid, qpn(x), |_| {});
        pairs.push((x, y));
    }
    for (i, &(x, y)) in pairs.iter().enumerate() {
        post_recv(y, &mut [recv_wr(i as u64, &[])]).unwrap();
        post_send(
            x,
            &mut [send_wr(i as u64, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED)],
        )
        .unwrap();
    }
    let wcs = poll_n(b.cq, 4);
    for wc in wcs {
        assert_eq!(wc.qp_num, qpn(pairs[wc.wr_id as usize].1));
    }
    assert_eq!(poll_n(a.cq, 4).len(), 4);
}

#[test]
fn overflow_raises_cq_err_and_the_qp_goes_to_error() {
    let f = Fabric::default();
    let (a, small) = overflowed_cq(&f);
    let ev = async_event(a.ctx).expect("CQ_ERR raised");
    assert_eq!(ev.event_type, IBV_EVENT_CQ_ERR);
    // SAFETY: the union holds the CQ for this event type.
    assert_eq!(unsafe { ev.element.cq }, small);
    // What fitted is still there; then polling says the CQ is broken.
    assert_eq!(poll(small, 8).len(), 2);
    assert_eq!(try_poll(small, 8), Err(-libc::EOVERFLOW));
}

/// Takes the pending event of channel `ch` (one must be pending), checks that it is CQ `cq`'s
/// and acknowledges it; returns the CQ's context.
fn take_cq_event(ch: *mut ibv_comp_channel, cq: *mut ibv_cq) -> usize {
    let (mut got_cq, mut got_ctx) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: valid channel and out-pointers; an event is pending, so this does not block.
    let r = unsafe { (CONTROL.get_cq_event)(ch, &mut got_cq, &mut got_ctx) };
    assert_eq!(r, 0);
    assert_eq!(got_cq, cq);
    // SAFETY: acknowledging the event just taken.
    unsafe { (CONTROL.ack_cq_events)(cq, 1) };
    got_ctx as usize
}

#[test]
fn completion_channel_fd_wakes_on_an_armed_completion() {
    let f = Fabric::default();
    let (qa, _b, qb, ch, cq) = channel_pair(&f);
    // SAFETY: a live channel is readable.
    let fd = unsafe { (*ch).fd };
    post_recv(qb, &mut [recv_wr(1, &[]), recv_wr(2, &[]), recv_wr(3, &[])]).unwrap();

    // Not armed: a completion does not wake the fd.
    post_send(
        qa,
        &mut [send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED)],
    )
    .unwrap();
    f.run_until_idle().unwrap();
    assert!(!readable(fd, 0));
    assert_eq!(poll(cq, 4).len(), 1);

    // Armed for the next completion; the sleeper wakes from another thread's progress.
    assert_eq!(req_notify(cq, false), 0);
    let sleeper = std::thread::spawn(move || readable(fd, 5_000));
    post_send(
        qa,
        &mut [send_wr(2, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED)],
    )
    .unwrap();
    f.run_until_idle().unwrap();
    assert!(sleeper.join().unwrap(), "the channel fd became readable");
    assert_eq!(take_cq_event(ch, cq), 0x5eed);
    assert!(!readable(fd, 0), "one event per arming");
    assert_eq!(poll(cq, 4).len(), 1);

    // Solicited-only: an unsolicited completion does not fire, a solicited one does.
    assert_eq!(req_notify(cq, true), 0);
    post_send(
        qa,
        &mut [send_wr(3, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED)],
    )
    .unwrap();
    f.run_until_idle().unwrap();
    assert!(!readable(fd, 0));
    post_recv(qb, &mut [recv_wr(4, &[])]).unwrap();
    post_send(
        qa,
        &mut [send_wr(
            4,
            ibv_wr_opcode::IBV_WR_SEND,
            &[],
            SIGNALED | SOLICITED,
        )],
    )
    .unwrap();
    f.run_until_idle().unwrap();
    assert!(readable(fd, 0));
    take_cq_event(ch, cq);
    assert_eq!(poll(cq, 4).len(), 2);

    // The channel is busy while the CQ uses it.
    // SAFETY: live objects; destroy order checked by softnic.
    unsafe {
        assert_eq!((CONTROL.destroy_comp_channel)(ch), libc::EBUSY);
        assert_eq!((CONTROL.destroy_qp)(qb), 0);
        assert_eq!((CONTROL.destroy_cq)(cq), 0);
        assert_eq!((CONTROL.destroy_comp_channel)(ch), 0);
    }
}

/// Armed for the next completion while completions wait unpolled, the CQ owes its event, as
/// ConnectX NICs raise one (perftest 4.5's `ib_send_bw -e -Q 2` arms before it polls what the
/// last event left, and waits for ever on a CQ that raises none): it comes when the program
/// waits for it in `get_cq_event`, or [`MISSED_EVENT_GRACE`] later for one that waits on the
/// descriptor, unless the program polls the CQ empty first. Armed solicited-only, an
/// unsolicited completion already there raises nothing.
#[test]
fn arming_a_cq_with_completions_unpolled_owes_its_event() {
    let f = Fabric::default();
    let (qa, _b, qb, ch, cq) = channel_pair(&f);
    // SAFETY: a live channel is readable.
    let fd = unsafe { (*ch).fd };
    post_recv(qb, &mut [recv_wr(1, &[]), recv_wr(2, &[])]).unwrap();
    post_send(
        qa,
        &mut [send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED)],
    )
    .unwrap();
    f.run_until_idle().unwrap();
    assert!(!readable(fd, 0), "not armed: no event");

    assert_eq!(req_notify(cq, true), 0);
    assert!(
        !readable(fd, 0),
        "solicited-only: the unsolicited completion raises none"
    );
    assert_eq!(req_notify(cq, false), 0);
    assert!(
        !readable(fd, 0),
        "armed with a completion unpolled: the event is owed, not raised yet"
    );
    f.advance(MISSED_EVENT_GRACE);
    assert!(
        readable(fd, 0),
        "armed with a completion unpolled and not polled: the event comes after the grace"
    );
    take_cq_event(ch, cq);
    assert_eq!(poll(cq, 4).len(), 1);

    // Owed and waited for: `get_cq_event` raises it at once (a blocking wait would never end
    // without the grace timer's progress).
    post_send(qa, &mut [send_wr(3, ibv_wr_opcode::IBV_WR_SEND, &[], 0)]).unwrap();
    post_recv(qb, &mut [recv_wr(3, &[])]).unwrap();
    f.run_until_idle().unwrap();
    assert_eq!(req_notify(cq, false), 0);
    take_cq_event(ch, cq);
    assert_eq!(poll(cq, 4).len(), 1);

    // Drained, the arming waits for the next completion, and that raises one event.
    assert_eq!(req_notify(cq, false), 0);
    assert!(!readable(fd, 0), "nothing unpolled: no event yet");
    post_send(
        qa,
        &mut [send_wr(2, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED)],
    )
    .unwrap();
    f.run_until_idle().unwrap();
    assert!(readable(fd, 0));
    take_cq_event(ch, cq);
    assert!(!readable(fd, 0), "one event per arming");
    assert_eq!(poll(cq, 4).len(), 1);
}

/// Perftest 4.5's `ib_send_lat -e`: one channel for the send and the receive CQ; after each
/// event the program acknowledges it, arms that CQ again and only then polls it, once. The
/// receive CQ is armed with its completion unpolled, which the poll right after takes: no
/// event is owed any more, and the next event on the channel is the send's (it was the stale
/// receive event, and the send CQ's single poll found nothing).
#[test]
fn an_owed_event_is_withdrawn_when_the_program_polls_the_cq_empty() {
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    let b = Node::open(&f, "soft1");
    // SAFETY: valid context.
    let ch = unsafe { (CONTROL.create_comp_channel)(b.ctx) };
    assert!(!ch.is_null());
    // SAFETY: a live channel is readable.
    let fd = unsafe { (*ch).fd };
    let (scq, rcq) = (b.new_cq(16, ch), b.new_cq(16, ch));
    let ty = ibv_qp_type::IBV_QPT_RC;
    let qa = a.qp(ty, cap(8, 8), true);
    let qb = b.qp_with(ty, cap(8, 8), true, scq, rcq, std::ptr::null_mut());
    bring_up(qa, ty, b.gid, qpn(qb), |_| {});
    bring_up(qb, ty, a.gid, qpn(qa), |_| {});
    assert_eq!(req_notify(scq, false), 0);
    assert_eq!(req_notify(rcq, false), 0);
    post_recv(qa, &mut [recv_wr(1, &[])]).unwrap();
    for round in 0..3 {
        post_recv(qb, &mut [recv_wr(round, &[])]).unwrap();
        post_send(
            qa,
            &mut [send_wr(round, ibv_wr_opcode::IBV_WR_SEND, &[], 0)],
        )
        .unwrap();
        f.run_until_idle().unwrap();
        take_cq_event(ch, rcq);
        assert_eq!(req_notify(rcq, false), 0);
        assert_eq!(poll(rcq, 1).len(), 1, "round {round}: the receive");
        // The reply.
        post_send(
            qb,
            &mut [send_wr(round, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED)],
        )
        .unwrap();
        f.run_until_idle().unwrap();
        take_cq_event(ch, scq);
        assert_eq!(req_notify(scq, false), 0);
        assert_eq!(
            poll(scq, 1).len(),
            1,
            "round {round}: the reply's completion"
        );
        assert!(!readable(fd, 0), "round {round}: no stale event");
        post_recv(qa, &mut [recv_wr(round + 2, &[])]).unwrap();
        // The request's completion and the reply's receive (all of `a`'s WRs signal).
        assert_eq!(poll(a.cq, 4).len(), 2);
    }
}

/// Armed with completions unpolled, a CQ whose program polls only some of them still owes
/// its event (`ib_send_bw -e -Q 2` polls 16 at a time): it comes when the program waits.
#[test]
fn an_owed_event_stays_owed_while_completions_are_left() {
    let f = Fabric::default();
    let (qa, _b, qb, ch, cq) = channel_pair(&f);
    let mut recvs: Vec<_> = (0..4).map(|i| recv_wr(i, &[])).collect();
    post_recv(qb, &mut recvs).unwrap();
    let mut sends: Vec<_> = (0..4)
        .map(|i| send_wr(i, ibv_wr_opcode::IBV_WR_SEND, &[], 0))
        .collect();
    post_send(qa, &mut sends).unwrap();
    f.run_until_idle().unwrap();
    assert_eq!(req_notify(cq, false), 0);
    assert_eq!(poll(cq, 2).len(), 2);
    take_cq_event(ch, cq);
    assert_eq!(poll(cq, 4).len(), 2);
}

/// A CQ destroyed with an event not yet taken: its event leaves the channel, whose descriptor
/// is no longer readable (as the kernel's event file, readable only while it has events; a
/// program that polls it before a blocking `get_cq_event` must not be woken for nothing), and
/// a blocking `get_cq_event` waits for one of the channel's other CQ (it returned -1 with
/// EAGAIN at once, having taken the destroyed CQ's count off the descriptor and found no
/// event).
#[test]
fn a_destroyed_cqs_events_leave_its_channel() {
    let f = Fabric::default();
    let (qa, b, qb, ch, cq) = channel_pair(&f);
    let other = b.new_cq(16, ch);
    post_recv(qb, &mut [recv_wr(1, &[])]).unwrap();
    post_send(
        qa,
        &mut [send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED)],
    )
    .unwrap();
    f.run_until_idle().unwrap();
    // Its event raised (armed with a completion unpolled), not taken.
    assert_eq!(req_notify(cq, false), 0);
    // SAFETY: live objects, no QP left on the CQ.
    unsafe {
        assert_eq!((CONTROL.destroy_qp)(qb), 0);
        assert_eq!((CONTROL.destroy_cq)(cq), 0);
    }
    // SAFETY: a live channel is readable.
    let fd = unsafe { (*ch).fd };
    assert!(!readable(fd, 0), "readable for a destroyed CQ's event");
    // The other CQ receives on a new pair of QPs.
    let ty = ibv_qp_type::IBV_QPT_RC;
    let a = Node::open(&f, "soft0");
    let qa2 = a.qp(ty, cap(8, 8), true);
    let qb2 = b.qp_with(ty, cap(8, 8), true, b.cq, other, std::ptr::null_mut());
    bring_up(qa2, ty, b.gid, qpn(qb2), |_| {});
    bring_up(qb2, ty, a.gid, qpn(qa2), |_| {});
    assert_eq!(req_notify(other, false), 0);
    let (ch_addr, done) = (ch as usize, Arc::new(AtomicBool::new(false)));
    let waiter = {
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            let (mut got_cq, mut got_ctx) = (std::ptr::null_mut(), std::ptr::null_mut());
            let ch = ch_addr as *mut ibv_comp_channel;
            // SAFETY: the channel outlives the thread (joined below); valid out-pointers.
            let r = unsafe { (CONTROL.get_cq_event)(ch, &mut got_cq, &mut got_ctx) };
            done.store(true, Ordering::SeqCst);
            (r, got_cq as usize)
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(
        !done.load(Ordering::SeqCst),
        "returned with no event to take"
    );
    post_recv(qb2, &mut [recv_wr(2, &[])]).unwrap();
    post_send(
        qa2,
        &mut [send_wr(2, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED)],
    )
    .unwrap();
    f.run_until_idle().unwrap();
    assert_eq!(waiter.join().unwrap(), (0, other as usize));
    assert!(!readable(fd, 0), "its one event taken");
    // SAFETY: acknowledging the event just taken.
    unsafe { (CONTROL.ack_cq_events)(other, 1) };
}

#[test]
fn get_cq_event_on_a_nonblocking_empty_channel_is_eagain() {
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    // SAFETY: valid context.
    let ch = unsafe { (CONTROL.create_comp_channel)(a.ctx) };
    // SAFETY: making the channel's own fd non-blocking, as rdma-core documents.
    unsafe {
        let fd = (*ch).fd;
        libc::fcntl(
            fd,
            libc::F_SETFL,
            libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK,
        );
    }
    let (mut cq, mut ctx) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: valid channel and out-pointers.
    assert_eq!(unsafe { (CONTROL.get_cq_event)(ch, &mut cq, &mut ctx) }, -1);
    // SAFETY: reading errno.
    assert_eq!(unsafe { *libc::__errno_location() }, libc::EAGAIN);
}

/// A QP moved to RESET, or destroyed, takes its completions not yet polled out of its CQs, as
/// ConnectX's provider cleans them (`mlx5_cq_clean`): a QP reset for reuse finds none of its
/// earlier life's (rdma-core's `test_mr_rereg_pd` restates a QP in ERROR, and its next poll
/// found a flush left from before), and a program never gets the `wr_id` of a destroyed QP's
/// WR. Another QP's completions in the same CQ stay, in order.
#[test]
fn a_qp_reset_or_destroyed_leaves_no_completion_behind() {
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    let b = Node::open(&f, "soft1");
    let ty = ibv_qp_type::IBV_QPT_RC;
    let (x1, x2) = (a.qp(ty, cap(8, 8), true), a.qp(ty, cap(8, 8), true));
    // Both of b's QPs complete in b's one CQ.
    let (y1, y2) = (b.qp(ty, cap(8, 8), true), b.qp(ty, cap(8, 8), true));
    for (x, y) in [(x1, y1), (x2, y2)] {
        bring_up(x, ty, b.gid, qpn(y), |_| {});
        bring_up(y, ty, a.gid, qpn(x), |_| {});
    }
    post_recv(y1, &mut [recv_wr(1, &[]), recv_wr(2, &[])]).unwrap();
    post_recv(y2, &mut [recv_wr(3, &[])]).unwrap();
    post_send(
        x1,
        &mut [send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED)],
    )
    .unwrap();
    post_send(
        x2,
        &mut [send_wr(3, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED)],
    )
    .unwrap();
    f.run_until_idle().unwrap();
    let to = |s| ibv_qp_attr {
        qp_state: s,
        ..Default::default()
    };
    let state = m(ibv_qp_attr_mask::IBV_QP_STATE);
    // y1's receive 1 done, receive 2 flushed; then y1 goes back to RESET.
    assert_eq!(modify(y1, &to(ibv_qp_state::IBV_QPS_ERR), state), 0);
    assert_eq!(modify(y1, &to(ibv_qp_state::IBV_QPS_RESET), state), 0);
    let left = poll(b.cq, 8);
    assert_eq!(
        left.iter().map(|w| (w.qp_num, w.wr_id)).collect::<Vec<_>>(),
        [(qpn(y2), 3)],
        "only y2's receive is left"
    );
    // y2 receives again, and is destroyed before its completion is polled.
    post_recv(y2, &mut [recv_wr(4, &[])]).unwrap();
    post_send(
        x2,
        &mut [send_wr(4, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED)],
    )
    .unwrap();
    f.run_until_idle().unwrap();
    // SAFETY: a live QP of b's, nothing else uses it.
    assert_eq!(unsafe { (CONTROL.destroy_qp)(y2) }, 0);
    assert!(
        poll(b.cq, 8).is_empty(),
        "a destroyed QP's completion was left"
    );
    assert_eq!(poll(a.cq, 8).len(), 3, "the senders' completions stay");
}

/// The completions a QP on an SRQ leaves when it is destroyed unpolled free their SRQ slots:
/// the SRQ takes as many new receives as before.
#[test]
fn a_destroyed_qp_s_srq_completions_free_their_slots() {
    let f = Fabric::default();
    let (a, qa, b, qb, srq) = srq_pair(&f);
    let _ = (&a, &b);
    let full: Vec<_> = (0..8).map(|i| recv_wr(i, &[])).collect();
    post_srq_recv(srq, &mut full.clone()).unwrap();
    let mut sends: Vec<_> = (0..8)
        .map(|i| send_wr(i, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED))
        .collect();
    post_send(qa, &mut sends).unwrap();
    f.run_until_idle().unwrap();
    // SAFETY: a live QP, nothing else uses it.
    assert_eq!(unsafe { (CONTROL.destroy_qp)(qb) }, 0);
    assert!(poll(b.cq, 16).is_empty());
    assert_eq!(
        post_srq_recv(srq, &mut full.clone()),
        Ok(()),
        "the SRQ's 8 slots are free again"
    );
}

/// An owed event withdrawn (the CQ polled empty) or settled (the CQ destroyed) leaves nothing
/// pending: the fabric is idle at once, and its clock does not move on to the grace's end.
#[test]
fn a_withdrawn_owed_event_leaves_nothing_pending() {
    let f = Fabric::default();
    let (qa, b, qb, ch, cq) = channel_pair(&f);
    post_recv(qb, &mut [recv_wr(1, &[]), recv_wr(2, &[])]).unwrap();
    let mut sends = [
        send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &[], 0),
        send_wr(2, ibv_wr_opcode::IBV_WR_SEND, &[], 0),
    ];
    post_send(qa, &mut sends).unwrap();
    f.run_until_idle().unwrap();
    assert_eq!(req_notify(cq, false), 0);
    assert_eq!(poll(cq, 4).len(), 2);
    let before = f.now();
    f.run_until_idle().unwrap();
    assert_eq!(f.now(), before, "the withdrawn event's timer is still set");
    // Owed by a CQ destroyed with it.
    let other = b.new_cq(4, ch);
    let ty = ibv_qp_type::IBV_QPT_UC;
    let a2 = Node::open(&f, "soft0");
    let x = a2.qp(ty, cap(4, 4), true);
    let y = b.qp_with(ty, cap(4, 4), true, b.cq, other, std::ptr::null_mut());
    bring_up(x, ty, b.gid, qpn(y), |_| {});
    bring_up(y, ty, a2.gid, qpn(x), |_| {});
    post_recv(y, &mut [recv_wr(3, &[])]).unwrap();
    post_send(x, &mut [send_wr(3, ibv_wr_opcode::IBV_WR_SEND, &[], 0)]).unwrap();
    f.run_until_idle().unwrap();
    assert_eq!(req_notify(other, false), 0);
    // SAFETY: live objects; the QP goes first.
    unsafe {
        assert_eq!((CONTROL.destroy_qp)(y), 0);
        assert_eq!((CONTROL.destroy_cq)(other), 0);
    }
    let before = f.now();
    f.run_until_idle().unwrap();
    assert_eq!(
        f.now(),
        before,
        "a destroyed CQ's owed event is still timed"
    );
}

/// The handler of the signal [`a_signal_interrupts_get_cq_event_as_it_interrupts_a_read`]
/// sends: it does nothing.
extern "C" fn on_sigusr2(_: libc::c_int) {}

/// A signal caught while a thread waits in `get_cq_event` ends the wait with EINTR unless its
/// handler was installed with `SA_RESTART`, and then the wait goes on until an event comes, as
/// a blocking `read` of the kernel's event file does. qperf's server stops each test from a
/// SIGALRM handler while it waits there; it waited for ever.
#[test]
fn a_signal_interrupts_get_cq_event_as_it_interrupts_a_read() {
    for restart in [false, true] {
        // SAFETY: a zeroed `sigaction` is valid; the handler does nothing, and no other test
        // uses SIGUSR2.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigusr2 as extern "C" fn(libc::c_int) as usize;
            sa.sa_flags = if restart { libc::SA_RESTART } else { 0 };
            libc::sigemptyset(&mut sa.sa_mask);
            assert_eq!(libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut()), 0);
        }
        let f = Fabric::default();
        let (qa, _b, qb, ch, cq) = channel_pair(&f);
        assert_eq!(req_notify(cq, false), 0);
        let (ch_addr, done) = (ch as usize, Arc::new(AtomicBool::new(false)));
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = {
            let done = Arc::clone(&done);
            std::thread::spawn(move || {
                // SAFETY: plain call.
                tx.send(unsafe { libc::pthread_self() }).unwrap();
                let (mut got_cq, mut got_ctx) = (std::ptr::null_mut(), std::ptr::null_mut());
                // SAFETY: the channel outlives the thread (joined below); valid out-pointers.
                let r =
                    unsafe { (CONTROL.get_cq_event)(ch_addr as *mut _, &mut got_cq, &mut got_ctx) };
                let e = std::io::Error::last_os_error().raw_os_error();
                done.store(true, Ordering::SeqCst);
                (r, e)
            })
        };
        let tid = rx.recv().unwrap();
        // Signals until the wait ends (it may not be asleep yet at the first), at most 2 s.
        for _ in 0..40 {
            std::thread::sleep(std::time::Duration::from_millis(50));
            if done.load(Ordering::SeqCst) {
                break;
            }
            // SAFETY: the waiter thread has not been joined, so its id is live.
            unsafe { libc::pthread_kill(tid, libc::SIGUSR2) };
        }
        if !restart {
            assert_eq!(waiter.join().unwrap(), (-1, Some(libc::EINTR)));
            continue;
        }
        assert!(!done.load(Ordering::SeqCst), "SA_RESTART: the wait goes on");
        post_recv(qb, &mut [recv_wr(1, &[])]).unwrap();
        post_send(qa, &mut [send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &[], 0)]).unwrap();
        f.run_until_idle().unwrap();
        assert_eq!(waiter.join().unwrap().0, 0);
        // SAFETY: acknowledging the event just taken.
        unsafe { (CONTROL.ack_cq_events)(cq, 1) };
    }
}
