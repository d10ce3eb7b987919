//! Posting: walking `ibv_send_wr`/`ibv_recv_wr` chains through `next`, checking each WR, and
//! queueing it, with libibverbs' `bad_wr` semantics (WRs before the failing one are posted).

use ibverbs_sys::{
    ibv_qp_state, ibv_recv_wr, ibv_send_flags, ibv_send_wr,
    ibv_send_wr__bindgen_ty_4__bindgen_ty_1, ibv_sge, ibv_wc_status, ibv_wr_opcode,
};

use super::{AtomicArgs, Extra, Payload, Qp, SendWqe, SgeList, Transport, UdDest, WqeMeta};
use crate::mr::read_mem;
use crate::mw::{Bind, LocalOp};
use crate::srq::RecvWqe;
use crate::state::World;

/// A chain longer than this is taken to be a cycle.
const MAX_CHAIN: usize = 1 << 20;

/// The SGEs of a WR, and how many bytes they name together.
///
/// # Safety
/// `list` must point to `n` readable `ibv_sge`s when `n > 0`.
unsafe fn sges(list: *mut ibv_sge, n: i32) -> Result<(SgeList, u64), i32> {
    match n {
        0 => Ok((SgeList::new(), 0)),
        n if n < 0 || list.is_null() => Err(libc::EINVAL),
        n => {
            // SAFETY: the caller guarantees `n` readable SGEs at `list`, which this copies
            // before returning.
            let sges = unsafe { std::slice::from_raw_parts(list, n as usize) };
            // One SGE (most WRs) is pushed, not copied through a `memcpy` call, and its length
            // is the total.
            Ok(match sges {
                // (The second unused.)
                [one] => (
                    SgeList::from_buf_and_len([*one, *one], 1),
                    u64::from(one.length),
                ),
                _ => (
                    SgeList::from_slice(sges),
                    sges.iter().map(|s| u64::from(s.length)).sum(),
                ),
            })
        }
    }
}

impl Qp {
    /// `ibv_post_send` on this QP.
    ///
    /// # Safety
    /// `wr` is null or the head of a `next`-linked chain of valid `ibv_send_wr`s whose SGE
    /// lists are valid, and whose inline buffers are readable, for the duration of the call.
    pub(crate) unsafe fn post_send(
        &mut self,
        w: &mut World,
        wr: *mut ibv_send_wr,
    ) -> Result<(), (i32, *mut ibv_send_wr)> {
        self.count(w, |c| c.post_send_calls += 1);
        // SAFETY: the caller's guarantees are passed on unchanged.
        let r = unsafe { self.queue_sends(w, wr) };
        // WRs before a failing one are posted: ring for them whatever happens.
        self.wake(w);
        r
    }

    /// Posts a chain all or nothing (the new post API's `wr_complete`): every WR is checked,
    /// and the send queue's room for all of them, before any is queued.
    ///
    /// # Safety
    /// As for [`Qp::post_send`].
    pub(crate) unsafe fn post_batch(
        &mut self,
        w: &mut World,
        mut wr: *mut ibv_send_wr,
    ) -> Result<(), i32> {
        self.count(w, |c| c.post_send_calls += 1);
        let mut wqes = Vec::new();
        while !wr.is_null() {
            // SAFETY: the caller guarantees every WR of the chain is valid.
            let r = unsafe { &*wr };
            // SAFETY: as above, for the WR's SGE list and inline data.
            wqes.push(unsafe { self.check_send(w, r, wqes.len(), true) }?);
            wr = r.next;
        }
        for wqe in wqes {
            self.queue_send(w, wqe);
        }
        self.wake(w);
        Ok(())
    }

    /// Queues the WRs of a chain up to the first bad one.
    ///
    /// # Safety
    /// As for [`Qp::post_send`].
    unsafe fn queue_sends(
        &mut self,
        w: &mut World,
        mut wr: *mut ibv_send_wr,
    ) -> Result<(), (i32, *mut ibv_send_wr)> {
        let mut n = 0;
        while !wr.is_null() {
            n += 1;
            if n > MAX_CHAIN {
                return Err((libc::EINVAL, wr));
            }
            // SAFETY: the caller guarantees every WR of the chain is valid.
            let r = unsafe { &*wr };
            // SAFETY: as above, for the WR's SGE list and inline data.
            let wqe = unsafe { self.check_send(w, r, 0, false) }.map_err(|e| (e, wr))?;
            self.queue_send(w, wqe);
            wr = r.next;
        }
        Ok(())
    }

    /// Checks that the send queue takes `r` after `ahead` more WRs than it holds now, and
    /// copies what the queue keeps of it (`built`: by the `ibv_wr_*` builders, see
    /// [`Qp::send_wqe`]).
    ///
    /// # Safety
    /// As for [`Qp::send_wqe`].
    #[inline(always)]
    unsafe fn check_send(
        &self,
        w: &World,
        r: &ibv_send_wr,
        ahead: usize,
        built: bool,
    ) -> Result<SendWqe, i32> {
        use ibv_qp_state::*;
        if ahead >= MAX_CHAIN || matches!(self.state, IBV_QPS_RESET | IBV_QPS_INIT | IBV_QPS_RTR) {
            return Err(libc::EINVAL);
        }
        // SAFETY: passed on.
        let wqe = unsafe { self.send_wqe(w, r, built) }?;
        if self.sq.occupied() + ahead >= self.cap.max_send_wr as usize {
            return Err(libc::ENOMEM);
        }
        Ok(wqe)
    }

    /// Queues a checked WR, giving it its place in the send queue.
    #[inline(always)]
    fn queue_send(&mut self, w: &mut World, mut wqe: SendWqe) {
        wqe.seq = self.sq.next_seq;
        self.sq.next_seq += 1;
        self.sq.wqes.push_back(wqe);
        self.count(w, |c| c.send_wrs += 1);
        if matches!(
            self.state,
            ibv_qp_state::IBV_QPS_ERR | ibv_qp_state::IBV_QPS_SQE
        ) {
            // Posted to a failed send queue: flushed at once.
            if !self.complete_send(w, ibv_wc_status::IBV_WC_WR_FLUSH_ERR) {
                self.sq.wqes.clear();
            }
            self.req.cur = self.sq.next_seq;
        }
    }

    /// Checks one send WR and copies what the queue keeps of it. A FLUSH exists only as
    /// `ibv_wr_flush` builds it (`built`; `ibv_send_wr` has no field for its placement type
    /// and level): the builder puts them in `imm_data` (type, then level << 8) and its length
    /// in `qp_type.xrc.remote_srqn`.
    ///
    /// # Safety
    /// `r`'s SGE list and (with `IBV_SEND_INLINE`) the memory it names must be readable.
    #[inline(always)]
    unsafe fn send_wqe(&self, w: &World, r: &ibv_send_wr, built: bool) -> Result<SendWqe, i32> {
        use ibv_wr_opcode::*;
        let op = r.opcode;
        // rxe's opcode table: memory windows are bound on RC and UC, invalidated locally on RC;
        // SEND_WITH_INV is RC's (the IBTA gives UC and UD no opcode for it).
        let allowed = match self.transport {
            // An XRC target sends nothing of its own.
            Transport::Rc if self.is_xrc_target() => false,
            Transport::Rc => {
                matches!(
                    op,
                    IBV_WR_SEND
                        | IBV_WR_SEND_WITH_IMM
                        | IBV_WR_RDMA_WRITE
                        | IBV_WR_RDMA_WRITE_WITH_IMM
                        | IBV_WR_RDMA_READ
                        | IBV_WR_ATOMIC_CMP_AND_SWP
                        | IBV_WR_ATOMIC_FETCH_AND_ADD
                        | IBV_WR_ATOMIC_WRITE
                        | IBV_WR_BIND_MW
                        | IBV_WR_LOCAL_INV
                        | IBV_WR_SEND_WITH_INV
                ) || (op == IBV_WR_FLUSH && built)
            }
            Transport::Uc => matches!(
                op,
                IBV_WR_SEND
                    | IBV_WR_SEND_WITH_IMM
                    | IBV_WR_RDMA_WRITE
                    | IBV_WR_RDMA_WRITE_WITH_IMM
                    | IBV_WR_BIND_MW
            ),
            Transport::Ud => matches!(op, IBV_WR_SEND | IBV_WR_SEND_WITH_IMM),
        };
        // rxe's validate_send_wr: a bind carries no data; nor does a FLUSH.
        let data_ok = !matches!(op, IBV_WR_BIND_MW | IBV_WR_FLUSH) || r.num_sge == 0;
        if !allowed || !data_ok || r.num_sge < 0 || r.num_sge as u32 > self.cap.max_send_sge {
            return Err(libc::EINVAL);
        }
        let local = match op {
            // SAFETY: for a BIND_MW WR the second union holds `bind_mw` (plain data).
            IBV_WR_BIND_MW => Some(LocalOp::Bind(bind_of(w, unsafe {
                r.__bindgen_anon_2.bind_mw
            })?)),
            // SAFETY: `imm_data` and `invalidate_rkey` are both a plain u32.
            IBV_WR_LOCAL_INV => Some(LocalOp::Invalidate(unsafe {
                r.__bindgen_anon_1.invalidate_rkey
            })),
            _ => None,
        };
        if let Some(op) = local {
            return Ok(SendWqe {
                meta: WqeMeta {
                    extra: Extra::Local(op),
                    ..self.wqe_of(r, 0)
                },
                payload: Payload::Sges(SgeList::new()),
            });
        }
        if op == IBV_WR_FLUSH {
            // SAFETY: plain u32s and the `rdma` member of the `wr` union, as the builder set
            // them (see above).
            let (ex, len, rdma) = unsafe {
                (
                    r.__bindgen_anon_1.imm_data,
                    r.qp_type.xrc.remote_srqn,
                    r.wr.rdma,
                )
            };
            let (ptype, level) = ((ex & 0xff) as u8, (ex >> 8) as u8);
            // Global visibility and/or persistence, of the range or of the whole region.
            if !(1..=3).contains(&ptype) || level > 1 {
                return Err(libc::EINVAL);
            }
            return Ok(SendWqe {
                meta: WqeMeta {
                    extra: Extra::Flush(ptype, level),
                    remote_addr: rdma.remote_addr,
                    rkey: rdma.rkey,
                    ..self.wqe_of(r, u64::from(len))
                },
                payload: Payload::Sges(SgeList::new()),
            });
        }
        // SAFETY: the caller guarantees the SGE list.
        let (list, len) = unsafe { sges(r.sg_list, r.num_sge) }?;
        let flags = r.send_flags;
        let inline = flags & ibv_send_flags::IBV_SEND_INLINE.0 != 0;
        let is_atomic = matches!(op, IBV_WR_ATOMIC_CMP_AND_SWP | IBV_WR_ATOMIC_FETCH_AND_ADD);
        let atomic = if is_atomic {
            // SAFETY: for an atomic WR the `wr` union holds the `atomic` member (plain data).
            let a = unsafe { r.wr.atomic };
            // rxe's validate_send_wr: exactly 8 local bytes and an 8-byte aligned address.
            if len != 8 || a.remote_addr % 8 != 0 || inline {
                return Err(libc::EINVAL);
            }
            Some((
                a.remote_addr,
                a.rkey,
                AtomicArgs {
                    compare_add: a.compare_add,
                    swap: a.swap,
                },
            ))
        } else if op == IBV_WR_ATOMIC_WRITE {
            // SAFETY: an ATOMIC WRITE is addressed as an RDMA WRITE: the `wr` union holds the
            // `rdma` member (plain data).
            let a = unsafe { r.wr.rdma };
            // rxe: the WR's data is the 8 bytes written, to an 8-byte aligned address (they
            // travel in the WQE, inline or not, whatever `max_inline_data` says).
            if len != 8 || a.remote_addr % 8 != 0 {
                return Err(libc::EINVAL);
            }
            Some((
                a.remote_addr,
                a.rkey,
                AtomicArgs {
                    compare_add: 0,
                    swap: 0,
                },
            ))
        } else {
            None
        };
        let payload = if inline {
            let too_long = len > u64::from(self.cap.max_inline_data) && op != IBV_WR_ATOMIC_WRITE;
            if op == IBV_WR_RDMA_READ || too_long {
                return Err(libc::EINVAL);
            }
            let mut data = Vec::with_capacity(len as usize);
            if w.cfg.copy_payload || !matches!(op, IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM) {
                for s in &list {
                    // SAFETY: an inline WR's buffers must be readable during the post
                    // (ibv_post_send contract); no lkey is involved.
                    unsafe { read_mem(s.addr, s.length as usize, &mut data) };
                }
            } else {
                data.resize(len as usize, 0);
            }
            Payload::Inline(data)
        } else {
            Payload::Sges(list)
        };
        // SAFETY: `imm_data` and `invalidate_rkey` are both a plain u32.
        let ex = unsafe { r.__bindgen_anon_1.imm_data };
        let imm = matches!(op, IBV_WR_SEND_WITH_IMM | IBV_WR_RDMA_WRITE_WITH_IMM).then_some(ex);
        let mut error = None;
        let (remote_addr, rkey, ud) = if self.transport == Transport::Ud {
            // SAFETY: for a UD QP the `wr` union holds the `ud` member (plain data).
            let ud = unsafe { r.wr.ud };
            let ah = w
                .ah_by_ptr
                .get(&(ud.ah as usize))
                .and_then(|id| w.ahs.get(id));
            let Some(ah) = ah else {
                return Err(libc::EINVAL);
            };
            if ah.pd != self.pd {
                error = Some(ibv_wc_status::IBV_WC_LOC_QP_OP_ERR);
            }
            let dest = UdDest {
                dgid: ah.dgid,
                remote_qpn: ud.remote_qpn & 0x00ff_ffff,
                qkey: ud.remote_qkey,
            };
            (0, 0, Some(dest))
        } else if let Some((remote_addr, rkey, _)) = atomic {
            (remote_addr, rkey, None)
        } else {
            // SAFETY: for RC/UC the `wr` union holds the `rdma` member (plain data).
            let rdma = unsafe { r.wr.rdma };
            (rdma.remote_addr, rdma.rkey, None)
        };
        Ok(SendWqe {
            meta: WqeMeta {
                imm,
                invalidate: (op == IBV_WR_SEND_WITH_INV).then_some(ex),
                remote_addr,
                rkey,
                extra: match (ud, atomic) {
                    (Some(d), _) => Extra::Ud(d),
                    (None, Some((_, _, args))) => Extra::Atomic(args),
                    (None, None) => Extra::None,
                },
                error,
                ..self.wqe_of(r, len)
            },
            payload,
        })
    }

    /// The metadata of a send WQE for `r` with data of `len` bytes, and nothing else of the
    /// opcode's.
    fn wqe_of(&self, r: &ibv_send_wr, len: u64) -> WqeMeta {
        let flags = r.send_flags;
        WqeMeta {
            seq: 0, // set when queued
            wr_id: r.wr_id,
            opcode: r.opcode,
            signaled: flags & ibv_send_flags::IBV_SEND_SIGNALED.0 != 0,
            fence: flags & ibv_send_flags::IBV_SEND_FENCE.0 != 0,
            solicited: flags & ibv_send_flags::IBV_SEND_SOLICITED.0 != 0,
            len,
            imm: None,
            remote_addr: 0,
            rkey: 0,
            extra: Extra::None,
            invalidate: None,
            started: false,
            first_psn: 0,
            npkts: 0,
            error: None,
            srqn: match self.xrc {
                // SAFETY: a plain u32 of the `qp_type` union (an initiator's WR sets it).
                Some(crate::xrc::Role::Initiator) => unsafe { r.qp_type.xrc.remote_srqn },
                _ => 0,
            } & 0x00ff_ffff,
        }
    }

    /// `ibv_post_recv` on this QP.
    ///
    /// # Safety
    /// `wr` is null or the head of a `next`-linked chain of valid `ibv_recv_wr`s with valid SGE
    /// lists.
    pub(crate) unsafe fn post_recv(
        &mut self,
        w: &mut World,
        mut wr: *mut ibv_recv_wr,
    ) -> Result<(), (i32, *mut ibv_recv_wr)> {
        self.count(w, |c| c.post_recv_calls += 1);
        let mut n = 0;
        while !wr.is_null() {
            n += 1;
            // (An XRC QP has no receive queue: an initiator receives nothing, a target into
            // the SRQs its requests name.)
            let no_rq = self.srq.is_some() || self.xrc.is_some();
            if n > MAX_CHAIN || self.state == ibv_qp_state::IBV_QPS_RESET || no_rq {
                return Err((libc::EINVAL, wr));
            }
            // SAFETY: the caller guarantees every WR of the chain is valid.
            let r = unsafe { &*wr };
            if r.num_sge < 0 || r.num_sge as u32 > self.cap.max_recv_sge {
                return Err((libc::EINVAL, wr));
            }
            // SAFETY: as above, for the SGE list.
            let (sges, _) = unsafe { sges(r.sg_list, r.num_sge) }.map_err(|e| (e, wr))?;
            if self.rq.wqes.len() + self.rq.unreclaimed as usize >= self.cap.max_recv_wr as usize {
                return Err((libc::ENOMEM, wr));
            }
            let wqe = RecvWqe {
                wr_id: r.wr_id,
                sges,
            };
            self.count(w, |c| c.recv_wrs += 1);
            if self.state == ibv_qp_state::IBV_QPS_ERR {
                let st = ibv_wc_status::IBV_WC_WR_FLUSH_ERR;
                self.complete_recv(w, &wqe, false, st, &Default::default(), false);
            } else {
                self.rq.wqes.push_back(wqe);
            }
            wr = r.next;
        }
        Ok(())
    }
}

/// A BIND_MW WR's window and region, resolved: EINVAL for a window that is not a live one of
/// this fabric, or a bind with a length and no live region (rxe's provider would dereference
/// them).
fn bind_of(w: &World, b: ibv_send_wr__bindgen_ty_4__bindgen_ty_1) -> Result<Bind, i32> {
    let info = b.bind_info;
    let mw = w.window_id(b.mw).ok_or(libc::EINVAL)?;
    let mr = match info.length {
        0 => None,
        _ => Some(w.region_id(info.mr).ok_or(libc::EINVAL)?),
    };
    Ok(Bind {
        mw,
        mr,
        addr: info.addr,
        len: info.length,
        access: info.mw_access_flags,
        tag: b.rkey as u8,
    })
}

impl World {
    /// `ibv_post_srq_recv` on SRQ `srq`.
    ///
    /// # Safety
    /// As for [`Qp::post_recv`].
    pub(crate) unsafe fn post_srq_recv(
        &mut self,
        srq: u32,
        mut wr: *mut ibv_recv_wr,
    ) -> Result<(), (i32, *mut ibv_recv_wr)> {
        let Some(s) = self.srqs.get_mut(&srq) else {
            return Err((libc::EINVAL, wr));
        };
        let dev = self.contexts.get(&s.ctx).map_or(0, |c| c.dev);
        let counters = &mut self.devices[dev].counters;
        counters.post_srq_recv_calls += 1;
        let mut n = 0;
        while !wr.is_null() {
            n += 1;
            if n > MAX_CHAIN {
                return Err((libc::EINVAL, wr));
            }
            // SAFETY: the caller guarantees every WR of the chain is valid.
            let r = unsafe { &*wr };
            if r.num_sge < 0 || r.num_sge as u32 > s.max_sge {
                return Err((libc::EINVAL, wr));
            }
            // SAFETY: as above, for the SGE list.
            let (sges, _) = unsafe { sges(r.sg_list, r.num_sge) }.map_err(|e| (e, wr))?;
            if s.wqes.len() + s.unreclaimed as usize >= s.max_wr as usize {
                return Err((libc::ENOMEM, wr));
            }
            s.wqes.push_back(RecvWqe {
                wr_id: r.wr_id,
                sges,
            });
            counters.recv_wrs += 1;
            wr = r.next;
        }
        Ok(())
    }
}
