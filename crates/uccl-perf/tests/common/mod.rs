//! Running the built uccl-perf binary and reading what it prints.

#![allow(dead_code, unreachable_pub)]

use std::process::{Command, Output};

/// Runs uccl-perf with `args` (split at spaces).
pub fn perf(args: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_uccl-perf"))
        .args(args.split_whitespace())
        .output()
        .expect("uccl-perf runs")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The one JSON object a `--json` run prints.
pub fn json(args: &str) -> serde_json::Value {
    let out = perf(&format!("--json {args}"));
    assert!(out.status.success(), "{args}: {}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 1, "one line: {text}");
    serde_json::from_str(&text).expect("one JSON object")
}
