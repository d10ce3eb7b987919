//! The device's address among the host's interface addresses: a program under `softnic-run`
//! finds it in `getifaddrs` (on `lo:soft0`, up and not loopback, after the C library's own
//! entries) from the start when the launcher was given it, else once the device is up; and
//! `freeifaddrs` frees the list. `--no-view` shows nothing.

use std::net::Ipv4Addr;
use std::process::Command;

/// Set for [`lister`]: the process is the one whose list is checked.
const LISTER: &str = "SOFTNIC_TEST_IFADDRS_LISTER";

/// The IPv4 entries `getifaddrs` gives, as `name address flags` lines (`up`, `loopback`).
fn entries() -> Vec<String> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `list` is valid to write a pointer to.
    let r = unsafe { libc::getifaddrs(&mut list) };
    assert_eq!(r, 0, "getifaddrs fails");
    let mut lines = Vec::new();
    let mut p = list;
    while !p.is_null() {
        // SAFETY: an entry of the list `getifaddrs` gave, not yet freed.
        let e = unsafe { &*p };
        // SAFETY: as above: a name is a NUL-terminated string; an address, when there, is a
        // socket address of its family (`sockaddr_in` for `AF_INET`).
        unsafe {
            if !e.ifa_addr.is_null() && i32::from((*e.ifa_addr).sa_family) == libc::AF_INET {
                let a = &*e.ifa_addr.cast::<libc::sockaddr_in>();
                let name = std::ffi::CStr::from_ptr(e.ifa_name).to_string_lossy();
                let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
                let flag = |f: i32, s: &'static str| (e.ifa_flags & f as u32 != 0).then_some(s);
                let flags = [
                    flag(libc::IFF_UP, "up"),
                    flag(libc::IFF_LOOPBACK, "loopback"),
                ];
                let flags: Vec<&str> = flags.into_iter().flatten().collect();
                lines.push(format!("{name} {ip} {}", flags.join(",")));
            }
        }
        p = e.ifa_next;
    }
    // SAFETY: the list `getifaddrs` gave, freed once.
    unsafe { libc::freeifaddrs(list) };
    lines
}

/// Brings the process's device up: `ibv_get_device_list` of the preloaded library (none
/// under `--no-view`, which does not preload it).
fn bring_the_device_up() {
    // SAFETY: a NUL-terminated name; the symbol, when found, is libibverbs's
    // `ibv_get_device_list`, of this type. The list it returns is left to the process's end.
    unsafe {
        let f = libc::dlsym(libc::RTLD_DEFAULT, c"ibv_get_device_list".as_ptr());
        if f.is_null() {
            return;
        }
        let get: unsafe extern "C" fn(*mut i32) -> *mut *mut libc::c_void = std::mem::transmute(f);
        let mut n = 0;
        assert!(!get(&mut n).is_null() && n == 1, "no device");
    }
}

/// The process whose list the tests check (run by them through `softnic-run`; does nothing
/// when run otherwise): prints its entries, then brings the device up and prints them again.
#[test]
#[ignore = "a process of the tests below, started by them"]
fn lister() {
    if std::env::var_os(LISTER).is_none() {
        return;
    }
    for _ in 0..2 {
        // Twice: a list freed (the added entry with it) and made again.
        println!("before: {}", entries().join("; "));
    }
    bring_the_device_up();
    println!("after: {}", entries().join("; "));
}

/// [`lister`]'s two lines (before and after the device is up) under the launcher with
/// `flags`, and the device's address as the library announced it.
fn listed(flags: &[&str]) -> (String, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_softnic-run"))
        .args(flags)
        .arg("--")
        .arg(std::env::current_exe().expect("this test binary"))
        .args(["--exact", "lister", "--ignored", "--nocapture"])
        .env(LISTER, "1")
        .output()
        .expect("the launcher runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    let line = |start: &str| {
        let mut l = stdout.lines().filter_map(|l| l.strip_prefix(start));
        l.next_back()
            .unwrap_or_else(|| panic!("no {start:?}: {stdout}{stderr}"))
            .to_string()
    };
    // "softnic: device soft0 on 127.0.0.N:4791 (RoCEv2 over UDP)"
    let announced = stderr
        .split_once("device soft0 on ")
        .and_then(|(_, r)| r.split_once(':'))
        .map_or_else(String::new, |(ip, _)| ip.to_string());
    (line("before: "), line("after: "), announced)
}

#[test]
fn the_devices_address_given_to_the_launcher_is_an_interface_address_from_the_start() {
    let (before, after, _) = listed(&["--quiet", "--addr", "127.0.43.1"]);
    for l in [&before, &after] {
        assert!(l.ends_with("; lo:soft0 127.0.43.1 up"), "{l}");
        // The C library's entries are all there, before it.
        assert!(l.starts_with("lo 127.0.0.1 up,loopback"), "{l}");
        assert_eq!(l.matches("lo:soft0").count(), 1, "{l}");
    }
}

#[test]
fn a_device_that_chose_its_address_shows_it_once_up() {
    let (before, after, ip) = listed(&[]);
    assert!(!before.contains("soft0"), "{before}");
    assert!(
        ip.starts_with("127.0.0."),
        "the device's address is announced: {ip:?}"
    );
    assert!(after.ends_with(&format!("lo:soft0 {ip} up")), "{after}");
}

#[test]
fn no_view_no_address() {
    let (before, after, _) = listed(&["--quiet", "--no-view", "--addr", "127.0.43.2"]);
    assert!(
        !before.contains("soft0") && !after.contains("soft0"),
        "{before}\n{after}"
    );
    assert!(before.starts_with("lo 127.0.0.1 up,loopback"), "{before}");
}
