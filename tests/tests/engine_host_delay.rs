//! uccl-engine on a busy host: time a thread spends away from its engine (descheduled, or
//! napping) is the host's, not the network's, and does not steer the congestion window.

use std::time::{Duration, Instant};

use uccl_engine::{Clock, Engine, EngineConfig, Mode, connect_pair};

/// A sender whose engine looks at its completions only every 2 ms (a thread that other
/// programs keep off its core) finds each ACK up to 2 ms late: more than the 50 us of
/// queueing the congestion window targets, so no RTT sample it takes steers the window (each
/// is counted as the host's), while every message still arrives. The RTT samples themselves
/// are still taken (they feed the retransmission timeout). (UC: in RC mode the NIC recovers
/// losses and the engine keeps no congestion window.)
#[test]
fn acks_an_engine_finds_late_do_not_steer_its_congestion_window() {
    let mode = Mode::Uc;
    let fabric = softnic::Fabric::new(softnic::FabricConfig {
        clock: softnic::Clock::Wall,
        ..Default::default()
    });
    let _progress = fabric.spawn_progress_thread();
    let verbs = verbs_safe::Verbs::soft(&fabric);
    let cfg = EngineConfig {
        mode,
        ..EngineConfig::default()
    };
    assert_eq!(cfg.tx.target_delay_us, 50, "the default the case is about");
    let engine = |name: &str| {
        let ctx = verbs_safe::Context::open_by_name(&verbs, name).unwrap();
        Engine::new(&ctx, cfg.clone(), Clock::wall()).unwrap()
    };
    let (mut a, mut b) = (engine("soft0"), engine("soft1"));
    let (ca, cb) = connect_pair(&mut a, &mut b).unwrap();
    let len = 1 << 20;
    let src = a.register(len).unwrap();
    let dst = b.register(len).unwrap();
    let end = Instant::now() + Duration::from_secs(60);
    for _ in 0..8 {
        let recv = b.recv(cb, &dst, 0, len as u64).unwrap();
        let send = a.send(ca, &src, 0, len as u64).unwrap();
        while !(send.is_done() && recv.is_done()) {
            assert!(Instant::now() < end, "{mode:?}: stuck");
            std::thread::sleep(Duration::from_millis(2));
            a.poll().unwrap();
            while b.poll().unwrap() {}
        }
        assert!(matches!(send.test(), Some(Ok(_))) && matches!(recv.test(), Some(Ok(_))));
    }
    let samples = a.rtt_samples().len();
    assert!(samples > 0, "{mode:?}: the ACKs gave RTT samples");
    assert_eq!(
        a.stats().host_delayed_samples,
        samples,
        "{mode:?}: every sample was found 2 ms after a look"
    );
}
