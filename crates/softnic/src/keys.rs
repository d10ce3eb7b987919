//! Memory keys: the lkeys and rkeys of a device's memory regions and the rkeys of its memory
//! windows, and the table every access through a key is checked against.
//!
//! A key is 32 bits: a 24-bit index (never 0) that no two live objects of a device share, and
//! an 8-bit tag (the "key" portion a consumer may change on a memory window with each bind,
//! `ibv_inc_rkey`). Lookups compare the whole 32 bits, so a window's old key is dead as soon as
//! it is bound with a new tag.
//!
//! Keys must not be guessable: a peer that saw one key must not compute another (hardware's key
//! variants serve the same end). The n-th key a device hands out is a keyed permutation of `n`:
//! its index is a four-round Feistel network over the 24 bits of `n` whose round function is
//! SipHash-2-4 under a 128-bit secret of the device, and its tag is the same PRF of `n` in
//! another domain. The secret comes from the fabric's seed on the virtual clock, so a run
//! replays bit for bit (same seed, same calls, same keys), and from the operating system's
//! entropy on the wall clock (two processes, or one run and the next, never share it). Once
//! all 2^24 counter values have been used the counter wraps, and indices still in use are
//! skipped.

use crate::hash::NumberMap;
use crate::mr::Region;

/// The number of counter values (and of indices): 2^24.
pub(crate) const KEYS: u32 = 1 << 24;

/// SipHash-2-4 of one 8-byte message `m` (little-endian) under the key `(k0, k1)`.
fn sip24((k0, k1): (u64, u64), m: u64) -> u64 {
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    let round = |v: &mut [u64; 4]| {
        v[0] = v[0].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(13) ^ v[0];
        v[0] = v[0].rotate_left(32);
        v[2] = v[2].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(16) ^ v[2];
        v[0] = v[0].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(21) ^ v[0];
        v[2] = v[2].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(17) ^ v[2];
        v[2] = v[2].rotate_left(32);
    };
    // The message block, then the last block: the message length (8) in its top byte.
    for block in [m, 8 << 56] {
        v[3] ^= block;
        round(&mut v);
        round(&mut v);
        v[0] ^= block;
    }
    v[2] ^= 0xff;
    for _ in 0..4 {
        round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

/// The secret a device's keys are drawn with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeySecret((u64, u64));

impl KeySecret {
    /// The secret of device `dev` of a fabric seeded with `seed` (the virtual clock: a run
    /// replays with its seed). Devices of one fabric get different secrets.
    pub(crate) fn seeded(seed: u64, dev: usize) -> Self {
        let domain = (0x6b65_7973, seed); // "keys"
        KeySecret((sip24(domain, dev as u64), sip24(domain, !(dev as u64))))
    }

    /// A secret from the operating system's entropy (the wall clock).
    pub(crate) fn random() -> Self {
        let mut buf = [0u8; 16];
        // SAFETY: `buf` is 16 writable bytes; getrandom writes at most that many.
        let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n != 16 {
            // No getrandom (an old kernel, a seccomp filter): std's per-process random keys.
            use std::hash::BuildHasher;
            let s = std::collections::hash_map::RandomState::new();
            return KeySecret((s.hash_one(0x6b65_7973u64), s.hash_one(!0x6b65_7973u64)));
        }
        let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
        KeySecret((word(&buf[..8]), word(&buf[8..])))
    }

    /// The key for counter value `n` (below [`KEYS`]): a permutation of `n` in the high 24
    /// bits, a tag in the low 8.
    fn key_at(self, n: u32) -> u32 {
        let (mut l, mut r) = ((n >> 12) & 0xfff, n & 0xfff);
        for round in 0..4u64 {
            let f = sip24(self.0, (round << 32) | u64::from(r)) as u32 & 0xfff;
            (l, r) = (r, l ^ f);
        }
        let tag = sip24(self.0, (1 << 40) | u64::from(n)) as u32 & 0xff;
        (((l << 12) | r) << 8) | tag
    }
}

/// What a key of a device names, by index: the whole key (tag included) and what an access
/// through it is checked against.
#[derive(Debug)]
pub(crate) struct Keys {
    secret: KeySecret,
    /// The next counter value, in `0..KEYS`.
    pub(crate) counter: u32,
    /// Index -> slot in `regions` of each live key.
    slots: NumberMap,
    /// The live keys, whole, and what they name; `None` where a key was given up. (Not a
    /// [`Table`](crate::table::Table): a device may have more keys than a table has slots,
    /// and only `slots` names a slot here, never one given up, so slots need no generations.)
    regions: Vec<Option<(u32, Region)>>,
    /// Slots of `regions` given up, to be taken again.
    free: Vec<u32>,
}

impl Keys {
    pub(crate) fn new(secret: KeySecret) -> Self {
        Keys {
            secret,
            counter: 0,
            slots: NumberMap::default(),
            regions: Vec::new(),
            free: Vec::new(),
        }
    }

    /// A new key for `region`, whose index no live key has; `None` if every index is taken.
    pub(crate) fn insert(&mut self, region: Region) -> Option<u32> {
        for _ in 0..KEYS {
            let n = self.counter;
            self.counter = (n + 1) % KEYS;
            let key = self.secret.key_at(n);
            let index = key >> 8;
            if index != 0 && !self.slots.contains(index) {
                let entry = Some((key, region));
                let slot = match self.free.pop() {
                    Some(slot) => {
                        self.regions[slot as usize] = entry;
                        slot
                    }
                    None => {
                        self.regions.push(entry);
                        (self.regions.len() - 1) as u32
                    }
                };
                self.slots.insert(index, slot);
                return Some(key);
            }
        }
        None
    }

    /// What `key` (all 32 bits of it) names.
    #[inline(always)]
    pub(crate) fn get(&self, key: u32) -> Option<&Region> {
        self.regions[self.slot(key)?].as_ref().map(|(_, r)| r)
    }

    /// The slot of `key`: that of its index, if the key living there has `key`'s tag.
    #[inline(always)]
    fn slot(&self, key: u32) -> Option<usize> {
        let slot = self.slots.get(key >> 8)? as usize;
        self.regions[slot]
            .as_ref()
            .is_some_and(|(k, _)| *k == key)
            .then_some(slot)
    }

    /// The live entry of `key`, to change it.
    fn entry_mut(&mut self, key: u32) -> Option<&mut (u32, Region)> {
        let slot = self.slot(key)?;
        self.regions[slot].as_mut()
    }

    /// What `key` names, to change it.
    pub(crate) fn get_mut(&mut self, key: u32) -> Option<&mut Region> {
        self.entry_mut(key).map(|(_, r)| r)
    }

    /// Gives `key` up: its index is free again.
    pub(crate) fn remove(&mut self, key: u32) -> Option<Region> {
        let slot = self.slot(key)?;
        self.slots.remove(key >> 8);
        self.free.push(slot as u32);
        self.regions[slot].take().map(|(_, r)| r)
    }

    /// Replaces `key`'s tag with `tag`: the old key is dead, the new one returned. `None` if
    /// `key` is not live.
    pub(crate) fn retag(&mut self, key: u32, tag: u8) -> Option<u32> {
        let (k, _) = self.entry_mut(key)?;
        *k = (key & !0xff) | u32::from(tag);
        Some(*k)
    }

    /// The number of live keys.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.regions.len() - self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hand-written SipHash-2-4 is the standard one (std's, for an 8-byte message).
    #[test]
    #[allow(deprecated)] // `SipHasher` is std's SipHash-2-4, deprecated only as a default hasher
    fn sip24_is_siphash_2_4() {
        use std::hash::Hasher;
        for (k, m) in [
            ((0, 0), 0),
            ((1, 2), 3),
            ((u64::MAX, 7), 0x0123_4567_89ab_cdef),
        ] {
            let mut h = std::hash::SipHasher::new_with_keys(k.0, k.1);
            h.write(&u64::to_le_bytes(m));
            assert_eq!(sip24(k, m), h.finish(), "key {k:?}, message {m:#x}");
        }
    }

    /// Keys given up free their slots for the next ones; a key given up, or retagged, names
    /// nothing, and the others still name their regions.
    #[test]
    fn keys_given_up_name_nothing_and_their_slots_are_taken_again() {
        let region = |addr| Region {
            pd: 1,
            addr,
            len: 64,
            access: 0,
            kind: crate::mr::KeyKind::Mr,
        };
        let mut keys = Keys::new(KeySecret::seeded(3, 0));
        let k: Vec<u32> = (0..300)
            .map(|i| keys.insert(region(i)).expect("a key"))
            .collect();
        for (i, &key) in k.iter().enumerate() {
            assert_eq!(keys.get(key).map(|r| r.addr), Some(i as u64), "key {i}");
            assert!(keys.get(key ^ 1).is_none(), "another tag of key {i}");
        }
        assert!(
            keys.remove(k[7] ^ 1).is_none(),
            "another tag gives nothing up"
        );
        assert_eq!(keys.remove(k[7]).map(|r| r.addr), Some(7));
        assert!(keys.remove(k[7]).is_none() && keys.get(k[7]).is_none());
        let new = keys.insert(region(1000)).expect("a key");
        assert_eq!(
            (keys.len(), keys.regions.len()),
            (300, 300),
            "slot 7 taken again"
        );
        assert_eq!(keys.get(new).map(|r| r.addr), Some(1000));
        assert!(keys.get(k[7]).is_none());
        let retagged = keys
            .retag(k[8], (k[8] as u8).wrapping_add(1))
            .expect("live");
        assert!(keys.get(k[8]).is_none() && keys.get_mut(k[8]).is_none());
        assert_eq!(keys.get(retagged).map(|r| r.addr), Some(8));
        for (i, &key) in k.iter().enumerate().filter(|&(i, _)| i != 7 && i != 8) {
            assert_eq!(keys.get(key).map(|r| r.addr), Some(i as u64), "key {i}");
        }
    }

    /// The index is a permutation: every counter value of a range gets its own index.
    #[test]
    fn indices_are_a_permutation() {
        let s = KeySecret::seeded(5, 0);
        let mut seen = std::collections::HashSet::new();
        for n in 0..1 << 16 {
            assert!(seen.insert(s.key_at(n) >> 8), "index repeated at {n}");
        }
    }
}
