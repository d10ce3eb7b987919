//! softnic as a drop-in `libibverbs.so.1`: unmodified libibverbs programs (rdma-core's
//! `ibv_*_pingpong`, perftest, anything linked with `-libverbs`) run on a softnic device.
//!
//! This crate builds a shared library with libibverbs's soname and symbol versions
//! (`IBVERBS_1.0`, `IBVERBS_1.1`, ... , `IBVERBS_PRIVATE_34`), whose verbs are served by
//! [softnic]: one device, `soft0`, on softnic's UDP link (RoCEv2 over UDP to any other
//! softnic process or host), and the `softnic-run` launcher that runs a program with it in
//! place of the system library:
//!
//! ```text
//! cargo build --release -p softnic-verbs
//! target/release/softnic-run -- ibv_rc_pingpong -g 0 &
//! target/release/softnic-run -- ibv_rc_pingpong -g 0 127.0.0.1
//! ```
//!
//! The hot path (post, poll, notify) goes through the `ibv_context.ops` softnic fills, as
//! rdma-core's inline helpers call it; so do memory windows (`ibv_alloc_mw`, `ibv_bind_mw`,
//! `ibv_dealloc_mw`, and `IBV_WR_BIND_MW`, `IBV_WR_LOCAL_INV`, `IBV_WR_SEND_WITH_INV` work
//! requests). The extended verbs, which programs also reach through inline helpers, are
//! served by softnic's `verbs_context` around each context: `ibv_query_port` (the whole
//! `ibv_port_attr`), `ibv_query_device_ex`, `ibv_create_cq_ex` (an `ibv_cq_ex` with
//! `ibv_start_poll`/`ibv_next_poll`/`ibv_end_poll` and the `ibv_wc_read_*` fields),
//! `ibv_create_qp_ex` with send ops and `ibv_qp_to_qp_ex` (the `ibv_wr_*` post API: sends,
//! writes, reads, atomics, atomic writes and flushes, window binds and invalidations, SGE
//! lists, inline data, UD addresses; `ibv_wr_complete` posts a batch all or nothing),
//! on-demand paging (explicit and implicit regions, `ibv_advise_mr`), completion timestamps
//! and `ibv_query_rt_values_ex`.
//! What is not served fails cleanly (`EOPNOTSUPP`, or `NULL` with `errno`: device memory,
//! flows, raw packet QPs), never by reaching the system library with one of softnic's
//! objects. A context's `cmd_fd` is a real descriptor; `ibv_read_sysfs_file` reads the
//! device's sysfs view that `softnic-run` shows (`/sys/class/infiniband/soft0`).
//!
//! The port's GID table is rxe's on a RoCE port: index 0 the link-local GID
//! `fe80::ffff:a.b.c.d`, index 1 the IPv4-mapped `::ffff:a.b.c.d`, both RoCE v2 and both
//! reaching the device. Packets travel over IPv4 either way, so a UD receiver's GRH names the
//! sender by its IPv4-mapped GID.
//!
//! The device is configured from the environment (the launcher sets it from its flags):
//! `SOFTNIC_ADDR` (the device's IPv4 address; default: a free one in 127.0.0.2-254),
//! `SOFTNIC_SEED`, `SOFTNIC_LOSS`, `SOFTNIC_REORDER`, `SOFTNIC_DUPLICATE`, `SOFTNIC_CORRUPT`
//! (seeded faults on what the device sends), `SOFTNIC_MTU`, `SOFTNIC_ANNOUNCE=1` to say on
//! standard error which address the device took, and `SOFTNIC_STATS=1` to print the device's
//! counters there when the program exits (and its connection manager's, after rdma_cm use). A
//! bad value makes `ibv_get_device_list` fail with `EINVAL` after saying why on standard error.
//!
//! A child forked after its parent used the device gets a device of its own when it opens one
//! (from a list it gets, or one its parent got), as a child opens its own context on a kernel:
//! on `SOFTNIC_ADDR` if that is free; if its parent holds that loopback address, on a free one
//! from 127.0.0.254 down (a non-loopback one fails, saying so). None of its parent's objects is
//! its own: their pointers fail as unknown ones (EINVAL), but for `ibv_close_device` of a
//! parent's context, which succeeds and leaves the parent's device alone, as closing the
//! child's copy of the device file does. See `device.rs`.

#[macro_use]
mod export;
mod cm;
mod compat;
mod device;
mod exports;
mod strings;

pub(crate) use device::{fabric, own_device};
