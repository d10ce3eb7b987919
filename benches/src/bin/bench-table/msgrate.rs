//! Row 11: message rate. `uccl-perf` between two processes on softnic's UDP link with 0, 8 and
//! 64-byte messages (messages per second, and the sending process's CPU per message) side by
//! side with perftest's `ib_send_bw -s 8` on the same link (two `softnic-run` processes).

use std::path::Path;

use crate::perf::{median, num};
use crate::{Out, Row};

/// Message sizes of the uccl-perf runs.
const SIZES: [u64; 3] = [0, 8, 64];
/// Seconds each uccl-perf client sends for.
const SECONDS: &str = "2";

/// One size's figures: messages per second and CPU ns per message (medians).
struct Rate {
    size: u64,
    per_s: f64,
    cpu_ns: f64,
}

/// Runs the row `reps` times over: uccl-perf at each size, then `ib_send_bw -s 8`.
pub(crate) fn rows(perf: &Path, reps: usize, out: &mut Out) -> Result<(), String> {
    let launcher = crate::ucx::launcher()?;
    let mut rates = Vec::new();
    for size in SIZES {
        let (mut per_s, mut cpu) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            let size = size.to_string();
            let v = crate::perf::two_processes(
                perf,
                &["--msg-size", &size, "--duration", SECONDS, "--loss", "0"],
            )?;
            per_s.push(num(&v, "messages_per_s")?);
            cpu.push(num(&v, "cpu_ns_per_message")?);
        }
        rates.push(Rate {
            size,
            per_s: median(&per_s),
            cpu_ns: median(&cpu),
        });
    }
    let mut perftest = Vec::new();
    for _ in 0..reps {
        let text = crate::ucx::pair(
            &launcher,
            crate::perf::free_port()?,
            "ib_send_bw -d soft0 -x 1 -s 8 -n 200000",
            &[],
        )?;
        // The result row's fifth column: MsgRate [Mpps].
        perftest.push(crate::ucx::perftest_column(&text, 4)? * 1e6);
    }
    let base = median(&perftest);
    for r in &rates {
        out.rows.push(Row::new(
            "11",
            format!("message rate, {} B messages vs ib_send_bw -s 8", r.size),
            "2 processes, softnic UDP link on loopback, UC, 4 flows x 8 QPs",
            format!("{base:.0} msg/s"),
            format!("{:.0} msg/s ({:.2} us CPU each)", r.per_s, r.cpu_ns / 1e3),
            r.per_s / base,
            "report (raw verbs post one SEND per message, no reliability)",
        ));
    }
    out.notes.push(format!(
        "Row 11: medians of {reps} runs each of `uccl-perf --server` and `uccl-perf --client \
         127.0.0.1 --msg-size S --duration {SECONDS} --loss 0 --json` (S = 0, 8, 64; the \
         client's messages per second, and its process CPU per message sent), against \
         `softnic-run -- ib_send_bw -d soft0 -x 1 -s 8 -n 200000` (MsgRate) on the same link."
    ));
    Ok(())
}
