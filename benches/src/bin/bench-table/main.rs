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
//!     between two run lengths ([`instructions`]; needs valgrind);
//! 14. the engine between two processes (UC and RC, 64 KiB and 16 KiB chunks) against
//!     `ib_write_bw -s 65536` on the same softnic link, and its retransmissions at 0% loss
//!     ([`goodput`]).
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
mod reads;
mod setup;
mod ucx;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bufpool::{IndexPool, LocalPool, SharedPool};
use uccl_benches::pools::{self, ArrayQueuePool, CAP};
use uccl_engine::EngineConfig;

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

/// Row 6's raw verbs runs: (WRITE size, WRITEs).
const VERBS_RUNS: [(u64, u64); 2] = [(4096, 100_000), (65_536, 10_000)];

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
        post_rows(&opts.perf, &mut out)?;
    }
    if want(2) {
        eprintln!("[2/9] one shared CQ vs one CQ per QP (verbs-safe on softnic)");
        cq_rows(&mut out)?;
    }
    if want(3) {
        eprintln!("[3/9] SRQ vs per-QP receive queues (computed)");
        srq_rows(&mut out);
    }
    if want(4) {
        eprintln!("[4/9] bufpool vs ArrayQueue");
        pool_rows(&mut out)?;
    }
    // Row 6's engine line reads the default runs of row 5.
    let losses = if want(5) || want(6) {
        eprintln!("[5/9] goodput under loss (uccl-perf default runs)");
        Some(perf::loss(&opts.perf, LOSS_SEEDS)?)
    } else {
        None
    };
    if let Some(l) = losses.as_deref().filter(|_| want(5)) {
        loss_rows(l, &mut out);
    }
    if let Some(l) = losses.as_deref().filter(|_| want(6)) {
        eprintln!("[6/9] softnic vs memcpy");
        memcpy_rows(&opts.perf, &l[1], &mut out)?;
    }
    if want(7) {
        eprintln!("[7/9] memory and keys (engines on softnic; uccl-perf --recv-keys)");
        memory_rows(&opts.perf, &mut out)?;
    }
    if want(8) {
        eprintln!("[8/9] connection set-up (three engines on threads, wall clock)");
        setup_rows(&mut out)?;
    }
    if want(9) {
        eprintln!("[9/9] reads and vectored writes (uccl-perf --op read|write|writev)");
        read_rows(&opts.perf, &mut out)?;
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
    }
    if want(10) {
        eprintln!("[10/14] UCX on softnic vs perftest and vs UCX over TCP (ucx_perftest)");
        // UCX and perftest come from setup's packages: without them the row says why.
        if let Err(e) = ucx_rows(&mut out) {
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

/// Row 10: UCX on softnic against perftest on the same link and against UCX over TCP.
fn ucx_rows(out: &mut Out) -> Result<(), String> {
    let rows = ucx::ucx_rows(3)?;
    for r in &rows {
        let fmt = |v: f64| format!("{v:.1} {}", r.unit);
        // Latency: the ratio of rates (baseline / ours), so that above 1 is faster either way.
        let ratio = |base: f64, ours: f64| {
            if r.unit == "MB/s" {
                ours / base
            } else {
                base / ours
            }
        };
        out.rows.push(Row::new(
            "10",
            format!("UCX {} vs {} (softnic, same link)", r.what, r.perftest),
            "2 processes, UCX_TLS=rc_verbs,ud_verbs, softnic UDP link on loopback",
            fmt(r.perftest_value),
            fmt(r.ucx_softnic),
            ratio(r.perftest_value, r.ucx_softnic),
            "near 1: UCX's overhead over raw verbs",
        ));
        out.rows.push(Row::new(
            "10",
            format!("UCX {}: softnic vs UCX_TLS=tcp on lo", r.what),
            "2 processes, same ucx_perftest arguments",
            fmt(r.ucx_tcp),
            fmt(r.ucx_softnic),
            ratio(r.ucx_tcp, r.ucx_softnic),
            "report (TCP is what a user without softnic runs)",
        ));
    }
    out.notes.push(
        "Row 10: medians of 3 runs each of `softnic-run -- ucx_perftest` (server and client, \
         UCX_TLS=rc_verbs,ud_verbs UCX_NET_DEVICES=soft0:1; `-t ucp_put_bw|tag_bw -s 65536 -n \
         5000 -w 500`, `-t tag_lat -s 8 -n 50000 -w 5000`), `softnic-run -- ib_write_bw -d \
         soft0 -x 1 -s 65536 -n 5000`, `softnic-run -- ib_send_lat -d soft0 -x 1 -s 8 -n \
         50000`, and the same ucx_perftest runs without softnic with UCX_TLS=tcp \
         UCX_NET_DEVICES=lo. Bandwidth: overall MB/s (UCX) and BW average (perftest); latency: \
         average one-way µs (UCX's average, perftest's t_avg); the latency ratio is baseline / \
         ours."
            .into(),
    );
    Ok(())
}

/// Row 1: chained vs single posts.
fn post_rows(perf: &Path, out: &mut Out) -> Result<(), String> {
    let ab = perf::post_ab(perf, 7)?;
    let case = "4 flows x 8 QPs, 1 MiB messages, 4 KiB chunks, UC, no payload, no loss";
    out.rows.push(Row::new(
        "1",
        "post calls per chunk: single vs **chained**",
        case,
        format!("{:.3}", ab.posts_per_chunk[1]),
        format!(
            "{:.3} ({:.2} WRs/post)",
            ab.posts_per_chunk[0], ab.wrs_per_post[0]
        ),
        ab.posts_per_chunk[0] / ab.posts_per_chunk[1],
        "chained <= 1/16 = 0.063",
    ));
    for (what, ns) in [
        ("CPU ns per chunk", ab.cpu_ns),
        (
            "stack CPU ns per chunk (without softnic's event loop)",
            ab.stack_ns,
        ),
    ] {
        out.rows.push(Row::new(
            "1",
            format!("{what}: single vs **chained**"),
            case,
            format!("{:.0}", ns[1]),
            format!("{:.0}", ns[0]),
            ns[0] / ns[1],
            "chained <= 200 ns (tx+rx+ACK)",
        ));
    }
    out.notes.push(format!(
        "Row 1: `uccl-perf {} --tx-mode chained|single`, {} chunks per run, {} runs of each \
         alternating; CPU = the median run's process CPU time / chunks sent (both engines, \
         softnic and the driver on one thread, on the virtual clock; the engines poll at most \
         once per microsecond of virtual time while they wait, uccl-perf's default \
         `--poll-interval-ns 1000`). Stack CPU = the same less the time in softnic's event loop, \
         which the driver runs between rounds (`stack_cpu_ns_per_chunk`): what a real NIC does \
         in hardware. The verbs calls (softnic's post and poll) stay in the stack's part, as a \
         provider library's do.",
        ab.args, ab.chunks, ab.reps
    ));
    Ok(())
}

/// Row 7: memory and keys.
fn memory_rows(perf: &Path, out: &mut Out) -> Result<(), String> {
    const ITERS: u32 = 2000;
    eprintln!("  register/export at 0 and {} connections", memory::CONNS);
    let c = memory::calls(ITERS, 5)?;
    for (what, [base, ours]) in [
        ("register(64 KiB) + deregister, ns", c.register),
        ("export(64 KiB) + withdraw, ns", c.export),
    ] {
        out.rows.push(Row::new(
            "7",
            format!("{what}: no connection vs **{} connections**", memory::CONNS),
            "one engine, softnic, per call pair",
            format!("{base:.0}"),
            format!("{ours:.0}"),
            ours / base,
            "~1 (O(log n), not O(QPs))",
        ));
    }
    let w = memory::windows(perf, 5)?;
    let case = "4 KiB messages of one chunk, 4 flows x 2 QPs, UC, no payload, no loss";
    out.rows.push(Row::new(
        "7",
        "messages/s: buffer key vs **receive window**",
        case,
        format!("{:.0}", w.msgs_per_s[1]),
        format!("{:.0}", w.msgs_per_s[0]),
        w.msgs_per_s[0] / w.msgs_per_s[1],
        "",
    ));
    out.rows.push(Row::new(
        "7",
        "stack CPU ns per message: buffer key vs **receive window**",
        case,
        format!("{:.0}", w.stack_ns[1]),
        format!("{:.0}", w.stack_ns[0]),
        w.stack_ns[0] / w.stack_ns[1],
        "",
    ));
    out.notes.push(format!(
        "Row 7: register/export = {ITERS} call pairs timed in this program, medians of 5 \
         rounds (after one to warm up), alternating between an engine holding no connection \
         and one holding {} (one data QP each): a buffer is pinned once in a table every data \
         QP shares, an export is one registration of its range; windows = `uccl-perf {} \
         --recv-keys window|buffer`, medians of 5 runs each, alternating (a window costs a bind \
         and an unbind per receive on the engine's window QP, and their completions).",
        memory::CONNS,
        w.args
    ));
    Ok(())
}

/// Row 9: one-sided reads and vectored transfers.
fn read_rows(perf: &Path, out: &mut Out) -> Result<(), String> {
    for rw in reads::read_vs_write(perf, 3)? {
        out.rows.push(Row::new(
            "9",
            "goodput Gb/s: WRITE vs **READ**, 64 KiB",
            format!(
                "{}, one process, virtual clock, no loss",
                rw.mode.to_uppercase()
            ),
            format!("{:.2}", rw.gbps[0]),
            format!("{:.2}", rw.gbps[1]),
            rw.gbps[1] / rw.gbps[0],
            "",
        ));
    }
    let v = reads::vectored(perf, 3)?;
    let n = reads::BLOCKS;
    let case = "4 KiB blocks, UC, 1 flow x 2 QPs, no payload, no loss";
    for (what, [base, ours], prec) in [
        ("post calls per block", v.posts, 3),
        ("stack CPU ns per block", v.cpu_ns, 0),
        ("virtual us per 1024 blocks", v.virtual_us, 1),
    ] {
        out.rows.push(Row::new(
            "9",
            format!("{what}: {n} `write`s vs **one `write_v` of {n}**"),
            case,
            format!("{base:.prec$}"),
            format!("{ours:.prec$}"),
            ours / base,
            "",
        ));
    }
    out.notes.push(format!(
        "Row 9: READ vs WRITE = `uccl-perf --transport uc|rc --op write|read --msg-size 64KiB \
         --messages 2000 --loss 0`, medians of 3 runs each, alternating (two processes: not \
         yet, uccl-perf's one-sided ops run in one process); write_v = `uccl-perf {}` vs \
         `uccl-perf {}`, medians of 3 each, alternating (each block one chunk; in flight: \
         32 writes of 4 KiB, or 2 write_v of 4 MiB).",
        v.args[1], v.args[0]
    ));
    Ok(())
}

/// Row 8: connection set-up.
fn setup_rows(out: &mut Out) -> Result<(), String> {
    let s = setup::set_ups(5)?;
    let n = setup::CLIENTS;
    let case = "in-process softnic, wall clock, engines on threads, TCP on 127.0.0.1";
    out.rows.push(Row::new(
        "8",
        format!("set-ups per second: one at a time vs **{n} at once**"),
        case,
        format!("{:.0}", s.per_s[0]),
        format!("{:.0}", s.per_s[1]),
        s.per_s[1] / s.per_s[0],
        "",
    ));
    out.rows.push(Row::new(
        "8",
        format!("transfer goodput, Gb/s: alone vs **while {n} clients connect** (100/s)"),
        case,
        format!("{:.2}", s.gbps[0]),
        format!("{:.2}", s.gbps[1]),
        s.gbps[1] / s.gbps[0],
        ">= 0.9",
    ));
    out.notes.push(format!(
        "Row 8: three engines (a server with a listener, the transfer's other end, the \
         clients'), each on a thread of its own, on one in-process fabric on the wall clock; \
         {n} connections set up and closed per round, one at a time or all in flight at once \
         (the handshakes run in the engines' rounds on non-blocking sockets, looked at every \
         16 rounds; while the engine moves data, set-ups take at most a fifth of its time); \
         the transfer streams 256 KiB messages, 4 in flight, into the server, for 1 s alone, \
         then for as long as {n} clients take to connect to the server, one every 10 ms (all \
         at once, the clients' engine takes the cores the transfer runs on: on 2 cores two \
         threads that only burn CPU as long cut it to a tenth); medians of 5 rounds."
    ));
    Ok(())
}

/// Row 2: one shared CQ vs a CQ per QP.
fn cq_rows(out: &mut Out) -> Result<(), String> {
    let mut rounds = Vec::new();
    for n in [1, 16, 256, 1024] {
        eprintln!("  {n} QPs");
        let c = cq::measure(n, 65_536)?;
        out.rows.push(Row::new(
            "2",
            "poll ns per completion: a CQ per QP vs **one shared CQ**",
            format!(
                "{n} QP{}, one completion each",
                if n == 1 { "" } else { "s" }
            ),
            format!("{:.1}", c.per_qp_ns),
            format!("{:.1}", c.shared_ns),
            c.shared_ns / c.per_qp_ns,
            "",
        ));
        rounds.push(format!("{}: {}", c.qps, c.rounds));
    }
    out.notes.push(format!(
        "Row 2: N RC QP pairs soft0 -> soft1, one signaled 64-byte WRITE per QP per round, \
         `run_until_idle`, then only the drain is timed (shared: `Poller::poll` budget 64 until \
         empty; per QP: every CQ polled once, budget 16); per round (drain time - the cost of \
         reading the clock) / N, the slowest {}% of rounds dropped (preemptions), the rest \
         averaged (rounds per N: {}); the two sets live on one fabric, rounds alternate.",
        cq::TRIM_PERCENT,
        rounds.join(", ")
    ));
    Ok(())
}

/// Row 3: SRQ vs per-QP receive queues, computed.
fn srq_rows(out: &mut Out) {
    let cfg = EngineConfig::default();
    let slot = u64::from(cfg.tx.chunk_size) + uccl_tx::wire::RETR_HDR_LEN as u64;
    let srq = u64::from(cfg.srq_depth) * slot;
    let rq_depth = u64::from(cfg.tx.flow_window);
    for n in [1u64, 16, 256, 1024] {
        let per_qp = n * rq_depth * slot;
        out.rows.push(Row::new(
            "3",
            "receive-buffer memory: per-QP RQs vs **SRQ**",
            format!("{n} QP{}", if n == 1 { "" } else { "s" }),
            mib(per_qp),
            mib(srq),
            srq as f64 / per_qp as f64,
            "",
        ));
    }
    out.notes.push(format!(
        "Row 3 (computed, not measured): `EngineConfig::default()`, {:?}, chunk {} B: a receive \
         buffer holds a retransmitted chunk, `[{}-byte header | chunk]` = {slot} B. SRQ: \
         `srq_depth` = {} buffers for the whole engine, whatever the number of QPs. Per-QP RQs: \
         each QP must absorb what its peer may put on it, and the path chooser may put a \
         connection's whole window on one QP: `flow_window` = {rq_depth} buffers per QP. (RC \
         posts zero-SGE WQEs: no buffers either way.)",
        cfg.mode,
        cfg.tx.chunk_size,
        uccl_tx::wire::RETR_HDR_LEN,
        cfg.srq_depth,
    ));
}

/// Seeds of each loss rate in row 5.
const LOSS_SEEDS: u64 = 5;

/// Row 5: goodput under loss relative to lossless.
fn loss_rows(losses: &[perf::Loss], out: &mut Out) {
    let base = &losses[0];
    out.rows.push(Row::new(
        "5",
        "goodput: lossless (reference)",
        format!(
            "uccl-perf defaults, 0% loss (simulated {:.1} Gb/s, wall {:.2} Gb/s)",
            base.virtual_gbps, base.wall_gbps
        ),
        "-",
        "-",
        1.0,
        "",
    ));
    for l in &losses[1..] {
        let target = if l.loss < 0.02 { ">= 0.9" } else { ">= 0.7" };
        let retx = format!(
            "{:.0} retransmits, {:.0} after a timeout",
            l.retransmits, l.rto_retransmits
        );
        out.rows.push(Row::new(
            "5",
            "goodput, simulated (virtual clock): lossless vs **lossy**",
            format!("{}% loss; {retx}", l.loss * 100.0),
            format!("{:.1} Gb/s", base.virtual_gbps),
            format!("{:.1} Gb/s", l.virtual_gbps),
            l.virtual_gbps / base.virtual_gbps,
            target,
        ));
        out.rows.push(Row::new(
            "5",
            "goodput, wall clock: lossless vs **lossy**",
            format!("{}% loss", l.loss * 100.0),
            format!("{:.2} Gb/s", base.wall_gbps),
            format!("{:.2} Gb/s", l.wall_gbps),
            l.wall_gbps / base.wall_gbps,
            "",
        ));
    }
    out.notes.push(format!(
        "Row 5: `uccl-perf --loss P --seed S` (defaults otherwise: UC, 4 flows x 8 QPs, 1 MiB \
         messages, 16 KiB chunks, 64 messages per flow, send/recv, chained), mean over seeds \
         1..={LOSS_SEEDS}; simulated = `virtual_goodput_gbps` (the 100 Gb/s simulated links), \
         wall = `goodput_gbps` (real time, including writing and checking every byte); \
         retransmits per run."
    ));
}

/// Repetitions of each raw verbs run in row 6.
const VERBS_REPS: usize = 5;

/// Row 6: softnic goodput relative to memcpy; `dflt` is the default engine run (1% loss).
fn memcpy_rows(perf: &Path, dflt: &perf::Loss, out: &mut Out) -> Result<(), String> {
    for (size, iters) in VERBS_RUNS {
        let v = perf::verbs(perf, "rc", size, iters, VERBS_REPS)?;
        let what = format!(
            "raw verbs, {} WRITE {}, chained",
            v.transport.to_uppercase(),
            human(v.size)
        );
        let sets = [
            format!("memcpy of {} hot in cache", human(v.size)),
            format!(
                "memcpy round {} (the engine run's working set)",
                human(perf::WORKING_SET)
            ),
        ];
        for (k, set) in sets.into_iter().enumerate() {
            out.rows.push(Row::new(
                "6",
                "goodput: memcpy vs **softnic**",
                format!("{what}; {set}"),
                format!("{:.1} Gb/s", v.memcpy_gbps[k]),
                format!("{:.1} Gb/s", v.softnic_gbps),
                v.ratio[k],
                ">= 0.5",
            ));
        }
    }
    out.rows.push(Row::new(
        "6",
        "goodput: memcpy vs **softnic**",
        "engine, uccl-perf default run (1% loss, every byte verified)",
        format!("{:.1} Gb/s", dflt.memcpy_gbps),
        format!("{:.2} Gb/s", dflt.wall_gbps),
        dflt.vs_memcpy,
        ">= 0.5",
    ));
    out.notes.push(format!(
        "Row 6: raw verbs = `uccl-perf --test verbs-write-bw --transport rc --msg-size SIZE \
         --messages N` (N = {} at 4 KiB, {} at 64 KiB), wall Gb/s of the chained run, against \
         a memcpy in this program of the same number of bytes in SIZE pieces, either from one \
         SIZE buffer to another (as the test writes one source to one destination: hot in \
         cache) or round a {} working set; median of {VERBS_REPS}; engine = the row-5 runs at \
         1% loss (the default run): `goodput_gbps` / `memcpy_gbps` (uccl-perf's own memcpy of \
         the same bytes round its in-flight working set, 4 flows x 4 messages x 1 MiB), mean \
         over the seeds.",
        VERBS_RUNS[0].1,
        VERBS_RUNS[1].1,
        human(perf::WORKING_SET)
    ));
    Ok(())
}

/// Row 4: alloc+free pairs, each pool timed in turn, rounds alternating; medians.
fn pool_rows(out: &mut Out) -> Result<(), String> {
    const ITERS: u64 = 2_000_000;
    const ITERS_2T: u64 = 500_000;
    const REPS: usize = 5;
    let e = |e: bufpool::PoolError| e.to_string();
    let local = LocalPool::with_capacity(CAP).map_err(e)?;
    let shared = SharedPool::with_capacity(CAP).map_err(e)?;
    let checked = ArrayQueuePool::new(CAP);
    let bare = pools::bare_array_queue();
    let shared2 = Arc::new(SharedPool::with_capacity(CAP).map_err(e)?);
    let checked2 = Arc::new(ArrayQueuePool::new(CAP));
    let bare2 = Arc::new(pools::bare_array_queue());
    let ns = |d: Duration, iters: u64| d.as_nanos() as f64 / iters as f64;
    let mut t: [Vec<f64>; 7] = Default::default();
    for _ in 0..REPS {
        t[0].push(ns(pools::time_local(&local, ITERS), ITERS));
        t[1].push(ns(pools::time_single(&shared, ITERS), ITERS));
        t[2].push(ns(pools::time_single(&checked, ITERS), ITERS));
        t[3].push(ns(pools::time_single(&bare, ITERS), ITERS));
        t[4].push(ns(pools::time_contended(&shared2, ITERS_2T), ITERS_2T));
        t[5].push(ns(pools::time_contended(&checked2, ITERS_2T), ITERS_2T));
        t[6].push(ns(pools::time_contended(&bare2, ITERS_2T), ITERS_2T));
    }
    let m: Vec<f64> = t.iter().map(|v| perf::median(v)).collect();
    // Under contention the rounds spread widely on this VM: show the range.
    let range = |v: &[f64]| {
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, 0.0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        format!("{lo:.0}-{hi:.0}")
    };
    let row = |case: String, base: &str, b: f64, ours: &str, o: f64| {
        Row::new(
            "4",
            format!("alloc+free ns: {base} vs **{ours}**"),
            case,
            format!("{b:.1}"),
            format!("{o:.1}"),
            o / b,
            "",
        )
    };
    let checked = "ArrayQueue + double-free check";
    let two = |base: usize| {
        format!(
            "2 threads, one pool (rounds ranged {} vs {})",
            range(&t[base]),
            range(&t[4])
        )
    };
    out.rows.extend([
        row("1 thread".into(), checked, m[2], "bufpool SharedPool", m[1]),
        row(
            "1 thread".into(),
            "bare ArrayQueue",
            m[3],
            "bufpool SharedPool",
            m[1],
        ),
        row("1 thread".into(), checked, m[2], "bufpool LocalPool", m[0]),
        row(two(5), checked, m[5], "bufpool SharedPool", m[4]),
        row(two(6), "bare ArrayQueue", m[6], "bufpool SharedPool", m[4]),
    ]);
    out.notes.push(format!(
        "Row 4: the pools of the `pools` criterion bench (`uccl_benches::pools`), {CAP} slots, \
         {} held in flight (freed FIFO); one pair = one alloc + one free; 1 thread: {ITERS} \
         pairs per timing, 2 threads: {ITERS_2T} pairs on each thread, time until both are done \
         / pairs per thread; median of {REPS} rounds, the pools alternating.",
        pools::HELD
    ));
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
        srq_rows(&mut out);
        assert_eq!(out.rows.len(), 4);
        // The SRQ's memory does not depend on the QPs; per-QP RQs grow linearly.
        assert!(out.rows.iter().all(|r| r.ours == out.rows[0].ours));
        let r = |i: usize| out.rows[i].ratio;
        assert!((r(0) / r(1) - 16.0).abs() < 1e-9);
    }
}
