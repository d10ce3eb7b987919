//! Driving a run to the end and measuring it: messages, bytes, time (wall, virtual and CPU),
//! the engines' and the NIC's counters, and a memcpy of the same bytes to compare with.

use uccl_engine::Engine;

use super::drive::new_bar;
use super::flow::{Flow, Payload};
use super::run::Run;
use super::{Measured, Role, inflight};
use crate::args::Args;

/// Drives `flows` to the end and measures.
pub(super) fn execute(
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
    let flows_len = flows.len();
    let mut run = Run {
        args,
        msg,
        window,
        limit,
        marker,
        marker_len: u64::from(marker && msg == 0),
        bar: new_bar(args, if args.duration.is_some() { 0 } else { total }),
        blocks: Vec::new(),
        flows,
        engines,
        names,
        fabric,
        payload: Payload::new(args, msg, window),
        nic_time: std::time::Duration::ZERO,
        received: 0,
        sent: 0,
        steady: (args.fabric.measured() && args.virtual_clock())
            .then(|| super::congestion::Steady::new(args.fabric.warmup_us, flows_len, window)),
    };
    let cpu0 = crate::cpu::process_time();
    let v0 = run
        .fabric
        .as_ref()
        .filter(|_| args.virtual_clock())
        .map(|f| f.now());
    let result = run.drive();
    run.bar.finish_and_clear();
    if let Some(why) = run
        .steady
        .as_ref()
        .and_then(super::congestion::Steady::unmeasured)
    {
        eprintln!("{why}");
    }
    let elapsed = result?;
    if marker && args.duration.is_none() {
        // Two processes: each flow ended by its sender must hold every message.
        for f in &run.flows {
            if let Some(r) = &f.rx
                && r.received != run.limit
            {
                return Err(format!(
                    "flow {}: {} messages arrived, {} were to be sent",
                    f.id, r.received, run.limit
                ));
            }
        }
    }
    let cpu = crate::cpu::process_time()
        .zip(cpu0)
        .map(|(b, a)| b.saturating_sub(a));
    let virtual_time = run.fabric.as_ref().zip(v0).map(|(f, v)| f.now() - v);
    // On the virtual clock this thread alone ran the run (the driver: engines and event loop).
    let as_cpu = |wall| match virtual_time {
        Some(_) => in_cpu(wall, cpu, elapsed),
        None => wall,
    };
    // Two processes: the ends part (outside what is measured).
    if marker {
        run.linger(role);
    }
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
    let (sent, received) = (run.sent * msg, run.received * msg);
    // What this end moved: the client's sends, else what arrived.
    let moved = if role == Role::Client { sent } else { received };
    // At least one message, however large; otherwise at most 64 MiB.
    let working = (run.flows.len() as u64 * window * msg)
        .min(64 << 20)
        .max(msg);
    Ok(Measured {
        role,
        inflight: window as u32,
        messages_sent: run.sent,
        messages_received: run.received,
        bytes_sent: sent,
        bytes_received: received,
        verified: !args.no_payload,
        elapsed,
        virtual_time,
        stats,
        failover_retransmits: failover,
        nic,
        cpu,
        check: as_cpu(run.payload.time),
        nic_time: virtual_time.map(|_| as_cpu(run.nic_time)),
        // Nothing to copy with 0-byte messages or without payloads (and a copy of every byte
        // would be most of what a `--no-payload` run executes).
        memcpy_gbps: if msg == 0 || args.no_payload {
            0.0
        } else {
            softnic::baseline::memcpy_gbps(moved.max(msg), msg, working)
        },
        congestion: run.steady.as_mut().and_then(|s| s.result.take()),
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
    s.probe_retransmits += b.probe_retransmits;
    s.nic_probes += b.nic_probes;
    s.ack_requests += b.ack_requests;
    s.ack_answers += b.ack_answers;
    s.acks_sent += b.acks_sent;
    s.ack_packets += b.ack_packets;
    s.acks_received += b.acks_received;
    s.cqes += b.cqes;
    s.polls += b.polls;
    s.chunks_received += b.chunks_received;
    s.credit_stalls += b.credit_stalls;
    s.window_stalls += b.window_stalls;
    s.host_delayed_samples += b.host_delayed_samples;
    s.dropped_duplicate += b.dropped_duplicate;
    s.dropped_invalid += b.dropped_invalid;
    s.dropped_out_of_window += b.dropped_out_of_window;
    s.messages_sent += b.messages_sent;
    s.messages_received += b.messages_received;
    s.bytes_received += b.bytes_received;
    s.writes_received += b.writes_received;
    s
}

/// A wall-time span of a run (softnic's event loop, the pattern checks: an `Instant` read each
/// way, where a CPU clock read is a system call) in CPU time, given the process's `cpu` over
/// the run's `elapsed` wall time. On a machine where other programs take turns, a wall span
/// also holds their turns: in CPU it is the span times the share of the run this process ran
/// (1 on an idle machine), as if the turns fell on every part of the run alike. Unscaled, the
/// turns taken inside the event loop were subtracted from the stack's own CPU (0 ns a chunk on
/// a busy machine). For a run on one thread: with more CPU than wall time (several threads)
/// the span is left as measured.
fn in_cpu(
    wall: std::time::Duration,
    cpu: Option<std::time::Duration>,
    elapsed: std::time::Duration,
) -> std::time::Duration {
    match cpu {
        Some(c) if c < elapsed => wall.mul_f64(c.as_secs_f64() / elapsed.as_secs_f64()),
        _ => wall,
    }
}

#[cfg(test)]
mod tests {
    use super::in_cpu;
    use std::time::Duration;

    #[test]
    fn wall_spans_count_the_share_of_the_run_the_process_ran() {
        let ms = Duration::from_millis;
        // An idle machine: the process ran all along.
        assert_eq!(in_cpu(ms(30), Some(ms(100)), ms(100)), ms(30));
        // Others took half the turns: half of the span was this process's.
        assert_eq!(in_cpu(ms(30), Some(ms(50)), ms(100)), ms(15));
        // More CPU than wall time (several threads), no CPU clock, no time at all: as measured.
        assert_eq!(in_cpu(ms(30), Some(ms(150)), ms(100)), ms(30));
        assert_eq!(in_cpu(ms(30), None, ms(100)), ms(30));
        assert_eq!(in_cpu(ms(0), Some(ms(0)), ms(0)), ms(0));
    }
}
