//! Two processes: this one runs the receivers (`--server`) or the senders (`--client`) of every
//! flow, on engines of a real device, or of a softnic device on the UDP link (RoCEv2 between
//! the two processes, each on its own 127.0.0.x), connected over TCP. A 0-byte message from
//! the sender ends each flow.

use std::net::TcpListener;

use uccl_engine::{Clock, Engine};
use verbs_safe::Verbs;

use super::flow::{Flow, RxSide, TxSide};
use super::measure::execute;
use super::{Measured, Role, buffer, engine_config, inflight, open};
use crate::args::Args;

/// Which end of every flow this process runs, and how it reaches the other process.
#[derive(Debug, Clone, Copy)]
pub(super) enum Side<'a> {
    /// The receivers (`--server`): each flow accepted on this listener.
    Server(&'a TcpListener),
    /// The senders (`--client`): each flow connected to the server at this address.
    Client(&'a str),
}

/// Runs this process's end of every flow, on engines of `--device`, as `--server` or
/// `--client` say.
pub(super) fn run(args: &Args) -> Result<Measured, String> {
    let (fabric, verbs, device) = if args.soft() {
        let fabric = softnic::Fabric::try_new(softnic::FabricConfig {
            devices: 1,
            seed: args.seed,
            copy_payload: !args.no_payload,
            link: softnic::Link::Udp { addr: None },
            ..Default::default()
        })
        .map_err(|e| e.to_string())?;
        fabric.set_default_faults(args.faults());
        let ip = fabric
            .udp_addr("soft0")
            .map_or_else(String::new, |a| a.to_string());
        let on = format!("uccl-perf: softnic device soft0 on {ip}:4791 (RoCEv2 over UDP)");
        if args.json {
            eprintln!("{on}");
        } else {
            println!("{on}");
        }
        let verbs = Verbs::soft(&fabric);
        (Some(fabric), verbs, "soft0".to_string())
    } else {
        (None, Verbs::system(), args.device.clone())
    };
    let n = usize::from(args.engines);
    let cfg = engine_config(args, u32::from(args.flows).div_ceil(n as u32));
    let mut engines = Vec::with_capacity(n);
    for _ in 0..n {
        let ctx = open(&verbs, &device)?;
        engines.push(
            Engine::new(&ctx, cfg.clone(), Clock::wall())
                .map_err(|e| format!("starting an engine on {}: {e}", args.device))?,
        );
    }
    let names = vec![device; n];
    match &args.client {
        None => {
            let listener = TcpListener::bind(("0.0.0.0", args.port))
                .map_err(|e| format!("listening on port {}: {e}", args.port))?;
            // On standard error with --json, whose standard output is the one JSON object.
            let waiting = format!(
                "uccl-perf: waiting for {} flows on port {}",
                args.flows, args.port
            );
            if args.json {
                eprintln!("{waiting}");
            } else {
                println!("{waiting}");
            }
            run_side(args, engines, names, fabric, Side::Server(&listener))
        }
        Some(host) => {
            let addr = format!("{host}:{}", args.port);
            run_side(args, engines, names, fabric, Side::Client(&addr))
        }
    }
}

/// Runs the `side` end of `args.flows` flows (flow `f` on engine `f % engines`): as the
/// server, until each sender ends its flow; as the client, until each flow is sent and ended.
pub(super) fn run_side(
    args: &Args,
    mut engines: Vec<Engine>,
    names: Vec<String>,
    fabric: Option<softnic::Fabric>,
    side: Side<'_>,
) -> Result<Measured, String> {
    let window = u64::from(inflight(args));
    let msg = args.msg_size();
    let n = engines.len();
    let mut flows = Vec::new();
    for f in 0..usize::from(args.flows) {
        let engine = f % n;
        let e = &mut engines[engine];
        let (tx, rx) = match side {
            Side::Server(listener) => {
                let conn = e
                    .accept(listener)
                    .map_err(|err| format!("accepting flow {f}: {err}"))?;
                let dst = buffer(e, window * msg)?;
                (None, Some(RxSide::new(engine, conn, dst, None)))
            }
            Side::Client(addr) => {
                let conn = e
                    .connect(addr)
                    .map_err(|err| format!("connecting flow {f} to {addr}: {err}"))?;
                let src = buffer(e, window * msg)?;
                (Some(TxSide::new(engine, conn, src)), None)
            }
        };
        flows.push(Flow {
            id: f as u64,
            tx,
            rx,
        });
    }
    let role = match side {
        Side::Server(_) => Role::Server,
        Side::Client(_) => Role::Client,
    };
    execute(args, role, engines, names, fabric, flows, true)
}
