//! A run in progress: every flow's requests completed and posted, round by round, and
//! whether (and where) the run is done.

use indicatif::ProgressBar;
use uccl_engine::{Engine, Opts};

use super::flow::{Flow, Payload};
use crate::args::{Args, OpArg};

/// Two processes, `--op read|readv`: the bytes of a notice that a message is ready (its number),
/// and where notices lie in the small buffer of each end (after the export's descriptor).
pub(super) const NOTICE: u64 = 8;
pub(super) const NOTICES_AT: u64 = 64;

/// A run in progress.
pub(super) struct Run<'a> {
    pub(super) args: &'a Args,
    /// The message size.
    pub(super) msg: u64,
    /// Messages per flow in flight.
    pub(super) window: u64,
    /// Messages per flow (`u64::MAX` until `--duration` runs out).
    pub(super) limit: u64,
    /// Two processes: a message of [`Run::marker_len`] bytes ends each flow.
    pub(super) marker: bool,
    /// The end-of-flow message's length: 0 bytes, or 1 when messages have none (receives
    /// then take up to 1 byte, so that the two can be told apart).
    pub(super) marker_len: u64,
    pub(super) flows: Vec<Flow>,
    pub(super) engines: Vec<Engine>,
    /// The device of each engine, for messages and counters.
    pub(super) names: Vec<String>,
    /// The fabric whose virtual clock this run moves (softnic).
    pub(super) fabric: Option<softnic::Fabric>,
    /// The payload written and checked.
    pub(super) payload: Payload<'a>,
    /// Wall time in softnic's event loop, which the driver runs between rounds on the virtual
    /// clock: the simulated NIC's work (moving packets, writing completions), which a real NIC
    /// does in hardware.
    pub(super) nic_time: std::time::Duration,
    /// Messages received, over every flow.
    pub(super) received: u64,
    /// Messages whose send completed, over every flow.
    pub(super) sent: u64,
    /// The progress bar (shown after a second, on a terminal).
    pub(super) bar: ProgressBar,
    /// The blocks of a vectored message being posted (reused).
    pub(super) blocks: Vec<uccl_engine::Block>,
    /// The steady state of a run on switches or an incast (see [`super::congestion`]).
    pub(super) steady: Option<super::congestion::Steady>,
}

impl Run<'_> {
    /// Completes and posts what it can on every flow; whether anything changed.
    pub(super) fn step(&mut self) -> Result<bool, String> {
        let mut progress = self.take_notes()?;
        for i in 0..self.flows.len() {
            progress |= self.step_rx(i)?;
            progress |= self.step_tx(i)?;
        }
        if progress {
            self.bar.set_position(match self.limit {
                u64::MAX => self.received,
                _ => self.received.max(self.sent),
            });
        }
        Ok(progress)
    }

    /// Completes the receives of flow `i` that are done, checking each message, and posts
    /// receives up to the window; whether anything changed.
    fn step_rx(&mut self, i: usize) -> Result<bool, String> {
        let mut progress = false;
        let (msg, window, limit, marker) = (self.msg, self.window, self.limit, self.marker);
        let marker_len = self.marker_len;
        let Some(rx) = self.flows[i].rx.as_mut() else {
            return Ok(false);
        };
        if rx.desc.is_some() {
            // One-sided: nothing completes at the receiver; the writer's completion says the
            // bytes are in place (in process), or its note does (two processes).
            return match (marker, self.args.op.reads()) {
                (true, false) => self.step_noted_rx(i),
                (true, true) => self.step_reading_rx(i),
                (false, _) => Ok(false),
            };
        }
        let id = self.flows[i].id;
        // Once the flow ended, the receives posted after its end-of-flow message are not
        // looked at: nothing comes for them, and the client's close fails them.
        while let Some((m, r)) = self.flows[i]
            .rx
            .as_ref()
            .filter(|rx| !rx.ended)
            .and_then(|rx| rx.reqs.front())
        {
            let m = *m;
            let Some(res) = r.test() else { break };
            let done =
                res.map_err(|e| format!("flow {id} message {m}: the receive failed: {e}"))?;
            self.flows[i].rx.as_mut().expect("rx").reqs.pop_front();
            progress = true;
            if marker && done.len == marker_len {
                self.flows[i].rx.as_mut().expect("rx").ended = true;
                break;
            }
            if done.len != msg {
                return Err(format!(
                    "flow {id} message {m}: {} bytes arrived, {msg} were sent",
                    done.len
                ));
            }
            self.payload.verify(&self.flows[i], m)?;
            self.flows[i].rx.as_mut().expect("rx").received += 1;
            self.received += 1;
        }
        let rx = self.flows[i].rx.as_mut().expect("rx");
        while !rx.ended && rx.next_post < rx.received + window && (marker || rx.next_post < limit) {
            let m = rx.next_post;
            let off = (m % window) * msg;
            let r = self.engines[rx.engine]
                .recv(rx.conn, &rx.dst, off, msg.max(marker_len))
                .map_err(|e| format!("flow {id} message {m}: posting the receive: {e}"))?;
            rx.reqs.push_back((m, r));
            rx.next_post += 1;
            progress = true;
        }
        Ok(progress)
    }

    /// Completes the sends (or writes) of flow `i` that are done, posts more up to the window,
    /// then the end marker once every message is sent; whether anything changed.
    fn step_tx(&mut self, i: usize) -> Result<bool, String> {
        let mut progress = false;
        let (msg, window, limit, marker) = (self.msg, self.window, self.limit, self.marker);
        let id = self.flows[i].id;
        if self.flows[i].tx.is_none() {
            return Ok(false);
        }
        while let Some((m, r)) = self.flows[i].tx.as_ref().and_then(|t| t.reqs.front()) {
            let m = *m;
            let Some(res) = r.test() else { break };
            let what = match self.args.op {
                OpArg::Send => "send",
                OpArg::Write => "write",
                OpArg::Read => "read",
                OpArg::Writev => "write_v",
                OpArg::Readv => "read_v",
            };
            let done = res.map_err(|e| match m {
                u64::MAX => format!("flow {id}: the end-of-flow message failed: {e}"),
                _ => format!("flow {id} message {m}: the {what} failed: {e}"),
            })?;
            self.flows[i].tx.as_mut().expect("tx").reqs.pop_front();
            progress = true;
            if m == u64::MAX {
                self.flows[i].tx.as_mut().expect("tx").marker_done = true;
                continue;
            }
            // Two processes, `--op read|readv`: what completes here is the message's notice.
            let notice = self.marker && self.args.op.reads();
            let expect = if notice { NOTICE } else { msg };
            if done.len != expect {
                return Err(format!(
                    "flow {id} message {m}: the {what} moved {} bytes of {expect}",
                    done.len
                ));
            }
            if what != "send" && self.flows[i].rx.is_some() {
                // In process: the write is acknowledged (the read complete), so every byte is
                // in place.
                self.payload.verify(&self.flows[i], m)?;
                self.flows[i].rx.as_mut().expect("rx").received += 1;
                self.received += 1;
            }
            self.flows[i].tx.as_mut().expect("tx").completed += 1;
            self.sent += 1;
            self.note_completed(i, m);
        }
        progress |= self.take_credits(i)?;
        loop {
            let tx = self.flows[i].tx.as_ref().expect("tx");
            let m = tx.next;
            // Two processes, `--op write`: a slot is free once the receiver handed it back, and
            // the engine takes MAX_NOTED notified writes at once.
            let (freed, window) = match &tx.remote {
                Some((_, c)) => (
                    c.got.min(tx.completed),
                    window.min(u64::from(uccl_engine::MAX_NOTED)),
                ),
                None => (tx.completed, window),
            };
            if m >= limit || m >= freed + window {
                break;
            }
            self.payload.fill(&self.flows[i], m)?;
            let off = (m % window) * msg;
            let f = &mut self.flows[i];
            let tx = f.tx.as_mut().expect("tx");
            let r = match (self.args.op, f.rx.as_ref()) {
                (OpArg::Write, Some(rx)) => {
                    let desc = rx.desc.as_ref().expect("exported");
                    self.engines[tx.engine].write(tx.conn, &tx.src, off, msg, desc, off)
                }
                // The receiver reads what the sender filled.
                (OpArg::Read, Some(rx)) => {
                    let desc = rx.desc.as_ref().expect("exported");
                    self.engines[rx.engine].read(rx.conn, &rx.dst, off, desc, off, msg)
                }
                (OpArg::Writev, Some(rx)) => {
                    let desc = rx.desc.as_ref().expect("exported");
                    let sc = self.payload.scatter().expect("vectored");
                    sc.blocks((&tx.src, off), (desc, off), &mut self.blocks);
                    self.engines[tx.engine].write_v(tx.conn, &self.blocks)
                }
                (OpArg::Readv, Some(rx)) => {
                    let desc = rx.desc.as_ref().expect("exported");
                    let sc = self.payload.scatter().expect("vectored");
                    sc.blocks((&rx.dst, off), (desc, off), &mut self.blocks);
                    self.engines[rx.engine].read_v(rx.conn, &self.blocks)
                }
                // Two processes: the note tells the receiver which message is in place.
                (OpArg::Write, None) => {
                    let (desc, _) = tx.remote.as_ref().expect("the receiver's export");
                    let note = Opts::default().note(&m.to_le_bytes()).expect("8 bytes");
                    self.engines[tx.engine].write_with(tx.conn, &tx.src, off, msg, desc, off, note)
                }
                // Two processes: the receiver reads the message once told it is ready.
                (OpArg::Read | OpArg::Readv, None) => {
                    let (_, c) = tx.remote.as_ref().expect("two processes");
                    let at = NOTICES_AT + (m % window) * NOTICE;
                    c.buf
                        .write_at(at as usize, &m.to_le_bytes())
                        .map_err(|e| format!("flow {id} message {m}: {e}"))?;
                    self.engines[tx.engine].send(tx.conn, &c.buf, at, NOTICE)
                }
                (OpArg::Writev, None) => {
                    let (desc, _) = tx.remote.as_ref().expect("the receiver's export");
                    let note = Opts::default().note(&m.to_le_bytes()).expect("8 bytes");
                    let sc = self.payload.scatter().expect("vectored");
                    sc.blocks((&tx.src, off), (desc, off), &mut self.blocks);
                    self.engines[tx.engine].write_v_with(tx.conn, &self.blocks, note)
                }
                _ => self.engines[tx.engine].send(tx.conn, &tx.src, off, msg),
            }
            .map_err(|e| format!("flow {id} message {m}: posting: {e}"))?;
            tx.reqs.push_back((m, r));
            tx.next += 1;
            progress = true;
            self.note_posted(i, m);
        }
        let tx = self.flows[i].tx.as_mut().expect("tx");
        // The end, once every message is out and (two processes, one-sided) every slot was
        // handed back: the receiver is done with this end's memory.
        let handed_back = tx.remote.as_ref().is_none_or(|(_, c)| c.got >= limit);
        if marker && !tx.marker_sent && tx.next == limit && tx.completed == limit && handed_back {
            let r = self.engines[tx.engine]
                .send(tx.conn, &tx.src, 0, self.marker_len)
                .map_err(|e| format!("flow {id}: posting the end-of-flow message: {e}"))?;
            tx.reqs.push_back((u64::MAX, r));
            tx.marker_sent = true;
            progress = true;
        }
        Ok(progress)
    }

    /// Two processes, `--op write`, the receiver: the notes of the writes that landed (each
    /// names its message), each message checked in its slot and the slot handed back (a 0-byte
    /// send); whether any came.
    fn take_notes(&mut self) -> Result<bool, String> {
        if !self.marker || !self.args.op.notes() {
            return Ok(false);
        }
        let mut progress = false;
        for e in 0..self.engines.len() {
            let notes = self.engines[e].notifications();
            while let Some(n) = notes.pop() {
                progress = true;
                let i = self
                    .flows
                    .iter()
                    .position(|f| f.rx.as_ref().is_some_and(|r| r.conn == n.conn))
                    .ok_or_else(|| format!("a note on no flow of this run ({:?})", n.conn))?;
                let id = self.flows[i].id;
                let rx = self.flows[i].rx.as_ref().expect("found");
                let m = <[u8; 8]>::try_from(&n.data[..])
                    .map(u64::from_le_bytes)
                    .map_err(|_| format!("flow {id}: a note of {} bytes", n.data.len()))?;
                if m != rx.received {
                    return Err(format!(
                        "flow {id}: the note of message {m} came when {} was due",
                        rx.received
                    ));
                }
                self.payload.verify(&self.flows[i], m)?;
                let rx = self.flows[i].rx.as_mut().expect("found");
                rx.received += 1;
                self.received += 1;
                let (buf, sends) = rx.credits.as_mut().expect("two processes, --op write");
                let r = self.engines[rx.engine]
                    .send(rx.conn, buf, 0, 0)
                    .map_err(|e| format!("flow {id} message {m}: handing the slot back: {e}"))?;
                sends.push_back(r);
            }
        }
        Ok(progress)
    }

    /// Two processes, `--op write`, the receiver of flow `i`: the slots handed back (their
    /// sends completing), and the end marker's receive; whether anything changed.
    fn step_noted_rx(&mut self, i: usize) -> Result<bool, String> {
        let id = self.flows[i].id;
        let rx = self.flows[i].rx.as_mut().expect("rx");
        if rx.ended {
            // The sender is done: the slots' hand-backs in flight no longer matter (its close
            // fails them).
            return Ok(false);
        }
        let (buf, sends) = rx.credits.as_mut().expect("two processes, --op write");
        let mut progress = false;
        while let Some(r) = sends.front() {
            match r.test() {
                None => break,
                Some(Ok(_)) => {
                    sends.pop_front();
                    progress = true;
                }
                Some(Err(e)) => return Err(format!("flow {id}: handing a slot back failed: {e}")),
            }
        }
        if let Some((_, r)) = rx.reqs.front()
            && let Some(res) = r.test()
        {
            res.map_err(|e| format!("flow {id}: the end-of-flow message failed: {e}"))?;
            rx.reqs.pop_front();
            rx.ended = true;
            return Ok(true);
        }
        if rx.reqs.is_empty() && !rx.ended {
            let r = self.engines[rx.engine]
                .recv(rx.conn, buf, 0, 1)
                .map_err(|e| format!("flow {id}: posting the end-of-flow receive: {e}"))?;
            rx.reqs.push_back((u64::MAX, r));
            progress = true;
        }
        Ok(progress)
    }

    /// Two processes, `--op read|readv`, the reader of flow `i`: notices of messages ready (a
    /// receive each, in order), the read of each message ready, each read checked when it
    /// completes and its slot handed back, and the end marker; whether anything changed.
    fn step_reading_rx(&mut self, i: usize) -> Result<bool, String> {
        let (msg, window, id) = (self.msg, self.window, self.flows[i].id);
        let mut progress = false;
        // Reads complete in order of notice: each checked, its slot handed back.
        loop {
            let rx = self.flows[i].rx.as_mut().expect("rx");
            let Some((m, r)) = rx.reads.front() else {
                break;
            };
            let Some(res) = r.test() else { break };
            let m = *m;
            res.map_err(|e| format!("flow {id} message {m}: the read failed: {e}"))?;
            rx.reads.pop_front();
            self.payload.verify(&self.flows[i], m)?;
            let rx = self.flows[i].rx.as_mut().expect("rx");
            rx.received += 1;
            self.received += 1;
            let (buf, sends) = rx.credits.as_mut().expect("two processes");
            let r = self.engines[rx.engine]
                .send(rx.conn, buf, 0, 0)
                .map_err(|e| format!("flow {id} message {m}: handing the slot back: {e}"))?;
            sends.push_back(r);
            progress = true;
        }
        let marker_len = self.marker_len;
        let rx = self.flows[i].rx.as_mut().expect("rx");
        if rx.ended {
            // Only the reads in flight matter now (above): the sender is done, and its close
            // fails the hand-backs in flight and the notices posted after its end.
            return Ok(progress);
        }
        let (buf, sends) = rx.credits.as_mut().expect("two processes");
        while let Some(r) = sends.front() {
            match r.test() {
                None => break,
                Some(Ok(_)) => {
                    sends.pop_front();
                }
                Some(Err(e)) => return Err(format!("flow {id}: handing a slot back failed: {e}")),
            }
        }
        // Notices, in order: the k-th names message k.
        while let Some((k, r)) = rx.reqs.front() {
            let k = *k;
            let Some(res) = r.test() else { break };
            let done = res.map_err(|e| format!("flow {id}: a notice failed: {e}"))?;
            rx.reqs.pop_front();
            progress = true;
            if done.len == marker_len {
                rx.ended = true;
                break;
            }
            let mut b = [0u8; NOTICE as usize];
            let at = NOTICES_AT + (k % window) * NOTICE;
            buf.read_at(at as usize, &mut b)
                .map_err(|e| format!("flow {id}: {e}"))?;
            if done.len != NOTICE || u64::from_le_bytes(b) != k {
                return Err(format!(
                    "flow {id}: notice {k} is garbled ({} bytes)",
                    done.len
                ));
            }
            let desc = rx.desc.as_ref().expect("the sender's export");
            let off = (k % window) * msg;
            let e = &mut self.engines[rx.engine];
            let r = match self.payload.scatter() {
                Some(sc) => {
                    sc.blocks((&rx.dst, off), (desc, off), &mut self.blocks);
                    e.read_v(rx.conn, &self.blocks)
                }
                None => e.read(rx.conn, &rx.dst, off, desc, off, msg),
            }
            .map_err(|e| format!("flow {id} message {k}: reading: {e}"))?;
            rx.reads.push_back((k, r));
        }
        // On UC each block read takes a receive's id (128 a connection, in order): notices
        // posted far ahead would hold ids the reads before them wait for.
        let ahead = match self.args.transport {
            crate::args::TransportArg::Uc => {
                let per_msg = 1 + if self.args.op.vectored() {
                    u64::from(self.args.iov)
                } else {
                    1
                };
                (96 / per_msg).clamp(1, window)
            }
            crate::args::TransportArg::Rc => window,
        };
        while !rx.ended && rx.next_post < rx.received + ahead {
            let k = rx.next_post;
            let at = NOTICES_AT + (k % window) * NOTICE;
            let r = match self.engines[rx.engine].recv(rx.conn, buf, at, NOTICE) {
                Ok(r) => r,
                // On UC the reads in flight hold receive slots too: post it later.
                Err(uccl_engine::EngineError::Limit { .. }) => break,
                Err(e) => return Err(format!("flow {id}: posting a notice's receive: {e}")),
            };
            rx.reqs.push_back((k, r));
            rx.next_post += 1;
            progress = true;
        }
        Ok(progress)
    }

    /// Two processes, `--op write`, the sender of flow `i`: the slots the receiver handed back,
    /// and receives posted for the next ones; whether anything changed.
    fn take_credits(&mut self, i: usize) -> Result<bool, String> {
        let (id, window, limit) = (self.flows[i].id, self.window, self.limit);
        let tx = self.flows[i].tx.as_mut().expect("tx");
        let Some((_, c)) = tx.remote.as_mut() else {
            return Ok(false);
        };
        let mut progress = false;
        while let Some(r) = c.reqs.front() {
            match r.test() {
                None => break,
                Some(Ok(_)) => {
                    c.reqs.pop_front();
                    c.got += 1;
                    progress = true;
                }
                Some(Err(e)) => return Err(format!("flow {id}: a slot handed back failed: {e}")),
            }
        }
        while c.posted < limit && (c.reqs.len() as u64) < window {
            let r = self.engines[tx.engine]
                .recv(tx.conn, &c.buf, 0, 1)
                .map_err(|e| format!("flow {id}: posting a receive for a slot: {e}"))?;
            c.reqs.push_back(r);
            c.posted += 1;
            progress = true;
        }
        Ok(progress)
    }

    /// Whether every flow is done at this end.
    pub(super) fn done(&self) -> bool {
        self.flows.iter().all(|f| {
            let tx_done =
                f.tx.as_ref()
                    .is_none_or(|t| t.completed == self.limit && (!self.marker || t.marker_done));
            let rx_done = f.rx.as_ref().is_none_or(|r| {
                if self.marker {
                    r.ended && r.reads.is_empty()
                } else {
                    r.received == self.limit
                }
            });
            tx_done && rx_done
        })
    }

    /// The first message not in yet, for a report of what is missing.
    pub(super) fn missing(&self) -> String {
        for f in &self.flows {
            if let Some(r) = &f.rx
                && !self.marker
                && r.received < self.limit
            {
                return format!(
                    "flow {}: message {} of {} never arrived",
                    f.id, r.received, self.limit
                );
            }
            if let Some(t) = &f.tx
                && t.completed < self.limit
            {
                return format!(
                    "flow {}: message {} of {} was never acknowledged",
                    f.id, t.completed, self.limit
                );
            }
            if let Some(r) = &f.rx
                && self.marker
                && !r.ended
            {
                return format!(
                    "flow {}: the sender never ended the flow ({} messages in)",
                    f.id, r.received
                );
            }
        }
        "nothing is missing".into()
    }

    /// Stops sending new messages (`--duration` ran out): each flow ends after what it has
    /// posted; every flow sends as many as the one furthest ahead, so they stay equal.
    pub(super) fn stop(&mut self) {
        let most = self
            .flows
            .iter()
            .filter_map(|f| f.tx.as_ref().map(|t| t.next))
            .max()
            .unwrap_or(0);
        self.limit = most;
    }
}
