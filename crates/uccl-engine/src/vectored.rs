//! Vectored transfers: [`Engine::write_v`] and [`Engine::read_v`] move a list of blocks (a
//! local range and a remote one each, of any length and anywhere in their buffers) as one
//! request, which completes once every block is in place.
//!
//! Each block of a write is a message of the connection's flow, taken straight from its buffer
//! (no staging copy on either side): the transmit side chains the chunks of consecutive blocks
//! into one post per path (a doorbell for many small blocks). Each block of a read is a read
//! of its own (pieces of RDMA READs posted in chains on RC; a read served by the peer's engine
//! on UC). The list is checked before anything starts: a bad block fails the call with
//! [`EngineError::Block`], naming it.

use uccl_tx::Message;

use crate::cancel::Opts;
use crate::conn::WRITE_RID;
use crate::descriptor::{Access, Descriptor};
use crate::engine::{ConnId, Engine};
use crate::error::{EngineError, Result};
use crate::memory::{BufUse, Buffer};
use crate::request::{Done, Request};

/// One block of a vectored transfer: `len` bytes at `offset` of `buf`, and at `remote_offset`
/// of `remote` (a peer's export: written by [`Engine::write_v`], read by
/// [`Engine::read_v`]).
#[derive(Debug, Clone)]
pub struct Block {
    /// The local buffer.
    pub buf: Buffer,
    /// Where the block starts in it.
    pub offset: u64,
    /// The peer's export.
    pub remote: Descriptor,
    /// Where the block starts in the export.
    pub remote_offset: u64,
    /// The block's bytes.
    pub len: u64,
}

impl Block {
    /// The address of the block in its export, if the export grants `needs` and holds it.
    pub(crate) fn remote_place(&self, needs: Access) -> Result<u64> {
        if !self.remote.access.allows(needs) {
            return Err(EngineError::NotGranted {
                export: self.remote,
                needs,
            });
        }
        self.remote
            .place(self.remote_offset, self.len)
            .map_err(EngineError::BadRange)
    }
}

/// `e`, as the error of block `index` of a vectored call (`vectored`), or as it is.
fn named(vectored: bool, index: usize, e: EngineError) -> EngineError {
    match vectored {
        true => EngineError::Block {
            index,
            error: Box::new(e),
        },
        false => e,
    }
}

impl Engine {
    /// Writes every block of `blocks` into its remote place, as one request: it completes
    /// once every block is in place (with the sum of their lengths), with the guarantees of
    /// [`write`](Self::write) for each. A bad block (a range outside its buffer or export, an
    /// export not writable, a buffer given back) fails the call with [`EngineError::Block`]
    /// and nothing starts. An empty list completes at once.
    pub fn write_v(&mut self, conn: ConnId, blocks: &[Block]) -> Result<Request> {
        self.write_v_with(conn, blocks, Opts::default())
    }

    /// [`write_v`](Self::write_v) with options: a [timeout](Opts::timeout) (as for
    /// [`write_with`](Self::write_with): withdrawn if no block started, else the connection
    /// fails), a [note](Opts::note) handed to the peer's application once every block is in
    /// place.
    pub fn write_v_with(&mut self, conn: ConnId, blocks: &[Block], opts: Opts) -> Result<Request> {
        self.unsettle();
        let req = self.new_request(conn);
        self.start_writes(conn, blocks, &req, opts, true)?;
        Ok(req)
    }

    /// Reads every block of `blocks` from its remote place into its local one, as one request
    /// that completes once every block is in place, with the guarantees of
    /// [`read`](Self::read) for each. A bad block fails the call with [`EngineError::Block`]
    /// and nothing starts. An empty list completes at once.
    pub fn read_v(&mut self, conn: ConnId, blocks: &[Block]) -> Result<Request> {
        self.read_v_with(conn, blocks, Opts::default())
    }

    /// [`read_v`](Self::read_v) with options (see [`read_with`](Self::read_with)).
    pub fn read_v_with(&mut self, conn: ConnId, blocks: &[Block], opts: Opts) -> Result<Request> {
        self.unsettle();
        let req = self.new_request(conn);
        self.start_reads(conn, blocks, &req, opts, true)?;
        Ok(req)
    }

    /// Checks `blocks` for a transfer on `conn` that needs `needs` of their exports
    /// (`vectored`: errors name the block) and holds their buffers: each block's local and
    /// remote range. Nothing is held unless every block is good.
    pub(crate) fn claim(
        &mut self,
        conn: ConnId,
        blocks: &[Block],
        needs: Access,
        vectored: bool,
    ) -> Result<Vec<(Message, BufUse)>> {
        self.conn_for_request(conn)?;
        let mut out = Vec::with_capacity(blocks.len());
        for (i, b) in blocks.iter().enumerate() {
            let name = |e| named(vectored, i, e);
            let remote_addr = b.remote_place(needs).map_err(name)?;
            let (use_, local_addr, lkey) = self
                .memory
                .take_use(&b.buf, b.offset, b.len)
                .map_err(name)?;
            let m = Message {
                local_addr,
                lkey,
                len: b.len,
                remote_addr,
                rkey: b.remote.rkey,
            };
            out.push((m, use_));
        }
        Ok(out)
    }

    /// Starts writes of `blocks` on `conn`, completing `req` (`vectored`: errors name the
    /// block). Nothing starts unless every block is good.
    pub(crate) fn start_writes(
        &mut self,
        conn: ConnId,
        blocks: &[Block],
        req: &Request,
        opts: Opts,
        vectored: bool,
    ) -> Result<()> {
        let msgs = self.claim(conn, blocks, Access::WRITE, vectored)?;
        if msgs.is_empty() {
            if opts.has_note() {
                return Err(EngineError::MisplacedNote("a vectored write of no block"));
            }
            req.complete(Ok(Done { len: 0 }));
            return Ok(());
        }
        req.set_parts(msgs.len() as u64);
        // The last block carries the note: it is delivered after it, so after every block.
        let note = match opts.the_note() {
            Some(_) => Some(self.next_noted(conn)?),
            None => None,
        };
        let last = msgs.len() - 1;
        for (i, (m, use_)) in msgs.into_iter().enumerate() {
            let c = self.open_conn(conn)?;
            let (rid, serial) = match note {
                Some((rid, serial)) if i == last => (rid, Some(serial)),
                _ => (WRITE_RID | (c.next_write & 0x3f), None),
            };
            c.next_write = c.next_write.wrapping_add(1);
            let msg = match self.tx.send_as(conn.index, m, rid) {
                Ok(msg) => msg,
                Err(e) => {
                    // The blocks before it went: the request fails (its blocks are lost to it).
                    let e = EngineError::from(e);
                    req.fail(e.clone());
                    return Err(e);
                }
            };
            let c = self.open_conn(conn)?;
            c.track(msg, req.clone(), (m.len, true), use_).note = serial;
            if let (Some(n), Some(_)) = (opts.the_note(), serial) {
                self.send_note(conn, n)?;
            }
        }
        self.armed(conn, req, opts);
        Ok(())
    }
}
