//! What a WR built for a safe post holds ([`Kept`]), checked before the post and moved into
//! the context's table under a tracked `wr_id` until the completion gives it back
//! ([`post_tracked`]).

use std::any::Any;
use std::ops::Deref;
use std::sync::Arc;

use ibverbs_sys::ibv_sge;

use crate::error::{Error, Result};
use crate::memory::{Mr, MrBuf};
use crate::track::{Entry, Owner, Posted, Tracker, WR_ID_TAG};

/// What a WR built for a safe post holds besides its SGEs: what the NIC may touch, kept until
/// the completion (see [`Qp::post_send_bufs`](crate::Qp::post_send_bufs)).
#[derive(Default)]
pub(crate) struct Kept {
    /// Shared: buffers the NIC only reads, remote buffers, address handles.
    shared: Vec<Arc<dyn Any + Send + Sync>>,
    /// Moved in: buffers the NIC writes.
    pub(crate) owned: Vec<MrBuf>,
    /// A shared [`MrBuf`] is among the SGEs (the NIC may only read those).
    pub(crate) shared_local: bool,
    /// A [`DmaBuf`](crate::DmaBuf) is among the SGEs (its bytes may change while the driver reads them).
    pub(crate) dma: bool,
    /// Bytes copied into the WR for [`SendWr::inline_data`](crate::SendWr::inline_data), each block where it was first put
    /// (the SGEs point at them). `Vec`s, not boxes: moving a box asserts it is the only way to
    /// its bytes, which would invalidate the SGE's pointer; a `Vec`'s buffer stays put, as is.
    pub(crate) inline: Vec<Vec<u8>>,
    /// An SGE (or address handle) the WR does not hold was added: only an `unsafe` post may
    /// take it.
    pub(crate) raw: bool,
    /// A range outside its buffer (or empty).
    pub(crate) bad: Option<String>,
    /// A safe post took the buffers this WR named (they come back with its completion): it
    /// holds none, so it may not be posted again.
    pub(crate) spent: bool,
    /// The table of the [`CompletionContext`](crate::CompletionContext) this WR names.
    pub(crate) handler_of: Option<Arc<Tracker>>,
}

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kept")
            .field("shared", &self.shared.len())
            .field("owned", &self.owned)
            .field("raw", &self.raw)
            .finish_non_exhaustive()
    }
}

/// A buffer's own length, which bounds what a WR may name of it (its region can be longer:
/// an empty buffer's region has one byte).
pub(crate) trait Extent {
    fn extent(&self) -> usize;
}

impl Extent for MrBuf {
    fn extent(&self) -> usize {
        self.len()
    }
}

impl Extent for crate::DmaBuf {
    fn extent(&self) -> usize {
        self.len()
    }
}

impl Kept {
    /// The SGE of `offset..offset + len` of `buf`, or a note that it is outside.
    fn range(
        &mut self,
        buf: &(impl Deref<Target = Mr> + Extent),
        offset: usize,
        len: u32,
    ) -> Option<ibv_sge> {
        let size = buf.extent();
        if len == 0 {
            // A zero length means 2 GiB to some NICs (mlx5): never let one through.
            self.bad = Some(format!(
                "an empty range at {offset} (some NICs read 0 as 2 GiB): name no buffer for \
                 0 bytes"
            ));
            return None;
        }
        let s = offset
            .checked_add(len as usize)
            .filter(|&end| end <= size)
            .and_then(|_| buf.sge(offset, len));
        if s.is_none() {
            self.bad = Some(format!("{offset}+{len} is outside a {size}-byte buffer"));
        }
        s
    }

    /// Holds `b` until the completion (once, however many of its ranges the WR names).
    pub(crate) fn share(&mut self, b: &Arc<impl Any + Send + Sync>) {
        let b: Arc<dyn Any + Send + Sync> = Arc::clone(b) as _;
        if !self.shared.iter().any(|k| Arc::ptr_eq(k, &b)) {
            self.shared.push(b);
        }
    }

    /// Shares `buf` until the completion, for the NIC to reach `offset..offset + len` of it:
    /// the range's SGE goes to `sges` (if it lies inside the buffer).
    pub(crate) fn share_range<B>(
        &mut self,
        sges: &mut Vec<ibv_sge>,
        buf: &Arc<B>,
        offset: usize,
        len: u32,
    ) where
        B: Deref<Target = Mr> + Extent + Any + Send + Sync,
    {
        if let Some(s) = self.range(&**buf, offset, len) {
            self.share(buf);
            sges.push(s);
        }
    }

    /// Moves `buf` in for the NIC to write `offset..offset + len` of it: the range's SGE goes
    /// to `sges` (if it lies inside the buffer); the buffer comes back with the completion.
    pub(crate) fn own_range(
        &mut self,
        sges: &mut Vec<ibv_sge>,
        buf: MrBuf,
        offset: usize,
        len: u32,
    ) {
        if let Some(s) = self.range(&buf, offset, len) {
            sges.push(s);
        }
        self.owned.push(buf);
    }

    /// The error for a safe post on a QP or SRQ of `tracker`'s context, if this WR cannot be
    /// posted safely; `writes_local` for a READ or an atomic, `inline` for a WR whose data the
    /// driver copies at post time.
    pub(crate) fn check(
        &self,
        index: usize,
        wr_id: u64,
        tracker: &Arc<Tracker>,
        (writes_local, inline): (bool, bool),
    ) -> Result<()> {
        let bad = |reason: String| Err(Error::InvalidWr { index, reason });
        if self.spent {
            return bad(
                "posted already: the buffers it names went with that post (they come back with \
                 its completion); build a new WR"
                    .into(),
            );
        }
        if let Some(reason) = &self.bad {
            return bad(reason.clone());
        }
        if inline && writes_local {
            return bad("only SENDs and WRITEs can carry inline data".into());
        }
        if inline && self.dma {
            return bad(
                "inline data from a DmaBuf: the driver would copy bytes that a peer, the NIC or \
                 write_at may be changing; inline bytes given by value (inline_data), or post \
                 the buffer without inlining"
                    .into(),
            );
        }
        if self.raw {
            return bad(
                "a raw SGE or address handle: post it with the unsafe post, or use the buffer \
                 builders"
                    .into(),
            );
        }
        match &self.handler_of {
            Some(t) if !Arc::ptr_eq(t, tracker) => {
                return bad("its completion context belongs to another device context".into());
            }
            Some(_) if !self.owned.is_empty() || !self.shared.is_empty() => {
                return bad("a WR with a completion context cannot also carry buffers".into());
            }
            Some(_) => {}
            None if wr_id & WR_ID_TAG != 0 => {
                return bad(format!(
                    "wr_id {wr_id:#x} has bit 63 set, which marks ids this crate issues"
                ));
            }
            None => {}
        }
        if writes_local && self.shared_local {
            return bad(
                "the NIC writes a READ or atomic target: move the buffer in with \
                        `target`, not a shared `buf`"
                    .into(),
            );
        }
        Ok(())
    }
}

/// A WR a safe post can take: its buffers move into the context's table until the completion.
pub(crate) trait SafeWr {
    /// Checks it may be posted safely on a QP or SRQ of `tracker`'s context.
    fn check_safe(&self, index: usize, tracker: &Arc<Tracker>) -> Result<()>;
    fn kept_mut(&mut self) -> &mut Kept;
    /// Its buffers went with a post: it forgets its SGEs (they name buffers it no longer
    /// holds) and refuses to be posted again.
    fn spend(&mut self);
    fn wr_id_mut(&mut self) -> &mut u64;
    /// Makes sure the WR produces a completion (the only moment its buffers come back).
    fn force_signaled(&mut self);
}

/// A safe post of `wrs` by `owner` on a QP or SRQ of `tracker`'s context: every WR is checked,
/// its buffers move into the table under a tracked `wr_id` (the caller's id is restored in the
/// WR afterwards and reported by the completion), then `post` posts them. WRs that were not
/// posted (from the failing one on) get their buffers and ids back.
pub(crate) fn post_tracked<W: SafeWr>(
    tracker: &Arc<Tracker>,
    owner: Owner,
    wrs: &mut [W],
    post: impl FnOnce(&mut [W]) -> Result<()>,
) -> Result<()> {
    for (i, w) in wrs.iter().enumerate() {
        w.check_safe(i, tracker)?;
    }
    let mut ids = Vec::with_capacity(wrs.len());
    for w in wrs.iter_mut() {
        w.force_signaled();
        let user = *w.wr_id_mut();
        let k = w.kept_mut();
        if k.handler_of.is_some() {
            ids.push(None);
            continue;
        }
        let holds = !k.shared.is_empty() || !k.owned.is_empty();
        let posted = Posted {
            wr_id: user,
            owner,
            shared: std::mem::take(&mut k.shared),
            owned: std::mem::take(&mut k.owned),
        };
        *w.wr_id_mut() = tracker.insert(Entry::Posted(posted));
        ids.push(Some((user, holds)));
    }
    let r = post(wrs);
    let first_unposted = match &r {
        Ok(()) => wrs.len(),
        Err(Error::Post { index, .. }) => *index,
        Err(_) => 0,
    };
    for (i, (w, user)) in wrs.iter_mut().zip(ids).enumerate() {
        let Some((user, holds)) = user else { continue };
        let tracked = std::mem::replace(w.wr_id_mut(), user);
        if i < first_unposted {
            if holds {
                w.spend();
            }
        } else if let Some(Entry::Posted(p)) = tracker.remove(tracked) {
            let k = w.kept_mut();
            k.shared = p.shared;
            k.owned = p.owned;
        }
    }
    r
}
