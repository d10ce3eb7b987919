//! The provider table: which libibverbs implementation the control path goes to.

use std::ffi::{CStr, c_int};
use std::sync::Arc;

use ibverbs_sys::{_compat_ibv_port_attr, ibv_context, ibv_device, ibv_port_attr};
use softnic::{CONTROL, ControlPath, Fabric};

use crate::error::{Errno, Error, Result};

/// The control path of a provider: the system libibverbs (through `ibverbs-sys`) or softnic.
///
/// The hot path (post, poll, notify) never goes through this table: it calls the context's
/// `ops`, exactly as rdma-core's inline functions do, for both providers.
#[derive(Clone)]
pub struct Verbs {
    pub(crate) ctl: ControlPath,
    source: Source,
}

#[derive(Clone)]
enum Source {
    System,
    Soft(Fabric),
}

impl std::fmt::Debug for Verbs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.source {
            Source::System => f.write_str("Verbs::system()"),
            Source::Soft(_) => f.write_str("Verbs::soft(..)"),
        }
    }
}

/// `ibv_query_port` of libibverbs takes the older, shorter port attribute struct (the full one
/// is reached through an inline wrapper that ibverbs-sys does not bind). The short struct is a
/// prefix of the full one, so the full one can be passed.
unsafe extern "C" fn system_query_port(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: `_compat_ibv_port_attr` is a layout prefix of `ibv_port_attr`; the caller's
    // pointer is valid for the full struct.
    unsafe { ibverbs_sys::ibv_query_port(ctx, port, attr.cast::<_compat_ibv_port_attr>()) }
}

impl Verbs {
    /// The system libibverbs (real RDMA hardware, or the kernel's rxe/siw).
    pub fn system() -> Verbs {
        use ibverbs_sys as s;
        Verbs {
            ctl: ControlPath {
                get_device_name: s::ibv_get_device_name,
                open_device: s::ibv_open_device,
                close_device: s::ibv_close_device,
                query_device: s::ibv_query_device,
                query_port: system_query_port,
                query_gid: s::ibv_query_gid,
                alloc_pd: s::ibv_alloc_pd,
                dealloc_pd: s::ibv_dealloc_pd,
                reg_mr: s::ibv_reg_mr,
                dereg_mr: s::ibv_dereg_mr,
                rereg_mr: s::ibv_rereg_mr,
                create_comp_channel: s::ibv_create_comp_channel,
                destroy_comp_channel: s::ibv_destroy_comp_channel,
                create_cq: s::ibv_create_cq,
                destroy_cq: s::ibv_destroy_cq,
                get_cq_event: s::ibv_get_cq_event,
                ack_cq_events: s::ibv_ack_cq_events,
                create_srq: s::ibv_create_srq,
                modify_srq: s::ibv_modify_srq,
                query_srq: s::ibv_query_srq,
                destroy_srq: s::ibv_destroy_srq,
                create_qp: s::ibv_create_qp,
                modify_qp: s::ibv_modify_qp,
                query_qp: s::ibv_query_qp,
                destroy_qp: s::ibv_destroy_qp,
                create_ah: s::ibv_create_ah,
                destroy_ah: s::ibv_destroy_ah,
                get_async_event: s::ibv_get_async_event,
                ack_async_event: s::ibv_ack_async_event,
            },
            source: Source::System,
        }
    }

    /// softnic's devices on `fabric`.
    pub fn soft(fabric: &Fabric) -> Verbs {
        Verbs {
            ctl: CONTROL,
            source: Source::Soft(fabric.clone()),
        }
    }

    /// softnic's devices on `fabric`, with a control path of the caller's choosing: softnic's
    /// ([`softnic::CONTROL`]) with some verbs replaced, to test what a program does when the
    /// provider fails them (a `dereg_mr` that returns `EBUSY`, say).
    ///
    /// # Safety
    /// Every function of `ctl` must behave as its libibverbs namesake documents for softnic's
    /// objects of `fabric`: take what softnic's takes, and return an object softnic made (or
    /// null, or an error) for what it creates. The simplest such replacement fails without
    /// doing anything.
    pub unsafe fn soft_with_control(fabric: &Fabric, ctl: ControlPath) -> Verbs {
        Verbs {
            ctl,
            source: Source::Soft(fabric.clone()),
        }
    }

    /// Whether this is softnic.
    pub fn is_soft(&self) -> bool {
        matches!(self.source, Source::Soft(_))
    }

    /// The softnic fabric, if this is softnic.
    pub fn fabric(&self) -> Option<&Fabric> {
        match &self.source {
            Source::Soft(f) => Some(f),
            Source::System => None,
        }
    }
}

/// The system's device list, freed when the last device taken from it is dropped.
struct SystemList(*mut *mut ibv_device);

impl Drop for SystemList {
    fn drop(&mut self) {
        // SAFETY: the list came from `ibv_get_device_list` and is freed exactly once.
        unsafe { ibverbs_sys::ibv_free_device_list(self.0) }
    }
}

// SAFETY: the list is only read (device pointers) and freed once; libibverbs allows that from
// any thread.
unsafe impl Send for SystemList {}
// SAFETY: as above.
unsafe impl Sync for SystemList {}

/// An RDMA device of a provider, not yet opened.
#[derive(Clone)]
pub struct Device {
    pub(crate) verbs: Verbs,
    pub(crate) raw: *mut ibv_device,
    name: String,
    _list: Option<Arc<SystemList>>,
}

// SAFETY: an `ibv_device` is immutable after enumeration; opening it is thread-safe.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("name", &self.name).finish()
    }
}

impl Device {
    /// The devices of `verbs`. With the system provider, a kernel without RDMA support
    /// (`ENOSYS`) or without devices gives an empty list, not an error.
    pub fn list(verbs: &Verbs) -> Result<Vec<Device>> {
        let (raws, list) = match &verbs.source {
            Source::Soft(f) => (f.devices(), None),
            Source::System => {
                let mut n: c_int = 0;
                // SAFETY: writes the count through a valid pointer; returns NULL or a
                // NULL-terminated array that `SystemList` frees.
                let p = unsafe { ibverbs_sys::ibv_get_device_list(&mut n) };
                if p.is_null() {
                    let e = Errno::last();
                    return match e.0 {
                        libc::ENOSYS | libc::ENODEV | libc::ENOENT => Ok(Vec::new()),
                        _ => Err(Error::DeviceList { errno: e }),
                    };
                }
                let list = Arc::new(SystemList(p));
                // SAFETY: `p` holds `n` valid device pointers.
                let raws = (0..n.max(0) as usize)
                    .map(|i| unsafe { *p.add(i) })
                    .collect();
                (raws, Some(list))
            }
        };
        Ok(raws
            .into_iter()
            .map(|raw| {
                // SAFETY: `raw` is a valid device of this provider; its name is a NUL-terminated
                // string owned by the device.
                let name = unsafe { CStr::from_ptr((verbs.ctl.get_device_name)(raw)) };
                Device {
                    verbs: verbs.clone(),
                    raw,
                    name: name.to_string_lossy().into_owned(),
                    _list: list.clone(),
                }
            })
            .collect())
    }

    /// The device named `name`.
    pub fn by_name(verbs: &Verbs, name: &str) -> Result<Device> {
        let all = Device::list(verbs)?;
        let available = all.iter().map(|d| d.name.clone()).collect();
        all.into_iter()
            .find(|d| d.name == name)
            .ok_or(Error::NoSuchDevice {
                name: name.to_string(),
                available,
            })
    }

    /// The device's name (`mlx5_0`, `rxe0`, `soft0`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The raw `ibv_device`.
    pub fn as_raw(&self) -> *mut ibv_device {
        self.raw
    }
}
