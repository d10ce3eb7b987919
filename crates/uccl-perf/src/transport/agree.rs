//! Two processes agree on the run before any engine starts: the client's first connection to
//! the server's port carries its run options (one JSON line), and the server adopts them, or
//! refuses at once when it was given a run option of its own that differs, naming it. Either
//! way the answer (one JSON line) reaches the client, which then connects its flows, or stops
//! with the server's reason. The client keeps this connection (the [`Session`]) open while the
//! run lasts, so the server learns at once if it goes away; connections to the port that
//! bring no run options (a port scan's, a stranger's) are ignored.
//!
//! The options are the resolved ones (`--msg-size` as bytes, `--messages` as a count unless
//! `--duration`, the loss that applies, the messages in flight), so the server runs exactly
//! the client's run.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use super::session::{self, Session};
use super::{inflight, say};
use crate::args::{Args, OpArg, RecvKeysArg, SILENCE_MS, TransportArg, TxMode};

/// The version of the exchange; a client and a server of different versions refuse each other.
/// 3: the client keeps its connection open while the run lasts; `max_silence_ms`. 4: the
/// client connects each flow when the server says so on that connection.
const VERSION: u32 = 4;
/// How long either end waits for the other's line (and the server for each of the client's
/// flows to connect).
pub(super) const TIMEOUT: Duration = Duration::from_secs(30);
/// How long a client tries again a server that refuses its connection (one started at the
/// same moment may not listen yet).
const SERVER_START: Duration = Duration::from_secs(5);
/// The longest line either end reads.
pub(super) const MAX_LINE: u64 = 64 << 10;

/// What makes a run, as the client sends it (and as the JSON report's `config` has it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct RunOptions {
    transport: TransportArg,
    /// What the messages are (`--op`): sends, or notified writes.
    #[serde(default = "send_op")]
    op: OpArg,
    /// `--op writev`: blocks per message and their size.
    #[serde(default)]
    iov: u32,
    #[serde(default)]
    block_size: u64,
    flows: u16,
    qps_per_flow: u16,
    engines: u16,
    msg_size: u64,
    chunk_size: u64,
    /// Messages per flow; none with a duration.
    messages: Option<u64>,
    duration_s: Option<f64>,
    inflight: u32,
    loss: f64,
    reorder: f64,
    duplicate: f64,
    corrupt: f64,
    seed: u64,
    tx_mode: TxMode,
    recv_keys: RecvKeysArg,
    no_payload: bool,
    /// The congestion window's and the ACKs' options (`None`, `false`: not given, the
    /// engine's default): the client's flows are steered by them, the server's ACKs by
    /// `--ack-delay-us`.
    #[serde(default)]
    ack_delay_us: Option<u32>,
    #[serde(default)]
    target_delay_us: Option<u64>,
    #[serde(default)]
    flow_scaling_us: Option<u64>,
    #[serde(default)]
    base_rtt_ns: Option<u64>,
    #[serde(default)]
    hop_delay_ns: Option<u64>,
    #[serde(default)]
    additive_increase: Option<f64>,
    #[serde(default)]
    min_window: Option<f64>,
    #[serde(default)]
    swift_decrease: bool,
    #[serde(default)]
    no_pacing: bool,
    #[serde(default)]
    no_ack_requests: bool,
    /// `--max-silence-ms` (`None`: the engine's default): both ends give a silent peer as
    /// long.
    #[serde(default)]
    max_silence_ms: Option<u64>,
}

/// `--op`'s default, for a client that does not say.
fn send_op() -> OpArg {
    OpArg::Send
}

/// The client's line.
#[derive(Debug, Serialize, Deserialize)]
struct Hello {
    uccl_perf: u32,
    run: RunOptions,
}

/// The server's answer.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Answer {
    Ok,
    Refused(String),
}

impl RunOptions {
    /// The run `args` describe.
    pub(crate) fn of(args: &Args) -> Self {
        RunOptions {
            transport: args.transport,
            op: args.op,
            iov: args.iov,
            block_size: args.block_size,
            flows: args.flows,
            qps_per_flow: args.qps_per_flow,
            engines: args.engines,
            msg_size: args.msg_size(),
            chunk_size: args.chunk_size,
            messages: match args.duration {
                Some(_) => None,
                None => Some(args.messages.unwrap_or(64)),
            },
            duration_s: args.duration.map(|d| d.as_secs_f64()),
            inflight: inflight(args),
            loss: args.loss(),
            reorder: args.reorder,
            duplicate: args.duplicate,
            corrupt: args.corrupt,
            seed: args.seed,
            tx_mode: args.tx_mode,
            recv_keys: args.recv_keys,
            no_payload: args.no_payload,
            ack_delay_us: args.fabric.ack_delay_us,
            target_delay_us: args.fabric.target_delay_us,
            flow_scaling_us: args.fabric.flow_scaling_us,
            base_rtt_ns: args.fabric.base_rtt_ns,
            hop_delay_ns: args.fabric.hop_delay_ns,
            additive_increase: args.fabric.additive_increase,
            min_window: args.fabric.min_window,
            swift_decrease: args.fabric.swift_decrease,
            no_pacing: args.fabric.no_pacing,
            no_ack_requests: args.fabric.no_ack_requests,
            max_silence_ms: args.max_silence_ms,
        }
    }

    /// These options with those left at the engine's defaults (`None`) given the values in
    /// effect in `cfg`, the engines' configuration: what a report says the run used. Options
    /// given stay as given.
    pub(crate) fn effective(mut self, cfg: &uccl_engine::EngineConfig) -> Self {
        let tx = &cfg.tx;
        let chunks = |v: u32| f64::from(v) / 1024.0;
        self.ack_delay_us.get_or_insert(cfg.ack_delay_us);
        self.target_delay_us.get_or_insert(tx.target_delay_us);
        self.flow_scaling_us.get_or_insert(tx.flow_scaling_us);
        self.base_rtt_ns.get_or_insert(tx.base_rtt_ns);
        self.hop_delay_ns.get_or_insert(tx.hop_delay_ns);
        self.additive_increase
            .get_or_insert(chunks(tx.additive_increase));
        self.min_window.get_or_insert(chunks(tx.min_window));
        self.max_silence_ms.get_or_insert(tx.max_silence_us / 1000);
        self
    }

    /// Each option by its id (clap's, e.g. `msg_size`) with its value as a command line gives
    /// it (`""` for a flag that is set, `None` for one not given).
    fn flags(&self) -> Vec<(&'static str, Option<String>)> {
        fn name(v: impl ValueEnum) -> Option<String> {
            v.to_possible_value().map(|p| p.get_name().to_string())
        }
        let some = |v: &dyn std::fmt::Display| Some(v.to_string());
        let set = |on: bool| on.then(String::new);
        vec![
            ("transport", name(self.transport)),
            ("op", name(self.op)),
            ("iov", some(&self.iov)),
            ("block_size", some(&self.block_size)),
            ("flows", some(&self.flows)),
            ("qps_per_flow", some(&self.qps_per_flow)),
            ("engines", some(&self.engines)),
            ("msg_size", some(&self.msg_size)),
            ("chunk_size", some(&self.chunk_size)),
            ("messages", self.messages.map(|n| n.to_string())),
            ("duration", self.duration_s.map(|d| d.to_string())),
            ("inflight", some(&self.inflight)),
            ("loss", some(&self.loss)),
            ("reorder", some(&self.reorder)),
            ("duplicate", some(&self.duplicate)),
            ("corrupt", some(&self.corrupt)),
            ("seed", some(&self.seed)),
            ("tx_mode", name(self.tx_mode)),
            ("recv_keys", name(self.recv_keys)),
            ("no_payload", set(self.no_payload)),
            ("ack_delay_us", self.ack_delay_us.map(|v| v.to_string())),
            (
                "target_delay_us",
                self.target_delay_us.map(|v| v.to_string()),
            ),
            (
                "flow_scaling_us",
                self.flow_scaling_us.map(|v| v.to_string()),
            ),
            ("base_rtt_ns", self.base_rtt_ns.map(|v| v.to_string())),
            ("hop_delay_ns", self.hop_delay_ns.map(|v| v.to_string())),
            (
                "additive_increase",
                self.additive_increase.map(|v| v.to_string()),
            ),
            ("min_window", self.min_window.map(|v| v.to_string())),
            ("swift_decrease", set(self.swift_decrease)),
            ("no_pacing", set(self.no_pacing)),
            ("no_ack_requests", set(self.no_ack_requests)),
            ("max_silence_ms", self.max_silence_ms.map(|v| v.to_string())),
        ]
    }

    /// `args` running this run (what else `args` say stays: the device, the port, `--json`).
    /// Values the command line could not have given are refused, naming them.
    fn apply(&self, args: &Args) -> Result<Args, String> {
        let counts = [
            ("--flows", u64::from(self.flows)),
            ("--qps-per-flow", u64::from(self.qps_per_flow)),
            ("--engines", u64::from(self.engines)),
            ("--chunk-size", self.chunk_size),
            ("--messages", self.messages.unwrap_or(1)),
            ("--inflight", u64::from(self.inflight)),
        ];
        if let Some((flag, _)) = counts.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{flag} 0"));
        }
        if self.messages.is_some() == self.duration_s.is_some() {
            return Err("both or neither of --messages and --duration".into());
        }
        let duration = match self.duration_s {
            Some(d) if d > 0.0 && d <= 1e6 => Duration::try_from_secs_f64(d).ok(),
            Some(d) => return Err(format!("--duration {d}")),
            None => None,
        };
        let faults = [
            ("--loss", self.loss),
            ("--reorder", self.reorder),
            ("--duplicate", self.duplicate),
            ("--corrupt", self.corrupt),
        ];
        if let Some((flag, p)) = faults.iter().find(|(_, p)| !(0.0..=1.0).contains(p)) {
            return Err(format!("{flag} {p}"));
        }
        if let Some(ms) = self.max_silence_ms.filter(|ms| !SILENCE_MS.contains(ms)) {
            return Err(format!("--max-silence-ms {ms}"));
        }
        let mut a = args.clone();
        a.transport = self.transport;
        a.op = self.op;
        if self.op.vectored() {
            // The message is the blocks.
            (a.iov, a.block_size) = (self.iov, self.block_size);
            if a.iov == 0 || a.block_size == 0 {
                return Err("--iov 0 or --block-size 0".into());
            }
        }
        a.flows = self.flows;
        a.qps_per_flow = self.qps_per_flow;
        a.engines = self.engines;
        a.msg_size = (!self.op.vectored()).then_some(self.msg_size);
        a.chunk_size = self.chunk_size;
        a.messages = self.messages;
        a.duration = duration;
        a.inflight = Some(self.inflight);
        a.loss = Some(self.loss);
        a.reorder = self.reorder;
        a.duplicate = self.duplicate;
        a.corrupt = self.corrupt;
        a.seed = self.seed;
        a.tx_mode = self.tx_mode;
        a.recv_keys = self.recv_keys;
        a.no_payload = self.no_payload;
        a.max_silence_ms = self.max_silence_ms;
        let f = &mut a.fabric;
        f.ack_delay_us = self.ack_delay_us;
        f.target_delay_us = self.target_delay_us;
        f.flow_scaling_us = self.flow_scaling_us;
        f.base_rtt_ns = self.base_rtt_ns;
        f.hop_delay_ns = self.hop_delay_ns;
        f.additive_increase = self.additive_increase;
        f.min_window = self.min_window;
        f.swift_decrease = self.swift_decrease;
        f.no_pacing = self.no_pacing;
        f.no_ack_requests = self.no_ack_requests;
        a.check()?;
        Ok(a)
    }
}

/// `--msg-size 65536`, `--no-payload`, or `no --messages`: an option as a command line has it.
fn flag_text(id: &str, value: &Option<String>) -> String {
    let flag = format!("--{}", id.replace('_', "-"));
    match value {
        None => format!("no {flag}"),
        Some(v) if v.is_empty() => flag,
        Some(v) => format!("{flag} {v}"),
    }
}

/// The server's options given on its command line that the client's run differs in: (this
/// server's, the client's), as command lines have them. The blocks of a vectored op are no
/// matter to a run of another op.
fn conflicts(server: &Args, client: &RunOptions) -> (Vec<String>, Vec<String>) {
    let ours = RunOptions::of(server).flags();
    let mut differ = (Vec::new(), Vec::new());
    for ((id, mine), (_, theirs)) in ours.iter().zip(client.flags()) {
        let matters = client.op.vectored() || !matches!(*id, "iov" | "block_size");
        if *mine != theirs && matters && server.given.iter().any(|g| g == id) {
            differ.0.push(flag_text(id, mine));
            differ.1.push(flag_text(id, &theirs));
        }
    }
    differ
}

/// Reads one line (at most [`MAX_LINE`] bytes) of `s` within `within` in all (a peer that
/// sends a byte now and then does not stretch it). Byte by byte, so that nothing after the
/// line (the server's go-aheads, see [`Session`]) is taken with it.
fn read_line(s: &TcpStream, within: Duration) -> Result<String, String> {
    let end = Instant::now() + within;
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while line.last() != Some(&b'\n') {
        let left = end.saturating_duration_since(Instant::now());
        if line.len() as u64 == MAX_LINE {
            return Err(format!("the line is longer than {MAX_LINE} bytes"));
        }
        if left.is_zero() {
            return Err(format!("no line came within {} s", within.as_secs()));
        }
        let _ = s.set_read_timeout(Some(left));
        match (&*s).read(&mut b) {
            Ok(0) if line.is_empty() => return Err("the connection closed".into()),
            Ok(0) => return Err("the connection closed within a line".into()),
            Ok(_) => line.push(b[0]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    String::from_utf8(line).map_err(|_| "the line is not UTF-8".into())
}

/// Writes `value` as one JSON line to `s`.
fn write_line(mut s: &TcpStream, value: &impl Serialize) -> Result<(), String> {
    let mut line = serde_json::to_string(value).map_err(|e| e.to_string())?;
    line.push('\n');
    s.write_all(line.as_bytes()).map_err(|e| e.to_string())
}

/// The server's side: takes connections on `listener` until one brings a client's run (see
/// [`session::first_client`]: strangers are ignored), answers it, and returns the options to
/// run with (`args` with the client's run) and the client's session, or why the client was
/// refused.
pub(super) fn serve(listener: &TcpListener, args: &Args) -> Result<(Args, Session), String> {
    let session::FirstLine {
        s,
        peer,
        line,
        version,
    } = session::first_client(listener, args)?;
    let refuse = |why: String| {
        let _ = write_line(&s, &Answer::Refused(why.clone()));
        format!("refused the client at {peer}: {why}")
    };
    if version != u64::from(VERSION) {
        return Err(refuse(format!(
            "the client speaks version {version} of the run options, this server {VERSION}"
        )));
    }
    let hello: Hello = serde_json::from_value(line)
        .map_err(|e| refuse(format!("its run options are not valid: {e}")))?;
    let adopted = adopt(args, &hello.run).map_err(refuse)?;
    write_line(&s, &Answer::Ok).map_err(|e| format!("answering the client at {peer}: {e}"))?;
    let session = Session::server(s, peer)?;
    let changed: Vec<String> = RunOptions::of(args)
        .flags()
        .into_iter()
        .zip(hello.run.flags())
        // What the client set (its `--duration` says it has no `--messages`).
        .filter(|((_, mine), (_, theirs))| mine != theirs && theirs.is_some())
        .map(|(_, (id, theirs))| flag_text(id, &theirs))
        .collect();
    say(
        &adopted,
        &if changed.is_empty() {
            format!("uccl-perf: the client at {peer} runs this server's options")
        } else {
            format!("uccl-perf: the client at {peer} runs {}", changed.join(" "))
        },
    );
    Ok((adopted, session))
}

/// `args` running the client's `run`, or why not: a run option the server was given that
/// differs, or a value no command line could give.
fn adopt(args: &Args, run: &RunOptions) -> Result<Args, String> {
    let (ours, theirs) = conflicts(args, run);
    if !ours.is_empty() {
        return Err(format!(
            "the server was started with {}, the client asks for {} (start the server \
             without them: it adopts the client's run options; or with the same)",
            ours.join(" "),
            theirs.join(" ")
        ));
    }
    run.apply(args)
        .map_err(|e| format!("the client's run options are not valid: {e}"))
}

/// The client's side: sends `args`' run to the server at `addr` and waits for its answer;
/// the session to keep open while the run lasts.
pub(super) fn ask(addr: &str, args: &Args) -> Result<Session, String> {
    let addrs: Vec<_> = addr
        .to_socket_addrs()
        .map_err(|e| format!("resolving {addr}: {e}"))?
        .collect();
    let mut last = format!("resolving {addr}: no address");
    let mut stream = None;
    // A server started just before may not listen yet: refused connections are tried again
    // for a while.
    let give_up = std::time::Instant::now() + SERVER_START;
    'connect: loop {
        let mut refused = false;
        for &a in &addrs {
            match TcpStream::connect_timeout(&a, TIMEOUT) {
                Ok(s) => {
                    stream = Some((s, a));
                    break 'connect;
                }
                Err(e) => {
                    refused |= e.kind() == std::io::ErrorKind::ConnectionRefused;
                    last = format!("connecting to {a}: {e} (is `uccl-perf --server` running?)");
                }
            }
        }
        if !refused || std::time::Instant::now() >= give_up {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let (s, server) = stream.ok_or(last)?;
    let _ = s.set_read_timeout(Some(TIMEOUT));
    let _ = s.set_write_timeout(Some(TIMEOUT));
    let hello = Hello {
        uccl_perf: VERSION,
        run: RunOptions::of(args),
    };
    let talk = || -> Result<Answer, String> {
        write_line(&s, &hello)?;
        let line = read_line(&s, TIMEOUT)?;
        serde_json::from_str(&line).map_err(|e| format!("{e}: {}", line.trim()))
    };
    match talk().map_err(|e| format!("agreeing on the run with the server at {addr}: {e}"))? {
        Answer::Ok => Ok(Session::client(s, server)),
        Answer::Refused(why) => Err(format!("the server at {addr} refused the run: {why}")),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn args(line: &str) -> Args {
        let mut a = Args::parse_from(std::iter::once("uccl-perf").chain(line.split_whitespace()));
        // As main's parse notes them: the options the line gave.
        a.given = line
            .split_whitespace()
            .filter_map(|w| w.strip_prefix("--"))
            .map(|w| w.replace('-', "_"))
            .collect();
        a
    }

    #[test]
    fn a_server_adopts_a_clients_run_and_names_what_it_was_given_that_differs() {
        let client = RunOptions::of(&args(
            "--client h --msg-size 0 --duration 2.5 --flows 3 --transport rc --no-payload",
        ));
        let server = args("--server --json");
        assert_eq!(conflicts(&server, &client), (vec![], vec![]));
        let a = client.apply(&server).unwrap();
        assert!(a.server && a.json, "the server's own options stay");
        assert_eq!(RunOptions::of(&a), client, "the client's run");
        assert_eq!(a.duration, Some(Duration::from_millis(2500)));
        assert_eq!(
            conflicts(&args("--server --iov 4"), &client),
            (vec![], vec![]),
            "no blocks in a send"
        );
        let given = args("--server --flows 3 --messages 10 --seed 1");
        assert_eq!(
            conflicts(&given, &client),
            (
                vec!["--messages 10".to_string()],
                vec!["no --messages".to_string()]
            ),
            "--flows 3 and --seed 1 are the client's too"
        );
    }

    #[test]
    fn the_congestion_windows_options_travel_with_the_run() {
        let client = RunOptions::of(&args(
            "--client h --target-delay-us 0 --ack-delay-us 5 --min-window 0.5 --swift-decrease",
        ));
        let a = client.apply(&args("--server")).unwrap();
        assert_eq!(a.fabric.target_delay_us, Some(0));
        assert_eq!(a.fabric.ack_delay_us, Some(5));
        assert_eq!(a.fabric.min_window, Some(0.5));
        assert!(a.fabric.swift_decrease && !a.fabric.no_pacing);
        assert_eq!(RunOptions::of(&a), client, "the client's run");
        assert_eq!(
            conflicts(&args("--server --target-delay-us 10 --no-pacing"), &client),
            (
                vec![
                    "--target-delay-us 10".to_string(),
                    "--no-pacing".to_string()
                ],
                vec![
                    "--target-delay-us 0".to_string(),
                    "no --no-pacing".to_string()
                ]
            )
        );
        let mut run = client;
        run.min_window = Some(2.0);
        assert!(
            run.apply(&args("--server"))
                .unwrap_err()
                .starts_with("--min-window 2: ")
        );
    }

    #[test]
    fn the_patience_for_a_silent_peer_travels_with_the_run() {
        let client = RunOptions::of(&args("--client h --max-silence-ms 4000"));
        let a = client.apply(&args("--server")).unwrap();
        assert_eq!(a.max_silence_ms, Some(4000));
        assert_eq!(
            crate::transport::engine_config(&a, 1).tx.max_silence_us,
            4_000_000
        );
        let default = RunOptions::of(&args("--client h")).apply(&args("--server"));
        assert_eq!(
            crate::transport::engine_config(&default.unwrap(), 1)
                .tx
                .max_silence_us,
            uccl_engine::EngineConfig::default().tx.max_silence_us,
            "the engine's own without the option"
        );
        assert_eq!(
            conflicts(&args("--server --max-silence-ms 2000"), &client),
            (
                vec!["--max-silence-ms 2000".to_string()],
                vec!["--max-silence-ms 4000".to_string()]
            )
        );
        let mut run = client;
        run.max_silence_ms = Some(1);
        assert_eq!(
            run.apply(&args("--server")).unwrap_err(),
            "--max-silence-ms 1"
        );
    }

    #[test]
    fn options_no_command_line_could_give_are_refused() {
        let server = args("--server");
        let mut run = RunOptions::of(&args("--client h"));
        run.engines = 0;
        assert_eq!(run.apply(&server).unwrap_err(), "--engines 0");
        let mut run = RunOptions::of(&args("--client h"));
        run.loss = 2.0;
        assert_eq!(run.apply(&server).unwrap_err(), "--loss 2");
        let mut run = RunOptions::of(&args("--client h"));
        run.duration_s = Some(5.0);
        assert!(run.apply(&server).unwrap_err().contains("both or neither"));
        let mut run = RunOptions::of(&args("--client h --duration 1"));
        run.duration_s = Some(f64::NAN);
        assert_eq!(run.apply(&server).unwrap_err(), "--duration NaN");
        let mut run = RunOptions::of(&args("--client h"));
        run.flows = 2;
        run.engines = 3;
        assert!(
            run.apply(&server)
                .unwrap_err()
                .contains("every engine pair")
        );
    }
}
