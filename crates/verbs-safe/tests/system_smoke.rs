//! Smoke test of the system libibverbs through `ibverbs-sys`: it links, it answers, and "no RDMA
//! hardware" (ENOSYS or an empty list, what a machine without an RDMA kernel returns) is not an
//! error.

use std::ffi::CStr;

#[test]
fn system_device_list_answers() {
    let mut n: i32 = -1;
    // SAFETY: `ibv_get_device_list` writes the count through the valid pointer it is given and
    // returns either NULL (with errno set) or a NULL-terminated array that we free below.
    let list = unsafe { ibverbs_sys::ibv_get_device_list(&mut n) };
    if list.is_null() {
        let err = std::io::Error::last_os_error();
        let errno = err.raw_os_error().unwrap_or(0);
        assert!(
            errno == libc::ENOSYS || errno == libc::ENODEV || errno == libc::ENOENT,
            "ibv_get_device_list failed with an unexpected error: {err}"
        );
        eprintln!("no RDMA hardware: ibv_get_device_list failed with {err}");
        return;
    }
    assert!(n >= 0, "device count {n} is negative");
    let mut names = Vec::new();
    for i in 0..n as usize {
        // SAFETY: `list` holds `n` valid device pointers followed by NULL.
        let dev = unsafe { *list.add(i) };
        assert!(!dev.is_null(), "entry {i} of {n} is NULL");
        // SAFETY: `dev` is a valid device; its name is a NUL-terminated string it owns.
        let name = unsafe { CStr::from_ptr(ibverbs_sys::ibv_get_device_name(dev)) };
        names.push(name.to_string_lossy().into_owned());
    }
    // SAFETY: the list came from `ibv_get_device_list` and is freed exactly once.
    unsafe { ibverbs_sys::ibv_free_device_list(list) };
    if names.is_empty() {
        eprintln!("no RDMA hardware: the device list is empty");
    } else {
        eprintln!("RDMA devices: {}", names.join(", "));
    }
}
