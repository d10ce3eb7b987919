//! softnic tested through the C ABI, the way a libibverbs program uses it: the control path
//! through `softnic::CONTROL`, posting and polling through `ibv_context.ops`. One module per
//! numbered point of the softnic issue.

mod common;

mod atomic_write;
mod atomics;
mod bad_input;
mod clock;
mod counters;
mod cqs;
mod determinism;
mod devices;
mod events;
mod extended;
mod faults;
mod keys;
mod mrs;
mod multicast;
mod odp;
mod opcodes;
mod props;
mod qp_state;
mod quiet;
mod reads;
mod rereg;
mod robustness;
mod sources;
mod srq;
mod switches;
mod udp;
mod windows;
mod wire;
mod xrc;
