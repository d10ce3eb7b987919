//! Progress on the UDP link: what one round takes in.

use std::net::{Ipv4Addr, UdpSocket};

use crate::{Fabric, FabricConfig, Link, roce};

/// A round of progress takes in at least as many packets as a port may send in one (a burst),
/// when they wait: a peer's flood of small requests each answered by many packets (READs)
/// drains as fast as it is answered, instead of filling the socket's queue, in which every
/// other peer's packets then wait (hundreds of milliseconds).
#[test]
fn a_round_takes_in_at_least_a_burst_of_waiting_packets() {
    let f = Fabric::try_new(FabricConfig {
        devices: 1,
        link: Link::Udp { addr: None },
        ..Default::default()
    })
    .expect("a free address in 127.0.0.2-254");
    let to = (f.udp_addr("soft0").unwrap(), roce::UDP_PORT);
    let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let burst = crate::link::udp::BURST as u64;
    let sent = 3 * burst;
    // Held: the progress thread takes none of them meanwhile.
    let mut st = f.shared.lock().unwrap();
    for _ in 0..sent {
        // Too short to be a packet: counted as malformed, and dropped.
        sock.send_to(&[1, 2, 3], to).unwrap();
    }
    // Loopback delivers as it sends; a moment for a kernel that deferred some of it.
    std::thread::sleep(std::time::Duration::from_millis(50));
    // The clock as it is now: past any moment the progress thread's last look, just before
    // the lock was taken, leaves the socket alone for.
    st.sync_clock();
    st.progress();
    let took = st.w.devices[0].counters.malformed;
    assert!(
        (burst..=sent).contains(&took),
        "one round took in {took} of {sent} waiting datagrams (a burst is {burst})"
    );
}
