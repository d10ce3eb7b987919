//! A small libibverbs-style harness: everything goes through `softnic::CONTROL` for the control
//! path and through `ibv_context.ops` for posting and polling, as a C program would.

#![allow(dead_code, unreachable_pub)]

use std::ffi::c_void;
use std::ptr::{null, null_mut};

pub use ibverbs_sys::*;
pub use softnic::{CONTROL, Counters, Fabric, FabricConfig, Faults, MISSED_EVENT_GRACE, Wc};

pub const LOCAL_WRITE: u32 = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
pub const REMOTE_WRITE: u32 = ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
pub const REMOTE_READ: u32 = ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
pub const ALL_ACCESS: u32 = LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ;
pub const SIGNALED: u32 = ibv_send_flags::IBV_SEND_SIGNALED.0;
pub const INLINE: u32 = ibv_send_flags::IBV_SEND_INLINE.0;
pub const FENCE: u32 = ibv_send_flags::IBV_SEND_FENCE.0;
pub const SOLICITED: u32 = ibv_send_flags::IBV_SEND_SOLICITED.0;

pub fn m(bits: ibv_qp_attr_mask) -> u32 {
    bits.0
}

/// One device opened, with a PD and a CQ.
pub struct Node {
    pub ctx: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub cq: *mut ibv_cq,
    pub gid: ibv_gid,
}

impl Node {
    pub fn open(fabric: &Fabric, name: &str) -> Node {
        let dev = fabric.device(name).expect("device exists");
        // SAFETY: `dev` is a device of a live fabric.
        let ctx = unsafe { (CONTROL.open_device)(dev) };
        assert!(!ctx.is_null());
        // SAFETY: `ctx` was just opened.
        let pd = unsafe { (CONTROL.alloc_pd)(ctx) };
        assert!(!pd.is_null());
        let mut gid = ibv_gid { raw: [0; 16] };
        // SAFETY: valid context and out-pointer.
        assert_eq!(unsafe { (CONTROL.query_gid)(ctx, 1, 0, &mut gid) }, 0);
        let mut n = Node {
            ctx,
            pd,
            cq: null_mut(),
            gid,
        };
        n.cq = n.new_cq(1024, null_mut());
        n
    }

    pub fn new_cq(&self, cqe: i32, channel: *mut ibv_comp_channel) -> *mut ibv_cq {
        // SAFETY: valid context; a null or valid channel.
        let cq = unsafe { (CONTROL.create_cq)(self.ctx, cqe, 0x5eed as *mut c_void, channel, 0) };
        assert!(
            !cq.is_null(),
            "create_cq failed: {}",
            std::io::Error::last_os_error()
        );
        cq
    }

    pub fn qp(&self, ty: ibv_qp_type::Type, cap: ibv_qp_cap, sig_all: bool) -> *mut ibv_qp {
        self.qp_with(ty, cap, sig_all, self.cq, self.cq, null_mut())
    }

    pub fn qp_with(
        &self,
        ty: ibv_qp_type::Type,
        cap: ibv_qp_cap,
        sig_all: bool,
        send_cq: *mut ibv_cq,
        recv_cq: *mut ibv_cq,
        srq: *mut ibv_srq,
    ) -> *mut ibv_qp {
        let mut init = ibv_qp_init_attr {
            qp_context: null_mut(),
            send_cq,
            recv_cq,
            srq,
            cap,
            qp_type: ty,
            sq_sig_all: i32::from(sig_all),
        };
        // SAFETY: valid PD and init attributes.
        let qp = unsafe { (CONTROL.create_qp)(self.pd, &mut init) };
        assert!(
            !qp.is_null(),
            "create_qp failed: {}",
            std::io::Error::last_os_error()
        );
        qp
    }

    /// Registers `buf`, which must outlive the MR.
    pub fn reg(&self, buf: &mut [u8], access: u32) -> *mut ibv_mr {
        // SAFETY: the test keeps `buf` alive and untouched by references while registered.
        let mr =
            unsafe { (CONTROL.reg_mr)(self.pd, buf.as_mut_ptr().cast(), buf.len(), access as i32) };
        assert!(
            !mr.is_null(),
            "reg_mr failed: {}",
            std::io::Error::last_os_error()
        );
        mr
    }

    pub fn srq(&self, max_wr: u32, max_sge: u32, limit: u32) -> *mut ibv_srq {
        let mut init = ibv_srq_init_attr {
            srq_context: null_mut(),
            attr: ibv_srq_attr {
                max_wr,
                max_sge,
                srq_limit: limit,
            },
        };
        // SAFETY: valid PD and init attributes.
        let srq = unsafe { (CONTROL.create_srq)(self.pd, &mut init) };
        assert!(!srq.is_null());
        srq
    }

    pub fn ah(&self, to: &Node) -> *mut ibv_ah {
        let mut a = ah_attr(to.gid);
        // SAFETY: valid PD and attributes.
        let ah = unsafe { (CONTROL.create_ah)(self.pd, &mut a) };
        assert!(!ah.is_null());
        ah
    }
}

pub fn cap(send: u32, recv: u32) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: send,
        max_recv_wr: recv,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    }
}

pub fn ah_attr(dgid: ibv_gid) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid,
            flow_label: 0,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
        },
        is_global: 1,
        port_num: 1,
        ..Default::default()
    }
}

pub fn modify(qp: *mut ibv_qp, attr: &ibv_qp_attr, mask: u32) -> i32 {
    let mut a = *attr;
    // SAFETY: any pointer is checked by softnic; `a` is a valid attribute struct.
    unsafe { (CONTROL.modify_qp)(qp, &mut a, mask as i32) }
}

pub fn query(qp: *mut ibv_qp) -> ibv_qp_attr {
    let mut a = ibv_qp_attr::default();
    let mut i = ibv_qp_init_attr {
        qp_context: null_mut(),
        send_cq: null_mut(),
        recv_cq: null_mut(),
        srq: null_mut(),
        cap: cap(0, 0),
        qp_type: 0,
        sq_sig_all: 0,
    };
    // SAFETY: valid QP and out-structs.
    assert_eq!(unsafe { (CONTROL.query_qp)(qp, &mut a, 0, &mut i) }, 0);
    a
}

pub fn state(qp: *mut ibv_qp) -> ibv_qp_state::Type {
    query(qp).qp_state
}

pub fn qpn(qp: *mut ibv_qp) -> u32 {
    // SAFETY: a live QP's `ibv_qp` is readable.
    unsafe { (*qp).qp_num }
}

pub fn init_attr(ty: ibv_qp_type::Type) -> (ibv_qp_attr, u32) {
    use ibv_qp_attr_mask as k;
    let a = ibv_qp_attr {
        qp_state: ibv_qp_state::IBV_QPS_INIT,
        pkey_index: 0,
        port_num: 1,
        qkey: 0x1111_1111,
        qp_access_flags: ALL_ACCESS,
        ..Default::default()
    };
    let mask = if ty == ibv_qp_type::IBV_QPT_UD {
        m(k::IBV_QP_STATE | k::IBV_QP_PKEY_INDEX | k::IBV_QP_PORT | k::IBV_QP_QKEY)
    } else {
        m(k::IBV_QP_STATE | k::IBV_QP_PKEY_INDEX | k::IBV_QP_PORT | k::IBV_QP_ACCESS_FLAGS)
    };
    (a, mask)
}

pub fn rtr_attr(
    ty: ibv_qp_type::Type,
    dgid: ibv_gid,
    dest_qpn: u32,
    rq_psn: u32,
) -> (ibv_qp_attr, u32) {
    use ibv_qp_attr_mask as k;
    let a = ibv_qp_attr {
        qp_state: ibv_qp_state::IBV_QPS_RTR,
        path_mtu: IBV_MTU_1024,
        dest_qp_num: dest_qpn,
        rq_psn,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
        ah_attr: ah_attr(dgid),
        ..Default::default()
    };
    let mask = match ty {
        ibv_qp_type::IBV_QPT_UD => m(k::IBV_QP_STATE),
        ibv_qp_type::IBV_QPT_UC => m(k::IBV_QP_STATE
            | k::IBV_QP_AV
            | k::IBV_QP_PATH_MTU
            | k::IBV_QP_DEST_QPN
            | k::IBV_QP_RQ_PSN),
        _ => m(k::IBV_QP_STATE
            | k::IBV_QP_AV
            | k::IBV_QP_PATH_MTU
            | k::IBV_QP_DEST_QPN
            | k::IBV_QP_RQ_PSN
            | k::IBV_QP_MAX_DEST_RD_ATOMIC
            | k::IBV_QP_MIN_RNR_TIMER),
    };
    (a, mask)
}

pub fn rts_attr(ty: ibv_qp_type::Type, sq_psn: u32) -> (ibv_qp_attr, u32) {
    use ibv_qp_attr_mask as k;
    let a = ibv_qp_attr {
        qp_state: ibv_qp_state::IBV_QPS_RTS,
        sq_psn,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 4,
        ..Default::default()
    };
    let mask = if ty == ibv_qp_type::IBV_QPT_RC {
        m(k::IBV_QP_STATE
            | k::IBV_QP_SQ_PSN
            | k::IBV_QP_TIMEOUT
            | k::IBV_QP_RETRY_CNT
            | k::IBV_QP_RNR_RETRY
            | k::IBV_QP_MAX_QP_RD_ATOMIC)
    } else {
        m(k::IBV_QP_STATE | k::IBV_QP_SQ_PSN)
    };
    (a, mask)
}

/// Brings `qp` to RTS towards `peer` (`peer_qpn` on the device with `peer_gid`).
pub fn bring_up(
    qp: *mut ibv_qp,
    ty: ibv_qp_type::Type,
    peer_gid: ibv_gid,
    peer_qpn: u32,
    tweak: impl Fn(&mut ibv_qp_attr),
) {
    let (a, mk) = init_attr(ty);
    assert_eq!(modify(qp, &a, mk), 0, "to INIT");
    let (a, mk) = rtr_attr(ty, peer_gid, peer_qpn, 100);
    assert_eq!(modify(qp, &a, mk), 0, "to RTR");
    let (mut a, mk) = rts_attr(ty, 100);
    tweak(&mut a);
    assert_eq!(modify(qp, &a, mk), 0, "to RTS");
}

/// An RC QP on `soft0` connected to one on `soft1` whose receive CQ (of 16) has a completion
/// channel: (qp a, node b, qp b, the channel, the CQ).
pub fn channel_pair(
    f: &Fabric,
) -> (
    *mut ibv_qp,
    Node,
    *mut ibv_qp,
    *mut ibv_comp_channel,
    *mut ibv_cq,
) {
    let a = Node::open(f, "soft0");
    let b = Node::open(f, "soft1");
    // SAFETY: valid context.
    let ch = unsafe { (CONTROL.create_comp_channel)(b.ctx) };
    assert!(!ch.is_null());
    let cq = b.new_cq(16, ch);
    let ty = ibv_qp_type::IBV_QPT_RC;
    let qa = a.qp(ty, cap(8, 8), true);
    let qb = b.qp_with(ty, cap(8, 8), true, b.cq, cq, null_mut());
    bring_up(qa, ty, b.gid, qpn(qb), |_| {});
    bring_up(qb, ty, a.gid, qpn(qa), |_| {});
    (qa, b, qb, ch, cq)
}

/// A UC QP on `soft0` connected to one on `soft1` that receives from an SRQ of 8 WQEs of one
/// SGE: (node a, qp a, node b, qp b, the SRQ).
pub fn srq_pair(f: &Fabric) -> (Node, *mut ibv_qp, Node, *mut ibv_qp, *mut ibv_srq) {
    let a = Node::open(f, "soft0");
    let b = Node::open(f, "soft1");
    let ty = ibv_qp_type::IBV_QPT_UC;
    let srq = b.srq(8, 1, 0);
    let qa = a.qp(ty, cap(8, 8), true);
    let qb = b.qp_with(ty, cap(8, 8), true, b.cq, b.cq, srq);
    bring_up(qa, ty, b.gid, qpn(qb), |_| {});
    bring_up(qb, ty, a.gid, qpn(qa), |_| {});
    (a, qa, b, qb, srq)
}

/// `modify_srq` of the limit alone: the event fires when fewer than `limit` are posted.
pub fn arm_srq_limit(srq: *mut ibv_srq, limit: u32) -> i32 {
    let mut attr = ibv_srq_attr {
        max_wr: 0,
        max_sge: 0,
        srq_limit: limit,
    };
    // SAFETY: an SRQ softnic checks, and valid attributes.
    unsafe { (CONTROL.modify_srq)(srq, &mut attr, IBV_SRQ_LIMIT as i32) }
}

/// Two connected QPs of type `ty` on two devices; returns (node a, qp a, node b, qp b).
pub fn pair(
    fabric: &Fabric,
    ty: ibv_qp_type::Type,
    depth: u32,
) -> (Node, *mut ibv_qp, Node, *mut ibv_qp) {
    pair_with(fabric, ty, depth, |_| {})
}

pub fn pair_with(
    fabric: &Fabric,
    ty: ibv_qp_type::Type,
    depth: u32,
    tweak: impl Fn(&mut ibv_qp_attr) + Copy,
) -> (Node, *mut ibv_qp, Node, *mut ibv_qp) {
    let a = Node::open(fabric, "soft0");
    let b = Node::open(fabric, "soft1");
    let qa = a.qp(ty, cap(depth, depth), true);
    let qb = b.qp(ty, cap(depth, depth), true);
    bring_up(qa, ty, b.gid, qpn(qb), tweak);
    bring_up(qb, ty, a.gid, qpn(qa), tweak);
    (a, qa, b, qb)
}

pub fn sge(buf: &[u8], mr: *mut ibv_mr) -> ibv_sge {
    // SAFETY: a live MR's `ibv_mr` is readable.
    let lkey = unsafe { (*mr).lkey };
    ibv_sge {
        addr: buf.as_ptr() as u64,
        length: buf.len() as u32,
        lkey,
    }
}

pub fn rkey(mr: *mut ibv_mr) -> u32 {
    // SAFETY: a live MR's `ibv_mr` is readable.
    unsafe { (*mr).rkey }
}

/// A copy of `sges` that lives for the rest of the test, so a WR built now may be posted later.
fn keep(sges: &[ibv_sge]) -> *mut ibv_sge {
    if sges.is_empty() {
        null_mut()
    } else {
        Box::leak(sges.to_vec().into_boxed_slice()).as_mut_ptr()
    }
}

/// A send WR over a copy of `sges`.
pub fn send_wr(
    wr_id: u64,
    opcode: ibv_wr_opcode::Type,
    sges: &[ibv_sge],
    flags: u32,
) -> ibv_send_wr {
    ibv_send_wr {
        wr_id,
        next: null_mut(),
        sg_list: keep(sges),
        num_sge: sges.len() as i32,
        opcode,
        send_flags: flags,
        ..Default::default()
    }
}

pub fn with_imm(mut wr: ibv_send_wr, imm_host: u32) -> ibv_send_wr {
    wr.__bindgen_anon_1.imm_data = imm_host.to_be();
    wr
}

pub fn with_rdma(mut wr: ibv_send_wr, remote_addr: u64, rkey: u32) -> ibv_send_wr {
    wr.wr.rdma = ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
    wr
}

/// A signaled RDMA WRITE of all of `src` (registered as `smr`) to `remote_addr`, under
/// `dmr`'s rkey.
pub fn write_wr(
    wr_id: u64,
    src: &[u8],
    smr: *mut ibv_mr,
    remote_addr: u64,
    dmr: *mut ibv_mr,
) -> ibv_send_wr {
    with_rdma(
        send_wr(
            wr_id,
            ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            &[sge(src, smr)],
            SIGNALED,
        ),
        remote_addr,
        rkey(dmr),
    )
}

/// A signaled RDMA WRITE_WITH_IMM of all of `src` (registered as `smr`) to `remote_addr`,
/// under `dmr`'s rkey, with immediate `imm` (host order).
pub fn write_imm_wr(
    wr_id: u64,
    src: &[u8],
    smr: *mut ibv_mr,
    remote_addr: u64,
    dmr: *mut ibv_mr,
    imm: u32,
) -> ibv_send_wr {
    let wr = send_wr(
        wr_id,
        ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
        &[sge(src, smr)],
        SIGNALED,
    );
    with_imm(with_rdma(wr, remote_addr, rkey(dmr)), imm)
}

/// A signaled RDMA READ into all of `dst` (registered as `dmr`) from `remote_addr`, under
/// `smr`'s rkey.
pub fn read_wr(
    wr_id: u64,
    dst: &[u8],
    dmr: *mut ibv_mr,
    remote_addr: u64,
    smr: *mut ibv_mr,
) -> ibv_send_wr {
    let wr = send_wr(
        wr_id,
        ibv_wr_opcode::IBV_WR_RDMA_READ,
        &[sge(dst, dmr)],
        SIGNALED,
    );
    with_rdma(wr, remote_addr, rkey(smr))
}

pub fn with_ud(mut wr: ibv_send_wr, ah: *mut ibv_ah, remote_qpn: u32, qkey: u32) -> ibv_send_wr {
    wr.wr.ud = ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
        ah,
        remote_qpn,
        remote_qkey: qkey,
    };
    wr
}

pub fn recv_wr(wr_id: u64, sges: &[ibv_sge]) -> ibv_recv_wr {
    ibv_recv_wr {
        wr_id,
        next: null_mut(),
        sg_list: keep(sges),
        num_sge: sges.len() as i32,
    }
}

pub fn ops(ctx: *mut ibv_context) -> ibv_context_ops {
    // SAFETY: a live context's `ibv_context` is readable.
    unsafe { (*ctx).ops }
}

fn qp_ctx(qp: *mut ibv_qp) -> *mut ibv_context {
    // SAFETY: a live QP's `ibv_qp` is readable.
    unsafe { (*qp).context }
}

/// Posts `wrs` linked through `next` with one call; on failure, the index of `bad_wr`.
/// A C work request: linked to the next one through `next`.
pub trait Wr: Sized {
    fn set_next(&mut self, next: *mut Self);
}

impl Wr for ibv_send_wr {
    fn set_next(&mut self, next: *mut Self) {
        self.next = next;
    }
}

impl Wr for ibv_recv_wr {
    fn set_next(&mut self, next: *mut Self) {
        self.next = next;
    }
}

/// Links `wrs` into one NULL-terminated chain, calls `post(head, &mut bad)` and turns a failure
/// into `(errno, index of the bad WR)`.
fn post_chain<W: Wr>(
    wrs: &mut [W],
    post: impl FnOnce(*mut W, &mut *mut W) -> i32,
) -> Result<(), (i32, usize)> {
    // One raw pointer for every link (a reference taken later would invalidate it).
    let base: *mut W = wrs.as_mut_ptr();
    let n = wrs.len();
    for i in 0..n {
        // Every element of `wrs` but the last links to the one after it.
        let next = if i + 1 < n {
            base.wrapping_add(i + 1)
        } else {
            null_mut()
        };
        // SAFETY: `i < n`, inside `wrs`, which this function borrows mutably.
        unsafe { (*base.add(i)).set_next(next) };
    }
    let head = if n == 0 { null_mut() } else { base };
    let mut bad = null_mut();
    match post(head, &mut bad) {
        0 => Ok(()),
        rc => Err((
            rc,
            (bad as usize - base as usize) / std::mem::size_of::<W>(),
        )),
    }
}

pub fn post_send(qp: *mut ibv_qp, wrs: &mut [ibv_send_wr]) -> Result<(), (i32, usize)> {
    // SAFETY: the chain and its SGE lists are valid for the call.
    post_chain(wrs, |head, bad| unsafe {
        ops(qp_ctx(qp)).post_send.unwrap()(qp, head, bad)
    })
}

/// Posts raw, for tests of bad pointers.
pub fn post_send_raw(ctx: *mut ibv_context, qp: *mut ibv_qp, wr: *mut ibv_send_wr) -> i32 {
    let mut bad = null_mut();
    // SAFETY: softnic checks `qp`; `wr` is valid or null.
    unsafe { ops(ctx).post_send.unwrap()(qp, wr, &mut bad) }
}

pub fn post_recv(qp: *mut ibv_qp, wrs: &mut [ibv_recv_wr]) -> Result<(), (i32, usize)> {
    // SAFETY: the chain and its SGE lists are valid for the call.
    post_chain(wrs, |head, bad| unsafe {
        ops(qp_ctx(qp)).post_recv.unwrap()(qp, head, bad)
    })
}

pub fn post_srq_recv(srq: *mut ibv_srq, wrs: &mut [ibv_recv_wr]) -> Result<(), (i32, usize)> {
    // SAFETY: a live SRQ's `ibv_srq` is readable; the chain is valid for the call.
    post_chain(wrs, |head, bad| unsafe {
        ops((*srq).context).post_srq_recv.unwrap()(srq, head, bad)
    })
}

/// One `poll_cq` call of up to `max` entries; `Err` for a negative return.
pub fn try_poll(cq: *mut ibv_cq, max: usize) -> Result<Vec<Wc>, i32> {
    let mut wc = vec![ibv_wc::default(); max];
    // SAFETY: a live CQ's `ibv_cq` is readable; `wc` has room for `max` entries.
    let n = unsafe { ops((*cq).context).poll_cq.unwrap()(cq, max as i32, wc.as_mut_ptr()) };
    if n < 0 {
        return Err(n);
    }
    Ok(wc[..n as usize].iter().map(|w| *Wc::from_ibv(w)).collect())
}

pub fn poll(cq: *mut ibv_cq, max: usize) -> Vec<Wc> {
    try_poll(cq, max).expect("poll_cq failed")
}

/// Polls until `n` completions arrived or nothing more can happen.
pub fn poll_n(cq: *mut ibv_cq, n: usize) -> Vec<Wc> {
    let mut out = Vec::new();
    let mut empty = 0;
    while out.len() < n && empty < 3 {
        let got = poll(cq, n - out.len());
        if got.is_empty() {
            empty += 1;
        } else {
            empty = 0;
        }
        out.extend(got);
    }
    out
}

pub fn req_notify(cq: *mut ibv_cq, solicited_only: bool) -> i32 {
    // SAFETY: a live CQ's `ibv_cq` is readable.
    unsafe { ops((*cq).context).req_notify_cq.unwrap()(cq, i32::from(solicited_only)) }
}

/// The next async event of `ctx` without blocking (the fd is made non-blocking).
pub fn async_event(ctx: *mut ibv_context) -> Option<ibv_async_event> {
    // SAFETY: a live context's `ibv_context` is readable; fcntl on its fd.
    unsafe {
        let fd = (*ctx).async_fd;
        let fl = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
    let mut ev = ibv_async_event {
        element: ibv_async_event__bindgen_ty_1 { port_num: 0 },
        event_type: 0,
    };
    // SAFETY: valid context and out-struct.
    let rc = unsafe { (CONTROL.get_async_event)(ctx, &mut ev) };
    if rc == 0 {
        // SAFETY: the event came from get_async_event.
        unsafe { (CONTROL.ack_async_event)(&mut ev) };
        Some(ev)
    } else {
        None
    }
}

pub fn ok(wc: &Wc) -> bool {
    wc.status == ibv_wc_status::IBV_WC_SUCCESS
}

pub fn no_ptr<T>() -> *mut T {
    null::<T>() as *mut T
}

/// `n` zero bytes aligned to 8 (atomics need it; a `Vec<u8>` need not be).
pub fn aligned(n: usize) -> Aligned {
    Aligned(vec![0u64; n.div_ceil(8)], n)
}

/// Bytes aligned to 8; derefs to `[u8]`.
pub struct Aligned(Vec<u64>, usize);

impl std::ops::Deref for Aligned {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `u64`s are plain bytes; `self.1 <= 8 * len`.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast(), self.1) }
    }
}

impl std::ops::DerefMut for Aligned {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, with unique access.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast(), self.1) }
    }
}

/// A packet filter that delivers every packet of the `twice` opcodes twice and loses the first
/// two copies of each PSN of opcode `lost` (the third passes): a response is lost, and its
/// duplicate's too, so only the requester's retry is answered.
pub fn duplicate_and_lose_twice(twice: &'static [u8], lost: u8) -> softnic::PacketFilter {
    let mut seen = std::collections::BTreeMap::<u32, u32>::new();
    Box::new(move |p: &softnic::PacketInfo| {
        if twice.contains(&p.opcode) {
            return softnic::Verdict::Duplicate;
        }
        if p.opcode != lost {
            return softnic::Verdict::Pass;
        }
        let n = seen.entry(p.psn).or_default();
        *n += 1;
        if *n <= 2 {
            softnic::Verdict::Drop
        } else {
            softnic::Verdict::Pass
        }
    })
}

/// Runs `f` on a thread and fails the test if it does not return within `secs` seconds (a hung
/// softnic call holds its fabric's lock forever; the thread is left behind).
pub fn within<T: Send + 'static>(
    secs: u64,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("{what}: no return within {secs} s"))
}

/// A pointer that may cross to the watchdog thread (softnic objects are thread-safe).
#[derive(Clone, Copy)]
pub struct P(pub usize);

/// Makes `f` break as soon as its progress thread sends a packet: a packet filter that panics
/// on that thread, then an 8 KiB SEND from `qa` (on `a`) to `qb` (on `b`) whose first packet
/// leaves at post time and whose others wait for whoever makes progress next. Returns the
/// buffers of the SEND and its receive: keep them while the fabric lives.
pub fn send_into_a_panicking_progress_thread(
    f: &Fabric,
    (a, qa): (&Node, *mut ibv_qp),
    (b, qb): (&Node, *mut ibv_qp),
) -> (Vec<u8>, Vec<u8>) {
    f.set_packet_filter(Some(Box::new(|_: &softnic::PacketInfo| {
        if std::thread::current().name() == Some("softnic-progress") {
            panic!("a filter bug");
        }
        softnic::Verdict::Pass
    })));
    let mut buf = vec![0u8; 64];
    let bmr = b.reg(&mut buf, LOCAL_WRITE);
    post_recv(qb, &mut [recv_wr(1, &[sge(&buf, bmr)])]).unwrap();
    let mut src = vec![7u8; 8192];
    let smr = a.reg(&mut src, LOCAL_WRITE);
    let w = send_wr(2, ibv_wr_opcode::IBV_WR_SEND, &[sge(&src, smr)], SIGNALED);
    let _ = post_send(qa, &mut [w]);
    (src, buf)
}

/// A CQ of 2 entries on a fresh node of `f`, overflowed by three signaled RDMA WRITEs of an
/// RC QP (the fabric run until idle): returns the node and the CQ.
pub fn overflowed_cq(f: &Fabric) -> (Node, *mut ibv_cq) {
    let a = Node::open(f, "soft0");
    let b = Node::open(f, "soft1");
    let ty = ibv_qp_type::IBV_QPT_RC;
    let small = a.new_cq(2, null_mut());
    let qa = a.qp_with(ty, cap(8, 8), true, small, small, null_mut());
    let qb = b.qp(ty, cap(8, 8), true);
    bring_up(qa, ty, b.gid, qpn(qb), |_| {});
    bring_up(qb, ty, a.gid, qpn(qa), |_| {});
    // The WRITEs' target, kept for the rest of the process (the MR outlives this call).
    let buf: &'static mut [u8] = Box::leak(vec![0u8; 8].into_boxed_slice());
    let bmr = b.reg(buf, ALL_ACCESS);
    let w = |id| {
        with_rdma(
            send_wr(id, ibv_wr_opcode::IBV_WR_RDMA_WRITE, &[], SIGNALED),
            buf.as_ptr() as u64,
            rkey(bmr),
        )
    };
    post_send(qa, &mut [w(1), w(2), w(3)]).unwrap();
    f.run_until_idle().unwrap();
    assert_eq!(state(qa), ibv_qp_state::IBV_QPS_ERR);
    (a, small)
}

/// A fabric whose time moves only when told (a poll of an empty CQ does not move it to the
/// next event).
pub fn still() -> Fabric {
    Fabric::new(FabricConfig {
        auto_advance: false,
        ..Default::default()
    })
}

/// The bytes of a packet with headers `h` and `payload`, its ICRC included (for
/// [`Fabric::inject`]).
pub fn frame(h: softnic::packet::Headers, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    h.emit(payload, &mut out).expect("consistent headers");
    out
}

/// Whether descriptor `fd` is readable within `timeout_ms` (0: now).
pub fn readable(fd: i32, timeout_ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, timeout_ms) == 1 }
}
