//! The engine window, shared: connections whose peers stop acknowledging (a peer that went
//! silent, or one that holds its ACKs back on purpose after letting its window grow, reads
//! served from an export feeding it) hold only a share of the chunks an engine may have
//! unacknowledged at once, never all of them, so the engine's other connections go on
//! meanwhile instead of waiting for the silent ones to fail.

use std::time::Duration;

use softnic::Faults;
use uccl_engine::{EngineConfig, Mode};
use uccl_integration::{Sim, pattern};

const VICTIM: usize = 0;
const HONEST: usize = 1;
const SILENT: usize = 2;
/// Chunks the victim may have unacknowledged at once, over all its connections.
const WINDOW: u32 = 256;

fn cfg() -> EngineConfig {
    let mut c = EngineConfig {
        mode: Mode::Uc,
        ..EngineConfig::default()
    };
    c.tx.engine_window = WINDOW;
    // No congestion window: a flow puts its whole flow window (128 chunks) in flight at once,
    // as one whose peer let its window grow would.
    c.tx.target_delay_us = 0;
    c
}

/// Two connections to an engine that is never polled again (it acknowledges nothing) each
/// have more to write than a flow window, which together is the whole engine window; a
/// message on a third connection, to an engine that answers, completes byte-exact while the
/// silent connections are still open (they fail only after `max_silence_us`, 1 s). With the
/// window first come, first served, the silent two took all of it and the message waited for
/// them to fail.
#[test]
fn connections_whose_peers_stop_acknowledging_hold_only_a_share_of_the_engine_window() {
    let seed = 21;
    let mut sim = Sim::new(seed, 3, Faults::NONE, &cfg());
    let honest = sim.connect(VICTIM, HONEST).unwrap();
    let silent: Vec<_> = (0..2)
        .map(|_| sim.connect(VICTIM, SILENT).unwrap())
        .collect();
    const BIG: u64 = 4 << 20;
    let target = sim.engines[SILENT].register(BIG as usize).unwrap();
    let dst = sim.engines[SILENT].export(&target, 0, BIG).unwrap();
    let src = sim.engines[VICTIM].register(BIG as usize).unwrap();
    let writes: Vec<_> = (silent.iter())
        .map(|l| {
            sim.engines[VICTIM]
                .write(l.ca, &src, 0, BIG, &dst, 0)
                .unwrap()
        })
        .collect();
    // The silent flows fill their windows (the silent engine is never polled from here on).
    let end = sim.fabric.now() + Duration::from_millis(1);
    while sim.fabric.now() < end {
        sim.engines[VICTIM].poll().unwrap();
        sim.advance_to_next(Some(Duration::from_micros(1)));
    }
    let len = 64 << 10;
    let data = pattern(seed, 1, 0, len);
    let msg = sim.engines[VICTIM].register(len).unwrap();
    msg.write_at(0, &data).unwrap();
    let into = sim.engines[HONEST].register(len).unwrap();
    let recv = sim.engines[HONEST]
        .recv(honest.cb, &into, 0, len as u64)
        .unwrap();
    let send = sim.engines[VICTIM]
        .send(honest.ca, &msg, 0, len as u64)
        .unwrap();
    let end = sim.fabric.now() + Duration::from_secs(3);
    while !(send.is_done() && recv.is_done()) && sim.fabric.now() < end {
        sim.engines[VICTIM].poll().unwrap();
        sim.engines[HONEST].poll().unwrap();
        sim.advance_to_next(Some(Duration::from_micros(1)));
    }
    assert!(
        send.is_done() && recv.is_done(),
        "seed {seed}: the honest message never completed"
    );
    assert!(
        (silent.iter()).all(|l| sim.engines[VICTIM].is_open(l.ca)),
        "seed {seed}: the honest message waited for the silent connections to fail \
         (their writes: {:?})",
        writes.iter().map(|w| w.test()).collect::<Vec<_>>()
    );
    assert!(writes.iter().all(|w| !w.is_done()));
    assert_eq!(recv.test().unwrap().map(|d| d.len).ok(), Some(len as u64));
    let mut got = vec![0u8; len];
    into.read_at(0, &mut got).unwrap();
    assert!(
        got == data,
        "seed {seed}: the honest message arrived changed"
    );
}
