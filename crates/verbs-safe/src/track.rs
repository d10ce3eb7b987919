//! What a completion must find again: per-WR handlers, the buffers of safe posts and the pins
//! signaled slot WRs retire, in a slab per context, keyed by the `wr_id` the WR carried.
//!
//! A tracked `wr_id` is [`WR_ID_TAG`] | generation (31 bits) << 32 | slot index (32 bits). The
//! slot is found in O(1) and the generation must match, so a `wr_id` can at worst name no
//! live entry (and is then delivered as a plain completion): it can never be turned into a
//! pointer, whatever bits a caller puts in it. A slot's generation grows with every reuse and
//! never comes round: a slot whose last generation is freed is retired for good (one slot per
//! 2^31 uses), so a `wr_id` that outlived its entry (a dropped handler's, a purged post's)
//! never names a later one.

use std::any::Any;
use std::sync::{Arc, Mutex};

use std::sync::atomic::{AtomicU64, Ordering};

use crate::memory::MrBuf;
use crate::pins::{Deltas, Pins};
use crate::wc::Completion;
use crate::window::PendingBind;

/// The `wr_id` bit that marks an id this crate issued for a tracked WR (a
/// [`CompletionContext`](crate::CompletionContext) or a safe post); plain `wr_id`s keep it
/// clear (safe posts refuse one that has it).
pub const WR_ID_TAG: u64 = 1 << 63;

/// A per-WR completion handler.
pub(crate) type Handler = Arc<dyn Fn(Completion<'_>) + Send + Sync>;

/// Who posted a tracked WR: entries of a destroyed QP or SRQ are dropped with it. The ids are
/// never reused (a counter), so a new queue never owns an entry of one that is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    Qp(u64),
    Srq(u64),
}

/// An id for a new queue: unique for the life of the process.
pub(crate) fn new_owner_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A signaled slot WR: when its completion is polled, it and every WR before it on its send
/// queue are done, so the pins they named retire.
pub(crate) struct Mark {
    /// The id the caller gave the WR (its completion reports this one).
    pub(crate) wr_id: u64,
    pub(crate) owner: Owner,
    pub(crate) pins: Arc<Pins>,
    /// What this WR and the unsignaled ones since the previous signaled one named.
    pub(crate) deltas: Deltas,
}

/// What a safe post handed over until its completion.
pub(crate) struct Posted {
    /// The id the caller gave the WR (its completion reports this one).
    pub(crate) wr_id: u64,
    pub(crate) owner: Owner,
    /// Kept alive, shared: buffers the NIC only reads, address handles, remote buffers.
    pub(crate) shared: Vec<Arc<dyn Any + Send + Sync>>,
    /// Owned: buffers the NIC writes, given back with the completion.
    pub(crate) owned: Vec<MrBuf>,
}

pub(crate) enum Entry {
    /// A persistent handler (stays until its context is dropped).
    Handler(Handler),
    /// One safe post (taken out by its completion).
    Posted(Posted),
    /// One signaled slot WR (taken out by its completion).
    Mark(Mark),
    /// One memory-window bind (taken out by its completion).
    Bind(PendingBind),
}

impl Entry {
    fn owner(&self) -> Option<Owner> {
        match self {
            Entry::Handler(_) => None,
            Entry::Posted(p) => Some(p.owner),
            Entry::Mark(m) => Some(m.owner),
            Entry::Bind(b) => Some(b.owner),
        }
    }
}

/// What a tracked `wr_id` resolves to.
pub(crate) enum Resolved {
    Handler(Handler),
    Posted(Posted),
    Mark(Mark),
    Bind(PendingBind),
    /// Not (or no longer) a live entry: a plain completion.
    Unknown,
}

struct Slot {
    generation: u32,
    entry: Option<Entry>,
}

#[derive(Default)]
struct Slots {
    slots: Vec<Slot>,
    free: Vec<u32>,
}

/// The slab of one context.
#[derive(Default)]
pub(crate) struct Tracker {
    slots: Mutex<Slots>,
}

impl std::fmt::Debug for Tracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracker").finish_non_exhaustive()
    }
}

/// The generations a slot goes through (31 bits of the key) before it is retired.
const GENERATIONS: u32 = 1 << 31;

fn key(index: u32, generation: u32) -> u64 {
    debug_assert!(generation < GENERATIONS);
    WR_ID_TAG | (u64::from(generation) << 32) | u64::from(index)
}

impl Tracker {
    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stores `e`; returns the `wr_id` that finds it.
    pub(crate) fn insert(&self, e: Entry) -> u64 {
        let mut s = self.lock();
        match s.free.pop() {
            Some(i) => {
                let slot = &mut s.slots[i as usize];
                slot.entry = Some(e);
                key(i, slot.generation)
            }
            None => {
                // 2^32 slots would be hundreds of GiB of table: never reached.
                let i = u32::try_from(s.slots.len()).expect("2^32 tracked WRs at once");
                s.slots.push(Slot {
                    generation: 0,
                    entry: Some(e),
                });
                key(i, 0)
            }
        }
    }

    /// The live slot `wr_id` names, if any.
    fn slot(s: &mut Slots, wr_id: u64) -> Option<&mut Slot> {
        if wr_id & WR_ID_TAG == 0 {
            return None;
        }
        let generation = ((wr_id >> 32) & 0x7fff_ffff) as u32;
        s.slots
            .get_mut((wr_id & 0xffff_ffff) as usize)
            .filter(|slot| slot.generation == generation && slot.entry.is_some())
    }

    /// Takes the entry out; the slot is reused with the next generation, or retired (never
    /// reused) when it had its last one, so no key it gave out ever names a later entry.
    fn free(s: &mut Slots, wr_id: u64) -> Option<Entry> {
        let slot = Self::slot(s, wr_id)?;
        let e = slot.entry.take();
        if slot.generation + 1 < GENERATIONS {
            slot.generation += 1;
            s.free.push((wr_id & 0xffff_ffff) as u32);
        }
        e
    }

    /// Removes the entry `wr_id` names (a dropped handler, or a post that never happened).
    pub(crate) fn remove(&self, wr_id: u64) -> Option<Entry> {
        Self::free(&mut self.lock(), wr_id)
    }

    /// What a completion with `wr_id` goes to: a handler stays, a post or a mark is taken out.
    pub(crate) fn resolve(&self, wr_id: u64) -> Resolved {
        let mut s = self.lock();
        match Self::slot(&mut s, wr_id).and_then(|slot| slot.entry.as_ref()) {
            Some(Entry::Handler(h)) => Resolved::Handler(Arc::clone(h)),
            Some(_) => match Self::free(&mut s, wr_id) {
                Some(Entry::Posted(p)) => Resolved::Posted(p),
                Some(Entry::Mark(m)) => Resolved::Mark(m),
                Some(Entry::Bind(b)) => Resolved::Bind(b),
                _ => Resolved::Unknown,
            },
            None => Resolved::Unknown,
        }
    }

    /// Sets the pins each mark `(wr_id, deltas)` of `fills` retires (filled in once the chain
    /// they are part of was counted, before it is posted), under one lock; empties `fills`.
    pub(crate) fn fill_marks(&self, fills: &mut Vec<(u64, Deltas)>) {
        if fills.is_empty() {
            return;
        }
        let mut s = self.lock();
        for (wr_id, deltas) in fills.drain(..) {
            if let Some(Entry::Mark(m)) =
                Self::slot(&mut s, wr_id).and_then(|slot| slot.entry.as_mut())
            {
                m.deltas = deltas;
            }
        }
    }

    /// Takes out every post and mark of `owner` (reset or destroyed: the NIC can no longer
    /// touch what they hold) and returns them, to be dropped (and retired) outside the lock.
    pub(crate) fn purge(&self, owner: Owner) -> Vec<Entry> {
        let mut s = self.lock();
        let dead: Vec<u64> = s
            .slots
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.entry.as_ref().and_then(Entry::owner) == Some(owner))
            .map(|(i, slot)| key(i as u32, slot.generation))
            .collect();
        dead.into_iter()
            .filter_map(|id| Self::free(&mut s, id))
            .collect()
    }

    /// Sets the generation of the slot `wr_id` names, as if it had been freed that many
    /// times: lets a test reach the end of the generations without 2^31 frees.
    #[cfg(test)]
    fn set_generation(&self, wr_id: u64, generation: u32) {
        self.lock().slots[(wr_id & 0xffff_ffff) as usize].generation = generation;
    }

    /// Safe posts not yet completed (for tests and leak checks).
    pub(crate) fn posted(&self) -> usize {
        self.lock()
            .slots
            .iter()
            .filter(|s| matches!(s.entry, Some(Entry::Posted(_) | Entry::Bind(_))))
            .count()
    }
}

/// Drops what [`Tracker::purge`] took out: posts give up their buffers, marks retire their
/// pins, binds (whose outcome is now unknown) leave their targets to their windows.
pub(crate) fn release(entries: Vec<Entry>) {
    for e in entries {
        if let Entry::Mark(m) = e {
            m.pins.retire(&m.deltas);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn posted(wr_id: u64) -> Entry {
        Entry::Posted(Posted {
            wr_id,
            owner: Owner::Qp(1),
            shared: Vec::new(),
            owned: Vec::new(),
        })
    }

    #[test]
    fn a_key_is_found_once_and_a_stale_or_forged_one_never() {
        let t = Tracker::default();
        let a = t.insert(posted(7));
        assert_ne!(a & WR_ID_TAG, 0);
        assert!(matches!(t.resolve(a), Resolved::Posted(p) if p.wr_id == 7));
        assert!(matches!(t.resolve(a), Resolved::Unknown), "taken once");
        // The slot is reused with a new generation: the old key stays dead.
        let b = t.insert(posted(8));
        assert_eq!(a & 0xffff_ffff, b & 0xffff_ffff);
        assert_ne!(a, b);
        assert!(matches!(t.resolve(a), Resolved::Unknown));
        for forged in [0, 1, u64::MAX, WR_ID_TAG | 5, b ^ (1 << 40), b & !WR_ID_TAG] {
            assert!(
                matches!(t.resolve(forged), Resolved::Unknown),
                "{forged:#x}"
            );
        }
        assert!(matches!(t.resolve(b), Resolved::Posted(p) if p.wr_id == 8));
    }

    /// A `wr_id` can outlive its entry (a dropped `CompletionContext` whose WRs are still in
    /// flight, a post purged by a reset whose completion is still queued). However often its
    /// slot is reused after that, the stale key never names a later entry: a slot whose
    /// generations are used up is retired instead of coming round to an old key.
    #[test]
    fn a_stale_key_never_names_a_later_entry_when_generations_run_out() {
        let t = Tracker::default();
        let stale = t.insert(posted(1));
        assert!(matches!(t.resolve(stale), Resolved::Posted(p) if p.wr_id == 1));
        // 2^31 - 1 frees of that slot later, its last generation:
        t.set_generation(stale, (1 << 31) - 1);
        let last = t.insert(posted(2));
        assert_eq!(last & 0xffff_ffff, stale & 0xffff_ffff, "the same slot");
        assert!(matches!(t.resolve(last), Resolved::Posted(p) if p.wr_id == 2));
        let later: Vec<u64> = (3..8).map(|i| t.insert(posted(i))).collect();
        for (i, &k) in later.iter().enumerate() {
            assert!(
                k != stale && k != last,
                "entry {} took an old key {k:#x}",
                i + 3
            );
        }
        assert!(
            matches!(t.resolve(stale), Resolved::Unknown),
            "stale key names an entry"
        );
        assert!(
            matches!(t.resolve(last), Resolved::Unknown),
            "stale key names an entry"
        );
        for (i, &k) in later.iter().enumerate() {
            assert!(matches!(t.resolve(k), Resolved::Posted(p) if p.wr_id == i as u64 + 3));
        }
    }

    /// Queues are told apart by an id that is never reused: a queue made after another is
    /// gone (possibly at the same address) never owns the entries of the first.
    #[test]
    fn owner_ids_are_never_reused() {
        let ids: std::collections::HashSet<u64> = (0..1000).map(|_| new_owner_id()).collect();
        assert_eq!(ids.len(), 1000);
        let t = Tracker::default();
        let (a, b) = (new_owner_id(), new_owner_id());
        let p = |owner| {
            t.insert(Entry::Posted(Posted {
                wr_id: 1,
                owner,
                shared: Vec::new(),
                owned: Vec::new(),
            }))
        };
        p(Owner::Qp(a));
        let kept = p(Owner::Qp(b));
        assert_eq!(t.purge(Owner::Qp(a)).len(), 1);
        assert!(matches!(t.resolve(kept), Resolved::Posted(_)));
    }

    #[test]
    fn handlers_stay_until_removed_and_purge_drops_an_owners_posts() {
        let t = Tracker::default();
        let h = t.insert(Entry::Handler(Arc::new(|_| {})));
        assert!(matches!(t.resolve(h), Resolved::Handler(_)));
        assert!(matches!(t.resolve(h), Resolved::Handler(_)));
        assert!(t.remove(h).is_some());
        assert!(matches!(t.resolve(h), Resolved::Unknown));
        let p = t.insert(posted(1));
        assert_eq!(t.posted(), 1);
        assert!(t.purge(Owner::Qp(2)).is_empty());
        assert_eq!(t.posted(), 1);
        assert_eq!(t.purge(Owner::Qp(1)).len(), 1);
        assert_eq!(t.posted(), 0);
        assert!(matches!(t.resolve(p), Resolved::Unknown));
    }
}
