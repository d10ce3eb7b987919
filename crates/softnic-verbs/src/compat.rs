//! What libraries loaded next to softnic's libibverbs need from it to load at all, and what
//! softnic does not serve: the provider interface (`IBVERBS_PRIVATE_34`, which rdma-core's
//! `libmlx5.so.1` and `libefa.so.1` bind at load time: perftest links them for their direct
//! verbs), the kernel-command helpers `librdmacm.so.1` binds, and the newer verbs softnic
//! has no use for (imports, dma-buf, ECE). Each fails cleanly: `EOPNOTSUPP` (as a return
//! value or `errno`), a null pointer, or nothing. No provider is ever called: softnic's
//! device list is the only one.

use std::ffi::{c_int, c_void};
use std::sync::atomic::AtomicBool;

use crate::exports::{fail, set_errno};

/// Defines each name as a function of no arguments returning `EOPNOTSUPP` (a C caller may
/// pass arguments: under the x86-64 and AArch64 C conventions the callee ignores them
/// harmlessly), bound to `name@@version`.
macro_rules! unsupported {
    ($ver:literal: $($name:ident)*) => {
        export! {$(
            /// Not served by softnic: returns `EOPNOTSUPP`.
            $ver fn $name() -> c_int {
                libc::EOPNOTSUPP
            }
        )*}
    };
}

unsupported!("IBVERBS_PRIVATE_34":
    execute_ioctl ibv_cmd_advise_mr ibv_cmd_alloc_dm ibv_cmd_alloc_mw ibv_cmd_alloc_pd
    ibv_cmd_attach_mcast ibv_cmd_close_xrcd ibv_cmd_create_ah ibv_cmd_create_counters
    ibv_cmd_create_cq ibv_cmd_create_cq_ex ibv_cmd_create_flow ibv_cmd_create_flow_action_esp
    ibv_cmd_create_qp ibv_cmd_create_qp_ex ibv_cmd_create_qp_ex2 ibv_cmd_create_rwq_ind_table
    ibv_cmd_create_srq ibv_cmd_create_srq_ex ibv_cmd_create_wq ibv_cmd_dealloc_mw
    ibv_cmd_dealloc_pd ibv_cmd_dereg_mr ibv_cmd_destroy_ah ibv_cmd_destroy_counters
    ibv_cmd_destroy_cq ibv_cmd_destroy_flow ibv_cmd_destroy_flow_action ibv_cmd_destroy_qp
    ibv_cmd_destroy_rwq_ind_table ibv_cmd_destroy_srq ibv_cmd_destroy_wq ibv_cmd_detach_mcast
    ibv_cmd_free_dm ibv_cmd_get_context ibv_cmd_modify_cq ibv_cmd_modify_flow_action_esp
    ibv_cmd_modify_qp ibv_cmd_modify_qp_ex ibv_cmd_modify_srq ibv_cmd_modify_wq
    ibv_cmd_open_qp ibv_cmd_open_xrcd ibv_cmd_poll_cq ibv_cmd_post_recv ibv_cmd_post_send
    ibv_cmd_post_srq_recv ibv_cmd_query_context ibv_cmd_query_device_any ibv_cmd_query_mr
    ibv_cmd_query_port ibv_cmd_query_qp ibv_cmd_query_srq ibv_cmd_read_counters
    ibv_cmd_reg_dm_mr ibv_cmd_reg_dmabuf_mr ibv_cmd_reg_mr ibv_cmd_req_notify_cq
    ibv_cmd_rereg_mr ibv_cmd_resize_cq verbs_init_cq
);

unsupported!("IBVERBS_1.1": ibv_resolve_eth_l2_from_gid);
unsupported!("IBVERBS_1.10": ibv_query_ece ibv_set_ece);

/// Whether a provider may destroy objects of a disassociated device (a provider's flag;
/// unused here). `AtomicBool` has `bool`'s layout and lives in writable memory.
#[unsafe(export_name = "softnic_verbs_allow_disassociate_destroy")]
pub(crate) static VERBS_ALLOW_DISASSOCIATE_DESTROY: AtomicBool = AtomicBool::new(false);
std::arch::global_asm!(
    ".symver softnic_verbs_allow_disassociate_destroy, verbs_allow_disassociate_destroy@@IBVERBS_PRIVATE_34"
);

export! {
    /// A provider registering itself (from its constructor): ignored, softnic is the device.
    "IBVERBS_PRIVATE_34" fn verbs_register_driver_34(_driver: *const c_void) {}

    /// A provider opening a device: no provider device is ever opened (NULL, EOPNOTSUPP).
    "IBVERBS_PRIVATE_34" fn verbs_open_device(_device: *mut c_void, _private: *mut c_void) -> *mut c_void {
        fail(libc::EOPNOTSUPP)
    }

    /// A provider's context set-up: no provider context is ever made.
    "IBVERBS_PRIVATE_34" fn _verbs_init_and_alloc_context() -> *mut c_void {
        fail(libc::EOPNOTSUPP)
    }

    /// A provider's context tear-down: nothing to do.
    "IBVERBS_PRIVATE_34" fn verbs_uninit_context(_context: *mut c_void) {}

    /// A provider's ops table: nothing to do.
    "IBVERBS_PRIVATE_34" fn verbs_set_ops(_context: *mut c_void, _ops: *const c_void) {}

    /// A provider's log line: dropped.
    "IBVERBS_PRIVATE_34" fn __verbs_log(_context: *mut c_void, _level: u32, _fmt: *const c_void) {}

    /// A provider's ioctl helper: no attributes.
    "IBVERBS_PRIVATE_34" fn __ioctl_final_num_attrs(_num: u32, _link: *const c_void) -> u32 {
        0
    }

    /// A provider's variadic sysfs read (a format and its arguments, which this function
    /// cannot take): -1 with ENOENT. Programs read the device's files with
    /// `ibv_read_sysfs_file`.
    "IBVERBS_PRIVATE_34" fn ibv_read_ibdev_sysfs_file(_buf: *mut c_void, _size: usize, _dev: *const c_void, _fmt: *const c_void) -> c_int {
        set_errno(libc::ENOENT);
        -1
    }

    /// Kernel-struct conversion for the RDMA CM: not served (nothing written).
    "IBVERBS_1.0" fn ibv_copy_path_rec_from_kern(_dst: *mut c_void, _src: *const c_void) {}

    /// Kernel-struct conversion for the RDMA CM: not served (nothing written).
    "IBVERBS_1.0" fn ibv_copy_path_rec_to_kern(_dst: *mut c_void, _src: *const c_void) {}

    /// Kernel-struct conversion for the RDMA CM: not served (nothing written).
    "IBVERBS_1.0" fn ibv_copy_qp_attr_from_kern(_dst: *mut c_void, _src: *const c_void) {}

    /// Kernel-struct conversion for the RDMA CM: not served (nothing written).
    "IBVERBS_1.1" fn ibv_copy_ah_attr_from_kern(_dst: *mut c_void, _src: *const c_void) {}

    /// Importing a device from a file descriptor: not served.
    "IBVERBS_1.10" fn ibv_import_device(_fd: c_int) -> *mut c_void {
        fail(libc::EOPNOTSUPP)
    }

    /// Importing a PD: not served.
    "IBVERBS_1.10" fn ibv_import_pd(_context: *mut c_void, _handle: u32) -> *mut c_void {
        fail(libc::EOPNOTSUPP)
    }

    /// Importing an MR: not served.
    "IBVERBS_1.10" fn ibv_import_mr(_pd: *mut c_void, _handle: u32) -> *mut c_void {
        fail(libc::EOPNOTSUPP)
    }

    /// Releasing an imported PD: nothing was imported.
    "IBVERBS_1.10" fn ibv_unimport_pd(_pd: *mut c_void) {}

    /// Releasing an imported MR: nothing was imported.
    "IBVERBS_1.10" fn ibv_unimport_mr(_mr: *mut c_void) {}

    /// Registering dma-buf memory: not served.
    "IBVERBS_1.12" fn ibv_reg_dmabuf_mr(_pd: *mut c_void, _offset: u64, _len: usize, _iova: u64, _fd: c_int, _access: c_int) -> *mut c_void {
        fail(libc::EOPNOTSUPP)
    }

    /// Importing device memory: not served.
    "IBVERBS_1.13" fn ibv_import_dm(_context: *mut c_void, _handle: u32) -> *mut c_void {
        fail(libc::EOPNOTSUPP)
    }

    /// Releasing imported device memory: nothing was imported.
    "IBVERBS_1.13" fn ibv_unimport_dm(_dm: *mut c_void) {}

    /// Whether a QP's data lands in order: softnic writes each packet's data when it arrives
    /// in order, but promises nothing beyond the IBTA's rules (0).
    "IBVERBS_1.14" fn ibv_query_qp_data_in_order(_qp: *mut c_void, _op: c_int, _flags: u32) -> c_int {
        0
    }
}
