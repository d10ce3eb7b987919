//! XRC: domains, XRC SRQs, initiator and target QPs, through the `verbs_context` ops the
//! inline helpers of `<infiniband/verbs.h>` call (`ibv_open_xrcd`, `ibv_create_srq_ex`,
//! `ibv_get_srq_num`, `ibv_create_qp_ex`, `ibv_close_xrcd`).

use std::ffi::c_int;
use std::os::fd::AsRawFd;
use std::ptr::null_mut;

use crate::common::*;
use crate::extended::vctx_op;

type OpenXrcd = unsafe extern "C" fn(*mut ibv_context, *mut ibv_xrcd_init_attr) -> *mut ibv_xrcd;
type CloseXrcd = unsafe extern "C" fn(*mut ibv_xrcd) -> c_int;
type CreateSrqEx =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_srq_init_attr_ex) -> *mut ibv_srq;
type GetSrqNum = unsafe extern "C" fn(*mut ibv_srq, *mut u32) -> c_int;
type CreateQpEx = unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp;

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `ibv_open_xrcd` with `fd` and `oflags` (both fields given).
fn open_xrcd(n: &Node, fd: i32, oflags: i32) -> Result<*mut ibv_xrcd, i32> {
    let mut a = ibv_xrcd_init_attr {
        comp_mask: IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
        fd,
        oflags,
    };
    let op: OpenXrcd = vctx_op(n.ctx, 288);
    // SAFETY: a live context and a valid attribute struct.
    let x = unsafe { op(n.ctx, &mut a) };
    if x.is_null() { Err(errno()) } else { Ok(x) }
}

fn close_xrcd(n: &Node, x: *mut ibv_xrcd) -> i32 {
    let op: CloseXrcd = vctx_op(n.ctx, 296);
    // SAFETY: softnic checks the pointer.
    unsafe { op(x) }
}

/// An XRC SRQ of `xrcd` (in `pd`), completing into `cq`.
pub(crate) fn xrc_srq(
    n: &Node,
    pd: *mut ibv_pd,
    xrcd: *mut ibv_xrcd,
    cq: *mut ibv_cq,
) -> Result<*mut ibv_srq, i32> {
    let mut a = ibv_srq_init_attr_ex {
        srq_context: null_mut(),
        attr: ibv_srq_attr {
            max_wr: 16,
            max_sge: 1,
            srq_limit: 0,
        },
        comp_mask: IBV_SRQ_INIT_ATTR_TYPE
            | IBV_SRQ_INIT_ATTR_PD
            | IBV_SRQ_INIT_ATTR_XRCD
            | IBV_SRQ_INIT_ATTR_CQ,
        srq_type: IBV_SRQT_XRC,
        pd,
        xrcd,
        cq,
        tm_cap: Default::default(),
    };
    let op: CreateSrqEx = vctx_op(n.ctx, 280);
    // SAFETY: a live context and a valid attribute struct.
    let s = unsafe { op(n.ctx, &mut a) };
    if s.is_null() { Err(errno()) } else { Ok(s) }
}

pub(crate) fn srq_num(n: &Node, srq: *mut ibv_srq) -> u32 {
    let op: GetSrqNum = vctx_op(n.ctx, 272);
    let mut num = 0;
    // SAFETY: softnic checks the SRQ; `num` is writable.
    assert_eq!(unsafe { op(srq, &mut num) }, 0);
    num
}

/// An XRC target QP of `xrcd`.
fn target_qp(n: &Node, xrcd: *mut ibv_xrcd) -> Result<*mut ibv_qp, i32> {
    let mut a = ibv_qp_init_attr_ex {
        qp_type: ibv_qp_type::IBV_QPT_XRC_RECV,
        comp_mask: IBV_QP_INIT_ATTR_XRCD,
        xrcd,
        ..Default::default()
    };
    let op: CreateQpEx = vctx_op(n.ctx, 264);
    // SAFETY: a live context and a valid attribute struct.
    let q = unsafe { op(n.ctx, &mut a) };
    if q.is_null() { Err(errno()) } else { Ok(q) }
}

/// Brings an XRC QP up towards `peer_qpn` on `peer_gid`, with the masks of its type (those of
/// `ibv_xsrq_pingpong`: the kernel's table).
fn xrc_up(qp: *mut ibv_qp, initiator: bool, peer_gid: ibv_gid, peer_qpn: u32) {
    use ibv_qp_attr_mask as k;
    let (a, mk) = init_attr(ibv_qp_type::IBV_QPT_RC);
    assert_eq!(modify(qp, &a, mk), 0, "to INIT");
    let (a, mut mk) = rtr_attr(ibv_qp_type::IBV_QPT_RC, peer_gid, peer_qpn, 100);
    if initiator {
        mk &= !m(k::IBV_QP_MAX_DEST_RD_ATOMIC | k::IBV_QP_MIN_RNR_TIMER);
    }
    assert_eq!(modify(qp, &a, mk), 0, "to RTR");
    let (a, mut mk) = rts_attr(ibv_qp_type::IBV_QPT_RC, 100);
    if !initiator {
        mk &= !m(k::IBV_QP_RETRY_CNT | k::IBV_QP_RNR_RETRY | k::IBV_QP_MAX_QP_RD_ATOMIC);
    }
    assert_eq!(modify(qp, &a, mk), 0, "to RTS");
}

/// An initiator on `soft0` connected to a target on `soft1` in a domain of its own.
pub(crate) struct Xrc {
    pub(crate) a: Node,
    pub(crate) b: Node,
    pub(crate) ini: *mut ibv_qp,
    pub(crate) tgt: *mut ibv_qp,
    pub(crate) xrcd: *mut ibv_xrcd,
}

pub(crate) fn xrc_pair(f: &Fabric) -> Xrc {
    let a = Node::open(f, "soft0");
    let b = Node::open(f, "soft1");
    let ini = a.qp_with(
        ibv_qp_type::IBV_QPT_XRC_SEND,
        cap(64, 0),
        true,
        a.cq,
        null_mut(),
        null_mut(),
    );
    let xrcd = open_xrcd(&b, -1, 0).unwrap();
    let tgt = target_qp(&b, xrcd).unwrap();
    xrc_up(ini, true, b.gid, qpn(tgt));
    xrc_up(tgt, false, a.gid, qpn(ini));
    Xrc {
        a,
        b,
        ini,
        tgt,
        xrcd,
    }
}

/// A signaled WR of `opcode` over `buf` (registered as `mr`) for the SRQ numbered `srqn`.
fn to_srq(
    wr_id: u64,
    opcode: ibv_wr_opcode::Type,
    buf: &[u8],
    mr: *mut ibv_mr,
    srqn: u32,
) -> ibv_send_wr {
    let mut wr = send_wr(wr_id, opcode, &[sge(buf, mr)], SIGNALED);
    wr.qp_type.xrc.remote_srqn = srqn;
    wr
}

#[test]
fn one_connection_delivers_into_whichever_srq_of_the_domain_each_message_names() {
    let f = Fabric::default();
    let x = xrc_pair(&f);
    let (a, b) = (&x.a, &x.b);
    let (cq1, cq2) = (b.new_cq(16, null_mut()), b.new_cq(16, null_mut()));
    let s1 = xrc_srq(b, b.pd, x.xrcd, cq1).unwrap();
    let s2 = xrc_srq(b, b.pd, x.xrcd, cq2).unwrap();
    let (n1, n2) = (srq_num(b, s1), srq_num(b, s2));
    assert_ne!(n1, n2);
    let mut dst = vec![0u8; 2 * 8192];
    let dmr = b.reg(&mut dst, LOCAL_WRITE);
    let (d1, d2) = dst.split_at(8192);
    post_srq_recv(s1, &mut [recv_wr(11, &[sge(d1, dmr)])]).unwrap();
    post_srq_recv(s2, &mut [recv_wr(22, &[sge(d2, dmr)])]).unwrap();

    // Five packets (1024-byte MTU) for the second SRQ, one with immediate data for the first.
    let mut src: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    let smr = a.reg(&mut src, LOCAL_WRITE);
    let big = to_srq(1, ibv_wr_opcode::IBV_WR_SEND, &src, smr, n2);
    let small = with_imm(
        to_srq(2, ibv_wr_opcode::IBV_WR_SEND_WITH_IMM, &src[..10], smr, n1),
        0xfeed,
    );
    post_send(x.ini, &mut [big, small]).unwrap();
    let sent = poll_n(a.cq, 2);
    assert!(sent.iter().all(ok), "{sent:?}");
    assert_eq!(sent[0].qp_num, qpn(x.ini));

    let got2 = poll_n(cq2, 1);
    assert_eq!((got2[0].wr_id, got2[0].byte_len), (22, 5000));
    let got1 = poll_n(cq1, 1);
    assert_eq!((got1[0].wr_id, got1[0].byte_len), (11, 10));
    assert_eq!(u32::from_be(got1[0].imm_data), 0xfeed);
    for wc in [&got1[0], &got2[0]] {
        assert!(ok(wc), "{wc:?}");
        // The target QP took the message in.
        assert_eq!(wc.qp_num, qpn(x.tgt));
        assert_eq!(wc.opcode, ibv_wc_opcode::IBV_WC_RECV);
    }
    assert_eq!(
        poll(b.cq, 4).len(),
        0,
        "nothing completes in the node's own CQ"
    );
    f.run_until_idle().unwrap();
    let dst = dst.clone();
    assert_eq!(&dst[..10], &src[..10]);
    assert_eq!(&dst[8192..8192 + 5000], &src[..]);
}

#[test]
fn remote_access_through_a_target_is_checked_against_the_pd_of_the_srq_named() {
    let f = Fabric::default();
    let x = xrc_pair(&f);
    let (a, b) = (&x.a, &x.b);
    // SAFETY: a live context.
    let other_pd = unsafe { (CONTROL.alloc_pd)(b.ctx) };
    let cq = b.new_cq(16, null_mut());
    let mine = xrc_srq(b, b.pd, x.xrcd, cq).unwrap();
    let other = xrc_srq(b, other_pd, x.xrcd, cq).unwrap();
    let mut remote = vec![0u8; 4096];
    let rmr = b.reg(&mut remote, ALL_ACCESS);
    let at = remote.as_ptr() as u64;
    let mut src = vec![7u8; 3000];
    let mut back = vec![0u8; 3000];
    let smr = a.reg(&mut src, LOCAL_WRITE);
    let bmr = a.reg(&mut back, LOCAL_WRITE);

    let mut w = with_rdma(
        to_srq(
            1,
            ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            &src,
            smr,
            srq_num(b, mine),
        ),
        at,
        rkey(rmr),
    );
    let mut r = with_rdma(
        to_srq(
            2,
            ibv_wr_opcode::IBV_WR_RDMA_READ,
            &back,
            bmr,
            srq_num(b, mine),
        ),
        at,
        rkey(rmr),
    );
    post_send(x.ini, std::slice::from_mut(&mut w)).unwrap();
    post_send(x.ini, std::slice::from_mut(&mut r)).unwrap();
    let done = poll_n(a.cq, 2);
    assert!(done.iter().all(ok), "{done:?}");
    f.run_until_idle().unwrap();
    assert_eq!(back, src, "the READ read what the WRITE wrote");

    // The same key, for an SRQ of another PD: refused, and the connection fails.
    let mut w = with_rdma(
        to_srq(
            3,
            ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            &src,
            smr,
            srq_num(b, other),
        ),
        at + 1000,
        rkey(rmr),
    );
    src.fill(9);
    post_send(x.ini, std::slice::from_mut(&mut w)).unwrap();
    let failed = poll_n(a.cq, 1);
    assert_eq!(failed[0].status, ibv_wc_status::IBV_WC_REM_ACCESS_ERR);
    assert_eq!(state(x.tgt), ibv_qp_state::IBV_QPS_ERR);
    f.run_until_idle().unwrap();
    assert!(remote[..3000].iter().all(|&b| b == 7), "the first WRITE's");
    assert!(
        remote[3000..].iter().all(|&b| b == 0),
        "nothing of the refused one"
    );
}

#[test]
fn a_target_refuses_srqs_outside_its_domain_and_srqs_that_are_gone() {
    for case in [
        "another domain",
        "a basic SRQ",
        "destroyed",
        "no such number",
    ] {
        let f = Fabric::default();
        let x = xrc_pair(&f);
        let (a, b) = (&x.a, &x.b);
        let cq = b.new_cq(16, null_mut());
        let elsewhere = open_xrcd(b, -1, 0).unwrap();
        let mut dst = vec![0u8; 64];
        let dmr = b.reg(&mut dst, LOCAL_WRITE);
        let srq = match case {
            "another domain" => xrc_srq(b, b.pd, elsewhere, cq).unwrap(),
            "a basic SRQ" => b.srq(4, 1, 0),
            _ => xrc_srq(b, b.pd, x.xrcd, cq).unwrap(),
        };
        post_srq_recv(srq, &mut [recv_wr(5, &[sge(&dst, dmr)])]).unwrap();
        let mut num = srq_num(b, srq);
        if case == "destroyed" {
            // SAFETY: a live SRQ that no QP holds.
            assert_eq!(unsafe { (CONTROL.destroy_srq)(srq) }, 0);
        }
        if case == "no such number" {
            num = 0xfe_dcba;
        }
        let mut src = *b"not for you";
        let smr = a.reg(&mut src, LOCAL_WRITE);
        let mut wr = to_srq(1, ibv_wr_opcode::IBV_WR_SEND, &src, smr, num);
        post_send(x.ini, std::slice::from_mut(&mut wr)).unwrap();
        let got = poll_n(a.cq, 1);
        assert_eq!(
            got[0].status,
            ibv_wc_status::IBV_WC_REM_INV_REQ_ERR,
            "{case}"
        );
        assert_eq!(state(x.tgt), ibv_qp_state::IBV_QPS_ERR, "{case}");
        assert_eq!(poll(cq, 4).len(), 0, "{case}");
        assert_eq!(poll(b.cq, 4).len(), 0, "{case}");
        assert!(dst.iter().all(|&b| b == 0), "{case}");
        // The target failed, and, as a QP that takes its receives from SRQs, says it has
        // taken its last.
        let events: Vec<u32> = std::iter::from_fn(|| async_event(b.ctx))
            .map(|e| e.event_type)
            .collect();
        assert_eq!(
            events,
            [IBV_EVENT_QP_FATAL, IBV_EVENT_QP_LAST_WQE_REACHED],
            "{case}"
        );
    }
}

/// The headers of an XRC request of RC opcode `op` with PSN `psn` to target `tgt`, for the SRQ
/// numbered `srqn` (a frame injected as the initiator's).
fn xrc_request(tgt: *mut ibv_qp, op: u8, psn: u32, srqn: u32) -> softnic::packet::Headers {
    softnic::packet::Headers {
        opcode: softnic::packet::opcode::XRC | op,
        pkey: 0xffff,
        dest_qp: qpn(tgt),
        ack_req: true,
        psn,
        xrceth: Some(srqn),
        ..Default::default()
    }
}

/// A packet out of sequence names no SRQ the target checks: a duplicate is answered (an ACK;
/// a READ's responses read under the PD it was checked against when it ran), one ahead is
/// NAKed for its sequence, whatever SRQ they name.
#[test]
fn a_target_answers_duplicates_whatever_srq_they_name() {
    use softnic::packet::opcode;
    let f = Fabric::default();
    let x = xrc_pair(&f);
    let (a, b) = (&x.a, &x.b);
    let cq = b.new_cq(16, null_mut());
    let srq = xrc_srq(b, b.pd, x.xrcd, cq).unwrap();
    let mut dst = vec![0u8; 64];
    let dmr = b.reg(&mut dst, LOCAL_WRITE);
    post_srq_recv(srq, &mut [recv_wr(5, &[sge(&dst, dmr)])]).unwrap();
    let mut src = *b"first";
    let smr = a.reg(&mut src, LOCAL_WRITE);
    let mut wr = to_srq(1, ibv_wr_opcode::IBV_WR_SEND, &src, smr, srq_num(b, srq));
    post_send(x.ini, std::slice::from_mut(&mut wr)).unwrap();
    assert!(ok(&poll_n(a.cq, 1)[0]));
    assert!(ok(&poll_n(cq, 1)[0]));
    // SAFETY: reading raw GID bytes.
    let sgid = unsafe { a.gid.raw };
    // The SEND again (PSN 100), and one ahead (PSN 200), for SRQs that do not exist.
    for psn in [100, 200] {
        let h = xrc_request(x.tgt, opcode::RC_SEND_ONLY, psn, 0xde_adbe);
        f.inject("soft1", sgid, &frame(h, b"again")).unwrap();
        f.run_until_idle().unwrap();
        assert_eq!(state(x.tgt), ibv_qp_state::IBV_QPS_RTS, "PSN {psn}");
    }
    assert_eq!(poll(cq, 4).len(), 0, "nothing delivered twice");
    let c = f.qp_counters(x.tgt).unwrap();
    assert_eq!(c.duplicates_received, 1);
    assert_eq!(c.seq_naks_sent, 1);
}

/// A READ's responses are read under the PD it was checked against: its SRQ destroyed while
/// they go out (the target unbound), the READ completes.
#[test]
fn a_read_completes_when_the_srq_it_named_goes_while_it_is_answered() {
    let f = Fabric::default();
    let x = xrc_pair(&f);
    let (a, b) = (&x.a, &x.b);
    let cq = b.new_cq(16, null_mut());
    let srq = xrc_srq(b, b.pd, x.xrcd, cq).unwrap();
    let mut remote: Vec<u8> = (0..256 * 1024).map(|i| (i % 253) as u8).collect();
    let rmr = b.reg(&mut remote, ALL_ACCESS);
    let mut back = vec![0u8; remote.len()];
    let bmr = a.reg(&mut back, LOCAL_WRITE);
    let at = remote.as_ptr() as u64;
    let mut r = with_rdma(
        to_srq(
            1,
            ibv_wr_opcode::IBV_WR_RDMA_READ,
            &back,
            bmr,
            srq_num(b, srq),
        ),
        at,
        rkey(rmr),
    );
    post_send(x.ini, std::slice::from_mut(&mut r)).unwrap();
    // Until the target has started answering (256 responses of 1 KiB).
    let started = |f: &Fabric| f.qp_counters(x.tgt).unwrap().packets_sent > 0;
    for _ in 0..1000 {
        if started(&f) {
            break;
        }
        f.advance(std::time::Duration::from_nanos(500));
    }
    assert!(started(&f));
    assert!(
        f.qp_counters(x.tgt).unwrap().packets_sent < 256,
        "still answering"
    );
    // SAFETY: a live SRQ.
    assert_eq!(unsafe { (CONTROL.destroy_srq)(srq) }, 0);
    let done = poll_n(a.cq, 1);
    assert!(ok(&done[0]), "{done:?}");
    f.run_until_idle().unwrap();
    assert!(back == remote);
    assert_eq!(state(x.tgt), ibv_qp_state::IBV_QPS_RTS);
}

#[test]
fn an_srq_destroyed_under_a_target_frees_its_pd_and_cq() {
    let f = Fabric::default();
    let x = xrc_pair(&f);
    let (a, b) = (&x.a, &x.b);
    // SAFETY: a live context.
    let pd = unsafe { (CONTROL.alloc_pd)(b.ctx) };
    let cq = b.new_cq(16, null_mut());
    let srq = xrc_srq(b, pd, x.xrcd, cq).unwrap();
    let mut dst = vec![0u8; 64];
    // SAFETY: `dst` outlives the MR (deregistered below).
    let dmr = unsafe { (CONTROL.reg_mr)(pd, dst.as_mut_ptr().cast(), 64, LOCAL_WRITE as i32) };
    post_srq_recv(srq, &mut [recv_wr(5, &[sge(&dst, dmr)])]).unwrap();
    let mut src = *b"hello";
    let smr = a.reg(&mut src, LOCAL_WRITE);
    let mut wr = to_srq(1, ibv_wr_opcode::IBV_WR_SEND, &src, smr, srq_num(b, srq));
    post_send(x.ini, std::slice::from_mut(&mut wr)).unwrap();
    assert!(ok(&poll_n(a.cq, 1)[0]));
    assert!(ok(&poll_n(cq, 1)[0]));
    // The CQ serves the SRQ: it stays while the SRQ does.
    // SAFETY: softnic checks the pointers.
    unsafe {
        assert_eq!((CONTROL.destroy_cq)(cq), libc::EBUSY);
        assert_eq!((CONTROL.destroy_srq)(srq), 0);
        assert_eq!((CONTROL.dereg_mr)(dmr), 0);
        // The target bound them for its last message; they are free all the same.
        assert_eq!((CONTROL.destroy_cq)(cq), 0);
        assert_eq!((CONTROL.dealloc_pd)(pd), 0);
    }
    assert_eq!(state(x.tgt), ibv_qp_state::IBV_QPS_RTS);
}

#[test]
fn domains_are_shared_by_file_and_live_until_their_last_close() {
    let f = Fabric::default();
    let b = Node::open(&f, "soft1");
    let file = tempfile_for_test();
    let fd = file.as_raw_fd();
    assert_eq!(
        open_xrcd(&b, fd, 0).err(),
        Some(libc::EAGAIN),
        "no domain yet"
    );
    let x1 = open_xrcd(&b, fd, libc::O_CREAT).unwrap();
    let x2 = open_xrcd(&b, fd, libc::O_CREAT).unwrap();
    assert_ne!(x1, x2, "each open is its own");
    assert_eq!(
        open_xrcd(&b, fd, libc::O_CREAT | libc::O_EXCL).err(),
        Some(libc::EINVAL)
    );
    assert_eq!(
        open_xrcd(&b, 1 << 20, libc::O_CREAT).err(),
        Some(libc::EBADF)
    );
    let mut bad = ibv_xrcd_init_attr {
        comp_mask: IBV_XRCD_INIT_ATTR_FD,
        fd: -1,
        oflags: 0,
    };
    let op: OpenXrcd = vctx_op(b.ctx, 288);
    // SAFETY: a live context and a valid attribute struct.
    assert!(unsafe { op(b.ctx, &mut bad) }.is_null());
    assert_eq!(errno(), libc::EINVAL);

    // A target QP made through one open reaches an SRQ made through the other.
    let a = Node::open(&f, "soft0");
    let ini = a.qp_with(
        ibv_qp_type::IBV_QPT_XRC_SEND,
        cap(4, 0),
        true,
        a.cq,
        null_mut(),
        null_mut(),
    );
    let tgt = target_qp(&b, x1).unwrap();
    xrc_up(ini, true, b.gid, qpn(tgt));
    xrc_up(tgt, false, a.gid, qpn(ini));
    let srq = xrc_srq(&b, b.pd, x2, b.cq).unwrap();
    let mut dst = vec![0u8; 16];
    let dmr = b.reg(&mut dst, LOCAL_WRITE);
    post_srq_recv(srq, &mut [recv_wr(9, &[sge(&dst, dmr)])]).unwrap();
    let mut src = *b"shared";
    let smr = a.reg(&mut src, LOCAL_WRITE);
    let mut wr = to_srq(1, ibv_wr_opcode::IBV_WR_SEND, &src, smr, srq_num(&b, srq));
    post_send(ini, std::slice::from_mut(&mut wr)).unwrap();
    assert!(ok(&poll_n(a.cq, 1)[0]));
    let got = poll_n(b.cq, 1);
    assert_eq!(
        (got[0].wr_id, got[0].byte_len, got[0].qp_num),
        (9, 6, qpn(tgt))
    );

    // A domain of its own (-1) is not the file's.
    let own = open_xrcd(&b, -1, 0).unwrap();
    let s_own = xrc_srq(&b, b.pd, own, b.cq).unwrap();
    let mut wr = to_srq(2, ibv_wr_opcode::IBV_WR_SEND, &src, smr, srq_num(&b, s_own));
    post_send(ini, std::slice::from_mut(&mut wr)).unwrap();
    assert_eq!(
        poll_n(a.cq, 1)[0].status,
        ibv_wc_status::IBV_WC_REM_INV_REQ_ERR
    );

    // Closing: an open waits for what was made through it (as the kernel's count per open),
    // whatever the other opens of its domain.
    assert_eq!(
        close_xrcd(&b, x1),
        libc::EBUSY,
        "the target QP was made through it"
    );
    assert_eq!(
        close_xrcd(&b, x2),
        libc::EBUSY,
        "the SRQ was made through it"
    );
    // SAFETY: softnic checks the pointers.
    unsafe { assert_eq!((CONTROL.destroy_srq)(srq), 0) };
    assert_eq!(close_xrcd(&b, x2), 0);
    assert_eq!(close_xrcd(&b, x2), libc::EINVAL, "closed already");
    // The domain lives on in its other open: another open of the file still reaches it.
    let x3 = open_xrcd(&b, fd, 0).unwrap();
    // SAFETY: softnic checks the pointers.
    unsafe {
        assert_eq!((CONTROL.destroy_qp)(tgt), 0);
        assert_eq!((CONTROL.destroy_srq)(s_own), 0);
    }
    assert_eq!(close_xrcd(&b, x1), 0);
    assert_eq!(close_xrcd(&b, x3), 0);
    assert_eq!(close_xrcd(&b, own), 0);
    // The file's domain is gone with its last open: it must be created again (flags other
    // than O_CREAT and O_EXCL are ignored, as by the kernel).
    assert_eq!(open_xrcd(&b, fd, 0).err(), Some(libc::EAGAIN));
    let again = open_xrcd(&b, fd, libc::O_CREAT | libc::O_RDWR).unwrap();
    assert_eq!(close_xrcd(&b, again), 0);
}

/// An open file for `open_xrcd` to name.
fn tempfile_for_test() -> std::fs::File {
    let path = std::env::temp_dir().join(format!("softnic-xrcd-{}", std::process::id()));
    let file = std::fs::File::create(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    file
}

#[test]
fn xrc_qps_take_the_attributes_of_their_type_and_refuse_what_they_do_not_do() {
    use ibv_qp_attr_mask as k;
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    let xrcd = open_xrcd(&a, -1, 0).unwrap();
    let ini = a.qp_with(
        ibv_qp_type::IBV_QPT_XRC_SEND,
        cap(4, 4),
        false,
        a.cq,
        null_mut(),
        null_mut(),
    );
    let tgt = target_qp(&a, xrcd).unwrap();
    // SAFETY: live QPs are readable.
    unsafe {
        assert_eq!((*ini).qp_type, ibv_qp_type::IBV_QPT_XRC_SEND);
        assert!((*ini).recv_cq.is_null(), "an initiator receives nothing");
        assert_eq!((*tgt).qp_type, ibv_qp_type::IBV_QPT_XRC_RECV);
        assert!((*tgt).pd.is_null() && (*tgt).send_cq.is_null());
    }
    let q = query(ini);
    assert_eq!(q.cap.max_recv_wr, 0);
    for qp in [ini, tgt] {
        let (a_, mk) = init_attr(ibv_qp_type::IBV_QPT_RC);
        assert_eq!(modify(qp, &a_, mk), 0);
        assert_eq!(
            post_recv(qp, &mut [recv_wr(1, &[])]),
            Err((libc::EINVAL, 0)),
            "no receive queue"
        );
    }
    // RTR: the responder's attributes are the target's; an initiator needs none, and those
    // given are ignored (the kernel's `modify_qp_mask`: perftest gives RC's to both).
    let (rtr, full) = rtr_attr(ibv_qp_type::IBV_QPT_RC, a.gid, 0x99, 1);
    let responder = m(k::IBV_QP_MAX_DEST_RD_ATOMIC | k::IBV_QP_MIN_RNR_TIMER);
    assert_eq!(modify(tgt, &rtr, full & !responder), libc::EINVAL);
    assert_eq!(modify(ini, &rtr, full & !responder), 0);
    assert_eq!(modify(tgt, &rtr, full), 0);
    assert_eq!(query(tgt).max_dest_rd_atomic, 4);
    // RTS: the requester's attributes are the initiator's; a target's are ignored.
    let (rts, full) = rts_attr(ibv_qp_type::IBV_QPT_RC, 1);
    let requester = m(k::IBV_QP_RETRY_CNT | k::IBV_QP_RNR_RETRY | k::IBV_QP_MAX_QP_RD_ATOMIC);
    assert_eq!(modify(ini, &rts, full & !requester), libc::EINVAL);
    assert_eq!(modify(tgt, &rts, full), 0);
    assert_eq!(modify(ini, &rts, full), 0);
    assert_eq!(query(ini).max_rd_atomic, 4);
    let ini2 = a.qp_with(
        ibv_qp_type::IBV_QPT_XRC_SEND,
        cap(4, 0),
        false,
        a.cq,
        null_mut(),
        null_mut(),
    );
    let (a_, mk) = init_attr(ibv_qp_type::IBV_QPT_RC);
    assert_eq!(modify(ini2, &a_, mk), 0);
    let (rtr, full) = rtr_attr(ibv_qp_type::IBV_QPT_RC, a.gid, 0x98, 1);
    assert_eq!(modify(ini2, &rtr, full), 0, "RC's mask, in part ignored");
    assert_eq!(query(ini2).max_dest_rd_atomic, 0, "the initiator took none");
    // A target sends nothing of its own.
    let mut buf = [0u8; 8];
    let mr = a.reg(&mut buf, LOCAL_WRITE);
    let wr = send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &[sge(&buf, mr)], SIGNALED);
    assert_eq!(post_send(tgt, &mut [wr]), Err((libc::EINVAL, 0)));

    // An XRC SRQ needs its domain and CQ, and is no RC QP's SRQ.
    let cq = a.cq;
    let srq = xrc_srq(&a, a.pd, xrcd, cq).unwrap();
    assert_eq!(xrc_srq(&a, a.pd, null_mut(), cq).err(), Some(libc::EINVAL));
    assert_eq!(
        xrc_srq(&a, a.pd, xrcd, null_mut()).err(),
        Some(libc::EINVAL)
    );
    let mut init = ibv_qp_init_attr {
        send_cq: cq,
        recv_cq: cq,
        srq,
        cap: cap(4, 0),
        qp_type: ibv_qp_type::IBV_QPT_RC,
        ..Default::default()
    };
    // SAFETY: a live PD and a valid init struct.
    assert!(unsafe { (CONTROL.create_qp)(a.pd, &mut init) }.is_null());
    assert_eq!(errno(), libc::EINVAL);
    // A target needs its domain.
    init.qp_type = ibv_qp_type::IBV_QPT_XRC_RECV;
    init.srq = null_mut();
    // SAFETY: as above.
    assert!(unsafe { (CONTROL.create_qp)(a.pd, &mut init) }.is_null());
    assert_eq!(errno(), libc::EINVAL);
    assert_eq!(target_qp(&a, null_mut()).err(), Some(libc::EINVAL));
    // The context says it serves XRC.
    let mut attr = ibv_device_attr::default();
    // SAFETY: a live context and a writable struct.
    assert_eq!(unsafe { (CONTROL.query_device)(a.ctx, &mut attr) }, 0);
    assert_ne!(attr.device_cap_flags & IBV_DEVICE_XRC, 0);
    // Closing the device waits for the domain's last close.
    // SAFETY: softnic checks the pointers.
    unsafe {
        assert_eq!((CONTROL.destroy_srq)(srq), 0);
        assert_eq!((CONTROL.destroy_qp)(tgt), 0);
    }
    assert_eq!(close_xrcd(&a, xrcd), 0);
}

/// Messages for two SRQs over one XRC connection under loss, reordering and duplication: each
/// lands once, in order, in the SRQ it names.
#[test]
fn xrc_delivers_exactly_once_under_faults() {
    let f = Fabric::new(FabricConfig {
        seed: 11,
        ..Default::default()
    });
    f.set_default_faults(Faults {
        loss: 0.05,
        reorder: 0.05,
        reorder_delay_ns: 20_000,
        duplicate: 0.05,
        ..Faults::NONE
    })
    .unwrap();
    let x = xrc_pair(&f);
    let (a, b) = (&x.a, &x.b);
    let (cq1, cq2) = (b.new_cq(64, null_mut()), b.new_cq(64, null_mut()));
    let srqs = [
        xrc_srq(b, b.pd, x.xrcd, cq1).unwrap(),
        xrc_srq(b, b.pd, x.xrcd, cq2).unwrap(),
    ];
    let (n, len) = (32usize, 3000usize);
    let mut dst = vec![0u8; n * len];
    let dmr = b.reg(&mut dst, LOCAL_WRITE);
    for (i, c) in dst.chunks(len).enumerate() {
        post_srq_recv(srqs[i % 2], &mut [recv_wr(i as u64, &[sge(c, dmr)])]).unwrap();
    }
    let mut src: Vec<u8> = (0..n * len).map(|i| (i % 241) as u8).collect();
    let smr = a.reg(&mut src, LOCAL_WRITE);
    let nums = [srq_num(b, srqs[0]), srq_num(b, srqs[1])];
    let mut wrs: Vec<ibv_send_wr> = src
        .chunks(len)
        .enumerate()
        .map(|(i, c)| to_srq(i as u64, ibv_wr_opcode::IBV_WR_SEND, c, smr, nums[i % 2]))
        .collect();
    post_send(x.ini, &mut wrs).unwrap();
    let sent = poll_n(a.cq, n);
    assert!(sent.iter().all(ok), "{:?}", sent.iter().find(|w| !ok(w)));
    for (k, cq) in [cq1, cq2].into_iter().enumerate() {
        let got = poll_n(cq, n / 2);
        let ids: Vec<u64> = got.iter().map(|w| w.wr_id).collect();
        let want: Vec<u64> = (0..n as u64).filter(|i| i % 2 == k as u64).collect();
        assert_eq!(ids, want, "in order, once each");
        assert!(got.iter().all(|w| ok(w) && w.byte_len == len as u32));
        assert_eq!(poll(cq, 4).len(), 0, "nothing twice");
    }
    f.run_until_idle().unwrap();
    assert!(dst == src);
    assert!(
        f.qp_counters(x.ini).unwrap().retransmits > 0,
        "the faults hit"
    );
}

/// The new post API on an initiator: `ibv_wr_set_xrc_srqn` names each WR's SRQ. An initiator
/// takes no FLUSH (its builder keeps the length where the SRQ goes), a target no send ops.
#[test]
fn the_wr_builders_name_the_srq_of_an_initiator_s_wrs() {
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    let b = Node::open(&f, "soft1");
    let xrcd = open_xrcd(&b, -1, 0).unwrap();
    let tgt = target_qp(&b, xrcd).unwrap();
    let create: CreateQpEx = vctx_op(a.ctx, 264);
    let mut attr = ibv_qp_init_attr_ex {
        send_cq: a.cq,
        cap: cap(8, 0),
        qp_type: ibv_qp_type::IBV_QPT_XRC_SEND,
        comp_mask: IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        pd: a.pd,
        send_ops_flags: u64::from(IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_FLUSH),
        ..Default::default()
    };
    // SAFETY: a live context and a valid attribute struct.
    assert!(unsafe { create(a.ctx, &mut attr) }.is_null());
    assert_eq!(errno(), libc::EOPNOTSUPP);
    attr.send_ops_flags = u64::from(IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM);
    // SAFETY: as above.
    let ini = unsafe { create(a.ctx, &mut attr) };
    assert!(!ini.is_null());
    xrc_up(ini, true, b.gid, qpn(tgt));
    xrc_up(tgt, false, a.gid, qpn(ini));
    let (cq1, cq2) = (b.new_cq(4, null_mut()), b.new_cq(4, null_mut()));
    let s1 = xrc_srq(&b, b.pd, xrcd, cq1).unwrap();
    let s2 = xrc_srq(&b, b.pd, xrcd, cq2).unwrap();
    let mut dst = vec![0u8; 64];
    let dmr = b.reg(&mut dst, LOCAL_WRITE);
    post_srq_recv(s1, &mut [recv_wr(1, &[sge(&dst[..32], dmr)])]).unwrap();
    post_srq_recv(s2, &mut [recv_wr(2, &[sge(&dst[32..], dmr)])]).unwrap();
    let mut src = *b"to the second...to the first....";
    let smr = a.reg(&mut src, LOCAL_WRITE);
    // SAFETY: softnic checks the pointer.
    let x = unsafe { softnic::qp_to_qp_ex(ini) };
    assert!(!x.is_null());
    // SAFETY: a live extended QP; the builders are called between wr_start and wr_complete.
    unsafe {
        let q = &*x;
        q.wr_start.unwrap()(x);
        for (i, (srq, half)) in [(s2, 0), (s1, 16)].into_iter().enumerate() {
            (*x).wr_id = i as u64;
            (*x).wr_flags = SIGNALED;
            q.wr_send.unwrap()(x);
            q.wr_set_xrc_srqn.unwrap()(x, srq_num(&b, srq));
            q.wr_set_sge.unwrap()(x, (*smr).lkey, src.as_ptr() as u64 + half, 16);
        }
        assert_eq!(q.wr_complete.unwrap()(x), 0);
    }
    let sent = poll_n(a.cq, 2);
    assert!(sent.iter().all(ok), "{sent:?}");
    assert_eq!(poll_n(cq1, 1)[0].byte_len, 16);
    assert_eq!(poll_n(cq2, 1)[0].byte_len, 16);
    f.run_until_idle().unwrap();
    assert_eq!(&dst[..16], b"to the first....");
    assert_eq!(&dst[32..48], b"to the second...");

    // A target sends nothing: no send ops.
    let mut t = ibv_qp_init_attr_ex {
        qp_type: ibv_qp_type::IBV_QPT_XRC_RECV,
        comp_mask: IBV_QP_INIT_ATTR_XRCD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        xrcd,
        send_ops_flags: u64::from(IBV_QP_EX_WITH_SEND),
        ..Default::default()
    };
    let create_b: CreateQpEx = vctx_op(b.ctx, 264);
    // SAFETY: as above.
    assert!(unsafe { create_b(b.ctx, &mut t) }.is_null());
    assert_eq!(errno(), libc::EOPNOTSUPP);
}

/// A device closed with a domain open: `ibv_close_device` (plain) waits for the domain's
/// close (EBUSY); a drop-in libibverbs's `ibv_close_device` (`release_device`) closes it
/// with everything else, as the kernel does when the device's file goes.
#[test]
fn closing_the_device_closes_its_xrc_domains() {
    let f = Fabric::default();
    let b = Node::open(&f, "soft1");
    let file = tempfile_for_test();
    let fd = file.as_raw_fd();
    let x = open_xrcd(&b, fd, libc::O_CREAT).unwrap();
    let _tgt = target_qp(&b, x).unwrap();
    let _srq = xrc_srq(&b, b.pd, x, b.cq).unwrap();
    // SAFETY: softnic checks the pointers.
    unsafe {
        assert_eq!((CONTROL.close_device)(b.ctx), libc::EBUSY);
        assert_eq!(softnic::release_device(b.ctx), 0);
    }
    assert_eq!(close_xrcd(&b, x), libc::EINVAL, "closed with the device");
    let again = Node::open(&f, "soft1");
    assert_eq!(
        open_xrcd(&again, fd, 0).err(),
        Some(libc::EAGAIN),
        "the domain went"
    );
}

/// A message keeps the SRQ its first packet named: a later packet of it, in sequence, naming
/// another is an Invalid Request (NAK, the target to ERROR), and nothing lands in the other.
#[test]
fn a_message_cannot_change_its_srq_half_way() {
    use softnic::packet::opcode;
    let f = Fabric::default();
    let x = xrc_pair(&f);
    let (a, b) = (&x.a, &x.b);
    let (cq1, cq2) = (b.new_cq(16, null_mut()), b.new_cq(16, null_mut()));
    let s1 = xrc_srq(b, b.pd, x.xrcd, cq1).unwrap();
    let s2 = xrc_srq(b, b.pd, x.xrcd, cq2).unwrap();
    let mut dst = vec![0u8; 4096];
    let dmr = b.reg(&mut dst, LOCAL_WRITE);
    let (d1, d2) = dst.split_at(2048);
    post_srq_recv(s1, &mut [recv_wr(1, &[sge(d1, dmr)])]).unwrap();
    post_srq_recv(s2, &mut [recv_wr(2, &[sge(d2, dmr)])]).unwrap();
    // SAFETY: reading raw GID bytes.
    let sgid = unsafe { a.gid.raw };
    let packet = |op, psn, srq| xrc_request(x.tgt, op, psn, srq_num(b, srq));
    let first = frame(packet(opcode::RC_SEND_FIRST, 100, s1), &[7; 1024]);
    f.inject("soft1", sgid, &first).unwrap();
    f.run_until_idle().unwrap();
    assert_eq!(state(x.tgt), ibv_qp_state::IBV_QPS_RTS);
    let last = frame(packet(opcode::RC_SEND_LAST, 101, s2), &[8; 10]);
    f.inject("soft1", sgid, &last).unwrap();
    f.run_until_idle().unwrap();
    assert_eq!(state(x.tgt), ibv_qp_state::IBV_QPS_ERR);
    assert_eq!(poll(cq1, 4).len(), 0);
    assert_eq!(poll(cq2, 4).len(), 0);
    assert!(
        dst[2048..].iter().all(|&b| b == 0),
        "nothing in the other SRQ's buffer"
    );
}

/// An XRC SRQ with no receive posted: the target answers RNR NAKs, and the message lands
/// once one is posted; the SRQ's limit event fires as a basic SRQ's does.
#[test]
fn an_empty_xrc_srq_holds_the_sender_back_until_a_receive_comes() {
    let f = Fabric::default();
    let x = xrc_pair(&f);
    let (a, b) = (&x.a, &x.b);
    let cq = b.new_cq(16, null_mut());
    let srq = xrc_srq(b, b.pd, x.xrcd, cq).unwrap();
    let mut src = *b"patience";
    let smr = a.reg(&mut src, LOCAL_WRITE);
    let mut wr = to_srq(1, ibv_wr_opcode::IBV_WR_SEND, &src, smr, srq_num(b, srq));
    post_send(x.ini, std::slice::from_mut(&mut wr)).unwrap();
    f.advance(std::time::Duration::from_millis(5));
    assert!(f.qp_counters(x.tgt).unwrap().rnr_naks_sent > 0);
    assert_eq!(poll(a.cq, 4).len(), 0, "the SEND waits");
    let mut dst = vec![0u8; 64];
    let dmr = b.reg(&mut dst, LOCAL_WRITE);
    let mut rs: Vec<ibv_recv_wr> = (0..3).map(|i| recv_wr(i, &[sge(&dst, dmr)])).collect();
    post_srq_recv(srq, &mut rs).unwrap();
    assert_eq!(arm_srq_limit(srq, 3), 0);
    assert!(ok(&poll_n(a.cq, 1)[0]));
    let got = poll_n(cq, 1);
    assert_eq!((got[0].wr_id, got[0].byte_len), (0, 8));
    f.run_until_idle().unwrap();
    assert_eq!(&dst[..8], b"patience");
    let ev = async_event(b.ctx).expect("the limit event");
    assert_eq!(ev.event_type, IBV_EVENT_SRQ_LIMIT_REACHED);
}
