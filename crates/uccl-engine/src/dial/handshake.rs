//! One connection set-up over TCP as a state machine on a non-blocking socket: connect (a
//! connector, each address in turn), the two handshakes, the QPs connected, the ready bytes.
//! Each step goes as far as the socket lets it and returns; the engine comes back when the
//! socket is ready again (see `dial.rs`).

use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::time::Instant;

use mio::net::TcpStream;
use mio::{Interest, Token};

use super::io_err;
use crate::engine::{ConnId, Engine};
use crate::error::EngineError;
use crate::proto::{HELLO_FIXED_LEN, Hello};
use crate::request::Connecting;

/// What an attempt is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    Connecting,
    ReadHello,
    SendHello,
    /// Waiting to create the connection's QPs (at most `SETUPS_PER_LOOK` per look).
    Offer,
    /// Waiting to connect the QPs to the peer's.
    Complete,
    SendReady,
    ReadReady,
}

impl Step {
    pub(super) fn doing(self) -> &'static str {
        match self {
            Step::Connecting => "connecting",
            Step::ReadHello => "reading the peer's handshake",
            Step::SendHello => "sending the handshake",
            Step::Offer => "creating the connection's QPs",
            Step::Complete => "connecting the QPs",
            Step::SendReady => "sending the ready byte",
            Step::ReadReady => "waiting for the peer to be ready",
        }
    }
}

/// Who learns how an attempt ended.
pub(super) enum Target {
    Handle(Connecting),
    /// The engine's listener: [`Engine::incoming`].
    Listener,
}

/// One handshake in flight.
pub(super) struct Attempt {
    pub(super) stream: TcpStream,
    pub(super) peer: SocketAddr,
    pub(super) connector: bool,
    /// Addresses still to try (a connector).
    pub(super) rest: Vec<SocketAddr>,
    pub(super) step: Step,
    /// The peer's handshake as read so far (and its length, once its fixed part is in).
    pub(super) hello: Vec<u8>,
    pub(super) want: usize,
    /// What is being sent, and how much of it went.
    pub(super) out: Vec<u8>,
    pub(super) sent: usize,
    /// The connection offered (QPs created), then connected.
    pub(super) offer: Option<ConnId>,
    pub(super) conn: Option<ConnId>,
    pub(super) started: Instant,
    /// Waiting in `Dials::parked` for a look with set-up budget left.
    pub(super) parked: bool,
    pub(super) target: Target,
}

impl Attempt {
    /// An accepting end's attempt, starting now with reading the peer's handshake.
    pub(super) fn new(stream: TcpStream, peer: SocketAddr, target: Target) -> Attempt {
        Attempt {
            stream,
            peer,
            connector: false,
            rest: Vec::new(),
            step: Step::ReadHello,
            hello: Vec::new(),
            want: HELLO_FIXED_LEN,
            out: Vec::new(),
            sent: 0,
            offer: None,
            conn: None,
            started: Instant::now(),
            parked: false,
            target,
        }
    }
}

impl Attempt {
    /// Whether the peer's whole handshake is in.
    pub(super) fn heard(&self) -> bool {
        match self.step {
            Step::Connecting | Step::ReadHello => false,
            // A connector sends its own first.
            Step::Offer | Step::SendHello => !self.connector,
            Step::Complete | Step::SendReady | Step::ReadReady => true,
        }
    }
}

/// How an attempt ended.
pub(super) enum Progress {
    Done(ConnId),
    Failed(EngineError),
}

impl Engine {
    /// Moves attempt `slot` on as far as its socket lets it.
    pub(super) fn step_attempt(&mut self, slot: usize) {
        let p = loop {
            match self.advance(slot) {
                Ok(true) => {}
                Ok(false) => return,
                Err(p) => break p,
            }
        };
        self.end_attempt(slot, p);
    }

    /// One step of attempt `slot`: `Ok(true)` if it moved on, `Ok(false)` if its socket has
    /// nothing for it now, `Err` when it ended.
    fn advance(&mut self, slot: usize) -> std::result::Result<bool, Progress> {
        let Some(a) = self.dials.attempts.get_mut(slot).and_then(Option::as_mut) else {
            return Ok(false);
        };
        let (doing, peer) = (a.step.doing(), a.peer);
        let fail = |reason: String| {
            Progress::Failed(EngineError::Handshake {
                peer: peer.to_string(),
                reason,
            })
        };
        match a.step {
            Step::Connecting => {
                if let Ok(Some(e)) | Err(e) = a.stream.take_error() {
                    return self.next_address(slot, e).map(|()| true);
                }
                match a.stream.peer_addr() {
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::NotConnected => return Ok(false),
                    Err(e) => return self.next_address(slot, e).map(|()| true),
                }
                let _ = a.stream.set_nodelay(true);
                a.step = Step::Offer;
            }
            Step::Offer | Step::Complete => {
                let now = Instant::now();
                let turn = self.dials.next_setup.is_none_or(|t| now >= t);
                if self.dials.budget == 0 || (self.dials.data_busy && !turn) {
                    if !a.parked {
                        a.parked = true;
                        self.dials.parked.push_back(slot);
                    }
                    return Ok(false);
                }
                self.dials.budget -= 1;
                let r = if a.step == Step::Offer {
                    self.offer_hello(slot)
                } else {
                    self.complete_hello(slot)
                };
                // While data moves, the next set-up step waits its turn (see `SETUP_SHARE`).
                self.dials.setup_took(now, now.elapsed());
                r?;
            }
            Step::SendHello | Step::SendReady => match a.stream.write(&a.out[a.sent..]) {
                Ok(n) => {
                    a.sent += n;
                    if a.sent == a.out.len() {
                        a.sent = 0;
                        a.step = match (a.step, a.connector) {
                            (Step::SendReady, _) => Step::ReadReady,
                            (_, true) => Step::ReadHello,
                            (_, false) => Step::Complete,
                        };
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(fail(format!("{doing}: {e}"))),
            },
            Step::ReadHello | Step::ReadReady => {
                let want = if a.step == Step::ReadReady { 1 } else { a.want };
                let mut buf = [0u8; 512];
                let room = (want - a.hello.len()).min(buf.len());
                match a.stream.read(&mut buf[..room]) {
                    Ok(0) => {
                        return Err(fail(format!(
                            "the peer closed the connection while {doing} ({} of {want} bytes)",
                            a.hello.len()
                        )));
                    }
                    Ok(n) => a.hello.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == ErrorKind::ConnectionReset => {
                        return Err(fail(format!(
                            "the peer closed the connection (reset) while {doing} ({} of \
                             {want} bytes)",
                            a.hello.len()
                        )));
                    }
                    Err(e) => return Err(fail(format!("{doing}: {e}"))),
                }
                if a.hello.len() < want {
                    return Ok(true);
                }
                if a.step == Step::ReadReady {
                    return Err(Progress::Done(a.conn.expect("connected")));
                }
                if a.want == HELLO_FIXED_LEN {
                    let fixed: &[u8; HELLO_FIXED_LEN] =
                        a.hello[..].try_into().expect("the fixed part");
                    a.want = Hello::total_len(fixed).map_err(|e| fail(e.to_string()))?;
                    if a.hello.len() < a.want {
                        return Ok(true);
                    }
                }
                a.step = if a.connector {
                    Step::Complete
                } else {
                    Step::Offer
                };
            }
        }
        Ok(true)
    }

    /// A connector's address refused or failed with `e`: the next one, or the end.
    fn next_address(
        &mut self,
        slot: usize,
        e: std::io::Error,
    ) -> std::result::Result<(), Progress> {
        let a = self.dials.attempts[slot].as_mut().expect("live");
        let failed = format!("connecting to {}: {e}", a.peer);
        let Some(next) = a.rest.pop() else {
            let peer = a.peer.to_string();
            return Err(Progress::Failed(EngineError::Handshake {
                peer,
                reason: failed,
            }));
        };
        let mut stream = TcpStream::connect(next).map_err(|e| {
            Progress::Failed(io_err(
                &next.to_string(),
                &format!("connecting to {next}"),
                e,
            ))
        })?;
        let interest = Interest::READABLE | Interest::WRITABLE;
        if let Some((p, _)) = &self.dials.poll {
            let _ = p.registry().deregister(&mut a.stream);
            p.registry()
                .register(&mut stream, Token(slot), interest)
                .map_err(|e| Progress::Failed(io_err(&next.to_string(), "registering", e)))?;
        }
        tracing::debug!("{failed}; trying {next}");
        a.stream = stream;
        a.peer = next;
        Ok(())
    }

    /// Creates the connection's QPs and starts sending this end's handshake.
    fn offer_hello(&mut self, slot: usize) -> std::result::Result<(), Progress> {
        let (id, mine) = self.offer().map_err(Progress::Failed)?;
        let a = self.dials.attempts[slot].as_mut().expect("live");
        a.offer = Some(id);
        a.out = mine;
        a.sent = 0;
        a.step = Step::SendHello;
        Ok(())
    }

    /// Connects the offered QPs to the peer's, then starts the ready exchange.
    fn complete_hello(&mut self, slot: usize) -> std::result::Result<(), Progress> {
        let a = self.dials.attempts[slot].as_mut().expect("live");
        let id = a.offer.take().expect("offered");
        let theirs = std::mem::take(&mut a.hello);
        let peer = a.peer.to_string();
        self.complete(id, &theirs).map_err(|e| {
            Progress::Failed(match e {
                EngineError::Handshake { reason, .. } => EngineError::Handshake { peer, reason },
                other => other,
            })
        })?;
        let a = self.dials.attempts[slot].as_mut().expect("live");
        a.conn = Some(id);
        a.out = vec![1];
        a.sent = 0;
        a.step = Step::SendReady;
        Ok(())
    }

    /// Ends attempt `slot`: its connection (or offer) goes if it failed, and whoever waits
    /// learns how it ended.
    pub(super) fn end_attempt(&mut self, slot: usize, p: Progress) {
        let Some(a) = self.dials.remove(slot) else {
            return;
        };
        let result = match p {
            Progress::Done(c) => Ok(c),
            Progress::Failed(e) => {
                if let Some(id) = a.offer {
                    self.withdraw(id);
                }
                if let Some(id) = a.conn {
                    let _ = self.close(id);
                }
                Err(e)
            }
        };
        match (a.target, result) {
            (Target::Handle(req), r) => req.finish(r),
            (Target::Listener, Ok(c)) => {
                self.dials.ready.push_back(c);
                self.dials.match_incoming();
            }
            (Target::Listener, Err(e)) => {
                tracing::info!(error = %e, "an incoming handshake failed");
                self.incoming_failed(e);
            }
        }
        if self.dials.listener.is_some() {
            self.dials.backlogged = true;
        }
    }
}
