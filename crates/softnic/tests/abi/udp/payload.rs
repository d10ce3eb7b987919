//! A packet for the UDP link leaves with its payload read from the program's memory as it
//! goes, at the end of the round that built it: a packet held back longer carries a copy
//! taken then, so that what the program writes after its WR completed never goes out.

use std::time::Duration;

use softnic::{PacketInfo, Verdict};

use super::{across, poll_until, udp_fabric};
use crate::common::*;

/// UC completes a WRITE as its last packet leaves the port. With its packets held back on
/// the way (50 ms, on the wall clock), the program overwrites the source buffer once the WR
/// completed: what lands is what the buffer held when the packets left.
#[test]
fn a_held_back_packet_carries_the_bytes_it_left_with() {
    let (a, b) = (udp_fabric(21), udp_fabric(22));
    let (na, qa, nb, qb) = across(&a, &b, ibv_qp_type::IBV_QPT_UC, 8);
    // Every UC request packet from `a` (opcodes 0x20 to 0x3f) is held back, once each.
    a.set_packet_filter(Some(Box::new(|p: &PacketInfo| {
        if (0x20..0x40).contains(&p.opcode) {
            Verdict::Delay(Duration::from_millis(50).as_nanos() as u64)
        } else {
            Verdict::Pass
        }
    })));
    const LEN: usize = 10_000; // three packets at the 4096-byte MTU
    let mut src: Vec<u8> = (0..LEN).map(|i| (i as u8).wrapping_mul(13) | 1).collect();
    let sent = src.clone();
    let mut dst = vec![0u8; LEN];
    let smr = na.reg(&mut src, LOCAL_WRITE);
    let dmr = nb.reg(&mut dst, ALL_ACCESS);
    post_recv(qb, &mut [recv_wr(1, &[])]).unwrap();
    let write = write_imm_wr(7, &src, smr, dst.as_ptr() as u64, dmr, 7);
    post_send(qa, &mut [write]).unwrap();
    let done = poll_until(na.cq, 1);
    assert!(ok(&done[0]), "{done:?}");
    // The WR completed: the buffer is the program's again.
    for b in src.iter_mut() {
        *b = 0;
    }
    let got = poll_until(nb.cq, 1);
    assert!(ok(&got[0]) && got[0].byte_len as usize == LEN, "{got:?}");
    assert!(
        dst == sent,
        "the bytes the packets left with landed, not those written after the completion"
    );
}
