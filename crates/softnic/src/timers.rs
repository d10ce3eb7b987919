//! The fabric's timer set: `(due, owner)` entries in order, the earliest kept at hand (every
//! round of progress, and every look for the next event, asks for it).

use std::collections::BTreeSet;

/// Timer entries `(due time, QP id or CM timer)`, ordered by due time.
#[derive(Debug, Default)]
pub(crate) struct Timers {
    set: BTreeSet<(u64, u32)>,
    /// `set`'s first entry.
    first: Option<(u64, u32)>,
}

impl Timers {
    /// The earliest entry.
    pub(crate) fn first(&self) -> Option<(u64, u32)> {
        self.first
    }

    /// Adds entry `e` (once: a second insert of it changes nothing).
    pub(crate) fn insert(&mut self, e: (u64, u32)) {
        self.set.insert(e);
        if self.first.is_none_or(|f| e < f) {
            self.first = Some(e);
        }
    }

    /// Removes entry `e`, if it is there.
    pub(crate) fn remove(&mut self, e: &(u64, u32)) {
        if self.set.remove(e) && self.first == Some(*e) {
            self.first = self.set.first().copied();
        }
    }

    /// Removes and returns the earliest entry.
    pub(crate) fn pop_first(&mut self) -> Option<(u64, u32)> {
        let e = self.set.pop_first();
        self.first = self.set.first().copied();
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_earliest_entry_is_always_the_set_s_first() {
        let mut t = Timers::default();
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut live = Vec::new();
        for _ in 0..2000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            match rng % 4 {
                0 | 1 => {
                    let e = (rng >> 40 & 63, (rng >> 20 & 7) as u32);
                    t.insert(e);
                    live.push(e);
                }
                2 if !live.is_empty() => {
                    let e = live.swap_remove((rng >> 8) as usize % live.len());
                    t.remove(&e);
                    live.retain(|&x| x != e);
                }
                _ => {
                    if let Some(e) = t.pop_first() {
                        live.retain(|&x| x != e);
                    }
                }
            }
            assert_eq!(t.first(), t.set.first().copied());
            assert_eq!(t.first(), live.iter().min().copied());
        }
    }
}
