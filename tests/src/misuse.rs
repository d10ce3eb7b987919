//! What the tests of uccl-engine's misuse share (`tests/tests/engine_misuse*.rs`): a
//! wall-clock guard that turns a hang into a failure, a small engine configuration, a
//! connected pair of engines on a virtual-time fabric, and a run until requests complete.

use std::any::Any;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use softnic::Faults;
use uccl_engine::{ConnId, EngineConfig, Mode, Request};

use crate::Sim;

/// Runs `f` on a thread of its own and fails (as a HANG) if it has not returned after `secs`
/// seconds of wall time; a panic in `f` is raised again here. A hang guard only: give it
/// ample room (tests run in parallel on small CI machines), never a performance threshold.
pub fn guard<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        let r = f();
        let _ = tx.send(());
        r
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("HANG: the probe did not return within {secs} s of wall time")
        }
        // `f` panicked: the sender went without a message.
        Err(mpsc::RecvTimeoutError::Disconnected) => match h.join() {
            Ok(r) => r,
            Err(p) => std::panic::resume_unwind(p),
        },
    }
}

/// The engine configuration the misuse tests start from: `mode`, two QPs a connection, at
/// most 8 connections, the rest the default.
pub fn small_config(mode: Mode) -> EngineConfig {
    EngineConfig {
        mode,
        qps_per_conn: 2,
        max_conns: 8,
        ..EngineConfig::default()
    }
}

/// Two engines built as `cfg` on a fabric without faults, seeded `seed`, connected: the
/// simulation, engine 0's id of the connection and engine 1's.
pub fn pair(seed: u64, cfg: &EngineConfig) -> (Sim, ConnId, ConnId) {
    let mut sim = Sim::new(seed, 2, Faults::NONE, cfg);
    let link = sim.connect(0, 1).unwrap_or_else(|e| panic!("{e}"));
    (sim, link.ca, link.cb)
}

/// Whether every request of `reqs` has completed.
pub fn all_done(reqs: &[&Request]) -> bool {
    reqs.iter().all(|r| r.is_done())
}

/// Runs `sim` until every request of `reqs` has completed, for at most `secs` seconds of
/// virtual time (then the error names the seed).
pub fn finish(sim: &mut Sim, secs: u64, reqs: &[&Request]) -> Result<(), String> {
    let limit = sim.fabric.now() + Duration::from_secs(secs);
    sim.run(limit, |_| all_done(reqs))
}

/// The message of a panic caught by `catch_unwind` (or a placeholder if it is not text).
pub fn panic_msg(p: Box<dyn Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "<a panic that is not text>".into())
}
