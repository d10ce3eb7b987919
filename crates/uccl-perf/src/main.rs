//! uccl-perf: a perftest-style benchmark of the UCCL transport, in the spirit of `ib_write_bw`.
//!
//! By default it runs the transport: flows of messages from sending engines to receiving
//! engines over the built-in software NIC (softnic) on its virtual clock, under 1% packet loss,
//! every received byte checked against a pattern derived from the seed, the flow and the
//! message. Any byte out of place or any message missing ends the run with a non-zero exit
//! status and a line naming the flow, the message and the offset. It prints a short table (a
//! progress bar first, on a terminal, for runs over a second) or, with `--json`, one JSON
//! object.
//!
//! ```text
//! uccl-perf                                      # 4 flows x 8 QPs, 1 MiB messages, 1% loss, UC
//! uccl-perf --transport rc --op write --loss 0   # one-sided writes, the NIC's reliability
//! uccl-perf --tx-mode single                     # one WR per post_send, as UCCL does
//! uccl-perf --no-payload --msg-size 4KiB --chunk-size 4KiB   # the stack's own cost per chunk
//! uccl-perf --device mlx5_0 --server             # two processes on a real NIC ...
//! uccl-perf --device mlx5_0 --client HOST        # ... the server runs the client's options
//! uccl-perf --test verbs-write-bw                # raw verbs: chained vs one post per WR
//! uccl-perf --op write --senders 64 --flows 1 --qps-per-flow 4 --topology star \
//!     --switch-buffer 1MB --loss 0 --chunk-size 4KiB --msg-size 64KiB --messages 100 \
//!     --target-delay-us 10 --flow-scaling-us 25 --additive-increase 0.25 \
//!     --base-rtt-ns 6000 --ack-delay-us 0 --warmup-us 2000   # 64:1 incast (RESULTS.md)
//! ```

#![deny(unsafe_code)]

mod args;
mod cpu;
mod fabric_args;
mod pattern;
mod report;
mod scatter;
mod transport;
mod verbs;

use std::process::ExitCode;

use crate::args::Test;

fn main() -> ExitCode {
    let args = match args::Args::try_parse_given() {
        Ok(a) => a,
        Err(e) if !e.use_stderr() => {
            // --help, --version.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // clap's first line says what is wrong; the usage and the tip stay out.
            let text = e.render().to_string();
            let mut line = text
                .lines()
                .next()
                .unwrap_or("bad arguments")
                .trim_start_matches("error: ")
                .to_string();
            if let Some(values) = text.lines().find(|l| l.contains("[possible values:")) {
                line = format!("{line} {}", values.trim());
            }
            eprintln!("uccl-perf: {line} (see --help)");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = args.check() {
        eprintln!("uccl-perf: {e}");
        return ExitCode::from(2);
    }
    let outcome = match args.test {
        Test::Engine => transport::run(&args).map(|(ran, m)| report::engine(&ran, &m)),
        Test::VerbsWriteBw | Test::VerbsWriteLat => verbs::run(&args)
            .map(|r| report::verbs(&args, &r))
            .map_err(|e| match e {
                verbs_safe::Error::NoSuchDevice { name, available } => {
                    transport::no_such_device(&name, &available)
                }
                e => e.to_string(),
            }),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("uccl-perf: {}", e.replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}
