//! The set-up queue's unit tests: what a look at the sockets does with set-ups waiting for
//! their turn.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::handshake::Step;
use super::{Attempt, Dials, Target};
use crate::EngineConfig;

/// While the engine moves data, a set-up step whose turn has not come (see
/// `SETUP_SHARE`) waits for a later look: the look steps it once and goes on, where it
/// stepped it again and again until its turn came (stalling the data path meanwhile).
#[test]
fn a_set_up_step_whose_turn_has_not_come_waits_for_a_later_look() {
    let fabric = softnic::Fabric::new(softnic::FabricConfig {
        devices: 2,
        ..Default::default()
    });
    let (mut e, _peer, _, _) = crate::test_pair(&fabric, &EngineConfig::default());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (s, peer) = listener.accept().unwrap();
    let setup = e.accept_stream(s, peer).unwrap();
    let slot = (e.dials.attempts.iter()).position(Option::is_some).unwrap();
    // Its client's handshake in, its QPs to create; the next step's turn an hour away.
    e.dials.attempts[slot].as_mut().unwrap().step = Step::Offer;
    e.dials.next_setup = Some(Instant::now() + Duration::from_secs(3600));
    (e.dials.data_busy, e.dials.budget) = (true, 1);
    e.step_attempt(slot);
    assert_eq!(Vec::from(e.dials.parked.clone()), [slot]);
    // A look stuck for a minute fails the test rather than hang it for the hour.
    struct Looked(Arc<AtomicBool>);
    impl Drop for Looked {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let looked = Looked(Arc::new(AtomicBool::new(false)));
    let watched = Arc::clone(&looked.0);
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(60));
        if !watched.load(Ordering::SeqCst) {
            eprintln!("a look at the sockets stepped a parked set-up for a minute");
            std::process::exit(101);
        }
    });
    e.drive_dials(true).unwrap();
    drop(looked);
    assert_eq!(
        Vec::from(e.dials.parked.clone()),
        [slot],
        "not parked again"
    );
    assert!(!setup.is_done());
}

/// An attempt that ends while it waits for its turn to create or connect QPs leaves the
/// queue of those waiting: with it there, and no socket left to look at, the engine
/// would never be idle (its set-ups would seem to wait for ever).
#[test]
fn an_attempt_that_ends_while_parked_leaves_the_queue() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let peer = client.local_addr().unwrap();
    let (s, _) = listener.accept().unwrap();
    s.set_nonblocking(true).unwrap();
    let mut d = Dials::default();
    let mut a = Attempt::new(mio::net::TcpStream::from_std(s), peer, Target::Listener);
    a.parked = true;
    let slot = d.add(a).unwrap();
    d.parked.push_back(slot);
    assert!(d.waiting());
    assert!(d.remove(slot).is_some());
    assert!(!d.waiting(), "the ended attempt is still parked");
    assert!(!d.active());
}

/// A set-up step during which the engine's thread was descheduled (a second, on a busy
/// machine) holds the next set-up back for as long as an honest slow step would, not five
/// times the second: set-ups arriving while data moves would wait seconds for their turn,
/// and past their handshake deadline.
#[test]
fn a_descheduled_set_up_step_does_not_hold_the_next_for_long() {
    let mut d = Dials::default();
    let began = Instant::now();
    d.setup_took(began, Duration::from_micros(40));
    assert_eq!(d.next_setup, Some(began + Duration::from_micros(200)));
    d.setup_took(began, Duration::from_secs(1));
    let wait = d.next_setup.unwrap() - began;
    assert!(
        wait <= super::SETUP_STEP_MAX * super::SETUP_SHARE,
        "the next set-up waits {wait:?}"
    );
}
