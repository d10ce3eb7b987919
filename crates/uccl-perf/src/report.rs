//! Printing results: a short table for people, or one JSON object.

use std::time::Duration;

use serde::Serialize;

use crate::args::{Args, OpArg, Test, TransportArg, TxMode, human_size};
use crate::transport::{Measured, Role, RunOptions};
use crate::verbs::RunResult;

fn gbps(bytes: u64, d: Duration) -> f64 {
    if d.is_zero() {
        0.0
    } else {
        bytes as f64 * 8.0 / d.as_secs_f64() / 1e9
    }
}

fn per_s(n: u64, d: Duration) -> f64 {
    if d.is_zero() {
        0.0
    } else {
        n as f64 / d.as_secs_f64()
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

fn transport(t: TransportArg) -> &'static str {
    match t {
        TransportArg::Uc => "uc",
        TransportArg::Rc => "rc",
    }
}

/// The configuration a run used, as the JSON reports it: the run's options (those left at
/// the engine's defaults with the values in effect), and this process's.
#[derive(Debug, Serialize)]
struct Config<'a> {
    test: Test,
    device: &'a str,
    role: Role,
    #[serde(flatten)]
    run: RunOptions,
    max_chain: u32,
    clock: &'static str,
    /// `--poll-interval-ns` (the virtual clock only).
    poll_interval_ns: Option<u64>,
}

/// What `--json` prints for the engine test.
#[derive(Debug, Serialize)]
struct EngineJson<'a> {
    messages_sent: u64,
    messages_received: u64,
    bytes_sent: u64,
    bytes_received: u64,
    verified: bool,
    elapsed_s: f64,
    goodput_gbps: f64,
    messages_per_s: f64,
    virtual_s: Option<f64>,
    virtual_goodput_gbps: Option<f64>,
    chunks_sent: u64,
    chunks_received: u64,
    post_send_calls: u64,
    send_wrs_posted: u64,
    wrs_per_post: f64,
    post_send_calls_per_chunk: f64,
    srq_post_calls: u64,
    srq_wrs_posted: u64,
    retransmits: u64,
    rto_retransmits: u64,
    fast_retransmits: u64,
    probe_retransmits: u64,
    nic_probes: u64,
    ack_requests: u64,
    acks_sent: u64,
    ack_packets: u64,
    cqes_polled: u64,
    cq_polls: u64,
    packets_sent: Option<u64>,
    packets_dropped: Option<u64>,
    packets_corrupted: Option<u64>,
    packets_duplicated: Option<u64>,
    packets_reordered: Option<u64>,
    nic_retransmits: Option<u64>,
    credit_stalls: u64,
    window_stalls: u64,
    host_delayed_samples: u64,
    duplicates_dropped: u64,
    cpu_s: Option<f64>,
    cpu_ns_per_chunk: Option<f64>,
    /// The process's CPU per message this end moved (sent, or received at a server).
    cpu_ns_per_message: Option<f64>,
    check_cpu_s: f64,
    nic_cpu_s: Option<f64>,
    stack_cpu_ns_per_chunk: Option<f64>,
    memcpy_gbps: f64,
    goodput_vs_memcpy: f64,
    /// The steady state on switches or in an incast (`--senders`, `--topology`).
    #[serde(flatten)]
    congestion: Option<&'a crate::transport::Congestion>,
    config: Config<'a>,
}

fn config<'a>(args: &'a Args, m: &Measured) -> Config<'a> {
    let engine = crate::transport::engine_config(args, 1);
    Config {
        test: args.test,
        device: &args.device,
        role: m.role,
        run: RunOptions::of(args).effective(&engine),
        max_chain: engine.tx.max_chain,
        clock: if args.virtual_clock() {
            "virtual"
        } else {
            "wall"
        },
        poll_interval_ns: args.virtual_clock().then_some(args.poll_interval_ns),
    }
}

/// The engine test's report.
pub(crate) fn engine(args: &Args, m: &Measured) {
    let s = &m.stats;
    let retransmits = s.retransmits() + m.failover_retransmits;
    // Each end's goodput is of what it moved: the sending side's of what it sent.
    let moved = match m.role {
        Role::Client => m.bytes_sent,
        Role::Server | Role::Both => m.bytes_received,
    };
    let goodput = gbps(moved, m.elapsed);
    // Per chunk this end moved: a server's received (its sends hand slots back), else sent.
    let chunks = match m.role {
        Role::Server => s.chunks_received,
        Role::Client | Role::Both => s.chunks_sent,
    };
    let cpu_per_chunk = m
        .cpu
        .filter(|_| chunks > 0)
        .map(|c| c.as_nanos() as f64 / chunks as f64);
    // The stack's own part: without the simulated NIC's event loop and the pattern checks.
    let stack_per_chunk = m
        .cpu
        .zip(m.nic_time)
        .filter(|_| s.chunks_sent > 0)
        .map(|(c, n)| c.saturating_sub(n + m.check).as_nanos() as f64 / s.chunks_sent as f64);
    let messages = m.messages_received.max(m.messages_sent);
    let cpu_ns_per_message = m
        .cpu
        .filter(|_| messages > 0)
        .map(|c| c.as_nanos() as f64 / messages as f64);
    let vs_memcpy = if m.memcpy_gbps > 0.0 {
        goodput / m.memcpy_gbps
    } else {
        0.0
    };
    if args.json {
        let j = EngineJson {
            messages_sent: m.messages_sent,
            messages_received: m.messages_received,
            bytes_sent: m.bytes_sent,
            bytes_received: m.bytes_received,
            verified: m.verified,
            elapsed_s: m.elapsed.as_secs_f64(),
            goodput_gbps: goodput,
            messages_per_s: per_s(m.messages_received.max(m.messages_sent), m.elapsed),
            virtual_s: m.virtual_time.map(|v| v.as_secs_f64()),
            virtual_goodput_gbps: m.virtual_time.map(|v| gbps(m.bytes_received, v)),
            chunks_sent: s.chunks_sent,
            chunks_received: s.chunks_received,
            post_send_calls: s.post_send_calls,
            send_wrs_posted: s.send_wrs,
            wrs_per_post: ratio(s.send_wrs, s.post_send_calls),
            post_send_calls_per_chunk: ratio(s.post_send_calls, s.chunks_sent),
            srq_post_calls: s.srq_posts,
            srq_wrs_posted: s.srq_wqes,
            retransmits,
            rto_retransmits: s.rto_retransmits,
            fast_retransmits: s.fast_retransmits,
            probe_retransmits: s.probe_retransmits,
            nic_probes: s.nic_probes,
            ack_requests: s.ack_requests,
            acks_sent: s.acks_sent,
            ack_packets: s.ack_packets,
            cqes_polled: s.cqes,
            cq_polls: s.polls,
            packets_sent: m.nic.map(|c| c.packets_sent),
            packets_dropped: m.nic.map(|c| c.packets_dropped),
            packets_corrupted: m.nic.map(|c| c.packets_corrupted),
            packets_duplicated: m.nic.map(|c| c.packets_duplicated),
            packets_reordered: m.nic.map(|c| c.packets_reordered),
            nic_retransmits: m.nic.map(|c| c.retransmits),
            credit_stalls: s.credit_stalls,
            window_stalls: s.window_stalls,
            host_delayed_samples: s.host_delayed_samples,
            duplicates_dropped: s.dropped_duplicate,
            cpu_s: m.cpu.map(|c| c.as_secs_f64()),
            cpu_ns_per_chunk: cpu_per_chunk,
            cpu_ns_per_message,
            check_cpu_s: m.check.as_secs_f64(),
            nic_cpu_s: m.nic_time.map(|n| n.as_secs_f64()),
            stack_cpu_ns_per_chunk: stack_per_chunk,
            memcpy_gbps: m.memcpy_gbps,
            goodput_vs_memcpy: vs_memcpy,
            congestion: m.congestion.as_ref(),
            config: config(args, m),
        };
        match serde_json::to_string(&j) {
            Ok(line) => println!("{line}"),
            Err(e) => eprintln!("uccl-perf: writing JSON: {e}"),
        }
        return;
    }
    let faults = args.faults();
    let mut fault_text = Vec::new();
    for (name, p) in [
        ("loss", faults.loss),
        ("reorder", faults.reorder),
        ("duplicate", faults.duplicate),
        ("corrupt", faults.corrupt),
    ] {
        if p > 0.0 {
            fault_text.push(format!("{}% {name}", p * 100.0));
        }
    }
    let role = match m.role {
        Role::Both => "",
        Role::Server => ", receiving side",
        Role::Client => ", sending side",
    };
    println!(
        "uccl-perf: {} {} on {}{role}, seed {}",
        transport(args.transport).to_uppercase(),
        match args.op {
            OpArg::Send => "send/recv",
            OpArg::Write => "one-sided write",
            OpArg::Read => "one-sided read",
            OpArg::Writev => "vectored write",
            OpArg::Readv => "vectored read",
        },
        if args.virtual_clock() {
            "softnic (virtual clock)".to_string()
        } else if args.soft() {
            "softnic, RoCEv2 over UDP (wall clock)".to_string()
        } else {
            format!("{} (wall clock)", args.device)
        },
        args.seed,
    );
    println!(
        "  {} flow{} x {} QPs, {} engine pair{}, {} messages in {} chunks, {} in flight per \
         flow, {} posts, {}",
        args.flows,
        if args.flows == 1 { "" } else { "s" },
        args.qps_per_flow,
        args.engines,
        if args.engines == 1 { "" } else { "s" },
        human_size(args.msg_size()),
        human_size(args.chunk_size),
        m.inflight,
        match args.tx_mode {
            TxMode::Chained => "chained",
            TxMode::Single => "single",
        },
        if fault_text.is_empty() {
            "no faults".to_string()
        } else {
            fault_text.join(", ")
        },
    );
    println!();
    let mut rows: Vec<(&str, String)> = vec![
        (
            "messages",
            format!(
                "{} sent, {} received, {}",
                m.messages_sent,
                m.messages_received,
                if m.verified && m.role == Role::Client {
                    format!(
                        "{} sent, every byte checked by the receiving side",
                        human_size(m.bytes_sent)
                    )
                } else if m.verified {
                    format!("every byte verified ({})", human_size(m.bytes_received))
                } else {
                    "not verified (--no-payload: softnic moved no data)".into()
                }
            ),
        ),
        (
            "time",
            format!(
                "{:.2} s{}",
                m.elapsed.as_secs_f64(),
                m.virtual_time.map_or(String::new(), |v| format!(
                    " ({:.2} ms of virtual time)",
                    v.as_secs_f64() * 1e3
                ))
            ),
        ),
        (
            "goodput",
            if args.msg_size() == 0 {
                format!(
                    "{:.0} messages/s of 0 bytes (no payload)",
                    per_s(m.messages_received.max(m.messages_sent), m.elapsed),
                )
            } else if m.memcpy_gbps == 0.0 {
                format!(
                    "{goodput:.2} Gb/s, {:.0} messages/s (no payload copied)",
                    per_s(m.messages_received.max(m.messages_sent), m.elapsed),
                )
            } else {
                format!(
                    "{goodput:.2} Gb/s, {:.0} messages/s (a memcpy in this run: {:.1} Gb/s; \
                     {vs_memcpy:.2}x)",
                    per_s(m.messages_received.max(m.messages_sent), m.elapsed),
                    m.memcpy_gbps,
                )
            },
        ),
    ];
    if let Some(v) = m.virtual_time {
        rows.push((
            "simulated",
            if args.msg_size() == 0 {
                format!(
                    "{:.0} messages/s on the simulated 100 Gb/s links",
                    per_s(m.messages_received, v)
                )
            } else {
                format!(
                    "{:.1} Gb/s on the simulated 100 Gb/s links",
                    gbps(m.bytes_received, v)
                )
            },
        ));
    }
    if let Some(c) = &m.congestion {
        rows.push((
            "steady",
            format!(
                "{:.0} us: bottleneck {:.3} used, {} drops ({:.1e}), {} ECN marks, queue p99 \
                 {} B; RTT p50 {:.1} / mean {:.1} / p99 {:.1} us; Jain {:.3}; messages p99 \
                 {}",
                c.window_us,
                c.bottleneck_utilization,
                c.drops,
                c.drop_ratio,
                c.ecn_marks,
                c.queue_p99_bytes,
                c.rtt_p50_us,
                c.rtt_mean_us,
                c.rtt_p99_us,
                c.jain_fairness,
                c.message_p99_us
                    .map_or_else(|| "none posted".into(), |p| format!("{p:.1} us")),
            ),
        ));
    }
    if let Some(c) = cpu_per_chunk {
        rows.push((
            "CPU",
            format!(
                "{:.2} us per chunk, {:.2} us per message ({:.2} s in all; {:.2} s of it \
                 writing and checking the data)",
                c / 1e3,
                cpu_ns_per_message.unwrap_or_default() / 1e3,
                m.cpu.unwrap_or_default().as_secs_f64(),
                m.check.as_secs_f64()
            ),
        ));
    }
    if let Some((c, n)) = stack_per_chunk.zip(m.nic_time) {
        rows.push((
            "stack CPU",
            format!(
                "{:.2} us per chunk, without the simulated NIC's event loop ({:.1} ms) and the \
                 data checks",
                c / 1e3,
                n.as_secs_f64() * 1e3
            ),
        ));
    }
    rows.extend([
        (
            "chunks",
            format!("{} sent, {} received", s.chunks_sent, s.chunks_received),
        ),
        (
            "post_send",
            format!(
                "{} WRs in {} calls: {:.1} WRs per doorbell, {:.2} calls per chunk",
                s.send_wrs,
                s.post_send_calls,
                ratio(s.send_wrs, s.post_send_calls),
                ratio(s.post_send_calls, s.chunks_sent),
            ),
        ),
        (
            "SRQ",
            format!("{} WQEs in {} posts", s.srq_wqes, s.srq_posts),
        ),
        (
            "retransmit",
            format!(
                "{retransmits} chunks ({} fast, {} probes, {} after a timeout), {} duplicates \
                 dropped; {} ACK requests before resending; {} NIC probes (RC)",
                s.fast_retransmits,
                s.probe_retransmits,
                s.rto_retransmits,
                s.dropped_duplicate,
                s.ack_requests,
                s.nic_probes,
            ),
        ),
    ]);
    if let Some(c) = m.nic {
        rows.push((
            "softnic",
            format!(
                "{} packets sent, {} dropped, {} corrupted, {} duplicated, {} reordered; RC \
                 QPs resent {}",
                c.packets_sent,
                c.packets_dropped,
                c.packets_corrupted,
                c.packets_duplicated,
                c.packets_reordered,
                c.retransmits
            ),
        ));
    }
    rows.push((
        "ACKs",
        format!(
            "{} in {} packets; {} completions polled; {} credit stalls, {} window stalls",
            s.acks_sent, s.ack_packets, s.cqes, s.credit_stalls, s.window_stalls
        ),
    ));
    for (k, v) in rows {
        println!("  {k:<12}{v}");
    }
}

fn pct(lat: &[Duration], p: f64) -> Duration {
    lat.get(((lat.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or_default()
}

/// One raw verbs run, as JSON.
#[derive(Debug, Serialize)]
struct VerbsRunJson {
    run: &'static str,
    iters: u64,
    batch: u32,
    posts: u64,
    wall_s: f64,
    msg_rate_mops: f64,
    wall_gbps: f64,
    virtual_gbps: Option<f64>,
    retransmits: Option<u64>,
    lat_p50_us: Option<f64>,
    lat_p99_us: Option<f64>,
}

/// What `--json` prints for a raw verbs test: one object, its runs inside.
#[derive(Debug, Serialize)]
struct VerbsJson<'a> {
    test: Test,
    device: &'a str,
    transport: TransportArg,
    size: u64,
    loss: f64,
    seed: u64,
    runs: Vec<VerbsRunJson>,
}

/// A raw verbs test's report.
pub(crate) fn verbs(args: &Args, results: &[RunResult]) {
    let size = args.msg_size();
    if args.json {
        let j = VerbsJson {
            test: args.test,
            device: &args.device,
            transport: args.transport,
            size,
            loss: args.loss(),
            seed: args.seed,
            runs: results
                .iter()
                .map(|r| {
                    let bytes = r.iters * size;
                    let lat = !r.latencies.is_empty();
                    VerbsRunJson {
                        run: r.name,
                        iters: r.iters,
                        batch: r.batch,
                        posts: r.posts,
                        wall_s: r.wall.as_secs_f64(),
                        msg_rate_mops: per_s(r.iters, r.wall) / 1e6,
                        wall_gbps: gbps(bytes, r.wall),
                        virtual_gbps: r.virtual_time.map(|v| gbps(bytes, v)),
                        retransmits: r.retransmits,
                        lat_p50_us: lat.then(|| pct(&r.latencies, 0.5).as_secs_f64() * 1e6),
                        lat_p99_us: lat.then(|| pct(&r.latencies, 0.99).as_secs_f64() * 1e6),
                    }
                })
                .collect(),
        };
        match serde_json::to_string(&j) {
            Ok(line) => println!("{line}"),
            Err(e) => eprintln!("uccl-perf: writing JSON: {e}"),
        }
        return;
    }
    let iters = results.first().map_or(0, |r| r.iters);
    println!(
        "uccl-perf raw verbs: {}, {}, {size} bytes x {iters} WRITEs",
        args.device,
        transport(args.transport)
    );
    if args.soft() {
        println!(
            "(softnic: 'wall' is the CPU cost of the whole software NIC; 'virtual' is the \
             simulated 100 Gb/s link)"
        );
    }
    println!(
        "{:<24} {:>6} {:>8} {:>10} {:>10} {:>12} {:>9}",
        "run", "batch", "posts", "Mmsg/s", "wall Gb/s", "virtual Gb/s", "retx"
    );
    for r in results {
        let bytes = r.iters * size;
        println!(
            "{:<24} {:>6} {:>8} {:>10.3} {:>10.3} {:>12} {:>9}",
            r.name,
            r.batch,
            r.posts,
            per_s(r.iters, r.wall) / 1e6,
            gbps(bytes, r.wall),
            r.virtual_time
                .map_or("-".into(), |v| format!("{:.2}", gbps(bytes, v))),
            r.retransmits.map_or("-".into(), |n| n.to_string()),
        );
        if !r.latencies.is_empty() {
            println!(
                "  latency (wall): p50 {:.2} us, p99 {:.2} us, max {:.2} us",
                pct(&r.latencies, 0.5).as_secs_f64() * 1e6,
                pct(&r.latencies, 0.99).as_secs_f64() * 1e6,
                pct(&r.latencies, 1.0).as_secs_f64() * 1e6,
            );
            if let Some(v) = r.virtual_time {
                println!(
                    "  latency (virtual): {:.2} us per WRITE",
                    v.as_secs_f64() * 1e6 / r.iters.max(1) as f64
                );
            }
        }
    }
    if let [chained, single] = results {
        let ratio = chained.wall.as_secs_f64().recip() / single.wall.as_secs_f64().recip();
        println!(
            "chained posts: {} doorbells instead of {}, {ratio:.2}x the message rate of one post per WR",
            chained.posts, single.posts
        );
    }
}
