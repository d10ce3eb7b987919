//! The exported verbs: each is a Rust function exported as `softnic_<name>` and bound, by an
//! assembler `.symver`, to `<name>@@<version>` as libibverbs defines it (the version nodes are
//! in `ibverbs.map`). Most hand their arguments to softnic's control path, which checks every
//! pointer it is given against the objects it made.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::ptr::null_mut;

use ibverbs_sys::*;
use softnic::CONTROL;

use crate::{fabric, own_device, strings};

/// Sets `errno`.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: `__errno_location` returns this thread's errno, always valid to write.
    unsafe { *libc::__errno_location() = e };
}

/// `errno` set to `e`, and -1 (the convention of the verbs that return -1 on failure).
fn minus_one(e: c_int) -> c_int {
    if e == 0 {
        return 0;
    }
    set_errno(e);
    -1
}

/// `errno` set to `e`, and a null pointer.
pub(crate) fn fail<T>(e: c_int) -> *mut T {
    set_errno(e);
    null_mut()
}

/// The address handle attributes that reach the sender of UD completion `wc` from `port`;
/// `None` if `wc` is null, or says a GRH is there and `grh` is null.
///
/// # Safety
///
/// `wc` is null or valid; when the completion has `IBV_WC_GRH`, `grh` is null or points to
/// the 40 bytes of the receive buffer's GRH.
unsafe fn ah_attr_from_wc(port: u8, wc: *const ibv_wc, grh: *const c_void) -> Option<ibv_ah_attr> {
    // SAFETY: null or valid, per the contract.
    let wc = unsafe { wc.as_ref()? };
    let mut a = ibv_ah_attr {
        dlid: wc.slid,
        sl: wc.sl,
        port_num: port,
        ..Default::default()
    };
    if wc.wc_flags.0 & ibv_wc_flags::IBV_WC_GRH.0 != 0 {
        if grh.is_null() {
            return None;
        }
        // SAFETY: 40 readable bytes, per the contract.
        let g = unsafe { std::slice::from_raw_parts(grh.cast::<u8>(), 40) };
        // An IPv6 header (version 6 in its first byte), else RoCEv2 over IPv4: 20 bytes of
        // padding, then the IPv4 header.
        let dgid = if g[0] >> 4 != 6 && g[20] >> 4 == 4 {
            softnic::roce::ipv4_gid(std::net::Ipv4Addr::new(g[32], g[33], g[34], g[35]))
        } else {
            g[8..24].try_into().ok()?
        };
        a.is_global = 1;
        a.grh.dgid = ibv_gid { raw: dgid };
        a.grh.hop_limit = 0xff;
    }
    Some(a)
}

/// The size of libibverbs's `struct _compat_ibv_port_attr` (everything up to `flags`), which
/// the exported `ibv_query_port` fills: a program built against older headers has no room for
/// more.
const COMPAT_PORT_ATTR: usize = std::mem::offset_of!(ibv_port_attr, flags) + 1;

/// The access flags softnic ignores: `IBV_ACCESS_OPTIONAL_RANGE`, hints a device may drop.
const OPTIONAL_ACCESS: c_uint = 0x3ff0_0000;

/// `IBV_GID_TYPE_ROCE_V2` (`enum ibv_gid_type`), and its `_sysfs` twin.
const GID_TYPE_ROCE_V2: u32 = 2;
const GID_TYPE_SYSFS_ROCE_V2: u32 = 1;

export! {
    /// The device list: softnic's one device, `soft0`.
    "IBVERBS_1.1" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
        let f = match fabric() {
            Ok(f) => f,
            Err(e) => return fail(e),
        };
        let devices = f.devices();
        // SAFETY: plain allocation of `n + 1` pointers, zeroed (so NULL-terminated).
        let list = unsafe { libc::calloc(devices.len() + 1, size_of::<*mut ibv_device>()) }
            .cast::<*mut ibv_device>();
        if list.is_null() {
            return fail(libc::ENOMEM);
        }
        for (i, d) in devices.iter().enumerate() {
            // SAFETY: `list` has room for `devices.len() + 1` pointers.
            unsafe { list.add(i).write(*d) };
        }
        if !num.is_null() {
            // SAFETY: non-null, writable per the contract.
            unsafe { *num = devices.len() as c_int };
        }
        list
    }

    /// Frees a list from `ibv_get_device_list` (the devices live on).
    "IBVERBS_1.1" fn ibv_free_device_list(list: *mut *mut ibv_device) {
        // SAFETY: `list` came from `ibv_get_device_list`'s `calloc`, or is null.
        unsafe { libc::free(list.cast()) };
    }

    /// The device's name.
    "IBVERBS_1.1" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
        // SAFETY: softnic checks the pointer.
        unsafe { (CONTROL.get_device_name)(own_device(device)) }
    }

    /// The node GUID (big-endian): a modified EUI-64 of the device's address.
    "IBVERBS_1.1" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
        let device = own_device(device);
        fabric()
            .ok()
            .filter(|f| f.devices().contains(&device))
            .and_then(|f| f.node_guid("soft0"))
            .map_or(0, u64::to_be)
    }

    /// The device's index (0: there is one).
    "IBVERBS_1.9" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
        let device = own_device(device);
        let known = fabric().is_ok_and(|f| f.devices().contains(&device));
        if known { 0 } else { -1 }
    }

    /// Opens the device (in a forked child, its own in the place of its parent's).
    "IBVERBS_1.1" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
        // SAFETY: softnic checks the pointer.
        unsafe { (CONTROL.open_device)(own_device(device)) }
    }

    /// Closes a context, destroying what is still made on it, as closing the kernel's device
    /// file does (programs such as perftest rely on it).
    "IBVERBS_1.1" fn ibv_close_device(context: *mut ibv_context) -> c_int {
        // SAFETY: softnic checks the pointer; the program is done with the context.
        unsafe { softnic::release_device(context) }
    }

    /// The device's attributes.
    "IBVERBS_1.1" fn ibv_query_device(context: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int {
        // SAFETY: softnic checks the pointers.
        unsafe { (CONTROL.query_device)(context, attr) }
    }

    /// The port's attributes, as far as `struct _compat_ibv_port_attr` goes.
    "IBVERBS_1.1" fn ibv_query_port(context: *mut ibv_context, port: u8, attr: *mut c_void) -> c_int {
        if attr.is_null() {
            return libc::EINVAL;
        }
        let mut full = ibv_port_attr::default();
        // SAFETY: softnic checks the context; `full` is a valid out-pointer.
        let r = unsafe { (CONTROL.query_port)(context, port, &mut full) };
        if r == 0 {
            // SAFETY: the caller's struct has at least the compat size (libibverbs's
            // contract); `full` is larger.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (&raw const full).cast::<u8>(),
                    attr.cast::<u8>(),
                    COMPAT_PORT_ATTR,
                )
            };
        }
        r
    }

    /// One GID of the port's table.
    "IBVERBS_1.1" fn ibv_query_gid(context: *mut ibv_context, port: u8, index: c_int, gid: *mut ibv_gid) -> c_int {
        // SAFETY: softnic checks the pointers.
        let r = unsafe { (CONTROL.query_gid)(context, port, index, gid) };
        minus_one(r)
    }

    /// One P_Key (the port has one: the default, 0xffff).
    "IBVERBS_1.1" fn ibv_query_pkey(context: *mut ibv_context, port: u8, index: c_int, pkey: *mut u16) -> c_int {
        let mut attr = ibv_port_attr::default();
        // SAFETY: softnic checks the context; `attr` is a valid out-pointer.
        let r = unsafe { (CONTROL.query_port)(context, port, &mut attr) };
        if r != 0 {
            return minus_one(r);
        }
        if index != 0 || pkey.is_null() {
            return minus_one(libc::EINVAL);
        }
        // SAFETY: non-null, writable per the contract.
        unsafe { *pkey = 0xffff_u16.to_be() };
        0
    }

    /// The index of a P_Key (only the default one is there).
    "IBVERBS_1.5" fn ibv_get_pkey_index(context: *mut ibv_context, port: u8, pkey: u16) -> c_int {
        let mut found = 0;
        // SAFETY: as in `ibv_query_pkey`.
        let ok = unsafe { ibv_query_pkey(context, port, 0, &mut found) } == 0;
        if ok && found == pkey { 0 } else { -1 }
    }

    /// The type of a GID: RoCE v2 (libibverbs's private sysfs enumeration).
    "IBVERBS_PRIVATE_34" fn ibv_query_gid_type(context: *mut ibv_context, port: u8, index: c_uint, kind: *mut u32) -> c_int {
        let mut gid = ibv_gid::default();
        let (Ok(index), false) = (c_int::try_from(index), kind.is_null()) else {
            return minus_one(libc::EINVAL);
        };
        // SAFETY: softnic checks the context; `gid` is a valid out-pointer.
        let r = unsafe { (CONTROL.query_gid)(context, port, index, &mut gid) };
        if r != 0 {
            return minus_one(r);
        }
        // SAFETY: non-null, writable per the contract.
        unsafe { *kind = GID_TYPE_SYSFS_ROCE_V2 };
        0
    }

    /// One GID table entry (`ibv_query_gid_ex`).
    "IBVERBS_1.11" fn _ibv_query_gid_ex(context: *mut ibv_context, port: u32, index: u32, entry: *mut ibv_gid_entry, flags: u32, entry_size: usize) -> c_int {
        if entry.is_null() || flags != 0 || entry_size < size_of::<ibv_gid_entry>() {
            return libc::EINVAL;
        }
        let (Ok(port8), Ok(i)) = (u8::try_from(port), c_int::try_from(index)) else {
            return libc::EINVAL;
        };
        let mut gid = ibv_gid::default();
        // SAFETY: softnic checks the context; `gid` is a valid out-pointer.
        let r = unsafe { (CONTROL.query_gid)(context, port8, i, &mut gid) };
        if r != 0 {
            return r;
        }
        let e = ibv_gid_entry { gid, gid_index: index, port_num: port, gid_type: GID_TYPE_ROCE_V2, ndev_ifindex: 1 };
        // SAFETY: non-null and at least `size_of::<ibv_gid_entry>()` bytes, per the check.
        unsafe { entry.write_unaligned(e) };
        0
    }

    /// The whole GID table (`ibv_query_gid_table`): how many entries were written; `-EINVAL`
    /// if `max` cannot hold them all (the kernel's `rdma_query_gid_table` fails so, writing
    /// what fitted).
    "IBVERBS_1.11" fn _ibv_query_gid_table(context: *mut ibv_context, entries: *mut ibv_gid_entry, max: usize, flags: u32, entry_size: usize) -> isize {
        if (entries.is_null() && max > 0) || flags != 0 || entry_size < size_of::<ibv_gid_entry>() {
            return -(libc::EINVAL as isize);
        }
        let mut n = 0;
        loop {
            let mut probe = ibv_gid::default();
            let Ok(index) = c_int::try_from(n) else { break };
            // SAFETY: softnic checks the context; `probe` is a valid out-pointer.
            let r = unsafe { (CONTROL.query_gid)(context, 1, index, &mut probe) };
            if r == libc::EINVAL && n > 0 {
                // Past the table's end.
                break;
            }
            if r != 0 {
                return -(r as isize);
            }
            if n == max {
                return -(libc::EINVAL as isize);
            }
            // SAFETY: `entries` has room for `max > n` entries of `entry_size` bytes.
            let e = unsafe { entries.cast::<u8>().add(n * entry_size).cast::<ibv_gid_entry>() };
            // SAFETY: as above.
            let r = unsafe { _ibv_query_gid_ex(context, 1, n as u32, e, 0, entry_size) };
            if r != 0 {
                return -(r as isize);
            }
            n += 1;
        }
        n as isize
    }

    /// A protection domain.
    "IBVERBS_1.1" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
        // SAFETY: softnic checks the pointer.
        unsafe { (CONTROL.alloc_pd)(context) }
    }

    /// Frees a protection domain.
    "IBVERBS_1.1" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
        // SAFETY: softnic checks the pointer.
        unsafe { (CONTROL.dealloc_pd)(pd) }
    }

    /// Registers memory (optional-range access hints dropped).
    "IBVERBS_1.1" fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, len: usize, access: c_int) -> *mut ibv_mr {
        let access = (access as c_uint & !OPTIONAL_ACCESS) as c_int;
        // SAFETY: softnic checks the PD and the access flags; the memory is the caller's.
        unsafe { (CONTROL.reg_mr)(pd, addr, len, access) }
    }

    /// Registers memory addressed by `iova`: only `iova == addr` (softnic addresses regions
    /// by virtual address); anything else is EOPNOTSUPP.
    "IBVERBS_1.7" fn ibv_reg_mr_iova(pd: *mut ibv_pd, addr: *mut c_void, len: usize, iova: u64, access: c_int) -> *mut ibv_mr {
        if iova != addr as u64 {
            return fail(libc::EOPNOTSUPP);
        }
        // SAFETY: as `ibv_reg_mr`.
        unsafe { ibv_reg_mr(pd, addr, len, access) }
    }

    /// `ibv_reg_mr_iova` with unsigned access flags (what `ibv_reg_mr` calls with optional
    /// flags).
    "IBVERBS_1.8" fn ibv_reg_mr_iova2(pd: *mut ibv_pd, addr: *mut c_void, len: usize, iova: u64, access: c_uint) -> *mut ibv_mr {
        // SAFETY: as `ibv_reg_mr`.
        unsafe { ibv_reg_mr_iova(pd, addr, len, iova, access as c_int) }
    }

    /// Re-registers memory: a new translation, PD or access (optional-range access hints
    /// dropped); 0 or an `ibv_rereg_mr_err_code` with errno set.
    "IBVERBS_1.1" fn ibv_rereg_mr(mr: *mut ibv_mr, flags: c_int, pd: *mut ibv_pd, addr: *mut c_void, len: usize, access: c_int) -> c_int {
        let access = (access as c_uint & !OPTIONAL_ACCESS) as c_int;
        // SAFETY: softnic checks the region, the PD, the flags and the access; the memory is
        // the caller's.
        unsafe { (CONTROL.rereg_mr)(mr, flags, pd, addr, len, access) }
    }

    /// Deregisters memory.
    "IBVERBS_1.1" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
        // SAFETY: softnic checks the pointer.
        unsafe { (CONTROL.dereg_mr)(mr) }
    }

    /// A completion channel (its `fd` is an event descriptor: poll it, then `ibv_get_cq_event`).
    "IBVERBS_1.0" fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel {
        // SAFETY: softnic checks the pointer.
        unsafe { (CONTROL.create_comp_channel)(context) }
    }

    /// Destroys a completion channel.
    "IBVERBS_1.0" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
        // SAFETY: softnic checks the pointer.
        unsafe { (CONTROL.destroy_comp_channel)(channel) }
    }

    /// A completion queue.
    "IBVERBS_1.1" fn ibv_create_cq(context: *mut ibv_context, cqe: c_int, user: *mut c_void, channel: *mut ibv_comp_channel, vector: c_int) -> *mut ibv_cq {
        // SAFETY: softnic checks the pointers.
        unsafe { (CONTROL.create_cq)(context, cqe, user, channel, vector) }
    }

    /// Changes the capacity of a CQ (never below the completions it holds).
    "IBVERBS_1.1" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
        // SAFETY: softnic checks the pointer.
        unsafe { softnic::resize_cq(cq, cqe) }
    }

    /// Destroys a completion queue.
    "IBVERBS_1.1" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
        // SAFETY: softnic checks the pointer.
        unsafe { (CONTROL.destroy_cq)(cq) }
    }

    /// Waits for a completion event on a channel.
    "IBVERBS_1.1" fn ibv_get_cq_event(channel: *mut ibv_comp_channel, cq: *mut *mut ibv_cq, user: *mut *mut c_void) -> c_int {
        // SAFETY: softnic checks the pointers.
        unsafe { (CONTROL.get_cq_event)(channel, cq, user) }
    }

    /// Acknowledges completion events.
    "IBVERBS_1.1" fn ibv_ack_cq_events(cq: *mut ibv_cq, n: c_uint) {
        // SAFETY: softnic checks the pointer.
        unsafe { (CONTROL.ack_cq_events)(cq, n) }
    }

    /// A shared receive queue.
    "IBVERBS_1.1" fn ibv_create_srq(pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> *mut ibv_srq {
        // SAFETY: softnic checks the pointers.
        unsafe { (CONTROL.create_srq)(pd, attr) }
    }

    /// Modifies an SRQ (its limit).
    "IBVERBS_1.1" fn ibv_modify_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> c_int {
        // SAFETY: softnic checks the pointers.
        unsafe { (CONTROL.modify_srq)(srq, attr, mask) }
    }

    /// An SRQ's attributes.
    "IBVERBS_1.1" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
        // SAFETY: softnic checks the pointers.
        unsafe { (CONTROL.query_srq)(srq, attr) }
    }

    /// Destroys an SRQ.
    "IBVERBS_1.1" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
        // SAFETY: softnic checks the pointer.
        unsafe { (CONTROL.destroy_srq)(srq) }
    }

    /// A queue pair.
    "IBVERBS_1.1" fn ibv_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
        // SAFETY: softnic checks the pointers.
        unsafe { (CONTROL.create_qp)(pd, attr) }
    }

    /// The extended QP (the `ibv_wr_*` builders) of a QP made by `ibv_create_qp_ex` with
    /// send ops; NULL with EOPNOTSUPP for another QP.
    "IBVERBS_1.6" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
        // SAFETY: softnic checks the pointer.
        unsafe { softnic::qp_to_qp_ex(qp) }
    }

    /// Moves a QP through its states.
    "IBVERBS_1.1" fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
        // SAFETY: softnic checks the pointers.
        unsafe { (CONTROL.modify_qp)(qp, attr, mask) }
    }

    /// A QP's attributes.
    "IBVERBS_1.1" fn ibv_query_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int, init: *mut ibv_qp_init_attr) -> c_int {
        // SAFETY: softnic checks the pointers.
        unsafe { (CONTROL.query_qp)(qp, attr, mask, init) }
    }

    /// Destroys a QP.
    "IBVERBS_1.1" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
        // SAFETY: softnic checks the pointer.
        unsafe { (CONTROL.destroy_qp)(qp) }
    }

    /// An address handle.
    "IBVERBS_1.1" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
        // SAFETY: softnic checks the pointers.
        unsafe { (CONTROL.create_ah)(pd, attr) }
    }

    /// Destroys an address handle.
    "IBVERBS_1.1" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
        // SAFETY: softnic checks the pointer.
        unsafe { (CONTROL.destroy_ah)(ah) }
    }

    /// The address of the sender of a UD completion, for a reply.
    "IBVERBS_1.1" fn ibv_init_ah_from_wc(context: *mut ibv_context, port: u8, wc: *mut ibv_wc, grh: *mut c_void, attr: *mut ibv_ah_attr) -> c_int {
        let mut probe = ibv_port_attr::default();
        // SAFETY: softnic checks the context; `probe` is a valid out-pointer.
        let r = unsafe { (CONTROL.query_port)(context, port, &mut probe) };
        if r != 0 || attr.is_null() {
            return minus_one(if r != 0 { r } else { libc::EINVAL });
        }
        // SAFETY: as this verb's contract.
        match unsafe { ah_attr_from_wc(port, wc, grh) } {
            Some(a) => {
                // SAFETY: non-null, writable per the contract.
                unsafe { *attr = a };
                0
            }
            None => minus_one(libc::EINVAL),
        }
    }

    /// An address handle to the sender of a UD completion.
    "IBVERBS_1.1" fn ibv_create_ah_from_wc(pd: *mut ibv_pd, wc: *mut ibv_wc, grh: *mut c_void, port: u8) -> *mut ibv_ah {
        // SAFETY: as this verb's contract.
        match unsafe { ah_attr_from_wc(port, wc, grh) } {
            // SAFETY: softnic checks the PD and the port.
            Some(mut a) => unsafe { (CONTROL.create_ah)(pd, &mut a) },
            None => fail(libc::EINVAL),
        }
    }

    /// Waits for an async event.
    "IBVERBS_1.1" fn ibv_get_async_event(context: *mut ibv_context, event: *mut ibv_async_event) -> c_int {
        // SAFETY: softnic checks the pointers.
        unsafe { (CONTROL.get_async_event)(context, event) }
    }

    /// Acknowledges an async event.
    "IBVERBS_1.1" fn ibv_ack_async_event(event: *mut ibv_async_event) {
        // SAFETY: softnic checks the pointer.
        unsafe { (CONTROL.ack_async_event)(event) }
    }

    /// Attaches a UD QP to a multicast group.
    "IBVERBS_1.1" fn ibv_attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
        // SAFETY: the caller's `gid` is null or readable, as libibverbs asks; softnic checks
        // the QP.
        unsafe { softnic::attach_mcast(qp, gid, lid) }
    }

    /// Detaches a UD QP from a multicast group.
    "IBVERBS_1.1" fn ibv_detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
        // SAFETY: as in `ibv_attach_mcast`.
        unsafe { softnic::detach_mcast(qp, gid, lid) }
    }

    /// Nothing to do: softnic pins no pages, so `fork` is safe.
    "IBVERBS_1.1" fn ibv_fork_init() -> c_int {
        0
    }

    /// `IBV_FORK_UNNEEDED`: softnic pins no pages.
    "IBVERBS_1.13" fn ibv_is_fork_initialized() -> c_int {
        2
    }

    /// Nothing to do (no pinned pages).
    "IBVERBS_1.1" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
        0
    }

    /// Nothing to do (no pinned pages).
    "IBVERBS_1.1" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
        0
    }

    /// The name of a completion status.
    "IBVERBS_1.1" fn ibv_wc_status_str(status: u32) -> *const c_char {
        strings::wc_status(status)
    }

    /// The name of an async event type.
    "IBVERBS_1.1" fn ibv_event_type_str(kind: u32) -> *const c_char {
        strings::event_type(kind)
    }

    /// The name of a node type.
    "IBVERBS_1.1" fn ibv_node_type_str(kind: c_int) -> *const c_char {
        strings::node_type(kind)
    }

    /// The name of a port state.
    "IBVERBS_1.1" fn ibv_port_state_str(state: u32) -> *const c_char {
        strings::port_state(state)
    }

    /// A rate as a multiple of 2.5 Gb/s.
    "IBVERBS_1.0" fn ibv_rate_to_mult(rate: c_int) -> c_int {
        strings::rate_to_mult(rate)
    }

    /// The rate of a multiple of 2.5 Gb/s.
    "IBVERBS_1.0" fn mult_to_ibv_rate(mult: c_int) -> c_int {
        strings::mult_to_rate(mult)
    }

    /// A rate in Mb/s.
    "IBVERBS_1.1" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
        strings::rate_to_mbps(rate)
    }

    /// The rate of a speed in Mb/s.
    "IBVERBS_1.1" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
        strings::mbps_to_rate(mbps)
    }

    /// Reads `dir/file` into `buf` as libibverbs does: at most `size` bytes, a final newline
    /// replaced by a NUL (or a NUL added when there is room; -1 when the contents fill `buf`
    /// with no newline); the length read, or -1 with errno. Under `softnic-run` the device's
    /// sysfs files are there (`/sys/class/infiniband/soft0/...`).
    "IBVERBS_1.0" fn ibv_read_sysfs_file(dir: *const c_char, file: *const c_char, buf: *mut c_char, size: usize) -> c_int {
        if dir.is_null() || file.is_null() || (buf.is_null() && size > 0) {
            return minus_one(libc::EINVAL);
        }
        // SAFETY: non-null NUL-terminated strings, per the contract.
        let (dir, file) = unsafe { (std::ffi::CStr::from_ptr(dir), std::ffi::CStr::from_ptr(file)) };
        let mut path = dir.to_bytes().to_vec();
        path.push(b'/');
        path.extend_from_slice(file.to_bytes());
        let path: std::ffi::OsString = std::os::unix::ffi::OsStringExt::from_vec(path);
        let mut f = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) => return minus_one(e.raw_os_error().unwrap_or(libc::EIO)),
        };
        if size == 0 {
            return 0;
        }
        // SAFETY: `buf` has `size` writable bytes, per the contract.
        let out = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), size) };
        let mut len = match std::io::Read::read(&mut f, out) {
            Ok(n) => n,
            Err(e) => return minus_one(e.raw_os_error().unwrap_or(libc::EIO)),
        };
        if len > 0 {
            if out[len - 1] == b'\n' {
                len -= 1;
                out[len] = 0;
            } else if len < size {
                out[len] = 0;
            } else {
                // No room for the terminating NUL.
                return minus_one(libc::EOVERFLOW);
            }
        }
        c_int::try_from(len).unwrap_or(c_int::MAX)
    }

    /// Where sysfs would be.
    "IBVERBS_1.0" fn ibv_get_sysfs_path() -> *const c_char {
        c"/sys".as_ptr()
    }
}
