//! Row 10: UCX on softnic (issue 25). Debian's `ucx_perftest` between two processes under
//! `softnic-run` (`UCX_TLS=rc_verbs,ud_verbs`) against perftest's `ib_write_bw` and
//! `ib_send_lat` on the same softnic link, and against the same `ucx_perftest` runs over TCP on
//! the loopback interface (`UCX_TLS=tcp`, what a user without softnic would run): `ucp_put_bw`
//! and `tag_bw` at 64 KiB (MB/s), `tag_lat` at 8 B (average one-way µs, as perftest's `t_avg`).
//! Each figure is the median of `reps` runs; the programs come from setup's packages, the
//! launcher is the `softnic-run` next to this program.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::perf::median;

use super::{Out, Row};

/// One measurement: what, how, and the medians (softnic perftest, softnic UCX, TCP UCX).
pub(crate) struct UcxRow {
    pub(crate) what: &'static str,
    pub(crate) perftest: &'static str,
    pub(crate) unit: &'static str,
    pub(crate) perftest_value: f64,
    pub(crate) ucx_softnic: f64,
    pub(crate) ucx_tcp: f64,
}

/// The three measurements: (name, ucx_perftest arguments, perftest program and arguments).
const CASES: [(&str, &str, &str); 3] = [
    (
        "ucp_put_bw 64 KiB",
        "-t ucp_put_bw -s 65536 -n 5000 -w 500",
        "ib_write_bw -d soft0 -x 1 -s 65536 -n 5000",
    ),
    (
        "tag_bw 64 KiB",
        "-t tag_bw -s 65536 -n 5000 -w 500",
        "ib_write_bw -d soft0 -x 1 -s 65536 -n 5000",
    ),
    (
        "tag_lat 8 B",
        "-t tag_lat -s 8 -n 50000 -w 5000",
        "ib_send_lat -d soft0 -x 1 -s 8 -n 50000",
    ),
];

/// The longest one process may run.
const DEADLINE: Duration = Duration::from_secs(120);

/// The `softnic-run` launcher next to this program.
pub(crate) fn launcher() -> Result<std::path::PathBuf, String> {
    beside("softnic-run", "softnic-verbs")
}

/// The program `name` next to this one, which `cargo build --release -p <package>` builds.
pub(crate) fn beside(name: &str, package: &str) -> Result<std::path::PathBuf, String> {
    let path = std::env::current_exe()
        .map_err(|e| format!("where is this program? {e}"))?
        .with_file_name(name);
    if !path.is_file() {
        return Err(format!(
            "no {name} at {} (cargo build --release -p {package})",
            path.display()
        ));
    }
    Ok(path)
}

/// Runs every case `reps` times (softnic perftest, softnic UCX, TCP UCX in turn).
pub(crate) fn ucx_rows(reps: usize) -> Result<Vec<UcxRow>, String> {
    let launcher = launcher()?;
    let mut rows = Vec::new();
    for (what, ucx, perftest) in CASES {
        let lat = what.contains("lat");
        let mut v = [Vec::new(), Vec::new(), Vec::new()];
        for _ in 0..reps {
            for (k, runs) in v.iter_mut().enumerate() {
                let port = crate::perf::free_port()?;
                let figure = match k {
                    0 => perftest_figure(&pair(&launcher, port, perftest, &[])?, lat)?,
                    1 => ucx_figure(&pair(&launcher, port, ucx, SOFTNIC)?, lat)?,
                    _ => ucx_figure(&pair(Path::new(""), port, ucx, TCP)?, lat)?,
                };
                runs.push(figure);
            }
        }
        rows.push(UcxRow {
            what,
            perftest: perftest.split_whitespace().next().unwrap_or(""),
            unit: if lat { "µs" } else { "MB/s" },
            perftest_value: median(&v[0]),
            ucx_softnic: median(&v[1]),
            ucx_tcp: median(&v[2]),
        });
    }
    Ok(rows)
}

const SOFTNIC: &[(&str, &str)] = &[
    ("UCX_TLS", "rc_verbs,ud_verbs"),
    ("UCX_NET_DEVICES", "soft0:1"),
];
const TCP: &[(&str, &str)] = &[("UCX_TLS", "tcp"), ("UCX_NET_DEVICES", "lo")];

/// A server and a client of `program` (its arguments after the name; the client's are given
/// only to the client for `ucx_perftest`, to both for perftest), under `launcher` unless it
/// is empty; the client's output.
pub(crate) fn pair(
    launcher: &Path,
    port: u16,
    command: &str,
    env: &[(&str, &str)],
) -> Result<String, String> {
    let mut words = command.split_whitespace();
    let program = words.next().unwrap_or("");
    let args: Vec<&str> = words.collect();
    let ucx = program.is_empty() || command.starts_with("-t");
    let (program, args) = if ucx {
        (
            "ucx_perftest",
            command.split_whitespace().collect::<Vec<_>>(),
        )
    } else {
        (program, args)
    };
    let port = port.to_string();
    let build = |client: bool| {
        let mut c = if launcher.as_os_str().is_empty() {
            Command::new(program)
        } else {
            let mut c = Command::new(launcher);
            c.args(["--quiet", "--", program]);
            c
        };
        if !ucx || client {
            c.args(&args);
        }
        c.args(["-p", &port]);
        if client {
            c.arg("127.0.0.1");
        }
        c.envs(env.iter().copied());
        c
    };
    eprintln!(
        "  $ {} ({})",
        command,
        if launcher.as_os_str().is_empty() {
            "tcp"
        } else {
            "softnic"
        }
    );
    let server = build(false)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting {program}: {e}"))?;
    let deadline = Instant::now() + DEADLINE;
    let client = loop {
        std::thread::sleep(Duration::from_millis(200));
        let out = build(true)
            .output()
            .map_err(|e| format!("running {program}: {e}"))?;
        let text = String::from_utf8_lossy(&out.stderr).to_lowercase();
        let early = text.contains("refused") || text.contains("couldn't connect");
        if out.status.success() || !early || Instant::now() > deadline {
            break out;
        }
    };
    reap(server, deadline);
    let text = output_text(&client);
    if client.status.success() {
        Ok(text)
    } else {
        Err(format!("{program} failed ({}):\n{text}", client.status))
    }
}

/// Waits for the server until `deadline`, then kills it.
pub(crate) fn reap(mut server: Child, deadline: Instant) {
    while Instant::now() < deadline {
        if let Ok(Some(_)) = server.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = server.kill();
    let _ = server.wait();
}

fn output_text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `ucx_perftest`'s final line: overall bandwidth (MB/s) or average latency (µs).
fn ucx_figure(out: &str, lat: bool) -> Result<f64, String> {
    let line = out
        .lines()
        .find(|l| l.starts_with("Final:"))
        .ok_or_else(|| format!("no 'Final:' line in:\n{out}"))?;
    let f: Vec<&str> = line.split_whitespace().collect();
    let i = if lat { 3 } else { 6 };
    f.get(i)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("no figure in {line:?}"))
}

/// perftest's result row: average bandwidth (MB/s, `ib_write_bw`) or `t_avg` (µs,
/// `ib_send_lat`).
fn perftest_figure(out: &str, lat: bool) -> Result<f64, String> {
    perftest_column(out, if lat { 5 } else { 3 })
}

/// `ib_write_bw -d soft0 -x 1 -s SIZE -n 20000` between two `launcher` processes on `port`:
/// its BW average, in Gb/s (rows 12 and 14's raw-verbs baseline at 64 KiB; row 14's at the
/// engine's 16 KiB chunks too).
pub(crate) fn ib_write_bw_gbps(launcher: &Path, port: u16, size: u32) -> Result<f64, String> {
    let text = pair(
        launcher,
        port,
        &format!("ib_write_bw -d soft0 -x 1 -s {size} -n 20000"),
        &[],
    )?;
    // MB/s to Gb/s.
    Ok(perftest_column(&text, 3)? * 8.0 / 1000.0)
}

/// Column `col` (from 0) of perftest's result row, the line after its `#bytes` header.
pub(crate) fn perftest_column(out: &str, col: usize) -> Result<f64, String> {
    let lines: Vec<&str> = out.lines().collect();
    let i = lines
        .iter()
        .position(|l| l.contains("#bytes"))
        .ok_or_else(|| format!("no result header in:\n{out}"))?;
    let row: Vec<&str> = lines
        .get(i + 1)
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default();
    row.get(col)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("no figure in {:?}", lines.get(i + 1)))
}

/// Row 10: UCX on softnic against perftest on the same link and against UCX over TCP.
pub(super) fn rows(out: &mut Out) -> Result<(), String> {
    let rows = ucx_rows(3)?;
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
