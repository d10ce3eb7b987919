//! Memory given back: a buffer registered, used (sends, receives, exports, writes, and UC
//! retransmissions under loss) and deregistered returns its memory; nothing the engine keeps
//! grows with the buffers that went or the connections that came and went; a buffer given back
//! with work in flight refuses new work, lets that work finish byte-exact, and only then goes.

use std::time::Duration;

use softnic::Faults;
use uccl_engine::{Buffer, EngineConfig, EngineError, Mode, RecvKeys, Request};
use uccl_integration::workload::{back_to_baseline, memory_back_to_baseline, usage_table};
use uccl_integration::{Sim, pattern};

const MIB: usize = 1 << 20;

/// Resident memory of this process, in bytes (`/proc/self/statm`: pages, the second field).
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("resident pages");
    pages * 4096
}

/// Fills all of `buf` with bytes (so every page is resident), a 1 MiB pattern over and over.
fn touch(buf: &Buffer, seed: u64) {
    let block = pattern(seed, 0, 0, MIB);
    for at in (0..buf.len()).step_by(MIB) {
        let n = MIB.min(buf.len() - at);
        buf.write_at(at, &block[..n]).unwrap();
    }
}

fn run_until(sim: &mut Sim, reqs: &[&Request]) {
    let limit = sim.fabric.now() + Duration::from_secs(30);
    sim.run(limit, |_| reqs.iter().all(|r| r.is_done()))
        .unwrap_or_else(|e| panic!("{e}\n{}", usage_table(sim)));
    for r in reqs {
        let r = r.test().expect("done");
        assert!(r.is_ok(), "seed {}: {r:?}", sim.seed);
    }
}

fn read(buf: &Buffer, at: usize, len: usize) -> Vec<u8> {
    let mut got = vec![0u8; len];
    buf.read_at(at, &mut got).unwrap();
    got
}

/// The soak, in CI's size: 64 MiB buffers registered, used and deregistered 64 times
/// over (4 GiB in all, each page written), under 5% loss on UC: resident memory ends within 64
/// MiB of where it started, and every buffer, export, pin, peer, pool and credit is back.
/// Before, the engine kept every buffer registered (and pinned on every QP) for its life.
#[test]
fn registering_and_giving_back_64_mib_64_times_returns_the_memory() {
    for mode in [Mode::Uc, Mode::Rc] {
        let cfg = EngineConfig {
            mode,
            qps_per_conn: 2,
            max_conns: 4,
            ..EngineConfig::default()
        };
        let seed = 41 + mode as u64;
        let loss = Faults {
            loss: 0.05,
            ..Faults::NONE
        };
        let mut sim = Sim::new(seed, 2, loss, &cfg);
        let l = sim.connect(0, 1).unwrap();
        let before = rss();
        let len = 64 * MIB;
        let msg = 256 << 10;
        for round in 0..64u64 {
            let src = sim.engines[0].register(len).unwrap();
            let dst = sim.engines[1].register(len).unwrap();
            touch(&src, seed ^ round);
            touch(&dst, 0);
            // A send into a receive at the end of the buffers, a write into an export at
            // their start.
            let end = (len - msg) as u64;
            let recv = sim.engines[1].recv(l.cb, &dst, end, msg as u64).unwrap();
            let send = sim.engines[0].send(l.ca, &src, end, msg as u64).unwrap();
            let d = sim.engines[1].export(&dst, 0, msg as u64).unwrap();
            let write = sim.engines[0]
                .write(l.ca, &src, 0, msg as u64, &d, 0)
                .unwrap();
            run_until(&mut sim, &[&recv, &send, &write]);
            for (at, what) in [(len - msg, "send"), (0, "write")] {
                let ok = read(&dst, at, msg) == read(&src, at, msg);
                assert!(
                    ok,
                    "{mode:?}, seed {seed}, round {round}: the {what}'s bytes differ"
                );
            }
            sim.engines[0].deregister(&src).unwrap();
            sim.engines[1].deregister(&dst).unwrap();
            drop((src, dst));
        }
        // Give the last WRs' completions (and their retirements) a round.
        sim.run(sim.fabric.now() + Duration::from_secs(5), |s| {
            (0..2).all(|i| memory_back_to_baseline(s, i))
        })
        .unwrap_or_else(|e| panic!("{mode:?}: {e}\n{}", usage_table(&sim)));
        let grown = rss().saturating_sub(before);
        assert!(
            grown < 64 * MIB as u64,
            "{mode:?}, seed {seed}: resident memory grew by {} MiB over 64 rounds of 2 x 64 MiB",
            grown >> 20
        );
        for i in 0..2 {
            sim.engines[i].close(if i == 0 { l.ca } else { l.cb }).ok();
        }
        let limit = sim.fabric.now() + Duration::from_secs(5);
        sim.run(limit, |s| (0..2).all(|i| back_to_baseline(s, i)))
            .unwrap_or_else(|e| panic!("{mode:?}: {e}\n{}", usage_table(&sim)));
    }
}

/// A buffer given back with a send, a receive and a write in flight: new work is refused with
/// `Deregistered` at once, the work in flight completes byte-exact, and only then is the
/// buffer unpinned and gone.
#[test]
fn a_buffer_given_back_with_work_in_flight_finishes_it_and_refuses_more() {
    for (mode, keys) in [
        (Mode::Uc, RecvKeys::Window),
        (Mode::Rc, RecvKeys::Window),
        (Mode::Uc, RecvKeys::Buffer),
    ] {
        let cfg = EngineConfig {
            mode,
            recv_keys: keys,
            ..EngineConfig::default()
        };
        let mut sim = Sim::new(9, 2, Faults::NONE, &cfg);
        let l = sim.connect(0, 1).unwrap();
        let (src, dst) = (
            sim.engines[0].register(4 * MIB).unwrap(),
            sim.engines[1].register(4 * MIB).unwrap(),
        );
        touch(&src, 5);
        let d = sim.engines[1]
            .export(&dst, 2 * MIB as u64, MIB as u64)
            .unwrap();
        let recv = sim.engines[1].recv(l.cb, &dst, 0, MIB as u64).unwrap();
        let send = sim.engines[0].send(l.ca, &src, 0, MIB as u64).unwrap();
        let write = sim.engines[0]
            .write(l.ca, &src, MIB as u64, MIB as u64, &d, 0)
            .unwrap();
        // One round: the work is posted, not done.
        for e in &mut sim.engines {
            e.poll().unwrap();
        }
        assert!(
            !send.is_done() && !recv.is_done(),
            "{mode:?}: done too soon"
        );
        sim.engines[0].deregister(&src).unwrap();
        let again = sim.engines[0].deregister(&src).unwrap_err();
        assert!(
            matches!(again, EngineError::Deregistered(id) if id == src.id()),
            "{again}"
        );
        for refused in [
            sim.engines[0].send(l.ca, &src, 0, 8).map(|_| ()),
            sim.engines[0].recv(l.ca, &src, 0, 8).map(|_| ()),
            sim.engines[0].write(l.ca, &src, 0, 8, &d, 0).map(|_| ()),
            sim.engines[0].export(&src, 0, 8).map(|_| ()),
        ] {
            let e = refused.unwrap_err();
            assert!(matches!(e, EngineError::Deregistered(_)), "{mode:?}: {e}");
            assert!(e.to_string().contains("given back"), "{e}");
        }
        let u = sim.engines[0].usage();
        assert_eq!((u.buffers, u.pinned), (0, 2), "{mode:?}: in use still");
        run_until(&mut sim, &[&recv, &send, &write]);
        let want = read(&src, 0, 2 * MIB);
        assert!(
            read(&dst, 0, MIB) == want[..MIB],
            "{mode:?}: the send's bytes"
        );
        assert!(
            read(&dst, 2 * MIB, MIB) == want[MIB..],
            "{mode:?}: the write's bytes"
        );
        // Its requests done, the buffer is unpinned (the table lets go once its WRs are).
        let limit = sim.fabric.now() + Duration::from_secs(1);
        sim.run(limit, |s| memory_back_to_baseline(s, 0))
            .unwrap_or_else(|e| panic!("{mode:?}: {e}\n{}", usage_table(&sim)));
        // The receiving side: deregistering withdraws the export (a write through it is
        // refused before it leaves: the descriptor is checked at the sender only by range, so
        // it fails at the peer), and the buffer goes.
        sim.engines[1].deregister(&dst).unwrap();
        assert_eq!(sim.engines[1].usage().exports, 0);
        let e = sim.engines[1].withdraw_export(&d).unwrap_err();
        assert!(matches!(e, EngineError::NoExport(x) if x == d), "{e}");
        sim.run(sim.fabric.now() + Duration::from_secs(1), |s| {
            memory_back_to_baseline(s, 1)
        })
        .unwrap();
    }
}

/// Dropping a buffer's last handle gives it back too, but its exports keep it (a peer holding
/// the descriptor may still write it) until they are withdrawn; a stale handle's id never
/// names the buffer that takes its slot.
#[test]
fn the_last_handle_gives_a_buffer_back_once_its_exports_are_withdrawn() {
    let mut sim = Sim::new(3, 2, Faults::NONE, &EngineConfig::default());
    let l = sim.connect(0, 1).unwrap();
    let dst = sim.engines[1].register(MIB).unwrap();
    let d = sim.engines[1].export(&dst, 0, 4096).unwrap();
    let old_id = dst.id();
    drop(dst);
    sim.engines[1].poll().unwrap();
    assert_eq!(sim.engines[1].usage().buffers, 0, "given back");
    assert_eq!(sim.engines[1].usage().pinned, 2, "kept by its export");
    // The export still works.
    let src = sim.engines[0].register(4096).unwrap();
    touch(&src, 1);
    let w = sim.engines[0].write(l.ca, &src, 0, 4096, &d, 0).unwrap();
    run_until(&mut sim, &[&w]);
    sim.engines[1].withdraw_export(&d).unwrap();
    sim.run(sim.fabric.now() + Duration::from_secs(1), |s| {
        memory_back_to_baseline(s, 1)
    })
    .unwrap();
    // The slot is reused; the old id is not the new buffer's.
    let fresh = sim.engines[1].register(MIB).unwrap();
    assert_ne!(fresh.id(), old_id);
}

/// Connections that come and go leave nothing behind: one pin per buffer whatever the number
/// of connections (registering pins once, not once per QP), and the peer table holds one peer
/// per distinct peer engine of the connections held, none once they are gone.
#[test]
fn connections_that_come_and_go_leave_no_pins_or_peers_behind() {
    let cfg = EngineConfig {
        max_conns: 8,
        ..EngineConfig::default()
    };
    let mut sim = Sim::new(17, 3, Faults::NONE, &cfg);
    let bufs: Vec<Buffer> = (0..10)
        .map(|_| sim.engines[0].register(64 << 10).unwrap())
        .collect();
    let pinned = sim.engines[0].usage().pinned;
    assert_eq!(pinned, 1 + bufs.len(), "the headers and one pin per buffer");
    for round in 0..40 {
        let peer = 1 + round % 2;
        let l = sim.connect(0, peer).unwrap();
        let l2 = sim.connect(0, peer).unwrap();
        let u = sim.engines[0].usage();
        assert_eq!((u.pinned, u.peers), (pinned, 1), "round {round}");
        let src = sim.engines[peer].register(4096).unwrap();
        let recv = sim.engines[0]
            .recv(l.ca, &bufs[round % 10], 0, 4096)
            .unwrap();
        let send = sim.engines[peer].send(l.cb, &src, 0, 4096).unwrap();
        run_until(&mut sim, &[&recv, &send]);
        for (e, c) in [(0, l.ca), (0, l2.ca)] {
            sim.engines[e].close(c).unwrap();
        }
        let limit = sim.fabric.now() + Duration::from_secs(5);
        sim.run(limit, |s| (0..3).all(|i| back_to_baseline(s, i)))
            .unwrap_or_else(|e| panic!("round {round}: {e}\n{}", usage_table(&sim)));
    }
    assert_eq!(sim.engines[0].usage().pinned, pinned);
}
