//! What both kinds of rsocket hold under their QP: a CQ with a completion channel (its
//! descriptor non-blocking, for waits to poll), one registered buffer of equal slots, and the
//! data-path verbs, reached through the device's ops table as rdma-core's inlines do.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ffi::c_int;
use std::ptr::null_mut;

use ibverbs_sys as v;

/// `struct ibv_wc` with its fields readable (ibverbs-sys keeps them private).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct Wc {
    pub(super) wr_id: u64,
    pub(super) status: u32,
    opcode: u32,
    vendor_err: u32,
    pub(super) byte_len: u32,
    imm_data: u32,
    qp_num: u32,
    pub(super) src_qp: u32,
    wc_flags: u32,
    pkey_index: u16,
    slid: u16,
    sl: u8,
    dlid_path_bits: u8,
}
const _: () = assert!(
    size_of::<Wc>() == size_of::<v::ibv_wc>() && align_of::<Wc>() == align_of::<v::ibv_wc>()
);

impl Wc {
    /// The immediate data of a successful receive that carried some.
    pub(super) fn imm(&self) -> Option<u32> {
        let with = self.wc_flags & v::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
        (self.status == 0 && with).then_some(self.imm_data)
    }
}

/// The CQ, its channel and the slots.
pub(super) struct Slots {
    /// The device context.
    pub(super) ctx: *mut v::ibv_context,
    /// The device's PD (the library's default one), where the slots are registered.
    pub(super) pd: *mut v::ibv_pd,
    ch: *mut v::ibv_comp_channel,
    pub(super) cq: *mut v::ibv_cq,
    mr: *mut v::ibv_mr,
    buf: *mut u8,
    size: usize,
    count: usize,
}

impl Slots {
    /// `count` slots of `size` bytes registered on the default PD of the device of `ctx` (for
    /// the peer to reach with nothing: local access only), and a CQ of `depth` there.
    pub(super) fn new(
        ctx: *mut v::ibv_context,
        size: usize,
        count: usize,
        depth: usize,
    ) -> Result<Slots, c_int> {
        let pd = crate::lib()?.default_pd(ctx);
        if pd.is_null() {
            return Err(libc::ENOMEM);
        }
        let mut s = Slots {
            ctx,
            pd,
            ch: null_mut(),
            cq: null_mut(),
            mr: null_mut(),
            buf: null_mut(),
            size,
            count,
        };
        // SAFETY: a live device context.
        s.ch = unsafe { v::ibv_create_comp_channel(ctx) };
        if s.ch.is_null() {
            return Err(libc::ENOMEM);
        }
        // SAFETY: the channel just made.
        super::nonblocking(unsafe { (*s.ch).fd });
        // SAFETY: the device context and the channel just made.
        s.cq = unsafe { v::ibv_create_cq(ctx, depth as c_int, null_mut(), s.ch, 0) };
        if s.cq.is_null() {
            return Err(libc::ENOMEM);
        }
        // SAFETY: a non-zero size.
        s.buf = unsafe { alloc_zeroed(s.layout()) };
        if s.buf.is_null() {
            return Err(libc::ENOMEM);
        }
        let access = v::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as c_int;
        // SAFETY: the device's PD and memory these slots own until they deregister it.
        s.mr = unsafe { v::ibv_reg_mr(pd, s.buf.cast(), size * count, access) };
        if s.mr.is_null() {
            return Err(crate::errno());
        }
        Ok(s)
    }

    /// Attributes of a QP of `qp_type` on these slots' CQ, with `send` and `recv` WRs of one
    /// entry each, every send signalled.
    pub(super) fn qp_attr(&self, qp_type: u32, send: usize, recv: usize) -> v::ibv_qp_init_attr {
        v::ibv_qp_init_attr {
            send_cq: self.cq,
            recv_cq: self.cq,
            cap: v::ibv_qp_cap {
                max_send_wr: send as u32,
                max_recv_wr: recv as u32,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type,
            sq_sig_all: 1,
            ..Default::default()
        }
    }

    fn layout(&self) -> Layout {
        Layout::from_size_align(self.size * self.count, 4096).expect("a valid layout")
    }

    /// Where slot `i` begins.
    pub(super) fn at(&self, i: usize) -> *mut u8 {
        assert!(i < self.count, "slot {i} of {}", self.count);
        // SAFETY: inside the buffer.
        unsafe { self.buf.add(i * self.size) }
    }

    /// `len` bytes of slot `i`, at `off`, as a scatter/gather entry.
    pub(super) fn sge(&self, i: usize, off: usize, len: usize) -> v::ibv_sge {
        assert!(
            off + len <= self.size,
            "{len} bytes at {off} of a {}-byte slot",
            self.size
        );
        v::ibv_sge {
            // SAFETY: inside slot `i`.
            addr: unsafe { self.at(i).add(off) } as u64,
            length: len as u32,
            // SAFETY: the registered MR.
            lkey: unsafe { (*self.mr).lkey },
        }
    }

    /// Posts a receive into all of slot `i`.
    pub(super) fn post_recv(&self, qp: *mut v::ibv_qp, i: usize, wr_id: u64) -> Result<(), c_int> {
        let mut sge = self.sge(i, 0, self.size);
        let mut wr = v::ibv_recv_wr {
            wr_id,
            next: null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = null_mut();
        // SAFETY: the ops table; a QP on these slots' CQ, a slot nothing reads or writes
        // until its completion, and a WR valid for the call.
        let e = unsafe {
            match (*self.ctx).ops.post_recv {
                Some(f) => f(qp, &mut wr, &mut bad),
                None => libc::EOPNOTSUPP,
            }
        };
        if e != 0 { Err(e) } else { Ok(()) }
    }

    /// Posts `wr` (one WR, whose entries are slots nothing writes until it completes).
    pub(super) fn post_send(
        &self,
        qp: *mut v::ibv_qp,
        wr: &mut v::ibv_send_wr,
    ) -> Result<(), c_int> {
        wr.next = null_mut();
        let mut bad = null_mut();
        // SAFETY: the ops table; a QP on these slots' CQ and a WR valid for the call.
        let e = unsafe {
            match (*self.ctx).ops.post_send {
                Some(f) => f(qp, wr, &mut bad),
                None => libc::EOPNOTSUPP,
            }
        };
        if e != 0 { Err(e) } else { Ok(()) }
    }

    /// Takes up to `wc.len()` completions: how many (negative: the CQ failed).
    pub(super) fn poll(&self, wc: &mut [Wc]) -> c_int {
        // SAFETY: the ops table, the CQ, and room for `wc.len()` (`Wc` is `ibv_wc`).
        unsafe {
            match (*self.ctx).ops.poll_cq {
                Some(f) => f(self.cq, wc.len() as c_int, wc.as_mut_ptr().cast()),
                None => -1,
            }
        }
    }

    /// Arms the CQ: the next completion makes [`Slots::fd`] readable.
    pub(super) fn arm(&self) {
        // SAFETY: the ops table and the CQ.
        unsafe {
            if let Some(f) = (*self.ctx).ops.req_notify_cq {
                f(self.cq, 0);
            }
        }
    }

    /// Takes (and acks) the completion events that came.
    pub(super) fn take_events(&self) {
        let (mut cq, mut cq_ctx) = (null_mut(), null_mut());
        // SAFETY: the (non-blocking) channel and out-pointers; each event taken is acked on
        // the CQ it names, this one.
        while unsafe { v::ibv_get_cq_event(self.ch, &mut cq, &mut cq_ctx) } == 0 {
            // SAFETY: as above.
            unsafe { v::ibv_ack_cq_events(cq, 1) };
        }
    }

    /// The descriptor readable once a completion event came (after [`Slots::arm`]).
    pub(super) fn fd(&self) -> c_int {
        // SAFETY: the channel lives as long as the slots.
        unsafe { (*self.ch).fd }
    }
}

impl Drop for Slots {
    /// Runs after the owner destroyed its QP (an owner's fields drop after its own `drop`).
    fn drop(&mut self) {
        // SAFETY: the objects these slots made (null when not made), no longer used by any
        // QP: the memory's registration, the memory, the CQ, its channel.
        unsafe {
            if !self.mr.is_null() {
                v::ibv_dereg_mr(self.mr);
            }
            if !self.buf.is_null() {
                dealloc(self.buf, self.layout());
            }
            if !self.cq.is_null() {
                v::ibv_destroy_cq(self.cq);
            }
            if !self.ch.is_null() {
                v::ibv_destroy_comp_channel(self.ch);
            }
        }
    }
}
