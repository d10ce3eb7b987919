//! Workloads of messages over the connections of a [`Sim`], and the invariants every run must
//! keep: every message delivered exactly once, byte-exact, into its own range only (every
//! other byte of the receiving and sending buffers untouched: guard bytes), receives, sends and
//! receives completing in posting order per connection and direction, no request failing; and
//! after the run, every pool slot, credit and CQ reservation given back.
//!
//! [`run`] posts the operations of a workload stream by stream (a stream is one direction of
//! one connection) with a bounded number in flight per stream, and watches every request from
//! the [`Sim::run`] loop, recording the round in which its `test()` first returned a result.

use std::collections::BTreeMap;
use std::time::Duration;

use uccl_engine::{Access, Block, Buffer, ConnId, Descriptor, Request, Stats};

pub use crate::settle::{
    back_to_baseline, close_all, drain, memory_back_to_baseline, quiet, run_and_drain, usage_table,
};
use crate::{Sim, pattern};

/// Bytes between two messages' ranges in an arena: they hold known bytes that no message may
/// touch (odd, so that ranges start unaligned too).
pub const GUARD: usize = 61;

/// A connection between two engines of a [`Sim`]: engine `a`'s id of it is `ca`, engine `b`'s
/// is `cb`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// One end's engine index.
    pub a: usize,
    /// Its id of the connection.
    pub ca: ConnId,
    /// The other end's engine index.
    pub b: usize,
    /// Its id of the connection.
    pub cb: ConnId,
}

/// How an operation moves its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Two-sided: the receiver posts a receive of `len + slack` bytes, the sender sends `len`.
    Send,
    /// One-sided: the receiver exports `len + slack` bytes, the sender writes `len` of them at
    /// offset `slack / 2`.
    Write,
    /// As [`Kind::Write`], as one vectored write ([`uccl_engine::Engine::write_v`]) of the
    /// message cut in up to three blocks ([`write_v_cuts`]), listed last first.
    WriteV,
    /// One-sided, the other way: the sender exports its `len` bytes for reading, and the
    /// receiver reads them ([`uccl_engine::Engine::read`]) into its buffer of `len + slack`
    /// bytes at offset `slack / 2`. The request is the receiver's.
    Read,
}

impl Kind {
    /// Whether the bytes land at offset `slack / 2` of the receiver's range (one-sided).
    fn one_sided(self) -> bool {
        self != Kind::Send
    }
}

/// The blocks a [`Kind::WriteV`] of `len` bytes is cut in: (offset in the message, length),
/// last block first. One block of 0 bytes for an empty message.
pub fn write_v_cuts(len: usize) -> Vec<(usize, usize)> {
    let n = len.clamp(1, 3);
    let each = len / n;
    let mut cuts: Vec<(usize, usize)> = (0..n)
        .map(|k| (k * each, if k + 1 == n { len - k * each } else { each }))
        .collect();
    cuts.reverse();
    cuts
}

/// One message of a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Op {
    /// Index of the link in the slice given to [`run`].
    pub link: usize,
    /// From `b` to `a` (else from `a` to `b`).
    pub reverse: bool,
    /// Two-sided or one-sided.
    pub kind: Kind,
    /// The message's bytes.
    pub len: usize,
    /// Bytes of the receive buffer or exported region beyond the message (they must stay as
    /// they were).
    pub slack: usize,
}

/// How [`run`] paces a workload.
#[derive(Debug, Clone, Copy)]
pub struct Pacing {
    /// Operations in flight at once per stream (at most the engines' `max_recvs`).
    pub window: usize,
    /// Virtual time the whole workload may take.
    pub limit: Duration,
}

impl Default for Pacing {
    fn default() -> Self {
        Pacing {
            window: 8,
            limit: Duration::from_secs(600),
        }
    }
}

/// What a successful [`run`] measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// Virtual time when the last request completed.
    pub virtual_time: Duration,
    /// Observations made (one per [`Sim::run`] round).
    pub rounds: u64,
    /// Each engine's counters at the end (not deltas).
    pub stats: Vec<Stats>,
    /// Sends or writes that completed while one posted before them on the same stream had
    /// not (allowed: a send completes when its last WR does, and WRs on different paths
    /// complete in any order; receives must complete in order).
    pub sender_out_of_order: u64,
}

/// Which requests of a stream: receives (which must complete in posting order), sends,
/// writes, reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Class {
    Recv,
    Send,
    Write,
    Read,
}

/// A request being watched.
struct Watched {
    req: Request,
    op: usize,
    class: Class,
    /// The round its result was first seen.
    seen: Option<u64>,
}

/// Where an operation's bytes come from and go.
#[derive(Debug, Clone, Copy)]
struct Place {
    src: usize,
    dst: usize,
}

/// An engine's two arenas: what it sends from and what it receives into.
struct Arenas {
    src: Buffer,
    dst: Buffer,
    /// Labelled ranges of `dst` and `src`, for naming where a wrong byte is.
    dst_ranges: Vec<(usize, usize, String)>,
    src_ranges: Vec<(usize, usize, String)>,
}

fn initial(seed: u64, engine: usize, which: u64, len: usize) -> Vec<u8> {
    pattern(seed, 0xfeed_0000 + which, engine as u64, len)
}

/// The bytes of operation `k` of a workload run with `seed`.
pub fn op_bytes(seed: u64, op: &Op, k: usize) -> Vec<u8> {
    pattern(
        seed,
        op.link as u64 * 2 + u64::from(op.reverse),
        k as u64,
        op.len,
    )
}

/// The sender, the receiver and the connection ids (sender's, receiver's) of `op`.
fn ends(links: &[Link], op: &Op) -> (usize, usize, ConnId, ConnId) {
    let l = links[op.link];
    if op.reverse {
        (l.b, l.a, l.cb, l.ca)
    } else {
        (l.a, l.b, l.ca, l.cb)
    }
}

/// Runs `ops` over `links` and checks every invariant of the module documentation; an error
/// names the seed, the operation and what went wrong.
pub fn run(sim: &mut Sim, links: &[Link], ops: &[Op], pacing: Pacing) -> Result<Report, String> {
    run_with(sim, links, ops, pacing, |_, _| {})
}

/// [`run`], calling `hook` with the simulation and the round's number once per round, after
/// the round's observations and postings (to inject faults or frames mid-transfer).
pub fn run_with(
    sim: &mut Sim,
    links: &[Link],
    ops: &[Op],
    pacing: Pacing,
    mut hook: impl FnMut(&mut Sim, u64),
) -> Result<Report, String> {
    let seed = sim.seed;
    let n = sim.engines.len();
    let before: Vec<Stats> = sim.engines.iter().map(|e| e.stats()).collect();
    // Lay every message out in its sender's source arena and its receiver's destination arena.
    let mut src_len = vec![0usize; n];
    let mut dst_len = vec![GUARD; n];
    let mut places = Vec::with_capacity(ops.len());
    for op in ops {
        let (s, r, _, _) = ends(links, op);
        places.push(Place {
            src: src_len[s],
            dst: dst_len[r],
        });
        src_len[s] += op.len + GUARD;
        dst_len[r] += op.len + op.slack + GUARD;
    }
    let mut arenas = Vec::with_capacity(n);
    for (i, e) in sim.engines.iter_mut().enumerate() {
        let err = |e| format!("seed {seed}: registering arenas of engine {i}: {e}");
        let src = e.register(src_len[i].max(1)).map_err(err)?;
        let dst = e.register(dst_len[i]).map_err(err)?;
        src.write_at(0, &initial(seed, i, 0, src.len()))
            .map_err(err)?;
        dst.write_at(0, &initial(seed, i, 1, dst.len()))
            .map_err(err)?;
        arenas.push(Arenas {
            src,
            dst,
            dst_ranges: Vec::new(),
            src_ranges: Vec::new(),
        });
    }
    let mut descs: Vec<Option<Descriptor>> = vec![None; ops.len()];
    for (k, (op, p)) in ops.iter().zip(&places).enumerate() {
        let (s, r, _, _) = ends(links, op);
        arenas[s]
            .src
            .write_at(p.src, &op_bytes(seed, op, k))
            .map_err(|e| format!("seed {seed}: {e}"))?;
        let label = format!("op {k} ({op:?})");
        arenas[s]
            .src_ranges
            .push((p.src, p.src + op.len, label.clone()));
        arenas[r]
            .dst_ranges
            .push((p.dst, p.dst + op.len + op.slack, label));
        let exported = match op.kind {
            Kind::Send => None,
            Kind::Write | Kind::WriteV => {
                let room = (op.len + op.slack) as u64;
                Some(sim.engines[r].export(&arenas[r].dst, p.dst as u64, room))
            }
            // A region of at least a byte (a guard byte follows every message).
            Kind::Read => Some(sim.engines[s].export_with(
                &arenas[s].src,
                p.src as u64,
                op.len.max(1) as u64,
                Access::READ,
            )),
        };
        if let Some(d) = exported {
            let d = d.map_err(|e| format!("seed {seed}: exporting for op {k}: {e}"))?;
            descs[k] = Some(d);
        }
    }
    // Streams: the operations of each direction of each connection, in order.
    let mut streams: BTreeMap<(usize, bool), Vec<usize>> = BTreeMap::new();
    for (k, op) in ops.iter().enumerate() {
        streams.entry((op.link, op.reverse)).or_default().push(k);
    }
    let mut next: BTreeMap<(usize, bool), usize> = streams.keys().map(|&s| (s, 0)).collect();
    let mut watched: Vec<Watched> = Vec::new();
    // Requests by stream and class, in posting order, and the first not yet complete.
    let mut order: BTreeMap<(usize, bool, Class), (Vec<usize>, usize)> = BTreeMap::new();
    let mut outstanding: BTreeMap<(usize, bool), usize> = BTreeMap::new();
    // Requests of each operation not yet complete (it leaves its stream's window at 0).
    let mut op_pending: Vec<u8> = ops
        .iter()
        .map(|op| if op.kind == Kind::Send { 2 } else { 1 })
        .collect();
    let mut rounds = 0u64;
    let mut sender_out_of_order = 0u64;
    let mut failure: Option<String> = None;
    let mut post_error: Option<String> = None;
    let run = sim.run(pacing.limit, |sim| {
        rounds += 1;
        // Observe: results first seen this round, in posting order per stream and class.
        for ((link, rev, class), (list, first)) in order.iter_mut() {
            let mut gap: Option<usize> = None;
            for &w in &list[*first..] {
                let wt = &mut watched[w];
                if wt.seen.is_none() {
                    match wt.req.test() {
                        Some(r) => {
                            wt.seen = Some(rounds);
                            op_pending[wt.op] -= 1;
                            if op_pending[wt.op] == 0 {
                                *outstanding.get_mut(&(*link, *rev)).expect("stream") -= 1;
                            }
                            if let Err(e) = r {
                                failure.get_or_insert(format!(
                                    "op {} ({:?}) {class:?} failed: {e}",
                                    wt.op, ops[wt.op]
                                ));
                            }
                            match gap {
                                Some(g) if *class == Class::Recv => {
                                    failure.get_or_insert(format!(
                                        "link {link} reverse {rev}: the receive of op {} \
                                         completed before that of op {g}, posted earlier",
                                        wt.op
                                    ));
                                }
                                Some(_) => sender_out_of_order += 1,
                                None => {}
                            }
                        }
                        None => {
                            gap.get_or_insert(wt.op);
                        }
                    }
                }
            }
            while *first < list.len() && watched[list[*first]].seen.is_some() {
                *first += 1;
            }
        }
        if failure.is_some() || post_error.is_some() {
            return true;
        }
        // Post what the windows allow.
        for (&key, list) in &streams {
            let i = next.get_mut(&key).expect("stream");
            let out = outstanding.entry(key).or_insert(0);
            while *i < list.len() && *out < pacing.window {
                let k = list[*i];
                let op = &ops[k];
                let (s, r, cs, cr) = ends(links, op);
                let p = places[k];
                let mut watch = |req: Request, class: Class| {
                    order
                        .entry((key.0, key.1, class))
                        .or_insert((Vec::new(), 0))
                        .0
                        .push(watched.len());
                    watched.push(Watched {
                        req,
                        op: k,
                        class,
                        seen: None,
                    });
                };
                let posted = match op.kind {
                    Kind::Send => {
                        let room = (op.len + op.slack) as u64;
                        sim.engines[r]
                            .recv(cr, &arenas[r].dst, p.dst as u64, room)
                            .map(|q| watch(q, Class::Recv))
                            .and_then(|()| {
                                sim.engines[s].send(cs, &arenas[s].src, p.src as u64, op.len as u64)
                            })
                            .map(|q| watch(q, Class::Send))
                    }
                    Kind::Write => {
                        let d = descs[k].expect("exported");
                        sim.engines[s]
                            .write(
                                cs,
                                &arenas[s].src,
                                p.src as u64,
                                op.len as u64,
                                &d,
                                (op.slack / 2) as u64,
                            )
                            .map(|q| watch(q, Class::Write))
                    }
                    Kind::WriteV => {
                        let d = descs[k].expect("exported");
                        let blocks: Vec<Block> = write_v_cuts(op.len)
                            .into_iter()
                            .map(|(at, len)| Block {
                                buf: arenas[s].src.clone(),
                                offset: (p.src + at) as u64,
                                remote: d,
                                remote_offset: (op.slack / 2 + at) as u64,
                                len: len as u64,
                            })
                            .collect();
                        sim.engines[s]
                            .write_v(cs, &blocks)
                            .map(|q| watch(q, Class::Write))
                    }
                    Kind::Read => {
                        let d = descs[k].expect("exported");
                        sim.engines[r]
                            .read(
                                cr,
                                &arenas[r].dst,
                                (p.dst + op.slack / 2) as u64,
                                &d,
                                0,
                                op.len as u64,
                            )
                            .map(|q| watch(q, Class::Read))
                    }
                };
                if let Err(e) = posted {
                    post_error = Some(format!("posting op {k} ({op:?}): {e}"));
                    return true;
                }
                *i += 1;
                *out += 1;
            }
        }
        hook(sim, rounds);
        next.iter().all(|(key, &i)| i == streams[key].len())
            && order.values().all(|(list, first)| *first == list.len())
    });
    let fail = |what: String| format!("seed {seed}: {what}\n{}", usage_table(sim));
    if let Some(e) = post_error.or(failure) {
        return Err(fail(e));
    }
    run.map_err(|e| {
        let pending: Vec<String> = watched
            .iter()
            .filter(|w| w.seen.is_none())
            .take(8)
            .map(|w| format!("op {} {:?} ({:?})", w.op, w.class, ops[w.op]))
            .collect();
        fail(format!("{e}; still pending: {pending:?}"))
    })?;
    let virtual_time = sim.fabric.now();
    // Every request moved exactly its message's bytes.
    for w in &watched {
        let done = w
            .req
            .test()
            .expect("seen")
            .map_err(|e| fail(e.to_string()))?;
        let want = ops[w.op].len as u64;
        if done.len != want {
            return Err(fail(format!(
                "op {} {:?} ({:?}) completed with {} bytes, not {want}",
                w.op, w.class, ops[w.op], done.len
            )));
        }
    }
    // Byte-exact: each arena is its initial bytes with exactly the messages in place.
    let mut want_dst: Vec<Vec<u8>> = (0..n).map(|i| initial(seed, i, 1, dst_len[i])).collect();
    let mut want_src: Vec<Vec<u8>> = (0..n)
        .map(|i| initial(seed, i, 0, src_len[i].max(1)))
        .collect();
    for (k, (op, p)) in ops.iter().zip(&places).enumerate() {
        let (s, r, _, _) = ends(links, op);
        let bytes = op_bytes(seed, op, k);
        want_src[s][p.src..p.src + op.len].copy_from_slice(&bytes);
        let at = p.dst + if op.kind.one_sided() { op.slack / 2 } else { 0 };
        want_dst[r][at..at + op.len].copy_from_slice(&bytes);
    }
    for (i, a) in arenas.iter().enumerate() {
        for (what, buf, want, ranges) in [
            ("destination", &a.dst, &want_dst[i], &a.dst_ranges),
            ("source", &a.src, &want_src[i], &a.src_ranges),
        ] {
            let mut got = vec![0u8; buf.len()];
            buf.read_at(0, &mut got).map_err(|e| fail(e.to_string()))?;
            if let Some(at) = got.iter().zip(want.iter()).position(|(g, w)| g != w) {
                let wrong = got[at..]
                    .iter()
                    .zip(&want[at..])
                    .filter(|(g, w)| g != w)
                    .count();
                let place = ranges
                    .iter()
                    .find(|(s, e, _)| (*s..*e).contains(&at))
                    .map_or("a guard byte".to_string(), |(s, _, l)| {
                        format!("byte {} of the range of {l}", at - s)
                    });
                return Err(fail(format!(
                    "engine {i}'s {what} arena differs at offset {at} ({place}): {wrong} bytes \
                     from there on are wrong"
                )));
            }
        }
    }
    // Exactly once: each receiver counted each of its messages (each block of a vectored
    // write) once, and the bytes of its reads once.
    let stats: Vec<Stats> = sim.engines.iter().map(|e| e.stats()).collect();
    for i in 0..n {
        let to_me = |kind, count: fn(&Op) -> u64| -> u64 {
            ops.iter()
                .filter(|op| op.kind == kind && ends(links, op).1 == i)
                .map(count)
                .sum()
        };
        let one = |_: &Op| 1;
        let want = (
            to_me(Kind::Send, one),
            to_me(Kind::Write, one) + to_me(Kind::WriteV, |op| write_v_cuts(op.len).len() as u64),
            to_me(Kind::Read, |op| op.len as u64),
        );
        let got = (
            stats[i].messages_received - before[i].messages_received,
            stats[i].writes_received - before[i].writes_received,
            stats[i].bytes_read - before[i].bytes_read,
        );
        if got != want {
            return Err(fail(format!(
                "engine {i} received {got:?} (messages, writes, bytes read), expected {want:?}"
            )));
        }
    }
    Ok(Report {
        virtual_time,
        rounds,
        stats,
        sender_out_of_order,
    })
}
