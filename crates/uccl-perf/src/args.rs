//! Command-line arguments.

use clap::{Parser, ValueEnum};

/// Which libibverbs implementation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Provider {
    /// softnic, the built-in software NIC (two devices, soft0 and soft1).
    Soft,
    /// The system libibverbs: a real RDMA NIC (or rxe/siw), in loopback.
    System,
}

/// Which test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Test {
    /// RDMA WRITE bandwidth, chained posts against one post per WR.
    WriteBw,
    /// RDMA WRITE latency: one signaled WRITE at a time.
    WriteLat,
}

/// Which QP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum TransportArg {
    /// Reliable connected.
    Rc,
    /// Unreliable connected.
    Uc,
}

/// perftest-style RDMA benchmark on softnic or a real NIC.
#[derive(Debug, Parser)]
#[command(name = "uccl-perf", version, about)]
pub(crate) struct Args {
    /// Which libibverbs to use.
    #[arg(long, value_enum, default_value = "soft")]
    pub(crate) provider: Provider,
    /// The sending device (softnic: soft0).
    #[arg(long)]
    pub(crate) device: Option<String>,
    /// The receiving device (softnic: soft1; system: the same device, loopback).
    #[arg(long)]
    pub(crate) peer_device: Option<String>,
    /// The test.
    #[arg(long, value_enum, default_value = "write-bw")]
    pub(crate) test: Test,
    /// The QP transport.
    #[arg(long, value_enum, default_value = "rc")]
    pub(crate) transport: TransportArg,
    /// Bytes per WRITE.
    #[arg(long, default_value_t = 4096)]
    pub(crate) size: usize,
    /// WRITEs per run.
    #[arg(long, default_value_t = 20_000)]
    pub(crate) iters: u64,
    /// WRs per post in the chained run (bandwidth test).
    #[arg(long, default_value_t = 32)]
    pub(crate) batch: u32,
    /// Send-queue depth.
    #[arg(long, default_value_t = 256)]
    pub(crate) depth: u32,
    /// softnic only: packet loss probability on every link.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) loss: f64,
    /// softnic only: the fault-injection seed.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Print one JSON object per run instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
}
