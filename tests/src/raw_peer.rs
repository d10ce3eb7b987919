//! A hostile peer: a uccl-engine connection's far end made of raw verbs-safe objects instead of
//! an engine, so a test can send a victim [`Engine`] whatever a misbehaving peer could.
//!
//! A [`RawPeer`] opens its own softnic device (on the victim's fabric, so on its virtual clock:
//! see [`sim_with_raw_devices`]), completes a real handshake with the victim in process
//! ([`Engine::offer`], then [`Engine::complete`] with the peer's [`Hello`]), and owns:
//! - one data QP per path (UC or RC, as the victim's handshake says), connected to the
//!   victim's, with the PSNs exchanged: [`RawPeer::post`] puts any WRITE, WRITE_WITH_IMM or
//!   SEND with any address, key and immediate on one of them;
//! - an RC control QP connected to the victim's connection control QP, with receives posted:
//!   it keeps that QP alive and collects the victim's control messages ([`CtlMsg`]: its
//!   receive-buffer advertisements, notes of refused retransmissions);
//! - a UD QP, where the victim's ACKs go (counted, not read: the peer acknowledges nothing),
//!   and from which [`RawPeer::send_ud`] sends the victim's UD QP anything (ACK requests).
//!
//! Nothing here follows the engine's rules (credits, sequence numbers, immediates): the caller
//! says what to send. The handshake and control-message layouts are uccl-engine's
//! (`proto.rs`), restated: they are a wire protocol.
//!
//! ```
//! # use uccl_integration::raw_peer::{RawPeer, sim_with_raw_devices};
//! # use std::time::Duration;
//! # use uccl_engine::EngineConfig;
//! let (mut sim, dev) = sim_with_raw_devices(7, 1, 1, &EngineConfig::default());
//! let fabric = sim.fabric.clone();
//! let (mut peer, conn) = RawPeer::connect(&fabric, &dev[0], &mut sim.engines[0], 7).unwrap();
//! let buf = sim.engines[0].register(4096).unwrap();
//! let _recv = sim.engines[0].recv(conn, &buf, 0, 4096).unwrap();
//! peer.run(&mut sim, Duration::from_secs(1), |_, p| !p.cts.is_empty()).unwrap();
//! let cts = peer.cts.pop_front().unwrap();
//! assert_eq!(cts.len, 4096);
//! ```

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use softnic::{Fabric, Faults};
use uccl_engine::{ConnId, Engine, EngineConfig};
use verbs_safe::{
    AccessFlags, Ah, ConnInit, Context, Cq, DmaBuf, Gid, LocalPort, MrBuf, Mtu, Pd, Poller, Qp,
    QpCaps, QpInit, Rc, RcRtr, RcRts, RecvWr, Remote, Rts, SendOp, SendWr, SqPsn, Uc, UcRtr, Ud,
    UdInit, UdRtr, UdSendWr, Verbs, WcStatus,
};

use crate::Sim;

mod wire;
pub use wire::{CTL_LEN, CTL_PACK, CtlMsg, Cts, Hello, QKEY};

/// Send queue depth of each data QP.
pub const SQ_DEPTH: u32 = 128;
/// Receives kept posted on the control QP and on the UD QP.
const CTL_RECVS: u32 = 128;
/// Bytes of a control receive: the most one SEND carries.
const CTL_RECV_LEN: usize = CTL_PACK * CTL_LEN;
const UD_RECVS: u32 = 16;
/// Bytes of a UD receive: the GRH, then a message of up to 4096 bytes.
const UD_SLOT: usize = 40 + 4096;

/// `wr_id`s of the peer's own WRs (a data WR's is a counter below `1 << 40`).
const CTL_RECV: u64 = 1 << 40;
const CTL_SEND: u64 = 2 << 40;
const UD_RECV: u64 = 3 << 40;
const UD_SEND: u64 = 4 << 40;
/// Send queue depth of the UD QP.
const UD_SENDS: u32 = 64;
const KIND: u64 = 0xff << 40;

/// A data QP of the peer.
enum DataQp {
    Uc(Qp<Uc, Rts>),
    Rc(Qp<Rc, Rts>),
}

impl DataQp {
    fn post(&self, wrs: &mut [SendWr]) -> verbs_safe::Result<()> {
        match self {
            DataQp::Uc(q) => q.post_send_bufs(wrs),
            DataQp::Rc(q) => q.post_send_bufs(wrs),
        }
    }
}

/// A connection's far end made of raw verbs (see the [module docs](self)).
pub struct RawPeer {
    pd: Arc<Pd>,
    cq: Arc<Cq>,
    poller: Poller,
    data: Vec<DataQp>,
    ctl: Qp<Rc, Rts>,
    ud: Qp<Ud, Rts>,
    ctl_rx: Arc<DmaBuf>,
    ud_rx: Arc<DmaBuf>,
    /// The victim's handshake.
    pub victim: Hello,
    /// This peer's handshake, as the victim got it.
    pub mine: Hello,
    next_wr: u64,
    /// Data WRs posted and not completed.
    posted: HashSet<u64>,
    /// How each data WR completed, by `wr_id`.
    pub done: HashMap<u64, WcStatus>,
    /// The victim's advertisements not yet taken, in order of arrival.
    pub cts: VecDeque<Cts>,
    /// The victim's notes of refused retransmissions, in order of arrival.
    pub unplaceable: Vec<CtlMsg>,
    /// The kinds of the other control messages that arrived.
    pub other_ctl: Vec<u8>,
    /// Messages that arrived on the UD QP (the victim's ACKs).
    pub ud_received: u64,
    /// How the control QP failed, if it did (its receives are then flushed, and not posted
    /// again).
    pub ctl_failed: Option<WcStatus>,
    /// Control receives are not posted again once used: the victim's control messages find
    /// none (receiver not ready), its control QP retries them for ever, and what it has to
    /// say piles up.
    pub hold_ctl: bool,
    /// What [`flood_ud`](Self::flood_ud) sends with: an address handle of the victim and the
    /// message, made on first use.
    flood: Option<(Arc<Ah>, Arc<MrBuf>)>,
}

impl std::fmt::Debug for RawPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawPeer")
            .field("victim", &self.victim)
            .field("mine", &self.mine)
            .field("posted", &self.posted.len())
            .finish_non_exhaustive()
    }
}

/// A simulation of `engines` engines built as `cfg` (on `soft0`..) and `raw` spare devices for
/// raw peers after them, whose names are returned: one fabric without faults, seeded `seed`,
/// on the virtual clock (a [`Sim`] of them all, less the engines of the spare devices).
pub fn sim_with_raw_devices(
    seed: u64,
    engines: usize,
    raw: usize,
    cfg: &EngineConfig,
) -> (Sim, Vec<String>) {
    let mut sim = Sim::new(seed, engines + raw, Faults::NONE, cfg);
    sim.engines.truncate(engines);
    sim.baseline.truncate(engines);
    let names = (engines..engines + raw)
        .map(|i| format!("soft{i}"))
        .collect();
    (sim, names)
}

/// SplitMix64 step: the peer's PSNs from a seed.
fn mix(x: &mut u64) -> u32 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ((z ^ (z >> 31)) & 0x00ff_ffff) as u32
}

fn verbs_err(what: &'static str) -> impl Fn(verbs_safe::Error) -> String {
    move |e| format!("raw peer: {what}: {e}")
}

impl RawPeer {
    /// Connects a raw peer on device `device` of `fabric` to `victim`: the victim offers a
    /// connection, the peer builds QPs to match (as many data QPs, of its transport), connects
    /// them, posts its receives, and the victim completes the connection with the peer's
    /// handshake. Returns the peer and the victim's id of the connection. `seed` draws the
    /// peer's first PSNs.
    pub fn connect(
        fabric: &Fabric,
        device: &str,
        victim: &mut Engine,
        seed: u64,
    ) -> Result<(RawPeer, ConnId), String> {
        let (conn, theirs) = victim.offer().map_err(|e| format!("offer: {e}"))?;
        let built = Hello::parse(&theirs).and_then(|h| {
            RawPeer::build(fabric, device, h, seed).map_err(|e| format!("raw peer: {e}"))
        });
        let peer = match built {
            Ok(p) => p,
            Err(e) => {
                victim.withdraw(conn);
                return Err(e);
            }
        };
        victim
            .complete(conn, &peer.mine.to_bytes())
            .map_err(|e| format!("the victim refused the raw peer's handshake: {e}"))?;
        Ok((peer, conn))
    }

    fn build(fabric: &Fabric, device: &str, victim: Hello, seed: u64) -> verbs_safe::Result<Self> {
        let verbs = Verbs::soft(fabric);
        let ctx = Context::open_by_name(&verbs, device)?;
        let pd = ctx.alloc_pd()?;
        let paths = victim.qps.len() as u32;
        let entries = paths * SQ_DEPTH + 2 * CTL_RECVS + UD_RECVS + 64;
        let cq = Cq::new(&ctx, entries, None)?;
        let port = ctx.query_port(1)?;
        let mtu = port.active_mtu.min(Mtu::Mtu4096);
        let gid = ctx.query_gid(1, 0)?;
        let from = LocalPort::new(1, 0);
        let init = |send: u32, recv: u32| QpInit {
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            caps: QpCaps {
                max_send_wr: send,
                max_recv_wr: recv,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sig_all: true,
        };
        let remote = |(qpn, psn): (u32, u32)| Remote {
            qpn,
            psn,
            lid: victim.lid,
            gid: Some(Gid(victim.gid)),
        };
        let mut rng = seed ^ 0x0072_6177_7065_6572;
        let mut qps = Vec::with_capacity(victim.qps.len());
        let mut data = Vec::with_capacity(victim.qps.len());
        for &theirs in &victim.qps {
            let psn = mix(&mut rng);
            let q = if victim.rc() {
                let q = Qp::<Rc, _>::new(&pd, init(SQ_DEPTH, 1))?;
                let rtr = RcRtr {
                    path_mtu: mtu,
                    ..RcRtr::new(remote(theirs), from)
                };
                let rts = RcRts {
                    timeout: 12,
                    retry_cnt: 3,
                    ..RcRts::new(psn)
                };
                DataQp::Rc(q.init(ConnInit::default())?.rtr(rtr)?.rts(rts)?)
            } else {
                let q = Qp::<Uc, _>::new(&pd, init(SQ_DEPTH, 1))?;
                let rtr = UcRtr {
                    path_mtu: mtu,
                    ..UcRtr::new(remote(theirs), from)
                };
                DataQp::Uc(q.init(ConnInit::default())?.rtr(rtr)?.rts(SqPsn(psn))?)
            };
            let qpn = match &q {
                DataQp::Uc(q) => q.qpn(),
                DataQp::Rc(q) => q.qpn(),
            };
            qps.push((qpn, psn));
            data.push(q);
        }
        let ctl_psn = mix(&mut rng);
        let ctl = Qp::<Rc, _>::new(&pd, init(16, CTL_RECVS))?;
        let rtr = RcRtr {
            path_mtu: mtu,
            min_rnr_timer: 1,
            ..RcRtr::new(remote((victim.conn_qpn, victim.conn_psn)), from)
        };
        let ctl = ctl
            .init(ConnInit::default())?
            .rtr(rtr)?
            .rts(RcRts::new(ctl_psn))?;
        let ud = Qp::<Ud, _>::new(&pd, init(UD_SENDS, UD_RECVS))?;
        let ud = ud.init(UdInit::new(QKEY))?.rtr(UdRtr)?.rts(SqPsn(0))?;
        let local = AccessFlags::LOCAL_WRITE;
        let ctl_rx = Arc::new(pd.alloc_dma(CTL_RECVS as usize * CTL_RECV_LEN, 64, local)?);
        let ud_rx = Arc::new(pd.alloc_dma(UD_RECVS as usize * UD_SLOT, 64, local)?);
        let mine = Hello {
            features: victim.features,
            max_chunk: victim.max_chunk,
            gid: gid.0,
            lid: port.lid,
            ctrl_qpn: ud.qpn(),
            qkey: QKEY,
            fid: 0,
            credit: 64,
            conn_qpn: ctl.qpn(),
            conn_psn: ctl_psn,
            qps,
        };
        let peer = RawPeer {
            pd,
            cq,
            poller: Poller::new(),
            data,
            ctl,
            ud,
            ctl_rx,
            ud_rx,
            victim,
            mine,
            next_wr: 0,
            posted: HashSet::new(),
            done: HashMap::new(),
            cts: VecDeque::new(),
            unplaceable: Vec::new(),
            other_ctl: Vec::new(),
            ud_received: 0,
            ctl_failed: None,
            hold_ctl: false,
            flood: None,
        };
        for i in 0..CTL_RECVS {
            peer.repost_ctl(i)?;
        }
        for i in 0..UD_RECVS {
            peer.repost_ud(i)?;
        }
        Ok(peer)
    }

    fn repost_ctl(&self, i: u32) -> verbs_safe::Result<()> {
        let at = i as usize * CTL_RECV_LEN;
        let wr =
            RecvWr::new(CTL_RECV | u64::from(i)).dma_buf(&self.ctl_rx, at, CTL_RECV_LEN as u32);
        self.ctl.post_recv_bufs(&mut [wr])
    }

    fn repost_ud(&self, i: u32) -> verbs_safe::Result<()> {
        let at = i as usize * UD_SLOT;
        let wr = RecvWr::new(UD_RECV | u64::from(i)).dma_buf(&self.ud_rx, at, UD_SLOT as u32);
        self.ud.post_recv_bufs(&mut [wr])
    }

    /// Data QPs (paths) of the connection.
    pub fn paths(&self) -> usize {
        self.data.len()
    }

    /// Bytes registered on the peer's device, for [`post_buf`](Self::post_buf): one
    /// registration for any number of posts.
    pub fn payload(&self, data: &[u8]) -> Result<Arc<MrBuf>, String> {
        let mut b = self
            .pd
            .alloc_mr(data.len().max(1), 64, AccessFlags::LOCAL_WRITE)
            .map_err(verbs_err("a payload"))?;
        b.as_mut_slice()[..data.len()].copy_from_slice(data);
        Ok(Arc::new(b))
    }

    /// Posts `op` on data QP `path`, carrying `payload` (registered for this post); returns the
    /// WR's id, under which its completion lands in [`done`](Self::done).
    pub fn post(&mut self, path: usize, op: SendOp, payload: &[u8]) -> Result<u64, String> {
        let buf = (!payload.is_empty())
            .then(|| self.payload(payload))
            .transpose()?;
        let len = payload.len();
        self.post_buf(path, op, buf.as_ref().map(|b| (b, 0, len)))
    }

    /// Posts `op` on data QP `path`, carrying `len` bytes at `offset` of `buf` (if any);
    /// returns the WR's id.
    pub fn post_buf(
        &mut self,
        path: usize,
        op: SendOp,
        buf: Option<(&Arc<MrBuf>, usize, usize)>,
    ) -> Result<u64, String> {
        let qp = self.data.get(path).ok_or("no such path")?;
        let id = self.next_wr;
        let mut wr = SendWr::new(id, op);
        if let Some((b, offset, len)) = buf {
            wr = wr.buf(b, offset, len as u32);
        }
        qp.post(&mut [wr]).map_err(verbs_err("posting"))?;
        self.next_wr += 1;
        self.posted.insert(id);
        Ok(id)
    }

    /// Sends `bytes` from the peer's UD QP to the victim's (where its peers' ACKs and ACK
    /// requests go), as one message. At most 64 wait for their completions ([`poll`](Self::poll)
    /// takes them).
    pub fn send_ud(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.send_ud_keyed(bytes, self.victim.qkey)
    }

    /// [`send_ud`](Self::send_ud) under Q_Key `qkey` (the victim's device drops a message
    /// whose Q_Key is not its UD QP's).
    pub fn send_ud_keyed(&mut self, bytes: &[u8], qkey: u32) -> Result<(), String> {
        let from = LocalPort::new(1, 0);
        let ah = self
            .pd
            .create_ah(from, self.victim.lid, Some(Gid(self.victim.gid)))
            .map_err(verbs_err("an address handle"))?;
        let b = self.payload(bytes)?;
        let wr =
            UdSendWr::new(UD_SEND, &ah, self.victim.ctrl_qpn, qkey).buf(&b, 0, bytes.len() as u32);
        self.ud
            .post_send_bufs(&mut [wr])
            .map_err(verbs_err("a UD send"))
    }

    /// Posts `bytes` from the peer's UD QP to the victim's, under its Q_Key, again and again
    /// until the UD send queue is full (its completions, taken by [`poll`](Self::poll), make
    /// room; any refused post is taken for a full queue): a flood of the QP every peer's ACKs
    /// share. Returns how many it posted.
    pub fn flood_ud(&mut self, bytes: &[u8]) -> Result<usize, String> {
        let (ah, b) = match &self.flood {
            Some(f) => f.clone(),
            None => {
                let ah = self
                    .pd
                    .create_ah(
                        LocalPort::new(1, 0),
                        self.victim.lid,
                        Some(Gid(self.victim.gid)),
                    )
                    .map_err(verbs_err("an address handle"))?;
                let f = (ah, self.payload(bytes)?);
                self.flood = Some(f.clone());
                f
            }
        };
        let mut n = 0;
        loop {
            let wr = UdSendWr::new(UD_SEND, &ah, self.victim.ctrl_qpn, self.victim.qkey).buf(
                &b,
                0,
                bytes.len() as u32,
            );
            if self.ud.post_send_bufs(&mut [wr]).is_err() {
                return Ok(n);
            }
            n += 1;
        }
    }

    /// Sends `msg` on the control QP (the victim reads it as a control message).
    pub fn send_ctl(&mut self, msg: &[u8; CTL_LEN]) -> Result<(), String> {
        let b = self.payload(msg)?;
        let wr = SendWr::new(CTL_SEND, SendOp::Send).buf(&b, 0, CTL_LEN as u32);
        self.ctl
            .post_send_bufs(&mut [wr])
            .map_err(verbs_err("a control send"))
    }

    /// Data WRs posted and not completed, on every path.
    pub fn outstanding(&self) -> usize {
        self.posted.len()
    }

    /// How data WR `id` completed, once it did.
    pub fn status(&self, id: u64) -> Option<WcStatus> {
        self.done.get(&id).copied()
    }

    /// Polls the peer's CQ empty: data completions are recorded, control messages collected,
    /// receives posted again. Returns how many completions it took.
    pub fn poll(&mut self) -> Result<usize, String> {
        let mut got = Vec::new();
        let ok = WcStatus::Success;
        self.poller
            .poll(&self.cq, 4096, |c| {
                let status = c.status().unwrap_or(WcStatus::GeneralErr);
                let len = c.ok().map_or(0, |s| s.byte_len() as usize);
                got.push((c.wr_id(), status, len));
            })
            .map_err(verbs_err("polling"))?;
        for &(id, status, len) in &got {
            match id & KIND {
                CTL_RECV if status == ok => {
                    let i = (id & 0xffff_ffff) as u32;
                    // A SEND carries one to CTL_PACK messages.
                    let mut b = [0u8; CTL_RECV_LEN];
                    let b = &mut b[..len.min(CTL_RECV_LEN)];
                    self.ctl_rx
                        .read_at(i as usize * CTL_RECV_LEN, b)
                        .map_err(verbs_err("reading a control message"))?;
                    for m in b.chunks_exact(CTL_LEN) {
                        match CtlMsg::parse(m.try_into().expect("a whole message")) {
                            CtlMsg::Cts(c) => self.cts.push_back(c),
                            n @ CtlMsg::Unplaceable { .. } => self.unplaceable.push(n),
                            CtlMsg::Other(k) => self.other_ctl.push(k),
                        }
                    }
                    if !self.hold_ctl {
                        self.repost_ctl(i).map_err(verbs_err("a control receive"))?;
                    }
                }
                UD_RECV if status == ok => {
                    self.ud_received += 1;
                    let i = (id & 0xffff_ffff) as u32;
                    // A UC victim advertises its receive buffers here, among its ACKs.
                    let mut b = [0u8; UD_SLOT];
                    let b = &mut b[..len.min(UD_SLOT)];
                    self.ud_rx
                        .read_at(i as usize * UD_SLOT, b)
                        .map_err(verbs_err("reading a UD message"))?;
                    self.cts
                        .extend(wire::ud_adverts(b.get(40..).unwrap_or_default()));
                    self.repost_ud(i).map_err(verbs_err("a UD receive"))?;
                }
                CTL_RECV | CTL_SEND if status != ok => {
                    self.ctl_failed.get_or_insert(status);
                }
                CTL_SEND | UD_RECV | CTL_RECV | UD_SEND => {}
                _ => {
                    self.posted.remove(&id);
                    self.done.insert(id, status);
                }
            }
        }
        Ok(got.len())
    }

    /// Runs `sim` (its engines and fabric) and this peer until `done` holds, as [`Sim::run`]
    /// does, except that with nothing pending it still turns the engines' rounds a while, as an
    /// engine's own loop does: an engine reads its device's asynchronous events (a data QP that
    /// a peer's refused access moved to ERROR) only every few rounds, and its
    /// [`next_deadline`](Engine::next_deadline) does not show them. Fails, naming the seed,
    /// after `limit` more of virtual time or once nothing has happened for 256 rounds.
    pub fn run(
        &mut self,
        sim: &mut Sim,
        limit: Duration,
        mut done: impl FnMut(&Sim, &RawPeer) -> bool,
    ) -> Result<(), String> {
        let fabric = sim.fabric.clone();
        let end = fabric.now() + limit;
        let seed = sim.seed;
        let mut idle = 0;
        loop {
            self.poll()?;
            if done(sim, self) {
                return Ok(());
            }
            let mut busy = false;
            for e in &mut sim.engines {
                busy |= e.poll().map_err(|e| format!("seed {seed}: {e}"))?;
            }
            if busy {
                continue;
            }
            let now = fabric.now();
            if now > end {
                return Err(format!(
                    "seed {seed}: not done after {now:?} of virtual time"
                ));
            }
            let next = (sim.engines.iter())
                .filter_map(Engine::next_deadline)
                .map(Duration::from_nanos)
                .chain(fabric.next_event())
                .min();
            match next {
                Some(t) => fabric.advance(t.saturating_sub(now).max(Duration::from_nanos(1))),
                None if idle < 256 => idle += 1,
                None => return Err(format!("seed {seed}: stuck at {now:?}: nothing pending")),
            }
        }
    }

    /// Drives the fabric alone (no engine polls: only the NICs answer) and this peer until
    /// `done` holds; fails after `limit` more of virtual time, or when nothing is left to
    /// happen.
    pub fn drive(
        &mut self,
        fabric: &Fabric,
        limit: Duration,
        mut done: impl FnMut(&RawPeer) -> bool,
    ) -> Result<(), String> {
        let end = fabric.now() + limit;
        loop {
            self.poll()?;
            if done(self) {
                return Ok(());
            }
            let now = fabric.now();
            match fabric.next_event() {
                Some(t) if t <= end => {
                    fabric.advance(t.saturating_sub(now).max(Duration::from_nanos(1)))
                }
                Some(_) => return Err(format!("raw peer: not done after {limit:?}")),
                None => return Err("raw peer: nothing left to happen and not done".into()),
            }
        }
    }
}
