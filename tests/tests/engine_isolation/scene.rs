//! The scene of the isolation tests: a victim engine, its honest peer, attackers made of raw
//! verbs ([`RawPeer`]), the victim's memory as it must be, and the attacks: single writes that
//! must fail ([`Scene::refused`]) and guessed keys ([`Scene::guess`]).

use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use uccl_engine::{Buffer, ConnId, Descriptor, Engine, EngineConfig, Mode, Request, Stats};
use uccl_integration::raw_peer::{CtlMsg, Cts, RawPeer, SQ_DEPTH, sim_with_raw_devices};
use uccl_integration::workload::Link;
use uccl_integration::{Sim, pattern};
use uccl_tx::wire::{CSN_SPACE, Imm, RetrHdrRepr};
use verbs_safe::{SendOp, WcStatus};

/// The victim is engine 0; engine 1 is its honest peer.
pub(crate) const VICTIM: usize = 0;
pub(crate) const HONEST: usize = 1;
/// Request ids from here on are one-sided writes (uccl-engine's `conn::WRITE_RID`).
pub(crate) const WRITE_RID: u8 = 0x80;
/// Bytes of each hostile write.
pub(crate) const HOSTILE: usize = 64;

fn seed() -> u64 {
    std::env::var("ISOLATION_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x150_1a7e)
}

/// A victim buffer and the bytes it must hold.
struct Watched {
    name: &'static str,
    buf: Buffer,
    bytes: Vec<u8>,
}

/// The victim, its honest peer, a spare device for attackers, and the victim's memory.
pub(crate) struct Scene {
    pub(crate) sim: Sim,
    mode: Mode,
    raw: String,
    pub(crate) honest: Link,
    attackers: u64,
    watched: Vec<Watched>,
    honest_msgs: u64,
}

/// A raw peer connected to the victim: the victim's id of the connection, and the next chunk
/// sequence number the victim expects from it.
pub(crate) struct Attacker {
    pub(crate) peer: RawPeer,
    pub(crate) conn: ConnId,
    csn: u16,
}

impl Attacker {
    /// The immediate of chunk `self.csn` of request `rid`, the message's last.
    pub(crate) fn imm(&self, rid: u8) -> u32 {
        let fid = self.peer.victim.fid;
        Imm {
            fid,
            rid,
            csn: self.csn,
            last: true,
        }
        .encode()
        .expect("an immediate")
    }

    /// A chunk landed: the victim expects the next.
    pub(crate) fn landed(&mut self) {
        self.csn = ((u32::from(self.csn) + 1) % CSN_SPACE) as u16;
    }
}

/// An export of a victim buffer: the buffer, where in it, and its descriptor.
pub(crate) struct Export {
    buf: Buffer,
    offset: usize,
    pub(crate) d: Descriptor,
}

/// What an attacker tries: `len` bytes at `addr` through `rkey`, as a chunk of request `rid`
/// (WRITE_WITH_IMM) or as a plain WRITE (`None`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Try {
    pub(crate) what: &'static str,
    pub(crate) addr: u64,
    pub(crate) rkey: u32,
    pub(crate) len: usize,
    pub(crate) rid: Option<u8>,
}

impl std::fmt::Display for Try {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (what, len, addr, key) = (self.what, self.len, self.addr, self.rkey);
        write!(f, "{what}: {len} bytes at {addr:#x} with key {key:#x}, ")?;
        match self.rid {
            Some(rid) => write!(f, "a chunk of request {rid:#x}"),
            None => write!(f, "a plain WRITE"),
        }
    }
}

impl Scene {
    /// `qps` data QPs a connection; at most 64 connections.
    pub(crate) fn new(mode: Mode, qps: u16) -> Scene {
        let cfg = EngineConfig {
            mode,
            qps_per_conn: qps,
            max_conns: 64,
            sq_depth: 16,
            ..EngineConfig::default()
        };
        let (mut sim, raw) = sim_with_raw_devices(seed(), 2, 1, &cfg);
        let honest = sim
            .connect(VICTIM, HONEST)
            .unwrap_or_else(|e| panic!("{e}"));
        Scene {
            sim,
            mode,
            raw: raw[0].clone(),
            honest,
            attackers: 0,
            watched: Vec::new(),
            honest_msgs: 0,
        }
    }

    pub(crate) fn ctx(&self) -> String {
        format!("seed {} ({:?})", self.sim.seed, self.mode)
    }

    pub(crate) fn victim(&mut self) -> &mut Engine {
        &mut self.sim.engines[VICTIM]
    }

    /// A victim buffer of `len` bytes, filled with its own pattern, watched from now on.
    pub(crate) fn watch(&mut self, name: &'static str, len: usize) -> Buffer {
        let buf = self.victim().register(len).expect("register");
        let bytes = pattern(self.sim.seed, 0x71c, self.watched.len() as u64, len);
        buf.write_at(0, &bytes).expect("fill");
        self.watched.push(Watched {
            name,
            buf: buf.clone(),
            bytes,
        });
        buf
    }

    /// Notes that `data` was written at `offset` of watched buffer `buf` (a legitimate write).
    pub(crate) fn expect_written(&mut self, buf: &Buffer, offset: usize, data: &[u8]) {
        let w = self
            .watched
            .iter_mut()
            .find(|w| w.buf.id() == buf.id())
            .expect("a watched buffer");
        w.bytes[offset..offset + data.len()].copy_from_slice(data);
    }

    /// Every watched buffer holds exactly what it must.
    pub(crate) fn check_memory(&self, after: &str) {
        for w in &self.watched {
            let mut now = vec![0u8; w.bytes.len()];
            w.buf.read_at(0, &mut now).expect("read");
            if now != w.bytes {
                let diff: Vec<usize> = (0..now.len()).filter(|&i| now[i] != w.bytes[i]).collect();
                panic!(
                    "{}: {after}: {} bytes of victim buffer {} changed, the first at \
                     offset {}, the last at {}",
                    self.ctx(),
                    diff.len(),
                    w.name,
                    diff[0],
                    diff[diff.len() - 1]
                );
            }
        }
    }

    /// A new raw peer connected to the victim.
    pub(crate) fn attacker(&mut self) -> Attacker {
        self.attackers += 1;
        let seed = self.sim.seed ^ self.attackers.wrapping_mul(0x9e37_79b9);
        let fabric = self.sim.fabric.clone();
        let (peer, conn) =
            RawPeer::connect(&fabric, &self.raw, &mut self.sim.engines[VICTIM], seed)
                .unwrap_or_else(|e| panic!("{}: {e}", self.ctx()));
        Attacker { peer, conn, csn: 0 }
    }

    /// Runs engines, fabric and the attacker until `done` (see [`RawPeer::run`]); fails
    /// naming the seed and `what`.
    pub(crate) fn run(
        &mut self,
        a: &mut Attacker,
        what: &str,
        done: impl FnMut(&Sim, &RawPeer) -> bool,
    ) {
        let r = a.peer.run(&mut self.sim, Duration::from_secs(10), done);
        r.unwrap_or_else(|e| panic!("{} waiting for {what}: {e}", self.ctx()));
    }

    /// Runs until `req` completed, and returns its result's length.
    pub(crate) fn finish(&mut self, a: &mut Attacker, what: &str, req: &Request) -> u64 {
        self.run(a, what, |_, _| req.is_done());
        let r = req.test().expect("done");
        r.unwrap_or_else(|e| panic!("{}: {what}: {e}", self.ctx()))
            .len
    }

    /// The next advertisement the attacker gets.
    pub(crate) fn next_cts(&mut self, a: &mut Attacker) -> Cts {
        self.run(a, "an advertisement", |_, p| !p.cts.is_empty());
        a.peer.cts.pop_front().expect("one")
    }

    /// A legitimate chunk: `data` written at `addr` with `rkey` as the last chunk of request
    /// `rid`. Lands (see `expect_written`), completing what it is for.
    pub(crate) fn legit_write(
        &mut self,
        a: &mut Attacker,
        addr: u64,
        rkey: u32,
        rid: u8,
        data: &[u8],
    ) {
        let imm = a.imm(rid);
        let op = SendOp::WriteWithImm {
            remote_addr: addr,
            rkey,
            imm,
        };
        let before = self.victim().stats().chunks_received;
        let id = a.peer.post(0, op, data).expect("post");
        self.run(a, "a legitimate chunk", |s, p| {
            p.status(id).is_some() && s.engines[VICTIM].stats().chunks_received > before
        });
        assert_eq!(a.peer.status(id), Some(WcStatus::Success), "{}", self.ctx());
        a.landed();
    }

    /// Exports `len` bytes at `offset` of `buf`.
    pub(crate) fn export(&mut self, buf: &Buffer, offset: u64, len: u64) -> Export {
        let d = self.victim().export(buf, offset, len).expect("export");
        Export {
            buf: buf.clone(),
            offset: offset as usize,
            d,
        }
    }

    /// A legitimate one-sided write of 256 bytes at `at` of export `x`: it lands.
    pub(crate) fn legit_export_write(&mut self, a: &mut Attacker, x: &Export, at: u64) {
        let data = pattern(self.sim.seed, 0x600d, u64::from(a.csn), 256);
        let before = self.victim().stats().writes_received;
        self.legit_write(a, x.d.addr + at, x.d.rkey, WRITE_RID, &data);
        assert_eq!(self.victim().stats().writes_received, before + 1);
        self.expect_written(&x.buf, x.offset + at as usize, &data);
        self.check_memory("a legitimate write into an export");
    }

    /// The honest connection still works: a message from the honest engine lands byte-exact.
    pub(crate) fn honest_works(&mut self) {
        self.honest_msgs += 1;
        let n = self.honest_msgs;
        let len = 3000 + 17 * n as usize;
        let data = pattern(self.sim.seed, 0x4e57, n, len);
        let dst = self.victim().register(len).expect("register");
        let src = self.sim.engines[HONEST].register(len).expect("register");
        src.write_at(0, &data).expect("fill");
        let Link { ca, cb, .. } = self.honest;
        let recv = self.victim().recv(ca, &dst, 0, len as u64).expect("recv");
        let send = self.sim.engines[HONEST]
            .send(cb, &src, 0, len as u64)
            .expect("send");
        let ctx = self.ctx();
        let limit = self.sim.fabric.now() + Duration::from_secs(10);
        self.sim
            .run(limit, |_| recv.is_done() && send.is_done())
            .unwrap_or_else(|e| panic!("{ctx}: the honest connection: {e}"));
        let got = recv.test().expect("done");
        assert_eq!(got.map(|d| d.len).ok(), Some(len as u64), "{ctx}");
        assert!(send.test().expect("done").is_ok(), "{ctx}");
        let mut back = vec![0u8; len];
        dst.read_at(0, &mut back).expect("read");
        assert!(back == data, "{ctx}: the honest message arrived changed");
    }

    /// Every try fails where it must and changes nothing. UC: all on `a`. RC: each on a
    /// connection of its own (the refusal fails it); `a` is a fresh one afterwards.
    pub(crate) fn refused(&mut self, a: &mut Attacker, tries: &[Try]) {
        for &t in tries {
            match self.mode {
                Mode::Uc => {
                    self.refused_uc_write(a, t);
                    self.refused_uc_retransmission(a, t);
                }
                Mode::Rc => {
                    self.refused_rc(a, t);
                    *a = self.attacker();
                }
            }
        }
    }

    fn hostile(&self, t: &Try) -> Vec<u8> {
        pattern(self.sim.seed, 0xbad, t.addr ^ u64::from(t.rkey), t.len)
    }

    fn op(a: &Attacker, t: &Try) -> SendOp {
        match t.rid {
            Some(rid) => SendOp::WriteWithImm {
                remote_addr: t.addr,
                rkey: t.rkey,
                imm: a.imm(rid),
            },
            None => SendOp::Write {
                remote_addr: t.addr,
                rkey: t.rkey,
            },
        }
    }

    fn dropped_at_victim(s: &Sim) -> u64 {
        let name = format!("soft{VICTIM}");
        s.fabric
            .device_counters(&name)
            .expect("the victim's device")
            .messages_dropped
    }

    /// UC: the victim's NIC drops the write; the engine sees nothing of it.
    fn refused_uc_write(&mut self, a: &mut Attacker, t: Try) {
        let (what, ctx) = (t.to_string(), format!("{}: {t}", self.ctx()));
        let dropped = Self::dropped_at_victim(&self.sim);
        let stats = self.victim().stats();
        let data = self.hostile(&t);
        let id = a.peer.post(0, Self::op(a, &t), &data).expect("post");
        // Sent (UC completes at the sender), and nothing left on the wire: it arrived.
        self.run(a, &what, |s, p| {
            p.status(id).is_some() && s.fabric.in_flight() == 0
        });
        self.check_memory(&what);
        same_receive_counters(&stats, &self.victim().stats(), &ctx);
        assert_eq!(a.peer.status(id), Some(WcStatus::Success), "{ctx}");
        let now = Self::dropped_at_victim(&self.sim);
        assert_eq!(now, dropped + 1, "{ctx}: messages the victim's NIC dropped");
    }

    /// UC: the same bytes as a retransmission with the forged header: refused and reported.
    fn refused_uc_retransmission(&mut self, a: &mut Attacker, t: Try) {
        let what = format!("{t}, as a retransmission");
        let ctx = format!("{}: {what}", self.ctx());
        let rid = t.rid.unwrap_or(WRITE_RID);
        let hdr = RetrHdrRepr {
            remote_addr: t.addr,
            imm: a.imm(rid),
            rkey: t.rkey,
        };
        let mut data = hdr.to_bytes().to_vec();
        data.extend(self.hostile(&t));
        let invalid = self.victim().stats().dropped_invalid;
        let notes = a.peer.unplaceable.len();
        let chunks = self.victim().stats().chunks_received;
        a.peer.post(0, SendOp::Send, &data).expect("post");
        self.run(a, &what, |s, p| {
            p.unplaceable.len() > notes || s.engines[VICTIM].stats().chunks_received > chunks
        });
        self.check_memory(&what);
        assert_eq!(self.victim().stats().dropped_invalid, invalid + 1, "{ctx}");
        let note = CtlMsg::Unplaceable {
            csn: a.csn,
            remote: t.addr,
            rkey: t.rkey,
        };
        assert_eq!(a.peer.unplaceable[notes..], [note], "{ctx}");
    }

    /// RC: the victim's NIC refuses the write (REM_ACCESS_ERR) and the victim fails the
    /// connection.
    fn refused_rc(&mut self, a: &mut Attacker, t: Try) {
        let (what, ctx) = (t.to_string(), format!("{}: {t}", self.ctx()));
        let data = self.hostile(&t);
        let id = a.peer.post(0, Self::op(a, &t), &data).expect("post");
        let conn = a.conn;
        self.run(a, &what, |_, p| p.status(id).is_some());
        self.check_memory(&what);
        assert_eq!(a.peer.status(id), Some(WcStatus::RemAccessErr), "{ctx}");
        self.run(a, &what, |s, _| !s.engines[VICTIM].is_open(conn));
        self.drained(a);
    }

    /// Runs until the victim's failed connections are gone (the attacker answers meanwhile).
    fn drained(&mut self, a: &mut Attacker) {
        self.run(a, "the failed connection to drain", |s, _| {
            s.engines[VICTIM].usage().draining == 0
        });
    }

    /// Runs for `d` of virtual time: advertisements go out, windows are bound.
    pub(crate) fn idle(&mut self, a: &mut Attacker, d: Duration) {
        let until = self.sim.fabric.now() + d;
        self.run(a, "time to pass", |s, _| s.fabric.now() >= until);
    }

    /// Every key of `keys` at every address of `targets` fails where it must and changes
    /// nothing (see [`guess_uc`](Self::guess_uc), [`guess_rc`](Self::guess_rc)).
    pub(crate) fn guess(
        &mut self,
        a: &mut Attacker,
        keys: &[u32],
        targets: &[u64],
        forged_at: u64,
    ) {
        match self.mode {
            Mode::Uc => self.guess_uc(a, keys, targets, forged_at),
            Mode::Rc => self.guess_rc(keys, targets),
        }
    }

    /// UC: every guessed WRITE is dropped by the victim's NIC (its engine sees none), and every
    /// guessed key in a forged retransmission header (at `forged_at`, a one-sided write's) is
    /// refused and reported, four at a time (the engine notes a few refusals per round). Each
    /// forged retransmission takes a buffer of the victim's receive queue and delivers nothing,
    /// which the victim allows a peer only a few dozen times per minimum RTO (more, and it
    /// fails the connection: see `engine_hostile.rs`): the attacker guesses at that pace.
    fn guess_uc(&mut self, a: &mut Attacker, keys: &[u32], targets: &[u64], forged_at: u64) {
        let what = format!("{} guessed keys", keys.len());
        let ctx = format!("{}: {what}", self.ctx());
        let hostile = pattern(self.sim.seed, 0xbad, 0, 8);
        let payload = a.peer.payload(&hostile).expect("payload");
        let dropped = Self::dropped_at_victim(&self.sim);
        let stats = self.victim().stats();
        let pairs: Vec<(u32, u64)> = (keys.iter())
            .flat_map(|&k| targets.iter().map(move |&t| (k, t)))
            .collect();
        let paths = a.peer.paths();
        let mut ids = Vec::with_capacity(pairs.len());
        for batch in pairs.chunks(SQ_DEPTH as usize * paths) {
            for (i, &(rkey, remote_addr)) in batch.iter().enumerate() {
                let op = SendOp::Write { remote_addr, rkey };
                let id = a.peer.post_buf(i % paths, op, Some((&payload, 0, 8)));
                ids.push(id.expect("post"));
            }
            self.run(a, &what, |_, p| p.outstanding() == 0);
        }
        self.run(a, &what, |s, _| s.fabric.in_flight() == 0);
        self.check_memory(&what);
        same_receive_counters(&stats, &self.victim().stats(), &ctx);
        let want = dropped + pairs.len() as u64;
        let now = Self::dropped_at_victim(&self.sim);
        assert_eq!(now, want, "{ctx}: messages the victim's NIC dropped");
        assert!(
            ids.iter()
                .all(|&id| a.peer.status(id) == Some(WcStatus::Success)),
            "{ctx}: a UC WRITE failed at the sender"
        );
        let invalid = stats.dropped_invalid;
        let first = a.peer.unplaceable.len();
        for (k, batch) in keys.chunks(4).enumerate() {
            if k % 2 == 1 {
                self.sim.fabric.advance(Duration::from_millis(1));
            }
            let mut bytes = Vec::new();
            for &rkey in batch {
                let imm = a.imm(WRITE_RID);
                let hdr = RetrHdrRepr {
                    remote_addr: forged_at,
                    imm,
                    rkey,
                };
                bytes.extend(hdr.to_bytes());
                bytes.extend(&hostile);
            }
            let buf = a.peer.payload(&bytes).expect("payload");
            let each = bytes.len() / batch.len();
            for i in 0..batch.len() {
                let b = Some((&buf, i * each, each));
                a.peer.post_buf(0, SendOp::Send, b).expect("post");
            }
            let want = a.peer.unplaceable.len() + batch.len();
            let chunks = self.victim().stats().chunks_received;
            self.run(a, &what, |s, p| {
                p.unplaceable.len() >= want || s.engines[VICTIM].stats().chunks_received > chunks
            });
            self.check_memory(&what);
        }
        let refused = self.victim().stats().dropped_invalid - invalid;
        assert_eq!(
            refused,
            keys.len() as u64,
            "{ctx}: forged retransmissions refused"
        );
        let noted: Vec<CtlMsg> = keys
            .iter()
            .map(|&rkey| CtlMsg::Unplaceable {
                csn: a.csn,
                remote: forged_at,
                rkey,
            })
            .collect();
        assert!(a.peer.unplaceable[first..] == noted[..], "{ctx}: the notes");
        self.check_memory(&what);
    }

    /// RC: every guessed WRITE fails at the victim's NIC with REM_ACCESS_ERR, one per data QP
    /// of a connection (a refusal fails the QP), the NIC alone answering (the victim's engine
    /// is not polled meanwhile, so each of its QPs still takes its write); then the victim
    /// fails the connection.
    fn guess_rc(&mut self, keys: &[u32], targets: &[u64]) {
        let what = format!("{} guessed keys", keys.len());
        let ctx = format!("{}: {what}", self.ctx());
        let mut queue: VecDeque<(u32, u64)> = (keys.iter())
            .flat_map(|&k| targets.iter().map(move |&t| (k, t)))
            .collect();
        let total = queue.len();
        let mut again = 0;
        let fabric = self.sim.fabric.clone();
        while !queue.is_empty() {
            let mut a = self.attacker();
            let payload = a.peer.payload(&[0xa5; 8]).expect("payload");
            let n = a.peer.paths().min(queue.len());
            let batch: Vec<(u32, u64)> = queue.drain(..n).collect();
            let ids: Vec<u64> = (batch.iter().enumerate())
                .map(|(path, &(rkey, remote_addr))| {
                    let op = SendOp::Write { remote_addr, rkey };
                    let p = Some((&payload, 0, 8));
                    a.peer.post_buf(path, op, p).expect("post")
                })
                .collect();
            a.peer
                .drive(&fabric, Duration::from_secs(10), |p| p.outstanding() == 0)
                .unwrap_or_else(|e| panic!("{ctx}: {e}"));
            for (&id, &(rkey, addr)) in ids.iter().zip(&batch) {
                match a.peer.status(id) {
                    Some(WcStatus::RemAccessErr) => {}
                    Some(WcStatus::Success) => {
                        panic!("{ctx}: guessed key {rkey:#x} wrote at {addr:#x}")
                    }
                    _ => {
                        again += 1;
                        queue.push_back((rkey, addr));
                    }
                }
            }
            assert!(
                again < total,
                "{ctx}: {again} guesses never reached the NIC"
            );
            let conn = a.conn;
            self.run(&mut a, "the attacker's connection to fail", |s, _| {
                !s.engines[VICTIM].is_open(conn)
            });
            self.drained(&mut a);
        }
        self.check_memory(&what);
    }
}

/// Nothing arrived at the victim's engine.
fn same_receive_counters(before: &Stats, after: &Stats, ctx: &str) {
    let pick = |s: &Stats| {
        (
            s.chunks_received,
            s.dropped_invalid,
            s.dropped_duplicate,
            s.dropped_out_of_window,
            s.messages_received,
            s.writes_received,
        )
    };
    assert_eq!(
        pick(before),
        pick(after),
        "{ctx}: the victim's engine saw something"
    );
}

/// The keys an attacker that saw `held` would guess: each one's next 1000 and previous 1000
/// values, and its index with every other low byte; none of `held` itself.
pub(crate) fn guesses(held: &[u32]) -> Vec<u32> {
    let mut g = BTreeSet::new();
    for &k in held {
        for d in 1..=1000u32 {
            g.insert(k.wrapping_add(d));
            g.insert(k.wrapping_sub(d));
        }
        for low in 0..=255u32 {
            g.insert(k & !0xff | low);
        }
    }
    for k in held {
        g.remove(k);
    }
    g.into_iter().collect()
}
