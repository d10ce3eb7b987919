//! The command line: the demo runs, JSON is one object per run, errors are clear.

use std::process::Command;

fn perf(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_uccl-perf"))
        .args(args)
        .output()
        .expect("uccl-perf runs")
}

#[test]
fn the_demo_compares_chained_and_single_posts() {
    let out = perf(&["--iters", "300"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("write_bw chained"), "{text}");
    assert!(text.contains("write_bw one-per-post"));
    assert!(text.contains("10 doorbells instead of 300"), "{text}");
}

#[test]
fn json_is_one_object_per_run() {
    for transport in ["rc", "uc"] {
        let out = perf(&[
            "--json",
            "--iters",
            "100",
            "--size",
            "1000",
            "--transport",
            transport,
            "--batch",
            "10",
        ]);
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].starts_with('{') && lines[0].ends_with('}'));
        assert!(lines[0].contains(&format!("\"transport\":\"{transport}\"")));
        assert!(lines[0].contains("\"posts\":10,"), "{}", lines[0]);
        assert!(lines[1].contains("\"posts\":100,"), "{}", lines[1]);
    }
}

#[test]
fn latency_and_loss_runs_work() {
    let out = perf(&["--test", "write-lat", "--iters", "50", "--size", "8"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("latency (virtual)"));
    let out = perf(&["--loss", "0.02", "--iters", "500", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("\"retransmits\":0,"),
        "loss shows as retransmissions"
    );
}

#[test]
fn errors_are_clear() {
    let out = perf(&["--device", "nope0"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no RDMA device named \"nope0\"") && err.contains("soft0"),
        "{err}"
    );
    let out = perf(&["--size", "many"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "bad arguments are clap's usage error"
    );
    // No hardware here: the system provider says so (or, on a machine with a NIC, runs).
    let out = perf(&["--provider", "system", "--iters", "10"]);
    if !out.status.success() {
        assert!(String::from_utf8_lossy(&out.stderr).contains("no RDMA device"));
    }
}
