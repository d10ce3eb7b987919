//! Memory regions.

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

use ibverbs_sys::*;

use super::{with, with_status};
use crate::abi::{self, Kind, Shell, set_errno};
use crate::mr::Mr;

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
        let id = st.w.alloc_id();
        let d = &mut st.w.devices[dev];
        d.next_key += 1;
        let n = d.next_key;
        // Unique per device (the counter in the high bits), not guessable from the index alone.
        let key = (n << 8) | (n.wrapping_mul(0x9d) & 0xff);
        d.keys.insert(key, id);
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
                addr: addr as u64,
                len: length as u64,
                access,
                key,
                shell,
            },
        );
        abi::register(p.cast(), Kind::Mr, shared, id);
        p
    })
}

pub(super) unsafe extern "C" fn dereg_mr(mr: *mut ibv_mr) -> c_int {
    with_status(mr.cast(), Kind::Mr, |_, st, id| {
        if let Some(m) = st.w.mrs.remove(&id) {
            st.w.devices[m.dev].keys.remove(&m.key);
            abi::unregister(m.shell.ptr().cast());
        }
        0
    })
}
