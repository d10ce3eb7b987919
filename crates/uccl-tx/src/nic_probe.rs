//! NIC probes ([`TxConfig::nic_probe_us`](crate::TxConfig::nic_probe_us)): on a transport
//! whose NIC recovers losses (RC), a path whose posted WRs see no completion for a probe
//! interval gets a zero-length signaled RDMA WRITE, one per stall (the next only once a
//! completion came). An RC responder NAKs a PSN gap at once, but only when a later packet
//! shows it: the last packet before a quiet spell that is lost (a tail loss), or the ACK that
//! would have covered it, otherwise waits for the QP's local ACK timeout. The probe is such a
//! later packet; zero-length, it touches no memory and needs no key (IBTA C9-88). A path keeps
//! one send-queue slot for it, so that a full send queue can still be probed.
//!
//! One timer per busy path, in the transmit side's heap, and no clock read on a completion:
//! armed when a WR finds the path's timer off, it compares the path's completions with those
//! it saw at its last firing: moved, the path made progress; not moved, the path is stalled.
//! It stops at a firing that finds nothing outstanding. So a stall is probed one to two
//! intervals after the path's last completion, a busy path costs one heap entry per interval,
//! a post a test, a completion nothing.

use crate::timers::PATHS;
use crate::tx::Tx;

impl Tx {
    /// The slots a path with a send queue of `depth` keeps for a NIC probe: one while probes
    /// are on, unless that would leave flows none.
    pub(crate) fn spare(&self, depth: u32) -> u32 {
        u32::from(self.cfg.nic_probe_us > 0 && depth > 1)
    }

    /// A WR was posted on path `p`: a path whose timer is off starts it.
    pub(crate) fn nic_probe_posted(&mut self, p: usize) {
        let path = &mut self.paths[p];
        if path.nic_probe.is_none() {
            let at = self.now + self.cfg.nic_probe_us * 1000;
            path.probe_mark = path.completed;
            path.nic_probe = Some(at);
            self.timers.arm(at, PATHS, p as u16);
        }
    }

    /// Path `p`'s timer, armed for `deadline`, fired at `now`: with nothing outstanding it
    /// stops; otherwise the path owes a probe if nothing completed since the last firing and
    /// none was owed for this stall yet, and the timer goes on.
    pub(crate) fn nic_probe_due(&mut self, p: usize, deadline: u64, now: u64) {
        let Some(path) = self
            .paths
            .get_mut(p)
            .filter(|path| path.nic_probe == Some(deadline))
        else {
            return;
        };
        if path.failed || path.posted == path.completed {
            path.nic_probe = None;
            return;
        }
        if path.completed != path.probe_mark {
            path.probe_mark = path.completed;
        } else if path.probed != Some(path.completed) && !path.owe_signal {
            // One probe per stall: while nothing completes, the NIC's own recovery (the
            // probe's NAK, or its timeout) goes on without more packets behind.
            self.stats.nic_probes += 1;
            path.probed = Some(path.completed);
            path.owe_signal = true;
            self.owing.push(p as u16);
        }
        let at = now + self.cfg.nic_probe_us * 1000;
        path.nic_probe = Some(at);
        self.timers.arm(at, PATHS, p as u16);
    }
}
