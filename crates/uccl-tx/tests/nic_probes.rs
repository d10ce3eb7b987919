//! NIC probes (`TxConfig::nic_probe_us`): on RC, where the NIC recovers losses and the
//! transmit side's own timers are out of reach, a path whose posted WRs see no completion for
//! the interval gets a zero-length signaled RDMA WRITE behind them (a later packet that shows
//! the responder a lost one), once per stall, into a slot the path keeps for it, and never
//! while completions come or other WRs go out.

mod util;

use uccl_tx::{Event, TxConfig};
use util::*;
use verbs_safe::sys::ibv_wr_opcode;

const MS: u64 = 1_000_000;

/// The transmit side as uccl-engine runs it in RC mode: its retransmission timers an hour
/// away, probes every millisecond.
fn rc(nic_probe_us: u64) -> TxConfig {
    let hour = 3_600_000_000;
    TxConfig {
        rto_min_us: hour,
        rto_initial_us: hour,
        rto_max_us: hour,
        max_silence_us: uccl_tx::MAX_TIME_US,
        tail_probes: false,
        nic_probe_us,
        ..chunks_of_100()
    }
}

/// Runs the transmit side's timers at `now` and posts what it hands out.
fn at(t: &mut uccl_tx::Tx, now: u64) -> Vec<Wr> {
    if t.poll_timeout().is_some_and(|d| d <= now) {
        t.handle_timeout(now);
    }
    post_all(t, now).0
}

fn is_probe(w: &Wr) -> bool {
    (w.opcode, w.num_sge, w.signaled) == (ibv_wr_opcode::IBV_WR_RDMA_WRITE, 0, true)
}

#[test]
fn a_stalled_path_gets_one_zero_length_write_at_a_time() {
    let (mut t, p) = one_path(rc(1000));
    let m = t.send(1, msg(300)).unwrap();
    let sent = at(&mut t, 0);
    assert_eq!(sent.len(), 3);
    assert!(
        t.poll_timeout().is_some_and(|d| d <= MS),
        "a timer within the interval"
    );
    assert!(at(&mut t, MS / 2).is_empty(), "not before the interval");
    // No completion for a millisecond: a probe, on the path, behind the chunks.
    let probe = at(&mut t, MS);
    assert_eq!(probe.len(), 1, "{probe:?}");
    assert!(is_probe(&probe[0]) && probe[0].path == p, "{probe:?}");
    assert_eq!((t.stats().nic_probes, t.stats().signals), (1, 1));
    // The stall goes on (the NIC goes back over what it sent): no second probe while the
    // first is outstanding.
    for k in 2..6 {
        assert!(at(&mut t, k * MS).is_empty(), "{k} ms");
    }
    assert_eq!(t.stats().nic_probes, 1);
    // The probe's completion covers everything before it: no probe after that.
    t.on_send_completion(probe[0].wr_id, true);
    assert_eq!(t.wrs_in_use(), 0);
    t.on_ack(6 * MS, &ack(1, 3, 2));
    assert_eq!(
        t.poll_event(),
        Some(Event::MessageComplete { fid: 1, msg: m })
    );
    for k in 6..10 {
        assert!(at(&mut t, k * MS).is_empty(), "{k} ms");
    }
    // The next stall gets a probe of its own, an interval after its post.
    t.send(1, msg(100)).unwrap();
    assert_eq!(at(&mut t, 10 * MS).len(), 1);
    assert!(at(&mut t, 10 * MS + MS / 2).is_empty());
    let probe = at(&mut t, 11 * MS);
    assert_eq!(probe.len(), 1);
    assert!(is_probe(&probe[0]));
    assert_eq!(t.stats().nic_probes, 2);
}

#[test]
fn a_path_whose_completions_come_gets_no_probe() {
    let (mut t, _) = one_path(rc(1000));
    // A message every 0.4 ms, each completed 0.3 ms after it went: the path is never
    // without a WR outstanding for long, but never a millisecond without progress.
    for k in 0..40u64 {
        let now = k * 400_000;
        t.send(1, msg(100)).unwrap();
        let wrs = at(&mut t, now);
        assert_eq!(wrs.len(), 1, "at {now}: {wrs:?}");
        assert!(at(&mut t, now + 300_000).is_empty());
        complete(&mut t, &wrs);
        t.on_ack(now + 300_000, &ack(1, k as u16 + 1, k as u16));
    }
    // Idle now: nothing outstanding, nothing probed.
    assert!(at(&mut t, 100 * MS).is_empty());
    assert_eq!(t.stats().nic_probes, 0);
}

#[test]
fn new_wrs_on_a_stalled_path_stand_in_for_its_probe() {
    let (mut t, _) = one_path(rc(1000));
    t.send(1, msg(100)).unwrap();
    assert_eq!(at(&mut t, 0).len(), 1);
    // A probe is owed at 1 ms, but a chunk goes in the same round: it is the later packet.
    t.send(1, msg(100)).unwrap();
    let wrs = at(&mut t, MS);
    assert_eq!(t.stats().nic_probes, 1);
    assert_eq!(wrs.len(), 1, "{wrs:?}");
    assert!(!is_probe(&wrs[0]), "the chunk, not a probe: {wrs:?}");
    assert_eq!(t.stats().signals, 0);
}

#[test]
fn without_an_interval_a_stalled_path_waits_for_the_nic() {
    let (mut t, _) = one_path(rc(0));
    t.send(1, msg(300)).unwrap();
    assert_eq!(at(&mut t, 0).len(), 3);
    for k in 1..20 {
        assert!(at(&mut t, k * MS).is_empty(), "{k} ms");
    }
    assert_eq!(t.stats().nic_probes, 0);
}

#[test]
fn a_completion_since_the_last_look_is_progress() {
    let (mut t, _) = one_path(rc(1000));
    t.send(1, msg(100)).unwrap();
    let a = at(&mut t, 0);
    t.send(1, msg(100)).unwrap();
    let b = at(&mut t, MS / 2);
    assert_eq!((a.len(), b.len()), (1, 1));
    // A completes at 0.95 ms: at 1 and 1.5 ms the path is not stalled.
    complete(&mut t, &a);
    for now in [MS, MS + MS / 2] {
        assert!(at(&mut t, now).is_empty(), "at {now}");
    }
    assert_eq!(t.stats().nic_probes, 0);
    // B, alone since 0.95 ms, is probed at the next look.
    let probe = at(&mut t, 2 * MS);
    assert_eq!(probe.len(), 1);
    assert!(is_probe(&probe[0]));
}

#[test]
fn a_full_send_queue_keeps_a_slot_for_its_probe() {
    let mut t = tx(rc(1000));
    let p = t.add_path(4).unwrap();
    t.open_flow(1, &[p], 256).unwrap();
    t.send(1, msg(1000)).unwrap();
    // Three of the four slots go to the flow.
    assert_eq!(at(&mut t, 0).len(), 3);
    assert_eq!(t.path_room(p), 0);
    assert!(!t.reserve(p, 1), "nor may the caller take the spare slot");
    let probe = at(&mut t, MS);
    assert_eq!(probe.len(), 1);
    assert!(is_probe(&probe[0]), "{probe:?}");
    // Without probes the flow has all four.
    let mut t = tx(rc(0));
    let p = t.add_path(4).unwrap();
    t.open_flow(1, &[p], 256).unwrap();
    t.send(1, msg(1000)).unwrap();
    assert_eq!(at(&mut t, 0).len(), 4);
}

#[test]
fn only_the_stalled_path_is_probed() {
    let mut t = tx(rc(1000));
    let (p, q) = (t.add_path(64).unwrap(), t.add_path(64).unwrap());
    t.open_flow(1, &[p, q], 256).unwrap();
    t.send(1, msg(400)).unwrap();
    let sent = at(&mut t, 0);
    assert!(
        sent.iter().any(|w| w.path == p) && sent.iter().any(|w| w.path == q),
        "{sent:?}"
    );
    // Path p's WRs complete; q's do not.
    let on_p: Vec<Wr> = sent.iter().filter(|w| w.path == p).copied().collect();
    complete(&mut t, &on_p);
    let probes = at(&mut t, MS);
    assert_eq!(probes.len(), 1, "{probes:?}");
    assert!(is_probe(&probes[0]) && probes[0].path == q, "{probes:?}");
}

#[test]
fn a_probe_taken_back_leaves_the_stall_to_be_probed_again() {
    let (mut t, _) = one_path(rc(1000));
    t.send(1, msg(100)).unwrap();
    assert_eq!(at(&mut t, 0).len(), 1);
    t.handle_timeout(MS);
    // The provider refuses the probe.
    let (refused, _) = post_with(&mut t, MS, |_, _| 0);
    assert!(refused.is_empty());
    assert_eq!(t.stats().taken_back, 1);
    let probe = at(&mut t, 2 * MS);
    assert_eq!(probe.len(), 1);
    assert!(is_probe(&probe[0]));
    assert_eq!(t.stats().nic_probes, 2);
}
