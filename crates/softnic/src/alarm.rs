//! Alarms: the deadlines of programs that run on a fabric's clock (an engine's retransmission
//! and ACK timers), so that the virtual clock can move to them when nothing else is pending.
//!
//! With [`FabricConfig::auto_advance`](crate::FabricConfig::auto_advance) a poll of an empty
//! CQ moves the virtual clock to the fabric's next event, but the fabric does not see its
//! users' timers: once every packet is lost, nothing is pending and a loop that only polls
//! never sees a retransmission timeout come. A program sets an [`Alarm`] to its next deadline,
//! and when it finds nothing to do, [`Alarm::advance_idle`] moves the clock to the earliest
//! alarm of all (so that no program's deadline is skipped) if the fabric has nothing pending.

use std::collections::BTreeSet;

use crate::fabric::{Clock, Fabric};

/// Every alarm of a fabric.
#[derive(Default)]
pub(crate) struct Alarms {
    /// Each alarm's time, by id (`None`: unset, or freed).
    at: Vec<Option<u64>>,
    free: Vec<u32>,
    /// The set alarms, earliest first.
    order: BTreeSet<(u64, u32)>,
}

impl Alarms {
    fn add(&mut self) -> u32 {
        self.free.pop().unwrap_or_else(|| {
            self.at.push(None);
            (self.at.len() - 1) as u32
        })
    }

    fn set(&mut self, id: u32, at: Option<u64>) {
        let slot = &mut self.at[id as usize];
        if let Some(old) = std::mem::replace(slot, at) {
            self.order.remove(&(old, id));
        }
        if let Some(t) = at {
            self.order.insert((t, id));
        }
    }

    fn remove(&mut self, id: u32) {
        self.set(id, None);
        self.free.push(id);
    }

    /// The earliest alarm set later than `now`.
    fn next_after(&self, now: u64) -> Option<u64> {
        let from = now.checked_add(1)?;
        self.order.range((from, 0)..).next().map(|&(t, _)| t)
    }
}

/// A deadline on a fabric's clock (see the module docs). Dropping it unsets it.
pub struct Alarm {
    fabric: Fabric,
    id: u32,
}

impl std::fmt::Debug for Alarm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Alarm").field("id", &self.id).finish()
    }
}

impl Fabric {
    /// A new alarm of this fabric, unset.
    pub fn alarm(&self) -> Alarm {
        let id = self.shared.lock_any().w.alarms.add();
        Alarm {
            fabric: self.clone(),
            id,
        }
    }
}

impl Alarm {
    /// Sets the alarm to `at_ns` on the fabric's clock, or unsets it (`None`).
    pub fn set(&self, at_ns: Option<u64>) {
        self.fabric.shared.lock_any().w.alarms.set(self.id, at_ns);
    }

    /// When nothing is pending on the fabric (no packet in flight, no timer, nothing to send)
    /// and its virtual clock moves by itself ([`FabricConfig::auto_advance`]), moves the clock
    /// to the earliest alarm set later than now, and returns the new time; `None` otherwise
    /// (on the wall clock, on a broken fabric, or with nothing to move to).
    ///
    /// [`FabricConfig::auto_advance`]: crate::FabricConfig::auto_advance
    pub fn advance_idle(&self) -> Option<u64> {
        let shared = &self.fabric.shared;
        let mut st = shared.lock()?;
        let w = &st.w;
        if w.cfg.clock == Clock::Wall || !w.cfg.auto_advance || w.on_udp {
            return None;
        }
        if !st.found_quiet {
            st.progress();
        }
        let to = match st.next_event() {
            Some(_) => None,
            None => st.w.alarms.next_after(st.w.now),
        };
        if let Some(t) = to {
            st.w.now = t;
        }
        shared.leave_quiet(&st);
        to
    }
}

impl Drop for Alarm {
    fn drop(&mut self) {
        self.fabric.shared.lock_any().w.alarms.remove(self.id);
    }
}
