//! The calls that move data: [`Engine::send`], [`Engine::recv`] and [`Engine::write`], and
//! their `_with` forms, which take [`Opts`] (a deadline, a note); reads are in `read.rs`,
//! vectored transfers in `vectored.rs`.

use crate::cancel::Opts;
use crate::config::RecvKeys;
use crate::conn::{PendingSend, PostedRecv, RECV_IDS, Win};
use crate::descriptor::Descriptor;
use crate::engine::{ConnId, Engine};
use crate::error::{EngineError, Result};
use crate::memory::Buffer;
use crate::request::{CancelTo, Request};

/// What a transfer does.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op {
    Send,
    Recv,
    Write { dst: Descriptor, dst_offset: u64 },
    Read { src: Descriptor, src_offset: u64 },
}

impl Engine {
    /// Sends `len` bytes at `offset` of `buf` on `conn`, into the next receive buffer its peer
    /// posts. Completes once every byte is acknowledged and no WR reads the buffer any more
    /// (then the buffer may be changed), and after every message that went out before it on
    /// `conn` (a send goes out once the peer's receive buffer is matched with it, a write at
    /// once; the peer delivers in that order, so a message after one that fails fails too);
    /// fails with [`EngineError::TooLarge`] if the peer's buffer is smaller.
    pub fn send(&mut self, conn: ConnId, buf: &Buffer, offset: u64, len: u64) -> Result<Request> {
        self.send_with(conn, buf, offset, len, Opts::default())
    }

    /// [`send`](Self::send) with options: with a [timeout](Opts::timeout), a send not matched
    /// with the peer's receive buffer by then fails with [`EngineError::TimedOut`] (and the
    /// connection goes on); one that is, but has not completed, fails the connection (the
    /// peer's receive would never be filled otherwise).
    pub fn send_with(
        &mut self,
        conn: ConnId,
        buf: &Buffer,
        offset: u64,
        len: u64,
        opts: Opts,
    ) -> Result<Request> {
        self.unsettle();
        self.start_request(conn, buf, (offset, len), Op::Send, opts)
    }

    /// Posts `len` bytes at `offset` of `buf` to receive the next message of `conn`, and
    /// advertises it to the peer. Completes with the message's length once all of it is in
    /// place; receives complete in the order they were posted.
    pub fn recv(&mut self, conn: ConnId, buf: &Buffer, offset: u64, len: u64) -> Result<Request> {
        self.recv_with(conn, buf, offset, len, Opts::default())
    }

    /// [`recv`](Self::recv) with options: with a [timeout](Opts::timeout), a receive the
    /// peer has not matched with a send by then is withdrawn (the peer matches its next send
    /// with the next receive) and fails with [`EngineError::TimedOut`], the connection going
    /// on; one whose message is arriving fails the connection.
    pub fn recv_with(
        &mut self,
        conn: ConnId,
        buf: &Buffer,
        offset: u64,
        len: u64,
        opts: Opts,
    ) -> Result<Request> {
        self.unsettle();
        self.start_request(conn, buf, (offset, len), Op::Recv, opts)
    }

    /// Writes `len` bytes at `offset` of `buf` into `dst` (a peer's exported region) at
    /// `dst_offset`, with the same reliability as a send, in the order messages go out (see
    /// [`send`](Self::send)); nothing is matched at the peer. A write into memory the peer
    /// does not offer (a wrong descriptor, or an export it withdrew meanwhile) fails the
    /// connection, with the requests in flight on it, in both modes: refused by the peer's
    /// NIC (RC) or by the peer's engine (UC).
    pub fn write(
        &mut self,
        conn: ConnId,
        buf: &Buffer,
        offset: u64,
        len: u64,
        dst: &Descriptor,
        dst_offset: u64,
    ) -> Result<Request> {
        self.write_with(conn, buf, offset, len, dst, dst_offset, Opts::default())
    }

    /// [`write`](Self::write) with options: with a [timeout](Opts::timeout), a write none of
    /// whose chunks went out by then fails with [`EngineError::TimedOut`] (the connection going
    /// on); one that started fails the connection. With a [note](Opts::note), the peer's
    /// application is handed the note once the write is in place.
    #[allow(clippy::too_many_arguments)] // write's arguments, and the options
    pub fn write_with(
        &mut self,
        conn: ConnId,
        buf: &Buffer,
        offset: u64,
        len: u64,
        dst: &Descriptor,
        dst_offset: u64,
        opts: Opts,
    ) -> Result<Request> {
        self.unsettle();
        let op = Op::Write {
            dst: *dst,
            dst_offset,
        };
        self.start_request(conn, buf, (offset, len), op, opts)
    }

    /// A new request of `op` on `conn`, started.
    fn start_request(
        &mut self,
        conn: ConnId,
        buf: &Buffer,
        range: (u64, u64),
        op: Op,
        opts: Opts,
    ) -> Result<Request> {
        let req = self.new_request(conn);
        self.start(conn, buf, range, op, &req, opts)?;
        Ok(req)
    }

    /// A request of a transfer on `conn` (it may be cancelled).
    pub(crate) fn new_request(&self, conn: ConnId) -> Request {
        Request::of_engine(&self.owner, Some(self.cancel_to(conn)))
    }

    /// Where the cancellation of a request on `conn` goes.
    pub(crate) fn cancel_to(&self, conn: ConnId) -> CancelTo {
        CancelTo {
            queue: std::sync::Arc::clone(&self.cancels),
            conn,
        }
    }

    /// Starts `op` of `range` of `buf` on `conn`, completing `req`, with `opts`.
    pub(crate) fn start(
        &mut self,
        conn: ConnId,
        buf: &Buffer,
        (offset, len): (u64, u64),
        op: Op,
        req: &Request,
        opts: Opts,
    ) -> Result<()> {
        let block = |remote| crate::vectored::Block {
            buf: buf.clone(),
            offset,
            remote,
            remote_offset: 0,
            len,
        };
        match op {
            Op::Write { dst, dst_offset } => {
                let b = crate::vectored::Block {
                    remote_offset: dst_offset,
                    ..block(dst)
                };
                return self.start_writes(conn, std::slice::from_ref(&b), req, opts, false);
            }
            Op::Read { src, src_offset } => {
                let b = crate::vectored::Block {
                    remote_offset: src_offset,
                    ..block(src)
                };
                return self.start_reads(conn, std::slice::from_ref(&b), req, opts, false);
            }
            _ if opts.has_note() => {
                let on = if matches!(op, Op::Send) {
                    "a send"
                } else {
                    "a receive"
                };
                return Err(EngineError::MisplacedNote(on));
            }
            Op::Send => self.start_send(conn, buf, (offset, len), req)?,
            Op::Recv => self.start_recv(conn, buf, (offset, len), req)?,
        }
        self.armed(conn, req, opts);
        Ok(())
    }

    /// Arms `req`'s deadline, if `opts` has one, and `conn`'s keep-alive: a request on it
    /// started.
    pub(crate) fn armed(&mut self, conn: ConnId, req: &Request, opts: Opts) {
        let now = self.clock.now();
        self.arm_deadline(req, opts, now);
        self.arm_keepalive(conn.index, now);
    }

    fn start_send(
        &mut self,
        conn: ConnId,
        buf: &Buffer,
        (offset, len): (u64, u64),
        req: &Request,
    ) -> Result<()> {
        let (use_, local, lkey) = self.memory.take_use(buf, offset, len)?;
        let c = self.conn_for_request(conn)?;
        c.sends.push_back(PendingSend {
            local,
            lkey,
            len,
            req: req.clone(),
            use_,
        });
        self.mark_ready(conn.index);
        Ok(())
    }

    fn start_recv(
        &mut self,
        conn: ConnId,
        buf: &Buffer,
        (offset, len): (u64, u64),
        req: &Request,
    ) -> Result<()> {
        let (use_, addr, _) = self.memory.take_use(buf, offset, len)?;
        self.post_recv(conn, use_, (addr, len), req, None)
    }

    /// Posts `addr..addr + len` (in the buffer `use_` holds) as the next receive of `conn`,
    /// or as a read from `read` (see `read.rs`), and advertises it.
    pub(crate) fn post_recv(
        &mut self,
        conn: ConnId,
        use_: crate::memory::BufUse,
        (addr, len): (u64, u64),
        req: &Request,
        read: Option<crate::read::ReadFrom>,
    ) -> Result<()> {
        let max = self.cfg.max_recvs;
        // With windows, the advertisement leaves once the window is bound (see `window.rs`).
        let windows = self.cfg.recv_keys == RecvKeys::Window;
        let c = self.conn_for_request(conn)?;
        if c.recvs_posted >= max {
            return Err(EngineError::Limit {
                what: "receives posted on one connection",
                limit: max.into(),
            });
        }
        let seq = c.next_seq;
        let slot = seq as usize % RECV_IDS;
        if c.recvs[slot].is_some() {
            // The receive posted 128 ago is still waiting (its peer completed later ones
            // first): refuse rather than lose it.
            return Err(EngineError::Limit {
                what: "receives outstanding on one connection (the oldest is still waiting)",
                limit: RECV_IDS as u64,
            });
        }
        let rkey = use_.mem.rkey();
        c.recvs[slot] = Some(PostedRecv {
            seq,
            use_,
            addr,
            len,
            rkey,
            req: req.clone(),
            advertised: !windows,
            window: Win::Idle,
            withdrawing: None,
            ending: None,
            read,
        });
        if windows && let Err(e) = self.bind_window(conn.index, slot) {
            let c = self.open_conn(conn)?;
            c.recvs[slot] = None;
            return Err(e);
        }
        let c = self.open_conn(conn)?;
        c.next_seq = c.next_seq.wrapping_add(1);
        c.recvs_posted += 1;
        if !windows {
            let advert = c.recvs[slot].as_ref().expect("posted").advert();
            self.advertise(conn.index, advert);
        }
        self.mark_ctl(conn.index);
        Ok(())
    }
}
