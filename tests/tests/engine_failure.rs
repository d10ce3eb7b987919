//! uccl-engine when a peer goes away: the link going down mid-transfer, or the peer engine
//! dropped mid-transfer, fails the requests in flight at both ends (or at the survivor) with
//! an error within bounded virtual time; the connection is torn down and every pool slot,
//! credit and CQ reservation comes back; the engines' other connections keep working. UC and
//! RC.

use std::time::Duration;

use softnic::Faults;
use uccl_engine::{EngineConfig, Mode, Request};
use uccl_integration::Sim;
use uccl_integration::workload::{self, Kind, Link, Op, Pacing};

/// How long after the failure every request must have failed: UC notices after
/// `max_silence_us` (1 s) without ACK progress, RC after 8 transport timeouts of 134 ms.
const BOUND: Duration = Duration::from_secs(3);

const BIG: usize = 8 << 20;

fn cfg(mode: Mode) -> EngineConfig {
    EngineConfig {
        mode,
        qps_per_conn: 2,
        max_conns: 8,
        ..EngineConfig::default()
    }
}

/// Requests posted by a test, by name.
type Named = Vec<(String, Request)>;

/// Starts transfers on `l` that cannot finish before the failure: from `a` to `b` an 8 MiB
/// message and an 8 MiB one-sided write, and (if `both`) the same from `b` to `a`.
fn start(sim: &mut Sim, l: &Link, both: bool) -> Named {
    let mut reqs = Named::new();
    let dirs: &[(usize, _, usize, _)] = if both {
        &[(l.a, l.ca, l.b, l.cb), (l.b, l.cb, l.a, l.ca)]
    } else {
        &[(l.a, l.ca, l.b, l.cb)]
    };
    for &(s, cs, r, cr) in dirs {
        let src = sim.engines[s].register(BIG).unwrap();
        let dst = sim.engines[r].register(2 * BIG).unwrap();
        let desc = sim.engines[r].export(&dst, BIG as u64, BIG as u64).unwrap();
        let rx = sim.engines[r].recv(cr, &dst, 0, BIG as u64).unwrap();
        let tx = sim.engines[s].send(cs, &src, 0, BIG as u64).unwrap();
        let w = sim.engines[s]
            .write(cs, &src, 0, BIG as u64, &desc, 0)
            .unwrap();
        reqs.push((format!("receive at engine {r}"), rx));
        reqs.push((format!("send from engine {s}"), tx));
        reqs.push((format!("write from engine {s}"), w));
    }
    reqs
}

/// Runs until the transfer is under way: engine `r` has received chunks.
fn get_going(sim: &mut Sim, r: usize, reqs: &Named) {
    sim.run(Duration::from_secs(1), |s| {
        s.engines[r].stats().chunks_received > 4
    })
    .unwrap();
    for (name, q) in reqs {
        assert!(
            q.test().is_none(),
            "seed {}: {name} finished before the failure",
            sim.seed
        );
    }
}

/// Runs until every request of `reqs` has completed, checks each failed, within [`BOUND`]
/// of virtual time from now.
fn all_fail(sim: &mut Sim, reqs: &Named, what: &str) {
    let seed = sim.seed;
    let t0 = sim.fabric.now();
    let r = sim.run(t0 + BOUND, |_| reqs.iter().all(|(_, q)| q.test().is_some()));
    let pending: Vec<&str> = reqs
        .iter()
        .filter(|(_, q)| q.test().is_none())
        .map(|(n, _)| n.as_str())
        .collect();
    assert!(
        r.is_ok(),
        "seed {seed}: {what}: still pending {:?} after the failure: {pending:?} ({})\n{}",
        sim.fabric.now() - t0,
        r.unwrap_err(),
        workload::usage_table(sim)
    );
    for (name, q) in reqs {
        match q.test().unwrap() {
            Ok(d) => panic!("seed {seed}: {what}: {name} succeeded ({d:?}) across the failure"),
            Err(e) => eprintln!("seed {seed}: {what}: {name} failed: {e}"),
        }
    }
    eprintln!(
        "seed {seed}: {what}: every request failed within {:?}",
        sim.fabric.now() - t0
    );
}

/// Runs until engine `i` holds no connection and is back to its baseline, or until it holds
/// just `keep` connections, nothing draining, no CQ reservation beyond theirs.
fn freed(sim: &mut Sim, i: usize, keep: usize) {
    let base = sim.baseline[i];
    let (send, ctl) = {
        let u = sim.engines[i].usage();
        let conns = u.connections as u64;
        // Per connection: what it reserved (the held connections' share stays).
        (
            (u.send_cq_reserved - base.send_cq_reserved) / conns.max(1),
            (u.ctrl_cq_reserved - base.ctrl_cq_reserved) / conns.max(1),
        )
    };
    let keep64 = keep as u64;
    let t0 = sim.fabric.now();
    let r = sim.run(t0 + BOUND, |s| {
        let u = s.engines[i].usage();
        u.connections == keep
            && u.draining == 0
            && u.send_cq_reserved == base.send_cq_reserved + keep64 * send
            && u.ctrl_cq_reserved == base.ctrl_cq_reserved + keep64 * ctl
            && (keep > 0 || workload::back_to_baseline(s, i))
    });
    assert!(
        r.is_ok(),
        "seed {}: engine {i} did not free the failed connection: {}\n{}",
        sim.seed,
        r.unwrap_err(),
        workload::usage_table(sim)
    );
}

/// A small workload on `l`: the engines' other connection still works.
fn still_works(sim: &mut Sim, l: Link) {
    let ops: Vec<Op> = (0..6)
        .map(|i| Op {
            link: 0,
            reverse: i % 2 == 1,
            kind: if i % 3 == 0 { Kind::Write } else { Kind::Send },
            len: [0, 1, 16 * 1024 + 1, 100_000, 7, 3 * 16 * 1024][i],
            slack: 3,
        })
        .collect();
    workload::run(sim, &[l], &ops, Pacing::default()).unwrap();
    workload::drain(sim, Duration::from_secs(5)).unwrap();
}

fn link_down(seed: u64, mode: Mode, both: bool) {
    let mut sim = Sim::new(seed, 3, Faults::NONE, &cfg(mode));
    let l01 = sim.connect(0, 1).unwrap();
    let l02 = sim.connect(0, 2).unwrap();
    let reqs = start(&mut sim, &l01, both);
    get_going(&mut sim, 1, &reqs);
    let down = Faults {
        link_down: true,
        ..Faults::NONE
    };
    sim.fabric.set_faults("soft0", "soft1", down).unwrap();
    sim.fabric.set_faults("soft1", "soft0", down).unwrap();
    all_fail(&mut sim, &reqs, &format!("{mode:?} link down"));
    assert!(!sim.engines[0].is_open(l01.ca) && !sim.engines[1].is_open(l01.cb));
    freed(&mut sim, 1, 0);
    freed(&mut sim, 0, 1);
    still_works(&mut sim, l02);
    workload::close_all(&mut sim, &[l01, l02], Duration::from_secs(5)).unwrap();
}

#[test]
fn uc_link_down_mid_transfer_fails_both_ends() {
    link_down(31, Mode::Uc, true);
}

#[test]
fn rc_link_down_mid_transfer_fails_both_ends() {
    link_down(32, Mode::Rc, true);
}

#[test]
fn uc_link_down_fails_a_receiver_that_only_receives() {
    link_down(33, Mode::Uc, false);
}

#[test]
fn rc_link_down_fails_a_receiver_that_only_receives() {
    link_down(34, Mode::Rc, false);
}

/// Engine 2 is dropped while transfers to and from engine 0 are under way (from engine 2
/// only, if `!both`: engine 0 only receives); engine 0's requests fail, its connection to
/// engine 2 goes, and its connection to engine 1 keeps working.
fn killed_peer(seed: u64, mode: Mode, both: bool) {
    let mut sim = Sim::new(seed, 3, Faults::NONE, &cfg(mode));
    let l01 = sim.connect(0, 1).unwrap();
    let l20 = sim.connect(2, 0).unwrap();
    let all = start(&mut sim, &l20, both);
    get_going(&mut sim, 0, &all);
    drop(sim.engines.pop());
    // What engine 0 holds: its receives always, its sends and writes if it sends.
    let survivors: Named = all
        .into_iter()
        .filter(|(n, _)| n.ends_with("engine 0"))
        .collect();
    assert!(!survivors.is_empty());
    all_fail(&mut sim, &survivors, &format!("{mode:?} killed peer"));
    assert!(!sim.engines[0].is_open(l20.cb));
    freed(&mut sim, 0, 1);
    still_works(&mut sim, l01);
    workload::close_all(&mut sim, &[l01], Duration::from_secs(5)).unwrap();
}

#[test]
fn uc_killed_peer_fails_the_survivors_requests() {
    killed_peer(41, Mode::Uc, true);
}

#[test]
fn rc_killed_peer_fails_the_survivors_requests() {
    killed_peer(42, Mode::Rc, true);
}

#[test]
fn uc_killed_sender_fails_a_receiver_that_only_receives() {
    killed_peer(43, Mode::Uc, false);
}

#[test]
fn rc_killed_sender_fails_a_receiver_that_only_receives() {
    killed_peer(44, Mode::Rc, false);
}

/// The link between engines 0 and 1 goes down for `outage` in the middle of a workload, then
/// comes back: shorter than `tx.max_silence_us` (`patience`), the time a connection gives a
/// silent peer in either mode, so every message still arrives, exactly once, in order,
/// byte-exact, and nothing fails (the RC QPs' transport timeouts, the control QP's in UC
/// mode too, wait as long).
fn outage(seed: u64, mode: Mode, outage: Duration, patience: Duration) {
    let mut c = cfg(mode);
    c.tx.max_silence_us = patience.as_micros() as u64;
    let mut sim = Sim::new(seed, 2, Faults::NONE, &c);
    let link = sim.connect(0, 1).unwrap();
    let ops: Vec<Op> = (0..16)
        .map(|i| Op {
            link: 0,
            reverse: i % 2 == 1,
            kind: if i % 4 == 3 { Kind::Write } else { Kind::Send },
            len: [1, 100_000, 1 << 20, 16 * 1024][i % 4],
            slack: i,
        })
        .collect();
    let down = Faults {
        link_down: true,
        ..Faults::NONE
    };
    let mut window: Option<(Duration, bool)> = None;
    workload::run_with(&mut sim, &[link], &ops, Pacing::default(), |sim, _| {
        let now = sim.fabric.now();
        match window {
            None if sim.engines[1].stats().chunks_received > 30 => {
                for (a, b) in [("soft0", "soft1"), ("soft1", "soft0")] {
                    sim.fabric.set_faults(a, b, down).unwrap();
                }
                window = Some((now + outage, false));
            }
            Some((until, false)) if now >= until => {
                for (a, b) in [("soft0", "soft1"), ("soft1", "soft0")] {
                    sim.fabric.set_faults(a, b, Faults::NONE).unwrap();
                }
                window = Some((until, true));
            }
            _ => {}
        }
    })
    .unwrap();
    assert!(
        matches!(window, Some((_, true))),
        "seed {seed}: the outage did not happen mid-transfer: {window:?}"
    );
    let dropped = sim.fabric.device_counters("soft1").unwrap().packets_dropped;
    assert!(dropped > 0, "seed {seed}: nothing was lost in the outage");
    // On UC a WR completes once sent: no NIC probe, ever.
    let probes = sim.engines[0].stats().nic_probes + sim.engines[1].stats().nic_probes;
    assert!(
        mode == Mode::Rc || probes == 0,
        "seed {seed}: {probes} NIC probes on UC"
    );
    workload::drain(&mut sim, Duration::from_secs(5)).unwrap();
    workload::close_all(&mut sim, &[link], Duration::from_secs(5)).unwrap();
}

/// The default patience (1 s).
const SECOND: Duration = Duration::from_secs(1);

#[test]
fn uc_a_brief_outage_is_survived() {
    outage(35, Mode::Uc, Duration::from_millis(900), SECOND);
}

#[test]
fn rc_a_brief_outage_is_survived() {
    outage(36, Mode::Rc, Duration::from_millis(900), SECOND);
}

#[test]
fn uc_an_outage_within_a_longer_patience_is_survived() {
    outage(37, Mode::Uc, Duration::from_secs(3), Duration::from_secs(4));
}

#[test]
fn rc_an_outage_within_a_longer_patience_is_survived() {
    outage(38, Mode::Rc, Duration::from_secs(3), Duration::from_secs(4));
}
