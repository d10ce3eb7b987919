//! bufpool: power-of-two pools for the data path, so it never allocates.
//!
//! A lock-free multi-producer multi-consumer pool for slots shared between threads, a local pool
//! for one engine thread, object pools whose elements are initialised once, and region-backed
//! buffer pools that carve one registered region into fixed-size slots. Misuse (a double free, a
//! foreign slot) is an error in every build. This crate knows nothing of verbs.
