//! Two processes: this one runs the receivers (`--server`) or the senders (`--client`) of every
//! flow, on engines of a real device connected over TCP. A 0-byte message from the sender ends
//! each flow.

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
    let verbs = Verbs::system();
    let n = usize::from(args.engines);
    let cfg = engine_config(args, u32::from(args.flows).div_ceil(n as u32));
    let mut engines = Vec::with_capacity(n);
    for _ in 0..n {
        let ctx = open(&verbs, &args.device)?;
        engines.push(
            Engine::new(&ctx, cfg.clone(), Clock::wall())
                .map_err(|e| format!("starting an engine on {}: {e}", args.device))?,
        );
    }
    let names = vec![args.device.clone(); n];
    match &args.client {
        None => {
            let listener = TcpListener::bind(("0.0.0.0", args.port))
                .map_err(|e| format!("listening on port {}: {e}", args.port))?;
            if !args.json {
                println!(
                    "uccl-perf: waiting for {} flows on port {}",
                    args.flows, args.port
                );
            }
            run_side(args, engines, names, Side::Server(&listener))
        }
        Some(host) => {
            let addr = format!("{host}:{}", args.port);
            run_side(args, engines, names, Side::Client(&addr))
        }
    }
}

/// Runs the `side` end of `args.flows` flows (flow `f` on engine `f % engines`): as the
/// server, until each sender ends its flow; as the client, until each flow is sent and ended.
pub(super) fn run_side(
    args: &Args,
    mut engines: Vec<Engine>,
    names: Vec<String>,
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
    execute(args, role, engines, names, None, flows, true)
}
