//! The threaded engine: [`Engine::spawn`] moves an engine onto a thread of its own, which
//! polls it round after round. Application threads hand it requests through a bounded
//! lock-free queue (crossbeam's `ArrayQueue`) and learn of completions through their
//! [`Request`] handles (test, wait, or await: the engine thread wakes them).
//!
//! When nothing happens for a while the engine thread backs off (spinning, then yielding,
//! then sleeping up to [`MAX_NAP`]); a new request wakes it at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering, fence};
use std::sync::mpsc;
use std::thread::{self, JoinHandle, Thread};
use std::time::Duration;

use crossbeam_queue::ArrayQueue;

use crate::cancel::Opts;
use crate::descriptor::Descriptor;
use crate::engine::{ConnId, Engine};
use crate::error::{EngineError, Result};
use crate::memory::Buffer;
use crate::notes::Notifications;
use crate::request::CancelTo;
use crate::request::Request;
use crate::transfer::Op;
use crate::vectored::Block;

/// Requests the queue towards the engine thread holds at most; beyond that
/// [`EngineHandle`]'s calls fail with [`EngineError::Limit`].
pub const QUEUE_DEPTH: usize = 4096;

/// The longest the engine thread sleeps while idle.
pub const MAX_NAP: Duration = Duration::from_millis(1);

/// Idle rounds spent spinning, then yielding, before the engine thread starts to sleep.
const SPINS: u32 = 64;
const YIELDS: u32 = 256;

/// A request on its way to the engine thread.
enum Command {
    /// A send, receive or write of `range` of `buf` on `conn`.
    Io {
        conn: ConnId,
        buf: Buffer,
        range: (u64, u64),
        op: Op,
        req: Request,
        opts: Opts,
    },
    /// A vectored write (or, `read`, read) of `blocks` on `conn`.
    Vector {
        conn: ConnId,
        blocks: Vec<Block>,
        read: bool,
        req: Request,
        opts: Opts,
    },
    /// A control-path call ([`EngineHandle::call`]).
    Call(Box<dyn FnOnce(&mut Engine) + Send>),
}

impl Command {
    /// Runs the command on the engine; a request that cannot start fails with the reason.
    fn apply(self, e: &mut Engine) {
        e.unsettle();
        match self {
            Command::Call(f) => f(e),
            Command::Io {
                conn,
                buf,
                range,
                op,
                req,
                opts,
            } => {
                if let Err(err) = e.start(conn, &buf, range, op, &req, opts) {
                    req.fail(err);
                }
            }
            Command::Vector {
                conn,
                blocks,
                read,
                req,
                opts,
            } => {
                let r = match read {
                    true => e.start_reads(conn, &blocks, &req, opts, true),
                    false => e.start_writes(conn, &blocks, &req, opts, true),
                };
                if let Err(err) = r {
                    req.fail(err);
                }
            }
        }
    }

    /// Fails the command's request: the engine is gone.
    fn cancel(self) {
        match self {
            Command::Io { req, .. } | Command::Vector { req, .. } => req.fail(EngineError::Stopped),
            // Dropping the closure drops its reply channel: the caller sees `Stopped`.
            Command::Call(_) => {}
        }
    }
}

struct Shared {
    queue: ArrayQueue<Command>,
    stop: AtomicBool,
    /// Set while the engine thread may be about to sleep: a producer that sees it wakes it.
    sleepy: AtomicBool,
    /// Set once the engine thread has exited.
    gone: AtomicBool,
}

/// An engine running on its own thread ([`Engine::spawn`]). Share it between application
/// threads (it is `Sync`); every call returns at once with a [`Request`], except
/// [`call`](Self::call) and what is built on it, which wait for the engine thread.
pub struct EngineHandle {
    shared: Arc<Shared>,
    /// The engine's id and count of ended requests, as its requests hold them.
    owner: Arc<crate::request::Owner>,
    /// The engine's queue of cancelled requests (the requests made here cancel through it).
    cancels: Arc<crossbeam_queue::SegQueue<Request>>,
    notifications: Notifications,
    thread: Thread,
    join: Option<JoinHandle<Engine>>,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle")
            .field("queued", &self.shared.queue.len())
            .field("running", &!self.shared.gone.load(Ordering::Relaxed))
            .finish()
    }
}

impl Engine {
    /// Moves the engine onto a thread of its own (named `uccl-engine-<device>`), which runs
    /// [`poll`](Self::poll) until the handle is shut down or dropped.
    ///
    /// On softnic, give threaded engines a wall-clock fabric (`softnic::Clock::Wall`): a
    /// virtual clock is moved by whichever thread polls, so it runs ahead of an engine thread
    /// that sleeps, and a threaded engine does not move it to its timers (an engine polled in
    /// the caller's loop does: see [`poll`](Self::poll)). Lossless runs work on either clock;
    /// on a virtual one, recovering a loss may wait for ever.
    pub fn spawn(mut self) -> Result<EngineHandle> {
        self.alarm = None;
        let shared = Arc::new(Shared {
            queue: ArrayQueue::new(QUEUE_DEPTH),
            stop: AtomicBool::new(false),
            sleepy: AtomicBool::new(false),
            gone: AtomicBool::new(false),
        });
        let owner = Arc::clone(&self.owner);
        let cancels = Arc::clone(&self.cancels);
        let notifications = self.notifications();
        let name = format!("uccl-engine-{}", self.io.ctx.name());
        let s = Arc::clone(&shared);
        let join = thread::Builder::new()
            .name(name)
            .spawn(move || run(self, &s))
            .map_err(|e| EngineError::Spawn(Arc::new(e)))?;
        Ok(EngineHandle {
            shared,
            owner,
            cancels,
            notifications,
            thread: join.thread().clone(),
            join: Some(join),
        })
    }
}

/// The engine thread: commands, a round, and a nap when idle for long.
fn run(mut engine: Engine, shared: &Shared) -> Engine {
    let _span = tracing::info_span!("engine", device = %engine.io.ctx.name()).entered();
    // However the loop ends (a panic included: then the engine is dropped after this, failing
    // what it held), the handle learns the thread is gone and nothing queued waits forever.
    let _exit = Exit(shared);
    let mut idle = 0u32;
    loop {
        let mut busy = false;
        // At most one queue's worth per round, so a flood of requests cannot starve polling.
        for _ in 0..QUEUE_DEPTH {
            let Some(cmd) = shared.queue.pop() else { break };
            cmd.apply(&mut engine);
            busy = true;
        }
        match engine.poll() {
            Ok(b) => busy |= b,
            Err(e) => {
                tracing::error!(error = %e, "the engine failed; its thread stops");
                engine.fail_all(&e);
                break;
            }
        }
        if shared.stop.load(Ordering::Acquire) && shared.queue.is_empty() {
            break;
        }
        if busy {
            idle = 0;
            continue;
        }
        idle = idle.saturating_add(1);
        if idle < SPINS {
            std::hint::spin_loop();
        } else if idle < SPINS + YIELDS {
            thread::yield_now();
        } else {
            shared.sleepy.store(true, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if shared.queue.is_empty() && !shared.stop.load(Ordering::SeqCst) {
                let nap = Duration::from_micros(10) * (idle - SPINS - YIELDS + 1).min(100);
                thread::park_timeout(nap.min(MAX_NAP));
            }
            shared.sleepy.store(false, Ordering::Relaxed);
        }
    }
    engine
}

/// Marks the engine thread gone and fails whatever is still queued for it, when dropped.
struct Exit<'a>(&'a Shared);

impl Drop for Exit<'_> {
    fn drop(&mut self) {
        self.0.gone.store(true, Ordering::SeqCst);
        while let Some(cmd) = self.0.queue.pop() {
            cmd.cancel();
        }
    }
}

impl EngineHandle {
    /// Queues `cmd` and wakes the engine thread if it may be asleep.
    fn push(&self, cmd: Command) -> Result<()> {
        if self.shared.gone.load(Ordering::Acquire) || self.shared.stop.load(Ordering::Acquire) {
            return Err(EngineError::Stopped);
        }
        if self.shared.queue.push(cmd).is_err() {
            return Err(EngineError::Limit {
                what: "requests queued to the engine thread",
                limit: QUEUE_DEPTH as u64,
            });
        }
        fence(Ordering::SeqCst);
        if self.shared.sleepy.load(Ordering::SeqCst) {
            self.thread.unpark();
        }
        // The thread may have exited between the check and the push: it drains the queue
        // after exiting, but a push that lost that race would wait forever.
        if self.shared.gone.load(Ordering::SeqCst) {
            while let Some(cmd) = self.shared.queue.pop() {
                cmd.cancel();
            }
        }
        Ok(())
    }

    /// Queues `op` of `offset..offset + len` of `buf` on `conn`.
    fn io(
        &self,
        conn: ConnId,
        buf: &Buffer,
        (offset, len): (u64, u64),
        op: Op,
        opts: Opts,
    ) -> Result<Request> {
        if buf.engine() != self.owner.id {
            return Err(EngineError::BadRange("a buffer of another engine".into()));
        }
        buf.check_range(offset, len)?;
        let req = self.request(conn);
        self.push(Command::Io {
            conn,
            buf: buf.clone(),
            range: (offset, len),
            op,
            req: req.clone(),
            opts,
        })?;
        Ok(req)
    }

    /// [`Engine::send`] on the engine thread.
    pub fn send(&self, conn: ConnId, buf: &Buffer, offset: u64, len: u64) -> Result<Request> {
        self.send_with(conn, buf, offset, len, Opts::default())
    }

    /// [`Engine::send_with`] on the engine thread.
    pub fn send_with(
        &self,
        conn: ConnId,
        buf: &Buffer,
        offset: u64,
        len: u64,
        opts: Opts,
    ) -> Result<Request> {
        self.io(conn, buf, (offset, len), Op::Send, opts)
    }

    /// [`Engine::recv`] on the engine thread.
    pub fn recv(&self, conn: ConnId, buf: &Buffer, offset: u64, len: u64) -> Result<Request> {
        self.recv_with(conn, buf, offset, len, Opts::default())
    }

    /// [`Engine::recv_with`] on the engine thread.
    pub fn recv_with(
        &self,
        conn: ConnId,
        buf: &Buffer,
        offset: u64,
        len: u64,
        opts: Opts,
    ) -> Result<Request> {
        self.io(conn, buf, (offset, len), Op::Recv, opts)
    }

    /// [`Engine::write`] on the engine thread.
    pub fn write(
        &self,
        conn: ConnId,
        buf: &Buffer,
        range: (u64, u64),
        dst: &Descriptor,
        dst_offset: u64,
    ) -> Result<Request> {
        self.write_with(conn, buf, range, dst, dst_offset, Opts::default())
    }

    /// [`Engine::write_with`] on the engine thread.
    pub fn write_with(
        &self,
        conn: ConnId,
        buf: &Buffer,
        range: (u64, u64),
        dst: &Descriptor,
        dst_offset: u64,
        opts: Opts,
    ) -> Result<Request> {
        let dst = *dst;
        self.io(conn, buf, range, Op::Write { dst, dst_offset }, opts)
    }

    /// [`Engine::read`] on the engine thread.
    pub fn read(
        &self,
        conn: ConnId,
        buf: &Buffer,
        range: (u64, u64),
        src: &Descriptor,
        src_offset: u64,
    ) -> Result<Request> {
        self.read_with(conn, buf, range, src, src_offset, Opts::default())
    }

    /// [`Engine::read_with`] on the engine thread.
    pub fn read_with(
        &self,
        conn: ConnId,
        buf: &Buffer,
        range: (u64, u64),
        src: &Descriptor,
        src_offset: u64,
        opts: Opts,
    ) -> Result<Request> {
        let src = *src;
        self.io(conn, buf, range, Op::Read { src, src_offset }, opts)
    }

    /// [`Engine::write_v`] on the engine thread.
    pub fn write_v(&self, conn: ConnId, blocks: &[Block]) -> Result<Request> {
        self.vector(conn, blocks, false, Opts::default())
    }

    /// [`Engine::write_v_with`] on the engine thread.
    pub fn write_v_with(&self, conn: ConnId, blocks: &[Block], opts: Opts) -> Result<Request> {
        self.vector(conn, blocks, false, opts)
    }

    /// [`Engine::read_v`] on the engine thread.
    pub fn read_v(&self, conn: ConnId, blocks: &[Block]) -> Result<Request> {
        self.vector(conn, blocks, true, Opts::default())
    }

    /// [`Engine::read_v_with`] on the engine thread.
    pub fn read_v_with(&self, conn: ConnId, blocks: &[Block], opts: Opts) -> Result<Request> {
        self.vector(conn, blocks, true, opts)
    }

    /// The notes the engine delivered ([`Engine::notifications`]).
    pub fn notifications(&self) -> Notifications {
        self.notifications.clone()
    }

    /// A request of this engine on `conn`.
    fn request(&self, conn: ConnId) -> Request {
        let cancel = CancelTo {
            queue: Arc::clone(&self.cancels),
            conn,
        };
        Request::of_engine(&self.owner, Some(cancel))
    }

    /// Queues a vectored write (`read`: read) of `blocks` on `conn`.
    fn vector(&self, conn: ConnId, blocks: &[Block], read: bool, opts: Opts) -> Result<Request> {
        let req = self.request(conn);
        self.push(Command::Vector {
            conn,
            blocks: blocks.to_vec(),
            read,
            req: req.clone(),
            opts,
        })?;
        Ok(req)
    }

    /// Runs `f` on the engine thread between two rounds and returns what it returns: for the
    /// control path (registering memory, exporting, closing, statistics). While `f` runs the
    /// engine makes no progress, so keep it short (connection set-up has methods of its own,
    /// which return at once: [`connect`](Self::connect), [`accept`](Self::accept)).
    pub fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Engine) -> R + Send + 'static,
    ) -> Result<R> {
        if self.on_engine_thread() {
            // It would wait for the thread it runs on (a request's waker, say).
            return Err(EngineError::OnEngineThread("call"));
        }
        let (tx, rx) = mpsc::sync_channel(1);
        self.push(Command::Call(Box::new(move |e| {
            let _ = tx.send(f(e));
        })))?;
        rx.recv().map_err(|_| EngineError::Stopped)
    }

    /// [`Engine::register`] on the engine thread.
    pub fn register(&self, len: usize) -> Result<Buffer> {
        self.call(move |e| e.register(len))?
    }

    /// [`Engine::deregister`] on the engine thread.
    pub fn deregister(&self, buf: &Buffer) -> Result<()> {
        let buf = buf.clone();
        self.call(move |e| e.deregister(&buf))?
    }

    /// [`Engine::export`] on the engine thread.
    pub fn export(&self, buf: &Buffer, offset: u64, len: u64) -> Result<Descriptor> {
        let buf = buf.clone();
        self.call(move |e| e.export(&buf, offset, len))?
    }

    /// [`Engine::withdraw_export`] on the engine thread.
    pub fn withdraw_export(&self, d: &Descriptor) -> Result<()> {
        let d = *d;
        self.call(move |e| e.withdraw_export(&d))?
    }

    /// [`Engine::close`] on the engine thread.
    pub fn close(&self, conn: ConnId) -> Result<Request<()>> {
        self.call(move |e| e.close(conn))?
    }

    /// [`Engine::connect`]: the address is resolved here (a host name may block this thread,
    /// never the engine's), the handshake runs in the engine thread's rounds.
    pub fn connect(&self, addr: impl std::net::ToSocketAddrs) -> Result<crate::Connecting> {
        let addrs: Vec<std::net::SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| EngineError::Handshake {
                peer: "the listener".into(),
                reason: format!("resolving the address: {e}"),
            })?
            .collect();
        self.call(move |e| e.connect(&addrs[..]))?
    }

    /// [`Engine::accept`] on the engine thread.
    pub fn accept(&self, listener: &std::net::TcpListener) -> Result<crate::Connecting> {
        let l = listener.try_clone().map_err(|e| EngineError::Handshake {
            peer: "a connecting engine".into(),
            reason: format!("taking the listener: {e}"),
        })?;
        self.call(move |e| e.accept(&l))?
    }

    /// [`Engine::accept_stream`] on the engine thread.
    pub fn accept_stream(
        &self,
        stream: std::net::TcpStream,
        peer: std::net::SocketAddr,
    ) -> Result<crate::Connecting> {
        self.call(move |e| e.accept_stream(stream, peer))?
    }

    /// [`Engine::peer_spoke`] on the engine thread.
    pub fn peer_spoke(&self, setup: &crate::Connecting) -> Result<bool> {
        let setup = setup.clone();
        self.call(move |e| e.peer_spoke(&setup))
    }

    /// [`Engine::abandon`] on the engine thread.
    pub fn abandon(&self, setup: &crate::Connecting) -> Result<bool> {
        let setup = setup.clone();
        self.call(move |e| e.abandon(&setup))
    }

    /// [`Engine::listen`] on the engine thread.
    pub fn listen(&self, listener: std::net::TcpListener) -> Result<()> {
        self.call(move |e| e.listen(listener))?
    }

    /// [`Engine::incoming`] on the engine thread.
    pub fn incoming(&self) -> Result<crate::Connecting> {
        self.call(move |e| e.incoming())?
    }

    /// [`Engine::incoming_failures`] on the engine thread.
    pub fn incoming_failures(&self) -> Result<Vec<EngineError>> {
        self.call(move |e| e.incoming_failures())
    }

    /// Stops the engine thread once it has taken every request queued so far, and gives the
    /// engine back (requests still in flight stay with it: poll it, or drop it to fail them).
    /// On the engine thread itself (in a request's waker) the engine cannot be given back:
    /// [`EngineError::OnEngineThread`], and the thread stops after its round, as when the
    /// handle is dropped.
    pub fn shutdown(mut self) -> Result<Engine> {
        if self.on_engine_thread() {
            // The engine cannot be handed back here; dropping `self` stops the thread after
            // this round (without waiting for it), as dropping the handle would.
            return Err(EngineError::OnEngineThread("shutdown"));
        }
        self.stop_thread().ok_or(EngineError::Stopped)
    }

    /// Whether the caller runs on the engine thread (in a waker, or a closure of `call`).
    fn on_engine_thread(&self) -> bool {
        thread::current().id() == self.thread.id()
    }

    fn stop_thread(&mut self) -> Option<Engine> {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.thread.unpark();
        let join = self.join.take()?;
        if self.on_engine_thread() {
            // Dropped on the engine thread itself: it cannot wait for itself. It stops after
            // this round and drops the engine there.
            drop(join);
            return None;
        }
        match join.join() {
            Ok(e) => Some(e),
            Err(_) => {
                tracing::error!("the engine thread panicked");
                None
            }
        }
    }
}

impl Drop for EngineHandle {
    /// Stops the engine thread and drops the engine: requests still in flight fail with
    /// [`EngineError::Stopped`].
    fn drop(&mut self) {
        drop(self.stop_thread());
    }
}
