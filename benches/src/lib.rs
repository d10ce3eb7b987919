//! Criterion benchmarks of the workspace; the benchmarks live in `benches/benches/` and run with
//! `cargo xtask bench`.
