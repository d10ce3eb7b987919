//! softnic as a drop-in `libibverbs.so.1`: unmodified libibverbs programs (rdma-core's
//! `ibv_*_pingpong`, perftest, anything linked with `-libverbs`) run on a softnic device.
//!
//! This crate builds a shared library with libibverbs's soname and symbol versions
//! (`IBVERBS_1.0`, `IBVERBS_1.1`, ... , `IBVERBS_PRIVATE_34`), whose verbs are served by
//! [softnic]: one device, `soft0`, on softnic's UDP link (RoCEv2 over UDP to any other
//! softnic process or host), and the `softnic-run` launcher that runs a program with it in
//! place of the system library:
//!
//! ```text
//! cargo build --release -p softnic-verbs
//! target/release/softnic-run -- ibv_rc_pingpong -g 0 &
//! target/release/softnic-run -- ibv_rc_pingpong -g 0 127.0.0.1
//! ```
//!
//! The hot path (post, poll, notify) goes through the `ibv_context.ops` softnic fills, as
//! rdma-core's inline helpers call it; so do memory windows (`ibv_alloc_mw`, `ibv_bind_mw`,
//! `ibv_dealloc_mw`, and `IBV_WR_BIND_MW`, `IBV_WR_LOCAL_INV`, `IBV_WR_SEND_WITH_INV` work
//! requests). The extended verbs, which programs also reach through inline helpers, are
//! served by softnic's `verbs_context` around each context: `ibv_query_port` (the whole
//! `ibv_port_attr`), `ibv_query_device_ex`, `ibv_create_cq_ex` (an `ibv_cq_ex` with
//! `ibv_start_poll`/`ibv_next_poll`/`ibv_end_poll` and the `ibv_wc_read_*` fields),
//! `ibv_create_qp_ex` with send ops and `ibv_qp_to_qp_ex` (the `ibv_wr_*` post API: sends,
//! writes, reads, atomics, atomic writes and flushes, window binds and invalidations, SGE
//! lists, inline data, UD addresses; `ibv_wr_complete` posts a batch all or nothing),
//! on-demand paging (explicit and implicit regions, `ibv_advise_mr`), completion timestamps
//! and `ibv_query_rt_values_ex`.
//! What is not served fails cleanly (`EOPNOTSUPP`, or `NULL` with `errno`: device memory,
//! flows, XRC, raw packet QPs), never by reaching the system library with one of softnic's
//! objects. A context's `cmd_fd` is a real descriptor; `ibv_read_sysfs_file` reads the
//! device's sysfs view that `softnic-run` shows (`/sys/class/infiniband/soft0`).
//!
//! The port's GID table is rxe's on a RoCE port: index 0 the link-local GID
//! `fe80::ffff:a.b.c.d`, index 1 the IPv4-mapped `::ffff:a.b.c.d`, both RoCE v2 and both
//! reaching the device. Packets travel over IPv4 either way, so a UD receiver's GRH names the
//! sender by its IPv4-mapped GID.
//!
//! The device is configured from the environment (the launcher sets it from its flags):
//! `SOFTNIC_ADDR` (the device's IPv4 address; default: a free one in 127.0.0.2-254),
//! `SOFTNIC_SEED`, `SOFTNIC_LOSS`, `SOFTNIC_REORDER`, `SOFTNIC_DUPLICATE`, `SOFTNIC_CORRUPT`
//! (seeded faults on what the device sends), `SOFTNIC_MTU`, `SOFTNIC_ANNOUNCE=1` to say on
//! standard error which address the device took, and `SOFTNIC_STATS=1` to print the device's
//! counters there when the program exits (and its connection manager's, after rdma_cm use). A
//! bad value makes `ibv_get_device_list` fail with `EINVAL` after saying why on standard error.

#[macro_use]
mod export;
mod cm;
mod compat;
mod exports;
mod strings;

use std::net::Ipv4Addr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use softnic::{Fabric, FabricConfig, Faults, Link};

static FABRIC: OnceLock<Result<Fabric, i32>> = OnceLock::new();

/// The device's IPv4 address, stored when the fabric is built.
static ADDR: AtomicU32 = AtomicU32::new(0);

/// `softnic_device_addr(&ip)`, for softnic-preload's `getifaddrs` (which finds it in the
/// process's libibverbs): 1 with the device's IPv4 address in `*ip` (host order) once the
/// device is up, 0 before, -1 if it failed to come up (or has no address). It takes no lock
/// (a `getifaddrs` may run anywhere, in a child forked while the fabric's lock was held too).
///
/// # Safety
///
/// `ip` is valid to write.
#[unsafe(export_name = "softnic_device_addr_v1")]
pub(crate) unsafe extern "C" fn device_addr(ip: *mut u32) -> std::ffi::c_int {
    match FABRIC.get() {
        None => 0,
        Some(Err(_)) => -1,
        // A device with no address (not on the UDP link): none to show.
        Some(Ok(_)) if ADDR.load(Ordering::Relaxed) == 0 => -1,
        Some(Ok(_)) => {
            // SAFETY: valid to write, per the contract.
            unsafe { ip.write(ADDR.load(Ordering::Relaxed)) };
            1
        }
    }
}
std::arch::global_asm!(".symver softnic_device_addr_v1, softnic_device_addr@@SOFTNIC_1.0");

/// Says the device's counters (and its connection manager's, if used) on standard error (at
/// exit, with `SOFTNIC_STATS=1`).
extern "C" fn print_stats() {
    let Some(Ok(f)) = FABRIC.get() else { return };
    let Some(devices) = f.counters_at_exit() else {
        eprintln!("softnic: no counters: the fabric is held by a verb this exit interrupted");
        return;
    };
    for (name, c, cm) in devices {
        eprintln!("softnic: {name}: {c:?}");
        // Its connection manager's, once a program used it (librdmacm).
        if cm.mads_sent + cm.mads_received > 0 {
            eprintln!("softnic: {name}: CM {cm:?}");
        }
    }
}

/// The process's fabric: one device on the UDP link, built on first use from the environment.
pub(crate) fn fabric() -> Result<&'static Fabric, i32> {
    FABRIC
        .get_or_init(|| {
            build().map_err(|why| {
                eprintln!("softnic: {why}");
                libc::EINVAL
            })
        })
        .as_ref()
        .map_err(|&e| e)
}

/// The fabric the environment describes.
fn build() -> Result<Fabric, String> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let parse = |name: &str| -> Result<Option<f64>, String> {
        var(name)
            .map(|v| {
                v.parse::<f64>()
                    .ok()
                    .filter(|p| (0.0..=1.0).contains(p))
                    .ok_or_else(|| format!("{name}={v:?} is not a probability in 0..=1"))
            })
            .transpose()
    };
    let addr = var("SOFTNIC_ADDR")
        .map(|a| {
            a.parse::<Ipv4Addr>()
                .map_err(|_| format!("SOFTNIC_ADDR={a:?} is not an IPv4 address"))
        })
        .transpose()?;
    let seed = var("SOFTNIC_SEED")
        .map(|s| {
            s.parse::<u64>()
                .map_err(|_| format!("SOFTNIC_SEED={s:?} is not a number"))
        })
        .transpose()?
        .unwrap_or(1);
    let mtu = var("SOFTNIC_MTU")
        .map(|m| {
            m.parse::<u32>()
                .ok()
                .filter(|m| [256, 512, 1024, 2048, 4096].contains(m))
                .ok_or_else(|| format!("SOFTNIC_MTU={m:?} is not 256, 512, 1024, 2048 or 4096"))
        })
        .transpose()?
        .unwrap_or(4096);
    let faults = Faults {
        loss: parse("SOFTNIC_LOSS")?.unwrap_or(0.0),
        reorder: parse("SOFTNIC_REORDER")?.unwrap_or(0.0),
        duplicate: parse("SOFTNIC_DUPLICATE")?.unwrap_or(0.0),
        corrupt: parse("SOFTNIC_CORRUPT")?.unwrap_or(0.0),
        ..Faults::NONE
    };
    let fabric = Fabric::try_new(FabricConfig {
        devices: 1,
        seed,
        mtu,
        link: Link::Udp { addr },
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    fabric
        .set_default_faults(faults)
        .map_err(|e| e.to_string())?;
    if var("SOFTNIC_STATS").is_some_and(|v| v == "1") {
        // SAFETY: registers a function with the C ABI that takes no arguments and only reads
        // the fabric (which is never dropped) through its own lock.
        unsafe { libc::atexit(print_stats) };
    }
    let ip = fabric.udp_addr("soft0");
    // Published with the fabric (`FABRIC`'s initialisation orders this store before it).
    ADDR.store(ip.map_or(0, u32::from), Ordering::Relaxed);
    if var("SOFTNIC_ANNOUNCE").is_some_and(|v| v == "1") {
        let ip = ip.map(|a| a.to_string());
        eprintln!(
            "softnic: device soft0 on {}:4791 (RoCEv2 over UDP)",
            ip.unwrap_or_default()
        );
    }
    Ok(fabric)
}
