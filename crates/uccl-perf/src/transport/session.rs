//! The connection on which a client and a server agree on a run (see [`super::agree`]): how
//! the server finds its client's among the connections to its port, and the [`Session`] both
//! keep open while the run lasts.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::agree::{MAX_LINE, TIMEOUT};
use super::say;
use crate::args::Args;

/// How long the server waits for the run options of a connection it took before it ignores
/// it (a client sends them as soon as it connects).
const HELLO_WAIT: Duration = Duration::from_secs(2);
/// Connections the server reads at once while it looks for its client's; one more pushes out
/// the oldest.
const READING: usize = 64;
/// How often the server looks at the connections to its port, and at its client's session,
/// while nothing happens.
pub(super) const LOOK_EVERY: Duration = Duration::from_millis(1);

/// Connections that bring no run options named on standard error, at most.
const IGNORED_NAMED: u32 = 8;

/// Whether an `accept` failed for the connection it was taking, not for the listener: the
/// client went before it was taken, a network error pending on it (which Linux reports
/// there, see accept(2)), or a signal. The next connection may do.
pub(super) fn is_transient(e: &std::io::Error) -> bool {
    use ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionAborted
            | ConnectionReset
            | Interrupted
            | HostUnreachable
            | NetworkUnreachable
            | NetworkDown
            | TimedOut
    ) || e.raw_os_error().is_some_and(|n| {
        [
            rustix::io::Errno::PROTO,
            rustix::io::Errno::NOPROTOOPT,
            rustix::io::Errno::OPNOTSUPP,
        ]
        .iter()
        .any(|x| x.raw_os_error() == n)
    })
}

/// A connection the server reads, not yet known to be a client's.
struct Caller {
    s: TcpStream,
    peer: SocketAddr,
    line: Vec<u8>,
    until: Instant,
}

/// The first connection to `listener` that sends a line naming a version of the run options
/// (`{"uccl_perf": N, ...}`), with its peer, the line and the version. Every connection is
/// read at once, each for [`HELLO_WAIT`] in all: one that closes, says something else or
/// nothing (a port scan, a stranger, a peer that sends a byte now and then) is ignored,
/// named on standard error (the first [`IGNORED_NAMED`]), and never holds the others up.
pub(super) fn first_client(
    listener: &TcpListener,
    args: &Args,
) -> Result<(TcpStream, SocketAddr, String, u64), String> {
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("the listener: {e}"))?;
    let mut callers: Vec<Caller> = Vec::new();
    let mut ignored = 0u32;
    let mut ignore = |c: Caller, why: &str| {
        ignored += 1;
        if ignored <= IGNORED_NAMED {
            let more = if ignored == IGNORED_NAMED {
                " (more are ignored without a word)"
            } else {
                ""
            };
            say(
                args,
                &format!(
                    "uccl-perf: ignored a connection from {}, not a uccl-perf client's run \
                     options: {why}{more}",
                    c.peer
                ),
            );
        }
    };
    loop {
        let mut busy = false;
        loop {
            match listener.accept() {
                Ok((s, peer)) => {
                    busy = true;
                    if s.set_nonblocking(true).is_err() {
                        continue;
                    }
                    if callers.len() == READING {
                        let oldest = callers.remove(0);
                        ignore(oldest, "pushed out by newer connections");
                    }
                    callers.push(Caller {
                        s,
                        // An IPv4 client of the dual-stack listener as IPv4 (not ::ffff:a.b.c.d).
                        peer: SocketAddr::new(peer.ip().to_canonical(), peer.port()),
                        line: Vec::new(),
                        until: Instant::now() + HELLO_WAIT,
                    });
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if is_transient(&e) => {}
                Err(e) => return Err(format!("accepting the client: {e}")),
            }
        }
        let mut i = 0;
        while i < callers.len() {
            let c = &mut callers[i];
            let mut b = [0u8; 4096];
            let why = match (&c.s).read(&mut b) {
                Ok(0) => Some("the connection closed"),
                Ok(n) => {
                    busy = true;
                    c.line.extend_from_slice(&b[..n]);
                    if let Some(end) = c.line.iter().position(|&x| x == b'\n') {
                        let c = callers.swap_remove(i);
                        match version(&c.line[..=end]) {
                            Some((line, v)) => {
                                // The client waits for the answer: a blocking connection again.
                                c.s.set_nonblocking(false)
                                    .map_err(|e| format!("the client's connection: {e}"))?;
                                let _ = c.s.set_write_timeout(Some(TIMEOUT));
                                return Ok((c.s, c.peer, line, v));
                            }
                            None => ignore(c, "it sent something else"),
                        }
                        continue;
                    }
                    (c.line.len() as u64 >= MAX_LINE).then_some("its line is too long")
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                    None
                }
                Err(_) => Some("the connection failed"),
            };
            let why =
                why.or((Instant::now() >= callers[i].until).then_some("nothing came in time"));
            match why {
                Some(why) => ignore(callers.swap_remove(i), why),
                None => i += 1,
            }
        }
        if !busy {
            std::thread::sleep(LOOK_EVERY);
        }
    }
}

/// The line as text and the version it names, if it is a JSON object with `uccl_perf`.
fn version(line: &[u8]) -> Option<(String, u64)> {
    let line = String::from_utf8(line.to_vec()).ok()?;
    let v = serde_json::from_str::<serde_json::Value>(&line)
        .ok()?
        .get("uccl_perf")?
        .as_u64()?;
    Some((line, v))
}

/// The connection on which the two ends agreed on the run, kept open by both while it lasts.
/// The server learns at once when the client ends or its process dies while its flows
/// connect (a stranger's connection to the port is no sign of that), and it paces them: the
/// client connects each flow only when the server says it takes the next (one byte), so that
/// each is set up by the engine the server chose for it.
#[derive(Debug)]
pub(super) struct Session(TcpStream);

impl Session {
    /// The server's end: it never waits on it.
    pub(super) fn server(s: TcpStream, peer: SocketAddr) -> Result<Self, String> {
        s.set_nonblocking(true)
            .map_err(|e| format!("the client's connection from {peer}: {e}"))?;
        Ok(Session(s))
    }

    /// The client's end: [`wait_go`](Self::wait_go) waits at most [`TIMEOUT`].
    pub(super) fn client(s: TcpStream) -> Self {
        let _ = s.set_read_timeout(Some(TIMEOUT));
        Session(s)
    }

    /// Whether the client closed the session: it ended, or its process died. (A host that
    /// vanished without closing is seen only by the engines' timeouts.) What it sent, which
    /// is nothing from a uccl-perf client, is read and dropped (a few KiB a look: a client
    /// that keeps sending is not seen to end until it stops).
    pub(super) fn ended(&self) -> bool {
        let mut b = [0u8; 1024];
        for _ in 0..8 {
            match (&self.0).read(&mut b) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return e.kind() != ErrorKind::WouldBlock,
            }
        }
        false
    }

    /// The server takes the next flow: the client may connect it.
    pub(super) fn go(&self) -> Result<(), String> {
        match (&self.0).write(&[1]) {
            Ok(1) => Ok(()),
            Ok(_) => Err("the client's connection takes nothing".into()),
            Err(e) => Err(format!("telling the client to connect its next flow: {e}")),
        }
    }

    /// The client waits until the server takes its next flow.
    pub(super) fn wait_go(&self) -> Result<(), String> {
        let mut b = [0u8; 1];
        match (&self.0).read(&mut b) {
            Ok(1) => Ok(()),
            Ok(_) => Err("the server closed its connection (it failed or stopped)".into()),
            Err(e) => Err(format!("waiting for the server to take the next flow: {e}")),
        }
    }
}
