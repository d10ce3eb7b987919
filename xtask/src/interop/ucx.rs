//! The UCX and MPI part of `cargo xtask interop`: Debian's UCX 1.13 (`ucx-utils`) and OpenMPI
//! (`openmpi-bin`, `libopenmpi-dev`) over UCX and over libfabric, unmodified, on softnic
//! through `softnic-run`.
//!
//! `ucx_info -d` must list softnic's device with UCX's `rc_verbs` and `ud_verbs` transports
//! (as an ordinary user when run as root: the launcher's device view needs no root);
//! `ucx_perftest` runs between a server and a client process (UCP tests with
//! `UCX_TLS=rc_verbs,ud_verbs` and with `ud_verbs` alone, UCT tests on one transport, some under
//! 1% loss); MPI tests of ours (built with `mpicc`: a ping-pong and bandwidth test,
//! `tests/c/mpi_pingpong.c`, on two ranks, and collectives and one-sided communication,
//! `tests/c/mpi_collectives.c`, on four) run with `--mca pml ucx --mca osc ucx`, and over
//! libfabric's verbs provider (`--mca pml cm --mca mtl ofi`), each rank its own softnic
//! device. A run fails on a non-zero exit, on missing success output, and on any error line
//! of UCX, MPI or the launcher in either process. Iteration counts are small: each run takes
//! about a second.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use super::{run_until, spawn_piped, stop, wait_with_deadline};

/// A row of the interop summary.
pub(super) struct Row {
    pub(super) program: String,
    pub(super) args: String,
    pub(super) ok: bool,
    pub(super) secs: f64,
    pub(super) line: String,
}

/// One `ucx_perftest` run: the transports, the client's arguments, the loss both devices
/// inject.
struct Perf {
    tls: &'static str,
    args: &'static str,
    loss: Option<&'static str>,
}

const fn perf(tls: &'static str, args: &'static str) -> Perf {
    Perf {
        tls,
        args,
        loss: None,
    }
}

const fn lossy(tls: &'static str, args: &'static str) -> Perf {
    Perf {
        tls,
        args,
        loss: Some("0.01"),
    }
}

const BOTH: &str = "rc_verbs,ud_verbs";
const UD: &str = "ud_verbs";
/// UCT tests name their transport and device themselves.
const UCT: &str = "";

/// The matrix. UCX's UD transport has no put (UCX refuses `put_bw` on `ud_verbs` itself).
const PERF: &[Perf] = &[
    perf(BOTH, "-t ucp_put_bw -s 65536 -n 100 -w 10"),
    perf(BOTH, "-t ucp_get -s 65536 -n 100 -w 10"),
    perf(BOTH, "-t tag_bw -s 65536 -n 100 -w 10"),
    perf(BOTH, "-t tag_lat -s 8 -n 1000 -w 100"),
    perf(BOTH, "-t stream_bw -s 65536 -n 100 -w 10"),
    perf(BOTH, "-t ucp_am_bw -s 65536 -n 100 -w 10"),
    perf(UD, "-t ucp_put_bw -s 65536 -n 50 -w 10"),
    perf(UD, "-t ucp_get -s 65536 -n 50 -w 10"),
    perf(UD, "-t tag_bw -s 65536 -n 50 -w 10"),
    perf(UD, "-t tag_lat -s 8 -n 200 -w 10"),
    perf(UD, "-t stream_bw -s 65536 -n 50 -w 10"),
    perf(UD, "-t ucp_am_bw -s 65536 -n 50 -w 10"),
    perf(
        UCT,
        "-t put_bw -D bcopy -x rc_verbs -d soft0:1 -s 4096 -n 200 -w 10",
    ),
    perf(
        UCT,
        "-t put_bw -D zcopy -x rc_verbs -d soft0:1 -s 65536 -n 100 -w 10",
    ),
    perf(
        UCT,
        "-t am_bw -D short -x rc_verbs -d soft0:1 -s 8 -n 1000 -w 10",
    ),
    perf(
        UCT,
        "-t am_bw -D short -x ud_verbs -d soft0:1 -s 8 -n 1000 -w 10",
    ),
    perf(
        UCT,
        "-t am_bw -D bcopy -x ud_verbs -d soft0:1 -s 4000 -n 200 -w 10",
    ),
    lossy(BOTH, "-t ucp_put_bw -s 65536 -n 50 -w 10"),
    lossy(BOTH, "-t tag_bw -s 65536 -n 50 -w 10"),
    lossy(UD, "-t tag_bw -s 65536 -n 30 -w 5"),
    lossy(UD, "-t tag_lat -s 8 -n 200 -w 10"),
];

/// How an MPI run moves its data.
#[derive(Clone, Copy)]
enum MpiPath {
    /// Over UCX with these transports (`UCX_TLS`): `--mca pml ucx --mca osc ucx`.
    Ucx(&'static str),
    /// Over libfabric's verbs provider under `ofi_rxm` (`--mca pml cm --mca mtl ofi`), which
    /// finds the device among the interface addresses; one-sided communication by Open MPI's
    /// own components over it.
    Ofi,
}

/// The MPI runs: the transports UCX may use, and libfabric.
const MPI: &[MpiPath] = &[MpiPath::Ucx(BOTH), MpiPath::Ucx(UD), MpiPath::Ofi];

impl MpiPath {
    /// `mpirun`'s arguments for the path: MCA parameters and exported variables.
    fn args(self) -> Vec<String> {
        let fixed: &[&str] = match self {
            MpiPath::Ucx(_) => &["--mca", "pml", "ucx", "--mca", "osc", "ucx"],
            MpiPath::Ofi => &["--mca", "pml", "cm", "--mca", "mtl", "ofi"],
        };
        let mut a: Vec<String> = fixed.iter().map(|s| s.to_string()).collect();
        match self {
            MpiPath::Ucx(tls) => a.extend([
                "-x".into(),
                format!("UCX_TLS={tls}"),
                "-x".into(),
                "UCX_NET_DEVICES=soft0:1".into(),
            ]),
            MpiPath::Ofi => a.extend(["-x".into(), "FI_PROVIDER=verbs;ofi_rxm".into()]),
        }
        a
    }

    /// How the summary names the path: its arguments, the variables without their `-x`.
    fn describe(self) -> String {
        let args = self.args();
        let named: Vec<&str> = args
            .iter()
            .map(String::as_str)
            .filter(|a| *a != "-x")
            .collect();
        named.join(" ")
    }
}

/// What marks an error in any process's output.
const ERROR_LINES: &[&str] = &[
    "UCX  ERROR",
    "UCX  WARN",
    "Fatal",
    "Caught signal",
    "mpi: FAILED",
    "softnic-run:",
    "softnic: ",
];

/// The longest one process may run.
const DEADLINE: Duration = Duration::from_secs(60);

/// An MPI test program of ours, `crates/softnic-verbs/tests/c/<name>.c`, built by
/// [`build_mpi`] into `target/interop/<name>`.
struct MpiTest {
    /// The program's (and its source's) name.
    name: &'static str,
    /// The ranks `mpirun` starts (`-np`).
    ranks: u8,
    /// The program's arguments.
    args: &'static [&'static str],
    /// The lines (their beginnings) of rank 0's output the summary shows.
    figures: &'static [&'static str],
}

/// The MPI tests: two ranks' ping-pong and bandwidth (`MPI_Send`, `MPI_Isend`), and four
/// ranks' collectives and one-sided communication (`MPI_Allreduce`, `MPI_Alltoall`,
/// `MPI_Put`, `MPI_Fetch_and_op`, ...).
const MPI_TESTS: &[MpiTest] = &[
    MpiTest {
        name: "mpi_pingpong",
        ranks: 2,
        args: &["100"],
        figures: &["mpi: ping-pong 8", "mpi: bandwidth"],
    },
    MpiTest {
        name: "mpi_collectives",
        ranks: 4,
        args: &[],
        figures: &["mpi: all checks passed"],
    },
];

impl MpiTest {
    /// Where [`build_mpi`] puts the program.
    fn program(&self) -> std::path::PathBuf {
        crate::run::workspace_root()
            .join("target/interop")
            .join(self.name)
    }
}

/// Builds the MPI tests with `mpicc` (from `libopenmpi-dev`, installed by setup).
pub(super) fn build_mpi() -> Result<(), String> {
    let root = crate::run::workspace_root();
    std::fs::create_dir_all(root.join("target/interop")).map_err(|e| e.to_string())?;
    for t in MPI_TESTS {
        let source = root.join(format!("crates/softnic-verbs/tests/c/{}.c", t.name));
        crate::run::status(&mut crate::run::cmd(
            "mpicc",
            &[
                "-O1",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-o",
                &t.program().to_string_lossy(),
                &source.to_string_lossy(),
            ],
        ))?;
    }
    Ok(())
}

/// Runs every UCX and MPI case, reporting each as it ends.
pub(super) fn run(launcher: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut report = |program: &str, args: String, started: Instant, r: Result<String, String>| {
        let line = match &r {
            Ok(l) => l.clone(),
            Err(why) => why.clone(),
        };
        eprintln!(
            "xtask interop: {program} {args} {}: {}",
            if r.is_ok() { "ok" } else { "FAILED" },
            line.lines().next().unwrap_or("")
        );
        rows.push(Row {
            program: program.into(),
            args,
            ok: r.is_ok(),
            secs: started.elapsed().as_secs_f64(),
            line,
        });
    };
    let started = Instant::now();
    let as_nobody = is_root();
    report(
        "ucx_info",
        format!("-d{}", if as_nobody { " (as nobody)" } else { "" }),
        started,
        ucx_info(launcher, as_nobody),
    );
    for p in PERF {
        let started = Instant::now();
        let mut args = String::new();
        if !p.tls.is_empty() {
            args = format!("UCX_TLS={} ", p.tls);
        }
        if let Some(l) = p.loss {
            args.push_str(&format!("--loss {l} "));
        }
        args.push_str(p.args);
        report("ucx_perftest", args, started, perftest(launcher, p));
    }
    for t in MPI_TESTS {
        for &path in MPI {
            let started = Instant::now();
            let args = format!(
                "-np {} --oversubscribe {} {}",
                t.ranks,
                path.describe(),
                t.name
            );
            report("mpirun", args, started, mpi(launcher, t, path));
        }
    }
    rows
}

/// Whether this process runs as root.
fn is_root() -> bool {
    crate::setup::is_root()
}

/// A command for the launcher, as `nobody` when asked (through `setpriv`).
fn launch(launcher: &str, as_nobody: bool) -> Command {
    let mut c = if as_nobody {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", launcher]);
        c
    } else {
        Command::new(launcher)
    };
    c.arg("--quiet");
    c
}

/// `ucx_info -d` lists softnic's device with both verbs transports.
fn ucx_info(launcher: &str, as_nobody: bool) -> Result<String, String> {
    let out = run_until(
        launch(launcher, as_nobody).args(["--", "ucx_info", "-d"]),
        Instant::now() + DEADLINE,
        "ucx_info",
        "alone",
    )?;
    if as_nobody && String::from_utf8_lossy(&out.stderr).contains("user namespaces look off") {
        // This host lets no ordinary user make a user namespace (the launcher said so): what
        // can be checked here is the device as root sees it.
        return ucx_info(launcher, false)
            .map(|l| format!("{l} (as root: user namespaces are off for other users here)"));
    }
    let text = clean(out, "ucx_info")?;
    let listed = |t: &str| text.contains(&format!("Transport: {t}"));
    if text.contains("Device: soft0:1") && listed("rc_verbs") && listed("ud_verbs") {
        Ok("soft0:1 with rc_verbs and ud_verbs".into())
    } else {
        Err(format!(
            "soft0:1 with rc_verbs and ud_verbs not listed:\n{text}"
        ))
    }
}

/// A `ucx_perftest` server and, once it listens, a client; both must succeed.
fn perftest(launcher: &str, p: &Perf) -> Result<String, String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("finding a free port: {e}"))?
        .port()
        .to_string();
    let command = |client: bool| {
        let mut c = launch(launcher, false);
        if let Some(l) = p.loss {
            c.args(["--loss", l]);
        }
        c.args(["--", "ucx_perftest", "-p", &port]);
        if client {
            c.arg("127.0.0.1").args(p.args.split_whitespace());
        }
        c.env("UCX_NET_DEVICES", "soft0:1");
        if !p.tls.is_empty() {
            c.env("UCX_TLS", p.tls);
        }
        c
    };
    let mut server = spawn_piped(&mut command(false), "ucx_perftest")?;
    let deadline = Instant::now() + DEADLINE;
    // The client retries until the server listens.
    let client = loop {
        std::thread::sleep(Duration::from_millis(100));
        let out = run_until(&mut command(true), deadline, "ucx_perftest", "client")
            .inspect_err(|_| stop(&mut server))?;
        let text = String::from_utf8_lossy(&out.stderr);
        if out.status.success() || !text.contains("Connection refused") || Instant::now() > deadline
        {
            break out;
        }
    };
    let server = wait_with_deadline(server, deadline, "ucx_perftest", "server");
    let client = clean(client, "client")?;
    clean(server?, "server")?;
    client
        .lines()
        .find(|l| l.starts_with("Final:"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .ok_or_else(|| format!("client: no 'Final:' line:\n{client}"))
}

/// MPI test `t` on its ranks over `path`.
fn mpi(launcher: &str, t: &MpiTest, path: MpiPath) -> Result<String, String> {
    let mut c = launch(launcher, false);
    let ranks = t.ranks.to_string();
    c.args(["--", "mpirun", "-np", &ranks, "--oversubscribe"]);
    if is_root() {
        c.arg("--allow-run-as-root");
    }
    c.args(path.args()).arg(t.program()).args(t.args);
    let out = run_until(&mut c, Instant::now() + DEADLINE, "mpirun", "every rank")?;
    let text = clean(out, "mpirun")?;
    if !text.contains("mpi: all checks passed") {
        return Err(format!("no 'mpi: all checks passed':\n{text}"));
    }
    Ok(text
        .lines()
        .filter(|l| t.figures.iter().any(|f| l.starts_with(f)))
        .map(|l| l.trim_start_matches("mpi: "))
        .collect::<Vec<_>>()
        .join("; "))
}

/// The output of a process that exited 0 with no error line; else why not.
fn clean(out: Output, who: &str) -> Result<String, String> {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let bad = text
        .lines()
        .find(|l| ERROR_LINES.iter().any(|e| l.contains(e)));
    match (out.status.success(), bad) {
        (true, None) => Ok(text),
        (ok, bad) => Err(format!(
            "{who}: {}{}:\n{text}",
            if ok {
                String::new()
            } else {
                format!("exit {}", out.status)
            },
            bad.map_or(String::new(), |l| format!(" error line {l:?}"))
        )),
    }
}
