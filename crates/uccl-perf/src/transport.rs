//! The engine test: flows of messages from sending engines to receiving engines, every byte
//! checked against the pattern of its flow and message.
//!
//! On softnic both ends run in this process on one fabric's virtual clock, driven as the
//! integration tests' `Sim` does: every engine is polled; when none has work the clock jumps
//! to the next event (a packet, or an engine's timer). The same seed gives the same run. On a
//! real device both ends run in this process in loopback on the wall clock, or in two
//! processes (`--server`, `--client`) connected over TCP.

use std::collections::VecDeque;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use uccl_engine::{
    Buffer, Clock, ConnId, Descriptor, Engine, EngineConfig, Mode, Request, connect_pair,
};
use verbs_safe::{Context, Verbs};

use crate::args::{Args, OpArg, TransportArg, TxMode};
use crate::pattern;

/// Which ends of the flows this process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Role {
    /// Both (one process).
    Both,
    /// The receivers (`--server`).
    Server,
    /// The senders (`--client`).
    Client,
}

/// What a run measured.
#[derive(Debug, Clone)]
pub(crate) struct Measured {
    pub(crate) role: Role,
    /// Messages per flow in flight.
    pub(crate) inflight: u32,
    pub(crate) messages_sent: u64,
    pub(crate) messages_received: u64,
    pub(crate) bytes_received: u64,
    /// Whether the payload was checked (not with `--no-payload`).
    pub(crate) verified: bool,
    pub(crate) elapsed: Duration,
    /// softnic's virtual time the run took (the simulated link's view).
    pub(crate) virtual_time: Option<Duration>,
    /// The engines' counters, summed.
    pub(crate) stats: uccl_engine::Stats,
    pub(crate) failover_retransmits: u64,
    /// softnic's counters over every device, summed.
    pub(crate) nic: Option<softnic::Counters>,
    /// Process CPU time over the run.
    pub(crate) cpu: Option<Duration>,
    /// Of which: writing and checking the patterns.
    pub(crate) check: Duration,
    /// A single-threaded memcpy of the same bytes, in this run.
    pub(crate) memcpy_gbps: f64,
}

/// The engines' configuration for `args`, each holding `conns` connections.
pub(crate) fn engine_config(args: &Args, conns: u32) -> EngineConfig {
    let mut cfg = EngineConfig {
        mode: match args.transport {
            TransportArg::Uc => Mode::Uc,
            TransportArg::Rc => Mode::Rc,
        },
        qps_per_conn: args.qps_per_flow,
        max_conns: conns.max(1),
        max_recvs: inflight(args).max(64),
        ..EngineConfig::default()
    };
    cfg.tx.chunk_size = args.chunk_size as u32;
    cfg.tx.max_chain = match args.tx_mode {
        TxMode::Chained => cfg.tx.max_chain,
        TxMode::Single => 1,
    };
    cfg.tx.seed = args.seed;
    // Enough that even 10% of every fault together never exhausts them.
    cfg.tx.max_retransmits = 64;
    // On UC every SRQ buffer holds a chunk: about 32 MiB of them, 128 to 1024.
    let slot = args.chunk_size + 64;
    let depth = ((32 << 20) / slot).clamp(128, 1024) as u32;
    cfg.srq_depth = depth.next_power_of_two().min(1024);
    cfg.srq_refill = cfg.srq_refill.min(cfg.srq_depth / 4);
    cfg
}

/// Messages per flow in flight: `--inflight`, or as many as fit in 4 MiB (2 to 32).
pub(crate) fn inflight(args: &Args) -> u32 {
    args.inflight
        .unwrap_or_else(|| ((4 << 20) / args.msg_size()).clamp(2, 32) as u32)
}

/// The sending end of a flow.
struct TxSide {
    engine: usize,
    conn: ConnId,
    src: Buffer,
    /// Sends (or writes) in flight: (message, request); the end marker is `u64::MAX`.
    reqs: VecDeque<(u64, Request)>,
    /// The next message to send.
    next: u64,
    /// Messages whose send completed.
    completed: u64,
    /// The end marker (a 0-byte message; two processes only) is posted.
    marker_sent: bool,
    marker_done: bool,
}

/// The receiving end of a flow.
struct RxSide {
    engine: usize,
    conn: ConnId,
    dst: Buffer,
    /// The region exported for `--op write`.
    desc: Option<Descriptor>,
    /// Receives posted: (message, request).
    reqs: VecDeque<(u64, Request)>,
    next_post: u64,
    received: u64,
    /// The end marker arrived (two processes only).
    ended: bool,
}

struct Flow {
    id: u64,
    tx: Option<TxSide>,
    rx: Option<RxSide>,
}

/// A run in progress.
struct Run<'a> {
    args: &'a Args,
    msg: u64,
    window: u64,
    /// Messages per flow (`u64::MAX` until `--duration` runs out).
    limit: u64,
    /// Two processes: a 0-byte message ends each flow.
    marker: bool,
    flows: Vec<Flow>,
    engines: Vec<Engine>,
    names: Vec<String>,
    /// The fabric whose virtual clock this run moves (softnic).
    fabric: Option<softnic::Fabric>,
    scratch: Vec<u8>,
    check: Duration,
    received: u64,
    sent: u64,
    bar: ProgressBar,
}

impl Run<'_> {
    /// Writes message `m` of `flow` into its slot of the source buffer.
    fn fill(&mut self, flow: usize, m: u64) -> Result<(), String> {
        if self.args.no_payload {
            return Ok(());
        }
        let t = Instant::now();
        let f = &self.flows[flow];
        let tx = f.tx.as_ref().expect("a sending end");
        pattern::fill(self.args.seed, f.id, m, &mut self.scratch);
        tx.src
            .write_at(((m % self.window) * self.msg) as usize, &self.scratch)
            .map_err(|e| format!("flow {}: writing message {m}: {e}", f.id))?;
        self.check += t.elapsed();
        Ok(())
    }

    /// Checks message `m` of `flow` in its slot of the destination buffer.
    fn verify(&mut self, flow: usize, m: u64) -> Result<(), String> {
        if self.args.no_payload {
            return Ok(());
        }
        let t = Instant::now();
        let f = &self.flows[flow];
        let rx = f.rx.as_ref().expect("a receiving end");
        let off = ((m % self.window) * self.msg) as usize;
        rx.dst
            .read_at(off, &mut self.scratch)
            .map_err(|e| format!("flow {}: reading message {m}: {e}", f.id))?;
        if let Some((tf, tm, at)) = self.args.tamper
            && (tf, tm) == (f.id, m)
            && let Some(b) = self.scratch.get_mut(at as usize)
        {
            *b ^= 0x40;
        }
        let bad = pattern::first_mismatch(self.args.seed, f.id, m, &self.scratch);
        self.check += t.elapsed();
        match bad {
            None => Ok(()),
            Some(at) => Err(format!(
                "flow {} message {m}: byte {at} of {} differs from the pattern (seed {})",
                f.id, self.msg, self.args.seed
            )),
        }
    }

    /// Completes and posts what it can on every flow; whether anything changed.
    fn step(&mut self) -> Result<bool, String> {
        let mut progress = false;
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

    fn step_rx(&mut self, i: usize) -> Result<bool, String> {
        let mut progress = false;
        let (msg, window, limit, marker) = (self.msg, self.window, self.limit, self.marker);
        let Some(rx) = self.flows[i].rx.as_mut() else {
            return Ok(false);
        };
        if rx.desc.is_some() {
            // One-sided: nothing completes at the receiver; the writer's completion says the
            // bytes are in place (in process).
            return Ok(false);
        }
        let id = self.flows[i].id;
        while let Some((m, r)) = self.flows[i].rx.as_ref().and_then(|rx| rx.reqs.front()) {
            let m = *m;
            let Some(res) = r.test() else { break };
            let done =
                res.map_err(|e| format!("flow {id} message {m}: the receive failed: {e}"))?;
            self.flows[i].rx.as_mut().expect("rx").reqs.pop_front();
            progress = true;
            if marker && done.len == 0 {
                self.flows[i].rx.as_mut().expect("rx").ended = true;
                break;
            }
            if done.len != msg {
                return Err(format!(
                    "flow {id} message {m}: {} bytes arrived, {msg} were sent",
                    done.len
                ));
            }
            self.verify(i, m)?;
            self.flows[i].rx.as_mut().expect("rx").received += 1;
            self.received += 1;
        }
        let rx = self.flows[i].rx.as_mut().expect("rx");
        while !rx.ended && rx.next_post < rx.received + window && (marker || rx.next_post < limit) {
            let m = rx.next_post;
            let off = (m % window) * msg;
            let r = self.engines[rx.engine]
                .recv(rx.conn, &rx.dst, off, msg)
                .map_err(|e| format!("flow {id} message {m}: posting the receive: {e}"))?;
            rx.reqs.push_back((m, r));
            rx.next_post += 1;
            progress = true;
        }
        Ok(progress)
    }

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
            let what = if self.flows[i].rx.as_ref().is_some_and(|r| r.desc.is_some()) {
                "write"
            } else {
                "send"
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
            if done.len != msg {
                return Err(format!(
                    "flow {id} message {m}: the {what} moved {} bytes of {msg}",
                    done.len
                ));
            }
            if what == "write" {
                // In process: the write is acknowledged, so every byte is in place.
                self.verify(i, m)?;
                self.flows[i].rx.as_mut().expect("rx").received += 1;
                self.received += 1;
            }
            self.flows[i].tx.as_mut().expect("tx").completed += 1;
            self.sent += 1;
        }
        loop {
            let tx = self.flows[i].tx.as_ref().expect("tx");
            let m = tx.next;
            if m >= limit || m >= tx.completed + window {
                break;
            }
            self.fill(i, m)?;
            let off = (m % window) * msg;
            let f = &mut self.flows[i];
            let tx = f.tx.as_mut().expect("tx");
            let e = &mut self.engines[tx.engine];
            let r = match f.rx.as_ref().and_then(|r| r.desc.as_ref()) {
                Some(desc) => e.write(tx.conn, &tx.src, off, msg, desc, off),
                None => e.send(tx.conn, &tx.src, off, msg),
            }
            .map_err(|e| format!("flow {id} message {m}: posting: {e}"))?;
            tx.reqs.push_back((m, r));
            tx.next += 1;
            progress = true;
        }
        let tx = self.flows[i].tx.as_mut().expect("tx");
        if marker && !tx.marker_sent && tx.next == limit && tx.completed == limit {
            let r = self.engines[tx.engine]
                .send(tx.conn, &tx.src, 0, 0)
                .map_err(|e| format!("flow {id}: posting the end-of-flow message: {e}"))?;
            tx.reqs.push_back((u64::MAX, r));
            tx.marker_sent = true;
            progress = true;
        }
        Ok(progress)
    }

    /// Whether every flow is done at this end.
    fn done(&self) -> bool {
        self.flows.iter().all(|f| {
            let tx_done =
                f.tx.as_ref()
                    .is_none_or(|t| t.completed == self.limit && (!self.marker || t.marker_done));
            let rx_done = f.rx.as_ref().is_none_or(|r| {
                if self.marker {
                    r.ended
                } else {
                    r.received == self.limit
                }
            });
            tx_done && rx_done
        })
    }

    /// The first message not in yet, for a report of what is missing.
    fn missing(&self) -> String {
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
    fn stop(&mut self) {
        let most = self
            .flows
            .iter()
            .filter_map(|f| f.tx.as_ref().map(|t| t.next))
            .max()
            .unwrap_or(0);
        self.limit = most;
    }

    /// Runs until every flow is done; returns the elapsed wall time.
    fn drive(&mut self) -> Result<Duration, String> {
        let start = Instant::now();
        let stop_at = self.args.duration.map(|d| start + d);
        let mut shown = false;
        let mut quiet_since = (start, self.fabric.as_ref().map(|f| f.now()));
        let mut rounds = 0u64;
        // Requests complete only inside a poll: after a round with nothing done, there is
        // nothing new to look at.
        let mut look = true;
        loop {
            let progress = look && self.step()?;
            if self.done() {
                return Ok(start.elapsed());
            }
            let mut kick = false;
            rounds += 1;
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
            look = busy || kick;
            if progress {
                quiet_since = (Instant::now(), self.fabric.as_ref().map(|f| f.now()));
            }
            if busy || progress {
                continue;
            }
            match &self.fabric {
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
                        .filter_map(Engine::next_deadline)
                        .map(Duration::from_nanos)
                        .chain(f.next_event())
                        .min();
                    match next {
                        Some(t) if t > now => f.advance(t - now),
                        Some(_) => f.advance(Duration::from_nanos(1)),
                        None => {
                            return Err(format!(
                                "{} (nothing left to happen at {now:?} of virtual time)",
                                self.missing()
                            ));
                        }
                    }
                }
                None => {
                    if quiet_since.0.elapsed() > Duration::from_secs(30) {
                        return Err(format!("{} (no progress in 30 s)", self.missing()));
                    }
                    std::hint::spin_loop();
                }
            }
        }
    }
}

/// Whether a progress bar may show: on a terminal, without `--json`.
fn show_progress(args: &Args) -> bool {
    use std::io::IsTerminal;
    !args.json && std::io::stdout().is_terminal()
}

fn new_bar(args: &Args, total: u64) -> ProgressBar {
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

/// What to say when there is no device `name` (`available` are the ones there are).
pub(crate) fn no_such_device(name: &str, available: &[String]) -> String {
    if available.is_empty() {
        format!(
            "no RDMA device named {name:?}: this machine has none (--device soft runs on the \
             built-in software NIC)"
        )
    } else {
        format!(
            "no RDMA device named {name:?} (there are: {}; or --device soft)",
            available.join(", ")
        )
    }
}

/// Opens `name` on `verbs`, saying plainly what is wrong if it cannot.
fn open(verbs: &Verbs, name: &str) -> Result<std::sync::Arc<Context>, String> {
    Context::open_by_name(verbs, name).map_err(|e| match e {
        verbs_safe::Error::NoSuchDevice { available, .. } => no_such_device(name, &available),
        e => format!("opening {name}: {e}"),
    })
}

fn buffer(e: &mut Engine, len: u64) -> Result<Buffer, String> {
    e.register(len as usize)
        .map_err(|err| format!("registering {len} bytes: {err}"))
}

/// Runs the engine test as `args` says.
pub(crate) fn run(args: &Args) -> Result<Measured, String> {
    if args.server || args.client.is_some() {
        return run_remote(args);
    }
    let pairs = usize::from(args.engines);
    let flows = usize::from(args.flows);
    let per_engine = flows.div_ceil(pairs) as u32;
    let cfg = engine_config(args, per_engine);
    let (fabric, verbs, names) = if args.soft() {
        let fabric = softnic::Fabric::new(softnic::FabricConfig {
            devices: 2 * pairs,
            seed: args.seed,
            auto_advance: false,
            copy_payload: !args.no_payload,
            ..Default::default()
        });
        fabric.set_default_faults(args.faults());
        let verbs = Verbs::soft(&fabric);
        let names = (0..2 * pairs).map(|i| format!("soft{i}")).collect();
        (Some(fabric), verbs, names)
    } else {
        (None, Verbs::system(), vec![args.device.clone(); 2 * pairs])
    };
    let clock = fabric
        .as_ref()
        .map_or_else(Clock::wall, |f| Clock::Fabric(f.clone()));
    let mut engines = Vec::with_capacity(2 * pairs);
    for name in &names {
        let ctx = open(&verbs, name)?;
        engines.push(
            Engine::new(&ctx, cfg.clone(), clock.clone())
                .map_err(|e| format!("starting an engine on {name}: {e}"))?,
        );
    }
    let window = u64::from(inflight(args));
    let msg = args.msg_size();
    let mut list = Vec::with_capacity(flows);
    for f in 0..flows {
        let p = f % pairs;
        let (a, b) = engines.split_at_mut(2 * p + 1);
        let (sender, receiver) = (&mut a[2 * p], &mut b[0]);
        let (ca, cb) =
            connect_pair(sender, receiver).map_err(|e| format!("connecting flow {f}: {e}"))?;
        let src = buffer(sender, window * msg)?;
        let dst = buffer(receiver, window * msg)?;
        let desc = match args.op {
            OpArg::Send => None,
            OpArg::Write => Some(
                receiver
                    .export(&dst, 0, window * msg)
                    .map_err(|e| format!("exporting flow {f}'s region: {e}"))?,
            ),
        };
        list.push(Flow {
            id: f as u64,
            tx: Some(TxSide {
                engine: 2 * p,
                conn: ca,
                src,
                reqs: VecDeque::new(),
                next: 0,
                completed: 0,
                marker_sent: false,
                marker_done: false,
            }),
            rx: Some(RxSide {
                engine: 2 * p + 1,
                conn: cb,
                dst,
                desc,
                reqs: VecDeque::new(),
                next_post: 0,
                received: 0,
                ended: false,
            }),
        });
    }
    execute(args, Role::Both, engines, names, fabric, list, false)
}

/// Drives `flows` to the end and measures.
fn execute(
    args: &Args,
    role: Role,
    engines: Vec<Engine>,
    names: Vec<String>,
    fabric: Option<softnic::Fabric>,
    flows: Vec<Flow>,
    marker: bool,
) -> Result<Measured, String> {
    let msg = args.msg_size();
    let window = u64::from(inflight(args));
    let limit = match args.duration {
        Some(_) => u64::MAX,
        None => args.messages.unwrap_or(64),
    };
    let total = limit.saturating_mul(flows.len() as u64);
    let mut run = Run {
        args,
        msg,
        window,
        limit,
        marker,
        bar: new_bar(args, if args.duration.is_some() { 0 } else { total }),
        flows,
        engines,
        names,
        fabric,
        scratch: vec![0u8; msg as usize],
        check: Duration::ZERO,
        received: 0,
        sent: 0,
    };
    let cpu0 = crate::cpu::process_time();
    let v0 = run.fabric.as_ref().map(|f| f.now());
    let result = run.drive();
    run.bar.finish_and_clear();
    let elapsed = result?;
    if marker && args.duration.is_none() {
        // Two processes: each flow ended by its sender must hold every message.
        for f in &run.flows {
            if let Some(r) = &f.rx
                && r.received != run.limit
            {
                return Err(format!(
                    "flow {}: {} messages arrived, {} were to be sent (same --messages on both \
                     sides?)",
                    f.id, r.received, run.limit
                ));
            }
        }
    }
    let cpu = crate::cpu::process_time()
        .zip(cpu0)
        .map(|(b, a)| b.saturating_sub(a));
    let virtual_time = run.fabric.as_ref().zip(v0).map(|(f, v)| f.now() - v);
    let mut stats = uccl_engine::Stats::default();
    let mut failover = 0;
    for e in &run.engines {
        stats = add(stats, e.stats());
        failover += e.tx_stats().failover_retransmits;
    }
    let nic = run.fabric.as_ref().map(|f| {
        let mut c = softnic::Counters::default();
        for n in &run.names {
            if let Some(d) = f.device_counters(n) {
                c += &d;
            }
        }
        c
    });
    let bytes = run.received * msg;
    let working = (run.flows.len() as u64 * window * msg).clamp(msg, 64 << 20);
    Ok(Measured {
        role,
        inflight: window as u32,
        messages_sent: run.sent,
        messages_received: run.received,
        bytes_received: bytes,
        verified: !args.no_payload,
        elapsed,
        virtual_time,
        stats,
        failover_retransmits: failover,
        nic,
        cpu,
        check: run.check,
        memcpy_gbps: memcpy_gbps(bytes.max(msg), msg, working),
    })
}

/// The sum of two engines' counters.
fn add(a: uccl_engine::Stats, b: uccl_engine::Stats) -> uccl_engine::Stats {
    let mut s = a;
    s.chunks_sent += b.chunks_sent;
    s.post_send_calls += b.post_send_calls;
    s.send_wrs += b.send_wrs;
    s.srq_posts += b.srq_posts;
    s.srq_wqes += b.srq_wqes;
    s.srq_limit_events += b.srq_limit_events;
    s.qp_fatal_events += b.qp_fatal_events;
    s.rto_retransmits += b.rto_retransmits;
    s.fast_retransmits += b.fast_retransmits;
    s.acks_sent += b.acks_sent;
    s.ack_packets += b.ack_packets;
    s.acks_received += b.acks_received;
    s.cqes += b.cqes;
    s.polls += b.polls;
    s.chunks_received += b.chunks_received;
    s.credit_stalls += b.credit_stalls;
    s.dropped_duplicate += b.dropped_duplicate;
    s.dropped_invalid += b.dropped_invalid;
    s.dropped_out_of_window += b.dropped_out_of_window;
    s.messages_sent += b.messages_sent;
    s.messages_received += b.messages_received;
    s.bytes_received += b.bytes_received;
    s.writes_received += b.writes_received;
    s
}

/// Copies `bytes` (at most 1 GiB of them) in `msg`-byte pieces round a `working`-byte set of
/// buffers, single-threaded: the software limit of a NIC that copies every byte.
fn memcpy_gbps(bytes: u64, msg: u64, working: u64) -> f64 {
    let bytes = bytes.min(1 << 30);
    let piece = msg.min(working) as usize;
    let slots = (working as usize / piece).max(1);
    let src = vec![0x5au8; piece * slots];
    let mut dst = vec![0u8; piece * slots];
    // Touch the destination once so that page faults are not timed.
    dst.iter_mut().step_by(4096).for_each(|b| *b = 1);
    let n = bytes.div_ceil(piece as u64);
    let t = Instant::now();
    for i in 0..n {
        let k = (i as usize % slots) * piece;
        dst[k..k + piece].copy_from_slice(&src[k..k + piece]);
        std::hint::black_box(&mut dst);
    }
    let s = t.elapsed().as_secs_f64();
    if s == 0.0 {
        0.0
    } else {
        (n * piece as u64) as f64 * 8.0 / s / 1e9
    }
}

/// Two processes: this one runs the receivers (`--server`) or the senders (`--client`) of every
/// flow, on engines of a real device connected over TCP.
fn run_remote(args: &Args) -> Result<Measured, String> {
    let verbs = Verbs::system();
    let n = usize::from(args.engines);
    let cfg = engine_config(args, u32::from(args.flows).div_ceil(n as u32));
    let mut engines = Vec::with_capacity(n);
    for _ in 0..n {
        let ctx = open(&verbs, &args.device)?;
        engines.push(
            Engine::new(&ctx, cfg.clone(), Clock::wall())
                .map_err(|e| format!("starting an engine on {}: {e}", args.device))?,
        );
    }
    let names = vec![args.device.clone(); n];
    match &args.client {
        None => {
            let listener = TcpListener::bind(("0.0.0.0", args.port))
                .map_err(|e| format!("listening on port {}: {e}", args.port))?;
            if !args.json {
                println!(
                    "uccl-perf: waiting for {} flows on port {}",
                    args.flows, args.port
                );
            }
            serve(args, engines, names, &listener)
        }
        Some(host) => {
            let addr = format!("{host}:{}", args.port);
            client(args, engines, names, &addr)
        }
    }
}

/// The receiving ends of `args.flows` flows accepted on `listener` (flow `f` on engine
/// `f % engines`), run until each sender ends its flow.
pub(crate) fn serve(
    args: &Args,
    mut engines: Vec<Engine>,
    names: Vec<String>,
    listener: &TcpListener,
) -> Result<Measured, String> {
    let window = u64::from(inflight(args));
    let msg = args.msg_size();
    let n = engines.len();
    let mut flows = Vec::new();
    for f in 0..usize::from(args.flows) {
        let e = &mut engines[f % n];
        let conn = e
            .accept(listener)
            .map_err(|err| format!("accepting flow {f}: {err}"))?;
        flows.push(Flow {
            id: f as u64,
            tx: None,
            rx: Some(RxSide {
                engine: f % n,
                conn,
                dst: buffer(e, window * msg)?,
                desc: None,
                reqs: VecDeque::new(),
                next_post: 0,
                received: 0,
                ended: false,
            }),
        });
    }
    execute(args, Role::Server, engines, names, None, flows, true)
}

/// The sending ends of `args.flows` flows connected to the server at `addr`.
pub(crate) fn client(
    args: &Args,
    mut engines: Vec<Engine>,
    names: Vec<String>,
    addr: &str,
) -> Result<Measured, String> {
    let window = u64::from(inflight(args));
    let msg = args.msg_size();
    let n = engines.len();
    let mut flows = Vec::new();
    for f in 0..usize::from(args.flows) {
        let e = &mut engines[f % n];
        let conn = e
            .connect(addr)
            .map_err(|err| format!("connecting flow {f} to {addr}: {err}"))?;
        flows.push(Flow {
            id: f as u64,
            tx: Some(TxSide {
                engine: f % n,
                conn,
                src: buffer(e, window * msg)?,
                reqs: VecDeque::new(),
                next: 0,
                completed: 0,
                marker_sent: false,
                marker_done: false,
            }),
            rx: None,
        });
    }
    execute(args, Role::Client, engines, names, None, flows, true)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// The arguments `extra` (split at spaces).
    fn args(extra: &str) -> Args {
        Args::parse_from(std::iter::once("uccl-perf").chain(extra.split_whitespace()))
    }

    #[test]
    fn a_small_run_verifies_every_message() {
        for op in ["send", "write"] {
            for t in ["uc", "rc"] {
                let a = args(&format!(
                    "--flows 3 --engines 2 --qps-per-flow 2 --msg-size 10000 --chunk-size 4KiB \
                     --messages 5 --op {op} --transport {t} --loss 0.02"
                ));
                let m = run(&a).unwrap();
                assert_eq!((m.messages_sent, m.messages_received), (15, 15), "{op} {t}");
                assert_eq!(m.bytes_received, 150_000);
                assert!(m.verified);
                assert!(m.stats.chunks_sent >= 15 * 3);
            }
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_run() {
        let a = args("--messages 4 --msg-size 64KiB --chunk-size 4KiB");
        let (x, y) = (run(&a).unwrap(), run(&a).unwrap());
        assert_eq!(x.stats, y.stats);
        assert_eq!(x.virtual_time, y.virtual_time);
        assert_eq!(x.nic, y.nic);
    }

    /// The two-process path, in one process: a server and a client thread over TCP on one
    /// softnic fabric on the wall clock.
    #[test]
    fn server_and_client_talk_over_tcp() {
        let a = args(
            "--flows 2 --engines 2 --qps-per-flow 2 --msg-size 20000 --chunk-size 8KiB \
             --messages 6",
        );
        let fabric = softnic::Fabric::new(softnic::FabricConfig {
            devices: 2,
            clock: softnic::Clock::Wall,
            ..Default::default()
        });
        let verbs = Verbs::soft(&fabric);
        let engines = |dev: &str| -> Vec<Engine> {
            (0..2)
                .map(|_| {
                    let ctx = Context::open_by_name(&verbs, dev).unwrap();
                    Engine::new(&ctx, engine_config(&a, 1), Clock::wall()).unwrap()
                })
                .collect()
        };
        let (srv, cli) = (engines("soft0"), engines("soft1"));
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let names = vec!["soft".to_string(); 2];
        std::thread::scope(|s| {
            let a = &a;
            let n = names.clone();
            let server = s.spawn(move || serve(a, srv, n, &listener));
            let c = client(a, cli, names, &addr).unwrap();
            let sv = server.join().unwrap().unwrap();
            assert_eq!((c.role, c.messages_sent), (Role::Client, 12));
            assert_eq!((sv.role, sv.messages_received), (Role::Server, 12));
            assert_eq!(sv.bytes_received, 12 * 20000);
        });
    }
}
