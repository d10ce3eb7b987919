//! A hashed timing wheel for pacing (see `cc`): flows whose window is below one chunk wait here
//! for their next send time.
//!
//! 256 slots of 1024 ns (a quarter of a millisecond in all), a bitmap of the slots that hold
//! anything, and a cursor at the first tick not yet passed; a deadline further ahead than the
//! wheel reaches waits in an overflow list and moves into the wheel once it is in reach.
//! Arming is O(1); the next deadline is a scan of four bitmap words and of the entries of one
//! slot; taking what is due touches only the slots that hold entries. The slots' room is
//! reused: steady pacing allocates nothing.

/// log2 of a tick in ns.
const TICK_SHIFT: u32 = 10;
/// Slots (a power of two, a multiple of 64).
const SLOTS: usize = 256;

/// Deadlines of paced flows: (time in ns, flow).
#[derive(Debug)]
pub(crate) struct Wheel {
    slots: Vec<Vec<(u64, u16)>>,
    /// Bit `i` set: slot `i` holds entries.
    full: [u64; SLOTS / 64],
    /// The first tick not yet passed: every entry in a slot has a tick in
    /// `cursor..cursor + SLOTS`.
    cursor: u64,
    /// Entries beyond the wheel's reach, and the earliest of them.
    overflow: Vec<(u64, u16)>,
    overflow_min: u64,
    /// Entries in all: an empty wheel answers at once (the engine asks every round).
    len: usize,
}

impl Default for Wheel {
    fn default() -> Self {
        Wheel {
            slots: (0..SLOTS).map(|_| Vec::new()).collect(),
            full: [0; SLOTS / 64],
            cursor: 0,
            overflow: Vec::new(),
            overflow_min: u64::MAX,
            len: 0,
        }
    }
}

impl Wheel {
    /// Flow `fid` may send again at `at` (ns).
    pub(crate) fn arm(&mut self, at: u64, fid: u16) {
        self.len += 1;
        self.place(at, fid);
    }

    /// Puts an entry in its slot, or in the overflow list.
    fn place(&mut self, at: u64, fid: u16) {
        let tick = (at >> TICK_SHIFT).max(self.cursor);
        if tick >= self.cursor + SLOTS as u64 {
            self.overflow.push((at, fid));
            self.overflow_min = self.overflow_min.min(at);
            return;
        }
        let slot = tick as usize % SLOTS;
        self.slots[slot].push((at, fid));
        self.full[slot / 64] |= 1 << (slot % 64);
    }

    /// The first slot holding entries from the cursor on, and its tick.
    fn first(&self) -> Option<(usize, u64)> {
        let start = self.cursor as usize % SLOTS;
        (0..=SLOTS / 64).find_map(|k| {
            // The words from the cursor's on, wrapping: the cursor's word first without the
            // slots before the cursor, and last with only those.
            let w = (start / 64 + k) % (SLOTS / 64);
            let mut bits = self.full[w];
            if k == 0 {
                bits &= u64::MAX << (start % 64);
            } else if k == SLOTS / 64 {
                bits &= !(u64::MAX << (start % 64));
            }
            (bits != 0).then(|| {
                let slot = w * 64 + bits.trailing_zeros() as usize;
                (slot, self.cursor + ((slot + SLOTS - start) % SLOTS) as u64)
            })
        })
    }

    /// The earliest deadline.
    #[inline]
    pub(crate) fn next(&self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        let wheel = self
            .first()
            .and_then(|(slot, _)| self.slots[slot].iter().map(|&(at, _)| at).min());
        let next = wheel.unwrap_or(u64::MAX).min(self.overflow_min);
        (next != u64::MAX).then_some(next)
    }

    /// Hands every entry due at `now` to `due(at, fid)`, in the order of their ticks.
    pub(crate) fn pop_due(&mut self, now: u64, mut due: impl FnMut(u64, u16)) {
        if self.len == 0 {
            return;
        }
        let end = now >> TICK_SHIFT;
        while let Some((slot, tick)) = self.first().filter(|&(_, t)| t <= end) {
            self.cursor = tick;
            let mut entries = std::mem::take(&mut self.slots[slot]);
            self.full[slot / 64] &= !(1 << (slot % 64));
            for &(at, fid) in &entries {
                if at <= now {
                    self.len -= 1;
                    due(at, fid);
                } else {
                    // Later in this very tick: back in its slot.
                    self.place(at, fid);
                }
            }
            entries.clear();
            let kept = std::mem::replace(&mut self.slots[slot], entries);
            self.slots[slot].extend_from_slice(&kept);
            if tick == end {
                break;
            }
        }
        self.cursor = self.cursor.max(end);
        // Deadlines that came within reach move into the wheel (and are taken if due).
        if self.overflow_min >> TICK_SHIFT < self.cursor + SLOTS as u64 {
            let mut far = std::mem::take(&mut self.overflow);
            self.overflow_min = u64::MAX;
            let mut again = false;
            for &(at, fid) in &far {
                again |= at <= now;
                self.place(at, fid);
            }
            // Those still beyond reach went back to `overflow`; keep its room otherwise.
            if self.overflow.is_empty() {
                far.clear();
                self.overflow = far;
            }
            if again {
                self.pop_due(now, due);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(w: &mut Wheel, now: u64) -> Vec<(u64, u16)> {
        let mut out = Vec::new();
        w.pop_due(now, |at, fid| out.push((at, fid)));
        out
    }

    #[test]
    fn entries_come_out_when_due_never_late() {
        let mut w = Wheel::default();
        assert_eq!(w.next(), None);
        w.arm(5_000, 1);
        w.arm(3_000, 2);
        w.arm(3_100, 3);
        assert_eq!(w.next(), Some(3_000));
        assert!(drain(&mut w, 2_999).is_empty());
        assert_eq!(drain(&mut w, 3_050), [(3_000, 2)]);
        assert_eq!(drain(&mut w, 10_000), [(3_100, 3), (5_000, 1)]);
        assert_eq!(w.next(), None);
    }

    #[test]
    fn a_deadline_beyond_the_wheel_waits_in_the_overflow_until_due() {
        let mut w = Wheel::default();
        let far = 10_000_000; // 10 ms: far past the 262 us the wheel reaches
        w.arm(far, 7);
        w.arm(1_000, 8);
        assert_eq!(w.next(), Some(1_000));
        assert_eq!(drain(&mut w, 1_000), [(1_000, 8)]);
        assert_eq!(w.next(), Some(far));
        assert!(drain(&mut w, far - 1).is_empty());
        // Now within reach: in the wheel, and still exact.
        assert_eq!(w.next(), Some(far));
        w.arm(far - 500, 9);
        assert_eq!(w.next(), Some(far - 500));
        // One tick: in the order they were armed.
        assert_eq!(drain(&mut w, far + 1), [(far, 7), (far - 500, 9)]);
        assert_eq!(w.next(), None);
        // A deadline far in the past is due at once.
        w.arm(5, 1);
        assert_eq!(drain(&mut w, far + 2), [(5, 1)]);
    }

    #[test]
    fn deadlines_still_beyond_reach_stay_in_the_overflow() {
        let mut w = Wheel::default();
        // Both beyond reach; once the first is within it, the second still is not.
        w.arm(1_000_000, 1);
        w.arm(9_000_000, 2);
        assert!(drain(&mut w, 900_000).is_empty());
        assert_eq!(w.next(), Some(1_000_000));
        assert_eq!(drain(&mut w, 1_000_000), [(1_000_000, 1)]);
        assert_eq!(w.next(), Some(9_000_000), "not lost");
        assert_eq!(drain(&mut w, 9_000_000), [(9_000_000, 2)]);
        assert_eq!(w.next(), None);
    }

    #[test]
    fn it_wraps_around_and_reuses_its_slots() {
        let mut w = Wheel::default();
        let mut now = 0u64;
        for round in 0..2_000u64 {
            let at = now + 700 + (round % 5) * 900;
            w.arm(at, (round % 3) as u16);
            let t = w.next().expect("armed");
            assert!(t <= at);
            now = at;
            assert_eq!(drain(&mut w, now), [(at, (round % 3) as u16)]);
        }
        assert_eq!(w.next(), None);
    }

    proptest::proptest! {
        /// Against a sorted list: every entry comes out once, at the first pop at or after
        /// its deadline, never before; `next` is never later than the earliest deadline.
        #[test]
        fn it_agrees_with_a_sorted_list(
            steps in proptest::collection::vec((0u64..2_000_000, 0u64..600_000, proptest::bool::ANY), 1..200)
        ) {
            let mut w = Wheel::default();
            let mut all: Vec<(u64, u16)> = Vec::new();
            let mut now = 0u64;
            for (k, &(ahead, step, arm)) in steps.iter().enumerate() {
                if arm {
                    let at = now + ahead;
                    w.arm(at, k as u16);
                    all.push((at, k as u16));
                }
                if let Some(earliest) = all.iter().map(|e| e.0).min() {
                    proptest::prop_assert!(w.next().is_some_and(|t| t <= earliest));
                }
                now += step;
                let mut got = drain(&mut w, now);
                let mut want: Vec<_> = all.iter().copied().filter(|e| e.0 <= now).collect();
                all.retain(|e| e.0 > now);
                got.sort_unstable();
                want.sort_unstable();
                proptest::prop_assert_eq!(got, want);
            }
        }
    }
}
