//! rdma-core's extended verbs, reached as the inline helpers of `<infiniband/verbs.h>` reach
//! them: the `verbs_context` in front of the `ibv_context` (found by `abi_compat` and fixed
//! offsets), `ibv_cq_ex`'s polling callbacks ([`cq`]), and `ibv_qp_ex`'s work-request builders
//! ([`qp`]). This module holds the context's tests and the helpers.

use std::ffi::{c_int, c_void};

use crate::common::*;

/// `offsetof(struct verbs_context, context)` in rdma-core's verbs.h.
pub(super) const CONTEXT_OFFSET: usize = 320;

/// The word at `offset` in the `verbs_context` of `ctx`, as `verbs_get_ctx_op` reads it,
/// read as a `T`.
pub(crate) fn vctx_read<T: Copy>(ctx: *mut ibv_context, offset: usize) -> T {
    // SAFETY: the context is extended (the `contexts_are_extended...` test checks its
    // `abi_compat`), so the 320 bytes before it are its `verbs_context`'s words; `T` is a
    // word (a size or an optional function pointer).
    unsafe {
        ctx.cast::<u8>()
            .sub(CONTEXT_OFFSET)
            .add(offset)
            .cast::<T>()
            .read()
    }
}

/// The word at `offset` in the `verbs_context` of `ctx`.
pub(super) fn vctx_word(ctx: *mut ibv_context, offset: usize) -> usize {
    vctx_read(ctx, offset)
}

/// The op at `offset` of the `verbs_context` of `ctx`, as a function of type `F` (a C
/// function pointer type of the op's signature).
pub(crate) fn vctx_op<F: Copy>(ctx: *mut ibv_context, offset: usize) -> F {
    vctx_read::<Option<F>>(ctx, offset).unwrap_or_else(|| panic!("op at offset {offset} is null"))
}

pub(super) type CreateCqEx =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex;
pub(super) type CreateQpEx =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp;

pub(super) fn create_cq_ex(ctx: *mut ibv_context, wc_flags: u32) -> Result<*mut ibv_cq_ex, i32> {
    let f: CreateCqEx = vctx_op(ctx, 200);
    let mut attr = ibv_cq_init_attr_ex {
        cqe: 64,
        cq_context: 0x5eed as *mut c_void,
        wc_flags: u64::from(wc_flags),
        ..Default::default()
    };
    // SAFETY: a live context and a valid attribute struct.
    let cq = unsafe { f(ctx, &mut attr) };
    if cq.is_null() {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    } else {
        Ok(cq)
    }
}

pub(crate) const ALL_SEND_OPS: u64 = (IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_SEND_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_READ
    | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD) as u64;

pub(super) fn create_qp_ex(n: &Node, cq: *mut ibv_cq, send_ops: u64) -> Result<*mut ibv_qp, i32> {
    let f: CreateQpEx = vctx_op(n.ctx, 264);
    let mut attr = ibv_qp_init_attr_ex {
        send_cq: cq,
        recv_cq: cq,
        cap: cap(16, 16),
        qp_type: ibv_qp_type::IBV_QPT_RC,
        comp_mask: IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        pd: n.pd,
        send_ops_flags: send_ops,
        ..Default::default()
    };
    // SAFETY: a live context and a valid attribute struct.
    let qp = unsafe { f(n.ctx, &mut attr) };
    if qp.is_null() {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    } else {
        Ok(qp)
    }
}

/// Two extended RC QPs on two devices, each with one extended CQ for both directions.
pub(crate) struct ExPair {
    pub(crate) a: Node,
    pub(crate) b: Node,
    pub(crate) cqa: *mut ibv_cq_ex,
    pub(crate) cqb: *mut ibv_cq_ex,
    pub(crate) qa: *mut ibv_qp,
    pub(crate) qb: *mut ibv_qp,
    pub(crate) xa: *mut ibv_qp_ex,
}

pub(crate) fn ex_pair(f: &Fabric, send_ops: u64) -> ExPair {
    let a = Node::open(f, "soft0");
    let b = Node::open(f, "soft1");
    let flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM;
    let cqa = create_cq_ex(a.ctx, flags).unwrap();
    let cqb = create_cq_ex(b.ctx, flags).unwrap();
    let qa = create_qp_ex(&a, cqa.cast(), send_ops).unwrap();
    let qb = create_qp_ex(&b, cqb.cast(), ALL_SEND_OPS).unwrap();
    let all = |x: &mut ibv_qp_attr| x.qp_access_flags = ALL_ACCESS;
    bring_up(qa, ibv_qp_type::IBV_QPT_RC, b.gid, qpn(qb), all);
    bring_up(qb, ibv_qp_type::IBV_QPT_RC, a.gid, qpn(qa), all);
    let remote = ibv_qp_attr {
        qp_access_flags: ALL_ACCESS | ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0,
        ..Default::default()
    };
    let access = m(ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS);
    assert_eq!(modify(qb, &remote, access), 0);
    // SAFETY: softnic checks the pointer.
    let xa = unsafe { softnic::qp_to_qp_ex(qa) };
    assert!(!xa.is_null());
    ExPair {
        a,
        b,
        cqa,
        cqb,
        qa,
        qb,
        xa,
    }
}

/// One completion as the `read_*` callbacks report it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Polled {
    pub(crate) status: u32,
    pub(crate) wr_id: u64,
    pub(crate) opcode: u32,
    pub(crate) byte_len: u32,
    pub(crate) imm: u32,
    pub(crate) qp_num: u32,
    pub(crate) flags: u32,
}

/// The completion in hand of `cq` (after a successful start_poll or next_poll).
pub(crate) fn read(cq: *mut ibv_cq_ex) -> Polled {
    // SAFETY: a live extended CQ, polled by this thread; every callback is set.
    unsafe {
        let c = &*cq;
        Polled {
            status: c.status,
            wr_id: c.wr_id,
            opcode: c.read_opcode.unwrap()(cq),
            byte_len: c.read_byte_len.unwrap()(cq),
            imm: c.read_imm_data.unwrap()(cq),
            qp_num: c.read_qp_num.unwrap()(cq),
            flags: c.read_wc_flags.unwrap()(cq),
        }
    }
}

/// Polls `cq` with start/next/end_poll until `n` completions came (or the fabric idles).
pub(crate) fn poll_ex(cq: *mut ibv_cq_ex, n: usize) -> Vec<Polled> {
    let mut out = Vec::new();
    for _ in 0..8 {
        if out.len() >= n {
            break;
        }
        // SAFETY: a live extended CQ; its callbacks are set.
        let c = unsafe { &*cq };
        let mut attr = ibv_poll_cq_attr { comp_mask: 0 };
        // SAFETY: as above.
        let mut r = unsafe { c.start_poll.unwrap()(cq, &mut attr) };
        if r == libc::ENOENT {
            continue;
        }
        assert_eq!(r, 0, "start_poll");
        while r == 0 {
            out.push(read(cq));
            // SAFETY: as above, between start_poll and end_poll.
            r = unsafe { c.next_poll.unwrap()(cq) };
        }
        assert_eq!(r, libc::ENOENT, "next_poll");
        // SAFETY: as above.
        unsafe { c.end_poll.unwrap()(cq) };
    }
    out
}

/// Calls a builder of `qp`'s extended interface.
macro_rules! wr {
    ($qp:expr, $f:ident $(, $arg:expr)*) => {
        // SAFETY: a live extended QP between wr_start and wr_complete; the callback is set.
        unsafe { (*$qp).$f.unwrap()($qp $(, $arg)*) }
    };
}

/// Sets the WR id and flags the next builder takes.
pub(crate) fn next_wr(qp: *mut ibv_qp_ex, wr_id: u64, flags: u32) {
    // SAFETY: a live extended QP; these fields are the caller's to set.
    unsafe {
        (*qp).wr_id = wr_id;
        (*qp).wr_flags = flags;
    }
}

#[test]
fn contexts_are_extended_with_ops_at_rdma_cores_offsets() {
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    // SAFETY: a live context is readable.
    assert_eq!(unsafe { (*a.ctx).abi_compat } as usize, usize::MAX);
    assert!(vctx_word(a.ctx, 312) >= 648, "sz covers every op");
    // Not served: null, so the helpers answer EOPNOTSUPP (alloc_null_mr, alloc_dm, open_qp).
    for offset in [16, 8 * 9, 256] {
        assert_eq!(vctx_word(a.ctx, offset), 0, "op at {offset}");
    }

    type QueryPort = unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int;
    let query_port: QueryPort = vctx_op(a.ctx, 0);
    // A caller with a larger struct (newer headers) gets zeros past softnic's.
    let mut big = [0xffu8; size_of::<ibv_port_attr>() + 16];
    // SAFETY: `big` has room for the length given.
    let r = unsafe { query_port(a.ctx, 1, big.as_mut_ptr().cast(), big.len()) };
    assert_eq!(r, 0);
    assert!(big[size_of::<ibv_port_attr>()..].iter().all(|&b| b == 0));
    // SAFETY: `big` starts with a whole `ibv_port_attr`.
    let p = unsafe { big.as_ptr().cast::<ibv_port_attr>().read_unaligned() };
    assert_eq!(p.state, ibv_port_state::IBV_PORT_ACTIVE);
    assert_eq!(p.link_layer, IBV_LINK_LAYER_ETHERNET as u8);
    // SAFETY: as above; port 2 does not exist.
    let r = unsafe { query_port(a.ctx, 2, big.as_mut_ptr().cast(), big.len()) };
    assert_eq!(r, libc::EINVAL);

    type QueryDeviceEx = unsafe extern "C" fn(
        *mut ibv_context,
        *const ibv_query_device_ex_input,
        *mut ibv_device_attr_ex,
        usize,
    ) -> c_int;
    let query: QueryDeviceEx = vctx_op(a.ctx, 216);
    let mut attr = ibv_device_attr_ex::default();
    // SAFETY: a writable struct of the size given.
    let r = unsafe {
        query(
            a.ctx,
            std::ptr::null(),
            &mut attr,
            size_of::<ibv_device_attr_ex>(),
        )
    };
    assert_eq!(r, 0);
    assert!(attr.orig_attr.max_qp_wr > 0);
    assert_eq!(attr.phys_port_cnt_ex, 1);
    let input = ibv_query_device_ex_input { comp_mask: 1 };
    // SAFETY: as above.
    let r = unsafe { query(a.ctx, &input, &mut attr, size_of::<ibv_device_attr_ex>()) };
    assert_eq!(r, libc::EINVAL);
    // A struct too small for `ibv_device_attr` is refused.
    // SAFETY: as above (nothing is written).
    let r = unsafe { query(a.ctx, std::ptr::null(), &mut attr, 8) };
    assert_eq!(r, libc::EINVAL);
}

/// The lkey of a live MR.
pub(super) fn rkey_l(mr: *mut ibv_mr) -> u32 {
    // SAFETY: a live MR's `ibv_mr` is readable.
    unsafe { (*mr).lkey }
}

mod cq;
mod qp;
mod windows;
