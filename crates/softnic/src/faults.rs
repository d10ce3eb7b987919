//! Fault injection: per-direction probabilities drawn from one seeded RNG, and an optional
//! packet filter for tests that need to hit one exact packet (smoltcp's `FaultInjector` idea).

/// The faults injected on packets from one device to another.
///
/// Probabilities are per packet, in `0.0..=1.0` (the fabric refuses others when they are set:
/// [`Faults::check`]); each is drawn independently, in this order:
/// link down (everything dropped), loss, corruption (one random bit flipped; the receiver's ICRC
/// check drops the packet), duplication (a second copy follows), reordering (this packet is held
/// back by up to `reorder_delay_ns`, so later ones overtake it).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Faults {
    /// Drop every packet (the link is down).
    pub link_down: bool,
    /// Probability a packet is lost.
    pub loss: f64,
    /// Probability a packet has one bit flipped.
    pub corrupt: f64,
    /// Probability a packet is delivered twice.
    pub duplicate: f64,
    /// Probability a packet is delayed so that later packets overtake it.
    pub reorder: f64,
    /// The largest extra delay of a reordered packet, in nanoseconds of virtual time.
    pub reorder_delay_ns: u64,
}

impl Faults {
    /// No faults.
    pub const NONE: Faults = Faults {
        link_down: false,
        loss: 0.0,
        corrupt: 0.0,
        duplicate: 0.0,
        reorder: 0.0,
        reorder_delay_ns: 0,
    };

    /// Checks that every probability is a number in `0.0..=1.0`: the first that is not is
    /// named, with its value (NaN would silently mean "never", 1.5 "always").
    pub fn check(&self) -> Result<(), InvalidFaults> {
        let probabilities = [
            ("loss", self.loss),
            ("corrupt", self.corrupt),
            ("duplicate", self.duplicate),
            ("reorder", self.reorder),
        ];
        match probabilities
            .into_iter()
            .find(|(_, p)| !(0.0..=1.0).contains(p))
        {
            Some((field, value)) => Err(InvalidFaults { field, value }),
            None => Ok(()),
        }
    }

    /// Only loss, with probability `p`.
    pub fn loss(p: f64) -> Self {
        Faults {
            loss: p,
            ..Faults::NONE
        }
    }
}

/// A [`Faults`] probability that is not a number in `0.0..=1.0`. Two are equal when they name
/// the same field with the same bits (so a NaN equals itself).
#[derive(Debug, Clone, Copy)]
pub struct InvalidFaults {
    /// The field (`loss`, `corrupt`, `duplicate` or `reorder`).
    pub field: &'static str,
    /// Its value.
    pub value: f64,
}

impl std::fmt::Display for InvalidFaults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "fault probability `{}` is {}: it must be a number in 0.0..=1.0",
            self.field, self.value
        )
    }
}

impl std::error::Error for InvalidFaults {}

impl PartialEq for InvalidFaults {
    fn eq(&self, other: &Self) -> bool {
        self.field == other.field && self.value.to_bits() == other.value.to_bits()
    }
}

impl Eq for InvalidFaults {}

/// What the fabric knows of a packet when it asks a [`PacketFilter`] about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketInfo {
    /// The fabric-wide sequence number of this transmission (0, 1, 2, ... in send order).
    pub seq: u64,
    /// Index of the sending device (`soft0` is 0).
    pub from: usize,
    /// Index of the receiving device, or `usize::MAX` for a packet leaving on the UDP link
    /// (to another process or host).
    pub to: usize,
    /// BTH opcode.
    pub opcode: u8,
    /// BTH PSN.
    pub psn: u32,
    /// BTH destination QP number.
    pub dest_qp: u32,
    /// Length of the packet on the wire in bytes (headers, payload, pad and ICRC).
    pub len: usize,
}

/// What to do with one packet, decided by a [`PacketFilter`] before the random faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Let the random faults decide.
    Pass,
    /// Drop it.
    Drop,
    /// Flip one bit of it (the receiver's ICRC check will drop it).
    Corrupt,
    /// Deliver it twice.
    Duplicate,
    /// Hold it back this many extra nanoseconds.
    Delay(u64),
}

/// A test's hook on every packet the fabric transmits.
pub type PacketFilter = Box<dyn FnMut(&PacketInfo) -> Verdict + Send>;

/// xoshiro256** seeded through SplitMix64: small, fast, and the same on every platform, so a
/// seed replays a run bit for bit.
#[derive(Debug, Clone)]
pub(crate) struct Rng([u64; 4]);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        Rng([next(), next(), next(), next()])
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let out = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        out
    }

    /// True with probability `p` (no draw at all when `p <= 0`, so fault-free runs do not
    /// consume randomness).
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64) < p
    }

    /// Uniform in `0..n` (`n > 0`).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let (mut a, mut b) = (Rng::new(42), Rng::new(42));
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
    }

    #[test]
    fn chance_matches_its_probability() {
        let mut r = Rng::new(7);
        let hits = (0..100_000).filter(|_| r.chance(0.1)).count();
        assert!((9_000..11_000).contains(&hits), "{hits}");
        assert!(!(0..1000).any(|_| r.chance(0.0)));
        assert!((0..1000).all(|_| r.chance(1.0)));
        assert!((0..1000).all(|_| r.below(5) < 5));
    }
}
