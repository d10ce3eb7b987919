//! Vectored transfers ([`Engine::write_v`], [`Engine::read_v`]) and notes ([`Opts::note`]),
//! UC and RC: scattered blocks land byte-exact and exactly once under loss, reordering and
//! duplication, and nothing outside them is touched; a bad block fails the whole list, names
//! itself, and moves nothing; a note is delivered after its data, in order with the
//! connection's other deliveries, and never for a write withdrawn; the threaded handle does the
//! same, and its requests are futures.

use std::thread;
use std::time::{Duration, Instant};

use softnic::{Fabric, Faults};
use uccl_engine::{
    Access, Block, Buffer, ConnId, Descriptor, Done, Engine, EngineConfig, EngineError,
    EngineHandle, Mode, Notification, Notifications, Opts, Request, connect_pair,
};
use uccl_integration::exec::block_on;
use uccl_integration::misuse::{finish, pair, small_config};
use uccl_integration::workload::quiet;
use uccl_integration::{Sim, pattern};

const KIB: u64 = 1024;
const MIB: u64 = 1 << 20;
/// What every byte no transfer may touch holds.
const GUARD: u8 = 0xee;

/// Loss, reordering (a reordered packet is held back up to 20 us, so that later ones really
/// overtake it) and duplication, each with probability `p`.
fn faults(p: f64) -> Faults {
    Faults {
        loss: p,
        reorder: p,
        duplicate: p,
        reorder_delay_ns: 20_000,
        ..Faults::NONE
    }
}

/// A sim of two engines in `mode` under `f` faults, connected.
fn faulty_pair(seed: u64, mode: Mode, f: Faults) -> (Sim, ConnId, ConnId) {
    let cfg = small_config(mode);
    let mut sim = Sim::new(seed, 2, f, &cfg);
    let link = sim.connect(0, 1).unwrap_or_else(|e| panic!("{e}"));
    (sim, link.ca, link.cb)
}

fn bytes(buf: &Buffer, at: u64, len: u64) -> Vec<u8> {
    let mut got = vec![0u8; len as usize];
    buf.read_at(at as usize, &mut got).unwrap();
    got
}

fn all(buf: &Buffer) -> Vec<u8> {
    bytes(buf, 0, buf.len() as u64)
}

/// Panics unless `got == want`, naming the first wrong byte (not printing megabytes).
fn same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(at) = got.iter().zip(want).position(|(g, w)| g != w) {
        let wrong = got[at..]
            .iter()
            .zip(&want[at..])
            .filter(|(g, w)| g != w)
            .count();
        panic!(
            "{what}: byte {at} is {:#04x}, not {:#04x} ({wrong} wrong bytes from there on)",
            got[at], want[at]
        );
    }
}

/// A seeded xorshift generator.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

/// Places blocks of `lens` in one buffer: in a random order, each after a random gap of guard
/// bytes (none a quarter of the time, so blocks also touch), with guard bytes before the first
/// and after the last. Each block's offset, and the buffer's length.
fn place(rng: &mut Rng, lens: &[u64]) -> (Vec<u64>, u64) {
    let mut order: Vec<usize> = (0..lens.len()).collect();
    rng.shuffle(&mut order);
    let mut at = vec![0; lens.len()];
    let mut end = 1 + rng.below(4096);
    for &i in &order {
        at[i] = end;
        end += lens[i];
        if rng.below(4) != 0 {
            end += 1 + rng.below(600);
        }
    }
    (at, end + 1 + rng.below(4096))
}

/// Blocks scattered over two buffers, independently on each side.
struct Scatter {
    lens: Vec<u64>,
    local: Vec<u64>,
    remote: Vec<u64>,
    local_len: u64,
    remote_len: u64,
}

impl Scatter {
    /// `n` blocks of random sizes in `0..=64 KiB` (the edges 0, 1 and 64 KiB among them when
    /// there are enough blocks), block `big` (if any) 8 MiB.
    fn new(seed: u64, n: usize, big: Option<usize>) -> Scatter {
        let mut rng = Rng::new(seed);
        let mut lens: Vec<u64> = (0..n).map(|_| rng.below(64 * KIB + 1)).collect();
        if n >= 8 {
            lens[1] = 0;
            lens[2] = 1;
            lens[4] = 64 * KIB;
        }
        if let Some(b) = big {
            lens[b] = 8 * MIB;
        }
        let (local, local_len) = place(&mut rng, &lens);
        let (remote, remote_len) = place(&mut rng, &lens);
        Scatter {
            lens,
            local,
            remote,
            local_len,
            remote_len,
        }
    }

    fn total(&self) -> u64 {
        self.lens.iter().sum()
    }

    fn blocks(&self, buf: &Buffer, remote: Descriptor) -> Vec<Block> {
        (0..self.lens.len())
            .map(|i| Block {
                buf: buf.clone(),
                offset: self.local[i],
                remote,
                remote_offset: self.remote[i],
                len: self.lens[i],
            })
            .collect()
    }

    /// `dst` (as it was) with every block copied in from `src`; `write`: from local to remote
    /// places, else from remote to local.
    fn expect(&self, dst: &[u8], src: &[u8], write: bool) -> Vec<u8> {
        let mut want = dst.to_vec();
        for i in 0..self.lens.len() {
            let (from, to) = match write {
                true => (self.local[i], self.remote[i]),
                false => (self.remote[i], self.local[i]),
            };
            let (from, to, len) = (from as usize, to as usize, self.lens[i] as usize);
            want[to..to + len].copy_from_slice(&src[from..from + len]);
        }
        want
    }
}

/// Runs `sim` until `req` completes (60 s of virtual time at most), then `check`s: nothing ran
/// since the round that completed it, so `check` sees the buffers as they were then. The
/// result.
fn on_completion(sim: &mut Sim, req: &Request, check: impl FnOnce()) -> Result<Done, EngineError> {
    finish(sim, 60, &[req]).unwrap_or_else(|e| panic!("{e}"));
    check();
    req.test().expect("done")
}

/// Runs `sim` for `d` of virtual time, calling `each` before every round.
fn run_for(sim: &mut Sim, d: Duration, mut each: impl FnMut(&mut Sim)) {
    let until = sim.fabric.now() + d;
    loop {
        each(sim);
        let mut busy = false;
        for e in &mut sim.engines {
            busy |= e.poll().unwrap();
        }
        if busy {
            continue;
        }
        let now = sim.fabric.now();
        if now >= until {
            return;
        }
        let next = sim
            .engines
            .iter()
            .filter_map(Engine::next_deadline)
            .map(Duration::from_nanos)
            .chain(sim.fabric.next_event())
            .min()
            .unwrap_or(until)
            .clamp(now + Duration::from_nanos(1), until);
        sim.fabric.advance(next - now);
    }
}

/// Every note waiting.
fn drain_notes(n: &Notifications) -> Vec<Notification> {
    std::iter::from_fn(|| n.pop()).collect()
}

/// 1, 7 (one of 8 MiB), 64 and 1024 blocks of 0 to 64 KiB, scattered in random orders and
/// with random gaps over both buffers, written with `write_v` and read back with `read_v` under
/// 5% loss, reordering and duplication: each request completes once with the sum of its
/// blocks' lengths, with every block byte-exact in place at that moment and every other byte
/// of the destination (guard bytes) and of the source as it was; the target counts each block
/// once (writes received, bytes read); and nothing lands afterwards (the destination,
/// overwritten once the request completed, stays as overwritten).
#[test]
fn scattered_blocks_are_written_and_read_exactly_once_under_faults() {
    for mode in [Mode::Uc, Mode::Rc] {
        let (mut sim, ca, _cb) = faulty_pair(21, mode, faults(0.05));
        let cases = [(1, None), (7, Some(3)), (64, None), (1024, None)];
        for (case, (n, big)) in cases.into_iter().enumerate() {
            let case = case as u64;
            let what = format!("{mode:?}, {n} blocks");
            let s = Scatter::new(100 + case, n, big);
            let total = s.total();
            let mine = sim.engines[0].register(s.local_len as usize).unwrap();
            let theirs = sim.engines[1].register(s.remote_len as usize).unwrap();
            let d = sim.engines[1]
                .export_with(&theirs, 0, s.remote_len, Access::READ_WRITE)
                .unwrap();
            let blocks = s.blocks(&mine, d);

            // write_v: mine's blocks into theirs.
            let src = pattern(7, case, 0, s.local_len as usize);
            mine.write_at(0, &src).unwrap();
            let dst = vec![GUARD; s.remote_len as usize];
            theirs.write_at(0, &dst).unwrap();
            let want = s.expect(&dst, &src, true);
            let before = sim.engines[1].stats();
            let w = sim.engines[0].write_v(ca, &blocks).unwrap();
            let done = on_completion(&mut sim, &w, || {
                same(&all(&theirs), &want, &format!("{what}: write_v, target"));
                same(&all(&mine), &src, &format!("{what}: write_v, source"));
            });
            assert_eq!(done.unwrap().len, total, "{what}: write_v");
            let after = sim.engines[1].stats();
            assert_eq!(
                after.writes_received - before.writes_received,
                n as u64,
                "{what}: each block received once"
            );
            // Nothing lands once it completed (no late duplicate, no stray retransmission).
            let over = vec![0x11u8; s.remote_len as usize];
            theirs.write_at(0, &over).unwrap();
            run_for(&mut sim, Duration::from_millis(2), |_| {});
            same(&all(&theirs), &over, &format!("{what}: after write_v"));
            assert_eq!(
                sim.engines[1].stats().writes_received,
                after.writes_received
            );

            // read_v: theirs's blocks into mine.
            let src = pattern(8, case, 0, s.remote_len as usize);
            theirs.write_at(0, &src).unwrap();
            let dst = vec![GUARD; s.local_len as usize];
            mine.write_at(0, &dst).unwrap();
            let want = s.expect(&dst, &src, false);
            let (r0, r1) = (sim.engines[0].stats(), sim.engines[1].stats());
            let r = sim.engines[0].read_v(ca, &blocks).unwrap();
            let done = on_completion(&mut sim, &r, || {
                same(&all(&mine), &want, &format!("{what}: read_v, reader"));
                same(&all(&theirs), &src, &format!("{what}: read_v, export"));
            });
            assert_eq!(done.unwrap().len, total, "{what}: read_v");
            let (a0, a1) = (sim.engines[0].stats(), sim.engines[1].stats());
            assert_eq!(
                a0.bytes_read - r0.bytes_read,
                total,
                "{what}: bytes read once"
            );
            if mode == Mode::Uc {
                assert_eq!(
                    a1.reads_served - r1.reads_served,
                    n as u64,
                    "{what}: each block served once"
                );
            }
            let over = vec![0x22u8; s.local_len as usize];
            mine.write_at(0, &over).unwrap();
            run_for(&mut sim, Duration::from_millis(2), |_| {});
            same(&all(&mine), &over, &format!("{what}: after read_v"));
            assert_eq!(sim.engines[0].stats().bytes_read, a0.bytes_read);
            // Given back: a stale READ request still on the wire must not fail the connection
            // (RC re-issues READs late; see
            // withdrawing_an_export_just_read_leaves_the_connection_usable).
            sim.engines[1].withdraw_export(&d).unwrap();
            sim.engines[0].deregister(&mine).unwrap();
            sim.engines[1].deregister(&theirs).unwrap();
        }
        assert!(sim.engines[0].is_open(ca), "{mode:?}");
    }
}

/// Whether `e` is `EngineError::Block` naming block 5, for the reason `why` accepts.
fn names_block_5(e: &EngineError, why: impl Fn(&EngineError) -> bool) -> bool {
    matches!(e, EngineError::Block { index: 5, error } if why(error))
}

/// A list whose block 5 is bad fails the call with `EngineError::Block { index: 5 }` and the
/// reason: a range past its export or past its local buffer (`BadRange`), an export without the
/// right (`NotGranted`: write-only for `read_v`, read-only for `write_v`), a buffer given back
/// (`Deregistered`), a buffer of the other engine. Nothing moves (blocks 0 to 4 neither), no
/// request is left behind, and the connection goes on. An empty `write_v` completes at once.
#[test]
fn a_bad_block_fails_the_whole_list_naming_it_and_nothing_moves() {
    for mode in [Mode::Uc, Mode::Rc] {
        let (mut sim, ca, _cb) = pair(5, &small_config(mode));
        let mine = sim.engines[0].register(256 * KIB as usize).unwrap();
        let theirs = sim.engines[1].register(256 * KIB as usize).unwrap();
        let (m0, t0) = (
            pattern(1, 0, 0, 256 * KIB as usize),
            pattern(2, 0, 0, 256 * KIB as usize),
        );
        mine.write_at(0, &m0).unwrap();
        theirs.write_at(0, &t0).unwrap();
        let rw = sim.engines[1]
            .export_with(&theirs, 0, 128 * KIB, Access::READ_WRITE)
            .unwrap();
        let write_only = sim.engines[1]
            .export_with(&theirs, 128 * KIB, 64 * KIB, Access::WRITE)
            .unwrap();
        let read_only = sim.engines[1]
            .export_with(&theirs, 192 * KIB, 64 * KIB, Access::READ)
            .unwrap();
        let gone = sim.engines[0].register(8 * KIB as usize).unwrap();
        sim.engines[0].deregister(&gone).unwrap();
        let foreign = sim.engines[1].register(8 * KIB as usize).unwrap();
        let good = |k: u64| Block {
            buf: mine.clone(),
            offset: k * 16 * KIB,
            remote: rw,
            remote_offset: (7 - k) * 16 * KIB,
            len: 4 * KIB + k,
        };
        let with5 = |b: Block| -> Vec<Block> {
            let mut v: Vec<Block> = (0..8).map(good).collect();
            v[5] = b;
            v
        };
        let (s0, s1) = (sim.engines[0].stats(), sim.engines[1].stats());
        let bad_range = |e: &EngineError| matches!(e, EngineError::BadRange(_));
        let gone_id = gone.id();
        let deregistered =
            |e: &EngineError| matches!(e, EngineError::Deregistered(id) if *id == gone_id);
        let needs = |a: Access| move |e: &EngineError| matches!(e, EngineError::NotGranted { needs, .. } if *needs == a);
        type Why<'a> = Box<dyn Fn(&EngineError) -> bool + 'a>;
        // (what, block 5, refused by write_v, refused by read_v, why)
        let cases: Vec<(&str, Block, bool, bool, Why)> = vec![
            (
                "past its export",
                Block {
                    remote_offset: 126 * KIB,
                    ..good(5)
                },
                true,
                true,
                Box::new(bad_range),
            ),
            (
                "past its local buffer",
                Block {
                    offset: 254 * KIB,
                    ..good(5)
                },
                true,
                true,
                Box::new(bad_range),
            ),
            (
                "of a write-only export",
                Block {
                    remote: write_only,
                    remote_offset: 0,
                    ..good(5)
                },
                false,
                true,
                Box::new(needs(Access::READ)),
            ),
            (
                "of a read-only export",
                Block {
                    remote: read_only,
                    remote_offset: 0,
                    ..good(5)
                },
                true,
                false,
                Box::new(needs(Access::WRITE)),
            ),
            (
                "of a buffer given back",
                Block {
                    buf: gone.clone(),
                    offset: 0,
                    ..good(5)
                },
                true,
                true,
                Box::new(deregistered),
            ),
            (
                "of the other engine's buffer",
                Block {
                    buf: foreign.clone(),
                    offset: 0,
                    ..good(5)
                },
                true,
                true,
                Box::new(bad_range),
            ),
        ];
        for (what, b5, write, read, why) in &cases {
            let list = with5(b5.clone());
            for (op, refused) in [("write_v", *write), ("read_v", *read)] {
                if !refused {
                    continue;
                }
                let r = match op {
                    "write_v" => sim.engines[0].write_v(ca, &list),
                    _ => sim.engines[0].read_v(ca, &list),
                };
                match r {
                    Err(e) => assert!(
                        names_block_5(&e, why),
                        "{mode:?} {op}, block 5 {what}: {e:?}"
                    ),
                    Ok(_) => panic!("{mode:?} {op}, block 5 {what}: accepted"),
                }
            }
        }
        // The first bad block is the one named.
        let mut list = with5(Block {
            remote_offset: 126 * KIB,
            ..good(5)
        });
        list[6].offset = 255 * KIB;
        let e = sim.engines[0].write_v(ca, &list).unwrap_err();
        assert!(names_block_5(&e, bad_range), "{mode:?}: {e:?}");
        // Nothing moved, nothing was sent, nothing waits.
        run_for(&mut sim, Duration::from_millis(5), |_| {});
        for (i, e) in sim.engines.iter().enumerate() {
            let u = e.usage();
            assert!(quiet(&u), "{mode:?}: engine {i} holds {u:?}");
        }
        same(&all(&mine), &m0, &format!("{mode:?}: the reader's buffer"));
        same(
            &all(&theirs),
            &t0,
            &format!("{mode:?}: the target's buffer"),
        );
        let (a0, a1) = (sim.engines[0].stats(), sim.engines[1].stats());
        assert_eq!(
            (a0.messages_sent, a0.read_wrs, a0.bytes_read),
            (s0.messages_sent, s0.read_wrs, s0.bytes_read),
            "{mode:?}"
        );
        assert_eq!(
            (a1.writes_received, a1.reads_served, a1.reads_refused),
            (s1.writes_received, s1.reads_served, s1.reads_refused),
            "{mode:?}"
        );
        // An empty list completes at once (read_v: an_empty_vectored_read_completes_at_once).
        let r = sim.engines[0].write_v(ca, &[]).unwrap();
        assert_eq!(r.test().expect("at once").unwrap().len, 0, "{mode:?}");
        // The connection goes on: the good list is written, then read back elsewhere.
        let list: Vec<Block> = (0..8).map(good).collect();
        let w = sim.engines[0].write_v(ca, &list).unwrap();
        finish(&mut sim, 10, &[&w]).unwrap();
        assert!(w.test().unwrap().is_ok(), "{mode:?}");
        let back: Vec<Block> = list
            .iter()
            .map(|b| Block {
                offset: b.offset + 8 * KIB,
                ..b.clone()
            })
            .collect();
        let r = sim.engines[0].read_v(ca, &back).unwrap();
        finish(&mut sim, 10, &[&r]).unwrap();
        assert!(r.test().unwrap().is_ok(), "{mode:?}");
        for b in &list {
            let src = bytes(&mine, b.offset, b.len);
            assert_eq!(bytes(&theirs, b.remote_offset, b.len), src, "{mode:?}");
            assert_eq!(bytes(&mine, b.offset + 8 * KIB, b.len), src, "{mode:?}");
        }
    }
}

/// An empty `read_v` completes at once with 0 bytes, as documented on `Engine::read_v` (and as
/// an empty `write_v` does).
#[test]
fn an_empty_vectored_read_completes_at_once() {
    for mode in [Mode::Uc, Mode::Rc] {
        let (mut sim, ca, _cb) = pair(8, &small_config(mode));
        let w = sim.engines[0].write_v(ca, &[]).unwrap();
        assert_eq!(w.test().expect("at once").unwrap().len, 0, "{mode:?}");
        let r = sim.engines[0].read_v(ca, &[]).unwrap();
        let at_once = r.test();
        run_for(&mut sim, Duration::from_millis(1), |_| {});
        assert!(
            matches!(at_once, Some(Ok(Done { len: 0 }))),
            "{mode:?}: an empty read_v at once: {at_once:?}; 1 ms later: {:?}",
            r.test()
        );
    }
}

/// An export withdrawn, or its buffer given back, as soon as a read of it completed leaves the
/// connection usable: the next write (to another export) completes. Under 5% reordering (a
/// reordered packet held back up to 20 us), seeds 21 to 23, UC and RC.
#[test]
fn withdrawing_an_export_just_read_leaves_the_connection_usable() {
    let reorder = Faults {
        reorder: 0.05,
        reorder_delay_ns: 20_000,
        ..Faults::NONE
    };
    for mode in [Mode::Uc, Mode::Rc] {
        for seed in [21, 22, 23] {
            for give_back in [false, true] {
                let what = format!("{mode:?} seed {seed} give back {give_back}");
                let (mut sim, ca, _cb) = faulty_pair(seed, mode, reorder);
                let mine = sim.engines[0].register(MIB as usize).unwrap();
                let theirs = sim.engines[1].register(MIB as usize).unwrap();
                theirs.write_at(0, &pattern(3, 0, 0, MIB as usize)).unwrap();
                let d = sim.engines[1]
                    .export_with(&theirs, 0, MIB, Access::READ)
                    .unwrap();
                let r = sim.engines[0].read(ca, &mine, 0, &d, 0, MIB).unwrap();
                finish(&mut sim, 60, &[&r]).unwrap();
                assert!(r.test().unwrap().is_ok(), "{what}: the read");
                assert!(all(&mine) == all(&theirs), "{what}: the read's bytes");
                match give_back {
                    false => sim.engines[1].withdraw_export(&d).unwrap(),
                    true => sim.engines[1].deregister(&theirs).unwrap(),
                }
                let other = sim.engines[1].register(MIB as usize).unwrap();
                let d2 = sim.engines[1].export(&other, 0, MIB).unwrap();
                let w = sim.engines[0].write(ca, &mine, 0, MIB, &d2, 0).unwrap();
                finish(&mut sim, 60, &[&w]).unwrap();
                assert!(
                    w.test().unwrap().is_ok(),
                    "{what}: the write after: {:?}",
                    w.test()
                );
                assert!(sim.engines[0].is_open(ca), "{what}");
            }
        }
    }
}

/// Where notified write `i` of [`notes_are_delivered_in_order_and_never_before_their_data`]
/// goes: its offset (the same in both buffers) and length.
fn noted_layout(rng: &mut Rng, n: usize) -> (Vec<(u64, u64)>, u64) {
    let mut at = 64;
    let mut v = Vec::new();
    for i in 0..n {
        let len = match i {
            2 => 4 * MIB,
            _ => match rng.below(4) {
                0 => 1 + rng.below(64),
                1 => rng.below(4 * KIB),
                2 => rng.below(128 * KIB),
                _ => rng.below(600 * KIB),
            },
        };
        v.push((at, len));
        at += len + 64;
    }
    (v, at)
}

fn note_of(i: usize) -> Vec<u8> {
    match i {
        // The longest note there is, and an empty one.
        5 => (0..256).map(|k| (k as u8) ^ 0x5a).collect(),
        7 => Vec::new(),
        _ => format!("note of write {i}").into_bytes(),
    }
}

/// 24 notified writes on one connection (every third a `write_v` of its range in three blocks,
/// last block first), of 0 B to 4 MiB, under 5% loss, reordering and duplication: their notes
/// (up to 256 B, and empty) arrive in the order of the writes, each with its connection, and
/// when a note is taken its write's every byte is in place at the target. Each arrives once;
/// no other note does.
#[test]
fn notes_are_delivered_in_order_and_never_before_their_data() {
    for mode in [Mode::Uc, Mode::Rc] {
        let (mut sim, ca, cb) = faulty_pair(31, mode, faults(0.05));
        let n = 24;
        let (places, len) = noted_layout(&mut Rng::new(3), n);
        let mine = sim.engines[0].register(len as usize).unwrap();
        let theirs = sim.engines[1].register(len as usize).unwrap();
        let src = pattern(9, 0, 0, len as usize);
        mine.write_at(0, &src).unwrap();
        theirs.write_at(0, &vec![GUARD; len as usize]).unwrap();
        let d = sim.engines[1].export(&theirs, 0, len).unwrap();
        let notes = sim.engines[1].notifications();
        let writes: Vec<Request> = places
            .iter()
            .enumerate()
            .map(|(i, &(at, l))| {
                let opts = Opts::default().note(&note_of(i)).unwrap();
                if i % 3 == 0 {
                    let third = l / 3;
                    let cuts = [
                        (at + 2 * third, l - 2 * third),
                        (at + third, third),
                        (at, third),
                    ];
                    let blocks: Vec<Block> = cuts
                        .iter()
                        .map(|&(o, l)| Block {
                            buf: mine.clone(),
                            offset: o,
                            remote: d,
                            remote_offset: o,
                            len: l,
                        })
                        .collect();
                    sim.engines[0].write_v_with(ca, &blocks, opts).unwrap()
                } else {
                    sim.engines[0]
                        .write_with(ca, &mine, at, l, &d, at, opts)
                        .unwrap()
                }
            })
            .collect();
        let mut seen = 0;
        let limit = sim.fabric.now() + Duration::from_secs(60);
        sim.run(limit, |_| {
            while let Some(note) = notes.pop() {
                assert!(seen < n, "{mode:?}: a note too many: {note:?}");
                assert_eq!(
                    note.data,
                    note_of(seen),
                    "{mode:?}: note {seen} out of order"
                );
                assert_eq!(note.conn, cb, "{mode:?}");
                let (at, l) = places[seen];
                assert!(
                    bytes(&theirs, at, l) == src[at as usize..(at + l) as usize],
                    "{mode:?}: the note of write {seen} ({l} B) came before its data"
                );
                seen += 1;
            }
            seen == n && writes.iter().all(Request::is_done)
        })
        .unwrap_or_else(|e| panic!("{mode:?}: {e} ({seen} notes)"));
        for (i, w) in writes.iter().enumerate() {
            assert_eq!(w.test().unwrap().unwrap().len, places[i].1, "{mode:?} {i}");
        }
        run_for(&mut sim, Duration::from_millis(2), |_| {});
        assert!(notes.is_empty(), "{mode:?}: {:?}", drain_notes(&notes));
        assert_eq!(sim.engines[1].stats().notes_received, n as u64);
        // The guard bytes between the writes are untouched.
        let mut want = vec![GUARD; len as usize];
        for &(at, l) in &places {
            let r = at as usize..(at + l) as usize;
            want[r.clone()].copy_from_slice(&src[r]);
        }
        same(&all(&theirs), &want, &format!("{mode:?}: the target"));
    }
}

/// A send issued after a notified write on the same connection is delivered after it: its
/// receive is never seen complete while the write's note is not delivered (both watched every
/// round), whichever of the receive and the write is posted first, under 5% loss, reordering
/// and duplication. 64 rounds: in some of them (seen: 26 on UC, 5 on RC) the send's bytes are in
/// the receive buffer while the note is still on its way, so the engine has to hold the
/// receive back.
#[test]
fn a_receive_after_a_notified_write_completes_after_its_note() {
    for mode in [Mode::Uc, Mode::Rc] {
        let (mut sim, ca, cb) = faulty_pair(41, mode, faults(0.05));
        let mine = sim.engines[0].register(4 * MIB as usize).unwrap();
        mine.write_at(0, &pattern(4, 0, 0, 4 * MIB as usize))
            .unwrap();
        let theirs = sim.engines[1].register(4 * MIB as usize).unwrap();
        let inbox = sim.engines[1].register(64 * KIB as usize).unwrap();
        let d = sim.engines[1].export(&theirs, 0, 4 * MIB).unwrap();
        let notes = sim.engines[1].notifications();
        for round in 0..64u64 {
            let sent = 1 + round * 77 % 999;
            let what = format!("{mode:?} round {round}");
            let len = [1, 3000, 64 * KIB, 700 * KIB][round as usize % 4];
            let note = format!("round {round}").into_bytes();
            let opts = Opts::default().note(&note).unwrap();
            let recv_first = round % 2 == 0;
            let mut r = None;
            if recv_first {
                r = Some(sim.engines[1].recv(cb, &inbox, 0, 64 * KIB).unwrap());
            }
            let w = if round % 3 == 2 {
                let blocks = [
                    Block {
                        buf: mine.clone(),
                        offset: 0,
                        remote: d,
                        remote_offset: 0,
                        len: len / 2,
                    },
                    Block {
                        buf: mine.clone(),
                        offset: len / 2,
                        remote: d,
                        remote_offset: len / 2,
                        len: len - len / 2,
                    },
                ];
                sim.engines[0].write_v_with(ca, &blocks, opts).unwrap()
            } else {
                sim.engines[0]
                    .write_with(ca, &mine, 0, len, &d, 0, opts)
                    .unwrap()
            };
            let s = sim.engines[0]
                .send(ca, &mine, 4 * MIB - 1000, sent)
                .unwrap();
            let r = match r {
                Some(r) => r,
                None => sim.engines[1].recv(cb, &inbox, 0, 64 * KIB).unwrap(),
            };
            let mut noted = false;
            let limit = sim.fabric.now() + Duration::from_secs(30);
            sim.run(limit, |_| {
                let received = r.is_done();
                if let Some(n) = notes.pop() {
                    assert_eq!(n.data, note, "{what}");
                    noted = true;
                }
                assert!(
                    !received || noted,
                    "{what}: the receive completed before the note of the write before it"
                );
                noted && r.is_done() && s.is_done() && w.is_done()
            })
            .unwrap_or_else(|e| panic!("{what}: {e}"));
            for q in [&w, &s, &r] {
                assert!(q.test().unwrap().is_ok(), "{what}: {:?}", q.test());
            }
            assert_eq!(r.test().unwrap().unwrap().len, sent, "{what}");
        }
    }
}

/// A note longer than 256 B is refused by `Opts::note`; a note on a send, a receive, a read or
/// a vectored read is refused by the call. Notes of 256 B and of none are delivered as they
/// were given.
#[test]
fn notes_only_ride_on_writes_and_are_at_most_256_bytes() {
    assert!(matches!(
        Opts::default().note(&[1; 257]),
        Err(EngineError::Limit { limit: 256, .. })
    ));
    assert!(Opts::default().note(&[1; 256]).is_ok());
    assert!(Opts::timeout(Duration::from_secs(1)).note(&[]).is_ok());
    for mode in [Mode::Uc, Mode::Rc] {
        let (mut sim, ca, cb) = pair(6, &small_config(mode));
        let buf = sim.engines[0].register(64 * KIB as usize).unwrap();
        let theirs = sim.engines[1].register(64 * KIB as usize).unwrap();
        let d = sim.engines[1]
            .export_with(&theirs, 0, 64 * KIB, Access::READ_WRITE)
            .unwrap();
        let noted = Opts::default().note(b"not here").unwrap();
        let block = Block {
            buf: buf.clone(),
            offset: 0,
            remote: d,
            remote_offset: 0,
            len: 4 * KIB,
        };
        let e0 = &mut sim.engines[0];
        let refused = [
            ("send_with", e0.send_with(ca, &buf, 0, 4 * KIB, noted)),
            ("recv_with", e0.recv_with(ca, &buf, 0, 4 * KIB, noted)),
            (
                "read_with",
                e0.read_with(ca, &buf, 0, &d, 0, 4 * KIB, noted),
            ),
            (
                "read_v_with",
                e0.read_v_with(ca, std::slice::from_ref(&block), noted),
            ),
        ];
        for (call, r) in refused {
            assert!(
                matches!(r, Err(EngineError::MisplacedNote(_))),
                "{mode:?} {call}: {r:?}"
            );
        }
        let r = sim.engines[1].recv_with(cb, &theirs, 0, 4 * KIB, noted);
        let e = r.unwrap_err();
        assert_eq!(
            e.to_string(),
            "a note rides on a write, not on a receive",
            "{mode:?}"
        );
        // Nothing of them went anywhere; notes of 256 B and of none arrive as they were.
        let long: Vec<u8> = (0..=255).collect();
        let w1 = sim.engines[0]
            .write_with(ca, &buf, 0, 10, &d, 0, Opts::default().note(&long).unwrap())
            .unwrap();
        let w2 = sim.engines[0]
            .write_v_with(
                ca,
                std::slice::from_ref(&block),
                Opts::default().note(&[]).unwrap(),
            )
            .unwrap();
        finish(&mut sim, 10, &[&w1, &w2]).unwrap();
        run_for(&mut sim, Duration::from_millis(1), |_| {});
        let got: Vec<Vec<u8>> = drain_notes(&sim.engines[1].notifications())
            .into_iter()
            .map(|n| n.data)
            .collect();
        assert_eq!(got, vec![long, vec![]], "{mode:?}");
        let s0 = sim.engines[0].stats();
        assert_eq!((s0.read_wrs, s0.bytes_read), (0, 0), "{mode:?}");
        assert_eq!(sim.engines[1].stats().reads_served, 0, "{mode:?}");
        assert_eq!(sim.engines[1].stats().writes_received, 2, "{mode:?}");
    }
}

/// What became of a notified write `r` that was cancelled, of the bytes `ranges` (offsets, the
/// same in `mine` and `theirs`): completed, its bytes in place, and its note (`note`) to be
/// delivered; or withdrawn (`Cancelled`), its bytes nowhere (guard bytes), and no note.
fn noted_outcome(
    r: &Request,
    note: &str,
    (theirs, src): (&Buffer, &[u8]),
    ranges: &[(u64, u64)],
    what: &str,
) -> Option<Vec<u8>> {
    match r.test().expect("done") {
        Ok(d) => {
            assert_eq!(d.len, ranges.iter().map(|r| r.1).sum::<u64>(), "{what}");
            for &(at, l) in ranges {
                let want = &src[at as usize..(at + l) as usize];
                same(&bytes(theirs, at, l), want, what);
            }
            Some(note.as_bytes().to_vec())
        }
        Err(EngineError::Cancelled) => {
            for &(at, l) in ranges {
                assert!(
                    bytes(theirs, at, l).iter().all(|&x| x == GUARD),
                    "{what}: withdrawn, but its bytes reached the target"
                );
            }
            None
        }
        Err(e) => panic!("{what}: failed: {e}"),
    }
}

/// Notified writes (and a notified `write_v`) cancelled before any round ran, behind an 8 MiB
/// write, and again later (100 us into the 8 MiB before it, or once the target has that
/// 8 MiB): each either completes, its bytes in place and its note delivered, or is withdrawn
/// (`Cancelled`), its bytes nowhere and its note never delivered; the notified writes after them
/// deliver theirs, every note in the order of the writes, once. (Which one happens is the
/// engine's choice: it may refuse to withdraw a notified write.) A plain write cancelled
/// among them before any round ran is withdrawn and disturbs nothing. Under 2% loss,
/// reordering and duplication.
#[test]
fn a_notified_write_cancelled_delivers_its_note_iff_it_completes() {
    for mode in [Mode::Uc, Mode::Rc] {
        let (mut sim, ca, _cb) = faulty_pair(51, mode, faults(0.02));
        let len = 8 * MIB + 128 * KIB;
        let mine = sim.engines[0].register(len as usize).unwrap();
        let src = pattern(5, 0, 0, len as usize);
        mine.write_at(0, &src).unwrap();
        let theirs = sim.engines[1].register(len as usize).unwrap();
        theirs.write_at(0, &vec![GUARD; len as usize]).unwrap();
        let d = sim.engines[1].export(&theirs, 0, len).unwrap();
        let notes = sim.engines[1].notifications();
        let note = |s: &str| Opts::default().note(s.as_bytes()).unwrap();
        let slot = |k: u64| 8 * MIB + k * 8 * KIB;
        let e = &mut sim.engines[0];
        let big = e.write(ca, &mine, 0, 8 * MIB, &d, 0).unwrap();
        let a = e
            .write_with(ca, &mine, slot(0), 4 * KIB, &d, slot(0), note("a"))
            .unwrap();
        a.cancel();
        let plain = e.write(ca, &mine, slot(10), 4 * KIB, &d, slot(10)).unwrap();
        plain.cancel();
        let blocks = [1, 2].map(|k| Block {
            buf: mine.clone(),
            offset: slot(k),
            remote: d,
            remote_offset: slot(k),
            len: 3 * KIB,
        });
        let b = e.write_v_with(ca, &blocks, note("b")).unwrap();
        b.cancel();
        let c = e
            .write_with(ca, &mine, slot(3), 5 * KIB, &d, slot(3), note("c"))
            .unwrap();
        let mut got = Vec::new();
        let limit = sim.fabric.now() + Duration::from_secs(30);
        sim.run(limit, |_| {
            got.extend(drain_notes(&notes).into_iter().map(|n| n.data));
            [&big, &a, &plain, &b, &c].iter().all(|r| r.is_done())
                && got.last().is_some_and(|n| n == b"c")
        })
        .unwrap_or_else(|e| panic!("{mode:?}: {e} (notes {got:?})"));
        run_for(&mut sim, Duration::from_millis(2), |_| {
            got.extend(drain_notes(&notes).into_iter().map(|n| n.data));
        });
        let want: Vec<Vec<u8>> = [
            noted_outcome(
                &a,
                "a",
                (&theirs, &src),
                &[(slot(0), 4 * KIB)],
                &format!("{mode:?} a"),
            ),
            noted_outcome(
                &b,
                "b",
                (&theirs, &src),
                &[(slot(1), 3 * KIB), (slot(2), 3 * KIB)],
                &format!("{mode:?} b"),
            ),
            noted_outcome(
                &c,
                "c",
                (&theirs, &src),
                &[(slot(3), 5 * KIB)],
                &format!("{mode:?} c"),
            ),
        ]
        .into_iter()
        .flatten()
        .collect();
        eprintln!(
            "{mode:?}: cancelled at once: a {:?}, b {:?}",
            a.test().unwrap(),
            b.test().unwrap()
        );
        assert_eq!(got, want, "{mode:?}: the notes delivered");
        assert!(
            matches!(plain.test(), Some(Err(EngineError::Cancelled))),
            "{mode:?}: the plain write: {:?}",
            plain.test()
        );
        assert!(
            bytes(&theirs, slot(10), 4 * KIB)
                .iter()
                .all(|&x| x == GUARD),
            "{mode:?}: the plain write, withdrawn, reached the target"
        );
        assert!(big.test().unwrap().is_ok(), "{mode:?}");

        // Cancelled later: 100 us into the 8 MiB before it (still queued), or once the target
        // has that 8 MiB (f under way, or done). Either outcome, its note with it.
        for late in [false, true] {
            let what = format!("{mode:?}, cancelled late {late}");
            let k = if late { 3 } else { 0 };
            let e = &mut sim.engines[0];
            let big = e.write(ca, &mine, 0, 8 * MIB, &d, 0).unwrap();
            let (sf, sg, sh) = (slot(4 + k), slot(5 + k), slot(6 + k));
            let f = e
                .write_with(ca, &mine, sf, 4 * KIB, &d, sf, note("f"))
                .unwrap();
            if late {
                let had = sim.engines[1].stats().writes_received;
                sim.run(sim.fabric.now() + Duration::from_secs(30), |s| {
                    s.engines[1].stats().writes_received > had
                })
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            } else {
                run_for(&mut sim, Duration::from_micros(100), |_| {});
            }
            f.cancel();
            let g = sim.engines[0]
                .write_with(ca, &mine, sg, 4 * KIB, &d, sg, note("g"))
                .unwrap();
            let h = sim.engines[0]
                .write_with(ca, &mine, sh, 4 * KIB, &d, sh, note("h"))
                .unwrap();
            let mut got = Vec::new();
            let limit = sim.fabric.now() + Duration::from_secs(30);
            sim.run(limit, |_| {
                got.extend(drain_notes(&notes).into_iter().map(|n| n.data));
                [&big, &f, &g, &h].iter().all(|r| r.is_done())
                    && got.last().is_some_and(|n| n == b"h")
            })
            .unwrap_or_else(|e| panic!("{what}: {e}"));
            run_for(&mut sim, Duration::from_millis(2), |_| {
                got.extend(drain_notes(&notes).into_iter().map(|n| n.data));
            });
            let mut want: Vec<Vec<u8>> =
                noted_outcome(&f, "f", (&theirs, &src), &[(sf, 4 * KIB)], &what)
                    .into_iter()
                    .collect();
            want.extend([b"g".to_vec(), b"h".to_vec()]);
            eprintln!("{what}: f {:?}", f.test().unwrap());
            assert_eq!(got, want, "{what}: the notes delivered");
            assert!(big.test().unwrap().is_ok(), "{what}");
            assert!(
                g.test().unwrap().is_ok() && h.test().unwrap().is_ok(),
                "{what}"
            );
        }
    }
}

/// Two engines on a wall-clock fabric, each to be driven by a thread of its own.
fn wall_pair(mode: Mode) -> (Fabric, Engine, Engine) {
    uccl_integration::wall_pair(&EngineConfig {
        mode,
        qps_per_conn: 2,
        max_conns: 8,
        ..EngineConfig::default()
    })
}

/// Waits for `req` (of a threaded engine), at most 30 s.
fn wait(req: &Request, what: &str) -> Done {
    match req.wait_timeout(Duration::from_secs(30)) {
        Some(Ok(d)) => d,
        other => panic!("{what}: {other:?}"),
    }
}

/// Waits (at most 10 s) for a note.
fn next_note(n: &Notifications) -> Notification {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(x) = n.pop() {
            return x;
        }
        assert!(Instant::now() < end, "no note within 10 s");
        thread::sleep(Duration::from_millis(1));
    }
}

/// A threaded engine and the regions of a test: engine `a` reads and writes through its
/// handle; `theirs` (at `b`) exported read-write.
struct Threaded {
    a: EngineHandle,
    b: EngineHandle,
    ca: ConnId,
    cb: ConnId,
    mine: Buffer,
    theirs: Buffer,
    d: Descriptor,
    _fabric: Fabric,
}

fn threaded(mode: Mode, len: u64) -> Threaded {
    let (fabric, mut a, mut b) = wall_pair(mode);
    let (ca, cb) = connect_pair(&mut a, &mut b).unwrap();
    let (a, b) = (a.spawn().unwrap(), b.spawn().unwrap());
    let mine = a.register(len as usize).unwrap();
    let theirs = b.register(len as usize).unwrap();
    let t = theirs.clone();
    let d = b
        .call(move |e| e.export_with(&t, 0, len, Access::READ_WRITE))
        .unwrap()
        .unwrap();
    Threaded {
        a,
        b,
        ca,
        cb,
        mine,
        theirs,
        d,
        _fabric: fabric,
    }
}

/// Through `EngineHandle`: a read, a `write_v` with a note and a `read_v` complete with every
/// byte in place, the note reaches the target's `notifications()` with its connection; a bad block
/// fails its request naming the block, and a note on a read fails it.
#[test]
fn the_threaded_handle_reads_writes_blocks_and_delivers_notes() {
    for mode in [Mode::Uc, Mode::Rc] {
        let len = 2 * MIB;
        let t = threaded(mode, len);
        let (m0, t0) = (
            pattern(11, 0, 0, len as usize),
            pattern(12, 0, 0, len as usize),
        );
        t.mine.write_at(0, &m0).unwrap();
        t.theirs.write_at(0, &t0).unwrap();
        // A read of 300 KiB (pieces on RC) at an odd place.
        let r =
            t.a.read(t.ca, &t.mine, (MIB, 300 * KIB), &t.d, 12345)
                .unwrap();
        assert_eq!(wait(&r, "read").len, 300 * KIB, "{mode:?}");
        same(
            &bytes(&t.mine, MIB, 300 * KIB),
            &t0[12345..12345 + 300 * KIB as usize],
            &format!("{mode:?}: read"),
        );
        // A write_v of 32 scattered blocks (within the first MiB of both), with a note.
        let s = Scatter::new(77, 32, None);
        assert!(s.local_len <= MIB && s.remote_len <= MIB);
        let blocks = s.blocks(&t.mine, t.d);
        let notes = t.b.notifications();
        let opts = Opts::default().note(b"threaded write_v").unwrap();
        let w = t.a.write_v_with(t.ca, &blocks, opts).unwrap();
        assert_eq!(wait(&w, "write_v").len, s.total(), "{mode:?}");
        let note = next_note(&notes);
        assert_eq!(
            (note.conn, note.data.as_slice()),
            (t.cb, &b"threaded write_v"[..])
        );
        let want = s.expect(&t0[..MIB as usize], &m0, true);
        same(
            &bytes(&t.theirs, 0, MIB),
            &want,
            &format!("{mode:?}: write_v"),
        );
        // A read_v of the same blocks back, each 1 MiB further into mine.
        let back: Vec<Block> = blocks
            .iter()
            .map(|b| Block {
                offset: b.offset + MIB,
                ..b.clone()
            })
            .collect();
        let r = t.a.read_v(t.ca, &back).unwrap();
        assert_eq!(wait(&r, "read_v").len, s.total(), "{mode:?}");
        for b in &back {
            assert_eq!(
                bytes(&t.mine, b.offset, b.len),
                bytes(&t.theirs, b.remote_offset, b.len),
                "{mode:?}"
            );
        }
        // Misuse arrives as the request's failure.
        let mut bad = back.clone();
        bad[5].remote_offset = len - 10;
        bad[5].len = 4 * KIB;
        let r = t.a.read_v(t.ca, &bad).unwrap();
        match r.wait_timeout(Duration::from_secs(30)) {
            Some(Err(EngineError::Block { index: 5, error })) => {
                assert!(matches!(*error, EngineError::BadRange(_)), "{error:?}")
            }
            other => panic!("{mode:?}: a bad block: {other:?}"),
        }
        let noted = Opts::default().note(b"no").unwrap();
        let r =
            t.a.read_with(t.ca, &t.mine, (0, 10), &t.d, 0, noted)
                .unwrap();
        assert!(
            matches!(
                r.wait_timeout(Duration::from_secs(30)),
                Some(Err(EngineError::MisplacedNote(_)))
            ),
            "{mode:?}"
        );
        assert!(notes.is_empty(), "{mode:?}: one note only");
        let a = t.a.shutdown().unwrap();
        let u = a.usage();
        assert_eq!((u.wrs_in_use, u.unacked), (0, 0), "{mode:?} {u:?}");
    }
}

/// A clone of a threaded engine's `read_v` request, awaited from a small executor, is woken
/// and ready with the whole length, every block in place; so is the original.
#[test]
fn a_vectored_read_is_a_future() {
    for mode in [Mode::Uc, Mode::Rc] {
        let t = threaded(mode, MIB);
        let t0 = pattern(13, 0, 0, MIB as usize);
        t.theirs.write_at(0, &t0).unwrap();
        t.mine.write_at(0, &vec![0; MIB as usize]).unwrap();
        let s = Scatter::new(78, 16, None);
        let blocks = s.blocks(&t.mine, t.d);
        let r = t.a.read_v(t.ca, &blocks).unwrap();
        let got = block_on(r.clone()).unwrap();
        assert_eq!(got.len, s.total(), "{mode:?}");
        assert_eq!(r.test().unwrap().unwrap().len, s.total(), "{mode:?}");
        let want = s.expect(&vec![0; s.local_len as usize], &t0, false);
        same(
            &bytes(&t.mine, 0, s.local_len),
            &want,
            &format!("{mode:?}: read_v awaited"),
        );
        drop(t.b);
    }
}
