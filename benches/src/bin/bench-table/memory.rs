//! Row 7: what memory and keys cost. Registering and giving back a buffer, and exporting and
//! withdrawing a range, per call, at no connection and at 1024 (both O(log n): a buffer is
//! pinned once for every data QP); and a receive advertised with a memory window over exactly
//! its range against one with the whole buffer's key (`uccl-perf --recv-keys`).

use std::path::Path;
use std::time::{Duration, Instant};

use softnic::{Fabric, FabricConfig};
use uccl_engine::{Clock, Engine, EngineConfig, connect_pair};
use verbs_safe::{Context, Verbs};

use crate::perf::{median, num, run};

use super::{Out, Row};

/// Per-call costs at no connection and at [`CONNS`], in ns.
pub(crate) struct Calls {
    /// register(64 KiB) + deregister: no connection, [`CONNS`].
    pub(crate) register: [f64; 2],
    /// export(64 KiB) + withdraw: no connection, [`CONNS`].
    pub(crate) export: [f64; 2],
}

/// Connections held while the calls are timed: none, then this many.
pub(crate) const CONNS: u32 = 1024;

/// Size of the buffers registered and of the ranges exported (below malloc's mmap threshold,
/// so that the allocator's system calls stay out of the measure).
const SIZE: usize = 64 << 10;

/// An engine pair on a fabric of its own, the first holding `conns` connections to the second.
fn engines(conns: u32) -> Result<(Fabric, Engine, Engine), String> {
    let e = |e: uccl_engine::EngineError| e.to_string();
    let fabric = Fabric::new(FabricConfig::default());
    let verbs = Verbs::soft(&fabric);
    let cfg = EngineConfig {
        max_conns: conns.max(1),
        qps_per_conn: 1,
        max_recvs: 2,
        ..EngineConfig::default()
    };
    let engine = |name: &str| -> Result<Engine, String> {
        let ctx = Context::open_by_name(&verbs, name).map_err(|e| e.to_string())?;
        Engine::new(&ctx, cfg.clone(), Clock::Fabric(fabric.clone())).map_err(e)
    };
    let (mut a, mut b) = (engine("soft0")?, engine("soft1")?);
    for _ in 0..conns {
        connect_pair(&mut a, &mut b).map_err(e)?;
    }
    Ok((fabric, a, b))
}

/// Medians over `reps` rounds of `iters` call pairs, the two engines' rounds alternating.
pub(crate) fn calls(iters: u32, reps: usize) -> Result<Calls, String> {
    let e = |e: uccl_engine::EngineError| e.to_string();
    let mut sides = [engines(0)?, engines(CONNS)?];
    let mut times = [[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]];
    for r in 0..=reps {
        for (k, (_, a, _)) in sides.iter_mut().enumerate() {
            let buf = a.register(SIZE).map_err(e)?;
            let t = Instant::now();
            for _ in 0..iters {
                let x = a.register(SIZE).map_err(e)?;
                a.deregister(&x).map_err(e)?;
            }
            let reg = per(t.elapsed(), iters);
            let t = Instant::now();
            for _ in 0..iters {
                let d = a.export(&buf, 0, SIZE as u64).map_err(e)?;
                a.withdraw_export(&d).map_err(e)?;
            }
            // Round 0 warms up (the allocator, the maps).
            if r > 0 {
                times[0][k].push(reg);
                times[1][k].push(per(t.elapsed(), iters));
            }
        }
    }
    let m = |v: &[Vec<f64>; 2]| [median(&v[0]), median(&v[1])];
    Ok(Calls {
        register: m(&times[0]),
        export: m(&times[1]),
    })
}

fn per(d: Duration, n: u32) -> f64 {
    d.as_nanos() as f64 / f64::from(n)
}

/// Receives with a window vs with the buffer's key: messages per second and stack CPU ns per
/// message, medians of `reps` runs of each, alternating.
pub(crate) struct Windows {
    pub(crate) args: String,
    /// Window, buffer.
    pub(crate) msgs_per_s: [f64; 2],
    pub(crate) stack_ns: [f64; 2],
}

/// The A/B of receive keys: 4 KiB messages of one chunk (the per-receive cost at its largest
/// share), no payload, no loss.
pub(crate) const WINDOW_ARGS: [&str; 11] = [
    "--no-payload",
    "--loss",
    "0",
    "--msg-size",
    "4KiB",
    "--chunk-size",
    "4KiB",
    "--messages",
    "20000",
    "--qps-per-flow",
    "2",
];

pub(crate) fn windows(bin: &Path, reps: usize) -> Result<Windows, String> {
    let keys = ["window", "buffer"];
    let (mut rate, mut cpu) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    for r in 0..reps {
        for k in [r % 2, 1 - r % 2] {
            let mut args = WINDOW_ARGS.to_vec();
            args.extend(["--recv-keys", keys[k]]);
            let j = run(bin, &args)?;
            rate[k].push(num(&j, "messages_per_s")?);
            cpu[k].push(num(&j, "stack_cpu_ns_per_chunk")?);
        }
    }
    Ok(Windows {
        args: WINDOW_ARGS.join(" "),
        msgs_per_s: [median(&rate[0]), median(&rate[1])],
        stack_ns: [median(&cpu[0]), median(&cpu[1])],
    })
}

/// Row 7: memory and keys.
pub(super) fn rows(perf: &Path, out: &mut Out) -> Result<(), String> {
    const ITERS: u32 = 2000;
    eprintln!("  register/export at 0 and {} connections", CONNS);
    let c = calls(ITERS, 5)?;
    for (what, [base, ours]) in [
        ("register(64 KiB) + deregister, ns", c.register),
        ("export(64 KiB) + withdraw, ns", c.export),
    ] {
        out.rows.push(Row::new(
            "7",
            format!("{what}: no connection vs **{} connections**", CONNS),
            "one engine, softnic, per call pair",
            format!("{base:.0}"),
            format!("{ours:.0}"),
            ours / base,
            "~1 (O(log n), not O(QPs))",
        ));
    }
    let w = windows(perf, 5)?;
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
        CONNS, w.args
    ));
    Ok(())
}
