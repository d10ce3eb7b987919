//! Receive tracking of one flow: which chunks arrived (a cumulative count and a SACK bitmap of
//! the 256 after it), duplicates dropped, messages completed in order as the cumulative point
//! passes their last chunk, and the ACK that says all this to the sender. Every operation is
//! O(1): the bitmap shifts by words, and the cumulative point moves once per chunk.

use uccl_tx::wire::{AckRepr, CSN_SPACE, Imm, SACK_BITS, csn_add, csn_diff};

/// Chunks a flow may have beyond its cumulative point (the SACK bitmap's span).
pub(crate) const WINDOW: usize = SACK_BITS;

#[derive(Debug, Clone, Copy, Default)]
struct Chunk {
    present: bool,
    last: bool,
    rid: u8,
    len: u32,
}

/// What became of an arriving chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// First time: recorded.
    New,
    /// Already received (a retransmission of something that arrived, or a duplicate).
    Duplicate,
    /// Beyond the window the sender may use: a broken or hostile sender; dropped.
    OutOfWindow,
}

/// A message whose every chunk has arrived, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Delivered {
    /// The request id the sender gave it.
    pub(crate) rid: u8,
    /// Its bytes.
    pub(crate) bytes: u64,
}

/// The receive side of one flow.
pub(crate) struct RxFlow {
    /// Chunks received in order, modulo 2^16; its low 11 bits are the next CSN expected.
    cum: u16,
    ring: Box<[Chunk; WINDOW]>,
    /// Bit `i`: CSN `cum + 1 + i` arrived.
    sack: [u64; WINDOW / 64],
    /// Bytes of the message in progress (chunks passed by the cumulative point).
    bytes: u64,
    /// Chunks received since the last ACK was built, and their bytes.
    since_ack: u32,
    since_ack_bytes: u64,
    /// The chunk that triggers the next ACK: its CSN, path, whether it was a
    /// retransmission, and when it arrived (ns).
    echo: u16,
    path: u16,
    retx: bool,
    echo_at: u64,
}

impl std::fmt::Debug for RxFlow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxFlow")
            .field("cum", &self.cum)
            .field("since_ack", &self.since_ack)
            .finish_non_exhaustive()
    }
}

impl Default for RxFlow {
    fn default() -> Self {
        RxFlow {
            cum: 0,
            ring: Box::new([Chunk::default(); WINDOW]),
            sack: [0; WINDOW / 64],
            bytes: 0,
            since_ack: 0,
            since_ack_bytes: 0,
            echo: 0,
            path: 0,
            retx: false,
            echo_at: 0,
        }
    }
}

impl RxFlow {
    /// The next CSN expected.
    fn next(&self) -> u16 {
        self.cum % CSN_SPACE as u16
    }

    /// The next CSN expected, and how many chunks beyond it arrived (what an ACK reports).
    pub(crate) fn ack_point(&self) -> (u16, u32) {
        (self.next(), self.sack.iter().map(|w| w.count_ones()).sum())
    }

    /// Chunks received since the last ACK, and their bytes.
    pub(crate) fn since_ack(&self) -> (u32, u64) {
        (self.since_ack, self.since_ack_bytes)
    }

    /// Records the chunk of immediate `imm` (`len` bytes) that came on the flow's path `path`
    /// (as a retransmission if `retx`) at `now`, then hands every message the cumulative
    /// point passed to `done`, in order.
    #[inline(always)]
    pub(crate) fn on_chunk(
        &mut self,
        imm: Imm,
        len: u32,
        (path, retx, now): (u16, bool, u64),
        mut done: impl FnMut(Delivered),
    ) -> Arrival {
        let Imm { csn, rid, last, .. } = imm;
        let ahead = csn_diff(csn, self.next());
        if ahead < 0 {
            self.note(csn, len, (path, retx, now));
            return Arrival::Duplicate;
        }
        let ahead = ahead as usize;
        if ahead >= WINDOW {
            return Arrival::OutOfWindow;
        }
        let slot = &mut self.ring[csn as usize % WINDOW];
        if ahead > 0 && self.sack[(ahead - 1) / 64] & (1 << ((ahead - 1) % 64)) != 0 {
            self.note(csn, len, (path, retx, now));
            return Arrival::Duplicate;
        }
        *slot = Chunk {
            present: true,
            last,
            rid,
            len,
        };
        self.note(csn, len, (path, retx, now));
        if ahead == 0 {
            self.advance(&mut done);
        } else {
            self.sack[(ahead - 1) / 64] |= 1 << ((ahead - 1) % 64);
        }
        Arrival::New
    }

    fn note(&mut self, csn: u16, len: u32, (path, retx, now): (u16, bool, u64)) {
        self.echo_at = now;
        self.since_ack += 1;
        self.since_ack_bytes += u64::from(len);
        self.echo = csn;
        self.path = path;
        self.retx = retx;
    }

    /// Moves the cumulative point over every chunk present from it on.
    #[inline(always)]
    fn advance(&mut self, done: &mut impl FnMut(Delivered)) {
        loop {
            let i = self.next() as usize % WINDOW;
            let c = self.ring[i];
            if !c.present {
                return;
            }
            self.ring[i].present = false;
            self.cum = self.cum.wrapping_add(1);
            self.shift_sack();
            self.bytes += u64::from(c.len);
            if c.last {
                done(Delivered {
                    rid: c.rid,
                    bytes: std::mem::take(&mut self.bytes),
                });
            }
        }
    }

    /// The cumulative point moved by one: the bitmap follows.
    fn shift_sack(&mut self) {
        let n = self.sack.len();
        for w in 0..n {
            let carry = if w + 1 < n { self.sack[w + 1] << 63 } else { 0 };
            self.sack[w] = (self.sack[w] >> 1) | carry;
        }
    }

    /// The ACK of everything received so far, for the sender's flow `fid`, granting `credit`
    /// WRs in flight, built at `now` (it says how long its echo chunk waited for it, so the
    /// sender's RTT sample leaves the wait out); resets the count of chunks since the last
    /// ACK.
    pub(crate) fn ack(&mut self, fid: u16, credit: u16, now: u64) -> AckRepr {
        self.since_ack = 0;
        self.since_ack_bytes = 0;
        let mut sack = [0u8; SACK_BITS / 8];
        for (i, w) in self.sack.iter().enumerate() {
            sack[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        AckRepr {
            path: self.path,
            fid,
            cum: self.cum,
            echo: self.echo,
            retx: self.retx,
            tag: 0,
            credit,
            queue_ns: now.saturating_sub(self.echo_at).min(u64::from(u32::MAX)) as u32,
            sack,
        }
    }

    /// Whether the chunk `csn` is still expected (not yet received and inside the window).
    pub(crate) fn expects(&self, csn: u16) -> bool {
        let ahead = csn_diff(csn, self.next());
        if ahead < 0 || ahead as usize >= WINDOW {
            return false;
        }
        let ahead = ahead as usize;
        ahead == 0 || self.sack[(ahead - 1) / 64] & (1 << ((ahead - 1) % 64)) == 0
    }
}

/// `csn + n` in CSN space (re-exported for the engine's tests).
#[allow(dead_code)]
pub(crate) fn csn_plus(csn: u16, n: u32) -> u16 {
    csn_add(csn, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(rx: &mut RxFlow, csn: u16, rid: u8, last: bool) -> (Arrival, Vec<Delivered>) {
        let mut out = Vec::new();
        let a = rx.on_chunk(
            Imm {
                fid: 0,
                rid,
                csn,
                last,
            },
            100,
            (0, false, u64::from(csn) * 10),
            |d| out.push(d),
        );
        (a, out)
    }

    #[test]
    fn messages_complete_in_order_as_gaps_fill() {
        let mut rx = RxFlow::default();
        // Message 0 = chunks 0..3, message 1 = chunk 3; chunk 1 arrives last.
        assert_eq!(run(&mut rx, 0, 0, false), (Arrival::New, vec![]));
        assert_eq!(run(&mut rx, 2, 0, true), (Arrival::New, vec![]));
        assert_eq!(run(&mut rx, 3, 1, true), (Arrival::New, vec![]));
        // Chunk 3 arrived at 30 ns (the helper's clock): built at 100, the ACK says it waited 70.
        let ack = rx.ack(9, 4, 100);
        assert_eq!((ack.cum, ack.echo, ack.fid, ack.credit), (1, 3, 9, 4));
        assert_eq!(ack.queue_ns, 70);
        assert!(
            ack.sacked(0) && ack.sacked(1) && !ack.sacked(2),
            "2 and 3 arrived"
        );
        let (a, done) = run(&mut rx, 1, 0, false);
        assert_eq!(a, Arrival::New);
        assert_eq!(
            done,
            [
                Delivered { rid: 0, bytes: 300 },
                Delivered { rid: 1, bytes: 100 }
            ]
        );
        let ack = rx.ack(9, 4, 0);
        assert_eq!(ack.cum, 4);
        assert!((0..SACK_BITS).all(|i| !ack.sacked(i)));
    }

    #[test]
    fn duplicates_and_chunks_beyond_the_window_are_refused() {
        let mut rx = RxFlow::default();
        assert_eq!(run(&mut rx, 0, 0, true).0, Arrival::New);
        assert_eq!(run(&mut rx, 0, 0, true).0, Arrival::Duplicate);
        assert_eq!(run(&mut rx, 5, 1, false).0, Arrival::New);
        assert_eq!(run(&mut rx, 5, 1, false).0, Arrival::Duplicate);
        assert!(!rx.expects(5) && rx.expects(1) && rx.expects(256));
        assert_eq!(
            run(&mut rx, 1 + WINDOW as u16, 1, false).0,
            Arrival::OutOfWindow
        );
        assert!(!rx.expects(1 + WINDOW as u16));
        // Far behind (a stale retransmission): a duplicate, and the ACK says where we are.
        assert_eq!(run(&mut rx, 2040, 0, false).0, Arrival::Duplicate);
    }

    #[test]
    fn the_cumulative_count_wraps_the_csn_space_and_keeps_counting() {
        let mut rx = RxFlow::default();
        let mut delivered = 0;
        for i in 0..(CSN_SPACE * 3 + 17) {
            let csn = (i % CSN_SPACE) as u16;
            let (a, done) = run(&mut rx, csn, (i % 200) as u8, true);
            assert_eq!(a, Arrival::New);
            delivered += done.len();
        }
        assert_eq!(delivered, CSN_SPACE as usize * 3 + 17);
        assert_eq!(rx.ack(0, 0, 0).cum, (CSN_SPACE * 3 + 17) as u16);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Chunks arriving in any order within the window, some twice, some too early (beyond
        /// the window, refused) before they come again, in runs in order and out of it: every
        /// message is delivered once, in order, with its bytes, and the ACK's point and bitmap
        /// are what arrived.
        #[test]
        fn any_arrival_order_delivers_every_message_once_in_order(
            seed in proptest::prelude::any::<u64>(),
            spread in 1usize..WINDOW,
        ) {
            // 2 300 chunks (the CSN space wraps), message `m` of `m % 3 + 1` chunks: chunk `i`
            // arrives `i` plus up to `spread` steps in, every seventh twice, and every eleventh
            // (from the 300th) also once too early, at step `i - WINDOW - 1 - r` (r < 32), when
            // fewer than `i - WINDOW` chunks have arrived.
            let mut rng = seed;
            let mut next = || {
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (rng >> 33) as usize
            };
            let mut msgs = Vec::new();
            let mut chunks = Vec::new();
            while chunks.len() < 2300 {
                let m = msgs.len();
                let k = m % 3 + 1;
                msgs.push(Delivered { rid: m as u8, bytes: 100 * k as u64 });
                for j in 0..k {
                    chunks.push((m as u8, j + 1 == k));
                }
            }
            let mut order: Vec<(usize, usize)> = (0..chunks.len())
                .flat_map(|i| {
                    let at = i + next() % spread;
                    let again = (i % 7 == 0).then(|| (at + next() % spread, i));
                    let early = (i % 11 == 5 && i >= 300).then(|| (i - WINDOW - 1 - next() % 32, i));
                    std::iter::once((at, i)).chain(again).chain(early)
                })
                .collect();
            order.sort();
            let mut rx = RxFlow::default();
            let mut got = Vec::new();
            let mut arrived = vec![false; chunks.len()];
            let csn_of = |i: usize| (i % CSN_SPACE as usize) as u16;
            // The model's cumulative point: every chunk before it arrived.
            let mut cum = 0;
            let mut too_early = 0;
            for (n, (_, i)) in order.into_iter().enumerate() {
                let csn = csn_of(i);
                let (rid, last) = chunks[i];
                let a = rx.on_chunk(Imm { fid: 0, rid, csn, last }, 100, (0, false, 0), |d| got.push(d));
                let want = if arrived[i] {
                    Arrival::Duplicate
                } else if i >= cum + WINDOW {
                    Arrival::OutOfWindow
                } else {
                    Arrival::New
                };
                proptest::prop_assert_eq!(a, want, "chunk {}", i);
                arrived[i] |= want == Arrival::New;
                too_early += usize::from(want == Arrival::OutOfWindow);
                while cum < arrived.len() && arrived[cum] {
                    cum += 1;
                }
                let ack = rx.ack(0, 0, 0);
                proptest::prop_assert_eq!(usize::from(ack.cum), cum);
                if n % 8 == 0 {
                    for b in 0..WINDOW.min(arrived.len().saturating_sub(cum + 1)) {
                        proptest::prop_assert_eq!(ack.sacked(b), arrived[cum + 1 + b], "bit {}", b);
                    }
                }
            }
            proptest::prop_assert_eq!(too_early, (300..chunks.len()).filter(|i| i % 11 == 5).count());
            proptest::prop_assert_eq!(cum, chunks.len());
            proptest::prop_assert_eq!(got, msgs);
        }
    }
}
