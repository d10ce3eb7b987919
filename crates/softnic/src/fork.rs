//! A forked child and softnic. On a kernel a forked child opens a context of its own on its
//! parent's device, and none of its parent's verbs objects is the child's. softnic's registry
//! forgets the parent's objects in the child (they are only recognised: see
//! [`abi::inherited`](crate::abi)), so that the child never reaches a fabric whose lock a
//! thread of its parent may have held when it forked, nor takes its parent's packets from a
//! socket they share; the child's copies of its parent's receiving sockets (bound to its
//! devices' addresses) and of the names that announce its listeners to the host are replaced
//! by `/dev/null` (see [`Bound`]), so that the parent's addresses are free again once it
//! exits, and its listeners no longer announced once it destroys them; and a [`PerProcess`]
//! value the parent built (the device of a library over softnic) is built afresh by the child
//! on its first use there.

use std::cell::RefCell;
use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, Ordering};
use std::sync::{OnceLock, RwLock, RwLockWriteGuard};

use crate::abi::{REGISTRY, Registry};
use crate::cm::loopback::NAME_PREFIX;

/// Forks between the process that first used softnic and this one (0 in that process).
static FORKS: AtomicU64 = AtomicU64::new(0);

/// Whether the fork handlers are registered (or being).
static GUARDED: AtomicBool = AtomicBool::new(false);

/// What a thread that forks holds from just before the fork to just after it: the registry's
/// write lock, and [`BINDING`]'s.
type ForkGuards = (
    RwLockWriteGuard<'static, Registry>,
    RwLockWriteGuard<'static, ()>,
);

thread_local! {
    /// What this thread holds across its fork.
    static FORKING: RefCell<Option<ForkGuards>> = const { RefCell::new(None) };
}

/// Registers softnic's fork handlers now, once; the first object made registers them too (a
/// fork before then has nothing of softnic's to leave behind). A library over softnic calls it
/// when it is loaded, before its program has other threads: a fork in another thread while
/// they are being registered would leave the child its parent's objects as its own (and the
/// registry's lock perhaps held).
pub fn watch_forks() {
    if GUARDED.load(Ordering::Acquire) || GUARDED.swap(true, Ordering::AcqRel) {
        return;
    }
    // SAFETY: registers three `extern "C"` functions that take no arguments; they run around
    // every later `fork` of the process, in the forking thread.
    let e = unsafe {
        libc::pthread_atfork(
            Some(before_fork),
            Some(after_fork_in_parent),
            Some(after_fork_in_child),
        )
    };
    // ENOMEM: a forked child then finds its parent's objects as its own, as it did before.
    debug_assert_eq!(e, 0, "pthread_atfork");
}

/// Forks between the process that first used softnic and this one: a value built by a
/// process with fewer is its parent's. Registers the fork handlers first, so that every later
/// fork is counted.
pub(crate) fn forks() -> u64 {
    watch_forks();
    FORKS.load(Ordering::Acquire)
}

/// Before a `fork`: the forking thread takes the registry's lock, so that the child never
/// finds it held by a thread that is not there (its first lookup would wait for ever), nor
/// an entry half made; then [`BINDING`], so that no [`Bound`] socket is half registered.
extern "C" fn before_fork() {
    let reg = REGISTRY.write().unwrap_or_else(|e| e.into_inner());
    let binding = BINDING.write().unwrap_or_else(|e| e.into_inner());
    let _ = FORKING.try_with(|f| *f.borrow_mut() = Some((reg, binding)));
}

/// After a `fork`, in the parent: the registry and [`BINDING`] as they were.
extern "C" fn after_fork_in_parent() {
    let _ = FORKING.try_with(|f| f.borrow_mut().take());
}

/// After a `fork`, in the child: every object is its parent's, its parent's addresses are
/// given back (see [`Bound`]), and one more fork is counted.
extern "C" fn after_fork_in_child() {
    let _ = FORKING.try_with(|f| {
        if let Some((mut reg, _binding)) = f.borrow_mut().take() {
            reg.inherit();
        }
    });
    // Also when the forking thread could not hold the locks (its thread-locals gone): then a
    // socket its parent was registering may be left bound.
    unbind_in_child();
    FORKS.fetch_add(1, Ordering::AcqRel);
}

/// The descriptors of the [`Bound`] sockets of the process: -1 where free. A process has one
/// per device on the UDP link, and one per device for each listener bound to the any address
/// there (every datagram rsocket's is); beyond 1024, a child keeps its copies of the rest, as
/// it did of all before.
static BOUND: [AtomicI32; 1024] = [const { AtomicI32::new(-1) }; 1024];

/// Held (shared) while a [`Bound`] socket is made and registered, or unregistered and closed,
/// and (exclusive) by a thread that forks: a child never has a bound socket its parent had
/// not registered yet, nor a number registered that its parent had closed.
static BINDING: RwLock<()> = RwLock::new(());

/// A socket bound to a device's address (its receiving socket on the UDP link, port 4791),
/// or to a name that announces a listener to the host (see
/// [`loopback`](crate::cm::loopback)), which a forked child must not keep: a parent restarted
/// while its child lives (a daemon that forked into the background, a server that forked a
/// worker) must find the address free, as it would a kernel's device, and a listener its
/// parent destroyed must not stay announced. In a child forked while it is registered, its
/// descriptor becomes `/dev/null`: the address or name is given back, and the child's copy
/// of the object that owns it (never reached through softnic's verbs there) closes
/// `/dev/null`, never a descriptor the child opened since.
#[derive(Debug)]
pub(crate) struct Bound<S: AsRawFd> {
    /// Closed by `drop`, under [`BINDING`].
    socket: ManuallyDrop<S>,
    /// Its place in [`BOUND`], if it found one.
    slot: Option<usize>,
}

impl<S: AsRawFd> Bound<S> {
    /// The socket `bind` makes (bound to port [`crate::roce::UDP_PORT`], or to an abstract
    /// Unix name that begins with [`NAME_PREFIX`]), registered.
    pub(crate) fn bind(bind: impl FnOnce() -> io::Result<S>) -> io::Result<Bound<S>> {
        watch_forks();
        let _no_fork = BINDING.read().unwrap_or_else(|e| e.into_inner());
        let socket = bind()?;
        let fd = socket.as_raw_fd();
        let slot = BOUND.iter().position(|s| {
            s.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        });
        Ok(Bound {
            socket: ManuallyDrop::new(socket),
            slot,
        })
    }
}

impl<S: AsRawFd> std::ops::Deref for Bound<S> {
    type Target = S;

    fn deref(&self) -> &S {
        &self.socket
    }
}

impl<S: AsRawFd> Drop for Bound<S> {
    /// Unregisters the socket and closes it, with no fork in between.
    fn drop(&mut self) {
        let _no_fork = BINDING.read().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = self.slot {
            // Its number only: a child's copy, whose slot the child cleared and may have
            // given to a socket of its own, leaves that one registered.
            let fd = self.socket.as_raw_fd();
            let _ = BOUND[i].compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Relaxed);
        }
        // SAFETY: dropped once, here; `self.socket` is not used again.
        unsafe { ManuallyDrop::drop(&mut self.socket) };
    }
}

/// In a forked child: each [`Bound`] socket's descriptor becomes `/dev/null`, and its slot is
/// free for the child's own (async-signal-safe calls only). A number is checked to be such a
/// socket first ([`bound_as_registered`]), in case it is not what its parent registered.
fn unbind_in_child() {
    let null = c"/dev/null";
    let mut devnull: RawFd = -1;
    for s in &BOUND {
        let fd = s.swap(-1, Ordering::AcqRel);
        if fd < 0 || !bound_as_registered(fd) {
            continue;
        }
        if devnull < 0 {
            // SAFETY: a NUL-terminated path; `open` is async-signal safe.
            devnull = unsafe { libc::open(null.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        }
        if devnull >= 0 {
            // SAFETY: both are open descriptors of this process; `dup3` closes the socket's
            // copy and puts `/dev/null` at its number, at once.
            unsafe { libc::dup3(devnull, fd, libc::O_CLOEXEC) };
        }
        // (Without `/dev/null`, EMFILE say, the copy stays: the slot is freed all the same.)
    }
    if devnull >= 0 {
        // SAFETY: opened above, and only used here.
        unsafe { libc::close(devnull) };
    }
}

/// Whether `fd` is a datagram socket bound as a [`Bound`] socket is: IPv4 on port
/// [`crate::roce::UDP_PORT`], or Unix to an abstract name that begins with [`NAME_PREFIX`].
fn bound_as_registered(fd: RawFd) -> bool {
    let mut kind: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `kind` is writable for `len` bytes; `getsockopt` is async-signal safe and fails
    // (ENOTSOCK, EBADF) on anything but a socket.
    let got = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            (&raw mut kind).cast(),
            &raw mut len,
        )
    };
    if got != 0 || kind != libc::SOCK_DGRAM {
        return false;
    }
    // SAFETY: all-zero is a valid `sockaddr_storage`.
    let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `addr` is writable for `len` bytes; `getsockname` is async-signal safe.
    if unsafe { libc::getsockname(fd, (&raw mut addr).cast(), &raw mut len) } != 0 {
        return false;
    }
    match libc::c_int::from(addr.ss_family) {
        libc::AF_INET => {
            // SAFETY: an AF_INET address, which `sockaddr_storage` is large and aligned for.
            let a = unsafe { &*(&raw const addr).cast::<libc::sockaddr_in>() };
            u16::from_be(a.sin_port) == crate::roce::UDP_PORT
        }
        libc::AF_UNIX => {
            // SAFETY: an AF_UNIX address, as above.
            let a = unsafe { &*(&raw const addr).cast::<libc::sockaddr_un>() };
            // An abstract name: a NUL, then its bytes (`len` counts the family's too).
            let name_len = (len as usize).saturating_sub(std::mem::size_of::<libc::sa_family_t>());
            let path = &a.sun_path[..name_len.min(a.sun_path.len())];
            path.first() == Some(&0)
                && path.len() > NAME_PREFIX.len()
                && path[1..=NAME_PREFIX.len()]
                    .iter()
                    .zip(NAME_PREFIX)
                    .all(|(&c, &p)| c as u8 == p)
        }
        _ => false,
    }
}

/// One process's value, built on first use.
struct Held<T: 'static> {
    /// [`forks`] of the process that made it.
    forks: u64,
    value: OnceLock<T>,
    /// The value of the process this one was forked from.
    parent: Option<&'static Held<T>>,
}

/// A value of the process (in a `static`), built on first use by [`get_or_init`]: a child
/// forked after its parent built it (or while another thread of the parent was building it)
/// builds its own. No value is ever dropped (each lives for the rest of its process): the
/// parent's stays in the child's memory, never reached by `get_or_init` there (its locks may
/// have been held by threads the child does not have); [`ancestors`] lists it.
///
/// ```
/// use softnic::PerProcess;
///
/// static PID: PerProcess<u32> = PerProcess::new();
/// assert_eq!(*PID.get_or_init(std::process::id), std::process::id());
/// assert_eq!(PID.get(), Some(&std::process::id()));
/// assert_eq!(PID.ancestors().count(), 0);
/// ```
///
/// [`get_or_init`]: PerProcess::get_or_init
/// [`ancestors`]: PerProcess::ancestors
pub struct PerProcess<T: 'static> {
    /// The latest `Held`, leaked: null before the first use.
    latest: AtomicPtr<Held<T>>,
    /// Shared as a `OnceLock<T>` is (`Sync` only for a `T` that is `Send` and `Sync`).
    value: std::marker::PhantomData<OnceLock<T>>,
}

impl<T: Send + Sync + 'static> PerProcess<T> {
    /// None built yet.
    pub const fn new() -> PerProcess<T> {
        PerProcess {
            latest: AtomicPtr::new(std::ptr::null_mut()),
            value: std::marker::PhantomData,
        }
    }

    /// This process's `Held`, made on its first use here.
    fn held(&self) -> &'static Held<T> {
        let forks = forks();
        let latest = self.latest.load(Ordering::Acquire);
        // SAFETY: `latest` is null or a `Held` leaked below, never freed nor mutated but
        // through its `OnceLock`.
        let parent = unsafe { latest.as_ref() };
        if let Some(h) = parent.filter(|h| h.forks == forks) {
            return h;
        }
        let mine = Box::into_raw(Box::new(Held {
            forks,
            value: OnceLock::new(),
            parent,
        }));
        match self
            .latest
            .compare_exchange(latest, mine, Ordering::AcqRel, Ordering::Acquire)
        {
            // SAFETY: just leaked (it stays for the rest of the process).
            Ok(_) => unsafe { &*mine },
            Err(theirs) => {
                // SAFETY: `mine` was never shared: it goes back as the box it came from.
                drop(unsafe { Box::from_raw(mine) });
                // SAFETY: another thread of this process leaked it, as above.
                unsafe { &*theirs }
            }
        }
    }

    /// This process's value, built by `make` on its first use in this process.
    pub fn get_or_init(&self, make: impl FnOnce() -> T) -> &'static T {
        self.held().value.get_or_init(make)
    }

    /// This process's value, if built. It allocates nothing and waits for no lock.
    pub fn get(&self) -> Option<&'static T> {
        // SAFETY: as in `held`.
        let latest = unsafe { self.latest.load(Ordering::Acquire).as_ref() }?;
        // Not null: `held` ran, and the fork handlers are registered.
        (latest.forks == forks())
            .then(|| latest.value.get())
            .flatten()
    }

    /// Whether a process this one was forked from built its value (this one's may be built
    /// too). It allocates nothing and waits for no lock.
    pub fn is_inherited(&self) -> bool {
        // SAFETY: as in `held`.
        let latest = unsafe { self.latest.load(Ordering::Acquire).as_ref() };
        let Some(latest) = latest else {
            return false;
        };
        let forks = forks();
        std::iter::successors(Some(latest), |h| h.parent)
            .any(|h| h.forks != forks && h.value.get().is_some())
    }

    /// The values of the processes this one was forked from (built there), its parent's
    /// first. They are not this process's to use: only to recognise. (Like `get_or_init`, it
    /// makes this process's place for its value, an allocation, on its first use here.)
    pub fn ancestors(&self) -> impl Iterator<Item = &'static T> {
        std::iter::successors(self.held().parent, |h| h.parent).filter_map(|h| h.value.get())
    }
}

impl<T: Send + Sync + 'static> Default for PerProcess<T> {
    fn default() -> Self {
        PerProcess::new()
    }
}
