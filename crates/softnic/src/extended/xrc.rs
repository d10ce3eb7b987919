//! The XRC verbs of `verbs_context` (see `crate::xrc`): `ibv_open_xrcd`, `ibv_close_xrcd`,
//! `ibv_create_srq_ex` and `ibv_get_srq_num`. Errors are libibverbs' and the kernel's:
//! `errno` and a null pointer for the constructors, the error number for the others.

use std::ffi::c_int;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::ptr::null_mut;

use ibverbs_sys::*;

use crate::abi::{self, Kind, Shell, set_errno};
use crate::control::{create_srq_with, with_status};
use crate::xrc::{Domain, Xrcd};

/// `verbs_context.open_xrcd`: an open of a new domain (`fd` -1), or of the one the file `fd`
/// names on this device (`oflags`: `O_CREAT` makes it if there is none, else EAGAIN;
/// `O_EXCL` refuses one that exists, EINVAL; other flags are ignored), as the kernel's. A mask
/// without both fields is EINVAL, one with unknown fields EOPNOTSUPP (libibverbs' checks), a
/// bad descriptor EBADF.
///
/// # Safety
/// `attr` is null or a valid `ibv_xrcd_init_attr`; `context` is any pointer (softnic refuses
/// one it did not hand out).
pub(super) unsafe extern "C" fn open_xrcd(
    context: *mut ibv_context,
    attr: *mut ibv_xrcd_init_attr,
) -> *mut ibv_xrcd {
    let fail = |e| {
        set_errno(e);
        null_mut()
    };
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: non-null, and a valid `ibv_xrcd_init_attr` per the verb's contract.
    let a = unsafe { *attr };
    if a.comp_mask >= IBV_XRCD_INIT_ATTR_RESERVED {
        return fail(libc::EOPNOTSUPP);
    }
    let both = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    if a.comp_mask & both != both {
        return fail(libc::EINVAL);
    }
    // The file, by device and inode, and a descriptor of it that the domain holds.
    let file = match a.fd {
        -1 => None,
        fd => {
            // SAFETY: reads nothing of the caller's but the descriptor number; the copy it
            // makes (or -1) is this function's.
            let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
            if dup < 0 {
                return fail(libc::EBADF);
            }
            // SAFETY: `dup` is a descriptor just made, owned by nothing else.
            let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(dup) });
            let Ok(m) = file.metadata() else {
                return fail(libc::EBADF);
            };
            Some(((m.dev(), m.ino()), OwnedFd::from(file)))
        }
    };
    crate::control::with(
        context.cast(),
        Kind::Context,
        null_mut(),
        |shared, st, ctx| {
            let dev = st.w.contexts[&ctx].dev;
            let found = file.as_ref().and_then(|(key, _)| {
                st.w.domains
                    .iter()
                    .find(|(_, d)| d.dev == dev && d.file.as_ref().is_some_and(|f| f.0 == *key))
                    .map(|(&id, _)| id)
            });
            let domain = match found {
                Some(_) if a.oflags & libc::O_EXCL != 0 => return fail(libc::EINVAL),
                Some(d) => d,
                None if file.is_some() && a.oflags & libc::O_CREAT == 0 => {
                    return fail(libc::EAGAIN);
                }
                None => {
                    let d = st.w.alloc_id();
                    st.w.domains.insert(
                        d,
                        Domain {
                            dev,
                            file,
                            opens: 0,
                        },
                    );
                    d
                }
            };
            st.w.domains
                .get_mut(&domain)
                .expect("just found or made")
                .opens += 1;
            let id = st.w.alloc_id();
            let shell = Shell::new(
                ibv_xrcd {
                    context: st.w.context_ptr(ctx),
                },
                id,
            );
            let p = shell.ptr();
            st.w.xrcds.insert(id, Xrcd { ctx, domain, shell });
            abi::register(p.cast(), Kind::Xrcd, shared, id);
            p
        },
    )
}

/// `verbs_context.close_xrcd`: closes an open, EBUSY while an SRQ or target QP made through
/// it lives (as the kernel's per-open count); the domain goes with its last open.
///
/// # Safety
/// `xrcd` is any pointer: softnic refuses one it did not hand out without dereferencing it.
pub(crate) unsafe extern "C" fn close_xrcd(xrcd: *mut ibv_xrcd) -> c_int {
    with_status(xrcd.cast(), Kind::Xrcd, |_, st, id| {
        if st.w.xrcd_in_use(id, &st.qps) {
            return libc::EBUSY;
        }
        let Some(x) = st.w.xrcds.remove(&id) else {
            return libc::EINVAL;
        };
        abi::unregister(x.shell.ptr().cast());
        if let Some(d) = st.w.domains.get_mut(&x.domain) {
            d.opens -= 1;
            if d.opens == 0 {
                st.w.domains.remove(&x.domain);
            }
        }
        0
    })
}

/// `verbs_context.get_srq_num`: the number requests name an SRQ by (an XRC SRQ's is what
/// matters; a basic SRQ has one too, as on mlx5).
///
/// # Safety
/// `srq_num` is null or writable; `srq` is any pointer (softnic refuses one it did not hand
/// out).
pub(super) unsafe extern "C" fn get_srq_num(srq: *mut ibv_srq, srq_num: *mut u32) -> c_int {
    if srq_num.is_null() {
        return libc::EINVAL;
    }
    with_status(srq.cast(), Kind::Srq, |_, st, id| {
        // SAFETY: non-null, and a writable `u32` per the verb's contract.
        unsafe { srq_num.write(st.w.srqs[&id].srqn) };
        0
    })
}

/// `verbs_context.create_srq_ex`: a basic SRQ (what `ibv_create_srq` makes) or an XRC SRQ
/// (`IBV_SRQT_XRC`: with `IBV_SRQ_INIT_ATTR_XRCD` and `_CQ`, else EINVAL). Every SRQ needs its
/// PD (EINVAL without); tag-matching SRQs and unknown fields are EOPNOTSUPP. The caller's
/// `attr` learns the SRQ's.
///
/// # Safety
/// `attr` is null or a valid, writable `ibv_srq_init_attr_ex` (its `tm_cap` need not exist:
/// it is never read); the pointers in it and `context` are checked.
pub(super) unsafe extern "C" fn create_srq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    let fail = |e| {
        set_errno(e);
        null_mut()
    };
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: non-null, and a valid `ibv_srq_init_attr_ex` per the verb's contract (its
    // `tm_cap`, last, is never read); the fields are read alone.
    let (mask, srq_type) = unsafe { ((*attr).comp_mask, (*attr).srq_type) };
    let served = IBV_SRQ_INIT_ATTR_TYPE
        | IBV_SRQ_INIT_ATTR_PD
        | IBV_SRQ_INIT_ATTR_XRCD
        | IBV_SRQ_INIT_ATTR_CQ;
    let srq_type = if mask & IBV_SRQ_INIT_ATTR_TYPE != 0 {
        srq_type
    } else {
        IBV_SRQT_BASIC
    };
    if mask & !served != 0 || srq_type == IBV_SRQT_TM {
        return fail(libc::EOPNOTSUPP);
    }
    // SAFETY: as above; these fields come before `tm_cap`, and each is read alone (no
    // reference to the whole struct, which a caller built against older headers may not
    // have room for).
    let (srq_context, srq_attr, pd, xrcd, cq) = unsafe {
        (
            (&raw const (*attr).srq_context).read(),
            (&raw const (*attr).attr).read(),
            (&raw const (*attr).pd).read(),
            (&raw const (*attr).xrcd).read(),
            (&raw const (*attr).cq).read(),
        )
    };
    let xrc_fields = IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
    let xrc = match srq_type {
        IBV_SRQT_BASIC => None,
        IBV_SRQT_XRC if mask & xrc_fields == xrc_fields => Some((xrcd, cq)),
        _ => return fail(libc::EINVAL),
    };
    if mask & IBV_SRQ_INIT_ATTR_PD == 0 {
        return fail(libc::EINVAL);
    }
    let mut init = ibv_srq_init_attr {
        srq_context,
        attr: srq_attr,
    };
    let srq = create_srq_with(pd, &mut init, Some(context), xrc);
    if !srq.is_null() {
        // SAFETY: as above; `attr.attr` is writable (the caller learns the SRQ's).
        unsafe { (&raw mut (*attr).attr).write(init.attr) };
    }
    srq
}
