//! Row 9: one-sided reads and vectored transfers (`uccl-perf --op read|write|writev`). READ
//! goodput against WRITE goodput at 64 KiB, UC (reads served by the exporting engine) and RC
//! (RDMA READs); and 1024 blocks of 4 KiB moved by one `write_v` against 1024 `write` calls:
//! post calls and stack CPU per block, and the virtual time 1024 blocks take.

use std::path::Path;

use crate::perf::{median, num, run};

use super::{Out, Row};

/// READ and WRITE goodput (Gb/s) in one mode: write, read.
pub(crate) struct ReadWrite {
    pub(crate) mode: &'static str,
    pub(crate) gbps: [f64; 2],
}

/// Medians of `reps` runs of each, alternating, at 64 KiB without loss, UC and RC.
pub(crate) fn read_vs_write(bin: &Path, reps: usize) -> Result<Vec<ReadWrite>, String> {
    let mut out = Vec::new();
    for mode in ["uc", "rc"] {
        let mut g = [Vec::new(), Vec::new()];
        for r in 0..reps {
            for k in [r % 2, 1 - r % 2] {
                let op = ["write", "read"][k];
                let args = [
                    "--transport",
                    mode,
                    "--op",
                    op,
                    "--msg-size",
                    "64KiB",
                    "--messages",
                    "2000",
                    "--loss",
                    "0",
                ];
                g[k].push(num(&run(bin, &args)?, "goodput_gbps")?);
            }
        }
        out.push(ReadWrite {
            mode,
            gbps: [median(&g[0]), median(&g[1])],
        });
    }
    Ok(out)
}

/// One `write_v` of [`BLOCKS`] blocks against as many `write`s: per block, post calls and
/// stack CPU ns; and virtual µs per [`BLOCKS`] blocks. Index 0: writes, 1: `write_v`.
pub(crate) struct Vectored {
    pub(crate) posts: [f64; 2],
    pub(crate) cpu_ns: [f64; 2],
    pub(crate) virtual_us: [f64; 2],
    pub(crate) args: [String; 2],
}

/// Blocks per vectored write.
pub(crate) const BLOCKS: u64 = 1024;
/// Vectored writes per run.
const MESSAGES: u64 = 20;

pub(crate) fn vectored(bin: &Path, reps: usize) -> Result<Vectored, String> {
    let (messages, blocks) = ((MESSAGES * BLOCKS).to_string(), BLOCKS.to_string());
    let common = [
        "--no-payload",
        "--loss",
        "0",
        "--flows",
        "1",
        "--qps-per-flow",
        "2",
    ];
    let runs: [Vec<&str>; 2] = [
        [
            "--op",
            "write",
            "--msg-size",
            "4KiB",
            "--messages",
            &messages,
        ]
        .to_vec(),
        [
            "--op",
            "writev",
            "--iov",
            &blocks,
            "--block-size",
            "4KiB",
            "--messages",
            "20",
        ]
        .to_vec(),
    ];
    let mut m = [
        [Vec::new(), Vec::new(), Vec::new()],
        [Vec::new(), Vec::new(), Vec::new()],
    ];
    for r in 0..reps {
        for k in [r % 2, 1 - r % 2] {
            let mut args = common.to_vec();
            args.extend(&runs[k]);
            let j = run(bin, &args)?;
            let n = (MESSAGES * BLOCKS) as f64;
            m[k][0].push(num(&j, "post_send_calls")? / n);
            m[k][1].push(num(&j, "stack_cpu_ns_per_chunk")?);
            m[k][2].push(num(&j, "virtual_s")? * 1e6 / MESSAGES as f64);
        }
    }
    let med = |i: usize| [median(&m[0][i]), median(&m[1][i])];
    let args = |k: usize| {
        let mut a = common.to_vec();
        a.extend(&runs[k]);
        a.join(" ")
    };
    Ok(Vectored {
        posts: med(0),
        cpu_ns: med(1),
        virtual_us: med(2),
        args: [args(0), args(1)],
    })
}

/// Row 9: one-sided reads and vectored transfers.
pub(super) fn rows(perf: &Path, out: &mut Out) -> Result<(), String> {
    for rw in read_vs_write(perf, 3)? {
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
    let v = vectored(perf, 3)?;
    let n = BLOCKS;
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
