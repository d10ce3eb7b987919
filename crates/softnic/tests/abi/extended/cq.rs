//! Extended CQs: `ibv_start_poll`/`ibv_next_poll`/`ibv_end_poll`, the `ibv_wc_read_*`
//! fields, a second thread's poll, and `ibv_resize_cq`.

use std::ptr::null_mut;

use super::*;

#[test]
fn extended_cqs_poll_with_start_next_end_and_read_callbacks() {
    let f = Fabric::default();
    let p = ex_pair(&f, ALL_SEND_OPS);
    let (mut src, mut dst) = (vec![7u8; 300], vec![0u8; 1024]);
    let (smr, dmr) = (p.a.reg(&mut src, ALL_ACCESS), p.b.reg(&mut dst, ALL_ACCESS));
    for i in 0..3u64 {
        let chunk = &dst[i as usize * 300..(i as usize + 1) * 300];
        post_recv(p.qb, &mut [recv_wr(100 + i, &[sge(chunk, dmr)])]).unwrap();
    }
    let mut sends: Vec<_> = (0..3)
        .map(|i| {
            with_imm(
                send_wr(
                    i,
                    ibv_wr_opcode::IBV_WR_SEND_WITH_IMM,
                    &[sge(&src, smr)],
                    SIGNALED,
                ),
                40 + i as u32,
            )
        })
        .collect();
    post_send(p.qa, &mut sends).unwrap();

    let got = poll_ex(p.cqb, 3);
    assert_eq!(got.len(), 3, "{got:?}");
    for (i, c) in got.iter().enumerate() {
        assert_eq!(c.status, ibv_wc_status::IBV_WC_SUCCESS);
        assert_eq!(c.wr_id, 100 + i as u64);
        assert_eq!(c.opcode, ibv_wc_opcode::IBV_WC_RECV);
        assert_eq!(c.byte_len, 300);
        assert_eq!(u32::from_be(c.imm), 40 + i as u32);
        assert_eq!(c.qp_num, qpn(p.qb));
        assert_ne!(c.flags & ibv_wc_flags::IBV_WC_WITH_IMM.0, 0);
    }
    // The sender's completions, through the legacy poll on the same CQ.
    let sent = poll_n(p.cqa.cast(), 3);
    assert_eq!(sent.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [0, 1, 2]);

    // SAFETY: live extended CQs; their callbacks are set.
    unsafe {
        let c = &*p.cqb;
        // Empty: ENOENT, and the poll lock is not held (a second start_poll is not EBUSY).
        assert_eq!(c.start_poll.unwrap()(p.cqb, null_mut()), libc::ENOENT);
        assert_eq!(c.start_poll.unwrap()(p.cqb, null_mut()), libc::ENOENT);
        let mut bad = ibv_poll_cq_attr { comp_mask: 1 };
        assert_eq!(c.start_poll.unwrap()(p.cqb, &mut bad), libc::EINVAL);
    }
    // Fields softnic does not report are refused at creation.
    assert_eq!(
        create_cq_ex(p.a.ctx, IBV_WC_EX_WITH_CVLAN),
        Err(libc::EOPNOTSUPP)
    );
}

/// Completion timestamps (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`, `_WALLCLOCK`): the device
/// clock at 1 GHz (`hca_core_clock` 1000000 kHz, all 64 bits valid), never before an earlier
/// completion's, never after the clock `ibv_query_rt_values_ex` reads next; the real time
/// within the real times around the run.
#[test]
fn completions_carry_timestamps_of_the_device_clock_and_the_real_time() {
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    let b = Node::open(&f, "soft1");
    let flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
    let (cqa, cqb) = (
        create_cq_ex(a.ctx, flags).unwrap(),
        create_cq_ex(b.ctx, flags).unwrap(),
    );
    let ty = ibv_qp_type::IBV_QPT_RC;
    let qa = a.qp_with(ty, cap(8, 8), true, cqa.cast(), cqa.cast(), null_mut());
    let qb = b.qp_with(ty, cap(8, 8), true, cqb.cast(), cqb.cast(), null_mut());
    bring_up(qa, ty, b.gid, qpn(qb), |_| {});
    bring_up(qb, ty, a.gid, qpn(qa), |_| {});
    let (mut src, mut dst) = (vec![1u8; 64], vec![0u8; 64 * 4]);
    let (smr, dmr) = (a.reg(&mut src, ALL_ACCESS), b.reg(&mut dst, ALL_ACCESS));
    for i in 0..4 {
        post_recv(
            qb,
            &mut [recv_wr(i, &[sge(&dst[i as usize * 64..][..64], dmr)])],
        )
        .unwrap();
    }
    let wall = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    };
    let before = wall();
    for i in 0..4 {
        let wr = send_wr(i, ibv_wr_opcode::IBV_WR_SEND, &[sge(&src, smr)], SIGNALED);
        post_send(qa, &mut [wr]).unwrap();
        f.advance(std::time::Duration::from_micros(50));
    }
    let mut stamps = Vec::new();
    for _ in 0..1000 {
        if stamps.len() == 4 {
            break;
        }
        f.step();
        // SAFETY: a live extended CQ; its callbacks are set.
        let c = unsafe { &*cqb };
        // SAFETY: as above.
        if unsafe { c.start_poll.unwrap()(cqb, null_mut()) } != 0 {
            continue;
        }
        loop {
            // SAFETY: between start_poll and end_poll; the callbacks are set.
            unsafe {
                assert_eq!(c.status, ibv_wc_status::IBV_WC_SUCCESS);
                stamps.push((
                    c.read_completion_ts.unwrap()(cqb),
                    c.read_completion_wallclock_ns.unwrap()(cqb),
                ));
                if c.next_poll.unwrap()(cqb) != 0 {
                    break;
                }
            }
        }
        // SAFETY: as above.
        unsafe { c.end_poll.unwrap()(cqb) };
    }
    let after = wall();
    assert_eq!(stamps.len(), 4, "every receive completed");
    let ticks: Vec<u64> = stamps.iter().map(|s| s.0).collect();
    assert!(ticks.windows(2).all(|w| w[0] <= w[1]), "{ticks:?}");
    assert!(
        ticks[3] - ticks[0] >= 150_000,
        "50 us apart on the fabric's clock: {ticks:?}"
    );
    assert!(
        stamps.iter().all(|s| (before..=after).contains(&s.1)),
        "{stamps:?}"
    );

    type QueryRtValues = unsafe extern "C" fn(*mut ibv_context, *mut ibv_values_ex) -> c_int;
    let query_rt: QueryRtValues = vctx_op(b.ctx, 192);
    let mut v = ibv_values_ex {
        comp_mask: IBV_VALUES_MASK_RAW_CLOCK,
        ..Default::default()
    };
    // SAFETY: a live context and a writable struct.
    assert_eq!(unsafe { query_rt(b.ctx, &mut v) }, 0);
    assert_eq!(v.comp_mask, IBV_VALUES_MASK_RAW_CLOCK);
    assert_eq!(v.raw_clock.tv_sec, 0);
    assert!(v.raw_clock.tv_nsec as u64 >= ticks[3]);

    type QueryDeviceEx = unsafe extern "C" fn(
        *mut ibv_context,
        *const ibv_query_device_ex_input,
        *mut ibv_device_attr_ex,
        usize,
    ) -> c_int;
    let query: QueryDeviceEx = vctx_op(a.ctx, 216);
    let mut attr = ibv_device_attr_ex::default();
    let len = size_of::<ibv_device_attr_ex>();
    // SAFETY: a writable struct of the size given.
    assert_eq!(unsafe { query(a.ctx, std::ptr::null(), &mut attr, len) }, 0);
    assert_eq!(
        (attr.hca_core_clock, attr.completion_timestamp_mask),
        (1_000_000, u64::MAX)
    );
}

#[test]
fn a_poll_of_another_thread_waits_for_end_poll() {
    let f = Fabric::default();
    let p = ex_pair(&f, ALL_SEND_OPS);
    // Three zero-length SENDs: three completions on the sender's CQ.
    for i in 0..3 {
        post_recv(p.qb, &mut [recv_wr(i, &[])]).unwrap();
    }
    let mut wrs: Vec<_> = (0..3)
        .map(|i| send_wr(i, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED))
        .collect();
    post_send(p.qa, &mut wrs).unwrap();
    assert_eq!(poll_n(p.cqb.cast(), 3).len(), 3, "delivered");
    let cq = p.cqa;
    // SAFETY: a live extended CQ; its callbacks are set.
    let c = unsafe { &*cq };
    // SAFETY: as above.
    assert_eq!(unsafe { c.start_poll.unwrap()(cq, null_mut()) }, 0);
    assert_eq!(read(cq).wr_id, 0);
    // The same thread starting again (its end_poll forgotten) goes on with the next one.
    // SAFETY: as above.
    assert_eq!(unsafe { c.start_poll.unwrap()(cq, null_mut()) }, 0);
    assert_eq!(read(cq).wr_id, 1);

    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (addr, flag) = (cq as usize, std::sync::Arc::clone(&done));
    let other = std::thread::spawn(move || {
        let cq = addr as *mut ibv_cq_ex;
        // SAFETY: the CQ outlives this thread (joined below); its callbacks are set.
        let c = unsafe { &*cq };
        // Not this thread's poll: next_poll is refused.
        // SAFETY: as above.
        let refused = unsafe { c.next_poll.unwrap()(cq) };
        // SAFETY: as above.
        let r = unsafe { c.start_poll.unwrap()(cq, null_mut()) };
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
        let wr_id = read(cq).wr_id;
        // SAFETY: as above, after a successful start_poll.
        unsafe { c.end_poll.unwrap()(cq) };
        (refused, r, wr_id)
    });
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(
        !done.load(std::sync::atomic::Ordering::SeqCst),
        "the other thread's start_poll waits for this thread's end_poll"
    );
    // SAFETY: as above.
    unsafe { c.end_poll.unwrap()(cq) };
    assert_eq!(other.join().unwrap(), (libc::EINVAL, 0, 2));
}

#[test]
fn resize_cq_keeps_what_the_cq_holds() {
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    let cq = a.new_cq(8, null_mut());
    // SAFETY: softnic checks the pointer.
    unsafe {
        assert_eq!(softnic::resize_cq(cq, 64), 0);
        assert_eq!((*cq).cqe, 64);
        assert_eq!(softnic::resize_cq(cq, 0), libc::EINVAL);
        assert_eq!(softnic::resize_cq(cq, i32::MAX), libc::EINVAL);
        assert_eq!(softnic::resize_cq(null_mut(), 8), libc::EINVAL);
    }
}
