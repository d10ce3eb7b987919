//! Connection set-up that never blocks the engine: every TCP handshake in flight is a state
//! machine ([`Attempt`]) on a non-blocking socket, driven by [`Engine::poll`] (every
//! `DIAL_EVERY` rounds, one `epoll_wait` of no timeout for all of them), with one deadline
//! for the whole handshake ([`EngineConfig::handshake_timeout_ms`](crate::EngineConfig)).
//!
//! - [`Engine::connect`] returns at once with a [`Connecting`] handle; the attempt connects
//!   (each resolved address in turn), sends this end's handshake, reads the peer's, connects
//!   the QPs, then exchanges a ready byte so that neither end sends before the other's QPs
//!   can receive.
//! - [`Engine::accept`] takes one connection of a listener the caller keeps;
//!   [`Engine::accept_stream`] one the caller accepted itself (and [`Engine::peer_spoke`]
//!   tells whether its client sent its handshake); [`Engine::abandon`] gives up any of these;
//!   [`Engine::listen`] hands a listener to the engine, which accepts while it runs (at most
//!   `MAX_INCOMING` handshakes at once; the kernel's backlog holds the rest), and
//!   [`Engine::incoming`] hands out the connections it set up, in order. An accepting end
//!   reads the peer's handshake before it creates any QP, so a client that sends nothing, too
//!   little or garbage costs it a socket until the deadline and nothing else.
//! - A handshake fails alone, with a precise reason: refused, timed out (at which step, with
//!   how many bytes), the peer closed (at which step), not a uccl-rs engine, another version,
//!   a mismatched configuration. A failed incoming handshake fails no handle:
//!   [`Engine::incoming_failures`] tells what became of it.

use std::collections::VecDeque;
use std::io::ErrorKind;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

use crate::engine::{ConnId, Engine};
use crate::error::{EngineError, Result};
use crate::request::{Connecting, Request};

mod handshake;

use handshake::{Attempt, Progress, Step, Target};

/// Rounds between two looks at the sockets.
pub(crate) const DIAL_EVERY: u32 = 16;
/// An idle engine with sockets to look at looks this often (ns of its clock).
pub(crate) const DIAL_PERIOD_NS: u64 = 100_000;
/// Connections whose QPs are created or connected per look. That control-path work runs on
/// the engine's thread, between its rounds (creating a connection's QPs and connecting them
/// costs a softnic engine tens of microseconds, a hardware one a few system calls); while the
/// engine also moves data, set-ups take at most `SETUP_SHARE` of its time, so that many
/// arriving together take turns with the data path rather than stall it.
const SETUPS_PER_LOOK: u32 = 2;
/// The share of its time (1/n) an engine that moves data gives set-ups.
pub(super) const SETUP_SHARE: u32 = 5;
/// The longest a set-up step counts for its successor's turn. Creating and connecting a
/// connection's QPs takes tens of microseconds on softnic, and on hardware about a
/// millisecond, tens with hundreds of QPs a connection; a step that took longer than this had
/// its thread descheduled, and five times that would hold every set-up back for seconds while
/// data moves.
const SETUP_STEP_MAX: Duration = Duration::from_millis(50);
/// Incoming handshakes a listener has in flight at once.
const MAX_INCOMING: usize = 64;
/// How long a listener's handshake may wait on its client before, with [`MAX_INCOMING`] in
/// flight, a newer client takes its slot (an honest client answers in milliseconds; one that
/// connects and says nothing would otherwise keep others out until its timeout).
const STALLED: Duration = Duration::from_secs(1);
/// How long a listener whose `accept` failed for want of descriptors or memory waits before it
/// tries again (each try that fails costs a system call, and the failure is said once).
const ACCEPT_AGAIN: Duration = Duration::from_millis(10);
/// Failed incoming handshakes kept for [`Engine::incoming_failures`].
const FAILURES_KEPT: usize = 64;
/// The token of the engine's listener; one-shot listeners count down from it.
const LISTENER: usize = usize::MAX;

/// The engine's handshakes in flight and its listeners.
#[derive(Default)]
pub(crate) struct Dials {
    /// Created with the first socket.
    poll: Option<(Poll, Events)>,
    attempts: Vec<Option<Attempt>>,
    live: usize,
    listener: Option<TcpListener>,
    /// The listener has connections waiting that were not taken (too many in flight).
    backlogged: bool,
    /// `accept` failed leaving its connection queued (out of descriptors or memory): when to
    /// try again.
    accept_again: Option<Instant>,
    /// One-shot accepts: a duplicate of the caller's listener, and who gets the connection.
    once: Vec<Option<(TcpListener, Connecting)>>,
    /// Connections the listener set up, and handles waiting for one.
    ready: VecDeque<ConnId>,
    waiting: VecDeque<Connecting>,
    failures: VecDeque<EngineError>,
    /// Set-up steps left this look, and attempts waiting for the next.
    budget: u32,
    parked: VecDeque<usize>,
    /// The engine moved data in the round before this look, and when the next set-up step
    /// may run then.
    data_busy: bool,
    next_setup: Option<Instant>,
}

impl Dials {
    /// Whether any socket needs looking at.
    pub(crate) fn active(&self) -> bool {
        self.live > 0 || self.listener.is_some() || self.once.iter().any(Option::is_some)
    }

    /// Whether set-ups wait for their turn (the engine should come back soon).
    pub(crate) fn waiting(&self) -> bool {
        !self.parked.is_empty()
    }

    /// A set-up step that began at `began` took `took`: while data moves, the next waits
    /// `SETUP_SHARE` times as long, counting at most [`SETUP_STEP_MAX`] (a step that took
    /// longer was descheduled, not slow).
    pub(crate) fn setup_took(&mut self, began: Instant, took: Duration) {
        self.next_setup = Some(began + took.min(SETUP_STEP_MAX) * SETUP_SHARE);
    }

    fn poll(&mut self) -> Result<&Poll> {
        if self.poll.is_none() {
            let p = Poll::new().map_err(|e| io_err("a socket poller", "creating it", e))?;
            self.poll = Some((p, Events::with_capacity(256)));
        }
        Ok(&self.poll.as_ref().expect("created").0)
    }

    /// Registers `a` and keeps it; returns its slot, which is its token.
    fn add(&mut self, mut a: Attempt) -> Result<usize> {
        let slot = match self.attempts.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.attempts.push(None);
                self.attempts.len() - 1
            }
        };
        let interest = Interest::READABLE | Interest::WRITABLE;
        self.poll()?
            .registry()
            .register(&mut a.stream, Token(slot), interest)
            .map_err(|e| io_err(&a.peer.to_string(), "registering the socket", e))?;
        self.attempts[slot] = Some(a);
        self.live += 1;
        Ok(slot)
    }

    fn remove(&mut self, slot: usize) -> Option<Attempt> {
        let mut a = self.attempts.get_mut(slot)?.take()?;
        self.live -= 1;
        if a.parked {
            // Not stepped for an attempt that ended (nor for the next in its slot): with
            // none left, a parked one would keep the engine from ever being idle.
            self.parked.retain(|&s| s != slot);
        }
        if let Some((p, _)) = &self.poll {
            let _ = p.registry().deregister(&mut a.stream);
        }
        Some(a)
    }

    fn failed_incoming(&mut self, e: EngineError) {
        if self.failures.len() == FAILURES_KEPT {
            self.failures.pop_front();
        }
        self.failures.push_back(e);
    }

    /// Hands out connections the listener set up to the handles waiting for them.
    fn match_incoming(&mut self) {
        while !self.ready.is_empty() && !self.waiting.is_empty() {
            let c = self.ready.pop_front().expect("checked");
            self.waiting.pop_front().expect("checked").finish(Ok(c));
        }
    }
}

/// Whether `accept` failed for the connection it was taking, not for the listener (the
/// connection is gone from the queue, and the next may do): its client went away before it
/// was accepted (ECONNABORTED, ECONNRESET), or a network error was pending on it, which Linux
/// reports from `accept` (accept(2): to be treated as EAGAIN). Not EMFILE and the like, nor a
/// security module's EPERM: those leave the connection queued, and taking it again at once
/// would fail again.
pub fn client_gone(e: &std::io::Error) -> bool {
    use ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionAborted
            | ConnectionReset
            | HostUnreachable
            | NetworkUnreachable
            | NetworkDown
            | TimedOut
    ) || e.raw_os_error().is_some_and(|n| {
        [
            libc::EPROTO,
            libc::ENOPROTOOPT,
            libc::EHOSTDOWN,
            libc::ENONET,
            libc::EOPNOTSUPP,
        ]
        .contains(&n)
    })
}

fn io_err(peer: &str, what: &str, e: std::io::Error) -> EngineError {
    EngineError::Handshake {
        peer: peer.into(),
        reason: format!("{what}: {e}"),
    }
}

impl Engine {
    /// Connects to the engine listening at `addr` (see [`accept`](Self::accept) and
    /// [`listen`](Self::listen)): the handshakes go over a TCP connection, closed afterwards.
    /// Returns at once (resolving a host name may block: pass an address to never block);
    /// the handle completes, as the engine polls, with the connection or with why not:
    /// refused, timed out (at which step), the peer closed, another version or mode.
    pub fn connect(&mut self, addr: impl ToSocketAddrs) -> Result<Connecting> {
        self.unsettle();
        let mut addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| io_err("the listener", "resolving the address", e))?
            .collect();
        if addrs.is_empty() {
            let e = std::io::Error::from(ErrorKind::NotFound);
            return Err(io_err("the listener", "resolving the address", e));
        }
        addrs.reverse();
        let first = addrs.pop().expect("checked");
        let req = Request::of_engine(&self.owner, None);
        let stream = TcpStream::connect(first)
            .map_err(|e| io_err(&first.to_string(), &format!("connecting to {first}"), e))?;
        let mut a = Attempt::new(stream, first, Target::Handle(req.clone()));
        (a.connector, a.rest, a.step) = (true, addrs, Step::Connecting);
        self.dials.add(a)?;
        Ok(req)
    }

    /// Accepts one connection on `listener` (which the caller keeps: the engine holds a
    /// duplicate of it until a client connects) from an engine calling
    /// [`connect`](Self::connect). Returns at once; the handle completes as the engine polls,
    /// with the connection or with why that client's handshake failed.
    pub fn accept(&mut self, listener: &std::net::TcpListener) -> Result<Connecting> {
        self.unsettle();
        let dup = listener
            .try_clone()
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| io_err("a connecting engine", "taking the listener", e))?;
        let mut l = TcpListener::from_std(dup);
        let slot = match self.dials.once.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.dials.once.push(None);
                self.dials.once.len() - 1
            }
        };
        self.dials
            .poll()?
            .registry()
            .register(&mut l, Token(LISTENER - 1 - slot), Interest::READABLE)
            .map_err(|e| io_err("a connecting engine", "registering the listener", e))?;
        let req = Request::of_engine(&self.owner, None);
        self.dials.once[slot] = Some((l, req.clone()));
        // A client may be waiting already (no readiness event would come for it).
        self.take_once(slot)?;
        Ok(req)
    }

    /// Sets up a connection on `stream`, a TCP connection the caller accepted itself (from a
    /// listener of its own, when it chose to) from `peer` (as `accept` returned it), with an
    /// engine calling [`connect`](Self::connect) at the other end. Returns at once; the handle
    /// completes as the engine polls, with the connection or with why that handshake failed
    /// (a peer that reset the connection before it was accepted fails it there). Several may
    /// run at once: a client that sends nothing holds only its own, until the handshake
    /// timeout or until the caller [`abandon`](Self::abandon)s it. An error only if the engine
    /// cannot take the socket.
    pub fn accept_stream(
        &mut self,
        stream: std::net::TcpStream,
        peer: SocketAddr,
    ) -> Result<Connecting> {
        self.unsettle();
        stream
            .set_nonblocking(true)
            .map_err(|e| io_err(&peer.to_string(), "taking the connection", e))?;
        let req = Request::of_engine(&self.owner, None);
        self.start_incoming(
            TcpStream::from_std(stream),
            peer,
            Target::Handle(req.clone()),
        )?;
        Ok(req)
    }

    /// Gives up the set-up `setup` stands for ([`connect`](Self::connect),
    /// [`accept`](Self::accept), [`accept_stream`](Self::accept_stream),
    /// [`incoming`](Self::incoming)) if it has not completed: its handshake ends (its socket
    /// closes, and the connection it made, if any, is withdrawn or closed: the peer's
    /// handshake fails, or, if this end's ready byte had gone, completes, and the peer is
    /// then told over the control QP that the connection is closed), a one-shot accept stops
    /// listening, a handle waiting for the listener's next connection stops waiting (that
    /// connection goes to the next). The handle fails with [`EngineError::Cancelled`].
    /// Whether it was in flight: a handle that completed, or another engine's, is left as it
    /// is.
    pub fn abandon(&mut self, setup: &Connecting) -> bool {
        self.unsettle();
        if setup.is_done() || setup.engine() != self.id {
            return false;
        }
        let this = |t: &Target| matches!(t, Target::Handle(r) if r.same(setup));
        let d = &mut self.dials;
        if let Some(slot) =
            (d.attempts.iter()).position(|a| a.as_ref().is_some_and(|a| this(&a.target)))
        {
            self.end_attempt(slot, Progress::Failed(EngineError::Cancelled));
        } else if let Some(slot) =
            (d.once.iter()).position(|o| o.as_ref().is_some_and(|(_, r)| r.same(setup)))
        {
            let (mut l, req) = d.once[slot].take().expect("found");
            if let Some((p, _)) = &d.poll {
                let _ = p.registry().deregister(&mut l);
            }
            req.fail(EngineError::Cancelled);
        } else if let Some(i) = d.waiting.iter().position(|r| r.same(setup)) {
            d.waiting
                .remove(i)
                .expect("found")
                .fail(EngineError::Cancelled);
        } else {
            return false;
        }
        true
    }

    /// Whether the peer of `setup`, a set-up in flight on this engine, has sent its whole
    /// handshake (well formed so far: what it asks for is checked in the next steps). An
    /// accepting end's peer that has not, long after it connected, is likely no engine at all
    /// (a port scan, a stranger: see [`abandon`](Self::abandon)); one that has is most likely
    /// an engine, perhaps a busy one. False for a set-up not in flight here (completed,
    /// waiting for a client to connect, or another engine's).
    pub fn peer_spoke(&self, setup: &Connecting) -> bool {
        (self.dials.attempts.iter().flatten())
            .any(|a| matches!(&a.target, Target::Handle(r) if r.same(setup)) && a.heard())
    }

    /// Hands `listener` to the engine, which accepts connections on it while it runs (see
    /// [`incoming`](Self::incoming)); replaces a listener handed over before. At most 64
    /// handshakes are in flight at once; with 64 in flight, one whose client has not sent its
    /// handshake for a second makes room for the next client (it fails, see
    /// [`incoming_failures`](Self::incoming_failures)). A process out of descriptors or
    /// memory cannot accept: the engine reports that once (see `incoming_failures`) and tries
    /// again every 10 ms at most, and the waiting clients are set up once it can.
    pub fn listen(&mut self, listener: std::net::TcpListener) -> Result<()> {
        self.unsettle();
        listener
            .set_nonblocking(true)
            .map_err(|e| io_err("a connecting engine", "taking the listener", e))?;
        let mut l = TcpListener::from_std(listener);
        self.dials
            .poll()?
            .registry()
            .register(&mut l, Token(LISTENER), Interest::READABLE)
            .map_err(|e| io_err("a connecting engine", "registering the listener", e))?;
        if let Some(mut old) = self.dials.listener.replace(l)
            && let Some((p, _)) = &self.dials.poll
        {
            let _ = p.registry().deregister(&mut old);
        }
        (self.dials.backlogged, self.dials.accept_again) = (true, None);
        Ok(())
    }

    /// The next connection set up on the listener handed over with [`listen`](Self::listen),
    /// in order: one that is ready, or a handle that completes with the next. An error if no
    /// listener was handed over.
    pub fn incoming(&mut self) -> Result<Connecting> {
        self.unsettle();
        if self.dials.listener.is_none() {
            return Err(EngineError::Handshake {
                peer: "a connecting engine".into(),
                reason: "no listener: hand one to the engine with Engine::listen first".into(),
            });
        }
        let req = Request::of_engine(&self.owner, None);
        self.dials.waiting.push_back(req.clone());
        self.dials.match_incoming();
        Ok(req)
    }

    /// Why incoming handshakes on the engine's listener failed since the last call (the last
    /// 64 at most), oldest first; also why the listener could not accept (once for a run of
    /// failures that leave the connection queued, such as EMFILE).
    pub fn incoming_failures(&mut self) -> Vec<EngineError> {
        self.unsettle();
        self.dials.failures.drain(..).collect()
    }

    /// Handshakes in flight (outgoing and incoming).
    pub fn handshakes(&self) -> usize {
        self.dials.live
    }

    /// Looks at every socket that has something for it, and fails the handshakes past their
    /// deadline. Called by [`poll`](Self::poll) every `DIAL_EVERY` rounds while any is active;
    /// `data_busy`: that round moved data.
    pub(crate) fn drive_dials(&mut self, data_busy: bool) -> Result<()> {
        self.dials.budget = SETUPS_PER_LOOK;
        self.dials.data_busy = data_busy;
        // Those parked before this look, once each: one whose turn has not come parks again
        // (stepping it again now would spin until its turn).
        for _ in 0..self.dials.parked.len() {
            if self.dials.budget == 0 {
                break;
            }
            let Some(slot) = self.dials.parked.pop_front() else {
                break;
            };
            if let Some(a) = self.dials.attempts.get_mut(slot).and_then(Option::as_mut) {
                a.parked = false;
                self.step_attempt(slot);
            }
        }
        let Some((poll, events)) = self.dials.poll.as_mut() else {
            return Ok(());
        };
        if let Err(e) = poll.poll(events, Some(Duration::ZERO))
            && e.kind() != ErrorKind::Interrupted
        {
            return Err(io_err("the sockets", "polling", e));
        }
        let tokens: Vec<usize> = events.iter().map(|e| e.token().0).collect();
        for t in tokens {
            if t == LISTENER {
                self.dials.backlogged = true;
            } else if t >= LISTENER - self.dials.once.len() {
                self.take_once(LISTENER - 1 - t)?;
            } else {
                self.step_attempt(t);
            }
        }
        if self.dials.backlogged {
            self.take_incoming()?;
        }
        let limit = Duration::from_millis(self.cfg.handshake_timeout_ms);
        let late: Vec<usize> = (self.dials.attempts.iter().enumerate())
            .filter(|(_, a)| a.as_ref().is_some_and(|a| a.started.elapsed() > limit))
            .map(|(i, _)| i)
            .collect();
        for slot in late {
            let a = self.dials.attempts[slot].as_ref().expect("late");
            let (got, want) = match a.step {
                Step::ReadHello => (a.hello.len(), a.want),
                Step::ReadReady => (0, 1),
                _ => (a.sent, a.out.len()),
            };
            let bytes = match a.step {
                Step::Connecting => String::new(),
                _ => format!(" ({got} of {want} bytes)"),
            };
            let reason = format!(
                "timed out after {} ms {}{bytes}",
                limit.as_millis(),
                a.step.doing()
            );
            self.end_attempt(slot, Progress::Failed(self.handshake_err(slot, reason)));
        }
        Ok(())
    }

    /// Accepts from the engine's listener while it has room for more handshakes.
    fn take_incoming(&mut self) -> Result<()> {
        let incoming = |d: &crate::dial::Dials| {
            (d.attempts.iter().flatten())
                .filter(|a| matches!(a.target, Target::Listener))
                .count()
        };
        if self.dials.accept_again.is_some_and(|t| Instant::now() < t) {
            return Ok(());
        }
        // Clients gone before they were accepted, taken from the queue this look (a look takes
        // a backlog's worth at most, then comes back).
        let mut gone = 0;
        loop {
            // Full: a newer client may take the slot of one that has said nothing for a while
            // (once it is accepted: with nobody waiting, nobody is pushed out).
            let full = incoming(&self.dials) >= MAX_INCOMING;
            if full && self.stalled_incoming().is_none() {
                self.dials.backlogged = true;
                return Ok(());
            }
            let Some(l) = &self.dials.listener else {
                return Ok(());
            };
            match l.accept() {
                Ok((stream, peer)) => {
                    self.dials.accept_again = None;
                    if full {
                        self.push_out_stalled();
                    }
                    self.start_incoming(stream, peer, Target::Listener)?
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    (self.dials.backlogged, self.dials.accept_again) = (false, None);
                    return Ok(());
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if client_gone(&e) => {
                    // That client fails; the next may be waiting behind it.
                    self.incoming_failed(io_err("a connecting engine", "accepting", e));
                    gone += 1;
                    if gone == MAX_INCOMING {
                        return Ok(());
                    }
                }
                Err(e) => {
                    // Out of descriptors or memory (or refused by a security module): the
                    // connection stays queued. Said once; tried again after a while.
                    if self.dials.accept_again.is_none() {
                        tracing::warn!(error = %e, "the listener cannot accept");
                        self.incoming_failed(io_err("a connecting engine", "accepting", e));
                    }
                    self.dials.accept_again = Some(Instant::now() + ACCEPT_AGAIN);
                    return Ok(());
                }
            }
        }
    }

    /// A connection to the engine's listener failed (its accept or its handshake): counted
    /// and kept for [`incoming_failures`](Self::incoming_failures).
    pub(crate) fn incoming_failed(&mut self, e: EngineError) {
        self.stats.handshakes_failed += 1;
        self.dials.failed_incoming(e);
    }

    /// Accepts one connection for one-shot accept `slot`, if one is waiting.
    fn take_once(&mut self, slot: usize) -> Result<()> {
        let Some((l, _)) = self.dials.once.get(slot).and_then(Option::as_ref) else {
            return Ok(());
        };
        let accepted = loop {
            match l.accept() {
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                // A client gone before it was accepted is not the caller's: the next is.
                Err(e) if e.kind() == ErrorKind::Interrupted || client_gone(&e) => {}
                other => break other,
            }
        };
        let (mut l, req) = self.dials.once[slot].take().expect("checked");
        if let Some((p, _)) = &self.dials.poll {
            let _ = p.registry().deregister(&mut l);
        }
        match accepted {
            Ok((stream, peer)) => self.start_incoming(stream, peer, Target::Handle(req)),
            Err(e) => {
                req.fail(io_err("a connecting engine", "accepting", e));
                Ok(())
            }
        }
    }

    /// An accepted client: its handshake starts with reading the peer's.
    fn start_incoming(
        &mut self,
        stream: TcpStream,
        peer: SocketAddr,
        target: Target,
    ) -> Result<()> {
        let _ = stream.set_nodelay(true);
        // An IPv4 client of a dual-stack listener named as IPv4 (not ::ffff:a.b.c.d).
        let peer = SocketAddr::new(peer.ip().to_canonical(), peer.port());
        let slot = self.dials.add(Attempt::new(stream, peer, target))?;
        // Its first bytes may be in already (no readiness event would come for them).
        self.step_attempt(slot);
        Ok(())
    }

    /// With [`MAX_INCOMING`] handshakes of the listener in flight: ends the one that has
    /// waited longest for its client's handshake, if that has been [`STALLED`] at least, so
    /// that a newer client may have its slot. Whether one ended. (A client that sent its
    /// handshake and is slow to be ready may be an honest one whose engine is busy: it keeps
    /// its slot until the handshake timeout.)
    fn push_out_stalled(&mut self) -> bool {
        let Some((slot, waited, step)) = self.stalled_incoming() else {
            return false;
        };
        let reason = format!(
            "pushed out for a newer client after {} ms {}, with {MAX_INCOMING} handshakes in \
             flight",
            waited.as_millis(),
            step.doing()
        );
        self.end_attempt(slot, Progress::Failed(self.handshake_err(slot, reason)));
        true
    }

    /// The listener's handshake that has waited longest for its client's, if that has been
    /// [`STALLED`] at least: its slot, how long, and its step.
    fn stalled_incoming(&self) -> Option<(usize, Duration, Step)> {
        let waiting = |a: &Attempt| matches!(a.target, Target::Listener) && !a.heard();
        (self.dials.attempts.iter().enumerate())
            .filter_map(|(i, a)| a.as_ref().filter(|a| waiting(a)).map(|a| (i, a)))
            .min_by_key(|(_, a)| a.started)
            .map(|(i, a)| (i, a.started.elapsed(), a.step))
            .filter(|&(_, waited, _)| waited >= STALLED)
    }

    fn handshake_err(&self, slot: usize, reason: String) -> EngineError {
        let peer = self.dials.attempts[slot]
            .as_ref()
            .map_or("peer".into(), |a| a.peer.to_string());
        EngineError::Handshake { peer, reason }
    }
}

#[cfg(test)]
mod tests;
