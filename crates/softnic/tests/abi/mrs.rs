//! Point 2: Memory regions: lkey/rkey, bounds and access flags checked on every access, with the
//! error completions of the verbs semantics (UC drops silently).

use crate::common::*;

#[test]
fn registration_checks_its_arguments() {
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    let mut buf = vec![0u8; 64];
    let p = buf.as_mut_ptr().cast();
    // SAFETY: each call gets a valid PD and either valid or rejected arguments.
    unsafe {
        // Remote write needs local write.
        assert!((CONTROL.reg_mr)(a.pd, p, 64, REMOTE_WRITE as i32).is_null());
        assert_eq!(*libc::__errno_location(), libc::EINVAL);
        // Unknown access bits.
        assert!((CONTROL.reg_mr)(a.pd, p, 64, 1 << 30).is_null());
        // NULL address with a length.
        assert!((CONTROL.reg_mr)(a.pd, std::ptr::null_mut(), 64, 0).is_null());
        let mr = (CONTROL.reg_mr)(a.pd, p, 64, ALL_ACCESS as i32);
        assert!(!mr.is_null());
        assert_eq!(((*mr).addr, (*mr).length, (*mr).pd), (p, 64, a.pd));
        let mr2 = (CONTROL.reg_mr)(a.pd, p, 64, LOCAL_WRITE as i32);
        assert_ne!((*mr).lkey, (*mr2).lkey, "keys are unique");
        assert_eq!((CONTROL.dereg_mr)(mr), 0);
        assert_eq!((CONTROL.dereg_mr)(mr), libc::EINVAL, "already deregistered");
        assert_eq!((CONTROL.dereg_mr)(mr2), 0);
    }
}

/// An anonymous mapping of one page with protection `prot`, unmapped on drop.
struct Page(*mut libc::c_void);

impl Page {
    fn new(prot: i32) -> Page {
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Page(p)
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, nothing refers to it any more.
        unsafe { libc::munmap(self.0, 4096) };
    }
}

/// Registration fails as the kernel's does where it could not pin the pages (`ib_umem_get`):
/// EFAULT for a range not mapped, or not writable for a region that writes (local or remote
/// write, remote atomics, window binds), so that no access through a region faults later
/// (a peer's WRITE into a read-only page would kill the process). A read-only mapping
/// registers for reading.
#[test]
fn registration_refuses_memory_the_kernel_could_not_pin() {
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    let read_only = Page::new(libc::PROT_READ);
    let no_access = Page::new(libc::PROT_NONE);
    // Below `vm.mmap_min_addr`: never mapped (an address unmapped by the test could be mapped
    // again by another test's thread meanwhile).
    let unmapped = 0x1000 as *mut libc::c_void;
    let reg = |p: *mut libc::c_void, len: usize, access: u32| {
        // SAFETY: a live PD; the pointer is only recorded (and the registration may fail).
        let mr = unsafe { (CONTROL.reg_mr)(a.pd, p, len, access as i32) };
        // SAFETY: errno of this thread.
        let errno = unsafe { *libc::__errno_location() };
        if mr.is_null() {
            Err(errno)
        } else {
            // SAFETY: a live MR made just now.
            assert_eq!(unsafe { (CONTROL.dereg_mr)(mr) }, 0);
            Ok(())
        }
    };
    let writes = [
        LOCAL_WRITE,
        LOCAL_WRITE | REMOTE_WRITE,
        LOCAL_WRITE | ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0,
        ibv_access_flags::IBV_ACCESS_MW_BIND.0,
    ];
    for access in writes {
        assert_eq!(
            reg(read_only.0, 4096, access),
            Err(libc::EFAULT),
            "{access:#x}"
        );
        assert_eq!(
            reg(unmapped, 4096, access),
            Err(libc::EFAULT),
            "{access:#x}"
        );
    }
    assert_eq!(reg(read_only.0, 4096, REMOTE_READ), Ok(()));
    assert_eq!(reg(read_only.0, 100, 0), Ok(()));
    assert_eq!(reg(unmapped, 4096, REMOTE_READ), Err(libc::EFAULT));
    assert_eq!(reg(no_access.0, 4096, REMOTE_READ), Err(libc::EFAULT));
    // No bytes: registered (rxe refuses them; see `region_ok` in softnic's control path).
    assert_eq!(reg(read_only.0, 0, LOCAL_WRITE), Ok(()));
    // A registration that ends past the mapping.
    let mut heap = vec![0u8; 64];
    assert_eq!(reg(heap.as_mut_ptr().cast(), 64, LOCAL_WRITE), Ok(()));
    assert_eq!(
        reg(read_only.0.cast::<u8>().wrapping_add(4000).cast(), 4096, 0),
        Err(libc::EFAULT)
    );
    // ibv_rereg_mr checks the region it would make the same way: refused by the command, the
    // region unchanged.
    let rereg = |mr, flags: u32, p: *mut libc::c_void, len: usize, access: u32| {
        // SAFETY: a live MR; the pointer is only recorded (and the change may fail).
        let r = unsafe {
            (CONTROL.rereg_mr)(
                mr,
                flags as i32,
                std::ptr::null_mut(),
                p,
                len,
                access as i32,
            )
        };
        // SAFETY: errno of this thread.
        (r, unsafe { *libc::__errno_location() })
    };
    let (access, translation) = (IBV_REREG_MR_CHANGE_ACCESS, IBV_REREG_MR_CHANGE_TRANSLATION);
    let cmd = (IBV_REREG_MR_ERR_CMD, libc::EFAULT);
    // SAFETY: a live PD; the page outlives the region.
    let mr = unsafe { (CONTROL.reg_mr)(a.pd, read_only.0, 4096, REMOTE_READ as i32) };
    assert!(!mr.is_null());
    assert_eq!(rereg(mr, access, std::ptr::null_mut(), 0, LOCAL_WRITE), cmd);
    let heap_p = heap.as_mut_ptr().cast();
    assert_eq!(
        rereg(mr, translation | access, heap_p, 64, LOCAL_WRITE).0,
        0
    );
    assert_eq!(rereg(mr, translation, read_only.0, 4096, 0), cmd);
    assert_eq!(rereg(mr, translation, unmapped, 4096, 0), cmd);
    // SAFETY: a live MR's `ibv_mr`, then the MR itself.
    unsafe {
        assert_eq!(((*mr).addr, (*mr).length), (heap_p, 64), "unchanged");
        assert_eq!((CONTROL.dereg_mr)(mr), 0);
    }
}

fn send_from(f: &Fabric, sg: impl FnOnce(&Node, &mut Vec<u8>, *mut ibv_mr) -> ibv_sge) -> Wc {
    let (a, qa, b, qb) = pair(f, ibv_qp_type::IBV_QPT_RC, 8);
    let mut src = vec![1u8; 256];
    let mut dst = vec![0u8; 256];
    let smr = a.reg(&mut src, LOCAL_WRITE);
    let dmr = b.reg(&mut dst, LOCAL_WRITE);
    post_recv(qb, &mut [recv_wr(1, &[sge(&dst, dmr)])]).unwrap();
    let s = [sg(&a, &mut src, smr)];
    post_send(qa, &mut [send_wr(2, ibv_wr_opcode::IBV_WR_SEND, &s, 0)]).unwrap();
    let wc = poll_n(a.cq, 1)[0];
    assert_eq!(
        state(qa),
        ibv_qp_state::IBV_QPS_ERR,
        "a local protection error is fatal on RC"
    );
    wc
}

#[test]
fn bad_local_sges_complete_with_loc_prot_err() {
    let f = Fabric::default();
    // Wrong lkey.
    let wc = send_from(&f, |_, src, mr| ibv_sge {
        lkey: rkey(mr) ^ 0x100,
        ..sge(src, mr)
    });
    assert_eq!(wc.status, ibv_wc_status::IBV_WC_LOC_PROT_ERR);
    assert_eq!(wc.wr_id, 2, "an unsignaled WR that fails still completes");
    // Past the end of the region.
    let wc = send_from(&f, |_, src, mr| ibv_sge {
        length: 257,
        ..sge(src, mr)
    });
    assert_eq!(wc.status, ibv_wc_status::IBV_WC_LOC_PROT_ERR);
    // An MR of another protection domain.
    let wc = send_from(&f, |a, src, _| {
        // SAFETY: a second PD on the same context.
        let pd2 = unsafe { (CONTROL.alloc_pd)(a.ctx) };
        // SAFETY: `src` outlives the test's use of this MR.
        let mr = unsafe {
            (CONTROL.reg_mr)(pd2, src.as_mut_ptr().cast(), src.len(), LOCAL_WRITE as i32)
        };
        sge(src, mr)
    });
    assert_eq!(wc.status, ibv_wc_status::IBV_WC_LOC_PROT_ERR);
}

#[test]
fn read_into_memory_without_local_write_is_loc_prot_err() {
    let f = Fabric::default();
    let (a, qa, b, _qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    let mut remote = vec![3u8; 64];
    let mut local = vec![0u8; 64];
    let rmr = b.reg(&mut remote, ALL_ACCESS);
    let lmr = a.reg(&mut local, 0); // read-only locally
    let wr = with_rdma(
        send_wr(
            1,
            ibv_wr_opcode::IBV_WR_RDMA_READ,
            &[sge(&local, lmr)],
            SIGNALED,
        ),
        remote.as_ptr() as u64,
        rkey(rmr),
    );
    post_send(qa, &mut [wr]).unwrap();
    assert_eq!(
        poll_n(a.cq, 1)[0].status,
        ibv_wc_status::IBV_WC_LOC_PROT_ERR
    );
    assert!(local.iter().all(|&x| x == 0));
}

#[test]
fn receive_buffer_too_small_is_loc_len_err_at_the_responder() {
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    let mut src = vec![1u8; 300];
    let mut dst = vec![0u8; 100];
    let smr = a.reg(&mut src, LOCAL_WRITE);
    let dmr = b.reg(&mut dst, LOCAL_WRITE);
    post_recv(qb, &mut [recv_wr(1, &[sge(&dst, dmr)])]).unwrap();
    post_send(
        qa,
        &mut [send_wr(
            2,
            ibv_wr_opcode::IBV_WR_SEND,
            &[sge(&src, smr)],
            SIGNALED,
        )],
    )
    .unwrap();
    let r = poll_n(b.cq, 1)[0];
    assert_eq!(r.status, ibv_wc_status::IBV_WC_LOC_LEN_ERR);
    assert_eq!(r.wr_id, 1);
    let s = poll_n(a.cq, 1)[0];
    assert_eq!(s.status, ibv_wc_status::IBV_WC_REM_INV_REQ_ERR);
    assert_eq!(state(qb), ibv_qp_state::IBV_QPS_ERR);
}

#[test]
fn bad_remote_access_is_rem_access_err_on_rc_and_silent_on_uc() {
    let f = Fabric::default();
    struct Case {
        access: u32,
        opcode: ibv_wr_opcode::Type,
        offset: u64,
        len: usize,
        rkey_xor: u32,
    }
    let cases = [
        // No remote write permission on the region.
        Case {
            access: LOCAL_WRITE | REMOTE_READ,
            opcode: ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            offset: 0,
            len: 16,
            rkey_xor: 0,
        },
        // Out of bounds.
        Case {
            access: ALL_ACCESS,
            opcode: ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            offset: 60,
            len: 16,
            rkey_xor: 0,
        },
        // Wrong rkey.
        Case {
            access: ALL_ACCESS,
            opcode: ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            offset: 0,
            len: 16,
            rkey_xor: 0x300,
        },
        // Read without remote read permission.
        Case {
            access: LOCAL_WRITE | REMOTE_WRITE,
            opcode: ibv_wr_opcode::IBV_WR_RDMA_READ,
            offset: 0,
            len: 16,
            rkey_xor: 0,
        },
    ];
    for c in &cases {
        let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
        let mut local = vec![9u8; 64];
        let mut remote = vec![0u8; 64];
        let lmr = a.reg(&mut local, LOCAL_WRITE);
        let rmr = b.reg(&mut remote, c.access);
        let s = [sge(&local[..c.len], lmr)];
        let wr = with_rdma(
            send_wr(1, c.opcode, &s, SIGNALED),
            remote.as_ptr() as u64 + c.offset,
            rkey(rmr) ^ c.rkey_xor,
        );
        let next = with_rdma(
            send_wr(2, ibv_wr_opcode::IBV_WR_RDMA_WRITE, &[], SIGNALED),
            0,
            0,
        );
        post_send(qa, &mut [wr, next]).unwrap();
        let wcs = poll_n(a.cq, 2);
        assert_eq!(
            wcs[0].status,
            ibv_wc_status::IBV_WC_REM_ACCESS_ERR,
            "case opcode {}",
            c.opcode
        );
        assert_eq!(wcs[1].status, ibv_wc_status::IBV_WC_WR_FLUSH_ERR);
        assert_eq!(state(qa), ibv_qp_state::IBV_QPS_ERR);
        assert_eq!(
            state(qb),
            ibv_qp_state::IBV_QPS_ERR,
            "the responder goes to ERROR too (rxe class C)"
        );
        assert!(remote.iter().all(|&x| x == 0));
    }
    // UC: the same bad write is dropped silently; the QP carries on.
    let (a, qa, b, _qb) = pair(&f, ibv_qp_type::IBV_QPT_UC, 8);
    let mut local = vec![9u8; 64];
    let mut remote = vec![0u8; 64];
    let lmr = a.reg(&mut local, LOCAL_WRITE);
    let rmr = b.reg(&mut remote, LOCAL_WRITE);
    let wr = write_wr(1, &local, lmr, remote.as_ptr() as u64, rmr);
    post_send(qa, &mut [wr]).unwrap();
    assert!(
        ok(&poll_n(a.cq, 1)[0]),
        "UC completes at the sender regardless"
    );
    f.run_until_idle().unwrap();
    assert!(remote.iter().all(|&x| x == 0));
    assert_eq!(state(qa), ibv_qp_state::IBV_QPS_RTS);
}
