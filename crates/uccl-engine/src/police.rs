//! Receive credits enforced: a connection that takes more of the shared receive queue than
//! its grant allows is throttled, then failed, so that it can never starve the others.
//!
//! Every chunk a peer sends (a WRITE_WITH_IMM, or on UC a retransmission SEND) takes a buffer
//! of the engine's one SRQ, whatever it carries. Two bounds, checked as the engine reads the
//! completions, so however fast a peer sends, what it took is judged by what it sent:
//!
//! - **Its grant.** An honest sender has at most its credit in flight, and a chunk stops being
//!   in flight for it only when an ACK says it arrived. So a new chunk's CSN lies less than
//!   the credit beyond the chunks the last ACK this end sent acknowledged (its cumulative
//!   point plus the chunks it reported beyond): a chunk `SLACK` or more past that point was
//!   sent past the grant. The grant is the largest this end ever gave the connection: a
//!   sender keeps its grant until an ACK that acknowledges something new lowers it (an ACK
//!   that does not might be an old one, reordered), so this end cannot know when the sender
//!   let go of a larger one.
//! - **Waste.** Duplicates, chunks out of the window and malformed ones deliver nothing. An
//!   honest sender sends them only by retransmitting what arrived after all, at most its
//!   window per timeout (and per loss detection), and timeouts are at least `rto_min_us`
//!   apart; the network adds duplicates of what it carries. So a connection may waste
//!   `WASTE_FACTOR` times its grant, plus `SLACK`, per `rto_min_us`, and one more buffer per
//!   new chunk it sent (never holding more than that bound in hand); past that it is flooding.
//!
//! The first offence throttles the connection: its grant goes to 0 (its share goes to the
//! others) and an ACK says so at once. An honest sender never gets there; one that goes on
//! past its bound by more than the grant it had, plus `SLACK`, is failed: "exceeded its
//! receive credit by N". Its QPs then go to ERROR, which drops its packets before they take a
//! buffer.

use uccl_tx::wire::csn_diff;

use crate::engine::Engine;

/// A connection may waste this many grants' worth of buffers per minimum RTO.
const WASTE_FACTOR: u32 = 3;
/// Chunks tolerated beyond either bound (timer and path skew; a grant of 0 or 1 in token
/// rotation).
pub(crate) const SLACK: u32 = 16;

/// What a connection took of the shared receive queue, against what it may.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Police {
    /// The largest grant it was given.
    peak: u16,
    /// The next CSN expected when the last ACK left, and the chunks beyond it it reported.
    acked: (u16, u32),
    /// Buffers it may still waste until `refill_at` (ns), when it gets a full allowance again.
    waste_left: u32,
    refill_at: u64,
    /// Offences since it was throttled, and how many it may have before it fails (`None`: not
    /// throttled).
    over: Option<(u32, u32)>,
}

/// What a connection did with a buffer it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Taken {
    /// A chunk that had not arrived, of this CSN.
    New(u16),
    /// A duplicate, a chunk out of the window, or one that was malformed or refused.
    Waste,
}

/// What becomes of the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Fine,
    /// Past a bound for the first time: throttle it.
    Throttle,
    /// Past its bounds again, by this many buffers, after being throttled: fail it.
    Fail(u32),
}

impl Police {
    /// A connection granted `credit` in the handshake, nothing received yet.
    pub(crate) fn new(credit: u16) -> Police {
        Police {
            peak: credit,
            acked: (0, 0),
            waste_left: 0,
            refill_at: 0,
            over: None,
        }
    }

    fn grant(&self) -> u32 {
        u32::from(self.peak)
    }

    /// Buffers it may waste per minimum RTO.
    pub(crate) fn waste_bound(&self) -> u32 {
        WASTE_FACTOR * self.grant() + SLACK
    }

    /// An ACK granting `grant` went to the peer, acknowledging every chunk before `next` and
    /// `beyond` chunks after it.
    pub(crate) fn acked(&mut self, grant: u16, next: u16, beyond: u32) {
        self.peak = self.peak.max(grant);
        self.acked = (next, beyond);
    }

    /// Judges one buffer taken at `now`, with a minimum RTO of `rto_min` ns.
    #[inline(always)]
    pub(crate) fn took(&mut self, t: Taken, now: u64, rto_min: u64) -> Verdict {
        if now >= self.refill_at {
            self.waste_left = self.waste_bound();
            self.refill_at = now.saturating_add(rto_min);
        }
        let fine = match t {
            Taken::New(csn) => {
                // What the network duplicates is in proportion to what it carries.
                self.waste_left = (self.waste_left + 1).min(self.waste_bound());
                let ahead = csn_diff(csn, self.acked.0);
                ahead < 0 || (ahead as u32) < self.grant() + self.acked.1 + SLACK
            }
            Taken::Waste => {
                let left = self.waste_left > 0;
                self.waste_left = self.waste_left.saturating_sub(1);
                left
            }
        };
        match (fine, &mut self.over) {
            (true, _) => Verdict::Fine,
            (false, None) => {
                self.over = Some((0, self.grant() + SLACK));
                Verdict::Throttle
            }
            (false, Some((n, grace))) => {
                *n += 1;
                if *n > *grace {
                    Verdict::Fail(*n)
                } else {
                    Verdict::Fine
                }
            }
        }
    }
}

impl Engine {
    /// Connection `ci` took a buffer of the SRQ, for `t`: throttled or failed if it took more
    /// than it may.
    #[inline(always)]
    pub(crate) fn took_buffer(&mut self, ci: u16, t: Taken, now: u64) {
        let rto_min = self.cfg.tx.rto_min_us * 1000;
        let Some(c) = self.conns[usize::from(ci)].as_mut().filter(|c| c.is_open()) else {
            return;
        };
        let verdict = c.police.took(t, now, rto_min);
        self.judged(ci, verdict, now);
    }

    /// Acts on the verdict of open connection `ci`'s police on a buffer it took.
    #[inline(always)]
    pub(crate) fn judged(&mut self, ci: u16, verdict: Verdict, now: u64) {
        if verdict != Verdict::Fine {
            self.punish(ci, verdict, now);
        }
    }

    /// [`judged`](Self::judged) for a verdict that is not [`Verdict::Fine`].
    #[cold]
    #[inline(never)]
    fn punish(&mut self, ci: u16, verdict: Verdict, now: u64) {
        let Some(c) = self.conns[usize::from(ci)].as_ref() else {
            return;
        };
        match verdict {
            Verdict::Fine => {} // (`judged` sends no such verdict here)
            Verdict::Throttle => {
                self.stats.throttled += 1;
                tracing::warn!(
                    conn = ci,
                    "a connection sent past its receive credit: throttled"
                );
                self.credits.throttle(ci, now);
                self.mark_ack(ci);
            }
            Verdict::Fail(by) => {
                let why = format!(
                    "exceeded its receive credit by {by} (buffers of the shared receive queue \
                     taken past its grant, or wasted on duplicates, chunks out of the window or \
                     malformed ones past {} per {} us, after it was throttled)",
                    c.police.waste_bound(),
                    self.cfg.tx.rto_min_us
                );
                self.fail_conn(ci, why, true);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RTO: u64 = 200_000;

    /// An honest sender (never more than its grant beyond what the last ACK acknowledged, a
    /// window of retransmissions per RTO) is never throttled.
    #[test]
    fn an_honest_sender_stays_within_its_bounds() {
        let mut p = Police::new(10);
        let mut next = 0u16;
        for round in 0..1000u64 {
            // Its window of new chunks, some of them beyond a gap the last ACK reported.
            for k in 0..10 + 3 {
                let csn = (next + k) % 2048;
                assert_eq!(p.took(Taken::New(csn), round * RTO, RTO), Verdict::Fine);
            }
            // A timeout's worth of retransmissions that had arrived after all.
            for _ in 0..10 {
                assert_eq!(p.took(Taken::Waste, round * RTO, RTO), Verdict::Fine);
            }
            next = (next + 10) % 2048;
            p.acked(10, next, 3);
        }
    }

    /// A chunk sent past the grant throttles the connection; going on past the grace fails it.
    #[test]
    fn chunks_past_the_grant_throttle_then_fail() {
        let mut p = Police::new(10);
        p.acked(10, 100, 0);
        let limit = 100 + 10 + SLACK as u16;
        for csn in 100..limit {
            assert_eq!(p.took(Taken::New(csn), 0, RTO), Verdict::Fine);
        }
        assert_eq!(p.took(Taken::New(limit), 0, RTO), Verdict::Throttle);
        // Throttled: the next ACKs grant 0 (the largest it had still bounds it); it has its
        // old grant and SLACK more of grace.
        p.acked(0, limit + 1, 0);
        let far = limit + 1 + 10 + SLACK as u16;
        for k in 0..10 + SLACK {
            assert_eq!(p.took(Taken::New(far + k as u16), 0, RTO), Verdict::Fine);
        }
        assert_eq!(p.took(Taken::New(far + 100), 0, RTO), Verdict::Fail(27));
    }

    /// Waste past its bound per RTO throttles; the allowance comes back each RTO.
    #[test]
    fn waste_is_bounded_per_rto() {
        let mut p = Police::new(4);
        let bound = p.waste_bound();
        assert_eq!(bound, 3 * 4 + SLACK);
        for t in 0..5 {
            for _ in 0..bound {
                assert_eq!(p.took(Taken::Waste, t * RTO, RTO), Verdict::Fine);
            }
        }
        assert_eq!(p.took(Taken::Waste, 4 * RTO + 1, RTO), Verdict::Throttle);
        for _ in 0..4 + SLACK {
            assert_eq!(p.took(Taken::Waste, 4 * RTO + 2, RTO), Verdict::Fine);
        }
        assert_eq!(
            p.took(Taken::Waste, 4 * RTO + 3, RTO),
            Verdict::Fail(4 + SLACK + 1)
        );
    }
}
