//! Row 13: instructions per chunk, counted by valgrind's callgrind: the whole process (both
//! engines, softnic and the driver, on the virtual clock, no payload copies) at the margin, the
//! difference between 32 and 8 messages of 1 MiB in 4 KiB chunks over the chunks it adds. A
//! count of instructions, not a time: it does not move with the machine's load.

use std::path::Path;
use std::process::Command;

use crate::perf::num;
use crate::{Out, Row};

/// The whole-process figure issue 28 started from (`--messages 32` less `--messages 8`).
const BEFORE: f64 = 12_100.0;

/// The runs' messages: the margin is between them.
const MESSAGES: [&str; 2] = ["8", "32"];

/// The function whose instructions are softnic's event loop, which the driver runs between
/// rounds and a real NIC does in hardware: counting only inside it, callgrind gives the NIC's
/// share; the rest is the stack's own (the engines, softnic's verbs they call, the driver).
const NIC_LOOP: &str = "softnic::fabric::Fabric::advance";

/// One run under callgrind (counting only inside `only`, if given): (chunks sent,
/// instructions).
fn counted(perf: &Path, messages: &str, only: Option<&str>) -> Result<(f64, f64), String> {
    let out_file = std::env::temp_dir().join(format!("bench-table-{}.cg", std::process::id()));
    // Row 1's runs (the shape of issue 28's count), at `messages` messages.
    let mut args = crate::perf::POST_AB_ARGS.to_vec();
    *args.last_mut().expect("--messages N") = messages;
    args.push("--json");
    eprintln!(
        "  $ valgrind --tool=callgrind {} {}",
        perf.display(),
        args.join(" ")
    );
    let mut valgrind = Command::new("valgrind");
    valgrind.arg("--tool=callgrind");
    if let Some(f) = only {
        valgrind.arg(format!("--toggle-collect={f}"));
    }
    let out = valgrind
        .arg(format!("--callgrind-out-file={}", out_file.display()))
        .arg(perf)
        .args(&args)
        .output()
        .map_err(|e| format!("running valgrind (is it installed?): {e}"))?;
    let _ = std::fs::remove_file(&out_file);
    if !out.status.success() {
        return Err(format!(
            "valgrind failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("no JSON from uccl-perf: {e}"))?;
    let err = String::from_utf8_lossy(&out.stderr);
    let collected = err
        .lines()
        .find_map(|l| l.split("Collected :").nth(1))
        .and_then(|n| n.trim().parse::<f64>().ok())
        .ok_or_else(|| format!("no 'Collected :' line from callgrind:\n{err}"))?;
    Ok((num(&v, "chunks_sent")?, collected))
}

/// The row: instructions per chunk at the margin.
pub(crate) fn rows(perf: &Path, out: &mut Out) -> Result<(), String> {
    let (c0, i0) = counted(perf, MESSAGES[0], None)?;
    let (c1, i1) = counted(perf, MESSAGES[1], None)?;
    if c1 <= c0 {
        return Err(format!("{c1} chunks at 32 messages, {c0} at 8: no margin"));
    }
    let (_, n0) = counted(perf, MESSAGES[0], Some(NIC_LOOP))?;
    let (_, n1) = counted(perf, MESSAGES[1], Some(NIC_LOOP))?;
    if n1 <= n0 {
        // Nothing counted inside it: the function is gone from the binary (inlined by its
        // callers, or renamed), and the split below would call all of it the stack's own.
        return Err(format!(
            "callgrind counted nothing inside {NIC_LOOP} ({n0}, then {n1}): is it still \
             #[inline(never)] and so named?"
        ));
    }
    let per_chunk = (i1 - i0) / (c1 - c0);
    let nic = (n1 - n0) / (c1 - c0);
    let case =
        "uccl-perf --no-payload --loss 0 --msg-size 1MiB --chunk-size 4KiB, 32 vs 8 messages";
    out.rows.push(Row::new(
        "13",
        "instructions per chunk, whole process (callgrind, at the margin)",
        case,
        format!("{BEFORE:.0} (issue 28's start)"),
        format!("{per_chunk:.0}"),
        per_chunk / BEFORE,
        "<= 6000 (0.5)",
    ));
    out.rows.push(Row::new(
        "13",
        "instructions per chunk, the stack's own (all but softnic's event loop)",
        case,
        format!("{per_chunk:.0} (whole process)"),
        format!("{:.0} (softnic's event loop: {nic:.0})", per_chunk - nic),
        (per_chunk - nic) / per_chunk,
        "<= 2000",
    ));
    out.notes.push(format!(
        "Row 13: `valgrind --tool=callgrind uccl-perf --no-payload --loss 0 --msg-size 1MiB \
         --chunk-size 4KiB --messages 32 --json` less the same with `--messages 8`: {:.0} - \
         {:.0} instructions over {:.0} - {:.0} chunks; the event loop's share counted with \
         `--toggle-collect={NIC_LOOP}` ({:.0} - {:.0}). Deterministic: the same binary gives \
         the same count whatever the load.",
        i1, i0, c1, c0, n1, n0
    ));
    Ok(())
}
