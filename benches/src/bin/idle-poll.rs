//! Polls an idle engine N times (the first argument; 100 000 by default): two engines on
//! `softnic::Fabric::default()` (the virtual clock, each poll of an empty CQ moving time to
//! the next event, as the engine's and softnic's own examples and most users' tests run), one
//! connection between them, nothing in flight. Bench row 13 counts its instructions with
//! callgrind at N = 0 and N = 100 000: what a poll costs an engine that waits for work.

use uccl_engine::{Clock, Engine, EngineConfig, connect_pair};
use verbs_safe::{Context, Verbs};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let polls: u64 = match std::env::args().nth(1) {
        Some(n) => n.parse().map_err(|e| format!("polls: {n:?}: {e}"))?,
        None => 100_000,
    };
    let fabric = softnic::Fabric::default();
    let verbs = Verbs::soft(&fabric);
    let clock = Clock::Fabric(fabric.clone());
    let open = |name| Context::open_by_name(&verbs, name);
    let mut a = Engine::new(&open("soft0")?, EngineConfig::default(), clock.clone())?;
    let mut b = Engine::new(&open("soft1")?, EngineConfig::default(), clock)?;
    let _conns = connect_pair(&mut a, &mut b)?;
    // What the connection left in flight (its first ACKs and advertisements) settles.
    for _ in 0..10_000 {
        if !(a.poll()? | b.poll()?) {
            break;
        }
    }
    for _ in 0..polls {
        a.poll()?;
    }
    Ok(())
}
