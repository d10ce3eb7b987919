//! The connections' control QPs (receive-buffer advertisements, refusals, closes, ACKs in RC
//! mode and in UC mode while the peer's engine asks so)
//! and teardown: failing a connection, telling its peer, and freeing it once its flushes are
//! polled.

use crate::config::Mode;
use crate::conn::State;
use crate::cts::{Cts, Taken};
use crate::engine::Engine;
use crate::error::EngineError;
use crate::proto::{CTL_LEN, CTL_PACK, Ctl, ctl_pack};
use crate::round::Cqe;

/// A failed completion's status, for an error message.
fn status(e: &Cqe) -> String {
    e.status
        .map_or_else(|| "an unknown status".to_string(), |s| format!("{s:?}"))
}

/// Why the requests of a connection this end closed fail.
pub(crate) const CLOSED_HERE: &str = "closed by this end";

impl Engine {
    /// A SEND on connection `ci`'s control QP: its messages, in order (see
    /// [`CTL_PACK`]).
    pub(crate) fn on_ctl(&mut self, ci: u16, slot: u32, e: Cqe, now: u64) {
        let Some(c) = self.conns.get_mut(usize::from(ci)).and_then(Option::as_mut) else {
            return;
        };
        c.ctl.recv.owed.push(slot);
        self.mark_ctl(ci);
        let c = self.conns[usize::from(ci)].as_mut().expect("checked");
        if !e.ok {
            if c.is_open() {
                let why = format!("a receive of its control QP failed ({})", status(&e));
                self.fail_conn(ci, why, false);
            }
            return;
        }
        c.heard = now;
        let mut b = [0u8; CTL_PACK * CTL_LEN];
        let len = e.byte_len as usize;
        let msgs = (len <= b.len() && c.ctl.recv.read(slot, 0, &mut b[..len]))
            .then(|| ctl_pack(&b[..len]))
            .flatten();
        let Some(msgs) = msgs else {
            self.stats.dropped_invalid += 1;
            return;
        };
        let open = |e: &Self| {
            e.conns[usize::from(ci)]
                .as_ref()
                .is_some_and(|c| c.is_open())
        };
        let was_open = open(self);
        for m in msgs {
            // A message that ends the connection ends the SEND: what follows it is dropped.
            if was_open && !open(self) {
                return;
            }
            self.on_ctl_msg(ci, Ctl::parse(m), now);
        }
    }

    /// One message of a SEND on connection `ci`'s control QP (`None`: malformed).
    fn on_ctl_msg(&mut self, ci: u16, msg: Option<Ctl>, now: u64) {
        let Some(c) = self.conns[usize::from(ci)].as_mut() else {
            return;
        };
        match msg {
            Some(m @ (Ctl::Cts { .. } | Ctl::Read { .. })) => self.take_advert(ci, m, now),
            Some(Ctl::NeedCts { seq }) if self.cfg.mode == Mode::Uc => self.on_need_cts(ci, seq),
            Some(Ctl::Refuse { seq, len }) => {
                let i = seq as usize % crate::conn::RECV_IDS;
                match c.recvs[i]
                    .as_ref()
                    .filter(|r| r.seq == seq && r.ending.is_none())
                {
                    Some(r) => {
                        let room = r.len;
                        self.end_recv(ci, i, Err(EngineError::TooLarge { len, room }));
                    }
                    None => self.stats.dropped_invalid += 1,
                }
            }
            // RC mode's ACKs, and UC mode's that this end asked for (see `acks.rs`); from the
            // connection's own peer, so checked as any.
            Some(Ctl::Ack(ack)) => self.on_ack(ack, crate::acks::AckSource::Conn(ci), now),
            Some(Ctl::Close) => self.fail_conn(ci, "the peer closed it", false),
            Some(Ctl::Unplaceable { csn, remote, rkey }) => {
                if self.tx.chunk_target(ci, csn) == Some((remote, rkey)) {
                    let why = format!(
                        "the peer refused a chunk of a send or write from this end: it names \
                         memory the peer did not offer (address {remote:#x}, rkey {rkey:#x}: a \
                         wrong descriptor, or an export withdrawn)"
                    );
                    self.fail_conn(ci, why, true);
                } else {
                    // Not where this end sent it: a forged frame's header, or a stale note.
                    self.stats.dropped_invalid += 1;
                }
            }
            Some(Ctl::Ping) => {}
            Some(Ctl::Withdraw { seq }) => self.on_withdraw(ci, seq),
            Some(Ctl::Withdrawn { seq, ok }) => self.on_withdrawn(ci, seq, ok),
            Some(Ctl::ReadRefused { seq, why }) => self.on_read_refused(ci, seq, why),
            Some(Ctl::Note {
                serial,
                last,
                len,
                data,
            }) => self.on_note(ci, serial, last, &data[..usize::from(len)]),
            _ => self.stats.dropped_invalid += 1,
        }
    }

    /// What takes a sequence number of connection `ci`'s advertisements, from its control QP
    /// or over the UD QP (UC advertisements, or copies): a receive buffer (`Ctl::Cts`), or a
    /// read to serve (`Ctl::Read`). Anything else is dropped.
    pub(crate) fn take_advert(&mut self, ci: u16, msg: Ctl, now: u64) {
        match msg {
            Ctl::Cts {
                seq,
                addr,
                len,
                rkey,
            } => {
                let cts = Cts {
                    seq,
                    addr,
                    len,
                    rkey,
                };
                self.take_cts(ci, cts, now);
            }
            Ctl::Read {
                seq,
                addr,
                len,
                rkey,
                src,
                src_rkey,
            } => {
                let from = crate::read::ReadFrom {
                    src,
                    rkey: src_rkey,
                };
                self.serve_read(ci, seq, (addr, len, rkey), from);
            }
            _ => self.stats.dropped_invalid += 1,
        }
    }

    /// The peer's advertisement `cts` on connection `ci`, from its control QP or over the UD
    /// QP: taken in order, once (see [`crate::cts`]); one taken ahead of its turn on UC has the
    /// ones before it asked for (see `need.rs`).
    pub(crate) fn take_cts(&mut self, ci: u16, cts: Cts, now: u64) {
        let Some(c) = self.conns[usize::from(ci)].as_mut() else {
            return;
        };
        match c.cts_order.take(cts, &mut c.cts) {
            Taken::New => {
                self.mark_ready(ci);
                // UC: one taken ahead of its turn shows the ones before it lost (asked for);
                // the ask timer's quick interval comes back.
                self.check_cts(ci, true, now);
            }
            Taken::Copy => {}
            // More advertisements than a peer can have outstanding: a broken peer.
            Taken::Invalid => self.stats.dropped_invalid += 1,
        }
    }

    /// A send of connection `ci`'s control QP completed.
    pub(crate) fn on_ctl_sent(&mut self, ci: u16, slot: u32, e: Cqe) {
        let Some(c) = self.conns.get_mut(usize::from(ci)).and_then(Option::as_mut) else {
            return;
        };
        c.ctl.send.give_back(slot);
        c.ctl.completions += 1;
        c.ctl.probed = false;
        let closing = c.ctl.close_slot == Some(slot);
        if closing && !c.is_open() {
            // The peer has been told (or could not be): the control QP can go now.
            c.ctl.shut();
        } else if !e.ok && c.is_open() {
            let why = format!(
                "a send of its control QP failed ({}: the peer is gone?)",
                status(&e)
            );
            self.fail_conn(ci, why, false);
        } else if closing && c.is_open() {
            self.fail_conn(ci, CLOSED_HERE, false);
        } else {
            self.mark_ctl(ci);
        }
    }

    /// Queues connection `ci` for posting its control receives and backlog this round.
    pub(crate) fn mark_ctl(&mut self, ci: u16) {
        if let Some(c) = self.conns[usize::from(ci)].as_mut()
            && !c.in_ctl
        {
            c.in_ctl = true;
            self.scratch.ctl.push(ci);
        }
    }

    /// Posts the control receives and messages of the connections marked this round.
    pub(crate) fn flush_ctl(&mut self, now: u64) {
        let ctl = std::mem::take(&mut self.scratch.ctl);
        for &ci in &ctl {
            self.resend_cts(ci);
            let Some(c) = self.conns[usize::from(ci)].as_mut() else {
                continue;
            };
            c.in_ctl = false;
            let had_ack = c.ctl.ack.is_some();
            let r = c.ctl.flush(ci);
            if let Ok(true) = r {
                self.stats.ack_packets += 1;
            }
            // The ACK that went answered the peer's request, if there was one (UC).
            if had_ack && c.ctl.ack.is_none() && c.answer.take().is_some() {
                self.stats.ack_answers += 1;
            }
            if let Err(e) = r {
                tracing::warn!(conn = ci, error = %e, "posting on a control QP failed");
                if c.is_open() {
                    self.fail_conn(ci, "posting on its control QP failed", false);
                }
            }
            self.arm_ctl_probe(ci, now);
        }
        let mut ctl = ctl;
        ctl.clear();
        if self.scratch.ctl.is_empty() {
            self.scratch.ctl = ctl;
        }
    }

    /// Fails connection `ci`: see [`fail_conn_with`](Self::fail_conn_with).
    pub(crate) fn fail_conn(&mut self, ci: u16, why: impl Into<std::sync::Arc<str>>, tell: bool) {
        let id = match self.conns[usize::from(ci)].as_ref() {
            Some(c) => c.id,
            None => return,
        };
        self.fail_conn_with(
            ci,
            EngineError::ConnectionFailed {
                conn: id,
                reason: why.into(),
            },
            tell,
        );
    }

    /// Tears connection `ci` down: every request on it fails with `e`, its flow closes, its
    /// QPs move to ERROR (their outstanding WRs flush; the flushes return every WR, header
    /// slot and credit), and once those are polled it goes. With `tell` (a failure the peer
    /// cannot see) a Close goes to the peer first, and the control QP follows the data QPs
    /// into ERROR once that send completes.
    pub(crate) fn fail_conn_with(&mut self, ci: u16, e: EngineError, tell: bool) {
        let now = self.clock.now();
        if !self.conns[usize::from(ci)]
            .as_ref()
            .is_some_and(|c| c.is_open())
        {
            return;
        }
        // Its flow's failure frees room other flows wait for, and reports its messages, after
        // the steps of this round that act on those may have run: the next round does.
        self.unsettle();
        let c = self.conns[usize::from(ci)].as_mut().expect("checked");
        tracing::warn!(conn = ci, error = %e, "connection torn down");
        c.state = State::Draining(e.clone());
        c.fail_requests(&e, false);
        c.cts.clear();
        c.ctl.backlog.clear();
        self.unstage_ack(ci);
        let c = self.conns[usize::from(ci)].as_mut().expect("checked");
        for q in std::mem::take(&mut c.qps) {
            c.qps.push(q.fail());
        }
        if !(tell && c.ctl.post_close(ci)) {
            c.ctl.shut();
        }
        let _ = self.tx.close_flow(ci);
        self.credits.close(ci, now);
        self.scratch.draining.push(ci);
    }

    /// Frees the connections whose flushes have all been polled.
    pub(crate) fn reap(&mut self) {
        if self.scratch.draining.is_empty() {
            return;
        }
        let depth = crate::io::conn_ctrl_depth(&self.cfg) as usize;
        let mut draining = std::mem::take(&mut self.scratch.draining);
        draining.retain(|&ci| {
            let Some(c) = self.conns[usize::from(ci)].as_ref() else {
                return false;
            };
            let data_done = c.paths.iter().all(|&p| self.tx.path_is_idle(p));
            let ctl_done = c.ctl.send.free.len() == depth
                && c.ctl.recv.owed.len() == depth
                && c.window_ops == 0;
            if !(data_done && ctl_done) {
                return true;
            }
            let mut c = self.conns[usize::from(ci)].take().expect("checked");
            if let Some(closed) = c.closed.take() {
                closed.finish(Ok(()));
            }
            if let crate::conn::State::Draining(why) = &c.state {
                let i = usize::from(ci);
                if self.ended.len() <= i {
                    self.ended.resize(i + 1, None);
                }
                self.ended[i] = Some((c.id, why.clone()));
            }
            for q in &c.qps {
                self.data_qpns.remove(q.qpn());
            }
            self.release_peer(c.peer);
            let (send, ctl) = self.cq_needs();
            self.io.send_credits.release(send);
            self.io.ctrl_credits.release(ctl);
            self.spare_paths.extend_from_slice(&c.paths);
            tracing::debug!(conn = ci, "connection freed");
            false
        });
        self.scratch.draining = draining;
    }
}
