//! Printing results: a perftest-like table, or one JSON object per run.

use std::time::Duration;

use crate::args::{Args, Provider, TransportArg};
use crate::bench::RunResult;

fn gbps(bytes: u64, d: Duration) -> f64 {
    if d.is_zero() {
        0.0
    } else {
        bytes as f64 * 8.0 / d.as_secs_f64() / 1e9
    }
}

fn mops(n: u64, d: Duration) -> f64 {
    if d.is_zero() {
        0.0
    } else {
        n as f64 / d.as_secs_f64() / 1e6
    }
}

fn pct(lat: &[Duration], p: f64) -> Duration {
    lat.get(((lat.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or_default()
}

pub(crate) fn print(args: &Args, results: &[RunResult]) {
    let provider = match args.provider {
        Provider::Soft => "soft",
        Provider::System => "system",
    };
    let transport = match args.transport {
        TransportArg::Rc => "rc",
        TransportArg::Uc => "uc",
    };
    if args.json {
        for r in results {
            let bytes = r.iters * args.size as u64;
            let virt = r
                .virtual_time
                .map_or("null".to_string(), |v| format!("{:.3}", gbps(bytes, v)));
            let retx = r.retransmits.map_or("null".to_string(), |n| n.to_string());
            println!(
                "{{\"test\":\"{}\",\"provider\":\"{provider}\",\"transport\":\"{transport}\",\"size\":{},\"iters\":{},\"batch\":{},\"posts\":{},\"wall_s\":{:.6},\"msg_rate_mops\":{:.4},\"wall_gbps\":{:.3},\"virtual_gbps\":{virt},\"retransmits\":{retx},\"lat_p50_us\":{:.3},\"lat_p99_us\":{:.3}}}",
                r.name,
                args.size,
                r.iters,
                r.batch,
                r.posts,
                r.wall.as_secs_f64(),
                mops(r.iters, r.wall),
                gbps(bytes, r.wall),
                pct(&r.latencies, 0.5).as_secs_f64() * 1e6,
                pct(&r.latencies, 0.99).as_secs_f64() * 1e6,
            );
        }
        return;
    }
    println!(
        "uccl-perf: {provider} provider, {transport}, {} bytes x {} WRITEs",
        args.size, args.iters
    );
    if args.provider == Provider::Soft {
        println!(
            "(softnic: 'wall' is the CPU cost of the whole software NIC; 'virtual' is the simulated 100 Gb/s link)"
        );
    }
    println!(
        "{:<24} {:>6} {:>8} {:>10} {:>10} {:>12} {:>9}",
        "run", "batch", "posts", "Mmsg/s", "wall Gb/s", "virtual Gb/s", "retx"
    );
    for r in results {
        let bytes = r.iters * args.size as u64;
        println!(
            "{:<24} {:>6} {:>8} {:>10.3} {:>10.3} {:>12} {:>9}",
            r.name,
            r.batch,
            r.posts,
            mops(r.iters, r.wall),
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
