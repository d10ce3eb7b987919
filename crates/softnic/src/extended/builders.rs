//! The batch a thread builds between `ibv_wr_start` and `ibv_wr_complete`, and the `ibv_wr_*`
//! builders and setters that append to it.
//!
//! A builder appends a WR with the caller's `wr_id` and `wr_flags` (an opcode the QP was not
//! made with fails the batch); a setter gives the last WR its SGE list, inline data or UD
//! address. Errors are kept, the first one wins, and `wr_complete` returns it. SGE lists and
//! inline data are checked against the QP's limits before anything is copied.

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

use ibverbs_sys::*;

use super::qp::{Builder, building};

/// Buffers of a batch larger than this (in elements) are shrunk back when it ends, so one
/// large batch does not pin its memory for the QP's life.
const KEEP: usize = 1024;

/// The WRs of a batch being built. Their SGE lists live in `sges`, and inline data in
/// `inline`: both may grow while building, so the WRs get their pointers in [`Batch::link`].
#[derive(Default)]
pub(super) struct Batch {
    wrs: Vec<ibv_send_wr>,
    /// Per WR: its SGEs in `sges` (start, count), and whether they are inline data (their
    /// `addr`s are offsets into `inline`).
    lists: Vec<(usize, usize, bool)>,
    sges: Vec<ibv_sge>,
    inline: Vec<u8>,
    /// The first error a builder met (an opcode the QP was not made with, a setter with no
    /// WR, a limit passed, something softnic does not serve).
    pub(super) error: c_int,
}

impl Batch {
    /// Empties the batch for the next one, keeping (bounded) buffers.
    pub(super) fn clear(&mut self) {
        fn reset<T>(v: &mut Vec<T>) {
            v.clear();
            v.shrink_to(KEEP);
        }
        reset(&mut self.wrs);
        reset(&mut self.lists);
        reset(&mut self.sges);
        reset(&mut self.inline);
        self.error = 0;
    }

    fn fail(&mut self, e: c_int) {
        if self.error == 0 {
            self.error = e;
        }
    }

    /// Gives every WR its SGE list and `IBV_SEND_INLINE` (set exactly when its data came from
    /// `wr_set_inline_data*`), and links them: the chain to post, null if empty. The pointers
    /// are all taken from one pointer to each buffer, after the last reference into it, so
    /// posting may read through every one of them.
    pub(super) fn link(&mut self) -> *mut ibv_send_wr {
        let inline = self.inline.as_ptr() as u64;
        let flag = ibv_send_flags::IBV_SEND_INLINE.0;
        for (wr, &(start, n, is_inline)) in self.wrs.iter_mut().zip(&self.lists) {
            if is_inline {
                for s in &mut self.sges[start..start + n] {
                    s.addr += inline;
                }
                wr.send_flags |= flag;
            } else {
                wr.send_flags &= !flag;
            }
            // `n` is at most the QP's `max_send_sge` (a `u32`) or 1.
            wr.num_sge = c_int::try_from(n).unwrap_or(c_int::MAX);
        }
        let sges = self.sges.as_mut_ptr();
        for (wr, &(start, n, _)) in self.wrs.iter_mut().zip(&self.lists) {
            wr.sg_list = if n == 0 {
                null_mut()
            } else {
                sges.wrapping_add(start)
            };
        }
        let wrs = self.wrs.as_mut_ptr();
        for i in 1..self.wrs.len() {
            // SAFETY: `i - 1` and `i` are below the length of `wrs`, whose buffer `wrs`
            // points to; no reference into it is live.
            unsafe { (*wrs.add(i - 1)).next = wrs.add(i) };
        }
        if self.wrs.is_empty() { null_mut() } else { wrs }
    }

    /// The last WR built, for a setter; a setter with none fails the batch.
    fn last(&mut self) -> Option<usize> {
        let i = self.wrs.len().checked_sub(1);
        if i.is_none() {
            self.fail(libc::EINVAL);
        }
        i
    }

    /// Replaces the last WR's SGE list with `sges` (inline data if `inline`).
    fn set_list(&mut self, sges: impl IntoIterator<Item = ibv_sge>, inline: bool) {
        let Some(i) = self.last() else { return };
        let start = self.sges.len();
        self.sges.extend(sges);
        self.lists[i] = (start, self.sges.len() - start, inline);
    }
}

/// Appends a WR of opcode `op` if the QP was made with `need`, and returns it for its
/// opcode's fields.
fn push<'a>(
    b: &'a mut Builder<'_>,
    op: ibv_wr_opcode::Type,
    need: u32,
) -> Option<&'a mut ibv_send_wr> {
    if b.limits.send_ops & u64::from(need) == 0 {
        b.batch.fail(libc::EINVAL);
        return None;
    }
    let batch = &mut *b.batch;
    batch.wrs.push(ibv_send_wr {
        wr_id: b.wr_id,
        next: null_mut(),
        sg_list: null_mut(),
        num_sge: 0,
        opcode: op,
        send_flags: b.wr_flags,
        __bindgen_anon_1: Default::default(),
        wr: Default::default(),
        qp_type: Default::default(),
        __bindgen_anon_2: Default::default(),
    });
    batch.lists.push((batch.sges.len(), 0, false));
    batch.wrs.last_mut()
}

/// Defines builders that append a WR: `name(args) => opcode, required send op, |wr| fill`.
macro_rules! builders {
    ($($name:ident($($arg:ident: $ty:ty),*) => $op:ident, $need:ident, |$wr:ident| $fill:block)*) => {$(
        pub(super) unsafe extern "C" fn $name(qp: *mut ibv_qp_ex, $($arg: $ty),*) {
            // SAFETY: called as `qp->wr_x(qp, ...)`, on a softnic shell.
            if let Some(mut b) = unsafe { building(qp) } {
                if let Some($wr) = push(&mut b, ibv_wr_opcode::$op, $need) {
                    $fill
                }
            }
        }
    )*};
}

builders! {
    wr_send() => IBV_WR_SEND, IBV_QP_EX_WITH_SEND, |_wr| {}
    wr_send_imm(imm: __be32) => IBV_WR_SEND_WITH_IMM, IBV_QP_EX_WITH_SEND_WITH_IMM, |wr| {
        wr.__bindgen_anon_1.imm_data = imm;
    }
    wr_rdma_write(rkey: u32, remote_addr: u64) => IBV_WR_RDMA_WRITE, IBV_QP_EX_WITH_RDMA_WRITE,
        |wr| { wr.wr.rdma = ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey }; }
    wr_rdma_write_imm(rkey: u32, remote_addr: u64, imm: __be32) => IBV_WR_RDMA_WRITE_WITH_IMM,
        IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM, |wr| {
            wr.wr.rdma = ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
            wr.__bindgen_anon_1.imm_data = imm;
        }
    wr_rdma_read(rkey: u32, remote_addr: u64) => IBV_WR_RDMA_READ, IBV_QP_EX_WITH_RDMA_READ,
        |wr| { wr.wr.rdma = ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey }; }
    wr_atomic_cmp_swp(rkey: u32, remote_addr: u64, compare: u64, swap: u64) =>
        IBV_WR_ATOMIC_CMP_AND_SWP, IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP, |wr| {
            wr.wr.atomic = ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                remote_addr, compare_add: compare, swap, rkey,
            };
        }
    wr_atomic_fetch_add(rkey: u32, remote_addr: u64, add: u64) =>
        IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD, |wr| {
            wr.wr.atomic = ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                remote_addr, compare_add: add, swap: 0, rkey,
            };
        }
    wr_local_inv(invalidate_rkey: u32) => IBV_WR_LOCAL_INV, IBV_QP_EX_WITH_LOCAL_INV, |wr| {
        wr.__bindgen_anon_1.invalidate_rkey = invalidate_rkey;
    }
    wr_send_inv(invalidate_rkey: u32) => IBV_WR_SEND_WITH_INV, IBV_QP_EX_WITH_SEND_WITH_INV,
        |wr| { wr.__bindgen_anon_1.invalidate_rkey = invalidate_rkey; }
}

/// `ibv_wr_bind_mw`: a BIND_MW of `mw` to what `info` describes, with the new key `rkey`
/// (its tag is the new key's; see [`crate::mw`]). A null `info` fails the batch (EINVAL).
pub(super) unsafe extern "C" fn wr_bind_mw(
    qp: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    info: *const ibv_mw_bind_info,
) {
    // SAFETY: called as `qp->wr_x(qp, ...)`, on a softnic shell.
    let Some(mut b) = (unsafe { building(qp) }) else {
        return;
    };
    if info.is_null() {
        return b.batch.fail(libc::EINVAL);
    }
    // SAFETY: non-null, and a valid `ibv_mw_bind_info` (the API's contract); copied now.
    let bind_info = unsafe { *info };
    let op = ibv_wr_opcode::IBV_WR_BIND_MW;
    if let Some(wr) = push(&mut b, op, IBV_QP_EX_WITH_BIND_MW) {
        wr.__bindgen_anon_2.bind_mw = ibv_send_wr__bindgen_ty_4__bindgen_ty_1 {
            mw,
            rkey,
            bind_info,
        };
    }
}

/// Fails the batch with EOPNOTSUPP: a builder softnic does not serve (TSO, XRC).
///
/// # Safety
/// As for [`building`].
unsafe fn unserved(qp: *mut ibv_qp_ex) {
    // SAFETY: passed on from the caller.
    if let Some(b) = unsafe { building(qp) } {
        b.batch.fail(libc::EOPNOTSUPP);
    }
}

pub(super) unsafe extern "C" fn wr_send_tso(qp: *mut ibv_qp_ex, _: *mut c_void, _: u16, _: u16) {
    // SAFETY: called as `qp->wr_x(qp, ...)`, on a softnic shell.
    unsafe { unserved(qp) }
}

/// `ibv_wr_atomic_write`: an RDMA ATOMIC WRITE of the 8 bytes at `atomic_wr` (copied now, as
/// rxe's provider copies them into the WQE) to `remote_addr`, which must be 8-byte aligned.
/// The bytes travel as the WR's inline data. A null `atomic_wr` fails the batch (EINVAL).
pub(super) unsafe extern "C" fn wr_atomic_write(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    atomic_wr: *const c_void,
) {
    // SAFETY: called as `qp->wr_x(qp, ...)`, on a softnic shell.
    let Some(mut b) = (unsafe { building(qp) }) else {
        return;
    };
    // SAFETY: 8 readable bytes, or null (the API's contract).
    let value: Option<[u8; 8]> =
        unsafe { caller_slice(atomic_wr.cast::<u8>(), 8) }.and_then(|v| v.try_into().ok());
    let Some(value) = value else {
        return b.batch.fail(libc::EINVAL);
    };
    let op = ibv_wr_opcode::IBV_WR_ATOMIC_WRITE;
    let Some(wr) = push(&mut b, op, IBV_QP_EX_WITH_ATOMIC_WRITE) else {
        return;
    };
    wr.wr.rdma = ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
    let batch = &mut *b.batch;
    let start = batch.inline.len() as u64;
    batch.inline.extend_from_slice(&value);
    // An offset into `inline` until the batch is linked, as `wr_set_inline_data`'s.
    let sge = ibv_sge {
        addr: start,
        length: 8,
        lkey: 0,
    };
    batch.set_list([sge], true);
}

/// `ibv_wr_flush`: an RDMA FLUSH of `len` bytes at `remote_addr` (or of the whole region,
/// `level` `IBV_FLUSH_MR`) to global visibility and/or persistence (`ptype`). A length over
/// the RETH's 32 bits fails the batch (EINVAL); the type and level are checked at
/// `ibv_wr_complete`. They travel to the post path in fields a FLUSH WR has no use for (see
/// softnic's `Qp::send_wqe`).
pub(super) unsafe extern "C" fn wr_flush(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    len: usize,
    ptype: u8,
    level: u8,
) {
    // SAFETY: called as `qp->wr_x(qp, ...)`, on a softnic shell.
    let Some(mut b) = (unsafe { building(qp) }) else {
        return;
    };
    let Ok(len) = u32::try_from(len) else {
        return b.batch.fail(libc::EINVAL);
    };
    let op = ibv_wr_opcode::IBV_WR_FLUSH;
    if let Some(wr) = push(&mut b, op, IBV_QP_EX_WITH_FLUSH) {
        wr.wr.rdma = ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
        wr.__bindgen_anon_1.imm_data = u32::from(ptype) | (u32::from(level) << 8);
        wr.qp_type.xrc.remote_srqn = len;
    }
}

/// The caller's array of `n` items: empty for `n == 0`, `None` for a null pointer.
///
/// # Safety
/// `ptr` is null or points to `n` readable items, unchanged while the slice is used.
unsafe fn caller_slice<'a, T>(ptr: *const T, n: usize) -> Option<&'a [T]> {
    if n == 0 {
        return Some(&[]);
    }
    if ptr.is_null() {
        return None;
    }
    // SAFETY: non-null, and `n` readable items per this function's contract.
    Some(unsafe { std::slice::from_raw_parts(ptr, n) })
}

pub(super) unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    // SAFETY: called as `qp->wr_x(qp, ...)`, on a softnic shell.
    if let Some(b) = unsafe { building(qp) } {
        b.batch.set_list([ibv_sge { addr, length, lkey }], false);
    }
}

pub(super) unsafe extern "C" fn wr_set_sge_list(
    qp: *mut ibv_qp_ex,
    n: usize,
    list: *const ibv_sge,
) {
    // SAFETY: called as `qp->wr_x(qp, ...)`, on a softnic shell.
    let Some(b) = (unsafe { building(qp) }) else {
        return;
    };
    if n > b.limits.max_sge as usize {
        return b.batch.fail(libc::EINVAL);
    }
    // SAFETY: the caller's list has `n` SGEs (the API's contract); copied now.
    match unsafe { caller_slice(list, n) } {
        Some(list) => b.batch.set_list(list.iter().copied(), false),
        None => b.batch.fail(libc::EINVAL),
    }
}

pub(super) unsafe extern "C" fn wr_set_inline_data(
    qp: *mut ibv_qp_ex,
    addr: *mut c_void,
    length: usize,
) {
    let buf = ibv_data_buf { addr, length };
    // SAFETY: passed on, with a list of one buffer.
    unsafe { wr_set_inline_data_list(qp, 1, &buf) }
}

pub(super) unsafe extern "C" fn wr_set_inline_data_list(
    qp: *mut ibv_qp_ex,
    n: usize,
    list: *const ibv_data_buf,
) {
    // SAFETY: called as `qp->wr_x(qp, ...)`, on a softnic shell.
    let Some(b) = (unsafe { building(qp) }) else {
        return;
    };
    // SAFETY: the caller's list has `n` buffers (the API's contract).
    let Some(list) = (unsafe { caller_slice(list, n) }) else {
        return b.batch.fail(libc::EINVAL);
    };
    let total = list
        .iter()
        .try_fold(0usize, |sum, d| sum.checked_add(d.length));
    if total.is_none_or(|t| t > b.limits.max_inline as usize) {
        return b.batch.fail(libc::EINVAL);
    }
    // The data is copied now, as one SGE over all of it; its address is an offset into
    // `inline` until the batch is linked.
    let batch = &mut *b.batch;
    let start = batch.inline.len();
    for d in list {
        // SAFETY: each buffer is `length` readable bytes (the API's contract).
        match unsafe { caller_slice(d.addr.cast::<u8>().cast_const(), d.length) } {
            Some(bytes) => batch.inline.extend_from_slice(bytes),
            None => return batch.fail(libc::EINVAL),
        }
    }
    // At most `max_inline`, a `u32`.
    let length = (batch.inline.len() - start) as u32;
    let sge = ibv_sge {
        addr: start as u64,
        length,
        lkey: 0,
    };
    batch.set_list((length > 0).then_some(sge), true);
}

/// `ibv_wr_set_xrc_srqn`: the remote SRQ the WR just built is for (read by an XRC initiator
/// only, as `qp_type.xrc.remote_srqn` of `ibv_post_send`).
///
/// # Safety
/// As for [`building`]: `qp` is the softnic QP whose callback this is.
pub(super) unsafe extern "C" fn wr_set_xrc_srqn(qp: *mut ibv_qp_ex, remote_srqn: u32) {
    // SAFETY: called as `qp->wr_x(qp, ...)`, on a softnic shell.
    let Some(b) = (unsafe { building(qp) }) else {
        return;
    };
    if let Some(i) = b.batch.last() {
        b.batch.wrs[i].qp_type.xrc.remote_srqn = remote_srqn;
    }
}

pub(super) unsafe extern "C" fn wr_set_ud_addr(
    qp: *mut ibv_qp_ex,
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    // SAFETY: called as `qp->wr_x(qp, ...)`, on a softnic shell.
    let Some(b) = (unsafe { building(qp) }) else {
        return;
    };
    if let Some(i) = b.batch.last() {
        b.batch.wrs[i].wr.ud = ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
            ah,
            remote_qpn,
            remote_qkey,
        };
    }
}
