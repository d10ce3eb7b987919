//! The device's address among the host's interface addresses: `getifaddrs(3)` and
//! `freeifaddrs(3)`, in front of the C library's (`softnic-run` preloads this library).
//!
//! On a host with a RoCE NIC, the NIC's IP address is an address of one of the host's
//! interfaces, and libraries find their RDMA device through that: libfabric's verbs provider
//! (hence Open MPI's `mtl ofi`, MPICH, NCCL's libfabric plugin) binds an rdma_cm id to each
//! non-loopback address `getifaddrs` lists and keeps those that land on a device. softnic's
//! device lives at an address of the loopback network (127.0.0.N, which the host reaches
//! without any interface holding it), so the list gets one more entry: the device's address,
//! on an interface named `lo:soft0` (the label form Linux gives a second address of `lo`, the
//! device's net device in its sysfs view), up and not flagged loopback, as a NIC's port is.
//! Network `ioctl`s that name it reach `lo` (the kernel drops the label).
//!
//! The entry is there once the process's device is up (its first `ibv_get_device_list`), or
//! from the start when its address was given (`SOFTNIC_ADDR`, `softnic-run --addr`). A
//! device that failed to come up shows nothing.

use std::ffi::{c_char, c_int, c_void};
use std::mem::{size_of, transmute};
use std::net::Ipv4Addr;
use std::sync::OnceLock;

use crate::exports::set_errno;

/// The interface name of the device's entry. Its address marks the entries this library
/// made: `freeifaddrs` frees those itself.
static NAME: [u8; 9] = *b"lo:soft0\0";

/// An entry this library adds, in one allocation (`malloc`) with the addresses it points to.
#[repr(C)]
struct Entry {
    ifa: libc::ifaddrs,
    addr: libc::sockaddr_in,
    netmask: libc::sockaddr_in,
    broadcast: libc::sockaddr_in,
}

type GetIfaddrs = unsafe extern "C" fn(*mut *mut libc::ifaddrs) -> c_int;
type FreeIfaddrs = unsafe extern "C" fn(*mut libc::ifaddrs);

/// The C library's definition of `name@GLIBC_2.3`, the next one after this library's.
fn next(name: &'static [u8]) -> Option<*mut c_void> {
    static FOUND: OnceLock<[usize; 2]> = OnceLock::new();
    let [get, free] = *FOUND.get_or_init(|| {
        [&b"getifaddrs\0"[..], &b"freeifaddrs\0"[..]].map(|n| {
            // SAFETY: both strings are NUL-terminated; `dlvsym` only reads them.
            let f =
                unsafe { libc::dlvsym(libc::RTLD_NEXT, n.as_ptr().cast(), c"GLIBC_2.3".as_ptr()) };
            f as usize
        })
    });
    let f = if name == b"getifaddrs" { get } else { free };
    (f != 0).then_some(f as *mut c_void)
}

/// The device's IPv4 address, if it is known without bringing the device up.
fn device_addr() -> Option<Ipv4Addr> {
    match crate::FABRIC.get() {
        Some(Ok(f)) => f.udp_addr("soft0"),
        Some(Err(_)) => None,
        None => std::env::var("SOFTNIC_ADDR").ok()?.parse().ok(),
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

/// `getifaddrs(3)`: the C library's list, then the device's entry (see the module's doc).
///
/// # Safety
///
/// `getifaddrs`'s contract: `out` is valid to write a pointer to.
#[unsafe(export_name = "softnic_getifaddrs")]
pub(crate) unsafe extern "C" fn getifaddrs(out: *mut *mut libc::ifaddrs) -> c_int {
    let Some(f) = next(b"getifaddrs") else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: `f` is the C library's `getifaddrs`, of this type.
    let libc_getifaddrs: GetIfaddrs = unsafe { transmute::<*mut c_void, GetIfaddrs>(f) };
    // SAFETY: `out` is valid to write, per the contract.
    let r = unsafe { libc_getifaddrs(out) };
    let Some(ip) = device_addr().filter(|_| r == 0) else {
        return r;
    };
    // SAFETY: `malloc` of a plain-data size; checked for null below.
    let e = unsafe { libc::malloc(size_of::<Entry>()) }.cast::<Entry>();
    if e.is_null() {
        // The list without the entry, as with a device not yet up.
        return 0;
    }
    let net = Ipv4Addr::from(u32::from(ip) & 0xff00_0000);
    // SAFETY: `e` is a fresh allocation of an `Entry`, aligned as `malloc` aligns; the
    // pointers written point into it (or to the static name, which the C API does not write).
    unsafe {
        e.write(Entry {
            ifa: libc::ifaddrs {
                ifa_next: std::ptr::null_mut(),
                ifa_name: NAME.as_ptr().cast::<c_char>().cast_mut(),
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
            // The loopback network: every other softnic device on this host is on it.
            netmask: sockaddr(Ipv4Addr::new(255, 0, 0, 0)),
            broadcast: sockaddr(Ipv4Addr::from(u32::from(net) | 0x00ff_ffff)),
        });
        let ifa = &mut (*e).ifa;
        ifa.ifa_addr = (&raw mut (*e).addr).cast();
        ifa.ifa_netmask = (&raw mut (*e).netmask).cast();
        ifa.ifa_ifu = (&raw mut (*e).broadcast).cast();
    }
    // Appended at the list's end.
    // SAFETY: `*out` is the list the C library just made (or null when empty): each entry's
    // `ifa_next` is valid to read and write.
    unsafe {
        let mut link = out;
        while !(*link).is_null() {
            link = &raw mut (**link).ifa_next;
        }
        *link = &raw mut (*e).ifa;
    }
    0
}
std::arch::global_asm!(".symver softnic_getifaddrs, getifaddrs@@GLIBC_2.3");

/// `freeifaddrs(3)`: frees the entries this library added, and the C library's list.
///
/// # Safety
///
/// `freeifaddrs`'s contract: `list` is null or a list `getifaddrs` gave and not yet freed.
#[unsafe(export_name = "softnic_freeifaddrs")]
pub(crate) unsafe extern "C" fn freeifaddrs(list: *mut libc::ifaddrs) {
    let mut libc_list: *mut libc::ifaddrs = std::ptr::null_mut();
    let mut p = list;
    while !p.is_null() {
        // SAFETY: an entry of a list `getifaddrs` gave, not yet freed (the contract).
        let next = unsafe { (*p).ifa_next };
        // SAFETY: as above.
        if unsafe { (*p).ifa_name }.cast_const() == NAME.as_ptr().cast::<c_char>() {
            // SAFETY: this library's entry: the start of an `Entry` it `malloc`ed, which the
            // list held alone.
            unsafe { libc::free(p.cast()) };
        } else if libc_list.is_null() {
            libc_list = p;
        }
        p = next;
    }
    if libc_list.is_null() {
        return;
    }
    if let Some(f) = next(b"freeifaddrs") {
        // SAFETY: `f` is the C library's `freeifaddrs`, of this type.
        let libc_freeifaddrs: FreeIfaddrs = unsafe { transmute::<*mut c_void, FreeIfaddrs>(f) };
        // SAFETY: the head of the list the C library made (this library's entries follow it).
        unsafe { libc_freeifaddrs(libc_list) };
    }
}
std::arch::global_asm!(".symver softnic_freeifaddrs, freeifaddrs@@GLIBC_2.3");
