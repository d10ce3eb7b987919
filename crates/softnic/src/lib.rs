//! softnic: a software RDMA NIC behind the real libibverbs provider ABI.
//!
//! There is no RDMA hardware on most CI machines, nor on most laptops. softnic is a faithful
//! software RDMA device so that everything above it runs for real: its objects are real
//! `ibverbs_sys` structs (`ibv_context`, `ibv_pd`, `ibv_mr`, `ibv_cq`, `ibv_srq`, `ibv_qp`,
//! `ibv_ah`, `ibv_comp_channel`) embedded first in softnic's own, and `ibv_context.ops` holds
//! softnic's `post_send`, `post_recv`, `post_srq_recv`, `poll_cq` and `req_notify_cq`. A caller
//! that posts and polls through `ops`, as rdma-core's static inlines do, cannot tell softnic
//! from hardware. The control path (open a device, create a QP, modify it, register memory...)
//! is [`CONTROL`], a table of `extern "C"` functions with the libibverbs signatures. The
//! extended verbs are there too, where rdma-core's inline helpers look for them: each context
//! sits in a `struct verbs_context` (`ibv_query_device_ex`, `ibv_create_cq_ex`,
//! `ibv_create_qp_ex`), every CQ is an `ibv_cq_ex` (`ibv_start_poll`...), and a QP made with
//! send ops is an `ibv_qp_ex` ([`qp_to_qp_ex`]; the `ibv_wr_*` post API).
//!
//! What it models (see `VERBS-SEMANTICS.md` of the project, from the rdma-core man pages and
//! the kernel's rxe driver; where hardware varies, softnic does what rxe does and says so):
//! - RC, UC and UD queue pairs with the full state machine and the attribute masks of every
//!   transition; SEND, SEND_WITH_IMM, RDMA_WRITE, RDMA_WRITE_WITH_IMM, RDMA_READ and the
//!   atomics (compare-and-swap, fetch-and-add; `IBV_ATOMIC_HCA`), RDMA ATOMIC WRITE and FLUSH
//!   (to global visibility; IBTA 1.5, as rxe has them) on RC; UD with address handles, Q_Keys
//!   and the 40-byte network header (its type in the completion's `sl`, as mlx5 reports it);
//!   inline data, fences, selective signaling.
//! - XRC (`xrc`): domains (`ibv_open_xrcd`, shared by the opens of one file in a process),
//!   XRC SRQs (`ibv_create_srq_ex`, `ibv_get_srq_num`) with CQs of their own, initiator QPs
//!   whose requests each name a remote SRQ, and target QPs that deliver each request into the
//!   SRQ it names, if it is of their domain, checking remote accesses against that SRQ's PD.
//!   Other QP types (raw packet, driver's) are EOPNOTSUPP.
//! - RDMA READ as the IBTA has it: one request reserving a PSN per response, responses in PSN
//!   order with every later request held back behind them, an ACK past an unfinished READ as
//!   an implicit NAK, a READ re-issued for what is missing, duplicates answered again (a READ
//!   re-read, an atomic from its saved result: never executed twice), `max_rd_atomic` honoured.
//! - Memory regions with lkey/rkey, bounds and access checks on every access; zero bytes touch
//!   no memory; every address sum from a WR or the wire is checked. Keys cannot be guessed
//!   from one another (a keyed permutation per device, replayed from the seed on the virtual
//!   clock, random on the wall clock). `rereg_mr` changes a region's translation, PD or
//!   access in place. On-demand regions (`IBV_ACCESS_ON_DEMAND`, implicit ones too) have
//!   their pages faulted in at each access, and one not mapped fails the access, never the
//!   process; `ibv_advise_mr` prefetches. Any other region's pages are faulted in when it is
//!   registered, as the kernel pins them (for writing if the region may be written): memory
//!   not mapped, or read-only for a region that writes, is refused with EFAULT, as the
//!   kernel refuses it. softnic does not pin: memory unmapped or made read-only while it is
//!   registered faults the process when the NIC next touches it, where pinned pages would
//!   take the access (and keep the data from the program).
//! - Memory windows as rxe has them (`ibv_context.ops.alloc_mw`, `bind_mw`, `dealloc_mw`):
//!   type 1, bound by `ibv_bind_mw`, and type 2B, bound by an `IBV_WR_BIND_MW` work request to
//!   the QP that posted it; invalidated by `IBV_WR_LOCAL_INV` or by a peer's
//!   `IBV_WR_SEND_WITH_INV`; every check of rxe's at bind time, and remote accesses through a
//!   window checked for its key, range, rights, PD and (type 2) QP. An RC WRITE between two
//!   devices of one fabric is copied once, from the requester's memory into the responder's
//!   when its packet is delivered (the requester may not touch that memory before the WRITE
//!   completes, which comes after): checked again then, and never read once its WR was
//!   flushed or its region deregistered (the packet is lost).
//! - Multicast as rxe has it ([`attach_mcast`], [`detach_mcast`]: `ibv_attach_mcast`): a UD
//!   send to a group reaches each UD QP attached to it on every device of the fabric, and on
//!   the UDP link in every process whose device joined the group's IPv4 address (an
//!   IPv4-mapped group's own, a `239.192.0.0/14` one made from an IPv6 MGID).
//! - Bounded CQs (overflow raises `IBV_EVENT_CQ_ERR`, never a silent loss), completion
//!   timestamps (the device clock at 1 GHz, and the wall clock), completion channels with real
//!   file descriptors, SRQs with the one-shot limit event; async events of a destroyed object
//!   go with it.
//! - Messages cut into MTU packets with PSNs in the IBTA wire format ([`packet`]), on a network
//!   with latency, port serialisation and seeded fault injection ([`Faults`]): loss, reordering,
//!   duplication, corruption (caught by the ICRC), link down. RC recovers (ACK/NAK, go-back-N,
//!   `timeout`, `retry_cnt`, RNR NAK and `rnr_retry`); UC loses whole messages; UD drops. Frames
//!   from outside ([`Fabric::inject`]) are parsed and checked like any other.
//! - Two links ([`Link`]): the in-process simulated network above, and UDP between processes
//!   or hosts: each device binds `127.0.0.x:4791` (or any address), its GID table is rxe's
//!   (the link-local `fe80::ffff:a.b.c.d`, then the address IPv4-mapped), and its packets travel as real RoCEv2 datagrams with the IBTA ICRC over the
//!   IP and UDP headers ([`roce`]; `tshark` decodes them), sent and taken in in batches
//!   (`sendmmsg`/`recvmmsg`) by the callers' polls and by a progress thread that sleeps in
//!   `ppoll` when there is nothing to do. The seeded faults apply to both.
//! - Two clocks ([`Clock`]): a virtual one (nothing runs in the background; polling a CQ or
//!   calling [`Fabric::step`] / [`Fabric::run_until_idle`] makes progress, and the same seed
//!   and the same calls give the same completions, bit for bit), and the wall clock for two
//!   threads driving the two ends (timers take real time; a [progress
//!   thread](Fabric::spawn_progress_thread) sleeps until the next event).
//!
//! Layout: the wire formats ([`packet`], [`roce`]); the transport state machines (`qp`:
//! requester, responder, completer, READ/atomic responses, local operations); the links
//! (`link`: faults, the simulated wire, UDP); the object tables behind the one fabric lock
//! (`state`, `keys`, `mr`, `mw`, `cq`, `srq`, `xrc`) and progress (`progress`); the C ABI (`abi`:
//! shells and the pointer registry, `control`: the control verbs, `ops`: the hot path,
//! `extended`: rdma-core's extended verbs).
//!
//! Robustness: a pointer softnic did not hand out, or one already destroyed, is refused with
//! EINVAL (object addresses are never reused, at the cost of a few hundred bytes per destroyed
//! object); a panic inside softnic breaks its fabric loudly (EIO from then on, see
//! [`Fabric::broken`]) instead of unwinding into C; a thread blocked in `get_cq_event` or
//! `get_async_event` is woken, with an error, when the object is destroyed.
//!
//! ```
//! use softnic::{CONTROL, Fabric, FabricConfig};
//!
//! let fabric = Fabric::new(FabricConfig { devices: 2, seed: 7, ..Default::default() });
//! assert_eq!(fabric.device_names(), ["soft0", "soft1"]);
//! let dev = fabric.device("soft0").unwrap();
//! // SAFETY: `dev` is a device of a live fabric; every object is destroyed before the end.
//! unsafe {
//!     let ctx = (CONTROL.open_device)(dev);
//!     assert!(!ctx.is_null());
//!     let cq = (CONTROL.create_cq)(ctx, 16, std::ptr::null_mut(), std::ptr::null_mut(), 0);
//!     // The hot path goes through the context's ops, as with any libibverbs provider.
//!     let poll = (*ctx).ops.poll_cq.unwrap();
//!     let mut wc = [ibverbs_sys::ibv_wc::default(); 4];
//!     assert_eq!(poll(cq, 4, wc.as_mut_ptr()), 0);
//!     assert_eq!((CONTROL.destroy_cq)(cq), 0);
//!     assert_eq!((CONTROL.close_device)(ctx), 0);
//! }
//! ```

mod abi;
mod alarm;
pub mod baseline;
pub mod cm;
mod control;
mod counters;
mod cq;
mod extended;
mod fabric;
mod faults;
mod fork;
mod hash;
mod keys;
mod link;
mod mcast;
mod mr;
mod mw;
mod ops;
pub mod packet;
mod progress;
#[cfg(test)]
mod progress_tests;
mod qp;
pub mod roce;
mod shared;
mod srq;
mod state;
mod table;
mod timers;
pub mod topology;
mod xrc;

pub use abi::Wc;
pub use alarm::Alarm;
pub use control::{CONTROL, ControlPath, attach_mcast, detach_mcast, release_device, resize_cq};
pub use counters::Counters;
pub use cq::MISSED_EVENT_GRACE;
pub use extended::qp_to_qp_ex;
pub use fabric::{Clock, Error, Fabric, FabricConfig, Link};
pub use faults::{Faults, InvalidFaults, PacketFilter, PacketInfo, Verdict};
pub use fork::{PerProcess, watch_forks};
pub use progress::ProgressThread;
pub use qp::check_transition;
pub use topology::{PortStats, PortTo, Red, SwitchConfig, Topology};
