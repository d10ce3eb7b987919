//! A model network for driving a `Tx`: per-QP in-order pipes with latency and loss (UC: a
//! lost WR is gone, the sender completes it anyway), send completions for signaled WRs, a
//! receiver that tracks a cumulative ACK and a SACK bitmap, and ACKs that may be delayed,
//! reordered, duplicated or lost.

#![allow(dead_code, unreachable_pub)]

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use bufpool::{Region, RegionPool};
use uccl_tx::wire::{AckRepr, Imm, SACK_BITS, csn_diff};
use uccl_tx::{Chain, Event, Message, PathId, Tx, TxConfig};
use verbs_safe::sys::{ibv_send_flags, ibv_wr_opcode};

pub const FID: u16 = 3;
pub const HDR_LKEY: u32 = 0xbeef;

/// Small, deterministic RNG for the model.
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
}

#[derive(Debug, Clone)]
pub struct NetConfig {
    pub seed: u64,
    /// (send-queue depth, one-way latency ns) per path.
    pub paths: Vec<(u32, u64)>,
    pub loss: f64,
    pub ack_loss: f64,
    pub ack_dup: f64,
    pub ack_delay_max: u64,
    pub hdr_slots: usize,
}

/// A WR on the wire.
#[derive(Debug, Clone, Copy)]
struct OnWire {
    csn: u16,
    path: PathId,
}

/// The receiver: cumulative ACK plus a bitmap of what arrived after it.
pub struct Receiver {
    /// Chunks received in order, modulo 2^16 (low 11 bits: the next CSN expected).
    pub cum: u16,
    ahead: [bool; SACK_BITS],
    pub delivered: u64,
    pub duplicates: u64,
}

impl Receiver {
    fn new() -> Receiver {
        Receiver {
            cum: 0,
            ahead: [false; SACK_BITS],
            delivered: 0,
            duplicates: 0,
        }
    }

    /// A chunk arrived; returns the ACK to send.
    fn arrive(&mut self, csn: u16, path: PathId) -> AckRepr {
        let d = csn_diff(csn, self.cum & 2047);
        assert!(
            d <= SACK_BITS as i32,
            "chunk {csn} is {d} past the cumulative ACK: the window outran the bitmap"
        );
        if d < 0 || (d > 0 && self.ahead[(d - 1) as usize]) {
            self.duplicates += 1;
        } else if d == 0 {
            self.delivered += 1;
            loop {
                // `ahead[0]` is the chunk right after the old cum, the new cum.
                self.cum = self.cum.wrapping_add(1);
                let next_arrived = self.ahead[0];
                self.ahead.rotate_left(1);
                self.ahead[SACK_BITS - 1] = false;
                if !next_arrived {
                    break;
                }
            }
        } else {
            self.delivered += 1;
            self.ahead[(d - 1) as usize] = true;
        }
        let mut a = AckRepr {
            path: path.0,
            fid: FID,
            cum: self.cum,
            echo: csn,
            ..AckRepr::default()
        };
        for (i, &b) in self.ahead.iter().enumerate() {
            if b {
                a.set_sacked(i);
            }
        }
        a
    }
}

pub struct Sim {
    pub tx: Tx,
    pub now: u64,
    pub rng: Rng,
    pub cfg: NetConfig,
    pub path_ids: Vec<PathId>,
    pipes: Vec<VecDeque<(u64, OnWire)>>,
    comps: Vec<VecDeque<(u64, u64)>>,
    /// Model send-queue accounting: WRs posted and covered by completions, per path.
    posted: Vec<u64>,
    completed: Vec<u64>,
    acks: BinaryHeap<Reverse<(u64, u64, [u8; uccl_tx::wire::ACK_LEN])>>,
    ack_seq: u64,
    pub rx: Receiver,
    /// Remote address each CSN (absolute index) was first sent to, to check headers.
    remote_of: BTreeMap<u16, u64>,
    pub done: BTreeMap<u64, u32>,
    pub failed: Vec<Event>,
    pub dropped_wrs: u64,
    pub chains_seen: u64,
    pub wrs_seen: u64,
    pub max_chain_seen: u32,
    pub sends: Vec<u64>,
}

impl Sim {
    pub fn new(cfg: NetConfig, txc: TxConfig) -> Sim {
        let hdrs = RegionPool::new(
            Region::for_slots(16, cfg.hdr_slots, 64).unwrap(),
            16,
            HDR_LKEY,
        )
        .unwrap();
        let mut tx = Tx::new(txc, hdrs).unwrap();
        let path_ids: Vec<PathId> = cfg
            .paths
            .iter()
            .map(|&(d, _)| tx.add_path(d).unwrap())
            .collect();
        tx.open_flow(FID, &path_ids, 0).unwrap();
        let n = cfg.paths.len();
        Sim {
            tx,
            now: 0,
            rng: Rng::new(cfg.seed),
            path_ids,
            pipes: vec![VecDeque::new(); n],
            comps: vec![VecDeque::new(); n],
            posted: vec![0; n],
            completed: vec![0; n],
            acks: BinaryHeap::new(),
            ack_seq: 0,
            rx: Receiver::new(),
            remote_of: BTreeMap::new(),
            done: BTreeMap::new(),
            failed: Vec::new(),
            dropped_wrs: 0,
            chains_seen: 0,
            wrs_seen: 0,
            max_chain_seen: 0,
            sends: Vec::new(),
            cfg,
        }
    }

    pub fn send(&mut self, len: u64, remote: u64) -> u64 {
        let id = self
            .tx
            .send(
                FID,
                Message {
                    local_addr: 0x10_0000,
                    lkey: 7,
                    len,
                    remote_addr: remote,
                    rkey: 9,
                },
            )
            .unwrap();
        self.sends.push(id);
        id
    }

    /// Posts what the transmit side hands out, checking every chain.
    fn post(&mut self, chains: &[Chain]) {
        for c in chains {
            let p = usize::from(c.path.0);
            self.chains_seen += 1;
            self.max_chain_seen = self.max_chain_seen.max(c.len);
            let wrs: Vec<_> = self
                .tx
                .chain(c)
                .map(|(h, e)| (h, e.slot.wr, e.slot.sges))
                .collect();
            assert_eq!(wrs.len() as u32, c.len, "chain length");
            let depth = self.cfg.paths[p].0 as u64;
            assert!(
                self.posted[p] + wrs.len() as u64 - self.completed[p] <= depth,
                "path {p}: {} outstanding + {} > depth {depth}",
                self.posted[p] - self.completed[p],
                wrs.len()
            );
            let latency = self.cfg.paths[p].1;
            for (h, wr, sges) in wrs {
                self.wrs_seen += 1;
                assert_eq!((wr.wr_id >> 40) as u8, c.path.0, "a chain mixes QPs");
                assert_eq!(
                    wr.wr_id & ((1 << 40) - 1),
                    self.posted[p],
                    "WR sequence numbers are consecutive"
                );
                self.posted[p] += 1;
                let (csn, remote) = if wr.opcode == ibv_wr_opcode::IBV_WR_SEND {
                    let hdr = self
                        .tx
                        .retransmission_header(h)
                        .expect("a SEND is a retransmission");
                    assert_eq!(wr.num_sge, 2);
                    assert_eq!(sges[0].lkey, HDR_LKEY);
                    assert_eq!(sges[0].length, 12);
                    let imm = Imm::decode(hdr.imm);
                    assert_eq!(imm.fid, FID);
                    (imm.csn, hdr.remote_addr)
                } else {
                    assert_eq!(wr.opcode, ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM);
                    assert_eq!(wr.num_sge, 1);
                    // SAFETY: the imm union member is a plain u32 written by the transmit side.
                    let imm = Imm::decode(u32::from_be(unsafe { wr.__bindgen_anon_1.imm_data }));
                    // SAFETY: RDMA WRITEs carry the `rdma` member of the union (plain data).
                    let remote = unsafe { wr.wr.rdma.remote_addr };
                    (imm.csn, remote)
                };
                // A retransmission goes where the original went (a first send may reuse the CSN
                // of a chunk acknowledged 2048 chunks ago).
                if wr.opcode == ibv_wr_opcode::IBV_WR_SEND {
                    assert_eq!(
                        self.remote_of.get(&csn),
                        Some(&remote),
                        "chunk {csn} retransmitted elsewhere"
                    );
                } else {
                    self.remote_of.insert(csn, remote);
                }
                let signaled = wr.send_flags & ibv_send_flags::IBV_SEND_SIGNALED.0 != 0;
                if signaled {
                    let at = self.comps[p]
                        .back()
                        .map_or(0, |&(t, _)| t)
                        .max(self.now + latency / 2);
                    self.comps[p].push_back((at, wr.wr_id));
                }
                if self.rng.chance(self.cfg.loss) {
                    self.dropped_wrs += 1;
                    continue;
                }
                let at = self.pipes[p]
                    .back()
                    .map_or(0, |&(t, _)| t)
                    .max(self.now + latency);
                self.pipes[p].push_back((at, OnWire { csn, path: c.path }));
            }
        }
    }

    fn next_event(&self) -> Option<u64> {
        let pipes = self.pipes.iter().filter_map(|q| q.front().map(|&(t, _)| t));
        let comps = self.comps.iter().filter_map(|q| q.front().map(|&(t, _)| t));
        let acks = self.acks.peek().map(|Reverse((t, _, _))| *t);
        pipes
            .chain(comps)
            .chain(acks)
            .chain(self.tx.poll_timeout())
            .min()
    }

    fn deliver_due(&mut self) {
        for p in 0..self.pipes.len() {
            while let Some(&(t, w)) = self.pipes[p].front() {
                if t > self.now {
                    break;
                }
                self.pipes[p].pop_front();
                let ack = self.rx.arrive(w.csn, w.path);
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
                    self.ack_seq += 1;
                    self.acks
                        .push(Reverse((at, self.ack_seq, ack.to_bytes().unwrap())));
                }
            }
            while let Some(&(t, id)) = self.comps[p].front() {
                if t > self.now {
                    break;
                }
                self.comps[p].pop_front();
                let seq = id & ((1 << 40) - 1);
                self.completed[p] = self.completed[p].max(seq + 1);
                self.tx.on_send_completion(id, true);
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
                Event::MessageComplete { msg, .. } => *self.done.entry(msg).or_default() += 1,
                other => self.failed.push(other),
            }
        }
    }

    /// Runs until every message completed or failed and nothing is left to happen, or
    /// `max_steps` events. Returns whether it finished.
    pub fn run(&mut self, max_steps: u64) -> bool {
        let mut chains = Vec::new();
        for _ in 0..max_steps {
            self.tx.handle_timeout(self.now);
            self.tx.poll_transmit(self.now, &mut chains);
            self.post(&chains);
            self.drain_events();
            let resolved = self.done.len()
                + self
                    .failed
                    .iter()
                    .filter(|e| matches!(e, Event::MessageFailed { .. }))
                    .count();
            let quiet =
                self.comps.iter().all(|q| q.is_empty()) && self.pipes.iter().all(|q| q.is_empty());
            if resolved == self.sends.len() && quiet && self.tx.unacked() == 0 {
                return true;
            }
            match self.next_event() {
                Some(t) => self.now = self.now.max(t),
                None => return resolved == self.sends.len(),
            }
            self.deliver_due();
            self.drain_events();
        }
        false
    }
}
