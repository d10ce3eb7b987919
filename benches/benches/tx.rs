//! uccl-tx: cost per chunk of send + poll_transmit + completions + ACK, chained (one doorbell
//! per QP per poll, up to 32 WRs) versus one WR per post, side by side:
//!
//! - `sans-io`: the transmit side alone (completions and ACKs synthesized);
//! - `softnic`: the chains really posted on a softnic UC QP (through verbs-safe, the same
//!   call a ConnectX gets) and its completions polled, so the doorbell cost is in.
//!
//! `cargo xtask bench -- tx`

use std::hint::black_box;
use std::time::Duration;

use bufpool::{Region, RegionPool};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use uccl_tx::wire::AckRepr;
use uccl_tx::{Chain, Event, Message, Tx, TxConfig};
use verbs_safe::*;

const CHUNK: u32 = 4096;
const CHUNKS: u64 = 64;

fn new_tx(max_chain: u32) -> Tx {
    let hdrs = RegionPool::new(Region::for_slots(16, 64, 64).unwrap(), 16, 1).unwrap();
    let cfg = TxConfig {
        chunk_size: CHUNK,
        flow_window: 128,
        max_chain,
        signal_every: 16,
        ..TxConfig::default()
    };
    let mut tx = Tx::new(cfg, hdrs).unwrap();
    let p = tx.add_path(256).unwrap();
    tx.open_flow(1, &[p], 0).unwrap();
    tx
}

/// One message of `CHUNKS` chunks through the transmit side; `post` gets each chain and
/// returns the `wr_id`s of the completions it saw.
fn one_message(
    tx: &mut Tx,
    m: Message,
    cum: &mut u16,
    mut post: impl FnMut(&Tx, &Chain) -> Vec<u64>,
) {
    tx.send(1, m).unwrap();
    let mut chains = Vec::new();
    let mut sent = 0;
    while sent < CHUNKS {
        tx.poll_transmit(0, &mut chains);
        let mut done = Vec::new();
        for c in &chains {
            sent += u64::from(c.len);
            done.extend(post(tx, c));
        }
        for id in done {
            tx.on_send_completion(id, true);
        }
    }
    *cum = cum.wrapping_add(CHUNKS as u16);
    tx.on_ack(
        1,
        &AckRepr {
            fid: 1,
            cum: *cum,
            echo: 0,
            ..AckRepr::default()
        },
    );
    while let Some(e) = tx.poll_event() {
        assert!(matches!(e, Event::MessageComplete { .. }));
    }
}

/// Completions the NIC would give: every signaled WR of the chain.
fn synthesized(tx: &Tx, c: &Chain) -> Vec<u64> {
    tx.chain(c)
        .filter(|(_, e)| e.slot.wr.send_flags & sys::ibv_send_flags::IBV_SEND_SIGNALED.0 != 0)
        .map(|(_, e)| e.slot.wr.wr_id)
        .collect()
}

fn sans_io(c: &mut Criterion) {
    let mut g = c.benchmark_group("tx/sans-io");
    g.throughput(Throughput::Elements(CHUNKS));
    for (name, max_chain) in [("chained", 32), ("one-wr-per-post", 1)] {
        let mut tx = new_tx(max_chain);
        let mut cum = 0;
        let m = Message {
            local_addr: 0x1000,
            lkey: 1,
            len: CHUNKS * u64::from(CHUNK),
            remote_addr: 0x10_0000,
            rkey: 2,
        };
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| one_message(black_box(&mut tx), m, &mut cum, synthesized))
        });
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
        let mut tx = new_tx(max_chain);
        let mut poller = Poller::new();
        let mut cum = 0;
        let m = Message {
            local_addr: s.src.addr(),
            lkey: s.src.lkey(),
            len: s.src.len() as u64,
            remote_addr: s.dst.addr(),
            rkey: s.dst.rkey(),
        };
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| {
                one_message(&mut tx, m, &mut cum, |_, c| {
                    // SAFETY: the chain lives in the transmit side's pool and names `src`,
                    // registered and alive for the whole benchmark.
                    unsafe { s.qp.post_send_chain(c.head).unwrap() };
                    let mut done = Vec::new();
                    poller.poll(&s.cq, 256, |wc| done.push(wc.wr_id())).unwrap();
                    done
                })
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    targets = sans_io, softnic
}
criterion_main!(benches);
