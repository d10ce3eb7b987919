//! Requests never wait forever: an RC write whose bytes the peer's NIC took but whose ACK never
//! came (the peer died in between) fails through the keep-alive; a threaded engine whose thread
//! dies fails what it held and refuses what comes after.

use std::time::Duration;

use softnic::Faults;
use uccl_engine::{EngineConfig, EngineError, Mode, connect_pair};
use uccl_integration::Sim;

#[test]
fn an_rc_write_acked_by_the_nic_but_not_by_a_dead_peer_fails() {
    let cfg = EngineConfig {
        mode: Mode::Rc,
        qps_per_conn: 1,
        ..EngineConfig::default()
    };
    let mut sim = Sim::new(61, 2, Faults::NONE, &cfg);
    let [a, b] = &mut sim.engines[..] else {
        unreachable!()
    };
    let (ca, _cb) = connect_pair(a, b).unwrap();
    let src = a.register(4096).unwrap();
    let dst = b.register(4096).unwrap();
    let desc = b.export(&dst, 0, 4096).unwrap();
    b.poll().unwrap(); // its SRQ is filled: the NIC can take the chunk
    let w = sim.engines[0].write(ca, &src, 0, 4096, &desc, 0).unwrap();
    // Only the writer runs: the peer's NIC takes the bytes, its engine never ACKs them.
    for _ in 0..200 {
        sim.engines[0].poll().unwrap();
        if let Some(t) = sim.fabric.next_event() {
            let now = sim.fabric.now();
            sim.fabric
                .advance(t.saturating_sub(now).max(Duration::from_nanos(1)));
        }
    }
    assert!(w.test().is_none(), "no software ACK came");
    assert_eq!(
        sim.fabric.in_flight(),
        0,
        "the NIC took the bytes: nothing is on the wire"
    );
    // The peer dies.
    drop(sim.engines.remove(1));
    sim.run(Duration::from_secs(10), |_| w.test().is_some())
        .unwrap();
    assert!(matches!(w.test(), Some(Err(_))), "{:?}", w.test());
}

#[test]
fn a_threaded_engine_whose_thread_dies_fails_everything_and_refuses_more() {
    let cfg = EngineConfig::default();
    let mut sim = Sim::new(62, 2, Faults::NONE, &cfg);
    let [a, b] = &mut sim.engines[..] else {
        unreachable!()
    };
    let (_ca, cb) = connect_pair(a, b).unwrap();
    let b = sim.engines.remove(1).spawn().unwrap();
    let dst = b.register(4096).unwrap();
    let waiting = b.recv(cb, &dst, 0, 4096).unwrap();
    // A control-path call that panics takes the engine thread down.
    assert!(matches!(
        b.call(|_| panic!("a bug")),
        Err(EngineError::Stopped)
    ));
    assert!(matches!(
        waiting.wait_timeout(Duration::from_secs(10)),
        Some(Err(EngineError::Stopped))
    ));
    match b.recv(cb, &dst, 0, 4096) {
        Err(EngineError::Stopped) => {}
        Ok(r) => assert!(matches!(
            r.wait_timeout(Duration::from_secs(10)),
            Some(Err(EngineError::Stopped))
        )),
        Err(e) => panic!("{e}"),
    }
    assert!(matches!(b.register(10), Err(EngineError::Stopped)));
}
