//! One-sided reads ([`Engine::read`], [`Engine::read_v`](crate::Engine::read_v)) of regions a
//! peer exported for reading.
//!
//! - **RC**: RDMA READs, posted by this engine on the connection's data QPs (pieces of at
//!   most [`READ_PIECE`] bytes, spread over the paths, in the send-queue slots the transmit
//!   side leaves them: [`uccl_tx::Tx::reserve`]); the peer's NIC answers, checking the key,
//!   range and READ right of its export, and retries what is lost. A piece completes when its
//!   bytes are in place; the peer's CPU does nothing.
//! - **UC**, which has no READ: the engine asks the peer's engine over the control QP
//!   (`Ctl::Read`), with the local range advertised as a receive (a window over exactly it, as
//!   for [`Engine::recv`]). The peer's engine checks its export's key, range and READ right
//!   before a byte moves, then writes the range back as a message of its own flow (reliable as
//!   every message is, retransmissions checked against the advertised range), or refuses and
//!   says why (`Ctl::ReadRefused`; that side is `serve.rs`); the read then fails with
//!   [`EngineError::ReadRefused`] and the connection goes on.
//!
//! Pieces wait in their connection's queue until there is room (send-queue slots on RC,
//! receive slots on UC), and are taken in order; a read completes once each of its pieces has
//! (a [`Request`] in parts).

use uccl_tx::PathId;
use verbs_safe::WrSlot;
use verbs_safe::sys::{ibv_send_flags, ibv_sge, ibv_wr_opcode};

use crate::cancel::{Opts, Why};
use crate::config::Mode;
use crate::conn::RECV_IDS;
use crate::descriptor::{Access, Descriptor};
use crate::engine::{ConnId, Engine};
use crate::error::{EngineError, Result};
use crate::memory::{BufUse, Buffer, ReadRefusal};
use crate::request::{Done, Request};
use crate::round::Cqe;
use crate::vectored::Block;

/// The most bytes one RDMA READ asks for (RC): a read is cut into pieces this long, spread
/// over the connection's paths, so they are answered together.
pub(crate) const READ_PIECE: u64 = 256 << 10;

/// The most RDMA READs in flight on one path: what a NIC answers at once (`max_rd_atomic`,
/// 16 on the engine's QPs).
const MAX_READS_PER_PATH: u8 = 16;

/// Where a read's bytes come from at the peer: its address and the export's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReadFrom {
    pub(crate) src: u64,
    pub(crate) rkey: u32,
}

/// A piece of a read waiting to be issued.
pub(crate) struct ReadPiece {
    req: Request,
    use_: BufUse,
    local: u64,
    lkey: u32,
    len: u64,
    from: ReadFrom,
    /// The first piece of its read (while it waits, nothing of the read was issued).
    first: bool,
}

impl ReadPiece {
    /// Fails its read with `e`.
    pub(crate) fn fail(self, e: EngineError) {
        self.req.fail(e);
    }
}

/// An RDMA READ in flight (RC).
struct InRead {
    req: Request,
    len: u64,
    path: PathId,
    ci: u16,
    _use: BufUse,
}

/// The engine's reads in flight (RC) and the connections with pieces waiting.
#[derive(Default)]
pub(crate) struct Reads {
    slots: Vec<Option<InRead>>,
    free: Vec<u32>,
    /// Connections with pieces queued.
    waiting: Vec<u16>,
    /// A chain of READs per path of the connection being issued (reused).
    chains: Vec<Vec<WrSlot<1>>>,
    /// RDMA READs in flight on each path (by [`PathId`]).
    per_path: Vec<u8>,
}

impl Reads {
    /// Fails every read in flight with `e` (the engine stops). Their slots stay until their
    /// completions (flushes) are polled, which give their send-queue room back.
    pub(crate) fn fail_all(&mut self, e: &EngineError) {
        for r in self.slots.iter().flatten() {
            r.req.fail(e.clone());
        }
    }

    /// Whether `req` has an RDMA READ in flight.
    fn in_flight(&self, req: &Request) -> bool {
        self.slots.iter().flatten().any(|r| r.req.same(req))
    }
}

impl Engine {
    /// Reads `len` bytes at `src_offset` of `src` (a region the peer exported for reading:
    /// [`Engine::export_with`] and [`Access::READ`]) into `offset..offset + len` of `buf`.
    /// Completes once every byte is in place, exactly once and byte-exact under loss, as
    /// writes are. A read does not wait for the sends and writes before it on `conn` (nor
    /// they for it), and reads may complete in any order: to read what was written, wait for
    /// the write first. Fails at once, moving nothing, for a range outside `src` or an export
    /// not readable; one the peer refuses fails on UC with [`EngineError::ReadRefused`] (the
    /// connection goes on), and on RC at the peer's NIC (a remote access error, which fails
    /// the connection, as a refused write does).
    ///
    /// On UC a read's bytes come back as a message into a receive of its own, which takes a
    /// place among the connection's receives (numbered in a ring of 128, and at most
    /// `max_recvs` outstanding): once the ring has come round to a receive the peer has not
    /// matched yet, the next reads wait for it (a receive the peer never sends to holds them
    /// up until it is cancelled or times out: give such receives a [timeout](Opts::timeout)).
    #[allow(clippy::too_many_arguments)] // read's arguments, as write's
    pub fn read(
        &mut self,
        conn: ConnId,
        buf: &Buffer,
        offset: u64,
        src: &Descriptor,
        src_offset: u64,
        len: u64,
    ) -> Result<Request> {
        self.read_with(conn, buf, offset, src, src_offset, len, Opts::default())
    }

    /// [`read`](Self::read) with options: with a [timeout](Opts::timeout), a read none of
    /// whose pieces was issued by then fails with [`EngineError::TimedOut`] (the connection
    /// goes on); one that was fails the connection (the peer may be writing the buffer). A
    /// note is refused (notes ride on writes).
    #[allow(clippy::too_many_arguments)] // read's arguments, and the options
    pub fn read_with(
        &mut self,
        conn: ConnId,
        buf: &Buffer,
        offset: u64,
        src: &Descriptor,
        src_offset: u64,
        len: u64,
        opts: Opts,
    ) -> Result<Request> {
        self.unsettle();
        let req = self.new_request(conn);
        let op = crate::transfer::Op::Read {
            src: *src,
            src_offset,
        };
        self.start(conn, buf, (offset, len), op, &req, opts)?;
        Ok(req)
    }

    /// Starts a read of `blocks` on `conn`, completing `req` (`vectored`: errors name the
    /// block). Nothing starts unless every block is good.
    pub(crate) fn start_reads(
        &mut self,
        conn: ConnId,
        blocks: &[Block],
        req: &Request,
        opts: Opts,
        vectored: bool,
    ) -> Result<()> {
        if opts.has_note() {
            return Err(EngineError::MisplacedNote("a read"));
        }
        let pieces = self.claim(conn, blocks, Access::READ, vectored)?;
        if pieces.is_empty() {
            req.complete(Ok(Done { len: 0 }));
            return Ok(());
        }
        // Cut into pieces as they are issued (see `issue_rc`): counted now.
        let piece = match self.cfg.mode {
            Mode::Rc => READ_PIECE,
            Mode::Uc => u64::MAX,
        };
        req.set_parts(
            pieces
                .iter()
                .map(|(m, _)| m.len.div_ceil(piece).max(1))
                .sum(),
        );
        let c = self.open_conn(conn)?;
        for (k, (m, use_)) in pieces.into_iter().enumerate() {
            c.reads.push_back(ReadPiece {
                req: req.clone(),
                use_,
                local: m.local_addr,
                lkey: m.lkey,
                len: m.len,
                from: ReadFrom {
                    src: m.remote_addr,
                    rkey: m.rkey,
                },
                first: k == 0,
            });
        }
        if !c.in_reads {
            c.in_reads = true;
            self.reads.waiting.push(conn.index);
        }
        self.armed(conn, req, opts);
        Ok(())
    }

    /// Issues the queued pieces of every connection waiting, as far as there is room; whether
    /// any was.
    pub(crate) fn issue_reads(&mut self) -> bool {
        if self.reads.waiting.is_empty() {
            return false;
        }
        let mut waiting = std::mem::take(&mut self.reads.waiting);
        let mut issued = false;
        waiting.retain(|&ci| {
            let queued = |e: &Engine| {
                e.conns[usize::from(ci)]
                    .as_ref()
                    .map_or(0, |c| c.reads.len())
            };
            let before = queued(self);
            match self.cfg.mode {
                Mode::Rc => self.issue_rc(ci),
                Mode::Uc => self.issue_uc(ci),
            }
            issued |= queued(self) != before;
            let Some(c) = self.conns[usize::from(ci)].as_mut() else {
                return false;
            };
            c.in_reads = c.is_open() && !c.reads.is_empty();
            c.in_reads
        });
        waiting.append(&mut self.reads.waiting);
        self.reads.waiting = waiting;
        issued
    }

    /// RC: posts queued pieces of connection `ci` as RDMA READs, a chain per path, while
    /// its paths have send-queue slots.
    fn issue_rc(&mut self, ci: u16) {
        let Some(c) = self.conns[usize::from(ci)].as_mut().filter(|c| c.is_open()) else {
            return;
        };
        let r = &mut self.reads;
        let lanes = c.paths.len();
        if r.chains.len() < lanes {
            r.chains.resize_with(lanes, Vec::new);
        }
        'pieces: while let Some(p) = c.reads.front() {
            if p.req.is_done() {
                // Its read failed (a piece refused, a post that failed): nothing more of it.
                c.reads.pop_front();
                continue;
            }
            if p.len == 0 {
                let p = c.reads.pop_front().expect("checked");
                p.req.complete(Ok(Done { len: 0 }));
                continue;
            }
            // The next path with a free slot and fewer than MAX_READS_PER_PATH reads, round
            // robin (beyond what the NIC answers at once, READs would only hold up the
            // path's writes behind them).
            let mut lane = None;
            for k in 0..lanes {
                let l = (c.read_lane + k) % lanes;
                let path = usize::from(c.paths[l].0);
                if r.per_path.len() <= path {
                    r.per_path.resize(path + 1, 0);
                }
                if r.per_path[path] < MAX_READS_PER_PATH && self.tx.reserve(c.paths[l], 1) {
                    r.per_path[path] += 1;
                    lane = Some(l);
                    break;
                }
            }
            let Some(l) = lane else { break 'pieces };
            c.read_lane = (l + 1) % lanes;
            // The block's next piece: the whole of what is left, or READ_PIECE of it.
            let front = c.reads.front_mut().expect("checked");
            let p = if front.len <= READ_PIECE {
                c.reads.pop_front().expect("checked")
            } else {
                let len = READ_PIECE;
                let piece = ReadPiece {
                    req: front.req.clone(),
                    use_: self.memory.dup(&front.use_),
                    local: front.local,
                    lkey: front.lkey,
                    len,
                    from: front.from,
                    first: front.first,
                };
                front.local += len;
                front.len -= len;
                front.from.src += len;
                front.first = false;
                piece
            };
            let slot = r.free.pop().unwrap_or_else(|| {
                r.slots.push(None);
                (r.slots.len() - 1) as u32
            });
            let mut w = WrSlot::<1>::default();
            w.wr.wr_id = crate::wrid::read(ci, slot);
            w.wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_READ;
            w.wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
            w.wr.wr.rdma.remote_addr = p.from.src;
            w.wr.wr.rdma.rkey = p.from.rkey;
            w.sges[0] = ibv_sge {
                addr: p.local,
                length: p.len as u32,
                lkey: p.lkey,
            };
            w.wr.num_sge = 1;
            r.chains[l].push(w);
            r.slots[slot as usize] = Some(InRead {
                req: p.req,
                len: p.len,
                path: c.paths[l],
                ci,
                _use: p.use_,
            });
        }
        let mut failed = None;
        for l in 0..lanes {
            let chain = &mut r.chains[l];
            if chain.is_empty() {
                continue;
            }
            let order = &mut self.scratch.order;
            order.clear();
            order.extend(0..chain.len() as u32);
            let posted = match c.qps[l].post_slots(chain, order) {
                Ok(()) => chain.len(),
                Err(e) => {
                    let n = match e {
                        verbs_safe::Error::Post { index, .. } => index.min(chain.len()),
                        _ => 0,
                    };
                    failed = Some(EngineError::verbs("posting an RDMA READ")(e));
                    n
                }
            };
            self.stats.read_wrs += posted as u64;
            self.stats.post_send_calls += 1;
            // What was not posted will not complete: its slot, send-queue room and request go.
            for w in chain.drain(..).skip(posted) {
                let slot = w.wr.wr_id as u32;
                if let Some(x) = r.slots[slot as usize].take() {
                    self.tx.unreserve(x.path, 1);
                    r.per_path[usize::from(x.path.0)] -= 1;
                    if let Some(e) = &failed {
                        x.req.fail(e.clone());
                    }
                }
                r.free.push(slot);
            }
        }
        if let Some(e) = failed {
            tracing::warn!(conn = ci, error = %e, "posting RDMA READs failed");
            self.fail_conn(ci, "posting an RDMA READ failed", false);
        }
    }

    /// UC: advertises queued pieces of connection `ci` to the peer as reads, while it has
    /// receive slots.
    fn issue_uc(&mut self, ci: u16) {
        loop {
            let max = self.cfg.max_recvs;
            let Some(c) = self.conns[usize::from(ci)].as_mut().filter(|c| c.is_open()) else {
                return;
            };
            if c.reads.is_empty() || !c.recv_room(max) {
                return;
            }
            let p = c.reads.pop_front().expect("checked");
            if p.req.is_done() {
                continue;
            }
            let id = c.id;
            let req = p.req.clone();
            if let Err(e) = self.post_recv(id, p.use_, (p.local, p.len), &p.req, Some(p.from)) {
                req.fail(e);
            }
        }
    }

    /// An RDMA READ completed (RC): its piece is in place, or its connection fails.
    pub(crate) fn on_read_done(&mut self, slot: u32, e: Cqe) {
        let Some(x) = self
            .reads
            .slots
            .get_mut(slot as usize)
            .and_then(Option::take)
        else {
            self.stats.dropped_invalid += 1;
            return;
        };
        self.reads.free.push(slot);
        self.reads.per_path[usize::from(x.path.0)] -= 1;
        self.tx.unreserve(x.path, 1);
        if e.ok {
            self.stats.bytes_read += x.len;
            x.req.complete(Ok(Done { len: x.len }));
            return;
        }
        let why = match e.status {
            Some(verbs_safe::WcStatus::RemAccessErr) => {
                "the peer's NIC refused a read from this end: remote access error (a range \
                 outside the export, an export not readable, or one withdrawn)"
                    .to_string()
            }
            s => format!("an RDMA READ failed ({s:?})"),
        };
        self.fail_conn(x.ci, why, true);
        let err = match self.conns[usize::from(x.ci)].as_ref().map(|c| &c.state) {
            Some(crate::conn::State::Draining(e)) => e.clone(),
            _ => EngineError::Stopped,
        };
        x.req.fail(err);
    }

    /// The peer refused read `seq` of connection `ci` (UC): it fails, moving nothing.
    pub(crate) fn on_read_refused(&mut self, ci: u16, seq: u32, why: u8) {
        let Some(c) = self.conns[usize::from(ci)].as_mut() else {
            return;
        };
        let slot = seq as usize % RECV_IDS;
        let ours = c.recvs[slot]
            .as_ref()
            .is_some_and(|r| r.seq == seq && r.read.is_some() && r.ending.is_none());
        match ReadRefusal::from_code(why).filter(|_| ours) {
            Some(why) => self.end_recv(ci, slot, Err(EngineError::ReadRefused(why.reason()))),
            None => self.stats.dropped_invalid += 1,
        }
    }

    /// Withdraws the read of `req` on connection `ci` if none of its pieces was issued (see
    /// `cancel.rs`); whether `req` is a read at all.
    pub(crate) fn withdraw_read(&mut self, ci: u16, req: &Request, why: Why) -> bool {
        let Some(c) = self.conns[usize::from(ci)].as_mut() else {
            return false;
        };
        let queued = c.reads.iter().position(|p| p.req.same(req));
        if let Some(i) = queued
            && c.reads[i].first
        {
            c.reads.retain(|p| !p.req.same(req));
            req.fail(why.error());
            return true;
        }
        if queued.is_none() && !self.reads.in_flight(req) {
            return false;
        }
        if why == Why::Deadline {
            req.fail(EngineError::TimedOut(
                "the peer was being read when it passed",
            ));
            self.fail_conn(ci, "a read passed its deadline after it started", true);
        }
        true
    }
}
