//! The raw verbs tests (`--test verbs-write-bw`, `verbs-write-lat`): a connected QP pair, RDMA
//! WRITEs posted straight through verbs-safe, their completions polled; no engine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use verbs_safe::{
    AccessFlags, ConnInit, Context, Cq, DmaBuf, Error, LocalPort, Mtu, Poller, Qp, QpCaps, QpInit,
    Rc, RcRtr, RcRts, Remote, Rts, SendOp, SqPsn, Transport, Uc, UcRtr, Verbs, WrSlot,
};

use crate::args::{Args, Test, TransportArg};

/// One run's numbers.
#[derive(Debug, Clone)]
pub(crate) struct RunResult {
    pub(crate) name: &'static str,
    pub(crate) iters: u64,
    /// WRs per `post_send` call.
    pub(crate) batch: u32,
    /// `post_send` calls.
    pub(crate) posts: u64,
    pub(crate) wall: Duration,
    /// softnic's virtual time spent (the simulated link's view).
    pub(crate) virtual_time: Option<Duration>,
    /// softnic: packets the RC QP sent again.
    pub(crate) retransmits: Option<u64>,
    /// Latency test: per-WRITE wall-clock latencies, sorted.
    pub(crate) latencies: Vec<Duration>,
}

/// How a transport is connected (the attributes its transitions take).
trait Link: Transport<Init = ConnInit> {
    fn rtr(remote: Remote, mtu: Mtu) -> Self::Rtr;
    fn rts(psn: u32) -> Self::Rts;
}

impl Link for Rc {
    fn rtr(remote: Remote, mtu: Mtu) -> RcRtr {
        RcRtr {
            path_mtu: mtu,
            ..RcRtr::new(remote, LocalPort::new(1, 0))
        }
    }
    fn rts(psn: u32) -> RcRts {
        RcRts::new(psn)
    }
}

impl Link for Uc {
    fn rtr(remote: Remote, mtu: Mtu) -> UcRtr {
        UcRtr {
            path_mtu: mtu,
            ..UcRtr::new(remote, LocalPort::new(1, 0))
        }
    }
    fn rts(psn: u32) -> SqPsn {
        SqPsn(psn)
    }
}

struct Pair<T: Transport> {
    qa: Qp<T, Rts>,
    _qb: Qp<T, Rts>,
    cq: Arc<Cq>,
    src: Arc<DmaBuf>,
    dst: Arc<DmaBuf>,
}

fn connect<T: Link>(
    verbs: &Verbs,
    dev_a: &str,
    dev_b: &str,
    args: &Args,
) -> Result<Pair<T>, Error> {
    let a = Context::open_by_name(verbs, dev_a)?;
    let b = Context::open_by_name(verbs, dev_b)?;
    let mtu = a.query_port(1)?.active_mtu.min(b.query_port(1)?.active_mtu);
    let (pa, pb) = (a.alloc_pd()?, b.alloc_pd()?);
    let (ca, cb) = (Cq::new(&a, args.depth * 2, None)?, Cq::new(&b, 64, None)?);
    let caps = QpCaps {
        max_send_wr: args.depth,
        max_recv_wr: 16,
        ..QpCaps::default()
    };
    let qa = Qp::<T, _>::new(
        &pa,
        QpInit {
            send_cq: &ca,
            recv_cq: &ca,
            srq: None,
            caps,
            sig_all: false,
        },
    )?;
    let qb = Qp::<T, _>::new(
        &pb,
        QpInit {
            send_cq: &cb,
            recv_cq: &cb,
            srq: None,
            caps,
            sig_all: false,
        },
    )?;
    let ra = Remote {
        qpn: qa.qpn(),
        psn: 0x100,
        lid: a.query_port(1)?.lid,
        gid: Some(a.query_gid(1, 0)?),
    };
    let rb = Remote {
        qpn: qb.qpn(),
        psn: 0x200,
        lid: b.query_port(1)?.lid,
        gid: Some(b.query_gid(1, 0)?),
    };
    let qa = qa
        .init(ConnInit::default())?
        .rtr(T::rtr(rb, mtu))?
        .rts(T::rts(0x100))?;
    let qb = qb
        .init(ConnInit::with_access(AccessFlags::REMOTE_WRITE))?
        .rtr(T::rtr(ra, mtu))?
        .rts(T::rts(0x200))?;
    let size = args.msg_size() as usize;
    let src = Arc::new(pa.alloc_dma(size, 4096, AccessFlags::LOCAL_WRITE)?);
    let pattern: Vec<u8> = (0..size).map(|i| i as u8).collect();
    src.write_at(0, &pattern)?;
    qa.pin(&src);
    let dst = pb.alloc_dma(
        size,
        4096,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    )?;
    Ok(Pair {
        qa,
        _qb: qb,
        cq: ca,
        src,
        dst: Arc::new(dst),
    })
}

const SIGNALED: u32 = verbs_safe::sys::ibv_send_flags::IBV_SEND_SIGNALED.0;

/// A WR slot writing all of `p.src` to `p.dst` with `op`.
fn write_slot<T: Transport>(p: &Pair<T>, op: SendOp, len: u32) -> WrSlot<1> {
    let SendOp::Write { remote_addr, rkey } = op else {
        unreachable!("the benchmark only writes")
    };
    let mut s = WrSlot::<1>::default();
    s.wr.opcode = verbs_safe::sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
    s.wr.wr.rdma.remote_addr = remote_addr;
    s.wr.wr.rdma.rkey = rkey;
    s.sges[0] = p.src.sge(0, len).expect("the whole buffer");
    s.wr.num_sge = 1;
    s
}

/// `iters` WRITEs, `batch` per post, a signaled one every `signal` WRs.
fn write_bw<T: Transport>(
    p: &Pair<T>,
    iters: u64,
    batch: u32,
    signal: u32,
    depth: u32,
) -> Result<(u64, u64), Error> {
    let mut poller = Poller::new();
    let (mut posted, mut completed, mut posts) = (0u64, 0u64, 0u64);
    let len = p.src.len() as u32;
    let op = SendOp::Write {
        remote_addr: p.dst.addr(),
        rkey: p.dst.rkey(),
    };
    // A pool of pre-initialised WRs, one per slot of a batch, posted as a chain.
    let mut slots: Vec<WrSlot<1>> = (0..batch).map(|_| write_slot(p, op, len)).collect();
    let order: Vec<u32> = (0..batch).collect();
    let mut failure = None;
    while completed < iters {
        let n = u64::from(batch).min(iters - posted);
        if n > 0 && posted + n - completed <= u64::from(depth) {
            for (k, i) in (posted..posted + n).enumerate() {
                let s = &mut slots[k];
                s.wr.wr_id = i;
                // Signal every `signal`-th WR and the very last one.
                let signaled = (i + 1) % u64::from(signal) == 0 || i + 1 == iters;
                s.wr.send_flags = if signaled { SIGNALED } else { 0 };
            }
            p.qa.post_slots(&mut slots, &order[..n as usize])?;
            posted += n;
            posts += 1;
            continue;
        }
        poller.poll(&p.cq, 64, |c| match c.ok() {
            Ok(s) => completed = completed.max(s.wr_id() + 1),
            Err(f) => failure = Some((f.wr_id(), f.status())),
        })?;
        if let Some((id, st)) = failure {
            return Err(Error::InvalidWr {
                index: id as usize,
                reason: format!("completed with {st:?}"),
            });
        }
    }
    Ok((posts, completed))
}

/// One signaled WRITE at a time; the wall-clock latency of each.
fn write_lat<T: Transport>(p: &Pair<T>, iters: u64) -> Result<Vec<Duration>, Error> {
    let mut poller = Poller::new();
    let len = p.src.len() as u32;
    let op = SendOp::Write {
        remote_addr: p.dst.addr(),
        rkey: p.dst.rkey(),
    };
    let mut lat = Vec::with_capacity(iters as usize);
    let mut slot = [write_slot(p, op, len)];
    slot[0].wr.send_flags = SIGNALED;
    for i in 0..iters {
        let t0 = Instant::now();
        slot[0].wr.wr_id = i;
        p.qa.post_slots(&mut slot, &[0])?;
        let mut done = None;
        while done.is_none() {
            poller.poll(&p.cq, 1, |c| done = Some(c.is_ok()))?;
        }
        if done == Some(false) {
            return Err(Error::InvalidWr {
                index: i as usize,
                reason: "the WRITE failed".into(),
            });
        }
        lat.push(t0.elapsed());
    }
    lat.sort();
    Ok(lat)
}

fn devices(args: &Args) -> (String, String) {
    if args.soft() {
        (
            "soft0".into(),
            args.peer_device.clone().unwrap_or_else(|| "soft1".into()),
        )
    } else {
        let peer = args
            .peer_device
            .clone()
            .unwrap_or_else(|| args.device.clone());
        (args.device.clone(), peer)
    }
}

/// Runs what `args` asks for.
pub(crate) fn run(args: &Args) -> Result<Vec<RunResult>, Error> {
    let fabric = args.soft().then(|| {
        let f = softnic::Fabric::new(softnic::FabricConfig {
            seed: args.seed,
            copy_payload: !args.no_payload,
            ..Default::default()
        });
        f.set_default_faults(args.faults())
            .expect("the argument parser checked every probability");
        f
    });
    let verbs = fabric.as_ref().map_or_else(Verbs::system, Verbs::soft);
    let (a, b) = devices(args);
    match args.transport {
        TransportArg::Rc => run_on::<Rc>(args, &verbs, fabric.as_ref(), &a, &b),
        TransportArg::Uc => run_on::<Uc>(args, &verbs, fabric.as_ref(), &a, &b),
    }
}

fn run_on<T: Link>(
    args: &Args,
    verbs: &Verbs,
    fabric: Option<&softnic::Fabric>,
    a: &str,
    b: &str,
) -> Result<Vec<RunResult>, Error> {
    let runs: Vec<(&'static str, u32)> = match args.test {
        Test::VerbsWriteBw => vec![
            ("write_bw chained", args.batch.max(1)),
            ("write_bw one-per-post", 1),
        ],
        _ => vec![("write_lat", 1)],
    };
    let iters = args.messages.unwrap_or(20_000);
    let mut out = Vec::new();
    for (name, batch) in runs {
        let pair = connect::<T>(verbs, a, b, args)?;
        let v0 = fabric.map(|f| f.now());
        let t0 = Instant::now();
        let (posts, latencies) = match args.test {
            Test::VerbsWriteBw => {
                let signal = args.batch.clamp(1, args.depth);
                let (posts, _) = write_bw(&pair, iters, batch, signal, args.depth)?;
                (posts, Vec::new())
            }
            _ => (iters, write_lat(&pair, iters)?),
        };
        let wall = t0.elapsed();
        out.push(RunResult {
            name,
            iters,
            batch,
            posts,
            wall,
            virtual_time: fabric.zip(v0).map(|(f, v)| f.now() - v),
            retransmits: fabric
                .and_then(|f| f.qp_counters(pair.qa.as_raw()))
                .map(|c| c.retransmits),
            latencies,
        });
    }
    Ok(out)
}
