//! The threaded engine: application threads hand requests to engines running on threads of
//! their own, wait on them, and await them as futures from a small executor.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use softnic::Fabric;
use uccl_engine::{Engine, EngineConfig, EngineError, Mode, connect_pair};
use uccl_integration::exec::block_on;
use uccl_integration::pattern;

/// Two engines on a wall-clock fabric (threads drive it).
fn pair(mode: Mode) -> (Fabric, Engine, Engine) {
    uccl_integration::wall_pair(&EngineConfig {
        mode,
        qps_per_conn: 2,
        max_conns: 8,
        ..EngineConfig::default()
    })
}

#[test]
fn four_application_threads_share_each_threaded_engine() {
    const THREADS: usize = 4;
    const MSGS: usize = 50;
    const LEN: usize = 40_000;
    for mode in [Mode::Uc, Mode::Rc] {
        let (_fabric, mut a, mut b) = pair(mode);
        let conns: Vec<_> = (0..THREADS)
            .map(|_| connect_pair(&mut a, &mut b).unwrap())
            .collect();
        let (a, b) = (Arc::new(a.spawn().unwrap()), Arc::new(b.spawn().unwrap()));
        let workers: Vec<_> = conns
            .into_iter()
            .enumerate()
            .flat_map(|(t, (ca, cb))| {
                let (a, b) = (Arc::clone(&a), Arc::clone(&b));
                let sender = thread::spawn(move || {
                    let src = a.register(LEN * MSGS).unwrap();
                    let sends: Vec<_> = (0..MSGS)
                        .map(|m| {
                            let data = pattern(7, t as u64, m as u64, LEN - m);
                            src.write_at(m * LEN, &data).unwrap();
                            a.send(ca, &src, (m * LEN) as u64, (LEN - m) as u64)
                                .unwrap()
                        })
                        .collect();
                    for (m, s) in sends.iter().enumerate() {
                        assert_eq!(
                            s.wait().unwrap().len,
                            (LEN - m) as u64,
                            "{mode:?} send {t}/{m}"
                        );
                    }
                });
                let receiver = thread::spawn(move || {
                    let dst = b.register(LEN * MSGS).unwrap();
                    let recvs: Vec<_> = (0..MSGS)
                        .map(|m| b.recv(cb, &dst, (m * LEN) as u64, LEN as u64).unwrap())
                        .collect();
                    for (m, r) in recvs.iter().enumerate() {
                        assert_eq!(
                            r.wait().unwrap().len,
                            (LEN - m) as u64,
                            "{mode:?} recv {t}/{m}"
                        );
                        let mut got = vec![0u8; LEN - m];
                        dst.read_at(m * LEN, &mut got).unwrap();
                        assert!(
                            got == pattern(7, t as u64, m as u64, LEN - m),
                            "{mode:?} {t}/{m}"
                        );
                    }
                });
                [sender, receiver]
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        // Everything came back; shutting down gives the engines back.
        let a = Arc::into_inner(a).unwrap().shutdown().unwrap();
        let u = a.usage();
        assert_eq!(
            (u.wrs_in_use, u.hdrs_in_use, u.unacked),
            (0, 0, 0),
            "{mode:?} {u:?}"
        );
        assert_eq!(a.stats().messages_sent, (THREADS * MSGS) as u64);
    }
}

#[test]
fn requests_are_futures_woken_by_the_engine_thread() {
    let (_fabric, mut a, mut b) = pair(Mode::Uc);
    let (ca, cb) = connect_pair(&mut a, &mut b).unwrap();
    let (a, b) = (a.spawn().unwrap(), b.spawn().unwrap());
    let src = a.register(1 << 20).unwrap();
    let dst = b.register(1 << 20).unwrap();
    let data = pattern(8, 0, 0, 1 << 20);
    src.write_at(0, &data).unwrap();
    let (sent, got) = block_on(async {
        let recv = b.recv(cb, &dst, 0, 1 << 20).unwrap();
        let send = a.send(ca, &src, 0, 1 << 20).unwrap();
        (send.await.unwrap(), recv.await.unwrap())
    });
    assert_eq!((sent.len, got.len), (1 << 20, 1 << 20));
    let mut out = vec![0u8; 1 << 20];
    dst.read_at(0, &mut out).unwrap();
    assert!(out == data);
}

#[test]
fn a_stopped_engine_fails_what_it_still_held() {
    let (_fabric, mut a, mut b) = pair(Mode::Uc);
    let (ca, cb) = connect_pair(&mut a, &mut b).unwrap();
    let b = b.spawn().unwrap();
    let dst = b.register(4096).unwrap();
    // A receive nobody will fill: dropping the engine fails it.
    let recv = b.recv(cb, &dst, 0, 4096).unwrap();
    let engine = b.shutdown().unwrap();
    assert!(recv.test().is_none());
    drop(engine);
    assert!(matches!(
        recv.wait_timeout(Duration::from_secs(5)),
        Some(Err(EngineError::Stopped))
    ));
    // A request of a handle whose buffer is another engine's is refused at once.
    let a = a.spawn().unwrap();
    assert!(matches!(
        a.send(ca, &dst, 0, 1),
        Err(EngineError::BadRange(_))
    ));
}
