//! Goodbyes: destroying an id as the kernel's CM does, and ids that outlive their caller
//! until their DREQ is answered.

use super::CmError;
use super::ids::St;
use super::mad::{Msg, Rej, private, reject};
use crate::qp::Transport;
use crate::state::State;

impl State {
    /// `rdma_destroy_id`: says goodbye as the kernel's CM does (a REJ for a request not
    /// decided, a DREP for the peer's DREQ; a listener's requests not handed out yet are
    /// rejected) and forgets the id and its events. A connection still up, or whose DREQ is
    /// not answered yet, lives on without its channel until its DREQ is answered or given up
    /// (as the kernel's CM goes on after the process): a lost DREQ would otherwise leave the
    /// peer connected for ever.
    pub(crate) fn cm_destroy_id(&mut self, id: u32) -> Result<(), CmError> {
        self.cm_leave_all(id);
        let i = self.cm_id(id)?;
        let (st, ps, chan) = (i.st, i.ps, i.chan);
        let (local, remote, qpn) = (i.local_comm, i.remote_comm, i.remote_qpn);
        if st == St::Listen {
            let waiting: Vec<u32> = self.w.cm.channels.get(&chan).map_or(Vec::new(), |c| {
                let mine = |e: &&super::CmEvent| e.listen_id == Some(super::CmId(id));
                c.events.iter().filter(mine).map(|e| e.id.0).collect()
            });
            for child in waiting {
                let _ = self.cm_destroy_id(child);
            }
        }
        let bye = match (st, ps.transport()) {
            (St::ReqRcvd, _) => {
                let _ = self.cm_reject(id, &[]);
                None
            }
            (St::ReqSent, Transport::Rc) => Some(Msg::Rej(Box::new(Rej {
                local_comm_id: local,
                remote_comm_id: remote,
                msg_rejected: 2,
                reason: reject::TIMEOUT,
                private: [0; private::REJ],
            }))),
            (St::Established | St::RepSent | St::RepRcvd, Transport::Rc) => {
                let dreq = Msg::Dreq(local, remote, qpn);
                self.cm_qp_error(id);
                self.w.cm_settle(id);
                self.w.cm_send(id, &dreq, true);
                self.orphan(id, St::DreqSent);
                return Ok(());
            }
            (St::DreqSent, _) => {
                self.orphan(id, St::DreqSent);
                return Ok(());
            }
            // The peer's DREQ, answered at last.
            (St::DreqRcvd, _) => Some(Msg::Drep(local, remote)),
            _ => None,
        };
        if let Some(m) = bye {
            self.w.cm_send(id, &m, false);
        }
        self.forget(id);
        Ok(())
    }

    /// The id lives on without a channel (no event, no QP) in state `st`, until
    /// [`forget`](Self::forget).
    fn orphan(&mut self, id: u32, st: St) {
        let cm = &mut self.w.cm;
        if let Some(c) = cm.ids.get(&id).and_then(|i| cm.channels.get_mut(&i.chan)) {
            c.events.take_if(|e| e.id.0 == id);
        }
        if let Some(i) = cm.ids.get_mut(&id) {
            i.st = st;
            i.chan = 0;
            i.qp = None;
            i.orphan = true;
        }
    }

    /// The process ends: every id it still holds is destroyed as [`cm_destroy_id`] destroys
    /// one (a DREQ for a connection, a DREP for the peer's DREQ, a REJ for a request not
    /// decided), as the kernel's CM destroys a process's ids when its descriptor closes, and
    /// the goodbyes are put on the wire before this returns (a DREP or REJ is sent once, and
    /// the process may be gone before its progress thread's next round). Returns how many
    /// ids there were.
    ///
    /// [`cm_destroy_id`]: Self::cm_destroy_id
    pub(crate) fn cm_close_all(&mut self) -> usize {
        let live: Vec<u32> = (self.w.cm.ids.iter())
            .filter(|(_, i)| !i.orphan)
            .map(|(&id, _)| id)
            .collect();
        for &id in &live {
            // A listener's destruction takes the requests it had not handed out with it.
            let _ = self.cm_destroy_id(id);
        }
        self.sync_clock();
        self.progress();
        live.len()
    }

    /// Ids destroyed whose goodbye (a DREQ) is not answered yet.
    pub(crate) fn cm_lingering(&self) -> usize {
        self.w.cm.ids.values().filter(|i| i.orphan).count()
    }

    /// Forgets an id: its communication IDs, its port, its events.
    pub(crate) fn forget(&mut self, id: u32) {
        let cm = &mut self.w.cm;
        let Some(i) = cm.ids.remove(&id) else {
            return;
        };
        cm.by_comm.remove(&i.local_comm);
        if let Some(dev) = i.dev {
            cm.by_remote.remove(&(dev, i.peer_gid, i.remote_comm));
        }
        if let Some(src) = i.src.filter(|_| i.listener.is_none()) {
            cm.release_port(i.ps, src.port());
        }
        if let Some(c) = cm.channels.get_mut(&i.chan) {
            c.events.take_if(|e| e.id.0 == id);
        }
    }
}
