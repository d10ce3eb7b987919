//! Shared set-up: two devices with a PD and a CQ each, and connected QP pairs.

#![allow(dead_code, unreachable_pub)]

use std::sync::{Arc, Mutex};

pub use verbs_safe::*;

/// Held by tests that leak on purpose or count leaks ([`leaks`] is per process, and the tests
/// of this binary run in parallel).
pub static LEAKS: Mutex<()> = Mutex::new(());

pub struct Side {
    pub ctx: Arc<Context>,
    pub pd: Arc<Pd>,
    pub cq: Arc<Cq>,
    pub gid: Gid,
}

impl Side {
    pub fn open(verbs: &Verbs, name: &str) -> Side {
        let ctx = Context::open_by_name(verbs, name).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = Cq::new(&ctx, 256, None).unwrap();
        let gid = ctx.query_gid(1, 0).unwrap();
        Side { ctx, pd, cq, gid }
    }

    pub fn qp<T: Transport>(&self, caps: QpCaps, sig_all: bool) -> Qp<T, Reset> {
        self.qp_init(QpInit {
            send_cq: &self.cq,
            recv_cq: &self.cq,
            srq: None,
            caps,
            sig_all,
        })
    }

    /// A signal-all QP with default caps on the given CQs and SRQ.
    pub fn qp_on<T: Transport>(
        &self,
        send_cq: &Arc<Cq>,
        recv_cq: &Arc<Cq>,
        srq: Option<&Arc<Srq>>,
    ) -> Qp<T, Reset> {
        self.qp_init(QpInit {
            send_cq,
            recv_cq,
            srq,
            caps: QpCaps::default(),
            sig_all: true,
        })
    }

    fn qp_init<T: Transport>(&self, init: QpInit<'_>) -> Qp<T, Reset> {
        Qp::new(&self.pd, init).unwrap()
    }
}

pub fn fabric() -> (softnic::Fabric, Verbs, Side, Side) {
    let f = softnic::Fabric::default();
    let v = Verbs::soft(&f);
    let a = Side::open(&v, "soft0");
    let b = Side::open(&v, "soft1");
    (f, v, a, b)
}

pub fn remote<T: Transport, S: QpState>(side: &Side, qp: &Qp<T, S>) -> Remote {
    Remote {
        qpn: qp.qpn(),
        psn: 0,
        lid: 0,
        gid: Some(side.gid),
    }
}

/// softnic's ports have one GID (index 0).
pub const FROM: LocalPort = LocalPort {
    port: 1,
    gid_index: 0,
};

/// What the test QPs let peers do: everything (each test's regions decide the rest).
pub fn open_access() -> ConnInit {
    ConnInit::with_access(AccessFlags::remote())
}

pub fn rc_pair(a: &Side, b: &Side, caps: QpCaps, sig_all: bool) -> (Qp<Rc, Rts>, Qp<Rc, Rts>) {
    connect_rc(a, a.qp::<Rc>(caps, sig_all), b, b.qp::<Rc>(caps, sig_all))
}

/// Brings `qa` (on `a`) and `qb` (on `b`) to RTS, connected to each other.
pub fn connect_rc(
    a: &Side,
    qa: Qp<Rc, Reset>,
    b: &Side,
    qb: Qp<Rc, Reset>,
) -> (Qp<Rc, Rts>, Qp<Rc, Rts>) {
    let (ra, rb) = (remote(a, &qa), remote(b, &qb));
    let up = |q: Qp<Rc, Reset>, peer| {
        q.init(open_access())
            .unwrap()
            .rtr(RcRtr::new(peer, FROM))
            .unwrap()
            .rts(RcRts::new(0))
            .unwrap()
    };
    (up(qa, rb), up(qb, ra))
}

pub fn uc_pair(a: &Side, b: &Side) -> (Qp<Uc, Rts>, Qp<Uc, Rts>) {
    let (qa, qb) = (
        a.qp::<Uc>(QpCaps::default(), true),
        b.qp::<Uc>(QpCaps::default(), true),
    );
    let (ra, rb) = (remote(a, &qa), remote(b, &qb));
    let qa = qa
        .init(open_access())
        .unwrap()
        .rtr(UcRtr::new(rb, FROM))
        .unwrap()
        .rts(SqPsn(0))
        .unwrap();
    let qb = qb
        .init(open_access())
        .unwrap()
        .rtr(UcRtr::new(ra, FROM))
        .unwrap()
        .rts(SqPsn(0))
        .unwrap();
    (qa, qb)
}

pub const QKEY: u32 = 0x1111;

pub fn ud_qp(s: &Side) -> Qp<Ud, Rts> {
    s.qp::<Ud>(QpCaps::default(), true)
        .init(UdInit::new(QKEY))
        .unwrap()
        .rtr(UdRtr)
        .unwrap()
        .rts(SqPsn(0))
        .unwrap()
}

/// Every completion of `cq` until `n` arrived or nothing more does, as owned records.
pub fn drain(cq: &Cq, n: usize) -> Vec<Done> {
    let mut p = Poller::new();
    let mut out = Vec::new();
    let mut idle = 0;
    while out.len() < n && idle < 3 {
        let got = p
            .poll(cq, n - out.len(), |c| out.push(Done::of(&c)))
            .unwrap();
        idle = if got.count == 0 { idle + 1 } else { 0 };
    }
    out
}

/// An owned summary of a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Done {
    pub wr_id: u64,
    pub qp_num: u32,
    pub status: WcStatus,
    pub opcode: Option<WcOpcode>,
    pub byte_len: u32,
    pub imm: Option<u32>,
    pub src_qp: u32,
}

impl Done {
    pub fn of(c: &Completion<'_>) -> Done {
        match c.ok() {
            Ok(s) => Done {
                wr_id: s.wr_id(),
                qp_num: s.qp_num(),
                status: WcStatus::Success,
                opcode: Some(s.opcode().unwrap()),
                byte_len: s.byte_len(),
                imm: s.imm(),
                src_qp: s.src_qp(),
            },
            Err(f) => Done {
                wr_id: f.wr_id(),
                qp_num: f.qp_num(),
                status: f.status().unwrap(),
                opcode: None,
                byte_len: 0,
                imm: None,
                src_qp: 0,
            },
        }
    }
}
