//! Connection set-up over TCP (`Engine::accept` / `Engine::connect`), as two processes do it:
//! the handshake carries QP numbers, PSNs, GIDs, the control QP and a version/feature word;
//! a mismatched or absent peer fails cleanly on both ends.

use std::net::TcpListener;
use std::thread;
use std::time::Duration;

use softnic::{Clock as FabricClock, Fabric, FabricConfig};
use uccl_engine::{Clock, Engine, EngineConfig, EngineError, Mode};
use uccl_integration::pattern;
use verbs_safe::{Context, Verbs};

fn engines(modes: [Mode; 2]) -> (Fabric, Engine, Engine) {
    engines_of(modes, |_| {})
}

/// Two UC engines as [`engines`] makes them, their configuration changed by `tweak`.
fn engines_with(tweak: impl Fn(&mut EngineConfig)) -> (Fabric, Engine, Engine) {
    engines_of([Mode::Uc, Mode::Uc], tweak)
}

fn engines_of(modes: [Mode; 2], tweak: impl Fn(&mut EngineConfig)) -> (Fabric, Engine, Engine) {
    let fabric = Fabric::new(FabricConfig {
        devices: 2,
        clock: FabricClock::Wall,
        ..Default::default()
    });
    let verbs = Verbs::soft(&fabric);
    let engine = |i: usize| {
        let ctx = Context::open_by_name(&verbs, &format!("soft{i}")).unwrap();
        let mut cfg = EngineConfig {
            mode: modes[i],
            qps_per_conn: 2,
            max_conns: 4,
            ..EngineConfig::default()
        };
        tweak(&mut cfg);
        Engine::new(&ctx, cfg, Clock::Fabric(fabric.clone())).unwrap()
    };
    let (a, b) = (engine(0), engine(1));
    (fabric, a, b)
}

/// Runs `accept` on a thread and `connect` here; returns both results and both engines.
#[allow(clippy::type_complexity)]
fn handshake(
    mut a: Engine,
    mut b: Engine,
) -> (
    Result<uccl_engine::ConnId, EngineError>,
    Result<uccl_engine::ConnId, EngineError>,
    Engine,
    Engine,
) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = thread::spawn(move || {
        let r = a.accept(&listener).and_then(|c| a.wait(&c));
        (r, a)
    });
    let rb = b.connect(addr).and_then(|c| b.wait(&c));
    let (ra, a) = server.join().unwrap();
    (ra, rb, a, b)
}

#[test]
fn engines_connected_over_tcp_move_messages_both_ways() {
    for mode in [Mode::Uc, Mode::Rc] {
        let (_fabric, a, b) = engines([mode, mode]);
        let (ra, rb, a, b) = handshake(a, b);
        let (ca, cb) = (ra.unwrap(), rb.unwrap());
        let (a, b) = (a.spawn().unwrap(), b.spawn().unwrap());
        let len = 300_000;
        let (sa, da) = (a.register(len).unwrap(), a.register(len).unwrap());
        let (sb, db) = (b.register(len).unwrap(), b.register(len).unwrap());
        sa.write_at(0, &pattern(5, 0, 0, len)).unwrap();
        sb.write_at(0, &pattern(5, 1, 0, len)).unwrap();
        let r1 = b.recv(cb, &db, 0, len as u64).unwrap();
        let r2 = a.recv(ca, &da, 0, len as u64).unwrap();
        let s1 = a.send(ca, &sa, 0, len as u64).unwrap();
        let s2 = b.send(cb, &sb, 0, len as u64).unwrap();
        for r in [&r1, &r2, &s1, &s2] {
            let done = r.wait_timeout(Duration::from_secs(20));
            assert_eq!(done.unwrap().unwrap().len, len as u64, "{mode:?}");
        }
        let mut got = vec![0u8; len];
        db.read_at(0, &mut got).unwrap();
        assert!(got == pattern(5, 0, 0, len), "{mode:?}: a to b");
        da.read_at(0, &mut got).unwrap();
        assert!(got == pattern(5, 1, 0, len), "{mode:?}: b to a");
    }
}

#[test]
fn a_peer_of_the_other_mode_is_refused_on_both_ends() {
    let (_fabric, a, b) = engines([Mode::Uc, Mode::Rc]);
    let (ra, rb, a, b) = handshake(a, b);
    for r in [ra, rb] {
        match r {
            Err(EngineError::Handshake { reason, .. }) => {
                assert!(
                    reason.contains("RC") || reason.contains("ready"),
                    "says why: {reason}"
                )
            }
            other => panic!("expected a handshake error, got {other:?}"),
        }
    }
    // Nothing is left behind: no connection, no reservation.
    for e in [&a, &b] {
        let u = e.usage();
        assert_eq!((u.connections, u.send_cq_reserved), (0, 0), "{u:?}");
    }
}

#[test]
fn connecting_to_nobody_is_an_error_that_names_the_address() {
    let (_fabric, _a, mut b) = engines([Mode::Uc, Mode::Uc]);
    // A port that was just free: nothing listens there.
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    match b.connect(addr).and_then(|c| b.wait(&c)) {
        Err(EngineError::Handshake { reason, .. }) => {
            assert!(reason.contains(&addr.to_string()), "{reason}")
        }
        other => panic!("expected a handshake error, got {other:?}"),
    }
    // Garbage from the other end is refused too.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let junk = thread::spawn(move || {
        use std::io::Write;
        let (mut s, _) = listener.accept().unwrap();
        let _ = s.write_all(&[0xab; 200]);
        thread::sleep(Duration::from_millis(100));
    });
    assert!(matches!(
        b.connect(addr).and_then(|c| b.wait(&c)),
        Err(EngineError::Handshake { .. })
    ));
    junk.join().unwrap();
    assert_eq!(b.usage().connections, 0);
}

/// Runs `b`'s `connect` to a server that does `serve` with the TCP connection; returns why
/// the connect failed.
fn connect_to(b: &mut Engine, serve: impl FnOnce(std::net::TcpStream) + Send + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = thread::spawn(move || serve(listener.accept().unwrap().0));
    let r = b.connect(addr).and_then(|c| b.wait(&c));
    server.join().unwrap();
    assert_eq!(b.handshakes(), 0, "the attempt is gone");
    assert_eq!(b.usage().connections, 0, "nothing is left behind");
    match r {
        Err(EngineError::Handshake { reason, .. }) => reason,
        other => panic!("expected a handshake error, got {other:?}"),
    }
}

/// Every way a set-up fails says which, and at which step: refused, the peer closing, another
/// version, the deadline (with the bytes it had).
#[test]
fn a_failed_set_up_says_why_and_at_which_step() {
    use std::io::{Read, Write};
    let (fabric, _a, mut b) = engines([Mode::Uc, Mode::Uc]);
    // Refused: nothing listens.
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let refused = match b.connect(addr).and_then(|c| b.wait(&c)) {
        Err(EngineError::Handshake { reason, .. }) => reason,
        other => panic!("{other:?}"),
    };
    assert!(
        refused.contains("refused") && refused.contains(&addr.to_string()),
        "{refused}"
    );
    // The peer closes before answering.
    let closed = connect_to(&mut b, |mut s| {
        let mut hello = [0u8; 64];
        let _ = s.read(&mut hello);
    });
    assert!(
        closed.contains("closed the connection")
            && closed.contains("while reading the peer's handshake (0 of"),
        "{closed}"
    );
    // A uccl-rs engine of another version: its fixed part says so.
    let version = connect_to(&mut b, |mut s| {
        let mut hello = [0u8; 512];
        let n = s.read(&mut hello).unwrap();
        hello[7] ^= 0x10; // the version with bit 4 flipped
        let _ = s.write_all(&hello[..n]);
        let _ = s.read(&mut hello);
    });
    let number_after = |what: &str| -> u16 {
        let at = version.find(what).unwrap_or_else(|| panic!("{version}")) + what.len();
        let digits: String = version[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().unwrap_or_else(|_| panic!("{version}"))
    };
    assert_eq!(
        number_after("speaks version "),
        number_after("this engine ") ^ 0x10,
        "{version}"
    );
    // Silence: the deadline, at the step it was at, with the bytes it had.
    let cfg = EngineConfig {
        handshake_timeout_ms: 300,
        ..b.config().clone()
    };
    let ctx = Context::open_by_name(&Verbs::soft(&fabric), "soft0").unwrap();
    let mut c = Engine::new(&ctx, cfg, Clock::Fabric(fabric.clone())).unwrap();
    let silent = connect_to(&mut c, |mut s| {
        let _ = s.write_all(b"UCC");
        thread::sleep(Duration::from_millis(600));
    });
    assert!(
        silent.contains("timed out after 300 ms reading the peer's handshake (3 of"),
        "{silent}"
    );
}

/// A listener handed to the engine: clients that send garbage or nothing fail alone (and say
/// why through `incoming_failures`), the engine's `incoming` handles get the real ones, in
/// order.
#[test]
fn a_listening_engine_sets_up_real_clients_and_refuses_the_others() {
    use std::io::Write;
    let (_fabric, mut a, mut b) = engines([Mode::Uc, Mode::Uc]);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    a.listen(listener).unwrap();
    let mut junk = std::net::TcpStream::connect(addr).unwrap();
    junk.write_all(&[0xab; 200]).unwrap();
    let first = a.incoming().unwrap();
    let c1 = b.connect(addr).unwrap();
    let c2 = b.connect(addr).unwrap();
    let second = a.incoming().unwrap();
    let all = [&first, &second, &c1, &c2];
    let end = std::time::Instant::now() + Duration::from_secs(20);
    while !all.iter().all(|r| r.is_done()) {
        assert!(std::time::Instant::now() < end, "not set up");
        a.poll().unwrap();
        b.poll().unwrap();
    }
    for r in all {
        r.test().unwrap().unwrap();
    }
    let why = a.incoming_failures();
    assert_eq!(why.len(), 1, "{why:?}");
    assert!(
        why[0].to_string().contains("not a uccl-rs engine"),
        "{}",
        why[0]
    );
    assert_eq!(a.stats().handshakes_failed, 1);
    assert_eq!(a.usage().connections, 2);
}

/// Clients that connect and say nothing fill every handshake slot of a listener (64): a real
/// client that comes after them is set up all the same, in the slot of the one that has been
/// silent longest (for a second at least), which fails saying why. Before, the real client
/// waited for the silent ones to time out (here after a minute), and its own attempt did.
#[test]
fn clients_that_say_nothing_cannot_keep_a_real_one_out() {
    let (_fabric, mut a, mut b) = engines_with(|c| c.handshake_timeout_ms = 60_000);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    a.listen(listener).unwrap();
    let silent: Vec<_> = (0..64)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    // The listener takes them all, and they stay silent for over a second.
    let quiet_until = std::time::Instant::now() + Duration::from_millis(1200);
    while std::time::Instant::now() < quiet_until {
        a.poll().unwrap();
        thread::sleep(Duration::from_millis(1));
    }
    let first = a.incoming().unwrap();
    let c = b.connect(addr).unwrap();
    let end = std::time::Instant::now() + Duration::from_secs(20);
    while !(first.is_done() && c.is_done()) {
        assert!(
            std::time::Instant::now() < end,
            "the real client was kept out: {:?}",
            a.incoming_failures()
        );
        a.poll().unwrap();
        b.poll().unwrap();
    }
    first.test().unwrap().unwrap();
    c.test().unwrap().unwrap();
    let why = a.incoming_failures();
    assert!(
        why.iter().any(|e| e.to_string().contains("pushed out")),
        "{why:?}"
    );
    drop(silent);
}

/// A connection the caller accepted itself is set up by `accept_stream`, beside one of a
/// client that says nothing (which holds only its own handshake, and fails alone at the
/// deadline, saying so); one that sends garbage fails at once, naming why.
#[test]
fn connections_the_caller_accepted_are_set_up_alone() {
    use std::io::Write;
    let (_fabric, mut a, mut b) = engines_with(|c| c.handshake_timeout_ms = 2_500);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let take = |a: &mut Engine| {
        let (s, peer) = listener.accept().unwrap();
        a.accept_stream(s, peer).unwrap()
    };
    let _silent_client = std::net::TcpStream::connect(addr).unwrap();
    let silent = take(&mut a);
    let mut junk_client = std::net::TcpStream::connect(addr).unwrap();
    junk_client.write_all(&[0xab; 200]).unwrap();
    let junk = take(&mut a);
    let c = b.connect(addr).unwrap();
    let real = take(&mut a);
    settle(&mut a, &mut b, &[&silent, &junk, &real, &c]);
    let ca = real.test().unwrap().unwrap();
    c.test().unwrap().unwrap();
    assert!(a.is_open(ca));
    let why = junk.test().unwrap().unwrap_err().to_string();
    assert!(why.contains("not a uccl-rs engine"), "{why}");
    let why = silent.test().unwrap().unwrap_err().to_string();
    assert!(why.contains("timed out"), "{why}");
    assert_eq!(a.usage().connections, 1);
}

/// Polls both engines until every handle is done (20 s at most).
fn settle(a: &mut Engine, b: &mut Engine, handles: &[&uccl_engine::Connecting]) {
    let end = std::time::Instant::now() + Duration::from_secs(20);
    while !handles.iter().all(|r| r.is_done()) {
        assert!(std::time::Instant::now() < end, "not set up");
        a.poll().unwrap();
        b.poll().unwrap();
    }
}

/// A client that resets its connection while it waits in the listener's backlog (a
/// connect-and-RST scan): the caller accepts a connection that has no peer any more
/// (`getpeername` fails), and its handshake fails alone, naming the address `accept` gave;
/// the next client is set up.
#[test]
fn a_connection_reset_before_it_was_accepted_fails_alone() {
    let (_fabric, mut a, mut b) = engines([Mode::Uc, Mode::Uc]);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let scan = std::net::TcpStream::connect(addr).unwrap();
    rustix::net::sockopt::set_socket_linger(&scan, Some(Duration::ZERO)).unwrap();
    drop(scan);
    thread::sleep(Duration::from_millis(50));
    let (s, scanner) = listener.accept().unwrap();
    assert!(
        s.peer_addr().is_err(),
        "the scan's connection was not reset"
    );
    let reset = a.accept_stream(s, scanner).unwrap();
    let c = b.connect(addr).unwrap();
    let (s, peer) = listener.accept().unwrap();
    let real = a.accept_stream(s, peer).unwrap();
    settle(&mut a, &mut b, &[&reset, &real, &c]);
    let why = reset.test().unwrap().unwrap_err().to_string();
    assert!(why.contains(&scanner.to_string()), "{why}");
    real.test().unwrap().unwrap();
    c.test().unwrap().unwrap();
}

/// A set-up given up with `abandon` fails with `Cancelled` and lets go of what it held: a
/// caller-accepted handshake its socket (the client sees it close), a one-shot accept its
/// listener (the next client is the caller's), a handle waiting for the listener's next
/// connection its turn, a connect its attempt. A completed one is left alone.
#[test]
fn abandoned_set_ups_fail_and_let_go_of_what_they_held() {
    use std::io::Read;
    let (_fabric, mut a, mut b) = engines([Mode::Uc, Mode::Uc]);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let cancelled =
        |r: &uccl_engine::Connecting| matches!(r.test(), Some(Err(EngineError::Cancelled)));

    let mut silent = std::net::TcpStream::connect(addr).unwrap();
    let (s, peer) = listener.accept().unwrap();
    let taken = a.accept_stream(s, peer).unwrap();
    a.poll().unwrap();
    assert_eq!(a.handshakes(), 1);
    assert!(a.abandon(&taken));
    assert!(cancelled(&taken), "{:?}", taken.test());
    assert_eq!(a.handshakes(), 0);
    silent
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(silent.read(&mut [0u8; 64]).unwrap(), 0, "still open");
    assert!(!a.abandon(&taken), "abandoned twice");

    let once = a.accept(&listener).unwrap();
    assert!(a.abandon(&once));
    assert!(cancelled(&once));
    let _next = std::net::TcpStream::connect(addr).unwrap();
    for _ in 0..100 {
        a.poll().unwrap();
    }
    listener.set_nonblocking(true).unwrap();
    assert!(
        listener.accept().is_ok(),
        "the abandoned accept took the next client"
    );
    listener.set_nonblocking(false).unwrap();

    let served = TcpListener::bind("127.0.0.1:0").unwrap();
    a.listen(served.try_clone().unwrap()).unwrap();
    let given_up = a.incoming().unwrap();
    let second = a.incoming().unwrap();
    assert!(a.abandon(&given_up));
    let c = b.connect(served.local_addr().unwrap()).unwrap();
    settle(&mut a, &mut b, &[&second, &c]);
    assert!(cancelled(&given_up));
    second.test().unwrap().unwrap();

    let nobody = TcpListener::bind("127.0.0.1:0").unwrap();
    let dial = b.connect(nobody.local_addr().unwrap()).unwrap();
    b.poll().unwrap();
    assert!(!a.abandon(&dial), "another engine's set-up was abandoned");
    assert!(!dial.is_done());
    assert!(b.abandon(&dial));
    assert!(cancelled(&dial));
    assert_eq!(b.handshakes(), 0);
    assert!(!b.abandon(&c), "a completed set-up was abandoned");
    c.test().unwrap().unwrap();
}

/// A set-up abandoned after its client sent its handshake, once it holds a connection (its
/// QPs created, the engine waiting for the client to be ready): the connection goes, and
/// the client's goes with it (its handshake fails, or its connection is closed). Until the
/// client spoke, `peer_spoke` says it had not.
#[test]
fn a_set_up_abandoned_after_its_client_spoke_lets_go_of_its_connection() {
    let (_fabric, mut a, mut b) = engines([Mode::Uc, Mode::Uc]);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = b.connect(listener.local_addr().unwrap()).unwrap();
    let (s, peer) = listener.accept().unwrap();
    let t = a.accept_stream(s, peer).unwrap();
    assert!(!a.peer_spoke(&t), "the client has not been polled yet");
    let end = std::time::Instant::now() + Duration::from_secs(20);
    // The client is polled only until its handshake is in: it never says it is ready.
    while !a.peer_spoke(&t) {
        assert!(std::time::Instant::now() < end, "the client never spoke");
        b.poll().unwrap();
        a.poll().unwrap();
    }
    while a.usage().connections == 0 {
        assert!(std::time::Instant::now() < end, "no connection was made");
        a.poll().unwrap();
    }
    assert!(!t.is_done());
    assert!(a.abandon(&t));
    assert!(!a.peer_spoke(&t), "an abandoned set-up is not in flight");
    assert!(matches!(t.test(), Some(Err(EngineError::Cancelled))));
    // The client's handshake fails, or (this end's ready byte was sent before it was
    // abandoned) completes and its connection is closed by this end.
    while !c.is_done() || a.usage().connections > 0 || b.usage().connections > 0 {
        assert!(
            std::time::Instant::now() < end,
            "{:?} {:?} {:?}",
            c.test(),
            a.usage(),
            b.usage()
        );
        a.poll().unwrap();
        b.poll().unwrap();
    }
    if let Ok(conn) = c.test().unwrap() {
        assert!(!b.is_open(conn));
    }
}
