//! Progress: the event loop over the fabric state (arrivals, timers, transmissions), the two
//! clocks it runs on, and the background thread that drives it for callers who sleep.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::fabric::{Clock, Fabric, Shared};
use crate::link::udp::Damage;
use crate::link::{Dest, Frame};
use crate::packet::{Packet, WireError};
use crate::state::State;

/// How long the progress thread of a virtual-clock fabric naps when nothing is pending.
const VIRTUAL_NAP: Duration = Duration::from_micros(50);
/// The longest a wall-clock progress thread sleeps before looking again (it is woken earlier
/// by any call that gives it work).
const WALL_NAP: Duration = Duration::from_millis(100);
/// How long after a CQ poll the UDP progress thread leaves the sockets to the pollers.
const POLLED_RECENTLY: Duration = Duration::from_micros(50);
/// The longest the UDP progress thread sleeps while pollers keep polling: it looks again
/// after [`POLLED_RECENTLY`], then twice as late each time it finds them still at it, up to
/// this (a look is a wake-up, and a context switch on a busy machine). A poller that arms a
/// CQ to sleep wakes it at once.
const POLLERS_BUSY_NAP: Duration = Duration::from_millis(1);
/// How long a device's socket, found empty, is left alone (ns of wall time).
const RX_IDLE_NS: u64 = 2_000;
/// How long after the last look at a device's socket a post's round of progress leaves it
/// alone (ns of wall time): a caller that polls looks between its posts (and would otherwise
/// make a system call per post that mostly finds nothing); one that only posts still has
/// what arrives taken in this often.
const POST_RX_GAP_NS: u64 = 20_000;
/// How long the UDP progress thread keeps looking, without sleeping, after a round that did
/// work (the busy polling a NIC's driver does, as Linux's `busy_poll`): traffic comes in
/// bursts, and a thread asleep at the next datagram is a wake-up the sending process pays for
/// (an inter-processor interrupt, a halted core woken) and a delay its window feels. It yields
/// its core between looks.
const STAY_AWAKE: Duration = Duration::from_micros(50);
/// Batches of datagrams a device takes in per round of progress, at least (unless the
/// socket empties first); more while fewer than [`BURST`](crate::link::udp::BURST) packets
/// came in them: a round takes in at least as many packets as a port may send in one, so
/// that a flood of small requests (READs, each answered by many packets) drains as fast as
/// it is answered, not behind a socket's queue of hundreds of milliseconds that every other
/// connection's packets wait in.
const RX_BATCHES: usize = 8;

impl State {
    /// Processes everything due now: arrivals, timers, transmissions, until nothing is left
    /// (a port on the UDP link sends a burst at most, see
    /// [`BURST`](crate::link::udp::BURST); the rest is due again at once).
    pub(crate) fn progress(&mut self) -> bool {
        self.progress_rx(0)
    }

    /// [`progress`](Self::progress) after a post: the sockets of the UDP link are read only
    /// if nobody has looked at them for [`POST_RX_GAP_NS`].
    pub(crate) fn progress_after_post(&mut self) -> bool {
        self.progress_rx(POST_RX_GAP_NS)
    }

    /// Progress, reading the UDP link's sockets unless they were looked at in the last
    /// `rx_gap` ns.
    fn progress_rx(&mut self, rx_gap: u64) -> bool {
        let udp = self.w.on_udp;
        let mut any = udp && self.receive_udp(rx_gap);
        if udp {
            for d in &mut self.w.devices {
                if let Some(port) = d.udp.as_mut() {
                    port.burst_left = crate::link::udp::BURST;
                    d.counters.packets_dropped += port.forget_lent();
                }
            }
        }
        loop {
            let took = self.deliver_due() | self.fire_timers();
            let sent = self.transmit_ready();
            any |= took || sent;
            // What a port sends arrives a wire time later at the soonest, and leaves the port
            // busy as long: unless something came or a timer fired (which may have made
            // something due now), sending made nothing due now. Even then, only a frame or a
            // timer due now is left for another pass: the arrivals and timers taken in this
            // one were taken until none was due, and the ports sent until busy or idle. A
            // frame for the UDP link leaves at once, through the queue of frames in flight if
            // something is due before it: the next pass moves it.
            if !((took && self.arrival_or_timer_by(self.w.now)) || (sent && udp)) {
                break;
            }
        }
        if udp {
            self.flush_udp();
        }
        any
    }

    /// Takes in one batch of datagrams per device on the UDP link and delivers them: the
    /// RoCEv2 ICRC is checked against the addresses they came from and to. A socket looked at
    /// in the last `gap` ns is left alone.
    fn receive_udp(&mut self, gap: u64) -> bool {
        let mut any = false;
        let mut incoming = std::mem::take(&mut self.w.udp_in);
        for dev in 0..self.w.devices.len() {
            let Some(port) = self.w.devices[dev].udp.as_ref() else {
                continue;
            };
            // A socket found empty is not asked again for a moment: a caller polling a CQ in
            // a loop would otherwise make a system call per poll.
            if self.w.now < port.idle_until || self.w.now < port.read_at.saturating_add(gap) {
                continue;
            }
            if let Some(port) = self.w.devices[dev].udp.as_mut() {
                port.read_at = self.w.now;
            }
            // A few batches, and at least a burst's worth of packets (see [`RX_BATCHES`]):
            // what came while nobody looked, without starving the rest. Each is read where it
            // came in, before the next one comes into the same buffers.
            // A batch that was not full emptied the socket: asking again would mostly be a
            // system call that finds nothing (one per look, before).
            let mut got = 0;
            let mut more = true;
            for batch in 0.. {
                let Some(port) = self.w.devices[dev].udp.as_mut() else {
                    break;
                };
                if !more || (batch >= RX_BATCHES && got >= crate::link::udp::BURST as usize) {
                    break;
                }
                let (n, full) = port.receive(&mut incoming);
                if n == 0 {
                    break;
                }
                more = full;
                got += incoming.len();
                let bufs = port.take_rx_bufs();
                for d in &incoming {
                    let damage = match self.w.devices[dev].udp.as_mut() {
                        Some(port) => port.damage(d, &bufs),
                        None => d.damage.or(Some(Damage::BadIcrc)),
                    };
                    let c = &mut self.w.devices[dev].counters;
                    match damage {
                        Some(Damage::Malformed) => c.malformed += 1,
                        Some(Damage::BadIcrc) => c.icrc_errors += 1,
                        None => self.deliver_wire(
                            &Frame {
                                from: dev,
                                to: Dest::Local(dev),
                                sport: d.src.port(),
                                sgid: crate::roce::ipv4_gid(*d.src.ip()),
                                // The bytes are read where they came in (`wire`).
                                bytes: Vec::new(),
                                sealed: false,
                                gather: None,
                                ecn: 0,
                                at: None,
                                mgid: None,
                            },
                            d.bytes(&bufs),
                        ),
                    }
                }
                if let Some(port) = self.w.devices[dev].udp.as_mut() {
                    port.give_rx_bufs(bufs);
                }
            }
            got += self.receive_groups(dev);
            if got == 0 {
                if let Some(port) = self.w.devices[dev].udp.as_mut() {
                    port.idle_until = self.w.now + RX_IDLE_NS;
                }
                continue;
            }
            any = true;
        }
        self.w.udp_in = incoming;
        any
    }

    /// Takes in what the multicast groups device `dev` joined on the UDP link hold, and
    /// delivers each packet once, as sent to the first of the device's groups at its address
    /// (see [`deliver_wire`](Self::deliver_wire) for its members); how many came in.
    fn receive_groups(&mut self, dev: usize) -> usize {
        let Some(port) = self.w.devices[dev]
            .udp
            .as_mut()
            .filter(|p| !p.groups.is_empty())
        else {
            return 0;
        };
        let (mut got, mut buf) = std::mem::take(&mut self.w.group_in);
        port.groups.receive(&mut got, &mut buf);
        for g in &got {
            let d = &mut self.w.devices[dev];
            match g.damage {
                Some(Damage::Malformed) => d.counters.malformed += 1,
                Some(Damage::BadIcrc) => d.counters.icrc_errors += 1,
                None => {
                    let Some(&mgid) = d.groups.at_address(g.ip).first() else {
                        d.counters.messages_dropped += 1;
                        continue;
                    };
                    let frame = Frame {
                        from: dev,
                        to: Dest::Local(dev),
                        sport: g.src.port(),
                        sgid: crate::roce::ipv4_gid(*g.src.ip()),
                        bytes: Vec::new(),
                        sealed: false,
                        gather: None,
                        ecn: 0,
                        at: None,
                        mgid: Some(Box::new(mgid)),
                    };
                    self.deliver_wire(&frame, &buf[g.at..g.at + g.len]);
                }
            }
        }
        let n = got.len();
        self.w.group_in = (got, buf);
        n
    }

    /// Sends what the devices on the UDP link have queued; what the kernel refuses counts
    /// as dropped.
    fn flush_udp(&mut self) {
        let w = &mut self.w;
        for d in &mut w.devices {
            if let Some(port) = d.udp.as_mut().filter(|p| p.has_outgoing()) {
                d.counters.packets_dropped += port.flush(&mut w.spare);
            }
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

    /// Whether an event is pending at or before `t` ([`next_event`](Self::next_event) at or
    /// before it, found without the earliest of all).
    pub(crate) fn due_by(&self, t: u64) -> bool {
        let w = &self.w;
        self.arrival_or_timer_by(t)
            || w.devices
                .iter()
                .any(|d| !d.tx_ready.is_empty() && d.egress_free_at.max(w.now) <= t)
    }

    /// Whether a frame arrives or a timer fires at or before `t`.
    fn arrival_or_timer_by(&self, t: u64) -> bool {
        self.w.net.next_at().is_some_and(|a| a <= t)
            || self.w.timers.first().is_some_and(|(a, _)| a <= t)
    }

    /// The time of the next pending event.
    pub(crate) fn next_event(&self) -> Option<u64> {
        let w = &self.w;
        let mut next = w.net.next_at().unwrap_or(u64::MAX);
        if let Some((t, _)) = w.timers.first() {
            next = next.min(t);
        }
        for d in &w.devices {
            if !d.tx_ready.is_empty() {
                next = next.min(d.egress_free_at.max(w.now));
            }
        }
        (next != u64::MAX).then_some(next)
    }

    fn deliver_due(&mut self) -> bool {
        let mut did = false;
        while let Some((at, frame)) = self.w.net.pop_due(self.w.now) {
            did = true;
            if frame.at.is_some() {
                self.w.forward(at, frame);
                continue;
            }
            match frame.to {
                Dest::Local(_) => {
                    self.deliver(&frame);
                    self.w.spare.give(frame.bytes);
                }
                Dest::Udp(dst) => {
                    // (Its payload is its own: see `World::transmit_udp`.)
                    debug_assert!(frame.gather.is_none(), "a waiting frame borrows memory");
                    if let Some(port) = self.w.devices[frame.from].udp.as_mut() {
                        port.queue(frame.sport, dst, frame.bytes, frame.sealed, None);
                    }
                }
            }
        }
        did
    }

    /// Hands a frame that arrived at its device to the QP it names. A frame that does not
    /// parse (bad ICRC, truncated, unknown opcode) or names no QP is counted and dropped.
    pub(crate) fn deliver(&mut self, frame: &Frame) {
        self.deliver_wire(frame, &frame.bytes);
    }

    /// [`deliver`](Self::deliver) with the frame's bytes in `wire` (its `bytes` not read):
    /// a packet from the UDP link, read where it came in.
    fn deliver_wire(&mut self, frame: &Frame, wire: &[u8]) {
        let Dest::Local(dev) = frame.to else {
            return;
        };
        let mut pkt = Packet::default();
        if let Err(e) = pkt.parse_into(wire, frame.sealed) {
            let c = &mut self.w.devices[dev].counters;
            if e == WireError::BadIcrc {
                c.icrc_errors += 1;
            } else {
                c.malformed += 1;
            }
            return;
        }
        if pkt.hdr.dest_qp == 1 {
            // (CM messages go to one port, never to a group.)
            if frame.mgid.is_none() {
                self.cm_receive(dev, &pkt, frame);
            }
            return;
        }
        if pkt.hdr.dest_qp == crate::mcast::MULTICAST_QPN {
            // A copy to each of the device's QPs in the group (none: not to a group, or to
            // one without a member here). On the UDP link a group is its IPv4 address: the
            // members of every group of the device at that address, each once (two IPv6
            // groups hashed to one address, or one and the IPv4 group of that address, are
            // one group there).
            let d = &self.w.devices[dev];
            let members = match frame.mgid.as_deref() {
                None => Default::default(),
                Some(g) if d.udp.is_some() => d.groups.members_at(crate::mcast::group_ipv4(g)),
                Some(g) => d.groups.members(g),
            };
            if members.is_empty() {
                self.w.devices[dev].counters.messages_dropped += 1;
            }
            for qpn in members {
                if let Some(qp) =
                    (self.w.devices[dev].qpns.get(qpn)).and_then(|id| self.qps.get_mut(&id))
                {
                    qp.receive(&mut self.w, &pkt, frame, wire);
                }
            }
            return;
        }
        let Some(id) = self.w.devices[dev].qpns.get(pkt.hdr.dest_qp) else {
            self.w.devices[dev].counters.messages_dropped += 1;
            return;
        };
        if let Some(g) = &frame.gather
            && self.w.cfg.copy_payload
            && self.qps.get(&g.qp).is_none_or(|q| q.wire_gen != g.wire_gen)
        {
            // Its WR was flushed or dropped since it left (the requester QP failed, was reset
            // or destroyed): the memory is the program's again, and the packet is lost. (Without
            // payload copies nothing is read: it goes on, as a packet with its bytes would.)
            self.w.devices[dev].counters.packets_dropped += 1;
            return;
        }
        if let Some(qp) = self.qps.get_mut(&id) {
            if pkt.hdr.opcode == crate::packet::opcode::CNP {
                qp.count(&mut self.w, |c| {
                    c.packets_received += 1;
                    c.cnps_received += 1;
                });
                return;
            }
            if frame.ecn == crate::link::CE {
                qp.congestion_experienced(&mut self.w, &pkt, frame.from);
            }
            qp.receive(&mut self.w, &pkt, frame, wire);
        }
    }

    fn fire_timers(&mut self) -> bool {
        let mut did = false;
        while let Some((t, id)) = self.w.timers.first() {
            if t > self.w.now {
                break;
            }
            self.w.timers.pop_first();
            did = true;
            if id == crate::cm::CM_TIMER {
                self.cm_timers();
                continue;
            }
            if id == crate::cq::CQ_TIMER {
                self.w.owed_events_due();
                continue;
            }
            if let Some(qp) = self.qps.get_mut(&id) {
                qp.timer_due(&mut self.w, t);
            }
        }
        did
    }

    /// Each port that is free sends one packet of the QP at the front of its ready queue,
    /// which then goes to the back (round-robin). A QP that has nothing to send leaves the
    /// queue, so this always ends; a port on the UDP link stops at its burst for the round
    /// (see [`BURST`](crate::link::udp::BURST)).
    fn transmit_ready(&mut self) -> bool {
        let mut did = false;
        let udp = self.w.on_udp;
        for dev in 0..self.w.devices.len() {
            while self.w.devices[dev].egress_free_at <= self.w.now {
                if udp
                    && self.w.devices[dev]
                        .udp
                        .as_ref()
                        .is_some_and(|p| p.burst_left == 0)
                {
                    break;
                }
                let Some(id) = self.w.devices[dev].tx_ready.pop_front() else {
                    break;
                };
                // A QP destroyed while queued is no longer found.
                let Some(qp) = self.qps.get_mut(&id) else {
                    continue;
                };
                if qp.next_tx(&mut self.w) {
                    self.w.devices[dev].tx_ready.push_back(id);
                    did = true;
                    if let Some(p) = self.w.devices[dev].udp.as_mut().filter(|_| udp) {
                        p.burst_left -= 1;
                    }
                } else {
                    qp.tx_queued = false;
                }
            }
        }
        did
    }
}

impl State {
    /// How long a progress thread with nothing to do may sleep.
    fn nap(&self) -> Duration {
        match self.w.cfg.clock {
            Clock::Virtual => VIRTUAL_NAP,
            Clock::Wall => self
                .next_event()
                .map_or(WALL_NAP, |t| {
                    Duration::from_nanos(t.saturating_sub(self.w.now))
                })
                .min(WALL_NAP),
        }
    }
}

/// Marks the fabric broken by a panic in a progress thread, and says so on standard error.
fn report_panic(shared: &Shared, payload: &(dyn std::any::Any + Send)) {
    let why = crate::fabric::panic_message(payload);
    shared.mark_broken(format!("progress thread panicked: {why}"));
    eprintln!(
        "softnic: the progress thread panicked ({why}); the fabric is broken and every call now fails with EIO"
    );
}

/// Starts the progress thread (named `softnic-udp`) of a fabric on the UDP link. It holds the
/// fabric only while it works and a weak handle while it sleeps in `ppoll` on the devices'
/// sockets and the fabric's waker, so the fabric is freed when its last handle goes (which
/// wakes the thread, and it ends).
pub(crate) fn spawn_udp_progress(shared: &Arc<Shared>) -> std::io::Result<()> {
    let weak = Arc::downgrade(shared);
    let Some(waker) = shared.waker.clone() else {
        return Ok(());
    };
    let spawned = std::thread::Builder::new()
        .name("softnic-udp".into())
        .spawn(move || {
            let mut busy_nap = POLLED_RECENTLY;
            // When a round of this thread last did work.
            let mut worked_at: Option<std::time::Instant> = None;
            loop {
                let Some(shared) = weak.upgrade() else { return };
                // While somebody polls a CQ, their polls take in what arrives and fire the
                // timers: stay out of their way (no wake-up per datagram or verb, not even a
                // look under the lock) until they have not polled for a while.
                // (Woken early when a poller arms a CQ to sleep on its channel.)
                if let Some(since) = shared.since_poll().filter(|&s| s < POLLED_RECENTLY) {
                    // Not a sleeper the verbs must wake: the pollers do the work.
                    shared.sleeper.store(false, Ordering::Release);
                    drop(shared);
                    let nap = (POLLED_RECENTLY - since).max(busy_nap);
                    busy_nap = (busy_nap * 2).min(POLLERS_BUSY_NAP);
                    crate::link::udp::wait_readable(&[waker.raw()], nap);
                    if waker.drain() {
                        // Woken (a poller armed a CQ to sleep; its last polls may still
                        // look recent): look again soon, not after the long nap.
                        busy_nap = POLLED_RECENTLY;
                    }
                    continue;
                }
                busy_nap = POLLED_RECENTLY;
                // Staying awake after work: looking again at once, not a sleeper to wake (the
                // verbs meanwhile write no wake-up).
                let awake = worked_at.is_some_and(|t| t.elapsed() < STAY_AWAKE);
                let round = catch_unwind(AssertUnwindSafe(|| {
                    let mut st = shared.lock()?;
                    shared.sleeper.store(false, Ordering::Release);
                    if st.progress() {
                        return Some((Duration::ZERO, None));
                    }
                    // Said under the lock, before the look that precedes the sleep: a verb
                    // after it wakes the thread.
                    shared.sleeper.store(!awake, Ordering::Release);
                    // To sleep on: the group sockets as they are now (joins and leaves wake
                    // it).
                    Some((st.nap(), (!awake).then(|| shared.sleep_fds(&st))))
                }));
                let (nap, fds) = match round {
                    Ok(Some(r)) => r,
                    Ok(None) => return,
                    Err(payload) => {
                        report_panic(&shared, payload.as_ref());
                        return;
                    }
                };
                if nap.is_zero() {
                    // Whoever waited for the lock meanwhile has it before the next round.
                    shared.let_waiters_in();
                    worked_at = Some(std::time::Instant::now());
                    continue;
                }
                drop(shared);
                if let Some(fds) = fds {
                    crate::link::udp::wait_readable(&fds, nap);
                    let _ = waker.drain();
                } else {
                    std::thread::yield_now();
                }
            }
        });
    spawned.map(drop)
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
                        // Whoever waited for the lock meanwhile has it before the next round.
                        Ok(true) => fabric.shared.let_waiters_in(),
                        Ok(false) => return,
                        Err(payload) => {
                            report_panic(&fabric.shared, payload.as_ref());
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
        let nap = st.nap();
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
