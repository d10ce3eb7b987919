//! Where an engine reads the time: the wall clock, or a softnic fabric's clock (virtual in
//! deterministic simulations, so that an engine's timers replay bit for bit with the fabric).

use std::time::Instant;

/// An engine's clock.
#[derive(Clone)]
pub enum Clock {
    /// Real time since the engine started.
    Wall(Instant),
    /// The fabric's time (virtual or wall, as the fabric was built).
    Fabric(softnic::Fabric),
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Clock::Wall(_) => f.write_str("Clock::Wall"),
            Clock::Fabric(_) => f.write_str("Clock::Fabric"),
        }
    }
}

impl Clock {
    /// The wall clock, starting now.
    pub fn wall() -> Clock {
        Clock::Wall(Instant::now())
    }

    /// An alarm on the fabric's clock if it is virtual and moves by itself
    /// (`auto_advance`): an idle engine moves it to the next deadline of the fabric's users.
    pub(crate) fn alarm(&self) -> Option<softnic::Alarm> {
        match self {
            Clock::Fabric(f) => {
                let c = f.config();
                (c.auto_advance && c.clock == softnic::Clock::Virtual).then(|| f.alarm())
            }
            Clock::Wall(_) => None,
        }
    }

    /// Whether this is a fabric's virtual clock (time moves only as the fabric's events do).
    pub(crate) fn is_virtual(&self) -> bool {
        matches!(self, Clock::Fabric(f) if f.config().clock == softnic::Clock::Virtual)
    }

    /// Nanoseconds since the clock's origin.
    #[inline(always)]
    pub fn now(&self) -> u64 {
        match self {
            Clock::Wall(t) => t.elapsed().as_nanos() as u64,
            Clock::Fabric(f) => f.now_ns(),
        }
    }
}
