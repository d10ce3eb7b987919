//! Row 8: connection set-up through the engine. Set-ups per second, one at a time against
//! many in flight at once (the handshakes run in the engines' rounds, on non-blocking
//! sockets); and the goodput of a transfer into the listening engine, alone against while
//! 100 clients connect to it.

use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use softnic::{Clock as FabricClock, Fabric, FabricConfig};
use uccl_engine::{Buffer, Clock, ConnId, Connecting, Engine, EngineConfig, EngineHandle, Request};
use verbs_safe::{Context, Verbs};

use crate::perf::median;

use super::{Out, Row};

/// Connections set up per measure, and clients connecting beside the transfer.
pub(crate) const CLIENTS: usize = 100;

/// What row 8 measured.
pub(crate) struct SetUps {
    /// Set-ups per second: one at a time, all at once.
    pub(crate) per_s: [f64; 2],
    /// Goodput of the transfer in Gb/s: alone, while [`CLIENTS`] connect.
    pub(crate) gbps: [f64; 2],
}

fn err(e: uccl_engine::EngineError) -> String {
    e.to_string()
}

/// Three engines on threads of their own, on one in-process fabric on the wall clock: the
/// server (listening), the transfer's other end (connected to it) and the clients'.
struct Three {
    _fabric: Fabric,
    server: EngineHandle,
    peer: EngineHandle,
    clients: EngineHandle,
    addr: SocketAddr,
}

fn three() -> Result<Three, String> {
    let fabric = Fabric::new(FabricConfig {
        devices: 3,
        clock: FabricClock::Wall,
        ..Default::default()
    });
    let verbs = Verbs::soft(&fabric);
    let cfg = EngineConfig {
        max_conns: CLIENTS as u32 + 2,
        qps_per_conn: 2,
        ..EngineConfig::default()
    };
    let engine = |i: usize| -> Result<EngineHandle, String> {
        let ctx = Context::open_by_name(&verbs, &format!("soft{i}")).map_err(|e| e.to_string())?;
        Engine::new(&ctx, cfg.clone(), Clock::wall())
            .and_then(Engine::spawn)
            .map_err(err)
    };
    let (server, peer, clients) = (engine(0)?, engine(1)?, engine(2)?);
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    server.listen(listener).map_err(err)?;
    Ok(Three {
        _fabric: fabric,
        server,
        peer,
        clients,
        addr,
    })
}

fn done<T: Clone>(c: &Request<T>) -> Result<T, String> {
    c.wait_timeout(Duration::from_secs(30))
        .ok_or("a set-up did not end in 30 s")?
        .map_err(err)
}

/// `n` clients connect to the server, `at_once` in flight at a time, a batch every `gap` at
/// most; both ends' connections are returned once every one is set up.
fn connect(
    t: &Three,
    n: usize,
    at_once: usize,
    gap: Duration,
) -> Result<Vec<(ConnId, ConnId)>, String> {
    let mut pairs = Vec::with_capacity(n);
    let mut started = 0;
    while pairs.len() < n {
        let next = Instant::now() + gap;
        let batch = at_once.min(n - started);
        let dials: Vec<(Connecting, Connecting)> = (0..batch)
            .map(|_| {
                Ok((
                    t.clients.connect(t.addr).map_err(err)?,
                    t.server.incoming().map_err(err)?,
                ))
            })
            .collect::<Result<_, String>>()?;
        started += batch;
        for (c, s) in &dials {
            pairs.push((done(c)?, done(s)?));
        }
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    Ok(pairs)
}

fn close(t: &Three, pairs: &[(ConnId, ConnId)]) -> Result<(), String> {
    // The clients close; the server's ends go as the close reaches them.
    for &(c, _) in pairs {
        t.clients.close(c).map_err(err)?;
    }
    // Until both engines let go of them (the close handshake runs in their rounds).
    let end = Instant::now() + Duration::from_secs(30);
    let open = |e: &EngineHandle| e.call(|e| e.usage().connections);
    while open(&t.clients).map_err(err)? > 0 || open(&t.server).map_err(err)? > 1 {
        if Instant::now() > end {
            return Err("connections were not closed in 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// Messages from the peer to the server while `more` says so, 4 of 256 KiB in flight: Gb/s.
fn stream(
    t: &Three,
    (s, p): (ConnId, ConnId),
    bufs: &(Buffer, Buffer),
    more: impl Fn(Duration) -> bool,
) -> Result<f64, String> {
    const MSG: u64 = 256 << 10;
    const WINDOW: u64 = 4;
    let post = |k: u64| -> Result<(Request, Request), String> {
        let at = k % WINDOW * MSG;
        Ok((
            t.server.recv(s, &bufs.0, at, MSG).map_err(err)?,
            t.peer.send(p, &bufs.1, at, MSG).map_err(err)?,
        ))
    };
    let start = Instant::now();
    let mut inflight = std::collections::VecDeque::new();
    for k in 0..WINDOW {
        inflight.push_back(post(k)?);
    }
    let (mut moved, mut k) = (0u64, WINDOW);
    while let Some((r, q)) = inflight.pop_front() {
        done(&r)?;
        done(&q)?;
        moved += MSG;
        if more(start.elapsed()) {
            inflight.push_back(post(k)?);
            k += 1;
        }
    }
    Ok((moved * 8) as f64 / start.elapsed().as_nanos() as f64)
}

/// Medians over `reps` rounds, the two sides of each comparison alternating.
pub(crate) fn set_ups(reps: usize) -> Result<SetUps, String> {
    let t = three()?;
    let (mut per_s, mut gbps) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    for _ in 0..reps {
        for (k, at_once) in [1, CLIENTS].into_iter().enumerate() {
            let t0 = Instant::now();
            let pairs = connect(&t, CLIENTS, at_once, Duration::ZERO)?;
            per_s[k].push(CLIENTS as f64 / t0.elapsed().as_secs_f64());
            close(&t, &pairs)?;
        }
    }
    let link = t.peer.connect(t.addr).map_err(err)?;
    let link = (done(&t.server.incoming().map_err(err)?)?, done(&link)?);
    let bufs = (
        t.server.register(1 << 20).map_err(err)?,
        t.peer.register(1 << 20).map_err(err)?,
    );
    let phase = Duration::from_millis(1000);
    for _ in 0..reps {
        gbps[0].push(stream(&t, link, &bufs, |d| d < phase)?);
        // The clients connect while the transfer runs, which runs until they are set up.
        let connecting = std::sync::atomic::AtomicBool::new(true);
        let dials = std::thread::scope(|sc| {
            let clients = sc.spawn(|| {
                let r = connect(&t, CLIENTS, 1, phase / CLIENTS as u32);
                connecting.store(false, std::sync::atomic::Ordering::Release);
                r
            });
            let g = stream(&t, link, &bufs, |_| {
                connecting.load(std::sync::atomic::Ordering::Acquire)
            });
            (clients.join().expect("the clients' thread"), g)
        });
        let (pairs, g) = (dials.0?, dials.1?);
        gbps[1].push(g);
        close(&t, &pairs)?;
    }
    Ok(SetUps {
        per_s: per_s.map(|v| median(&v)),
        gbps: gbps.map(|v| median(&v)),
    })
}

/// Row 8: connection set-up.
pub(super) fn rows(out: &mut Out) -> Result<(), String> {
    let s = set_ups(5)?;
    let n = CLIENTS;
    let case = "in-process softnic, wall clock, engines on threads, TCP on 127.0.0.1";
    out.rows.push(Row::new(
        "8",
        format!("set-ups per second: one at a time vs **{n} at once**"),
        case,
        format!("{:.0}", s.per_s[0]),
        format!("{:.0}", s.per_s[1]),
        s.per_s[1] / s.per_s[0],
        "",
    ));
    out.rows.push(Row::new(
        "8",
        format!("transfer goodput, Gb/s: alone vs **while {n} clients connect** (100/s)"),
        case,
        format!("{:.2}", s.gbps[0]),
        format!("{:.2}", s.gbps[1]),
        s.gbps[1] / s.gbps[0],
        ">= 0.9",
    ));
    out.notes.push(format!(
        "Row 8: three engines (a server with a listener, the transfer's other end, the \
         clients'), each on a thread of its own, on one in-process fabric on the wall clock; \
         {n} connections set up and closed per round, one at a time or all in flight at once \
         (the handshakes run in the engines' rounds on non-blocking sockets, looked at every \
         16 rounds; while the engine moves data, set-ups take at most a fifth of its time); \
         the transfer streams 256 KiB messages, 4 in flight, into the server, for 1 s alone, \
         then for as long as {n} clients take to connect to the server, one every 10 ms (all \
         at once, the clients' engine takes the cores the transfer runs on: on 2 cores two \
         threads that only burn CPU as long cut it to a tenth); medians of 5 rounds."
    ));
    Ok(())
}
