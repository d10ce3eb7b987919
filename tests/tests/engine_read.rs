//! One-sided reads ([`Engine::read`], [`Engine::read_v`]) and notified writes, UC and RC: every
//! byte exactly where it belongs under loss, reordering and duplication; what may not be read
//! fails with why and moves nothing; a note never arrives before its data.

use std::time::Duration;

use softnic::Faults;
use uccl_engine::{Access, Block, Buffer, Descriptor, EngineError, Mode, Opts, Request};
use uccl_integration::misuse::{finish, pair, small_config};
use uccl_integration::{Sim, pattern};

const KIB: u64 = 1024;
const MIB: u64 = 1 << 20;

fn faults(p: f64) -> Faults {
    Faults {
        loss: p,
        reorder: p,
        duplicate: p,
        ..Faults::NONE
    }
}

fn bytes(buf: &Buffer, at: u64, len: u64) -> Vec<u8> {
    let mut got = vec![0u8; len as usize];
    buf.read_at(at as usize, &mut got).unwrap();
    got
}

fn ok(sim: &mut Sim, reqs: &[&Request]) {
    finish(sim, 60, reqs).unwrap_or_else(|e| panic!("{e}"));
    for r in reqs {
        let r = r.test().expect("done");
        assert!(r.is_ok(), "seed {}: {r:?}", sim.seed);
    }
}

/// A sim of two engines in `mode` under `f` faults, connected.
fn faulty_pair(
    seed: u64,
    mode: Mode,
    f: Faults,
) -> (Sim, uccl_engine::ConnId, uccl_engine::ConnId) {
    let cfg = small_config(mode);
    let mut sim = Sim::new(seed, 2, f, &cfg);
    let link = sim.connect(0, 1).unwrap();
    (sim, link.ca, link.cb)
}

/// Reads of 0 B to 8 MiB land byte-exact, with the guard bytes around them untouched, under
/// 5% loss, reordering and duplication; the exporter's memory is unchanged.
#[test]
fn reads_of_every_size_land_exactly_once_under_faults() {
    for mode in [Mode::Uc, Mode::Rc] {
        let (mut sim, ca, _cb) = faulty_pair(7, mode, faults(0.05));
        let size = 8 * MIB + 2 * 4 * KIB;
        let src = sim.engines[1].register(size as usize).unwrap();
        src.write_at(0, &pattern(1, 0, 0, size as usize)).unwrap();
        let d = sim.engines[1]
            .export_with(&src, 4 * KIB, 8 * MIB, Access::READ)
            .unwrap();
        let dst = sim.engines[0].register(size as usize).unwrap();
        for len in [0, 1, 4 * KIB - 1, 64 * KIB, 300 * KIB, 8 * MIB] {
            let guard = vec![0xeeu8; size as usize];
            dst.write_at(0, &guard).unwrap();
            let from = (8 * MIB - len) / 3;
            let r = sim.engines[0]
                .read(ca, &dst, 4 * KIB, &d, from, len)
                .unwrap();
            ok(&mut sim, &[&r]);
            assert_eq!(r.test().unwrap().unwrap().len, len, "{mode:?}");
            assert_eq!(
                bytes(&dst, 4 * KIB, len),
                bytes(&src, 4 * KIB + from, len),
                "{mode:?} {len}"
            );
            assert!(
                bytes(&dst, 0, 4 * KIB).iter().all(|&b| b == 0xee),
                "{mode:?} {len}"
            );
            let after = 4 * KIB + len;
            assert!(
                bytes(&dst, after, size - after).iter().all(|&b| b == 0xee),
                "{mode:?} {len}: guard bytes after the read"
            );
        }
        assert_eq!(bytes(&src, 0, size), pattern(1, 0, 0, size as usize));
    }
}

/// A read outside the export, of a write-only export, or after withdrawal fails with why,
/// and no byte moves.
#[test]
fn a_read_of_what_was_not_offered_fails_and_moves_nothing() {
    for mode in [Mode::Uc, Mode::Rc] {
        let (mut sim, ca, _cb) = pair(3, &small_config(mode));
        let src = sim.engines[1].register(64 * KIB as usize).unwrap();
        src.write_at(0, &[7u8; 64 * 1024]).unwrap();
        let dst = sim.engines[0].register(64 * KIB as usize).unwrap();
        let readable = sim.engines[1]
            .export_with(&src, 0, 32 * KIB, Access::READ)
            .unwrap();
        let write_only = sim.engines[1].export(&src, 32 * KIB, 32 * KIB).unwrap();
        // Outside the export: refused at once.
        let e = sim.engines[0]
            .read(ca, &dst, 0, &readable, 16 * KIB, 32 * KIB)
            .unwrap_err();
        assert!(matches!(e, EngineError::BadRange(_)), "{mode:?}: {e}");
        // A write-only export: refused at once.
        let e = sim.engines[0]
            .read(ca, &dst, 0, &write_only, 0, 4 * KIB)
            .unwrap_err();
        assert!(matches!(e, EngineError::NotGranted { .. }), "{mode:?}: {e}");
        // A forged descriptor claiming READ for the write-only export: the owner refuses.
        let forged = Descriptor {
            access: Access::READ_WRITE,
            ..write_only
        };
        let r = sim.engines[0]
            .read(ca, &dst, 0, &forged, 0, 4 * KIB)
            .unwrap();
        finish(&mut sim, 10, &[&r]).unwrap();
        let e = r.test().unwrap().unwrap_err();
        match mode {
            Mode::Uc => assert!(matches!(e, EngineError::ReadRefused(_)), "{e}"),
            Mode::Rc => assert!(e.to_string().contains("remote access"), "{e}"),
        }
        assert!(
            bytes(&dst, 0, 64 * KIB).iter().all(|&b| b == 0),
            "{mode:?}: nothing moved"
        );
        if mode == Mode::Uc {
            // The connection goes on; a withdrawn export is refused too.
            sim.engines[1].withdraw_export(&readable).unwrap();
            let r = sim.engines[0]
                .read(ca, &dst, 0, &readable, 0, 4 * KIB)
                .unwrap();
            finish(&mut sim, 10, &[&r]).unwrap();
            let e = r.test().unwrap().unwrap_err();
            assert!(matches!(e, EngineError::ReadRefused(_)), "{e}");
            assert!(bytes(&dst, 0, 64 * KIB).iter().all(|&b| b == 0));
            assert_eq!(sim.engines[1].stats().reads_refused, 2);
        }
    }
}

/// A vectored read and a vectored write of 4096 blocks of scattered 1 KiB pieces complete once
/// each, every block in place.
#[test]
fn vectored_transfers_of_4096_blocks_complete_once_with_every_block_in_place() {
    for mode in [Mode::Uc, Mode::Rc] {
        let (mut sim, ca, _cb) = faulty_pair(11, mode, faults(0.02));
        let n = 4096u64;
        let blk = KIB;
        let len = 2 * n * blk;
        let theirs = sim.engines[1].register(len as usize).unwrap();
        theirs.write_at(0, &pattern(2, 0, 0, len as usize)).unwrap();
        let d = sim.engines[1]
            .export_with(&theirs, 0, len, Access::READ_WRITE)
            .unwrap();
        let mine = sim.engines[0].register(len as usize).unwrap();
        mine.write_at(0, &pattern(3, 0, 0, len as usize)).unwrap();
        // Block k: local slot k * 2 + 1 from remote slot (n - 1 - k) * 2.
        let blocks: Vec<Block> = (0..n)
            .map(|k| Block {
                buf: mine.clone(),
                offset: (2 * k + 1) * blk,
                remote: d,
                remote_offset: 2 * (n - 1 - k) * blk,
                len: blk,
            })
            .collect();
        let r = sim.engines[0].read_v(ca, &blocks).unwrap();
        ok(&mut sim, &[&r]);
        assert_eq!(r.test().unwrap().unwrap().len, n * blk);
        for b in &blocks {
            assert_eq!(
                bytes(&mine, b.offset, blk),
                bytes(&theirs, b.remote_offset, blk),
                "{mode:?}"
            );
        }
        // Write the odd local slots into the odd remote slots, with a note.
        let blocks: Vec<Block> = (0..n)
            .map(|k| Block {
                buf: mine.clone(),
                offset: (2 * k + 1) * blk,
                remote: d,
                remote_offset: (2 * k + 1) * blk,
                len: blk,
            })
            .collect();
        let notes = sim.engines[1].notifications();
        let opts = Opts::default().note(b"all 4096 blocks").unwrap();
        let w = sim.engines[0].write_v_with(ca, &blocks, opts).unwrap();
        let limit = sim.fabric.now() + Duration::from_secs(60);
        let mut seen = None;
        sim.run(limit, |_| {
            if seen.is_none()
                && let Some(n) = notes.pop()
            {
                // The note is never ahead of its data.
                for b in &blocks {
                    assert_eq!(
                        bytes(&theirs, b.remote_offset, blk),
                        bytes(&mine, b.offset, blk)
                    );
                }
                seen = Some(n);
            }
            w.is_done() && seen.is_some()
        })
        .unwrap();
        assert_eq!(seen.unwrap().data, b"all 4096 blocks");
        assert!(w.test().unwrap().is_ok());
    }
}

/// Reads, vectored reads and noted writes leave nothing behind: with some in flight when the
/// connection is closed (they fail, with why), every slot, credit, reservation, send-queue
/// slot left to RDMA READs, buffer and export comes back.
#[test]
fn reads_in_flight_at_a_close_fail_and_everything_comes_back() {
    use uccl_integration::workload::{Link, back_to_baseline, close_all, memory_back_to_baseline};
    for mode in [Mode::Uc, Mode::Rc] {
        let cfg = small_config(mode);
        let mut sim = Sim::new(5, 2, faults(0.02), &cfg);
        let link: Link = sim.connect(0, 1).unwrap();
        let (ca, cb) = (link.ca, link.cb);
        let theirs = sim.engines[1].register(4 * MIB as usize).unwrap();
        let d = sim.engines[1]
            .export_with(&theirs, 0, 4 * MIB, Access::READ_WRITE)
            .unwrap();
        let mine = sim.engines[0].register(4 * MIB as usize).unwrap();
        // Some complete...
        let r = sim.engines[0].read(ca, &mine, 0, &d, 0, MIB).unwrap();
        let blocks: Vec<Block> = (0..64)
            .map(|k| Block {
                buf: mine.clone(),
                offset: MIB + k * 4 * KIB,
                remote: d,
                remote_offset: 2 * MIB + k * 8 * KIB,
                len: 4 * KIB,
            })
            .collect();
        let rv = sim.engines[0].read_v(ca, &blocks).unwrap();
        let opts = Opts::default().note(b"x").unwrap();
        let w = sim.engines[0]
            .write_with(ca, &mine, 0, 64 * KIB, &d, 3 * MIB, opts)
            .unwrap();
        ok(&mut sim, &[&r, &rv, &w]);
        // ...and some are in flight when the peer closes.
        let late = sim.engines[0].read(ca, &mine, 0, &d, 0, 4 * MIB).unwrap();
        let late_v = sim.engines[0].read_v(ca, &blocks).unwrap();
        sim.engines[0].poll().unwrap();
        sim.engines[1].close(cb).unwrap();
        finish(&mut sim, 30, &[&late, &late_v]).unwrap();
        for l in [&late, &late_v] {
            // Either it made it before the close, or it failed saying the connection did.
            if let Err(e) = l.test().unwrap() {
                assert!(
                    matches!(e, EngineError::ConnectionFailed { .. }),
                    "{mode:?}: {e}"
                );
            }
        }
        close_all(&mut sim, &[link], Duration::from_secs(30)).unwrap();
        sim.engines[1].withdraw_export(&d).unwrap();
        drop((mine, theirs, blocks));
        for i in 0..2 {
            sim.engines[i].poll().unwrap();
            assert!(
                back_to_baseline(&sim, i),
                "{mode:?} engine {i}: {:?}",
                sim.engines[i].usage()
            );
            assert!(
                memory_back_to_baseline(&sim, i),
                "{mode:?} engine {i}: {:?}",
                sim.engines[i].usage()
            );
        }
        let notes = sim.engines[1].notifications();
        assert_eq!(notes.pop().map(|n| n.data), Some(b"x".to_vec()));
    }
}

/// UC: an export withdrawn while its owner serves reads of it refuses those whose bytes have
/// not started out (`ReadRefused`) and lets the started ones end byte-exact; both ends go on.
/// The owner's connections that serve no read are not looked at (a withdrawal costs the same
/// with many connections as with none: bench row 7), and the one that served is looked at
/// again for the next withdrawal while it serves.
#[test]
fn withdrawing_an_export_refuses_the_reads_of_it_not_started_yet() {
    let (mut sim, ca, cb) = pair(5, &small_config(Mode::Uc));
    let idle = sim.connect(0, 1).unwrap();
    let size = 8 * MIB as usize;
    let src = sim.engines[1].register(size).unwrap();
    let want = pattern(9, 0, 0, size);
    src.write_at(0, &want).unwrap();
    let dst = sim.engines[0].register(size).unwrap();
    let piece = 256 * KIB;
    let reads = |sim: &mut Sim, d: &Descriptor, n: u64| -> Vec<Request> {
        (0..n)
            .map(|i| sim.engines[0].read(ca, &dst, i * piece, d, i * piece, piece))
            .collect::<Result<_, _>>()
            .unwrap()
    };
    for round in 0..2 {
        let d = sim.engines[1]
            .export_with(&src, 0, size as u64, Access::READ)
            .unwrap();
        let rs = reads(&mut sim, &d, 32);
        // Until the owner serves all of them: the last ones wait behind the first.
        let served = sim.engines[1].stats().reads_served;
        let limit = sim.fabric.now() + Duration::from_secs(5);
        sim.run(limit, |s| s.engines[1].stats().reads_served == served + 32)
            .unwrap();
        sim.engines[1].withdraw_export(&d).unwrap();
        let refs: Vec<&Request> = rs.iter().collect();
        finish(&mut sim, 30, &refs).unwrap();
        let mut refused = 0;
        for (i, r) in rs.iter().enumerate() {
            match r.test().unwrap() {
                Ok(done) => {
                    assert_eq!(done.len, piece, "round {round}, read {i}");
                    let at = i * piece as usize;
                    assert!(
                        bytes(&dst, at as u64, piece) == want[at..at + piece as usize],
                        "round {round}, read {i}: its bytes"
                    );
                }
                Err(EngineError::ReadRefused(_)) => refused += 1,
                Err(e) => panic!("round {round}, read {i}: {e}"),
            }
        }
        assert!(refused > 0, "round {round}: no read was refused");
        assert!(sim.engines[0].is_open(ca) && sim.engines[1].is_open(cb));
        assert!(sim.engines[0].is_open(idle.ca), "round {round}");
    }
}
