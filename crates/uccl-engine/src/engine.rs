//! The engine: its resources, its connections, and the calls applications make.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bufpool::{LocalPool, Memory, RegionPool};
use uccl_tx::{PathId, Tx, TxConfig};
use verbs_safe::{AccessFlags, Context, DmaBuf, Poller};

use crate::clock::Clock;
use crate::config::{EngineConfig, Mode, RecvKeys};
use crate::conn::{Conn, State};
use crate::credits::Credits;
use crate::error::{EngineError, Result};
use crate::io::Io;

use crate::proto::Ctl;
use crate::qpn::QpnTable;
use crate::request::Request;
use crate::rx::Delivered;
use crate::stats::Stats;

/// A connection of an engine (the engine, an index and a generation: a stale id never names
/// a newer connection in the same slot, nor an id of one engine a connection of another).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnId {
    pub(crate) engine: u64,
    pub(crate) index: u16,
    pub(crate) generation: u32,
}

impl std::fmt::Display for ConnId {
    /// "3 of engine 1 (generation 2)": the slot, its engine, and which use of the slot.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of engine {} (generation {})",
            self.index, self.engine, self.generation
        )
    }
}

/// What an engine holds at a moment ([`Engine::usage`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Usage {
    /// Work-request extensions in use (posted, or queued for retransmission).
    pub wrs_in_use: usize,
    /// Retransmission header slots in use.
    pub hdrs_in_use: usize,
    /// Chunks sent and not yet acknowledged.
    pub unacked: u32,
    /// Connections held (open or draining).
    pub connections: usize,
    /// Connections draining after a failure.
    pub draining: usize,
    /// SRQ buffers consumed and not yet posted again (below the refill threshold).
    pub srq_owed: usize,
    /// Completions of the engine's CQ reserved for data sends (by the data QPs of the
    /// connections held): what the QPs could have outstanding at most, so the CQ can never
    /// overflow.
    pub send_cq_reserved: u64,
    /// Completions of the engine's CQ reserved for control: the engine's own UD control QP's
    /// share (for its life) and the connections' control QPs'.
    pub ctrl_cq_reserved: u64,
    /// Receive credits granted to the peers' senders together (never more than the SRQ holds).
    pub credits_granted: u32,
    /// Control send slots in use (ACK packets and control messages being sent).
    pub ctrl_sends_in_use: usize,
    /// Buffers registered and not given back.
    pub buffers: usize,
    /// Exports not withdrawn.
    pub exports: usize,
    /// Buffers (and the retransmission headers) pinned to the data QPs' table.
    pub pinned: usize,
    /// Buffers given back whose memory a posted WR still names (released once it is done).
    pub pins_retiring: usize,
    /// Peer engines held (one per distinct peer of the connections held).
    pub peers: usize,
}

/// The engine's retransmission headers, in a registered region uccl-tx writes through.
struct HdrMem(Arc<DmaBuf>);

impl Memory for HdrMem {
    fn addr(&self) -> usize {
        self.0.addr() as usize
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn write(&mut self, offset: usize, src: &[u8]) {
        let _ = self.0.write_at(offset, src);
    }
    fn read(&self, offset: usize, dst: &mut [u8]) {
        let _ = self.0.read_at(offset, dst);
    }
}

/// Scratch of a poll round, kept to spare allocations.
#[derive(Default)]
pub(crate) struct Scratch {
    /// Rounds run (wrapping).
    pub(crate) rounds: u32,
    /// The engine's next deadline after a round that did nothing, until something is asked of
    /// it; 0 otherwise (see `Engine::settled`).
    pub(crate) settled_until: u64,
    /// Whether this round took a buffer another thread dropped or a request it cancelled.
    pub(crate) took_input: bool,
    /// Whether something asked for a full next round during this one (`Engine::unsettle`).
    pub(crate) redo: bool,
    /// When the engine last looked at its CQ (polled it), on a clock that runs by itself.
    pub(crate) looked_at: u64,
    /// Since when this round's completions may have waited for the engine: its last look
    /// before this round (a thread descheduled or napping is late to see them; the receiver's
    /// hold and the sender's RTT sample count it as this host's time, not the network's). On
    /// a virtual clock the round's own time: an engine polled at every event waits for none.
    pub(crate) seen_since: u64,
    /// What the engine's alarm was last set to (see `Engine::idle`).
    pub(crate) alarm_at: Option<u64>,
    /// Connections with a CTS or a send to match.
    pub(crate) ready: Vec<u16>,
    /// Connections with an ACK to send.
    pub(crate) acks: Vec<u16>,
    /// Delayed ACKs: (due, connection), in the order they are due (the delay is constant);
    /// an entry whose time is no longer its connection's `ack_due` is stale and skipped.
    pub(crate) delayed: VecDeque<(u64, u16)>,
    pub(crate) delivered: Vec<Delivered>,
    pub(crate) order: Vec<u32>,
    pub(crate) changed: Vec<u16>,
    /// Connections draining after a failure.
    pub(crate) draining: Vec<u16>,
    /// Connections with control receives or messages to post.
    pub(crate) ctl: Vec<u16>,
    /// Peers with ACKs staged.
    pub(crate) peers: Vec<usize>,
    /// Connections to fail after a transmission round.
    pub(crate) failed: Vec<(u16, &'static str)>,
    pub(crate) cqes: Vec<crate::round::Cqe>,
    pub(crate) bytes: Vec<u8>,
    /// Messages of a request being withdrawn.
    pub(crate) msgs: Vec<u64>,
}

static ENGINES: AtomicU64 = AtomicU64::new(1);

/// Header slots of retransmissions in flight.
const HDR_SLOTS: usize = 4096;
const HDR_SLOT: usize = uccl_tx::wire::RETR_HDR_LEN;

/// A UCCL transport engine on one device context. See the [crate documentation](crate).
pub struct Engine {
    pub(crate) id: u64,
    /// What the engine's requests know of it (its id, and how many of them have ended).
    pub(crate) owner: Arc<crate::request::Owner>,
    pub(crate) cfg: EngineConfig,
    pub(crate) clock: Clock,
    /// On a softnic fabric whose virtual clock moves by itself: the engine's next deadline,
    /// so that an idle engine can move the clock to it (see `Engine::idle`).
    pub(crate) alarm: Option<softnic::Alarm>,
    /// Whether the clock is a fabric's virtual one (see `Scratch::seen_since`).
    pub(crate) virtual_clock: bool,
    pub(crate) io: Io,
    pub(crate) tx: Tx,
    pub(crate) conns: Vec<Option<Conn>>,
    /// Why each slot's last connection ended, once freed: a later call on it says so (the
    /// error its requests failed with), not that there is no such connection.
    pub(crate) ended: Vec<Option<(ConnId, EngineError)>>,
    /// Connections offered and not yet completed, by index (a slot is free when it is in
    /// neither table).
    pub(crate) offers: Vec<Option<crate::setup::Offer>>,
    pub(crate) generation: u32,
    /// The ACK tag of the last connection in each slot (a new one gets another).
    pub(crate) last_tags: Vec<u8>,
    /// Connection set-ups over TCP in flight, and listeners (see `dial.rs`).
    pub(crate) dials: crate::dial::Dials,
    /// Data QP number -> connection index << 8 | lane.
    pub(crate) data_qpns: QpnTable,
    /// Transmit path -> (connection index, lane).
    pub(crate) paths: Vec<(u16, u16)>,
    /// Keep-alive timers of connections waiting for their peer.
    pub(crate) keepalive: crate::keepalive::Timers,
    /// Idle keep-alive timers of every open connection, when `idle_keepalive_ms` is set.
    pub(crate) idle_pings: crate::keepalive::Timers,
    /// Control probe timers of connections with control sends outstanding.
    pub(crate) ctl_probes: crate::keepalive::Probes,
    /// Ask timers of UC connections waiting for an advertisement (see `need.rs`).
    pub(crate) cts_timers: crate::need::Timers,
    /// Paths of connections that went, drained, for the next connections to reuse.
    pub(crate) spare_paths: Vec<PathId>,
    pub(crate) peers: crate::peers::Peers,
    /// Registered buffers and exports.
    pub(crate) memory: crate::memory::Memory,
    /// First PSNs and ACK tags.
    pub(crate) rng: crate::rng::Rng,
    pub(crate) credits: Credits,
    /// Requests cancelled by the application, taken in the next round.
    pub(crate) cancels: Arc<crossbeam_queue::SegQueue<Request>>,
    /// The deadlines of requests that have one.
    pub(crate) deadlines: crate::cancel::Deadlines,
    /// Connections that serve a peer's read, or did since an export was last withdrawn (UC):
    /// what a withdrawal looks through, instead of every connection.
    pub(crate) readers: Vec<u16>,
    pub(crate) scratch: Scratch,
    /// When the UD QP was last found short of receives (what comes then may find none and be
    /// dropped), if ever: see `acks.rs`.
    pub(crate) ud_dry_at: Option<u64>,
    pub(crate) stats: Stats,
    pub(crate) poller: Poller,
    /// RDMA READs in flight and connections with reads to issue (see `read.rs`).
    pub(crate) reads: crate::read::Reads,
    /// Notes delivered, for the application (see `notes.rs`).
    pub(crate) notifications: crate::notes::Notifications,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("device", &self.io.ctx.name())
            .field("mode", &self.cfg.mode)
            .field("conns", &self.conns.iter().flatten().count())
            .finish_non_exhaustive()
    }
}

impl Drop for Engine {
    /// Fails every request still in flight with [`EngineError::Stopped`] (nobody will complete
    /// them); the QPs, the CQ and memory go with the engine.
    fn drop(&mut self) {
        self.fail_all(&EngineError::Stopped);
    }
}

impl Engine {
    /// Fails every request of every connection with `e` (the engine cannot go on).
    pub(crate) fn fail_all(&mut self, e: &EngineError) {
        for c in self.conns.iter_mut().flatten() {
            c.fail_requests(e, true);
        }
        self.reads.fail_all(e);
    }

    /// An engine on `ctx` built as `cfg` says, reading time from `clock`.
    pub fn new(ctx: &Arc<Context>, cfg: EngineConfig, clock: Clock) -> Result<Engine> {
        cfg.validate()?;
        let mut rng = crate::rng::Rng::new(&clock, ctx.name());
        let qkey = rng.next_u64() as u32 & !crate::io::CONTROLLED_QKEY;
        let io = Io::new(ctx, &cfg, rng.psn(), qkey)?;
        let probe = match cfg.recv_keys {
            RecvKeys::Window => io.pd.alloc_mw().err(),
            RecvKeys::Buffer => None,
        };
        let unsupported = |e: &verbs_safe::Error| match e {
            verbs_safe::Error::Unsupported(_) => true,
            // EOPNOTSUPP, ENOSYS, EINVAL (no such window type): the device has none.
            verbs_safe::Error::Create { errno, .. } => [95, 38, 22].contains(&errno.0),
            _ => false,
        };
        if let Some(e) = probe {
            if !unsupported(&e) {
                // The device has windows; allocating one failed for another reason.
                return Err(EngineError::verbs("allocating a first memory window")(e));
            }
            return Err(EngineError::Config {
                field: "recv_keys",
                value: 0,
                reason: "RecvKeys::Window needs memory windows, which this device does not have: \
                         set RecvKeys::Buffer to advertise receive buffers with their whole \
                         buffer's key (a peer may then write anywhere in a buffer it was sent \
                         a receive of, while it is registered)",
            });
        }
        let hdrs = Arc::new(
            io.pd
                .alloc_dma(HDR_SLOTS * HDR_SLOT, 64, AccessFlags::LOCAL_WRITE)
                .map_err(EngineError::verbs("allocating retransmission headers"))?,
        );
        let pool =
            RegionPool::<u32, LocalPool, _>::new(HdrMem(Arc::clone(&hdrs)), HDR_SLOT, hdrs.lkey())
                .map_err(|e| EngineError::Tx(e.into()))?;
        let tx = Tx::new(tx_config(&cfg), pool)?;
        // What senders may have in flight together: the SRQ, less what a refill may still owe
        // (on RC as on UC: a sender past its grant would take buffers RNR then denies the
        // others).
        let budget = cfg.srq_depth - cfg.srq_refill;
        let turn = cfg.tx.rto_initial_us * 1000;
        let credits = Credits::new(budget, cfg.tx.flow_window, turn);
        let id = ENGINES.fetch_add(1, Ordering::Relaxed);
        let memory = crate::memory::Memory::new(id);
        // The retransmission headers are named by data WRs of every connection: pinned for good.
        memory.pins.pin(&hdrs);
        Ok(Engine {
            id,
            owner: crate::request::Owner::new(id),
            credits,
            alarm: clock.alarm(),
            virtual_clock: clock.is_virtual(),
            clock,
            io,
            tx,
            conns: Vec::new(),
            ended: Vec::new(),
            offers: Vec::new(),
            generation: 0,
            last_tags: Vec::new(),
            dials: crate::dial::Dials::default(),
            data_qpns: QpnTable::default(),
            paths: Vec::new(),
            spare_paths: Vec::new(),
            keepalive: Default::default(),
            idle_pings: Default::default(),
            ctl_probes: Default::default(),
            cts_timers: Default::default(),
            peers: Default::default(),
            memory,
            rng,
            cancels: Arc::default(),
            deadlines: Default::default(),
            readers: Vec::new(),
            scratch: Scratch::default(),
            ud_dry_at: None,
            stats: Stats::default(),
            poller: Poller::new(),
            reads: Default::default(),
            notifications: Default::default(),
            cfg,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The RTT samples of this engine's ACKs (ns, the receiver's hold time left out), since it
    /// started or [`reset_rtt_samples`](Self::reset_rtt_samples): see
    /// [`uccl_tx::Tx::rtt_samples`].
    pub fn rtt_samples(&self) -> &uccl_tx::Histogram<u64> {
        self.tx.rtt_samples()
    }

    /// Forgets the RTT samples so far.
    pub fn reset_rtt_samples(&mut self) {
        self.tx.reset_rtt_samples();
    }

    /// How many of this engine's requests have ended so far (completed, failed or
    /// cancelled; connects and accepts too): one atomic load. A loop that drives the engine
    /// and tests its requests need test them again only when this moved: a request that
    /// ended before the count was read tests as done after it.
    pub fn requests_ended(&self) -> u64 {
        self.owner.ended()
    }

    /// Counters (the transmit side's are in [`tx_stats`](Self::tx_stats)).
    pub fn stats(&self) -> Stats {
        let t = self.tx.stats();
        Stats {
            chunks_sent: t.chunks,
            rto_retransmits: t.rto_retransmits,
            fast_retransmits: t.fast_retransmits,
            probe_retransmits: t.probe_retransmits,
            nic_probes: t.nic_probes,
            ack_requests: t.ack_requests,
            credit_stalls: t.credit_stalls,
            window_stalls: t.window_stalls,
            host_delayed_samples: t.host_delayed_samples,
            ..self.stats
        }
    }

    /// The transmit side's counters.
    pub fn tx_stats(&self) -> uccl_tx::TxStats {
        self.tx.stats()
    }

    /// What the engine holds now: after every request completed and the peers went quiet,
    /// everything but the posted SRQ and control buffers is back.
    pub fn usage(&self) -> Usage {
        Usage {
            wrs_in_use: self.tx.wrs_in_use(),
            hdrs_in_use: self.tx.hdrs_in_use(),
            unacked: self.tx.unacked(),
            connections: self.conns.iter().flatten().count(),
            draining: self.scratch.draining.len(),
            srq_owed: self.io.srq_ring.owed.len(),
            send_cq_reserved: self.io.send_credits.reserved(),
            ctrl_cq_reserved: self.io.ctrl_credits.reserved(),
            credits_granted: self.credits.granted(),
            ctrl_sends_in_use: self.io.ctrl_send.in_use()
                + self
                    .conns
                    .iter()
                    .flatten()
                    .map(|c| c.ctl.send.in_use())
                    .sum::<usize>(),
            buffers: self.memory.buffers(),
            exports: self.memory.exports(),
            pinned: self.memory.pins.pinned(),
            pins_retiring: self.memory.pins.retiring(),
            peers: self.peers.len(),
        }
    }

    /// The device context.
    pub fn context(&self) -> &Arc<Context> {
        &self.io.ctx
    }

    /// [`open_conn`](Self::open_conn), for new requests: a connection this end is closing
    /// takes none (they would fail with the close).
    pub(crate) fn conn_for_request(&mut self, id: ConnId) -> Result<&mut Conn> {
        let c = self.open_conn(id)?;
        if c.closed.is_some() {
            return Err(EngineError::ConnectionFailed {
                conn: id,
                reason: crate::control::CLOSED_HERE.into(),
            });
        }
        Ok(c)
    }

    /// The open connection `id`.
    pub(crate) fn open_conn(&mut self, id: ConnId) -> Result<&mut Conn> {
        let ended = &self.ended;
        self.conns
            .get_mut(usize::from(id.index))
            .and_then(Option::as_mut)
            .filter(|c| c.id == id)
            .ok_or_else(|| match ended.get(usize::from(id.index)) {
                Some(Some((was, why))) if *was == id => why.clone(),
                _ => EngineError::NoConnection(id),
            })
            .and_then(|c| match &c.state {
                State::Open => Ok(c),
                State::Draining(e) => Err(e.clone()),
            })
    }

    /// Polls the engine until `req` completes; for an embedded engine (a threaded one makes
    /// progress by itself: [`Request::wait`]). A request of another engine that has not
    /// completed is refused ([`EngineError::OtherEngine`]): polling this one would never
    /// complete it. It polls only this engine: with the peer's engine on the same thread,
    /// poll both in a loop of your own (the crate's example), or this waits for ever.
    pub fn wait<T: Clone>(&mut self, req: &Request<T>) -> Result<T> {
        if req.engine() != self.id {
            return req
                .test()
                .unwrap_or(Err(EngineError::OtherEngine("request")));
        }
        loop {
            if let Some(r) = req.test() {
                return r;
            }
            self.poll()?;
        }
    }

    /// Queues `conn` for matching its sends with its peer's receive buffers this round.
    pub(crate) fn mark_ready(&mut self, index: u16) {
        if let Some(c) = self.conns[usize::from(index)].as_mut()
            && !c.in_ready
        {
            c.in_ready = true;
            self.scratch.ready.push(index);
        }
    }

    /// Closes `conn`: tells the peer, then tears the connection down (requests still in
    /// flight on it fail). The request completes (`Ok`) once the connection is gone from
    /// this end: the peer told (or its retries ran out), every WR of the connection flushed
    /// and polled, its slot free. After that no WR of it touches memory, and dropping the
    /// engine cannot cut the goodbye short. It fails with [`EngineError::Stopped`] if the
    /// engine goes first. Closing it again before it is gone returns the same request.
    pub fn close(&mut self, conn: ConnId) -> Result<Request<()>> {
        self.unsettle();
        if let Some(r) = self
            .conns
            .get(usize::from(conn.index))
            .and_then(Option::as_ref)
            .filter(|c| c.id == conn)
            .and_then(|c| c.closed.clone())
        {
            return Ok(r);
        }
        let closed = Request::of_engine(&self.owner, None);
        let c = self.open_conn(conn)?;
        c.closed = Some(closed.clone());
        c.ctl.backlog.push_back(Ctl::Close.to_bytes());
        self.mark_ctl(conn.index);
        Ok(closed)
    }

    /// The connection ids open now.
    pub fn connections(&self) -> Vec<ConnId> {
        self.conns
            .iter()
            .flatten()
            .filter(|c| c.is_open())
            .map(|c| c.id)
            .collect()
    }

    /// Whether `conn` is open (not failed, closed or unknown). A connection with nothing in
    /// flight learns that its peer is gone when a request on it waits (keep-alives run while
    /// requests wait), or, with
    /// [`idle_keepalive_ms`](crate::EngineConfig::idle_keepalive_ms) set, within that long plus
    /// the control QP's retries; by default an idle connection whose peer vanished stays open
    /// until a request waits.
    pub fn is_open(&self, conn: ConnId) -> bool {
        self.conns
            .get(usize::from(conn.index))
            .and_then(Option::as_ref)
            .is_some_and(|c| c.id == conn && c.is_open())
    }
}

/// The transmit side's configuration for `cfg`: the peer delays its ACKs as this engine does
/// (both run one configuration), unless every chunk fills an ACK by itself; in RC mode the
/// NIC recovers every loss, so the transmit side never retransmits (its timers are out of
/// reach), and a data QP whose WRs see no completion for `rto_initial_us` gets a NIC probe
/// (see [`TxConfig::nic_probe_us`], which the engine sets, in either mode).
fn tx_config(cfg: &EngineConfig) -> TxConfig {
    let mut t = cfg.tx.clone();
    let delays = cfg.ack_every > 1 && t.chunk_size < cfg.ack_bytes;
    if delays {
        t.peer_ack_delay_us = t.peer_ack_delay_us.max(u64::from(cfg.ack_delay_us));
    }
    // On UC a WR completes once sent: nothing for a NIC probe to reveal.
    t.nic_probe_us = 0;
    if cfg.mode == Mode::Rc {
        let hour = 3_600_000_000;
        t.rto_min_us = hour;
        t.rto_initial_us = hour;
        t.rto_max_us = hour;
        t.max_silence_us = uccl_tx::MAX_TIME_US;
        t.tail_probes = false;
        // A tail loss waits for the QP's local ACK timeout unless a later packet shows it.
        t.nic_probe_us = cfg.tx.rto_initial_us;
        t.ack_requests = false;
        // ACKs ride the control QP behind the engine's other control messages: their delay
        // is not the data path's queue.
        t.target_delay_us = 0;
    }
    t
}
