//! Row 12: softnic's UDP link against the kernel's own UDP limit on this machine. perftest's
//! `ib_write_bw -s 65536` between two `softnic-run` processes, side by side with `udp-limit`
//! (a GSO sender and a GRO receiver on the loopback interface, RoCE-sized datagrams).

use std::process::Command;

use crate::perf::median;
use crate::{Out, Row};

/// Runs both `reps` times, alternating.
pub(crate) fn rows(reps: usize, out: &mut Out) -> Result<(), String> {
    let launcher = crate::ucx::launcher()?;
    let limit_bin = launcher.with_file_name("udp-limit");
    let (mut kernel, mut softnic) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        eprintln!("  $ {} --json", limit_bin.display());
        let o = Command::new(&limit_bin)
            .arg("--json")
            .output()
            .map_err(|e| format!("running {}: {e}", limit_bin.display()))?;
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).map_err(|e| {
            format!(
                "udp-limit printed no JSON ({e}): {}",
                String::from_utf8_lossy(&o.stderr)
            )
        })?;
        kernel.push(crate::perf::num(&v, "received_gbps")?);
        softnic.push(crate::ucx::ib_write_bw_gbps(
            &launcher,
            crate::perf::free_port()?,
            65536,
        )?);
    }
    let (k, s) = (median(&kernel), median(&softnic));
    out.rows.push(Row::new(
        "12",
        "softnic's UDP link: ib_write_bw 64 KiB vs the kernel's UDP limit",
        "2 processes on loopback; udp-limit: GSO sends, GRO receives, 4128 B datagrams",
        format!("{k:.1} Gb/s"),
        format!("{s:.1} Gb/s"),
        s / k,
        ">= 0.8",
    ));
    out.notes.push(format!(
        "Row 12: medians of {reps} alternating runs of `udp-limit --json` (received Gb/s over 2 \
         s) and `softnic-run -- ib_write_bw -d soft0 -x 1 -s 65536 -n 20000` (BW average) on the \
         same machine."
    ));
    Ok(())
}
