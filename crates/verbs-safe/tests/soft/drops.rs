//! RAII: objects can be dropped in any order; parents live as long as their children.

use crate::setup::*;

#[test]
fn dropping_parents_first_is_fine() {
    let (_f, v, a, b) = fabric();
    let (qa, qb) = rc_pair(&a, &b, QpCaps::default(), true);
    let mr = a.pd.alloc_mr(64, 64, AccessFlags::LOCAL_WRITE).unwrap();
    let srq = Srq::new(&a.pd, 4, 1).unwrap();
    // Miri's eventfd has no F_GETFL, which CompChannel::new uses to make the channel
    // non-blocking: under Miri the CQ has no channel (that the CQ keeps its channel alive is
    // checked outside Miri only).
    let ch = (!cfg!(miri)).then(|| CompChannel::new(&a.ctx).unwrap());
    let cq = Cq::new(&a.ctx, 4, ch.as_ref()).unwrap();
    let ah = a.pd.create_ah(FROM, 0, Some(b.gid)).unwrap();
    // Drop the context, PD and CQ handles first: the children keep them alive.
    let Side {
        ctx, pd, cq: acq, ..
    } = a;
    drop(ctx);
    drop(pd);
    drop(acq);
    drop(ch);
    drop(v);
    // Everything still works.
    assert_eq!(qa.current_state().unwrap(), QpStateKind::Rts);
    assert!(mr.lkey() != 0);
    assert_eq!(srq.query().unwrap().max_wr, 4);
    assert_eq!(cq.capacity(), 4);
    drop(qa);
    drop(mr);
    drop(srq);
    drop(ah);
    drop(cq);
    drop(qb);
}

#[test]
fn registering_bad_memory_is_an_error_naming_it() {
    let (_f, _v, a, _b) = fabric();
    // SAFETY: NULL with a length is refused by the provider before any access.
    let err = unsafe {
        a.pd.register(std::ptr::null_mut(), 64, AccessFlags::LOCAL_WRITE)
    }
    .unwrap_err();
    assert!(matches!(err, Error::RegMr { len: 64, .. }), "{err}");
    // Remote write without local write is refused by the provider.
    let err =
        a.pd.alloc_dma(64, 64, AccessFlags::REMOTE_WRITE)
            .unwrap_err();
    assert!(err.to_string().contains("errno 22"), "{err}");
    // Remote access through an `MrBuf` (whose bytes safe code may borrow) is refused.
    let err =
        a.pd.alloc_mr(64, 64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
            .unwrap_err();
    assert!(
        matches!(err, Error::InvalidAttr { name: "access", .. }),
        "{err}"
    );
    assert!(a.pd.alloc_mr(64, 3, AccessFlags::LOCAL_WRITE).is_err());
}
