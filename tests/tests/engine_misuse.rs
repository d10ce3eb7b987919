//! uccl-engine's buffers, connections and requests misused: ranges past a buffer's end,
//! objects of another engine, connection ids used after close, garbage handshakes, messages
//! larger than their receive buffer, forged descriptors, and engines and requests dropped with
//! work in flight. Each probe asserts an error naming what is wrong, or that everything still
//! arrives; nothing panics or hangs (a wall-clock hang guard, a virtual-time fabric with a
//! limit).
//!
//! Values at their limits (configuration fields, sizes, counts) are in
//! `engine_misuse_config.rs`, the threaded engine in `engine_misuse_threaded.rs`.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use softnic::Faults;
use uccl_engine::{
    Access, Descriptor, EngineError, MAX_NOTED, MAX_WAITING_NOTES, Mode, Opts, Request,
    connect_pair,
};
use uccl_integration::misuse::{all_done, finish, guard, pair, panic_msg, small_config};
use uccl_integration::{Sim, pattern};

/// Both modes of the engine.
const MODES: [Mode; 2] = [Mode::Uc, Mode::Rc];

/// Asserts that `e` names connections and buffers in words ("connection 0 of engine 2
/// (generation 1)", "buffer 0 (generation 0)"), never as a Debug dump of their ids.
fn assert_in_words(e: &EngineError) {
    let s = e.to_string();
    assert!(
        !s.contains("ConnId") && !s.contains("BufferId"),
        "an error prints an id's Debug: {s}"
    );
}

// ---------------------------------------------------------------------------------------------
// Buffers and ranges.

/// A descriptor withdrawn with anything changed (its key, place, length or rights) is not one
/// this engine gave: `NoExport`, the export staying until its own descriptor withdraws it.
#[test]
fn a_withdrawal_of_a_descriptor_changed_in_any_field_is_no_export() {
    guard(60, || {
        let (mut sim, _ca, _cb) = pair(17, &small_config(Mode::Uc));
        let e = &mut sim.engines[1];
        let buf = e.register(8192).unwrap();
        let d = e.export_with(&buf, 4096, 4096, Access::WRITE).unwrap();
        let forged = [
            Descriptor {
                rkey: d.rkey ^ 1,
                ..d
            },
            Descriptor {
                addr: d.addr + 1,
                ..d
            },
            Descriptor {
                len: d.len - 1,
                ..d
            },
            Descriptor {
                access: Access::READ_WRITE,
                ..d
            },
            Descriptor {
                access: Access::READ,
                ..d
            },
        ];
        for f in forged {
            let r = e.withdraw_export(&f);
            assert!(
                matches!(r, Err(EngineError::NoExport(x)) if x == f),
                "{f:?}: {r:?}"
            );
            assert_eq!(e.usage().exports, 1, "{f:?}");
        }
        e.withdraw_export(&d).unwrap();
        assert_eq!(e.usage().exports, 0);
    });
}

/// Ranges past a buffer's end, or whose end wraps `u64`, are refused with `BadRange` by send,
/// recv, write and export (and by `read_at`); so are destination offsets past a descriptor's
/// region and a forged descriptor whose region wraps the address space. Nothing refused is
/// queued: a good send and receive afterwards still match each other.
#[test]
fn ranges_past_the_end_or_wrapping_u64_are_bad_range() {
    guard(120, || {
        let (mut sim, ca, cb) = pair(13, &small_config(Mode::Uc));
        let buf = sim.engines[0].register(4096).unwrap();
        let far = sim.engines[1].register(4096).unwrap();
        let d = sim.engines[1].export(&far, 0, 4096).unwrap();
        let a = &mut sim.engines[0];
        let ranges = [
            (0, 4097),
            (4096, 1),
            (4097, 0),
            (u64::MAX, 1),
            (1, u64::MAX),
            (u64::MAX, u64::MAX),
            (u64::MAX, 0),
        ];
        for (off, len) in ranges {
            let bad = |r: Result<Request, EngineError>| matches!(r, Err(EngineError::BadRange(_)));
            assert!(bad(a.send(ca, &buf, off, len)), "send {off}+{len}");
            assert!(bad(a.recv(ca, &buf, off, len)), "recv {off}+{len}");
            assert!(bad(a.write(ca, &buf, off, len, &d, 0)), "write {off}+{len}");
            assert!(
                matches!(a.export(&buf, off, len), Err(EngineError::BadRange(_))),
                "export {off}+{len}"
            );
            let r = buf.read_at(off as usize, &mut [0u8; 2]);
            assert!(
                r.is_err() || off < 4095,
                "read_at({off}, 2 bytes) of a 4096-byte buffer: {r:?}"
            );
        }
        // Destination offsets past the region or wrapping.
        for dst_off in [4096, u64::MAX, u64::MAX - 1] {
            assert!(
                matches!(
                    a.write(ca, &buf, 0, 2, &d, dst_off),
                    Err(EngineError::BadRange(_))
                ),
                "dst_offset {dst_off}"
            );
        }
        // A forged descriptor whose region wraps the address space.
        let wrap = Descriptor {
            addr: u64::MAX - 10,
            len: 100,
            ..d
        };
        assert!(matches!(
            a.write(ca, &buf, 0, 50, &wrap, 20),
            Err(EngineError::BadRange(_))
        ));
        assert!(Descriptor::from_bytes(&[0u8; 20]).is_none());
        // The errors say which range, and what it runs past.
        let e = a.send(ca, &buf, 4000, 97).unwrap_err();
        assert_in_words(&e);
        let e = e.to_string();
        let id = buf.id();
        let want = format!("97 bytes at offset 4000 runs past buffer {id} (4096 bytes)");
        assert!(e.contains(&want), "{e}");
        let e = a.write(ca, &buf, 0, 2, &d, 4095).unwrap_err().to_string();
        let want = format!(
            "2 bytes at offset 4095 run past the 4096-byte export with rkey {:#x}",
            d.rkey
        );
        assert!(e.contains(&want), "{e}");
        // Nothing was queued by the refusals: one good pair still matches in order.
        let recv = sim.engines[1].recv(cb, &far, 0, 4096).unwrap();
        let send = sim.engines[0].send(ca, &buf, 0, 100).unwrap();
        finish(&mut sim, 5, &[&recv, &send]).unwrap();
        assert_eq!(recv.test().unwrap().unwrap().len, 100);
    });
}

/// A buffer registered with another engine is refused with `BadRange` by send, recv, write
/// and export; the engine's own buffer is accepted.
#[test]
fn a_buffer_of_another_engine_is_refused_everywhere() {
    guard(120, || {
        let mut sim = Sim::new(14, 3, Faults::NONE, &small_config(Mode::Uc));
        let [a, b, c] = &mut sim.engines[..] else {
            unreachable!()
        };
        let (ca, _cb) = connect_pair(a, b).unwrap();
        let foreign = c.register(4096).unwrap();
        let mine = a.register(4096).unwrap();
        let d = b.register(4096).unwrap();
        let d = b.export(&d, 0, 4096).unwrap();
        let bad = |r: Result<Request, EngineError>| matches!(r, Err(EngineError::BadRange(_)));
        assert!(bad(a.send(ca, &foreign, 0, 1)));
        assert!(bad(a.recv(ca, &foreign, 0, 1)));
        assert!(bad(a.write(ca, &foreign, 0, 1, &d, 0)));
        assert!(matches!(
            a.export(&foreign, 0, 1),
            Err(EngineError::BadRange(_))
        ));
        assert!(a.send(ca, &mine, 0, 1).is_ok());
    });
}

// ---------------------------------------------------------------------------------------------
// Connections.

/// Another engine's connection id is `NoConnection`; closing twice before a round is `Ok`;
/// a send, receive or write on a connection being closed is refused at once; both ends are gone within 50 ms of virtual time (no RC timeout); the closed id is then
/// `NoConnection` for close and send, and the engine's other connection stays open. In UC
/// and RC mode.
#[test]
fn conn_ids_of_another_engine_and_after_closing_twice() {
    guard(120, || {
        for mode in MODES {
            let mut sim = Sim::new(16, 3, Faults::NONE, &small_config(mode));
            let [a, b, c] = &mut sim.engines[..] else {
                unreachable!()
            };
            let (ca, cb) = connect_pair(a, b).unwrap();
            let (cc_a, _cc_c) = connect_pair(a, c).unwrap();
            let buf_a = a.register(4096).unwrap();
            let buf_b = b.register(4096).unwrap();
            // Another engine's id (a's id on b, b's id on a).
            assert!(matches!(
                b.send(ca, &buf_b, 0, 1),
                Err(EngineError::NoConnection(_))
            ));
            assert!(matches!(
                a.send(cb, &buf_a, 0, 1),
                Err(EngineError::NoConnection(_))
            ));
            // Close twice before the engine ran a round.
            let pending = b.recv(cb, &buf_b, 0, 4096).unwrap();
            a.close(ca).unwrap();
            let second = a.close(ca);
            assert!(second.is_ok(), "{mode:?}: the second close: {second:?}");
            // A connection being closed takes no new request: each is refused at once, with
            // what its requests fail with.
            let late_recv = a.recv(ca, &buf_a, 0, 10);
            let late_write = a.write(ca, &buf_a, 0, 10, &b.export(&buf_b, 0, 4096).unwrap(), 0);
            for late in [a.send(ca, &buf_a, 0, 10), late_recv, late_write] {
                match late {
                    Err(EngineError::ConnectionFailed { conn, reason }) => {
                        assert_eq!((conn, &*reason), (ca, "closed by this end"), "{mode:?}")
                    }
                    other => panic!("{mode:?}: a request after close: {other:?}"),
                }
            }
            let start = sim.fabric.now();
            let limit = start + Duration::from_secs(10);
            sim.run(limit, |s| {
                pending.is_done()
                    && !s.engines[0].is_open(ca)
                    && !s.engines[1].is_open(cb)
                    && s.engines[0].usage().connections == 1
                    && s.engines[1].usage().connections == 0
            })
            .unwrap_or_else(|e| panic!("{mode:?}: closing twice: {e}"));
            let took = sim.fabric.now() - start;
            assert!(
                took < Duration::from_millis(50),
                "{mode:?}: closing twice took {took:?} of virtual time (an RC timeout?)"
            );
            // Freed: a later call says how it ended.
            let a = &mut sim.engines[0];
            for late in [a.close(ca).map(drop), a.send(ca, &buf_a, 0, 1).map(drop)] {
                match late {
                    Err(EngineError::ConnectionFailed { conn, reason }) => {
                        assert_eq!((conn, &*reason), (ca, "closed by this end"), "{mode:?}")
                    }
                    other => panic!("{mode:?}: a call after the close: {other:?}"),
                }
            }
            assert!(a.is_open(cc_a), "{mode:?}: the other connection");
        }
    });
}

/// Closes a connection with a receive outstanding at each end (a second time at once when
/// `twice`) and runs until both ends are gone: what the closing end's device sent (send WRs,
/// packets) and the error of its receive.
fn close_with_a_receive_outstanding(mode: Mode, twice: bool) -> (u64, u64, EngineError) {
    let (mut sim, ca, cb) = pair(17, &small_config(mode));
    let buf = sim.engines[0].register(4096).unwrap();
    let dst = sim.engines[1].register(4096).unwrap();
    let recv = sim.engines[0].recv(ca, &buf, 0, 4096).unwrap();
    let peer = sim.engines[1].recv(cb, &dst, 0, 4096).unwrap();
    sim.engines[0].close(ca).unwrap();
    if twice {
        let r = sim.engines[0].close(ca);
        assert!(r.is_ok(), "{mode:?}: the second close: {r:?}");
    }
    let limit = sim.fabric.now() + Duration::from_secs(10);
    sim.run(limit, |s| {
        all_done(&[&recv, &peer]) && s.engines.iter().all(|e| e.usage().connections == 0)
    })
    .unwrap_or_else(|e| panic!("{mode:?}: {e}"));
    let sent = sim.fabric.device_counters("soft0").unwrap();
    (
        sent.send_wrs,
        sent.packets_sent,
        recv.test().unwrap().unwrap_err(),
    )
}

/// Closing a connection twice is `Ok` and idempotent: the closing end sends exactly what it
/// sends when closing once, and its outstanding receive fails with the close ("closed by this
/// end", the connection named in words), not a control QP's error. In UC and RC mode.
#[test]
fn closing_twice_sends_nothing_more_and_fails_requests_with_the_close() {
    guard(120, || {
        for mode in MODES {
            let (wrs1, packets1, _) = close_with_a_receive_outstanding(mode, false);
            let (wrs2, packets2, e) = close_with_a_receive_outstanding(mode, true);
            eprintln!(
                "{mode:?}: closing once sent {wrs1} WRs in {packets1} packets, twice \
                 {wrs2} in {packets2}; the receive: {e}"
            );
            assert_eq!(
                (wrs2, packets2),
                (wrs1, packets1),
                "{mode:?}: (send WRs, packets) closing twice, against closing once"
            );
            let s = e.to_string();
            assert!(
                s.contains("closed by this end"),
                "{mode:?}: the local request failed with: {s}"
            );
            assert_in_words(&e);
        }
    });
}

/// An offered, not completed id is `NoConnection` for send, close and (once withdrawn, twice
/// without harm) complete; offers beyond `max_conns` are `Limit` until withdrawn; every
/// truncation of a valid handshake is refused without a panic, trailing garbage is not a
/// panic either; and completing a connection twice is `NoConnection`.
#[test]
fn offers_completes_withdraws_and_garbage_handshakes() {
    guard(120, || {
        let (mut sim, _, _) = pair(18, &small_config(Mode::Uc));
        let [a, b] = &mut sim.engines[..] else {
            unreachable!()
        };
        let buf = a.register(4096).unwrap();
        // Using an offered, not completed id.
        let (offered, _) = a.offer().unwrap();
        assert!(matches!(
            a.send(offered, &buf, 0, 1),
            Err(EngineError::NoConnection(_))
        ));
        assert!(matches!(
            a.close(offered),
            Err(EngineError::NoConnection(_))
        ));
        a.withdraw(offered);
        a.withdraw(offered);
        assert!(matches!(
            a.complete(offered, &[]),
            Err(EngineError::NoConnection(_))
        ));
        // The max_conns limit (8; one used by the pair) is an error, and withdrawing frees.
        let offers: Vec<_> = (0..7).map(|_| a.offer().unwrap().0).collect();
        assert!(matches!(a.offer(), Err(EngineError::Limit { .. })));
        for o in offers {
            a.withdraw(o);
        }
        // Every truncation of a valid handshake is refused.
        let (theirs, hello) = b.offer().unwrap();
        for n in 0..hello.len() {
            let (mine, _) = a.offer().unwrap();
            match catch_unwind(AssertUnwindSafe(|| a.complete(mine, &hello[..n]))) {
                Err(p) => panic!(
                    "complete with {n} of {} bytes panicked: {}",
                    hello.len(),
                    panic_msg(p)
                ),
                Ok(Ok(())) => panic!("a handshake cut to {n} bytes was accepted"),
                Ok(Err(_)) => {}
            }
        }
        // Trailing garbage.
        let mut long = hello.clone();
        long.extend_from_slice(&[0xff; 64]);
        let (mine, _) = a.offer().unwrap();
        let r = a.complete(mine, &long);
        eprintln!("a handshake with 64 trailing bytes: {r:?}");
        if r.is_ok() {
            a.close(mine).unwrap();
        }
        b.withdraw(theirs);
        // Completing twice.
        let (x, hx) = a.offer().unwrap();
        let (y, hy) = b.offer().unwrap();
        a.complete(x, &hy).unwrap();
        b.complete(y, &hx).unwrap();
        assert!(matches!(
            a.complete(x, &hy),
            Err(EngineError::NoConnection(_))
        ));
    });
}

/// A handshake with any one bit flipped (the lowest or highest of any byte) never panics;
/// a bogus connection it opens goes away after a close within 30 s of virtual time.
#[test]
fn single_bit_flips_in_a_handshake_never_panic() {
    guard(300, || {
        let mut sim = Sim::new(19, 2, Faults::NONE, &small_config(Mode::Uc));
        let (theirs, hello) = sim.engines[1].offer().unwrap();
        let mut panics = Vec::new();
        for i in 0..hello.len() {
            for bit in [0x01u8, 0x80] {
                let mut h = hello.clone();
                h[i] ^= bit;
                let a = &mut sim.engines[0];
                let (mine, _) = a.offer().unwrap();
                match catch_unwind(AssertUnwindSafe(|| a.complete(mine, &h))) {
                    Err(p) => panics.push(format!("byte {i} ^ {bit:#x}: {}", panic_msg(p))),
                    Ok(Err(_)) => {}
                    Ok(Ok(())) => {
                        a.close(mine).unwrap();
                        let limit = sim.fabric.now() + Duration::from_secs(30);
                        sim.run(limit, |s| s.engines[0].usage().connections == 0)
                            .unwrap_or_else(|e| {
                                panic!("byte {i} ^ {bit:#x}: a bogus connection never went: {e}")
                            });
                    }
                }
            }
        }
        sim.engines[1].withdraw(theirs);
        assert!(panics.is_empty(), "{}", panics.join("\n"));
    });
}

/// Two offers of one engine completed with each other's handshake make a loopback
/// connection that carries a 100 kB message byte-exact, in UC and RC mode.
#[test]
fn a_connection_of_an_engine_to_itself() {
    guard(120, || {
        for mode in MODES {
            let mut sim = Sim::new(20, 1, Faults::NONE, &small_config(mode));
            let a = &mut sim.engines[0];
            let (c1, h1) = a.offer().unwrap();
            let (c2, h2) = a.offer().unwrap();
            a.complete(c1, &h2).unwrap();
            a.complete(c2, &h1).unwrap();
            let src = a.register(100_000).unwrap();
            let dst = a.register(100_000).unwrap();
            let data = pattern(20, 0, 0, 100_000);
            src.write_at(0, &data).unwrap();
            let recv = a.recv(c2, &dst, 0, 100_000).unwrap();
            let send = a.send(c1, &src, 0, 100_000).unwrap();
            finish(&mut sim, 5, &[&recv, &send])
                .unwrap_or_else(|e| panic!("{mode:?} loopback: {e}"));
            assert_eq!(recv.test().unwrap().unwrap().len, 100_000, "{mode:?}");
            assert!(send.test().unwrap().is_ok(), "{mode:?}");
            let mut got = vec![0u8; 100_000];
            dst.read_at(0, &mut got).unwrap();
            assert!(got == data, "{mode:?}: the loopback message differs");
        }
    });
}

/// An offer completed with its own handshake is either refused or a connection to itself
/// that carries a message (send and receive both succeed), in UC and RC mode.
#[test]
fn an_offer_completed_with_its_own_handshake_is_refused_or_works() {
    guard(120, || {
        for mode in MODES {
            let mut sim = Sim::new(21, 1, Faults::NONE, &small_config(mode));
            let a = &mut sim.engines[0];
            let (c, h) = a.offer().unwrap();
            let r = a.complete(c, &h);
            eprintln!("{mode:?}: completing an offer with its own handshake: {r:?}");
            if r.is_err() {
                continue;
            }
            let src = a.register(50_000).unwrap();
            let dst = a.register(50_000).unwrap();
            let recv = a.recv(c, &dst, 0, 50_000).unwrap();
            let send = a.send(c, &src, 0, 50_000).unwrap();
            finish(&mut sim, 5, &[&recv, &send])
                .unwrap_or_else(|e| panic!("{mode:?} self-connection: {e}"));
            let (r, s) = (recv.test().unwrap(), send.test().unwrap());
            assert!(
                matches!(&r, Ok(d) if d.len == 50_000) && s.is_ok(),
                "{mode:?}: recv {r:?}, send {s:?}"
            );
        }
    });
}

/// After a connection's peer engine is dropped mid-transfer, the dropped engine's requests
/// fail with `Stopped`; the survivor keeps polling without an error, fails what waits on the
/// peer (the connection named in words), closes the connection, and refuses closing it again.
/// In UC and RC mode.
#[test]
fn dropping_an_engine_fails_its_requests_and_the_peers() {
    guard(120, || {
        for mode in MODES {
            let (mut sim, ca, cb) = pair(29, &small_config(mode));
            let src = sim.engines[0].register(4 << 20).unwrap();
            let dst = sim.engines[1].register(4 << 20).unwrap();
            let mine = sim.engines[0].recv(ca, &src, 0, 4096).unwrap();
            let recv = sim.engines[1].recv(cb, &dst, 0, 4 << 20).unwrap();
            let send = sim.engines[0].send(ca, &src, 0, 4 << 20).unwrap();
            let peer_wait = sim.engines[1].recv(cb, &dst, 0, 10).unwrap();
            // A few rounds: the transfer is under way.
            for _ in 0..50 {
                for e in &mut sim.engines {
                    e.poll().unwrap();
                }
                sim.fabric.advance(Duration::from_micros(5));
            }
            drop(sim.engines.remove(0));
            assert!(
                matches!(send.test(), Some(Err(EngineError::Stopped))),
                "{mode:?}"
            );
            assert!(
                matches!(mine.test(), Some(Err(EngineError::Stopped))),
                "{mode:?}"
            );
            // The survivor keeps polling without an error and fails what waits on the peer.
            finish(&mut sim, 30, &[&recv, &peer_wait])
                .unwrap_or_else(|e| panic!("{mode:?}: the survivor: {e}"));
            let e = peer_wait.test().unwrap().unwrap_err();
            eprintln!("{mode:?}: the survivor's receive: {e}");
            assert_in_words(&e);
            assert!(!sim.engines[0].is_open(cb));
            // Closing the dead connection afterwards is an error, not a panic.
            let r = sim.engines[0].close(cb);
            assert!(r.is_err(), "{r:?}");
            for _ in 0..100 {
                sim.engines[0].poll().unwrap();
            }
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Requests.

/// A 101-byte message for a 100-byte receive buffer fails with `TooLarge { len: 101, room:
/// 100 }` at both ends, in UC and RC mode.
#[test]
fn a_receive_smaller_than_the_message_fails_with_too_large_on_both_ends() {
    guard(120, || {
        for mode in MODES {
            let (mut sim, ca, cb) = pair(25, &small_config(mode));
            let src = sim.engines[0].register(8192).unwrap();
            let dst = sim.engines[1].register(8192).unwrap();
            let recv = sim.engines[1].recv(cb, &dst, 0, 100).unwrap();
            let send = sim.engines[0].send(ca, &src, 0, 101).unwrap();
            finish(&mut sim, 5, &[&recv, &send]).unwrap();
            for (end, r) in [("sender", &send), ("receiver", &recv)] {
                let r = r.test().unwrap();
                assert!(
                    matches!(
                        r,
                        Err(EngineError::TooLarge {
                            len: 101,
                            room: 100
                        })
                    ),
                    "{mode:?}: the {end}: {r:?}"
                );
            }
        }
    });
}

/// A send and its receive dropped (requests and buffer handles) as soon as they are posted
/// still deliver the message; a second message after them completes. In UC and RC mode.
#[test]
fn dropping_requests_and_buffers_in_flight_loses_nothing() {
    guard(120, || {
        for mode in MODES {
            let (mut sim, ca, cb) = pair(28, &small_config(mode));
            let src = sim.engines[0].register(1 << 20).unwrap();
            let data = pattern(28, 0, 0, 1 << 20);
            src.write_at(0, &data).unwrap();
            let dst = sim.engines[1].register(1 << 20).unwrap();
            let keep = dst.clone();
            // Requests and buffer handles dropped at once.
            drop(sim.engines[1].recv(cb, &dst, 0, 1 << 20).unwrap());
            drop(sim.engines[0].send(ca, &src, 0, 1 << 20).unwrap());
            drop(src);
            drop(dst);
            // A second pair, kept, completes after them, in order.
            let src2 = sim.engines[0].register(16).unwrap();
            src2.write_at(0, b"second message!!").unwrap();
            let dst2 = sim.engines[1].register(16).unwrap();
            let r2 = sim.engines[1].recv(cb, &dst2, 0, 16).unwrap();
            let s2 = sim.engines[0].send(ca, &src2, 0, 16).unwrap();
            finish(&mut sim, 10, &[&r2, &s2]).unwrap();
            assert_eq!(r2.test().unwrap().unwrap().len, 16);
            let mut got = vec![0u8; 1 << 20];
            keep.read_at(0, &mut got).unwrap();
            assert!(got == data, "{mode:?}: the first message did not land");
        }
    });
}

/// A forgery of a descriptor from the peer's good one and a third engine's: its name and
/// the forgery.
type Forgery = (&'static str, fn(&Descriptor, &Descriptor) -> Descriptor);

/// A wrong rkey on the peer's region, and a third engine's (valid) descriptor.
const FORGERIES: [Forgery; 2] = [
    ("a wrong rkey", |good, _| Descriptor {
        rkey: good.rkey ^ 0x0101_0101,
        ..*good
    }),
    ("a third engine's descriptor", |_, theirs| *theirs),
];

/// A one-sided write with a forged descriptor (a wrong rkey, or a third engine's) fails;
/// the send posted after it completes no sooner than it (completions in message order), and
/// that send and the peer's receive agree: both succeed or both fail, never a send reported
/// delivered while its receive fails. The sender's errors say why: on UC the receiver tells
/// it which chunk it could not place (not its retransmissions running out), on RC the
/// peer's NIC refuses the WRITE (a remote access error, not just "a data QP failed"). Errors
/// name connections in words. In UC and RC mode.
#[test]
fn a_write_with_a_forged_descriptor_fails_and_the_next_send_agrees_with_its_receive() {
    guard(300, || {
        for mode in MODES {
            for (what, forge) in FORGERIES {
                let mut sim = Sim::new(30, 3, Faults::NONE, &small_config(mode));
                let [a, b, c] = &mut sim.engines[..] else {
                    unreachable!()
                };
                let (ca, cb) = connect_pair(a, b).unwrap();
                let src = a.register(1 << 16).unwrap();
                let region = b.register(1 << 16).unwrap();
                let good = b.export(&region, 0, 1 << 16).unwrap();
                let elsewhere = c.register(1 << 16).unwrap();
                let theirs = c.export(&elsewhere, 0, 1 << 16).unwrap();
                let bad = forge(&good, &theirs);
                let dst = b.register(4096).unwrap();
                let recv = b.recv(cb, &dst, 0, 4096).unwrap();
                let w = a.write(ca, &src, 0, 20_000, &bad, 0).unwrap();
                let send = a.send(ca, &src, 0, 4096).unwrap();
                // The round in which each of the write, the send and the receive completed.
                let reqs = [&w, &send, &recv];
                let mut done_in = [None; 3];
                let mut round = 0u64;
                let limit = sim.fabric.now() + Duration::from_secs(30);
                sim.run(limit, |_| {
                    round += 1;
                    for (d, r) in done_in.iter_mut().zip(reqs) {
                        if d.is_none() && r.is_done() {
                            *d = Some(round);
                        }
                    }
                    all_done(&reqs)
                })
                .unwrap_or_else(|e| panic!("{mode:?}, {what}: {e}"));
                let (w, s, r) = (
                    w.test().unwrap(),
                    send.test().unwrap(),
                    recv.test().unwrap(),
                );
                eprintln!("{mode:?}, {what}:\n  write: {w:?}\n  send: {s:?}\n  recv: {r:?}");
                for e in [&w, &s, &r].into_iter().filter_map(|x| x.as_ref().err()) {
                    assert_in_words(e);
                }
                assert!(w.is_err(), "{mode:?}: a write with {what} succeeded");
                assert!(
                    done_in[0] <= done_in[1],
                    "{mode:?}, {what}: the send completed (round {:?}) before the write \
                     posted before it (round {:?})",
                    done_in[1],
                    done_in[0]
                );
                assert!(
                    s.is_ok() == r.is_ok(),
                    "{mode:?}, {what}: the send and its receive disagree: send {s:?}, recv {r:?}"
                );
                // UC: the receiver notes the first retransmission it may not place. RC: the
                // peer's NIC refuses the WRITE. Either way the sender's errors say why.
                let why = match mode {
                    Mode::Uc => "the peer refused a chunk",
                    Mode::Rc => "remote access error",
                };
                for x in [&w, &s] {
                    let e = x
                        .as_ref()
                        .err()
                        .map(ToString::to_string)
                        .unwrap_or_default();
                    assert!(e.contains(why), "{mode:?}, {what}: {e}");
                }
            }
        }
    });
}

/// `Engine::wait` on a request of another engine returns `OtherEngine("request")` at once
/// (instead of polling forever); the request still completes on its own engine, and then
/// waiting on it anywhere gives its result.
#[test]
fn engine_wait_on_a_request_of_another_engine_is_refused() {
    guard(60, || {
        let (mut sim, ca, cb) = pair(32, &small_config(Mode::Uc));
        let dst = sim.engines[1].register(4096).unwrap();
        let foreign = sim.engines[1].recv(cb, &dst, 0, 4096).unwrap();
        let r = sim.engines[0].wait(&foreign);
        assert!(
            matches!(r, Err(EngineError::OtherEngine("request"))),
            "{r:?}"
        );
        let src = sim.engines[0].register(4096).unwrap();
        let send = sim.engines[0].send(ca, &src, 0, 10).unwrap();
        finish(&mut sim, 5, &[&foreign, &send]).unwrap();
        assert_eq!(foreign.test().unwrap().unwrap().len, 10);
        // Once it has completed, waiting on it anywhere gives its result.
        assert_eq!(sim.engines[0].wait(&foreign).unwrap().len, 10);
    });
}

/// `NoConnection` for another engine's id prints the id in words: "no connection 0 of
/// engine 1 (generation 1)".
#[test]
fn no_connection_names_the_connection_in_words() {
    guard(60, || {
        let (mut sim, ca, _cb) = pair(33, &small_config(Mode::Uc));
        let buf = sim.engines[1].register(64).unwrap();
        let e = sim.engines[1].send(ca, &buf, 0, 1).unwrap_err();
        let s = e.to_string();
        assert!(
            s.starts_with("no connection 0 of engine ") && s.ends_with(" (generation 1)"),
            "{s}"
        );
        assert_eq!(s, format!("no connection {ca}"));
    });
}

// ---------------------------------------------------------------------------------------------
// Notes nobody takes.

/// Notified writes until `n` more notes were delivered on `cb`, `MAX_NOTED` at a time.
fn notify(sim: &mut Sim, ca: uccl_engine::ConnId, n: u32) -> Vec<Request> {
    let src = sim.engines[0].register(64).unwrap();
    let dst = sim.engines[1].register(64).unwrap();
    let d = sim.engines[1].export(&dst, 0, 64).unwrap();
    let mut last = Vec::new();
    let mut left = n;
    while left > 0 {
        let batch = left.min(MAX_NOTED);
        last = (0..batch)
            .map(|i| {
                let opts = Opts::default().note(&i.to_le_bytes()).unwrap();
                sim.engines[0]
                    .write_with(ca, &src, 0, 1, &d, 0, opts)
                    .unwrap()
            })
            .collect();
        let reqs: Vec<&Request> = last.iter().collect();
        let want = sim.engines[1].stats().notes_received + u64::from(batch);
        let limit = sim.fabric.now() + Duration::from_secs(10);
        sim.run(limit, |s| {
            all_done(&reqs) && s.engines[1].stats().notes_received >= want
        })
        .unwrap();
        left -= batch;
    }
    last
}

/// An application that never takes its notes: a connection's notes wait for it up to
/// `MAX_WAITING_NOTES`, and the next one fails that connection, naming why (a peer cannot
/// fill the engine's memory with notes). Notes taken make room again.
#[test]
fn notes_nobody_takes_fail_their_connection_past_the_limit() {
    let (mut sim, ca, cb) = pair(61, &small_config(Mode::Uc));
    let notes = sim.engines[1].notifications();
    let inbox = sim.engines[1].register(64).unwrap();
    let recv = sim.engines[1].recv(cb, &inbox, 0, 64).unwrap();
    for w in notify(&mut sim, ca, MAX_WAITING_NOTES) {
        w.test().unwrap().unwrap();
    }
    assert_eq!(notes.len(), MAX_WAITING_NOTES as usize);
    assert!(!recv.is_done(), "the connection is up");
    // One taken, one more in: still up.
    notes.pop().unwrap();
    notify(&mut sim, ca, 1)[0].test().unwrap().unwrap();
    assert!(!recv.is_done(), "the connection is up");
    // One too many.
    let src = sim.engines[0].register(64).unwrap();
    let d = sim.engines[1].export(&inbox, 0, 64).unwrap();
    let more = Opts::default().note(b"more").unwrap();
    let w = sim.engines[0]
        .write_with(ca, &src, 0, 1, &d, 0, more)
        .unwrap();
    finish(&mut sim, 10, &[&recv, &w]).unwrap();
    match recv.test().unwrap() {
        Err(EngineError::ConnectionFailed { reason, .. }) => {
            assert!(reason.contains("notes"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        notes.len(),
        MAX_WAITING_NOTES as usize,
        "the last note was not kept"
    );
    // The next connection in the same slot starts with none of its own waiting.
    let limit = sim.fabric.now() + Duration::from_secs(10);
    sim.run(limit, |s| s.engines[1].usage().connections == 0)
        .unwrap();
    let link = sim.connect(0, 1).unwrap();
    let slot = |c: &uccl_engine::ConnId| c.to_string().split(" (").next().unwrap().to_string();
    assert_eq!(slot(&link.cb), slot(&cb), "the slot is used again");
    notify(&mut sim, link.ca, 1)[0].test().unwrap().unwrap();
    assert_eq!(notes.len(), MAX_WAITING_NOTES as usize + 1);
}
