//! softnic: a software RDMA NIC behind the real libibverbs provider ABI.
//!
//! Its objects are real `ibverbs_sys` structs (`ibv_context`, `ibv_qp`, `ibv_cq`, ...) embedded
//! first in softnic's own, and `ibv_context.ops` holds softnic's `post_send`, `post_recv`,
//! `post_srq_recv`, `poll_cq` and `req_notify_cq`, so code that posts and polls through `ops` (as
//! rdma-core's static inlines do) cannot tell softnic from hardware. Messages travel as MTU-sized
//! packets over a simulated fabric with seeded fault injection.
