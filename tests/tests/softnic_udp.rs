//! softnic over real sockets (`Link::Udp`), end to end between two processes.
//!
//! Each test below starts a second process (this test binary again, running the ignored test
//! [`child_peer`] through the libtest arguments that both `cargo test` and `cargo nextest`
//! binaries take). Each process builds its own one-device fabric on the UDP link, so the two
//! devices sit on different 127.0.0.x addresses and only talk through RoCEv2 datagrams (real
//! ICRC) on port 4791. The processes swap QP numbers, GIDs, PSNs and RDMA WRITE targets over a
//! TCP connection on 127.0.0.1, bring up an RC, a UC and a UD QP pair through verbs-safe's
//! typestate API, and move data both ways at once:
//!
//! - RC: SENDs and RDMA WRITEs with immediate of 1 byte to 64 KiB (up to 16 packets at the
//!   4096-byte MTU, PSNs crossing the 24-bit wrap), every message delivered, in order;
//! - UC: SENDs and RDMA WRITEs with immediate of up to 16 KiB, in small windows;
//! - UD: SENDs of up to one MTU, the 40-byte GRH (naming the sender's address) and the source
//!   QPN checked.
//!
//! Every byte is compared against a pattern derived from (seed, direction, message kind,
//! message index); the index travels in the immediate data, so a message is recognised even
//! when the ones before it were lost. It runs once without faults (everything arrives, nothing
//! is dropped) and once with 1% loss injected on what each side sends: RC still delivers
//! everything exactly (its retransmissions are asserted through the device counters), while
//! UC and UD deliver a consistent, byte-exact subset. No counter shows an ICRC error.
//!
//! Also checked: a fabric asked for an address another fabric holds fails with
//! `softnic::Error::Bind` naming it.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use softnic::{Counters, Fabric, FabricConfig, Faults, Link};
use verbs_safe::{
    AccessFlags, ConnInit, Context, Cq, DmaBuf, Gid, LocalPort, MrBuf, Mtu, Pd, Poller, Qp, QpCaps,
    QpInit, Rc, RcRtr, RcRts, RecvWr, Remote, Rts, SendOp, SendWr, SqPsn, Uc, UcRtr, Ud, UdInit,
    UdRtr, UdSendWr, Verbs, WcOpcode,
};

/// Environment of the child: the parent's TCP port on 127.0.0.1.
const ENV_PORT: &str = "SOFTNIC_UDP_TEST_PORT";
/// Environment of the child: the loss probability to inject on what it sends.
const ENV_LOSS: &str = "SOFTNIC_UDP_TEST_LOSS";
/// Environment of the child: the seed of the run (data patterns; the fabric seeds derive).
/// Set for the parent, it replaces the tests' own seeds (to replay or explore a run).
const ENV_SEED: &str = "SOFTNIC_UDP_TEST_SEED";

/// The child process is killed (and the test fails) if it has not exited by then.
const CHILD_DEADLINE: Duration = Duration::from_secs(60);
/// Longest wait for any one step (a TCP message from the peer, a set of completions).
const STEP: Duration = Duration::from_secs(30);
/// With loss: how long after the peer said it sent a UC/UD window its stragglers may arrive.
const GRACE: Duration = Duration::from_millis(250);

/// The port MTU of both fabrics and the path MTU of the connected QPs.
const MTU: usize = 4096;
/// Bytes of the GRH in front of every UD receive.
const GRH: usize = 40;
const QKEY: u32 = 0x5eed;
const FROM: LocalPort = LocalPort {
    port: 1,
    gid_index: 0,
};

/// RC, per round and direction: SEND `i` and WRITE-with-immediate `i` interleaved.
const RC_SEND_SIZES: [usize; 8] = [1, 777, 4096, 4097, 20_000, 65_536, 65_536, 65_536];
const RC_WRITE_SIZES: [usize; 8] = [65_536, 1, 4095, 8193, 30_001, 65_536, 12_288, 65_536];
const RC_N: usize = RC_SEND_SIZES.len();
/// Receive slot and WRITE target slot of RC (the largest message).
const RC_SLOT: usize = 65_536;
/// With loss, RC rounds repeat until both sides have seen a drop and a retransmission: a
/// round is 122 data packets each way, which 1% loss leaves untouched about 30% of the time
/// (the faults are seeded, so a given seed mostly takes the same number of rounds). This many
/// at most: a side still without a retransmission after them fails (~0.3^12 = 5e-7).
const RC_MAX_ROUNDS: usize = 12;

/// UC: messages alternate SEND and WRITE-with-immediate, each kind cycling through the sizes.
const UC_SIZES: [usize; 6] = [1, 300, 4096, 4097, 9000, 16_384];
const UC_WINDOW: usize = 6;
const UC_ROUNDS: usize = 4;
const UC_MSGS: usize = UC_WINDOW * UC_ROUNDS;
const UC_SLOT: usize = 16_384;

/// UD: SENDs of up to one MTU.
const UD_SIZES: [usize; 8] = [1, 64, 1000, 2048, 4000, 4096, 17, 3333];
const UD_WINDOW: usize = 8;
const UD_ROUNDS: usize = 4;
const UD_MSGS: usize = UD_WINDOW * UD_ROUNDS;
const UD_SLOT: usize = GRH + MTU;

#[test]
fn two_processes_move_rc_uc_ud_data_both_ways_without_loss() {
    two_processes(0.0, 0x00c0_ffee);
}

/// The seed makes the losses of this run nearly the same every time (the fault RNG draws once
/// per packet sent; only which packet each draw meets depends on timing): with it both sides
/// drop packets in the first RC round and lose UC messages. Nothing depends on that: RC rounds
/// repeat until both sides have retransmitted, and UC/UD only have to deliver most messages.
#[test]
fn two_processes_move_rc_uc_ud_data_both_ways_with_one_percent_loss() {
    two_processes(0.01, 7928);
}

/// The child's end of [`two_processes`]; does nothing when not started by it.
#[test]
#[ignore = "the second process of the two-process tests, which start it themselves"]
fn child_peer() {
    let Ok(port) = std::env::var(ENV_PORT) else {
        eprintln!("child_peer: {ENV_PORT} is not set: only the two-process tests run this");
        return;
    };
    let port: u16 = port.parse().expect("a TCP port in SOFTNIC_UDP_TEST_PORT");
    let loss: f64 = env_or(ENV_LOSS, "0")
        .parse()
        .expect("a probability in SOFTNIC_UDP_TEST_LOSS");
    let seed: u64 = env_or(ENV_SEED, "0")
        .parse()
        .expect("a seed in SOFTNIC_UDP_TEST_SEED");
    let addr = std::net::SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let stream = TcpStream::connect_timeout(&addr, STEP)
        .unwrap_or_else(|e| panic!("child: connecting to the parent at {addr}: {e}"));
    let summary = run_peer(Role::Child, stream, loss, seed);
    println!("{summary}");
}

#[test]
fn a_second_fabric_on_an_address_in_use_fails_with_bind() {
    let first = Fabric::try_new(udp_config(None, 0)).expect("a UDP fabric on a free address");
    let ip = first.udp_addr("soft0").expect("soft0 is on the UDP link");
    let [a, b, c, d] = ip.octets();
    assert!(
        a == 127 && b == 0 && c == 0 && (2..=254).contains(&d),
        "a free address is taken from 127.0.0.2-254, got {ip}"
    );
    assert_eq!(first.gid("soft0"), Some(ip.to_ipv6_mapped().octets()));
    let err = Fabric::try_new(udp_config(Some(ip), 0))
        .expect_err("a second fabric cannot bind the same address");
    match &err {
        softnic::Error::Bind { addr, reason } => {
            assert_eq!(*addr, Some(ip), "the error names the address asked for");
            assert!(!reason.is_empty(), "the error says why");
        }
        other => panic!("expected Error::Bind, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains(&ip.to_string()),
        "the message names the address: {msg}"
    );
    assert_eq!(first.broken(), None, "the first fabric is untouched");
    assert_eq!(first.udp_addr("soft0"), Some(ip));
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn udp_config(addr: Option<Ipv4Addr>, seed: u64) -> FabricConfig {
    FabricConfig {
        devices: 1,
        seed,
        mtu: MTU as u32,
        link: Link::Udp { addr },
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------------
// The parent: starts the child, is the other peer, and judges the child's exit.

/// The child process; killed (and its output shown) if the parent gives up on it.
struct ChildGuard {
    child: Option<Child>,
    output: Vec<JoinHandle<String>>,
}

impl ChildGuard {
    fn spawn(port: u16, loss: f64, seed: u64) -> ChildGuard {
        let exe = std::env::current_exe().expect("the test binary's path");
        let mut child = Command::new(&exe)
            .args([
                "child_peer",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ENV_PORT, port.to_string())
            .env(ENV_LOSS, loss.to_string())
            .env(ENV_SEED, seed.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting the child {}: {e}", exe.display()));
        fn drain(mut r: impl Read + Send + 'static) -> JoinHandle<String> {
            thread::spawn(move || {
                let mut s = Vec::new();
                let _ = r.read_to_end(&mut s);
                String::from_utf8_lossy(&s).into_owned()
            })
        }
        let output = vec![
            drain(child.stdout.take().expect("piped stdout")),
            drain(child.stderr.take().expect("piped stderr")),
        ];
        ChildGuard {
            child: Some(child),
            output,
        }
    }

    fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("the child is still ours")
    }

    /// What the child printed (once it has exited).
    fn output(&mut self) -> String {
        let parts = self
            .output
            .drain(..)
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| "<output reader panicked>".into())
            })
            .collect::<Vec<_>>();
        format!(
            "--- child stdout ---\n{}--- child stderr ---\n{}",
            parts.first().map_or("", String::as_str),
            parts.get(1).map_or("", String::as_str)
        )
    }

    /// Panics (with the child's output) if the child has already exited.
    fn check_running(&mut self, while_doing: &str) {
        if let Ok(Some(status)) = self.child().try_wait() {
            self.child = None;
            panic!(
                "the child exited ({status}) while the parent was {while_doing}\n{}",
                self.output()
            );
        }
    }

    /// Waits for the child to exit until `deadline`, killing it then; its status (`None`:
    /// killed) and output.
    fn wait(mut self, deadline: Instant) -> (Option<ExitStatus>, String) {
        let mut child = self.child.take().expect("the child is still ours");
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(5)),
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                Err(e) => panic!("waiting for the child: {e}"),
            }
        };
        (status, self.output())
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            if thread::panicking() {
                eprintln!(
                    "the child was stopped (killed if still running); its output:\n{}",
                    self.output()
                );
            }
        }
    }
}

/// Runs the two peers, this process and a child, with `loss` injected on both sides.
fn two_processes(loss: f64, seed: u64) {
    let seed = std::env::var(ENV_SEED).map_or(seed, |s| {
        s.parse()
            .unwrap_or_else(|e| panic!("{ENV_SEED}={s:?}: not a seed: {e}"))
    });
    let started = Instant::now();
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a TCP port on 127.0.0.1");
    let port = listener
        .local_addr()
        .expect("the listener's address")
        .port();
    let mut child = ChildGuard::spawn(port, loss, seed);
    listener
        .set_nonblocking(true)
        .expect("a non-blocking listener");
    let deadline = Instant::now() + STEP;
    let stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                child.check_running("waiting for it to connect");
                assert!(
                    Instant::now() < deadline,
                    "the child did not connect within {STEP:?}"
                );
                thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("accepting the child's connection: {e}"),
        }
    };
    stream
        .set_nonblocking(false)
        .expect("a blocking connection");
    let summary = run_peer(Role::Parent, stream, loss, seed);
    let (status, output) = child.wait(started + CHILD_DEADLINE);
    let Some(status) = status else {
        panic!("the child did not exit within {CHILD_DEADLINE:?}: killed\n{output}");
    };
    assert!(status.success(), "the child failed ({status})\n{output}");
    assert!(
        output.contains("child_peer ... ok") || output.contains("test result: ok. 1 passed"),
        "the child did not run child_peer\n{output}"
    );
    println!("{summary}");
    println!("{output}");
    println!("took {:?}", started.elapsed());
}

// ---------------------------------------------------------------------------------------------
// One peer: the same code runs in both processes; only the direction differs.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Parent,
    Child,
}

impl Role {
    /// The direction of what this peer sends (0: parent to child, 1: child to parent).
    fn dir(self) -> u8 {
        match self {
            Role::Parent => 0,
            Role::Child => 1,
        }
    }

    fn peer(self) -> Role {
        match self {
            Role::Parent => Role::Child,
            Role::Child => Role::Parent,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Role::Parent => "parent",
            Role::Child => "child",
        }
    }
}

/// What a message is; its index travels in the immediate data next to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    RcSend = 1,
    RcWrite = 2,
    UcSend = 3,
    UcWrite = 4,
    UdSend = 5,
}

impl Kind {
    fn imm(self, idx: usize) -> u32 {
        assert!(idx < 1 << 24);
        ((self as u32) << 24) | idx as u32
    }

    fn decode(imm: u32) -> Option<(Kind, usize)> {
        let kind = match imm >> 24 {
            1 => Kind::RcSend,
            2 => Kind::RcWrite,
            3 => Kind::UcSend,
            4 => Kind::UcWrite,
            5 => Kind::UdSend,
            _ => return None,
        };
        Some((kind, (imm & 0x00ff_ffff) as usize))
    }

    /// The length of message `idx` of this kind.
    fn len(self, idx: usize) -> usize {
        match self {
            Kind::RcSend => RC_SEND_SIZES[idx % RC_N],
            Kind::RcWrite => RC_WRITE_SIZES[idx % RC_N],
            Kind::UcSend | Kind::UcWrite => UC_SIZES[(idx / 2) % UC_SIZES.len()],
            Kind::UdSend => UD_SIZES[idx % UD_SIZES.len()],
        }
    }

    /// The kind of UC message `idx`.
    fn uc(idx: usize) -> Kind {
        if idx.is_multiple_of(2) {
            Kind::UcSend
        } else {
            Kind::UcWrite
        }
    }

    /// The completion opcode its arrival has.
    fn recv_opcode(self) -> WcOpcode {
        match self {
            Kind::RcWrite | Kind::UcWrite => WcOpcode::RecvRdmaWithImm,
            Kind::RcSend | Kind::UcSend | Kind::UdSend => WcOpcode::Recv,
        }
    }

    /// The completion opcode its sender sees.
    fn send_opcode(self) -> WcOpcode {
        match self {
            Kind::RcWrite | Kind::UcWrite => WcOpcode::RdmaWrite,
            Kind::RcSend | Kind::UcSend | Kind::UdSend => WcOpcode::Send,
        }
    }
}

/// Packets a message of `len` bytes takes.
fn packets(len: usize) -> u64 {
    len.div_ceil(MTU).max(1) as u64
}

/// The bytes of message `idx` of `kind` sent in direction `dir`.
fn pattern(seed: u64, dir: u8, kind: Kind, idx: usize, len: usize) -> Vec<u8> {
    let mut x = seed
        ^ (u64::from(dir) << 56)
        ^ ((kind as u64) << 48)
        ^ (idx as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut next = move || {
        // SplitMix64.
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&next().to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Asserts `got == want`, naming the first difference.
fn assert_bytes(what: &str, got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(g, w)| g != w) {
        let bad = got.iter().zip(want).filter(|(g, w)| g != w).count();
        let end = (i + 16).min(got.len());
        panic!(
            "{what}: {bad} of {} bytes differ, the first at offset {i}: got {:02x?}, want {:02x?}",
            got.len(),
            &got[i..end],
            &want[i..end]
        );
    }
}

/// The TCP connection to the other peer: one line per message.
struct Wire {
    me: Role,
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Wire {
    fn new(me: Role, stream: TcpStream) -> Wire {
        stream.set_nodelay(true).expect("TCP_NODELAY");
        stream.set_read_timeout(Some(STEP)).expect("a read timeout");
        stream
            .set_write_timeout(Some(STEP))
            .expect("a write timeout");
        let writer = stream
            .try_clone()
            .expect("a second handle on the connection");
        Wire {
            me,
            reader: BufReader::new(stream),
            writer,
        }
    }

    fn say(&mut self, line: &str) {
        writeln!(self.writer, "{line}")
            .and_then(|()| self.writer.flush())
            .unwrap_or_else(|e| panic!("{}: telling the peer {line:?}: {e}", self.me.name()));
    }

    fn hear(&mut self, what: &str) -> String {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => panic!(
                "{}: the peer closed the connection while we waited for {what}",
                self.me.name()
            ),
            Ok(_) => line.trim_end().to_string(),
            Err(e) => panic!(
                "{}: waiting for {what} from the peer (at most {STEP:?}): {e}",
                self.me.name()
            ),
        }
    }

    /// Both peers reach `tag` before either goes on.
    fn barrier(&mut self, tag: &str) {
        self.say(tag);
        let got = self.hear(tag);
        assert_eq!(got, tag, "{}: out of step with the peer", self.me.name());
    }

    /// Says `line` and hears the peer's line of the same `tag` (its first word).
    fn swap(&mut self, line: &str) -> String {
        let tag = line
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string();
        self.say(line);
        let got = self.hear(&tag);
        assert_eq!(
            got.split_whitespace().next(),
            Some(tag.as_str()),
            "{}: out of step with the peer: {got:?}",
            self.me.name()
        );
        got
    }
}

/// What one peer tells the other to connect to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Info {
    gid: [u8; 16],
    rc_qpn: u32,
    rc_psn: u32,
    uc_qpn: u32,
    uc_psn: u32,
    ud_qpn: u32,
    rc_addr: u64,
    rc_rkey: u32,
    uc_addr: u64,
    uc_rkey: u32,
}

impl Info {
    fn line(&self) -> String {
        let gid = self
            .gid
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>();
        format!(
            "info {gid} {:x} {:x} {:x} {:x} {:x} {:x} {:x} {:x} {:x}",
            self.rc_qpn,
            self.rc_psn,
            self.uc_qpn,
            self.uc_psn,
            self.ud_qpn,
            self.rc_addr,
            self.rc_rkey,
            self.uc_addr,
            self.uc_rkey
        )
    }

    fn parse(line: &str) -> Info {
        let f = line.split_whitespace().collect::<Vec<_>>();
        assert!(
            f.len() == 11 && f[0] == "info" && f[1].len() == 32,
            "a malformed info line: {line:?}"
        );
        let mut gid = [0u8; 16];
        for (i, b) in gid.iter_mut().enumerate() {
            *b = u8::from_str_radix(&f[1][2 * i..2 * i + 2], 16).expect("a hex GID");
        }
        let n = |i: usize| u64::from_str_radix(f[i], 16).expect("a hex number in the info line");
        let n32 = |i: usize| u32::try_from(n(i)).expect("a 32-bit number in the info line");
        Info {
            gid,
            rc_qpn: n32(2),
            rc_psn: n32(3),
            uc_qpn: n32(4),
            uc_psn: n32(5),
            ud_qpn: n32(6),
            rc_addr: n(7),
            rc_rkey: n32(8),
            uc_addr: n(9),
            uc_rkey: n32(10),
        }
    }
}

/// A successful completion, owned.
#[derive(Debug, Clone, Copy)]
struct Got {
    wr_id: u64,
    opcode: WcOpcode,
    byte_len: u32,
    imm: Option<u32>,
    src_qp: u32,
    grh: bool,
}

/// One QP's CQ (sends and receives) and what came out of it so far.
struct Queue {
    name: &'static str,
    cq: Arc<Cq>,
    sends: Vec<Got>,
    recvs: Vec<Got>,
}

impl Queue {
    fn new(name: &'static str, ctx: &Arc<Context>) -> Queue {
        Queue {
            name,
            cq: Cq::new(ctx, 1024, None).expect("a CQ"),
            sends: Vec::new(),
            recvs: Vec::new(),
        }
    }

    /// Takes in what the CQ holds; any failed completion fails the test.
    fn pump(&mut self, poller: &mut Poller) {
        let mut failed = Vec::new();
        let (sends, recvs) = (&mut self.sends, &mut self.recvs);
        poller
            .poll(&self.cq, 256, |c| match c.ok() {
                Ok(s) => {
                    let g = Got {
                        wr_id: s.wr_id(),
                        opcode: s.opcode().expect("a known completion opcode"),
                        byte_len: s.byte_len(),
                        imm: s.imm(),
                        src_qp: s.src_qp(),
                        grh: s.has_grh(),
                    };
                    match g.opcode {
                        WcOpcode::Send | WcOpcode::RdmaWrite => sends.push(g),
                        _ => recvs.push(g),
                    }
                }
                Err(f) => failed.push(format!(
                    "wr_id {} status {:?} (vendor error {})",
                    f.wr_id(),
                    f.status(),
                    f.vendor_err()
                )),
            })
            .unwrap_or_else(|e| panic!("polling the {} CQ: {e}", self.name));
        assert!(
            failed.is_empty(),
            "{} completions failed: {failed:?}",
            self.name
        );
    }

    /// Pumps until `sends` send and `recvs` receive completions have come (in total), or,
    /// with `give_up_at`, until then; panics at `deadline`.
    fn wait(
        &mut self,
        poller: &mut Poller,
        sends: usize,
        recvs: usize,
        give_up_at: Option<Instant>,
        deadline: Instant,
    ) {
        loop {
            self.pump(poller);
            if self.sends.len() >= sends && self.recvs.len() >= recvs {
                return;
            }
            let now = Instant::now();
            if give_up_at.is_some_and(|t| now >= t && self.sends.len() >= sends) {
                return;
            }
            assert!(
                now < deadline,
                "{}: timed out waiting for completions: {}/{sends} sends and {}/{recvs} receives",
                self.name,
                self.sends.len(),
                self.recvs.len()
            );
            thread::sleep(Duration::from_micros(200));
        }
    }
}

/// Everything one peer has once connected.
struct Peer {
    me: Role,
    seed: u64,
    loss: f64,
    wire: Wire,
    fabric: Fabric,
    ip: Ipv4Addr,
    peer_ip: Ipv4Addr,
    peer: Info,
    pd: Arc<Pd>,
    poller: Poller,
    rc: Qp<Rc, Rts>,
    uc: Qp<Uc, Rts>,
    ud: Qp<Ud, Rts>,
    rc_q: Queue,
    uc_q: Queue,
    ud_q: Queue,
    rc_recv: Arc<DmaBuf>,
    rc_write: Arc<DmaBuf>,
    uc_recv: Arc<DmaBuf>,
    uc_write: Arc<DmaBuf>,
    ud_recv: Arc<DmaBuf>,
    /// Data packets this peer's messages took (a lower bound of `packets_sent`).
    data_packets: u64,
}

/// Runs one peer over `stream` to the other; returns a one-line summary.
fn run_peer(me: Role, stream: TcpStream, loss: f64, seed: u64) -> String {
    let mut p = Peer::connect(me, stream, loss, seed);
    let rc_rounds = p.rc_phase();
    let (uc_got, uc_sent) = p.uc_phase();
    let (ud_got, ud_sent) = p.ud_phase();
    p.wire.barrier("traffic-done");
    let c = p.check_counters();
    p.wire.barrier("bye");
    format!(
        "{} {} <-> {} (loss {loss}): RC {rc_rounds} round(s) of {} messages each way, \
         UC {uc_got}/{uc_sent} and UD {ud_got}/{ud_sent} received; soft0 sent {} packets, \
         received {}, dropped {}, retransmitted {} ({} timeouts, {} sequence NAKs received)",
        me.name(),
        p.ip,
        p.peer_ip,
        2 * RC_N,
        c.packets_sent,
        c.packets_received,
        c.packets_dropped,
        c.retransmits,
        c.timeouts,
        c.seq_naks_received
    )
}

impl Peer {
    /// Builds this side's fabric and QPs, swaps [`Info`] with the peer, and brings every QP
    /// to RTS.
    fn connect(me: Role, stream: TcpStream, loss: f64, seed: u64) -> Peer {
        let mut wire = Wire::new(me, stream);
        let fabric = Fabric::try_new(udp_config(None, seed.wrapping_add(u64::from(me.dir()))))
            .unwrap_or_else(|e| panic!("{}: a UDP fabric: {e}", me.name()));
        if loss > 0.0 {
            fabric
                .set_default_faults(Faults {
                    loss,
                    ..Faults::NONE
                })
                .unwrap();
        }
        let ip = fabric.udp_addr("soft0").expect("soft0 is on the UDP link");
        let gid = fabric.gid("soft0").expect("soft0 has a GID");
        assert_eq!(
            gid,
            ip.to_ipv6_mapped().octets(),
            "the GID is the IPv4-mapped address"
        );
        assert_eq!(ip.octets()[..3], [127, 0, 0], "a loopback address: {ip}");

        let verbs = Verbs::soft(&fabric);
        let ctx = Context::open_by_name(&verbs, "soft0").expect("soft0 opens");
        // The GID table, as rxe's: the link-local GID, then the IPv4-mapped one.
        assert_eq!(
            ctx.query_gid(1, 0).expect("GID 0 of port 1"),
            Gid(softnic::roce::link_local_gid(ip))
        );
        assert_eq!(ctx.query_gid(1, 1).expect("GID 1 of port 1"), Gid(gid));
        let pd = ctx.alloc_pd().expect("a PD");
        let (rc_q, uc_q, ud_q) = (
            Queue::new("RC", &ctx),
            Queue::new("UC", &ctx),
            Queue::new("UD", &ctx),
        );
        fn init(q: &Queue) -> QpInit<'_> {
            QpInit {
                send_cq: &q.cq,
                recv_cq: &q.cq,
                srq: None,
                caps: QpCaps::default(),
                sig_all: true,
            }
        }
        let rc = Qp::<Rc, _>::new(&pd, init(&rc_q)).expect("an RC QP");
        let uc = Qp::<Uc, _>::new(&pd, init(&uc_q)).expect("a UC QP");
        let ud = Qp::<Ud, _>::new(&pd, init(&ud_q)).expect("a UD QP");

        let local = AccessFlags::LOCAL_WRITE;
        let writable = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let dma = |len: usize, access| Arc::new(pd.alloc_dma(len, 64, access).expect("a region"));
        let rc_recv = dma(2 * RC_N * RC_SLOT, local);
        let rc_write = dma(RC_N * RC_SLOT, writable);
        let uc_recv = dma(UC_MSGS * UC_SLOT, local);
        let uc_write = dma(UC_MSGS * UC_SLOT, writable);
        let ud_recv = dma(UD_MSGS * UD_SLOT, local);

        // PSNs just below the 24-bit wrap, so that the connected transfers cross it.
        let info = Info {
            gid,
            rc_qpn: rc.qpn(),
            rc_psn: 0x00ff_fff0 + u32::from(me.dir()),
            uc_qpn: uc.qpn(),
            uc_psn: 0x00ff_fffa - u32::from(me.dir()),
            ud_qpn: ud.qpn(),
            rc_addr: rc_write.addr(),
            rc_rkey: rc_write.rkey(),
            uc_addr: uc_write.addr(),
            uc_rkey: uc_write.rkey(),
        };
        let peer = Info::parse(&wire.swap(&info.line()));
        let peer_ip = Ipv4Addr::from(<[u8; 4]>::try_from(&peer.gid[12..]).expect("four bytes"));
        assert_eq!(
            peer.gid,
            peer_ip.to_ipv6_mapped().octets(),
            "the peer's GID is IPv4-mapped"
        );
        assert_ne!(
            peer_ip, ip,
            "the two processes' devices have their own addresses"
        );

        let remote = |qpn, psn| Remote {
            qpn,
            psn,
            lid: 0,
            gid: Some(Gid(peer.gid)),
        };
        let access = ConnInit::with_access(AccessFlags::REMOTE_WRITE);
        let rc = rc
            .init(access)
            .expect("RC to INIT")
            .rtr(RcRtr {
                path_mtu: Mtu::Mtu4096,
                ..RcRtr::new(remote(peer.rc_qpn, peer.rc_psn), FROM)
            })
            .expect("RC to RTR")
            .rts(RcRts::new(info.rc_psn))
            .expect("RC to RTS");
        let uc = uc
            .init(access)
            .expect("UC to INIT")
            .rtr(UcRtr {
                path_mtu: Mtu::Mtu4096,
                ..UcRtr::new(remote(peer.uc_qpn, peer.uc_psn), FROM)
            })
            .expect("UC to RTR")
            .rts(SqPsn(info.uc_psn))
            .expect("UC to RTS");
        let ud = ud
            .init(UdInit::new(QKEY))
            .expect("UD to INIT")
            .rtr(UdRtr)
            .expect("UD to RTR")
            .rts(SqPsn(0x1000 * u32::from(me.dir())))
            .expect("UD to RTS");
        wire.barrier("rts");
        Peer {
            me,
            seed,
            loss,
            wire,
            fabric,
            ip,
            peer_ip,
            peer,
            pd,
            poller: Poller::new(),
            rc,
            uc,
            ud,
            rc_q,
            uc_q,
            ud_q,
            rc_recv,
            rc_write,
            uc_recv,
            uc_write,
            ud_recv,
            data_packets: 0,
        }
    }

    fn name(&self) -> &'static str {
        self.me.name()
    }

    /// A registered copy of message `idx` of `kind` in this peer's direction.
    fn source(&mut self, kind: Kind, idx: usize) -> (Arc<MrBuf>, u32) {
        let len = kind.len(idx);
        let mut buf = self
            .pd
            .alloc_mr(len, 64, AccessFlags::empty())
            .expect("a send buffer");
        buf.as_mut_slice()
            .copy_from_slice(&pattern(self.seed, self.me.dir(), kind, idx, len));
        self.data_packets += packets(len);
        (Arc::new(buf), len as u32)
    }

    /// Checks an arrived message against what the peer sent as message `idx` of `kind`.
    fn check_data(&self, what: &str, kind: Kind, idx: usize, got: &Got) {
        let len = kind.len(idx);
        let want = pattern(self.seed, self.me.peer().dir(), kind, idx, len);
        assert_eq!(got.opcode, kind.recv_opcode(), "{what}: opcode");
        let mut data = vec![0u8; len];
        match kind {
            Kind::RcSend => {
                assert_eq!(got.byte_len as usize, len, "{what}: length");
                self.rc_recv
                    .read_at(got.wr_id as usize * RC_SLOT, &mut data)
                    .expect("inside the region");
            }
            Kind::RcWrite => {
                assert_eq!(got.byte_len as usize, len, "{what}: length");
                self.rc_write
                    .read_at((idx % RC_N) * RC_SLOT, &mut data)
                    .expect("inside the region");
            }
            Kind::UcSend => {
                assert_eq!(got.byte_len as usize, len, "{what}: length");
                self.uc_recv
                    .read_at(got.wr_id as usize * UC_SLOT, &mut data)
                    .expect("inside the region");
            }
            Kind::UcWrite => {
                assert_eq!(got.byte_len as usize, len, "{what}: length");
                self.uc_write
                    .read_at(idx * UC_SLOT, &mut data)
                    .expect("inside the region");
            }
            Kind::UdSend => {
                assert_eq!(
                    got.byte_len as usize,
                    GRH + len,
                    "{what}: length (GRH included)"
                );
                assert!(got.grh, "{what}: a UD receive has a GRH");
                assert_eq!(got.src_qp, self.peer.ud_qpn, "{what}: source QPN");
                let at = got.wr_id as usize * UD_SLOT;
                let mut grh = [0u8; GRH];
                self.ud_recv
                    .read_at(at, &mut grh)
                    .expect("inside the region");
                // RoCEv2 over IPv4: 20 bytes of zeros, then the IPv4 header it came under.
                assert_eq!(
                    grh[..20],
                    [0; 20],
                    "{what}: GRH of an IPv4 packet: {grh:02x?}"
                );
                assert_eq!(grh[20], 0x45, "{what}: IPv4 version and length: {grh:02x?}");
                assert_eq!(grh[29], 17, "{what}: UDP inside: {grh:02x?}");
                assert_eq!(grh[32..36], self.peer_ip.octets(), "{what}: source address");
                assert_eq!(grh[36..40], self.ip.octets(), "{what}: destination address");
                self.ud_recv
                    .read_at(at + GRH, &mut data)
                    .expect("inside the region");
            }
        }
        assert_bytes(what, &data, &want);
    }

    /// RC: rounds of `RC_N` SENDs and `RC_N` WRITEs with immediate each way, interleaved, all
    /// delivered in order and byte-exact. With loss, rounds repeat until both sides saw a drop
    /// and a retransmission. Returns the rounds run.
    fn rc_phase(&mut self) -> usize {
        let per_round = 2 * RC_N;
        for round in 0..RC_MAX_ROUNDS {
            let (s0, r0) = (self.rc_q.sends.len(), self.rc_q.recvs.len());
            let mut recvs = (0..per_round)
                .map(|k| RecvWr::new(k as u64).dma_buf(&self.rc_recv, k * RC_SLOT, RC_SLOT as u32))
                .collect::<Vec<_>>();
            self.rc
                .post_recv_bufs(&mut recvs)
                .expect("posting RC receives");
            self.wire.barrier(&format!("rc-posted {round}"));

            // The k-th operation of the round: SEND j for even k, WRITE j for odd k.
            let op = |k: usize| {
                let idx = round * RC_N + k / 2;
                let kind = if k.is_multiple_of(2) {
                    Kind::RcSend
                } else {
                    Kind::RcWrite
                };
                (kind, idx)
            };
            let mut wrs = Vec::with_capacity(per_round);
            for k in 0..per_round {
                let (kind, idx) = op(k);
                let (buf, len) = self.source(kind, idx);
                let sendop = match kind {
                    Kind::RcSend => SendOp::SendWithImm(kind.imm(idx)),
                    _ => SendOp::WriteWithImm {
                        remote_addr: self.peer.rc_addr + ((idx % RC_N) * RC_SLOT) as u64,
                        rkey: self.peer.rc_rkey,
                        imm: kind.imm(idx),
                    },
                };
                wrs.push(SendWr::new(k as u64, sendop).buf(&buf, 0, len));
            }
            self.rc.post_send_bufs(&mut wrs).expect("posting RC sends");
            drop(wrs);

            let deadline = Instant::now() + STEP;
            self.rc_q.wait(
                &mut self.poller,
                s0 + per_round,
                r0 + per_round,
                None,
                deadline,
            );
            assert_eq!(
                self.rc_q.sends.len(),
                s0 + per_round,
                "RC: extra send completions"
            );
            assert_eq!(
                self.rc_q.recvs.len(),
                r0 + per_round,
                "RC: extra receive completions"
            );
            for k in 0..per_round {
                let (kind, idx) = op(k);
                let s = self.rc_q.sends[s0 + k];
                assert_eq!(
                    (s.wr_id, s.opcode),
                    (k as u64, kind.send_opcode()),
                    "RC round {round}: send completions in posting order"
                );
                let r = self.rc_q.recvs[r0 + k];
                let what = format!(
                    "{}: RC round {round} arrival {k} ({kind:?} {idx})",
                    self.name()
                );
                assert_eq!(r.wr_id, k as u64, "{what}: receive WQEs are taken in order");
                assert_eq!(
                    r.imm,
                    Some(kind.imm(idx)),
                    "{what}: in order, with its immediate"
                );
                self.check_data(&what, kind, idx, &r);
            }

            let c = self.counters();
            let line = self.wire.swap(&format!(
                "rc-done {round} {} {}",
                c.packets_dropped, c.retransmits
            ));
            let f = line.split_whitespace().collect::<Vec<_>>();
            assert_eq!(
                f.get(1),
                Some(&round.to_string().as_str()),
                "out of step: {line:?}"
            );
            let n = |i: usize| {
                f.get(i)
                    .and_then(|s| s.parse::<u64>().ok())
                    .expect("a count")
            };
            let (peer_dropped, peer_retransmits) = (n(2), n(3));
            // Without loss one round does; with loss, until both sides have lost a packet and
            // retransmitted (both sides decide alike from the same four numbers).
            let seen = |dropped: u64, retransmits: u64| dropped > 0 && retransmits > 0;
            if self.loss == 0.0
                || (seen(c.packets_dropped, c.retransmits) && seen(peer_dropped, peer_retransmits))
            {
                return round + 1;
            }
        }
        RC_MAX_ROUNDS
    }

    /// UC: windows of SENDs and WRITEs with immediate each way. Returns (messages received,
    /// messages the peer sent).
    fn uc_phase(&mut self) -> (usize, usize) {
        let mut seen = BTreeSet::new();
        let mut last: Option<usize> = None;
        let mut checked = 0;
        let mut peer_sent = 0;
        for round in 0..UC_ROUNDS {
            // Lost messages of earlier windows never come: count this window from what did.
            let before = self.uc_q.recvs.len();
            let first = round * UC_WINDOW;
            let msgs = first..first + UC_WINDOW;
            let mut recvs = msgs
                .clone()
                .map(|i| RecvWr::new(i as u64).dma_buf(&self.uc_recv, i * UC_SLOT, UC_SLOT as u32))
                .collect::<Vec<_>>();
            self.uc
                .post_recv_bufs(&mut recvs)
                .expect("posting UC receives");
            self.wire.barrier(&format!("uc-posted {round}"));

            let mut wrs = Vec::with_capacity(UC_WINDOW);
            for idx in msgs.clone() {
                let kind = Kind::uc(idx);
                let (buf, len) = self.source(kind, idx);
                let sendop = match kind {
                    Kind::UcSend => SendOp::SendWithImm(kind.imm(idx)),
                    _ => SendOp::WriteWithImm {
                        remote_addr: self.peer.uc_addr + (idx * UC_SLOT) as u64,
                        rkey: self.peer.uc_rkey,
                        imm: kind.imm(idx),
                    },
                };
                wrs.push(SendWr::new(idx as u64, sendop).buf(&buf, 0, len));
            }
            self.uc.post_send_bufs(&mut wrs).expect("posting UC sends");
            drop(wrs);
            peer_sent += self.window_sent(Transport::Uc, round, UC_WINDOW);
            self.collect_window(Transport::Uc, before + UC_WINDOW);

            // Every message that came is one the peer sent, once, in order, byte-exact.
            while checked < self.uc_q.recvs.len() {
                let r = self.uc_q.recvs[checked];
                checked += 1;
                let (kind, idx) = decode(&r, "UC");
                let what = format!("{}: UC message {idx} ({kind:?})", self.name());
                assert!(
                    matches!(kind, Kind::UcSend | Kind::UcWrite),
                    "{what}: a UC kind"
                );
                assert_eq!(kind, Kind::uc(idx), "{what}: its kind");
                assert!(
                    idx < peer_sent,
                    "{what}: one the peer sent ({peer_sent} so far)"
                );
                assert!(seen.insert(idx), "{what}: arrived twice");
                assert!(
                    last.is_none_or(|l| idx > l),
                    "{what}: after {last:?}, out of order"
                );
                last = Some(idx);
                self.check_data(&what, kind, idx, &r);
            }
        }
        for (i, s) in self.uc_q.sends.iter().enumerate() {
            assert_eq!(
                (s.wr_id, s.opcode),
                (i as u64, Kind::uc(i).send_opcode()),
                "UC send completions in posting order"
            );
        }
        self.judge("UC", seen.len(), peer_sent);
        (seen.len(), peer_sent)
    }

    /// UD: windows of SENDs each way, through an address handle towards the peer's GID.
    /// Returns (messages received, messages the peer sent).
    fn ud_phase(&mut self) -> (usize, usize) {
        let ah = self
            .pd
            .create_ah(FROM, 0, Some(Gid(self.peer.gid)))
            .expect("an address handle towards the peer");
        let mut seen = BTreeSet::new();
        let mut checked = 0;
        let mut peer_sent = 0;
        for round in 0..UD_ROUNDS {
            let before = self.ud_q.recvs.len();
            let first = round * UD_WINDOW;
            let msgs = first..first + UD_WINDOW;
            let mut recvs = msgs
                .clone()
                .map(|i| RecvWr::new(i as u64).dma_buf(&self.ud_recv, i * UD_SLOT, UD_SLOT as u32))
                .collect::<Vec<_>>();
            self.ud
                .post_recv_bufs(&mut recvs)
                .expect("posting UD receives");
            self.wire.barrier(&format!("ud-posted {round}"));

            let mut wrs = Vec::with_capacity(UD_WINDOW);
            for idx in msgs.clone() {
                let (buf, len) = self.source(Kind::UdSend, idx);
                wrs.push(
                    UdSendWr::new(idx as u64, &ah, self.peer.ud_qpn, QKEY)
                        .imm(Kind::UdSend.imm(idx))
                        .buf(&buf, 0, len),
                );
            }
            self.ud.post_send_bufs(&mut wrs).expect("posting UD sends");
            drop(wrs);
            peer_sent += self.window_sent(Transport::Ud, round, UD_WINDOW);
            self.collect_window(Transport::Ud, before + UD_WINDOW);

            while checked < self.ud_q.recvs.len() {
                let r = self.ud_q.recvs[checked];
                checked += 1;
                let (kind, idx) = decode(&r, "UD");
                let what = format!("{}: UD message {idx}", self.name());
                assert_eq!(kind, Kind::UdSend, "{what}: a UD kind");
                assert!(
                    idx < peer_sent,
                    "{what}: one the peer sent ({peer_sent} so far)"
                );
                assert!(seen.insert(idx), "{what}: arrived twice");
                self.check_data(&what, kind, idx, &r);
            }
        }
        for (i, s) in self.ud_q.sends.iter().enumerate() {
            assert_eq!(
                (s.wr_id, s.opcode),
                (i as u64, WcOpcode::Send),
                "UD send completions in posting order"
            );
        }
        self.judge("UD", seen.len(), peer_sent);
        (seen.len(), peer_sent)
    }

    /// Waits for this window's send completions, then tells the peer how many left and
    /// hears how many it sent.
    fn window_sent(&mut self, t: Transport, round: usize, window: usize) -> usize {
        let (q, tag) = match t {
            Transport::Uc => (&mut self.uc_q, "uc"),
            Transport::Ud => (&mut self.ud_q, "ud"),
        };
        let want = (round + 1) * window;
        q.wait(&mut self.poller, want, 0, None, Instant::now() + STEP);
        assert_eq!(q.sends.len(), want, "{tag}: extra send completions");
        let line = self.wire.swap(&format!("{tag}-sent {round} {window}"));
        assert_eq!(
            line,
            format!("{tag}-sent {round} {window}"),
            "out of step with the peer"
        );
        window
    }

    /// Waits for a window of the peer's messages, until `total` arrivals in all: every one
    /// without loss (or fails); with loss, until they are there or [`GRACE`] has passed.
    fn collect_window(&mut self, t: Transport, total: usize) {
        let q = match t {
            Transport::Uc => &mut self.uc_q,
            Transport::Ud => &mut self.ud_q,
        };
        let give_up = (self.loss > 0.0).then(|| Instant::now() + GRACE);
        let sends = q.sends.len();
        q.wait(
            &mut self.poller,
            sends,
            total,
            give_up,
            Instant::now() + STEP,
        );
    }

    /// The UC/UD verdict: all arrived without loss; with loss, at most all and most.
    fn judge(&self, what: &str, got: usize, sent: usize) {
        assert!(
            got <= sent,
            "{}: {what}: {got} received of {sent} sent",
            self.name()
        );
        if self.loss == 0.0 {
            assert_eq!(
                got,
                sent,
                "{}: {what}: without loss all arrive",
                self.name()
            );
        } else {
            assert!(
                got >= sent / 2,
                "{}: {what}: only {got} of {sent} arrived at {} loss: is the link broken?",
                self.name(),
                self.loss
            );
        }
    }

    fn counters(&self) -> Counters {
        self.fabric
            .device_counters("soft0")
            .expect("soft0's counters")
    }

    /// The device counters agree with what went over the link.
    fn check_counters(&mut self) -> Counters {
        let c = self.counters();
        let who = self.name();
        // Nothing is in flight any more: what arrived here is at most what the peer's fabric
        // sent and did not drop (no fault duplicates).
        let line = self.wire.swap(&format!(
            "counters {} {}",
            c.packets_sent, c.packets_dropped
        ));
        let f = line.split_whitespace().collect::<Vec<_>>();
        let n = |i: usize| {
            f.get(i)
                .and_then(|s| s.parse::<u64>().ok())
                .expect("a count")
        };
        let (peer_sent, peer_dropped) = (n(1), n(2));
        assert!(
            c.packets_received + c.icrc_errors + c.malformed <= peer_sent - peer_dropped,
            "{who}: {} packets arrived, the peer sent {peer_sent} and dropped {peer_dropped}: {c:?}",
            c.packets_received
        );
        assert_eq!(
            self.fabric.broken(),
            None,
            "{who}: the fabric is not broken"
        );
        assert!(
            c.packets_sent >= self.data_packets,
            "{who}: {} packets sent, the messages alone take {}: {c:?}",
            c.packets_sent,
            self.data_packets
        );
        assert_eq!(
            c.icrc_errors, 0,
            "{who}: no ICRC error on the real link: {c:?}"
        );
        assert_eq!(c.malformed, 0, "{who}: nothing malformed: {c:?}");
        assert!(c.packets_received > 0, "{who}: packets arrived: {c:?}");
        if self.loss == 0.0 {
            assert_eq!(
                c.packets_dropped, 0,
                "{who}: nothing dropped without loss: {c:?}"
            );
            assert_eq!(c.messages_dropped, 0, "{who}: no message dropped: {c:?}");
            // The peer's messages are the same sizes as ours, and all arrived.
            assert!(
                c.packets_received >= self.data_packets,
                "{who}: {} packets received, the peer's messages alone take {}: {c:?}",
                c.packets_received,
                self.data_packets
            );
        } else {
            assert!(
                c.packets_dropped > 0,
                "{who}: the injected loss dropped packets: {c:?}"
            );
            assert!(
                c.retransmits > 0,
                "{who}: RC retransmitted after {RC_MAX_ROUNDS} rounds with loss: {c:?}"
            );
        }
        c
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Uc,
    Ud,
}

/// The kind and index an arrival carries in its immediate.
fn decode(r: &Got, what: &str) -> (Kind, usize) {
    let imm = r
        .imm
        .unwrap_or_else(|| panic!("{what}: an arrival without its immediate: {r:?}"));
    Kind::decode(imm).unwrap_or_else(|| panic!("{what}: an unknown immediate {imm:#x}: {r:?}"))
}
