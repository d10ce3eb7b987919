//! Memory regions.

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

use ibverbs_sys::*;

use super::{with, with_status};
use crate::abi::{self, Kind, Shell, set_errno};
use crate::mr::{KeyKind, Mr, Region};

const MR_ACCESS: u32 = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
    | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
    | ibv_access_flags::IBV_ACCESS_REMOTE_READ.0
    | ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0
    | ibv_access_flags::IBV_ACCESS_MW_BIND.0
    | ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING.0;

pub(super) unsafe extern "C" fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    with(pd.cast(), Kind::Pd, null_mut(), |shared, st, pd_id| {
        let access = access as u32;
        let needs_local_write = ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
            | ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;
        let local_write = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        let bad = access & !MR_ACCESS != 0
            || (access & needs_local_write != 0 && access & local_write == 0)
            || (addr.is_null() && length > 0)
            || (addr as usize).checked_add(length).is_none();
        if bad {
            set_errno(libc::EINVAL);
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
