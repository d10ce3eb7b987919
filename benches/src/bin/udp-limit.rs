//! The kernel's own UDP limit on this machine: what a sender with GSO and a receiver with GRO
//! move over the loopback interface, the ceiling of any software NIC's UDP link here. The
//! baseline of bench-table's row 12, beside `ib_write_bw` on softnic's link.
//!
//! ```text
//! cargo run --release -p uccl-benches --bin udp-limit -- [--seconds S] [--segment BYTES] [--json]
//! ```
//!
//! One thread sends datagrams of `--segment` bytes (4128 by default: a RoCEv2 RDMA WRITE
//! packet of 4 KiB, its transport headers and ICRC) as GSO sends of up to 64 KB to
//! `127.0.0.2:4792`; another receives them with GRO, into 64 KB buffers. The figure is what
//! arrived, in Gb/s of UDP payload, over the sending time.

#![deny(unsafe_code)]

use std::net::{SocketAddrV4, UdpSocket};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::sys::socket::{setsockopt, sockopt};

const ADDR: &str = "127.0.0.2:4792";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("udp-limit: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let mut seconds = 2.0f64;
    let mut segment = 4128usize;
    let mut json = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .and_then(|v| v.parse::<f64>().ok())
                .ok_or_else(|| format!("{name} needs a number"))
        };
        match a.as_str() {
            "--seconds" => seconds = value("--seconds")?,
            "--segment" => segment = value("--segment")? as usize,
            "--json" => json = true,
            _ => {
                return Err(format!(
                    "unknown argument `{a}` (--seconds S, --segment BYTES, --json)"
                ));
            }
        }
    }
    if !(64..=8192).contains(&segment) {
        return Err(format!("--segment {segment}: must be 64..=8192 bytes"));
    }
    let to: SocketAddrV4 = ADDR.parse().map_err(|e| format!("{ADDR}: {e}"))?;
    let rx = UdpSocket::bind(to).map_err(|e| format!("binding {to}: {e}"))?;
    setsockopt(&rx, sockopt::UdpGroSegment, &true).map_err(|e| format!("UDP_GRO: {e}"))?;
    setsockopt(&rx, sockopt::RcvBufForce, &(64 << 20)).or_else(|_| {
        setsockopt(&rx, sockopt::RcvBuf, &(64 << 20)).map_err(|e| format!("SO_RCVBUF: {e}"))
    })?;
    rx.set_read_timeout(Some(Duration::from_millis(100)))
        .map_err(|e| e.to_string())?;
    let tx = UdpSocket::bind("127.0.0.1:0").map_err(|e| format!("binding a sender: {e}"))?;
    setsockopt(&tx, sockopt::UdpGsoSegment, &(segment as i32))
        .map_err(|e| format!("UDP_SEGMENT: {e}"))?;
    let sending = Arc::new(AtomicBool::new(true));
    let receiver = {
        let sending = Arc::clone(&sending);
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 65_536];
            let mut bytes = 0u64;
            loop {
                match rx.recv(&mut buf) {
                    Ok(n) => bytes += n as u64,
                    Err(_) if !sending.load(Ordering::Relaxed) => return bytes,
                    Err(_) => {}
                }
            }
        })
    };
    // As many whole segments as one GSO send takes (64 KB of payload at most).
    let batch = vec![0xa5u8; (65_507 / segment) * segment];
    let (start, mut sent) = (Instant::now(), 0u64);
    let length = Duration::from_secs_f64(seconds);
    while start.elapsed() < length {
        if let Ok(n) = tx.send_to(&batch, to) {
            sent += n as u64;
        }
    }
    let elapsed = start.elapsed();
    sending.store(false, Ordering::Relaxed);
    let received = receiver.join().map_err(|_| "the receiver panicked")?;
    let gbps = |b: u64| b as f64 * 8.0 / elapsed.as_secs_f64() / 1e9;
    if json {
        println!(
            "{{\"segment\":{segment},\"seconds\":{:.3},\"sent_gbps\":{:.3},\"received_gbps\":{:.3}}}",
            elapsed.as_secs_f64(),
            gbps(sent),
            gbps(received)
        );
    } else {
        println!(
            "UDP over loopback, GSO/GRO, {segment}-byte datagrams: {:.2} Gb/s received ({:.2} \
             sent) in {:.2} s",
            gbps(received),
            gbps(sent),
            elapsed.as_secs_f64()
        );
    }
    Ok(())
}
