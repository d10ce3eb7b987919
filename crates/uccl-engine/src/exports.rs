//! The regions an engine exported for one-sided writes, found in one ordered lookup when a
//! retransmitted chunk of a write must be checked before it is copied into place.

use std::collections::BTreeMap;

use crate::engine::BufferId;

/// The regions exported for one-sided writes, merged where they overlap or touch: start
/// address -> (end, buffer). Found with one ordered lookup.
#[derive(Default)]
pub(crate) struct Exports(BTreeMap<u64, (u64, BufferId)>);

impl Exports {
    /// Adds `addr..end` of `buf` (merging it with the exported ranges it meets; ranges of
    /// different buffers never meet: they are different memory).
    pub(crate) fn add(&mut self, buf: BufferId, mut addr: u64, mut end: u64) {
        // The ranges that meet `addr..end`, latest start first (they never overlap one
        // another); a neighbour of another buffer may touch it and stays apart.
        while let Some((a, e)) = self
            .0
            .range(..=end)
            .rev()
            .take_while(|(_, (e, _))| *e >= addr)
            .find(|(_, (_, b))| *b == buf)
            .map(|(&a, &(e, _))| (a, e))
        {
            self.0.remove(&a);
            addr = addr.min(a);
            end = end.max(e);
        }
        self.0.insert(addr, (end, buf));
    }

    /// The exported range holding `addr..end`: `(start, end, buffer)`.
    pub(crate) fn find(&self, addr: u64, end: u64) -> Option<(u64, u64, BufferId)> {
        let (&a, &(e, b)) = self.0.range(..=addr).next_back()?;
        (end <= e).then_some((a, e, b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_and_touching_ranges_merge_and_lookups_stay_inside() {
        let mut x = Exports::default();
        let b = BufferId(3);
        x.add(b, 100, 200);
        x.add(b, 300, 400);
        assert_eq!(x.find(150, 200), Some((100, 200, b)));
        assert_eq!(x.find(150, 201), None, "past the end");
        assert_eq!(x.find(250, 260), None, "in the gap");
        assert_eq!(x.find(50, 60), None, "before everything");
        x.add(b, 200, 300);
        assert_eq!(
            x.find(150, 350),
            Some((100, 400, b)),
            "merged across the touching range"
        );
        x.add(b, 90, 1000);
        assert_eq!(x.find(90, 1000), Some((90, 1000, b)));
        assert_eq!(x.0.len(), 1);
        x.add(BufferId(4), 5000, 6000);
        assert_eq!(x.find(5500, 5600), Some((5000, 6000, BufferId(4))));
        // Another buffer right after this one touches it but is not merged into it.
        x.add(BufferId(5), 6000, 7000);
        assert_eq!(x.find(5500, 5600), Some((5000, 6000, BufferId(4))));
        assert_eq!(x.find(6500, 6600), Some((6000, 7000, BufferId(5))));
        assert_eq!(x.find(5900, 6100), None, "no range spans two buffers");
    }
}
