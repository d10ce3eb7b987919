//! Memory regions.

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

use ibverbs_sys::*;

use super::{try_with, with, with_status};
use crate::abi::{self, Kind, Shell, set_errno};
use crate::mr::{KeyKind, Mr, Region};

const MR_ACCESS: u32 = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
    | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
    | ibv_access_flags::IBV_ACCESS_REMOTE_READ.0
    | ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0
    | ibv_access_flags::IBV_ACCESS_MW_BIND.0
    | ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING.0
    | ibv_access_flags::IBV_ACCESS_ON_DEMAND.0
    // FLUSH to global visibility; persistence needs persistent memory, which softnic has
    // none of: IBV_ACCESS_FLUSH_PERSISTENT is refused (EINVAL), as rxe refuses it outside pmem.
    | ibv_access_flags::IBV_ACCESS_FLUSH_GLOBAL.0;

/// Whether `access` is a region's: known bits, and remote write or atomic access only with
/// local write (the kernel's `ib_check_mr_access`).
fn access_ok(access: u32) -> bool {
    let needs_local_write =
        ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0 | ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;
    let local_write = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    // Windows are not bound to on-demand regions: a window's accesses would not fault their
    // pages in.
    let odp_bind =
        ibv_access_flags::IBV_ACCESS_ON_DEMAND.0 | ibv_access_flags::IBV_ACCESS_MW_BIND.0;
    access & !MR_ACCESS == 0
        && (access & needs_local_write == 0 || access & local_write != 0)
        && access & odp_bind != odp_bind
}

/// Whether `length` bytes at `addr` are an address range (a null address only if empty, or
/// for the whole address space of an implicit on-demand region: `NULL`, `SIZE_MAX`).
fn range_ok(addr: *mut c_void, length: usize, access: u32) -> bool {
    let implicit = addr.is_null()
        && length == usize::MAX
        && access & ibv_access_flags::IBV_ACCESS_ON_DEMAND.0 != 0;
    implicit || ((!addr.is_null() || length == 0) && (addr as usize).checked_add(length).is_some())
}

/// Whether a region with `access` (known to be valid) may be made over `length` bytes at
/// `addr`, as an errno: its range must be one ([`range_ok`]: EINVAL), and the pages of a
/// region that is not on demand ones the kernel could pin (EFAULT: see
/// [`crate::mr::pinnable`]); an on-demand region's are faulted in as they are accessed.
///
/// A region of no bytes registers (at any address): rxe refuses one (EINVAL, as every driver
/// behind the kernel's `ib_umem_get`), but uccl-engine exports zero-byte ranges as regions.
fn region_ok(addr: *mut c_void, length: usize, access: u32) -> Result<(), c_int> {
    if !range_ok(addr, length, access) {
        return Err(libc::EINVAL);
    }
    if access & ibv_access_flags::IBV_ACCESS_ON_DEMAND.0 != 0 {
        return Ok(());
    }
    crate::mr::pinnable(addr as u64, length as u64, access)
}

pub(super) unsafe extern "C" fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    let access = access as u32;
    // The pages are looked at (and brought in) before the fabric's lock is taken: that takes
    // a while for a large region. A PD that is not one is refused first, below.
    let checked = match (access_ok(access), abi::lookup(pd.cast(), Kind::Pd)) {
        (false, _) => Err(libc::EINVAL),
        (true, Some(_)) => region_ok(addr, length, access),
        (true, None) => Ok(()),
    };
    with(pd.cast(), Kind::Pd, null_mut(), |shared, st, pd_id| {
        if let Err(e) = checked {
            set_errno(e);
            return null_mut();
        }
        let ctx = st.w.pds[&pd_id].ctx;
        let dev = st.w.contexts[&ctx].dev;
        let region = Region {
            pd: pd_id,
            addr: addr as u64,
            len: length as u64,
            access,
            kind: KeyKind::Mr,
        };
        let Some(key) = st.w.devices[dev].keys.insert(region) else {
            set_errno(libc::ENOMEM);
            return null_mut();
        };
        let id = st.w.alloc_id();
        let context = st.w.context_ptr(ctx);
        let mr = ibv_mr {
            context,
            pd,
            addr,
            length,
            handle: id,
            lkey: key,
            rkey: key,
        };
        let shell = Shell::new(mr, id);
        let p = shell.ptr();
        st.w.mrs.insert(
            id,
            Mr {
                ctx,
                pd: pd_id,
                dev,
                key,
                windows: 0,
                shell,
            },
        );
        abi::register(p.cast(), Kind::Mr, shared, id);
        p
    })
}

/// Deregisters an MR; EINVAL, the MR still registered, while memory windows are bound to it
/// (rxe's `rxe_dereg_mr`; IBA 10.6.7.2.6).
pub(super) unsafe extern "C" fn dereg_mr(mr: *mut ibv_mr) -> c_int {
    with_status(mr.cast(), Kind::Mr, |_, st, id| {
        if st.w.mrs.get(&id).is_some_and(|m| m.windows > 0) {
            return libc::EINVAL;
        }
        if let Some(m) = st.w.mrs.remove(&id) {
            st.w.devices[m.dev].keys.remove(m.key);
            abi::unregister(m.shell.ptr().cast());
        }
        0
    })
}

/// `ibv_rereg_mr`: libibverbs' own checks, then the provider's. Changes the region's
/// translation (`IBV_REREG_MR_CHANGE_TRANSLATION`: `addr`, `length`), PD
/// (`IBV_REREG_MR_CHANGE_PD`: `pd`, of the same context) and access
/// (`IBV_REREG_MR_CHANGE_ACCESS`: `access`), all or nothing; the keys stay (as rxe's), and
/// the `ibv_mr` says the new PD, address and length. Returns 0, or an `ibv_rereg_mr_err_code`
/// with errno set: `IBV_REREG_MR_ERR_INPUT` (the region unchanged) for unknown flags, a
/// translation without an address or a length, access without `CHANGE_ACCESS`, or a pointer
/// that is not a live region; `IBV_REREG_MR_ERR_CMD` (the region unchanged) for no flags, a PD
/// that is not one of the region's context, access or a range a region may not have (EINVAL),
/// and while memory windows are bound to the region (EBUSY: their ranges and rights were
/// checked against what it is now, as hardware refuses it).
pub(super) unsafe extern "C" fn rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    let fail = |code, e| {
        set_errno(e);
        code
    };
    let translation = flags & IBV_REREG_MR_CHANGE_TRANSLATION as c_int != 0;
    let changes_pd = flags & IBV_REREG_MR_CHANGE_PD as c_int != 0;
    let changes_access = flags & IBV_REREG_MR_CHANGE_ACCESS as c_int != 0;
    let unknown = flags & !(IBV_REREG_MR_FLAGS_SUPPORTED as c_int) != 0;
    if unknown
        || (translation && (length == 0 || addr.is_null()))
        || (access != 0 && !changes_access)
    {
        return fail(IBV_REREG_MR_ERR_INPUT, libc::EINVAL);
    }
    let r = try_with(mr.cast(), Kind::Mr, |_, st, id| {
        let m = &st.w.mrs[&id];
        let (dev, ctx, key) = (m.dev, m.ctx, m.key);
        if m.windows > 0 {
            return Err(libc::EBUSY);
        }
        let Some(mut region) = st.w.devices[dev].keys.get(key).copied() else {
            return Err(libc::EINVAL);
        };
        let new_pd = changes_pd.then(|| st.w.pd_id(pd));
        let bad = flags == 0
            || new_pd.is_some_and(|p| p.is_none_or(|p| st.w.pds[&p].ctx != ctx))
            || (changes_access && !access_ok(access as u32))
            || (translation && !range_ok(addr, length, 0));
        if bad {
            return Err(libc::EINVAL);
        }
        if translation || changes_access {
            // The region it becomes is checked as a registration's.
            let now_access = if changes_access {
                access as u32
            } else {
                region.access
            };
            let (a, n) = match translation {
                true => (addr, length),
                false => (region.addr as usize as *mut c_void, region.len as usize),
            };
            region_ok(a, n, now_access)?;
        }
        if let Some(Some(p)) = new_pd {
            region.pd = p;
        }
        if changes_access {
            region.access = access as u32;
        }
        if translation {
            (region.addr, region.len) = (addr as u64, length as u64);
        }
        if let Some(r) = st.w.devices[dev].keys.get_mut(key) {
            *r = region;
        }
        let m = st.w.mrs.get_mut(&id).expect("the region looked up above");
        m.pd = region.pd;
        m.shell.update(|s| {
            if changes_pd {
                s.pd = pd;
            }
            if translation {
                (s.addr, s.length) = (addr, length);
            }
        });
        Ok(())
    });
    match r {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => fail(IBV_REREG_MR_ERR_CMD, e),
        // Not a live region (errno is set): an input error.
        Err(e) => fail(IBV_REREG_MR_ERR_INPUT, e),
    }
}

#[cfg(test)]
mod tests {
    use crate::{CONTROL, Fabric};

    /// Once a device's key counter wraps, a new MR never takes the key of one still registered.
    #[test]
    fn keys_in_use_are_skipped_when_the_counter_wraps() {
        let f = Fabric::default();
        let dev = f.device("soft0").unwrap();
        // SAFETY: a device of a live fabric, then its context.
        let pd = unsafe { (CONTROL.alloc_pd)((CONTROL.open_device)(dev)) };
        assert!(!pd.is_null());
        let mut mem = vec![0u8; 64];
        let reg = |mem: &mut [u8]| {
            // SAFETY: a live PD; `mem` outlives the MRs (the fabric goes first).
            let mr = unsafe { (CONTROL.reg_mr)(pd, mem.as_mut_ptr().cast(), mem.len(), 1) };
            assert!(!mr.is_null());
            // SAFETY: a live MR's `ibv_mr`.
            unsafe { (*mr).lkey }
        };
        let first = reg(&mut mem);
        // The counter at its end: the next value it gives wraps to the one that gave `first`.
        f.shared.lock_any().w.devices[0].keys.counter = crate::keys::KEYS - 1;
        let mut later = Vec::new();
        for _ in 0..3 {
            later.push(reg(&mut mem));
        }
        assert!(
            later.iter().all(|k| k >> 8 != first >> 8),
            "{first:#x}'s index handed out twice: {later:x?}"
        );
        let st = f.shared.lock_any();
        let keys = &st.w.devices[0].keys;
        assert_eq!(keys.len(), 4, "every MR keeps its own key");
        assert!(keys.get(first).is_some());
    }
}
