//! RDMA WRITE goodput between two processes on softnic's UDP link (RoCEv2 over the loopback
//! interface, each process with its own device on its own 127.0.0.x): the raw-verbs number
//! behind softnic's two-process figure in `benches/RESULTS.md`.
//!
//! ```text
//! cargo run --release -p uccl-benches --bin udp-write-bw -- [--size BYTES] [--count N]
//!                                                           [--window W] [--json]
//! ```
//!
//! This process is the sender; it starts itself again as the receiver (`--receiver`) and the
//! two swap their GIDs, QP numbers and the WRITE target over the child's standard input and
//! output. The sender keeps `W` RC WRITEs with immediate of `BYTES` in flight until `N` have
//! completed; the receiver counts the immediates. Goodput is `N * BYTES` over the time from
//! the first post to the last completion.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softnic::{Fabric, FabricConfig, Link};
use verbs_safe::{
    AccessFlags, ConnInit, Context, Cq, Gid, LocalPort, Mtu, Poller, Qp, QpCaps, QpInit, Rc, RcRtr,
    RcRts, RecvWr, Remote, SendOp, SendWr, Verbs,
};

const FROM: LocalPort = LocalPort {
    port: 1,
    gid_index: 0,
};

struct Opts {
    size: usize,
    count: u64,
    window: usize,
    json: bool,
    receiver: bool,
}

fn opts() -> Result<Opts, String> {
    let mut o = Opts {
        size: 64 << 10,
        count: 20_000,
        window: 32,
        json: false,
        receiver: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |what: &str| -> Result<u64, String> {
            args.next()
                .and_then(|v| v.parse().ok())
                .filter(|&v| v > 0)
                .ok_or_else(|| format!("{what} takes a positive number"))
        };
        match a.as_str() {
            "--size" => o.size = num("--size")? as usize,
            "--count" => o.count = num("--count")?,
            "--window" => o.window = num("--window")? as usize,
            "--json" => o.json = true,
            "--receiver" => o.receiver = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if o.size > 1 << 30 || o.window > 1024 {
        return Err("--size is at most 1 GiB and --window at most 1024".into());
    }
    Ok(o)
}

fn main() -> ExitCode {
    let r = opts().and_then(|o| if o.receiver { receiver(&o) } else { sender(&o) });
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("udp-write-bw: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One process's device, PD, CQ and RC QP, brought up to the peer `line` describes.
struct End {
    _fabric: Fabric,
    pd: Arc<verbs_safe::Pd>,
    cq: Arc<Cq>,
    qp: Qp<Rc, verbs_safe::Reset>,
    gid: Gid,
}

fn end(o: &Opts) -> Result<End, String> {
    let fabric = Fabric::try_new(FabricConfig {
        devices: 1,
        link: Link::Udp { addr: None },
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    let verbs = Verbs::soft(&fabric);
    let e = |e: verbs_safe::Error| e.to_string();
    let ctx = Context::open_by_name(&verbs, "soft0").map_err(e)?;
    let pd = ctx.alloc_pd().map_err(e)?;
    let depth = (2 * o.window) as u32;
    let cq = Cq::new(&ctx, 2 * depth, None).map_err(e)?;
    let qp = Qp::<Rc, _>::new(
        &pd,
        QpInit {
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            caps: QpCaps {
                max_send_wr: depth,
                max_recv_wr: depth,
                ..QpCaps::default()
            },
            sig_all: true,
        },
    )
    .map_err(e)?;
    let gid = ctx.query_gid(1, 0).map_err(e)?;
    Ok(End {
        _fabric: fabric,
        pd,
        cq,
        qp,
        gid,
    })
}

fn hex(g: &Gid) -> String {
    g.0.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Gid> {
    let mut raw = [0u8; 16];
    for (i, b) in raw.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(Gid(raw))
}

/// Brings `qp` to RTS towards (gid, qpn).
fn up(
    qp: Qp<Rc, verbs_safe::Reset>,
    gid: Gid,
    qpn: u32,
) -> Result<Qp<Rc, verbs_safe::Rts>, String> {
    let remote = Remote {
        qpn,
        psn: 0,
        lid: 0,
        gid: Some(gid),
    };
    qp.init(ConnInit::with_access(AccessFlags::REMOTE_WRITE))
        .map_err(|e| e.to_string())?
        .rtr(RcRtr {
            path_mtu: Mtu::Mtu4096,
            ..RcRtr::new(remote, FROM)
        })
        .map_err(|e| e.to_string())?
        .rts(RcRts::new(0))
        .map_err(|e| e.to_string())
}

/// The receiver: a WRITE target, a receive per immediate, until `count` arrived.
fn receiver(o: &Opts) -> Result<(), String> {
    let End {
        pd, cq, qp, gid, ..
    } = end(o)?;
    let target = pd
        .alloc_dma(
            o.size * o.window,
            4096,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .map_err(|e| e.to_string())?;
    println!(
        "{} {} {} {}",
        hex(&gid),
        qp.qpn(),
        target.addr(),
        target.rkey()
    );
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let mut w = line.split_whitespace();
    let (Some(g), Some(q)) = (
        w.next().and_then(unhex),
        w.next().and_then(|q| q.parse().ok()),
    ) else {
        return Err(format!("bad peer line {line:?}"));
    };
    let qp = up(qp, g, q)?;
    let recvs = 2 * o.window;
    let mut wrs: Vec<RecvWr> = (0..recvs).map(|i| RecvWr::new(i as u64)).collect();
    // SAFETY: receives with no SGE (the WRITEs carry only immediates into them).
    unsafe { qp.post_recv(&mut wrs).map_err(|e| e.to_string())? };
    let mut poller = Poller::new();
    let mut got = 0u64;
    let deadline = Instant::now() + Duration::from_secs(120);
    while got < o.count {
        let mut n = 0;
        poller
            .poll(&cq, 64, |c| {
                if c.ok().is_ok() {
                    n += 1;
                }
            })
            .map_err(|e| e.to_string())?;
        if n > 0 {
            got += n;
            let mut wrs: Vec<RecvWr> = (0..n).map(RecvWr::new).collect();
            // SAFETY: as above.
            unsafe { qp.post_recv(&mut wrs).map_err(|e| e.to_string())? };
        } else if Instant::now() > deadline {
            return Err(format!("{got} of {} WRITEs arrived in 120 s", o.count));
        }
    }
    println!("done {got}");
    Ok(())
}

/// The sender: starts the receiver, connects, keeps `window` WRITEs in flight.
fn sender(o: &Opts) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .args([
            "--receiver",
            "--size",
            &o.size.to_string(),
            "--count",
            &o.count.to_string(),
            "--window",
            &o.window.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting the receiver: {e}"))?;
    let mut out = BufReader::new(child.stdout.take().ok_or("no pipe")?);
    let mut line = String::new();
    out.read_line(&mut line).map_err(|e| e.to_string())?;
    let mut w = line.split_whitespace();
    let peer = (|| {
        Some((
            unhex(w.next()?)?,
            w.next()?.parse::<u32>().ok()?,
            w.next()?.parse::<u64>().ok()?,
            w.next()?.parse::<u32>().ok()?,
        ))
    })()
    .ok_or_else(|| format!("bad receiver line {line:?}"))?;
    let End {
        pd, cq, qp, gid, ..
    } = end(o)?;
    let src = pd
        .alloc_mr(o.size, 4096, AccessFlags::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    writeln!(
        child.stdin.as_mut().ok_or("no pipe")?,
        "{} {}",
        hex(&gid),
        qp.qpn()
    )
    .map_err(|e| e.to_string())?;
    let qp = up(qp, peer.0, peer.1)?;
    let (addr, rkey) = (peer.2, peer.3);
    let post = |i: u64| -> Result<(), String> {
        let slot = (i as usize % o.window) * o.size;
        let mut wr = [SendWr::new(
            i,
            SendOp::WriteWithImm {
                remote_addr: addr + slot as u64,
                rkey,
                imm: i as u32,
            },
        )
        .sge(src.sge(0, o.size as u32).ok_or("SGE out of range")?)];
        // SAFETY: `src` is registered, local-only, and outlives every completion (we wait
        // for all of them before it drops).
        unsafe { qp.post_send(&mut wr).map_err(|e| e.to_string()) }
    };
    let start = Instant::now();
    let mut posted = 0u64;
    while posted < o.count.min(o.window as u64) {
        post(posted)?;
        posted += 1;
    }
    let mut done = 0u64;
    let mut poller = Poller::new();
    let deadline = start + Duration::from_secs(120);
    while done < o.count {
        let mut n = 0;
        let mut failed = None;
        poller
            .poll(&cq, 64, |c| match c.ok() {
                Ok(_) => n += 1,
                Err(f) => failed = Some(format!("{:?}", f.status())),
            })
            .map_err(|e| e.to_string())?;
        if let Some(f) = failed {
            return Err(format!("a WRITE failed: {f}"));
        }
        done += n;
        for _ in 0..n {
            if posted < o.count {
                post(posted)?;
                posted += 1;
            }
        }
        if Instant::now() > deadline {
            return Err(format!("{done} of {} WRITEs completed in 120 s", o.count));
        }
    }
    let elapsed = start.elapsed();
    let status = child.wait().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("the receiver failed ({status})"));
    }
    let gbps = (o.count * o.size as u64 * 8) as f64 / elapsed.as_secs_f64() / 1e9;
    if o.json {
        println!(
            "{}",
            serde_json::json!({
                "size": o.size, "count": o.count, "window": o.window,
                "elapsed_s": elapsed.as_secs_f64(), "goodput_gbps": gbps,
            })
        );
    } else {
        println!(
            "udp-write-bw: {} RC WRITEs of {} bytes between two processes in {:.2} s: {gbps:.2} Gb/s",
            o.count,
            o.size,
            elapsed.as_secs_f64()
        );
    }
    Ok(())
}
