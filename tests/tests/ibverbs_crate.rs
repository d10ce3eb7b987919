//! The `ibverbs` crate (0.9, an independent libibverbs client that knows nothing of softnic)
//! runs on softnic: this test binary, linked against the system libibverbs like any program,
//! is started twice by `softnic-run` (a server and a client process, each with its own softnic
//! device on 127.0.0.x), and the two connect RC queue pairs with nothing but that crate's API
//! (the endpoints travel over TCP) and exchange SENDs both ways, every byte checked.
//!
//! (The crate's 0.9 API has SEND and RECEIVE only: no RDMA WRITE call to test.)

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Environment of a peer: `server` or `client`, and the server's TCP port.
const ROLE: &str = "IBVERBS_CRATE_PEER_ROLE";
const PORT: &str = "IBVERBS_CRATE_PEER_PORT";
/// Messages each way, and their size.
const N: usize = 16;
const SIZE: usize = 8192;

#[test]
fn the_ibverbs_crate_connects_rc_queue_pairs_between_two_processes_on_softnic() {
    let exe = std::env::current_exe().expect("this test binary");
    // target/<profile>/deps/<test> -> target/<profile>/softnic-run
    let launcher: PathBuf = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|p| p.join("softnic-run"))
        .expect("a target directory");
    assert!(
        launcher.exists(),
        "{} is missing: build it with `cargo build -p softnic-verbs`",
        launcher.display()
    );
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let peer = |role: &str| {
        Command::new(&launcher)
            .args(["--quiet", "--"])
            .arg(&exe)
            .args(["--exact", "ibverbs_peer", "--ignored", "--nocapture"])
            .env(ROLE, role)
            .env(PORT, port.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("softnic-run starts")
    };
    let server = peer("server");
    let client = peer("client");
    let deadline = Instant::now() + Duration::from_secs(60);
    for (who, mut child) in [("server", server), ("client", client)] {
        while child.try_wait().expect("waiting").is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let out = child.wait_with_output().expect("its output");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "{who} failed ({}):\n{text}",
            out.status
        );
        assert!(
            text.contains(&format!("{who}: {N} messages each way, every byte right")),
            "{text}"
        );
    }
}

/// One peer (run by the test above through `softnic-run`; does nothing when run otherwise).
#[test]
#[ignore = "a peer process of the_ibverbs_crate_..., started by it"]
fn ibverbs_peer() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let port: u16 = std::env::var(PORT)
        .expect("the port")
        .parse()
        .expect("a port");
    let server = role == "server";

    let devices = ibverbs::devices().expect("softnic's device list");
    let dev = devices.iter().next().expect("one device");
    assert_eq!(dev.name().expect("a name").to_str(), Ok("soft0"));
    let ctx = dev.open().expect("the device opens");
    let cq = ctx.create_cq(4 * N as i32, 0).expect("a CQ");
    let pd = ctx.alloc_pd().expect("a PD");
    let prepared = pd
        .create_qp(&cq, &cq, ibverbs::ibv_qp_type::IBV_QPT_RC)
        .set_gid_index(0)
        .set_max_send_wr(N as u32)
        .set_max_recv_wr(N as u32)
        .build()
        .expect("an RC QP");
    let mine = prepared.endpoint();

    // The endpoints travel over TCP as JSON lines.
    let stream = if server {
        let l = TcpListener::bind(("127.0.0.1", port)).expect("listening");
        l.accept().expect("the client").0
    } else {
        connect(port)
    };
    let mut line = serde_json::to_string(&mine).expect("JSON");
    line.push('\n');
    (&stream)
        .write_all(line.as_bytes())
        .expect("sent the endpoint");
    // One reader for the whole conversation (a second one could miss what the first buffered).
    let mut reader = BufReader::new(&stream);
    let mut theirs = String::new();
    reader.read_line(&mut theirs).expect("the peer's endpoint");
    let remote = serde_json::from_str(&theirs).expect("an endpoint");
    let mut qp = prepared.handshake(remote).expect("connected");

    let mut inbox = pd.allocate::<u8>(N * SIZE).expect("receive memory");
    let mut outbox = pd.allocate::<u8>(N * SIZE).expect("send memory");
    let dir = |from_server: bool| u8::from(from_server) * 128;
    for (i, b) in outbox.iter_mut().enumerate() {
        *b = (i % 251) as u8 ^ dir(server);
    }
    for m in 0..N {
        // SAFETY: the memory region outlives the completions, which are all waited for.
        unsafe { qp.post_receive(&mut inbox, m * SIZE..(m + 1) * SIZE, 1000 + m as u64) }
            .expect("a receive");
    }
    // Both sides have posted their receives before anybody sends.
    (&stream).write_all(b"r\n").expect("ready");
    let mut ready = String::new();
    reader.read_line(&mut ready).expect("peer ready");
    for m in 0..N {
        // SAFETY: as above.
        unsafe { qp.post_send(&mut outbox, m * SIZE..(m + 1) * SIZE, m as u64) }.expect("a send");
    }
    let (mut sent, mut received) = (0, 0);
    let mut wc = [ibverbs::ibv_wc::default(); 16];
    let deadline = Instant::now() + Duration::from_secs(30);
    while sent < N || received < N {
        assert!(
            Instant::now() < deadline,
            "{sent} sent, {received} received after 30 s"
        );
        for c in cq.poll(&mut wc).expect("poll") {
            assert!(c.is_valid(), "a failed completion: {:?}", c.error());
            if c.wr_id() >= 1000 {
                assert_eq!(c.len(), SIZE);
                received += 1;
            } else {
                sent += 1;
            }
        }
    }
    for (i, &b) in inbox.iter().enumerate() {
        assert_eq!(b, (i % 251) as u8 ^ dir(!server), "byte {i}");
    }
    println!("{role}: {N} messages each way, every byte right");
}

/// Connects to the server, which may not listen yet.
fn connect(port: u16) -> TcpStream {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => return s,
            Err(e) => assert!(Instant::now() < deadline, "connecting: {e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
