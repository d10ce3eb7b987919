//! The loop the docs show, and nothing else: polling the engines until the requests end, on
//! `softnic::Fabric::default()` (a virtual clock that moves by itself). With every packet of
//! a moment lost, nothing is pending on the fabric and only the engines' own timers can
//! recover: the clock must reach them without a driver that moves it (the engines' alarms).

use softnic::{Fabric, Faults};
use uccl_engine::{Clock, Engine, EngineConfig, Mode, connect_pair};
use verbs_safe::{Context, Verbs};

/// Two engines in `mode` on a default fabric with `loss`, connected: 8 messages of 1 MiB
/// each way by the documented loop alone, checked byte for byte. Fails (rather than hangs)
/// if the loop polls a million times without a message ending.
fn documented_loop(mode: Mode, loss: f64) {
    let fabric = Fabric::default();
    let verbs = Verbs::soft(&fabric);
    let clock = Clock::Fabric(fabric.clone());
    let cfg = EngineConfig {
        mode,
        ..EngineConfig::default()
    };
    let open = |name| Context::open_by_name(&verbs, name).unwrap();
    let mut a = Engine::new(&open("soft0"), cfg.clone(), clock.clone()).unwrap();
    let mut b = Engine::new(&open("soft1"), cfg, clock).unwrap();
    let (ca, cb) = connect_pair(&mut a, &mut b).unwrap();
    fabric.set_default_faults(Faults::loss(loss)).unwrap();
    const LEN: usize = 1 << 20;
    let (sa, da) = (a.register(LEN).unwrap(), a.register(LEN).unwrap());
    let (sb, db) = (b.register(LEN).unwrap(), b.register(LEN).unwrap());
    for i in 0..8u8 {
        let bytes: Vec<u8> = (0..LEN).map(|k| (k as u8).wrapping_mul(31) ^ i).collect();
        sa.write_at(0, &bytes).unwrap();
        sb.write_at(0, &bytes).unwrap();
        let reqs = [
            b.recv(cb, &db, 0, LEN as u64).unwrap(),
            a.recv(ca, &da, 0, LEN as u64).unwrap(),
            a.send(ca, &sa, 0, LEN as u64).unwrap(),
            b.send(cb, &sb, 0, LEN as u64).unwrap(),
        ];
        let mut polls = 0u32;
        while reqs.iter().any(|r| r.test().is_none()) {
            a.poll().unwrap();
            b.poll().unwrap();
            polls += 1;
            assert!(
                polls < 1_000_000,
                "message {i} stuck at {} ns: a's next deadline {:?}, the fabric's next event \
                 {:?}",
                fabric.now_ns(),
                a.next_deadline(),
                fabric.next_event()
            );
        }
        for r in &reqs {
            assert!(r.test().unwrap().is_ok(), "message {i}: {:?}", r.test());
        }
        let mut got = vec![0u8; LEN];
        for d in [&da, &db] {
            d.read_at(0, &mut got).unwrap();
            assert!(got == bytes, "message {i}: bytes differ");
        }
    }
}

#[test]
fn the_documented_loop_recovers_losses_on_uc() {
    documented_loop(Mode::Uc, 0.05);
}

#[test]
fn the_documented_loop_recovers_losses_on_rc() {
    documented_loop(Mode::Rc, 0.05);
}

#[test]
fn the_documented_loop_runs_lossless() {
    documented_loop(Mode::Uc, 0.0);
}
