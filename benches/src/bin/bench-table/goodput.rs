//! Row 14: the engine between two processes against raw verbs on the same link. `uccl-perf`
//! (`--server` and `--client`, each its own softnic device on the UDP link, no faults) at
//! 64 KiB messages, UC and RC, in 64 KiB and 16 KiB chunks, side by side with perftest's
//! `ib_write_bw -s 65536` between two `softnic-run` processes; and the retransmissions each
//! run needed at 0% loss (every one a late ACK taken for a loss). The 16 KiB chunks are also
//! set against `ib_write_bw -s 16384`, raw verbs at the same size of WR: softnic's cost per WR
//! on this link (two or three datagram sends per WRITE, whatever its length) bounds both.

use std::path::Path;

use crate::perf::{median, num};
use crate::{Out, Row};

/// (transport, chunk size, congestion window's target delay, payload) of the engine runs:
/// the engine's defaults; once without the window (`--target-delay-us 0`), which on this
/// host reads the receiving process's CPU queue (RTTs of hundreds of microseconds) as
/// congestion and holds the flows back; and at 64 KiB chunks without the payload
/// (`--no-payload`), as `ib_write_bw` runs: no pattern written into each message before it is
/// sent and checked after it arrives (uccl-perf's own work, a third of a core on each side).
const RUNS: [(&str, &str, &str, bool); 7] = [
    ("uc", "64KiB", "50", true),
    ("rc", "64KiB", "50", true),
    ("uc", "16KiB", "50", true),
    ("rc", "16KiB", "50", true),
    ("uc", "64KiB", "0", true),
    ("uc", "64KiB", "50", false),
    ("rc", "64KiB", "50", false),
];

/// Runs each engine case `reps` times and perftest `reps` times, alternating.
pub(crate) fn rows(perf: &Path, reps: usize, out: &mut Out) -> Result<(), String> {
    let launcher = crate::ucx::launcher()?;
    let (mut raw, mut raw16) = (Vec::new(), Vec::new());
    let mut engine = vec![(Vec::new(), 0.0f64); RUNS.len()];
    for _ in 0..reps {
        let port = crate::perf::free_port()?;
        raw.push(crate::ucx::ib_write_bw_gbps(&launcher, port, 65536)?);
        let port = crate::perf::free_port()?;
        raw16.push(crate::ucx::ib_write_bw_gbps(&launcher, port, 16384)?);
        for (k, (transport, chunk, target, payload)) in RUNS.iter().enumerate() {
            let no_payload: &[&str] = if *payload { &[] } else { &["--no-payload"] };
            let v = crate::perf::two_processes(
                perf,
                &[
                    no_payload,
                    &[
                        "--transport",
                        transport,
                        "--chunk-size",
                        chunk,
                        "--msg-size",
                        "64KiB",
                        "--duration",
                        "2",
                        "--loss",
                        "0",
                        "--target-delay-us",
                        target,
                    ],
                ]
                .concat(),
            )?;
            engine[k].0.push(num(&v, "goodput_gbps")?);
            engine[k].1 += num(&v, "retransmits")?;
        }
    }
    let (base, base16) = (median(&raw), median(&raw16));
    let mut same_wr = Vec::new();
    for ((transport, chunk, target, payload), (gbps, retx)) in RUNS.iter().zip(&engine) {
        let g = median(gbps);
        let window = match (*target == "0", payload) {
            (true, _) => ", no congestion window",
            (false, false) => ", no payload",
            (false, true) => "",
        };
        out.rows.push(Row::new(
            "14",
            format!(
                "goodput between 2 processes, {} {chunk} chunks{window} vs ib_write_bw 64 KiB",
                transport.to_uppercase()
            ),
            format!(
                "softnic UDP link on loopback, 64 KiB messages, 0% loss ({retx:.0} \
                 retransmissions in {reps} runs)"
            ),
            format!("{base:.1} Gb/s"),
            format!("{g:.1} Gb/s"),
            g / base,
            ">= 0.8, 0 retransmissions",
        ));
        if *chunk == "16KiB" {
            same_wr.push(Row::new(
                "14",
                format!(
                    "goodput between 2 processes, {} 16KiB chunks vs ib_write_bw 16 KiB (the same \
                     size of WR)",
                    transport.to_uppercase()
                ),
                "softnic UDP link on loopback, 64 KiB messages, 0% loss",
                format!("{base16:.1} Gb/s"),
                format!("{g:.1} Gb/s"),
                g / base16,
                "report",
            ));
        }
    }
    out.rows.extend(same_wr);
    out.notes.push(format!(
        "Row 14: medians of {reps} alternating runs of `softnic-run -- ib_write_bw -d soft0 -x 1 \
         -s 65536 -n 20000` (BW average) and `uccl-perf --server` / `uccl-perf --client \
         127.0.0.1 --transport uc|rc --chunk-size 64KiB|16KiB --msg-size 64KiB --duration 2 \
         --loss 0 --target-delay-us 50|0 [--no-payload] --json` (the client's goodput; \
         retransmissions summed over the runs; 50 us is the engine's default target). Without \
         `--no-payload` the client writes a pattern into every message and the server checks \
         every byte, which `ib_write_bw` does not do. The rows against `ib_write_bw 16 KiB` \
         take the medians of as many runs of `ib_write_bw ... -s 16384`, in the same \
         alternation."
    ));
    Ok(())
}
