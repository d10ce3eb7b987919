//! Destroying an object waits until every event reported about it has been acknowledged
//! (ibv_get_cq_event(3), ibv_get_async_event(3): "this guarantees a one-to-one correspondence
//! between acks and successful gets"), so a thread that took an event may still use the
//! object it names until it acknowledges it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::common::*;
use ibv_qp_attr_mask as k;
use ibv_qp_state::IBV_QPS_SQD;

/// Runs `destroy` on another thread, checks that it has not returned while the event is
/// unacknowledged, runs `ack`, and returns what `destroy` returned.
fn destroy_waits_for(destroy: impl FnOnce() -> i32 + Send + 'static, ack: impl FnOnce()) -> i32 {
    let done = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&done);
    let t = std::thread::spawn(move || {
        let r = destroy();
        flag.store(true, Ordering::SeqCst);
        r
    });
    std::thread::sleep(Duration::from_millis(100));
    let early = done.load(Ordering::SeqCst);
    ack();
    let r = t.join().unwrap();
    assert!(
        !early,
        "the destroy returned before the event was acknowledged"
    );
    r
}

/// [`destroy_waits_for`] the acknowledgement of async event `ev`.
fn destroy_waits_for_ack_of(
    mut ev: ibv_async_event,
    destroy: impl FnOnce() -> i32 + Send + 'static,
) -> i32 {
    // SAFETY: the event get_async_event gave, acknowledged once.
    destroy_waits_for(destroy, || unsafe { (CONTROL.ack_async_event)(&mut ev) })
}

/// The next async event of `ctx`, not acknowledged.
fn take_async_event(ctx: *mut ibv_context) -> ibv_async_event {
    let mut ev = ibv_async_event {
        element: ibv_async_event__bindgen_ty_1 { port_num: 0 },
        event_type: 0,
    };
    // SAFETY: valid context and out-struct; an event is pending, so this does not block.
    assert_eq!(unsafe { (CONTROL.get_async_event)(ctx, &mut ev) }, 0);
    ev
}

/// Moves an idle RTS QP to SQD, asking for the event (`IBV_EVENT_SQ_DRAINED`, raised at once).
fn drain(qp: *mut ibv_qp) {
    let sqd = ibv_qp_attr {
        qp_state: IBV_QPS_SQD,
        en_sqd_async_notify: 1,
        ..Default::default()
    };
    let mask = m(k::IBV_QP_STATE | k::IBV_QP_EN_SQD_ASYNC_NOTIFY);
    assert_eq!(modify(qp, &sqd, mask), 0);
}

#[test]
fn destroy_cq_waits_for_its_completion_events_to_be_acknowledged() {
    let f = Fabric::default();
    let (qa, _b, qb, ch, cq) = channel_pair(&f);
    post_recv(qb, &mut [recv_wr(1, &[]), recv_wr(2, &[])]).unwrap();
    let (mut got_cq, mut got_ctx) = (std::ptr::null_mut(), std::ptr::null_mut());
    for id in 1..=2 {
        assert_eq!(req_notify(cq, false), 0);
        let send = send_wr(id, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED);
        post_send(qa, &mut [send]).unwrap();
        f.run_until_idle().unwrap();
        assert_eq!(
            // SAFETY: valid channel and out-pointers; an event is pending.
            unsafe { (CONTROL.get_cq_event)(ch, &mut got_cq, &mut got_ctx) },
            0
        );
        assert_eq!(got_cq, cq);
    }
    // SAFETY: one of the two events taken.
    unsafe { (CONTROL.ack_cq_events)(cq, 1) };
    // SAFETY: a live QP.
    assert_eq!(unsafe { (CONTROL.destroy_qp)(qb) }, 0);
    let p = cq as usize;
    // SAFETY: a live CQ no QP uses.
    let destroy = move || unsafe { (CONTROL.destroy_cq)(p as *mut ibv_cq) };
    // SAFETY: the other event.
    let ack = || unsafe { (CONTROL.ack_cq_events)(cq, 1) };
    assert_eq!(destroy_waits_for(destroy, ack), 0);
    // SAFETY: its CQ is gone.
    assert_eq!(unsafe { (CONTROL.destroy_comp_channel)(ch) }, 0);
}

#[test]
fn destroy_qp_waits_for_its_async_events_to_be_acknowledged() {
    let f = Fabric::default();
    let (a, qa, _b, _qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 4);
    drain(qa);
    let ev = take_async_event(a.ctx);
    assert_eq!(ev.event_type, IBV_EVENT_SQ_DRAINED);
    let p = qa as usize;
    // SAFETY: a live QP.
    let destroy = move || unsafe { (CONTROL.destroy_qp)(p as *mut ibv_qp) };
    assert_eq!(destroy_waits_for_ack_of(ev, destroy), 0);
}

#[test]
fn destroy_srq_waits_for_its_async_events_to_be_acknowledged() {
    let f = Fabric::default();
    let (_a, qa, b, qb, srq) = srq_pair(&f);
    post_srq_recv(srq, &mut [recv_wr(1, &[]), recv_wr(2, &[])]).unwrap();
    assert_eq!(arm_srq_limit(srq, 2), 0);
    post_send(
        qa,
        &mut [send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED)],
    )
    .unwrap();
    poll_n(b.cq, 1);
    let ev = take_async_event(b.ctx);
    assert_eq!(ev.event_type, IBV_EVENT_SRQ_LIMIT_REACHED);
    // SAFETY: a live QP.
    assert_eq!(unsafe { (CONTROL.destroy_qp)(qb) }, 0);
    let p = srq as usize;
    // SAFETY: a live SRQ no QP uses.
    let destroy = move || unsafe { (CONTROL.destroy_srq)(p as *mut ibv_srq) };
    assert_eq!(destroy_waits_for_ack_of(ev, destroy), 0);
}

/// An object destroyed with an async event not yet taken takes the event with it, as the
/// kernel drops a destroyed object's events: the context's descriptor is then not readable
/// for it (it was, and a program that polls the descriptor before a blocking
/// `ibv_get_async_event` slept in it), and the events of other objects still come.
#[test]
fn a_destroyed_objects_async_events_leave_the_descriptor() {
    let f = Fabric::default();
    let ty = ibv_qp_type::IBV_QPT_RC;
    let (a, qa, b, _qb) = pair(&f, ty, 4);
    let (other, peer) = (a.qp(ty, cap(4, 4), true), b.qp(ty, cap(4, 4), true));
    bring_up(other, ty, b.gid, qpn(peer), |_| {});
    bring_up(peer, ty, a.gid, qpn(other), |_| {});
    // SAFETY: a live context is readable.
    let fd = unsafe { (*a.ctx).async_fd };
    drain(qa);
    assert!(readable(fd, 0));
    // SAFETY: a live QP, its event not reported.
    assert_eq!(unsafe { (CONTROL.destroy_qp)(qa) }, 0);
    assert!(!readable(fd, 0), "readable for a destroyed QP's event");
    drain(other);
    let ev = take_async_event(a.ctx);
    assert_eq!(ev.event_type, IBV_EVENT_SQ_DRAINED);
    // SAFETY: the union holds the QP for this event type.
    assert_eq!(unsafe { ev.element.qp }, other);
    assert!(!readable(fd, 0));
}

#[test]
fn an_acknowledged_event_does_not_hold_the_destroy_up() {
    let f = Fabric::default();
    let (a, qa, _b, _qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 4);
    drain(qa);
    // Taken and acknowledged: the destroy returns at once, on this thread.
    assert!(async_event(a.ctx).is_some());
    // SAFETY: a live QP.
    assert_eq!(unsafe { (CONTROL.destroy_qp)(qa) }, 0);
}

#[test]
fn releasing_a_device_waits_for_no_acknowledgement() {
    let f = Fabric::default();
    let (a, qa, _b, _qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 4);
    drain(qa);
    let _never_acknowledged = take_async_event(a.ctx);
    // As the kernel's release of a closed device file: the QP goes with the rest, at once.
    // SAFETY: the context's objects are not used again.
    assert_eq!(unsafe { softnic::release_device(a.ctx) }, 0);
}
