//! The device's address among the host's interface addresses: a program under `softnic-run`
//! finds it in `getifaddrs` (on `lo:soft0`, up, running and not loopback, after the C
//! library's own entries, which are all kept) from the start when the launcher was given it,
//! else once the device is up; it may write the entry's name and `freeifaddrs` frees the
//! list. The preload comes after any the environment had. `--no-view` shows nothing.

use std::net::Ipv4Addr;
use std::process::Command;

/// Set for [`lister`]: the process is the one whose list is checked.
const LISTER: &str = "SOFTNIC_TEST_IFADDRS_LISTER";

/// The IPv4 entries `getifaddrs` gives, as `name address/netmask broadcast flags` (flags
/// among `up`, `running`, `loopback`). The list is freed after the caller's labels were cut
/// off in place (the name is the caller's to write), as some programs do.
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
        let ip = |a: *mut libc::sockaddr| {
            // SAFETY: an address of the entry, when there, is a socket address of its family
            // (`sockaddr_in` for `AF_INET`).
            unsafe {
                (!a.is_null() && i32::from((*a).sa_family) == libc::AF_INET).then(|| {
                    let a = &*a.cast::<libc::sockaddr_in>();
                    Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr))
                })
            }
        };
        if let Some(addr) = ip(e.ifa_addr) {
            // SAFETY: a name is a NUL-terminated string.
            let name = unsafe { std::ffi::CStr::from_ptr(e.ifa_name) };
            let mask = ip(e.ifa_netmask).map_or("-".into(), |m| m.to_string());
            let brd = ip(e.ifa_ifu).filter(|_| e.ifa_flags & libc::IFF_BROADCAST as u32 != 0);
            let flag = |f: i32, s: &'static str| (e.ifa_flags & f as u32 != 0).then_some(s);
            let flags = [
                flag(libc::IFF_UP, "up"),
                flag(libc::IFF_RUNNING, "running"),
                flag(libc::IFF_LOOPBACK, "loopback"),
            ];
            let flags: Vec<&str> = flags.into_iter().flatten().collect();
            lines.push(format!(
                "{} {addr}/{mask} {} {}",
                name.to_string_lossy(),
                brd.map_or("-".into(), |b| b.to_string()),
                flags.join(",")
            ));
            // The label cut off, in place.
            let colon = name.to_bytes().iter().position(|&c| c == b':');
            if let Some(i) = colon {
                // SAFETY: within the name, which the caller may write.
                unsafe { *e.ifa_name.add(i) = 0 };
            }
        }
        p = e.ifa_next;
    }
    // SAFETY: the list `getifaddrs` gave, freed once.
    unsafe { libc::freeifaddrs(list) };
    lines
}

/// Brings the process's device up: `ibv_get_device_list` of softnic's libibverbs (the test
/// binary does not link it: it is loaded here, from the launcher's `LD_LIBRARY_PATH`).
fn bring_the_device_up() {
    // SAFETY: NUL-terminated names; the symbol is libibverbs's `ibv_get_device_list`, of this
    // type. The library and the list it returns are left to the process's end.
    unsafe {
        let lib = libc::dlopen(c"libibverbs.so.1".as_ptr(), libc::RTLD_NOW);
        assert!(!lib.is_null(), "libibverbs.so.1 does not load");
        let f = libc::dlsym(lib, c"ibv_get_device_list".as_ptr());
        assert!(!f.is_null(), "no ibv_get_device_list");
        let get: unsafe extern "C" fn(*mut i32) -> *mut *mut libc::c_void = std::mem::transmute(f);
        let mut n = 0;
        assert!(!get(&mut n).is_null() && n == 1, "no device");
    }
}

/// The process whose list the tests check (run by them through `softnic-run`; does nothing
/// when run otherwise): prints its entries twice (a list freed and made again), brings the
/// device up, prints them again, then its preload variables.
#[test]
#[ignore = "a process of the tests below, started by them"]
fn lister() {
    if std::env::var_os(LISTER).is_none() {
        return;
    }
    println!("first: {}", entries().join("; "));
    println!("second: {}", entries().join("; "));
    bring_the_device_up();
    println!("up: {}", entries().join("; "));
    for v in ["LD_PRELOAD", "ASAN_OPTIONS"] {
        println!("{v}={}", std::env::var(v).unwrap_or_default());
    }
}

/// What [`lister`] printed under the launcher with `flags` (and `env`), by line start, and
/// the device's address as the library announced it.
struct Listed {
    out: String,
    announced: String,
}

impl Listed {
    fn line(&self, start: &str) -> &str {
        let mut l = self.out.lines().filter_map(|l| l.strip_prefix(start));
        l.next()
            .unwrap_or_else(|| panic!("no {start:?}: {}", self.out))
    }
}

fn listed(flags: &[&str], env: &[(&str, &str)]) -> Listed {
    let out = Command::new(env!("CARGO_BIN_EXE_softnic-run"))
        .args(flags)
        .arg("--")
        .arg(std::env::current_exe().expect("this test binary"))
        .args(["--exact", "lister", "--ignored", "--nocapture"])
        .env(LISTER, "1")
        .env_remove("SOFTNIC_ADDR")
        .env_remove("LD_PRELOAD")
        .env_remove("ASAN_OPTIONS")
        .envs(env.iter().copied())
        .output()
        .expect("the launcher runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    // "softnic: device soft0 on 127.0.0.N:4791 (RoCEv2 over UDP)"
    let announced = stderr
        .split_once("device soft0 on ")
        .and_then(|(_, r)| r.split_once(':'))
        .map_or_else(String::new, |(ip, _)| ip.to_string());
    Listed {
        out: format!("{stdout}{stderr}"),
        announced,
    }
}

/// The entries of this process (no preload): the C library's.
fn the_c_librarys() -> String {
    entries().join("; ")
}

/// The device's entry for `ip`.
fn device(ip: &str) -> String {
    format!("lo:soft0 {ip}/255.0.0.0 127.255.255.255 up,running")
}

#[test]
fn the_devices_address_given_to_the_launcher_is_an_interface_address_from_the_start() {
    let l = listed(&["--quiet", "--addr", "127.0.43.1"], &[]);
    let want = format!("{}; {}", the_c_librarys(), device("127.0.43.1"));
    for when in ["first: ", "second: ", "up: "] {
        assert_eq!(l.line(when), want, "{when}");
    }
}

#[test]
fn a_device_that_chose_its_address_shows_it_once_up() {
    let l = listed(&[], &[]);
    assert_eq!(l.line("first: "), the_c_librarys());
    assert!(l.announced.starts_with("127.0.0."), "{}", l.out);
    let want = format!("{}; {}", the_c_librarys(), device(&l.announced));
    assert_eq!(l.line("up: "), want);
}

#[test]
fn the_preload_comes_after_the_environments() {
    let l = listed(
        &["--quiet"],
        &[("LD_PRELOAD", "libm.so.6"), ("ASAN_OPTIONS", "")],
    );
    let preload = l.line("LD_PRELOAD=");
    assert!(
        preload.starts_with("libm.so.6:") && preload.ends_with("/libsoftnic_preload.so"),
        "{preload}"
    );
    assert_eq!(l.line("ASAN_OPTIONS="), "verify_asan_link_order=0");
    let l = listed(
        &["--quiet"],
        &[("ASAN_OPTIONS", "verify_asan_link_order=1")],
    );
    assert_eq!(l.line("ASAN_OPTIONS="), "verify_asan_link_order=1");
    let l = listed(&["--quiet"], &[("ASAN_OPTIONS", "detect_leaks=0")]);
    assert_eq!(
        l.line("ASAN_OPTIONS="),
        "detect_leaks=0:verify_asan_link_order=0"
    );
}

#[test]
fn two_copies_of_the_library_show_one_entry_and_free_it_once() {
    // The library the launcher preloads, as it says.
    let lib = listed(&["--quiet"], &[]).line("LD_PRELOAD=").to_string();
    let copy = std::env::temp_dir().join(format!("softnic-preload-copy-{}.so", std::process::id()));
    std::fs::copy(&lib, &copy).expect("a copy of the library");
    let preload = copy.to_string_lossy().into_owned();
    let l = listed(
        &["--quiet", "--addr", "127.0.43.3"],
        &[("LD_PRELOAD", &preload)],
    );
    let _ = std::fs::remove_file(&copy);
    let want = format!("{}; {}", the_c_librarys(), device("127.0.43.3"));
    for when in ["first: ", "second: ", "up: "] {
        assert_eq!(l.line(when), want, "{when}");
    }
    assert!(l.line("LD_PRELOAD=").starts_with(&format!("{preload}:")));
}

#[test]
fn no_view_no_address() {
    let l = listed(
        &["--quiet", "--no-view", "--addr", "127.0.43.2"],
        &[("LD_PRELOAD", "")],
    );
    for when in ["first: ", "up: "] {
        assert_eq!(l.line(when), the_c_librarys(), "{when}");
    }
    assert_eq!(l.line("LD_PRELOAD="), "");
}
