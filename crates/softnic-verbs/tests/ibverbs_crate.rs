//! The `ibverbs` crate (0.9, an independent libibverbs client that knows nothing of softnic)
//! runs on softnic: this test binary, linked against the system libibverbs like any program,
//! is started twice by `softnic-run` (a server and a client process, each with its own softnic
//! device on 127.0.0.x):
//! - two processes connect RC queue pairs with nothing but that crate's API (the endpoints
//!   travel over TCP) and exchange SENDs both ways, every byte checked;
//! - RDMA WRITE and READ: the crate's 0.9 API has no call that issues them, but it registers
//!   memory for remote access (`allocate`, `rkey`) and makes QPs that allow it
//!   (`allow_remote_rw`). So one process, written against the crate, is the target, and the
//!   other, written against verbs-safe over the same libibverbs ABI, WRITEs into the crate's
//!   memory with immediate data (the crate's process sees the completion and checks every
//!   byte) and READs it back.
//!
//! It lives in softnic-verbs so that `cargo test` builds what it runs: the package's
//! `softnic-run` launcher (`CARGO_BIN_EXE_softnic-run`) and its library, the drop-in
//! `libibverbs.so` (built for the tests because the library is an rlib too).

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

// The crates.io `ibverbs` crate (this package's own library is named `ibverbs` too).
use ibverbs_crate as ibverbs;

/// Environment of a peer: `server` or `client`, and the server's TCP port.
const ROLE: &str = "IBVERBS_CRATE_PEER_ROLE";
const PORT: &str = "IBVERBS_CRATE_PEER_PORT";
/// Messages each way, and their size.
const N: usize = 16;
const SIZE: usize = 8192;

#[test]
fn the_ibverbs_crate_connects_rc_queue_pairs_between_two_processes_on_softnic() {
    run_peers(
        ["server", "client"],
        &format!("{N} messages each way, every byte right"),
    );
}

#[test]
fn an_rdma_write_and_read_reach_memory_the_ibverbs_crate_registered() {
    run_peers(["target", "writer"], "WRITE and READ of");
}

/// Starts this binary's [`ibverbs_peer`] once per role under `softnic-run` (the first role
/// listens on a TCP port, the second connects); each must exit 0 and print `"{role}: "`
/// followed by `says`.
fn run_peers(roles: [&str; 2], says: &str) {
    let exe = std::env::current_exe().expect("this test binary");
    // Built by cargo with this test, as the package's binary.
    let launcher = env!("CARGO_BIN_EXE_softnic-run");
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let peer = |role: &str| {
        Command::new(launcher)
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
    let children = roles.map(|role| (role, peer(role)));
    let deadline = Instant::now() + Duration::from_secs(60);
    for (who, mut child) in children {
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
        assert!(text.contains(&format!("{who}: {says}")), "{text}");
    }
}

/// One peer (run by the tests above through `softnic-run`; does nothing when run otherwise).
#[test]
#[ignore = "a peer process of the tests above, started by them"]
fn ibverbs_peer() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let port: u16 = std::env::var(PORT)
        .expect("the port")
        .parse()
        .expect("a port");
    match role.as_str() {
        "target" => crate_target(port),
        "writer" => safe_writer(port),
        _ => sends_both_ways(&role, port),
    }
}

/// Listens on `port` for the other peer (the first role), or connects to it.
fn meet(listen: bool, port: u16) -> TcpStream {
    if listen {
        let l = TcpListener::bind(("127.0.0.1", port)).expect("listening");
        l.accept().expect("the other peer").0
    } else {
        connect(port)
    }
}

/// Sends one JSON line.
fn send_line(stream: &TcpStream, value: &serde_json::Value) {
    let mut line = value.to_string();
    line.push('\n');
    (&*stream)
        .write_all(line.as_bytes())
        .expect("sent a line to the peer");
}

/// Reads one JSON line.
fn read_line(reader: &mut BufReader<&TcpStream>) -> serde_json::Value {
    let mut line = String::new();
    reader.read_line(&mut line).expect("a line from the peer");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
}

/// The RC SEND test's peer: the crate's API only.
fn sends_both_ways(role: &str, port: u16) {
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
    let stream = meet(server, port);
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

/// Bytes the writer WRITEs into the crate's memory and READs back.
const LEN: usize = 20_000;
/// The immediate data of the WRITE.
const IMM: u32 = 0x5eed;

/// The byte at `i` of what the writer WRITEs.
fn pattern(i: usize) -> u8 {
    (i % 253) as u8 ^ 0x5a
}

/// The RDMA target: written against the `ibverbs` crate only. It registers memory for remote
/// access, makes a QP that allows it, hands the writer its endpoint, address and rkey, and
/// checks every byte once the WRITE-with-immediate completes; it stays up until the writer
/// has READ the memory back.
fn crate_target(port: u16) {
    let devices = ibverbs::devices().expect("softnic's device list");
    let ctx = devices
        .iter()
        .next()
        .expect("one device")
        .open()
        .expect("opens");
    let cq = ctx.create_cq(4, 0).expect("a CQ");
    let pd = ctx.alloc_pd().expect("a PD");
    let prepared = pd
        .create_qp(&cq, &cq, ibverbs::ibv_qp_type::IBV_QPT_RC)
        .allow_remote_rw()
        .set_max_dest_rd_atomic(1)
        .set_gid_index(1)
        .build()
        .expect("an RC QP open to remote reads and writes");
    let memory = pd.allocate::<u8>(LEN).expect("remotely accessible memory");
    let stream = meet(true, port);
    send_line(
        &stream,
        &serde_json::json!({
            "endpoint": prepared.endpoint(),
            "addr": memory.as_ptr() as u64,
            "rkey": memory.rkey().key,
        }),
    );
    let mut reader = BufReader::new(&stream);
    let remote = serde_json::from_value(read_line(&mut reader)).expect("an endpoint");
    let mut qp = prepared.handshake(remote).expect("connected");
    // The WRITE's immediate data consumes a receive (of no bytes).
    let mut note = pd.allocate::<u8>(1).expect("a receive buffer");
    // SAFETY: the memory region outlives the completion, which is waited for.
    unsafe { qp.post_receive(&mut note, 0..0, 7) }.expect("a receive");
    send_line(&stream, &serde_json::json!("ready"));
    let mut wc = [ibverbs::ibv_wc::default(); 4];
    let deadline = Instant::now() + Duration::from_secs(30);
    let done = loop {
        assert!(Instant::now() < deadline, "no WRITE arrived in 30 s");
        if let Some(c) = cq.poll(&mut wc).expect("poll").first() {
            break *c;
        }
    };
    assert!(done.is_valid(), "a failed completion: {:?}", done.error());
    assert_eq!(done.wr_id(), 7);
    assert_eq!(
        done.opcode(),
        ibverbs::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM
    );
    // The crate hands out the immediate data as it is in the completion: network order.
    assert_eq!(done.imm_data().map(u32::from_be), Some(IMM));
    for (i, &b) in memory.iter().enumerate() {
        assert_eq!(b, pattern(i), "byte {i} of the crate's memory");
    }
    // The writer READs it back, then says so.
    assert_eq!(read_line(&mut reader), serde_json::json!("read"));
    drop(memory);
    println!("target: WRITE and READ of {LEN} bytes in memory the ibverbs crate registered");
}

/// The RDMA initiator: written against verbs-safe over the system libibverbs (softnic's,
/// under `softnic-run`).
fn safe_writer(port: u16) {
    use std::sync::Arc;
    use verbs_safe::*;

    let verbs = Verbs::system();
    let ctx = Context::open_by_name(&verbs, "soft0").expect("soft0 opens");
    let pd = ctx.alloc_pd().expect("a PD");
    let cq = Cq::new(&ctx, 16, None).expect("a CQ");
    let init = QpInit {
        send_cq: &cq,
        recv_cq: &cq,
        srq: None,
        caps: QpCaps::default(),
        sig_all: true,
    };
    let qp = Qp::<Rc, _>::new(&pd, init).expect("an RC QP");
    let stream = meet(false, port);
    let mut reader = BufReader::new(&stream);
    let theirs = read_line(&mut reader);
    let field = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k}"));
    let (addr, rkey) = (field(&theirs, "addr"), field(&theirs, "rkey") as u32);
    let endpoint = &theirs["endpoint"];
    let raw: Vec<u8> = serde_json::from_value(endpoint["gid"]["raw"].clone()).expect("a GID");
    let remote = Remote {
        qpn: field(endpoint, "num") as u32,
        psn: 0,
        lid: 0,
        gid: Some(Gid(raw.try_into().expect("16 bytes"))),
    };
    // The IPv4-mapped GID, index 1, as the target uses.
    let gid = ctx.query_gid(1, 1).expect("GID 1");
    send_line(
        &stream,
        &serde_json::json!({ "num": qp.qpn(), "lid": 0, "gid": { "raw": gid.0 } }),
    );
    let qp = qp.init(ConnInit::default()).expect("INIT");
    // The crate's QPs take the port's active MTU as their path MTU: the same here.
    let rtr = RcRtr {
        path_mtu: ctx.query_port(1).expect("port 1").active_mtu,
        ..RcRtr::new(remote, LocalPort::new(1, 1))
    };
    let qp = qp.rtr(rtr).expect("RTR");
    let qp = qp.rts(RcRts::new(0)).expect("RTS");
    assert_eq!(read_line(&mut reader), serde_json::json!("ready"));

    let mut src = pd
        .alloc_mr(LEN, 64, AccessFlags::LOCAL_WRITE)
        .expect("a source");
    for (i, b) in src.as_mut_slice().iter_mut().enumerate() {
        *b = pattern(i);
    }
    let src = Arc::new(src);
    let write = SendOp::WriteWithImm {
        remote_addr: addr,
        rkey,
        imm: IMM,
    };
    qp.post_send_bufs(&mut [SendWr::new(1, write).buf(&src, 0, LEN as u32)])
        .expect("the WRITE");
    let sink = pd
        .alloc_mr(LEN, 64, AccessFlags::LOCAL_WRITE)
        .expect("a READ target");
    let read = SendOp::Read {
        remote_addr: addr,
        rkey,
    };
    qp.post_send_bufs(&mut [SendWr::new(2, read).target(sink, 0, LEN as u32)])
        .expect("the READ");
    let mut poller = Poller::new();
    let mut back = None;
    let mut done = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while done < 2 {
        assert!(Instant::now() < deadline, "{done} of 2 completions in 30 s");
        poller
            .poll(&cq, 4, |mut c| {
                assert!(c.ok().is_ok(), "a failed completion: {:?}", c.status());
                if c.wr_id() == 2 {
                    back = c.take_bufs().pop();
                }
                done += 1;
            })
            .expect("poll");
    }
    let back = back.expect("the READ target came back");
    assert!(
        back.as_slice()[..LEN]
            .iter()
            .enumerate()
            .all(|(i, &b)| b == pattern(i)),
        "the READ brought back what was written"
    );
    send_line(&stream, &serde_json::json!("read"));
    println!("writer: WRITE and READ of {LEN} bytes through verbs-safe, checked");
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
