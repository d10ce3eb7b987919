//! uccl-perf: a perftest-style benchmark (`ib_write_bw`, `ib_write_lat`) of the verbs layer,
//! on softnic by default or on a real RDMA NIC by name.
//!
//! With no arguments it runs the demo: RDMA WRITE bandwidth on softnic with chained posts (one
//! doorbell per batch of WRs, UCCL's optimisation) and with one post per WR, side by side, and
//! prints the ratio. `--json` prints one JSON object per test instead of the table.
//!
//! ```text
//! uccl-perf                                   # the demo on softnic
//! uccl-perf --test write-lat --size 8
//! uccl-perf --provider system --device mlx5_0 # loopback on a real NIC
//! uccl-perf --loss 0.01 --transport rc        # RC recovering from 1% packet loss
//! ```

#![deny(unsafe_code)]

mod args;
mod bench;
mod report;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = args::Args::parse();
    match bench::run(&args) {
        Ok(results) => {
            report::print(&args, &results);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("uccl-perf: {e}");
            if args.provider == args::Provider::System {
                eprintln!(
                    "uccl-perf: (no RDMA hardware here? `--provider soft` runs on the built-in software NIC)"
                );
            }
            ExitCode::FAILURE
        }
    }
}
