//! What a QP's slot posts named, until the NIC is done with it: the accounting that lets a
//! shared [`Pins`] table release an unpinned region only once no posted WR names it.
//!
//! Send completions come in queue order, and a signaled WR completes only after every WR
//! before it on its queue. So each signaled slot WR gets a mark in the context's tracker (its
//! `wr_id` is swapped for the mark's key for the post, and the caller's comes back with the
//! completion), holding what it and the unsignaled WRs since the previous signaled one named;
//! its completion, successful or flushed, retires them. What unsignaled WRs after the last
//! signaled one named waits in `open` for the next mark. Receive slot posts hold each region
//! they name until the QP is reset or destroyed (receive completions carry no such order once
//! an SRQ or a shared CQ mixes queues). A reset or a destroy retires everything (the NIC drops
//! the queues' WRs); a failed destroy retires nothing.

use std::sync::{Arc, Mutex, MutexGuard};

use ibverbs_sys::ibv_send_flags;

use crate::context::Pd;
use crate::error::{Error, Result};
use crate::pins::{Deltas, Pins, add_delta};
use crate::slots::{RecvSlot, WrSlot, check_send_op, check_slot, link};
use crate::track::{Entry, Mark, Owner, Tracker, release};

/// A QP's outstanding pin uses.
#[derive(Default)]
pub(crate) struct Ledger {
    /// What send WRs posted since the last signaled one named: the next mark takes it.
    open: Deltas,
    /// What receive slot posts named, each region once, held until reset or destroy.
    held: Deltas,
    /// Scratch of one post: the pins each WR named, flat, and each WR's span of it by position.
    named: Vec<u32>,
    spans: Vec<(u32, u32)>,
    /// The signaled WRs of one post: (position, mark key, the caller's `wr_id`).
    marks: Vec<(usize, u64, u64)>,
    /// What each mark of one post retires, (mark key, deltas): filled in under one lock.
    fills: Vec<(u64, Deltas)>,
}

/// A QP's ledger with what posting needs to know of the QP.
pub(crate) struct Books {
    pub(crate) ledger: Mutex<Ledger>,
    pub(crate) pins: Arc<Pins>,
    pub(crate) owner: u64,
    pub(crate) sig_all: bool,
}

impl Books {
    pub(crate) fn new(pins: Arc<Pins>, owner: u64, sig_all: bool) -> Books {
        Books {
            ledger: Mutex::default(),
            pins,
            owner,
            sig_all,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Checks, counts and posts the send slots `order` names with `post` (given the chain's
    /// head); see [`Qp::post_slots`](crate::Qp::post_slots). `ud`: the QP is UD, of this
    /// protection domain (its WRs' address handles must be too).
    pub(crate) fn post_sends<X: AsMut<WrSlot<N>>, const N: usize>(
        &self,
        tracker: &Tracker,
        (slots, order): (&mut [X], &[u32]),
        (max_sge, ud): (u32, Option<&Arc<Pd>>),
        post: impl FnOnce(*mut WrSlot<N>) -> Result<()>,
    ) -> Result<()> {
        // Held through the post: the queue's order is the order marks take `open` in.
        let mut guard = self.lock();
        let l = &mut *guard;
        l.named.clear();
        l.spans.clear();
        l.spans.resize(order.len(), (0, 0));
        l.marks.clear();
        let owner = Owner::Qp(self.owner);
        let pins = self.pins.checker();
        let linked = link(slots, order, |k, s: &mut WrSlot<N>| {
            let start = l.named.len() as u32;
            check_slot(&pins, k, s, max_sge, |p| l.named.push(p))?;
            check_send_op(k, s, ud.is_some())?;
            if let Some(pd) = ud {
                // SAFETY: on a UD QP the `wr` union holds the `ud` member (plain data); only
                // the address is compared, never followed.
                let ah = unsafe { s.wr.wr.ud }.ah;
                let (p, pinned) = pins.ah(ah).ok_or_else(|| Error::InvalidWr {
                    index: k,
                    reason: "its address handle is not pinned to this QP".into(),
                })?;
                // The provider follows the handle as its own struct: one of another PD (or
                // context, or provider) must never reach it.
                if !Arc::ptr_eq(pinned.pd(), pd) {
                    return Err(Error::InvalidWr {
                        index: k,
                        reason: format!(
                            "its address handle belongs to {}, the QP's is {}",
                            pinned.pd().describe(),
                            pd.describe()
                        ),
                    });
                }
                l.named.push(p);
            }
            l.spans[k] = (start, l.named.len() as u32);
            if self.sig_all || s.wr.send_flags & ibv_send_flags::IBV_SEND_SIGNALED.0 != 0 {
                let key = tracker.insert(Entry::Mark(Mark {
                    wr_id: s.wr.wr_id,
                    owner,
                    pins: Arc::clone(&self.pins),
                    deltas: Deltas::new(),
                }));
                l.marks.push((k, key, s.wr.wr_id));
                s.wr.wr_id = key;
            }
            Ok(())
        });
        let head = match linked {
            Ok(h) => h,
            Err(e) => {
                drop(pins);
                for &(k, key, user) in &l.marks {
                    tracker.remove(key);
                    restore(slots, order, k, user);
                }
                return Err(e);
            }
        };
        // `link` saw the WRs last to first: the marks, first to last.
        l.marks.reverse();
        let before = l.open.clone();
        let mut all = Deltas::new();
        // `link` saw the WRs last to first, so the pins of WRs `i..=j` are one slice of
        // `named`: from WR `j`'s first to WR `i`'s last. Each mark takes the WRs since the one
        // before it, and `open` those after the last.
        let mut end = l.named.len();
        for &(k, key, _) in &l.marks {
            let start = l.spans[k].0 as usize;
            count_runs(&l.named[start..end], &mut l.open, &mut all);
            l.fills.push((key, std::mem::take(&mut l.open)));
            end = start;
        }
        count_runs(&l.named[..end], &mut l.open, &mut all);
        tracker.fill_marks(&mut l.fills);
        // Counted under the table's read lock: no unpin releases anything named in between.
        pins.count(&all);
        drop(pins);
        let r = post(head);
        let posted = match &r {
            Ok(()) => order.len(),
            Err(Error::Post { index, .. }) => (*index).min(order.len()),
            Err(_) => 0,
        };
        if posted < order.len() {
            self.unpost(l, tracker, before, posted);
        }
        for &(k, _, user) in &l.marks {
            restore(slots, order, k, user);
        }
        r
    }

    /// Undoes the accounting of the WRs from position `posted` on, which the provider did not
    /// take; `before` is what `open` held before the post.
    fn unpost(&self, l: &mut Ledger, tracker: &Tracker, before: Deltas, posted: usize) {
        let mut undo = Deltas::new();
        for &(a, b) in &l.spans[posted..] {
            for &p in &l.named[a as usize..b as usize] {
                add_delta(&mut undo, p, 1);
            }
        }
        for &(k, key, _) in &l.marks {
            if k >= posted {
                tracker.remove(key);
            }
        }
        // `open` is what the posted WRs after the last posted mark named.
        let last = l.marks.iter().map(|m| m.0).filter(|&k| k < posted).max();
        l.open = if last.is_some() {
            Deltas::new()
        } else {
            before
        };
        for &(a, b) in &l.spans[last.map_or(0, |k| k + 1)..posted] {
            for &p in &l.named[a as usize..b as usize] {
                add_delta(&mut l.open, p, 1);
            }
        }
        self.pins.retire(&undo);
    }

    /// Checks and posts receive slots (see [`Qp::post_recv_slots`](crate::Qp::post_recv_slots)):
    /// every region they name is held until the QP is reset or destroyed.
    pub(crate) fn post_recvs<X: AsMut<RecvSlot<N>>, const N: usize>(
        &self,
        (slots, order): (&mut [X], &[u32]),
        max_sge: u32,
        post: impl FnOnce(*mut RecvSlot<N>) -> Result<()>,
    ) -> Result<()> {
        let mut guard = self.lock();
        let l = &mut *guard;
        let pins = self.pins.checker();
        let mut new = Deltas::new();
        let head = link(slots, order, |k, s: &mut RecvSlot<N>| {
            check_slot(&pins, k, s, max_sge, |p| {
                if !l.held.iter().chain(&new).any(|e| e.0 == p) {
                    new.push((p, 1));
                }
            })
        })?;
        pins.count(&new);
        l.held.extend_from_slice(&new);
        drop(pins);
        post(head)
    }

    /// The QP was reset or destroyed: nothing it posted will be touched again.
    pub(crate) fn clear(&self, tracker: &Tracker) {
        release(tracker.purge(Owner::Qp(self.owner)));
        let mut l = self.lock();
        self.pins.retire(&std::mem::take(&mut l.open));
        self.pins.retire(&std::mem::take(&mut l.held));
    }
}

/// Adds the uses of the pins `named` names to `open` and to `all`. Consecutive WRs mostly name
/// the same pin (one buffer): a run of one pin is counted at once.
fn count_runs(named: &[u32], open: &mut Deltas, all: &mut Deltas) {
    let Some((&first, rest)) = named.split_first() else {
        return;
    };
    let (mut pin, mut n) = (first, 1);
    for &p in rest {
        if p == pin {
            n += 1;
        } else {
            add_delta(open, pin, n);
            add_delta(all, pin, n);
            (pin, n) = (p, 1);
        }
    }
    add_delta(open, pin, n);
    add_delta(all, pin, n);
}

/// Gives the slot at position `k` its caller's `wr_id` back (the post has read it). `as_mut` is
/// the caller's code and may hand out another slot than the one posted: then that one gets
/// the id, and the posted one keeps a mark's key, which a safe post refuses (bit 63).
fn restore<X: AsMut<WrSlot<N>>, const N: usize>(
    slots: &mut [X],
    order: &[u32],
    k: usize,
    wr_id: u64,
) {
    if let Some(x) = order.get(k).and_then(|&i| slots.get_mut(i as usize)) {
        x.as_mut().wr.wr_id = wr_id;
    }
}
