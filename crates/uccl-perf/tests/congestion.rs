//! Incast and permutation runs on softnic's switches (`--senders`, `--topology`), on the
//! virtual clock: congestion control keeps a switch's queue within its buffer where the
//! receiver's credit alone does not, the steady state is reported, and a run replays from its
//! seed.

mod common;
use common::json;

/// 16 senders into one receiver through one switch with a 256 KB buffer: 4 KiB chunks of
/// one-sided writes, 1 flow of 4 QPs each.
const INCAST: &str = "--op write --senders 16 --flows 1 --qps-per-flow 4 --topology star \
     --switch-buffer 256KB --loss 0 --chunk-size 4KiB --msg-size 64KiB --messages 64 \
     --inflight 8 --warmup-us 1000";

/// A congestion window whose target (the base RTT of this fabric, 6 us, given, plus 5 us and
/// up to 10 us of flow scaling) keeps the queue within the buffer.
const CC: &str = "--target-delay-us 5 --flow-scaling-us 10 --additive-increase 0.25 \
     --base-rtt-ns 6000 --ack-delay-us 0 --min-window 0.015625";

fn field(v: &serde_json::Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or_else(|| panic!("{k} in {v}"))
}

#[test]
fn without_congestion_control_an_incast_overflows_the_switch_and_with_it_does_not() {
    let without = json(&format!("{INCAST} --target-delay-us 0"));
    assert!(
        field(&without, "drops") > 0.0,
        "the receiver's credit alone lets 16 senders overflow a 256 KB buffer: {without}"
    );
    let with = json(&format!("{INCAST} {CC}"));
    assert_eq!(field(&with, "drops"), 0.0, "{with}");
    // Every byte arrived and was checked, both times (the engine recovers what was dropped).
    for v in [&without, &with] {
        assert_eq!(v["verified"], true);
        assert_eq!(field(v, "messages_received"), 16.0 * 64.0);
    }
    // The queue the window keeps is far shorter, and so is the RTT.
    assert!(field(&with, "queue_p99_bytes") < field(&without, "queue_p99_bytes") / 2.0);
    assert!(field(&with, "rtt_p99_us") < field(&without, "rtt_p99_us"));
    for k in [
        "bottleneck_utilization",
        "jain_fairness",
        "rtt_p50_us",
        "rtt_mean_us",
        "message_p99_us",
        "ecn_marks",
    ] {
        assert!(field(&with, k) >= 0.0, "{k}");
    }
    assert!(field(&with, "jain_fairness") <= 1.0);
}

#[test]
fn an_incast_run_replays_from_its_seed_with_its_drops_and_marks() {
    // Without a congestion window the queue passes RED's thresholds (100 and 400 KB, the
    // buffer 256 KB): marks, and drops.
    let args = format!("{INCAST} --target-delay-us 0 --ecn --seed 7");
    let (a, b) = (json(&args), json(&args));
    assert!(
        field(&a, "ecn_marks") > 0.0 && field(&a, "drops") > 0.0,
        "{a}"
    );
    for k in [
        "drops",
        "ecn_marks",
        "queue_p99_bytes",
        "rtt_p99_us",
        "jain_fairness",
        "virtual_s",
    ] {
        assert_eq!(a[k], b[k], "{k}");
    }
}

#[test]
fn leaf_spine_permutation_traffic_runs_over_every_path() {
    for qps in [1, 4] {
        let v = json(&format!(
            "--op write --engines 4 --flows 4 --qps-per-flow {qps} --topology leaf-spine \
             --spines 4 --loss 0 --chunk-size 4KiB --msg-size 64KiB --messages 16 \
             --warmup-us 50 {CC}"
        ));
        assert_eq!(v["verified"], true);
        assert!(field(&v, "bottleneck_utilization") > 0.0, "{v}");
    }
}
