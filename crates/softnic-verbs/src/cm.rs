//! The hand-over to softnic's drop-in librdmacm (`crates/softnic-rdmacm`): that library finds
//! the process's connection manager here, in the libibverbs that owns the fabric, so that
//! both libraries act on one fabric.

use softnic::cm::cabi::{CM_OPS, CmOps};

export! {
    /// softnic's connection manager as a C table (see `softnic::cm::cabi`).
    "IBVERBS_PRIVATE_SOFTNIC" fn softnic_cm_ops() -> *const CmOps {
        &CM_OPS
    }
}
