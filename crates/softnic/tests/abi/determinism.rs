//! Point 8: Progress: nothing runs in the background; the same seed and the same calls give the same
//! completions, bit for bit.

use crate::common::*;

/// A run with faults: returns every completion of both sides and the counters.
fn run(seed: u64) -> (Vec<Wc>, Vec<Wc>, Counters, std::time::Duration) {
    let f = Fabric::new(FabricConfig {
        seed,
        ..Default::default()
    });
    f.set_default_faults(Faults {
        loss: 0.05,
        reorder: 0.05,
        reorder_delay_ns: 5000,
        duplicate: 0.05,
        corrupt: 0.02,
        ..Faults::NONE
    })
    .unwrap();
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 64);
    let mut src: Vec<u8> = (0..64 * 2500).map(|i| (i * 7 % 256) as u8).collect();
    let mut dst = vec![0u8; 64 * 2500];
    let smr = a.reg(&mut src, LOCAL_WRITE);
    let dmr = b.reg(&mut dst, LOCAL_WRITE);
    let mut rs: Vec<[ibv_sge; 1]> = dst.chunks(2500).map(|c| [sge(c, dmr)]).collect();
    let mut rw: Vec<ibv_recv_wr> = rs
        .iter_mut()
        .enumerate()
        .map(|(i, s)| recv_wr(i as u64, s))
        .collect();
    post_recv(qb, &mut rw).unwrap();
    let mut ss: Vec<[ibv_sge; 1]> = src.chunks(2500).map(|c| [sge(c, smr)]).collect();
    let mut sw: Vec<ibv_send_wr> = ss
        .iter_mut()
        .enumerate()
        .map(|(i, s)| {
            with_imm(
                send_wr(i as u64, ibv_wr_opcode::IBV_WR_SEND_WITH_IMM, s, SIGNALED),
                i as u32,
            )
        })
        .collect();
    post_send(qa, &mut sw).unwrap();
    let sent = poll_n(a.cq, 64);
    let got = poll_n(b.cq, 64);
    assert_eq!(dst, src, "seed {seed}");
    (sent, got, f.device_counters("soft0").unwrap(), f.now())
}

#[test]
fn same_seed_same_run_bit_for_bit() {
    for seed in [1, 2, 99] {
        let x = run(seed);
        let y = run(seed);
        assert_eq!(x, y, "seed {seed} did not replay");
    }
    let (a, b) = (run(1), run(2));
    assert_ne!(
        (a.2, a.3),
        (b.2, b.3),
        "different seeds give different fault schedules"
    );
}

#[test]
fn nothing_happens_without_a_poll_or_a_step() {
    let f = still();
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    post_recv(qb, &mut [recv_wr(1, &[])]).unwrap();
    post_send(
        qa,
        &mut [send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED)],
    )
    .unwrap();
    // The packet left at post time, but the clock has not moved: it is still in flight.
    assert_eq!(f.in_flight(), 1);
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(f.in_flight(), 1, "no background thread");
    assert_eq!(f.now(), std::time::Duration::ZERO);
    assert!(
        poll(b.cq, 1).is_empty(),
        "auto_advance is off: polling alone does not move time"
    );
    f.advance(std::time::Duration::from_micros(2));
    assert_eq!(poll(b.cq, 1).len(), 1);
    f.run_until_idle().unwrap();
    assert_eq!(poll(a.cq, 1).len(), 1);
}

#[test]
fn run_until_idle_gives_up_on_endless_work() {
    let f = Fabric::new(FabricConfig {
        idle_limit: std::time::Duration::from_millis(5),
        ..Default::default()
    });
    let (_a, qa, _b, _qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    // rnr_retry 7 and no receive: RNR NAKs forever.
    post_send(
        qa,
        &mut [send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED)],
    )
    .unwrap();
    match f.run_until_idle() {
        Err(softnic::Error::StillBusy { now }) => {
            assert!(now >= std::time::Duration::from_millis(5))
        }
        other => panic!("expected StillBusy, got {other:?}"),
    }
}

#[test]
fn a_progress_thread_drives_a_sleeping_caller() {
    // A thread of its own drives the fabric: the wall clock, which it never runs ahead of.
    let f = Fabric::new(FabricConfig {
        clock: softnic::Clock::Wall,
        ..Default::default()
    });
    let (_a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    let _driver = f.spawn_progress_thread();
    post_recv(qb, &mut [recv_wr(1, &[])]).unwrap();
    post_send(
        qa,
        &mut [send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED)],
    )
    .unwrap();
    let start = std::time::Instant::now();
    while poll(b.cq, 1).is_empty() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "progress thread did not deliver"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}
