//! The engine's random numbers: its connections' first PSNs and ACK tags, which a peer must not
//! guess. Drawn from the OS's randomness, except on a fabric's virtual clock, where they come
//! from the fabric's seed and the device (so that a simulation replays bit for bit).

use std::hash::{BuildHasher, Hash, Hasher};

use crate::clock::Clock;

/// SplitMix64 over a seed no peer knows.
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator for an engine on device `device` reading time from `clock`.
    pub(crate) fn new(clock: &Clock, device: &str) -> Rng {
        let seed = match clock {
            Clock::Fabric(f) => {
                let cfg = f.config();
                if cfg.clock == softnic::Clock::Virtual {
                    // std's default hasher is SipHash with fixed keys: the same everywhere.
                    let mut h = std::collections::hash_map::DefaultHasher::new();
                    (cfg.seed, device).hash(&mut h);
                    h.finish()
                } else {
                    random()
                }
            }
            Clock::Wall(_) => random(),
        };
        Rng(seed)
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
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
