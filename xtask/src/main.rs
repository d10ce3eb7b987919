//! The project's task runner (the rust-analyzer `xtask` pattern): `cargo xtask <task>`.
//!
//! ```text
//! cargo xtask setup          check (and as root, install) the system packages the build needs
//! cargo xtask test           setup, fmt --check, clippy -D warnings, the whole test suite
//! cargo xtask demo [ARGS]    setup, release build, run `uccl-perf` (ARGS are passed on)
//! cargo xtask bench          setup, release build, the side-by-side benchmark table
//! cargo xtask bench criterion [ARGS]  the criterion benchmarks (ARGS go to `cargo bench`)
//! cargo xtask capture       two softnic processes under tshark: RoCEv2 decoded, ICRCs right
//! cargo xtask interop       rdma-core's pingpongs and perftest, unmodified, on softnic
//! cargo xtask soak [CASES]   setup, the property tests with CASES cases each, and the long
//!                            hostile runs (release build)
//! cargo xtask miri           the unsafe crates' tests under Miri (nightly)
//! cargo xtask fresh-clone    `cargo test` of uccl-integration and softnic-verbs in a fresh clone
//! ```
//!
//! Only the standard library: the task runner must build before anything else does.

mod capture;
mod interop;
mod run;
mod seed;
mod setup;
mod tasks;

use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <task> [args]

tasks:
  setup          check the system packages the build needs; install them with apt-get when
                 run as root, otherwise print the exact command and fail
  test           setup, cargo fmt --check, cargo clippy -D warnings, the whole test suite
  demo [ARGS]    setup, build release, run uccl-perf with its defaults (ARGS are passed on)
  bench          setup, build release, print the side-by-side benchmark table (markdown:
                 chained vs single posts, shared vs per-QP CQs, SRQ vs per-QP RQs, bufpool
                 vs ArrayQueue, goodput under loss, softnic vs memcpy; ~15 s once built);
                 `bench table --only 2,4` prints only those rows
  bench criterion [ARGS]
                 setup, the criterion benchmarks (ARGS are passed to cargo bench, e.g.
                 `criterion -- tx`); `bench -- ARGS` does the same
  bench all [ARGS]
                 the table, then the criterion benchmarks
  capture        two uccl-perf processes on softnic's UDP link under tshark (lo, udp port
                 4791): every frame must decode as InfiniBand, none malformed, every ICRC
                 right (part of `test`)
  interop        build softnic-verbs, then run ibv_devices, ibv_devinfo, the ibv_*_pingpong
                 programs and perftest's ib_{write,send,read}_{bw,lat} unmodified on softnic
                 (softnic-run), server and client processes over RoCEv2 on lo (part of `test`)
  soak [CASES]   setup, the property tests with CASES cases each (default 20000; the engine's
                 whole-workload property a fiftieth of that), then the long hostile runs
                 (engine_hostile's ignored tests), release build
  miri           bufpool's unit tests and verbs-safe's (unit and on softnic) under Miri:
                 nightly, installed with rustup when missing; a few minutes
  fresh-clone    cargo test -p uccl-integration -p softnic-verbs in a fresh clone of the
                 committed tree (target/fresh-clone), as a new user runs it (part of `test`)
  help           this text
";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let task = args.next();
    let rest: Vec<String> = args.collect();
    let result = match task.as_deref() {
        Some("setup") => no_args("setup", &rest).and_then(|()| setup::run()),
        Some("test") => no_args("test", &rest).and_then(|()| tasks::test()),
        Some("demo") => tasks::demo(&rest),
        Some("bench") => tasks::bench(&rest),
        Some("soak") => tasks::soak(&rest),
        Some("miri") => no_args("miri", &rest).and_then(|()| tasks::miri()),
        Some("fresh-clone") => no_args("fresh-clone", &rest).and_then(|()| tasks::fresh_clone()),
        Some("interop") => no_args("interop", &rest)
            .and_then(|()| setup::run())
            .and_then(|()| interop::interop()),
        Some("capture") => no_args("capture", &rest)
            .and_then(|()| setup::run())
            .and_then(|()| capture::capture()),
        Some("help" | "-h" | "--help") => {
            print!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown task `{other}`\n\n{USAGE}")),
        None => Err(USAGE.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("xtask: {msg}");
            ExitCode::FAILURE
        }
    }
}

fn no_args(task: &str, rest: &[String]) -> Result<(), String> {
    match rest.first() {
        None => Ok(()),
        Some(arg) => Err(format!(
            "`{task}` takes no arguments, got `{arg}`\n\n{USAGE}"
        )),
    }
}
