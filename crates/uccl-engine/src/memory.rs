//! Memory registered with an engine, and what peers may reach of it.
//!
//! - A [`Buffer`] is registered once and pinned once, to the one pin table every data QP of the
//!   engine shares (O(log n), whatever the number of connections). Its own region grants peers
//!   nothing (with [`RecvKeys::Window`]): they reach it only through
//!   the keys below.
//! - It is given back by [`Engine::deregister`] (which withdraws its exports at once), or when
//!   its last handle is dropped (then its exports keep it until they are withdrawn): from then
//!   on it takes no new work ([`EngineError::Deregistered`]), and once no request and no
//!   export uses it, it is unpinned. Its memory returns when the last posted WR naming it is
//!   done (verbs-safe's pin table waits for that) and the last handle is gone.
//! - An export ([`Engine::export`]) is a region of its own over exactly the exported range,
//!   with its own key: a write outside it fails at the NIC, and
//!   [`Engine::withdraw_export`] deregisters it (later writes fail too).
//!
//! Cost (the reason for the choice): a registration per export, as exports are made once and
//! used many times; a memory window bind per receive (see `window.rs`), as receives come and
//! go with every message.

use std::collections::HashMap;
use std::sync::Arc;

use crossbeam_queue::SegQueue;
use verbs_safe::{AccessFlags, DmaBuf, DmaRange, Pins};

use crate::config::RecvKeys;
use crate::descriptor::{Access, Descriptor};
use crate::engine::Engine;
use crate::error::{EngineError, Result};

/// A buffer of an engine: a slot and a generation (a stale id never names a newer buffer in
/// the same slot: 64 bits, as a slot freed and taken again every microsecond would wrap 32 in
/// about an hour).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufferId {
    index: u32,
    generation: u64,
}

impl std::fmt::Display for BufferId {
    /// "3 (generation 2)".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (generation {})", self.index, self.generation)
    }
}

/// Memory registered with an engine: what sends read and what receives and one-sided writes
/// land in. The NIC and peers may access it at any time, so its bytes are reached by copies
/// ([`read_at`](Self::read_at), [`write_at`](Self::write_at)), never by references.
///
/// Cloning gives another handle to the same buffer. It is given back by
/// [`Engine::deregister`], or when its last handle is dropped.
#[derive(Clone)]
pub struct Buffer {
    handle: Arc<Handle>,
}

struct Handle {
    engine: u64,
    id: BufferId,
    mem: Arc<DmaBuf>,
    /// Where the engine learns that the last handle went.
    ended: Arc<SegQueue<Ended>>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.ended.push(Ended::Handles(self.id));
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("engine", &self.handle.engine)
            .field("id", &self.handle.id)
            .field("len", &self.len())
            .finish()
    }
}

impl Buffer {
    /// Its id.
    pub fn id(&self) -> BufferId {
        self.handle.id
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.handle.mem.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.handle.mem.is_empty()
    }

    /// Copies `out.len()` bytes at `offset` into `out`.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.handle
            .mem
            .read_at(offset, out)
            .map_err(|_| self.outside(offset as u64, out.len() as u64, "a read"))
    }

    /// Copies `data` to `offset`.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.handle
            .mem
            .write_at(offset, data)
            .map_err(|_| self.outside(offset as u64, data.len() as u64, "a write"))
    }

    /// The engine it belongs to.
    pub(crate) fn engine(&self) -> u64 {
        self.handle.engine
    }

    /// Checks `offset..offset + len` lies inside.
    pub(crate) fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        let end = offset.checked_add(len);
        if end.is_none_or(|e| e > self.len() as u64) {
            return Err(self.outside(offset, len, "the range"));
        }
        Ok(())
    }

    /// `what` of `len` bytes at `offset`, which lies outside this buffer.
    fn outside(&self, offset: u64, len: u64, what: &str) -> EngineError {
        let (id, size) = (self.id(), self.len());
        EngineError::BadRange(format!(
            "{what} of {len} bytes at offset {offset} runs past buffer {id} ({size} bytes)"
        ))
    }
}

/// Why this engine refuses a peer's read of an export (told to the reader in its reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadRefusal {
    /// No export has the key (never given, or withdrawn).
    NoExport = 1,
    /// The range is not inside the export.
    OutOfRange = 2,
    /// The export may not be read.
    NotReadable = 3,
    /// The peer could not take the read on (its connection is going, or the export was
    /// withdrawn before the read started).
    Withdrawn = 4,
}

impl ReadRefusal {
    /// From its code on the wire.
    pub(crate) fn from_code(c: u8) -> Option<ReadRefusal> {
        match c {
            1 => Some(ReadRefusal::NoExport),
            2 => Some(ReadRefusal::OutOfRange),
            3 => Some(ReadRefusal::NotReadable),
            4 => Some(ReadRefusal::Withdrawn),
            _ => None,
        }
    }

    /// What the reader is told.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            ReadRefusal::NoExport => {
                "the peer has no export with that key (never given, or withdrawn)"
            }
            ReadRefusal::OutOfRange => "the range is not inside the peer's export",
            ReadRefusal::NotReadable => "the peer's export may not be read (exported for writes)",
            ReadRefusal::Withdrawn => {
                "the peer withdrew the export (or was closing) before the read started"
            }
        }
    }
}

/// A request's hold on a buffer: while one lives, the buffer's deregistration waits. It also
/// gives the request the buffer's memory (a retransmitted chunk is copied into it).
pub(crate) struct BufUse {
    id: BufferId,
    pub(crate) mem: Arc<DmaBuf>,
    ended: Arc<SegQueue<Ended>>,
}

impl Drop for BufUse {
    fn drop(&mut self) {
        self.ended.push(Ended::Use(self.id));
    }
}

/// What ended on another thread, for the engine to take in at its next round.
enum Ended {
    /// A buffer's last handle was dropped.
    Handles(BufferId),
    /// A request's hold on a buffer ended.
    Use(BufferId),
}

/// An export: its own region over the range, and the buffer it is part of.
pub(crate) struct Export {
    pub(crate) region: DmaRange,
    buf: BufferId,
    /// What peers may do there (the region's access flags say the same to the NIC).
    access: Access,
}

struct Entry {
    mem: Arc<DmaBuf>,
    /// Requests using it (sends and writes reading it, receives posted into it).
    uses: u32,
    /// The rkeys of its exports.
    exports: Vec<u32>,
    /// Given back: it takes no new work and goes once nothing uses it.
    dying: bool,
}

impl Entry {
    /// Given back and used by nothing any more: it can go.
    fn done(&self) -> bool {
        self.dying && self.uses == 0 && self.exports.is_empty()
    }
}

struct Slot {
    generation: u64,
    entry: Option<Entry>,
}

/// The buffers and exports of an engine.
pub(crate) struct Memory {
    engine: u64,
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// The pin table of every data QP (and the retransmission headers).
    pub(crate) pins: Arc<Pins>,
    /// Buffers whose last handle was dropped and buffer uses that ended, in the order they
    /// ended.
    ended: Arc<SegQueue<Ended>>,
    /// Exports by rkey.
    exports: HashMap<u32, Export>,
    live: usize,
}

impl Memory {
    pub(crate) fn new(engine: u64) -> Memory {
        Memory {
            engine,
            slots: Vec::new(),
            free: Vec::new(),
            pins: Pins::new(),
            ended: Arc::default(),
            exports: HashMap::new(),
            live: 0,
        }
    }

    /// Buffers registered and not given back.
    pub(crate) fn buffers(&self) -> usize {
        self.live
    }

    /// Exports not withdrawn.
    pub(crate) fn exports(&self) -> usize {
        self.exports.len()
    }

    /// The export with key `rkey` holding `addr..end` and allowing `access`.
    pub(crate) fn export_holding(
        &self,
        rkey: u32,
        (addr, end): (u64, u64),
        access: Access,
    ) -> Option<&Export> {
        self.exports.get(&rkey).filter(|x| {
            x.access.allows(access)
                && addr >= x.region.addr()
                && end <= x.region.addr() + x.region.len() as u64
        })
    }

    /// A use of `addr..end` of the export with key `rkey` (for a peer's read: it must allow
    /// reading), and the lkey to read it with; else why not.
    pub(crate) fn read_use(
        &mut self,
        rkey: u32,
        (addr, end): (u64, u64),
    ) -> std::result::Result<(BufUse, u32), ReadRefusal> {
        let x = self.exports.get(&rkey).ok_or(ReadRefusal::NoExport)?;
        if addr < x.region.addr() || end > x.region.addr() + x.region.len() as u64 {
            return Err(ReadRefusal::OutOfRange);
        }
        if !x.access.allows(Access::READ) {
            return Err(ReadRefusal::NotReadable);
        }
        let id = x.buf;
        let ended = Arc::clone(&self.ended);
        let e = self.live_slot(id).ok_or(ReadRefusal::NoExport)?;
        e.uses += 1;
        let mem = Arc::clone(&e.mem);
        // The buffer's own lkey: its region is pinned to every data QP (the export's is not).
        let lkey = mem.lkey();
        Ok((BufUse { id, mem, ended }, lkey))
    }

    /// The live (not given back) entry of `buf`.
    fn entry(&mut self, buf: &Buffer) -> Result<&mut Entry> {
        if buf.engine() != self.engine {
            return Err(EngineError::BadRange("a buffer of another engine".into()));
        }
        let id = buf.id();
        self.slots
            .get_mut(id.index as usize)
            .filter(|s| s.generation == id.generation)
            .and_then(|s| s.entry.as_mut())
            .filter(|e| !e.dying)
            .ok_or(EngineError::Deregistered(id))
    }

    /// A use of `offset..offset + len` of `buf` by a new request: its address and lkey.
    pub(crate) fn take_use(
        &mut self,
        buf: &Buffer,
        offset: u64,
        len: u64,
    ) -> Result<(BufUse, u64, u32)> {
        buf.check_range(offset, len)?;
        let ended = Arc::clone(&self.ended);
        let e = self.entry(buf)?;
        e.uses += 1;
        let mem = Arc::clone(&e.mem);
        let (addr, lkey) = (mem.addr() + offset, mem.lkey());
        let u = BufUse {
            id: buf.id(),
            mem,
            ended,
        };
        Ok((u, addr, lkey))
    }

    /// Another hold on the buffer `u` holds (a piece of the same request).
    pub(crate) fn dup(&mut self, u: &BufUse) -> BufUse {
        if let Some(e) = self.live_slot(u.id) {
            e.uses += 1;
        }
        BufUse {
            id: u.id,
            mem: Arc::clone(&u.mem),
            ended: Arc::clone(&self.ended),
        }
    }

    /// Whether no handle was dropped and no use ended since the last [`settle`](Self::settle).
    pub(crate) fn is_quiet(&self) -> bool {
        self.ended.is_empty()
    }

    /// Takes in the handles dropped and the uses ended since the last call: buffers given back
    /// with nothing in flight go. Whether there were any.
    pub(crate) fn settle(&mut self) -> bool {
        // A round finds the queue empty almost always: `is_empty` costs two loads, where an
        // empty `pop` costs a full fence.
        if self.is_quiet() {
            return false;
        }
        // In the order they ended. (Taken in another order, each buffer would end up the same:
        // given back, its uses counted down, gone once both; only the order in which the slots
        // of buffers that went return to `free`, so which index a later one gets, would differ.)
        while let Some(ended) = self.ended.pop() {
            match ended {
                Ended::Use(id) => {
                    if let Some(e) = self.live_slot(id) {
                        e.uses -= 1;
                        if e.done() {
                            self.finish(id);
                        }
                    }
                }
                Ended::Handles(id) => self.give_back(id, false),
            }
        }
        true
    }

    fn live_slot(&mut self, id: BufferId) -> Option<&mut Entry> {
        self.slots
            .get_mut(id.index as usize)
            .filter(|s| s.generation == id.generation)
            .and_then(|s| s.entry.as_mut())
    }

    /// Gives buffer `id` back: no new work, its exports withdrawn if `withdraw`, gone once
    /// nothing uses it.
    fn give_back(&mut self, id: BufferId, withdraw: bool) {
        let Some(e) = self.live_slot(id).filter(|e| !e.dying) else {
            return;
        };
        e.dying = true;
        let exports = if withdraw {
            std::mem::take(&mut e.exports)
        } else {
            Vec::new()
        };
        let done = e.done();
        self.live -= 1;
        for rkey in exports {
            self.exports.remove(&rkey);
        }
        if done {
            self.finish(id);
        }
    }

    /// Frees the slot of a buffer given back with nothing in flight, and unpins it (the pin
    /// table keeps it until the last WR naming it is done).
    fn finish(&mut self, id: BufferId) {
        let slot = &mut self.slots[id.index as usize];
        if let Some(e) = slot.entry.take() {
            self.pins.unpin(&e.mem);
            slot.generation = slot.generation.wrapping_add(1);
            self.free.push(id.index);
        }
    }
}

impl Engine {
    /// Registers `len` bytes: a buffer sends may read and receives and one-sided writes may
    /// fill. Peers reach it only through the keys the engine gives them: a receive's (its
    /// range, while it is posted) and an export's (its range, until withdrawn). With
    /// [`RecvKeys::Buffer`] a receive's key is the whole buffer's, for as long as it is
    /// registered.
    pub fn register(&mut self, len: usize) -> Result<Buffer> {
        self.unsettle();
        let m = &mut self.memory;
        let index = match m.free.pop() {
            Some(i) => i,
            None if m.slots.len() < u32::MAX as usize => {
                m.slots.push(Slot {
                    generation: 0,
                    entry: None,
                });
                (m.slots.len() - 1) as u32
            }
            None => {
                return Err(EngineError::Limit {
                    what: "registered buffers",
                    limit: u32::MAX.into(),
                });
            }
        };
        let access = AccessFlags::LOCAL_WRITE
            | match self.cfg.recv_keys {
                RecvKeys::Window => AccessFlags::MW_BIND,
                RecvKeys::Buffer => AccessFlags::REMOTE_WRITE,
            };
        let mem = match self.io.pd.alloc_dma(len, 4096, access) {
            Ok(b) => Arc::new(b),
            Err(e) => {
                m.free.push(index);
                return Err(EngineError::verbs("registering a buffer")(e));
            }
        };
        m.pins.pin(&mem);
        let slot = &mut m.slots[index as usize];
        slot.entry = Some(Entry {
            mem: Arc::clone(&mem),
            uses: 0,
            exports: Vec::new(),
            dying: false,
        });
        m.live += 1;
        let id = BufferId {
            index,
            generation: slot.generation,
        };
        Ok(Buffer {
            handle: Arc::new(Handle {
                engine: self.id,
                id,
                mem,
                ended: Arc::clone(&m.ended),
            }),
        })
    }

    /// Gives `buf` back. From now on it takes no new work ([`EngineError::Deregistered`]) and
    /// its exports are withdrawn (peers' writes into them fail); requests already using it run
    /// to their end (their data stays exact), then it is unpinned. Its memory is freed once no
    /// posted WR names it and every handle is dropped. Dropping every handle without calling
    /// this gives it back too, except that its exports stay until withdrawn
    /// ([`withdraw_export`](Self::withdraw_export)) and keep it meanwhile. Fails with
    /// [`EngineError::Deregistered`] if it was given back already.
    pub fn deregister(&mut self, buf: &Buffer) -> Result<()> {
        self.unsettle();
        let exports = self.memory.entry(buf)?.exports.clone();
        self.memory.give_back(buf.id(), true);
        self.memory.settle();
        for rkey in exports {
            self.stop_serving(rkey);
        }
        Ok(())
    }

    /// Exports `offset..offset + len` of `buf` for one-sided writes by peers: registers that
    /// range on its own, so the descriptor's key reaches exactly it (a write outside fails at
    /// this end's NIC), until [`withdraw_export`](Self::withdraw_export) or the buffer is given
    /// back. Each export is a registration of its own (a system call on hardware).
    pub fn export(&mut self, buf: &Buffer, offset: u64, len: u64) -> Result<Descriptor> {
        self.export_with(buf, offset, len, Access::WRITE)
    }

    /// [`export`](Self::export) with the rights peers get: to read the range
    /// ([`Engine::read`]), to write it, or both. A right not given fails at this end's NIC on
    /// RC (the region's access flags lack it) and is refused by this engine on UC, where reads
    /// are served by it.
    pub fn export_with(
        &mut self,
        buf: &Buffer,
        offset: u64,
        len: u64,
        access: Access,
    ) -> Result<Descriptor> {
        self.unsettle();
        buf.check_range(offset, len)?;
        let e = self.memory.entry(buf)?;
        let mut flags = AccessFlags::LOCAL_WRITE;
        if access.allows(Access::READ) {
            flags |= AccessFlags::REMOTE_READ;
        }
        if access.allows(Access::WRITE) {
            flags |= AccessFlags::REMOTE_WRITE;
        }
        let region = e
            .mem
            .register_range(offset as usize, len as usize, flags)
            .map_err(EngineError::verbs("registering an export"))?;
        let d = Descriptor {
            addr: region.addr(),
            len,
            rkey: region.rkey(),
            access,
        };
        e.exports.push(d.rkey);
        let x = Export {
            region,
            buf: buf.id(),
            access,
        };
        self.memory.exports.insert(d.rkey, x);
        Ok(d)
    }

    /// Withdraws an export: its region is deregistered, so a peer's write through `d` fails
    /// from now on (at this end's NIC on RC; on UC the write is dropped, and a retransmission
    /// is refused and reported to the sender), and fails the writer's connection (see
    /// [`write`](Self::write)). A peer's read of it that this engine serves (UC) and has not
    /// started is refused; one started runs to its end, as a READ a NIC had begun does. Fails
    /// with [`EngineError::NoExport`] for a descriptor this engine did not give (its key,
    /// place, length and rights as they were given), or withdrew already.
    pub fn withdraw_export(&mut self, d: &Descriptor) -> Result<()> {
        self.unsettle();
        let m = &mut self.memory;
        let matches = m.exports.get(&d.rkey).is_some_and(|x| {
            x.region.addr() == d.addr && x.region.len() as u64 == d.len && x.access == d.access
        });
        if !matches {
            return Err(EngineError::NoExport(*d));
        }
        let x = m.exports.remove(&d.rkey).expect("checked");
        if let Some(e) = m.live_slot(x.buf) {
            e.exports.retain(|&k| k != d.rkey);
            if e.done() {
                m.finish(x.buf);
            }
        }
        self.stop_serving(d.rkey);
        Ok(())
    }
}
