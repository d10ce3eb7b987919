//! Safe chained posting from pools of pre-initialised WRs (UCCL's `wr_ex` pool): regions and
//! address handles are pinned to a queue, and a chain of slots is checked against them, linked
//! in the caller's order and posted with one doorbell, without an allocation.
//!
//! What makes it safe without `unsafe` at the call site: every SGE must lie inside a
//! [`DmaBuf`](crate::DmaBuf) pinned to the queue's table ([`Pins`](crate::Pins), which keeps it
//! alive while a posted WR may name it, and whose bytes safe code only reaches by copies), every
//! UD address handle must be pinned too, each slot's
//! SGE list is re-pointed at the slot's own SGEs, the chain is linked here (no caller pointer
//! is followed), and `wr_id`s keep bit 63 ([`WR_ID_TAG`]) clear. The WRs themselves are only
//! read during the call, as libibverbs specifies.

use std::ptr::{NonNull, null_mut};

use ibverbs_sys::{ibv_recv_wr, ibv_send_wr, ibv_sge};

use crate::error::{Error, Result};
use crate::pins::Checker;
use crate::post::Linked;
use crate::track::WR_ID_TAG;

/// A send WR with `N` SGEs of its own: the element of a pool of pre-initialised WRs (UCCL's
/// `wr_ex`). `#[repr(C)]` with the WR first, so a pointer to the slot is a pointer to its WR.
///
/// Posted safely by [`Qp::post_slots`](crate::Qp::post_slots), which points the WR at the
/// slot's own SGEs; an `unsafe` chain post needs [`point_sges`](Self::point_sges) once the
/// slot is at its final address.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct WrSlot<const N: usize> {
    /// The work request.
    pub wr: ibv_send_wr,
    /// Its scatter-gather entries.
    pub sges: [ibv_sge; N],
}

/// A receive WR with `N` SGEs of its own (the element of a pool of receive WRs, refilled in
/// chains: [`Srq::post_recv_slots`](crate::Srq::post_recv_slots)).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RecvSlot<const N: usize> {
    /// The work request.
    pub wr: ibv_recv_wr,
    /// Its scatter-gather entries.
    pub sges: [ibv_sge; N],
}

macro_rules! slot_common {
    ($slot:ident, $wr:ty) => {
        impl<const N: usize> Default for $slot<N> {
            fn default() -> Self {
                $slot {
                    wr: <$wr>::default(),
                    sges: [ibv_sge::default(); N],
                }
            }
        }

        // SAFETY: the raw pointers inside are addresses (of the slot's own SGEs, of registered
        // memory, of the next WR in a chain, of an address handle); nothing about them is tied
        // to a thread, and only a post (checked, or `unsafe`) follows them.
        unsafe impl<const N: usize> Send for $slot<N> {}
        // SAFETY: as above; shared access only reads plain data.
        unsafe impl<const N: usize> Sync for $slot<N> {}

        impl<const N: usize> std::fmt::Debug for $slot<N> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($slot))
                    .field("wr_id", &self.wr.wr_id)
                    .field("num_sge", &self.wr.num_sge)
                    .field("sges", &self.sges)
                    .finish_non_exhaustive()
            }
        }

        impl<const N: usize> $slot<N> {
            /// Points the WR at the first `n` of the slot's SGEs (`n` is capped at `N`).
            pub fn point_sges(&mut self, n: usize) {
                self.wr.sg_list = self.sges.as_mut_ptr();
                self.wr.num_sge = n.min(N) as i32;
            }

            /// The WR's address, for linking it into a chain through another WR's `next`.
            pub fn wr_ptr(&mut self) -> *mut $wr {
                &mut self.wr
            }
        }

        impl<const N: usize> AsMut<$slot<N>> for $slot<N> {
            fn as_mut(&mut self) -> &mut $slot<N> {
                self
            }
        }
    };
}

slot_common!(WrSlot, ibv_send_wr);
slot_common!(RecvSlot, ibv_recv_wr);

/// A WR of a slot chain: its `next` and its SGE list are set here, never taken from the caller.
pub(crate) trait Slot: Linked {
    fn wr_id(&self) -> u64;
    /// The slot's SGEs in use (`num_sge`, which must fit the slot).
    fn sges(&self) -> std::result::Result<&[ibv_sge], String>;
    /// Points the slot at `p`'s own SGEs and its `next` at `next`, through `p` alone: no
    /// reference to the slot is made, so the pointers the chain keeps (to this slot and its
    /// SGEs) all derive from `p` and stay valid while the post reads them.
    ///
    /// # Safety
    /// `p` points to a live slot that nothing else reads or writes during the call.
    unsafe fn link_raw(p: *mut Self, next: *mut Self);
}

macro_rules! slot_impl {
    ($slot:ident) => {
        impl<const N: usize> Slot for $slot<N> {
            fn wr_id(&self) -> u64 {
                self.wr.wr_id
            }
            fn sges(&self) -> std::result::Result<&[ibv_sge], String> {
                usize::try_from(self.wr.num_sge)
                    .ok()
                    .filter(|&n| n <= N)
                    .map(|n| &self.sges[..n])
                    .ok_or_else(|| format!("num_sge {} for a slot of {N}", self.wr.num_sge))
            }
            unsafe fn link_raw(p: *mut Self, next: *mut Self) {
                // SAFETY: the caller guarantees `p` is live and unshared; only place
                // expressions through `p` are used (no intermediate references).
                unsafe {
                    (*p).wr.sg_list = if (*p).wr.num_sge == 0 {
                        null_mut()
                    } else {
                        std::ptr::addr_of_mut!((*p).sges).cast()
                    };
                    (*p).wr.next = next.cast();
                }
            }
        }

        impl<const N: usize> Linked for $slot<N> {
            fn next(&self) -> *mut Self {
                self.wr.next.cast()
            }
            fn set_next(&mut self, next: *mut Self) {
                self.wr.next = next.cast();
            }
        }
    };
}

slot_impl!(WrSlot);
slot_impl!(RecvSlot);

/// Checks the slots `order` names (each once, each valid by `check`), then links them in that
/// order through `next`, pointing each at its own SGEs. Returns the head (null for an empty
/// order). On an error nothing is linked and no `next` is left changed in a way that matters
/// (the chain is only ever followed by the post this prepares).
///
/// `as_mut` is the caller's code: it may hand out another slot, or change one, from one call
/// to the next. So what is checked is what the last call hands out, the one that is linked
/// and posted; and that slot must be one the first pass marked (named once). `check` sees
/// the slots last to first, and may change the slot it checks (its `wr_id`) before it is
/// linked.
pub(crate) fn link<S, X: AsMut<S>>(
    slots: &mut [X],
    order: &[u32],
    mut check: impl FnMut(usize, &mut S) -> Result<()>,
) -> Result<*mut S>
where
    S: Slot,
{
    // A marker no real WR address can equal: finds an index named twice (a cycle otherwise).
    let mark: *mut S = NonNull::<S>::dangling().as_ptr();
    let mut result = Ok(null_mut());
    let mut marked = 0;
    for (k, &i) in order.iter().enumerate() {
        let Some(x) = slots.get_mut(i as usize) else {
            result = Err(Error::InvalidWr {
                index: k,
                reason: format!("no slot {i} in a pool of {}", slots.len()),
            });
            break;
        };
        let s = x.as_mut();
        if s.next() == mark {
            result = Err(Error::InvalidWr {
                index: k,
                reason: format!("slot {i} is named twice"),
            });
            break;
        }
        s.set_next(mark);
        marked += 1;
    }
    if result.is_ok() {
        // Elements are reached through one base pointer from here on: indexing the slice
        // would re-borrow all of it and invalidate the pointers the chain already holds.
        let base = slots.as_mut_ptr();
        let mut head: *mut S = null_mut();
        for (k, &i) in order.iter().enumerate().rev() {
            // SAFETY: `i` is in bounds (checked in the first pass) and named once in `order`,
            // so this is the only reference to element `i`; `base` comes from `slots`, which
            // is borrowed mutably for this call.
            let s = unsafe { &mut *base.add(i as usize) }.as_mut();
            if s.next() != mark {
                result = Err(Error::InvalidWr {
                    index: k,
                    reason: format!("slot {i} is not the one checked (its AsMut changed it)"),
                });
                break;
            }
            if let Err(e) = check(k, &mut *s) {
                result = Err(e);
                break;
            }
            let p: *mut S = s;
            // SAFETY: `p` comes from the only reference to this slot, no longer used.
            unsafe { S::link_raw(p, head) };
            head = p;
        }
        if result.is_ok() {
            return Ok(head);
        }
    }
    for &i in &order[..marked] {
        slots[i as usize].as_mut().set_next(null_mut());
    }
    result
}

/// The operations a slot post may carry: the data operations whose every pointer is an SGE
/// checked against the pinned regions (no memory-window binds, no TSO headers, no
/// invalidations), only SENDs on a UD QP (`ud`: its WR's union holds the address handle, which
/// an RDMA WR's remote address would overlay), and never inline.
#[inline]
pub(crate) fn check_send_op<const N: usize>(index: usize, s: &WrSlot<N>, ud: bool) -> Result<()> {
    use ibverbs_sys::ibv_wr_opcode as op;
    const SENDS: u32 = 1 << op::IBV_WR_SEND | 1 << op::IBV_WR_SEND_WITH_IMM;
    const ATOMICS: u32 = 1 << op::IBV_WR_ATOMIC_CMP_AND_SWP | 1 << op::IBV_WR_ATOMIC_FETCH_AND_ADD;
    const DATA: u32 = SENDS
        | ATOMICS
        | 1 << op::IBV_WR_RDMA_WRITE
        | 1 << op::IBV_WR_RDMA_WRITE_WITH_IMM
        | 1 << op::IBV_WR_RDMA_READ;
    let bit = 1u32.checked_shl(s.wr.opcode).unwrap_or(0);
    if bit & if ud { SENDS } else { DATA } == 0 {
        let what = if ud {
            "a UD QP sends SENDs only"
        } else {
            "not a data operation"
        };
        return Err(Error::InvalidWr {
            index,
            reason: format!("opcode {}: {what}", s.wr.opcode),
        });
    }
    if bit & ATOMICS != 0 {
        check_atomic(index, s)?;
    }
    if s.wr.send_flags & ibverbs_sys::ibv_send_flags::IBV_SEND_INLINE.0 != 0 {
        return Err(Error::InvalidWr {
            index,
            reason: "inline data is copied by the driver at post time, racing the region's \
                     writers: post it from a pinned region instead"
                .into(),
        });
    }
    Ok(())
}

/// An atomic slot's SGEs: one of the 8 bytes the NIC writes back (off the path of the other
/// operations).
#[cold]
#[inline(never)]
fn check_atomic<const N: usize>(index: usize, s: &WrSlot<N>) -> Result<()> {
    let sges = s
        .sges()
        .map_err(|reason| Error::InvalidWr { index, reason })?;
    crate::wr::atomic_target(index, sges)
}

/// The common checks of a slot at position `index`: an id this crate does not reserve, and
/// SGEs inside pinned regions (each one's pin goes to `named`).
pub(crate) fn check_slot<S: Slot>(
    pinned: &Checker<'_>,
    index: usize,
    s: &S,
    max_sge: u32,
    named: impl FnMut(u32),
) -> Result<()> {
    if s.wr_id() & WR_ID_TAG != 0 {
        return Err(Error::InvalidWr {
            index,
            reason: format!(
                "wr_id {:#x} has bit 63 set, which marks ids this crate issues",
                s.wr_id()
            ),
        });
    }
    let sges = s
        .sges()
        .map_err(|reason| Error::InvalidWr { index, reason })?;
    pinned.check_sges(index, sges, max_sge, named)
}
