//! Chained posting from caller-owned WRs, one doorbell, and bad_wr semantics.

use crate::setup::*;
use verbs_safe::sys::{ibv_send_wr, ibv_sge, ibv_wr_opcode};

#[test]
fn a_batch_of_pool_wrs_rings_the_doorbell_once() {
    let (f, _v, a, b) = fabric();
    let (qa, qb) = rc_pair(&a, &b, QpCaps::default(), true);
    let src =
        a.pd.alloc_mr(16 * 64, 64, AccessFlags::LOCAL_WRITE)
            .unwrap();
    let dst = b.pd.alloc_dma(16 * 64, 64, AccessFlags::all()).unwrap();
    // A pool of pre-initialised WRs, each with its own SGE, as UCCL's WrExBuffPool.
    let mut sges: Vec<ibv_sge> = (0..16).map(|i| src.sge(i * 64, 64).unwrap()).collect();
    let mut wrs: Vec<ibv_send_wr> = (0..16)
        .map(|i| {
            let mut w = ibv_send_wr {
                wr_id: i as u64,
                num_sge: 1,
                opcode: ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                ..Default::default()
            };
            w.wr.rdma.remote_addr = dst.addr() + i as u64 * 64;
            w.wr.rdma.rkey = dst.rkey();
            w
        })
        .collect();
    for (w, s) in wrs.iter_mut().zip(sges.iter_mut()) {
        w.sg_list = s;
    }
    let mut batch = qa.send_batch();
    for w in wrs.iter_mut() {
        batch.push(w);
    }
    assert_eq!(batch.len(), 16);
    // SAFETY: the regions outlive the completions.
    unsafe { batch.submit().unwrap() };
    assert_eq!(drain(&a.cq, 16).len(), 16);
    let c = f.qp_counters(qa.as_raw()).unwrap();
    assert_eq!((c.post_send_calls, c.send_wrs), (1, 16));
    let _ = qb;
}

#[test]
fn a_failed_chain_says_which_wr_and_keeps_the_ones_before() {
    let (_f, _v, a, b) = fabric();
    let (qa, qb) = rc_pair(
        &a,
        &b,
        QpCaps {
            max_send_wr: 3,
            ..QpCaps::default()
        },
        true,
    );
    let mut wrs: Vec<SendWr> = (0..5)
        .map(|i| {
            SendWr::new(
                i,
                SendOp::Write {
                    remote_addr: 0,
                    rkey: 0,
                },
            )
        })
        .collect();
    // SAFETY: zero-length writes name no memory.
    let err = unsafe { qa.post_send(&mut wrs) }.unwrap_err();
    match err {
        Error::Post {
            queue,
            index,
            errno,
            qpn,
        } => {
            assert_eq!(
                (queue, index, errno.0, qpn),
                ("post_send", 3, libc::ENOMEM, qa.qpn())
            );
        }
        e => panic!("{e}"),
    }
    assert_eq!(
        drain(&a.cq, 3).iter().map(|d| d.wr_id).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    // Receive batches report the same way.
    let mut rwrs: Vec<verbs_safe::sys::ibv_recv_wr> = (0..3)
        .map(|i| verbs_safe::sys::ibv_recv_wr {
            wr_id: i,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
        })
        .collect();
    rwrs[2].num_sge = -1; // malformed
    let mut batch = qb.recv_batch();
    for w in rwrs.iter_mut() {
        batch.push(w);
    }
    // SAFETY: no buffers.
    let err = unsafe { batch.submit() }.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Post {
                queue: "post_recv",
                index: 2,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn receives_are_postable_from_init_but_sends_only_from_rts() {
    let (_f, _v, a, _b) = fabric();
    let q = a
        .qp::<Rc>(QpCaps::default(), true)
        .init(ConnInit::default())
        .unwrap();
    // SAFETY: no buffers.
    unsafe { q.post_recv(&mut [RecvWr::new(1)]).unwrap() };
    // (Posting a send here does not compile: see tests/compile-fail.)
    let q = q.into_error().unwrap();
    assert_eq!(drain(&a.cq, 1)[0].status, WcStatus::WrFlushErr);
    let _ = q;
}
