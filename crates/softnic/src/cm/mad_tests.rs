//! Round trips and refusals of the CM wire format.

use super::*;

fn req() -> Req {
    Req {
        local_comm_id: 0x1234_5678,
        service_id: service_id(ps::TCP, 7174),
        ca_guid: 0x0102_0304_0506_0708,
        qpn: 0x00ab_cdef,
        responder_resources: 4,
        initiator_depth: 3,
        remote_cm_timeout: 18,
        transport: 0,
        flow_control: true,
        starting_psn: 0x0065_4321,
        local_cm_timeout: 18,
        retry_count: 7,
        mtu: 5,
        rnr_retry: 6,
        max_cm_retries: 15,
        srq: true,
        local_gid: [1; 16],
        remote_gid: [2; 16],
        ack_timeout: 14,
        private: [9; private::REQ],
    }
}

#[test]
fn every_message_round_trips() {
    let msgs = [
        Msg::Req(Box::new(req())),
        Msg::Mra(1, 2, 1, 20),
        Msg::Rej(Box::new(Rej {
            local_comm_id: 3,
            remote_comm_id: 4,
            msg_rejected: 0,
            reason: reject::CONSUMER_DEFINED,
            private: [5; private::REJ],
        })),
        Msg::Rep(Box::new(Rep {
            local_comm_id: 5,
            remote_comm_id: 6,
            qpn: 0x11,
            starting_psn: 0xff_fffe,
            responder_resources: 1,
            initiator_depth: 2,
            flow_control: true,
            rnr_retry: 7,
            srq: false,
            ca_guid: 42,
            private: [7; private::REP],
        })),
        Msg::Rtu(7, 8),
        Msg::Dreq(9, 10, 0x12),
        Msg::Drep(11, 12),
        Msg::SidrReq(13, service_id(ps::UDP, 1), Box::new([3; private::SIDR_REQ])),
        Msg::SidrRep(Box::new(SidrRep {
            request_id: 13,
            status: 0,
            qpn: 0x22,
            service_id: service_id(ps::UDP, 1),
            qkey: UDP_QKEY,
            private: [4; private::SIDR_REP],
        })),
    ];
    for (i, m) in msgs.iter().enumerate() {
        let mad = m.emit(i as u64 + 100);
        assert_eq!(Msg::parse(&mad), Ok((i as u64 + 100, m.clone())), "{m:?}");
    }
}

#[test]
fn malformed_mads_are_errors() {
    let good = Msg::Req(Box::new(req())).emit(1);
    assert_eq!(Msg::parse(&good[..255]), Err(MadError::Length(255)));
    let mut bad = good;
    bad[1] = 0x04;
    assert_eq!(Msg::parse(&bad), Err(MadError::NotCm));
    let mut bad = good;
    bad[3] = 0x81;
    assert_eq!(Msg::parse(&bad), Err(MadError::Method(0x81)));
    let mut bad = good;
    bad[17] = 0x19;
    assert_eq!(Msg::parse(&bad), Err(MadError::Attribute(0x19)));
    let mut bad = good;
    bad[HDR_LEN + 50] = 0x70;
    assert!(matches!(Msg::parse(&bad), Err(MadError::Field(_))));
}

#[test]
fn ip_header_and_service_ids() {
    let h = IpHeader {
        src: Ipv4Addr::new(10, 0, 0, 1),
        src_port: 40000,
        dst: Ipv4Addr::new(10, 0, 0, 2),
    };
    let mut b = [0u8; private::REQ];
    h.emit(&mut b);
    assert_eq!(b[1], 0x40);
    assert_eq!(IpHeader::parse(&b), Some(h));
    assert_eq!(service_id(ps::TCP, 7174), 0x0000_0000_0106_1c06);
    assert_eq!(split_service_id(0x0000_0000_0111_0001), Some((ps::UDP, 1)));
    assert_eq!(split_service_id(0x1000_0000_0106_0001), None);
}
