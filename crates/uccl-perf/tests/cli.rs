//! The command line, through the built binary: a run verifies every byte and says so in one
//! JSON object; the table; `--no-payload`; the checker catches a flipped byte; bad arguments
//! get one line each; the raw verbs tests still run.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;
use common::{json, perf, stderr, stdout};

/// Small, but with the defaults' shape: 4 flows x 8 QPs, 1% loss, UC.
const SMALL: &str = "--msg-size 256KiB --chunk-size 16KiB --messages 6";

#[test]
fn a_default_shaped_run_verifies_every_byte() {
    let j = json(SMALL);
    assert_eq!(j["verified"], true);
    assert_eq!(j["messages_sent"], 24);
    assert_eq!(j["messages_received"], 24);
    assert_eq!(j["bytes_received"], 24 * 256 * 1024);
    assert_eq!(j["chunks_sent"], 24 * 16);
    for k in [
        "elapsed_s",
        "goodput_gbps",
        "messages_per_s",
        "post_send_calls",
        "send_wrs_posted",
        "srq_post_calls",
        "srq_wrs_posted",
        "retransmits",
        "rto_retransmits",
        "fast_retransmits",
        "probe_retransmits",
        "ack_requests",
        "acks_sent",
        "ack_packets",
        "cqes_polled",
        "packets_dropped",
        "credit_stalls",
        "cpu_ns_per_chunk",
        "memcpy_gbps",
    ] {
        assert!(j[k].is_number(), "{k}: {j}");
    }
    assert!(
        j["packets_dropped"].as_u64().unwrap() > 0,
        "1% loss by default"
    );
    assert!(
        j["retransmits"].as_u64().unwrap() > 0,
        "and it is recovered"
    );
    let c = &j["config"];
    assert_eq!(
        (&c["transport"], &c["flows"], &c["qps_per_flow"], &c["loss"]),
        (&"uc".into(), &4.into(), &8.into(), &0.01.into())
    );
    // Options left at the engine's defaults are reported with the values in effect.
    for k in [
        "ack_delay_us",
        "target_delay_us",
        "flow_scaling_us",
        "base_rtt_ns",
        "hop_delay_ns",
        "additive_increase",
        "min_window",
        "max_silence_ms",
    ] {
        assert!(c[k].is_number(), "{k}: {c}");
    }
    let engine = uccl_engine::EngineConfig::default();
    assert_eq!(c["ack_delay_us"], engine.ack_delay_us);
    assert_eq!(c["max_silence_ms"], engine.tx.max_silence_us / 1000);
    assert_eq!(c["min_window"], f64::from(engine.tx.min_window) / 1024.0);
    // The same seed, the same run.
    let again = json(SMALL);
    for k in ["retransmits", "acks_sent", "packets_dropped", "virtual_s"] {
        assert_eq!(j[k], again[k], "{k}");
    }
}

/// Reads, UC (served by the sender's engine) and RC (RDMA READs), under faults: every byte
/// verified, and a byte changed after the read is caught.
#[test]
fn reads_run_under_faults_and_every_byte_is_verified() {
    for mode in ["uc", "rc"] {
        let j = json(&format!(
            "--transport {mode} --op read --flows 2 --qps-per-flow 2 --msg-size 100000 \
             --messages 20 --loss 0.02 --reorder 0.02 --duplicate 0.02"
        ));
        assert_eq!(j["messages_received"], 40, "{mode}: {j}");
        assert_eq!(j["verified"], true, "{mode}: {j}");
        let out = perf(&format!(
            "--transport {mode} --op read --messages 5 --tamper 0:3:7"
        ));
        assert!(!out.status.success());
        assert!(
            stderr(&out).contains("message 3: byte 7"),
            "{}",
            stderr(&out)
        );
    }
}

/// Vectored writes and reads of blocks scattered in both buffers, under faults, UC and RC:
/// every block verified in its place, and one moved byte caught.
#[test]
fn vectored_transfers_run_under_faults_and_every_block_is_verified() {
    for mode in ["uc", "rc"] {
        for op in ["writev", "readv"] {
            let j = json(&format!(
                "--transport {mode} --op {op} --iov 37 --block-size 1000 --flows 2 \
                 --qps-per-flow 2 --messages 12 --loss 0.02 --reorder 0.02 --duplicate 0.02"
            ));
            assert_eq!(j["messages_received"], 24, "{mode} {op}: {j}");
            assert_eq!(j["bytes_received"], 24 * 37 * 1000, "{mode} {op}: {j}");
            assert_eq!(j["verified"], true, "{mode} {op}: {j}");
            let out = perf(&format!(
                "--transport {mode} --op {op} --iov 8 --messages 5 --tamper 0:2:9"
            ));
            assert!(!out.status.success());
            assert!(stderr(&out).contains("message 2: byte"), "{}", stderr(&out));
        }
    }
    let out = perf("--op writev --msg-size 4KiB");
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--msg-size does not apply"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn every_mode_runs_and_the_table_shows_it() {
    let j = json(
        "--transport rc --op write --tx-mode single --engines 2 --flows 3 --qps-per-flow 2 \
         --msg-size 100000 --chunk-size 8KiB --messages 5 --reorder 0.02 --duplicate 0.02 \
         --corrupt 0.02",
    );
    assert_eq!(j["messages_received"], 15);
    assert_eq!(j["verified"], true);
    assert_eq!(
        j["post_send_calls"], j["send_wrs_posted"],
        "one WR per post"
    );
    let out = perf("--flows 2 --messages 3 --msg-size 64KiB");
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for row in [
        "messages",
        "goodput",
        "CPU",
        "stack CPU",
        "chunks",
        "post_send",
        "retransmit",
        "softnic",
        "ACKs",
    ] {
        assert!(text.contains(&format!("\n  {row} ")), "{row}: {text}");
    }
    assert!(text.contains("every byte verified"), "{text}");
    assert!(!text.contains('\r'), "no progress bar off a terminal");
    let j = json("--duration 0.2 --flows 1 --msg-size 64KiB");
    assert!(j["messages_received"].as_u64().unwrap() > 0);
    assert_eq!(j["messages_received"], j["messages_sent"]);
}

/// On the virtual clock the engines poll at most once per poll interval while they wait: what
/// the NIC did meanwhile is taken in one round. Fewer polls for the same messages, every byte
/// still verified; 0 is a round at every NIC event.
#[test]
fn a_poll_interval_batches_what_the_nic_did_between_rounds() {
    let each = json(&format!("{SMALL} --poll-interval-ns 0"));
    let batched = json(&format!("{SMALL} --poll-interval-ns 2000"));
    for j in [&each, &batched] {
        assert_eq!(j["verified"], true, "{j}");
        assert_eq!(j["messages_received"], 24, "{j}");
    }
    assert_eq!(each["config"]["poll_interval_ns"], 0);
    assert_eq!(batched["config"]["poll_interval_ns"], 2000);
    let polls = |j: &serde_json::Value| j["cq_polls"].as_u64().unwrap();
    assert!(
        2 * polls(&batched) < polls(&each),
        "{} polls batched, {} at every event",
        polls(&batched),
        polls(&each)
    );
    assert_eq!(
        json(SMALL)["config"]["poll_interval_ns"],
        1000,
        "the default"
    );
}

#[test]
fn no_payload_moves_nothing_and_verifies_nothing() {
    let j = json("--no-payload --msg-size 4KiB --chunk-size 4KiB --messages 50");
    assert_eq!(j["verified"], false);
    assert_eq!(j["messages_received"], 200);
    assert_eq!(j["config"]["no_payload"], true);
    // Nothing is copied, so there is no memcpy to compare with: the run copies none either
    // (it once copied every byte, which callgrind's instructions per chunk counted).
    assert_eq!(j["memcpy_gbps"], 0.0, "{j}");
    assert_eq!(j["goodput_vs_memcpy"], 0.0, "{j}");
    // The stack's own CPU per chunk leaves out the simulated NIC's event loop.
    let num = |k: &str| j[k].as_f64().unwrap_or_else(|| panic!("{k}: {j}"));
    assert!(
        num("nic_cpu_s") > 0.0 && num("nic_cpu_s") < num("cpu_s"),
        "{j}"
    );
    assert!(
        num("stack_cpu_ns_per_chunk") > 0.0
            && num("stack_cpu_ns_per_chunk") < num("cpu_ns_per_chunk"),
        "{j}"
    );
}

/// A message larger than the 64 MiB that the run's memcpy comparison goes round (the
/// comparison once panicked after a verified run: a clamp whose minimum passed its maximum).
#[test]
fn a_message_over_64_mib_runs() {
    let j = json("--msg-size 65MiB --flows 1 --qps-per-flow 2 --messages 1 --loss 0");
    assert_eq!(j["verified"], true, "{j}");
    assert_eq!(j["bytes_received"], 65u64 << 20);
    assert!(j["memcpy_gbps"].as_f64().is_some_and(|g| g > 0.0), "{j}");
}

/// A flipped byte is named by its offset in the message, wherever it lies (a message is
/// checked in pieces: the first, one in the middle, the last byte).
#[test]
fn a_flipped_byte_is_named() {
    for at in [100, 40_001, 65_535] {
        let out = perf(&format!(
            "--flows 2 --messages 4 --msg-size 64KiB --tamper 1:2:{at}"
        ));
        assert_eq!(out.status.code(), Some(1));
        let err = stderr(&out);
        assert!(
            err.contains(&format!("flow 1 message 2: byte {at} of 65536 differs")),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

#[test]
fn bad_arguments_get_one_line() {
    for (args, says) in [
        ("--loss 1.5", "0..=1"),
        ("--reorder -0.1", "--reorder"),
        ("--flows 0", "at least 1"),
        (
            "--chunk-size 2GiB",
            "--chunk-size 2147483648 is too large (at most 1 GiB",
        ),
        ("--flows 70000", "70000 is too large (at most 65535)"),
        ("--flows 1.5", "\"1.5\" is not a positive whole number"),
        ("--flows -2", "\"-2\" is not a positive whole number"),
        ("--duration -1", "more than 0 seconds"),
        ("--seed -1", "--seed"),
        ("--msg-size -4KiB", "\"-4KiB\" is not a size"),
        (
            "--messages 99999999999999999999",
            "too large (at most 18446744073709551615)",
        ),
        ("--messages 0", "at least 1"),
        ("--chunk-size 0", "at least 1 byte"),
        (
            "--test verbs-write-bw --msg-size 0",
            "--msg-size 0 runs in the engine test only",
        ),
        ("--chunk-size lots", "not a size"),
        ("--transport tcp", "possible values: uc, rc"),
        ("--device nope0", "no RDMA device named \"nope0\""),
        ("--engines 5", "every engine pair needs a flow"),
        ("--duration x", "not a number"),
        ("--poll-interval-ns 2000000", "0..=1000000"),
        ("--poll-interval-ns -5", "--poll-interval-ns"),
        (
            "--max-silence-ms 10",
            "not a number of milliseconds from 50",
        ),
        ("--max-silence-ms -1", "--max-silence-ms"),
        (
            "--client 127.0.0.1 --poll-interval-ns 500",
            "--poll-interval-ns paces the engines on softnic's virtual clock",
        ),
        (
            "--additive-increase 0",
            "--additive-increase 0: must be a number of chunks from 1/1024",
        ),
        (
            "--min-window 2",
            "--min-window 2: must be a number of chunks",
        ),
        // 128 buffers of a chunk in each of 8 engines: 1 TiB.
        (
            "--chunk-size 1GiB --msg-size 1GiB --engines 4 --flows 4",
            "--chunk-size 1 GiB: UC receive buffers would take",
        ),
    ] {
        let out = perf(args);
        assert!(!out.status.success(), "{args}");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{args}: {err}");
        assert!(
            err.starts_with("uccl-perf: ") && err.contains(says),
            "{args}: {err}"
        );
        assert!(
            !err.contains("panicked") && stdout(&out).is_empty(),
            "{args}"
        );
    }
}

/// A process whose standard output and error are read on threads (so that neither pipe
/// fills), its standard error also watched for a line.
struct Running {
    child: Child,
    out: std::thread::JoinHandle<String>,
    err: std::thread::JoinHandle<String>,
}

/// Starts uccl-perf with `args`; `seen` gets one message when a line of its standard error
/// contains `marker`.
fn start(args: &str, marker: &'static str, seen: mpsc::Sender<()>) -> Running {
    let mut child = Command::new(env!("CARGO_BIN_EXE_uccl-perf"))
        .args(args.split_whitespace())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("uccl-perf starts");
    let mut stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains(marker) {
                let _ = seen.send(());
            }
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    Running { child, out, err }
}

impl Running {
    /// Waits for the process until `deadline` (then kills it); its output.
    fn finish(mut self, deadline: Instant) -> Output {
        while self.child.try_wait().expect("waiting").is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Output {
            status: self.child.wait().expect("its status"),
            stdout: self.out.join().expect("stdout").into_bytes(),
            stderr: self.err.join().expect("stderr").into_bytes(),
        }
    }
}

/// A free TCP port on 127.0.0.1.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// `uccl-perf --server --port {port} {opts}`, once it says it is waiting (standard output is
/// the JSON, standard error says when it listens).
fn listening_server(port: u16, opts: &str) -> Running {
    let (tx, rx) = mpsc::channel();
    let srv = start(&format!("--server --port {port} {opts}"), "waiting for", tx);
    if rx.recv_timeout(Duration::from_secs(30)).is_err() {
        let out = srv.finish(Instant::now());
        panic!("the server did not listen: {}", stderr(&out));
    }
    srv
}

/// Runs `uccl-perf --server {server}` and, once it says it is waiting, `--client 127.0.0.1
/// {client}`, both on a free port; their outputs (the server's, the client's). Each is killed
/// if it has not ended within a minute.
fn server_and_client(server: &str, client: &str) -> (Output, Output) {
    server_and_client_at("127.0.0.1", server, client)
}

/// [`server_and_client`] with the client given `--client {host}`.
fn server_and_client_at(host: &str, server: &str, client: &str) -> (Output, Output) {
    let port = free_port();
    let srv = listening_server(port, server);
    let deadline = Instant::now() + Duration::from_secs(60);
    let cli = start(
        &format!("--client {host} --port {port} {client}"),
        "",
        mpsc::channel().0,
    );
    let cli = cli.finish(deadline);
    (srv.finish(deadline), cli)
}

/// The JSON object `out` printed, after checking it succeeded.
fn json_of(who: &str, out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "{who}: {}", stderr(out));
    serde_json::from_str(stdout(out).trim()).unwrap_or_else(|e| panic!("{who}: {e}: {out:?}"))
}

/// `--server` and `--client 127.0.0.1` on softnic: two processes, each with its own device on
/// its own 127.0.0.x, the engine's traffic in RoCEv2 datagrams between them, with the default
/// 1% loss on both sides; both verify everything.
#[test]
fn server_and_client_run_as_two_processes_on_softnic() {
    let opts = format!("--json --flows 2 --qps-per-flow 4 {SMALL}");
    let (server, client) = server_and_client(&opts, &opts);
    assert!(stderr(&server).contains("RoCEv2 over UDP"), "{server:?}");
    for (who, out) in [("server", &server), ("client", &client)] {
        let j = json_of(who, out);
        assert_eq!(j["verified"], true, "{who}");
        assert_eq!(j["config"]["clock"], "wall", "{who}");
        // On the wall clock softnic's NIC runs by itself: its share is not measured.
        assert!(
            j["nic_cpu_s"].is_null() && j["stack_cpu_ns_per_chunk"].is_null(),
            "{who}"
        );
    }
    let j = json_of("server", &server);
    assert_eq!(j["messages_received"], 12);
    assert_eq!(j["bytes_received"], 12 * 256 * 1024);
    let c = json_of("client", &client);
    assert_eq!(c["messages_sent"], 12);
    // Each side's goodput is of what it moved (the client's was 0: it received nothing).
    assert_eq!(c["bytes_sent"], 12 * 256 * 1024);
    for (who, j) in [("server", &j), ("client", &c)] {
        assert!(
            j["goodput_gbps"].as_f64().is_some_and(|g| g > 0.0),
            "{who}: {j}"
        );
    }
    assert!(
        c["packets_dropped"].as_u64() > Some(0) && c["retransmits"].as_u64() > Some(0),
        "the 1% loss was injected and recovered: {c}"
    );
}

/// Both ends of a two-process run end cleanly under loss, whatever is lost last: the server
/// is done once the end-of-flow messages arrived, the client once they are acknowledged, so
/// a server that left at once made the client fail its flow whenever that last ACK was lost
/// ("no ACK progress", about one run in eight at 5% loss); and the client's close must not
/// fail the server's receives posted after the end. Eight runs of each way of moving data.
#[test]
fn two_processes_end_cleanly_when_the_last_ack_is_lost() {
    for op in ["send", "write", "read"] {
        for run in 0..8 {
            let opts = format!(
                "--json --op {op} --transport uc --flows 2 --qps-per-flow 2 --msg-size 64KiB \
                 --chunk-size 16KiB --messages 8 --loss 0.05 --seed {run}"
            );
            let (server, client) = server_and_client(&opts, &opts);
            json_of(&format!("{op} run {run}: server"), &server);
            json_of(&format!("{op} run {run}: client"), &client);
        }
    }
}

/// A client started before its server (as a script that starts both at once may) waits for
/// it to listen rather than failing on the refused connection; with no server at all it
/// gives up, naming the address.
#[test]
fn a_client_started_before_its_server_waits_for_it() {
    let port = free_port();
    let (tx, _rx) = mpsc::channel();
    let opts = format!("--json --flows 2 {SMALL}");
    let cli = start(
        &format!("--client 127.0.0.1 --port {port} {opts}"),
        "",
        tx.clone(),
    );
    std::thread::sleep(Duration::from_millis(700));
    let srv = start(&format!("--server --port {port} {opts}"), "", tx);
    let deadline = Instant::now() + Duration::from_secs(60);
    let (cli, srv) = (cli.finish(deadline), srv.finish(deadline));
    assert_eq!(json_of("client", &cli)["messages_sent"], 12);
    assert_eq!(json_of("server", &srv)["messages_received"], 12);

    let nobody = perf(&format!("--client 127.0.0.1 --port {port} {opts}"));
    assert!(!nobody.status.success());
    assert!(
        stderr(&nobody).contains(&format!("connecting to 127.0.0.1:{port}")),
        "{}",
        stderr(&nobody)
    );
}

/// `--op write|writev|read|readv` between two processes. Writes: the server hands its export over, the client writes
/// each message with a note naming it, the server checks each message when its note comes
/// (never before its bytes are in place) and hands the slot back; under 1% loss, UC and RC;
/// a byte changed after it landed is caught at the server.
#[test]
fn one_sided_ops_run_between_two_processes() {
    for mode in ["uc", "rc"] {
        let client =
            format!("--json --flows 2 --qps-per-flow 2 --op write --transport {mode} {SMALL}");
        let (server, client) = server_and_client("--json", &client);
        let (s, c) = (json_of("server", &server), json_of("client", &client));
        assert_eq!(s["config"]["op"], "write", "{s}");
        assert_eq!(s["messages_received"], 12, "{mode}: {s}");
        assert_eq!(s["bytes_received"], 12 * 256 * 1024, "{mode}: {s}");
        assert_eq!(s["verified"], true, "{mode}: {s}");
        assert_eq!(c["messages_sent"], 12, "{mode}: {c}");
    }
    // A vectored write of 16 blocks of 1000 bytes, scattered in both buffers.
    let (server, client) = server_and_client(
        "--json",
        "--json --flows 2 --op writev --iov 16 --block-size 1000 --messages 10",
    );
    let (s, c) = (json_of("server", &server), json_of("client", &client));
    assert_eq!(s["config"]["op"], "writev", "{s}");
    assert_eq!(s["messages_received"], 20, "{s}");
    assert_eq!(s["bytes_received"], 20 * 16 * 1000, "{s}");
    assert_eq!(
        (s["verified"].clone(), c["messages_sent"].clone()),
        (true.into(), 20.into())
    );
    // Reads: the client hands its export over and a notice per message; the server reads each
    // message, checks it and hands the slot back. UC (served by the client's engine) and RC
    // (RDMA READs), a vectored read of scattered blocks on UC.
    for run in [
        "--op read --transport uc",
        "--op read --transport rc",
        "--op readv --transport uc --iov 16 --block-size 1000",
    ] {
        let extra = if run.contains("readv") {
            "--messages 6"
        } else {
            SMALL
        };
        let (server, client) =
            server_and_client("--json", &format!("--json --flows 2 {run} {extra}"));
        let (s, c) = (json_of("server", &server), json_of("client", &client));
        assert_eq!(s["messages_received"], 12, "{run}: {s}");
        assert_eq!(s["verified"], true, "{run}: {s}");
        assert_eq!(c["messages_sent"], 12, "{run}: {c}");
    }
    let (server, _) = server_and_client(
        "--json --tamper 1:4:9",
        &format!("--json --flows 2 --op write {SMALL}"),
    );
    assert!(!server.status.success());
    assert!(
        stderr(&server).contains("flow 1 message 4: byte 9"),
        "{}",
        stderr(&server)
    );
}

/// A server started with no run options runs the client's (issue 28: with `--duration` on
/// the client only, the server expected 64 messages per flow and failed, and the client,
/// which received nothing, reported 0 Gb/s): both ends agree on the run, and each reports the
/// goodput of what it moved, the client what it sent, the server what it received.
#[test]
fn a_server_runs_the_clients_options_and_each_side_reports_what_it_moved() {
    let (server, client) = server_and_client(
        "--json",
        "--json --flows 2 --qps-per-flow 2 --msg-size 64KiB --duration 1 --loss 0 --seed 9 \
         --target-delay-us 20 --max-silence-ms 3000",
    );
    let (s, c) = (json_of("server", &server), json_of("client", &client));
    for (k, v) in [
        ("target_delay_us", serde_json::json!(20)),
        ("max_silence_ms", 3000.into()),
        ("flows", serde_json::json!(2)),
        ("qps_per_flow", 2.into()),
        ("msg_size", 65536.into()),
        ("duration_s", 1.0.into()),
        ("loss", 0.0.into()),
        ("seed", 9.into()),
    ] {
        assert_eq!(s["config"][k], v, "the server ran the client's {k}: {s}");
    }
    assert_eq!(s["config"]["role"], "server");
    let sent = c["messages_sent"].as_u64().expect("a count");
    assert!(sent > 0, "{c}");
    assert_eq!(s["messages_received"], sent, "{s}");
    assert_eq!(s["bytes_received"], sent * 65536);
    assert_eq!(c["bytes_sent"], sent * 65536);
    for (who, j) in [("server", &s), ("client", &c)] {
        assert!(
            j["goodput_gbps"].as_f64().is_some_and(|g| g > 0.0),
            "{who}'s goodput: {j}"
        );
        assert!(
            j["cpu_ns_per_chunk"].as_f64().is_some_and(|g| g > 0.0),
            "{who}'s CPU per chunk it moved: {j}"
        );
    }
    for (who, out) in [("server", &server), ("client", &client)] {
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            text.matches("\"op\":").count(),
            1,
            "{who}: a key once: {text}"
        );
    }
}

/// Connections to the server's port that are not its client's, before the client and while
/// its flows connect and run, are ignored: a port scan that connects and closes, a stranger
/// that speaks another protocol, ones that connect and say nothing, held open (each held
/// the server's only handshake: the client's connection waited behind it until its own
/// deadline), and ones reset before the server takes them (the server asked the connection
/// for its peer, which it no longer had, and ended the run). The run goes on (one that
/// closed at once ended the server, taken for the client, or for a client that died while
/// its flows connected).
#[test]
fn strangers_at_the_servers_port_do_not_end_its_run() {
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};
    /// Stops the strangers however the test ends (a panic must not leave them running).
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let port = free_port();
    let opts = format!("--json --flows 4 --qps-per-flow 2 {SMALL}");
    let srv = listening_server(port, &opts);
    let at = ("127.0.0.1", port);
    drop(std::net::TcpStream::connect(at).expect("a scan connects"));
    let mut http = std::net::TcpStream::connect(at).expect("a stranger connects");
    http.write_all(b"GET / HTTP/1.0\r\n\r\n")
        .expect("and speaks");
    let done = AtomicBool::new(false);
    let (srv, cli) = std::thread::scope(|s| {
        // A scan at every millisecond while the client's flows connect and run: every tenth
        // connection held open and silent (200 at most), every third of the others reset
        // (SO_LINGER 0: the server may take it with no peer left).
        s.spawn(|| {
            let mut silent = Vec::new();
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            for i in 0.. {
                if done.load(Ordering::Relaxed) {
                    break;
                }
                // Not blocked for seconds by a SYN retried while the backlog is full.
                if let Ok(c) =
                    std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(100))
                {
                    if i % 10 == 0 && silent.len() < 200 {
                        silent.push(c);
                    } else if i % 3 == 0 {
                        let _ = rustix::net::sockopt::set_socket_linger(&c, Some(Duration::ZERO));
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        let _stop = Stop(&done);
        let cli = start(
            &format!("--client 127.0.0.1 --port {port} {opts}"),
            "",
            mpsc::channel().0,
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        (srv.finish(deadline), cli.finish(deadline))
    });
    assert_eq!(json_of("client", &cli)["messages_sent"], 24);
    assert_eq!(json_of("server", &srv)["messages_received"], 24);
    assert!(
        stderr(&srv).contains("uccl-perf: ignored a connection from 127.0.0.1:"),
        "{}",
        stderr(&srv)
    );
}

/// A client that agrees on the run and then goes away before it connects its flows (it died,
/// or was stopped) ends the server at once, saying so; the server waited 30 s for flows that
/// could not come.
#[test]
fn a_client_that_goes_away_after_agreeing_ends_the_server_at_once() {
    use std::io::Write;
    // The run options a client sends, caught by a listener of this test's.
    let catcher = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = catcher.local_addr().expect("its address").port();
    let opts = format!("--json --flows 2 {SMALL}");
    let cli = start(
        &format!("--client 127.0.0.1 --port {port} {opts}"),
        "",
        mpsc::channel().0,
    );
    let (c, _) = catcher.accept().expect("the client connects");
    let mut hello = String::new();
    BufReader::new(&c).read_line(&mut hello).expect("its run");
    drop((c, catcher));
    cli.finish(Instant::now() + Duration::from_secs(30));

    // That run, agreed with a server by a client that then leaves.
    let port = free_port();
    let srv = listening_server(port, &opts);
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connects");
    s.write_all(hello.as_bytes()).expect("sends the run");
    let mut answer = String::new();
    BufReader::new(&s)
        .read_line(&mut answer)
        .expect("an answer");
    assert_eq!(answer.trim(), "\"ok\"");
    drop(s);
    let out = srv.finish(Instant::now() + Duration::from_secs(60));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("accepting flow 0: the client closed its connection to this server"),
        "{err}"
    );
}

/// The server takes clients over IPv6 as well as IPv4 (it listened on IPv4 only, so
/// `--client ::1` was refused); skipped on a host without IPv6.
#[test]
fn a_client_reaches_the_server_over_ipv6() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("skipped: this host has no IPv6 loopback");
        return;
    }
    let opts = format!("--json --flows 2 --qps-per-flow 2 {SMALL}");
    let (srv, cli) = server_and_client_at("::1", &opts, &opts);
    assert_eq!(json_of("client", &cli)["messages_sent"], 12);
    assert_eq!(json_of("server", &srv)["messages_received"], 12);
    assert!(
        stderr(&srv).contains("the client at [::1]:"),
        "{}",
        stderr(&srv)
    );
}

/// A server started with a run option the client's differs from refuses the run at once, and
/// both ends say which option in one line.
#[test]
fn a_server_refuses_a_client_whose_options_differ_from_its_own_naming_the_option() {
    let t0 = Instant::now();
    let (server, client) = server_and_client(
        "--json --msg-size 64KiB --flows 1",
        "--json --msg-size 128KiB --flows 1 --qps-per-flow 1 --messages 2",
    );
    assert!(t0.elapsed() < Duration::from_secs(20), "at once");
    for (who, out) in [("server", &server), ("client", &client)] {
        assert!(!out.status.success(), "{who}: {out:?}");
        let err = stderr(out);
        let last = err.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("uccl-perf: ")
                && last.contains("--msg-size 65536")
                && last.contains("--msg-size 131072"),
            "{who}: {err}"
        );
        assert!(!err.contains("panicked"), "{who}: {err}");
    }
    assert_eq!(stderr(&client).lines().count(), 1, "{client:?}");
}

/// 0-byte messages (the message rate with no payload): allowed, counted, and reported without
/// a division by zero, in one process and between two (whose end-of-flow marker is a 0-byte
/// message when messages have bytes).
#[test]
fn zero_byte_messages_run_and_report_their_rate() {
    for op in ["send", "write", "read"] {
        let j = json(&format!(
            "--msg-size 0 --flows 2 --qps-per-flow 2 --messages 100 --op {op}"
        ));
        assert_eq!(j["messages_received"], 200, "{op}: {j}");
        assert_eq!(j["bytes_received"], 0, "{op}: {j}");
        assert_eq!(j["goodput_gbps"], 0.0, "{op}: {j}");
        // The per-message overhead users compare: the rate and the CPU each message took.
        for k in ["messages_per_s", "cpu_ns_per_message"] {
            assert!(j[k].as_f64().is_some_and(|r| r > 0.0), "{op} {k}: {j}");
        }
        for k in ["memcpy_gbps", "goodput_vs_memcpy", "wrs_per_post"] {
            assert!(j[k].as_f64().is_some_and(f64::is_finite), "{op} {k}: {j}");
        }
    }
    let out = perf("--msg-size 0 --flows 1 --messages 10");
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        !text.contains("NaN") && !text.contains("inf") && text.contains("0 B messages"),
        "{text}"
    );
    let (server, client) = server_and_client(
        "--json",
        "--json --msg-size 0 --flows 2 --qps-per-flow 2 --messages 50 --loss 0",
    );
    let (s, c) = (json_of("server", &server), json_of("client", &client));
    assert_eq!(s["messages_received"], 100, "{s}");
    assert_eq!(c["messages_sent"], 100, "{c}");
    for j in [&s, &c] {
        assert!(
            j["cpu_ns_per_message"].as_f64().is_some_and(|r| r > 0.0),
            "{j}"
        );
    }
}

#[test]
fn the_raw_verbs_tests_still_run() {
    let out = perf("--test verbs-write-bw --messages 300");
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("write_bw chained"), "{text}");
    assert!(text.contains("10 doorbells instead of 300"), "{text}");
    let out =
        perf("--test verbs-write-lat --messages 50 --msg-size 8 --transport rc --loss 0.02 --json");
    assert!(out.status.success(), "{}", stderr(&out));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["runs"][0]["run"], "write_lat");
    assert!(j["runs"][0]["lat_p50_us"].is_number());
}

/// Users profile and check the benchmark under valgrind (callgrind counts instructions, which
/// a noisy machine cannot move). rustix's own vDSO lookup crashed there (its auxv check reads
/// memory valgrind does not map: rustix issue 1559), so the CPU clock goes through libc.
/// Skipped, saying so, where valgrind is not installed (CI's machines have it).
#[test]
fn a_run_completes_under_valgrind() {
    let probe = Command::new("valgrind").arg("--version").output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!("valgrind not found: skipped");
        return;
    }
    let out = Command::new("valgrind")
        .args(["--tool=none", "-q", env!("CARGO_BIN_EXE_uccl-perf")])
        .args(
            "--json --flows 1 --qps-per-flow 2 --msg-size 64KiB --chunk-size 16KiB --messages 2"
                .split(' '),
        )
        .output()
        .expect("valgrind runs");
    assert!(out.status.success(), "{:?}: {}", out.status, stderr(&out));
    let j: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("one JSON object");
    assert_eq!(j["verified"], true);
    assert!(
        j["cpu_ns_per_chunk"].as_f64().is_some_and(|c| c > 0.0),
        "{j}"
    );
}
