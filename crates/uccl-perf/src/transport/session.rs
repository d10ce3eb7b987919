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
/// Connections the server reads at once while it looks for its client's.
const READING: usize = 64;
/// How long a connection the server reads (for run options here, for a flow's handshake
/// while flows are set up) keeps its place against a newer one while every place is taken:
/// an honest client speaks at once, so one that has not sent all it should (its whole line,
/// its whole handshake) within this long gives its place up to a connection that waits for
/// one.
pub(super) const PUSH_OUT_AFTER: Duration = Duration::from_secs(1);

/// Connections that bring no run options named on standard error, at most.
const IGNORED_NAMED: u32 = 8;

/// Whether an `accept` failed for the connection it was taking, not for the listener
/// ([`uccl_engine::client_gone`]), or was interrupted by a signal: the next connection may do.
pub(super) fn is_transient(e: &std::io::Error) -> bool {
    e.kind() == ErrorKind::Interrupted || uccl_engine::client_gone(e)
}

/// A connection the server reads, not yet known to be a client's.
struct Caller {
    s: TcpStream,
    peer: SocketAddr,
    line: Vec<u8>,
    since: Instant,
}

/// What the server's client sent first: its connection and address, and its run options'
/// line as JSON, with the version it names.
pub(super) struct FirstLine {
    pub(super) s: TcpStream,
    pub(super) peer: SocketAddr,
    pub(super) line: serde_json::Value,
    pub(super) version: u64,
}

/// The first connection to `listener` that sends a line naming a version of the run options
/// (`{"uccl_perf": N, ...}`). Up to [`READING`] connections are read at once, each for
/// [`HELLO_WAIT`] in all: one that closes, says something else or nothing (a port scan, a
/// stranger, a peer that sends a byte now and then) is ignored, named on standard error
/// (the first [`IGNORED_NAMED`]), and never holds the others up; with every place taken, the
/// oldest makes room for a newer connection after [`PUSH_OUT_AFTER`]. The server sleeps
/// until a connection or a byte comes, or a deadline passes.
pub(super) fn first_client(listener: &TcpListener, args: &Args) -> Result<FirstLine, String> {
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
    // The caller that has been read longest: the one to push out.
    let oldest = |callers: &[Caller]| (0..callers.len()).min_by_key(|&i| callers[i].since);
    loop {
        // Every connection waiting while there is room; with none, only one that pushes the
        // oldest out (a connection is taken only once it is there to take).
        loop {
            let full = callers.len() >= READING;
            let out = oldest(&callers).filter(|&i| callers[i].since.elapsed() >= PUSH_OUT_AFTER);
            if full && out.is_none() {
                break;
            }
            match listener.accept() {
                Ok((s, peer)) => {
                    if s.set_nonblocking(true).is_err() {
                        continue;
                    }
                    if let Some(i) = out.filter(|_| full) {
                        ignore(callers.swap_remove(i), "pushed out by a newer connection");
                    }
                    callers.push(Caller {
                        s,
                        // An IPv4 client of the dual-stack listener as IPv4 (not ::ffff:a.b.c.d).
                        peer: SocketAddr::new(peer.ip().to_canonical(), peer.port()),
                        line: Vec::new(),
                        since: Instant::now(),
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
                    c.line.extend_from_slice(&b[..n]);
                    if let Some(end) = c.line.iter().position(|&x| x == b'\n') {
                        let c = callers.swap_remove(i);
                        match version(&c.line[..=end]) {
                            Some((line, version)) => {
                                // The client waits for the answer: a blocking connection again.
                                c.s.set_nonblocking(false)
                                    .map_err(|e| format!("the client's connection: {e}"))?;
                                let _ = c.s.set_write_timeout(Some(TIMEOUT));
                                return Ok(FirstLine {
                                    s: c.s,
                                    peer: c.peer,
                                    line,
                                    version,
                                });
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
            let late = callers[i].since.elapsed() >= HELLO_WAIT;
            match why.or(late.then_some("nothing came in time")) {
                Some(why) => ignore(callers.swap_remove(i), why),
                None => i += 1,
            }
        }
        wait(listener, &callers)?;
    }
}

/// Sleeps until a connection waits on `listener` (while it can be taken: see
/// [`first_client`]), one of the `callers` sends something or closes, or the next of their
/// deadlines passes: a caller's [`HELLO_WAIT`], or, with every place taken and none to push
/// out yet, the oldest's [`PUSH_OUT_AFTER`].
fn wait(listener: &TcpListener, callers: &[Caller]) -> Result<(), String> {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let oldest = callers.iter().map(|c| c.since).min();
    let full = callers.len() >= READING;
    let can_push = oldest.is_some_and(|t| t.elapsed() >= PUSH_OUT_AFTER);
    let next = oldest.map(|t| {
        t + if full && !can_push {
            PUSH_OUT_AFTER
        } else {
            HELLO_WAIT
        }
    });
    let mut fds: Vec<PollFd<'_>> = callers
        .iter()
        .map(|c| PollFd::new(&c.s, PollFlags::IN))
        .collect();
    if !full || can_push {
        fds.push(PollFd::new(listener, PollFlags::IN));
    }
    let timeout = next.map(|t| {
        let left = t.saturating_duration_since(Instant::now());
        // Rounded up to the next millisecond: no wake-up just before the deadline.
        Timespec::try_from(left + Duration::from_millis(1)).unwrap_or(Timespec {
            tv_sec: i64::MAX,
            tv_nsec: 0,
        })
    });
    match poll(&mut fds, timeout.as_ref()) {
        Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
        Err(e) => Err(format!("waiting for the client: {e}")),
    }
}

/// The line as JSON and the version it names, if it is an object with `uccl_perf`.
fn version(line: &[u8]) -> Option<(serde_json::Value, u64)> {
    let line = serde_json::from_slice::<serde_json::Value>(line).ok()?;
    let v = line.get("uccl_perf")?.as_u64()?;
    Some((line, v))
}

/// The connection on which the two ends agreed on the run, kept open by both while it lasts.
/// The server learns at once when the client ends or its process dies while its flows
/// connect (a stranger's connection to the port is no sign of that), and it paces them: the
/// client connects each flow only when the server says it takes the next (one byte), so that
/// each is set up by the engine the server chose for it.
#[derive(Debug)]
pub(super) struct Session {
    s: TcpStream,
    /// The other end's address (IPv4 as such, not v4-mapped): the client's at the server,
    /// the server's (the one the name resolved to that took the session) at the client.
    peer: SocketAddr,
}

impl Session {
    /// The server's end, with the client at `peer`: it never waits on it.
    pub(super) fn server(s: TcpStream, peer: SocketAddr) -> Result<Self, String> {
        s.set_nonblocking(true)
            .map_err(|e| format!("the client's connection from {peer}: {e}"))?;
        Ok(Session {
            s,
            peer: SocketAddr::new(peer.ip().to_canonical(), peer.port()),
        })
    }

    /// The client's end, with the server at `server`: [`wait_go`](Self::wait_go) waits at
    /// most [`TIMEOUT`].
    pub(super) fn client(s: TcpStream, server: SocketAddr) -> Self {
        let _ = s.set_read_timeout(Some(TIMEOUT));
        Session { s, peer: server }
    }

    /// The client's end: the server's address the flows connect to, the session's own (not
    /// the name resolved again, which may give another address), so that they come from the
    /// same source address (see [`is_clients_host`](Self::is_clients_host)).
    pub(super) fn server_addr(&self) -> SocketAddr {
        self.peer
    }

    /// The server's end: whether a connection from `peer` may be one of the client's flows:
    /// it comes from the client's host (its address on this session). The client's engines
    /// connect to the address the session did ([`server_addr`](Self::server_addr)), so the kernel gives
    /// them the same source address; another host's engine cannot take a flow's place.
    pub(super) fn is_clients_host(&self, peer: SocketAddr) -> bool {
        self.peer.ip() == peer.ip().to_canonical()
    }

    /// Whether the client closed the session: it ended, or its process died. (A host that
    /// vanished without closing is seen only by the engines' timeouts.) What it sent, which
    /// is nothing from a uccl-perf client, is read and dropped (a few KiB a look: a client
    /// that keeps sending is not seen to end until it stops).
    pub(super) fn ended(&self) -> bool {
        let mut b = [0u8; 1024];
        for _ in 0..8 {
            match (&self.s).read(&mut b) {
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
        match (&self.s).write(&[1]) {
            Ok(1) => Ok(()),
            Ok(_) => Err("the client's connection takes nothing".into()),
            Err(e) => Err(format!("telling the client to connect its next flow: {e}")),
        }
    }

    /// The client waits until the server takes its next flow, flow `f`.
    pub(super) fn wait_go(&self, f: usize) -> Result<(), String> {
        let mut b = [0u8; 1];
        loop {
            match (&self.s).read(&mut b) {
                Ok(1) => return Ok(()),
                Ok(_) => {
                    return Err(format!(
                        "flow {f}: the server closed its connection before it took the flow \
                         (it failed or stopped)"
                    ));
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(format!(
                        "flow {f}: the server did not take the flow within {} s",
                        TIMEOUT.as_secs()
                    ));
                }
                Err(e) => {
                    return Err(format!(
                        "flow {f}: waiting for the server to take the flow: {e}"
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::sync::mpsc;
    use std::time::Duration;

    use clap::Parser;

    use super::{READING, first_client};
    use crate::args::Args;

    /// A burst of more connections than the server reads at once, right behind the client's
    /// (every one in the backlog before the server looks): the client's line is read first,
    /// not pushed out unread by the burst.
    #[test]
    fn a_burst_behind_the_client_does_not_push_it_out() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut client = TcpStream::connect(addr).unwrap();
        client.write_all(b"{\"uccl_perf\": 99}\n").unwrap();
        let burst: Vec<TcpStream> = (0..READING + 20)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let args = Args::parse_from(["uccl-perf", "--server"]);
            let _ = tx.send(first_client(&listener, &args).map(|f| (f.peer, f.version)));
        });
        let (peer, version) = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the client's line was never read")
            .unwrap();
        assert_eq!((peer, version), (client.local_addr().unwrap(), 99));
        drop(burst);
    }
}
