//! Cross-crate integration tests of the workspace; the tests themselves live in `tests/tests/`.
//!
//! This library holds what those tests share: [`Sim`], a deterministic simulation of engines
//! on one softnic fabric (virtual clock, seeded faults), and the data patterns messages carry;
//! and [`workload`]: workloads of messages over many connections, run with every invariant of
//! delivery checked (exactly once, in order, byte-exact, guard bytes untouched), and the
//! checks that pools, credits and CQ reservations come back afterwards; and [`misuse`]: what
//! the tests of the API's misuse share (a wall-clock hang guard, a connected pair); and
//! [`exec`]: the smallest executor, for the tests that await requests.

pub mod exec;
pub mod misuse;
pub mod raw_peer;
mod settle;
pub mod workload;

use std::time::Duration;

use softnic::{Fabric, FabricConfig, Faults};
use uccl_engine::{Clock, Engine, EngineConfig, Usage, connect_pair};
use verbs_safe::{Context, Verbs};

/// Two engines built as `cfg` on a two-device wall-clock fabric (threads drive it: their own,
/// or the engines' [`spawn`](Engine::spawn)ed ones), not connected.
pub fn wall_pair(cfg: &EngineConfig) -> (Fabric, Engine, Engine) {
    let fabric = Fabric::new(FabricConfig {
        devices: 2,
        clock: softnic::Clock::Wall,
        ..Default::default()
    });
    let verbs = Verbs::soft(&fabric);
    let engine = |name: &str| {
        let ctx = Context::open_by_name(&verbs, name).expect("device");
        Engine::new(&ctx, cfg.clone(), Clock::Fabric(fabric.clone())).expect("engine")
    };
    let (a, b) = (engine("soft0"), engine("soft1"));
    (fabric, a, b)
}

/// A property test's configuration: the environment's `PROPTEST_*` settings, else `cases`
/// cases and a shrink of at most `shrink` steps (each case is a whole simulation).
pub fn proptest_config(cases: u32, shrink: u32) -> proptest::test_runner::Config {
    let mut c = proptest::test_runner::Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = cases;
    }
    if std::env::var_os("PROPTEST_MAX_SHRINK_ITERS").is_none() {
        c.max_shrink_iters = shrink;
    }
    c
}

/// Engines on one softnic fabric, driven round by round on the fabric's virtual clock: the
/// same seed and the same calls give the same run, bit for bit.
pub struct Sim {
    /// The fabric.
    pub fabric: Fabric,
    /// The engines, engine `i` on device `soft<i>`.
    pub engines: Vec<Engine>,
    /// The seed (printed by [`Sim::run`] when it gives up).
    pub seed: u64,
    /// Each engine's [`Usage`] when it was built, before any connection: what it holds again
    /// once every connection is gone.
    pub baseline: Vec<Usage>,
}

impl Sim {
    /// `n` engines built as `cfg`, the fabric faulty as `faults` (every direction), seeded.
    pub fn new(seed: u64, n: usize, faults: Faults, cfg: &EngineConfig) -> Sim {
        Sim::with_topology(seed, n, faults, cfg, softnic::Topology::Direct)
    }

    /// As [`Sim::new`], the devices meeting as `topology` says (switches: see
    /// [`softnic::topology`]).
    pub fn with_topology(
        seed: u64,
        n: usize,
        faults: Faults,
        cfg: &EngineConfig,
        topology: softnic::Topology,
    ) -> Sim {
        trace_from_env();
        let fabric = Fabric::new(FabricConfig {
            devices: n,
            seed,
            auto_advance: false,
            topology,
            ..Default::default()
        });
        fabric.set_default_faults(faults).unwrap();
        let verbs = Verbs::soft(&fabric);
        let engines = (0..n)
            .map(|i| {
                let ctx = Context::open_by_name(&verbs, &format!("soft{i}")).expect("device");
                Engine::new(&ctx, cfg.clone(), Clock::Fabric(fabric.clone())).expect("engine")
            })
            .collect::<Vec<Engine>>();
        let baseline = engines.iter().map(Engine::usage).collect();
        Sim {
            fabric,
            engines,
            seed,
            baseline,
        }
    }

    /// Connects engine `i` to engine `j` (`i != j`) in process: a [`workload::Link`].
    pub fn connect(&mut self, i: usize, j: usize) -> Result<workload::Link, String> {
        let (ca, cb) = {
            let (a, b) = pair_mut(&mut self.engines, i, j);
            connect_pair(a, b)
                .map_err(|e| format!("seed {}: connecting {i} to {j}: {e}", self.seed))?
        };
        Ok(workload::Link { a: i, ca, b: j, cb })
    }

    /// Connects every pair of engines `per_pair` times: links in the order (0,1), (0,2), ...,
    /// (1,2), ..., each pair's `per_pair` links together.
    pub fn connect_all(&mut self, per_pair: usize) -> Result<Vec<workload::Link>, String> {
        let n = self.engines.len();
        let mut links = Vec::new();
        for i in 0..n {
            for j in i + 1..n {
                for _ in 0..per_pair {
                    links.push(self.connect(i, j)?);
                }
            }
        }
        Ok(links)
    }

    /// Runs rounds until `done` holds, moving the virtual clock to the next event (a packet,
    /// a timer of the fabric or of an engine) whenever no engine has work. Fails, naming the
    /// seed, after `limit` of virtual time or when nothing is left to happen.
    pub fn run(
        &mut self,
        limit: Duration,
        mut done: impl FnMut(&mut Sim) -> bool,
    ) -> Result<(), String> {
        loop {
            if done(self) {
                return Ok(());
            }
            let mut busy = false;
            for e in &mut self.engines {
                busy |= e.poll().map_err(|e| format!("seed {}: {e}", self.seed))?;
            }
            if busy {
                continue;
            }
            let now = self.fabric.now();
            if now > limit {
                return Err(format!(
                    "seed {}: not done after {now:?} of virtual time",
                    self.seed
                ));
            }
            let next = self
                .engines
                .iter()
                .filter_map(Engine::next_deadline)
                .map(Duration::from_nanos)
                .chain(self.fabric.next_event())
                .min();
            match next {
                Some(t) if t > now => self.fabric.advance(t - now),
                Some(_) => self.fabric.advance(Duration::from_nanos(1)),
                None if done(self) => return Ok(()),
                None => {
                    return Err(format!(
                        "seed {}: stuck at {now:?}: nothing pending and not done",
                        self.seed
                    ));
                }
            }
        }
    }
}

impl Sim {
    /// Moves the virtual clock to the fabric's next event (by at least 1 ns), or, with none
    /// pending, by `idle` (not at all if `None`): a step for tests that run some engines alone.
    pub fn advance_to_next(&self, idle: Option<Duration>) {
        let now = self.fabric.now();
        if let Some(next) = self.fabric.next_event().or(idle.map(|d| now + d)) {
            self.fabric
                .advance(next.saturating_sub(now).max(Duration::from_nanos(1)));
        }
    }
}

/// Mutable references to two different elements of `v`.
pub fn pair_mut<T>(v: &mut [T], i: usize, j: usize) -> (&mut T, &mut T) {
    assert_ne!(i, j, "two different elements");
    if i < j {
        let (l, r) = v.split_at_mut(j);
        (&mut l[i], &mut r[0])
    } else {
        let (l, r) = v.split_at_mut(i);
        (&mut r[0], &mut l[j])
    }
}

/// Sends the engines' `tracing` events to the test's output, filtered by `RUST_LOG` (nothing
/// when it is unset). Harmless to call more than once.
pub fn trace_from_env() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
}

/// The bytes of message `msg` of flow `flow` under `seed`: `len` bytes no other message has
/// at the same place, so a byte out of place, missing or duplicated shows.
pub fn pattern(seed: u64, flow: u64, msg: u64, len: usize) -> Vec<u8> {
    let mut x =
        seed ^ flow.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ msg.wrapping_mul(0xbf58_476d_1ce4_e5b9)
            | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
