//! The driver: rounds of stepping every flow and polling every engine until every flow is
//! done. On softnic, when nothing has work, the fabric's virtual clock jumps to the next event
//! (a packet, or an engine's timer) or by the poll interval (`--poll-interval-ns`), whichever
//! is later, so the same seed gives the same run.

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::run::Run;
use crate::args::Args;

/// How long the server keeps answering after its run, at most, for the client to close.
const SERVER_LINGER: Duration = Duration::from_secs(3);
/// How long the client waits for its closes to leave, at most.
const CLIENT_LINGER: Duration = Duration::from_secs(1);

impl Run<'_> {
    /// Runs until every flow is done; returns the elapsed wall time.
    pub(super) fn drive(&mut self) -> Result<Duration, String> {
        let start = Instant::now();
        let stop_at = self.args.duration.map(|d| start + d);
        let mut shown = false;
        let mut quiet_since = (start, self.fabric.as_ref().map(|f| f.now()));
        // A fabric on the virtual clock is moved from event to event here; one on the wall
        // clock (the UDP link between two processes) moves by itself.
        let virtual_fabric = self
            .fabric
            .clone()
            .filter(|f| f.config().clock == softnic::Clock::Virtual);
        let mut rounds = 0u64;
        // Flows change only when a request ends (or a note comes, when notes are taken): after
        // a round that ended none, there is nothing new to look at.
        let mut look = true;
        let notes = self.marker && self.args.op.notes();
        let mut ended = self.requests_ended();
        // Whether a flow moved since `quiet_since` was last set.
        let mut moved = false;
        // Quiet rounds on the wall clock: the 30 s check reads the clock every 64th.
        let mut quiet_rounds = 0u64;
        loop {
            let progress = look && self.step()?;
            if self.steady.is_some() {
                self.observe();
            }
            // Only a step moves a flow towards its end.
            if look && self.done() {
                return Ok(start.elapsed());
            }
            let mut kick = false;
            rounds += 1;
            moved |= progress;
            // The wall clock is read once every 64 rounds (a round can take less than a read).
            if rounds.is_multiple_of(64) {
                let now = Instant::now();
                if let Some(t) = stop_at
                    && self.limit == u64::MAX
                    && now >= t
                {
                    self.stop();
                    kick = true;
                }
                if !shown && now - start >= Duration::from_secs(1) {
                    shown = true;
                    if show_progress(self.args) {
                        self.bar.set_draw_target(ProgressDrawTarget::stdout());
                    }
                }
            }
            let mut busy = false;
            for (k, e) in self.engines.iter_mut().enumerate() {
                busy |= e
                    .poll()
                    .map_err(|e| format!("engine on {}: {e}", self.names[k]))?;
            }
            // Read every round, not only after a busy one: a request can end inside a step
            // (a receive whose message had already arrived).
            let now_ended = self.requests_ended();
            look = kick || (busy && notes) || now_ended != ended;
            ended = now_ended;
            if busy || progress {
                continue;
            }
            if moved {
                // The first quiet round after progress: the clocks are read here, once.
                quiet_since = (Instant::now(), self.fabric.as_ref().map(|f| f.now()));
                moved = false;
            }
            match &virtual_fabric {
                Some(f) => {
                    let now = f.now();
                    if quiet_since
                        .1
                        .is_some_and(|q| now - q > Duration::from_secs(30))
                    {
                        return Err(format!(
                            "{} (no progress in 30 s of virtual time)",
                            self.missing()
                        ));
                    }
                    let next = self
                        .engines
                        .iter()
                        .filter_map(|e| e.next_deadline())
                        .map(Duration::from_nanos)
                        .chain(f.next_event())
                        .min();
                    // The engines poll again at the next event, or a poll interval from now if
                    // that is later: what the NIC does meanwhile waits for one round.
                    let interval = Duration::from_nanos(self.args.poll_interval_ns.max(1));
                    match next {
                        Some(t) => {
                            let t0 = Instant::now();
                            f.advance(t.saturating_sub(now).max(interval));
                            self.nic_time += t0.elapsed();
                        }
                        None => {
                            return Err(format!(
                                "{} (nothing left to happen at {now:?} of virtual time)",
                                self.missing()
                            ));
                        }
                    }
                }
                None => {
                    quiet_rounds += 1;
                    if quiet_rounds.is_multiple_of(64)
                        && quiet_since.0.elapsed() > Duration::from_secs(30)
                    {
                        return Err(format!("{} (no progress in 30 s)", self.missing()));
                    }
                    std::hint::spin_loop();
                }
            }
        }
    }

    /// Requests of every engine of the run that have ended so far.
    fn requests_ended(&self) -> u64 {
        self.engines.iter().map(|e| e.requests_ended()).sum()
    }

    /// Two processes, once this end's run is done: the client closes its connections and
    /// waits for the closes to leave; the server keeps its engines answering until the client
    /// has closed every connection (at most [`SERVER_LINGER`]). The server is done when the
    /// end-of-flow messages have arrived, the client only once they are acknowledged: a
    /// server gone at once would leave a client whose ACK was lost asking an engine that is
    /// no longer there, and failing its flow.
    pub(super) fn linger(&mut self, role: super::Role) {
        let client = role == super::Role::Client;
        let conns: Vec<(usize, uccl_engine::ConnId)> = self
            .flows
            .iter()
            .flat_map(|f| {
                let tx = f.tx.as_ref().map(|t| (t.engine, t.conn));
                let rx = f.rx.as_ref().map(|r| (r.engine, r.conn));
                tx.into_iter().chain(rx)
            })
            .collect();
        if client {
            for &(e, c) in &conns {
                // A connection that failed meanwhile has nothing to close.
                let _ = self.engines[e].close(c);
            }
        }
        let until = Instant::now() + if client { CLIENT_LINGER } else { SERVER_LINGER };
        while Instant::now() < until && conns.iter().any(|&(e, c)| self.engines[e].is_open(c)) {
            let mut busy = false;
            for e in &mut self.engines {
                busy |= e.poll().unwrap_or(false);
            }
            if !busy {
                std::thread::yield_now();
            }
        }
    }
}

/// Whether a progress bar may show: on a terminal, without `--json`.
fn show_progress(args: &Args) -> bool {
    use std::io::IsTerminal;
    !args.json && std::io::stdout().is_terminal()
}

/// A progress bar of `total` messages (a spinner with `--duration`), hidden at first.
pub(super) fn new_bar(args: &Args, total: u64) -> ProgressBar {
    // Hidden until the run has lasted a second (`Run::drive` shows it then).
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
    let style = ProgressStyle::with_template(if args.duration.is_some() {
        "{spinner} {elapsed} {pos} messages ({per_sec})"
    } else {
        "{bar:40} {pos}/{len} messages {elapsed}/{eta} ({per_sec})"
    })
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}
