//! Notes: a small message ([`MAX_NOTE`] bytes at most) that a write carries to the target's
//! application ([`Opts::note`](crate::Opts::note)), delivered there
//! ([`Engine::notifications`]) once every byte of the write is in place, in order with the
//! connection's other deliveries (receives completing, other notes).
//!
//! - **Sender**: a notified write (of a [`write_v`](crate::Engine::write_v), its last block)
//!   takes request id `NOTE_RID | serial % 64`, where `serial` counts the connection's notified
//!   writes, and its note goes over the control QP once the write is handed to the transmit
//!   side, in fragments (`Ctl::Note`). A notified write is never withdrawn (its note may be on
//!   its way): a cancel leaves it to complete, a deadline past fails the connection. At most
//!   [`MAX_NOTED`] notified writes are outstanding per connection, so a request id names its
//!   note without doubt.
//! - **Receiver**: notes and writes arrive by different QPs, each in order. A notified write
//!   whose every byte arrived (the flow's cumulative point passed it) is delivered with the
//!   oldest note waiting, which must be its own; until that note is in, it and every delivery
//!   after it on the connection that the application sees (receives, notes) are held. A
//!   peer that breaks this (a note too long, too many notes or held deliveries) fails its
//!   connection, and only it; so does one whose notes the application leaves untaken, past
//!   [`MAX_WAITING_NOTES`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crossbeam_queue::SegQueue;

use crate::conn::{NOTE_RID, WRITE_RID};
use crate::engine::{ConnId, Engine};
use crate::proto::{Ctl, NOTE_FRAGMENT};
use crate::rx::Delivered;

/// The most bytes a note may carry.
pub const MAX_NOTE: usize = 256;
/// Notified writes a connection may have outstanding (sent and not yet complete); one more
/// is refused with [`EngineError::Limit`](crate::EngineError::Limit).
pub const MAX_NOTED: u32 = 32;
/// Notes a connection may have delivered ahead of their writes.
const MAX_ARRIVED: usize = 2 * MAX_NOTED as usize;
/// Deliveries a connection may have held behind a note not yet in.
const MAX_HELD: usize = 4096;
/// Notes of one connection that may wait in [`Notifications`], delivered and not taken by the
/// application; the next one fails the connection (a peer cannot fill the engine's memory
/// with notes nobody takes).
pub const MAX_WAITING_NOTES: u32 = 4096;

/// A note, as a write's options carry it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Note {
    len: u16,
    data: [u8; MAX_NOTE],
}

impl Note {
    /// `data` as a note, if it is short enough.
    pub(crate) fn new(data: &[u8]) -> Option<Note> {
        let mut n = Note {
            len: u16::try_from(data.len())
                .ok()
                .filter(|&l| usize::from(l) <= MAX_NOTE)?,
            data: [0; MAX_NOTE],
        };
        n.data[..data.len()].copy_from_slice(data);
        Some(n)
    }

    fn bytes(&self) -> &[u8] {
        &self.data[..usize::from(self.len)]
    }
}

impl std::fmt::Debug for Note {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Note({} bytes)", self.len)
    }
}

/// A note delivered: the connection its write came on, and the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// The connection.
    pub conn: ConnId,
    /// The note's bytes.
    pub data: Vec<u8>,
}

/// The notes an engine delivered, oldest first: a handle any thread may hold
/// ([`Engine::notifications`], [`EngineHandle::notifications`](crate::EngineHandle::notifications)).
/// At most [`MAX_WAITING_NOTES`] of a connection wait here.
#[derive(Clone, Default)]
pub struct Notifications(Arc<SegQueue<(Notification, Arc<AtomicU32>)>>);

impl Notifications {
    /// The oldest note not taken yet.
    pub fn pop(&self) -> Option<Notification> {
        let (n, waiting) = self.0.pop()?;
        waiting.fetch_sub(1, Ordering::AcqRel);
        Some(n)
    }

    /// Notes waiting to be taken.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Queues `n` (the engine's thread only), counted in `waiting` (its connection's count of
    /// notes here), unless that has [`MAX_WAITING_NOTES`] already: then it is handed back.
    fn push(&self, n: Notification, waiting: &Arc<AtomicU32>) -> Result<(), Notification> {
        // Only this thread adds, so the count cannot pass the limit between the look and
        // the add; another thread's pop may only lower it (and never below zero: a note is
        // counted before it goes in, uncounted after it comes out).
        if waiting.load(Ordering::Acquire) >= MAX_WAITING_NOTES {
            return Err(n);
        }
        waiting.fetch_add(1, Ordering::AcqRel);
        self.0.push((n, Arc::clone(waiting)));
        Ok(())
    }
}

impl std::fmt::Debug for Notifications {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifications")
            .field("waiting", &self.len())
            .finish()
    }
}

/// The notes arriving on one connection.
#[derive(Default)]
pub(crate) struct Inbox {
    /// The note being put together from its fragments: its serial and bytes so far.
    partial: Option<(u32, Vec<u8>)>,
    /// Notes in whole whose write has not been delivered, oldest first.
    arrived: VecDeque<(u32, Vec<u8>)>,
    /// Deliveries held behind a notified write whose note is not in yet.
    held: VecDeque<Delivered>,
    /// Its notes waiting in [`Notifications`] (the queue's entries hold it too).
    waiting: Arc<AtomicU32>,
}

impl Engine {
    /// The notes delivered to this engine's application (see [`Opts::note`](crate::Opts::note)):
    /// a handle that any thread may keep and take from.
    pub fn notifications(&self) -> Notifications {
        self.notifications.clone()
    }

    /// The request id and serial of the next notified write of `conn`; or the limit, if
    /// [`MAX_NOTED`] are outstanding.
    pub(crate) fn next_noted(&mut self, conn: ConnId) -> crate::Result<(u8, u32)> {
        let c = self.conn_for_request(conn)?;
        if c.next_note.wrapping_sub(c.notes_done) >= MAX_NOTED {
            return Err(crate::EngineError::Limit {
                what: "notified writes outstanding on one connection",
                limit: MAX_NOTED.into(),
            });
        }
        Ok((NOTE_RID | (c.next_note % 64) as u8, c.next_note))
    }

    /// Sends `note`, of the notified write of `conn` just handed to the transmit side (the
    /// serial [`next_noted`](Self::next_noted) gave).
    pub(crate) fn send_note(&mut self, conn: ConnId, note: &Note) -> crate::Result<()> {
        let c = self.conn_for_request(conn)?;
        let serial = c.next_note;
        c.next_note = c.next_note.wrapping_add(1);
        let bytes = note.bytes();
        let n = bytes.len().div_ceil(NOTE_FRAGMENT).max(1);
        for k in 0..n {
            let part = &bytes[(k * NOTE_FRAGMENT).min(bytes.len())..];
            let part = &part[..part.len().min(NOTE_FRAGMENT)];
            let mut data = [0u8; NOTE_FRAGMENT];
            data[..part.len()].copy_from_slice(part);
            let frag = Ctl::Note {
                serial,
                last: k + 1 == n,
                len: part.len() as u8,
                data,
            };
            c.ctl.backlog.push_back(frag.to_bytes());
        }
        self.mark_ctl(conn.index);
        Ok(())
    }

    /// A fragment of note `serial` of connection `ci` arrived.
    pub(crate) fn on_note(&mut self, ci: u16, serial: u32, last: bool, bytes: &[u8]) {
        let Some(c) = self.conns[usize::from(ci)].as_mut().filter(|c| c.is_open()) else {
            return;
        };
        let (s, buf) = c
            .inbox
            .partial
            .get_or_insert_with(|| (serial, Vec::with_capacity(MAX_NOTE)));
        if *s != serial || buf.len() + bytes.len() > MAX_NOTE {
            return self.fail_conn(ci, "the peer sent a broken note", true);
        }
        buf.extend_from_slice(bytes);
        if !last {
            return;
        }
        let whole = c.inbox.partial.take().expect("checked");
        if c.inbox.arrived.len() >= MAX_ARRIVED {
            return self.fail_conn(ci, "the peer sent more notes than notified writes", true);
        }
        c.inbox.arrived.push_back(whole);
        self.release_held(ci);
    }

    /// A message of connection `ci` arrived whole: delivered now, or held behind a notified
    /// write whose note is not in yet.
    pub(crate) fn deliver(&mut self, ci: u16, d: Delivered) {
        let Some(c) = self.conns[usize::from(ci)].as_mut() else {
            return;
        };
        // A plain write shows nothing to the application: it is counted, never held.
        if (c.inbox.held.is_empty() || (WRITE_RID..NOTE_RID).contains(&d.rid))
            && self.try_deliver(ci, d)
        {
            return;
        }
        let c = self.conns[usize::from(ci)].as_mut().expect("checked");
        if c.inbox.held.len() >= MAX_HELD {
            return self.fail_conn(
                ci,
                "the peer's notified writes came without their notes",
                true,
            );
        }
        c.inbox.held.push_back(d);
    }

    /// Delivers what was held on connection `ci`, up to a notified write whose note is still
    /// not in.
    fn release_held(&mut self, ci: u16) {
        while let Some(&d) = self.conns[usize::from(ci)]
            .as_ref()
            .and_then(|c| c.inbox.held.front())
        {
            if !self.try_deliver(ci, d) {
                return;
            }
            if let Some(c) = self.conns[usize::from(ci)].as_mut() {
                c.inbox.held.pop_front();
            }
        }
    }

    /// Delivers `d` of connection `ci` unless it is a notified write whose note is not the
    /// oldest waiting (not in yet).
    fn try_deliver(&mut self, ci: u16, d: Delivered) -> bool {
        if d.rid < NOTE_RID {
            self.deliver_now(ci, d);
            return true;
        }
        let Some(c) = self.conns[usize::from(ci)].as_mut() else {
            return true;
        };
        let tag = u32::from(d.rid - NOTE_RID);
        if c.inbox.arrived.front().is_none_or(|(s, _)| s % 64 != tag) {
            return false;
        }
        let (_, data) = c.inbox.arrived.pop_front().expect("checked");
        let note = Notification { conn: c.id, data };
        if self.notifications.push(note, &c.inbox.waiting).is_err() {
            let why = format!("the application took none of its last {MAX_WAITING_NOTES} notes");
            self.fail_conn(ci, why, true);
            return true;
        }
        self.stats.writes_received += 1;
        self.stats.notes_received += 1;
        true
    }
}
