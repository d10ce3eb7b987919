//! A model network for driving a `Tx`, deterministic from a seed:
//!
//! - per-QP in-order pipes with a latency and a random queueing delay (so RTOs can be
//!   spurious), WR loss (UC: a lost WR is gone, the sender completes it anyway), duplication,
//!   and optionally one black-holed QP (everything sent on it is lost);
//! - send completions for signaled WRs after a random delay, each covering the WRs before it;
//!   optionally one QP fails at a given time (its outstanding WRs flush with errors);
//! - posts that fail half-way (the provider accepts a prefix of the chain);
//! - a receiver that tracks a cumulative ACK and a SACK bitmap and grants a credit window,
//!   sometimes 0 for a while (a window update follows);
//! - ACKs that may be delayed (so reordered), duplicated or lost;
//! - ACK requests (a timeout's, with `TxConfig::ack_requests`) that reach the receiver behind
//!   everything sent before them (as on one link) and are answered, both lost like ACKs.
//!
//! It checks as it goes: chains never overfill a send queue nor mix QPs, WR sequence
//! numbers are consecutive per QP, a retransmission goes where the original went, a message is
//! reported complete only once no WR naming its bytes is outstanding and is never named by a
//! WR after that, and a flow never posts beyond its credit window.

#![allow(dead_code, unreachable_pub)]

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use bufpool::{Region, RegionPool};
use uccl_tx::wire::{AckRepr, Imm};
use uccl_tx::{Event, Message, PathId, Tx, TxConfig, WrId};
use verbs_safe::sys::{ibv_send_flags, ibv_wr_opcode};

mod net;

use net::OnWire;
pub use net::{NetConfig, Receiver, Rng};

/// The first flow's id.
pub const FID: u16 = 3;

/// A message: its flow and its id in the flow.
pub type MsgKey = (u16, u64);
pub const HDR_LKEY: u32 = 0xbeef;

/// A WR the model's NIC holds until a completion covers it.
#[derive(Debug, Clone, Copy)]
struct Outstanding {
    seq: u64,
    wr_id: u64,
    msg: Option<MsgKey>,
}

/// What the model reads from a WR before posting it.
#[derive(Debug, Clone, Copy)]
struct WrSeen {
    wr_id: u64,
    send: bool,
    signaled: bool,
    fid: u16,
    csn: u16,
    remote: u64,
    data: u64,
    chunk: bool,
}

pub struct Sim {
    pub tx: Tx,
    pub now: u64,
    pub rng: Rng,
    pub cfg: NetConfig,
    pub path_ids: Vec<PathId>,
    pipes: Vec<VecDeque<(u64, OnWire)>>,
    comps: Vec<VecDeque<(u64, u64)>>,
    /// WRs each path's NIC still holds, oldest first.
    held: Vec<VecDeque<Outstanding>>,
    /// WRs posted per path (the next sequence number).
    posted: Vec<u64>,
    failed_paths: Vec<bool>,
    acks: BinaryHeap<Reverse<(u64, u64, [u8; uccl_tx::wire::ACK_LEN])>>,
    ack_seq: u64,
    /// ACK requests on their way to the receiver: (arrival, flow, number), in arrival order.
    asks: VecDeque<(u64, u16, u16)>,
    /// The receiver of each flow.
    pub rx: Vec<Receiver>,
    /// Remote address each (flow, CSN) was first sent to, to check retransmissions.
    remote_of: BTreeMap<(u16, u16), u64>,
    /// Message of each local address range: start -> (end, message).
    ranges: BTreeMap<u64, (u64, MsgKey)>,
    next_local: u64,
    /// WRs naming each message that the NIC still holds.
    naming: BTreeMap<MsgKey, u32>,
    pub done: BTreeMap<MsgKey, u32>,
    pub failed: Vec<Event>,
    pub dropped_wrs: u64,
    pub chains_seen: u64,
    pub wrs_seen: u64,
    pub max_chain_seen: u32,
    pub post_failures: u64,
    pub sends: Vec<MsgKey>,
}

impl Sim {
    pub fn new(cfg: NetConfig, txc: TxConfig) -> Sim {
        let hdrs = RegionPool::new(
            Region::for_slots(16, cfg.hdr_slots, 64).unwrap(),
            16,
            HDR_LKEY,
        )
        .unwrap();
        let first = txc.first_wr_seq;
        let mut tx = Tx::new(txc, hdrs).unwrap();
        let path_ids: Vec<PathId> = cfg
            .paths
            .iter()
            .map(|&(d, _)| tx.add_path(d).unwrap())
            .collect();
        for f in 0..cfg.flows {
            tx.open_flow(FID + f, &path_ids, cfg.credit).unwrap();
        }
        let n = cfg.paths.len();
        Sim {
            tx,
            now: 0,
            rng: Rng::new(cfg.seed),
            path_ids,
            pipes: vec![VecDeque::new(); n],
            comps: vec![VecDeque::new(); n],
            held: vec![VecDeque::new(); n],
            posted: vec![first; n],
            failed_paths: vec![false; n],
            acks: BinaryHeap::new(),
            ack_seq: 0,
            asks: VecDeque::new(),
            rx: (0..cfg.flows).map(|_| Receiver::new()).collect(),
            remote_of: BTreeMap::new(),
            ranges: BTreeMap::new(),
            next_local: 0x10_0000,
            naming: BTreeMap::new(),
            done: BTreeMap::new(),
            failed: Vec::new(),
            dropped_wrs: 0,
            chains_seen: 0,
            wrs_seen: 0,
            max_chain_seen: 0,
            post_failures: 0,
            sends: Vec::new(),
            cfg,
        }
    }

    /// The flows' ids.
    pub fn fids(&self) -> std::ops::Range<u16> {
        FID..FID + self.cfg.flows
    }

    /// Queues a message of `len` bytes (its own local range) to `remote`, on the flows in
    /// turn.
    pub fn send(&mut self, len: u64, remote: u64) -> MsgKey {
        let local = self.next_local;
        self.next_local += len + 64;
        let fid = FID + (self.sends.len() % usize::from(self.cfg.flows)) as u16;
        let id = self
            .tx
            .send(
                fid,
                Message {
                    local_addr: local,
                    lkey: 7,
                    len,
                    remote_addr: remote,
                    rkey: 9,
                },
            )
            .unwrap();
        self.ranges.insert(local, (local + len, (fid, id)));
        self.sends.push((fid, id));
        (fid, id)
    }

    fn message_at(&self, addr: u64) -> MsgKey {
        let (_, &(end, key)) = self.ranges.range(..=addr).next_back().expect("a message");
        assert!(addr <= end, "WR data at {addr:#x} names no message");
        key
    }

    /// Polls the transmit side until it hands out nothing, posting what it hands out (a post
    /// sometimes failing half-way).
    fn transmit(&mut self) {
        while self.transmit_once() {}
    }

    /// One `poll_transmit`; whether it handed out anything.
    fn transmit_once(&mut self) -> bool {
        let mut posted = Vec::new();
        {
            let now = self.now;
            let Sim { tx, rng, cfg, .. } = self;
            let mut t = tx.poll_transmit(now);
            while let Some(chain) = t.next_chain() {
                let p = usize::from(chain.path().0);
                let seen: Vec<WrSeen> = chain
                    .wrs()
                    .map(|w| {
                        let send = w.wr.opcode == ibv_wr_opcode::IBV_WR_SEND;
                        let chunk = w.wr.opcode != ibv_wr_opcode::IBV_WR_RDMA_WRITE;
                        let (fid, csn, remote, data) = if send {
                            let hdr = chain
                                .retransmission_header(w)
                                .expect("a SEND is a retransmission");
                            // No empty SGE: an empty chunk's SEND is its header alone.
                            assert_eq!(w.wr.num_sge, 1 + i32::from(w.sges[1].length > 0));
                            assert_eq!((w.sges[0].lkey, w.sges[0].length), (HDR_LKEY, 16));
                            let imm = Imm::decode(hdr.imm);
                            (imm.fid, imm.csn, hdr.remote_addr, w.sges[1].addr)
                        } else if chunk {
                            assert_eq!(w.wr.opcode, ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM);
                            assert_eq!(w.wr.num_sge, i32::from(w.sges[0].length > 0));
                            // SAFETY: the imm union member is a plain u32 the transmit side wrote.
                            let imm = Imm::decode(u32::from_be(unsafe {
                                w.wr.__bindgen_anon_1.imm_data
                            }));
                            // SAFETY: RDMA WRITEs carry the `rdma` member of the union.
                            let remote = unsafe { w.wr.wr.rdma.remote_addr };
                            (imm.fid, imm.csn, remote, w.sges[0].addr)
                        } else {
                            // A signal WR: a zero-length WRITE that only asks for a completion.
                            assert_eq!(w.wr.num_sge, 0);
                            (0, 0, 0, 0)
                        };
                        WrSeen {
                            wr_id: w.wr.wr_id,
                            send,
                            signaled: w.wr.send_flags & ibv_send_flags::IBV_SEND_SIGNALED.0 != 0,
                            fid,
                            csn,
                            remote,
                            data,
                            chunk,
                        }
                    })
                    .collect();
                assert_eq!(seen.len() as u32, chain.len(), "chain length");
                let n = if rng.chance(cfg.post_fail) {
                    rng.below(u64::from(chain.len())) as u32
                } else {
                    chain.len()
                };
                chain.posted(n);
                posted.push((p, seen, n as usize));
            }
        }
        let mut chunks = 0;
        let any = !posted.is_empty();
        for (p, seen, n) in posted {
            self.chains_seen += 1;
            self.max_chain_seen = self.max_chain_seen.max(seen.len() as u32);
            if n < seen.len() {
                self.post_failures += 1;
            }
            let depth = u64::from(self.cfg.paths[p].0);
            let held = self.held[p].len() as u64;
            assert!(
                held + seen.len() as u64 <= depth,
                "path {p}: {held} outstanding + {} > depth {depth}",
                seen.len()
            );
            for w in &seen[..n] {
                chunks += u32::from(w.chunk);
                self.post_one(p, *w);
            }
        }
        for fid in self.fids().filter(|_| chunks > 0) {
            let f = self.tx.flow_info(fid).unwrap();
            assert!(
                f.inflight <= f.credit,
                "flow {fid}: {} chunks in flight with a credit of {}",
                f.inflight,
                f.credit
            );
        }
        any
    }

    fn post_one(&mut self, p: usize, w: WrSeen) {
        self.wrs_seen += 1;
        let id = WrId::from_raw(w.wr_id);
        assert_eq!(usize::from(id.path.0), p, "a chain mixes QPs");
        assert_eq!(
            id.seq, self.posted[p] as u32,
            "WR sequence numbers are consecutive"
        );
        let seq = self.posted[p];
        self.posted[p] += 1;
        let msg = w.chunk.then(|| self.message_at(w.data));
        if let Some(m) = msg {
            assert_eq!(m.0, w.fid, "a WR carries another flow's immediate");
            assert!(
                !self.done.contains_key(&m),
                "a WR names message {m:?} after its completion"
            );
            *self.naming.entry(m).or_default() += 1;
        }
        self.held[p].push_back(Outstanding {
            seq,
            wr_id: w.wr_id,
            msg,
        });
        // A retransmission goes where the original went (a first send may reuse the CSN of a
        // chunk acknowledged 2048 chunks ago).
        if w.send {
            assert_eq!(
                self.remote_of.get(&(w.fid, w.csn)),
                Some(&w.remote),
                "chunk {} retransmitted elsewhere",
                w.csn
            );
        } else if w.chunk {
            self.remote_of.insert((w.fid, w.csn), w.remote);
        }
        let latency = self.cfg.paths[p].1;
        if self.failed_paths[p] {
            // A QP in ERROR flushes what is posted to it.
            self.comps[p].push_back((self.now, w.wr_id | 1 << 63));
            return;
        }
        if w.signaled {
            let at = self.comps[p]
                .back()
                .map_or(0, |&(t, _)| t)
                .max(self.now + latency / 2 + self.rng.below(self.cfg.comp_delay_max));
            self.comps[p].push_back((at, w.wr_id));
        }
        if !w.chunk {
            return;
        }
        if self.cfg.black_hole == Some(p) || self.rng.chance(self.cfg.loss) {
            self.dropped_wrs += 1;
            return;
        }
        let copies = if self.rng.chance(self.cfg.dup) { 2 } else { 1 };
        for _ in 0..copies {
            let at = self.pipes[p]
                .back()
                .map_or(0, |&(t, _)| t)
                .max(self.now + latency + self.rng.below(self.cfg.queue_max));
            let lane = p as u16;
            self.pipes[p].push_back((
                at,
                OnWire {
                    fid: w.fid,
                    csn: w.csn,
                    lane,
                    retx: w.send,
                },
            ));
        }
    }

    fn next_event(&self) -> Option<u64> {
        let pipes = self.pipes.iter().filter_map(|q| q.front().map(|&(t, _)| t));
        let comps = self.comps.iter().filter_map(|q| q.front().map(|&(t, _)| t));
        let acks = self.acks.peek().map(|Reverse((t, _, _))| *t);
        let fail = self
            .cfg
            .fail_path
            .filter(|&(p, _)| !self.failed_paths[p])
            .map(|(_, t)| t);
        pipes
            .chain(comps)
            .chain(acks)
            .chain(self.asks.front().map(|&(t, _, _)| t))
            .chain(fail)
            .chain(self.tx.poll_timeout())
            .min()
    }

    fn queue_ack(&mut self, at: u64, ack: AckRepr) {
        self.ack_seq += 1;
        self.acks
            .push(Reverse((at, self.ack_seq, ack.to_bytes().unwrap())));
    }

    fn deliver_due(&mut self) {
        if let Some((p, t)) = self.cfg.fail_path
            && t <= self.now
            && !self.failed_paths[p]
        {
            // The QP goes to ERROR: every WR it holds completes with a flush error.
            self.failed_paths[p] = true;
            self.comps[p].clear();
            for o in &self.held[p] {
                self.comps[p].push_back((self.now, o.wr_id | 1 << 63));
            }
        }
        for p in 0..self.pipes.len() {
            while let Some(&(t, w)) = self.pipes[p].front() {
                if t > self.now {
                    break;
                }
                self.pipes[p].pop_front();
                let zero = self.rng.chance(self.cfg.credit_zero);
                let credit = if zero { 0 } else { self.cfg.credit };
                let ack = self.rx[usize::from(w.fid - FID)].arrive(w, credit);
                if zero {
                    // The window opens again a little later (a reliable window update).
                    let at = self.now + 1 + self.rng.below(4 * self.cfg.ack_delay_max + 1);
                    let update = AckRepr {
                        credit: self.cfg.credit,
                        ..ack
                    };
                    self.queue_ack(at, update);
                }
                if self.rng.chance(self.cfg.ack_loss) {
                    continue;
                }
                let copies = if self.rng.chance(self.cfg.ack_dup) {
                    2
                } else {
                    1
                };
                for _ in 0..copies {
                    let at = self.now + 1 + self.rng.below(self.cfg.ack_delay_max);
                    self.queue_ack(at, ack);
                }
            }
            while let Some(&(t, raw)) = self.comps[p].front() {
                if t > self.now {
                    break;
                }
                self.comps[p].pop_front();
                let (id, ok) = (raw & !(1 << 63), raw >> 63 == 0);
                let seq = self.held[p]
                    .iter()
                    .find(|o| o.wr_id == id)
                    .expect("a completion for a WR the NIC holds")
                    .seq;
                while self.held[p].front().is_some_and(|o| o.seq <= seq) {
                    let o = self.held[p].pop_front().unwrap();
                    if let Some(m) = o.msg {
                        *self.naming.get_mut(&m).unwrap() -= 1;
                    }
                }
                self.tx.on_send_completion(id, ok);
            }
        }
        while let Some(&(t, fid, seq)) = self.asks.front() {
            if t > self.now {
                break;
            }
            self.asks.pop_front();
            if self.rng.chance(self.cfg.ack_loss) {
                continue;
            }
            let answer = self.rx[usize::from(fid - FID)].answer(fid, seq, self.cfg.credit);
            if !self.rng.chance(self.cfg.ack_loss) {
                let at = self.now + 1 + self.rng.below(self.cfg.ack_delay_max);
                self.queue_ack(at, answer);
            }
        }
        while let Some(Reverse((t, _, bytes))) = self.acks.peek().copied() {
            if t > self.now {
                break;
            }
            self.acks.pop();
            let ack = AckRepr::from_bytes(&bytes).unwrap();
            self.tx.on_ack(self.now, &ack);
        }
    }

    fn drain_events(&mut self) {
        while let Some(e) = self.tx.poll_event() {
            match e {
                Event::MessageComplete { fid, msg } | Event::MessageFailed { fid, msg, .. } => {
                    let naming = self.naming.get(&(fid, msg)).copied().unwrap_or(0);
                    assert_eq!(
                        naming, 0,
                        "message {msg} of flow {fid} reported while the NIC holds {naming} WRs naming it"
                    );
                    if matches!(e, Event::MessageComplete { .. }) {
                        *self.done.entry((fid, msg)).or_default() += 1;
                    } else {
                        self.failed.push(e);
                    }
                }
                Event::AckRequest { fid, seq } => {
                    // Behind everything sent before it, as on one link, or (overtaking) as
                    // fast as the fastest path; requests stay in order.
                    let last = self.asks.back().map_or(self.now, |&(t, _, _)| t);
                    let at = if self.cfg.asks_overtake {
                        let fastest = self.cfg.paths.iter().map(|&(_, l)| l).min();
                        self.now + fastest.unwrap_or(0)
                    } else {
                        self.pipes
                            .iter()
                            .filter_map(|q| q.back().map(|&(t, _)| t))
                            .fold(self.now, u64::max)
                    };
                    self.asks.push_back((at.max(last) + 1, fid, seq));
                }
                other => self.failed.push(other),
            }
        }
    }

    /// Messages reported (complete or failed).
    pub fn resolved(&self) -> usize {
        self.done.len()
            + self
                .failed
                .iter()
                .filter(|e| matches!(e, Event::MessageFailed { .. }))
                .count()
    }

    /// Runs until every message completed or failed and nothing is left to happen, or
    /// `max_steps` events. Returns whether it finished.
    pub fn run(&mut self, max_steps: u64) -> bool {
        for _ in 0..max_steps {
            self.tx.handle_timeout(self.now);
            self.transmit();
            self.drain_events();
            let quiet =
                self.comps.iter().all(|q| q.is_empty()) && self.pipes.iter().all(|q| q.is_empty());
            if self.resolved() == self.sends.len() && quiet && self.tx.unacked() == 0 {
                return true;
            }
            match self.next_event() {
                Some(t) => self.now = self.now.max(t),
                None => return false,
            }
            self.deliver_due();
            self.drain_events();
        }
        false
    }
}
