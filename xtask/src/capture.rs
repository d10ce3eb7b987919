//! `cargo xtask capture` (part of `test`): two softnic processes talk RoCEv2 over UDP on the
//! loopback interface while tshark captures; every frame must decode as InfiniBand with
//! nothing malformed, and carry the right ICRC over the headers the kernel really sent. An
//! rping between two processes on softnic's librdmacm is captured too: its connection must
//! show as InfiniBand CM MADs (ConnectRequest with the IP CM service header, ConnectReply,
//! ReadyToUse, DisconnectRequest, DisconnectReply).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use crate::run::{cmd, status, target_bin};

/// The runs captured: the engine between two processes, on UC (with 5% loss: retransmitted
/// chunks, and timeouts' ACK requests and their answers on the UD QPs) and on RC, small enough
/// to take a second.
const RUNS: &[&str] = &[
    "--transport uc --flows 2 --qps-per-flow 2 --msg-size 64KiB --chunk-size 16KiB --messages 8 \
     --loss 0.05",
    "--transport rc --flows 1 --qps-per-flow 2 --msg-size 64KiB --chunk-size 16KiB --messages 8",
];

pub(crate) fn capture() -> Result<(), String> {
    // uccl-perf and softnic's `check_capture` example.
    crate::run::build_workspace()?;
    let dir = std::env::temp_dir().join(format!("xtask-capture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let pcapng = dir.join("roce.pcapng");
    let pcap = dir.join("roce.pcap");
    let file = pcapng.to_string_lossy().into_owned();

    let mut tshark = Command::new("tshark")
        .args(["-i", "lo", "-f", "udp port 4791", "-q", "-w", &file])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start tshark (cargo xtask setup installs it): {e}"))?;
    let said = wait_for(&mut tshark, "Capturing on");
    if !said.contains("Capturing on") {
        let _ = tshark.kill();
        return Err(format!("tshark did not start capturing on lo: {said}"));
    }
    let perf = target_bin("debug", "uccl-perf");
    let result = RUNS
        .iter()
        .try_for_each(|run| two_processes(&perf, run))
        .and_then(|()| {
            // rping is here for its frames; its own correctness is softnic-rdmacm's tests'.
            // A pair that fails goes once more (what it said is printed), so that a rare
            // teardown race does not hide the capture's verdict; twice is a failure.
            rping().or_else(|e| {
                eprintln!("xtask capture: {e}; once more");
                rping()
            })
        });
    // Let the last frames reach the capture, then stop it the way ^C does.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let _ = Command::new("kill")
        .args(["-INT", &tshark.id().to_string()])
        .status();
    let _ = tshark.wait();
    result?;

    let count = |filter: &str| -> Result<usize, String> {
        let out = Command::new("tshark")
            .args(["-r", &file, "-Y", filter])
            .stderr(Stdio::null())
            .output()
            .map_err(|e| format!("tshark -r: {e}"))?;
        Ok(String::from_utf8_lossy(&out.stdout).lines().count())
    };
    let all = count("frame")?;
    let ib = count("infiniband")?;
    let bad = count("_ws.malformed || _ws.expert.severity >= error")?;
    eprintln!("xtask capture: {all} frames, {ib} decoded as InfiniBand, {bad} malformed");
    // The CM exchange of the rping: each message decoded (attribute IDs of IBTA 16.7.2), the
    // REQ's private data as the IP CM service header.
    for (name, attr) in [
        ("ConnectRequest", "0x0010"),
        ("ConnectReply", "0x0013"),
        ("ReadyToUse", "0x0014"),
        ("DisconnectRequest", "0x0015"),
        ("DisconnectReply", "0x0016"),
    ] {
        let n = count(&format!(
            "infiniband.mad.mgmtclass == 0x07 && infiniband.mad.attributeid == {attr}"
        ))?;
        if n == 0 {
            return Err(format!(
                "the capture {file} has no CM {name} of rping's connection"
            ));
        }
    }
    if count("infiniband.cm.req.ip_cm.dip4 == 127.0.28.1")? == 0 {
        return Err(format!(
            "the capture {file} has no REQ with the IP CM service header"
        ));
    }
    if all == 0 || ib != all || bad != 0 {
        return Err(format!(
            "the capture {file} has {all} frames, {ib} of them InfiniBand, {bad} malformed \
             (want every frame InfiniBand and none malformed)"
        ));
    }
    status(&mut cmd(
        "tshark",
        &["-r", &file, "-F", "pcap", "-w", &pcap.to_string_lossy()],
    ))?;
    status(&mut cmd(
        &target_bin("debug/examples", "check_capture"),
        &[&pcap.to_string_lossy()],
    ))?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Runs `uccl-perf --server` and `--client 127.0.0.1` with `opts`; both must succeed.
fn two_processes(perf: &str, opts: &str) -> Result<(), String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("finding a free port: {e}"))?
        .port();
    let opts = format!("--json --port {port} {opts}");
    let args = |role: &str| {
        format!("{role} {opts}")
            .split_whitespace()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    eprintln!(
        "$ SOFTNIC_GSO=0 {perf} --server {opts} & SOFTNIC_GSO=0 {perf} --client 127.0.0.1 {opts}"
    );
    // One datagram per packet: on the loopback interface a capture sees a GSO send before the
    // kernel cuts it into datagrams, as one frame holding many packets.
    let mut server = Command::new(perf)
        .env("SOFTNIC_GSO", "0")
        .args(args("--server"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting {perf}: {e}"))?;
    let said = wait_for(&mut server, "waiting for");
    if !said.contains("waiting for") {
        let _ = server.kill();
        return Err(format!("uccl-perf --server did not start: {said}"));
    }
    let client = Command::new(perf)
        .env("SOFTNIC_GSO", "0")
        .args(args("--client 127.0.0.1"))
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("starting {perf}: {e}"))?;
    let server = server.wait().map_err(|e| e.to_string())?;
    if client.success() && server.success() {
        Ok(())
    } else {
        Err(format!(
            "uccl-perf {opts}: client {client}, server {server}"
        ))
    }
}

/// An rping (server 127.0.28.1, client 127.0.28.2) on softnic's librdmacm through
/// `softnic-run`, packets one per datagram; both must succeed within a deadline.
fn rping() -> Result<(), String> {
    let run = target_bin("debug", "softnic-run");
    let log = |side: &str| std::env::temp_dir().join(format!("xtask-rping-{side}.log"));
    let side = |addr: &str, args: &str, name: &str| -> Result<Command, String> {
        let out = std::fs::File::create(log(name)).map_err(|e| e.to_string())?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let mut c = Command::new(&run);
        c.env("SOFTNIC_GSO", "0")
            .args(["--quiet", "--addr", addr, "--", "rping"])
            .args(args.split_whitespace())
            .stdout(out)
            .stderr(err);
        Ok(c)
    };
    eprintln!("$ softnic-run --addr 127.0.28.1 -- rping -s -a 127.0.28.1 -C 3 -v & (and -c)");
    let mut server = side("127.0.28.1", "-s -a 127.0.28.1 -C 3 -v", "server")?
        .spawn()
        .map_err(|e| format!("starting rping (cargo xtask setup installs it): {e}"))?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let wait = |child: &mut Child| -> Result<bool, String> {
        loop {
            if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
                return Ok(s.success());
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Ok(false);
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    };
    // A client that came before the server listened is rejected (no listener on the port)
    // and ends at once: on a busy machine the server may take longer than a moment to start,
    // so a client that failed while the server still runs goes again, as interop's do.
    let c = loop {
        std::thread::sleep(std::time::Duration::from_millis(300));
        let mut client = side("127.0.28.2", "-c -a 127.0.28.1 -C 3 -v", "client")?
            .spawn()
            .map_err(|e| format!("starting rping: {e}"))?;
        let ok = wait(&mut client)?;
        let server_waits = server.try_wait().map_err(|e| e.to_string())?.is_none();
        if ok || !server_waits || std::time::Instant::now() > deadline {
            break ok;
        }
    };
    let s = wait(&mut server)?;
    if c && s {
        Ok(())
    } else {
        let said = |name: &str| {
            let text = std::fs::read_to_string(log(name)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(6)..].join("\n  ")
        };
        Err(format!(
            "rping on softnic: client ok {c}, server ok {s}\n client said:\n  {}\n server \
             said:\n  {}",
            said("client"),
            said("server")
        ))
    }
}

/// Reads `child`'s standard error until a line contains `marker` (or it ends); what it said.
/// The rest of its standard error is passed through on a thread.
fn wait_for(child: &mut Child, marker: &str) -> String {
    let Some(err) = child.stderr.take() else {
        return String::new();
    };
    let mut lines = BufReader::new(err).lines();
    let mut said = String::new();
    for line in lines.by_ref() {
        let Ok(line) = line else { break };
        said.push_str(&line);
        said.push('\n');
        if line.contains(marker) {
            break;
        }
    }
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            eprintln!("{line}");
        }
    });
    said
}
