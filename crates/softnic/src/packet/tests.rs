//! Round trips and refusals of the packet layer.

use super::*;
use opcode::*;

fn roundtrip(h: Headers, payload: &[u8]) {
    let mut buf = Vec::new();
    h.emit(payload, &mut buf).unwrap();
    assert_eq!(buf.len(), h.wire_len(payload.len()));
    assert_eq!(buf.len() % 4, 0);
    let p = Packet::parse(&buf).unwrap();
    assert_eq!(p.hdr, h);
    assert_eq!(p.payload, payload);
}

#[test]
fn every_layout_round_trips() {
    let reth = Some(Reth {
        va: 0x1122_3344_5566_7788,
        rkey: 0xdead_beef,
        len: 70000,
    });
    let aeth = Some(Aeth {
        syndrome: syndrome::NAK_PSN_SEQ_ERR,
        msn: 0xabcdef,
    });
    let base = Headers {
        se: true,
        pkey: 0xffff,
        dest_qp: 0x12_3456,
        ack_req: true,
        psn: 0xff_fffe,
        ..Headers::default()
    };
    roundtrip(
        Headers {
            opcode: RC_WRITE_ONLY_IMM,
            reth,
            imm: Some(0x0403_0201),
            ..base
        },
        b"hello",
    );
    roundtrip(
        Headers {
            opcode: RC_ACKNOWLEDGE,
            aeth,
            ..base
        },
        b"",
    );
    roundtrip(
        Headers {
            opcode: UC | RC_SEND_LAST_IMM,
            imm: Some(7),
            ..base
        },
        &[1, 2, 3],
    );
    roundtrip(
        Headers {
            opcode: UD_SEND_ONLY,
            deth: Some(Deth {
                qkey: 0x1111_1111,
                src_qp: 0x42,
            }),
            ..base
        },
        &[9; 33],
    );
    roundtrip(
        Headers {
            opcode: RC_READ_RESPONSE_MIDDLE,
            ..base
        },
        &[5; 256],
    );
    roundtrip(
        Headers {
            opcode: RC_SEND_FIRST,
            ..base
        },
        &[5; 256],
    );
    roundtrip(
        Headers {
            opcode: RC_SEND_ONLY_INV,
            ieth: Some(0x1234_5678),
            ..base
        },
        b"invalidate",
    );
    roundtrip(
        Headers {
            opcode: RC_SEND_LAST_INV,
            ieth: Some(7),
            ..base
        },
        &[1; 3],
    );
    roundtrip(
        Headers {
            opcode: RC_FLUSH,
            feth: Some(0x11),
            reth: Some(Reth {
                va: 0x1000,
                rkey: 9,
                len: 4096,
            }),
            ..base
        },
        &[],
    );
    roundtrip(
        Headers {
            opcode: RC_ATOMIC_WRITE,
            reth: Some(Reth {
                va: 0x2000,
                rkey: 9,
                len: 8,
            }),
            ..base
        },
        &[7; 8],
    );
    roundtrip(
        Headers {
            opcode: RC_COMPARE_SWAP,
            atomic: Some(AtomicEth {
                va: 0x1000_0008,
                rkey: 0x55,
                swap_add: u64::MAX - 1,
                compare: 0x0102_0304_0506_0708,
            }),
            ..base
        },
        b"",
    );
    roundtrip(
        Headers {
            opcode: RC_ATOMIC_ACKNOWLEDGE,
            aeth,
            atomic_ack: Some(0xfeed_face_cafe_beef),
            ..base
        },
        b"",
    );
}

#[test]
fn xrc_requests_name_their_srq_right_after_the_bth_and_responses_do_not() {
    let base = Headers {
        pkey: 0xffff,
        dest_qp: 0x12_3456,
        psn: 5,
        ..Headers::default()
    };
    let write = Headers {
        opcode: XRC | RC_WRITE_FIRST,
        xrceth: Some(0xab_cdef),
        reth: Some(Reth {
            va: 0x1000,
            rkey: 0x77,
            len: 9000,
        }),
        ..base
    };
    roundtrip(write, &[9; 1024]);
    let mut buf = Vec::new();
    write.emit(b"", &mut buf).unwrap();
    // BTH, then the XRCETH (8 reserved bits and the SRQ number), then the RETH.
    assert_eq!(buf[0], 0xa6);
    assert_eq!(buf[BTH_LEN..BTH_LEN + XRCETH_LEN], [0, 0xab, 0xcd, 0xef]);
    assert_eq!(buf[BTH_LEN + XRCETH_LEN..][..8], 0x1000u64.to_be_bytes());
    for op in [
        RC_SEND_ONLY_IMM,
        RC_READ_REQUEST,
        RC_SEND_LAST_INV,
        RC_ATOMIC_WRITE,
    ] {
        let l = layout(XRC | op).unwrap();
        assert!(l.xrceth, "{op:#x}");
        assert_eq!(
            Layout { xrceth: false, ..l },
            layout(op).unwrap(),
            "XRC's {op:#x} is RC's plus the XRCETH"
        );
    }
    roundtrip(
        Headers {
            opcode: XRC | RC_FETCH_ADD,
            xrceth: Some(1),
            atomic: Some(AtomicEth {
                va: 8,
                rkey: 2,
                swap_add: 3,
                compare: 0,
            }),
            ..base
        },
        b"",
    );
    for op in [
        RC_ACKNOWLEDGE,
        RC_READ_RESPONSE_MIDDLE,
        RC_ATOMIC_ACKNOWLEDGE,
    ] {
        assert!(!layout(XRC | op).unwrap().xrceth, "{op:#x}");
    }
    roundtrip(
        Headers {
            opcode: XRC | RC_ACKNOWLEDGE,
            aeth: Some(Aeth {
                syndrome: syndrome::ACK,
                msn: 3,
            }),
            ..base
        },
        b"",
    );
    // A request without its XRCETH is not built, and one cut short is not parsed.
    let mut buf = Vec::new();
    let bare = Headers {
        opcode: XRC | RC_SEND_ONLY,
        ..base
    };
    assert_eq!(bare.emit(b"", &mut buf), Err(WireError::HeaderMismatch));
    assert_eq!(layout(XRC | 0x1f), None);
    let mut short = Vec::new();
    Headers {
        opcode: RC_SEND_ONLY,
        ..base
    }
    .emit(b"", &mut short)
    .unwrap();
    short[0] = XRC | RC_SEND_ONLY;
    super::seal(&mut short);
    assert_eq!(Packet::parse(&short), Err(WireError::Truncated));
}

#[test]
fn mismatched_or_unknown_headers_are_refused() {
    let mut buf = Vec::new();
    let h = Headers {
        opcode: RC_WRITE_ONLY,
        ..Headers::default()
    };
    assert_eq!(h.emit(b"", &mut buf), Err(WireError::HeaderMismatch));
    let h = Headers {
        opcode: 0x1f,
        ..Headers::default()
    };
    assert_eq!(h.emit(b"", &mut buf), Err(WireError::UnknownOpcode(0x1f)));
    assert_eq!(layout(UC | RC_READ_REQUEST), None);
    assert_eq!(
        layout(UC | RC_SEND_ONLY_INV),
        None,
        "UC has no SEND with invalidate"
    );
}

#[test]
fn every_single_bit_flip_is_detected() {
    let h = Headers {
        opcode: RC_WRITE_FIRST,
        reth: Some(Reth::default()),
        psn: 5,
        ..Headers::default()
    };
    let mut buf = Vec::new();
    h.emit(&[0xa5; 64], &mut buf).unwrap();
    for bit in 0..buf.len() * 8 {
        let mut b = buf.clone();
        b[bit / 8] ^= 1 << (bit % 8);
        assert!(
            Packet::parse(&b).is_err(),
            "flip of bit {bit} went unnoticed"
        );
    }
}

#[test]
fn truncated_input_is_an_error_not_a_panic() {
    let h = Headers {
        opcode: RC_WRITE_ONLY,
        reth: Some(Reth::default()),
        ..Headers::default()
    };
    let mut buf = Vec::new();
    h.emit(b"abcd", &mut buf).unwrap();
    for n in 0..buf.len() {
        assert!(Packet::parse(&buf[..n]).is_err());
    }
}

#[test]
fn psn_arithmetic_wraps_at_24_bits() {
    assert_eq!(psn_add(PSN_MASK, 1), 0);
    assert_eq!(psn_diff(0, PSN_MASK), 1);
    assert_eq!(psn_diff(PSN_MASK, 0), -1);
    assert_eq!(psn_diff(10, 3), 7);
}
