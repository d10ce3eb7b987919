//! The engine's random numbers: its connections' first PSNs and ACK tags, which a peer must not
//! guess. Drawn from the OS's randomness, except on a fabric's virtual clock, where they come
//! from the fabric's seed and the device (so that a simulation replays bit for bit).

use std::hash::{BuildHasher, Hash, Hasher};

use crate::clock::Clock;

/// SipHash-2-4 of a counter under a 128-bit key no peer knows: a pseudo-random function, so
/// the values a peer sees (24-bit PSNs, 7-bit tags) tell it nothing of the others, where a
/// plain generator's state could be solved for from a few of its outputs.
pub(crate) struct Rng {
    keys: (u64, u64),
    n: u64,
}

impl Rng {
    /// A generator for an engine on device `device` reading time from `clock`.
    pub(crate) fn new(clock: &Clock, device: &str) -> Rng {
        let keys = match clock {
            Clock::Fabric(f) => {
                let cfg = f.config();
                if cfg.clock == softnic::Clock::Virtual {
                    // std's default hasher is SipHash with fixed keys: the same everywhere.
                    let key = |k: u8| {
                        let mut h = std::collections::hash_map::DefaultHasher::new();
                        (cfg.seed, device, k).hash(&mut h);
                        h.finish()
                    };
                    (key(0), key(1))
                } else {
                    (random(), random())
                }
            }
            Clock::Wall(_) => (random(), random()),
        };
        Rng { keys, n: 0 }
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        // SipHasher is deprecated as a `Hasher` for maps (std's RandomState picks its keys);
        // here it is the keyed PRF itself, with keys of our own.
        #[allow(deprecated)]
        let mut h = std::hash::SipHasher::new_with_keys(self.keys.0, self.keys.1);
        h.write_u64(self.n);
        self.n += 1;
        h.finish()
    }

    /// A random 24-bit packet sequence number.
    pub(crate) fn psn(&mut self) -> u32 {
        (self.next_u64() & 0x00ff_ffff) as u32
    }
}

/// 64 bits from the OS's randomness (std's hash keys are drawn from it, per process and then
/// per instance).
fn random() -> u64 {
    std::collections::hash_map::RandomState::new().hash_one(std::time::Instant::now())
}
