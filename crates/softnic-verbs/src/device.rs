//! The process's device: built from the environment on first use, and built again in a child
//! forked after that. On a kernel a forked child opens a context of its own on the device its
//! parent uses, and none of its parent's verbs objects is the child's; here each process is
//! its own device (its own UDP socket), so a child gets a device of its own, on
//! `SOFTNIC_ADDR` if that is free and on a free address if its parent holds it. softnic
//! refuses the parent's objects in the child (its registry forgets them at the fork), so the
//! child never waits for a lock a thread of its parent held, nor takes its parent's packets.

use std::net::Ipv4Addr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

use ibverbs_sys::ibv_device;
use softnic::{Fabric, FabricConfig, Faults, Link};

/// A device built: its fabric, the devices it lists, its address.
struct Built {
    fabric: Fabric,
    /// The `ibv_device` pointers it hands out, in order (as addresses).
    devices: Vec<usize>,
    /// Its IPv4 address, if it has one.
    addr: Option<Ipv4Addr>,
}

/// The device of the process as one fork left it: built on first use (or why it could not be:
/// the errno `ibv_get_device_list` fails with).
struct Generation {
    built: OnceLock<Result<Built, i32>>,
    /// The generation of the process this one was forked from.
    parent: Option<&'static Generation>,
}

/// The device of the process that started.
static FIRST: Generation = Generation {
    built: OnceLock::new(),
    parent: None,
};

/// The generation of this process: `FIRST`, or one leaked by `after_fork_in_child`.
static CURRENT: AtomicPtr<Generation> = AtomicPtr::new((&raw const FIRST).cast_mut());

/// Whether `after_fork_in_child` is registered.
static FORK_HANDLER: AtomicBool = AtomicBool::new(false);

/// Whether `print_stats` is registered to run at exit.
static STATS_AT_EXIT: AtomicBool = AtomicBool::new(false);

fn current() -> &'static Generation {
    // SAFETY: CURRENT only ever holds `FIRST`'s address or one of a generation leaked with
    // `Box::leak`: both live for the rest of the process and are only read through `&`.
    unsafe { &*CURRENT.load(Ordering::Acquire) }
}

/// After a `fork`, in the child: a new generation, whose device is built on first use. The
/// parent's stays where it was (its lock may be held by a thread of the parent; nothing in
/// the child reaches it). A build under way in another thread of the parent is left behind
/// with it.
extern "C" fn after_fork_in_child() {
    let child = Box::leak(Box::new(Generation {
        built: OnceLock::new(),
        parent: Some(current()),
    }));
    CURRENT.store(child, Ordering::Release);
}

/// The process's device built, building it on first use.
fn built() -> Result<&'static Built, i32> {
    if !FORK_HANDLER.swap(true, Ordering::AcqRel) {
        // SAFETY: registers an `extern "C"` function that takes no arguments, to run in the
        // child of every later `fork` (in its only thread).
        let e = unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
        // ENOMEM: a forked child then keeps its parent's device, unusable there.
        debug_assert_eq!(e, 0, "pthread_atfork");
    }
    let g = current();
    g.built
        .get_or_init(|| {
            build(g.parent.is_some()).map_err(|why| {
                eprintln!("softnic: {why}");
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
    let mut ancestor = current().parent;
    while let Some(g) = ancestor {
        let listed = g.built.get().and_then(|b| b.as_ref().ok());
        if let Some(i) = listed.and_then(|b| b.devices.iter().position(|&d| d == device as usize)) {
            return built()
                .ok()
                .and_then(|b| b.devices.get(i))
                .map_or(device, |&d| d as *mut ibv_device);
        }
        ancestor = g.parent;
    }
    device
}

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
    match current().built.get() {
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
    let Some(Ok(b)) = current().built.get() else {
        return;
    };
    let Some(devices) = b.fabric.counters_at_exit() else {
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
        // The parent (or another child of it) holds the address: a free one.
        Err(softnic::Error::Bind { addr: Some(_), .. }) if forked => on(None),
        made => made,
    }
    .map_err(|e| e.to_string())?;
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
        let ip = addr.map(|a| a.to_string());
        eprintln!(
            "softnic: device soft0 on {}:4791 (RoCEv2 over UDP)",
            ip.unwrap_or_default()
        );
    }
    let devices = fabric.devices().into_iter().map(|d| d as usize).collect();
    Ok(Built {
        fabric,
        devices,
        addr,
    })
}
