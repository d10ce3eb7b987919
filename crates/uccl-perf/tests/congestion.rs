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
     --inflight 8";

/// A congestion window whose target (the base RTT of this fabric, 6 us, given, plus 5 us and
/// up to 10 us of flow scaling) keeps the queue within the buffer.
const CC: &str = "--target-delay-us 5 --flow-scaling-us 10 --additive-increase 0.25 \
     --base-rtt-ns 6000 --ack-delay-us 0 --min-window 0.015625";

fn field(v: &serde_json::Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or_else(|| panic!("{k} in {v}"))
}

#[test]
fn without_congestion_control_an_incast_overflows_the_switch_and_with_it_does_not() {
    // Without a window the first flows finish early: measure from 100 us.
    let without = json(&format!("{INCAST} --target-delay-us 0 --warmup-us 100"));
    assert!(
        field(&without, "drops") > 0.0,
        "the receiver's credit alone lets 16 senders overflow a 256 KB buffer: {without}"
    );
    let with = json(&format!("{INCAST} {CC} --warmup-us 1000"));
    assert_eq!(field(&with, "drops"), 0.0, "{with}");
    // Every byte arrived and was checked, both times (the engine recovers what was dropped).
    for v in [&without, &with] {
        assert_eq!(v["verified"], true);
        assert_eq!(field(v, "messages_received"), 16.0 * 64.0);
    }
    // The queue the window keeps is far shorter, and so is the RTT.
    assert!(field(&with, "queue_p99_bytes") < field(&without, "queue_p99_bytes") / 2.0);
    assert!(field(&with, "rtt_p99_us") < field(&without, "rtt_p99_us"));
    // The window shares the bottleneck out, nearly all of it.
    assert!(field(&with, "bottleneck_utilization") > 0.9, "{with}");
    assert!(field(&with, "jain_fairness") > 0.9, "{with}");
    assert!(field(&with, "rtt_p50_us") <= field(&with, "rtt_p99_us"));
}

#[test]
fn an_incast_run_replays_from_its_seed_with_its_drops_and_marks() {
    // Without a congestion window the queue passes RED's thresholds (100 and 400 KB, the
    // buffer 256 KB): marks, and drops.
    let args = format!("{INCAST} --target-delay-us 0 --warmup-us 100 --ecn --seed 7");
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
fn on_a_leaf_spine_more_paths_per_flow_finish_permutation_traffic_sooner() {
    // 8 hosts of one leaf write to the 8 of the other through 8 spines; ECMP on the UDP
    // source port puts a one-QP flow on one spine, and several flows share some spines.
    let run = |qps: u32, seed: u32| {
        json(&format!(
            "--op write --engines 8 --flows 8 --qps-per-flow {qps} --topology leaf-spine \
             --spines 8 --loss 0 --chunk-size 4KiB --msg-size 64KiB --messages 48 \
             --warmup-us 200 --seed {seed} {CC} --hop-delay-ns 1000"
        ))
    };
    for seed in [1, 2] {
        let (one, four) = (run(1, seed), run(4, seed));
        for v in [&one, &four] {
            assert_eq!(v["verified"], true);
        }
        assert!(
            field(&four, "virtual_s") < field(&one, "virtual_s"),
            "seed {seed}: 4 QPs {four}\n1 QP {one}"
        );
        assert!(
            field(&four, "bottleneck_utilization") > field(&one, "bottleneck_utilization"),
            "seed {seed}"
        );
    }
}

#[test]
fn switches_are_refused_where_they_cannot_apply() {
    let out = common::perf("--server --senders 4");
    assert!(!out.status.success());
    let err = common::stderr(&out);
    assert!(
        err.contains("--senders") && err.lines().count() == 1,
        "{err}"
    );
}
