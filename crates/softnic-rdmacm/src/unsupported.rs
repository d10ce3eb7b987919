//! What softnic's librdmacm does not serve: ECE (`EOPNOTSUPP`).

use std::ffi::c_int;

use crate::fail;
use crate::types::rdma_cm_id;

export! {
    /// ECE is not negotiated: `EOPNOTSUPP`.
    "RDMACM_1.3" fn rdma_set_local_ece(_id: *mut rdma_cm_id, _ece: *mut libc::c_void) -> c_int {
        fail(libc::EOPNOTSUPP)
    }

    /// ECE is not negotiated: `EOPNOTSUPP`.
    "RDMACM_1.3" fn rdma_get_remote_ece(_id: *mut rdma_cm_id, _ece: *mut libc::c_void) -> c_int {
        fail(libc::EOPNOTSUPP)
    }

    /// Rejects as `rdma_reject` does (no ECE).
    "RDMACM_1.3" fn rdma_reject_ece(id: *mut rdma_cm_id, data: *const libc::c_void, len: u8) -> c_int {
        // SAFETY: passed on with the caller's contract.
        unsafe { crate::id::rdma_reject(id, data, len) }
    }
}
