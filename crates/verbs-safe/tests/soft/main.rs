//! verbs-safe on softnic: every feature exercised for real, through the same code path a
//! hardware NIC would take.

mod setup;

mod completions;
mod drops;
mod memory;
mod pins;
mod posting;
mod reposts;
mod slots;
mod transports;
mod typestate;
mod windows;
