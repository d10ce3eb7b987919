//! The engine test: flows of messages from sending engines to receiving engines, every byte
//! checked against the pattern of its flow and message.
//!
//! On softnic both ends run in this process on one fabric's virtual clock, driven as the
//! integration tests' `Sim` does: every engine is polled; when none has work the clock jumps
//! to the next event (a packet, or an engine's timer). The same seed gives the same run. On a
//! real device both ends run in this process in loopback on the wall clock, or in two
//! processes (`--server`, `--client`) connected over TCP.
//!
//! - [`local`]: both ends in this process (the deterministic softnic run, or loopback);
//! - [`remote`]: one end in each of two processes, connected over TCP;
//! - [`agree`]: the two processes agree on the run (the server adopts the client's options);
//! - [`flow`]: a flow's sending and receiving ends, and the payload written and checked;
//! - [`mod@run`]: a run in progress, moving every flow along;
//! - [`drive`]: polling the engines and moving the virtual clock until every flow is done;
//! - [`measure`]: driving a run to the end and measuring it.

mod agree;
mod congestion;
mod drive;
mod flow;
mod local;
mod measure;
mod remote;
mod run;
mod session;

use std::time::Duration;

use uccl_engine::{Buffer, Engine, EngineConfig, Mode, RecvKeys};
use verbs_safe::{Context, Verbs};

pub(crate) use self::agree::RunOptions;
pub(crate) use self::congestion::Congestion;
use crate::args::{Args, RecvKeysArg, TransportArg, TxMode};

/// Which ends of the flows this process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Role {
    /// Both (one process).
    Both,
    /// The receivers (`--server`).
    Server,
    /// The senders (`--client`).
    Client,
}

/// What a run measured.
#[derive(Debug, Clone)]
pub(crate) struct Measured {
    pub(crate) role: Role,
    /// Messages per flow in flight.
    pub(crate) inflight: u32,
    pub(crate) messages_sent: u64,
    pub(crate) messages_received: u64,
    pub(crate) bytes_sent: u64,
    pub(crate) bytes_received: u64,
    /// Whether the payload was checked (not with `--no-payload`).
    pub(crate) verified: bool,
    pub(crate) elapsed: Duration,
    /// softnic's virtual time the run took (the simulated link's view).
    pub(crate) virtual_time: Option<Duration>,
    /// The engines' counters, summed.
    pub(crate) stats: uccl_engine::Stats,
    pub(crate) failover_retransmits: u64,
    /// softnic's counters over every device, summed.
    pub(crate) nic: Option<softnic::Counters>,
    /// Process CPU time over the run.
    pub(crate) cpu: Option<Duration>,
    /// Of which: writing and checking the patterns (on the virtual clock, wall time scaled by
    /// the share of the run the process ran: see `measure::in_cpu`).
    pub(crate) check: Duration,
    /// Of which, on softnic's virtual clock: the simulated NIC's event loop (packets moved,
    /// completions written), run by the driver between rounds (scaled as `check`).
    pub(crate) nic_time: Option<Duration>,
    /// A single-threaded memcpy of the same bytes, in this run.
    pub(crate) memcpy_gbps: f64,
    /// The steady state of a run on switches or an incast (softnic's virtual clock).
    pub(crate) congestion: Option<Congestion>,
}

/// Runs the engine test as `args` says; the options the run had (a server's are its
/// client's) and what it measured.
pub(crate) fn run(args: &Args) -> Result<(Args, Measured), String> {
    if args.server || args.client.is_some() {
        return remote::run(args);
    }
    local::run(args).map(|m| (args.clone(), m))
}

/// Says `text` on standard output, or on standard error with `--json` (whose standard output
/// is the one JSON object).
pub(crate) fn say(args: &Args, text: &str) {
    if args.json {
        eprintln!("{text}");
    } else {
        println!("{text}");
    }
}

/// The engines' configuration for `args`, each holding `conns` connections.
pub(crate) fn engine_config(args: &Args, conns: u32) -> EngineConfig {
    let mut cfg = EngineConfig {
        mode: match args.transport {
            TransportArg::Uc => Mode::Uc,
            TransportArg::Rc => Mode::Rc,
        },
        qps_per_conn: args.qps_per_flow,
        max_conns: conns.max(1),
        max_recvs: inflight(args).max(64),
        recv_keys: match args.recv_keys {
            RecvKeysArg::Window => RecvKeys::Window,
            RecvKeysArg::Buffer => RecvKeys::Buffer,
        },
        ..EngineConfig::default()
    };
    cfg.tx.chunk_size = args.chunk_size as u32;
    cfg.tx.max_chain = match args.tx_mode {
        TxMode::Chained => cfg.tx.max_chain,
        TxMode::Single => 1,
    };
    cfg.tx.seed = args.seed;
    // Enough that even 10% of every fault together never exhausts them.
    cfg.tx.max_retransmits = 64;
    if let Some(ms) = args.max_silence_ms {
        cfg.tx.max_silence_us = ms * 1000;
    }
    // On UC every SRQ buffer holds a chunk: about 32 MiB of them, 128 to 1024.
    let slot = args.chunk_size + 64;
    let depth = ((32 << 20) / slot).clamp(128, 1024) as u32;
    cfg.srq_depth = depth.next_power_of_two().min(1024);
    cfg.srq_refill = cfg.srq_refill.min(cfg.srq_depth / 4);
    args.fabric.apply(&mut cfg);
    cfg
}

/// Refuses a UC run whose receive buffers would take more than half of the memory this
/// machine has available, naming `--chunk-size`: each engine keeps `srq_depth` buffers of a
/// chunk each (at least 128, see [`engine_config`]). Where the machine does not say (no
/// `/proc/meminfo`), nothing is refused.
pub(crate) fn check_receive_memory(args: &Args) -> Result<(), String> {
    if args.transport != TransportArg::Uc {
        return Ok(());
    }
    let buffers = u64::from(engine_config(args, 1).srq_depth);
    let slot = args.chunk_size + 64;
    // Both ends' engines in one process.
    let engines = u64::from(args.engines) * if args.remote() { 1 } else { 2 };
    let need = buffers.saturating_mul(slot).saturating_mul(engines);
    match available_memory() {
        Some(avail) if need > avail / 2 => Err(format!(
            "--chunk-size {}: UC receive buffers would take {} ({buffers} chunks in each of \
             {engines} engines), more than half of the {} this machine has available (a \
             smaller --chunk-size, or --transport rc, whose receives take no buffers)",
            crate::args::human_size(args.chunk_size),
            crate::args::human_size(need),
            crate::args::human_size(avail)
        )),
        _ => Ok(()),
    }
}

/// The memory this machine has available (`MemAvailable` of `/proc/meminfo`), if it says.
fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Why an engine on `device` would not start; for a configuration the device cannot take, with
/// the options it comes from (the engine's error names its own settings).
pub(crate) fn engine_error(device: &str, e: &uccl_engine::EngineError) -> String {
    let from = match e {
        uccl_engine::EngineError::Config { .. } => {
            " (uccl-perf sets max_conns from --flows and --engines, qps_per_conn from \
             --qps-per-flow, max_recvs from --inflight, the SRQ from --chunk-size)"
        }
        _ => "",
    };
    format!("starting an engine on {device}: {e}{from}")
}

/// Messages per flow in flight: `--inflight`, or as many as fit in 4 MiB (2 to 32; 32 of 0
/// bytes).
pub(crate) fn inflight(args: &Args) -> u32 {
    args.inflight
        .unwrap_or_else(|| ((4 << 20) / args.msg_size().max(1)).clamp(2, 32) as u32)
}

/// What to say when there is no device `name` (`available` are the ones there are).
pub(crate) fn no_such_device(name: &str, available: &[String]) -> String {
    if available.is_empty() {
        format!(
            "no RDMA device named {name:?}: this machine has none (--device soft runs on the \
             built-in software NIC)"
        )
    } else {
        format!(
            "no RDMA device named {name:?} (there are: {}; or --device soft)",
            available.join(", ")
        )
    }
}

/// Opens `name` on `verbs`, saying plainly what is wrong if it cannot.
fn open(verbs: &Verbs, name: &str) -> Result<std::sync::Arc<Context>, String> {
    Context::open_by_name(verbs, name).map_err(|e| match e {
        verbs_safe::Error::NoSuchDevice { available, .. } => no_such_device(name, &available),
        e => format!("opening {name}: {e}"),
    })
}

/// A buffer of `len` bytes (at least 1, for 0-byte messages) registered with `e`.
fn buffer(e: &mut Engine, len: u64) -> Result<Buffer, String> {
    let len = len.max(1);
    e.register(len as usize)
        .map_err(|err| format!("registering {len} bytes: {err}"))
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use clap::Parser;
    use uccl_engine::Clock;

    use super::remote::{Side, run_side};
    use super::*;

    /// The arguments `extra` (split at spaces).
    fn args(extra: &str) -> Args {
        Args::parse_from(std::iter::once("uccl-perf").chain(extra.split_whitespace()))
    }

    #[test]
    fn a_small_run_verifies_every_message() {
        for op in ["send", "write"] {
            for t in ["uc", "rc"] {
                let a = args(&format!(
                    "--flows 3 --engines 2 --qps-per-flow 2 --msg-size 10000 --chunk-size 4KiB \
                     --messages 5 --op {op} --transport {t} --loss 0.02"
                ));
                let (_, m) = run(&a).unwrap();
                assert_eq!((m.messages_sent, m.messages_received), (15, 15), "{op} {t}");
                assert_eq!(m.bytes_received, 150_000);
                assert!(m.verified);
                assert!(m.stats.chunks_sent >= 15 * 3);
            }
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_run() {
        let a = args("--messages 4 --msg-size 64KiB --chunk-size 4KiB");
        let (x, y) = (run(&a).unwrap().1, run(&a).unwrap().1);
        assert_eq!(x.stats, y.stats);
        assert_eq!(x.virtual_time, y.virtual_time);
        assert_eq!(x.nic, y.nic);
    }

    /// The two-process path, in one process: a server and a client thread agree on the run
    /// and connect over TCP on one softnic fabric on the wall clock.
    #[test]
    fn server_and_client_talk_over_tcp() {
        let a = args(
            "--flows 2 --engines 2 --qps-per-flow 2 --msg-size 20000 --chunk-size 8KiB \
             --messages 6",
        );
        let fabric = softnic::Fabric::new(softnic::FabricConfig {
            devices: 2,
            clock: softnic::Clock::Wall,
            ..Default::default()
        });
        let verbs = Verbs::soft(&fabric);
        let engines = |dev: &str| -> Vec<Engine> {
            (0..2)
                .map(|_| {
                    let ctx = Context::open_by_name(&verbs, dev).unwrap();
                    Engine::new(&ctx, engine_config(&a, 1), Clock::wall()).unwrap()
                })
                .collect()
        };
        let (srv, cli) = (engines("soft0"), engines("soft1"));
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let names = vec!["soft".to_string(); 2];
        std::thread::scope(|s| {
            let a = &a;
            let n = names.clone();
            let server = s.spawn(move || {
                let (a, session) = agree::serve(&listener, a)?;
                run_side(&a, srv, n, None, Side::Server(&listener, &session))
            });
            let session = agree::ask(&addr, a).unwrap();
            let c = run_side(a, cli, names, None, Side::Client(&addr, &session)).unwrap();
            let sv = server.join().unwrap().unwrap();
            assert_eq!((c.role, c.messages_sent), (Role::Client, 12));
            assert_eq!((sv.role, sv.messages_received), (Role::Server, 12));
            assert_eq!(sv.bytes_received, 12 * 20000);
        });
    }
}
