//! uccl-engine on a busy host: time a thread spends away from its engine (descheduled, or
//! napping) is the host's, not the network's, and does not steer the congestion window.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use uccl_engine::{EngineConfig, Mode, connect_pair};

/// A sender whose engine looks at its completions only every 2 ms (a thread that other
/// programs keep off its core), against a receiver on a thread of its own that acknowledges
/// at once: each ACK is found up to 2 ms after it came, more than the 50 us of queueing the
/// congestion window targets. Such samples neither teach the window the path's base delay
/// nor steer it while the host's time could change their verdict: here, none does, and each
/// is counted as the host's; every message still arrives, and every sample still feeds the
/// retransmission timeout. (UC: in RC mode the NIC recovers losses and the engine
/// keeps no congestion window.)
#[test]
fn acks_an_engine_finds_late_are_counted_as_the_hosts_time() {
    let cfg = EngineConfig {
        mode: Mode::Uc,
        ..EngineConfig::default()
    };
    assert_eq!(cfg.tx.target_delay_us, 50, "the default the case is about");
    let (_fabric, mut a, mut b) = uccl_integration::wall_pair(&cfg);
    let (ca, cb) = connect_pair(&mut a, &mut b).unwrap();
    let (len, n) = (1u64 << 20, 8u64);
    let src = a.register(len as usize).unwrap();
    let dst = b.register((n * len) as usize).unwrap();
    let recvs: Vec<_> = (0..n)
        .map(|k| b.recv(cb, &dst, k * len, len).unwrap())
        .collect();
    // The receiver polls without a pause on a thread of its own: its holds are short.
    let stop = Arc::new(AtomicBool::new(false));
    let receiver = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                b.poll().unwrap();
            }
            b
        })
    };
    let end = Instant::now() + Duration::from_secs(60);
    for _ in 0..n {
        let send = a.send(ca, &src, 0, len).unwrap();
        while !send.is_done() {
            assert!(Instant::now() < end, "stuck");
            std::thread::sleep(Duration::from_millis(2));
            a.poll().unwrap();
        }
        assert!(matches!(send.test(), Some(Ok(_))));
    }
    while !recvs.iter().all(|r| r.is_done()) {
        assert!(Instant::now() < end, "stuck");
        std::thread::sleep(Duration::from_millis(1));
    }
    stop.store(true, Ordering::Relaxed);
    let b = receiver.join().unwrap();
    assert!(recvs.iter().all(|r| matches!(r.test(), Some(Ok(_)))));
    assert_eq!(
        b.stats().host_delayed_samples,
        0,
        "the receiver sends nothing"
    );
    let samples = a.rtt_samples().len();
    assert!(samples > 0, "the ACKs gave RTT samples");
    // Every ACK was found about 2 ms after the sender's last look: no sample is free of that
    // doubt, so none teaches the path's base, and without a base none can steer the window.
    assert_eq!(
        a.stats().host_delayed_samples,
        samples,
        "every sample left out as the host's time"
    );
}
