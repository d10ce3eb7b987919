//! The typestate QP: transitions per transport, failures that hand the QP back, reset/error.

use crate::setup::*;

#[test]
fn every_transport_reaches_rts() {
    let (_f, _v, a, b) = fabric();
    let (qa, qb) = rc_pair(&a, &b, QpCaps::default(), true);
    assert_eq!(qa.current_state().unwrap(), QpStateKind::Rts);
    assert_eq!(qb.current_state().unwrap(), QpStateKind::Rts);
    let (ua, _ub) = uc_pair(&a, &b);
    assert_eq!(ua.current_state().unwrap(), QpStateKind::Rts);
    let d = ud_qp(&a);
    assert_eq!(d.current_state().unwrap(), QpStateKind::Rts);
    assert!(format!("{d:?}").contains("UD"));
}

#[test]
fn a_refused_transition_hands_the_qp_back_unchanged() {
    let (_f, _v, a, b) = fabric();
    let q = a
        .qp::<Rc>(QpCaps::default(), true)
        .init(ConnInit::default())
        .unwrap();
    // A valid mask with an invalid value: a port the device does not have.
    let mut rtr = RcRtr::new(
        Remote {
            qpn: 5,
            psn: 0,
            lid: 0,
            gid: Some(b.gid),
        },
        FROM,
    );
    rtr.from.port = 2;
    let err = q.rtr(rtr).unwrap_err();
    assert_eq!(err.qp.current_state().unwrap(), QpStateKind::Init);
    match &err.error {
        Error::ModifyQp {
            from,
            to,
            errno,
            missing,
            unexpected,
            mask,
            ..
        } => {
            assert_eq!((*from, *to), (QpStateKind::Init, QpStateKind::Rtr));
            assert_eq!(errno.0, libc::EINVAL);
            assert!(
                missing.is_empty() && unexpected.is_empty(),
                "the mask was right; a value was not"
            );
            assert!(mask.contains(QpAttrMask::AV | QpAttrMask::DEST_QPN));
        }
        e => panic!("unexpected error {e}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("Init") && text.contains("Rtr") && text.contains("errno 22"),
        "{text}"
    );
    // The QP handed back still works.
    let q = err
        .qp
        .rtr(RcRtr::new(
            Remote {
                qpn: 5,
                psn: 0,
                lid: 0,
                gid: Some(b.gid),
            },
            FROM,
        ))
        .unwrap();
    assert_eq!(q.current_state().unwrap(), QpStateKind::Rtr);
}

#[test]
fn out_of_range_attributes_are_refused_before_the_provider() {
    let (_f, _v, a, b) = fabric();
    let q = a
        .qp::<Rc>(QpCaps::default(), true)
        .init(ConnInit::default())
        .unwrap();
    let bad = RcRtr::new(
        Remote {
            qpn: 1 << 24,
            psn: 0,
            lid: 0,
            gid: Some(b.gid),
        },
        FROM,
    );
    let err = q.rtr(bad).unwrap_err();
    assert!(
        matches!(
            err.error,
            Error::InvalidAttr {
                name: "dest_qp_num",
                ..
            }
        ),
        "{}",
        err.error
    );
    let q = err
        .qp
        .rtr(RcRtr::new(
            Remote {
                qpn: 1,
                psn: 0,
                lid: 0,
                gid: Some(b.gid),
            },
            FROM,
        ))
        .unwrap();
    let mut rts = RcRts::new(0);
    rts.retry_cnt = 8;
    let err = q.rts(rts).unwrap_err();
    assert!(matches!(
        err.error,
        Error::InvalidAttr {
            name: "retry_cnt",
            value: 8,
            ..
        }
    ));
    let ud = a.qp::<Ud>(QpCaps::default(), true);
    assert!(matches!(
        ud.init(UdInit::new(0x8000_0000)).unwrap_err().error,
        Error::InvalidAttr { name: "qkey", .. }
    ));
}

#[test]
fn sqd_and_back_and_error_and_recover() {
    let (_f, _v, a, b) = fabric();
    let (qa, _qb) = rc_pair(&a, &b, QpCaps::default(), true);
    let qa = qa.drain().unwrap();
    assert_eq!(qa.current_state().unwrap(), QpStateKind::Sqd);
    let qa = qa.resume().unwrap();
    let qa = qa.into_error().unwrap();
    assert_eq!(qa.current_state().unwrap(), QpStateKind::Error);
    let qa = qa.recover().unwrap();
    assert_eq!(qa.current_state().unwrap(), QpStateKind::Reset);
    // RESET -> ERROR does not exist: refused, and the QP comes back in RESET.
    let err = qa.into_error().unwrap_err();
    assert!(matches!(err.error, Error::ModifyQp { .. }));
    assert_eq!(err.qp.current_state().unwrap(), QpStateKind::Reset);
    // And it can be brought up again.
    let again = err.qp.init(ConnInit::default()).unwrap();
    assert_eq!(again.current_state().unwrap(), QpStateKind::Init);
}

#[test]
fn device_queries_report_softnic_limits() {
    let (_f, v, a, _b) = fabric();
    let limits = a.ctx.query_device().unwrap();
    assert_eq!((limits.max_qp_wr, limits.max_sge), (16384, 32));
    let port = a.ctx.query_port(1).unwrap();
    assert!(port.active);
    assert_eq!(port.active_mtu, Mtu::Mtu4096);
    assert!(a.ctx.query_port(3).is_err());
    assert!(matches!(
        Context::open_by_name(&v, "mlx5_0"),
        Err(Error::NoSuchDevice { .. })
    ));
    let names: Vec<String> = Device::list(&v)
        .unwrap()
        .iter()
        .map(|d| d.name().to_string())
        .collect();
    assert_eq!(names, ["soft0", "soft1"]);
}
