//! QP number to connection, in O(1) without hashing: a two-level dense table (UCX's `qpn >> 12`
//! scheme). A QP number is 24 bits: the top 12 pick a page of 4096 entries, allocated when a
//! QP number in it is first used; the bottom 12 pick the entry.

const PAGE_BITS: u32 = 12;
const PAGE: usize = 1 << PAGE_BITS;
const EMPTY: u32 = u32::MAX;

/// QP number -> a `u32` value (a connection index).
#[derive(Debug)]
pub(crate) struct QpnTable {
    pages: Vec<Option<Box<[u32; PAGE]>>>,
}

impl Default for QpnTable {
    fn default() -> Self {
        QpnTable {
            pages: (0..PAGE).map(|_| None).collect(),
        }
    }
}

impl QpnTable {
    fn split(qpn: u32) -> (usize, usize) {
        let qpn = qpn & 0x00ff_ffff;
        ((qpn >> PAGE_BITS) as usize, qpn as usize & (PAGE - 1))
    }

    /// Maps `qpn` to `value` (not `u32::MAX`).
    pub(crate) fn insert(&mut self, qpn: u32, value: u32) {
        debug_assert_ne!(value, EMPTY);
        let (p, i) = Self::split(qpn);
        self.pages[p].get_or_insert_with(|| Box::new([EMPTY; PAGE]))[i] = value;
    }

    /// Forgets `qpn`.
    pub(crate) fn remove(&mut self, qpn: u32) {
        let (p, i) = Self::split(qpn);
        if let Some(page) = self.pages[p].as_mut() {
            page[i] = EMPTY;
        }
    }

    /// The value of `qpn`, if mapped.
    pub(crate) fn get(&self, qpn: u32) -> Option<u32> {
        let (p, i) = Self::split(qpn);
        self.pages[p]
            .as_ref()
            .map(|page| page[i])
            .filter(|&v| v != EMPTY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_and_forgets_across_pages() {
        let mut t = QpnTable::default();
        for (qpn, v) in [(0x11, 1), (0xfff, 2), (0x1000, 3), (0xff_ffff, 4)] {
            t.insert(qpn, v);
        }
        assert_eq!(t.get(0x11), Some(1));
        assert_eq!(t.get(0xfff), Some(2));
        assert_eq!(t.get(0x1000), Some(3));
        assert_eq!(t.get(0xff_ffff), Some(4));
        assert_eq!(t.get(0x12), None);
        assert_eq!(t.get(0x5000), None, "an unused page");
        t.remove(0x1000);
        assert_eq!(t.get(0x1000), None);
        // Bits above the 24 of a QP number are ignored.
        assert_eq!(t.get(0x0100_0011), Some(1));
    }
}
