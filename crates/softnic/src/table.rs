//! The objects looked up on every packet and completion (QPs, CQs, SRQs), by ids the table
//! hands out: the index of the object's slot in the low bits, so that a look-up is an index
//! and a compare rather than a hash; a generation in the high bits, so that the id of an
//! object gone does not name the next one in its slot (timers, completions and frames in
//! flight name QPs by id, and may outlive them).

use std::collections::VecDeque;

/// Bits of an id that index its slot.
const SLOT_BITS: u32 = 20;
const SLOT_MASK: u32 = (1 << SLOT_BITS) - 1;
/// Generations of a slot before its ids come round again (each id has one of `1..GENS`: no
/// id is 0).
const GENS: u32 = 1 << (32 - SLOT_BITS);
/// Slots of a table, at most: the last two indices are left out, so that no id is `u32::MAX`
/// or `u32::MAX - 1` (the ids the connection manager's timer and the CQs' owed events go by
/// among the QPs' in the fabric's timer set).
const SLOTS: usize = SLOT_MASK as usize - 1;

/// Objects by id.
#[derive(Debug)]
pub(crate) struct Table<V> {
    slots: Vec<Slot<V>>,
    /// The free slots, the one free longest first: a slot is taken again only after every
    /// other free one was, which puts as many ids as possible between two of a slot.
    free: VecDeque<u32>,
}

#[derive(Debug)]
struct Slot<V> {
    /// The id of the object in it, or of the last one.
    id: u32,
    val: Option<V>,
}

impl<V> Default for Table<V> {
    fn default() -> Self {
        Table {
            slots: Vec::new(),
            free: VecDeque::new(),
        }
    }
}

impl<V> Table<V> {
    /// The id the next [`insert`](Self::insert) gives its object (the caller builds the
    /// object with it), or `None` if every slot is taken.
    pub(crate) fn next_id(&self) -> Option<u32> {
        match self.free.front() {
            Some(&s) => {
                let old = self.slots[s as usize].id;
                let generation = (old >> SLOT_BITS) % (GENS - 1) + 1;
                Some(s | (generation << SLOT_BITS))
            }
            None if self.slots.len() < SLOTS => Some(self.slots.len() as u32 | (1 << SLOT_BITS)),
            None => None,
        }
    }

    /// Adds `v` as `id`, which [`next_id`](Self::next_id) gave (nothing was inserted since).
    ///
    /// # Panics
    /// If `id` is not the one `next_id` gives.
    pub(crate) fn insert(&mut self, id: u32, v: V) {
        assert_eq!(Some(id), self.next_id(), "an id the table did not give");
        let slot = Slot { id, val: Some(v) };
        match self.free.pop_front() {
            Some(s) => self.slots[s as usize] = slot,
            None => self.slots.push(slot),
        }
    }

    /// Takes the object `id` out; its slot is free again.
    pub(crate) fn remove(&mut self, id: &u32) -> Option<V> {
        let s = self.slots.get_mut((id & SLOT_MASK) as usize)?;
        if s.id != *id {
            return None;
        }
        let v = s.val.take()?;
        self.free.push_back(id & SLOT_MASK);
        Some(v)
    }

    /// The object `id`, if it is here.
    #[inline]
    pub(crate) fn get(&self, id: &u32) -> Option<&V> {
        let s = self.slots.get((id & SLOT_MASK) as usize)?;
        if s.id == *id { s.val.as_ref() } else { None }
    }

    /// The object `id`, to change it.
    #[inline]
    pub(crate) fn get_mut(&mut self, id: &u32) -> Option<&mut V> {
        let s = self.slots.get_mut((id & SLOT_MASK) as usize)?;
        if s.id == *id { s.val.as_mut() } else { None }
    }

    /// Every object, in slot order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.slots.iter().filter_map(|s| s.val.as_ref())
    }

    /// Every object and its id, in slot order.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (&u32, &mut V)> {
        (self.slots.iter_mut()).filter_map(|s| s.val.as_mut().map(|v| (&s.id, v)))
    }
}

impl<V> std::ops::Index<&u32> for Table<V> {
    type Output = V;

    fn index(&self, id: &u32) -> &V {
        self.get(id).expect("an object of the table")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_names_its_object_and_no_later_one() {
        let mut t = Table::default();
        let a = t.next_id().unwrap();
        t.insert(a, "a");
        let b = t.next_id().unwrap();
        t.insert(b, "b");
        assert_ne!(a, b);
        assert!(a != 0 && b != 0);
        assert_eq!((t.get(&a), t.get(&b)), (Some(&"a"), Some(&"b")));
        assert_eq!(t.remove(&a), Some("a"));
        assert_eq!(t.get(&a), None);
        assert_eq!(t.remove(&a), None);
        // The freed slot is taken again, under another id; the old one finds nothing.
        let c = t.next_id().unwrap();
        t.insert(c, "c");
        assert_eq!(c & SLOT_MASK, a & SLOT_MASK);
        assert_ne!(c, a);
        assert_eq!((t.get(&a), t.get(&c)), (None, Some(&"c")));
        *t.get_mut(&c).unwrap() = "c2";
        assert_eq!(t[&c], "c2");
        assert_eq!(t.values().copied().collect::<Vec<_>>(), ["c2", "b"]);
        assert!(t.get(&0).is_none() && t.get(&(1 << 30)).is_none());
    }

    #[test]
    fn a_full_table_gives_no_id_and_never_the_timer_sentinels() {
        let mut t = Table::default();
        for _ in 0..SLOTS {
            let id = t.next_id().expect("room");
            // Not the slot of either sentinel, whatever the generation.
            assert!(id & SLOT_MASK < crate::cq::CQ_TIMER & SLOT_MASK, "{id:#x}");
            assert!(id & SLOT_MASK < crate::cm::CM_TIMER & SLOT_MASK, "{id:#x}");
            t.insert(id, ());
        }
        assert_eq!(t.next_id(), None);
        // One freed makes room again.
        let last = (SLOTS as u32 - 1) | (1 << SLOT_BITS);
        assert_eq!(t.remove(&last), Some(()));
        assert_eq!(t.next_id(), Some((SLOTS as u32 - 1) | (2 << SLOT_BITS)));
    }

    #[test]
    fn a_slot_goes_through_every_generation_before_an_id_comes_back() {
        let mut t = Table::default();
        let first = t.next_id().unwrap();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..GENS - 1 {
            let id = t.next_id().unwrap();
            assert_ne!(id >> SLOT_BITS, 0, "no generation 0");
            assert!(seen.insert(id), "{id:#x} came back early");
            t.insert(id, ());
            t.remove(&id);
        }
        assert_eq!(t.next_id(), Some(first));
    }

    #[test]
    fn the_longest_free_slot_is_taken_first() {
        let mut t = Table::default();
        let ids: Vec<u32> = (0..3)
            .map(|i| {
                let id = t.next_id().unwrap();
                t.insert(id, i);
                id
            })
            .collect();
        t.remove(&ids[1]);
        t.remove(&ids[0]);
        let next = t.next_id().unwrap();
        assert_eq!(next & SLOT_MASK, ids[1] & SLOT_MASK);
    }

    #[test]
    #[should_panic(expected = "an id the table did not give")]
    fn an_id_not_given_is_refused() {
        let mut t = Table::default();
        t.insert(7, ());
    }
}
