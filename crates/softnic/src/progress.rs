//! Progress: the event loop over the fabric state (arrivals, timers, transmissions), the two
//! clocks it runs on, and the background thread that drives it for callers who sleep.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::fabric::{Clock, Fabric, Shared};
use crate::net::Frame;
use crate::packet::{Packet, WireError};
use crate::state::State;

/// How long the progress thread of a virtual-clock fabric naps when nothing is pending.
const VIRTUAL_NAP: Duration = Duration::from_micros(50);
/// The longest a wall-clock progress thread sleeps before looking again (it is woken earlier
/// by any call that gives it work).
const WALL_NAP: Duration = Duration::from_millis(100);

impl State {
    /// Processes everything due now: arrivals, timers, transmissions, until nothing is left.
    pub(crate) fn progress(&mut self) -> bool {
        let mut any = false;
        loop {
            let mut did = self.deliver_due();
            did |= self.fire_timers();
            did |= self.transmit_ready();
            if !did {
                return any;
            }
            any = true;
        }
    }

    /// Moves the clock to the real time elapsed since the fabric started (wall-clock mode;
    /// the clock never runs ahead of it, and never back).
    pub(crate) fn sync_clock(&mut self) {
        if self.w.cfg.clock == Clock::Wall {
            let real = self.w.started.elapsed().as_nanos() as u64;
            self.w.now = self.w.now.max(real);
        }
    }

    /// Virtual clock: moves it to the next pending event and processes it. False if nothing is
    /// pending, and always false on the wall clock (time is not ours to move).
    pub(crate) fn warp(&mut self) -> bool {
        if self.w.cfg.clock == Clock::Wall {
            return false;
        }
        match self.next_event() {
            Some(t) => {
                self.w.now = self.w.now.max(t);
                self.progress();
                true
            }
            None => false,
        }
    }

    /// The time of the next pending event.
    pub(crate) fn next_event(&self) -> Option<u64> {
        let w = &self.w;
        let ports = w
            .devices
            .iter()
            .filter(|d| !d.tx_ready.is_empty())
            .map(|d| d.egress_free_at.max(w.now));
        [w.net.next_at(), w.timers.first().map(|&(t, _)| t)]
            .into_iter()
            .flatten()
            .chain(ports)
            .min()
    }

    fn deliver_due(&mut self) -> bool {
        let mut did = false;
        while let Some(frame) = self.w.net.pop_due(self.w.now) {
            did = true;
            self.deliver(&frame);
        }
        did
    }

    /// Hands a frame that arrived at its device to the QP it names. A frame that does not
    /// parse (bad ICRC, truncated, unknown opcode) or names no QP is counted and dropped.
    pub(crate) fn deliver(&mut self, frame: &Frame) {
        let dev = frame.to;
        let pkt = match Packet::parse_with(&frame.bytes, frame.sealed) {
            Ok(p) => p,
            Err(e) => {
                let c = &mut self.w.devices[dev].counters;
                if e == WireError::BadIcrc {
                    c.icrc_errors += 1;
                } else {
                    c.malformed += 1;
                }
                return;
            }
        };
        let Some(&id) = self.w.devices[dev].qpns.get(&pkt.hdr.dest_qp) else {
            self.w.devices[dev].counters.messages_dropped += 1;
            return;
        };
        if let Some(qp) = self.qps.get_mut(&id) {
            qp.receive(&mut self.w, &pkt, frame);
        }
    }

    fn fire_timers(&mut self) -> bool {
        let mut did = false;
        while let Some(&(t, id)) = self.w.timers.first() {
            if t > self.w.now {
                break;
            }
            self.w.timers.pop_first();
            did = true;
            if let Some(qp) = self.qps.get_mut(&id)
                && qp.req.timer == Some(t)
            {
                qp.on_timer(&mut self.w);
            }
        }
        did
    }

    /// Each port that is free sends one packet of the next ready QP (round-robin). A QP that
    /// has nothing to send leaves the ready set, so this always ends.
    fn transmit_ready(&mut self) -> bool {
        let mut did = false;
        for dev in 0..self.w.devices.len() {
            while self.w.devices[dev].egress_free_at <= self.w.now {
                let d = &self.w.devices[dev];
                let Some(id) = d
                    .tx_ready
                    .range(d.tx_last.saturating_add(1)..)
                    .next()
                    .or_else(|| d.tx_ready.first())
                    .copied()
                else {
                    break;
                };
                let sent = self
                    .qps
                    .get_mut(&id)
                    .is_some_and(|qp| qp.next_tx(&mut self.w));
                let d = &mut self.w.devices[dev];
                if sent {
                    d.tx_last = id;
                    did = true;
                } else {
                    d.tx_ready.remove(&id);
                }
            }
        }
        did
    }
}

impl Fabric {
    /// Starts a thread (named `softnic-progress`) that drives this fabric for callers that
    /// sleep on a completion channel with nobody else polling; it stops when the handle is
    /// dropped.
    ///
    /// On the wall clock ([`Clock::Wall`]) it sleeps until the next pending event (retransmission
    /// timer, packet arrival) or until a call gives it work, and never moves time itself. On the
    /// virtual clock it moves time to each pending event as soon as it is idle, so runs are no
    /// longer deterministic while it is on.
    ///
    /// A panic inside it (a softnic bug, or a panicking [`PacketFilter`](crate::PacketFilter))
    /// breaks the fabric: it is reported on standard error and by [`Fabric::broken`], and every
    /// later call fails with EIO.
    pub fn spawn_progress_thread(&self) -> ProgressThread {
        let stop = Arc::new(AtomicBool::new(false));
        let fabric = self.clone();
        let flag = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("softnic-progress".into())
            .spawn(move || {
                while !flag.load(Ordering::Acquire) {
                    match catch_unwind(AssertUnwindSafe(|| fabric.progress_and_nap(&flag))) {
                        Ok(true) => {}
                        Ok(false) => return,
                        Err(payload) => {
                            let why = crate::fabric::panic_message(payload.as_ref());
                            fabric.shared.mark_broken(format!("progress thread panicked: {why}"));
                            eprintln!(
                                "softnic: the progress thread panicked ({why}); the fabric is broken and every call now fails with EIO"
                            );
                            return;
                        }
                    }
                }
            })
            .expect("spawning the softnic progress thread");
        ProgressThread {
            stop,
            shared: Arc::clone(&self.shared),
            handle: Some(handle),
        }
    }

    /// One round of the progress thread: progress, then sleep until there is more to do.
    /// False once the fabric is broken.
    fn progress_and_nap(&self, stop: &AtomicBool) -> bool {
        let Some(mut st) = self.shared.lock() else {
            return false;
        };
        let busy = st.progress() || st.warp();
        if busy {
            return true;
        }
        let nap = match st.w.cfg.clock {
            Clock::Virtual => VIRTUAL_NAP,
            Clock::Wall => st
                .next_event()
                .map_or(WALL_NAP, |t| {
                    Duration::from_nanos(t.saturating_sub(st.w.now))
                })
                .min(WALL_NAP),
        };
        if stop.load(Ordering::Acquire) {
            return true;
        }
        self.shared.sleeper.store(true, Ordering::Release);
        let st = self.shared.nap(st, nap);
        self.shared.sleeper.store(false, Ordering::Release);
        drop(st);
        true
    }
}

/// The background progress of [`Fabric::spawn_progress_thread`]; stops when dropped.
pub struct ProgressThread {
    stop: Arc<AtomicBool>,
    shared: Arc<Shared>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for ProgressThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProgressThread").finish_non_exhaustive()
    }
}

impl Drop for ProgressThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.shared.kick();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
