//! Two processes: this one runs the receivers (`--server`) or the senders (`--client`) of every
//! flow, on engines of a real device, or of a softnic device on the UDP link (RoCEv2 between
//! the two processes, each on its own 127.0.0.x), connected over TCP. A message of another
//! size than the run's (0 bytes, or 1 when messages have none) from the sender ends each flow.

use std::collections::VecDeque;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV6, TcpListener};
use std::time::{Duration, Instant};

use uccl_engine::{Access, Buffer, Clock, ConnId, Connecting, DESCRIPTOR_LEN, Descriptor, Engine};
use verbs_safe::Verbs;

use super::flow::{Credits, Flow, RxSide, TxSide};
use super::measure::execute;
use super::run::{NOTICE, NOTICES_AT};
use super::session::{PUSH_OUT_AFTER, Session};
use super::{Measured, Role, agree, buffer, engine_config, inflight, open, say};
use crate::args::Args;

/// Which end of every flow this process runs, and how it reaches the other process.
#[derive(Debug, Clone, Copy)]
pub(super) enum Side<'a> {
    /// The receivers (`--server`): each flow accepted on this listener, from the client
    /// whose session this is.
    Server(&'a TcpListener, &'a Session),
    /// The senders (`--client`): each flow connected to the server at this address when
    /// the server, whose session this is, takes it.
    Client(&'a str, &'a Session),
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
            let listener =
                listen(args.port).map_err(|e| format!("listening on port {}: {e}", args.port))?;
            // The port listened on (the kernel's choice for `--port 0`).
            let port = listener.local_addr().map_or(args.port, |a| a.port());
            say(
                args,
                &format!("uccl-perf: waiting for a client on port {port} (it chooses the run)"),
            );
            let (args, session) = agree::serve(&listener, args)?;
            let m = start(&args, Side::Server(&listener, &session))?;
            Ok((args, m))
        }
        Some(host) => {
            let addr = address(host, args.port);
            // Kept open until the run ends: the server paces the flows on it, and learns so if
            // this process dies.
            let session = agree::ask(&addr, args)?;
            let m = start(args, Side::Client(&addr, &session))?;
            Ok((args.clone(), m))
        }
    }
}

/// The server's listener on `port`, for clients over IPv6 and IPv4 alike (one socket on `::`
/// that takes both), or over IPv4 alone where this host has no IPv6.
fn listen(port: u16) -> std::io::Result<TcpListener> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType, sockopt};
    let both = || -> std::io::Result<TcpListener> {
        let fd = rustix::net::socket_with(
            AddressFamily::INET6,
            SocketType::STREAM,
            SocketFlags::CLOEXEC,
            None,
        )?;
        // As the standard library's own listeners: a port left in TIME_WAIT by the last run
        // can be listened on at once.
        sockopt::set_socket_reuseaddr(&fd, true)?;
        sockopt::set_ipv6_v6only(&fd, false)?;
        rustix::net::bind(&fd, &SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, port, 0, 0))?;
        rustix::net::listen(&fd, 128)?;
        Ok(TcpListener::from(fd))
    };
    // IPv4 alone only where this host has no IPv6 (no such family or protocol, or `::` not
    // an address here); any other error (a port in use) is IPv6's to tell.
    both().or_else(|e| {
        use rustix::io::Errno;
        let no_v6 = [
            Errno::AFNOSUPPORT,
            Errno::PROTONOSUPPORT,
            Errno::ADDRNOTAVAIL,
        ]
        .iter()
        .any(|n| e.raw_os_error() == Some(n.raw_os_error()));
        if no_v6 {
            TcpListener::bind((Ipv4Addr::UNSPECIFIED, port))
        } else {
            Err(e)
        }
    })
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

/// Handshakes of connections to the port a flow has in flight at most: with this many, the
/// oldest whose client has not sent its handshake within [`PUSH_OUT_AFTER`] gives its place
/// up to a newer connection, and more wait in the kernel's backlog meanwhile.
const TRIES: usize = 64;
/// How often the server looks at the connections to its port, and at its client's session,
/// while it sets up a flow (it polls the engine between looks).
const LOOK_EVERY: Duration = Duration::from_millis(1);

/// The client's next flow, set up on engine `e` within [`agree::TIMEOUT`]. The server tells
/// the client to connect it (see [`Session`]) and takes every connection to `listener` (non-
/// blocking) meanwhile: one from another host than the client's is closed at once; the
/// others are each set up on their own: one that fails or says nothing (a stranger's,
/// another client asking for a run) holds only its own handshake, and gives it up for a
/// newer connection with [`TRIES`] in flight; the others are given up once the flow is
/// set up. A client that agreed on the run and never connects (its device failed) does not
/// hold the server for ever, and one that closes its session (its process died, it gave up)
/// ends the run at once.
fn accept_flow(
    e: &mut Engine,
    listener: &TcpListener,
    session: &Session,
) -> Result<ConnId, String> {
    session.go()?;
    // Oldest first, with when each began.
    let mut tries: VecDeque<(Connecting, Instant)> = VecDeque::new();
    let mut last = None;
    let got = take_flow(e, listener, session, &mut tries, &mut last);
    for (t, _) in tries {
        // One set up meanwhile is not the flow (it came after, or the run ends): closed.
        if !e.abandon(&t)
            && let Some(Ok(conn)) = t.test()
        {
            let _ = e.close(conn);
        }
    }
    got.map_err(|why| {
        let last = last.map_or_else(String::new, |why| format!("; the last connection: {why}"));
        format!("{why}{last}")
    })
}

/// [`accept_flow`]'s loop: the handshakes in flight are in `tries` (those that ended, and
/// those pushed out and abandoned, are taken from it), the last one's failure in `last`.
fn take_flow(
    e: &mut Engine,
    listener: &TcpListener,
    session: &Session,
    tries: &mut VecDeque<(Connecting, Instant)>,
    last: &mut Option<uccl_engine::EngineError>,
) -> Result<ConnId, String> {
    let end = Instant::now() + agree::TIMEOUT;
    let mut looked = Instant::now();
    loop {
        if let Some(i) = tries.iter().position(|(t, _)| t.is_done()) {
            let (t, _) = tries.remove(i).expect("found");
            match t.test() {
                Some(Ok(conn)) => return Ok(conn),
                Some(Err(why)) => *last = Some(why),
                None => {}
            }
            continue;
        }
        if Instant::now() >= end {
            return Err(format!(
                "the client did not connect it within {} s (did it fail after agreeing on the \
                 run?)",
                agree::TIMEOUT.as_secs()
            ));
        }
        e.poll().map_err(|e| e.to_string())?;
        if looked.elapsed() < LOOK_EVERY {
            continue;
        }
        looked = Instant::now();
        if session.ended() {
            return Err(
                "the client closed its connection to this server (it ended or died) \
                        before it connected this flow"
                    .to_string(),
            );
        }
        let mut refused = 0;
        loop {
            // With every place taken, a connection is taken only to push out the oldest
            // handshake whose client has not sent its own for a while (never one that
            // completed, nor one whose client did: an engine, however slow).
            let full = tries.len() >= TRIES;
            let out = full.then(|| {
                tries.iter().position(|(t, at)| {
                    at.elapsed() >= PUSH_OUT_AFTER && !t.is_done() && !e.peer_spoke(t)
                })
            });
            if out == Some(None) {
                break;
            }
            match listener.accept() {
                // Closed at once: another host's engine is never the flow. A backlog's worth
                // a look at most: a host that keeps connecting does not keep the engine
                // unpolled.
                Ok((_, peer)) if !session.is_clients_host(peer) => {
                    refused += 1;
                    if refused == TRIES {
                        break;
                    }
                }
                Ok((stream, peer)) => {
                    if let Some(Some(i)) = out
                        && let Some((oldest, _)) = tries.remove(i)
                    {
                        e.abandon(&oldest);
                    }
                    let t = e.accept_stream(stream, peer).map_err(|e| e.to_string())?;
                    tries.push_back((t, Instant::now()));
                }
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(err) if super::session::is_transient(&err) => {}
                Err(err) => return Err(format!("accepting a connection: {err}")),
            }
        }
    }
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
    if let Side::Server(listener, _) = side {
        // Every connection is taken as it comes (see `accept_flow`).
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("the listener: {e}"))?;
    }
    let mut flows = Vec::new();
    for f in 0..usize::from(args.flows) {
        let engine = f % n;
        let e = &mut engines[engine];
        let (tx, rx) = match side {
            Side::Server(listener, session) => {
                let conn = accept_flow(e, listener, session)
                    .map_err(|err| format!("accepting flow {f}: {err}"))?;
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
            Side::Client(addr, session) => {
                session.wait_go(f)?;
                let conn = e
                    .connect(session.server_addr())
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
        Side::Server(..) => Role::Server,
        Side::Client(..) => Role::Client,
    };
    execute(args, role, engines, names, fabric, flows, true)
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::io::{Read, Write};
    use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
    use std::sync::mpsc;
    use std::time::Duration;

    use uccl_engine::{Clock, Engine, EngineConfig, EngineHandle};
    use verbs_safe::{Context, Verbs};

    use super::{PUSH_OUT_AFTER, Session, TRIES, accept_flow, address, take_flow};

    /// A server's engine, a client's and a stranger's (threaded) on one softnic fabric, each
    /// with handshake deadlines longer than the server's wait for a flow (a flow held up
    /// behind strangers would never be set up); the server's port (non-blocking) and its
    /// address; a session from 127.0.0.1, with its client's end.
    struct Rig {
        _fabric: softnic::Fabric,
        server: Engine,
        client: EngineHandle,
        stranger: EngineHandle,
        listener: TcpListener,
        addr: SocketAddr,
        session: Session,
        go: TcpStream,
    }

    fn rig() -> Rig {
        let fabric = softnic::Fabric::new(softnic::FabricConfig {
            devices: 3,
            clock: softnic::Clock::Wall,
            ..Default::default()
        });
        let verbs = Verbs::soft(&fabric);
        let engine = |i: usize| {
            let ctx = Context::open_by_name(&verbs, &format!("soft{i}")).unwrap();
            let cfg = EngineConfig {
                handshake_timeout_ms: 2 * super::agree::TIMEOUT.as_millis() as u64,
                ..EngineConfig::default()
            };
            Engine::new(&ctx, cfg, Clock::Fabric(fabric.clone())).unwrap()
        };
        let (server, client) = (engine(0), engine(1).spawn().unwrap());
        let stranger = engine(2).spawn().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let side = TcpListener::bind("127.0.0.1:0").unwrap();
        let go = TcpStream::connect(side.local_addr().unwrap()).unwrap();
        let (s, peer) = side.accept().unwrap();
        Rig {
            _fabric: fabric,
            server,
            client,
            stranger,
            listener,
            addr,
            session: Session::server(s, peer).unwrap(),
            go,
        }
    }

    /// More silent connections to the port than a flow has handshakes in flight, all ahead of
    /// the client's flow in the backlog: the oldest give their places up, and the flow is set
    /// up, and none of the silent ones is still held once it is.
    #[test]
    fn a_flood_of_silent_connections_does_not_hold_a_flow_up() {
        let mut r = rig();
        let (client, addr, mut go) = (r.client, r.addr, r.go);
        let silent: Vec<TcpStream> = (0..TRIES + 40)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        let flow = std::thread::spawn(move || {
            go.read_exact(&mut [0u8; 1]).unwrap();
            let c = client.connect(addr).unwrap();
            let got = c.wait();
            (got, client, go)
        });
        let conn = accept_flow(&mut r.server, &r.listener, &r.session);
        let (got, _client, _go) = flow.join().unwrap();
        let conn = conn.unwrap();
        got.unwrap();
        assert!(r.server.is_open(conn));
        for _ in 0..10 {
            r.server.poll().unwrap();
        }
        assert_eq!(r.server.handshakes(), 0, "handshakes left behind");
        drop(silent);
    }

    /// A connection whose client sent an engine's whole handshake (and then went quiet, as a
    /// busy engine may) keeps its place however long it takes, while silent ones behind it,
    /// with every place taken, give theirs up to newer connections and to the flow.
    #[test]
    fn a_handshake_whose_client_spoke_keeps_its_place() {
        let mut r = rig();
        let (client, addr) = (r.client, r.addr);
        // An engine's handshake, caught on a port of the test's (its engine waits for an
        // answer that never comes while the test lasts).
        let catcher = TcpListener::bind("127.0.0.1:0").unwrap();
        let _caught = client.connect(catcher.local_addr().unwrap()).unwrap();
        let (mut c, _) = catcher.accept().unwrap();
        c.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut hello = Vec::new();
        let mut b = [0u8; 4096];
        while let Ok(n @ 1..) = c.read(&mut b) {
            hello.extend_from_slice(&b[..n]);
        }
        assert!(!hello.is_empty(), "no handshake came");
        let mut spoke = TcpStream::connect(addr).unwrap();
        spoke.write_all(&hello).unwrap();
        // Every place taken behind it, and one more waiting from the start.
        let silent: Vec<TcpStream> = (0..TRIES)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        let flow = std::thread::spawn(move || {
            std::thread::sleep(PUSH_OUT_AFTER + Duration::from_millis(300));
            let got = client.connect(addr).unwrap().wait();
            (got, client)
        });
        let (mut tries, mut last) = (VecDeque::new(), None);
        let conn = take_flow(
            &mut r.server,
            &r.listener,
            &r.session,
            &mut tries,
            &mut last,
        );
        let (got, _client) = flow.join().unwrap();
        conn.unwrap();
        got.unwrap();
        assert!(
            tries.iter().any(|(t, _)| r.server.peer_spoke(t)),
            "the handshake whose client spoke was pushed out ({last:?})"
        );
        drop((silent, spoke, c));
    }

    /// A TCP relay to `to` from `from` (another address than the client's): the address
    /// to connect to it at. It takes one connection and copies both ways; each side's end
    /// is passed on.
    fn relay_from(from: Ipv4Addr, to: SocketAddr) -> SocketAddr {
        use rustix::net::{AddressFamily, SocketType};
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (a, _) = l.accept().unwrap();
            let fd = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
            rustix::net::bind(&fd, &SocketAddrV4::new(from, 0)).unwrap();
            rustix::net::connect(&fd, &to).unwrap();
            let b = TcpStream::from(fd);
            let copy = |mut x: TcpStream, mut y: TcpStream| {
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut x, &mut y);
                    let _ = y.shutdown(std::net::Shutdown::Write);
                })
            };
            copy(a.try_clone().unwrap(), b.try_clone().unwrap());
            copy(b, a);
        });
        at
    }

    /// An engine on another host than the session's client (here another loopback address)
    /// that connects while the server waits for a flow is not taken for the flow: its
    /// handshake fails, and the client's own flow is set up.
    #[test]
    fn a_connection_from_another_host_than_the_clients_is_not_the_flow() {
        let mut r = rig();
        let (client, stranger, addr, mut go) = (r.client, r.stranger, r.addr, r.go);
        let (told, heard) = mpsc::channel();
        let relay = relay_from(Ipv4Addr::new(127, 0, 0, 2), addr);
        let strange = std::thread::spawn(move || {
            let got = stranger.connect(relay).unwrap().wait();
            let _ = told.send(got.is_ok());
            (got, stranger)
        });
        let flow = std::thread::spawn(move || {
            go.read_exact(&mut [0u8; 1]).unwrap();
            // The client connects once the stranger's handshake has ended (if it was taken
            // for the flow, never: the server waits for no other).
            if heard.recv_timeout(Duration::from_secs(30)) != Ok(false) {
                return (None, client, go);
            }
            let got = client.connect(addr).unwrap().wait();
            (Some(got), client, go)
        });
        let conn = accept_flow(&mut r.server, &r.listener, &r.session);
        let (got, _client, _go) = flow.join().unwrap();
        let (strange, _stranger) = strange.join().unwrap();
        assert!(
            strange.is_err(),
            "the stranger's connection was taken for the flow"
        );
        conn.unwrap();
        got.expect("the client never connected").unwrap();
    }

    #[test]
    fn a_host_may_name_its_port_and_be_ipv6() {
        assert_eq!(address("10.0.0.1", 7), "10.0.0.1:7");
        assert_eq!(address("server.local", 7), "server.local:7");
        assert_eq!(address("127.0.0.1:18515", 7), "127.0.0.1:18515");
        assert_eq!(address("::1", 7), "[::1]:7");
        assert_eq!(address("[::1]:9", 7), "[::1]:9");
    }
}
