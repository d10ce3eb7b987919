//! A listening engine in a process out of file descriptors (its own test binary: it lowers the
//! process's descriptor limit, which would fail any test running beside it).
//!
//! `accept` then fails with EMFILE and leaves the connection queued. The engine says so once,
//! tries again now and then (not on every look: each try would fail and be recorded again),
//! and sets the client up once a descriptor is free.

use std::net::TcpListener;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
use uccl_engine::EngineConfig;

/// Every descriptor the process could still open, taken: the soft limit lowered to just above
/// the highest open one and the holes below filled. Dropped (at the end of the window, or by a
/// panic inside it), it frees them and gives the limit back.
struct Exhausted {
    held: Vec<OwnedFd>,
    saved: Rlimit,
}

impl Exhausted {
    fn take() -> Exhausted {
        let saved = getrlimit(Resource::Nofile);
        let highest = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
            .max()
            .unwrap();
        let lowered = Rlimit {
            current: Some(highest + 1),
            maximum: saved.maximum,
        };
        setrlimit(Resource::Nofile, lowered).unwrap();
        let mut taken = Exhausted {
            held: vec![],
            saved,
        };
        let null = std::fs::File::open("/dev/null").map(OwnedFd::from);
        let null = null.unwrap_or_else(|e| panic!("none free below {highest}: {e}"));
        while let Ok(fd) = null.try_clone() {
            taken.held.push(fd);
        }
        taken.held.push(null);
        taken
    }
}

impl Drop for Exhausted {
    fn drop(&mut self) {
        self.held.clear();
        let _ = setrlimit(Resource::Nofile, self.saved);
    }
}

#[test]
fn a_listener_out_of_descriptors_says_so_once_and_sets_the_client_up_once_one_is_free() {
    let (_fabric, mut a, mut b) = uccl_integration::wall_pair(&EngineConfig {
        qps_per_conn: 2,
        max_conns: 4,
        ..EngineConfig::default()
    });
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    a.listen(listener).unwrap();
    // The client's socket exists and its connection waits in the listener's backlog.
    let client = b.connect(addr).unwrap();
    let incoming = a.incoming().unwrap();

    let exhausted = Exhausted::take();
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until {
        a.poll().unwrap();
        b.poll().unwrap();
    }
    let why = a.incoming_failures();
    let done = (incoming.is_done(), client.is_done());
    drop(exhausted);
    assert_eq!(done, (false, false), "set up without a descriptor?");
    assert_eq!(why.len(), 1, "said once, not on every look: {why:?}");
    assert_eq!(
        a.stats().handshakes_failed,
        1,
        "the failure said is counted, once"
    );
    let text = why[0].to_string();
    assert!(
        text.contains("accepting") && text.contains("Too many open files"),
        "{text}"
    );

    let end = Instant::now() + Duration::from_secs(20);
    while !(incoming.is_done() && client.is_done()) {
        assert!(
            Instant::now() < end,
            "not set up once descriptors were free"
        );
        a.poll().unwrap();
        b.poll().unwrap();
    }
    incoming.test().unwrap().unwrap();
    client.test().unwrap().unwrap();
    assert_eq!(a.incoming_failures().len(), 0);
    assert_eq!(a.stats().handshakes_failed, 1);
}
