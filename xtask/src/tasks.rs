//! `test`, `demo` and `bench`.

use crate::run::{cargo, cmd, status, succeeds, workspace_root};
use crate::setup;

/// The test command of the README: everything CI checks.
pub(crate) fn test() -> Result<(), String> {
    setup::run()?;
    let cargo = cargo();
    status(&mut cmd(&cargo, &["fmt", "--all", "--check"]))?;
    status(&mut cmd(
        &cargo,
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--locked",
            "--",
            "-D",
            "warnings",
        ],
    ))?;
    if succeeds(&mut cmd(&cargo, &["nextest", "--version"])) {
        status(&mut cmd(
            &cargo,
            &[
                "nextest",
                "run",
                "--workspace",
                "--all-targets",
                "--locked",
                "--no-fail-fast",
            ],
        ))?;
    } else {
        eprintln!("xtask test: cargo-nextest not found, using cargo test");
        status(&mut cmd(
            &cargo,
            &[
                "test",
                "--workspace",
                "--all-targets",
                "--locked",
                "--no-fail-fast",
            ],
        ))?;
    }
    status(&mut cmd(
        &cargo,
        &["test", "--workspace", "--doc", "--locked"],
    ))?;
    loom(&cargo)?;
    eprintln!("xtask test: all green");
    Ok(())
}

/// Builds release and runs `uccl-perf` with its defaults on the built-in software NIC.
pub(crate) fn demo(args: &[String]) -> Result<(), String> {
    setup::run()?;
    let cargo = cargo();
    status(&mut cmd(
        &cargo,
        &["build", "--release", "--locked", "--package", "uccl-perf"],
    ))?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let bin = target.join("release/uccl-perf");
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    status(&mut cmd(&bin.to_string_lossy(), &argv))
}

/// Runs the criterion benchmarks of the workspace; extra arguments go to `cargo bench`.
pub(crate) fn bench(args: &[String]) -> Result<(), String> {
    setup::run()?;
    let mut argv = vec!["bench", "--workspace", "--locked"];
    argv.extend(args.iter().map(String::as_str));
    status(&mut cmd(&cargo(), &argv))
}

/// The loom models of bufpool's lock-free pool: exhaustive (no preemption bound; they are small),
/// in a target directory of their own because `--cfg loom` rebuilds everything it touches.
fn loom(cargo: &str) -> Result<(), String> {
    let target = workspace_root().join("target/loom");
    status(
        cmd(
            cargo,
            &[
                "test",
                "--package",
                "bufpool",
                "--test",
                "loom",
                "--release",
                "--locked",
            ],
        )
        .env("RUSTFLAGS", "--cfg loom")
        .env("CARGO_TARGET_DIR", target),
    )
}
