//! The congestion window (`TxConfig::target_delay_us` and Swift's terms): the chunks in flight
//! it allows, how it shrinks for a queue (persistent or Swift's rule) and grows again, and the
//! pacing of a window below one chunk.

mod util;

use uccl_tx::TxConfig;
use uccl_tx::wire::AckRepr;
use util::*;

/// A flow with a target delay of 50 us (a queue that persists only, or Swift's rule), 16
/// chunks in flight (its initial window, which then stalls it), and chunk 0 acknowledged at
/// 10 us: the smallest RTT, so the target is 10 + 50 = 60 us.
fn sixteen_in_flight(persistent_delay: bool) -> uccl_tx::Tx {
    let (mut t, _) = one_path(TxConfig {
        target_delay_us: 50,
        peer_ack_delay_us: 40,
        persistent_delay,
        ..chunks_of_100()
    });
    t.send(1, msg(100 * 100)).unwrap();
    let (wrs, _) = post_all(&mut t, 0);
    assert_eq!(wrs.len(), 16, "the initial window");
    assert!(post_all(&mut t, 0).0.is_empty());
    assert!(t.stats().window_stalls > 0);
    t.on_ack(10_000, &ack(1, 1, 0));
    t
}

/// With a target delay (and the default `persistent_delay`), a flow's chunks in flight stay
/// within its congestion window: 16 to start; once the RTT (less the receiver's hold time) has
/// stayed over the smallest RTT seen plus the target delay for a smoothed RTT, it shrinks in
/// proportion to the excess (by at most half); ACKs below grow it by a chunk per window.
#[test]
fn a_congestion_window_shrinks_for_a_queue_that_persists() {
    let mut t = sixteen_in_flight(true);
    // Chunks 1-7 acknowledged at 200 us, held 40 us by the receiver: an RTT of 160 us, over
    // the target, but one sample is not a queue yet.
    let held = |cum, echo| AckRepr {
        queue_ns: 40_000,
        ..ack(1, cum, echo)
    };
    t.on_ack(200_000, &held(8, 7));
    assert_eq!(t.flow_info(1).unwrap().window, 16);
    // The rest 60 us later (more than the smoothed RTT, 53 us with this sample), still over:
    // RTT 220 us, 160 over the target: keep 1 - 0.8 * 160 / 220 = 42%, at least half: 8.
    t.on_ack(260_000, &held(16, 15));
    assert_eq!(t.flow_info(1).unwrap().window, 8);
    let (wrs, _) = post_all(&mut t, 300_000);
    assert_eq!(wrs.len(), 8);
    // Those 8 acknowledged 10 us later, under the target: one chunk more.
    t.on_ack(310_000, &ack(1, 24, 23));
    assert_eq!(t.flow_info(1).unwrap().window, 9);
    assert_eq!(post_all(&mut t, 310_000).0.len(), 9);
}

/// With Swift's decrease (`persistent_delay` off), the first ACK whose RTT (less the
/// receiver's hold time) exceeds the smallest RTT seen plus the target delay shrinks the window
/// in proportion (by at most half, at most once per smoothed RTT).
#[test]
fn swifts_rule_shrinks_the_window_at_the_first_sample_over_the_target() {
    let mut t = sixteen_in_flight(false);
    // Chunks 1-7 acknowledged at 200 us, held 40 us by the receiver: an RTT of 160 us, 100
    // over the target: keep 1 - 0.8 * 100 / 160 = 50%.
    let held = |cum, echo| AckRepr {
        queue_ns: 40_000,
        ..ack(1, cum, echo)
    };
    t.on_ack(200_000, &held(8, 7));
    assert_eq!(t.flow_info(1).unwrap().window, 8);
    // 20 us later, within the smoothed RTT (about 48 us), still over: the same queue.
    t.on_ack(220_000, &held(12, 11));
    assert_eq!(t.flow_info(1).unwrap().window, 8);
    // 100 us after the cut (the smoothed RTT is about 74 us), still over: RTT 260 us, 200
    // over: keep 1 - 0.8 * 200 / 260 = 38%, at least half: 4.
    t.on_ack(300_000, &held(16, 15));
    assert_eq!(t.flow_info(1).unwrap().window, 4);
    let (wrs, _) = post_all(&mut t, 300_000);
    assert_eq!(wrs.len(), 4);
    // Those 4 acknowledged 10 us later, under the target: one chunk more.
    t.on_ack(310_000, &ack(1, 20, 19));
    assert_eq!(t.flow_info(1).unwrap().window, 5);
    assert_eq!(post_all(&mut t, 310_000).0.len(), 5);
}

/// Without a target delay there is no congestion window: the credit alone bounds a flow.
#[test]
fn without_a_target_delay_only_the_credit_bounds_a_flow() {
    let (mut t, _) = one_path(chunks_of_100());
    t.send(1, msg(100 * 100)).unwrap();
    assert_eq!(post_all(&mut t, 0).0.len(), 64, "the path's depth");
    assert_eq!(t.stats().window_stalls, 0);
    assert_eq!(t.flow_info(1).unwrap().window, u16::MAX);
}

/// A congestion window cut below one chunk paces the flow: after a chunk goes, the next waits
/// `srtt / window` (a pacing timer wakes the flow), where without pacing (the negative
/// control) the window counts as one chunk in flight and the next goes as soon as the last is
/// acknowledged.
#[test]
fn a_window_below_one_chunk_paces_the_flow() {
    for pacing in [true, false] {
        let (mut t, p) = one_path(TxConfig {
            target_delay_us: 10,
            // A window of one chunk to start with (the SACK window bounds it).
            flow_window: 1,
            // The smallest increase, so that one ACK under the target leaves it below a chunk.
            additive_increase: 1,
            // One sample over the target cuts the window (Swift's rule), below one chunk.
            persistent_delay: false,
            min_window: 16,
            pacing,
            ..chunks_of_100()
        });
        t.send(1, msg(100 * 100)).unwrap();
        assert_eq!(post_all(&mut t, 0).0.len(), 1);
        // The first ACK, 10 us: the base, so the target is 20 us.
        t.on_ack(10_000, &ack(1, 1, 0));
        assert_eq!(post_all(&mut t, 10_000).0.len(), 1);
        // Its RTT 1 ms, far over the target: the window halves, to half a chunk.
        let now = 1_010_000;
        t.on_ack(now, &ack(1, 2, 1));
        // One chunk goes, and is acknowledged 10 us later (under the target).
        assert_eq!(post_all(&mut t, now).0.len(), 1, "pacing {pacing}");
        let acked = now + 10_000;
        t.on_ack(acked, &ack(1, 3, 2));
        let srtt = t.path_srtt(p).unwrap();
        let next = post_all(&mut t, acked).0;
        if !pacing {
            assert_eq!(next.len(), 1, "one chunk in flight at all times");
            assert_eq!(t.stats().pacing_stalls, 0);
            continue;
        }
        assert!(next.is_empty(), "paced: the next chunk waits");
        assert!(t.stats().pacing_stalls > 0);
        // It goes when the pacing timer fires, srtt / window (about 2 srtt) after the last.
        let sent_at = loop {
            let at = t.poll_timeout().expect("a pacing timer");
            t.handle_timeout(at);
            if !post_all(&mut t, at).0.is_empty() {
                break at;
            }
        };
        let gap = sent_at - now;
        assert!(gap > 3 * srtt / 2 && gap < 3 * srtt, "{gap} vs srtt {srtt}");
    }
}

/// An RTT that may hold host time (an ACK found long after this end last looked, a chunk the
/// receiver held beyond its declared ACK delay) steers the window only where the host's time
/// cannot change the verdict: a sample over the target with the host's time but under it
/// without leaves the window as it was (counted), while one over the target even without the
/// host's time cuts it for what is left. The RTO learns from every sample.
#[test]
fn an_rtt_that_may_be_host_time_does_not_steer_the_window() {
    // Swift's rule: one sample over the target (60 us) would cut the window.
    let mut t = sixteen_in_flight(false);
    let held = |cum, echo, us: u32| AckRepr {
        queue_ns: us * 1000,
        ..ack(1, cum, echo)
    };
    let srtt = t.path_srtt(uccl_tx::PathId(0)).unwrap();
    // RTT 200 us less 40 held: 160, over the target; but this end last looked 150 us before
    // it found the ACK, which may have waited all that time: 10 us without it.
    t.on_ack_seen(200_000, 50_000, &held(8, 7, 40));
    assert_eq!(t.flow_info(1).unwrap().window, 16);
    assert_eq!(t.stats().host_delayed_samples, 1);
    assert_ne!(
        t.path_srtt(uccl_tx::PathId(0)).unwrap(),
        srtt,
        "the RTO still learns"
    );
    // The receiver held the chunk 240 us, 200 beyond its declared 40: 200 - 40 = 160 us with
    // the hold's excess, nothing without it.
    t.on_ack_seen(240_000, 239_000, &held(12, 11, 240));
    assert_eq!(t.flow_info(1).unwrap().window, 16);
    assert_eq!(t.stats().host_delayed_samples, 2);
    // Found 60 us after a look, held 40 us: 220 us, and 160 even if the 60 were the host's,
    // over the target either way: a queue. Keep 1 - 0.8 * 100 / 160 = 50%: 8.
    t.on_ack_seen(260_000, 200_000, &held(16, 15, 40));
    assert_eq!(t.flow_info(1).unwrap().window, 8);
    assert_eq!(t.stats().host_delayed_samples, 2);
}
