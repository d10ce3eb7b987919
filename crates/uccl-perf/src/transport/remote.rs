//! Two processes: this one runs the receivers (`--server`) or the senders (`--client`) of every
//! flow, on engines of a real device, or of a softnic device on the UDP link (RoCEv2 between
//! the two processes, each on its own 127.0.0.x), connected over TCP. A message of another
//! size than the run's (0 bytes, or 1 when messages have none) from the sender ends each flow.

use std::net::TcpListener;
use std::time::Instant;

use uccl_engine::{Access, Buffer, Clock, ConnId, DESCRIPTOR_LEN, Descriptor, Engine};
use verbs_safe::Verbs;

use super::flow::{Credits, Flow, RxSide, TxSide};
use super::measure::execute;
use super::run::{NOTICE, NOTICES_AT};
use super::{Measured, Role, agree, buffer, engine_config, inflight, open, say};
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
/// `--client` say: first the two agree on the run (the client's options; see [`agree`]),
/// then every flow connects. The options the run had, and what it measured.
pub(super) fn run(args: &Args) -> Result<(Args, Measured), String> {
    // A device that cannot be opened fails now, before the other end waits for this one.
    if !args.soft() {
        open(&Verbs::system(), &args.device)?;
    }
    match &args.client {
        None => {
            let listener = TcpListener::bind(("0.0.0.0", args.port))
                .map_err(|e| format!("listening on port {}: {e}", args.port))?;
            // The port listened on (the kernel's choice for `--port 0`).
            let port = listener.local_addr().map_or(args.port, |a| a.port());
            say(
                args,
                &format!("uccl-perf: waiting for a client on port {port} (it chooses the run)"),
            );
            let args = agree::serve(&listener, args)?;
            let m = start(&args, Side::Server(&listener))?;
            Ok((args, m))
        }
        Some(host) => {
            let addr = address(host, args.port);
            agree::ask(&addr, args)?;
            let m = start(args, Side::Client(&addr))?;
            Ok((args.clone(), m))
        }
    }
}

/// The server's address for `--client HOST`: `HOST:PORT`, unless HOST names its port itself
/// (`127.0.0.1:18515`, `[::1]:18515`); an IPv6 address in brackets.
fn address(host: &str, port: u16) -> String {
    if host.parse::<std::net::SocketAddr>().is_ok() {
        host.to_string()
    } else if host.parse::<std::net::Ipv6Addr>().is_ok() {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Starts this process's `--engines` engines on `--device` (softnic: one device on the UDP
/// link, with `args`' faults) and runs the `side` end of every flow on them.
fn start(args: &Args, side: Side<'_>) -> Result<Measured, String> {
    let (fabric, verbs, device) = if args.soft() {
        let fabric = softnic::Fabric::try_new(softnic::FabricConfig {
            devices: 1,
            seed: args.seed,
            copy_payload: !args.no_payload,
            link: softnic::Link::Udp { addr: None },
            ..Default::default()
        })
        .map_err(|e| e.to_string())?;
        fabric
            .set_default_faults(args.faults())
            .map_err(|e| e.to_string())?;
        let ip = fabric
            .udp_addr("soft0")
            .map_or_else(String::new, |a| a.to_string());
        say(
            args,
            &format!("uccl-perf: softnic device soft0 on {ip}:4791 (RoCEv2 over UDP)"),
        );
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
                .map_err(|e| super::engine_error(&args.device, &e))?,
        );
    }
    run_side(args, engines, vec![device; n], fabric, side)
}

/// The client's next flow, accepted on `listener` within [`agree::TIMEOUT`]: a client that
/// agreed on the run and then never connects its flows (its device failed, it died) does not
/// hold the server for ever. A connection whose handshake fails otherwise than by closing
/// (another client asking for a run, which is not an engine's handshake, or says too little
/// of one) is dropped and the next one taken: the run goes on. One the client closed (it died
/// while its flows connected) ends the run at once.
fn accept_flow(e: &mut Engine, listener: &TcpListener) -> Result<ConnId, String> {
    let end = Instant::now() + agree::TIMEOUT;
    let mut last = None;
    while Instant::now() < end {
        let req = e.accept(listener).map_err(|e| e.to_string())?;
        while !req.is_done() && Instant::now() < end {
            e.poll().map_err(|e| e.to_string())?;
        }
        match req.test() {
            Some(Ok(conn)) => return Ok(conn),
            Some(Err(why)) if closed(&why) => return Err(why.to_string()),
            Some(Err(why)) => last = Some(why),
            None => break,
        }
    }
    let last = last.map_or_else(String::new, |why| format!("; the last connection: {why}"));
    Err(format!(
        "the client did not connect it within {} s (did it fail after agreeing on the run?){last}",
        agree::TIMEOUT.as_secs()
    ))
}

/// Whether a handshake failed because the peer closed its connection (the engine says so in
/// words: "the peer closed the connection ...").
fn closed(e: &uccl_engine::EngineError) -> bool {
    matches!(e, uccl_engine::EngineError::Handshake { reason, .. }
        if reason.contains("peer closed"))
}

/// The peer's export, sent as the flow's first message: received into `small` (64 bytes at
/// least) of engine `e`'s connection `conn`.
fn take_export(e: &mut Engine, conn: ConnId, small: &Buffer) -> Result<Descriptor, String> {
    let r = e.recv(conn, small, 0, 64).map_err(|e| e.to_string())?;
    let len = e.wait(&r).map_err(|e| e.to_string())?.len as usize;
    let mut b = [0u8; 64];
    small.read_at(0, &mut b[..len]).map_err(|e| e.to_string())?;
    Descriptor::from_bytes(&b[..len]).ok_or_else(|| "it came garbled".to_string())
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
                let conn =
                    accept_flow(e, listener).map_err(|err| format!("accepting flow {f}: {err}"))?;
                let dst = buffer(e, window * msg)?;
                let mut rx = RxSide::new(engine, conn, dst, None);
                if args.op.reads() {
                    // The sender's export comes as the flow's first message.
                    let err = |err| format!("flow {f}: taking the sender's export: {err}");
                    let small = buffer(e, NOTICES_AT + window * NOTICE)?;
                    rx.desc = Some(take_export(e, conn, &small).map_err(err)?);
                    rx.credits = Some((small, Default::default()));
                }
                if args.op.notes() {
                    // The export goes to the sender as the flow's first message.
                    let err = |err| format!("flow {f}: handing the export over: {err}");
                    let desc = e.export(&rx.dst, 0, window * msg).map_err(err)?;
                    let small = buffer(e, 64)?;
                    small.write_at(0, &desc.to_bytes()).map_err(err)?;
                    let r = e
                        .send(conn, &small, 0, DESCRIPTOR_LEN as u64)
                        .map_err(err)?;
                    e.wait(&r).map_err(err)?;
                    rx.desc = Some(desc);
                    rx.credits = Some((small, Default::default()));
                }
                (None, Some(rx))
            }
            Side::Client(addr) => {
                let conn = e
                    .connect(addr)
                    .and_then(|c| e.wait(&c))
                    .map_err(|err| format!("connecting flow {f} to {addr}: {err}"))?;
                let src = buffer(e, window * msg)?;
                let mut tx = TxSide::new(engine, conn, src);
                if args.op.notes() {
                    let err = |err| format!("flow {f}: taking the receiver's export: {err}");
                    let small = buffer(e, 64)?;
                    let desc = take_export(e, conn, &small).map_err(err)?;
                    tx.remote = Some((desc, Credits::new(small)));
                }
                if args.op.reads() {
                    // The export goes to the reader as the flow's first message.
                    let err = |err| format!("flow {f}: handing the export over: {err}");
                    let desc = e
                        .export_with(&tx.src, 0, window * msg, Access::READ)
                        .map_err(err)?;
                    let small = buffer(e, NOTICES_AT + window * NOTICE)?;
                    small.write_at(0, &desc.to_bytes()).map_err(err)?;
                    let r = e
                        .send(conn, &small, 0, DESCRIPTOR_LEN as u64)
                        .map_err(err)?;
                    e.wait(&r).map_err(err)?;
                    tx.remote = Some((desc, Credits::new(small)));
                }
                (Some(tx), None)
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

#[cfg(test)]
mod tests {
    use super::address;

    #[test]
    fn a_host_may_name_its_port_and_be_ipv6() {
        assert_eq!(address("10.0.0.1", 7), "10.0.0.1:7");
        assert_eq!(address("server.local", 7), "server.local:7");
        assert_eq!(address("127.0.0.1:18515", 7), "127.0.0.1:18515");
        assert_eq!(address("::1", 7), "[::1]:7");
        assert_eq!(address("[::1]:9", 7), "[::1]:9");
    }
}
