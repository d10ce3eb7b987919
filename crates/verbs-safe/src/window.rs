//! Memory windows (type 1): a key over part of a [`DmaBuf`], bound and unbound through a
//! connected QP's send queue (`ibv_bind_mw`), dead at once when deallocated.
//!
//! A window is cheaper to move than a registration (a bind is one work request, no system
//! call), so it suits keys that live as long as one transfer: a receive buffer advertised to
//! a peer, say. The buffer's own region must allow binds ([`AccessFlags::MW_BIND`]) and needs
//! no remote access of its own: then the window's key is the only way in, over exactly its
//! range, and only while it is bound.
//!
//! What a window keeps alive, and why: see [`Mw`].

use std::sync::{Arc, Mutex, MutexGuard};

use ibverbs_sys::{ibv_mw, ibv_mw_bind, ibv_mw_bind_info, ibv_send_flags, ibv_wc_status};

use crate::context::{Pd, leaked};
use crate::error::{Errno, Error, Result};
use crate::flags::AccessFlags;
use crate::memory::DmaBuf;
use crate::post::post_error;
use crate::qp::{CanPostSend, Connected, Qp};
use crate::track::{Entry, Owner};

type DeallocFn = unsafe extern "C" fn(*mut ibv_mw) -> i32;

/// What becomes of the buffers a window let go of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// The window lives: buffers its keys may reach are held, the others dropped.
    Live,
    /// Deallocated: its keys are dead, nothing need be held.
    Deallocated,
    /// Its deallocation failed: its keys may reach anything they ever named, for good.
    Leaked,
}

/// What a window's keys may reach, as far as the completions seen tell (see [`Mw`]). Binds are numbered from 1 in the order they were posted.
struct Reach {
    /// Buffers the keys may reach now, by the number of the bind that named them: the last
    /// successful bind's target, and those of later binds that may have run.
    held: Vec<(u64, Arc<DmaBuf>)>,
    /// The last bind seen to succeed (0: none).
    succeeded: u64,
    /// Its key (the window's first key before any), and whether it gave the window a range.
    rkey: u32,
    bound: bool,
    /// The number of the last bind handed to the provider (posted or not).
    numbered: u64,
    /// Binds posted whose outcome is not known yet, with the key each asked for.
    in_flight: Vec<(u64, u32)>,
    /// The QP they were posted on (its owner id and number), while there are any.
    on: Option<(Owner, u32)>,
    fate: Fate,
}

/// Drops buffers a window let go of (`Live`, `Deallocated`), or keeps them for good (`Leaked`).
fn let_go(fate: Fate, bufs: impl IntoIterator<Item = Arc<DmaBuf>>) {
    for b in bufs {
        if fate == Fate::Leaked {
            std::mem::forget(b);
        }
    }
}

/// A bind posted (or being posted), in the context's tracker under the bind's `wr_id`: it
/// holds its target until its outcome is known, then settles the window's [`Reach`]. Dropped
/// unseen (its QP reset or destroyed, or its context gone), it may have run.
pub(crate) struct PendingBind {
    /// The id the caller gave the bind (its completion reports this one).
    pub(crate) wr_id: u64,
    pub(crate) owner: Owner,
    /// `None` once settled.
    reach: Option<Arc<Mutex<Reach>>>,
    /// The bind's number.
    seq: u64,
    target: Option<Arc<DmaBuf>>,
    /// Whether it gives the window a range (a length).
    ranged: bool,
}

/// What a bind did, as far as its completion tells.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Ran,
    /// Flushed: never ran.
    NotRun,
    /// Failed, or dropped unseen: it may have run.
    Maybe,
}

fn lock(reach: &Mutex<Reach>) -> MutexGuard<'_, Reach> {
    reach.lock().unwrap_or_else(|e| e.into_inner())
}

impl PendingBind {
    /// The bind completed with `status`.
    pub(crate) fn completed(mut self, status: u32) {
        let outcome = match status {
            ibv_wc_status::IBV_WC_SUCCESS => Outcome::Ran,
            ibv_wc_status::IBV_WC_WR_FLUSH_ERR => Outcome::NotRun,
            _ => Outcome::Maybe,
        };
        self.settle(outcome);
    }

    fn settle(&mut self, outcome: Outcome) {
        let Some(reach) = self.reach.take() else {
            return;
        };
        let target = self.target.take();
        let mut r = lock(&reach);
        let fate = r.fate;
        let Some(at) = r.in_flight.iter().position(|&(seq, _)| seq == self.seq) else {
            // Never posted (the provider refused it): it reaches nothing.
            drop(r);
            return let_go(fate, target);
        };
        let (seq, rkey) = r.in_flight.swap_remove(at);
        if r.in_flight.is_empty() {
            r.on = None;
        }
        let mut gone = Vec::new();
        match outcome {
            Outcome::Ran if seq > r.succeeded => {
                // The window reaches this target only now, and whatever later binds that may
                // have run named.
                r.succeeded = seq;
                r.rkey = rkey;
                r.bound = self.ranged;
                let (earlier, later) = std::mem::take(&mut r.held)
                    .into_iter()
                    .partition::<Vec<_>, _>(|&(s, _)| s < seq);
                r.held = later;
                gone.extend(earlier.into_iter().map(|(_, b)| b));
                if fate == Fate::Live {
                    r.held.extend(target.map(|b| (seq, b)));
                } else {
                    gone.extend(target);
                }
            }
            Outcome::Maybe if seq > r.succeeded && fate == Fate::Live => {
                r.held.extend(target.map(|b| (seq, b)));
            }
            // Never ran, or overtaken by a later bind seen to succeed, or the window is gone.
            _ => gone.extend(target),
        }
        drop(r);
        let_go(fate, gone);
    }
}

impl Drop for PendingBind {
    fn drop(&mut self) {
        self.settle(Outcome::Maybe);
    }
}

/// A type-1 memory window of a protection domain ([`Pd::alloc_mw`]). Its key
/// ([`rkey`](Self::rkey)) reaches nothing until [`Qp::bind_mw`] binds it to part of a
/// [`DmaBuf`]; binding it again moves it, an unbind (a bind to nothing) closes it, and dropping
/// it deallocates it (its key is dead at once).
///
/// # What a window keeps alive
///
/// A bind is a work request: it runs, fails or is flushed some time after it was posted, and
/// only its completion tells which. Until then the window's old key still reaches the old
/// buffer (a peer may write it), and a bind that failed or was flushed leaves the window where
/// it was. So a window keeps alive every buffer its keys may still reach at the NIC:
/// - the target of the last bind seen to complete successfully (after which the window reaches
///   that target only, through that bind's key);
/// - the target of every bind posted after that one whose outcome is not known to be nothing:
///   in flight (its post holds it), failed other than by a flush (`MW_BIND_ERR`), or dropped
///   unseen by a reset or destroy of its QP;
///
/// until a later bind is seen to succeed, or the window is deallocated (its keys die at once).
/// That reasoning needs the binds' order: the binds of one QP run in the order they were
/// posted, but two QPs run theirs in any order; so while a bind of a window is in flight on
/// one QP (until its completion is polled through a [`Poller`](crate::Poller), or the QP is
/// reset or destroyed), binding it on another QP is refused.
pub struct Mw {
    pd: Arc<Pd>,
    raw: *mut ibv_mw,
    dealloc: DeallocFn,
    reach: Arc<Mutex<Reach>>,
}

// SAFETY: the window is only changed through the provider's thread-safe verbs, under the
// `reach` lock; the rest is behind that lock.
unsafe impl Send for Mw {}
// SAFETY: as above.
unsafe impl Sync for Mw {}

impl std::fmt::Debug for Mw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mw")
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .field("bound", &self.is_bound())
            .finish()
    }
}

impl Pd {
    /// A new type-1 memory window (`ibv_alloc_mw`). Fails with [`Error::Unsupported`] where
    /// the provider has no memory windows.
    pub fn alloc_mw(self: &Arc<Self>) -> Result<Mw> {
        // SAFETY: reading the ops table of a live context.
        let ops = unsafe { (*self.ctx.raw).ops };
        let (Some(alloc), Some(dealloc), Some(_)) = (ops.alloc_mw, ops.dealloc_mw, ops.bind_mw)
        else {
            return Err(Error::Unsupported("memory windows (alloc_mw/bind_mw)"));
        };
        // SAFETY: live PD.
        let raw = unsafe { alloc(self.raw, ibverbs_sys::IBV_MW_TYPE_1) };
        if raw.is_null() {
            return Err(Error::Create {
                what: "memory window",
                device: self.ctx.name().to_string(),
                detail: "type 1".into(),
                errno: Errno::last(),
            });
        }
        // SAFETY: a window just allocated, which no bind has touched yet.
        let rkey = unsafe { (*raw).rkey };
        Ok(Mw {
            pd: Arc::clone(self),
            raw,
            dealloc,
            reach: Arc::new(Mutex::new(Reach {
                held: Vec::new(),
                succeeded: 0,
                rkey,
                bound: false,
                numbered: 0,
                in_flight: Vec::new(),
                on: None,
                fate: Fate::Live,
            })),
        })
    }
}

impl Mw {
    /// The window's remote key: the one the last bind seen to complete successfully gave it
    /// (the key its allocation gave it before any). A bind in flight, or one that failed or
    /// was flushed, leaves it as it was; [`Qp::bind_mw`] returns the key a bind asks for.
    pub fn rkey(&self) -> u32 {
        lock(&self.reach).rkey
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    /// Whether the last bind seen to complete successfully gave it a range (an unbind, or no
    /// bind yet: not bound).
    pub fn is_bound(&self) -> bool {
        lock(&self.reach).bound
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        // SAFETY: a live window, deallocated once.
        let rc = unsafe { (self.dealloc)(self.raw) };
        let mut r = lock(&self.reach);
        let held = std::mem::take(&mut r.held);
        if rc == 0 {
            // Its keys are dead: nothing it named is reachable through it any more (binds
            // still in flight hold their targets until their completion).
            r.fate = Fate::Deallocated;
        } else {
            // Its keys may still reach what they named: keep it, for good.
            leaked("memory window", rc, 0);
            r.fate = Fate::Leaked;
        }
        let fate = r.fate;
        drop(r);
        let_go(fate, held.into_iter().map(|(_, b)| b));
    }
}

impl<T: Connected, S: CanPostSend> Qp<T, S> {
    /// Binds `mw` to `len` bytes at `offset` of `buf` with `access` (a subset of
    /// `REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC`), or unbinds it (`to` is `None`), with a
    /// bind work request on this QP's send queue (`ibv_bind_mw`). Returns the key the bind
    /// asks for, valid once the bind has run (the QP runs it before any WR posted after it, so
    /// a SEND posted next that carries the key reaches the peer after it). The bind completes
    /// (signaled) with `wr_id` and [`WcOpcode::BindMw`](crate::WcOpcode::BindMw);
    /// [`Mw::rkey`] reports the new key once that completion was polled successfully.
    ///
    /// Every buffer the window may still reach stays alive (see [`Mw`]): the buffer it leaves
    /// until this bind is seen to succeed (a failed or flushed bind leaves the window where it
    /// was), `buf` until a later bind is seen to succeed or the window is dropped.
    ///
    /// `buf`'s region must allow binds ([`AccessFlags::MW_BIND`], and `LOCAL_WRITE` for a
    /// writable window) and belong to the window's protection domain; the range may be of any
    /// length inside it (4 GiB or more too). A `wr_id` with bit 63 set is refused, and so is a
    /// bind while one of this window is in flight on another QP (the two could run in either
    /// order): poll its completion first.
    pub fn bind_mw(
        &self,
        mw: &Mw,
        wr_id: u64,
        to: Option<(&Arc<DmaBuf>, usize, usize)>,
        access: AccessFlags,
    ) -> Result<u32> {
        let bad = |reason: String| Err(Error::InvalidWr { index: 0, reason });
        if wr_id & crate::WR_ID_TAG != 0 {
            return bad("a bind's wr_id has bit 63 set, which marks ids this crate issues".into());
        }
        if !AccessFlags::remote().contains(access) {
            return bad("a window grants remote access only".into());
        }
        if !Arc::ptr_eq(self.pd_ref(), &mw.pd) {
            return bad(format!(
                "the window belongs to {}, the QP to {}",
                mw.pd.describe(),
                self.pd_ref().describe()
            ));
        }
        let (info, ranged) = match to {
            Some((buf, offset, len)) => {
                if !Arc::ptr_eq(buf.pd(), &mw.pd) {
                    return bad(format!(
                        "the window belongs to {}, the buffer to {}",
                        mw.pd.describe(),
                        buf.pd().describe()
                    ));
                }
                if offset.checked_add(len).is_none_or(|end| end > buf.len()) {
                    return bad(format!(
                        "the range {offset}+{len} lies outside the buffer ({} bytes)",
                        buf.len()
                    ));
                }
                let info = ibv_mw_bind_info {
                    mr: buf.as_raw(),
                    addr: buf.addr() + offset as u64,
                    length: len as u64,
                    mw_access_flags: access.bits(),
                };
                (info, len > 0)
            }
            None => {
                let info = ibv_mw_bind_info {
                    mr: std::ptr::null_mut(),
                    addr: 0,
                    length: 0,
                    mw_access_flags: 0,
                };
                (info, false)
            }
        };
        let ctx = &self.pd_ref().ctx;
        // SAFETY: reading the ops of a live context.
        let Some(bind) = (unsafe { (*ctx.raw).ops.bind_mw }) else {
            return Err(Error::Unsupported("bind_mw"));
        };
        let owner = self.owner();
        // Held through the post: binds of a window are numbered in the order they are posted.
        let mut r = lock(&mw.reach);
        if let Some((_, qpn)) = r.on.filter(|&(on, _)| on != owner) {
            return bad(format!(
                "the window has binds in flight on QP {qpn:#x}: bind it there, or once their \
                 completions are polled (this is QP {:#x})",
                self.qpn()
            ));
        }
        r.numbered += 1;
        let seq = r.numbered;
        // The target is held by the bind's entry until its outcome is known; its completion
        // (always signaled) or its QP's reset or destroy settles the window's reach.
        let key = ctx.tracker.insert(Entry::Bind(PendingBind {
            wr_id,
            owner,
            reach: Some(Arc::clone(&mw.reach)),
            seq,
            target: to.map(|(b, _, _)| Arc::clone(b)),
            ranged,
        }));
        let mut wr = ibv_mw_bind {
            wr_id: key,
            send_flags: ibv_send_flags::IBV_SEND_SIGNALED.0,
            bind_info: info,
        };
        // SAFETY: a live QP and window of one PD, and a valid bind whose region (if any) is
        // the buffer's own and covers the range. The buffer stays alive while the window may
        // reach it: the bind's tracker entry holds it until the bind's outcome is known, then
        // the window does until a later bind is seen to succeed or it is deallocated (and a
        // buffer the window leaves is held the same way until this bind is seen to succeed).
        // The provider reads `wr` during the call only.
        let rc = unsafe { bind(self.as_raw(), mw.raw, &mut wr) };
        if rc != 0 {
            let unposted = ctx.tracker.remove(key);
            // Settled (as never posted: not in flight) outside the lock it takes.
            drop(r);
            drop(unposted);
            return Err(post_error("bind_mw", self.qpn(), 0, rc));
        }
        // SAFETY: the provider wrote the window's new key during the bind, which returned;
        // every bind of this window holds the lock held here.
        let rkey = unsafe { (*mw.raw).rkey };
        r.in_flight.push((seq, rkey));
        r.on = Some((owner, self.qpn()));
        Ok(rkey)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bufs(n: usize) -> (softnic::Fabric, Vec<Arc<DmaBuf>>) {
        let f = softnic::Fabric::default();
        let v = crate::Verbs::soft(&f);
        let pd = crate::Context::open_by_name(&v, "soft0")
            .unwrap()
            .alloc_pd()
            .unwrap();
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND;
        let b = (0..n)
            .map(|_| Arc::new(pd.alloc_dma(64, 64, access).unwrap()))
            .collect();
        (f, b)
    }

    /// A window's reach with binds 1..=n in flight on one QP (keys 101, 102, ...), and their
    /// pending entries, targeting `targets`.
    fn in_flight(targets: &[Arc<DmaBuf>]) -> (Arc<Mutex<Reach>>, Vec<PendingBind>) {
        let n = targets.len() as u64;
        let reach = Arc::new(Mutex::new(Reach {
            held: Vec::new(),
            succeeded: 0,
            rkey: 100,
            bound: false,
            numbered: n,
            in_flight: (1..=n).map(|s| (s, 100 + s as u32)).collect(),
            on: Some((Owner::Qp(1), 7)),
            fate: Fate::Live,
        }));
        let pending = targets
            .iter()
            .zip(1..)
            .map(|(t, seq)| PendingBind {
                wr_id: seq,
                owner: Owner::Qp(1),
                reach: Some(Arc::clone(&reach)),
                seq,
                target: Some(Arc::clone(t)),
                ranged: true,
            })
            .collect();
        (reach, pending)
    }

    /// Completions of one QP's binds may be dispatched out of order (two threads polling one
    /// CQ): a success seen after a later bind's success does not move the window back, and a
    /// bind that may have run stays held only if no later bind is seen to succeed.
    #[test]
    fn the_last_bind_posted_wins_whatever_order_completions_are_seen_in() {
        let (_f, targets) = bufs(3);
        let weak: Vec<_> = targets.iter().map(Arc::downgrade).collect();
        let (reach, mut pending) = in_flight(&targets);
        drop(targets);
        let third = pending.pop().unwrap();
        let second = pending.pop().unwrap();
        let first = pending.pop().unwrap();
        second.completed(ibv_wc_status::IBV_WC_SUCCESS);
        {
            let r = lock(&reach);
            assert_eq!((r.succeeded, r.rkey, r.bound), (2, 102, true));
            assert_eq!(r.on, Some((Owner::Qp(1), 7)), "two still in flight");
        }
        first.completed(ibv_wc_status::IBV_WC_SUCCESS);
        assert!(weak[0].upgrade().is_none(), "overtaken by bind 2");
        assert_eq!(lock(&reach).rkey, 102);
        // Bind 3 failed: it may have run (kept), and so may bind 2's target still be reached.
        third.completed(ibv_wc_status::IBV_WC_MW_BIND_ERR);
        assert!(weak[1].upgrade().is_some() && weak[2].upgrade().is_some());
        {
            let r = lock(&reach);
            assert_eq!((r.rkey, r.on), (102, None), "settled");
        }
        // Dropped unseen, an entry leaves its target to the window; a flushed one lets go.
        let (_f, t) = bufs(2);
        let w: Vec<_> = t.iter().map(Arc::downgrade).collect();
        let (reach, mut pending) = in_flight(&t);
        drop(t);
        pending
            .pop()
            .unwrap()
            .completed(ibv_wc_status::IBV_WC_WR_FLUSH_ERR);
        drop(pending);
        assert!(w[0].upgrade().is_some() && w[1].upgrade().is_none());
        assert_eq!(lock(&reach).held.len(), 1);
    }
}
