//! An engine whose last round left nothing to do stops its next round after the CQ poll if
//! nothing was asked of it since ([`Engine::poll`]). Whatever is asked of it (each call, a
//! buffer dropped or a request cancelled on another thread) must still be acted on at once.
//! Each case lets both engines settle (rounds with nothing to do, the clock standing still),
//! asks one thing, and requires it done within [`PROMPT`] of virtual time: an engine that
//! skipped the work would only see it at its next deadline. Debug builds also check every
//! skipped round against a full one run in its place.

use std::time::Duration;

use uccl_engine::{Access, Block, Buffer, ConnId, EngineError, Mode, Request};
use uccl_integration::Sim;
use uccl_integration::misuse::{finish, pair, small_config};

const KIB: u64 = 1024;

/// Far more than any of these requests takes on the idle simulated fabric (a few round trips
/// of a few microseconds), far less than the engines' periodic deadlines.
const PROMPT: Duration = Duration::from_micros(200);

/// Rounds of both engines with the clock standing still: each ends settled.
fn settle(sim: &mut Sim) {
    for _ in 0..3 {
        for e in &mut sim.engines {
            e.poll().unwrap();
        }
    }
}

/// Runs `sim` until `done`; fails unless that took less than [`PROMPT`].
fn promptly(sim: &mut Sim, what: &str, done: impl FnMut(&mut Sim) -> bool) {
    let start = sim.fabric.now();
    sim.run(start + Duration::from_secs(10), done)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let took = sim.fabric.now() - start;
    assert!(
        took < PROMPT,
        "{what}: done only after {took:?} of virtual time"
    );
}

fn done(reqs: &[&Request]) -> impl FnMut(&mut Sim) -> bool {
    move |_| reqs.iter().all(|r| r.is_done())
}

/// Runs `sim` for `d` of virtual time (to its end if nothing is pending before).
fn idle_for(sim: &mut Sim, d: Duration) {
    let until = sim.fabric.now() + d;
    while sim.fabric.now() < until {
        let mut busy = false;
        for e in &mut sim.engines {
            busy |= e.poll().unwrap();
        }
        if busy {
            continue;
        }
        let next = sim
            .engines
            .iter()
            .filter_map(|e| e.next_deadline())
            .map(Duration::from_nanos)
            .chain(sim.fabric.next_event())
            .min()
            .unwrap_or(until)
            .clamp(sim.fabric.now() + Duration::from_nanos(1), until);
        sim.fabric.advance(next - sim.fabric.now());
    }
}

fn ok(r: &Request) -> u64 {
    r.test().expect("done").expect("succeeded").len
}

struct Case {
    sim: Sim,
    ca: ConnId,
    cb: ConnId,
    a: Buffer,
    b: Buffer,
}

fn case(mode: Mode) -> Case {
    let (mut sim, ca, cb) = pair(11, &small_config(mode));
    let a = sim.engines[0].register(64 * KIB as usize).unwrap();
    let b = sim.engines[1].register(64 * KIB as usize).unwrap();
    idle_for(&mut sim, Duration::from_millis(1));
    Case { sim, ca, cb, a, b }
}

/// A receive, then (settled again) a send: each call is taken up by the next round.
#[test]
fn receives_and_sends_asked_of_a_settled_engine_go_at_once() {
    for mode in [Mode::Uc, Mode::Rc] {
        let Case {
            mut sim,
            ca,
            cb,
            a,
            b,
        } = case(mode);
        // The receive first (its advertisement leaves while the clock runs on), then the send.
        settle(&mut sim);
        let r = sim.engines[1].recv(cb, &b, 0, 16 * KIB).unwrap();
        idle_for(&mut sim, Duration::from_micros(50));
        settle(&mut sim);
        let s = sim.engines[0].send(ca, &a, 0, 16 * KIB).unwrap();
        promptly(&mut sim, "send and receive", done(&[&s, &r]));
        assert_eq!((ok(&s), ok(&r)), (16 * KIB, 16 * KIB), "{mode:?}");
        // The send first this time, then the receive it waits for.
        settle(&mut sim);
        let s = sim.engines[0].send(ca, &a, 0, 8 * KIB).unwrap();
        idle_for(&mut sim, Duration::from_micros(50));
        settle(&mut sim);
        let r = sim.engines[1].recv(cb, &b, 0, 8 * KIB).unwrap();
        promptly(&mut sim, "receive and send", done(&[&s, &r]));
        assert_eq!((ok(&s), ok(&r)), (8 * KIB, 8 * KIB), "{mode:?}");
    }
}

/// One-sided writes and reads, plain and vectored, each asked of a settled engine.
#[test]
fn one_sided_requests_asked_of_a_settled_engine_go_at_once() {
    for mode in [Mode::Uc, Mode::Rc] {
        let Case {
            mut sim, ca, a, b, ..
        } = case(mode);
        settle(&mut sim);
        let d = sim.engines[1]
            .export_with(&b, 0, 64 * KIB, Access::READ_WRITE)
            .unwrap();
        let block = |offset| Block {
            buf: a.clone(),
            offset,
            remote: d,
            remote_offset: offset,
            len: 4 * KIB,
        };
        type Ask<'a> = Box<dyn Fn(&mut Sim) -> Request + 'a>;
        let asks: [(&str, Ask); 4] = [
            (
                "a write",
                Box::new(|s: &mut Sim| s.engines[0].write(ca, &a, 0, 8 * KIB, &d, 0).unwrap()),
            ),
            (
                "a read",
                Box::new(|s: &mut Sim| s.engines[0].read(ca, &a, 0, &d, 0, 8 * KIB).unwrap()),
            ),
            (
                "a vectored write",
                Box::new(move |s: &mut Sim| {
                    s.engines[0]
                        .write_v(ca, &[block(0), block(8 * KIB)])
                        .unwrap()
                }),
            ),
            (
                "a vectored read",
                Box::new(move |s: &mut Sim| {
                    s.engines[0]
                        .read_v(ca, &[block(0), block(8 * KIB)])
                        .unwrap()
                }),
            ),
        ];
        for (what, ask) in &asks {
            settle(&mut sim);
            let r = ask(&mut sim);
            promptly(&mut sim, what, done(&[&r]));
            assert_eq!(ok(&r), 8 * KIB, "{mode:?}: {what}");
        }
        // A withdrawn export refuses the next write at once.
        settle(&mut sim);
        sim.engines[1].withdraw_export(&d).unwrap();
        let w = sim.engines[0].write(ca, &a, 0, 4 * KIB, &d, 0).unwrap();
        promptly(&mut sim, "a write to a withdrawn export", done(&[&w]));
        assert!(w.test().unwrap().is_err(), "{mode:?}");
    }
}

/// A receive cancelled on another thread is withdrawn at once; a buffer whose last handle
/// another thread drops is given back by the next round.
#[test]
fn cancels_and_drops_on_other_threads_reach_a_settled_engine() {
    for mode in [Mode::Uc, Mode::Rc] {
        let Case { mut sim, cb, b, .. } = case(mode);
        let r = sim.engines[1].recv(cb, &b, 0, 4 * KIB).unwrap();
        idle_for(&mut sim, Duration::from_micros(50));
        settle(&mut sim);
        let cancel = r.clone();
        std::thread::spawn(move || cancel.cancel()).join().unwrap();
        promptly(&mut sim, "a cancelled receive", done(&[&r]));
        assert!(
            matches!(r.test(), Some(Err(EngineError::Cancelled))),
            "{mode:?}: {:?}",
            r.test()
        );

        let held = sim.engines[0].usage().buffers;
        let spare = sim.engines[0].register(4 * KIB as usize).unwrap();
        assert_eq!(sim.engines[0].usage().buffers, held + 1);
        settle(&mut sim);
        std::thread::spawn(move || drop(spare)).join().unwrap();
        sim.engines[0].poll().unwrap();
        assert_eq!(sim.engines[0].usage().buffers, held, "{mode:?}");
    }
}

/// A connection closed on a settled engine: the peer learns of it at once.
#[test]
fn a_close_asked_of_a_settled_engine_goes_at_once() {
    for mode in [Mode::Uc, Mode::Rc] {
        let Case {
            mut sim, ca, cb, ..
        } = case(mode);
        settle(&mut sim);
        sim.engines[0].close(ca).unwrap();
        promptly(&mut sim, "a close", |s| !s.engines[1].is_open(cb));
    }
}

/// The engine still wakes for deadlines of its own while settled: a receive with a timeout
/// fails when it is due, with nothing else happening.
#[test]
fn a_settled_engine_still_keeps_its_deadlines() {
    let Case { mut sim, cb, b, .. } = case(Mode::Uc);
    settle(&mut sim);
    let timeout = Duration::from_micros(300);
    let r = sim.engines[1]
        .recv_with(cb, &b, 0, 4 * KIB, uccl_engine::Opts::timeout(timeout))
        .unwrap();
    let start = sim.fabric.now();
    finish(&mut sim, 10, &[&r]).unwrap();
    assert!(
        matches!(r.test(), Some(Err(EngineError::TimedOut(_)))),
        "{:?}",
        r.test()
    );
    let took = sim.fabric.now() - start;
    assert!(took >= timeout && took < timeout + PROMPT, "{took:?}");
}
