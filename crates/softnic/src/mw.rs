//! Memory windows, as the kernel's rxe driver has them (`rxe_mw.c`): type 1 windows, bound by
//! `ibv_bind_mw` and valid from their allocation, and type 2B windows, free until a BIND_MW
//! work request binds them to the QP that posted it, and free again once a LOCAL_INV or a
//! peer's SEND_WITH_INV invalidates them.
//!
//! A window's key is a device key like an MR's ([`crate::keys`]): a 24-bit index of its own
//! and a tag the consumer picks with each bind (`ibv_inc_rkey`). Remote accesses through it are
//! checked against its [`Region`]: its bound range and access, its PD and, for a type 2 window,
//! the QP it is bound to (see [`World::check_remote`]). An unbound window's region is empty.
//!
//! Where rxe and the IBTA part ways, softnic keeps to the IBTA and says so: a window's range,
//! not its region's, bounds what a remote access may reach; the region of a bind must be in the
//! window's PD for type 2 windows too; a free window, or one bound to another QP, cannot be
//! invalidated by a peer; zero-based windows are not served (their bind fails).

use ibverbs_sys::{ibv_access_flags, ibv_mw};

use crate::abi::Shell;
use crate::mr::{KeyKind, LOCAL_WRITE, REMOTE_ATOMIC, REMOTE_READ, REMOTE_WRITE, Region};
use crate::state::World;

const MW_BIND: u32 = ibv_access_flags::IBV_ACCESS_MW_BIND.0;

/// The access flags a window may be bound with: its remote rights (and local write, which
/// means nothing on a window and is ignored).
const WINDOW_ACCESS: u32 = REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC | LOCAL_WRITE;

/// A memory window.
pub(crate) struct Mw {
    pub(crate) ctx: u32,
    pub(crate) pd: u32,
    pub(crate) dev: usize,
    /// Type 2 (bound by work requests, to a QP); else type 1.
    pub(crate) type2: bool,
    /// The window's live key: its tag changes with each bind.
    pub(crate) key: u32,
    /// Type 1: the key the last `ibv_bind_mw` posted asked for (the key it gave the caller),
    /// from which the next one's tag is counted.
    pub(crate) posted_key: u32,
    /// The MR the window is bound to; `None` while unbound (a type 2 window is then free).
    pub(crate) mr: Option<u32>,
    pub(crate) shell: Shell<ibv_mw>,
}

/// A BIND_MW work request as the send queue keeps it, its window and region resolved.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bind {
    pub(crate) mw: u32,
    /// The region, if the bind has a length (a length of 0 unbinds a type 1 window).
    pub(crate) mr: Option<u32>,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) access: u32,
    /// The new key's tag (its low 8 bits; the rest is the window's).
    pub(crate) tag: u8,
}

/// A work request the requester executes itself, sending nothing (rxe's local operations).
#[derive(Debug, Clone, Copy)]
pub(crate) enum LocalOp {
    /// IBV_WR_BIND_MW.
    Bind(Bind),
    /// IBV_WR_LOCAL_INV of this key.
    Invalidate(u32),
}

impl World {
    /// Executes a BIND_MW of QP `qp` of device `dev` in `pd`, with rxe's checks
    /// (`rxe_check_bind_mw`); `None` if one fails (the WR completes with `MW_BIND_ERR`).
    pub(crate) fn bind_window(&mut self, (dev, pd, qp): (usize, u32, u32), b: &Bind) -> Option<()> {
        let mw = self.mws.get(&b.mw)?;
        if mw.dev != dev || b.access & !WINDOW_ACCESS != 0 {
            return None;
        }
        // o10-37.2.30: a type 2 window is bound only when free; C10-72: by a QP of its PD;
        // o10-37.2.40: to a region, with a length.
        if mw.type2 && (mw.mr.is_some() || mw.pd != pd || b.mr.is_none() || b.len == 0) {
            return None;
        }
        let (type2, mw_pd, key) = (mw.type2, mw.pd, mw.key);
        let target = if b.len == 0 {
            None
        } else {
            let mr = self.mrs.get(&b.mr?)?;
            let region = self.devices[dev].keys.get(mr.key)?;
            let end = b.addr.checked_add(b.len)?;
            let writable = b.access & (REMOTE_WRITE | REMOTE_ATOMIC) != 0;
            let ok = mr.dev == dev
                && region.pd == mw_pd
                // C10-73: the region allows binding.
                && region.access & MW_BIND != 0
                // C10-74: a window that may be written needs local write on the region.
                && (!writable || region.access & LOCAL_WRITE != 0)
                // C10-75: the window lies in the region.
                && b.addr >= region.addr
                && end <= region.addr + region.len;
            if !ok {
                return None;
            }
            b.mr
        };
        // The last step that can fail comes first: a refused bind changes nothing.
        let key = self.devices[dev].keys.retag(key, b.tag)?;
        if let Some(m) = self.mws.get_mut(&b.mw) {
            m.key = key;
        }
        self.unbind(b.mw);
        if let Some(m) = target.and_then(|id| self.mrs.get_mut(&id)) {
            m.windows += 1;
        }
        if let Some(r) = self.devices[dev].keys.get_mut(key) {
            *r = Region {
                pd: mw_pd,
                addr: b.addr,
                len: if target.is_some() { b.len } else { 0 },
                access: b.access,
                kind: KeyKind::Window {
                    mw: b.mw,
                    qp: type2.then_some(qp),
                },
            };
        }
        if let Some(m) = self.mws.get_mut(&b.mw) {
            m.mr = target;
        }
        Some(())
    }

    /// Invalidates the type 2 window of `rkey` for QP `qp` of device `dev` in `pd`: a
    /// LOCAL_INV, or (`remote`) the IETH of a SEND_WITH_INV that arrived at that QP, which
    /// may invalidate only a window bound to it. `None` if the key names no window bound in
    /// that PD (rxe's `rxe_invalidate_mw`; a region's key cannot be invalidated: softnic has
    /// no fast-registration regions).
    pub(crate) fn invalidate(
        &mut self,
        (dev, pd, qp): (usize, u32, u32),
        rkey: u32,
        remote: bool,
    ) -> Option<()> {
        let r = self.devices[dev].keys.get(rkey)?;
        let KeyKind::Window { mw, qp: bound } = r.kind else {
            return None;
        };
        let m = self.mws.get(&mw)?;
        // o10-37.2.26: a type 1 window is not invalidated.
        if !m.type2 || m.mr.is_none() || m.pd != pd || (remote && bound != Some(qp)) {
            return None;
        }
        self.unbind(mw);
        Some(())
    }

    /// Unbinds window `mw`: its region lets its count go, its key reaches nothing (its tag
    /// stays until the next bind).
    fn unbind(&mut self, mw: u32) {
        let Some(m) = self.mws.get_mut(&mw) else {
            return;
        };
        if let Some(mr) = m.mr.take().and_then(|id| self.mrs.get_mut(&id)) {
            mr.windows = mr.windows.saturating_sub(1);
        }
        if let Some(r) = self.devices[m.dev].keys.get_mut(m.key) {
            r.len = 0;
            r.access = 0;
            r.kind = KeyKind::Window { mw, qp: None };
        }
    }

    /// Frees window `mw`: unbound, and its key dead at once.
    pub(crate) fn free_window(&mut self, mw: u32) -> Option<Mw> {
        self.unbind(mw);
        let m = self.mws.remove(&mw)?;
        self.devices[m.dev].keys.remove(m.key);
        Some(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CONTROL, Fabric};

    /// A bind that fails at its last step (the window's key cannot be retagged) changes
    /// nothing: the window stays bound to its region, and no region's window count moves.
    /// (It used to unbind the window and count it on the new region first.)
    #[test]
    fn a_bind_that_fails_late_changes_no_count() {
        let f = Fabric::default();
        let dev = f.device("soft0").unwrap();
        // SAFETY: a device of a live fabric, then its context.
        let pd = unsafe { (CONTROL.alloc_pd)((CONTROL.open_device)(dev)) };
        assert!(!pd.is_null());
        let mut mem = vec![0u8; 2 * 4096];
        let access = (ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 | MW_BIND) as i32;
        let (a, b) = mem.split_at_mut(4096);
        // SAFETY: a live PD; `mem` outlives the MRs (the fabric goes first).
        let (ma, mb) = unsafe {
            (
                (CONTROL.reg_mr)(pd, a.as_mut_ptr().cast(), 4096, access),
                (CONTROL.reg_mr)(pd, b.as_mut_ptr().cast(), 4096, access),
            )
        };
        assert!(!ma.is_null() && !mb.is_null());
        // SAFETY: a live PD.
        let mw = unsafe { crate::control::alloc_mw(pd, ibverbs_sys::IBV_MW_TYPE_1) };
        assert!(!mw.is_null());
        let mut st = f.shared.lock_any();
        let w = &mut st.w;
        let (ra, rb, id) = (
            w.region_id(ma).unwrap(),
            w.region_id(mb).unwrap(),
            w.window_id(mw).unwrap(),
        );
        let pd_id = w.mrs[&ra].pd;
        let bind = |mr: u32, addr: *mut u8, tag: u8| Bind {
            mw: id,
            mr: Some(mr),
            addr: addr as u64,
            len: 64,
            access: REMOTE_WRITE,
            tag,
        };
        assert!(
            w.bind_window((0, pd_id, 0), &bind(ra, a.as_mut_ptr(), 1))
                .is_some()
        );
        assert_eq!((w.mrs[&ra].windows, w.mws[&id].mr), (1, Some(ra)));
        // The window's key is gone from the device's table: retagging it fails.
        let key = w.mws[&id].key;
        assert!(w.devices[0].keys.remove(key).is_some());
        assert!(
            w.bind_window((0, pd_id, 0), &bind(rb, b.as_mut_ptr(), 2))
                .is_none()
        );
        assert_eq!(
            (w.mrs[&ra].windows, w.mrs[&rb].windows, w.mws[&id].mr),
            (1, 0, Some(ra)),
            "a failed bind moved the counts"
        );
    }
}
