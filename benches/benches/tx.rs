//! uccl-tx: cost per chunk of send + poll_transmit + posting report + completions + ACK.
//!
//! - `tx/sans-io`: one flow, the transmit side alone (completions and ACKs synthesized),
//!   chained (up to 32 WRs per doorbell) versus one WR per post, side by side;
//! - `tx/softnic`: the same, the chains really posted on a softnic UC QP (through verbs-safe,
//!   the call a ConnectX gets) and its completions polled, so the doorbell cost is in;
//! - `tx/flows`: 1, 64 and 4096 open flows over 16 QPs, side by side; each iteration sends
//!   4096 one-chunk messages, each acknowledged on its own: `busy` spreads them over every
//!   flow, `idle` sends them all on one flow while the others stay open. The cost per chunk
//!   must not grow with the number of flows.
//!
//! `cargo xtask bench -- tx`

use std::hint::black_box;
use std::time::Duration;

use bufpool::{Region, RegionPool};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use uccl_tx::wire::AckRepr;
use uccl_tx::{Event, Message, PathId, Tx, TxConfig};
use verbs_safe::*;

const CHUNK: u32 = 4096;
const CHUNKS: u64 = 64;

fn new_tx(max_chain: u32, paths: u16, depth: u32) -> (Tx, Vec<PathId>) {
    let hdrs = RegionPool::new(Region::for_slots(16, 64, 64).unwrap(), 16, 1).unwrap();
    let cfg = TxConfig {
        chunk_size: CHUNK,
        flow_window: 256,
        engine_window: 1 << 20,
        wr_pool: 1 << 15,
        max_chain,
        signal_every: 16,
        ..TxConfig::default()
    };
    let mut tx = Tx::new(cfg, hdrs).unwrap();
    let ids = (0..paths).map(|_| tx.add_path(depth).unwrap()).collect();
    (tx, ids)
}

/// The flow a chunk belongs to: its data address says (`local_addr` is `fid << 32`).
fn fid_of(w: &WrSlot<2>) -> u16 {
    (w.sges[0].addr >> 32) as u16
}

/// The only flow.
fn flow_0(_: &WrSlot<2>) -> u16 {
    0
}

fn message(fid: u16, chunks: u64) -> Message {
    Message {
        local_addr: u64::from(fid) << 32,
        lkey: 1,
        len: chunks * u64::from(CHUNK),
        remote_addr: 0x10_0000,
        rkey: 2,
    }
}

/// ACK state of the driver: chunks sent per flow (the cumulative ACK to send), and the flow
/// of each chunk sent in this round, in order.
struct Acks {
    cum: Vec<u16>,
    round: Vec<u16>,
    /// One ACK per chunk, or one per round.
    each: bool,
}

impl Acks {
    fn new(flows: usize, each: bool) -> Acks {
        Acks {
            cum: vec![0; flows],
            round: Vec::new(),
            each,
        }
    }

    /// Everything sent in this round arrived: one ACK per chunk, or (a driver of one flow)
    /// one per round.
    fn ack(&mut self, tx: &mut Tx) {
        for &fid in &self.round {
            let c = &mut self.cum[usize::from(fid)];
            *c = c.wrapping_add(1);
            if self.each {
                Self::send(tx, fid, *c);
            }
        }
        if !self.each
            && let Some(&fid) = self.round.last()
        {
            Self::send(tx, fid, self.cum[usize::from(fid)]);
        }
        self.round.clear();
    }

    fn send(tx: &mut Tx, fid: u16, cum: u16) {
        let ack = AckRepr {
            fid,
            cum,
            echo: cum.wrapping_sub(1) & 2047,
            credit: 256,
            ..AckRepr::default()
        };
        tx.on_ack(1, &ack);
    }
}

/// Drives `tx` until every chunk queued is posted, completed and acknowledged; `post` posts a
/// chain (its head) and returns how many WRs it accepted, pushing the `wr_id`s of the
/// completions it saw.
fn drive(
    tx: &mut Tx,
    acks: &mut Acks,
    done: &mut Vec<u64>,
    flow_of: fn(&WrSlot<2>) -> u16,
    mut post: impl FnMut(*mut sys::ibv_send_wr, &mut Vec<u64>) -> u32,
) {
    loop {
        let mut t = tx.poll_transmit(0);
        let mut any = false;
        while let Some(c) = t.next_chain() {
            any = true;
            acks.round.extend(c.wrs().map(flow_of));
            let n = post(c.head(), done);
            c.posted(n);
        }
        drop(t);
        if !any {
            break;
        }
        for id in done.drain(..) {
            tx.on_send_completion(id, true);
        }
        acks.ack(tx);
    }
    while let Some(e) = tx.poll_event() {
        assert!(matches!(e, Event::MessageComplete { .. }));
    }
}

/// Completions the NIC would give: every signaled WR of the chain.
fn synthesized(head: *mut sys::ibv_send_wr, done: &mut Vec<u64>) -> u32 {
    let mut n = 0;
    let mut p = head;
    while !p.is_null() {
        // SAFETY: `head` heads the chain the transmit side handed out, valid until it is
        // reported; the walk only reads.
        let wr = unsafe { &*p };
        if wr.send_flags & sys::ibv_send_flags::IBV_SEND_SIGNALED.0 != 0 {
            done.push(wr.wr_id);
        }
        n += 1;
        p = wr.next;
    }
    n
}

fn sans_io(c: &mut Criterion) {
    let mut g = c.benchmark_group("tx/sans-io");
    g.throughput(Throughput::Elements(CHUNKS));
    for (name, max_chain) in [("chained", 32), ("one-wr-per-post", 1)] {
        let (mut tx, paths) = new_tx(max_chain, 1, 256);
        tx.open_flow(0, &paths, 256).unwrap();
        let (mut acks, mut done) = (Acks::new(1, false), Vec::new());
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| {
                tx.send(0, message(0, CHUNKS)).unwrap();
                drive(
                    black_box(&mut tx),
                    &mut acks,
                    &mut done,
                    flow_0,
                    synthesized,
                );
            })
        });
    }
    g.finish();
}

fn flows(c: &mut Criterion) {
    const PER_ITER: u64 = 4096;
    let mut g = c.benchmark_group("tx/flows");
    g.throughput(Throughput::Elements(PER_ITER));
    for busy in [true, false] {
        for n in [1u16, 64, 4096] {
            let (mut tx, paths) = new_tx(32, 16, 1024);
            for f in 0..n {
                let i = usize::from(f) % paths.len();
                tx.open_flow(f, &[paths[i], paths[(i + 1) % paths.len()]], 256)
                    .unwrap();
            }
            let (mut acks, mut done) = (Acks::new(usize::from(n), true), Vec::new());
            let name = format!("{}/{n}", if busy { "busy" } else { "idle" });
            g.bench_function(BenchmarkId::from_parameter(name), |b| {
                b.iter(|| {
                    // One-chunk messages, one ACK each: the work per chunk is the same in
                    // every variant, only the number of flows differs.
                    for i in 0..PER_ITER {
                        let f = if busy { (i % u64::from(n)) as u16 } else { 0 };
                        tx.send(f, message(f, 1)).unwrap();
                    }
                    drive(
                        black_box(&mut tx),
                        &mut acks,
                        &mut done,
                        fid_of,
                        synthesized,
                    );
                })
            });
        }
    }
    g.finish();
}

struct SoftQp {
    _fabric: softnic::Fabric,
    qp: Qp<Uc, Rts>,
    cq: std::sync::Arc<Cq>,
    _peer: Qp<Uc, Rts>,
    src: MrBuf,
    dst: DmaBuf,
}

/// A UC QP pair on softnic with a source and a destination region.
fn soft_qp() -> SoftQp {
    let fabric = softnic::Fabric::default();
    let v = Verbs::soft(&fabric);
    let (a, b) = (
        Context::open_by_name(&v, "soft0").unwrap(),
        Context::open_by_name(&v, "soft1").unwrap(),
    );
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (
        Cq::new(&a, 4096, None).unwrap(),
        Cq::new(&b, 4096, None).unwrap(),
    );
    let caps = QpCaps {
        max_send_wr: 256,
        ..QpCaps::default()
    };
    let qa = Qp::<Uc, _>::new(
        &pa,
        QpInit {
            send_cq: &ca,
            recv_cq: &ca,
            srq: None,
            caps,
            sig_all: false,
        },
    )
    .unwrap();
    let qb = Qp::<Uc, _>::new(
        &pb,
        QpInit {
            send_cq: &cb,
            recv_cq: &cb,
            srq: None,
            caps,
            sig_all: false,
        },
    )
    .unwrap();
    let ra = Remote {
        qpn: qa.qpn(),
        psn: 0,
        lid: 0,
        gid: Some(a.query_gid(1, 0).unwrap()),
    };
    let rb = Remote {
        qpn: qb.qpn(),
        psn: 0,
        lid: 0,
        gid: Some(b.query_gid(1, 0).unwrap()),
    };
    let rtr = |r| UcRtr {
        path_mtu: Mtu::Mtu4096,
        ..UcRtr::new(r, LocalPort::new(1, 0))
    };
    let qa = qa
        .init(ConnInit::default())
        .unwrap()
        .rtr(rtr(rb))
        .unwrap()
        .rts(SqPsn(0))
        .unwrap();
    let qb = qb
        .init(ConnInit::with_access(AccessFlags::REMOTE_WRITE))
        .unwrap()
        .rtr(rtr(ra))
        .unwrap()
        .rts(SqPsn(0))
        .unwrap();
    let len = (CHUNKS * u64::from(CHUNK)) as usize;
    let src = pa.alloc_mr(len, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = pb
        .alloc_dma(
            len,
            4096,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    SoftQp {
        _fabric: fabric,
        qp: qa,
        cq: ca,
        _peer: qb,
        src,
        dst,
    }
}

fn softnic(c: &mut Criterion) {
    let mut g = c.benchmark_group("tx/softnic");
    g.throughput(Throughput::Elements(CHUNKS));
    for (name, max_chain) in [("chained", 32), ("one-wr-per-post", 1)] {
        let s = soft_qp();
        let (mut tx, paths) = new_tx(max_chain, 1, 256);
        tx.open_flow(0, &paths, 256).unwrap();
        let mut poller = Poller::new();
        let (mut acks, mut done) = (Acks::new(1, false), Vec::new());
        let m = Message {
            local_addr: s.src.addr(),
            lkey: s.src.lkey(),
            len: s.src.len() as u64,
            remote_addr: s.dst.addr(),
            rkey: s.dst.rkey(),
        };
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| {
                tx.send(0, m).unwrap();
                drive(&mut tx, &mut acks, &mut done, flow_0, |head, done| {
                    // SAFETY: the chain lives in the transmit side's pool, which the borrow
                    // keeps unchanged during the post, and names `src`, registered and alive
                    // for the whole benchmark.
                    let n = match unsafe { s.qp.post_send_chain(head) } {
                        Ok(()) => u32::MAX,
                        Err(Error::Post { index, .. }) => index as u32,
                        Err(e) => panic!("{e}"),
                    };
                    poller.poll(&s.cq, 256, |wc| done.push(wc.wr_id())).unwrap();
                    n
                })
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    targets = sans_io, flows, softnic
}
criterion_main!(benches);
