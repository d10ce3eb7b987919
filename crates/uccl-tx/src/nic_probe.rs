//! NIC probes ([`TxConfig::nic_probe_us`](crate::TxConfig::nic_probe_us)): on a transport
//! whose NIC recovers losses (RC), a path whose posted WRs see no completion for a probe
//! interval gets a zero-length signaled RDMA WRITE, one per stall (the next only once a
//! completion came). An RC responder NAKs a PSN gap at once,
//! but only when a later packet shows it: the last packet before a quiet spell that is lost
//! (a tail loss), or the ACK that would have covered it, otherwise waits for the QP's local
//! ACK timeout (67 ms at the least, the engine's 134 ms by default). The probe is such a
//! later packet; zero-length, it touches no memory and needs no key (IBTA C9-88).
//!
//! One timer per busy path, in the transmit side's heap: armed when a WR finds the path with
//! nothing outstanding, disarmed (its entry left stale) when a completion leaves nothing
//! outstanding, and re-armed from the path's last progress when it fires early. A completion
//! costs a store, a post a test; nothing when probes are off.

use crate::timers::PATHS;
use crate::tx::Tx;

impl Tx {
    /// A WR was posted on path `p`: a path that had nothing outstanding starts its timer.
    pub(crate) fn nic_probe_posted(&mut self, p: usize) {
        let path = &mut self.paths[p];
        if path.nic_probe.is_none() {
            let at = self.now + self.cfg.nic_probe_us * 1000;
            path.progress_at = self.now;
            path.nic_probe = Some(at);
            self.timers.arm(at, PATHS, p as u16);
        }
    }

    /// A completion covered WRs of path `p`: it made progress, and with nothing outstanding
    /// left its timer stops.
    pub(crate) fn nic_probe_progress(&mut self, p: usize) {
        let path = &mut self.paths[p];
        path.progress_at = self.now;
        if path.posted == path.completed {
            path.nic_probe = None;
        }
    }

    /// Path `p`'s timer, armed for `deadline`, fired at `now`: the path owes a probe if it
    /// made no progress for an interval; the timer goes on while WRs are outstanding.
    pub(crate) fn nic_probe_due(&mut self, p: usize, deadline: u64, now: u64) {
        let interval = self.cfg.nic_probe_us * 1000;
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
        let at = if path.progress_at + interval > now {
            path.progress_at + interval
        } else {
            // One probe per stall: while nothing completes, the NIC's own recovery (the
            // probe's NAK, or its timeout) goes on without more packets behind, and the send
            // queue does not fill with probes.
            if path.probed != Some(path.completed) && !path.owe_signal {
                self.stats.nic_probes += 1;
                path.probed = Some(path.completed);
                path.owe_signal = true;
                self.owing.push(p as u16);
            }
            now + interval
        };
        path.nic_probe = Some(at);
        self.timers.arm(at, PATHS, p as u16);
    }
}
