//! On-demand paging (`IBV_ACCESS_ON_DEMAND`): advertised by `ibv_query_device_ex`, honoured
//! by every access (pages are faulted in when an operation reaches them, so memory never
//! touched, or mapped after registration, is fine), implicit regions over the whole address
//! space (`NULL`, `SIZE_MAX`), and `ibv_advise_mr`'s prefetches. What cannot be faulted in (a
//! page not mapped) fails the operation as a protection error, never the process.

use std::ffi::c_void;
use std::ptr::null_mut;

use crate::common::*;
use crate::extended::vctx_op;

const ODP: u32 = ibverbs_sys::ibv_access_flags::IBV_ACCESS_ON_DEMAND.0;
const RW: u32 = LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ;

/// `n` fresh anonymous pages, never touched.
struct Pages(*mut u8, usize);

impl Pages {
    fn new(n: usize) -> Pages {
        let len = n * 4096;
        // SAFETY: a fresh private anonymous mapping, owned by the value.
        let p = unsafe {
            libc::mmap(
                null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Pages(p.cast(), len)
    }

    fn addr(&self) -> u64 {
        self.0 as u64
    }

    fn bytes(&self) -> Vec<u8> {
        // SAFETY: the mapping is live, readable, and no reference to it is held elsewhere.
        unsafe { std::slice::from_raw_parts(self.0, self.1).to_vec() }
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // SAFETY: the mapping this value made.
        unsafe { libc::munmap(self.0.cast(), self.1) };
    }
}

/// An address no mapping covers: a page mapped, then unmapped.
fn unmapped() -> u64 {
    Pages::new(1).addr()
}

/// An implicit on-demand region of `n`'s PD: the whole address space.
fn implicit(n: &Node) -> *mut ibv_mr {
    // SAFETY: a live PD; an implicit region names no memory of its own.
    let mr = unsafe { (CONTROL.reg_mr)(n.pd, null_mut(), usize::MAX, (RW | ODP) as i32) };
    assert!(!mr.is_null(), "{}", std::io::Error::last_os_error());
    mr
}

fn lkey(mr: *mut ibv_mr) -> u32 {
    // SAFETY: a live MR is readable.
    unsafe { (*mr).lkey }
}

fn at(addr: u64, len: u32, mr: *mut ibv_mr) -> ibv_sge {
    ibv_sge {
        addr,
        length: len,
        lkey: lkey(mr),
    }
}

#[test]
fn odp_is_advertised_for_every_transport_with_implicit_regions() {
    type QueryDeviceEx = unsafe extern "C" fn(
        *mut ibv_context,
        *const ibv_query_device_ex_input,
        *mut ibv_device_attr_ex,
        usize,
    ) -> i32;
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    let query: QueryDeviceEx = vctx_op(a.ctx, 216);
    let mut attr = ibv_device_attr_ex::default();
    let len = size_of::<ibv_device_attr_ex>();
    // SAFETY: a writable struct of the size given.
    assert_eq!(unsafe { query(a.ctx, std::ptr::null(), &mut attr, len) }, 0);
    let odp = attr.odp_caps;
    assert_eq!(
        odp.general_caps,
        u64::from(IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT)
    );
    let all = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV;
    let t = odp.per_transport_caps;
    assert_eq!(t.ud_odp_caps, all);
    assert_eq!(t.uc_odp_caps, all | IBV_ODP_SUPPORT_WRITE);
    assert_eq!(
        t.rc_odp_caps,
        all | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC
    );
    // Windows are not bound to on-demand regions: asking for both is refused.
    let mut buf = vec![0u8; 64];
    let both = (RW | ODP | ibverbs_sys::ibv_access_flags::IBV_ACCESS_MW_BIND.0) as i32;
    // SAFETY: a live PD and buffer.
    let mr = unsafe { (CONTROL.reg_mr)(a.pd, buf.as_mut_ptr().cast(), buf.len(), both) };
    assert!(mr.is_null());
    let errno = std::io::Error::last_os_error().raw_os_error();
    assert_eq!(errno, Some(libc::EINVAL));
}

/// Sends, receives, WRITEs and READs through implicit regions, on pages never touched before:
/// every byte arrives. Then a send from, a receive into and a WRITE to pages not mapped fail
/// as protection errors (local, or remote access at the requester), and the process lives.
#[test]
fn implicit_regions_fault_pages_in_and_refuse_unmapped_ones() {
    let f = Fabric::default();
    let ty = ibv_qp_type::IBV_QPT_RC;
    let (a, qa, b, qb) = pair_with(&f, ty, 16, |x| x.qp_access_flags = RW);
    let (ma, mb) = (implicit(&a), implicit(&b));
    let (src, dst) = (Pages::new(2), Pages::new(4));
    // SAFETY: the pages are live and ours; the NIC reads them only after the post.
    unsafe { std::ptr::write_bytes(src.0, 0x5a, 5000) };
    post_recv(qb, &mut [recv_wr(1, &[at(dst.addr(), 5000, mb)])]).unwrap();
    let send = send_wr(
        2,
        ibv_wr_opcode::IBV_WR_SEND,
        &[at(src.addr(), 5000, ma)],
        SIGNALED,
    );
    let write = with_rdma(
        send_wr(
            3,
            ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            &[at(src.addr(), 3000, ma)],
            SIGNALED,
        ),
        dst.addr() + 8192,
        lkey(mb),
    );
    post_send(qa, &mut [send, write]).unwrap();
    let sent = poll_n(a.cq, 2);
    assert!(sent.iter().all(ok), "{sent:?}");
    let got = poll_n(b.cq, 1);
    assert!(ok(&got[0]) && got[0].byte_len == 5000, "{got:?}");
    let d = dst.bytes();
    assert!(d[..5000].iter().all(|&x| x == 0x5a));
    assert!(d[8192..8192 + 3000].iter().all(|&x| x == 0x5a));
    assert!(d[5000..8192].iter().all(|&x| x == 0));
    // A READ back into untouched pages of the requester.
    let back = Pages::new(1);
    let read = with_rdma(
        send_wr(
            4,
            ibv_wr_opcode::IBV_WR_RDMA_READ,
            &[at(back.addr(), 3000, ma)],
            SIGNALED,
        ),
        dst.addr() + 8192,
        lkey(mb),
    );
    post_send(qa, &mut [read]).unwrap();
    assert!(ok(&poll_n(a.cq, 1)[0]));
    assert!(back.bytes()[..3000].iter().all(|&x| x == 0x5a));

    // A send from a page that is not mapped: a local protection error.
    let gone = unmapped();
    let bad = send_wr(
        5,
        ibv_wr_opcode::IBV_WR_SEND,
        &[at(gone, 100, ma)],
        SIGNALED,
    );
    post_send(qa, &mut [bad]).unwrap();
    let c = poll_n(a.cq, 1)[0];
    assert_eq!(c.status, ibv_wc_status::IBV_WC_LOC_PROT_ERR, "{c:?}");
}

#[test]
fn a_write_to_an_unmapped_page_of_an_on_demand_region_is_a_remote_access_error() {
    let f = Fabric::default();
    let ty = ibv_qp_type::IBV_QPT_RC;
    let (a, qa, b, _qb) = pair_with(&f, ty, 16, |x| x.qp_access_flags = RW);
    let (ma, mb) = (implicit(&a), implicit(&b));
    let src = Pages::new(1);
    let write = with_rdma(
        send_wr(
            1,
            ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            &[at(src.addr(), 64, ma)],
            SIGNALED,
        ),
        unmapped(),
        lkey(mb),
    );
    post_send(qa, &mut [write]).unwrap();
    let c = poll_n(a.cq, 1)[0];
    assert_eq!(c.status, ibv_wc_status::IBV_WC_REM_ACCESS_ERR, "{c:?}");
}

/// `ibv_advise_mr`: the three prefetches of a region's range succeed (the pages are there
/// after a write prefetch); a range out of the region, a key of nobody or pages not mapped
/// are EFAULT; unknown flags or no SGEs EINVAL; another advice EOPNOTSUPP.
#[test]
fn advise_mr_prefetches_what_a_region_holds() {
    type AdviseMr = unsafe extern "C" fn(*mut ibv_pd, u32, u32, *mut ibv_sge, u32) -> i32;
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    let advise: AdviseMr = vctx_op(a.ctx, 8);
    let pages = Pages::new(4);
    // SAFETY: a live PD; the pages outlive the region.
    let mr =
        unsafe { (CONTROL.reg_mr)(a.pd, pages.0.cast::<c_void>(), pages.1, (RW | ODP) as i32) };
    assert!(!mr.is_null());
    let call = |advice: u32, flags: u32, mut sges: Vec<ibv_sge>| {
        // SAFETY: a live PD and `sges.len()` SGEs.
        unsafe { advise(a.pd, advice, flags, sges.as_mut_ptr(), sges.len() as u32) }
    };
    let whole = at(pages.addr(), pages.1 as u32, mr);
    for advice in 0..3 {
        assert_eq!(call(advice, 1, vec![whole]), 0, "advice {advice}");
    }
    let mut resident = [0u8; 4];
    // SAFETY: `pages` is a live mapping of 4 pages; `resident` has a byte per page.
    let r = unsafe { libc::mincore(pages.0.cast(), pages.1, resident.as_mut_ptr()) };
    assert_eq!(r, 0);
    assert!(resident.iter().all(|&r| r & 1 == 1), "{resident:?}");
    let beyond = at(pages.addr() + 4096, pages.1 as u32, mr);
    let stranger = ibv_sge {
        lkey: lkey(mr) ^ 0x55,
        ..whole
    };
    assert_eq!(call(0, 0, vec![beyond]), libc::EFAULT);
    assert_eq!(call(0, 0, vec![whole, stranger]), libc::EFAULT);
    let ma = implicit(&a);
    assert_eq!(call(0, 0, vec![at(unmapped(), 64, ma)]), libc::EFAULT);
    assert_eq!(
        call(2, 0, vec![at(unmapped(), 64, ma)]),
        0,
        "no fault asked"
    );
    assert_eq!(call(0, 2, vec![whole]), libc::EINVAL);
    assert_eq!(call(0, 0, vec![]), libc::EINVAL);
    assert_eq!(call(3, 0, vec![whole]), libc::EOPNOTSUPP);
}

/// A QP's access flags may carry the MR-side ones (`IBV_ACCESS_ON_DEMAND`, zero-based, huge
/// pages, relaxed ordering, the optional range), which the kernel passes on and ConnectX
/// ignores: rdma-core's ODP tests give their QPs their regions' flags (softnic refused them
/// with EINVAL). A bit no flag has is still refused.
#[test]
fn a_qp_takes_the_regions_access_flags() {
    use ibverbs_sys::ibv_access_flags as af;
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    let ty = ibv_qp_type::IBV_QPT_RC;
    let (mut attr, mask) = init_attr(ty);
    let regions = ODP
        | af::IBV_ACCESS_ZERO_BASED.0
        | af::IBV_ACCESS_HUGETLB.0
        | af::IBV_ACCESS_RELAXED_ORDERING.0
        // rdma-core's IBV_ACCESS_OPTIONAL_RANGE (not in ibverbs-sys).
        | 0x3ff0_0000;
    attr.qp_access_flags = RW | af::IBV_ACCESS_REMOTE_ATOMIC.0 | regions;
    let qp = a.qp(ty, cap(4, 4), true);
    assert_eq!(modify(qp, &attr, mask), 0);
    assert_eq!(state(qp), ibv_qp_state::IBV_QPS_INIT);
    let other = a.qp(ty, cap(4, 4), true);
    attr.qp_access_flags = RW | 1 << 31;
    assert_eq!(modify(other, &attr, mask), libc::EINVAL);
}
