//! Issue 10, item 6: the work of the hot path does not grow with the number of open flows.
//! Test builds count inner-loop steps (flows visited by `poll_transmit`, chunks acknowledged
//! or declared lost, timer entries handled); per chunk sent they must stay flat from 1 to 4096
//! open flows, whether the other flows are idle or busy.

use bufpool::{Region, RegionPool};

use crate::wire::AckRepr;
use crate::{Message, PathId, Tx, TxConfig};

/// Steps per chunk with `open` flows open, `busy` of them sending a 64-chunk message.
fn steps_per_chunk(open: u16, busy: u16) -> u64 {
    let hdrs = RegionPool::new(Region::for_slots(16, 16, 64).unwrap(), 16, 1).unwrap();
    let cfg = TxConfig {
        chunk_size: 100,
        wr_pool: 1 << 15,
        engine_window: 1 << 20,
        ..TxConfig::default()
    };
    let mut t = Tx::new(cfg, hdrs).unwrap();
    let paths: Vec<PathId> = (0..16).map(|_| t.add_path(1024).unwrap()).collect();
    for f in 0..open {
        let i = usize::from(f) % 16;
        t.open_flow(f, &[paths[i], paths[(i + 1) % 16]], 256)
            .unwrap();
    }
    for f in 0..busy {
        let m = Message {
            local_addr: u64::from(f) << 16,
            lkey: 1,
            len: 6400,
            remote_addr: 0x10_0000,
            rkey: 2,
        };
        t.send(f, m).unwrap();
    }
    t.work = 0;
    let mut now = 0;
    let mut cum = vec![0u16; usize::from(open)];
    loop {
        now += 1000;
        let mut signaled = Vec::new();
        let mut chunks = 0;
        let mut out = t.poll_transmit(now);
        while let Some(c) = out.next_chain() {
            chunks += c.len();
            for w in c.wrs() {
                // No loss: each flow's chunks go out in order; the data address names the flow.
                cum[(w.sges[0].addr >> 16) as usize] += 1;
                if w.wr.send_flags != 0 {
                    signaled.push(w.wr.wr_id);
                }
            }
            let n = c.len();
            c.posted(n);
        }
        drop(out);
        if chunks == 0 {
            break;
        }
        for id in signaled {
            t.on_send_completion(id, true);
        }
        for (fid, &c) in cum.iter().enumerate().filter(|(_, c)| **c > 0) {
            if t.flow_info(fid as u16).unwrap().span == 0 {
                continue;
            }
            let ack = AckRepr {
                fid: fid as u16,
                cum: c,
                echo: c - 1,
                credit: 256,
                ..AckRepr::default()
            };
            t.on_ack(now + 10, &ack);
        }
        let _ = t.poll_timeout();
        t.handle_timeout(now + 20);
    }
    assert_eq!(t.stats().chunks, 64 * u64::from(busy));
    t.work / t.stats().chunks
}

#[test]
fn work_per_chunk_does_not_grow_with_open_flows() {
    let one = steps_per_chunk(1, 1);
    let idle = steps_per_chunk(4096, 1);
    let busy = steps_per_chunk(4096, 4096);
    assert!(
        idle <= one + 1 && busy <= one + 1,
        "steps per chunk: 1 flow {one}, 4096 open with 1 busy {idle}, 4096 busy {busy}"
    );
}
