//! softnic as a drop-in `librdmacm.so.1`: unmodified rdma_cm programs (rping, ucmatose,
//! udaddy, rdma_server/rdma_client, perftest's `-R`, libfabric's verbs provider) connect over
//! softnic's connection manager, which exchanges real InfiniBand CM MADs on QP1 over
//! softnic's RoCEv2-on-UDP link, as the kernel's rdma_cm does over rxe.
//!
//! This crate builds a shared library with librdmacm's soname and symbol versions
//! (`RDMACM_1.0` .. `RDMACM_1.3`, Debian 12's), that `softnic-run` puts beside softnic's
//! `libibverbs.so.1`:
//!
//! ```text
//! cargo build --release -p softnic-verbs -p softnic-rdmacm
//! target/release/softnic-run --addr 127.0.0.2 -- rping -s -a 127.0.0.2 -v -C 3 &
//! target/release/softnic-run --addr 127.0.0.3 -- rping -c -a 127.0.0.2 -v -C 3
//! ```
//!
//! The connection manager itself lives in softnic (`softnic::cm`, where it is tested on the
//! virtual clock); this library is its C face, and reaches it through the process's
//! libibverbs (`softnic_cm_ops`, exported by softnic's libibverbs only), so that both
//! libraries work on the one fabric of the process. Run with another libibverbs, every call
//! fails with `ENODEV` after saying why on standard error.
//!
//! What it serves: event channels whose `fd` is a real descriptor, readable while events wait
//! (`poll` it; make it non-blocking and `rdma_get_cm_event` fails with `EAGAIN`); ids on
//! `RDMA_PS_TCP` (RC), `RDMA_PS_UDP` (UD, resolved by SIDR) and `RDMA_PS_IB` (RC and XRC, in
//! its own ports), synchronous ids (no channel: each call waits for its event, as librdmacm's
//! do); IPv4 addresses (the link's: the device's own and any other softnic port, and multicast
//! groups to join; 127.0.0.1, unless a device has it, is the host, where a listener of another
//! process bound to the any address is found, as a kernel's processes share its devices; IPv6's
//! `::` and `::1` stand for 0.0.0.0 and 127.0.0.1, its IPv4-mapped addresses for theirs, other
//! IPv6 addresses fail with `EAFNOSUPPORT`); events with the fields librdmacm fills;
//! `rdma_create_qp` (with CQs and completion channels of its own when the caller gives none, as
//! `rdma_verbs.h`'s helpers expect), `rdma_create_ep`, `rdma_get_request`, `rdma_getaddrinfo`
//! of numeric addresses and host names.
//!
//! Threads: a program may call on one id from several threads (the library's calls on an id
//! take turns; a synchronous call waits for its event outside its turn, so the others go on),
//! and take its events on another: an event's ids stay valid until the event is acked, even
//! if they are destroyed first.
//!
//! Multicast (`rdma_join_multicast`, `_ex`, `rdma_leave_multicast`) as the kernel does it on
//! RoCE: the group's GID is its IPv4-mapped address, the id's UD QP is attached to it (unless
//! it joins to send only), and `MULTICAST_JOIN` says where to send.
//!
//! rsockets, the socket API over RDMA (`rsocket`, `rconnect`, `rsend`, `rpoll`, `riomap`,
//! ...): stream sockets over RC and datagram sockets over UD between ends on softnic
//! (rdmacm-utils' `rstream`, `riostream`, `rcopy`, `udpong`); see the `rsocket` module.
//!
//! XRC: `rdma_create_ep` of an `RDMA_PS_IB` address of QP type `IBV_QPT_XRC_SEND` or
//! `IBV_QPT_XRC_RECV` makes an id of that type (a listener's requests take it too), whose
//! `rdma_create_qp` and `rdma_create_srq` make XRC QPs and SRQs, in the device's default XRC
//! domain when the caller gives none, as librdmacm does (rdmacm-utils' `rdma_xserver` and
//! `rdma_xclient`); `rdma_create_qp_ex` makes XRC QPs on any RC id (libfabric's verbs
//! provider).
//!
//! What it does not: ECE (`EOPNOTSUPP`), `AF_IB` addresses, QPs other than RC and XRC on
//! `RDMA_PS_IB` ids (`EINVAL`; `rdma_create_ep` of such an address: `EPROTONOSUPPORT`),
//! `RDMA_PS_IPOIB`
//! (`EPROTONOSUPPORT`: on RoCE the kernel's CM cannot give it the IPoIB
//! group's Q_Key either).

#[macro_use]
mod export;
mod addr;
mod event;
mod id;
mod multicast;
mod qp;
mod rsocket;
mod srq;
pub mod types;
mod unsupported;
mod xverbs;

use std::collections::BTreeMap;
use std::ffi::{CStr, c_int};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use ibverbs_sys::{ibv_context, ibv_pd};
use softnic::PerProcess;
use softnic::cm::cabi::{CEvent, CM_OPS_VERSION, CmOps};

/// One device, opened through the process's libibverbs.
struct Dev {
    ctx: *mut ibv_context,
    /// The device's PD for callers that give none (allocated on first use).
    pd: Mutex<*mut ibv_pd>,
    /// The device's XRC domain for XRC ids whose caller gives none (opened on first use, as
    /// librdmacm's `ucma_get_xrcd`).
    xrcd: Mutex<*mut ibverbs_sys::ibv_xrcd>,
}

/// The library's view of the process: softnic's CM, the devices and the ids.
struct Lib {
    ops: &'static CmOps,
    devs: Vec<Dev>,
    /// Every live id, by CM id.
    ids: Mutex<BTreeMap<u32, std::sync::Arc<id::Id>>>,
}

// SAFETY: the raw pointers are libibverbs objects that live as long as the process and that
// libibverbs lets any thread use; the PD and XRC domain slots are behind mutexes.
unsafe impl Send for Lib {}
// SAFETY: as for Send: nothing is mutated but through the mutex.
unsafe impl Sync for Lib {}

/// Built on first use; a child forked after its parent used the library builds its own (its
/// parent's devices and ids are not its own: softnic refuses them there).
static LIB: PerProcess<Result<Lib, c_int>> = PerProcess::new();

/// Whether `linger` is registered to run at exit.
static LINGER_AT_EXIT: AtomicBool = AtomicBool::new(false);

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: `__errno_location` returns the calling thread's errno slot, valid for writes.
    unsafe { *libc::__errno_location() = e }
}

/// The calling thread's `errno`.
pub(crate) fn errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// librdmacm's failure: -1 with `errno`.
pub(crate) fn fail(e: c_int) -> c_int {
    set_errno(e);
    -1
}

/// 0, or -1 with `errno` for a CM call's errno value.
pub(crate) fn status(e: c_int) -> c_int {
    if e == 0 { 0 } else { fail(e) }
}

/// The library as this process built it, if it did.
fn built_lib() -> Option<&'static Lib> {
    LIB.get().and_then(|l| l.as_ref().ok())
}

fn lib() -> Result<&'static Lib, c_int> {
    LIB.get_or_init(|| {
        open().map_err(|(e, why)| {
            // One `write`, not through the standard library's lock of standard error (a thread
            // of the parent of a forked child may have held it at the fork).
            let line = format!("softnic librdmacm: {why}\n");
            // SAFETY: writes the bytes of `line`, valid for its length, to descriptor 2.
            let _ = unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
            e
        })
    })
    .as_ref()
    .map_err(|&e| e)
}

/// Finds softnic's CM in the process's libibverbs and opens every device.
fn open() -> Result<Lib, (c_int, String)> {
    let name = c"softnic_cm_ops";
    // SAFETY: dlsym with the default handle and a NUL-terminated name.
    let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if sym.is_null() {
        let why = "this libibverbs is not softnic's (run the program with softnic-run)";
        return Err((libc::ENODEV, why.to_string()));
    }
    // SAFETY: softnic's libibverbs exports `softnic_cm_ops` as `fn() -> *const CmOps`.
    let get: unsafe extern "C" fn() -> *const CmOps = unsafe { std::mem::transmute(sym) };
    // SAFETY: it returns a pointer to a static table.
    let ops = unsafe { &*get() };
    if ops.version != CM_OPS_VERSION || ops.event_size as usize != size_of::<CEvent>() {
        let why = "softnic's libibverbs and librdmacm come from different builds";
        return Err((libc::ENODEV, why.to_string()));
    }
    let mut n: c_int = 0;
    // SAFETY: libibverbs call with a valid out-pointer.
    let list = unsafe { ibverbs_sys::ibv_get_device_list(&mut n) };
    if list.is_null() || n <= 0 {
        return Err((libc::ENODEV, "no softnic device".to_string()));
    }
    let mut devs = Vec::new();
    for i in 0..n as usize {
        // SAFETY: `list` holds `n` device pointers.
        let dev = unsafe { *list.add(i) };
        // SAFETY: a device of the list just taken.
        let ctx = unsafe { ibverbs_sys::ibv_open_device(dev) };
        if ctx.is_null() {
            return Err((libc::ENODEV, format!("opening device {i} failed")));
        }
        devs.push(Dev {
            ctx,
            pd: Mutex::new(std::ptr::null_mut()),
            xrcd: Mutex::new(std::ptr::null_mut()),
        });
    }
    if !LINGER_AT_EXIT.swap(true, Ordering::AcqRel) {
        // SAFETY: registers a function of no arguments that only calls the CM through its
        // table.
        unsafe { libc::atexit(linger) };
    }
    Ok(Lib {
        ops,
        devs,
        ids: Mutex::new(BTreeMap::new()),
    })
}

/// At exit, destroys the ids the program still holds (as the kernel's CM does when the
/// process's descriptor closes: a connection's peer hears DISCONNECTED, not nothing), then
/// waits (at most [`LINGER`]) while destroyed ids still send their DREQ: the kernel's CM
/// would go on after the process, a softnic process's CM ends with it, and a DREQ lost then
/// would leave its peer connected for ever. The peer's DREP comes when the peer's program
/// disconnects or destroys its id (as on the kernel's CM): a process that exits connected
/// to a program that does neither waits the whole [`LINGER`].
extern "C" fn linger() {
    let Some(l) = built_lib() else { return };
    // SAFETY: a context of the fabric.
    unsafe { (l.ops.close_all)(l.ctx()) };
    let end = std::time::Instant::now() + LINGER;
    // SAFETY: a context of the fabric.
    while unsafe { (l.ops.lingering)(l.ctx()) } > 0 && std::time::Instant::now() < end {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// The longest a process lingers at exit for its DREQs (two retransmissions).
const LINGER: std::time::Duration = std::time::Duration::from_secs(5);

impl Lib {
    /// The context the CM's calls name the fabric by.
    fn ctx(&self) -> *mut ibv_context {
        self.devs[0].ctx
    }

    /// The context of device `dev` (`None` for one the library does not know).
    fn dev_ctx(&self, dev: c_int) -> Option<*mut ibv_context> {
        usize::try_from(dev)
            .ok()
            .and_then(|d| self.devs.get(d))
            .map(|d| d.ctx)
    }

    /// The default PD of the device of `ctx`, allocated on first use.
    fn default_pd(&self, ctx: *mut ibv_context) -> *mut ibv_pd {
        let Some(d) = self.devs.iter().find(|d| d.ctx == ctx) else {
            return std::ptr::null_mut();
        };
        let mut pd = d.pd.lock().unwrap_or_else(|e| e.into_inner());
        if pd.is_null() {
            // SAFETY: a context this library opened.
            *pd = unsafe { ibverbs_sys::ibv_alloc_pd(ctx) };
        }
        *pd
    }

    /// The XRC domain of device `ctx` for callers that give none (null, with `errno` set, if
    /// it cannot be opened).
    fn default_xrcd(&self, ctx: *mut ibv_context) -> *mut ibverbs_sys::ibv_xrcd {
        let Some(d) = self.devs.iter().find(|d| d.ctx == ctx) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        let mut xrcd = d.xrcd.lock().unwrap_or_else(|e| e.into_inner());
        if xrcd.is_null() {
            *xrcd = xverbs::open_own_xrcd(ctx);
        }
        *xrcd
    }
}

/// `rdma_event_str`'s names, by event number.
const EVENT_NAMES: [&CStr; 16] = [
    c"RDMA_CM_EVENT_ADDR_RESOLVED",
    c"RDMA_CM_EVENT_ADDR_ERROR",
    c"RDMA_CM_EVENT_ROUTE_RESOLVED",
    c"RDMA_CM_EVENT_ROUTE_ERROR",
    c"RDMA_CM_EVENT_CONNECT_REQUEST",
    c"RDMA_CM_EVENT_CONNECT_RESPONSE",
    c"RDMA_CM_EVENT_CONNECT_ERROR",
    c"RDMA_CM_EVENT_UNREACHABLE",
    c"RDMA_CM_EVENT_REJECTED",
    c"RDMA_CM_EVENT_ESTABLISHED",
    c"RDMA_CM_EVENT_DISCONNECTED",
    c"RDMA_CM_EVENT_DEVICE_REMOVAL",
    c"RDMA_CM_EVENT_MULTICAST_JOIN",
    c"RDMA_CM_EVENT_MULTICAST_ERROR",
    c"RDMA_CM_EVENT_ADDR_CHANGE",
    c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
];
