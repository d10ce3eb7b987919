//! Isolation: a peer reaches only the memory it was given, only while it holds it. A hostile
//! peer made of raw verbs ([`RawPeer`]) connects to a victim engine with a real handshake and
//! writes where it should not: outside an export, through an export after it was withdrawn or
//! its buffer given back, with keys guessed from every key it saw, into a receive after it
//! completed, into a buffer advertised to another connection. Every such write fails where it
//! must, and the victim's memory stays byte for byte as it was (guard bytes and all):
//! - RC: the raw peer's WR completes with `REM_ACCESS_ERR` (the victim's NIC refused it), the
//!   victim's connection to the attacker fails, and its honest connection (to another engine)
//!   still carries a message byte-exact afterwards;
//! - UC: the victim's NIC drops the WRITE (its device counts the message dropped; the engine
//!   sees no completion), and the same bytes sent as a retransmission (a SEND of
//!   `[retransmission header | payload]` into the victim's SRQ) with the forged header are
//!   refused by the engine (`dropped_invalid`) and reported to the raw peer (`Unplaceable`).
//!
//! A positive control per mode proves the raw peer's writes land where they are allowed to, so
//! no refusal passes vacuously. Runs are deterministic from the seed (`ISOLATION_SEED`
//! overrides it), which every failure names.

#[path = "engine_isolation/scene.rs"]
mod scene;

use std::time::Duration;

use scene::{Attacker, Export, HONEST, HOSTILE, Scene, Try, VICTIM, WRITE_RID, guesses};
use uccl_engine::{Buffer, EngineError, Mode};
use uccl_integration::pattern;
use uccl_integration::raw_peer::{Cts, Hello};
use uccl_tx::wire::RetrHdrRepr;
use verbs_safe::SendOp;

/// One test per mode of each case.
macro_rules! both_modes {
    ($name:ident, $case:ident) => {
        mod $name {
            #[test]
            fn uc() {
                super::$case(uccl_engine::Mode::Uc);
            }
            #[test]
            fn rc() {
                super::$case(uccl_engine::Mode::Rc);
            }
        }
    };
}

/// The raw peer's writes land where they are allowed to: a WRITE_WITH_IMM into a receive the
/// victim advertised to it completes that receive byte-exact, one into an export lands, and
/// (UC) a retransmission-shaped SEND with a true header is copied into place. Without this the
/// refusals below could pass because the raw peer never reached the victim at all.
fn positive_control(mode: Mode) {
    let mut s = Scene::new(mode, 2);
    let v = s.watch("V", 64 << 10);
    let mut a = s.attacker();
    let recv = s.victim().recv(a.conn, &v, 4096, 8192).expect("recv");
    let cts = s.next_cts(&mut a);
    assert_eq!((cts.seq, cts.len), (0, 8192), "{}", s.ctx());
    let data = pattern(s.sim.seed, 0x900d, 0, 1000);
    s.legit_write(&mut a, cts.addr, cts.rkey, (cts.seq % 128) as u8, &data);
    assert_eq!(s.finish(&mut a, "the receive", &recv), 1000, "{}", s.ctx());
    s.expect_written(&v, 4096, &data);
    s.check_memory("a legitimate write into a receive");
    let x = s.export(&v, 32768, 4096);
    s.legit_export_write(&mut a, &x, 100);
    if mode == Mode::Uc {
        let data = pattern(s.sim.seed, 0x900d, 1, 600);
        let hdr = RetrHdrRepr {
            remote_addr: x.d.addr + 1000,
            imm: a.imm(WRITE_RID | 1),
            rkey: x.d.rkey,
        };
        let mut bytes = hdr.to_bytes().to_vec();
        bytes.extend(&data);
        let before = s.victim().stats().writes_received;
        a.peer.post(1, SendOp::Send, &bytes).expect("post");
        s.run(&mut a, "a true retransmission", |s, _| {
            s.engines[VICTIM].stats().writes_received > before
        });
        a.landed();
        s.expect_written(&v, 32768 + 1000, &data);
        s.check_memory("a retransmission with a true header");
        assert!(a.peer.unplaceable.is_empty(), "{}", s.ctx());
    }
    // The victim acknowledged the chunks: on the UD QP (UC), or the control QP (RC, kind 4).
    s.run(&mut a, "the victim's ACKs", |_, p| match mode {
        Mode::Uc => p.ud_received > 0,
        Mode::Rc => p.other_ctl.contains(&4),
    });
    assert!(a.peer.ctl_failed.is_none(), "{}", s.ctx());
    s.honest_works();
}
both_modes!(
    positive_control_the_raw_peer_reaches_what_it_was_given,
    positive_control
);

/// Tries of `len` bytes at each of `at` through `rkey`, as a chunk of request `rid` and as a
/// plain WRITE.
fn tries(at: &[(&'static str, u64)], rkey: u32, rid: u8) -> Vec<Try> {
    let mut t = Vec::new();
    for &(what, addr) in at {
        for rid in [Some(rid), None] {
            t.push(Try {
                what,
                addr,
                rkey,
                len: HOSTILE,
                rid,
            });
        }
    }
    t
}

/// A receive of `len` bytes at `offset` of `buf` advertised to the attacker and completed by
/// its legitimate write, which fills it: the advertisement.
fn received(s: &mut Scene, a: &mut Attacker, buf: &Buffer, offset: u64, len: u64) -> Cts {
    let recv = s.victim().recv(a.conn, buf, offset, len).expect("recv");
    let cts = s.next_cts(a);
    assert_eq!(cts.len, len, "{}", s.ctx());
    let data = pattern(
        s.sim.seed,
        0x900d,
        u64::from(cts.seq) << 8 | offset,
        len as usize,
    );
    s.legit_write(a, cts.addr, cts.rkey, (cts.seq % 128) as u8, &data);
    assert_eq!(s.finish(a, "a receive", &recv), len, "{}", s.ctx());
    s.expect_written(buf, offset as usize, &data);
    s.check_memory("a legitimate write into a receive");
    cts
}

/// A write outside an export, with its key: before it, straddling its start or its end, after
/// it. (Before per-export keys the export's key was its whole buffer's: these landed on their
/// first transmission, and were refused only when retransmitted.)
fn outside_an_export(mode: Mode) {
    let mut s = Scene::new(mode, 2);
    let v = s.watch("V", 64 << 10);
    let x = s.export(&v, 16384, 4096);
    let mut a = s.attacker();
    // Its first and last bytes are reachable: the range is exactly the export.
    s.legit_export_write(&mut a, &x, 0);
    s.legit_export_write(&mut a, &x, 4096 - 256);
    let (start, end, h) = (x.d.addr, x.d.addr + x.d.len, HOSTILE as u64);
    let at = [
        ("before the export", start - h),
        ("straddling the export's start", start - h / 2),
        ("straddling the export's end", end - h / 2),
        ("just after the export", end),
        ("well after the export", end + 8192),
    ];
    s.refused(&mut a, &tries(&at, x.d.rkey, WRITE_RID | 2));
    s.honest_works();
}
both_modes!(a_write_outside_an_export_fails, outside_an_export);

/// A write through an export after it was withdrawn, and after its buffer was given back.
fn after_withdrawal(mode: Mode) {
    let mut s = Scene::new(mode, 2);
    let xb = s.watch("X", 16 << 10);
    let yb = s.watch("Y", 16 << 10);
    let x = s.export(&xb, 4096, 4096);
    let y = s.export(&yb, 2048, 8192);
    let mut a = s.attacker();
    s.legit_export_write(&mut a, &x, 512);
    s.legit_export_write(&mut a, &y, 512);
    s.victim().withdraw_export(&x.d).expect("withdraw");
    let inside = |x: &Export| {
        [
            ("inside a withdrawn export", x.d.addr),
            ("inside a withdrawn export, where it wrote", x.d.addr + 512),
            (
                "at a withdrawn export's end",
                x.d.addr + x.d.len - HOSTILE as u64,
            ),
        ]
    };
    s.refused(&mut a, &tries(&inside(&x), x.d.rkey, WRITE_RID | 3));
    s.victim().deregister(&yb).expect("deregister");
    let e = s.victim().withdraw_export(&y.d);
    let ctx = s.ctx();
    assert!(matches!(e, Err(EngineError::NoExport(_))), "{ctx}: {e:?}");
    s.refused(&mut a, &tries(&inside(&y), y.d.rkey, WRITE_RID | 4));
    s.honest_works();
}
both_modes!(
    a_write_after_withdrawal_or_deregistration_fails,
    after_withdrawal
);

/// Keys guessed from every key the attacker saw (two receives' window keys, an export's): the
/// next and previous 1000 values and the same index with the other 255 low bytes, each at
/// every place it might reach: the completed receives, its export, and an export it was not
/// given. (softnic's keys were `n << 8 | (n * 0x9d & 0xff)` for a counter `n`: the next
/// registration's key was one guess away.)
fn guessed_keys(mode: Mode) {
    let mut s = Scene::new(mode, if mode == Mode::Rc { 256 } else { 2 });
    let v = s.watch("V", 64 << 10);
    let mut a = s.attacker();
    let r1 = received(&mut s, &mut a, &v, 16384, 4096);
    let r2 = received(&mut s, &mut a, &v, 24576, 4096);
    let x = s.export(&v, 8192, 4096);
    s.legit_export_write(&mut a, &x, 0);
    let other = s.export(&v, 40960, 4096);
    let held = [r1.rkey, r2.rkey, x.d.rkey];
    let keys = guesses(&held);
    // (The low bytes' variants lie within 255 of the key: among its 1000 neighbours.)
    let ctx = s.ctx();
    assert_eq!(
        keys.len(),
        2000 * held.len(),
        "{ctx}: held keys are neighbours"
    );
    let targets = [r1.addr, r2.addr, x.d.addr, other.d.addr];
    s.guess(&mut a, &keys, &targets, other.d.addr);
    let other_key = other.d.rkey;
    assert!(
        !keys.contains(&other_key),
        "{ctx}: {other_key:#x} was a guess"
    );
    s.honest_works();
}
both_modes!(keys_guessed_from_neighbours_reach_nothing, guessed_keys);

/// A write into a receive after the victim reported it complete, with its window key; and
/// once the same range is advertised again (a new receive), the old key is still dead.
fn into_a_completed_receive(mode: Mode) {
    let mut s = Scene::new(mode, 2);
    let v = s.watch("V", 32 << 10);
    let mut a = s.attacker();
    let r = received(&mut s, &mut a, &v, 8192, 4096);
    let rid = (r.seq % 128) as u8;
    let at = [
        ("into a completed receive", r.addr),
        (
            "at a completed receive's end",
            r.addr + r.len - HOSTILE as u64,
        ),
    ];
    s.refused(&mut a, &tries(&at, r.rkey, rid));
    let again = s.victim().recv(a.conn, &v, 8192, 4096).expect("recv");
    let cts = s.next_cts(&mut a);
    assert_eq!((cts.addr, cts.len), (r.addr, r.len), "{}", s.ctx());
    assert_ne!(cts.rkey, r.rkey, "{}: a new receive, a new key", s.ctx());
    let at = [("into the range advertised again, with the old key", r.addr)];
    let rid = (cts.seq % 128) as u8;
    let conn = a.conn;
    s.refused(&mut a, &tries(&at, r.rkey, rid));
    match mode {
        Mode::Uc => {
            let data = pattern(s.sim.seed, 0x900d, 77, 4096);
            s.legit_write(&mut a, cts.addr, cts.rkey, rid, &data);
            assert_eq!(s.finish(&mut a, "the new receive", &again), 4096);
            s.expect_written(&v, 8192, &data);
            s.check_memory("the new receive");
        }
        // Its connection failed with the refused write.
        Mode::Rc => {
            assert!(!s.victim().is_open(conn), "{}", s.ctx());
            let r = again.test().expect("failed with its connection");
            let ctx = s.ctx();
            assert!(
                matches!(r, Err(EngineError::ConnectionFailed { .. })),
                "{ctx}: {r:?}"
            );
        }
    }
    s.honest_works();
}
both_modes!(
    a_write_into_a_completed_receive_fails,
    into_a_completed_receive
);

/// A write into a buffer advertised to another connection: the attacker was given buffer B
/// once (a receive it completed, so it knows B's address and held a key to it), and holds an
/// export's key; B is then advertised to the victim's honest connection. Every key it holds,
/// and every guess from them, fails at B; the honest message then lands in B byte-exact.
/// (Before windows a receive's key was its whole buffer's, for as long as it was registered.)
fn into_another_connections_buffer(mode: Mode) {
    let mut s = Scene::new(mode, if mode == Mode::Rc { 256 } else { 2 });
    let b = s.watch("B", 24 << 10);
    let v = s.watch("V", 16 << 10);
    let mut a = s.attacker();
    let old = received(&mut s, &mut a, &b, 4096, 8192);
    let x = s.export(&v, 0, 4096);
    s.legit_export_write(&mut a, &x, 0);
    let len = 8192;
    let data = pattern(s.sim.seed, 0x4e57, 0, len);
    let ca = s.honest.ca;
    let recv = s.victim().recv(ca, &b, 4096, len as u64).expect("recv");
    s.idle(&mut a, Duration::from_millis(1));
    assert!(!recv.is_done(), "{}", s.ctx());
    let at = [
        ("into another connection's receive", old.addr),
        ("inside another connection's receive", old.addr + 4096),
        (
            "at the end of another connection's receive",
            old.addr + 8192 - HOSTILE as u64,
        ),
    ];
    let mut t = tries(&at, old.rkey, (old.seq % 128) as u8);
    t.extend(tries(&at, x.d.rkey, WRITE_RID | 5));
    s.refused(&mut a, &t);
    let keys = guesses(&[old.rkey, x.d.rkey]);
    s.guess(&mut a, &keys, &[old.addr, old.addr + 4096], old.addr);
    let src = s.sim.engines[HONEST].register(len).expect("register");
    src.write_at(0, &data).expect("fill");
    let cb = s.honest.cb;
    let send = s.sim.engines[HONEST]
        .send(cb, &src, 0, len as u64)
        .expect("send");
    s.run(&mut a, "the honest message", |_, _| {
        recv.is_done() && send.is_done()
    });
    let got = recv.test().expect("done").map(|d| d.len);
    assert_eq!(got.ok(), Some(len as u64), "{}", s.ctx());
    s.expect_written(&b, 4096, &data);
    s.check_memory("the honest message");
    s.honest_works();
}
both_modes!(
    a_write_into_another_connections_buffer_fails,
    into_another_connections_buffer
);

/// A handshake that speaks for another engine: it names the honest engine's UD QP and Q_Key
/// (its address, the same in every handshake it makes) and the honest engine's id of a live
/// connection to the victim (a small index), with that connection's 7-bit ACK tag. Taken, the
/// victim would send what it has for the forger's connection over its UD QP (on UC the
/// advertisements of its receives, and its ACKs) to the honest engine, which would take them
/// for the victim's on its own connection: its next message landed in a receive the victim had
/// posted for the forger, and the honest receive completed with none of its bytes (found by an
/// audit). Refused, naming the connection; the honest connection goes on, and another
/// connection between the two engines (another id at the honest engine) is taken.
fn a_handshake_speaking_for_a_connected_engine_is_refused(mode: Mode) {
    let mut s = Scene::new(mode, 2);
    let ctx = s.ctx();
    // A connection made by hand, for the honest engine's handshake.
    let (hc, hello) = s.sim.engines[HONEST].offer().expect("offer");
    let (vc, theirs) = s.victim().offer().expect("offer");
    s.sim.engines[HONEST]
        .complete(hc, &theirs)
        .expect("complete");
    s.victim().complete(vc, &hello).expect("complete");
    let honest = Hello::parse(&hello).expect("a handshake");
    let forged = Hello {
        // Another control QP and first PSN, with the same low 7 bits (the ACK tag).
        conn_qpn: 0x00ff_fff0,
        conn_psn: honest.conn_psn ^ 0x00ab_cd00,
        qps: (honest.qps.iter())
            .map(|&(qpn, psn)| (qpn ^ 0x0080_0000, psn))
            .collect(),
        ..honest.clone()
    };
    let (offer, _) = s.victim().offer().expect("offer");
    let err = (s.victim().complete(offer, &forged.to_bytes()))
        .expect_err("a handshake speaking for the honest engine");
    assert!(
        matches!(err, EngineError::Handshake { .. }) && err.to_string().contains("already"),
        "{ctx}: {err}"
    );
    s.honest_works();
    s.sim
        .connect(VICTIM, HONEST)
        .unwrap_or_else(|e| panic!("{ctx}: another honest connection: {e}"));
    s.honest_works();
}

both_modes!(
    speaking_for_another_engine,
    a_handshake_speaking_for_a_connected_engine_is_refused
);
