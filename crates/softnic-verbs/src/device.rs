//! The process's device: built from the environment on first use, and built again in a child
//! forked after that. On a kernel a forked child opens a context of its own on the device its
//! parent uses, and none of its parent's verbs objects is the child's; here each process is
//! its own device (its own UDP socket), so a child gets a device of its own, on
//! `SOFTNIC_ADDR` if that is free and, if its parent holds that loopback address, on a free
//! one. softnic keeps its parent's objects out of the child's reach (see softnic's `fork.rs`),
//! so the child never waits for its parent's fabric lock, nor takes its parent's packets.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};

use ibverbs_sys::ibv_device;
use softnic::{Fabric, FabricConfig, Faults, Link, PerProcess};

/// A device built: its fabric, the devices it lists, its address.
struct Built {
    fabric: Fabric,
    /// The `ibv_device` pointers it hands out, in order (as addresses).
    devices: Vec<usize>,
    /// Its IPv4 address, if it has one.
    addr: Option<Ipv4Addr>,
}

/// The process's device: built on first use (or why it could not be: the errno
/// `ibv_get_device_list` fails with), and by a forked child for itself.
static DEVICE: PerProcess<Result<Built, i32>> = PerProcess::new();

/// Whether `print_stats` is registered to run at exit.
static STATS_AT_EXIT: AtomicBool = AtomicBool::new(false);

/// The process's device built, building it on first use.
fn built() -> Result<&'static Built, i32> {
    let forked = || DEVICE.ancestors().any(Result::is_ok);
    DEVICE
        .get_or_init(|| {
            build(forked()).map_err(|why| {
                say(&why);
                libc::EINVAL
            })
        })
        .as_ref()
        .map_err(|&e| e)
}

/// The process's fabric: one device on the UDP link, built on first use from the environment.
pub(crate) fn fabric() -> Result<&'static Fabric, i32> {
    built().map(|b| &b.fabric)
}

/// `device`, or in a forked child, for a device its parent (or an ancestor) listed, the
/// child's own device in its place: a program that got the device list before it forked
/// opens the device from that list in the child, as it may on a kernel.
pub(crate) fn own_device(device: *mut ibv_device) -> *mut ibv_device {
    let listed = DEVICE
        .ancestors()
        .filter_map(|b| b.as_ref().ok())
        .find_map(|b| b.devices.iter().position(|&d| d == device as usize));
    match listed {
        Some(i) => built()
            .ok()
            .and_then(|b| b.devices.get(i))
            .map_or(device, |&d| d as *mut ibv_device),
        None => device,
    }
}

/// `softnic_device_addr(&ip)`, for softnic-preload's `getifaddrs` (which finds it in the
/// process's libibverbs): 1 with the device's IPv4 address in `*ip` (host order) once the
/// device is up, 0 before, -1 if it failed to come up (or has no address), and -1 in a forked
/// child before its own device is up (it will not be on its parent's address). It takes no lock
/// and allocates nothing (a `getifaddrs` may run anywhere, in a child forked while the
/// fabric's lock was held too).
///
/// # Safety
///
/// `ip` is valid to write.
#[unsafe(export_name = "softnic_device_addr_v1")]
pub(crate) unsafe extern "C" fn device_addr(ip: *mut u32) -> std::ffi::c_int {
    match DEVICE.get() {
        // A forked child whose parent's device is up shows no address until its own is up:
        // it will not be on its parent's.
        None if DEVICE.is_inherited() => -1,
        None => 0,
        Some(Err(_)) => -1,
        // A device with no address (not on the UDP link): none to show.
        Some(Ok(Built { addr: None, .. })) => -1,
        Some(Ok(Built { addr: Some(a), .. })) => {
            // SAFETY: valid to write, per the contract.
            unsafe { ip.write(u32::from(*a)) };
            1
        }
    }
}
std::arch::global_asm!(".symver softnic_device_addr_v1, softnic_device_addr@@SOFTNIC_1.0");

/// Says the device's counters (and its connection manager's, if used) on standard error (at
/// exit, with `SOFTNIC_STATS=1`).
extern "C" fn print_stats() {
    let Some(Ok(b)) = DEVICE.get() else {
        return;
    };
    let Some(devices) = b.fabric.counters_at_exit() else {
        say("no counters: the fabric is held by a verb this exit interrupted");
        return;
    };
    for (name, c, cm) in devices {
        say(&format!("{name}: {c:?}"));
        // Its connection manager's, once a program used it (librdmacm).
        if cm.mads_sent + cm.mads_received > 0 {
            say(&format!("{name}: CM {cm:?}"));
        }
    }
}

/// Registers softnic's fork handlers as the library is loaded (see
/// [`softnic::watch_forks`]), before the program has threads that could fork meanwhile.
#[used]
// SAFETY: `.init_array` holds pointers to functions the loader calls with no arguments when
// the library is loaded; this entry is one, of that type, and what it runs (an atomic flag and
// `pthread_atfork`) needs nothing of the program set up first.
#[unsafe(link_section = ".init_array")]
static WATCH_FORKS: extern "C" fn() = watch_forks;

extern "C" fn watch_forks() {
    softnic::watch_forks();
}

/// Says `what` on standard error, in one `write` (not through the standard library's lock of
/// it, which a thread of the parent of a forked child may have held at the fork).
fn say(what: &str) {
    let line = format!("softnic: {what}\n");
    // SAFETY: writes the bytes of `line`, valid for its length, to descriptor 2.
    let _ = unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

/// The device the environment describes (`forked`: in a child forked from a process that
/// may hold `SOFTNIC_ADDR`).
fn build(forked: bool) -> Result<Built, String> {
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
    let on = |addr| {
        Fabric::try_new(FabricConfig {
            devices: 1,
            seed,
            mtu,
            link: Link::Udp { addr },
            ..Default::default()
        })
    };
    let fabric = match on(addr) {
        // A loopback address its parent (or another child of it) holds: a free one, from the
        // top of 127.0.0.2-254 down (the addresses programs are given are mostly low ones).
        Err(softnic::Error::Bind { addr: Some(a), .. }) if forked && a.is_loopback() => (2..=254)
            .rev()
            .map(|n| on(Some(Ipv4Addr::new(127, 0, 0, n))))
            .find(Result::is_ok)
            .unwrap_or_else(|| on(None)),
        made => made,
    }
    .map_err(|e| match e {
        softnic::Error::Bind { addr: Some(a), .. } if forked => format!(
            "{e} (a child forked after its parent used the device needs an address of its \
             own: its parent holds {a}, and only a loopback address is replaced by a free one)"
        ),
        e => e.to_string(),
    })?;
    fabric
        .set_default_faults(faults)
        .map_err(|e| e.to_string())?;
    if var("SOFTNIC_STATS").is_some_and(|v| v == "1") && !STATS_AT_EXIT.swap(true, Ordering::AcqRel)
    {
        // SAFETY: registers a function with the C ABI that takes no arguments and only reads
        // the fabric (which is never dropped) through its own lock.
        unsafe { libc::atexit(print_stats) };
    }
    let addr = fabric.udp_addr("soft0");
    if var("SOFTNIC_ANNOUNCE").is_some_and(|v| v == "1") {
        let ip = addr.map(|a| a.to_string()).unwrap_or_default();
        say(&format!("device soft0 on {ip}:4791 (RoCEv2 over UDP)"));
    }
    let devices = fabric.devices().into_iter().map(|d| d as usize).collect();
    Ok(Built {
        fabric,
        devices,
        addr,
    })
}
