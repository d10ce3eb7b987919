//! Unmodified rdma_cm programs (rdma-core's rdmacm-utils) connect over softnic: a server and a
//! client process, each on softnic's libibverbs and librdmacm (both built by cargo for this
//! test, in the directory of its binary), talking RoCEv2 over UDP on loopback addresses.
//! A program that is not installed is skipped, saying so.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A directory where `libibverbs.so.1` and `librdmacm.so.1` are softnic's.
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("this test binary");
    let deps = exe.parent().expect("deps/").to_path_buf();
    // One per test: under `cargo test` the tests are threads of one process.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = deps.join(format!("softnic-rdmacm-test-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory for the links");
    for (name, target) in [
        ("libibverbs.so.1", "libibverbs.so"),
        ("librdmacm.so.1", "librdmacm.so"),
    ] {
        let built = deps.join(target);
        assert!(built.exists(), "{} was not built", built.display());
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&built, &link).expect("linking the library");
    }
    dir
}

fn installed(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| Path::new(&d).join(program).is_file()))
}

/// Whether an rdmacm-utils program is installed (saying the test is skipped when not).
fn have(program: &str) -> bool {
    let there = installed(program);
    if !there {
        eprintln!("skipped: {program} is not installed (apt-get install rdmacm-utils)");
    }
    there
}

/// Starts `args` on softnic with its device on `addr`, and `env` set.
fn start(lib: &Path, addr: &str, args: &[&str], env: &[(&str, &str)]) -> Child {
    Command::new(args[0])
        .args(&args[1..])
        .env("LD_LIBRARY_PATH", lib)
        .env("SOFTNIC_ADDR", addr)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", args[0]))
}

/// Waits for `child` (killed at `deadline`): whether it succeeded, and what it said.
fn finish(mut child: Child, deadline: Instant) -> (bool, String) {
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
    (out.status.success(), text)
}

/// Held by the tests that use 127.0.0.1 (a device there, or a client of the host's listeners
/// there), which take turns: a device at 127.0.0.1 is where requests to it go. (Under
/// nextest, whose tests are processes, `.config/nextest.toml` puts them in one group.)
fn localhost() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs a server and then a client; both must succeed. Returns their output.
fn pair(server: &[&str], client: &[&str], addrs: [&str; 2]) -> Option<(String, String)> {
    pair_with(server, client, addrs, &[])
}

/// [`pair`], both with `env` set.
fn pair_with(
    server: &[&str],
    client: &[&str],
    addrs: [&str; 2],
    env: &[(&str, &str)],
) -> Option<(String, String)> {
    if !have(server[0]) {
        return None;
    }
    let lib = library_dir();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut s = start(&lib, addrs[0], server, env);
    // A client that comes before the server listens is rejected (or, before its device is
    // up, sends its REQ again two seconds later): started again when rejected, and so is the
    // server, which may be half-way through a session with the client that gave up (perftest
    // connects twice, and a server that has taken the first connection takes the next
    // client's as the second: its QP has no receives, and that client's first SEND gets RNR
    // NAKs for ever).
    let (c_ok, c_text) = loop {
        std::thread::sleep(Duration::from_millis(300));
        let (ok, text) = finish(start(&lib, addrs[1], client, env), deadline);
        let early = ["REJECTED", "rejected", "refused"];
        if ok || !early.iter().any(|w| text.contains(w)) || Instant::now() > deadline {
            break (ok, text);
        }
        let _ = s.kill();
        let _ = s.wait();
        s = start(&lib, addrs[0], server, env);
    };
    let (s_ok, s_text) = finish(s, deadline);
    let _ = std::fs::remove_dir_all(&lib);
    assert!(
        c_ok,
        "client {client:?} failed:\n{c_text}\nserver said:\n{s_text}"
    );
    assert!(
        s_ok,
        "server {server:?} failed:\n{s_text}\nclient said:\n{c_text}"
    );
    Some((s_text, c_text))
}

#[test]
fn rping_verifies_its_data() {
    let Some((s, c)) = pair(
        &["rping", "-s", "-a", "127.0.26.1", "-C", "20", "-v"],
        &["rping", "-c", "-a", "127.0.26.1", "-C", "20", "-v"],
        ["127.0.26.1", "127.0.26.2"],
    ) else {
        return;
    };
    assert_eq!(c.matches("ping data: rdma-ping-").count(), 20, "{c}");
    assert!(s.contains("server ping data: rdma-ping-19"), "{s}");
}

/// A server bound to the any address is reached at 127.0.0.1, as on a kernel, whose
/// processes share the host's devices (each softnic process has its own: the listener is
/// announced to the host). It was ADDR_RESOLVED, then UNREACHABLE after the REQ's timeouts.
#[test]
fn rping_reaches_a_server_on_the_host_at_127_0_0_1() {
    let _turn = localhost();
    let Some((s, c)) = pair(
        &["rping", "-s", "-p", "47174", "-C", "5", "-v"],
        &[
            "rping",
            "-c",
            "-a",
            "127.0.0.1",
            "-p",
            "47174",
            "-C",
            "5",
            "-v",
        ],
        ["127.0.62.3", "127.0.62.4"],
    ) else {
        return;
    };
    assert_eq!(c.matches("ping data: rdma-ping-").count(), 5, "{c}");
    assert!(s.contains("server ping data: rdma-ping-4"), "{s}");
}

#[test]
fn ucmatose_connects_several_rc_connections() {
    pair(
        &["ucmatose", "-b", "127.0.26.3", "-c", "8", "-C", "10"],
        &["ucmatose", "-s", "127.0.26.3", "-c", "8", "-C", "10"],
        ["127.0.26.3", "127.0.26.4"],
    );
}

#[test]
fn udaddy_resolves_ud_services() {
    pair(
        &["udaddy", "-b", "127.0.26.5", "-c", "4", "-C", "10"],
        &["udaddy", "-s", "127.0.26.5", "-c", "4", "-C", "10"],
        ["127.0.26.5", "127.0.26.6"],
    );
}

/// Two ids a side: the server's join the group and receive; the client's join to send only
/// (`-o`: their QPs not attached) and send to it 3 s after (mckey's pause).
#[test]
fn mckey_sends_to_a_multicast_group() {
    let Some((s, _)) = pair(
        &[
            "mckey",
            "-m",
            "239.1.26.7",
            "-b",
            "127.0.26.15",
            "-c",
            "2",
            "-C",
            "10",
        ],
        &[
            "mckey",
            "-m",
            "239.1.26.7",
            "-s",
            "-o",
            "-c",
            "2",
            "-C",
            "10",
        ],
        ["127.0.26.15", "127.0.26.16"],
    ) else {
        return;
    };
    assert_eq!(
        s.matches("joined dgid: ::ffff:239.1.26.7").count(),
        2,
        "{s}"
    );
}

#[test]
fn rdma_server_and_client_use_synchronous_endpoints() {
    let Some((s, c)) = pair(
        &["rdma_server", "-s", "127.0.26.7", "-p", "7471"],
        &["rdma_client", "-s", "127.0.26.7", "-p", "7471"],
        ["127.0.26.7", "127.0.26.8"],
    ) else {
        return;
    };
    assert!(s.contains("rdma_server: end 0"), "{s}");
    assert!(c.contains("rdma_client: end 0"), "{c}");
}

/// rdmacm-utils' XRC example: the server's endpoint on `RDMA_PS_IB` takes `XRC_RECV` requests
/// (the id's XRC SRQ and target QP in librdmacm's default XRC domain, the SRQ's number in the
/// accept's private data), the client's an `XRC_SEND` QP that sends into that SRQ. And the
/// same two programs over RC.
#[test]
fn rdma_xserver_and_xclient_connect_over_xrc_and_rc() {
    for (mode, port) in [("x", "7473"), ("r", "7474")] {
        let Some((s, c)) = pair(
            &["rdma_xserver", "-c", mode, "-p", port],
            &["rdma_xclient", "-s", "127.0.26.61", "-c", mode, "-p", port],
            ["127.0.26.61", "127.0.26.62"],
        ) else {
            return;
        };
        assert!(s.contains("rdma_xserver: end 0"), "-c {mode}: {s}");
        assert!(c.contains("rdma_xclient: end 0"), "-c {mode}: {c}");
    }
}

#[test]
fn perftest_connects_with_rdma_cm() {
    let Some((_, c)) = pair(
        &["ib_write_bw", "-R", "-n", "100"],
        &["ib_write_bw", "-R", "-n", "100", "127.0.26.9"],
        ["127.0.26.9", "127.0.26.10"],
    ) else {
        return;
    };
    assert!(c.contains("#bytes"), "{c}");
}

/// libfabric's verbs provider finds the device among the host's interface addresses: the
/// server's device is the loopback interface's 127.0.0.1.
#[test]
fn fi_pingpong_runs_over_libfabric_s_verbs_provider_on_rc_and_xrc() {
    let _turn = localhost();
    let args = [
        "fi_pingpong",
        "-p",
        "verbs",
        "-e",
        "msg",
        "-I",
        "50",
        "-S",
        "1024",
        "-c",
    ];
    let mut client = args.to_vec();
    client.push("127.0.0.1");
    let Some((_, c)) = pair(&args, &client, ["127.0.0.1", "127.0.26.11"]) else {
        return;
    };
    assert!(c.contains("1k"), "{c}");

    // The reliable datagram endpoint (`ofi_rxm`) over XRC connections (the verbs provider's
    // XRC domain, with a shared receive context): each side's initiator QP reaches the
    // other's XRC SRQ through its target QP, made with `rdma_create_qp_ex` (an XRC target: no
    // CQs) on the id of a connection that is disconnected once both directions are up. The
    // target QP, taken off its id (`id->qp = NULL`), outlives that disconnect.
    let mut xrc = args.to_vec();
    xrc[4] = "rdm";
    xrc[8] = "70000";
    let mut client = xrc.clone();
    client.push("127.0.0.1");
    let env = [
        ("FI_VERBS_PREFER_XRC", "1"),
        ("FI_OFI_RXM_USE_SRX", "1"),
        ("FI_LOG_LEVEL", "info"),
    ];
    let Some((s, c)) = pair_with(&xrc, &client, ["127.0.0.1", "127.0.26.11"], &env) else {
        return;
    };
    for text in [&s, &c] {
        assert!(text.contains("domain: soft0-xrc"), "not on XRC:\n{text}");
        assert!(text.contains("TGT Connection Done"), "{text}");
    }
    assert!(c.contains("=50"), "{c}");
}

/// `tests/c/<name>.c`, built with the system's C compiler into `lib` (`None`, saying so,
/// without a compiler or librdmacm's headers).
fn build_c(lib: &Path, name: &str) -> Option<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    if !installed("cc") || !Path::new("/usr/include/rdma/rdma_cma.h").exists() {
        eprintln!(
            "skipped: no C compiler or no <rdma/rdma_cma.h> (apt-get install gcc librdmacm-dev)"
        );
        return None;
    }
    let exe = lib.join(name);
    let built = Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .args(["-lrdmacm", "-libverbs", "-lpthread"])
        .output()
        .expect("running cc");
    assert!(
        built.status.success(),
        "cc {}: {}",
        src.display(),
        String::from_utf8_lossy(&built.stderr)
    );
    Some(exe.to_str().expect("a UTF-8 path").to_string())
}

/// A program's threads call on one synchronous id at once: while `rdma_connect` waits for its
/// event (the listener, in the same process, holds the request unanswered), the other
/// thread's calls on that id return; the rejection then ends the wait with ECONNREFUSED.
#[test]
fn calls_on_an_id_go_on_while_a_synchronous_call_on_it_waits() {
    says_ok("turns", &["127.0.26.13"], false);
}

/// Two ports of 127.0.0.1 served by datagram rsockets of two processes (two devices), asked in
/// turn by a third over one socket (`tests/c/hostports.c`): each port's datagrams go to its
/// own device and its answers come from 127.0.0.1 and that port (a first version sent the
/// second port's to the first device, whose AH the host's address had).
#[test]
fn two_ports_of_127_0_0_1_on_two_devices_are_two_peers() {
    let lib = library_dir();
    let Some(exe) = build_c(&lib, "hostports") else {
        return;
    };
    let _turn = localhost();
    let deadline = Instant::now() + Duration::from_secs(60);
    let servers = [("127.0.62.5", "47181", "A"), ("127.0.62.6", "47182", "B")]
        .map(|(addr, port, tag)| start(&lib, addr, &[&exe, "serve", port, tag], &[]));
    // The servers listen at once; the client's first datagram waits for their SIDR answer.
    std::thread::sleep(Duration::from_millis(500));
    let ask = [&exe, "ask", "47181", "A", "47182", "B"];
    let (ok, text) = finish(start(&lib, "127.0.62.7", &ask, &[]), deadline);
    let said: Vec<(bool, String)> = servers.into_iter().map(|s| finish(s, deadline)).collect();
    let _ = std::fs::remove_dir_all(&lib);
    assert!(
        ok && text.contains("ok"),
        "client: {text}
servers: {said:?}"
    );
    for (ok, text) in said {
        assert!(ok && text.contains("ok"), "server: {text}");
    }
}

/// rdma_cm across a fork (`tests/c/forked.c`): a child forked after its parent connected
/// makes ids of its own (its own device, at another address) and connects to its parent's
/// listener; its exit ends its own connection and none of its parent's, which still carries
/// a message after the child is gone. Its parent's rsockets are not its own (EBADF); a
/// datagram rsocket of its own exchanges datagrams with its parent's, each process's port
/// answered by its own SIDR service.
#[test]
fn a_forked_child_connects_with_ids_of_its_own() {
    says_ok("forked", &["127.0.26.71"], false);
}

/// An event taken before its id is destroyed names a live id until it is acked (the thread
/// taking events may be reading the id while another destroys it). Under valgrind when it is
/// installed, which reports a read of the freed id.
#[test]
fn an_event_names_a_live_id_until_it_is_acked() {
    turns_under_valgrind("127.0.26.14", "late-ack");
}

/// A thread that calls `rdma_get_cm_event` on a channel another thread has just destroyed
/// waits (rping's event thread does as its main thread exits; the error it got made rping
/// call `exit(-1)`). Under valgrind when it is installed, which reports a read of a freed
/// channel.
#[test]
fn a_late_call_on_a_destroyed_channel_waits() {
    turns_under_valgrind("127.0.26.17", "late-get");
}

/// What librdmacm refuses before anything is sent, with EINVAL: an id of no port space, an
/// address of no family it knows, an RC connect with neither a QP nor parameters, responder
/// resources above the device's, a second QP on an id (which keeps its first).
#[test]
fn connection_parameters_and_a_second_qp_are_checked() {
    turns_under_valgrind("127.0.26.19", "params");
}

/// A client process that exits connected (no disconnect, no destroy) says goodbye, as the
/// kernel's CM does when the process's descriptor closes: its server hears DISCONNECTED
/// soon after, not never (an RC QP with nothing to send never notices its peer gone).
#[test]
fn a_process_that_exits_connected_disconnects() {
    let lib = library_dir();
    let Some(exe) = build_c(&lib, "turns") else {
        return;
    };
    let addr = "127.0.26.31";
    let Some((s, c)) = pair(
        &[&exe, addr, "exit-server"],
        &[&exe, addr, "exit-client"],
        [addr, "127.0.26.32"],
    ) else {
        return;
    };
    let _ = std::fs::remove_dir_all(&lib);
    assert!(s.contains("ok") && c.contains("ok"), "{s}\n{c}");
}

/// A connected QP the program took off its id (`id->qp = NULL`, as libfabric's verbs
/// provider does with XRC QPs that outlive their connection's id) stays in RTS through that
/// id's disconnect and destruction: librdmacm acts on `id->qp` only.
#[test]
fn a_qp_taken_off_its_id_outlives_the_id() {
    turns_under_valgrind("127.0.26.33", "taken-qp");
}

/// Synchronous XRC endpoints on `RDMA_PS_IB` (an initiator without a receive CQ, a target
/// request, an XRC SRQ by `rdma_create_srq_ex` in the default domain, a SEND into it, and
/// `rdma_destroy_ep` taking the SRQ), under valgrind when it is installed.
#[test]
fn xrc_endpoints_are_made_as_librdmacm_makes_them() {
    turns_under_valgrind("127.0.26.63", "xrc-ep");
}

/// `turns <addr> <mode>` on a device at `addr`, under valgrind when it is installed (which
/// then fails the run on a read of freed memory): it must say "ok" and exit 0.
fn turns_under_valgrind(addr: &str, mode: &str) {
    under_valgrind("turns", &[addr, mode]);
}

/// `tests/c/<name>.c` run with `args` on a device at `args[0]`, under valgrind when it is
/// installed (which then fails the run on a read of freed memory or an uninitialised value):
/// it must say "ok" and exit 0.
fn under_valgrind(name: &str, args: &[&str]) {
    says_ok(name, args, true);
}

/// `tests/c/<name>.c` run with `args` on a device at `args[0]` (under valgrind if `valgrind`
/// and it is installed, given 120 s, else 60 s): it must say "ok" and exit 0.
fn says_ok(name: &str, args: &[&str], valgrind: bool) {
    let lib = library_dir();
    let Some(exe) = build_c(&lib, name) else {
        return;
    };
    let addr = args[0];
    let mut args: Vec<&str> = std::iter::once(exe.as_str())
        .chain(args.iter().copied())
        .collect();
    let valgrind = valgrind && installed("valgrind");
    if valgrind {
        args.splice(0..0, ["valgrind", "-q", "--error-exitcode=9"]);
    }
    let secs = if valgrind { 120 } else { 60 };
    let (ok, text) = finish(
        start(&lib, addr, &args, &[]),
        Instant::now() + Duration::from_secs(secs),
    );
    let _ = std::fs::remove_dir_all(&lib);
    assert!(ok && text.contains("ok"), "{text}");
}

#[test]
fn without_softnic_s_libibverbs_every_call_fails_with_enodev() {
    if !installed("rping") {
        return;
    }
    let exe = std::env::current_exe().expect("this test binary");
    let deps = exe.parent().expect("deps/");
    let dir = deps.join(format!("softnic-rdmacm-alone-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let link = dir.join("librdmacm.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(deps.join("librdmacm.so"), &link).expect("linking");
    let c = start(
        &dir,
        "127.0.26.12",
        &["rping", "-c", "-a", "127.0.26.1", "-C", "1"],
        &[],
    );
    let (ok, text) = finish(c, Instant::now() + Duration::from_secs(20));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!ok, "{text}");
    assert!(text.contains("not softnic's"), "{text}");
}

/// rdmacm-utils' `rstream` over rsockets: verified data both ways, non-blocking (its
/// default), blocking, and waiting in `rpoll` (`-T a`), through sizes that fill several
/// slots and sizes that end inside one.
#[test]
fn rstream_moves_verified_data_nonblocking() {
    rstream(
        &["-S", "100000", "-C", "100", "-T", "v"],
        ["127.0.26.41", "127.0.26.42"],
    );
}

#[test]
fn rstream_moves_verified_data_blocking() {
    let args = ["-S", "4096", "-C", "1000", "-T", "b", "-T", "v"];
    rstream(&args, ["127.0.26.43", "127.0.26.44"]);
}

#[test]
fn rstream_moves_verified_data_polled() {
    let args = ["-S", "1000000", "-C", "20", "-T", "a", "-T", "v"];
    rstream(&args, ["127.0.26.45", "127.0.26.46"]);
}

/// A server `rstream -b <addrs[0]> <args>` and its client at `addrs[1]`; both print their
/// result row.
fn rstream(args: &[&str], addrs: [&str; 2]) {
    let server: Vec<&str> = ["rstream", "-b", addrs[0]]
        .iter()
        .chain(args)
        .copied()
        .collect();
    let client: Vec<&str> = ["rstream", "-s", addrs[0]]
        .iter()
        .chain(args)
        .copied()
        .collect();
    let Some((s, c)) = pair(&server, &client, addrs) else {
        return;
    };
    for out in [&s, &c] {
        assert!(out.lines().any(|l| l.starts_with("custom")), "{s}\n{c}");
    }
}

/// rdmacm-utils' `riostream`: each end maps its buffer (`riomap`) and the other writes it
/// (`riowrite`, RDMA WRITEs), verified; the reader learns of the writes by watching the
/// buffer's last byte, with no call into the library.
#[test]
fn riostream_writes_verified_data_to_a_mapped_buffer() {
    let args = ["-S", "100000", "-C", "20", "-I", "5", "-T", "v"];
    let server: Vec<&str> = ["riostream", "-b", "127.0.26.51"]
        .iter()
        .chain(&args)
        .copied()
        .collect();
    let client: Vec<&str> = ["riostream", "-s", "127.0.26.51"]
        .iter()
        .chain(&args)
        .copied()
        .collect();
    let Some((s, c)) = pair(&server, &client, ["127.0.26.51", "127.0.26.52"]) else {
        return;
    };
    for out in [&s, &c] {
        assert!(out.lines().any(|l| l.starts_with("custom")), "{s}\n{c}");
    }
}

/// Starts `server` (which serves until killed) on a device at `addrs[0]`, then `client` at
/// `addrs[1]` (again while it is refused: the server may not listen yet), and kills the
/// server once the client is done: whether the client succeeded, and what both said.
fn serving(
    lib: &Path,
    server: &[&str],
    client: &[&str],
    addrs: [&str; 2],
) -> (bool, String, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut s = start(lib, addrs[0], server, &[]);
    let (ok, text) = loop {
        std::thread::sleep(Duration::from_millis(300));
        let (ok, text) = finish(start(lib, addrs[1], client, &[]), deadline);
        if ok || !text.contains("refused") || Instant::now() > deadline {
            break (ok, text);
        }
    };
    let _ = s.kill();
    let (_, s_text) = finish(s, deadline);
    (ok, text, s_text)
}

/// rdmacm-utils' `rcopy` copies a file over rsockets (its server serves until killed): the
/// copy is the file, byte for byte.
#[test]
fn rcopy_copies_a_file() {
    if !have("rcopy") {
        return;
    }
    let lib = library_dir();
    let src = lib.join("source");
    let dst = lib.join("copy");
    let data: Vec<u8> = (0..3_000_001u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&src, &data).expect("writing the source");
    let target = format!("127.0.26.47:{}", dst.display());
    let client = ["rcopy", src.to_str().unwrap(), &target, "-p", "7429"];
    let addrs = ["127.0.26.47", "127.0.26.48"];
    let (ok, text, s_text) = serving(&lib, &["rcopy", "-p", "7429"], &client, addrs);
    let copy = std::fs::read(&dst).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&lib);
    assert!(ok, "client: {text}\nserver: {s_text}");
    assert!(
        copy == data,
        "the copy differs ({} bytes of {})\n{s_text}",
        copy.len(),
        data.len()
    );
}

/// rdmacm-utils' `udpong` over datagram rsockets (UD; its server serves until killed): a
/// ping-pong that sends again what a millisecond brings no answer to, then a stream of
/// datagrams the server counts, non-blocking and blocking. The second server binds where
/// `udpong` does by default, `::1` (the host, as 127.0.0.1: it was EAFNOSUPPORT), and its
/// client sends to 127.0.0.1 (answered from the server's device: taken as from 127.0.0.1),
/// on a port of their own (the host's listeners are announced by port).
#[test]
fn udpong_sends_datagrams() {
    if !have("udpong") {
        return;
    }
    let _turn = localhost();
    let lib = library_dir();
    for (args, addrs, bind) in [
        (
            ["-C", "500", "-S", "1000", "-T", "e"],
            ["127.0.26.53", "127.0.26.54"],
            true,
        ),
        (
            ["-C", "2000", "-S", "1400", "-T", "b"],
            ["127.0.26.55", "127.0.26.56"],
            false,
        ),
    ] {
        // A blocking server: non-blocking, it spins for as long as it serves.
        let (server_at, client_to): (&[&str], &[&str]) = if bind {
            (&["-b", addrs[0]], &["-s", addrs[0]])
        } else {
            (&["-p", "47175"], &["-s", "127.0.0.1", "-p", "47175"])
        };
        let server: Vec<&str> = ["udpong", "-T", "b"]
            .iter()
            .chain(server_at)
            .copied()
            .collect();
        let client: Vec<&str> = ["udpong"]
            .iter()
            .chain(client_to)
            .chain(&args)
            .copied()
            .collect();
        let (ok, text, s_text) = serving(&lib, &server, &client, addrs);
        assert!(
            ok && text.lines().any(|l| l.starts_with("custom")),
            "client: {text}\nserver: {s_text}"
        );
    }
    let _ = std::fs::remove_dir_all(&lib);
}

/// What a socket program expects of rsockets, from refusals to the end of a stream
/// (`tests/c/rsock.c` says what), under valgrind when it is installed.
#[test]
fn rsockets_behave_as_sockets() {
    let _turn = localhost();
    under_valgrind("rsock", &["127.0.26.49"]);
}
