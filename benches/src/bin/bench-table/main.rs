//! `bench-table`: the side-by-side table of issue 12, printed as markdown (`cargo xtask bench`).
//!
//! Every row compares two things measured in this one run, and the table shows their ratio;
//! nothing is asserted. The rows:
//!
//! 1. chained vs single posts (`uccl-perf --tx-mode`, softnic payload copies off): post calls
//!    per chunk, and CPU ns per chunk, all of it and the stack's own (without softnic's event
//!    loop);
//! 2. one shared CQ vs one CQ per QP: poll cost per completion at 1, 16, 256, 1024 QPs
//!    (verbs-safe on softnic, [`cq`]);
//! 3. SRQ vs per-QP receive queues: receive-buffer memory at 1, 16, 256, 1024 QPs, computed
//!    from the engine's default configuration;
//! 4. bufpool vs crossbeam's `ArrayQueue`: alloc+free pairs;
//! 5. goodput at 0, 1 and 5 % loss relative to lossless (`uccl-perf` default runs);
//! 6. softnic goodput relative to a memcpy of the same bytes;
//! 7. memory and keys: register+deregister and export+withdraw per call at 1024 connections vs
//!    none, and receives advertised with a memory window vs the whole buffer's key
//!    ([`memory`]);
//! 8. connection set-up: set-ups per second one at a time vs 100 at once, and a transfer's
//!    goodput alone vs while 100 clients connect to its engine ([`setup`]);
//! 9. one-sided reads and vectored transfers: READ vs WRITE goodput at 64 KiB (UC and RC), and
//!    one `write_v` of 1024 blocks of 4 KiB vs 1024 `write`s ([`reads`]);
//! 10. UCX on softnic: `ucx_perftest` (`ucp_put_bw`, `tag_bw` at 64 KiB, `tag_lat` at 8 B)
//!     against `ib_write_bw`/`ib_send_lat` on the same softnic link, and against UCX over TCP
//!     on the loopback interface ([`ucx`]; needs `softnic-run` next to this program);
//! 11. message rate: `uccl-perf` between two processes with 0, 8 and 64-byte messages
//!     (messages per second, CPU per message) against `ib_send_bw -s 8` on the same softnic
//!     link ([`msgrate`]);
//! 12. softnic's UDP link: `ib_write_bw -s 65536` against the kernel's own UDP limit on this
//!     machine (`udp-limit`, next to this program) ([`link`]);
//! 13. instructions per chunk of the whole process, counted by callgrind at the margin
//!     between two run lengths, and per poll of an idle engine (`idle-poll`, next to this
//!     program) ([`instructions`]; needs valgrind);
//! 14. the engine between two processes (UC and RC, 64 KiB and 16 KiB chunks) against
//!     `ib_write_bw -s 65536` on the same softnic link (the 16 KiB chunks against
//!     `-s 16384` too), and its retransmissions at 0% loss ([`goodput`]).
//!
//! Rows 1, 5, 6, 7, 9, 11, 13 and 14 run the `uccl-perf` binary (`--perf PATH`, by default the one next to this
//! program: build both with `cargo build --release -p uccl-perf -p uccl-benches`). Progress goes
//! to stderr, the table to stdout.

mod cq;
mod goodput;
mod instructions;
mod link;
mod memory;
mod msgrate;
mod perf;
mod pools;
mod reads;
mod setup;
mod srq;
mod ucx;

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

const USAGE: &str = "\
usage: bench-table [--perf PATH] [--only ROWS]

Prints the side-by-side benchmark table (markdown) of uccl-rs on softnic.
  --perf PATH   the uccl-perf binary (default: the one next to this program)
  --only ROWS   only these rows, e.g. 2 or 1,4 (1-14; the whole table by default)
";

/// What the command line asks for.
struct Opts {
    perf: PathBuf,
    rows: [bool; 15],
}

impl Opts {
    fn parse() -> Result<Opts, String> {
        let mut args = std::env::args().skip(1);
        let mut perf = None;
        let mut rows = [true; 15];
        while let Some(a) = args.next() {
            match a.as_str() {
                "--perf" => perf = Some(PathBuf::from(args.next().ok_or("--perf needs a path")?)),
                "--only" => {
                    let list = args.next().ok_or("--only needs rows, e.g. 1,4")?;
                    rows = [false; 15];
                    for r in list.split(',') {
                        match r.trim().parse::<usize>() {
                            Ok(n @ 1..=14) => rows[n] = true,
                            _ => return Err(format!("--only: {r:?} is not a row (1-14)")),
                        }
                    }
                }
                "-h" | "--help" => {
                    print!("{USAGE}");
                    std::process::exit(0);
                }
                _ => return Err(format!("unknown argument `{a}`\n{USAGE}")),
            }
        }
        let perf = match perf {
            Some(p) => p,
            None => std::env::current_exe()
                .map_err(|e| format!("where is this program? {e}"))?
                .with_file_name("uccl-perf"),
        };
        if !perf.is_file() && rows[1] | rows[5] | rows[6] | rows[7] | rows[9] | rows[11] | rows[13]
        {
            return Err(format!(
                "no uccl-perf at {} (build it: cargo build --release -p uccl-perf, or pass \
                 --perf)",
                perf.display()
            ));
        }
        Ok(Opts { perf, rows })
    }
}

/// One line of the table.
struct Row {
    n: &'static str,
    measure: String,
    case: String,
    baseline: String,
    ours: String,
    ratio: f64,
    target: String,
}

impl Row {
    fn new(
        n: &'static str,
        measure: impl Into<String>,
        case: impl Into<String>,
        baseline: impl Into<String>,
        ours: impl Into<String>,
        ratio: f64,
        target: impl Into<String>,
    ) -> Row {
        Row {
            n,
            measure: measure.into(),
            case: case.into(),
            baseline: baseline.into(),
            ours: ours.into(),
            ratio,
            target: target.into(),
        }
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-table: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What the rows found: table lines and the notes saying how.
#[derive(Default)]
struct Out {
    rows: Vec<Row>,
    notes: Vec<String>,
}

fn run() -> Result<(), String> {
    let opts = Opts::parse()?;
    let t0 = Instant::now();
    let load0 = loadavg();
    let mut out = Out::default();
    let want = |n: usize| opts.rows[n];
    if want(1) {
        eprintln!("[1/9] chained vs single posts (uccl-perf, no payload)");
        perf::post_rows(&opts.perf, &mut out)?;
    }
    if want(2) {
        eprintln!("[2/9] one shared CQ vs one CQ per QP (verbs-safe on softnic)");
        cq::rows(&mut out)?;
    }
    if want(3) {
        eprintln!("[3/9] SRQ vs per-QP receive queues (computed)");
        srq::rows(&mut out);
    }
    if want(4) {
        eprintln!("[4/9] bufpool vs ArrayQueue");
        pools::rows(&mut out)?;
    }
    // Row 6's engine line reads the default runs of row 5.
    let losses = if want(5) || want(6) {
        eprintln!("[5/9] goodput under loss (uccl-perf default runs)");
        Some(perf::loss(&opts.perf, perf::LOSS_SEEDS)?)
    } else {
        None
    };
    if let Some(l) = losses.as_deref().filter(|_| want(5)) {
        perf::loss_rows(l, &mut out);
    }
    if let Some(l) = losses.as_deref().filter(|_| want(6)) {
        eprintln!("[6/9] softnic vs memcpy");
        perf::memcpy_rows(&opts.perf, &l[1], &mut out)?;
    }
    if want(7) {
        eprintln!("[7/9] memory and keys (engines on softnic; uccl-perf --recv-keys)");
        memory::rows(&opts.perf, &mut out)?;
    }
    if want(8) {
        eprintln!("[8/9] connection set-up (three engines on threads, wall clock)");
        setup::rows(&mut out)?;
    }
    if want(9) {
        eprintln!("[9/9] reads and vectored writes (uccl-perf --op read|write|writev)");
        reads::rows(&opts.perf, &mut out)?;
    }
    if want(11) {
        eprintln!("[11/14] message rate: uccl-perf (0, 8, 64 B) vs ib_send_bw -s 8, 2 processes");
        if let Err(e) = msgrate::rows(&opts.perf, 3, &mut out) {
            out.notes.push(format!("Row 11 not measured: {e}"));
        }
    }
    if want(12) {
        eprintln!("[12/14] softnic's UDP link vs the kernel's UDP limit (ib_write_bw, udp-limit)");
        if let Err(e) = link::rows(3, &mut out) {
            out.notes.push(format!("Row 12 not measured: {e}"));
        }
    }
    if want(14) {
        eprintln!("[14/14] the engine between 2 processes vs ib_write_bw (uccl-perf, perftest)");
        // Ten runs of each case: issue 28 asks for no retransmission at 0% loss in ten.
        if let Err(e) = goodput::rows(&opts.perf, 10, &mut out) {
            out.notes.push(format!("Row 14 not measured: {e}"));
        }
    }
    if want(13) {
        eprintln!("[13/14] instructions per chunk (callgrind, uccl-perf --no-payload)");
        if let Err(e) = instructions::rows(&opts.perf, &mut out) {
            out.notes.push(format!("Row 13 not measured: {e}"));
        }
        if let Err(e) = instructions::idle_rows(&mut out) {
            out.notes
                .push(format!("Row 13's idle poll not measured: {e}"));
        }
    }
    if want(10) {
        eprintln!("[10/14] UCX on softnic vs perftest and vs UCX over TCP (ucx_perftest)");
        // UCX and perftest come from setup's packages: without them the row says why.
        if let Err(e) = ucx::rows(&mut out) {
            out.notes.push(format!("Row 10 not measured: {e}"));
        }
    }
    let load1 = loadavg();
    println!("{}", header(load0, load1, t0.elapsed()));
    println!();
    print_table(&out.rows);
    println!();
    for n in out.notes {
        println!("- {n}");
    }
    Ok(())
}

fn print_table(rows: &[Row]) {
    println!("| # | measure | case | baseline | ours | ours / baseline | target |");
    println!("|---|---------|------|---------:|-----:|----------------:|--------|");
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.n,
            r.measure,
            r.case,
            r.baseline,
            r.ours,
            if r.baseline == "-" {
                "1".to_string()
            } else {
                format!("{:.3}", r.ratio)
            },
            if r.target.is_empty() { "-" } else { &r.target },
        );
    }
}

fn header(load0: String, load1: String, took: Duration) -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let os = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_string())
        })
        .unwrap_or_else(|| std::env::consts::OS.into());
    let commit = git(&["rev-parse", "--short", "HEAD"]).map_or_else(
        || "unknown commit".to_string(),
        |c| {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            format!("commit {c}{}", if dirty { " + local changes" } else { "" })
        },
    );
    format!(
        "uccl-rs side-by-side benchmarks: {cpus} CPUs ({model}), {os}, softnic (in-process \
         software NIC, no RDMA hardware), {commit}; load average {load0} before, {load1} after; \
         {:.0} s.",
        took.as_secs_f64()
    )
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

fn mib(bytes: u64) -> String {
    let m = bytes as f64 / f64::from(1 << 20);
    if m >= 1024.0 {
        format!("{:.2} GiB", m / 1024.0)
    } else {
        format!("{m:.1} MiB")
    }
}

fn human(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else if bytes.is_multiple_of(1 << 10) {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_print_as_people_read_them() {
        assert_eq!(mib(16 << 20), "16.0 MiB");
        assert_eq!(mib(2 << 30), "2.00 GiB");
        assert_eq!(human(4096), "4 KiB");
        assert_eq!(human(16 << 20), "16 MiB");
        assert_eq!(human(100), "100 B");
    }

    #[test]
    fn the_srq_rows_follow_the_engine_defaults() {
        let mut out = Out::default();
        srq::rows(&mut out);
        assert_eq!(out.rows.len(), 4);
        // The SRQ's memory does not depend on the QPs; per-QP RQs grow linearly.
        assert!(out.rows.iter().all(|r| r.ours == out.rows[0].ours));
        let r = |i: usize| out.rows[i].ratio;
        assert!((r(0) / r(1) - 16.0).abs() < 1e-9);
    }
}
