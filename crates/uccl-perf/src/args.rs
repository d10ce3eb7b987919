//! Command-line arguments, and the checks that turn a bad one into one line saying what is
//! wrong.

use std::time::Duration;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};

/// Which test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Test {
    /// Messages between uccl engines, every byte verified (the transport).
    Engine,
    /// Raw verbs: RDMA WRITE bandwidth, chained posts against one post per WR.
    VerbsWriteBw,
    /// Raw verbs: RDMA WRITE latency, one signaled WRITE at a time.
    VerbsWriteLat,
}

/// Which reliability the data QPs use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum TransportArg {
    /// Unreliable connected, with the engine's software reliability (UCCL's).
    Uc,
    /// Reliable connected: the NIC recovers losses.
    Rc,
}

/// Two-sided messages or one-sided writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum OpArg {
    /// `send` matched with the receiver's posted `recv`.
    Send,
    /// `write` into a region the receiver exported.
    Write,
    /// `read` by the receiver of a region the sender exported for reading (RDMA READ on RC;
    /// served by the sender's engine on UC).
    Read,
    /// `write_v`: each message is `--iov` blocks of `--block-size`, scattered in both buffers.
    Writev,
    /// `read_v`: each message is `--iov` blocks of `--block-size`, scattered in both buffers.
    Readv,
}

impl OpArg {
    /// Whether the receiver of the run's data issues the requests (reads).
    pub(crate) fn reads(self) -> bool {
        matches!(self, OpArg::Read | OpArg::Readv)
    }

    /// Whether messages are writes that carry a note naming them (two processes: the
    /// receiver learns of each from its note).
    pub(crate) fn notes(self) -> bool {
        matches!(self, OpArg::Write | OpArg::Writev)
    }

    /// Whether a message is a list of blocks.
    pub(crate) fn vectored(self) -> bool {
        matches!(self, OpArg::Writev | OpArg::Readv)
    }
}

/// How the transmit side posts its work requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum TxMode {
    /// Up to 32 WRs per `ibv_post_send` (one doorbell per chain).
    Chained,
    /// One WR per `ibv_post_send`, as UCCL does.
    Single,
}

/// What key a receive buffer is advertised with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RecvKeysArg {
    /// A memory window bound over exactly the receive, while it is posted (the default).
    Window,
    /// The whole buffer's key (no work per receive; a peer reaches the whole buffer).
    Buffer,
}

/// perftest-style benchmark of the UCCL transport: messages between engines, every byte
/// verified, on softnic (the built-in software NIC) or a real RDMA NIC.
#[derive(Debug, Clone, Parser)]
#[command(name = "uccl-perf", version, about, max_term_width = 100)]
pub(crate) struct Args {
    /// `soft` (the built-in software NIC, both ends in this process, on its virtual clock)
    /// or the name of an RDMA device (e.g. mlx5_0).
    #[arg(long, default_value = "soft", value_parser = nonempty)]
    pub(crate) device: String,
    /// Run the receiving side and wait for a `--client`, whose run options (flows, sizes,
    /// messages or duration, transport, faults, seed, the congestion window's...) this side
    /// adopts: a run option given here too must be the client's, or the run is refused at
    /// once, naming it.
    #[arg(long, conflicts_with = "client")]
    pub(crate) server: bool,
    /// Run the sending side against the `--server` on HOST, with this side's run options
    /// (sent to the server, which adopts them).
    #[arg(long, value_name = "HOST")]
    pub(crate) client: Option<String>,
    /// The TCP port of the connection set-up (`--server`/`--client`).
    #[arg(long, default_value_t = 18515, allow_negative_numbers = true)]
    pub(crate) port: u16,
    /// What to run.
    #[arg(long, value_enum, default_value = "engine")]
    pub(crate) test: Test,
    /// The data QPs: uc (software reliability) or rc (the NIC's).
    #[arg(long, value_enum, default_value = "uc")]
    pub(crate) transport: TransportArg,
    /// Connections (flows) from the senders to the receivers.
    #[arg(long, default_value = "4", value_parser = count::<u16>, allow_negative_numbers = true)]
    pub(crate) flows: u16,
    /// Data QPs (paths) per flow.
    #[arg(long, default_value = "8", value_parser = count::<u16>, allow_negative_numbers = true)]
    pub(crate) qps_per_flow: u16,
    /// Engine pairs (one sender and one receiver engine each); flows are spread over them.
    #[arg(long, default_value = "1", value_parser = count::<u16>, allow_negative_numbers = true)]
    pub(crate) engines: u16,
    /// Bytes per message (suffixes K, KiB, M, MiB, G, GiB; binary). Default 1 MiB; 4 KiB for
    /// the raw verbs tests. 0: messages without payload (the message rate alone).
    #[arg(long, value_parser = byte_count, value_name = "SIZE", allow_hyphen_values = true)]
    pub(crate) msg_size: Option<u64>,
    /// Bytes per chunk (one RDMA WRITE_WITH_IMM each). 16 KiB, the engine's default: on UC a
    /// chunk that loses any of its packets is sent again whole, so at 1% packet loss a 16 KiB
    /// chunk (4 packets) arrives 96% of the time, a 64 KiB one (16 packets) 85%.
    #[arg(long, default_value = "16KiB", value_parser = size, value_name = "SIZE", allow_hyphen_values = true)]
    pub(crate) chunk_size: u64,
    /// Messages per flow (default 64; 20000 WRITEs for the raw verbs tests).
    #[arg(long, value_parser = count::<u64>, conflicts_with = "duration", value_name = "N", allow_negative_numbers = true)]
    pub(crate) messages: Option<u64>,
    /// Send for this many seconds (wall clock) instead of a number of messages.
    #[arg(long, value_parser = seconds, value_name = "SECS", allow_negative_numbers = true)]
    pub(crate) duration: Option<Duration>,
    /// Messages in flight per flow (default: as many as fit in 4 MiB, 2 to 32).
    #[arg(long, value_parser = count::<u32>, value_name = "N", allow_negative_numbers = true)]
    pub(crate) inflight: Option<u32>,
    /// How long a connection may hear nothing from its peer while it has data in flight
    /// before it fails, in milliseconds (EngineConfig's `tx.max_silence_us`; default 1000).
    /// The RC QPs' retries (the control QP's always) cover as much up to 8.6 s and no more: a
    /// peer whose NIC stays silent longer (a host down; softnic's NIC inside a stopped
    /// process) fails the connection after 8.6 s whatever this says. More patience for a
    /// peer on a busy host, whose process may be descheduled for longer; less to learn of a
    /// dead one sooner. At least 50 (the longest retransmission timeout), at most 3600000.
    #[arg(long, value_parser = silence_ms, value_name = "MS", allow_negative_numbers = true)]
    pub(crate) max_silence_ms: Option<u64>,
    /// Two-sided (send/recv) or one-sided (write into an exported region, read from one).
    #[arg(long, value_enum, default_value = "send")]
    pub(crate) op: OpArg,
    /// `--op writev|readv`: blocks per message.
    #[arg(long, default_value = "16", value_parser = count::<u32>, value_name = "N", allow_negative_numbers = true)]
    pub(crate) iov: u32,
    /// `--op writev|readv`: bytes per block (a message is `--iov` of them).
    #[arg(long, default_value = "4KiB", value_parser = size, value_name = "SIZE", allow_hyphen_values = true)]
    pub(crate) block_size: u64,
    /// softnic: probability that a packet is lost [default: 0.01 for the engine test, 0 for
    /// the raw verbs tests].
    #[arg(long, value_parser = probability, value_name = "P", allow_negative_numbers = true)]
    pub(crate) loss: Option<f64>,
    /// softnic: probability that a packet is delayed so that later ones overtake it.
    #[arg(long, default_value = "0", value_parser = probability, value_name = "P", allow_negative_numbers = true)]
    pub(crate) reorder: f64,
    /// softnic: probability that a packet is delivered twice.
    #[arg(long, default_value = "0", value_parser = probability, value_name = "P", allow_negative_numbers = true)]
    pub(crate) duplicate: f64,
    /// softnic: probability that a packet has a bit flipped (its ICRC then drops it).
    #[arg(long, default_value = "0", value_parser = probability, value_name = "P", allow_negative_numbers = true)]
    pub(crate) corrupt: f64,
    /// softnic's virtual clock (`--device soft` in one process; refused elsewhere, where the
    /// engines poll on the wall clock): while the engines wait for the NIC, they poll at most once per
    /// this many nanoseconds of virtual time and take what arrived meanwhile in one round, as
    /// a busy engine's poll loop does (0: a round at every NIC event, each packet apart, as if
    /// polling took no time). Timers fire up to this late. At most 1000000.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(0..=1_000_000), value_name = "NS", allow_negative_numbers = true)]
    pub(crate) poll_interval_ns: u64,
    /// The seed of the data patterns, the faults and the path choice: one seed, one run.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    pub(crate) seed: u64,
    /// Chained posts (up to 32 WRs per doorbell) or one WR per post, as UCCL does.
    #[arg(long, value_enum, default_value = "chained")]
    pub(crate) tx_mode: TxMode,
    /// The key receive buffers are advertised with: a memory window over exactly the receive
    /// (a bind and an unbind per receive), or the whole buffer's (to measure what windows
    /// cost).
    #[arg(long, value_enum, default_value = "window")]
    pub(crate) recv_keys: RecvKeysArg,
    /// softnic: skip the NIC's payload copies (nothing is verified), to measure the stack's
    /// own cost per chunk.
    #[arg(long)]
    pub(crate) no_payload: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Self-test of the checker: flip the byte at FLOW:MESSAGE:OFFSET after it arrives (the
    /// run must then fail naming it).
    #[arg(long, hide = true, value_parser = tamper, value_name = "FLOW:MESSAGE:OFFSET")]
    pub(crate) tamper: Option<(u64, u64, u64)>,
    /// Raw verbs tests: WRs per post in the chained run.
    #[arg(long, default_value = "32", value_parser = count::<u32>, help_heading = "Raw verbs tests", allow_negative_numbers = true)]
    pub(crate) batch: u32,
    /// Raw verbs tests: send-queue depth.
    #[arg(long, default_value = "256", value_parser = count::<u32>, help_heading = "Raw verbs tests", allow_negative_numbers = true)]
    pub(crate) depth: u32,
    /// Raw verbs tests: the receiving device (default: soft1 on softnic, else the same
    /// device, in loopback).
    #[arg(long, help_heading = "Raw verbs tests")]
    pub(crate) peer_device: Option<String>,
    /// Switches and congestion control (softnic, in one process).
    #[command(flatten)]
    pub(crate) fabric: crate::fabric_args::FabricArgs,
    /// The options given on the command line (by id, e.g. `msg_size`), not by default.
    #[arg(skip)]
    pub(crate) given: Vec<String>,
}

impl Args {
    /// Parses the command line, noting which options it gave ([`Args::given`]).
    pub(crate) fn try_parse_given() -> Result<Self, clap::Error> {
        let mut cmd = Self::command();
        let m = cmd.try_get_matches_from_mut(std::env::args_os())?;
        let mut args = Self::from_arg_matches(&m).map_err(|e| e.format(&mut cmd))?;
        args.given = m
            .ids()
            .filter(|id| m.value_source(id.as_str()) == Some(ValueSource::CommandLine))
            .map(|id| id.to_string())
            .collect();
        Ok(args)
    }

    /// Whether the run is on softnic.
    pub(crate) fn soft(&self) -> bool {
        self.device == "soft"
    }

    /// Whether this process is one of two (`--server` or `--client`).
    pub(crate) fn remote(&self) -> bool {
        self.server || self.client.is_some()
    }

    /// Whether the run is on softnic's virtual clock (both ends in this process).
    pub(crate) fn virtual_clock(&self) -> bool {
        self.soft() && !self.remote()
    }

    /// The message size in bytes.
    pub(crate) fn msg_size(&self) -> u64 {
        if self.op.vectored() {
            return u64::from(self.iov).saturating_mul(self.block_size);
        }
        self.msg_size.unwrap_or(match self.test {
            Test::Engine => 1 << 20,
            _ => 4096,
        })
    }

    /// The softnic faults asked for.
    pub(crate) fn faults(&self) -> softnic::Faults {
        softnic::Faults {
            link_down: false,
            loss: self.loss(),
            corrupt: self.corrupt,
            duplicate: self.duplicate,
            reorder: self.reorder,
            reorder_delay_ns: 20_000,
        }
    }

    /// Checks what the parser could not check alone: combinations. One line on error.
    pub(crate) fn check(&self) -> Result<(), String> {
        self.fabric.check()?;
        if self.op.vectored() && self.msg_size.is_some() {
            return Err(
                "--op writev|readv: a message is --iov blocks of --block-size; --msg-size \
                        does not apply"
                    .into(),
            );
        }
        if self.no_payload && !self.soft() {
            return Err(
                "--no-payload switches softnic's payload copies off; a real NIC \
                        always moves the bytes"
                    .into(),
            );
        }
        if self.fabric.measured() && !self.virtual_clock() {
            return Err(
                "--senders/--topology/--switch-buffer/--ecn build softnic's simulated fabric: \
                 softnic in one process only (--device soft, not --server/--client)"
                    .into(),
            );
        }
        if !self.virtual_clock() && self.given.iter().any(|g| g == "poll_interval_ns") {
            return Err(
                "--poll-interval-ns paces the engines on softnic's virtual clock (--device \
                 soft in one process); elsewhere they poll on the wall clock, as fast as they can"
                    .into(),
            );
        }
        let faults = self.loss.unwrap_or(0.0) + self.reorder + self.duplicate + self.corrupt;
        if faults > 0.0 && !self.soft() {
            return Err(
                "--loss/--reorder/--duplicate/--corrupt inject faults on softnic only \
                        (--device soft)"
                    .into(),
            );
        }
        if self.test == Test::Engine {
            // The transmit side's largest chunk (uccl_tx::MAX_CHUNK).
            if self.chunk_size > 1 << 30 {
                return Err(format!(
                    "--chunk-size {} is too large (at most 1 GiB: one RDMA WRITE)",
                    self.chunk_size
                ));
            }
            if self.msg_size() > 1 << 30 {
                return Err(format!(
                    "--msg-size {} is too large (at most 1 GiB)",
                    self.msg_size()
                ));
            }
            if self.engines > self.flows {
                return Err(format!(
                    "--engines {} is more than --flows {}: every engine pair needs a flow",
                    self.engines, self.flows
                ));
            }
            if self.flows > 4096 {
                return Err(format!("--flows {} is more than 4096", self.flows));
            }
            if self.qps_per_flow > 256 {
                return Err(format!(
                    "--qps-per-flow {} is more than 256",
                    self.qps_per_flow
                ));
            }
            if self.inflight.is_some_and(|n| n > 127) {
                return Err("--inflight is at most 127 (receives advertised per flow)".into());
            }
            crate::transport::check_receive_memory(self)?;
        } else {
            if self.msg_size() == 0 {
                return Err(
                    "--msg-size 0 runs in the engine test only (a raw verbs WRITE moves at \
                     least 1 byte here)"
                        .into(),
                );
            }
            if self.duration.is_some() {
                return Err(
                    "--duration is for the engine test; the raw verbs tests take \
                            --messages"
                        .into(),
                );
            }
            if self.msg_size() > u64::from(u32::MAX) {
                return Err("--msg-size is at most 4 GiB - 1 for the raw verbs tests".into());
            }
            if self.server || self.client.is_some() {
                return Err("the raw verbs tests run in one process (loopback)".into());
            }
        }
        Ok(())
    }

    /// The loss that applies: 1% by default for the engine test on softnic, else none.
    pub(crate) fn loss(&self) -> f64 {
        self.loss
            .unwrap_or(if self.soft() && self.test == Test::Engine {
                0.01
            } else {
                0.0
            })
    }
}

/// The values `--max-silence-ms` takes: from the transmit side's longest retransmission
/// timeout (`rto_max_us`, 50 ms) to an hour.
pub(crate) const SILENCE_MS: std::ops::RangeInclusive<u64> = 50..=3_600_000;

fn silence_ms(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(ms) if SILENCE_MS.contains(&ms) => Ok(ms),
        _ => Err(format!(
            "{s:?} is not a number of milliseconds from {} to {}",
            SILENCE_MS.start(),
            SILENCE_MS.end()
        )),
    }
}

fn tamper(s: &str) -> Result<(u64, u64, u64), String> {
    let v: Vec<u64> = s
        .split(':')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|_| format!("{s:?} is not FLOW:MESSAGE:OFFSET"))?;
    match v[..] {
        [f, m, o] => Ok((f, m, o)),
        _ => Err(format!("{s:?} is not FLOW:MESSAGE:OFFSET")),
    }
}

fn nonempty(s: &str) -> Result<String, String> {
    if s.is_empty() {
        Err("must name a device (or soft)".into())
    } else {
        Ok(s.to_string())
    }
}

fn count<T>(s: &str) -> Result<T, String>
where
    T: std::str::FromStr + Default + PartialEq + TryFrom<u128>,
{
    match s.parse::<T>() {
        Ok(v) if v == T::default() => Err("must be at least 1".into()),
        Ok(v) => Ok(v),
        // A whole number, but too large for the count.
        Err(_) => match s.parse::<u128>().map(T::try_from) {
            Ok(_) => Err(format!("{s} is too large ({})", max_of::<T>())),
            Err(_) => Err(format!("{s:?} is not a positive whole number")),
        },
    }
}

/// "at most N": the largest value of the unsigned `T` (its width tried from 128 bits down).
fn max_of<T: TryFrom<u128>>() -> String {
    let mut bits = 128;
    while bits > 0 && T::try_from(u128::MAX >> (128 - bits)).is_err() {
        bits -= 8;
    }
    format!("at most {}", u128::MAX >> (128 - bits))
}

fn probability(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        Ok(_) => Err("a probability must lie in 0..=1".into()),
        Err(_) => Err(format!("{s:?} is not a number")),
    }
}

fn seconds(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>() {
        Ok(x) if x > 0.0 && x.is_finite() && x <= 1e6 => Ok(Duration::from_secs_f64(x)),
        Ok(_) => Err("must be more than 0 seconds (and at most 1e6)".into()),
        Err(_) => Err(format!("{s:?} is not a number of seconds")),
    }
}

/// A byte count that is never zero (see [`byte_count`]).
pub(crate) fn size(s: &str) -> Result<u64, String> {
    match byte_count(s)? {
        0 => Err("must be at least 1 byte".into()),
        v => Ok(v),
    }
}

/// A byte count: digits, then an optional binary suffix (K/KiB/KB, M/MiB/MB, G/GiB/GB, B), in
/// any case; zero too.
pub(crate) fn byte_count(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let bad = || {
        format!("{s:?} is not a size (a whole number with an optional suffix: 4096, 64KiB, 1MiB)")
    };
    let n: u64 = num.parse().map_err(|_| bad())?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => return Err(bad()),
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// `1.5 MiB`, `64 KiB`, `100 B`: a size as people read it.
pub(crate) fn human_size(n: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (u, name) in UNITS {
        if n >= u {
            let x = n as f64 / u as f64;
            return if n.is_multiple_of(u) {
                format!("{} {name}", n / u)
            } else {
                format!("{x:.1} {name}")
            };
        }
    }
    format!("{n} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(size("4096"), Ok(4096));
        assert_eq!(size("64KiB"), Ok(64 << 10));
        assert_eq!(size("64k"), Ok(64 << 10));
        assert_eq!(size("1MiB"), Ok(1 << 20));
        assert_eq!(size("2 GiB"), Ok(2 << 30));
        assert!(size("0").is_err());
        assert!(size("0KiB").is_err());
        assert!(size("many").is_err());
        assert!(size("1.5MiB").is_err());
        assert!(size("1TiB").is_err());
        assert!(size("99999999999999999999G").is_err());
        assert_eq!(byte_count("0"), Ok(0));
        assert_eq!(byte_count("0KiB"), Ok(0));
        assert!(byte_count("-1").is_err());
        assert_eq!(human_size(1 << 20), "1 MiB");
        assert_eq!(human_size(1536), "1.5 KiB");
        assert_eq!(human_size(100), "100 B");
    }

    #[test]
    fn probabilities_and_counts_are_checked() {
        assert!(probability("1.5").is_err());
        assert!(probability("-0.1").is_err());
        assert!(probability("NaN").is_err());
        assert_eq!(probability("0.25"), Ok(0.25));
        assert!(count::<u16>("0").is_err());
        assert!(count::<u16>("70000").is_err());
        assert_eq!(count::<u16>("7"), Ok(7));
    }
}
