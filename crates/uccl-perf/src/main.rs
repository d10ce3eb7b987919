//! uccl-perf: the command-line benchmark and demo (perftest-style) of the UCCL transport.
//!
//! Not written yet: the transport crates it drives are still being built.

fn main() {
    eprintln!(
        "uccl-perf: the benchmark is not implemented yet; it arrives with the transport engine. \
         `cargo xtask test` runs what exists."
    );
}
