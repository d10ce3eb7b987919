//! uccl-engine: what the engine costs, between two engines on one softnic fabric driven on its
//! virtual clock (no faults), everything side by side in one run.
//!
//! - Printed once before the groups (counts, not times; only under `cargo bench`): post calls
//!   per chunk and WRs per post of a 64 MiB transfer (1 MiB messages, 1 connection of 4 QPs),
//!   chained versus one WR per post (`tx.max_chain = 1`); and the receive-buffer memory of the
//!   engine's SRQ versus per-QP receive queues at 1024 QPs, computed from the configuration.
//! - `engine/e2e`: CPU time per chunk of a two-sided message moved end to end: both engines'
//!   poll rounds and all of softnic's work (packets, ICRC, and, with `copy`, the payload
//!   copied into packets and out again; `nocopy` is `FabricConfig::copy_payload = false`). UC
//!   versus RC, 16 KiB and 4 KiB chunks, and two ways of taking turns (`Drive`): `step` (the
//!   tests' `Sim::run`: about one packet per round) and `batch` (the fabric runs until idle
//!   between rounds).
//! - `engine/poll`: the receiver's CPU time per completion with 1 data QP versus 1024 on its one
//!   CQ: the sender writes one-chunk messages round-robin over the connections and the
//!   fabric delivers them all before the receiver polls; only the receiver's poll rounds that
//!   drain those completions are timed (`iter_custom`).
//!
//! `cargo bench -p uccl-engine` (or `cargo xtask bench -- engine/`); the numbers and what they
//! include: `benches/RESULTS.md`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};
use softnic::{Fabric, FabricConfig};
use uccl_engine::{
    Buffer, Clock, ConnId, Descriptor, Engine, EngineConfig, Mode, Request, Stats, connect_pair,
};
use verbs_safe::{Context, Verbs};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// Two engines on one fabric (virtual clock, no faults), `a` (on `soft0`) connected to `b` (on
/// `soft1`).
struct Pair {
    fabric: Fabric,
    a: Engine,
    b: Engine,
    /// The connections: `a`'s id, `b`'s id.
    conns: Vec<(ConnId, ConnId)>,
}

impl Pair {
    /// Two engines built as `cfg` with `conns` connections between them, idle; softnic moves
    /// the payload of RDMA WRITEs if `copy` (else its packets carry zeros and nothing is
    /// written: [`FabricConfig::copy_payload`]).
    fn new(cfg: &EngineConfig, conns: usize, copy: bool) -> Pair {
        let fabric = Fabric::new(FabricConfig {
            devices: 2,
            auto_advance: false,
            copy_payload: copy,
            ..FabricConfig::default()
        });
        let verbs = Verbs::soft(&fabric);
        let engine = |name: &str| {
            let ctx = Context::open_by_name(&verbs, name).expect("device");
            Engine::new(&ctx, cfg.clone(), Clock::Fabric(fabric.clone())).expect("engine")
        };
        let (mut a, mut b) = (engine("soft0"), engine("soft1"));
        let conns = (0..conns)
            .map(|_| connect_pair(&mut a, &mut b).expect("connecting"))
            .collect();
        let mut p = Pair {
            fabric,
            a,
            b,
            conns,
        };
        p.settle();
        p
    }

    /// Polls both engines until neither has work and nothing is in the fabric (the handshake's
    /// receive posts and credit updates are through).
    fn settle(&mut self) {
        for _ in 0..1_000_000 {
            let busy = self.a.poll().expect("poll") | self.b.poll().expect("poll");
            if busy {
                continue;
            }
            let now = self.fabric.now();
            match self.fabric.next_event() {
                Some(t) if t > now => self.fabric.advance(t - now),
                Some(_) => self.fabric.advance(Duration::from_nanos(1)),
                None => return,
            }
        }
        panic!("the engines never went quiet");
    }

    /// Runs rounds of both engines until `done` holds, driven as `drive` says.
    fn run(&mut self, drive: Drive, mut done: impl FnMut() -> bool) {
        loop {
            if done() {
                return;
            }
            let busy = self.a.poll().expect("poll") | self.b.poll().expect("poll");
            let now = self.fabric.now();
            let pending = self.fabric.next_event();
            if drive == Drive::Batch && pending.is_some() {
                self.fabric.run_until_idle().expect("fabric idle");
                continue;
            }
            if busy {
                continue;
            }
            let next = [self.a.next_deadline(), self.b.next_deadline()]
                .into_iter()
                .flatten()
                .map(Duration::from_nanos)
                .chain(pending)
                .min();
            match next {
                Some(t) if t > now => self.fabric.advance(t - now),
                Some(_) => self.fabric.advance(Duration::from_nanos(1)),
                None if done() => return,
                None => panic!("stuck at {now:?}: nothing pending and not done"),
            }
        }
    }
}

/// How the engines and the fabric take turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drive {
    /// The tests' `Sim::run`: both engines poll until neither has work, then the virtual clock
    /// moves to the next event (one packet, mostly) and they poll again. Every engine sees
    /// about one packet per round: the finest interleaving, many rounds per chunk.
    Step,
    /// Both engines poll once, then the fabric runs until nothing is in flight (everything
    /// posted in that round arrives, and its completions wait in the CQ): every round sees a
    /// batch, as a busy engine on a real NIC would.
    Batch,
}

impl Drive {
    fn name(self) -> &'static str {
        match self {
            Drive::Step => "step",
            Drive::Batch => "batch",
        }
    }
}

/// Checks every request completed well.
fn all_ok(reqs: &[Request]) {
    for r in reqs {
        r.test().expect("complete").expect("succeeded");
    }
}

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Uc => "uc",
        Mode::Rc => "rc",
    }
}

// ---- Counts ------------------------------------------------------------------------------

/// Moves 64 MiB from `a` to `b` as 1 MiB two-sided messages (all 64 receives and sends posted
/// at once) on one connection; the two engines' counters afterwards.
fn transfer_64mib(cfg: &EngineConfig, drive: Drive) -> (Stats, Stats) {
    let mut p = Pair::new(cfg, 1, true);
    let (ca, cb) = p.conns[0];
    let src = p.a.register(MIB as usize).expect("register");
    let dst = p.b.register(64 * MIB as usize).expect("register");
    let mut reqs = Vec::new();
    for i in 0..64 {
        reqs.push(p.b.recv(cb, &dst, i * MIB, MIB).expect("recv"));
    }
    for _ in 0..64 {
        reqs.push(p.a.send(ca, &src, 0, MIB).expect("send"));
    }
    p.run(drive, || reqs.iter().all(Request::is_done));
    all_ok(&reqs);
    (p.a.stats(), p.b.stats())
}

fn ratio(n: u64, d: u64) -> f64 {
    n as f64 / d.max(1) as f64
}

fn print_post_counts() {
    eprintln!();
    eprintln!("uccl-engine counts (not times): 64 MiB as 64 x 1 MiB two-sided messages, chunk");
    eprintln!("16 KiB, 1 connection x 4 QPs, softnic (virtual clock), no faults. Sender: post");
    eprintln!("calls and WRs on the data QPs, retransmissions; receiver: ACK headers per chunk,");
    eprintln!("ACK headers per control packet, SRQ WQEs per refill post, receive CQEs per round.");
    eprintln!(
        "  {:<5} {:<4} {:>5} {:>6} {:>6} {:>6} {:>11} {:>8} {:>4} {:>10} {:>8} {:>9} {:>10}",
        "drive",
        "mode",
        "chain",
        "chunks",
        "posts",
        "WRs",
        "posts/chunk",
        "WRs/post",
        "retx",
        "ACKs/chunk",
        "ACKs/pkt",
        "WQEs/post",
        "CQEs/round"
    );
    let mut calls = Vec::new();
    for drive in [Drive::Step, Drive::Batch] {
        for mode in [Mode::Uc, Mode::Rc] {
            for max_chain in [32, 1] {
                let mut cfg = EngineConfig {
                    mode,
                    qps_per_conn: 4,
                    ..EngineConfig::default()
                };
                cfg.tx.max_chain = max_chain;
                let (a, b) = transfer_64mib(&cfg, drive);
                eprintln!(
                    "  {:<5} {:<4} {:>5} {:>6} {:>6} {:>6} {:>11.3} {:>8.2} {:>4} {:>10.3} {:>8.2} \
                     {:>9.1} {:>10.2}",
                    drive.name(),
                    mode_name(mode),
                    max_chain,
                    a.chunks_sent,
                    a.post_send_calls,
                    a.send_wrs,
                    ratio(a.post_send_calls, a.chunks_sent),
                    ratio(a.send_wrs, a.post_send_calls),
                    a.retransmits(),
                    ratio(b.acks_sent, b.chunks_received),
                    ratio(b.acks_sent, b.ack_packets),
                    ratio(b.srq_wqes, b.srq_posts),
                    // One CQ is polled per round.
                    ratio(b.chunks_received, b.polls),
                );
                calls.push((drive, mode, max_chain, a.post_send_calls));
            }
        }
    }
    eprintln!("  post calls, chained (max_chain 32) / one WR per post (max_chain 1):");
    for drive in [Drive::Step, Drive::Batch] {
        for mode in [Mode::Uc, Mode::Rc] {
            let of = |m| {
                calls
                    .iter()
                    .find(|&&(d, x, c, _)| d == drive && x == mode && c == m)
                    .map_or(0, |c| c.3)
            };
            eprintln!(
                "    {:<5} {}: {} / {} = {:.3}",
                drive.name(),
                mode_name(mode),
                of(32),
                of(1),
                ratio(of(32), of(1))
            );
        }
    }
}

fn print_memory() {
    let cfg = EngineConfig::default();
    let (conns, qpc) = (256u64, u64::from(cfg.qps_per_conn));
    let qps = conns * qpc;
    let chunk = u64::from(cfg.tx.chunk_size);
    let slot = chunk + uccl_tx::wire::RETR_HDR_LEN as u64;
    let srq = u64::from(cfg.srq_depth) * slot;
    // The engine's receiver credits: the SRQ less what a refill may owe, split evenly among
    // the connections, at most a flow's window.
    let grant =
        (u64::from(cfg.srq_depth - cfg.srq_refill) / conns).min(u64::from(cfg.tx.flow_window));
    let mib = |b: u64| b as f64 / MIB as f64;
    eprintln!();
    eprintln!(
        "receive-buffer memory at {qps} QPs ({conns} connections x {qpc}), UC, chunk {} KiB, \
         slot = chunk + {}-byte header = {slot} B:",
        chunk / KIB,
        uccl_tx::wire::RETR_HDR_LEN
    );
    eprintln!(
        "  SRQ, shared by all QPs: srq_depth {} x {slot} B = {:.1} MiB",
        cfg.srq_depth,
        mib(srq)
    );
    let rows = [
        (
            grant,
            format!(
                "the SRQ's own grant per connection at {conns} connections, \
                 ({} - {}) / {conns} = {grant}, on any one QP",
                cfg.srq_depth, cfg.srq_refill
            ),
        ),
        (
            u64::from(cfg.tx.flow_window),
            "flow_window: a connection's whole window on any one QP".to_string(),
        ),
        (
            u64::from(cfg.sq_depth),
            "sq_depth: everything the peer's QP may have posted".to_string(),
        ),
    ];
    for (depth, why) in rows {
        let per_qp = qps * depth * slot;
        eprintln!(
            "  per-QP RQs, depth {depth:>3} ({why}): {qps} x {depth} x {slot} B = {:.1} MiB, \
             {:.1}x the SRQ",
            mib(per_qp),
            ratio(per_qp, srq)
        );
    }
    eprintln!();
}

// ---- engine/e2e ----------------------------------------------------------------------------

/// Chunks per message in `engine/e2e`.
const E2E_CHUNKS: u64 = 256;

struct E2e {
    p: Pair,
    src: Buffer,
    dst: Buffer,
    len: u64,
    drive: Drive,
}

impl E2e {
    fn new(drive: Drive, mode: Mode, chunk: u32, copy: bool) -> E2e {
        let mut cfg = EngineConfig {
            mode,
            qps_per_conn: 4,
            ..EngineConfig::default()
        };
        cfg.tx.chunk_size = chunk;
        let mut p = Pair::new(&cfg, 1, copy);
        let len = E2E_CHUNKS * u64::from(chunk);
        let src = p.a.register(len as usize).expect("register");
        let dst = p.b.register(len as usize).expect("register");
        E2e {
            p,
            src,
            dst,
            len,
            drive,
        }
    }

    /// One message of `E2E_CHUNKS` chunks from `a` to `b`: the receive posted (its
    /// advertisement sent), the send matched with it, every chunk written and acknowledged.
    fn message(&mut self) -> u64 {
        let (ca, cb) = self.p.conns[0];
        let r = self.p.b.recv(cb, &self.dst, 0, self.len).expect("recv");
        let t = self.p.a.send(ca, &self.src, 0, self.len).expect("send");
        self.p.run(self.drive, || r.is_done() && t.is_done());
        t.test().expect("done").expect("sent");
        r.test().expect("done").expect("received").len
    }
}

fn e2e(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine/e2e");
    g.throughput(Throughput::Elements(E2E_CHUNKS))
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    let runs = [Drive::Step, Drive::Batch].into_iter().flat_map(|d| {
        [Mode::Uc, Mode::Rc].into_iter().flat_map(move |m| {
            [16 * KIB as u32, 4 * KIB as u32]
                .into_iter()
                .flat_map(move |c| [true, false].map(|copy| (d, m, c, copy)))
        })
    });
    for (drive, mode, chunk, copy) in runs {
        // Built on first use, so that a filtered-out benchmark costs nothing.
        let mut state = None;
        let id = format!(
            "{}/{}/{}KiB/{}",
            drive.name(),
            mode_name(mode),
            chunk / 1024,
            if copy { "copy" } else { "nocopy" }
        );
        g.bench_function(BenchmarkId::from_parameter(&id), |bench| {
            let s = state.get_or_insert_with(|| {
                let mut s = E2e::new(drive, mode, chunk, copy);
                // One message untimed (first touches), and what a message costs in counts.
                let (a0, b0) = (s.p.a.stats(), s.p.b.stats());
                s.message();
                let (a1, b1) = (s.p.a.stats(), s.p.b.stats());
                eprintln!(
                    "engine/e2e/{id}: per message of {E2E_CHUNKS} chunks: {} poll rounds of \
                     each engine, {} post calls, {} ACK headers, {} retransmissions",
                    (a1.polls - a0.polls) / 3,
                    a1.post_send_calls - a0.post_send_calls,
                    b1.acks_sent - b0.acks_sent,
                    a1.retransmits() - a0.retransmits(),
                );
                s
            });
            bench.iter(|| black_box(s.message()))
        });
    }
    g.finish();
}

// ---- engine/poll ---------------------------------------------------------------------------

/// Completions drained per iteration of `engine/poll`.
const POLL_CQES: u64 = 1024;
const POLL_CHUNK: u32 = 4096;

struct Drain {
    p: Pair,
    src: Buffer,
    dst: Descriptor,
    /// One-chunk writes per batch, all in flight at once (within the flows' windows and
    /// credits).
    batch: u64,
    poll_budget: u64,
}

impl Drain {
    /// `conns` connections of `qps_per_conn` QPs each; batches of `batch` chunks.
    fn new(conns: usize, qps_per_conn: u16, batch: u64) -> Drain {
        let mut cfg = EngineConfig {
            mode: Mode::Uc,
            qps_per_conn,
            max_conns: conns as u32,
            sq_depth: 64,
            // Room for every chunk of a batch: each connection is granted
            // (2048 - 64) / conns receive credits, at most its flow window.
            srq_depth: 2048,
            srq_refill: 64,
            max_recvs: 1,
            ..EngineConfig::default()
        };
        cfg.tx.chunk_size = POLL_CHUNK;
        cfg.tx.flow_window = 256;
        // The receiver is kept from polling while a batch crosses the fabric (1024 packets
        // take 340 us of virtual time at 100 Gb/s): the sender must not time out meanwhile.
        cfg.tx.rto_min_us = 1_000_000;
        cfg.tx.rto_initial_us = 1_000_000;
        cfg.tx.rto_max_us = 1_000_000;
        cfg.tx.max_silence_us = 10_000_000;
        // Nor may a congestion window hold the batch back (no ACK comes while it crosses).
        cfg.tx.target_delay_us = 0;
        let poll_budget = cfg.poll_budget as u64;
        let grant = (u64::from(cfg.srq_depth - cfg.srq_refill) / conns as u64)
            .min(u64::from(cfg.tx.flow_window));
        assert!(batch <= grant * conns as u64, "a batch fits the credits");
        assert_eq!(POLL_CQES % batch, 0);
        let mut p = Pair::new(&cfg, conns, true);
        let src = p.a.register(POLL_CHUNK as usize).expect("register");
        let buf =
            p.b.register((batch * u64::from(POLL_CHUNK)) as usize)
                .expect("register");
        let dst = p.b.export(&buf, 0, buf.len() as u64).expect("export");
        Drain {
            p,
            src,
            dst,
            batch,
            poll_budget,
        }
    }

    /// One batch: `a` writes one-chunk messages round-robin over the connections and the fabric
    /// delivers them all, `b` not polling; then `b`'s poll rounds that drain the completions
    /// (timed); then both run until every write is acknowledged. Returns the drain's time and
    /// the receiver's counters before and after it.
    fn batch(&mut self) -> (Duration, Stats, Stats) {
        let p = &mut self.p;
        let n = p.conns.len();
        let mut reqs = Vec::with_capacity(self.batch as usize);
        for k in 0..self.batch {
            let (ca, _) = p.conns[k as usize % n];
            let off = k * u64::from(POLL_CHUNK);
            let r =
                p.a.write(ca, &self.src, 0, POLL_CHUNK.into(), &self.dst, off);
            reqs.push(r.expect("write"));
        }
        let target = p.a.stats().chunks_sent + self.batch;
        for round in 0.. {
            let busy = p.a.poll().expect("poll");
            p.fabric.run_until_idle().expect("fabric idle");
            if !busy && p.a.stats().chunks_sent >= target {
                break;
            }
            assert!(round < 100_000, "the sender cannot send the batch");
        }
        let before = p.b.stats();
        let rounds = self.batch.div_ceil(self.poll_budget);
        let t0 = Instant::now();
        drain_rounds(&mut p.b, rounds);
        let took = t0.elapsed();
        let after = p.b.stats();
        assert_eq!(
            after.chunks_received - before.chunks_received,
            self.batch,
            "the drain took every chunk of the batch, and only those"
        );
        let mut done = 0;
        p.run(Drive::Step, || {
            // Writes complete in order, mostly.
            while reqs.get(done).is_some_and(Request::is_done) {
                done += 1;
            }
            done == reqs.len()
        });
        all_ok(&reqs);
        (took, before, after)
    }
}

/// `rounds` poll rounds of `e` (a function of its own, so that a profile can pick out the
/// timed rounds: the samples with `drain_rounds` in their call chain).
#[inline(never)]
fn drain_rounds(e: &mut Engine, rounds: u64) {
    for _ in 0..rounds {
        e.poll().expect("poll");
    }
}

fn poll(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine/poll");
    g.throughput(Throughput::Elements(POLL_CQES))
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    // A batch is what crosses the fabric before the receiver polls: one connection's window
    // holds at most 256 chunks; the 1024-QP runs also take 1024 at once (a chunk on every QP).
    let runs = [
        (1usize, 1u16, 256u64),
        (256, 4, 256),
        (4, 256, 256),
        (256, 4, 1024),
        (4, 256, 1024),
    ];
    for (conns, qps, batch) in runs {
        let mut state: Option<Drain> = None;
        let id = format!("{}qp/{conns}x{qps}/b{batch}", conns * usize::from(qps));
        g.bench_function(BenchmarkId::from_parameter(&id), |bench| {
            let d = state.get_or_insert_with(|| {
                let mut d = Drain::new(conns, qps, batch);
                // One batch untimed (first touches), and what the receiver does per CQE.
                let (_, x, y) = d.batch();
                let cqes = (y.cqes - x.cqes).max(1) as f64;
                eprintln!(
                    "engine/poll/{id}: per receive CQE in the drain: {:.3} ACK headers, {:.3} \
                     ACK packets",
                    (y.acks_sent - x.acks_sent) as f64 / cqes,
                    (y.ack_packets - x.ack_packets) as f64 / cqes,
                );
                d
            });
            bench.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    for _ in 0..POLL_CQES / d.batch {
                        total += d.batch().0;
                    }
                }
                total
            })
        });
    }
    g.finish();
}

criterion_group!(benches, e2e, poll);

fn main() {
    // The counts take a few transfers: only when benchmarking (not under `cargo test`, which
    // runs every benchmark once, nor when listing).
    let args: Vec<String> = std::env::args().collect();
    let has = |a: &str| args.iter().any(|x| x == a);
    if has("--bench") && !has("--test") && !has("--list") {
        print_post_counts();
        print_memory();
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
