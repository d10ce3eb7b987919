//! `test`, `demo` and `bench`.

use crate::run::{cargo_cmd, cmd, status, succeeds, target_bin, workspace_root};
use crate::setup;

/// The test command of the README: everything CI checks.
pub(crate) fn test() -> Result<(), String> {
    setup::run()?;
    // The free disk, for the log: a cold run writes about 3 GB under target/ (a linker that
    // runs out of space dies of SIGBUS, which says nothing about disk).
    let _ = status(&mut cmd("df", &["-h", "."]));
    status(&mut cargo_cmd(&["fmt", "--all", "--check"]))?;
    status(&mut cargo_cmd(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--locked",
        "--",
        "-D",
        "warnings",
    ]))?;
    // Every public item's docs, their links included (after clippy: the dependencies'
    // metadata it checked serve here too).
    status(
        cargo_cmd(&["doc", "--workspace", "--no-deps", "--locked"])
            .env("RUSTDOCFLAGS", "-D warnings"),
    )?;
    // Everything the later steps run (the launcher and the drop-in libibverbs for interop,
    // uccl-perf and check_capture for capture), and the tests.
    crate::run::build_workspace()?;
    if succeeds(&mut cargo_cmd(&["nextest", "--version"])) {
        status(&mut cargo_cmd(&[
            "nextest",
            "run",
            "--workspace",
            "--all-targets",
            "--locked",
            "--no-fail-fast",
        ]))?;
    } else {
        eprintln!("xtask test: cargo-nextest not found, using cargo test");
        status(&mut cargo_cmd(&[
            "test",
            "--workspace",
            "--all-targets",
            "--locked",
            "--no-fail-fast",
        ]))?;
    }
    status(&mut cargo_cmd(&[
        "test",
        "--workspace",
        "--doc",
        "--locked",
    ]))?;
    loom()?;
    crate::capture::capture()?;
    crate::interop::interop()?;
    fresh_clone()?;
    eprintln!("xtask test: all green");
    Ok(())
}

/// Builds release and runs `uccl-perf` with its defaults on the built-in software NIC.
pub(crate) fn demo(args: &[String]) -> Result<(), String> {
    setup::run()?;
    build_release(&["uccl-perf"])?;
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    status(&mut cmd(&release_bin("uccl-perf"), &argv))
}

/// Builds `packages` in release.
fn build_release(packages: &[&str]) -> Result<(), String> {
    let mut argv = vec!["build", "--release", "--locked"];
    for p in packages {
        argv.extend(["--package", p]);
    }
    status(&mut cargo_cmd(&argv))
}

/// A binary of the release build.
fn release_bin(name: &str) -> String {
    target_bin("release", name)
}

/// The benchmarks. No arguments, or `table [ARGS]` (ARGS go to `bench-table`, e.g.
/// `--only 2`): the side-by-side table of uccl-benches' `bench-table`, markdown on stdout.
/// `criterion [ARGS]`: the criterion benchmarks of the workspace, ARGS going to `cargo bench`
/// (`criterion -- tx` for one); arguments that name no mode go to `cargo bench` too (`cargo
/// xtask bench -- tx`). `all [ARGS]`: the table, then the criterion benchmarks.
pub(crate) fn bench(args: &[String]) -> Result<(), String> {
    setup::run()?;
    match args.first().map(String::as_str) {
        None => bench_table(&[]),
        Some("table") => bench_table(&args[1..]),
        Some("criterion") => criterion(&args[1..]),
        Some("all") => {
            bench_table(&[])?;
            criterion(&args[1..])
        }
        Some(_) => criterion(args),
    }
}

/// Builds release and runs `bench-table`, which runs the release `uccl-perf` for three rows.
fn bench_table(args: &[String]) -> Result<(), String> {
    // softnic-verbs: `softnic-run` and its library, for the UCX row.
    build_release(&["uccl-perf", "uccl-benches", "softnic-verbs"])?;
    let perf = release_bin("uccl-perf");
    let mut argv = vec!["--perf", &perf];
    argv.extend(args.iter().map(String::as_str));
    status(&mut cmd(&release_bin("bench-table"), &argv))
}

/// The criterion benchmarks of the workspace; `args` go to `cargo bench`.
fn criterion(args: &[String]) -> Result<(), String> {
    let mut argv = vec!["bench", "--workspace", "--locked"];
    argv.extend(args.iter().map(String::as_str));
    status(&mut cargo_cmd(&argv))
}

/// `cargo test` of the packages whose tests run programs (`uccl-integration`, and
/// `softnic-verbs`, whose tests run its `softnic-run` launcher) as a new user runs it: in a
/// fresh clone of the committed tree, with nothing built beforehand by this task runner
/// (tests that need a binary must get cargo to build it). The clone builds into a target
/// directory of its own, `fresh-clone` under the workspace's, kept between runs so that only
/// the workspace's crates are built again (the clone's sources are new). The registry crates
/// the workspace's own build compiled are seeded there first ([`crate::seed`]), so a first run
/// builds only the dependencies the clone resolves otherwise.
pub(crate) fn fresh_clone() -> Result<(), String> {
    let clone = std::env::temp_dir().join(format!("uccl-fresh-clone-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&clone);
    let workspace_target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let target = workspace_target.join("fresh-clone");
    let root = workspace_root();
    let from = workspace_target.join("debug");
    crate::seed::clear_leftovers(&target.join("debug"))
        .map_err(|e| format!("clearing {}: {e}", target.display()))?;
    let lock = std::fs::read_to_string(root.join("Cargo.lock")).unwrap_or_default();
    if from.join(".fingerprint").is_dir() {
        match crate::seed::registry_builds(&lock, &from, &target.join("debug")) {
            Ok(n) => eprintln!(
                "xtask fresh-clone: {n} registry builds seeded from {}",
                from.display()
            ),
            // Only slower: the clone builds them.
            Err(e) => eprintln!("xtask fresh-clone: seeding from {}: {e}", from.display()),
        }
    }
    let result = status(&mut cmd(
        "git",
        &[
            "clone",
            "--quiet",
            &root.to_string_lossy(),
            &clone.to_string_lossy(),
        ],
    ))
    .and_then(|()| {
        status(
            cargo_cmd(&[
                "test",
                "--locked",
                "--package",
                "uccl-integration",
                "--package",
                "softnic-verbs",
            ])
            .current_dir(&clone)
            .env("CARGO_TARGET_DIR", &target),
        )
    });
    let _ = std::fs::remove_dir_all(&clone);
    result.map_err(|e| format!("in a fresh clone of the committed tree: {e}"))
}

/// The loom models of bufpool's lock-free pool: exhaustive (no preemption bound; they are small),
/// in a target directory of their own because `--cfg loom` rebuilds everything it touches, and
/// unoptimised (the workspace's `loom` profile), which builds in a fifth of release's time.
fn loom() -> Result<(), String> {
    let target = workspace_root().join("target/loom");
    status(
        cargo_cmd(&[
            "test",
            "--package",
            "bufpool",
            "--test",
            "loom",
            "--profile",
            "loom",
            "--locked",
        ])
        .env("RUSTFLAGS", "--cfg loom")
        .env("CARGO_TARGET_DIR", target),
    )
}

/// The property tests of softnic, uccl-tx and bufpool with many more cases than CI runs.
pub(crate) fn soak(args: &[String]) -> Result<(), String> {
    let cases = match args {
        [] => "20000".to_string(),
        [n] if n.parse::<u32>().is_ok() => n.clone(),
        _ => return Err(format!("`soak` takes one number of cases, got {args:?}")),
    };
    setup::run()?;
    for (package, test) in [
        ("softnic", "abi"),
        ("uccl-tx", "model"),
        ("bufpool", "model"),
    ] {
        let filter = if package == "softnic" { "props" } else { "" };
        let mut argv = vec![
            "test",
            "--release",
            "--locked",
            "--package",
            package,
            "--test",
            test,
        ];
        if !filter.is_empty() {
            argv.push(filter);
        }
        status(cargo_cmd(&argv).env("PROPTEST_CASES", &cases))?;
    }
    // Each engine case runs several engines through a whole workload: a fiftieth as many.
    let engine_cases = (cases.parse::<u32>().unwrap_or(20_000) / 50)
        .max(16)
        .to_string();
    // The engine's property tests, then the long runs the test matrix leaves out.
    for (test, ignored) in [
        ("engine_props", false),
        ("engine_switches", false),
        ("engine_hostile", true),
    ] {
        let mut argv = vec![
            "test",
            "--release",
            "--locked",
            "--package",
            "uccl-integration",
            "--test",
            test,
        ];
        if ignored {
            argv.extend(["--", "--ignored"]);
        }
        status(cargo_cmd(&argv).env("PROPTEST_CASES", &engine_cases))?;
    }
    eprintln!("xtask soak: {cases} cases each ({engine_cases} for the engine), all green");
    Ok(())
}

/// The unit tests of the crates with `unsafe` code, and verbs-safe's tests on softnic, under
/// Miri (Stacked Borrows): every pointer they follow is checked. Needs the nightly toolchain's
/// `miri` and `rust-src` (installed here with rustup when missing). softnic's object shells
/// live for the process (their addresses are never reused): leaks are not reported; the
/// tests that sleep in poll(2), which Miri does not have, are skipped.
pub(crate) fn miri() -> Result<(), String> {
    if !succeeds(&mut cmd("cargo", &["+nightly", "miri", "--version"])) {
        let add = ["+nightly", "component", "add", "miri", "rust-src"];
        status(&mut cmd("rustup", &add)).map_err(|e| {
            format!("{e}: Miri needs the nightly toolchain: rustup toolchain install nightly --component miri,rust-src")
        })?;
    }
    for (package, tests) in [
        ("bufpool", &["--lib"][..]),
        ("verbs-safe", &["--lib", "--test", "soft"][..]),
    ] {
        let mut argv = vec!["+nightly", "miri", "test", "--locked", "--package", package];
        argv.extend(tests);
        argv.extend(["--", "--skip", "completions::"]);
        status(
            cmd("cargo", &argv).env("MIRIFLAGS", "-Zmiri-disable-isolation -Zmiri-ignore-leaks"),
        )?;
    }
    eprintln!("xtask miri: all green");
    Ok(())
}
