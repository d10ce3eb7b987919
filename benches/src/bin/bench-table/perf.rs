//! Rows 1, 5 and 6: runs of the `uccl-perf` binary (`--json`), side by side.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Out, Row, human};

/// One `uccl-perf --json` run: its JSON object.
pub(crate) fn run(bin: &Path, args: &[&str]) -> Result<Value, String> {
    let line = format!("{} --json {}", bin.display(), args.join(" "));
    eprintln!("  $ {line}");
    let out = Command::new(bin)
        .arg("--json")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `{line}`: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`{line}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("`{line}` printed no JSON object: {e}"))
}

/// A TCP port that nothing holds now, on any address, as the kernel picks one (from its
/// ephemeral range, a port free at that moment; the run binds it a moment later, and
/// [`two_processes`] tries again with another if its server could not listen).
pub(crate) fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("finding a free port: {e}"))
}

/// A `uccl-perf --server` and a `uccl-perf --client 127.0.0.1` with `args` (the run's
/// options, which the server adopts) on a free port, each on its own softnic device on the
/// UDP link; the client's JSON. A server that could not listen (its port taken between
/// [`free_port`] and its bind) is started again on another port, twice at most; if the
/// client fails otherwise, the error says what the server printed.
pub(crate) fn two_processes(bin: &Path, args: &[&str]) -> Result<Value, String> {
    let mut tries = 3;
    loop {
        tries -= 1;
        match two_processes_once(bin, args) {
            Err((e, listening)) if !listening && tries > 0 => {
                eprintln!("  (the server did not listen: {e}; again on another port)");
            }
            r => return r.map_err(|(e, _)| e),
        }
    }
}

/// One [`two_processes`] run: the client's JSON, or its error and whether the server got as
/// far as listening.
fn two_processes_once(bin: &Path, args: &[&str]) -> Result<Value, (String, bool)> {
    let port = free_port().map_err(|e| (e, true))?.to_string();
    let log = std::env::temp_dir().join(format!(
        "bench-table-server-{}-{port}.err",
        std::process::id()
    ));
    let err = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&log)
        .map_err(|e| (format!("creating {}: {e}", log.display()), true))?;
    let server = Command::new(bin)
        .args(["--server", "--port", &port, "--json"])
        .stdout(Stdio::null())
        .stderr(err)
        .spawn();
    let server = match server {
        Ok(s) => s,
        Err(e) => {
            let _ = std::fs::remove_file(&log);
            return Err((format!("starting uccl-perf --server: {e}"), true));
        }
    };
    // The server listens at once; the client retries its connect for a while anyway.
    std::thread::sleep(Duration::from_millis(300));
    let mut client_args = vec!["--client", "127.0.0.1", "--port", &port];
    client_args.extend_from_slice(args);
    let client = run(bin, &client_args);
    crate::ucx::reap(server, Instant::now() + Duration::from_secs(30));
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    client.map_err(|e| {
        // uccl-perf says so when its bind fails (crates/uccl-perf/src/transport/remote.rs).
        let listening = !said.contains(&format!("listening on port {port}:"));
        let e = format!("{e}; the server (port {port}) printed: {}", said.trim());
        (e, listening)
    })
}

/// A number field of a JSON object.
pub(crate) fn num(v: &Value, key: &str) -> Result<f64, String> {
    v.get(key)
        .and_then(Value::as_f64)
        .ok_or_else(|| format!("the JSON has no number `{key}`: {v}"))
}

/// The median of `v` (not empty).
pub(crate) fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

/// The mean of `v` (not empty).
pub(crate) fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// Row 1: chained vs single posts, softnic payload copies off, no loss.
pub(crate) struct PostAb {
    pub(crate) args: String,
    pub(crate) chunks: f64,
    /// `post_send_calls_per_chunk`, chained and single.
    pub(crate) posts_per_chunk: [f64; 2],
    /// `wrs_per_post`, chained and single.
    pub(crate) wrs_per_post: [f64; 2],
    /// Median `cpu_ns_per_chunk`, chained and single.
    pub(crate) cpu_ns: [f64; 2],
    /// Median `stack_cpu_ns_per_chunk` (without softnic's event loop), chained and single.
    pub(crate) stack_ns: [f64; 2],
    pub(crate) reps: usize,
}

pub(crate) const POST_AB_ARGS: [&str; 9] = [
    "--no-payload",
    "--loss",
    "0",
    "--msg-size",
    "1MiB",
    "--chunk-size",
    "4KiB",
    "--messages",
    "32",
];

pub(crate) fn post_ab(bin: &Path, reps: usize) -> Result<PostAb, String> {
    let modes = ["chained", "single"];
    let mut cpu = [Vec::new(), Vec::new()];
    let mut stack = [Vec::new(), Vec::new()];
    let mut ppc = [0.0; 2];
    let mut wpp = [0.0; 2];
    let mut chunks = 0.0;
    for r in 0..reps {
        for k in [r % 2, 1 - r % 2] {
            let mut args = POST_AB_ARGS.to_vec();
            args.extend(["--tx-mode", modes[k]]);
            let j = run(bin, &args)?;
            cpu[k].push(num(&j, "cpu_ns_per_chunk")?);
            stack[k].push(num(&j, "stack_cpu_ns_per_chunk")?);
            ppc[k] = num(&j, "post_send_calls_per_chunk")?;
            wpp[k] = num(&j, "wrs_per_post")?;
            chunks = num(&j, "chunks_sent")?;
        }
    }
    Ok(PostAb {
        args: POST_AB_ARGS.join(" "),
        chunks,
        posts_per_chunk: ppc,
        wrs_per_post: wpp,
        cpu_ns: [median(&cpu[0]), median(&cpu[1])],
        stack_ns: [median(&stack[0]), median(&stack[1])],
        reps,
    })
}

/// Row 5 (and the engine half of row 6): the default run at 0, 1 and 5 % loss, several seeds.
pub(crate) struct Loss {
    pub(crate) loss: f64,
    /// Means over the seeds.
    pub(crate) virtual_gbps: f64,
    pub(crate) wall_gbps: f64,
    pub(crate) retransmits: f64,
    pub(crate) rto_retransmits: f64,
    /// Mean of the runs' `goodput_vs_memcpy`, and of their `memcpy_gbps`.
    pub(crate) vs_memcpy: f64,
    pub(crate) memcpy_gbps: f64,
}

pub(crate) const LOSSES: [f64; 3] = [0.0, 0.01, 0.05];

pub(crate) fn loss(bin: &Path, seeds: u64) -> Result<Vec<Loss>, String> {
    let mut runs: Vec<Vec<Value>> = vec![Vec::new(); LOSSES.len()];
    for seed in 1..=seeds {
        for (i, l) in LOSSES.iter().enumerate() {
            let (l, s) = (l.to_string(), seed.to_string());
            runs[i].push(run(bin, &["--loss", &l, "--seed", &s])?);
        }
    }
    LOSSES
        .iter()
        .zip(runs)
        .map(|(&loss, js)| {
            let field = |k: &str| -> Result<f64, String> {
                Ok(mean(
                    &js.iter()
                        .map(|j| num(j, k))
                        .collect::<Result<Vec<_>, _>>()?,
                ))
            };
            Ok(Loss {
                loss,
                virtual_gbps: field("virtual_goodput_gbps")?,
                wall_gbps: field("goodput_gbps")?,
                retransmits: field("retransmits")?,
                rto_retransmits: field("rto_retransmits")?,
                vs_memcpy: field("goodput_vs_memcpy")?,
                memcpy_gbps: field("memcpy_gbps")?,
            })
        })
        .collect()
}

/// Row 6, raw verbs: chained RDMA WRITEs on softnic against a memcpy of the same bytes.
pub(crate) struct VerbsVsMemcpy {
    pub(crate) transport: &'static str,
    pub(crate) size: u64,
    /// Medians over the repetitions: softnic, then per memcpy working set (the test's own
    /// buffers, then [`WORKING_SET`]) the memcpy and the ratio.
    pub(crate) softnic_gbps: f64,
    pub(crate) memcpy_gbps: [f64; 2],
    pub(crate) ratio: [f64; 2],
}

/// The working set of the second memcpy of row 6: that of uccl-perf's default engine run
/// (4 flows x 4 messages in flight x 1 MiB), which its own `memcpy_gbps` copies round.
pub(crate) const WORKING_SET: u64 = 16 << 20;

pub(crate) fn verbs(
    bin: &Path,
    transport: &'static str,
    size: u64,
    iters: u64,
    reps: usize,
) -> Result<VerbsVsMemcpy, String> {
    let mut soft = Vec::new();
    let (mut mem, mut ratio) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    for _ in 0..reps {
        let (s, n) = (size.to_string(), iters.to_string());
        let j = run(
            bin,
            &[
                "--test",
                "verbs-write-bw",
                "--transport",
                transport,
                "--msg-size",
                &s,
                "--messages",
                &n,
            ],
        )?;
        let chained = j
            .get("runs")
            .and_then(Value::as_array)
            .and_then(|r| r.first())
            .ok_or_else(|| format!("no runs in {j}"))?;
        let g = num(chained, "wall_gbps")?;
        soft.push(g);
        // The test writes one `size`-byte source into one `size`-byte destination, again and
        // again: the first memcpy copies the same bytes the same way (hot in cache); the
        // second round a working set as large as the engine run's.
        for (k, working) in [size, WORKING_SET.max(size)].into_iter().enumerate() {
            let m = softnic::baseline::memcpy_gbps(size * iters, size, working);
            mem[k].push(m);
            ratio[k].push(g / m);
        }
    }
    Ok(VerbsVsMemcpy {
        transport,
        size,
        softnic_gbps: median(&soft),
        memcpy_gbps: [median(&mem[0]), median(&mem[1])],
        ratio: [median(&ratio[0]), median(&ratio[1])],
    })
}

/// Row 6's raw verbs runs: (WRITE size, WRITEs).
pub(super) const VERBS_RUNS: [(u64, u64); 2] = [(4096, 100_000), (65_536, 10_000)];

/// Repetitions of each raw verbs run in row 6.
pub(super) const VERBS_REPS: usize = 5;

/// Seeds of each loss rate in row 5.
pub(super) const LOSS_SEEDS: u64 = 5;

/// Row 1: chained vs single posts.
pub(super) fn post_rows(perf: &Path, out: &mut Out) -> Result<(), String> {
    let ab = post_ab(perf, 7)?;
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

/// Row 5: goodput under loss relative to lossless.
pub(super) fn loss_rows(losses: &[Loss], out: &mut Out) {
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

/// Row 6: softnic goodput relative to memcpy; `dflt` is the default engine run (1% loss).
pub(super) fn memcpy_rows(perf: &Path, dflt: &Loss, out: &mut Out) -> Result<(), String> {
    for (size, iters) in VERBS_RUNS {
        let v = verbs(perf, "rc", size, iters, VERBS_REPS)?;
        let what = format!(
            "raw verbs, {} WRITE {}, chained",
            v.transport.to_uppercase(),
            human(v.size)
        );
        let sets = [
            format!("memcpy of {} hot in cache", human(v.size)),
            format!(
                "memcpy round {} (the engine run's working set)",
                human(WORKING_SET)
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
        human(WORKING_SET)
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(mean(&[1.0, 2.0, 3.0]), 2.0);
        let j: Value = serde_json::from_str(r#"{"a": 1.5, "b": "x"}"#).unwrap();
        assert_eq!(num(&j, "a"), Ok(1.5));
        assert!(num(&j, "b").is_err());
    }
}
