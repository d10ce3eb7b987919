//! The rdma_cm part of `cargo xtask interop`: unmodified programs that connect with librdmacm
//! (rdma-core's `rdmacm-utils`: rping, ucmatose, udaddy, rdma_server/rdma_client, cmtime,
//! mckey, and rstream/riostream/udpong over rsockets; perftest's `-R`; libfabric's verbs
//! provider, alone and under `ofi_rxm` on RC and XRC connections, through `fi_pingpong` of
//! `libfabric-bin`) on softnic's drop-in librdmacm and connection manager, through
//! `softnic-run`: a server and a client process, each its own softnic device, talking RoCEv2
//! (CM MADs on QP1, then the data) over loopback addresses. RC runs again under 1% loss on both
//! devices (the CM sends lost MADs again, RC retransmits); UD (udaddy, udpong) runs without
//! loss, as a datagram lost is lost.
//!
//! A client that came before its server listened is rejected (REJ "invalid service ID") and
//! is started again. libfabric's verbs provider looks for the device among the host's
//! interface addresses, where the launcher shows it (`lo:soft0`). Each process has a
//! deadline; counts are small (about a second a run).

use std::process::Command;
use std::time::{Duration, Instant};

use super::ucx::Row;
use super::{run_until, spawn_piped, stop, wait_with_deadline};

/// One run: the program, the server's and the client's arguments (`{S}`: the server's
/// address; `program => args` for a client program of its own), what the client says on
/// success, the loss both devices inject.
struct Run {
    program: &'static str,
    server: &'static str,
    client: &'static str,
    says: &'static str,
    loss: Option<&'static str>,
    /// The server serves until stopped (cmtime's): it is killed once its client is done.
    stays: bool,
    /// Environment both ends run with.
    env: &'static [(&'static str, &'static str)],
}

const fn run(
    program: &'static str,
    server: &'static str,
    client: &'static str,
    says: &'static str,
) -> Run {
    Run {
        program,
        server,
        client,
        says,
        loss: None,
        stays: false,
        env: &[],
    }
}

const fn lossy(r: Run) -> Run {
    Run {
        loss: Some("0.01"),
        ..r
    }
}

const RPING: Run = run(
    "rping",
    "-s -a {S} -C 100 -v",
    "-c -a {S} -C 100 -v",
    "ping data: rdma-ping-99:",
);
const UCMATOSE: Run = run(
    "ucmatose",
    "-b {S} -c 10 -C 10",
    "-s {S} -c 10 -C 10",
    "return status 0",
);
const RDMA_SERVER: Run = run(
    "rdma_server",
    "-s {S} -p 7471",
    "rdma_client => -s {S} -p 7471",
    "rdma_client: end 0",
);
const WRITE_BW: Run = run("ib_write_bw", "-R -n 200", "-R -n 200 {S}", "#bytes");
const SEND_LAT: Run = run("ib_send_lat", "-R -n 200", "-R -n 200 {S}", "#bytes");
const FI_PINGPONG: Run = run(
    "fi_pingpong",
    "-p verbs -e msg -I 100 -S 1024 -c",
    "-p verbs -e msg -I 100 -S 1024 -c {S}",
    "#sent",
);
/// libfabric's reliable datagram endpoint (`ofi_rxm` over the verbs provider, as MPI's and
/// NCCL's libfabric transports use it): a connection made at the first send to a peer, and
/// 1 MiB messages, past `ofi_rxm`'s segmented-send limit (128 KiB), moved by rendezvous: an
/// RDMA READ of the sender's buffer.
const FI_RDM: Run = run(
    "fi_pingpong",
    "-p verbs -e rdm -I 100 -S 1048576 -c",
    "-p verbs -e rdm -I 100 -S 1048576 -c {S}",
    "#sent",
);
/// The same endpoint over XRC connections (the verbs provider's XRC domain, which wants
/// `ofi_rxm`'s shared receive context): each direction an initiator QP to the peer's target
/// QP and XRC SRQ, both set up over rdma_cm, whose ids are then disconnected (the QPs stay).
const FI_RDM_XRC: Run = Run {
    env: &[("FI_VERBS_PREFER_XRC", "1"), ("FI_OFI_RXM_USE_SRX", "1")],
    ..run(
        "fi_pingpong",
        "-p verbs -e rdm -I 100 -S 65536 -c",
        "-p verbs -e rdm -I 100 -S 65536 -c {S}",
        "#sent",
    )
};
/// rsockets, the socket API over RDMA: verified data both ways, non-blocking (rstream's
/// default: sends take what the slots take).
const RSTREAM: Run = run(
    "rstream",
    "-b {S} -S 100000 -C 200 -T v",
    "-s {S} -S 100000 -C 200 -T v",
    "custom",
);
/// rsockets' I/O mapping: each end writes the other's mapped buffer (RDMA WRITEs), verified.
const RIOSTREAM: Run = run(
    "riostream",
    "-b {S} -S 100000 -C 20 -I 5 -T v",
    "-s {S} -S 100000 -C 20 -I 5 -T v",
    "custom",
);
/// Datagram rsockets (UD): a ping-pong that sends again what a millisecond brings no answer
/// to (the server serves until stopped). Not under loss: udpong takes a late answer for the
/// answer to its next message, sends that message's number from then on and never matches
/// again (its own flaw; a loss makes late answers likelier on 2 cores).
const UDPONG: Run = Run {
    stays: true,
    ..run("udpong", "-b {S}", "-s {S} -C 500 -S 1000 -T e", "custom")
};

/// The matrix.
const RUNS: &[Run] = &[
    RPING,
    UCMATOSE,
    run(
        "udaddy",
        "-b {S} -c 4 -C 10",
        "-s {S} -c 4 -C 10",
        "return status 0",
    ),
    RDMA_SERVER,
    // Connection set-up timed: 100 at once.
    Run {
        stays: true,
        ..run("cmtime", "-b {S} -c 100", "-s {S} -c 100", "connect      :")
    },
    WRITE_BW,
    SEND_LAT,
    // RDMA READs (responder resources and initiator depth from the CM), and UD resolved by
    // SIDR.
    run("ib_read_bw", "-R -n 200", "-R -n 200 {S}", "#bytes"),
    run(
        "ib_send_bw",
        "-R -c UD -n 200",
        "-R -c UD -n 200 {S}",
        "#bytes",
    ),
    FI_PINGPONG,
    FI_RDM,
    // Both sides move their own QPs with rdma_init_qp_attr, the server's before it accepts
    // (the attributes come from the request).
    run(
        "rping",
        "-s -a {S} -C 10 -V -q",
        "-c -a {S} -C 10 -V -q -v",
        "ping data: rdma-ping-9:",
    ),
    // A QP of one send SGE and no inline data asked for takes 16 inline bytes, as on rxe.
    run(
        "rdma_xserver",
        "-c r",
        "rdma_xclient => -s {S} -c r",
        "rdma_xclient: end 0",
    ),
    // XRC endpoints on RDMA_PS_IB: the server's request an XRC_RECV id (target QP and XRC
    // SRQ in the default domain), the client's an XRC_SEND QP sending into that SRQ.
    run(
        "rdma_xserver",
        "-c x",
        "rdma_xclient => -s {S} -c x",
        "rdma_xclient: end 0",
    ),
    // RDMA_PS_IB over IPv4: RC connections in service IDs of that port space.
    run(
        "ucmatose",
        "-b {S} -P ib -c 4 -C 10",
        "-s {S} -P ib -c 4 -C 10",
        "return status 0",
    ),
    // Multicast: the server's id joins the group and receives what the client's (joined
    // too) sends there, 3 s after its join (mckey's pause for a subnet manager).
    run(
        "mckey",
        "-m 239.1.2.4 -b {S} -C 10",
        "-m 239.1.2.4 -s -C 10",
        "return status 0",
    ),
    RSTREAM,
    // Blocking calls.
    run(
        "rstream",
        "-b {S} -S 4096 -C 1000 -T b -T v",
        "-s {S} -S 4096 -C 1000 -T b -T v",
        "custom",
    ),
    RIOSTREAM,
    UDPONG,
    // Datagrams the server counts, blocking calls.
    Run {
        stays: true,
        ..run("udpong", "-b {S}", "-s {S} -C 2000 -S 1400 -T b", "custom")
    },
    lossy(RPING),
    lossy(UCMATOSE),
    lossy(RDMA_SERVER),
    lossy(WRITE_BW),
    lossy(SEND_LAT),
    lossy(FI_PINGPONG),
    lossy(FI_RDM),
    FI_RDM_XRC,
    lossy(FI_RDM_XRC),
    lossy(RSTREAM),
    lossy(RIOSTREAM),
];

/// The server's and the client's device addresses.
const SERVER: &str = "127.0.27.1";
const CLIENT: &str = "127.0.27.2";

/// The longest one process may run.
const DEADLINE: Duration = Duration::from_secs(60);

/// Runs the matrix: a row each.
pub(super) fn run_all(launcher: &str) -> Vec<Row> {
    RUNS.iter()
        .map(|r| {
            let started = Instant::now();
            let mut result = run_pair(launcher, r);
            // A close under loss, lost as it would be on a real NIC: again, twice at most
            // (the run is of the data, which both ends moved).
            for _ in 0..2 {
                match &result {
                    Err(why) if r.loss.is_some() && lost_at_close(why) => {
                        eprintln!(
                            "xtask interop: {} {}: the close lost under loss; again",
                            r.program, r.client
                        );
                        result = run_pair(launcher, r);
                    }
                    _ => break,
                }
            }
            let mut args = r.client.to_string();
            for (k, v) in r.env {
                args += &format!(" {k}={v}");
            }
            if let Some(p) = r.loss {
                args += &format!(" (loss {p})");
            }
            let (ok, line) = match result {
                Ok(line) => (true, line),
                Err(why) => (false, why),
            };
            eprintln!(
                "xtask interop: {} {args} {}: {}",
                r.program,
                if ok { "ok" } else { "FAILED" },
                line.lines().next().unwrap_or("")
            );
            Row {
                program: r.program.into(),
                args,
                ok,
                secs: started.elapsed().as_secs_f64(),
                line,
            }
        })
        .collect()
}

/// Whether a run failed only in its close, after both ends moved all their data and printed
/// their figures: the server's last message of the closing exchange still waited for its ACK
/// when the client, done, disconnected (the ACK lost: the client's QP, in the error state
/// once it disconnects, takes no retransmission, so a real NIC fails it too, after its
/// retries). perftest's close says "Failed to close connection"; fi_pingpong's (its "fin",
/// sent with `FI_TRANSMIT_COMPLETE`, which the client does not wait for the server to see
/// complete) a flushed work request. With 1% loss, one run in a few dozen.
fn lost_at_close(why: &str) -> bool {
    let perftest = why.contains("Failed to close connection") && why.matches("#bytes").count() >= 2;
    let fi_pingpong =
        why.contains("cq_readerr: Work Request Flushed Error") && why.matches("#sent").count() >= 2;
    why.starts_with("server failed") && (perftest || fi_pingpong)
}

/// The launcher's arguments for one side.
fn side(r: &Run, addr: &str, args: &str, server: &str) -> Vec<String> {
    let mut a = vec!["--quiet".to_string(), "--addr".into(), addr.into()];
    if let Some(p) = r.loss {
        a.extend(["--loss".into(), p.into()]);
    }
    let (program, args) = args.split_once(" => ").unwrap_or((r.program, args));
    a.extend(["--".into(), program.into()]);
    a.extend(
        args.replace("{S}", server)
            .split_whitespace()
            .map(String::from),
    );
    a
}

/// A server, then its client: both must exit 0 and the client say what success says.
/// Returns the client's figure line.
///
/// A client rejected for coming before the server listens is tried again with a new server,
/// given longer to start each time: a server that was rejecting may have gone past its
/// listen with that client already (perftest's `-R` connects twice, listening again after a
/// hand-shake on the first connection; a client that comes before the second listen is
/// rejected and leaves a server waiting on the port for it, where a second client's first
/// connection would be taken for the first client's second).
fn run_pair(launcher: &str, r: &Run) -> Result<String, String> {
    let deadline = Instant::now() + DEADLINE;
    let mut head_start = Duration::from_millis(300);
    let (client, mut server) = loop {
        let mut server = spawn_piped(
            Command::new(launcher)
                .args(side(r, SERVER, r.server, SERVER))
                .envs(r.env.iter().copied()),
            r.program,
        )?;
        std::thread::sleep(head_start);
        let out = run_until(
            Command::new(launcher)
                .args(side(r, CLIENT, r.client, SERVER))
                .envs(r.env.iter().copied()),
            deadline,
            r.program,
            "client",
        )
        .inspect_err(|_| stop(&mut server))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // (libfabric reports the REJ as error -8; UD's SIDR answers "no such service" as
        // UNREACHABLE with status 1.)
        let early = [
            "REJECTED",
            "rejected",
            "refused",
            "Unknown error -8",
            "UNREACHABLE; error: 1",
        ];
        let retry = !out.status.success() && early.iter().any(|w| text.contains(w));
        if !retry || Instant::now() > deadline {
            break ((out.status.success(), text), server);
        }
        stop(&mut server);
        head_start = (head_start * 2).min(Duration::from_secs(2));
    };
    if r.stays {
        let _ = server.kill();
    }
    let server = wait_with_deadline(server, deadline, r.program, "server")?;
    let server_text = format!(
        "{}{}",
        String::from_utf8_lossy(&server.stdout),
        String::from_utf8_lossy(&server.stderr)
    );
    let (ok, text) = client;
    if !ok || !text.contains(r.says) {
        return Err(format!(
            "client failed (wanted {:?}):\n{text}\nserver:\n{server_text}",
            r.says
        ));
    }
    if !server.status.success() && !r.stays {
        return Err(format!(
            "server failed ({}):\n{server_text}\nclient:\n{text}",
            server.status
        ));
    }
    // perftest's result row, cmtime's connect time, else the client's last line (rping's
    // last ping, ucmatose's status, fi_pingpong's figures).
    if text.contains("#bytes") {
        return Ok(super::figure(&text));
    }
    if let Some(l) = text.lines().find(|l| l.starts_with("connect ")) {
        return Ok(l.split_whitespace().collect::<Vec<_>>().join(" "));
    }
    Ok(text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .to_string())
}

#[cfg(test)]
mod tests {
    use super::lost_at_close;

    /// Only a server that failed in perftest's or fi_pingpong's close, after both ends
    /// printed their figures, is taken for the close lost under loss.
    #[test]
    fn only_a_close_is_taken_for_one_lost_under_loss() {
        let figures = " #bytes     #iterations    BW peak[MB/sec]\n 65536      200   1372.39\n";
        let close = format!(
            "server failed (exit status: 1):\n{figures} Bad wc status 5\n Unable to write \
             from socket/rdma_cm\nFailed to close connection between server and client\n\
             \nclient:\n{figures}"
        );
        assert!(lost_at_close(&close));
        // Before the data moved, or the client's failure: not the close.
        let early = close.replacen(figures, "", 1);
        assert!(!lost_at_close(&early));
        assert!(!lost_at_close(&close.replacen(
            "server failed",
            "client failed",
            1
        )));
        assert!(!lost_at_close(
            &close.replace("Failed to close connection", "Bad wc")
        ));
        // fi_pingpong's: its "fin" flushed after both printed their figures.
        let figures = "bytes   #sent   #ack     total       time     MB/sec\n1m  100  =100  200m\n";
        let fin = format!(
            "server failed (exit status: 125):\n{figures}[error] util/pingpong.c:1119: \
             cq_readerr: Work Request Flushed Error\n\nclient:\n{figures}"
        );
        assert!(lost_at_close(&fin));
        assert!(!lost_at_close(&fin.replacen(figures, "", 1)));
        assert!(!lost_at_close(&fin.replace("Flushed", "Remote Access")));
    }
}
