//! uccl-engine misused with values at their limits: every configuration field at zero and at
//! its type's maximum, the smallest valid values, buffers and messages of zero bytes and of
//! impossible or huge sizes, one-byte chunks, receives up to and past `max_recvs`, and
//! thousands of requests outstanding. A configuration value is either refused with an error
//! naming its field (by `EngineConfig::validate`, or by `Engine::new` for what only the
//! device knows) or it works: an engine built with it moves a message. Nothing panics or
//! hangs (each probe runs under a wall-clock hang guard, on a virtual-time fabric with a
//! limit).
//!
//! Misused objects, connections and requests are in `engine_misuse.rs`, the threaded engine
//! in `engine_misuse_threaded.rs`.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use softnic::{Fabric, FabricConfig, Faults};
use uccl_engine::{Clock, Engine, EngineConfig, EngineError, Mode, Request, connect_pair};
use uccl_integration::misuse::{all_done, finish, guard, pair, panic_msg, small_config};
use uccl_integration::{Sim, pattern};
use uccl_tx::TxError;
use verbs_safe::{Context, Verbs};

/// What became of an engine configuration.
enum Outcome {
    /// Two engines built with it connected and moved a 64 KiB message.
    Works,
    /// `EngineConfig::validate` refused it, naming this field.
    Refused(&'static str),
    /// `EngineConfig::validate` refused it with an error that names no field.
    RefusedUnnamed(EngineError),
    /// `validate` accepted it, `Engine::new` failed.
    New(EngineError),
    /// The engines were built, connecting them failed.
    Connect(EngineError),
    /// The engines connected, the message did not go through.
    Transfer(String),
    /// Something panicked.
    Panic(String),
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Works => write!(f, "works"),
            Outcome::Refused(field) => write!(f, "validate refuses it, naming {field}"),
            Outcome::RefusedUnnamed(e) => write!(f, "validate refuses it, naming no field: {e:?}"),
            Outcome::New(e) => write!(f, "Engine::new fails: {e} ({e:?})"),
            Outcome::Connect(e) => write!(f, "connecting fails: {e}"),
            Outcome::Transfer(e) => write!(f, "the message does not go through: {e}"),
            Outcome::Panic(p) => write!(f, "PANIC: {p}"),
        }
    }
}

/// The field a configuration error names (the engine's own, or its transmit side's).
fn named_field(e: &EngineError) -> Option<&'static str> {
    match e {
        EngineError::Config { field, .. } => Some(field),
        EngineError::Tx(TxError::Config { field, .. }) => Some(field),
        _ => None,
    }
}

/// What two engines built as `c` do: refused by `validate` or `Engine::new`, or connected
/// and moving a 64 KiB message (at most 5 s of virtual time); a panic is caught.
fn outcome(c: &EngineConfig) -> Outcome {
    let c = c.clone();
    catch_unwind(AssertUnwindSafe(move || {
        if let Err(e) = c.validate() {
            return match named_field(&e) {
                Some(field) => Outcome::Refused(field),
                None => Outcome::RefusedUnnamed(e),
            };
        }
        let fabric = Fabric::new(FabricConfig {
            devices: 2,
            seed: 7,
            auto_advance: false,
            ..Default::default()
        });
        let verbs = Verbs::soft(&fabric);
        let mut engines = Vec::new();
        for name in ["soft0", "soft1"] {
            let ctx = Context::open_by_name(&verbs, name).expect("device");
            match Engine::new(&ctx, c.clone(), Clock::Fabric(fabric.clone())) {
                Ok(e) => engines.push(e),
                Err(e) => return Outcome::New(e),
            }
        }
        let mut sim = Sim {
            fabric,
            baseline: engines.iter().map(Engine::usage).collect(),
            engines,
            seed: 7,
        };
        let [a, b] = &mut sim.engines[..] else {
            unreachable!()
        };
        let (ca, cb) = match connect_pair(a, b) {
            Ok(x) => x,
            Err(e) => return Outcome::Connect(e),
        };
        let src = a.register(64 << 10).expect("register");
        let dst = b.register(64 << 10).expect("register");
        let recv = b.recv(cb, &dst, 0, 64 << 10).expect("recv");
        let send = a.send(ca, &src, 0, 64 << 10).expect("send");
        if let Err(e) = finish(&mut sim, 5, &[&recv, &send]) {
            return Outcome::Transfer(e);
        }
        match (send.test().unwrap(), recv.test().unwrap()) {
            (Ok(_), Ok(_)) => Outcome::Works,
            (s, r) => Outcome::Transfer(format!("send {s:?}, recv {r:?}")),
        }
    }))
    .unwrap_or_else(|p| Outcome::Panic(panic_msg(p)))
}

/// Whether `out` is acceptable for a change of the field `name` ("tx.chunk_size" may be named
/// "chunk_size"): it works, or `validate` or `Engine::new` refuses it naming the field, or
/// (the port only) the device refuses to be queried about it.
fn acceptable(name: &str, out: &Outcome) -> bool {
    let short = name.rsplit('.').next().unwrap();
    let names_it = |f: &str| f == name || f == short;
    match out {
        Outcome::Works => true,
        Outcome::Refused(f) => names_it(f),
        Outcome::New(e) => {
            named_field(e).is_some_and(names_it)
                || (name == "port" && e.to_string().contains("querying the port"))
        }
        _ => false,
    }
}

/// A change of one field: its name and the change.
type Tweak = (&'static str, fn(&mut EngineConfig));

/// The outcomes of `tweaks`, each applied alone to [`small_config`]`(mode)`, that are not
/// acceptable (every outcome is printed).
fn audit(mode: Mode, tweaks: &[Tweak]) -> Vec<String> {
    let mut bad = Vec::new();
    for (name, tweak) in tweaks {
        let mut c = small_config(mode);
        tweak(&mut c);
        let out = outcome(&c);
        eprintln!("{mode:?} {name:>24}: {out}");
        if !acceptable(name, &out) {
            bad.push(format!("{mode:?} {name}: {out}"));
        }
    }
    bad
}

/// Both modes of the engine.
const MODES: [Mode; 2] = [Mode::Uc, Mode::Rc];

/// Every field at zero.
const ZEROS: &[Tweak] = &[
    ("qps_per_conn", |c| c.qps_per_conn = 0),
    ("max_conns", |c| c.max_conns = 0),
    ("sq_depth", |c| c.sq_depth = 0),
    ("srq_depth", |c| c.srq_depth = 0),
    ("srq_refill", |c| c.srq_refill = 0),
    ("ack_every", |c| c.ack_every = 0),
    ("ack_bytes", |c| c.ack_bytes = 0),
    ("ack_delay_us", |c| c.ack_delay_us = 0),
    ("max_recvs", |c| c.max_recvs = 0),
    ("poll_budget", |c| c.poll_budget = 0),
    ("port", |c| c.port = 0),
    ("tx.chunk_size", |c| c.tx.chunk_size = 0),
    ("tx.flow_window", |c| c.tx.flow_window = 0),
    ("tx.engine_window", |c| c.tx.engine_window = 0),
    ("tx.rto_min_us", |c| c.tx.rto_min_us = 0),
    ("tx.rto_max_us", |c| c.tx.rto_max_us = 0),
    ("tx.rto_initial_us", |c| c.tx.rto_initial_us = 0),
    ("tx.peer_ack_delay_us", |c| c.tx.peer_ack_delay_us = 0),
    ("tx.target_delay_us", |c| c.tx.target_delay_us = 0),
    ("tx.max_retransmits", |c| c.tx.max_retransmits = 0),
    // tx.max_silence_us = 0 has a test of its own.
    ("tx.signal_every", |c| c.tx.signal_every = 0),
    ("tx.max_chain", |c| c.tx.max_chain = 0),
    ("tx.burst_bytes", |c| c.tx.burst_bytes = 0),
    ("tx.wr_pool", |c| c.tx.wr_pool = 0),
];

/// Every field at its type's maximum (every microsecond field among them: at `u64::MAX` its
/// time in nanoseconds overflows).
const MAXES: &[Tweak] = &[
    ("qps_per_conn", |c| c.qps_per_conn = u16::MAX),
    ("max_conns", |c| c.max_conns = u32::MAX),
    ("sq_depth", |c| c.sq_depth = u32::MAX),
    ("srq_depth", |c| c.srq_depth = u32::MAX),
    ("srq_refill", |c| c.srq_refill = u32::MAX),
    ("ack_every", |c| c.ack_every = u32::MAX),
    ("ack_bytes", |c| c.ack_bytes = u32::MAX),
    ("ack_delay_us", |c| c.ack_delay_us = u32::MAX),
    ("max_recvs", |c| c.max_recvs = u32::MAX),
    ("poll_budget", |c| c.poll_budget = usize::MAX),
    ("port", |c| c.port = u8::MAX),
    ("gid_index", |c| c.gid_index = Some(u8::MAX)),
    ("tx.chunk_size", |c| c.tx.chunk_size = u32::MAX),
    ("tx.flow_window", |c| c.tx.flow_window = u16::MAX),
    ("tx.engine_window", |c| c.tx.engine_window = u32::MAX),
    ("tx.rto_min_us", |c| c.tx.rto_min_us = u64::MAX),
    ("tx.rto_max_us", |c| c.tx.rto_max_us = u64::MAX),
    ("tx.rto_initial_us", |c| c.tx.rto_initial_us = u64::MAX),
    ("tx.peer_ack_delay_us", |c| {
        c.tx.peer_ack_delay_us = u64::MAX
    }),
    ("tx.target_delay_us", |c| c.tx.target_delay_us = u64::MAX),
    ("tx.max_retransmits", |c| c.tx.max_retransmits = u16::MAX),
    ("tx.max_silence_us", |c| c.tx.max_silence_us = u64::MAX),
    ("tx.signal_every", |c| c.tx.signal_every = u32::MAX),
    ("tx.max_chain", |c| c.tx.max_chain = u32::MAX),
    ("tx.burst_bytes", |c| c.tx.burst_bytes = u32::MAX),
    ("tx.wr_pool", |c| c.tx.wr_pool = usize::MAX),
    ("tx.seed", |c| c.tx.seed = u64::MAX),
    ("tx.first_wr_seq", |c| c.tx.first_wr_seq = u64::MAX),
];

/// Each field at zero, in UC and RC mode, is refused naming the field or works.
#[test]
fn config_every_field_at_zero_is_refused_by_name_or_works() {
    let bad = guard(300, || {
        let mut bad = audit(Mode::Uc, ZEROS);
        bad.extend(audit(Mode::Rc, ZEROS));
        bad
    });
    assert!(bad.is_empty(), "zero values:\n{}", bad.join("\n"));
}

/// Each field at its type's maximum, in UC and RC mode, is refused naming the field (by
/// `validate`, or by `Engine::new` for the device's limits; the port by the device) or works;
/// none panics.
#[test]
fn config_every_field_at_its_maximum_is_refused_by_name_or_works() {
    let bad = guard(300, || {
        let mut bad = audit(Mode::Uc, MAXES);
        bad.extend(audit(Mode::Rc, MAXES));
        bad
    });
    assert!(bad.is_empty(), "maximum values:\n{}", bad.join("\n"));
}

/// `max_silence_us = 0` (a flow declared silent before its first retransmission timeout) is
/// refused by `validate`, naming `max_silence_us`.
#[test]
fn config_max_silence_us_zero_is_refused_by_name() {
    let out = guard(60, || {
        let mut c = small_config(Mode::Uc);
        c.tx.max_silence_us = 0;
        outcome(&c)
    });
    assert!(
        matches!(out, Outcome::Refused("max_silence_us")),
        "max_silence_us = 0: {out}"
    );
}

/// The smallest valid value of every field at once still moves a message, in UC and RC mode.
#[test]
fn config_smallest_valid_values_still_move_a_message() {
    let outs = guard(300, || {
        MODES.map(|mode| {
            let mut c = small_config(mode);
            c.qps_per_conn = 1;
            c.max_conns = 1;
            c.sq_depth = 2;
            c.srq_depth = 2;
            c.srq_refill = 1;
            c.ack_every = 1;
            c.ack_bytes = 1;
            c.max_recvs = 1;
            c.poll_budget = 1;
            c.tx.chunk_size = 1024;
            c.tx.flow_window = 1;
            c.tx.engine_window = 1;
            c.tx.signal_every = 1;
            c.tx.max_chain = 1;
            c.tx.wr_pool = 1;
            (mode, outcome(&c))
        })
    });
    for (mode, out) in outs {
        assert!(matches!(out, Outcome::Works), "{mode:?}: {out}");
    }
}

/// Registering a buffer too large to exist fails with verbs-safe's invalid attribute `len`,
/// and its message speaks of the length, not of an alignment that is not a power of two.
#[test]
fn register_an_impossible_size_is_a_clear_error() {
    guard(60, || {
        let (mut sim, _, _) = pair(12, &small_config(Mode::Uc));
        for len in [usize::MAX, usize::MAX / 2, 1 << 50] {
            let e = match sim.engines[0].register(len) {
                Ok(_) => panic!("register({len}) succeeded"),
                Err(e) => e,
            };
            let s = e.to_string();
            eprintln!("register({len}): {s}");
            assert!(
                matches!(
                    &e,
                    EngineError::Verbs { source, .. }
                        if matches!(**source, verbs_safe::Error::InvalidAttr { name: "len", .. })
                ),
                "register({len}): {e:?}"
            );
            assert!(s.contains("len"), "register({len}): {s}");
            assert!(!s.contains("power of two"), "register({len}): {s}");
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Sizes and counts at their limits: empty and huge buffers and messages, one-byte chunks,
// receives up to `max_recvs` (and peers that differ in it), thousands of requests outstanding.

/// A buffer of zero bytes registers, refuses a byte written into it, and carries zero-byte
/// sends, receives and writes (through a zero-byte export), in UC and RC mode.
#[test]
fn register_zero_bytes_and_move_zero_bytes_through_it() {
    guard(120, || {
        for mode in MODES {
            let (mut sim, ca, cb) = pair(11, &small_config(mode));
            let src = sim.engines[0].register(0).expect("register(0)");
            let dst = sim.engines[1].register(0).expect("register(0)");
            assert_eq!((src.len(), dst.len()), (0, 0));
            assert!(src.write_at(0, &[1]).is_err());
            let recv = sim.engines[1].recv(cb, &dst, 0, 0).unwrap();
            let send = sim.engines[0].send(ca, &src, 0, 0).unwrap();
            let d = sim.engines[1].export(&dst, 0, 0).unwrap();
            let w = sim.engines[0].write(ca, &src, 0, 0, &d, 0).unwrap();
            finish(&mut sim, 5, &[&recv, &send, &w]).unwrap();
            assert_eq!(recv.test().unwrap().unwrap().len, 0, "{mode:?}");
            assert_eq!(send.test().unwrap().unwrap().len, 0, "{mode:?}");
            assert_eq!(w.test().unwrap().unwrap().len, 0, "{mode:?}");
        }
    });
}

/// A 32 MiB message arrives byte-exact, a zero-byte one into a zero-byte receive buffer
/// works, and a one-byte one into a zero-byte buffer fails with `TooLarge { len: 1, room: 0 }`
/// at both ends; in UC and RC mode.
#[test]
fn zero_length_and_large_messages() {
    guard(300, || {
        for mode in MODES {
            let (mut sim, ca, cb) = pair(23, &small_config(mode));
            let len = 32usize << 20;
            let src = sim.engines[0].register(len).unwrap();
            let dst = sim.engines[1].register(len).unwrap();
            let data = pattern(23, 0, 0, len);
            src.write_at(0, &data).unwrap();
            // A zero-length receive buffer for a zero-length message, one for a 1-byte one.
            let r0 = sim.engines[1].recv(cb, &dst, 0, 0).unwrap();
            let r1 = sim.engines[1].recv(cb, &dst, 0, 0).unwrap();
            let rbig = sim.engines[1].recv(cb, &dst, 0, len as u64).unwrap();
            let s0 = sim.engines[0].send(ca, &src, 0, 0).unwrap();
            let s1 = sim.engines[0].send(ca, &src, 0, 1).unwrap();
            let sbig = sim.engines[0].send(ca, &src, 0, len as u64).unwrap();
            finish(&mut sim, 30, &[&r0, &r1, &rbig, &s0, &s1, &sbig])
                .unwrap_or_else(|e| panic!("{mode:?}: {e}"));
            assert_eq!(r0.test().unwrap().unwrap().len, 0, "{mode:?}");
            assert_eq!(s0.test().unwrap().unwrap().len, 0, "{mode:?}");
            for (end, r) in [("send", &s1), ("recv", &r1)] {
                let r = r.test().unwrap();
                assert!(
                    matches!(r, Err(EngineError::TooLarge { len: 1, room: 0 })),
                    "{mode:?}: the {end} of 1 byte into 0: {r:?}"
                );
            }
            assert_eq!(rbig.test().unwrap().unwrap().len, len as u64, "{mode:?}");
            assert!(sbig.test().unwrap().is_ok(), "{mode:?}");
            let mut got = vec![0u8; len];
            dst.read_at(0, &mut got).unwrap();
            assert!(got == data, "{mode:?}: the 32 MiB message differs");
        }
    });
}

/// With one-byte chunks, a 5000-byte message (5000 chunks) arrives byte-exact.
#[test]
fn one_byte_chunks_many_per_message() {
    guard(300, || {
        let mut c = small_config(Mode::Uc);
        c.tx.chunk_size = 1;
        let (mut sim, ca, cb) = pair(24, &c);
        let len = 5000;
        let src = sim.engines[0].register(len).unwrap();
        let dst = sim.engines[1].register(len).unwrap();
        let data = pattern(24, 0, 0, len);
        src.write_at(0, &data).unwrap();
        let recv = sim.engines[1].recv(cb, &dst, 0, len as u64).unwrap();
        let send = sim.engines[0].send(ca, &src, 0, len as u64).unwrap();
        finish(&mut sim, 30, &[&recv, &send]).unwrap();
        assert_eq!(recv.test().unwrap().unwrap().len, len as u64);
        let mut got = vec![0u8; len];
        dst.read_at(0, &mut got).unwrap();
        assert!(got == data);
    });
}

/// With `max_recvs = 127`, a 128th outstanding receive is `Limit`; the 127 accepted complete
/// with their messages' lengths, and 127 more after them (the receive ids wrap) complete too.
#[test]
fn receives_beyond_the_limit_are_refused_and_the_rest_complete() {
    guard(120, || {
        let mut c = small_config(Mode::Uc);
        c.max_recvs = 127;
        let (mut sim, ca, cb) = pair(26, &c);
        let src = sim.engines[0].register(4096).unwrap();
        let dst = sim.engines[1].register(4096).unwrap();
        let recvs: Vec<_> = (0..127)
            .map(|_| sim.engines[1].recv(cb, &dst, 0, 64).unwrap())
            .collect();
        assert!(matches!(
            sim.engines[1].recv(cb, &dst, 0, 64),
            Err(EngineError::Limit { .. })
        ));
        let sends: Vec<_> = (0..127)
            .map(|i| sim.engines[0].send(ca, &src, 0, i % 65).unwrap())
            .collect();
        let all: Vec<&Request> = recvs.iter().chain(&sends).collect();
        finish(&mut sim, 10, &all).unwrap();
        for (i, r) in recvs.iter().enumerate() {
            assert_eq!(r.test().unwrap().unwrap().len, i as u64 % 65);
        }
        // And again, wrapping the receive ids (seq 127..254).
        let recvs: Vec<_> = (0..127)
            .map(|_| sim.engines[1].recv(cb, &dst, 0, 64).unwrap())
            .collect();
        let sends: Vec<_> = (0..127)
            .map(|_| sim.engines[0].send(ca, &src, 0, 7).unwrap())
            .collect();
        let all: Vec<&Request> = recvs.iter().chain(&sends).collect();
        finish(&mut sim, 10, &all).unwrap();
        assert!(all.iter().all(|r| r.test().unwrap().is_ok()));
    });
}

/// A peer with `max_recvs = 1` still delivers 127 messages into 127 receives posted by an
/// engine with `max_recvs = 127`, in UC and RC mode.
#[test]
fn peers_with_different_max_recvs_still_deliver_everything() {
    guard(300, || {
        for mode in MODES {
            let many = EngineConfig {
                max_recvs: 127,
                ..small_config(mode)
            };
            let few = EngineConfig {
                max_recvs: 1,
                ..small_config(mode)
            };
            let mut sim = Sim::new(22, 2, Faults::NONE, &many);
            // Engine 1 again, with max_recvs 1.
            drop(sim.engines.pop());
            let verbs = Verbs::soft(&sim.fabric);
            let ctx = Context::open_by_name(&verbs, "soft1").unwrap();
            let e = Engine::new(&ctx, few, Clock::Fabric(sim.fabric.clone())).unwrap();
            sim.engines.push(e);
            let [a, b] = &mut sim.engines[..] else {
                unreachable!()
            };
            let (ca, cb) = connect_pair(a, b).unwrap();
            let dst = a.register(127 * 1024).unwrap();
            let src = b.register(1024).unwrap();
            let recvs: Vec<_> = (0..127)
                .map(|i| a.recv(ca, &dst, i * 1024, 1024).unwrap())
                .collect();
            let sends: Vec<_> = (0..127)
                .map(|_| b.send(cb, &src, 0, 1000).unwrap())
                .collect();
            let all: Vec<&Request> = recvs.iter().chain(&sends).collect();
            finish(&mut sim, 10, &all).unwrap_or_else(|e| panic!("{mode:?}: {e}"));
            let failed: Vec<_> = all.iter().filter_map(|r| r.test().unwrap().err()).collect();
            assert!(failed.is_empty(), "{mode:?}: {failed:?}");
        }
    });
}

/// 2000 sends queued before any receive and 1000 one-sided writes outstanding at once all
/// complete (the receiver keeps 32 receives posted), the writes' bytes byte-exact; in UC and
/// RC mode.
#[test]
fn thousands_of_sends_and_writes_outstanding_all_complete() {
    guard(300, || {
        for mode in MODES {
            let (mut sim, ca, cb) = pair(27, &small_config(mode));
            let src = sim.engines[0].register(1 << 16).unwrap();
            src.write_at(0, &pattern(27, 0, 0, 1 << 16)).unwrap();
            let dst = sim.engines[1].register(1 << 16).unwrap();
            let region = sim.engines[1].register(1 << 16).unwrap();
            let d = sim.engines[1].export(&region, 0, 1 << 16).unwrap();
            // 2000 sends queued before any receive, and 1000 writes (rids wrap every 128).
            let sends: Vec<_> = (0..2000)
                .map(|i| sim.engines[0].send(ca, &src, i % 1000, 64).unwrap())
                .collect();
            let writes: Vec<_> = (0..1000)
                .map(|i| {
                    sim.engines[0]
                        .write(ca, &src, i * 64, 64, &d, i * 64)
                        .unwrap()
                })
                .collect();
            let mut recvs: Vec<Request> = Vec::new();
            let limit = sim.fabric.now() + Duration::from_secs(60);
            sim.run(limit, |s| {
                // Keep up to 32 receives posted.
                while recvs.len() < 2000 && recvs.iter().filter(|r| !r.is_done()).count() < 32 {
                    recvs.push(s.engines[1].recv(cb, &dst, 0, 64).unwrap());
                }
                recvs.len() == 2000
                    && all_done(
                        &recvs
                            .iter()
                            .chain(&sends)
                            .chain(&writes)
                            .collect::<Vec<_>>(),
                    )
            })
            .unwrap_or_else(|e| panic!("{mode:?}: {e}"));
            let failed = recvs
                .iter()
                .chain(&sends)
                .chain(&writes)
                .filter(|r| r.test().unwrap().is_err())
                .count();
            assert_eq!(failed, 0, "{mode:?}");
            let mut got = vec![0u8; 64_000];
            region.read_at(0, &mut got).unwrap();
            let mut want = vec![0u8; 64_000];
            src.read_at(0, &mut want).unwrap();
            assert!(got == want, "{mode:?}: the writes' bytes differ");
        }
    });
}

/// What only the device knows is checked by `Engine::new` and named: a port the device does
/// not have, chunks longer than the port's largest message. A fabric MTU below the engine's
/// path MTU is not an error: the engine's QPs take the smaller (its memory-window QP, which
/// carries no data, the smallest).
#[test]
fn device_limits_are_named_or_taken() {
    let engine_on = |fc: FabricConfig, cfg: EngineConfig| {
        let fabric = Fabric::new(fc);
        let verbs = Verbs::soft(&fabric);
        let clock = Clock::Fabric(fabric.clone());
        let open = |name| Context::open_by_name(&verbs, name).unwrap();
        let a = Engine::new(&open("soft0"), cfg.clone(), clock.clone());
        let b = Engine::new(&open("soft1"), cfg, clock);
        (fabric, a, b)
    };
    let port = EngineConfig {
        port: 2,
        ..EngineConfig::default()
    };
    let (_, a, _) = engine_on(FabricConfig::default(), port);
    assert_eq!(a.err().as_ref().and_then(named_field), Some("port"));
    let short = FabricConfig {
        max_msg_size: 1024,
        ..FabricConfig::default()
    };
    let (_, a, _) = engine_on(short, EngineConfig::default());
    assert_eq!(a.err().as_ref().and_then(named_field), Some("chunk_size"));
    let small_mtu = FabricConfig {
        mtu: 1000,
        ..FabricConfig::default()
    };
    let (fabric, a, b) = engine_on(small_mtu, EngineConfig::default());
    let (mut a, mut b) = (a.unwrap(), b.unwrap());
    let (ca, cb) = connect_pair(&mut a, &mut b).unwrap();
    let (src, dst) = (a.register(64 << 10).unwrap(), b.register(64 << 10).unwrap());
    let data = pattern(3, 0, 0, 64 << 10);
    src.write_at(0, &data).unwrap();
    let recv = b.recv(cb, &dst, 0, 64 << 10).unwrap();
    let send = a.send(ca, &src, 0, 64 << 10).unwrap();
    while recv.test().is_none() || send.test().is_none() {
        a.poll().unwrap();
        b.poll().unwrap();
        assert!(fabric.now_ns() < 5_000_000_000, "stuck");
    }
    let mut got = vec![0u8; 64 << 10];
    dst.read_at(0, &mut got).unwrap();
    assert!(got == data);
}
