//! What slot posts may name: registered regions and address handles pinned to a table that any
//! number of queues share, and released only once no posted work request names them.
//!
//! A slot post checks every SGE against the regions of its queue's table (and a UD WR's address
//! handle against its handles), then counts each WR against what it named. A WR stops counting
//! once the NIC is done with it: when the completion of a signaled WR at or after it on its
//! send queue is polled (send completions come in queue order), or when its queue is reset or
//! destroyed. [`Pins::unpin`] takes an object out of the table at once (no new WR can name it),
//! but the table keeps it alive until its count is zero; only then is it dropped, and with it
//! possibly the last handle of its memory. So unpinning is always safe, whatever is in flight.
//!
//! Pinning and unpinning are O(log n) in what the table holds; checking an SGE is O(log n),
//! O(1) when it lies in the region the previous SGE of the chain lay in.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use ibverbs_sys::{ibv_ah, ibv_sge};
use smallvec::SmallVec;

use crate::context::Ah;
use crate::error::{Error, Result};
use crate::memory::DmaBuf;

/// Pinned objects and how many WRs (or holds) each gained or lost: `(pin, n)` pairs, few.
pub(crate) type Deltas = SmallVec<[(u32, u32); 2]>;

/// Adds `n` uses of `pin` to `d`.
pub(crate) fn add_delta(d: &mut Deltas, pin: u32, n: u32) {
    match d.iter_mut().find(|e| e.0 == pin) {
        Some(e) => e.1 += n,
        None => d.push((pin, n)),
    }
}

/// What a pin keeps alive.
enum Held {
    Region(#[allow(dead_code)] Arc<DmaBuf>),
    /// Its protection domain is checked against the posting QP's.
    Ah(Arc<Ah>),
}

/// One pinned object, and the facts the checker compares SGEs with.
struct Pin {
    /// `None` once released (the slot is free).
    held: Option<Held>,
    start: u64,
    end: u64,
    lkey: u32,
    /// Posted WRs (and receive holds) that name it and are not retired yet.
    uses: AtomicU32,
    /// Taken out of the lookup tables: released once `uses` is zero.
    unpinned: bool,
}

#[derive(Default)]
struct Table {
    /// Region start -> pin (regions are distinct allocations: they never overlap).
    regions: BTreeMap<u64, u32>,
    /// Address handle address -> pin.
    ahs: HashMap<usize, u32>,
    slab: Vec<Pin>,
    free: Vec<u32>,
    /// Unpinned objects still named by posted WRs.
    retiring: usize,
}

impl Table {
    fn add(&mut self, held: Held, start: u64, end: u64, lkey: u32) -> u32 {
        let pin = Pin {
            held: Some(held),
            start,
            end,
            lkey,
            uses: AtomicU32::new(0),
            unpinned: false,
        };
        match self.free.pop() {
            Some(i) => {
                self.slab[i as usize] = pin;
                i
            }
            None => {
                self.slab.push(pin);
                (self.slab.len() - 1) as u32
            }
        }
    }

    /// Takes pin `id` out of the lookups; drops it at once if nothing names it (returned, to
    /// be dropped outside the lock).
    fn unpin(&mut self, id: u32) -> Option<Held> {
        let p = &mut self.slab[id as usize];
        p.unpinned = true;
        if p.uses.load(Ordering::Acquire) == 0 {
            self.free.push(id);
            return p.held.take();
        }
        self.retiring += 1;
        None
    }
}

/// Regions ([`DmaBuf`]s) and address handles that slot posts may name, shareable by any
/// number of queue pairs ([`Qp::with_pins`](crate::Qp::with_pins)): a buffer pinned once is
/// usable by every QP of the table, whatever the number of QPs.
///
/// [`unpin`](Self::unpin) withdraws an object at once (a slot naming it is refused from then
/// on) and releases it once the last posted WR naming it is done (see the module
/// documentation): safe code can never free memory under the NIC this way.
#[derive(Default)]
pub struct Pins {
    table: RwLock<Table>,
}

impl std::fmt::Debug for Pins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pins")
            .field("pinned", &self.pinned())
            .field("retiring", &self.retiring())
            .finish()
    }
}

impl Pins {
    /// An empty table.
    pub fn new() -> Arc<Pins> {
        Arc::default()
    }

    fn read(&self) -> RwLockReadGuard<'_, Table> {
        self.table.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Table> {
        self.table.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Pins `buf`: slot posts on the queues of this table may name its bytes, and it stays
    /// alive until it is unpinned and no posted WR names it. Pinning a pinned buffer does
    /// nothing (one [`unpin`](Self::unpin) undoes it). O(log n).
    pub fn pin(&self, buf: &Arc<DmaBuf>) {
        if buf.is_empty() {
            // No SGE (never empty) can lie inside an empty region.
            return;
        }
        let mut t = self.write();
        if t.regions.contains_key(&buf.addr()) {
            return;
        }
        let end = buf.addr() + buf.len() as u64;
        let id = t.add(Held::Region(Arc::clone(buf)), buf.addr(), end, buf.lkey());
        t.regions.insert(buf.addr(), id);
    }

    /// Unpins `buf`: slots naming it are refused from now on, and the table lets go of it once
    /// the posted WRs that name it are done. Returns whether it was pinned. O(log n).
    pub fn unpin(&self, buf: &DmaBuf) -> bool {
        let mut t = self.write();
        let Some(id) = t.regions.remove(&buf.addr()) else {
            return false;
        };
        let gone = t.unpin(id);
        drop(t);
        drop(gone);
        true
    }

    /// Pins an address handle: UD slot posts may name it; it lives until unpinned and no
    /// posted WR names it. A table may serve QPs of several protection domains: a post
    /// refuses a handle of another PD than its QP's.
    pub fn pin_ah(&self, ah: &Arc<Ah>) {
        let mut t = self.write();
        let key = ah.raw as usize;
        if t.ahs.contains_key(&key) {
            return;
        }
        let id = t.add(Held::Ah(Arc::clone(ah)), 0, 0, 0);
        t.ahs.insert(key, id);
    }

    /// Unpins an address handle (as [`unpin`](Self::unpin) a buffer). Returns whether it was
    /// pinned.
    pub fn unpin_ah(&self, ah: &Ah) -> bool {
        let mut t = self.write();
        let Some(id) = t.ahs.remove(&(ah.raw as usize)) else {
            return false;
        };
        let gone = t.unpin(id);
        drop(t);
        drop(gone);
        true
    }

    /// Objects pinned now (regions and address handles slot posts may name).
    pub fn pinned(&self) -> usize {
        let t = self.read();
        t.regions.len() + t.ahs.len()
    }

    /// Objects unpinned that posted WRs still name (released once those are done).
    pub fn retiring(&self) -> usize {
        self.read().retiring
    }

    /// A view for checking one chain: the lock is taken once per post, not once per WR.
    pub(crate) fn checker(&self) -> Checker<'_> {
        Checker {
            t: self.read(),
            last: Cell::new(NO_REGION),
        }
    }

    /// Retires `deltas`: the WRs (or holds) they count are done. Objects unpinned meanwhile
    /// whose count reaches zero are released.
    pub(crate) fn retire(&self, deltas: &[(u32, u32)]) {
        if deltas.is_empty() {
            return;
        }
        let mut release = false;
        {
            let t = self.read();
            for &(id, n) in deltas {
                let Some(p) = t.slab.get(id as usize) else {
                    continue;
                };
                let before = p.uses.fetch_sub(n, Ordering::AcqRel);
                debug_assert!(before >= n, "pin {id}: {n} retired of {before} uses");
                release |= before == n && p.unpinned;
            }
        }
        if release {
            let mut gone: SmallVec<[Held; 2]> = SmallVec::new();
            let mut t = self.write();
            for &(id, _) in deltas {
                let p = &mut t.slab[id as usize];
                if p.unpinned && p.held.is_some() && p.uses.load(Ordering::Acquire) == 0 {
                    gone.extend(p.held.take());
                    t.free.push(id);
                    t.retiring -= 1;
                }
            }
            drop(t);
            drop(gone);
        }
    }
}

/// A table read-locked while one chain is checked and counted.
pub(crate) struct Checker<'a> {
    t: RwLockReadGuard<'a, Table>,
    /// The region (start, end, lkey, pin) the last SGE checked lay in: a chain's WRs mostly
    /// name one region, which is then found without a search.
    last: Cell<(u64, u64, u32, u32)>,
}

/// No region: no SGE (at least one byte) lies inside it.
const NO_REGION: (u64, u64, u32, u32) = (u64::MAX, 0, 0, u32::MAX);

impl Checker<'_> {
    /// The pin of address handle `ah`, if pinned, and the handle (pinned, so alive).
    pub(crate) fn ah(&self, ah: *mut ibv_ah) -> Option<(u32, &Arc<Ah>)> {
        let &id = self.t.ahs.get(&(ah as usize))?;
        match &self.t.slab[id as usize].held {
            Some(Held::Ah(a)) => Some((id, a)),
            _ => None,
        }
    }

    /// The pin of the region holding `addr..end` with key `lkey`, if any.
    #[inline]
    fn region(&self, addr: u64, end: u64, lkey: u32) -> Option<u32> {
        let (start, last_end, last_key, id) = self.last.get();
        if start <= addr && end <= last_end && last_key == lkey {
            return Some(id);
        }
        self.region_looked_up(addr, end, lkey)
    }

    /// [`region`](Self::region) when the last region found is not it.
    #[inline(never)]
    fn region_looked_up(&self, addr: u64, end: u64, lkey: u32) -> Option<u32> {
        let (_, &id) = self.t.regions.range(..=addr).next_back()?;
        let p = &self.t.slab[id as usize];
        (p.lkey == lkey && end <= p.end).then(|| {
            self.last.set((p.start, p.end, p.lkey, id));
            id
        })
    }

    /// Checks the SGEs of the WR at position `index` of a chain (each non-empty, inside a
    /// pinned region with that region's lkey) and hands each one's pin to `named`.
    pub(crate) fn check_sges(
        &self,
        index: usize,
        sges: &[ibv_sge],
        max_sge: u32,
        mut named: impl FnMut(u32),
    ) -> Result<()> {
        let bad = |reason: String| Err(Error::InvalidWr { index, reason });
        if sges.len() > max_sge as usize {
            return bad(format!("{} SGEs, the queue takes {max_sge}", sges.len()));
        }
        for s in sges {
            // A zero length means 2 GiB to some NICs (mlx5): never let one through.
            if s.length == 0 {
                return bad(format!(
                    "an empty SGE at {:#x} (some NICs read 0 as 2 GiB)",
                    s.addr
                ));
            }
            let pin = s
                .addr
                .checked_add(u64::from(s.length))
                .and_then(|end| self.region(s.addr, end, s.lkey));
            match pin {
                Some(p) => named(p),
                None => {
                    return bad(format!(
                        "SGE {:#x}+{} (lkey {:#x}) is not inside a region pinned to this queue",
                        s.addr, s.length, s.lkey
                    ));
                }
            }
        }
        Ok(())
    }

    /// Counts `deltas` as named by posted WRs (under the read lock, so no unpin can release
    /// an object between its check and its count).
    pub(crate) fn count(&self, deltas: &[(u32, u32)]) {
        for &(id, n) in deltas {
            self.t.slab[id as usize].uses.fetch_add(n, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(pd: &Arc<crate::Pd>, len: usize) -> Arc<DmaBuf> {
        Arc::new(
            pd.alloc_dma(len, 64, crate::AccessFlags::LOCAL_WRITE)
                .unwrap(),
        )
    }

    fn pd() -> (softnic::Fabric, Arc<crate::Pd>) {
        let f = softnic::Fabric::default();
        let v = crate::Verbs::soft(&f);
        let ctx = crate::Context::open_by_name(&v, "soft0").unwrap();
        let pd = ctx.alloc_pd().unwrap();
        (f, pd)
    }

    fn sge(b: &DmaBuf, off: usize, len: u32) -> ibv_sge {
        b.sge(off, len).unwrap()
    }

    /// An unpinned region is refused at once, and dropped only when its last use retires.
    #[test]
    fn an_unpinned_region_lives_until_its_last_use_retires() {
        let (_f, pd) = pd();
        let pins = Pins::new();
        let b = buf(&pd, 4096);
        let weak = Arc::downgrade(&b);
        pins.pin(&b);
        pins.pin(&b);
        assert_eq!(pins.pinned(), 1, "pinning twice pins once");
        let mut named = Vec::new();
        {
            let c = pins.checker();
            c.check_sges(0, &[sge(&b, 0, 64), sge(&b, 64, 64)], 2, |p| named.push(p))
                .unwrap();
            let mut d = Deltas::new();
            for &p in &named {
                add_delta(&mut d, p, 1);
            }
            assert_eq!(d.as_slice(), &[(named[0], 2)]);
            c.count(&d);
        }
        drop(b);
        assert!(pins.unpin(&weak.upgrade().unwrap()));
        assert!(!pins.unpin(&weak.upgrade().unwrap()), "unpinned once");
        assert_eq!((pins.pinned(), pins.retiring()), (0, 1));
        assert!(weak.upgrade().is_some(), "still named by two WRs");
        let c = pins.checker();
        let b2 = weak.upgrade().unwrap();
        let e = c.check_sges(0, &[sge(&b2, 0, 64)], 1, |_| {}).unwrap_err();
        assert!(e.to_string().contains("not inside a region pinned"), "{e}");
        drop(c);
        drop(b2);
        pins.retire(&[(named[0], 1)]);
        assert!(weak.upgrade().is_some(), "one WR left");
        pins.retire(&[(named[0], 1)]);
        assert!(weak.upgrade().is_none(), "released with its last use");
        assert_eq!(pins.retiring(), 0);
    }

    /// A region unpinned with nothing naming it goes at once, and its pin slot is reused.
    #[test]
    fn an_idle_region_goes_at_once_and_slots_are_reused() {
        let (_f, pd) = pd();
        let pins = Pins::new();
        let (a, b) = (buf(&pd, 128), buf(&pd, 128));
        let weak = Arc::downgrade(&a);
        pins.pin(&a);
        pins.unpin(&a);
        drop(a);
        assert!(weak.upgrade().is_none());
        pins.pin(&b);
        assert_eq!(pins.read().slab.len(), 1, "the freed slot was reused");
        let mut n = 0;
        pins.checker()
            .check_sges(0, &[sge(&b, 0, 128)], 1, |_| n += 1)
            .unwrap();
        assert_eq!(n, 1);
    }
}
