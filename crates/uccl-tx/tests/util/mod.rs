//! Helpers of the exact scenarios: a transmit side, messages, and posting what it hands out
//! while reading back every WR.

#![allow(dead_code, unreachable_pub)]

use bufpool::{Region, RegionPool};
use uccl_tx::wire::{AckRepr, Imm, RetrHdrRepr};
use uccl_tx::{Event, Message, PathId, Tx, TxConfig};
use verbs_safe::WrSlot;
use verbs_safe::sys::{ibv_send_flags, ibv_wr_opcode};

pub const HDR_LKEY: u32 = 0x77;

pub fn tx(cfg: TxConfig) -> Tx {
    let hdrs = RegionPool::new(Region::for_slots(16, 8, 64).unwrap(), 16, HDR_LKEY).unwrap();
    Tx::new(cfg, hdrs).unwrap()
}

/// The configuration most scenarios start from: 100-byte chunks.
pub fn chunks_of_100() -> TxConfig {
    TxConfig {
        chunk_size: 100,
        ..TxConfig::default()
    }
}

/// A transmit side with `cfg` and flow 1 open, with a credit of 256, on one 64-deep path.
pub fn one_path(cfg: TxConfig) -> (Tx, PathId) {
    let mut t = tx(cfg);
    let p = t.add_path(64).unwrap();
    t.open_flow(1, &[p], 256).unwrap();
    (t, p)
}

pub fn msg(len: u64) -> Message {
    Message {
        local_addr: 0x1000,
        lkey: 5,
        len,
        remote_addr: 0x8000_0000,
        rkey: 6,
    }
}

/// A WR as it was handed out.
#[derive(Debug, Clone, Copy)]
pub struct Wr {
    pub path: PathId,
    pub wr_id: u64,
    pub opcode: u32,
    pub signaled: bool,
    /// The chunk's immediate (from the WR, or from the header of a retransmission).
    pub imm: Imm,
    pub remote: u64,
    /// The payload SGE: (addr, length, lkey).
    pub data: (u64, u32, u32),
    pub hdr: Option<RetrHdrRepr>,
    pub num_sge: i32,
}

pub fn read(path: PathId, w: &WrSlot<2>, hdr: Option<RetrHdrRepr>) -> Wr {
    let write = w.wr.opcode == ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
    // SAFETY: a WRITE_WITH_IMM's immediate union member is a plain u32.
    let imm = write.then(|| u32::from_be(unsafe { w.wr.__bindgen_anon_1.imm_data }));
    // SAFETY: RDMA WRITEs carry the `rdma` union member (plain data).
    let remote = unsafe { w.wr.wr.rdma.remote_addr };
    let n = w.wr.num_sge as usize;
    let sge = w.sges[n.saturating_sub(1)];
    Wr {
        path,
        wr_id: w.wr.wr_id,
        opcode: w.wr.opcode,
        signaled: w.wr.send_flags & ibv_send_flags::IBV_SEND_SIGNALED.0 != 0,
        imm: Imm::decode(imm.or(hdr.map(|h| h.imm)).unwrap_or(0)),
        remote: hdr.map_or(remote, |h| h.remote_addr),
        data: (sge.addr, sge.length, sge.lkey),
        hdr,
        num_sge: w.wr.num_sge,
    }
}

/// Polls once and posts every chain; returns the WRs and the chain lengths.
pub fn post_all(t: &mut Tx, now: u64) -> (Vec<Wr>, Vec<u32>) {
    post_with(t, now, |_, len| len)
}

/// Polls once; `accept(path, len)` says how many WRs of each chain the provider accepts.
pub fn post_with(
    t: &mut Tx,
    now: u64,
    mut accept: impl FnMut(PathId, u32) -> u32,
) -> (Vec<Wr>, Vec<u32>) {
    let (mut wrs, mut lens) = (Vec::new(), Vec::new());
    let mut out = t.poll_transmit(now);
    while let Some(c) = out.next_chain() {
        let n = accept(c.path(), c.len());
        let all: Vec<Wr> = c
            .wrs()
            .map(|w| read(c.path(), w, c.retransmission_header(w)))
            .collect();
        assert_eq!(all.len() as u32, c.len());
        wrs.extend_from_slice(&all[..n as usize]);
        lens.push(c.len());
        c.posted(n);
    }
    (wrs, lens)
}

/// Feeds the completion of every signaled WR in `wrs`.
pub fn complete(t: &mut Tx, wrs: &[Wr]) {
    for w in wrs.iter().filter(|w| w.signaled) {
        t.on_send_completion(w.wr_id, true);
    }
}

pub fn ack(fid: u16, cum: u16, echo: u16) -> AckRepr {
    AckRepr {
        fid,
        cum,
        echo,
        credit: 256,
        ..AckRepr::default()
    }
}

/// An ACK of flow `fid` granting `credit`.
pub fn ack_granting(fid: u16, cum: u16, echo: u16, credit: u16) -> AckRepr {
    AckRepr {
        credit,
        ..ack(fid, cum, echo)
    }
}

pub fn events(t: &mut Tx) -> Vec<Event> {
    std::iter::from_fn(|| t.poll_event()).collect()
}
