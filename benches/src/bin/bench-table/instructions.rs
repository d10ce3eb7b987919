//! Row 13: instructions per chunk, counted by valgrind's callgrind: the whole process (both
//! engines, softnic and the driver, on the virtual clock, no payload copies) at the margin, the
//! difference between 32 and 8 messages of 1 MiB in 4 KiB chunks over the chunks it adds; and
//! the instructions of one poll of an idle engine (`idle-poll`, next to this program, at 100 000
//! polls less none). Counts of instructions, not times: they do not move with the machine's
//! load.

use std::path::Path;
use std::process::Command;

use crate::perf::num;
use crate::{Out, Row};

/// The whole-process figure issue 28 started from (`--messages 32` less `--messages 8`).
const BEFORE: f64 = 12_100.0;

/// The runs' messages: the margin is between them.
const MESSAGES: [&str; 2] = ["8", "32"];

/// An idle engine's poll before a quiet fabric with `auto_advance` answered polls without its
/// lock (7738383).
const IDLE_BEFORE: f64 = 641.0;

/// The idle polls counted (less a run of none).
const IDLE_POLLS: u32 = 100_000;

/// The function whose instructions are softnic's event loop, which the driver runs between
/// rounds and a real NIC does in hardware: counting only inside it, callgrind gives the NIC's
/// share; the rest is the stack's own (the engines, softnic's verbs they call, the driver).
const NIC_LOOP: &str = "softnic::fabric::Fabric::advance";

/// One run under callgrind (counting only inside `only`, if given): (chunks sent,
/// instructions).
fn counted(perf: &Path, messages: &str, only: Option<&str>) -> Result<(f64, f64), String> {
    // Row 1's runs (the shape of issue 28's count), at `messages` messages.
    let mut args = crate::perf::POST_AB_ARGS.to_vec();
    *args.last_mut().expect("--messages N") = messages;
    args.push("--json");
    let (stdout, collected) = callgrind(perf, &args, only)?;
    let v: serde_json::Value =
        serde_json::from_slice(&stdout).map_err(|e| format!("no JSON from uccl-perf: {e}"))?;
    Ok((num(&v, "chunks_sent")?, collected))
}

/// Runs `program` with `args` under callgrind (counting only inside `only`, if given): its
/// standard output and the instructions counted.
fn callgrind(program: &Path, args: &[&str], only: Option<&str>) -> Result<(Vec<u8>, f64), String> {
    let out_file = std::env::temp_dir().join(format!("bench-table-{}.cg", std::process::id()));
    eprintln!(
        "  $ valgrind --tool=callgrind {} {}",
        program.display(),
        args.join(" ")
    );
    let mut valgrind = Command::new("valgrind");
    valgrind.arg("--tool=callgrind");
    if let Some(f) = only {
        valgrind.arg(format!("--toggle-collect={f}"));
    }
    let out = valgrind
        .arg(format!("--callgrind-out-file={}", out_file.display()))
        .arg(program)
        .args(args)
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
    let err = String::from_utf8_lossy(&out.stderr);
    let collected = err
        .lines()
        .find_map(|l| l.split("Collected :").nth(1))
        .and_then(|n| n.trim().parse::<f64>().ok())
        .ok_or_else(|| format!("no 'Collected :' line from callgrind:\n{err}"))?;
    Ok((out.stdout, collected))
}

/// Row 13's idle line: instructions of one poll of an idle engine (`idle-poll`).
pub(crate) fn idle_rows(out: &mut Out) -> Result<(), String> {
    let bin = crate::ucx::beside("idle-poll", "uccl-benches")?;
    let polls = IDLE_POLLS.to_string();
    let (_, none) = callgrind(&bin, &["0"], None)?;
    let (_, many) = callgrind(&bin, &[&polls], None)?;
    let per_poll = (many - none) / f64::from(IDLE_POLLS);
    out.rows.push(Row::new(
        "13",
        "instructions per poll of an idle engine (callgrind, at the margin)",
        "idle-poll: 2 engines on softnic::Fabric::default(), 1 connection, nothing in flight",
        format!("{IDLE_BEFORE:.0} (7738383)"),
        format!("{per_poll:.0}"),
        per_poll / IDLE_BEFORE,
        "report (issue 28: empty polls that cost little)",
    ));
    out.notes.push(format!(
        "Row 13, idle poll: `valgrind --tool=callgrind idle-poll {IDLE_POLLS}` less `idle-poll \
         0`: {many:.0} - {none:.0} instructions over {IDLE_POLLS} polls."
    ));
    Ok(())
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
