//! Memory regions: keys, bounds and access checks, and the "DMA" into and out of caller memory.

use ibverbs_sys::{ibv_access_flags, ibv_mr, ibv_sge, ibv_wc_status};

use crate::abi::Shell;
use crate::link::Gather;
use crate::state::World;

pub(crate) struct Mr {
    pub(crate) ctx: u32,
    pub(crate) pd: u32,
    pub(crate) dev: usize,
    /// The lkey and rkey; its bounds and access are the key's [`Region`].
    pub(crate) key: u32,
    /// Memory windows bound to it: while there are any it cannot be deregistered or
    /// re-registered.
    pub(crate) windows: u32,
    pub(crate) shell: Shell<ibv_mr>,
}

/// What an access through a key is checked against, kept with the key: one lookup per check.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Region {
    pub(crate) pd: u32,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) access: u32,
    /// What the key names.
    pub(crate) kind: KeyKind,
}

/// What a key names: a memory region (its lkey and rkey) or a memory window (an rkey only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyKind {
    /// A memory region: local and remote accesses.
    Mr,
    /// A memory window of id `mw`: remote accesses only, through exactly its bound range and
    /// access (none while unbound); a type 2 window only from the QP it is bound to (`qp`).
    Window { mw: u32, qp: Option<u32> },
}

impl Region {
    fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.addr + self.len)
    }

    /// Whether a remote access arriving at QP `qp` in `pd` and needing `access` may reach
    /// `len` bytes at `va` through this key (rxe's `lookup_mr` and `rxe_lookup_mw`, and the
    /// range check: a window's own range, not its region's, as the IBTA has it; rxe checks the
    /// region's).
    #[inline(always)]
    fn allows_remote(&self, pd: u32, qp: u32, va: u64, len: u64, access: u32) -> bool {
        let from_qp = match self.kind {
            KeyKind::Mr => true,
            KeyKind::Window { qp: bound, .. } => bound.is_none_or(|b| b == qp),
        };
        self.pd == pd && from_qp && self.access & access == access && self.contains(va, len)
    }
}

pub(crate) const LOCAL_WRITE: u32 = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
pub(crate) const REMOTE_WRITE: u32 = ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
pub(crate) const REMOTE_READ: u32 = ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
pub(crate) const REMOTE_ATOMIC: u32 = ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;
pub(crate) const ON_DEMAND: u32 = ibv_access_flags::IBV_ACCESS_ON_DEMAND.0;

/// The size of the host's pages (4 KiB unless the kernel says otherwise).
fn page_size() -> u64 {
    // SAFETY: sysconf reads a constant of the process (from its auxiliary vector).
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(n)
        .ok()
        .filter(|n| n.is_power_of_two())
        .unwrap_or(4096)
}

/// Brings in the pages of `len` bytes at `addr` as the NIC's page fault of an on-demand region
/// does (rxe's ODP faults them through `hmm_range_fault`): `MADV_POPULATE_READ`, or
/// `_WRITE` if `write`. False if they cannot be: not mapped, or not readable (writable) as
/// asked. Zero bytes always can.
pub(crate) fn fault_in(addr: u64, len: u64, write: bool) -> bool {
    populate(addr, len, write).is_ok()
}

/// `MADV_POPULATE_READ` (`_WRITE` if `write`) over the pages of `len` bytes at `addr`: the
/// errno if it fails (ENOMEM: not mapped; EINVAL: a mapping that does not allow the access, or
/// a kernel without these advices; EFAULT: an access that would fault).
fn populate(addr: u64, len: u64, write: bool) -> Result<(), i32> {
    if len == 0 {
        return Ok(());
    }
    let page = page_size();
    let start = addr & !(page - 1);
    let end = addr
        .checked_add(len)
        .and_then(|e| e.checked_next_multiple_of(page))
        .ok_or(libc::EINVAL)?;
    let span = usize::try_from(end - start).map_err(|_| libc::EINVAL)?;
    let advice = if write {
        libc::MADV_POPULATE_WRITE
    } else {
        libc::MADV_POPULATE_READ
    };
    advise(start, span, advice)
}

/// `madvise(2)` with a populate or hint `advice` (`MADV_POPULATE_*`, `MADV_WILLNEED`) over
/// `span` bytes from the page at `start`: the errno if it fails.
#[cfg(not(miri))]
fn advise(start: u64, span: usize, advice: i32) -> Result<(), i32> {
    // SAFETY: these advices change no mapping and no byte: MADV_POPULATE_* faults pages of
    // existing mappings in, as touching them would (without a signal where that would fail),
    // and MADV_WILLNEED is a hint (the callers pass no other advice).
    match unsafe { libc::madvise(start as usize as *mut std::ffi::c_void, span, advice) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EFAULT)),
    }
}

/// Under Miri, which has no `madvise`: every range is taken as mapped with the access asked
/// (Miri checks each access the copies then make against its own memory model).
#[cfg(miri)]
fn advise(_start: u64, _span: usize, _advice: i32) -> Result<(), i32> {
    Ok(())
}

/// Whether the kernel has `MADV_POPULATE_*` (Linux 5.14 on): asked once, of a page of this
/// process's own data.
fn can_populate() -> bool {
    static ANSWER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    static PROBE: u8 = 0;
    *ANSWER.get_or_init(|| populate(&raw const PROBE as u64, 1, false) != Err(libc::EINVAL))
}

/// Access through which a region's memory may be written: the kernel pins such a region's
/// pages for writing (`ib_access_writable`: a window bound to the region may write it too).
const WRITES: u32 =
    LOCAL_WRITE | REMOTE_WRITE | REMOTE_ATOMIC | ibv_access_flags::IBV_ACCESS_MW_BIND.0;

/// Whether the `len` bytes at `addr` may be a region with `access` that is not on demand.
/// The kernel pins a region's pages when it is registered (`ib_umem_get`), for writing if
/// `access` writes, and fails with EFAULT where it cannot: a range not mapped, or not writable
/// for a region that writes. softnic does not pin; it faults the pages in the same way, and
/// fails as the kernel does, so that no access through the region faults later (a peer's
/// WRITE into a read-only page would kill the process). Memory unmapped or made read-only
/// after its registration is still the program's to keep: the kernel's pinned pages would go
/// on taking the NIC's accesses, where softnic's would fault. On a kernel without
/// `MADV_POPULATE_*` the pages are taken as they are.
pub(crate) fn pinnable(addr: u64, len: u64, access: u32) -> Result<(), i32> {
    let write = access & WRITES != 0;
    let mut tries = 0;
    loop {
        match populate(addr, len, write) {
            Ok(()) => return Ok(()),
            Err(libc::EINTR) if tries < 16 => tries += 1,
            Err(libc::EINVAL) if !can_populate() => return Ok(()),
            Err(_) => return Err(libc::EFAULT),
        }
    }
}

impl World {
    /// Checks a local SGE of a WR on a QP of `dev` in `pd`: an MR of that device and PD with
    /// that lkey must hold the whole range, with local write access if `write`. A zero-length
    /// SGE is not checked (rxe's behaviour; mlx5 would read 0 as 2 GiB).
    #[inline(always)]
    pub(crate) fn check_local(
        &self,
        dev: usize,
        pd: u32,
        sge: &ibv_sge,
        write: bool,
    ) -> Result<(), ibv_wc_status::Type> {
        if sge.length == 0 {
            return Ok(());
        }
        let mr = self.devices[dev].keys.get(sge.lkey).filter(|mr| {
            mr.kind == KeyKind::Mr && mr.pd == pd && mr.contains(sge.addr, u64::from(sge.length))
        });
        match mr {
            Some(mr) if write && mr.access & LOCAL_WRITE == 0 => {
                Err(ibv_wc_status::IBV_WC_LOC_PROT_ERR)
            }
            // An on-demand region's pages are faulted in at each access; one that cannot be
            // (not mapped) fails the WR as a protection error.
            Some(mr)
                if mr.access & ON_DEMAND != 0
                    && !fault_in(sge.addr, u64::from(sge.length), write) =>
            {
                Err(ibv_wc_status::IBV_WC_LOC_PROT_ERR)
            }
            Some(_) => Ok(()),
            None => Err(ibv_wc_status::IBV_WC_LOC_PROT_ERR),
        }
    }

    /// Checks a remote access through `rkey` of `len` bytes at `va`, arriving at QP `qp` of
    /// device `dev` in `pd` and needing `access` (`REMOTE_WRITE`, `REMOTE_READ` or
    /// `REMOTE_ATOMIC`): through the key of a memory region or of a bound memory window.
    #[inline(always)]
    pub(crate) fn check_remote(
        &self,
        (dev, pd, qp): (usize, u32, u32),
        rkey: u32,
        va: u64,
        len: u64,
        access: u32,
    ) -> bool {
        match self.devices[dev].keys.get(rkey) {
            Some(r) => {
                r.allows_remote(pd, qp, va, len, access)
                    && (r.access & ON_DEMAND == 0 || fault_in(va, len, access != REMOTE_READ))
            }
            None => false,
        }
    }

    /// Checks a FLUSH through `rkey` arriving at QP `qp` of device `dev` in `pd`: a memory
    /// region's key (rxe's `lookup_mr`; a window's is refused) granting the placement types
    /// asked (`ptype`: 1 global visibility, 2 persistence), holding `len` bytes at `va` unless
    /// the whole region is flushed (`whole`: rxe skips the range check then).
    pub(crate) fn check_flush(
        &self,
        (dev, pd, _qp): (usize, u32, u32),
        rkey: u32,
        (va, len): (u64, u64),
        ptype: u8,
        whole: bool,
    ) -> bool {
        let mut need = 0;
        if ptype & 1 != 0 {
            need |= ibv_access_flags::IBV_ACCESS_FLUSH_GLOBAL.0;
        }
        if ptype & 2 != 0 {
            need |= ibv_access_flags::IBV_ACCESS_FLUSH_PERSISTENT.0;
        }
        self.devices[dev].keys.get(rkey).is_some_and(|r| {
            r.kind == KeyKind::Mr
                && r.pd == pd
                && r.access & need == need
                && (whole || r.contains(va, len))
        })
    }

    /// `ibv_advise_mr` on PD `pd` of device `dev`: each SGE must lie in a region of the PD
    /// with that lkey (with local write access to prefetch for writing: `write`), and its pages
    /// are faulted in now, as an on-demand region's first access would (`no_fault`: only
    /// hinted, `MADV_WILLNEED`, never failing). 0, or EFAULT as the man page has it: a bad
    /// key or range, or pages that cannot be brought in.
    pub(crate) fn advise(
        &self,
        dev: usize,
        pd: u32,
        sges: &[ibv_sge],
        write: bool,
        no_fault: bool,
    ) -> i32 {
        for sge in sges {
            let len = u64::from(sge.length);
            let ok = self.devices[dev].keys.get(sge.lkey).is_some_and(|r| {
                r.kind == KeyKind::Mr
                    && r.pd == pd
                    && r.contains(sge.addr, len)
                    && (!write || r.access & LOCAL_WRITE != 0)
            });
            if !ok {
                return libc::EFAULT;
            }
            if no_fault {
                // A hint only: its failure, on a range not mapped, is ignored (no fault is
                // asked for).
                let _ = advise(
                    sge.addr & !(page_size() - 1),
                    (len + (sge.addr & (page_size() - 1))) as usize,
                    libc::MADV_WILLNEED,
                );
            } else if !fault_in(sge.addr, len, write) {
                return libc::EFAULT;
            }
        }
        0
    }

    /// Appends `len` bytes starting `offset` bytes into the data described by `sges` to `out`,
    /// checking every SGE it touches. Unless `copy`, appends zeros instead of reading the
    /// memory ([`FabricConfig::copy_payload`](crate::FabricConfig::copy_payload)).
    pub(crate) fn gather(
        &self,
        dev: usize,
        pd: u32,
        sges: &[ibv_sge],
        (mut offset, mut len): (u64, u64),
        copy: bool,
        out: &mut Vec<u8>,
    ) -> Result<(), ibv_wc_status::Type> {
        for sge in sges {
            if len == 0 {
                break;
            }
            let l = u64::from(sge.length);
            if offset >= l {
                offset -= l;
                continue;
            }
            self.check_local(dev, pd, sge, false)?;
            let n = (l - offset).min(len);
            if copy {
                // SAFETY: the range lies inside a live MR (checked just above); registering that
                // MR promised the memory stays valid and readable while it is registered.
                unsafe { read_mem(sge.addr + offset, n as usize, out) };
            } else {
                out.resize(out.len() + n as usize, 0);
            }
            len -= n;
            offset = 0;
        }
        if len == 0 {
            Ok(())
        } else {
            Err(ibv_wc_status::IBV_WC_LOC_LEN_ERR)
        }
    }

    /// The payload of the `len` bytes starting `offset` bytes into the data described by
    /// `sges` of a WR on QP `qp` (of device `dev`, in `pd`), left in memory, if they lie in one
    /// SGE (checked, unless the caller `checked` every SGE of the WR since it last let go of the
    /// fabric's lock); `None` if they span two.
    pub(crate) fn gather_late(
        &self,
        (dev, pd, qp, wire_gen): (usize, u32, u32, u32),
        sges: &[ibv_sge],
        (mut offset, len): (u64, u64),
        checked: bool,
    ) -> Option<Result<Gather, ibv_wc_status::Type>> {
        for sge in sges {
            let l = u64::from(sge.length);
            if offset >= l {
                offset -= l;
                continue;
            }
            if len > l - offset {
                return None;
            }
            let g = Gather {
                dev,
                pd,
                lkey: sge.lkey,
                addr: sge.addr + offset,
                len: len as u32,
                qp,
                wire_gen,
            };
            if checked {
                return Some(Ok(g));
            }
            return Some(self.check_gather(&g).map(|()| g));
        }
        Some(Err(ibv_wc_status::IBV_WC_LOC_LEN_ERR))
    }

    /// Whether any of `sges` (of a WR on device `dev`) lies in an on-demand region.
    pub(crate) fn on_demand(&self, dev: usize, sges: &[ibv_sge]) -> bool {
        let keys = &self.devices[dev].keys;
        sges.iter()
            .any(|s| keys.get(s.lkey).is_some_and(|r| r.access & ON_DEMAND != 0))
    }

    /// Checks that the memory a [`Gather`] reads is still registered as it was when its
    /// packet left.
    pub(crate) fn check_gather(&self, g: &Gather) -> Result<(), ibv_wc_status::Type> {
        self.check_local(g.dev, g.pd, &g.sge(), false)
    }

    /// Copies a [`Gather`]'s payload from the requester's memory to `va`.
    ///
    /// # Safety
    /// Since the fabric's lock was last taken, [`check_gather`](Self::check_gather) passed for
    /// `g` (so its memory is a live MR's, and stays one until the lock is let go), and `va` was
    /// checked to lie in a live MR with remote write access for `g.len` bytes.
    pub(crate) unsafe fn place(&self, g: &Gather, va: u64) {
        debug_assert!(self.check_gather(g).is_ok());
        // SAFETY: both ranges lie in live MRs, per this function's contract. They may overlap
        // (a loopback WRITE within one buffer): `copy_mem` allows that.
        unsafe { copy_mem(g.addr, va, g.len as usize) };
    }

    /// Writes `data` starting `offset` bytes into the buffer described by `sges`, checking
    /// every SGE it touches for local write access. `LOC_LEN_ERR` if the buffer is too short.
    /// Unless `copy`, checks the same and writes nothing
    /// ([`FabricConfig::copy_payload`](crate::FabricConfig::copy_payload)).
    pub(crate) fn scatter(
        &self,
        dev: usize,
        pd: u32,
        sges: &[ibv_sge],
        mut offset: u64,
        mut data: &[u8],
        copy: bool,
    ) -> Result<(), ibv_wc_status::Type> {
        for sge in sges {
            if data.is_empty() {
                break;
            }
            let l = u64::from(sge.length);
            if offset >= l {
                offset -= l;
                continue;
            }
            self.check_local(dev, pd, sge, true)?;
            let n = ((l - offset) as usize).min(data.len());
            if copy {
                // SAFETY: inside a live MR with local write access (checked just above).
                unsafe { write_mem(sge.addr + offset, &data[..n]) };
            }
            data = &data[n..];
            offset = 0;
        }
        if data.is_empty() {
            Ok(())
        } else {
            Err(ibv_wc_status::IBV_WC_LOC_LEN_ERR)
        }
    }
}

/// Appends `len` bytes at `addr` to `out`. Zero bytes touch no memory (the address may be
/// anything then, null included).
///
/// # Safety
/// Unless `len` is 0, `addr..addr + len` must be readable memory: the NIC's DMA read of a
/// registered region.
pub(crate) unsafe fn read_mem(addr: u64, len: usize, out: &mut Vec<u8>) {
    if len == 0 {
        return;
    }
    // SAFETY: the caller guarantees the range is readable.
    let src = unsafe { std::slice::from_raw_parts(addr as usize as *const u8, len) };
    out.extend_from_slice(src);
}

/// Copies `len` bytes from `src` to `dst`, which may overlap (as `memmove`). Zero bytes touch
/// no memory.
///
/// # Safety
/// Unless `len` is 0, `src..src + len` must be readable and `dst..dst + len` writable memory
/// that no Rust reference aliases: the NIC's DMA between two registered regions.
pub(crate) unsafe fn copy_mem(src: u64, dst: u64, len: usize) {
    if len == 0 {
        return;
    }
    // SAFETY: the caller guarantees both ranges; `copy` allows them to overlap.
    unsafe { std::ptr::copy(src as usize as *const u8, dst as usize as *mut u8, len) };
}

/// Copies `data` to `addr`. Zero bytes touch no memory.
///
/// # Safety
/// Unless `data` is empty, `addr..addr + data.len()` must be writable memory that no Rust
/// reference aliases: the NIC's DMA write into a registered region.
pub(crate) unsafe fn write_mem(addr: u64, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    // SAFETY: the caller guarantees the range is writable; `data` is softnic's own buffer, so
    // the two cannot overlap.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), addr as usize as *mut u8, data.len()) };
}

/// Executes an atomic on the 8 bytes at `addr` (host byte order, as rxe does): compare-and-swap
/// (`swap`: replace with `swap_add` if equal to `compare`) or fetch-and-add (add `swap_add`).
/// Returns the value before. Atomic with respect to the program's own atomic operations on
/// those bytes.
///
/// # Safety
/// `addr` must be 8-byte aligned and `addr..addr + 8` valid for reads and writes for the call
/// (registered memory with remote atomic access).
pub(crate) unsafe fn atomic_op(addr: u64, swap: bool, swap_add: u64, compare: u64) -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
    // SAFETY: aligned and valid for the call, per this function's contract.
    let cell = unsafe { AtomicU64::from_ptr(addr as usize as *mut u64) };
    if swap {
        cell.compare_exchange(compare, swap_add, SeqCst, SeqCst)
            .unwrap_or_else(|v| v)
    } else {
        cell.fetch_add(swap_add, SeqCst)
    }
}

/// Stores the 8 bytes `value` (host byte order) at `addr` at once, after every store before it
/// (a release store, as rxe's `smp_store_release` for an ATOMIC WRITE).
///
/// # Safety
/// `addr` must be 8-byte aligned and `addr..addr + 8` valid for writes for the call
/// (registered memory with remote write access).
pub(crate) unsafe fn atomic_store(addr: u64, value: u64) {
    use std::sync::atomic::{AtomicU64, Ordering::Release};
    // SAFETY: aligned and valid for the call, per this function's contract.
    let cell = unsafe { AtomicU64::from_ptr(addr as usize as *mut u64) };
    cell.store(value, Release);
}
