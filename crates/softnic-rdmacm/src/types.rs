//! librdmacm's structs as `<rdma/rdma_cma.h>` lays them out (programs read their fields
//! directly, and the `<rdma/rdma_verbs.h>` inline helpers use `id->qp`, `id->pd`,
//! `id->send_cq`...). Sizes and offsets are asserted against the header's at compile time.

#![allow(non_camel_case_types, missing_docs)]

use std::ffi::{c_char, c_int, c_void};

use ibverbs_sys::{
    ibv_ah_attr, ibv_comp_channel, ibv_context, ibv_cq, ibv_gid, ibv_pd, ibv_qp, ibv_srq,
};

/// `struct rdma_event_channel`.
#[repr(C)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

/// `struct sockaddr_storage`: 128 bytes, 8-aligned.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct sockaddr_storage(pub [u8; 128]);

/// `struct rdma_ib_addr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ib_addr {
    pub sgid: ibv_gid,
    pub dgid: ibv_gid,
    pub pkey: u16,
}

/// `struct rdma_addr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_addr {
    pub src: sockaddr_storage,
    pub dst: sockaddr_storage,
    pub ibaddr: rdma_ib_addr,
}

/// `struct rdma_route`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_route {
    pub addr: rdma_addr,
    pub path_rec: *mut c_void,
    pub num_paths: c_int,
}

/// `struct rdma_cm_id`.
#[repr(C)]
pub struct rdma_cm_id {
    pub verbs: *mut ibv_context,
    pub channel: *mut rdma_event_channel,
    pub context: *mut c_void,
    pub qp: *mut ibv_qp,
    pub route: rdma_route,
    pub ps: c_int,
    pub port_num: u8,
    pub event: *mut rdma_cm_event,
    pub send_cq_channel: *mut ibv_comp_channel,
    pub send_cq: *mut ibv_cq,
    pub recv_cq_channel: *mut ibv_comp_channel,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub pd: *mut ibv_pd,
    pub qp_type: c_int,
}

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

/// `struct rdma_ud_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ud_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub ah_attr: ibv_ah_attr,
    pub qp_num: u32,
    pub qkey: u32,
}

/// `struct rdma_cm_join_mc_attr_ex`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_cm_join_mc_attr_ex {
    pub comp_mask: u32,
    pub join_flags: u32,
    pub addr: *mut libc::sockaddr,
}

/// `rdma_cm_join_mc_attr_ex.comp_mask`: `addr` is set.
pub const RDMA_CM_JOIN_MC_ATTR_ADDRESS: u32 = 1 << 0;
/// `rdma_cm_join_mc_attr_ex.comp_mask`: `join_flags` is set.
pub const RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS: u32 = 1 << 1;
/// A join that receives (the id's QP is attached to the group).
pub const RDMA_MC_JOIN_FLAG_FULLMEMBER: u32 = 0;
/// A join that only sends (the QP is not attached).
pub const RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER: u32 = 1;

/// The `param` union of `struct rdma_cm_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_cm_event_param {
    pub conn: rdma_conn_param,
    pub ud: rdma_ud_param,
}

/// `struct rdma_cm_event`.
#[repr(C)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    pub event: c_int,
    pub status: c_int,
    pub param: rdma_cm_event_param,
}

/// `struct rdma_addrinfo`.
#[repr(C)]
pub struct rdma_addrinfo {
    pub ai_flags: c_int,
    pub ai_family: c_int,
    pub ai_qp_type: c_int,
    pub ai_port_space: c_int,
    pub ai_src_len: u32,
    pub ai_dst_len: u32,
    pub ai_src_addr: *mut libc::sockaddr,
    pub ai_dst_addr: *mut libc::sockaddr,
    pub ai_src_canonname: *mut c_char,
    pub ai_dst_canonname: *mut c_char,
    pub ai_route_len: usize,
    pub ai_route: *mut c_void,
    pub ai_connect_len: usize,
    pub ai_connect: *mut c_void,
    pub ai_next: *mut rdma_addrinfo,
}

/// `RAI_PASSIVE`.
pub const RAI_PASSIVE: c_int = 1;
/// `RDMA_PS_TCP`.
pub const RDMA_PS_TCP: c_int = 0x0106;
/// `RDMA_OPTION_ID`: options of the id.
pub const RDMA_OPTION_ID: c_int = 0;
/// `RDMA_OPTION_IB`: InfiniBand options.
pub const RDMA_OPTION_IB: c_int = 1;
/// `RDMA_OPTION_ID_TOS` (a `uint8_t`).
pub const RDMA_OPTION_ID_TOS: c_int = 0;
/// `RDMA_OPTION_ID_REUSEADDR` (an `int`).
pub const RDMA_OPTION_ID_REUSEADDR: c_int = 1;
/// `RDMA_OPTION_ID_AFONLY` (an `int`).
pub const RDMA_OPTION_ID_AFONLY: c_int = 2;
/// `RDMA_OPTION_ID_ACK_TIMEOUT` (a `uint8_t`).
pub const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;
/// `RDMA_OPTION_IB_PATH` (`struct ibv_path_data` records).
pub const RDMA_OPTION_IB_PATH: c_int = 1;
/// `RDMA_PS_UDP`.
pub const RDMA_PS_UDP: c_int = 0x0111;
/// `RDMA_PS_IB`.
pub const RDMA_PS_IB: c_int = 0x013f;

// The header's layout (gcc on x86_64, `offsetof`/`sizeof` of Debian 12's rdma_cma.h).
const _: () = {
    assert!(size_of::<rdma_addr>() == 296);
    assert!(size_of::<rdma_route>() == 312);
    assert!(size_of::<rdma_cm_id>() == 416);
    assert!(std::mem::offset_of!(rdma_cm_id, route) == 32);
    assert!(std::mem::offset_of!(rdma_cm_id, ps) == 344);
    assert!(std::mem::offset_of!(rdma_cm_id, port_num) == 348);
    assert!(std::mem::offset_of!(rdma_cm_id, event) == 352);
    assert!(std::mem::offset_of!(rdma_cm_id, pd) == 400);
    assert!(std::mem::offset_of!(rdma_cm_id, qp_type) == 408);
    assert!(size_of::<rdma_cm_event>() == 80);
    assert!(std::mem::offset_of!(rdma_cm_event, param) == 24);
    assert!(size_of::<rdma_conn_param>() == 24);
    assert!(size_of::<rdma_ud_param>() == 56);
    assert!(std::mem::offset_of!(rdma_ud_param, ah_attr) == 16);
    assert!(std::mem::offset_of!(rdma_ud_param, qp_num) == 48);
    assert!(size_of::<rdma_addrinfo>() == 96);
    assert!(std::mem::offset_of!(rdma_addrinfo, ai_next) == 88);
};
