//! What `softnic-run` preloads into a program: softnic's device among the host's interface
//! addresses, as `getifaddrs(3)` lists them.
//!
//! On a host with a RoCE NIC, the NIC's IP address is an address of one of the host's
//! interfaces, and libraries find their RDMA device through that: libfabric's verbs provider
//! (and so Open MPI's `mtl ofi`, and MPICH and NCCL over libfabric) binds an rdma_cm id to each
//! interface address and keeps those that land on a device, skipping the loopback interface.
//! softnic's device lives at an address of the loopback network (127.0.0.N, which the host
//! reaches without any interface holding it), so this library's `getifaddrs` gives the C
//! library's list and one entry more: the device's address on an interface named `lo:soft0`
//! (the form of a labelled address of `lo`, the device's net device in its sysfs view), up and
//! running, not flagged loopback (libfabric 1.17 skips flagged ones; newer versions skip the
//! one named `lo`), netmask 255.0.0.0. `freeifaddrs` frees that entry and hands the rest to
//! the C library.
//!
//! ```text
//! cargo build -p softnic-verbs      # builds this library too (target/debug/deps/)
//! target/debug/softnic-run --addr 127.0.0.2 -- hostname -I      # ... 127.0.0.2
//! target/debug/softnic-run -- mpirun -np 2 --mca pml cm --mca mtl ofi ./a.out
//! ```
//!
//! The entry is there once the process's device is up (softnic's libibverbs answers
//! `softnic_device_addr`), or, before that, when the launcher was given the device's address
//! (`SOFTNIC_ADDR`); never for a device that failed to come up, nor in a process whose
//! libibverbs is not softnic's, nor in a child forked after its parent's device came up, until
//! its own is up (it may not be on its parent's address). One entry, however many copies of
//! this library a process has preloaded. Programs that look for "the first address that is not
//! loopback" may find the device's.
//!
//! What the entry does not reach: network `ioctl`s that name `lo:soft0` reach `lo` for its
//! flags, index and MTU (the kernel drops the label, and says loopback), and fail with
//! `EADDRNOTAVAIL` for addresses (no address of `lo` has that label).

use std::ffi::{c_char, c_int, c_void};
use std::mem::{offset_of, size_of, transmute};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// The name of the device's entry.
const NAME: &[u8] = b"lo:soft0\0";

/// An entry this library adds: one allocation (`malloc`) holding the addresses and the name
/// it points to (writable, as a C caller may cut a label off in place).
#[repr(C)]
struct Entry {
    ifa: libc::ifaddrs,
    addr: libc::sockaddr_in,
    netmask: libc::sockaddr_in,
    broadcast: libc::sockaddr_in,
    name: [c_char; libc::IFNAMSIZ],
}

/// Whether `p` is an [`Entry`] this library (or another copy of it) made: its name and
/// netmask pointers point into itself where an `Entry`'s do (the C library's entries keep
/// theirs at other offsets).
fn is_ours(p: *const libc::ifaddrs, name: *const c_char, netmask: *const libc::sockaddr) -> bool {
    let at = |offset: usize| (p as usize).wrapping_add(offset);
    name as usize == at(offset_of!(Entry, name))
        && netmask as usize == at(offset_of!(Entry, netmask))
}

type GetIfaddrs = unsafe extern "C" fn(*mut *mut libc::ifaddrs) -> c_int;
type FreeIfaddrs = unsafe extern "C" fn(*mut libc::ifaddrs);
type DeviceAddr = unsafe extern "C" fn(*mut u32) -> c_int;

/// The next definition of `name` after this library's (the C library's), as an address.
/// Looked up once; no lock is taken (a child forked in the middle of a first lookup looks up
/// again).
fn next(name: &'static std::ffi::CStr) -> Option<*mut c_void> {
    static GET: AtomicUsize = AtomicUsize::new(0);
    static FREE: AtomicUsize = AtomicUsize::new(0);
    let found = if name == c"getifaddrs" { &GET } else { &FREE };
    let mut f = found.load(Ordering::Acquire);
    if f == 0 {
        // SAFETY: a NUL-terminated name, only read.
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
        found.store(f, Ordering::Release);
    }
    (f != 0).then_some(f as *mut c_void)
}

/// `SOFTNIC_ADDR`, read once (a later `setenv` of the program's does not race with it).
fn given_addr() -> Option<Ipv4Addr> {
    // 0: not read yet; 1: no address; 2 << 32 | address.
    static GIVEN: AtomicU64 = AtomicU64::new(0);
    let mut g = GIVEN.load(Ordering::Relaxed);
    if g == 0 {
        let ip = std::env::var("SOFTNIC_ADDR")
            .ok()
            .and_then(|a| a.parse::<Ipv4Addr>().ok());
        g = ip.map_or(1, |ip| 2 << 32 | u64::from(u32::from(ip)));
        GIVEN.store(g, Ordering::Relaxed);
    }
    (g >> 32 == 2).then(|| Ipv4Addr::from(g as u32))
}

/// The device's IPv4 address: from softnic's libibverbs when it is loaded (anywhere in the
/// process) and its device is up, else `SOFTNIC_ADDR` while no device came up or failed to;
/// none if the libibverbs loaded is not softnic's.
fn device_addr() -> Option<Ipv4Addr> {
    // SAFETY: a NUL-terminated name; `RTLD_NOLOAD` only looks for a library already loaded.
    let lib = unsafe {
        libc::dlopen(
            c"libibverbs.so.1".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        )
    };
    let mut state = 0;
    let mut ip = 0u32;
    if !lib.is_null() {
        // SAFETY: a handle `dlopen` gave and NUL-terminated names.
        let f = unsafe {
            libc::dlvsym(
                lib,
                c"softnic_device_addr".as_ptr(),
                c"SOFTNIC_1.0".as_ptr(),
            )
        };
        if f.is_null() {
            // Another libibverbs than softnic's.
            state = -1;
        } else {
            // SAFETY: softnic's libibverbs defines `softnic_device_addr@SOFTNIC_1.0` of this
            // type.
            let device_addr: DeviceAddr = unsafe { transmute::<*mut c_void, DeviceAddr>(f) };
            // SAFETY: `ip` is valid to write.
            state = unsafe { device_addr(&mut ip) };
        }
        // SAFETY: the handle `dlopen` gave, closed once (the library stays: it was loaded).
        unsafe { libc::dlclose(lib) };
    }
    match state {
        1 => Some(Ipv4Addr::from(ip)),
        0 => given_addr(),
        _ => None,
    }
}

/// An IPv4 socket address (port 0).
fn sockaddr(ip: Ipv4Addr) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// A fresh [`Entry`] for `ip` (null if `malloc` fails).
fn entry(ip: Ipv4Addr) -> *mut Entry {
    // SAFETY: `malloc` of a plain-data size; checked for null.
    let e = unsafe { libc::malloc(size_of::<Entry>()) }.cast::<Entry>();
    if e.is_null() {
        return e;
    }
    let mut name = [0; libc::IFNAMSIZ];
    for (d, &s) in name.iter_mut().zip(NAME) {
        *d = s as c_char;
    }
    // The loopback network: every softnic device on this host is on it.
    let broadcast = Ipv4Addr::from((u32::from(ip) & 0xff00_0000) | 0x00ff_ffff);
    // SAFETY: `e` is a fresh allocation of an `Entry`, aligned as `malloc` aligns; the
    // pointers written point into it.
    unsafe {
        e.write(Entry {
            ifa: libc::ifaddrs {
                ifa_next: std::ptr::null_mut(),
                ifa_name: std::ptr::null_mut(),
                ifa_flags: (libc::IFF_UP
                    | libc::IFF_RUNNING
                    | libc::IFF_BROADCAST
                    | libc::IFF_MULTICAST) as u32,
                ifa_addr: std::ptr::null_mut(),
                ifa_netmask: std::ptr::null_mut(),
                ifa_ifu: std::ptr::null_mut(),
                ifa_data: std::ptr::null_mut(),
            },
            addr: sockaddr(ip),
            netmask: sockaddr(Ipv4Addr::new(255, 0, 0, 0)),
            broadcast: sockaddr(broadcast),
            name,
        });
        let ifa = &raw mut (*e).ifa;
        (*ifa).ifa_name = (&raw mut (*e).name).cast();
        (*ifa).ifa_addr = (&raw mut (*e).addr).cast();
        (*ifa).ifa_netmask = (&raw mut (*e).netmask).cast();
        (*ifa).ifa_ifu = (&raw mut (*e).broadcast).cast();
    }
    e
}

/// `getifaddrs(3)`: the C library's list, then the device's entry (see the crate's doc).
///
/// # Safety
///
/// `getifaddrs`'s contract: `out` is valid to write a pointer to.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getifaddrs(out: *mut *mut libc::ifaddrs) -> c_int {
    let Some(f) = next(c"getifaddrs") else {
        // SAFETY: this thread's errno, always valid to write.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        return -1;
    };
    // SAFETY: `f` is the C library's `getifaddrs`, of this type.
    let libc_getifaddrs: GetIfaddrs = unsafe { transmute::<*mut c_void, GetIfaddrs>(f) };
    // SAFETY: `out` is valid to write, per the contract.
    let r = unsafe { libc_getifaddrs(out) };
    let Some(ip) = device_addr().filter(|_| r == 0) else {
        return r;
    };
    // The end of the list, unless an entry is there already (another copy of this library,
    // preloaded too, added it).
    let mut link = out;
    // SAFETY: `*out` is the list just made (null when empty): each entry's fields are valid
    // to read.
    unsafe {
        while !(*link).is_null() {
            let p = *link;
            if is_ours(p, (*p).ifa_name, (*p).ifa_netmask) {
                return 0;
            }
            link = &raw mut (*p).ifa_next;
        }
    }
    let e = entry(ip);
    if e.is_null() {
        // The list without the entry, as before the device is up.
        return 0;
    }
    // SAFETY: `link` is the last entry's `ifa_next` (or `*out`), valid to write; `e` is
    // valid.
    unsafe { *link = &raw mut (*e).ifa };
    0
}

/// `freeifaddrs(3)`: frees the entries this library added (unlinked first: the list that is
/// left may go to another copy of this library before the C library), and hands the rest on.
///
/// # Safety
///
/// `freeifaddrs`'s contract: `list` is null or a list `getifaddrs` gave, not yet freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn freeifaddrs(list: *mut libc::ifaddrs) {
    let mut head = list;
    let mut link: *mut *mut libc::ifaddrs = &raw mut head;
    // SAFETY: `*link` walks a list `getifaddrs` gave, not yet freed (the contract); each
    // entry is read before it is freed, and one freed is first unlinked, so the walk and
    // what is handed on never reach it.
    unsafe {
        while !(*link).is_null() {
            let p = *link;
            if is_ours(p, (*p).ifa_name, (*p).ifa_netmask) {
                *link = (*p).ifa_next;
                // This library's `Entry` (or another copy's), `malloc`ed and held by this
                // list alone.
                libc::free(p.cast());
            } else {
                link = &raw mut (*p).ifa_next;
            }
        }
    }
    let libc_list = head;
    if libc_list.is_null() {
        return;
    }
    if let Some(f) = next(c"freeifaddrs") {
        // SAFETY: `f` is the C library's `freeifaddrs`, of this type.
        let libc_freeifaddrs: FreeIfaddrs = unsafe { transmute::<*mut c_void, FreeIfaddrs>(f) };
        // SAFETY: the list the C library made, this library's entries taken out.
        unsafe { libc_freeifaddrs(libc_list) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The C library's list.
    fn libc_list() -> *mut libc::ifaddrs {
        let f = next(c"getifaddrs").expect("the C library's getifaddrs");
        // SAFETY: the C library's `getifaddrs`, of this type.
        let libc_getifaddrs: GetIfaddrs = unsafe { transmute::<*mut c_void, GetIfaddrs>(f) };
        let mut list = std::ptr::null_mut();
        // SAFETY: `list` is valid to write a pointer to.
        assert_eq!(unsafe { libc_getifaddrs(&mut list) }, 0);
        list
    }

    #[test]
    fn an_entry_names_the_device_and_is_told_from_the_c_librarys() {
        let e = entry(Ipv4Addr::new(127, 0, 9, 9));
        assert!(!e.is_null());
        // SAFETY: a fresh entry, read before it is freed.
        unsafe {
            let ifa = &(*e).ifa;
            let name = std::ffi::CStr::from_ptr(ifa.ifa_name);
            assert_eq!(name.to_bytes(), b"lo:soft0");
            let at = |p: *mut libc::sockaddr| {
                let a = &*p.cast::<libc::sockaddr_in>();
                assert_eq!(i32::from(a.sin_family), libc::AF_INET);
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr))
            };
            assert_eq!(at(ifa.ifa_addr), Ipv4Addr::new(127, 0, 9, 9));
            assert_eq!(at(ifa.ifa_netmask), Ipv4Addr::new(255, 0, 0, 0));
            assert_eq!(at(ifa.ifa_ifu), Ipv4Addr::new(127, 255, 255, 255));
            let up = (libc::IFF_UP | libc::IFF_RUNNING) as u32;
            assert_eq!(ifa.ifa_flags & up, up);
            assert_eq!(ifa.ifa_flags & libc::IFF_LOOPBACK as u32, 0);
            assert!(is_ours(&raw const (*e).ifa, ifa.ifa_name, ifa.ifa_netmask));
            // The name is the caller's to write (a label cut off in place).
            *ifa.ifa_name.add(2) = 0;
            assert!(is_ours(&raw const (*e).ifa, ifa.ifa_name, ifa.ifa_netmask));
        }
        let list = libc_list();
        let mut p = list;
        while !p.is_null() {
            // SAFETY: an entry of the C library's list, not yet freed.
            let (name, netmask, next) = unsafe { ((*p).ifa_name, (*p).ifa_netmask, (*p).ifa_next) };
            assert!(
                !is_ours(p, name, netmask),
                "a C library entry taken for this library's"
            );
            p = next;
        }
        // SAFETY: the entry, freed once: alone, and as the last of the C library's list.
        unsafe {
            freeifaddrs(&raw mut (*e).ifa);
            let e = entry(Ipv4Addr::new(127, 0, 9, 10));
            let mut last = list;
            while !last.is_null() && !(*last).ifa_next.is_null() {
                last = (*last).ifa_next;
            }
            // Two entries (as two copies of this library add, each its own), both freed, the
            // rest handed to the C library.
            let e2 = entry(Ipv4Addr::new(127, 0, 9, 11));
            (*e).ifa.ifa_next = &raw mut (*e2).ifa;
            if last.is_null() {
                freeifaddrs(&raw mut (*e).ifa);
            } else {
                (*last).ifa_next = &raw mut (*e).ifa;
                freeifaddrs(list);
            }
        }
    }
}
