//! `cargo xtask interop` (part of `test`): unmodified libibverbs programs (rdma-core's
//! `ibverbs-utils`, `perftest`) run on softnic through `softnic-run`, each as a server
//! process and a client process talking RoCEv2 over the loopback interface; every one must
//! exit 0 with its own success output; then UCX and OpenMPI over UCX ([`ucx`]), and the
//! rdma_cm programs on softnic's librdmacm ([`rdmacm`]). A summary table ends the run.

use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use crate::run::{cargo_cmd, cmd, status, target_bin};

mod rdmacm;
mod ucx;

/// One program run: its arguments and how its success shows.
struct Case {
    program: &'static str,
    args: &'static str,
    /// Run as a server and a client (`false`: one process).
    pair: bool,
    /// A line of the client's output that says it worked.
    says: &'static str,
    /// A line of the server's output that says it worked (unused for one process).
    server_says: &'static str,
}

const fn pair(program: &'static str, args: &'static str, says: &'static str) -> Case {
    Case {
        program,
        args,
        pair: true,
        says,
        server_says: says,
    }
}

/// One process.
const fn alone(program: &'static str, args: &'static str, says: &'static str) -> Case {
    Case {
        program,
        args,
        pair: false,
        says,
        server_says: "",
    }
}

/// A pair whose server prints no result (perftest's READ and atomic latency tests: only the
/// side that issues the operations measures): it must exit 0 having said whom it talked to.
const fn quiet_server(program: &'static str, args: &'static str, says: &'static str) -> Case {
    Case {
        server_says: "remote address",
        ..pair(program, args, says)
    }
}

/// The matrix: the pingpongs with and without events and at a few sizes, perftest's
/// bandwidth and latency tests at their default size and over all sizes (`-a`, fewer
/// iterations to stay within the test budget). GID index 0 is the link-local GID and 1 the
/// IPv4-mapped one, as on rxe: both are used.
const CASES: &[Case] = &[
    alone("ibv_devices", "", "soft0"),
    alone("ibv_devinfo", "-v", "PORT_ACTIVE"),
    pair("ibv_rc_pingpong", "-g 0", "iters in"),
    pair("ibv_rc_pingpong", "-g 1 -e", "iters in"),
    pair("ibv_rc_pingpong", "-g 0 -s 65536", "iters in"),
    pair("ibv_rc_pingpong", "-g 0 -N -c", "iters in"),
    pair("ibv_uc_pingpong", "-g 0", "iters in"),
    pair("ibv_uc_pingpong", "-g 1 -e -s 1", "iters in"),
    pair("ibv_ud_pingpong", "-g 0", "iters in"),
    pair("ibv_ud_pingpong", "-g 1 -e -s 2048", "iters in"),
    pair("ibv_srq_pingpong", "-g 0", "iters in"),
    pair("ibv_srq_pingpong", "-g 1 -e -s 16384 -q 4", "iters in"),
    // XRC: a domain, an XRC SRQ and a target QP each side, the messages naming the SRQ.
    pair("ibv_xsrq_pingpong", "-g 1 -n 500", "success"),
    pair("ibv_xsrq_pingpong", "-g 0 -e -s 65536 -n 50", "success"),
    pair("ib_write_bw", "-d soft0 -x 0", "#bytes"),
    pair("ib_send_bw", "-d soft0 -x 1", "#bytes"),
    pair("ib_read_bw", "-d soft0 -x 0", "#bytes"),
    pair("ib_write_lat", "-d soft0 -x 0", "#bytes"),
    pair("ib_send_lat", "-d soft0 -x 1", "#bytes"),
    pair("ib_write_bw", "-d soft0 -x 0 -a -n 10", "#bytes"),
    pair("ib_send_bw", "-d soft0 -x 0 -a -n 10", "#bytes"),
    pair("ib_read_bw", "-d soft0 -x 1 -a -n 10", "#bytes"),
    // 16 outstanding READs of 16 MiB: answered a burst a round, not 256 MiB at once.
    pair("ib_read_bw", "-d soft0 -x 1 -s 16777216 -n 20", "#bytes"),
    pair("ib_write_lat", "-d soft0 -x 0 -a -n 5", "#bytes"),
    pair("ib_send_lat", "-d soft0 -x 0 -a -n 5", "#bytes"),
    quiet_server("ib_read_lat", "-d soft0 -x 0 -a -n 5", "#bytes"),
    // Atomics: compare-and-swap (perftest's default) and fetch-and-add.
    pair("ib_atomic_bw", "-d soft0 -x 1", "#bytes"),
    quiet_server("ib_atomic_lat", "-d soft0 -x 0 -A FETCH_AND_ADD", "#bytes"),
    // Multicast (-g): the server's UD QP joins a group and the client sends to it, an
    // IPv4-mapped group with the IPv4 GID (the server sleeping on its channel, -e: softnic's
    // progress thread takes the group's packets in), perftest's IPv6 default MGID with the
    // link-local one (perftest wants both of one kind).
    pair(
        "ib_send_bw",
        "-d soft0 -x 1 -c UD -g -M 0:0:0:0:0:0:0:0:0:0:255:255:239:1:2:3 -n 500 -e",
        "#bytes",
    ),
    pair("ib_send_lat", "-d soft0 -x 0 -c UD -g -n 500", "#bytes"),
    // Events. With completion moderation this perftest arms its CQ before it polls what the
    // last event left, and completes only because a CQ armed with completions unpolled owes
    // its event (as ConnectX raises one); its latency test shares one channel between its
    // two CQs and polls each once right after arming it, and completes only because that
    // event is withdrawn when the poll takes what was left (softnic's `MISSED_EVENT_GRACE`).
    pair("ib_send_bw", "-d soft0 -x 0 -e -Q 2 -n 500", "#bytes"),
    pair("ib_send_lat", "-d soft0 -x 0 -e -n 500", "#bytes"),
    // XRC (perftest gives both XRC QP types RC's attributes: those of the other side are
    // ignored, as by the kernel): SENDs into the server's XRC SRQ, four initiators' WRITEs,
    // READ and atomic latency.
    pair("ib_send_bw", "-d soft0 -x 1 -c XRC -n 1000", "#bytes"),
    pair("ib_write_bw", "-d soft0 -x 0 -c XRC -q 4 -n 1000", "#bytes"),
    quiet_server("ib_read_lat", "-d soft0 -x 1 -c XRC -n 200", "#bytes"),
    quiet_server("ib_atomic_lat", "-d soft0 -x 0 -c XRC -n 200", "#bytes"),
    // rdma_cm (-R) to 127.0.0.1: the server's listener at the any address is announced to
    // the host, as a kernel's processes share its devices (RC, and UD through SIDR).
    pair("ib_write_bw", "-d soft0 -x 1 -R", "#bytes"),
    pair("ib_send_bw", "-d soft0 -x 0 -R -c UD -n 500", "#bytes"),
];

/// The programs built here, not installed: the `ibverbs` crate's own `loopback` example and
/// softnic-verbs' C test of the extended verbs (`crates/softnic-verbs/tests/c/ext_verbs.c`,
/// written against `<infiniband/verbs.h>` and its inline helpers).
const BUILT: &[Case] = &[
    alone(LOOPBACK, "", "received"),
    alone(EXT_VERBS, "", "all checks passed"),
    alone(CONFORM, "", "conform: all checks passed"),
];

const LOOPBACK: &str = "ibverbs crate: loopback";
const EXT_VERBS: &str = "ext_verbs.c";
/// softnic-verbs' C test of what a conformance suite asks (`tests/c/conform.c`).
const CONFORM: &str = "conform.c";

/// The path of a program: where `build_local` put a built one, else its name.
fn path_of(program: &str) -> String {
    let built = match program {
        LOOPBACK => "target/ibverbs-crate/debug/examples/loopback",
        EXT_VERBS => "target/interop/ext_verbs",
        CONFORM => "target/interop/conform",
        _ => return program.to_string(),
    };
    crate::run::workspace_root()
        .join(built)
        .to_string_lossy()
        .into_owned()
}

/// The longest one program may run.
const DEADLINE: Duration = Duration::from_secs(120);
/// How long a program's output pipes may stay open after it exited (held by a process it
/// left behind) before the case fails.
const PIPE_GRACE: Duration = Duration::from_secs(10);

pub(crate) fn interop() -> Result<(), String> {
    // The launcher and the drop-in libibverbs.
    crate::run::build_workspace()?;
    let launcher = target_bin("debug", "softnic-run");
    ibverbs_loopback()?;
    c_test(EXT_VERBS)?;
    c_test(CONFORM)?;
    ucx::build_mpi()?;
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    for case in CASES.iter().chain(BUILT) {
        let started = Instant::now();
        let result = if case.pair {
            run_pair(&launcher, case)
        } else {
            run_one(&launcher, case)
        };
        let secs = started.elapsed().as_secs_f64();
        let line = match &result {
            Ok(out) => figure(out),
            Err(why) => why.lines().next().unwrap_or("").to_string(),
        };
        let ok = result.is_ok();
        eprintln!(
            "xtask interop: {} {} {}: {}",
            case.program,
            case.args,
            if ok { "ok" } else { "FAILED" },
            line
        );
        if let Err(why) = &result {
            failed.push(format!("{} {}:\n{why}", case.program, case.args));
        }
        rows.push(ucx::Row {
            program: case.program.into(),
            args: case.args.into(),
            ok,
            secs,
            line,
        });
    }
    for row in ucx::run(&launcher)
        .into_iter()
        .chain(rdmacm::run_all(&launcher))
    {
        if !row.ok {
            failed.push(format!("{} {}:\n{}", row.program, row.args, row.line));
        }
        rows.push(row);
    }
    println!("\n| program | arguments | result | time | reported |");
    println!("|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.1} s | {} |",
            r.program,
            r.args,
            if r.ok { "ok" } else { "FAILED" },
            r.secs,
            r.line.lines().next().unwrap_or("").trim()
        );
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} of {} interop runs failed:\n\n{}",
            failed.len(),
            rows.len(),
            failed.join("\n\n")
        ))
    }
}

/// The line of a program's output worth a summary: perftest's result row, a pingpong's
/// iteration line, else the first line.
fn figure(out: &str) -> String {
    let lines: Vec<&str> = out.lines().collect();
    if let Some(i) = lines.iter().position(|l| l.contains("#bytes")) {
        return lines
            .iter()
            .skip(i + 1)
            .take_while(|l| !l.starts_with("---"))
            .last()
            .map_or(String::new(), |l| {
                l.split_whitespace().collect::<Vec<_>>().join(" ")
            });
    }
    lines
        .iter()
        .find(|l| l.contains("iters in"))
        .or(lines.first())
        .map_or(String::new(), |l| l.trim().to_string())
}

/// Compiles a C test of softnic-verbs (`tests/c/<name>`) against the system's
/// `<infiniband/verbs.h>` and libibverbs (`libibverbs-dev`, installed by setup), as any C
/// program is.
fn c_test(name: &str) -> Result<(), String> {
    let root = crate::run::workspace_root();
    let out = path_of(name);
    std::fs::create_dir_all(root.join("target/interop")).map_err(|e| e.to_string())?;
    let source = root.join("crates/softnic-verbs/tests/c").join(name);
    let source = source.to_string_lossy();
    status(&mut cmd(
        "cc",
        &[
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
            &out,
            &source,
            "-libverbs",
        ],
    ))
}

/// Builds the `ibverbs` crate's own `loopback` example (from the crate as the workspace
/// downloaded it, into its own target directory): a program written against the crate, which
/// links the system libibverbs like any other (run from [`path_of`]).
fn ibverbs_loopback() -> Result<(), String> {
    let metadata = crate::run::output(&mut cargo_cmd(&[
        "metadata",
        "--format-version",
        "1",
        "--locked",
    ]))
    .ok_or("cargo metadata failed")?;
    let key = "\"manifest_path\":\"";
    let manifest = metadata
        .match_indices(key)
        .map(|(i, _)| &metadata[i + key.len()..])
        .map(|rest| &rest[..rest.find('"').unwrap_or(0)])
        .find(|path| path.contains("/ibverbs-0.") && path.ends_with("/Cargo.toml"))
        .ok_or("the ibverbs crate is not among the workspace's dependencies")?
        .to_string();
    let target = crate::run::workspace_root().join("target/ibverbs-crate");
    let target = target.to_string_lossy();
    status(&mut cargo_cmd(&[
        "build",
        "--manifest-path",
        &manifest,
        "--example",
        "loopback",
        "--target-dir",
        &target,
    ]))?;
    Ok(())
}

/// Runs a one-process case (the `ibverbs` crate's example by its path).
fn run_one(launcher: &str, case: &Case) -> Result<String, String> {
    let program = path_of(case.program);
    let mut c = Command::new(launcher);
    c.args(["--quiet", "--", &program])
        .args(case.args.split_whitespace());
    let out = run_until(&mut c, Instant::now() + DEADLINE, case.program, "alone")?;
    checked(case.says, &out)
}

/// Runs a server and, once it listens, a client; both must succeed.
fn run_pair(launcher: &str, case: &Case) -> Result<String, String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("finding a free port: {e}"))?
        .port()
        .to_string();
    let args = |client: bool| {
        let mut a: Vec<String> = vec!["--quiet".into(), "--".into(), case.program.into()];
        a.extend(case.args.split_whitespace().map(String::from));
        a.extend(["-p".to_string(), port.clone()]);
        if client {
            a.push("127.0.0.1".into());
        }
        a
    };
    let spawn_server = || spawn_piped(Command::new(launcher).args(args(false)), case.program);
    let mut server = spawn_server()?;
    let deadline = Instant::now() + DEADLINE;
    // The client retries until the server listens (the programs do not).
    let client = loop {
        std::thread::sleep(Duration::from_millis(200));
        let out = run_until(
            Command::new(launcher).args(args(true)),
            deadline,
            case.program,
            "client",
        )
        .inspect_err(|_| stop(&mut server))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
        .to_lowercase();
        let failed = !out.status.success() && Instant::now() <= deadline;
        // (Through rdma_cm, -R, a request that finds no listener is rejected.)
        let refused = text.contains("couldn't connect")
            || text.contains("unable to open file descriptor")
            || text.contains("unable to perform rdma_client function");
        // perftest's -R connects twice, the server listening again after a hand-shake on the
        // first connection; a UD client whose second request (SIDR) came before that listen
        // is told "no such service" (UNREACHABLE, status 1), as a kernel's would be, and
        // leaves the server waiting for it: a new server, then a new client.
        if failed && text.contains("unreachable; error: 1") {
            stop(&mut server);
            server = spawn_server()?;
            continue;
        }
        if !(failed && refused) {
            break out;
        }
    };
    let server = wait_with_deadline(server, deadline, case.program, "server")?;
    let c = checked(case.says, &client).map_err(|e| format!("client: {e}"));
    let s = checked(case.server_says, &server).map_err(|e| format!("server: {e}"));
    s.and(c)
}

/// Kills and reaps a server whose pair ended early: it is not left running, holding the
/// address or port the next pair's server binds.
fn stop(server: &mut std::process::Child) {
    let _ = server.kill();
    let _ = server.wait();
}

/// Waits for `child` (the pair's `role`: server, client...) until `deadline`, then kills it.
/// Its piped output is read meanwhile (on a thread each), so a child that says much never
/// blocks on a full pipe while this waits for it to exit.
fn wait_with_deadline(
    child: std::process::Child,
    deadline: Instant,
    program: &str,
    role: &str,
) -> Result<Output, String> {
    wait_with_grace(child, deadline, PIPE_GRACE, program, role)
}

/// [`wait_with_deadline`], with the time `grace` the child's output may stay open after it
/// exited.
fn wait_with_grace(
    mut child: std::process::Child,
    deadline: Instant,
    grace: Duration,
    program: &str,
    role: &str,
) -> Result<Output, String> {
    // Each pipe is read on a thread of its own into a buffer this keeps; the thread says when
    // the pipe ended.
    type Read = (Arc<Mutex<Vec<u8>>>, mpsc::Receiver<()>);
    fn drain(mut pipe: Option<impl std::io::Read + Send + 'static>) -> Read {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let b = buf.clone();
        std::thread::spawn(move || {
            let mut chunk = [0u8; 16 << 10];
            while let Some(p) = pipe.as_mut() {
                match p.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => b
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .extend(&chunk[..n]),
                }
            }
            let _ = tx.send(());
        });
        (buf, rx)
    }
    let (stdout, stderr) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let mut late = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() > deadline => {
                late = true;
                let _ = child.kill();
                break child
                    .wait()
                    .map_err(|e| format!("reaping {program} ({role}): {e}"))?;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => {
                stop(&mut child);
                return Err(format!("waiting for {program} ({role}): {e}"));
            }
        }
    };
    // A pipe ends when its last writer exits: a process the child left behind (a daemon, a
    // rank) may hold it, so what was read is taken after a grace period at the latest.
    let open_until = Instant::now() + grace;
    let mut held = false;
    let mut read = |(buf, ended): Read| {
        held |= ended
            .recv_timeout(open_until.saturating_duration_since(Instant::now()))
            .is_err();
        std::mem::take(&mut *buf.lock().unwrap_or_else(|e| e.into_inner()))
    };
    let out = Output {
        status,
        stdout: read(stdout),
        stderr: read(stderr),
    };
    let (said, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    if late {
        return Err(format!(
            "{program} ({role}) ran past its deadline and was killed (a case has \
             {DEADLINE:?} from its start):\n{said}{err}"
        ));
    }
    if held {
        return Err(format!(
            "{program} ({role}) exited ({status}) but its output stayed open {grace:?} \
             (held by a process it left running):\n{said}{err}"
        ));
    }
    Ok(out)
}

/// Runs `c` with its output piped, for `role`, until `deadline` (then kills it): a program
/// that hangs fails its case instead of the whole matrix.
fn run_until(
    c: &mut Command,
    deadline: Instant,
    program: &str,
    role: &str,
) -> Result<Output, String> {
    let child = spawn_piped(c.stdin(Stdio::null()), program)?;
    wait_with_deadline(child, deadline, program, role)
}

/// Starts `c` with its output piped (for [`wait_with_deadline`] to read).
fn spawn_piped(c: &mut Command, program: &str) -> Result<std::process::Child, String> {
    c.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {program} (cargo xtask setup installs it): {e}"))
}

/// Its standard output if `out` exited 0 and said `says` (what success says); else why not.
fn checked(says: &str, out: &Output) -> Result<String, String> {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() && (stdout.contains(says) || stderr.contains(says)) {
        Ok(format!("{stdout}{stderr}"))
    } else {
        Err(format!(
            "exit {}; wanted {:?} in its output:\n{stdout}{stderr}",
            out.status, says
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    }

    #[test]
    fn a_program_past_its_deadline_is_killed_and_named() {
        let start = Instant::now();
        let r = run_until(
            // `exec`: the killed process is the one holding the pipes.
            &mut sh("echo started; exec sleep 30"),
            start + Duration::from_millis(300),
            "sleeper",
            "client",
        );
        let e = r.expect_err("ran past its deadline");
        assert!(e.contains("sleeper (client) ran past its deadline"), "{e}");
        assert!(e.contains("started"), "what it said is kept: {e}");
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "killed at the deadline"
        );
    }

    #[test]
    fn a_program_that_says_more_than_a_pipe_holds_is_not_blocked() {
        // 1 MiB on each stream: more than a pipe's buffer, so unread it would block the
        // program until the deadline.
        let r = run_until(
            &mut sh("head -c 1048576 /dev/zero; head -c 1048576 /dev/zero >&2; exit 3"),
            Instant::now() + Duration::from_secs(20),
            "talker",
            "server",
        )
        .expect("finished");
        assert_eq!(r.status.code(), Some(3));
        assert_eq!((r.stdout.len(), r.stderr.len()), (1 << 20, 1 << 20));
    }

    #[test]
    fn output_held_open_by_a_leftover_process_fails_after_the_grace() {
        // The shell exits at once; the background sleep keeps its stdout open.
        let start = Instant::now();
        let grace = Duration::from_millis(300);
        let forker = spawn_piped(&mut sh("echo parent; sleep 60 & exit 0"), "forker").unwrap();
        let e = wait_with_grace(
            forker,
            start + Duration::from_secs(5),
            grace,
            "forker",
            "alone",
        )
        .expect_err("its pipe stayed open");
        assert!(e.contains("forker (alone) exited"), "{e}");
        assert!(e.contains("stayed open 300ms"), "{e}");
        assert!(e.contains("parent"), "what it said is kept: {e}");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "given up after the grace"
        );
    }

    #[test]
    fn a_program_that_cannot_start_says_so() {
        let e = run_until(
            &mut Command::new("/nonexistent/program"),
            Instant::now() + Duration::from_secs(5),
            "nothing",
            "client",
        )
        .expect_err("no such program");
        assert!(e.contains("cannot run nothing"), "{e}");
    }
}
