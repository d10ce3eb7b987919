//! The model's configuration, its random numbers and its receiver.

use uccl_tx::wire::{ANSWER_PATH, AckRepr, SACK_BITS, csn_diff};

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

/// The network and the receiver.
#[derive(Debug, Clone)]
pub struct NetConfig {
    pub seed: u64,
    /// (send-queue depth, one-way latency ns) per path.
    pub paths: Vec<(u32, u64)>,
    /// Probability a WR is lost.
    pub loss: f64,
    /// Probability a WR arrives twice.
    pub dup: f64,
    /// Most extra queueing delay of a WR (ns); a QP stays in order.
    pub queue_max: u64,
    /// Most delay of a send completion after the WR left (ns).
    pub comp_delay_max: u64,
    pub ack_loss: f64,
    pub ack_dup: f64,
    pub ack_delay_max: u64,
    pub hdr_slots: usize,
    /// A path on which everything is lost.
    pub black_hole: Option<usize>,
    /// A path whose QP goes to ERROR at this time (ns).
    pub fail_path: Option<(usize, u64)>,
    /// Probability a post fails half-way.
    pub post_fail: f64,
    /// The receive window the receiver grants (also the initial one).
    pub credit: u16,
    /// Probability an ACK grants 0 instead (a window update follows after a while).
    pub credit_zero: f64,
    /// Flows (ids `FID ..`), sharing the paths; messages go to them in turn.
    pub flows: u16,
    /// ACK requests take the shortest path's latency instead of queueing behind what was
    /// sent before them (another route than the data's): an answer may then show missing
    /// what is still on its way.
    pub asks_overtake: bool,
}

impl NetConfig {
    /// A clean network over `paths`, granting a full window.
    pub fn clean(seed: u64, paths: Vec<(u32, u64)>) -> NetConfig {
        NetConfig {
            seed,
            paths,
            loss: 0.0,
            dup: 0.0,
            queue_max: 0,
            comp_delay_max: 0,
            ack_loss: 0.0,
            ack_dup: 0.0,
            ack_delay_max: 100,
            hdr_slots: 64,
            black_hole: None,
            fail_path: None,
            post_fail: 0.0,
            credit: 256,
            credit_zero: 0.0,
            flows: 1,
            asks_overtake: false,
        }
    }
}

/// A WR on the wire.
#[derive(Debug, Clone, Copy)]
pub(super) struct OnWire {
    pub(super) fid: u16,
    pub(super) csn: u16,
    pub(super) lane: u16,
    pub(super) retx: bool,
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
    pub(super) fn new() -> Receiver {
        Receiver {
            cum: 0,
            ahead: [false; SACK_BITS],
            delivered: 0,
            duplicates: 0,
        }
    }

    /// The answer to ACK request `seq`: what arrived so far, triggered by no chunk.
    pub(super) fn answer(&self, fid: u16, seq: u16, credit: u16) -> AckRepr {
        let mut a = AckRepr {
            path: ANSWER_PATH,
            fid,
            cum: self.cum,
            echo: seq,
            credit,
            ..AckRepr::default()
        };
        for (i, &b) in self.ahead.iter().enumerate() {
            if b {
                a.set_sacked(i);
            }
        }
        a
    }

    /// A chunk arrived; returns the ACK to send.
    pub(super) fn arrive(&mut self, w: OnWire, credit: u16) -> AckRepr {
        let d = csn_diff(w.csn, self.cum & 2047);
        assert!(
            d <= SACK_BITS as i32,
            "chunk {} is {d} past the cumulative ACK: the window outran the bitmap",
            w.csn
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
            path: w.lane,
            fid: w.fid,
            cum: self.cum,
            echo: w.csn,
            retx: w.retx,
            credit,
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
