//! The C ABI surface: the structs callers hold pointers to, the registry that tells softnic's
//! pointers from foreign ones, `errno`, and a layout-identical mirror of `ibv_wc`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};

use crate::hash::FastMap;

use ibverbs_sys::ibv_wc;

use crate::fabric::Shared;

/// A softnic object as callers see it: the libibverbs struct, at an address that is never
/// handed out again.
///
/// The struct lives in its own heap allocation that softnic only ever reaches through the raw
/// pointer it was created with (never through a `Box` or a long-lived reference), so the
/// pointer a caller holds and softnic's own accesses are all derived from one raw pointer: a
/// C caller reading `qp->state` while softnic updates it under its lock is no aliasing
/// violation under Stacked or Tree Borrows. The allocation is deliberately never freed: a
/// destroyed object's address can then never come back as a new object, so a stale pointer is
/// always refused (it is no longer in the registry) instead of reaching an unrelated object.
/// The cost is the size of one shell per destroyed object: the `ibv_*` struct, or the
/// extended one around it (`W`: a `verbs_context`, an `ibv_cq_ex`, an `ibv_qp_ex`), at most
/// about a kilobyte; a QP's batch buffers are freed when it is destroyed.
pub(crate) struct Shell<T, W = T> {
    /// The libibverbs struct inside the allocation of a `W`: the pointer handed to callers.
    ptr: std::ptr::NonNull<T>,
    wrapper: std::marker::PhantomData<W>,
    /// softnic's id of the object (the key of its table in the fabric state).
    pub(crate) id: u32,
}

// SAFETY: the shell is plain data behind a pointer that softnic only dereferences under its
// fabric's lock (or, for an extended object's own fields, on the one thread the libibverbs
// contract lets use them at a time); the pointee is an `ibv_*` struct of plain C fields.
unsafe impl<T: Send, W: Send> Send for Shell<T, W> {}

/// A struct that holds the libibverbs struct callers see (a `T`) at a fixed offset, with
/// softnic's or rdma-core's extended fields around it.
///
/// # Safety
///
/// `W` is `#[repr(C)]` and has a field of type `T` (or a `#[repr(C)]` prefix laid out exactly
/// as `T`, checked by compile-time offset asserts) at byte offset [`Holds::OFFSET`].
pub(crate) unsafe trait Holds<T> {
    /// Where the `T` starts inside `Self`.
    const OFFSET: usize;
}

// SAFETY: a struct is its own field at offset 0.
unsafe impl<T> Holds<T> for T {
    const OFFSET: usize = 0;
}

impl<T> Shell<T> {
    pub(crate) fn new(ibv: T, id: u32) -> Self {
        Shell::wrapped(ibv, id)
    }
}

impl<T, W: Holds<T>> Shell<T, W> {
    /// A shell for `outer`, whose `T` callers see.
    pub(crate) fn wrapped(outer: W, id: u32) -> Self {
        let outer = std::ptr::NonNull::from(Box::leak(Box::new(outer)));
        // SAFETY: `W: Holds<T>` puts a `T` at `OFFSET` inside the allocation, so the pointer
        // stays in bounds and is aligned for `T`.
        let ptr = unsafe { outer.byte_add(W::OFFSET) }.cast::<T>();
        Shell {
            ptr,
            wrapper: std::marker::PhantomData,
            id,
        }
    }
}

impl<T, W> Shell<T, W> {
    /// The pointer handed to callers.
    pub(crate) fn ptr(&self) -> *mut T {
        self.ptr.as_ptr()
    }

    /// A copy of the struct as it is now.
    pub(crate) fn get(&self) -> T
    where
        T: Copy,
    {
        // SAFETY: the allocation is live forever (never freed) and initialised; softnic reads
        // it under its fabric's lock, the only place it writes it.
        unsafe { self.ptr.as_ptr().read() }
    }

    /// Changes the struct in place (a field callers read, such as `ibv_qp.state`).
    pub(crate) fn update(&self, f: impl FnOnce(&mut T)) {
        // SAFETY: the allocation is live forever; softnic holds its fabric's lock, so this is
        // the only softnic reference, and it ends with this call. Callers only read these
        // fields (as libibverbs callers read a provider's), through pointers derived from the
        // same raw pointer, which this short-lived reference does not invalidate. Extended
        // fields written outside the lock lie outside `T`.
        f(unsafe { &mut *self.ptr.as_ptr() })
    }
}

/// Which kind of object a registered pointer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Device,
    Context,
    Pd,
    Mr,
    Mw,
    Cq,
    Channel,
    Srq,
    Qp,
    Ah,
    Xrcd,
}

struct Entry {
    kind: Kind,
    /// Weak: a fabric lives as long as its `Fabric` handles; once they are gone its objects
    /// are gone too, and their pointers fail as unknown.
    fabric: Weak<Shared>,
    fabric_id: u64,
    id: u32,
}

/// Every live softnic object, by the address callers hold (`live`). A pointer that is not
/// there (null, foreign, already destroyed, or its parent's in a forked child) is never
/// dereferenced.
pub(crate) struct Registry {
    live: FastMap<usize, Entry>,
    /// In a forked child, the objects of the processes it was forked from (see `fork.rs`):
    /// never reached, only recognised.
    inherited: FastMap<usize, Entry>,
}

impl Registry {
    /// After a `fork`, in the child: every object it knows is its parent's.
    pub(crate) fn inherit(&mut self) {
        self.inherited.extend(self.live.drain());
        // The forking thread's recent lookups name the parent's objects too.
        REMOVALS.fetch_add(1, Ordering::Release);
    }
}

pub(crate) static REGISTRY: RwLock<Registry> = RwLock::new(Registry {
    live: HashMap::with_hasher(BuildHasherDefault::new()),
    inherited: HashMap::with_hasher(BuildHasherDefault::new()),
});

/// Whether `ptr` is an object of `kind` of a process this one was forked from, forgetting it
/// if so (a second close of an inherited context is refused, as a second close of the child's
/// copy of a descriptor is).
pub(crate) fn take_inherited(ptr: *const c_void, kind: Kind) -> bool {
    let mut reg = REGISTRY.write().unwrap_or_else(|e| e.into_inner());
    let key = ptr as usize;
    let found = reg.inherited.get(&key).is_some_and(|e| e.kind == kind);
    if found {
        reg.inherited.remove(&key);
    }
    found
}

pub(crate) fn register(ptr: *const c_void, kind: Kind, fabric: &Arc<Shared>, id: u32) {
    crate::fork::watch_forks();
    let mut reg = REGISTRY.write().unwrap_or_else(|e| e.into_inner());
    reg.live.insert(
        ptr as usize,
        Entry {
            kind,
            fabric: Arc::downgrade(fabric),
            fabric_id: fabric.id,
            id,
        },
    );
}

/// Forgets every object of fabric `fabric_id` (the fabric is being dropped).
pub(crate) fn unregister_fabric(fabric_id: u64) {
    let mut reg = REGISTRY.write().unwrap_or_else(|e| e.into_inner());
    reg.live.retain(|_, e| e.fabric_id != fabric_id);
    REMOVALS.fetch_add(1, Ordering::Release);
}

pub(crate) fn unregister(ptr: *const c_void) {
    let mut reg = REGISTRY.write().unwrap_or_else(|e| e.into_inner());
    reg.live.remove(&(ptr as usize));
    REMOVALS.fetch_add(1, Ordering::Release);
}

/// Objects that left the registry so far (bumped under its write lock, after the removal).
static REMOVALS: AtomicU64 = AtomicU64::new(0);

/// A lookup a thread made, good while no object has left the registry since.
struct Recent {
    ptr: usize,
    kind: Kind,
    removals: u64,
    fabric: Weak<Shared>,
    id: u32,
}

/// Lookups each thread remembers, by address (direct-mapped): a caller polling its CQs and
/// posting on its QPs in a loop finds them here, without the registry's lock and its hash.
const RECENT: usize = 64;

thread_local! {
    static RECENTS: RefCell<[Option<Recent>; RECENT]> =
        const { RefCell::new([const { None }; RECENT]) };
}

/// The slot of `addr` among a thread's recent lookups.
fn recent_slot(addr: usize) -> usize {
    ((addr >> 4) ^ (addr >> 10)) % RECENT
}

/// An object found in the registry, and when: see [`Found::still_there`].
pub(crate) struct Found {
    pub(crate) fabric: Arc<Shared>,
    pub(crate) id: u32,
    ptr: usize,
    kind: Kind,
    removals: u64,
}

impl Found {
    /// Whether the object is still registered. Call it holding the fabric's lock: objects are
    /// destroyed under it, so an object there now stays until the lock is let go. (Another
    /// thread may have destroyed it between the lookup and the lock: a program error that gets
    /// EINVAL, not a panic that would break the fabric.)
    #[inline(always)]
    pub(crate) fn still_there(&self) -> bool {
        REMOVALS.load(Ordering::Acquire) == self.removals || {
            let reg = REGISTRY.read().unwrap_or_else(|e| e.into_inner());
            reg.live.get(&self.ptr).is_some_and(|e| e.kind == self.kind)
        }
    }
}

/// The fabric and id of the live object of `kind` at `ptr`, if there is one.
pub(crate) fn lookup(ptr: *const c_void, kind: Kind) -> Option<Found> {
    if ptr.is_null() {
        return None;
    }
    let addr = ptr as usize;
    // No object left the registry since this thread found this one there: it is still there.
    let removals = REMOVALS.load(Ordering::Acquire);
    let slot = recent_slot(addr);
    let hit = RECENTS
        .try_with(|r| {
            let r = r.borrow();
            r[slot]
                .as_ref()
                .filter(|e| e.ptr == addr && e.kind == kind && e.removals == removals)
                .map(|e| e.fabric.upgrade().map(|f| (f, e.id)))
        })
        .ok()
        .flatten();
    match hit {
        // `None`: the object's fabric is gone.
        Some(hit) => hit.map(|(fabric, id)| Found {
            fabric,
            id,
            ptr: addr,
            kind,
            removals,
        }),
        None => lookup_registry(addr, kind, removals),
    }
}

/// [`lookup`] of an object this thread did not find recently (`removals`: objects that had
/// left the registry before the look-up), remembered for the next one.
#[inline(never)]
fn lookup_registry(addr: usize, kind: Kind, removals: u64) -> Option<Found> {
    let reg = REGISTRY.read().unwrap_or_else(|e| e.into_inner());
    let e = reg.live.get(&addr).filter(|e| e.kind == kind)?;
    let (fabric, id) = (e.fabric.clone(), e.id);
    drop(reg);
    let _ = RECENTS.try_with(|r| {
        r.borrow_mut()[recent_slot(addr)] = Some(Recent {
            ptr: addr,
            kind,
            removals,
            fabric: fabric.clone(),
            id,
        });
    });
    Some(Found {
        fabric: fabric.upgrade()?,
        id,
        ptr: addr,
        kind,
        removals,
    })
}

/// The 16 bytes of a GID.
pub(crate) fn gid_bytes(g: &ibverbs_sys::ibv_gid) -> [u8; 16] {
    // SAFETY: every variant of the `ibv_gid` union is 16 plain bytes; any bit pattern is a
    // valid `[u8; 16]`.
    unsafe { g.raw }
}

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: i32) {
    // SAFETY: `__errno_location` returns the calling thread's errno slot, valid for writes.
    unsafe { *libc::__errno_location() = e }
}

/// `ibv_wc` with every field public.
///
/// ibverbs-sys keeps `wr_id`, `status`, `opcode`, `vendor_err` and `byte_len` private and has no
/// constructor; this mirror has the same size, alignment and field offsets (asserted at compile
/// time), so a `*mut ibv_wc` array may be written, and an `&[ibv_wc]` read, through it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Wc {
    /// The work request's id.
    pub wr_id: u64,
    /// `ibv_wc_status`.
    pub status: u32,
    /// `ibv_wc_opcode`.
    pub opcode: u32,
    /// Vendor error syndrome.
    pub vendor_err: u32,
    /// Bytes transferred.
    pub byte_len: u32,
    /// Immediate data, big-endian as on the wire.
    pub imm_data: u32,
    /// The local QP number.
    pub qp_num: u32,
    /// The remote QP number (UD receives).
    pub src_qp: u32,
    /// `ibv_wc_flags` bits.
    pub wc_flags: u32,
    /// P_Key index.
    pub pkey_index: u16,
    /// Source LID (0 on RoCE).
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// Destination LID path bits.
    pub dlid_path_bits: u8,
}

const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<Wc>() == size_of::<ibv_wc>());
    assert!(align_of::<Wc>() == align_of::<ibv_wc>());
    assert!(offset_of!(Wc, imm_data) == offset_of!(ibv_wc, imm_data));
    assert!(offset_of!(Wc, qp_num) == offset_of!(ibv_wc, qp_num));
    assert!(offset_of!(Wc, src_qp) == offset_of!(ibv_wc, src_qp));
    assert!(offset_of!(Wc, wc_flags) == offset_of!(ibv_wc, wc_flags));
    assert!(offset_of!(Wc, pkey_index) == offset_of!(ibv_wc, pkey_index));
    assert!(offset_of!(Wc, slid) == offset_of!(ibv_wc, slid));
    assert!(offset_of!(Wc, sl) == offset_of!(ibv_wc, sl));
    assert!(offset_of!(Wc, dlid_path_bits) == offset_of!(ibv_wc, dlid_path_bits));
    // The private fields come first, in declaration order, packed: wr_id (8) at 0, then four
    // u32s up to the first public field.
    assert!(offset_of!(ibv_wc, imm_data) == 24);
};

impl Wc {
    /// Views an `ibv_wc` through the mirror.
    pub fn from_ibv(wc: &ibv_wc) -> &Wc {
        // SAFETY: `Wc` and `ibv_wc` have identical size, alignment and layout (asserted above);
        // every bit pattern is valid for both (plain integers).
        unsafe { &*(wc as *const ibv_wc).cast::<Wc>() }
    }

    /// The same bytes as an `ibv_wc`.
    pub fn to_ibv(self) -> ibv_wc {
        // SAFETY: identical size and layout (asserted above); all fields are plain integers, and
        // ibverbs-sys's `ibv_wc` enums are `u32` type aliases, so any value is valid.
        unsafe { std::mem::transmute::<Wc, ibv_wc>(self) }
    }
}
