//! The peers' reads this engine serves (UC, which has no RDMA READ; see `read.rs`): a peer's
//! `Ctl::Read` is checked against the export it names and answered as a message of this end's
//! own flow into the reader's receive, or refused; an export withdrawn refuses the reads of it
//! not started yet, looking only at the connections that serve reads.

use crate::cancel::Why;
use crate::config::Mode;
use crate::conn::RECV_IDS;
use crate::cts::Taken;
use crate::engine::Engine;
use crate::memory::ReadRefusal;
use crate::proto::Ctl;
use crate::read::ReadFrom;
use crate::request::Request;

impl Engine {
    /// The peer asks for a read (UC): its receive buffer `seq` is to get `len` bytes at
    /// `from` of one of this engine's exports, if that export allows it.
    pub(crate) fn serve_read(
        &mut self,
        ci: u16,
        seq: u32,
        (addr, len, rkey): (u64, u64, u32),
        from: ReadFrom,
    ) {
        let Some(c) = self.conns[usize::from(ci)].as_mut().filter(|c| c.is_open()) else {
            return;
        };
        // It takes the sequence number of an advertisement: later ones are matched after it.
        // The second of its two copies (control QP, UD QP) is dropped.
        match c.cts_order.skip(seq, &mut c.cts) {
            _ if self.cfg.mode != Mode::Uc => {
                self.stats.dropped_invalid += 1;
                return;
            }
            Taken::New => {}
            Taken::Copy => return,
            Taken::Invalid => {
                self.stats.dropped_invalid += 1;
                return;
            }
        }
        // An honest peer has at most a receive's worth of reads posted, and takes the answers.
        if c.serving >= RECV_IDS as u32 || c.ctl.backlog.len() >= 4 * RECV_IDS {
            let why = "the peer asked for more reads at once than it can have posted";
            return self.fail_conn(ci, why, true);
        }
        self.mark_ready(ci);
        let used = from
            .src
            .checked_add(len)
            .ok_or(ReadRefusal::OutOfRange)
            .and_then(|end| self.memory.read_use(from.rkey, (from.src, end)));
        let c = self.conns[usize::from(ci)].as_mut().expect("checked");
        let (use_, lkey) = match used {
            Ok(u) => u,
            Err(why) => return self.refuse_read(ci, seq, why),
        };
        let m = uccl_tx::Message {
            local_addr: from.src,
            lkey,
            len,
            remote_addr: addr,
            rkey,
        };
        let rid = (seq as usize % RECV_IDS) as u8;
        match self.tx.send_as(ci, m, rid) {
            Ok(msg) => {
                self.stats.reads_served += 1;
                // Nobody waits for it here: the reader learns of it as a receive.
                let req = Request::of_engine(&self.owner, None);
                c.track(msg, req, (len, false), use_).served = Some((from.rkey, seq));
                c.serving += 1;
                if !c.in_readers {
                    // Entries of connections gone from a slot another took stay until a look:
                    // one now and then keeps the list within twice the slots.
                    if self.readers.len() >= 2 * self.conns.len().max(8) {
                        self.each_reader(|_, _| {});
                    }
                    // (That look keeps this one if its slot was there already.)
                    if let Some(c) = self.conns[usize::from(ci)].as_mut()
                        && !c.in_readers
                    {
                        c.in_readers = true;
                        self.readers.push(ci);
                    }
                }
            }
            Err(e) => {
                tracing::warn!(conn = ci, error = %e, "serving a read failed");
                self.refuse_read(ci, seq, ReadRefusal::Withdrawn);
            }
        }
    }

    /// Tells the peer of connection `ci` that its read `seq` is refused, and why.
    fn refuse_read(&mut self, ci: u16, seq: u32, why: ReadRefusal) {
        let Some(c) = self.conns[usize::from(ci)].as_mut() else {
            return;
        };
        self.stats.reads_refused += 1;
        let no = Ctl::ReadRefused {
            seq,
            why: why as u8,
        };
        c.ctl.backlog.push_back(no.to_bytes());
        self.mark_ctl(ci);
    }

    /// The export with key `rkey` was withdrawn: the peers' reads of it this engine serves and
    /// has not started are refused; one started runs to its end (as a READ a NIC had begun
    /// does). O(messages in flight of the connections that serve reads): a control-path call,
    /// which an engine with many connections and no reads served makes in O(1).
    pub(crate) fn stop_serving(&mut self, rkey: u32) {
        self.each_reader(|e, ci| e.stop_serving_on(ci, rkey));
    }

    /// Calls `f` once for each connection in `readers` (the connections that serve reads, or
    /// did since the last look; a slot another connection took may be there twice), then
    /// keeps only those that still serve.
    fn each_reader(&mut self, mut f: impl FnMut(&mut Engine, u16)) {
        // Those that still serve are kept at the front of the same list (no allocation).
        let mut readers = std::mem::take(&mut self.readers);
        let mut kept = 0;
        for i in 0..readers.len() {
            let ci = readers[i];
            let Some(c) = self.conns[usize::from(ci)]
                .as_mut()
                .filter(|c| c.in_readers)
            else {
                continue;
            };
            c.in_readers = false;
            f(self, ci);
            if let Some(c) = self.conns[usize::from(ci)].as_ref()
                && c.is_open()
                && c.serving > 0
            {
                readers[kept] = ci;
                kept += 1;
            }
        }
        readers.truncate(kept);
        for &ci in &readers {
            if let Some(c) = self.conns[usize::from(ci)].as_mut() {
                c.in_readers = true;
            }
        }
        self.readers = readers;
    }

    /// [`stop_serving`](Self::stop_serving) on connection `ci`.
    fn stop_serving_on(&mut self, ci: u16, rkey: u32) {
        let mut msgs = std::mem::take(&mut self.scratch.msgs);
        msgs.clear();
        if let Some(c) = self.conns[usize::from(ci)].as_ref().filter(|c| c.is_open()) {
            let first = c.first_msg;
            msgs.extend(c.inflight.iter().enumerate().filter_map(|(i, m)| {
                m.as_ref()
                    .filter(|m| m.served.is_some_and(|(k, _)| k == rkey))
                    .map(|_| first + i as u64)
            }));
        }
        for &msg in &msgs {
            if self.tx.started(ci, msg) == Some(false) && self.tx.cancel(ci, msg) {
                let c = self.conns[usize::from(ci)].as_mut().expect("open");
                let m = c.message(msg).expect("tracked");
                m.withdrawn = Some(Why::Cancel);
                let seq = m.served.map_or(0, |(_, s)| s);
                self.refuse_read(ci, seq, ReadRefusal::Withdrawn);
            }
        }
        self.scratch.msgs = msgs;
    }
}

#[cfg(test)]
mod tests {
    use crate::{Access, EngineConfig, connect_pair, test_pair};

    /// The engine's list of connections that serve reads keeps within twice its connection
    /// slots, however many connections come, serve a read and go in the same slots between
    /// two withdrawals (UC).
    #[test]
    fn the_list_of_readers_stays_within_twice_the_slots() {
        let fabric = softnic::Fabric::default();
        let cfg = EngineConfig {
            max_conns: 2,
            ..EngineConfig::default()
        };
        let (mut a, mut b, ca, cb) = test_pair(&fabric, &cfg);
        let (src, dst) = (b.register(4096).unwrap(), a.register(4096).unwrap());
        let d = b.export_with(&src, 0, 4096, Access::READ).unwrap();
        let mut most = 0;
        let mut first = Some((ca, cb));
        for round in 0..40 {
            let (ca, cb) = match first.take() {
                Some(c) => c,
                None => connect_pair(&mut a, &mut b).unwrap(),
            };
            let r = a.read(ca, &dst, 0, &d, 0, 4096).unwrap();
            let mut closed = false;
            for _ in 0..100_000 {
                if r.is_done() && !closed {
                    a.close(ca).unwrap();
                    closed = true;
                }
                if closed && !a.is_open(ca) && !b.is_open(cb) {
                    break;
                }
                a.poll().unwrap();
                b.poll().unwrap();
            }
            assert!(r.test().unwrap().is_ok(), "round {round}");
            assert!(!b.is_open(cb), "round {round}");
            most = most.max(b.readers.len());
        }
        assert!(most <= 16, "{most} entries for 2 slots");
        assert!(
            most >= 8,
            "{most}: the slots' connections came and went in the list"
        );
    }
}
