//! Malformed and hostile MADs: counted and dropped, never a panic, and the honest connection
//! goes on.

use proptest::prelude::*;
use softnic::cm::mad::{self, Msg};
use softnic::packet::{Deth, Headers, opcode};

use super::common::*;
use super::*;

/// A UD SEND to QP1 carrying `payload`, as the wire has it.
fn to_qp1(payload: &[u8], qkey: u32) -> Vec<u8> {
    let hdr = Headers {
        opcode: opcode::UD_SEND_ONLY,
        pkey: 0xffff,
        dest_qp: 1,
        deth: Some(Deth { qkey, src_qp: 1 }),
        ..Headers::default()
    };
    let mut out = Vec::new();
    hdr.emit(payload, &mut out).unwrap();
    out
}

fn inject(f: &Fabric, from: &Node, payload: &[u8], qkey: u32) {
    f.inject("soft1", from.gid_bytes(), &to_qp1(payload, qkey))
        .unwrap();
}

trait GidBytes {
    fn gid_bytes(&self) -> [u8; 16];
}

impl GidBytes for Node {
    fn gid_bytes(&self) -> [u8; 16] {
        // SAFETY: every variant of the union is 16 plain bytes.
        unsafe { self.gid.raw }
    }
}

#[test]
fn malformed_and_hostile_mads_are_counted_and_dropped() {
    let e = ends(20);
    let (_, qa, s, qb) = connect(&e);
    let good = Msg::Rtu(1, 2).emit(7);
    let mut wrong_class = good;
    wrong_class[1] = 0x04;
    let mut bad_mtu = Msg::Req(Box::new(sample_req())).emit(8);
    bad_mtu[mad::HDR_LEN + 50] = 0xf0;
    // Not CM: short, wrong class, bad field, wrong Q_Key.
    inject(&e.fabric, &e.a, &good[..100], mad::GSI_QKEY);
    inject(&e.fabric, &e.a, &wrong_class, mad::GSI_QKEY);
    inject(&e.fabric, &e.a, &bad_mtu, mad::GSI_QKEY);
    inject(&e.fabric, &e.a, &good, 0x1234);
    let c = e.fabric.cm_counters("soft1").unwrap();
    assert_eq!(c.malformed, 4, "{c:?}");
    // CM messages naming connections that are not (or not the sender's).
    let unknown = [
        Msg::Rtu(1, 2),
        Msg::Rep(Box::new(sample_rep())),
        Msg::Drep(5, 6),
        Msg::Mra(1, 2, 0, 3),
        Msg::SidrRep(Box::new(mad::SidrRep {
            request_id: 9,
            status: 0,
            qpn: 1,
            service_id: 1,
            qkey: 1,
            private: [0; mad::private::SIDR_REP],
        })),
    ];
    for m in &unknown {
        inject(&e.fabric, &e.a, &m.emit(1), mad::GSI_QKEY);
    }
    let c2 = e.fabric.cm_counters("soft1").unwrap();
    assert_eq!(c2.unexpected - c.unexpected, unknown.len() as u64, "{c2:?}");
    // A DREQ naming the live connection's ID from a stranger's GID does not disconnect it.
    let stranger = [0xfe; 16];
    let dreq = to_qp1(&Msg::Dreq(0, 0, 0).emit(1), mad::GSI_QKEY);
    e.fabric.inject("soft1", stranger, &dreq).unwrap();
    assert!(e.fabric.broken().is_none());
    send_works(&e.a, qa, &e.b, qb, 200);
    e.fabric.cm_disconnect(s).unwrap();
    expect(&e.fabric, e.ca, CmEventKind::Disconnected);
}

fn sample_req() -> mad::Req {
    mad::Req {
        service_id: mad::service_id(mad::ps::TCP, 1),
        ..Default::default()
    }
}

fn sample_rep() -> mad::Rep {
    mad::Rep {
        local_comm_id: 3,
        remote_comm_id: 4,
        ..Default::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Any 256 bytes with a CM header, any attribute: never a panic, the fabric works on.
    #[test]
    fn random_cm_mads_never_break_the_fabric(
        attr in 0x10u16..0x1b,
        body in proptest::collection::vec(any::<u8>(), 232),
    ) {
        let e = ends(21);
        let l = listen(&e, PortSpace::Tcp, 2);
        let mut m = [0u8; 256];
        m[..4].copy_from_slice(&[1, mad::CLASS_CM, mad::CLASS_VERSION, mad::METHOD_SEND]);
        m[16..18].copy_from_slice(&attr.to_be_bytes());
        m[24..].copy_from_slice(&body);
        inject(&e.fabric, &e.a, &m, mad::GSI_QKEY);
        e.fabric.advance(Duration::from_secs(200));
        prop_assert!(e.fabric.broken().is_none());
        let _ = l;
    }
}

/// A REQ that asks for more READ depth than any device has (255, from a peer that is not
/// softnic, or not honest): the attributes `rdma_init_qp_attr` gives before the accept stay
/// within the device's, so a server that moves its own QP with them can.
#[test]
fn a_req_asking_any_read_depth_gives_attributes_the_device_takes() {
    let e = ends(23);
    let l = listen(&e, PortSpace::Tcp, 8);
    let mut private = [0u8; mad::private::REQ];
    let ip = mad::IpHeader {
        src: CLIENT_IP,
        src_port: 5000,
        dst: *SERVER.ip(),
    };
    ip.emit(&mut private);
    let req = mad::Req {
        local_comm_id: 77,
        service_id: mad::service_id(mad::ps::TCP, SERVER.port()),
        qpn: 0x99,
        responder_resources: 255,
        initiator_depth: 255,
        starting_psn: 5,
        retry_count: 7,
        rnr_retry: 7,
        private,
        ..sample_req()
    };
    inject(
        &e.fabric,
        &e.a,
        &Msg::Req(Box::new(req)).emit(3),
        mad::GSI_QKEY,
    );
    let ev = expect(&e.fabric, e.cb, CmEventKind::ConnectRequest);
    assert_eq!(ev.listen_id, Some(l));
    let qb = e.b.qp(ibv_qp_type::IBV_QPT_RC, cap(4, 4), true);
    move_by_cm(&e, ev.id, qb);
    let q = query(qb);
    assert_eq!((q.max_dest_rd_atomic, q.max_rd_atomic), (16, 16));
}
