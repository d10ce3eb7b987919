//! Checks the RoCEv2 ICRC of every frame of a capture (classic pcap, Ethernet or Linux
//! "cooked" link type), as a receiving NIC would: `check_capture FILE.pcap`.
//!
//! `cargo xtask capture` runs it on a capture of two softnic processes talking, so that the
//! ICRC softnic computes before a datagram leaves is checked against the IP and UDP headers
//! the kernel really put on the wire. Exits non-zero naming the first bad frame.

use std::process::ExitCode;

use softnic::packet::ICRC_LEN;
use softnic::roce::{self, IPV4_LEN, UDP_LEN, UDP_PORT};

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: check_capture FILE.pcap");
        return ExitCode::FAILURE;
    };
    match check(&path) {
        Ok(n) => {
            println!("check_capture: {n} RoCEv2 frames, every ICRC right");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("check_capture: {path}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Checks every frame; how many were RoCEv2.
fn check(path: &str) -> Result<usize, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let u32_at = |b: &[u8], at: usize, le: bool| -> Option<u32> {
        let w: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
        Some(if le {
            u32::from_le_bytes(w)
        } else {
            u32::from_be_bytes(w)
        })
    };
    let le = match u32_at(&bytes, 0, true) {
        Some(0xa1b2_c3d4 | 0xa1b2_3c4d) => true,
        Some(0xd4c3_b2a1 | 0x4d3c_b2a1) => false,
        _ => return Err("not a classic pcap file".into()),
    };
    let link = u32_at(&bytes, 20, le).ok_or("truncated header")?;
    let l2 = match link {
        1 => 14,   // Ethernet
        113 => 16, // Linux cooked
        other => return Err(format!("link type {other} is neither Ethernet nor cooked")),
    };
    let (mut at, mut frame, mut roce_frames) = (24, 0, 0);
    while at < bytes.len() {
        frame += 1;
        let caplen = u32_at(&bytes, at + 8, le).ok_or("truncated record")? as usize;
        let data = bytes
            .get(at + 16..at + 16 + caplen)
            .ok_or_else(|| format!("frame {frame} is truncated"))?;
        at += 16 + caplen;
        let Some(ip) = data.get(l2..) else { continue };
        if ip.first().map(|v| v >> 4) != Some(4) || ip.get(9) != Some(&17) {
            continue;
        }
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        if ihl != IPV4_LEN || ip.len() < IPV4_LEN + UDP_LEN {
            continue;
        }
        if u16::from_be_bytes([ip[22], ip[23]]) != UDP_PORT {
            continue;
        }
        let ib = &ip[IPV4_LEN + UDP_LEN..];
        let Some(n) = ib.len().checked_sub(ICRC_LEN) else {
            return Err(format!("frame {frame}: shorter than an ICRC"));
        };
        let want = roce::icrc(&ip[..IPV4_LEN + UDP_LEN], &ib[..n]).to_le_bytes();
        if ib[n..] != want {
            return Err(format!(
                "frame {frame}: ICRC {:02x?} on the wire, {want:02x?} computed over the headers \
                 as captured",
                &ib[n..]
            ));
        }
        roce_frames += 1;
    }
    if roce_frames == 0 {
        return Err("no RoCEv2 frame in the capture".into());
    }
    Ok(roce_frames)
}
