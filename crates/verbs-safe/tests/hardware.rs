//! On real RDMA hardware (or the kernel's rxe/siw): runs only when
//! `Device::list(&Verbs::system())` finds a device, and says so when it skips.
//!
//! Two RC QPs on the first device are connected to each other (loopback) and exchange a SEND
//! and an RDMA WRITE with immediate, through exactly the code paths softnic tests cover. The
//! source GID index is `VERBS_SAFE_GID_INDEX` (default 0; on RoCE v2 often 1 or 3, see
//! `show_gids`), and the port's LID is used as well, so the test also runs on InfiniBand.

use verbs_safe::*;

fn first_device() -> Option<Device> {
    match Device::list(&Verbs::system()) {
        Ok(list) if !list.is_empty() => list.into_iter().next(),
        Ok(_) => {
            eprintln!("hardware tests skipped: no RDMA device (ibv_get_device_list found none)");
            None
        }
        Err(e) => {
            eprintln!("hardware tests skipped: {e}");
            None
        }
    }
}

#[test]
fn loopback_rc_send_and_write_with_imm() -> Result<()> {
    let Some(dev) = first_device() else {
        return Ok(());
    };
    eprintln!("hardware test on {}", dev.name());
    let ctx = Context::open(&dev)?;
    let port = ctx.query_port(1)?;
    let gid_index: u8 = std::env::var("VERBS_SAFE_GID_INDEX")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let gid = ctx.query_gid(1, gid_index.into())?;
    let from = LocalPort::new(1, gid_index);
    let pd = ctx.alloc_pd()?;
    let cq = Cq::new(&ctx, 64, None)?;
    let init = || QpInit {
        send_cq: &cq,
        recv_cq: &cq,
        srq: None,
        caps: QpCaps::default(),
        sig_all: true,
    };
    let qa = Qp::<Rc, _>::new(&pd, init())?;
    let qb = Qp::<Rc, _>::new(&pd, init())?;
    let (ra, rb) = (
        Remote {
            qpn: qa.qpn(),
            psn: 1,
            lid: port.lid,
            gid: Some(gid),
        },
        Remote {
            qpn: qb.qpn(),
            psn: 1,
            lid: port.lid,
            gid: Some(gid),
        },
    );
    let rtr = |r| RcRtr {
        path_mtu: port.active_mtu.min(Mtu::Mtu1024),
        ..RcRtr::new(r, from)
    };
    let qa = qa
        .init(ConnInit::with_access(AccessFlags::REMOTE_WRITE))?
        .rtr(rtr(rb))?
        .rts(RcRts::new(1))?;
    let qb = qb
        .init(ConnInit::with_access(AccessFlags::REMOTE_WRITE))?
        .rtr(rtr(ra))?
        .rts(RcRts::new(1))?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mut src = pd.alloc_mr(4096, 4096, AccessFlags::LOCAL_WRITE)?;
    let dst = pd.alloc_dma(4096, 4096, access)?;
    src.as_mut_slice()[..11].copy_from_slice(b"hello world");
    // SAFETY: both regions live until the completions are polled below.
    unsafe {
        qb.post_recv(&mut [RecvWr::new(1).sge(dst.sge(0, 100).unwrap()), RecvWr::new(2)])?;
        qa.post_send(&mut [
            SendWr::new(3, SendOp::Send).sge(src.sge(0, 11).unwrap()),
            SendWr::new(
                4,
                SendOp::WriteWithImm {
                    remote_addr: dst.addr() + 2048,
                    rkey: dst.rkey(),
                    imm: 9,
                },
            )
            .sge(src.sge(0, 11).unwrap()),
        ])?;
    }
    let mut p = Poller::new();
    let mut done = Vec::new();
    let start = std::time::Instant::now();
    while done.len() < 4 {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "timed out: {done:?}"
        );
        p.poll(&cq, 16, |c| done.push((c.wr_id(), c.is_ok())))?;
    }
    assert!(done.iter().all(|&(_, ok)| ok), "{done:?}");
    let mut got = vec![0u8; 4096];
    dst.read_at(0, &mut got)?;
    assert_eq!(&got[..11], b"hello world");
    assert_eq!(&got[2048..2059], b"hello world");
    Ok(())
}
