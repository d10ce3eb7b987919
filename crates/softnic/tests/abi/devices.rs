//! Point 1: Fabric and devices: names, GIDs, attributes with real limits.

use crate::common::*;

#[test]
fn devices_have_names_gids_and_limits() {
    let f = Fabric::new(FabricConfig {
        devices: 3,
        mtu: 2048,
        ..Default::default()
    });
    assert_eq!(f.device_names(), ["soft0", "soft1", "soft2"]);
    let nodes: Vec<Node> = ["soft0", "soft1", "soft2"]
        .iter()
        .map(|n| Node::open(&f, n))
        .collect();
    // SAFETY: reading the 16 raw bytes of GIDs softnic filled.
    let gids: Vec<[u8; 16]> = nodes.iter().map(|n| unsafe { n.gid.raw }).collect();
    assert_ne!(gids[0], gids[1]);
    assert_ne!(gids[1], gids[2]);
    assert_eq!(&gids[0][..12], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);

    let mut attr = ibv_device_attr::default();
    assert_eq!(
        // SAFETY: valid context and out-struct.
        unsafe { (CONTROL.query_device)(nodes[0].ctx, &mut attr) },
        0
    );
    assert_eq!(attr.max_qp_wr, 16384);
    assert_eq!(attr.max_sge, 32);
    assert_eq!(attr.max_cqe, 1 << 20);
    assert_eq!(attr.max_srq_wr, 16384);
    assert_eq!(attr.phys_port_cnt, 1);

    let mut port = ibv_port_attr::default();
    assert_eq!(
        // SAFETY: valid context and out-struct.
        unsafe { (CONTROL.query_port)(nodes[0].ctx, 1, &mut port) },
        0
    );
    assert_eq!(port.active_mtu, IBV_MTU_2048);
    assert_eq!(port.state, ibv_port_state::IBV_PORT_ACTIVE);
    assert_eq!(port.link_layer, IBV_LINK_LAYER_ETHERNET as u8);
    assert_eq!(
        // SAFETY: port 2 does not exist: the call must fail cleanly.
        unsafe { (CONTROL.query_port)(nodes[0].ctx, 2, &mut port) },
        libc::EINVAL
    );
    let mut gid = ibv_gid { raw: [0; 16] };
    assert_eq!(
        // SAFETY: GID index 1 does not exist.
        unsafe { (CONTROL.query_gid)(nodes[0].ctx, 1, 1, &mut gid) },
        libc::EINVAL
    );

    let dev = f.device("soft1").unwrap();
    // SAFETY: a device of a live fabric.
    let name = unsafe { std::ffi::CStr::from_ptr((CONTROL.get_device_name)(dev)) };
    assert_eq!(name.to_str().unwrap(), "soft1");
    assert!(f.device("soft9").is_none());
    assert!(f.set_faults("soft0", "soft9", Faults::NONE).is_err());
}

#[test]
fn odd_mtu_is_rounded_down() {
    assert_eq!(
        Fabric::new(FabricConfig {
            mtu: 3000,
            ..Default::default()
        })
        .config()
        .mtu,
        2048
    );
    assert_eq!(
        Fabric::new(FabricConfig {
            mtu: 10,
            ..Default::default()
        })
        .config()
        .mtu,
        256
    );
}

#[test]
fn ops_table_is_filled_for_the_hot_path() {
    let f = Fabric::default();
    let n = Node::open(&f, "soft0");
    // SAFETY: a live context is readable.
    let ops = unsafe { (*n.ctx).ops };
    assert!(ops.post_send.is_some() && ops.post_recv.is_some() && ops.post_srq_recv.is_some());
    assert!(ops.poll_cq.is_some() && ops.req_notify_cq.is_some());
    // SAFETY: as above.
    assert_eq!(unsafe { (*n.ctx).num_comp_vectors }, 1);
}

/// A context's `cmd_fd` is a real descriptor, as the kernel's open device file is: `dup` and
/// `fcntl` work on it, and it is closed with the context.
#[test]
fn cmd_fd_is_a_real_descriptor() {
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    // SAFETY: a live context's `ibv_context` is readable.
    let fd = unsafe { (*a.ctx).cmd_fd };
    assert!(fd >= 0, "cmd_fd {fd}");
    // SAFETY: plain descriptor calls on a descriptor number.
    unsafe {
        assert!(libc::fcntl(fd, libc::F_GETFD) >= 0);
        let copy = libc::dup(fd);
        assert!(copy >= 0, "dup failed");
        assert_eq!(libc::close(copy), 0);
    }
}
