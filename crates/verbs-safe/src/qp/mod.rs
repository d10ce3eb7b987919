//! The typestate queue pair: `Qp<Transport, State>`.
//!
//! Each transition consumes the QP and asks for exactly the attributes its transport needs
//! there; on failure it hands the QP back unchanged with an error that names the mask bits. Only
//! states that may post expose posting: sends on RTS (and SQD), receives from INIT on.

// A refused transition returns the QP itself with the error, by value: that is the point of
// the typestate, and transitions are control-path calls where the size does not matter.
#![allow(clippy::result_large_err)]

mod attrs;
mod ledger;
mod posting;

use std::marker::PhantomData;
use std::sync::Arc;

use ibverbs_sys::{ibv_qp, ibv_qp_attr, ibv_qp_cap, ibv_qp_init_attr, ibv_qp_state};

pub use attrs::{
    Attrs, ConnInit, Connected, Rc, RcRtr, RcRts, Remote, SqPsn, Transport, Uc, UcRtr, Ud, UdInit,
    UdRtr,
};

use crate::context::{Ah, Pd, leaked};
use crate::cq::Cq;
use crate::error::{Errno, Error, Result};
use crate::flags::QpAttrMask;
use crate::memory::DmaBuf;
use crate::pins::Pins;
use crate::post::{PostRecvFn, PostSendFn};
use crate::srq::Srq;
use crate::track::{Owner, new_owner_id};
use ledger::Books;

/// A QP state, as libibverbs numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum QpStateKind {
    Reset,
    Init,
    Rtr,
    Rts,
    Sqd,
    Sqe,
    Error,
    Unknown,
}

impl QpStateKind {
    /// The `ibv_qp_state` value.
    pub fn to_raw(self) -> ibv_qp_state::Type {
        use ibv_qp_state::*;
        match self {
            QpStateKind::Reset => IBV_QPS_RESET,
            QpStateKind::Init => IBV_QPS_INIT,
            QpStateKind::Rtr => IBV_QPS_RTR,
            QpStateKind::Rts => IBV_QPS_RTS,
            QpStateKind::Sqd => IBV_QPS_SQD,
            QpStateKind::Sqe => IBV_QPS_SQE,
            QpStateKind::Error => IBV_QPS_ERR,
            QpStateKind::Unknown => IBV_QPS_UNKNOWN,
        }
    }

    /// The state of an `ibv_qp_state` value.
    pub fn from_raw(raw: ibv_qp_state::Type) -> QpStateKind {
        use ibv_qp_state::*;
        match raw {
            IBV_QPS_RESET => QpStateKind::Reset,
            IBV_QPS_INIT => QpStateKind::Init,
            IBV_QPS_RTR => QpStateKind::Rtr,
            IBV_QPS_RTS => QpStateKind::Rts,
            IBV_QPS_SQD => QpStateKind::Sqd,
            IBV_QPS_SQE => QpStateKind::Sqe,
            IBV_QPS_ERR => QpStateKind::Error,
            _ => QpStateKind::Unknown,
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A state of the typestate QP.
pub trait QpState: sealed::Sealed + Send + Sync + 'static {
    /// Which state.
    const KIND: QpStateKind;
}

/// A state in which receives may be posted (INIT, RTR, RTS, SQD).
pub trait CanPostRecv: QpState {}
/// A state in which sends may be posted (RTS, SQD).
pub trait CanPostSend: QpState {}

macro_rules! states {
    ($($(#[$m:meta])* $name:ident = $kind:ident;)*) => {$(
        $(#[$m])*
        #[derive(Debug)]
        pub enum $name {}
        impl sealed::Sealed for $name {}
        impl QpState for $name {
            const KIND: QpStateKind = QpStateKind::$kind;
        }
    )*};
}

states! {
    /// Just created or reset: nothing can be posted.
    Reset = Reset;
    /// Initialised: receives may be posted (not yet processed).
    Init = Init;
    /// Ready to receive.
    Rtr = Rtr;
    /// Ready to send.
    Rts = Rts;
    /// Send queue drained: sends queue up but do not start.
    Sqd = Sqd;
    /// Failed: every WR was flushed; only a reset brings it back.
    Errored = Error;
}

impl CanPostRecv for Init {}
impl CanPostRecv for Rtr {}
impl CanPostRecv for Rts {}
impl CanPostRecv for Sqd {}
impl CanPostSend for Rts {}
impl CanPostSend for Sqd {}

/// Queue sizes of a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth (0 with an SRQ).
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Inline bytes per send WR.
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
        }
    }
}

impl QpCaps {
    fn to_ibv(self) -> ibv_qp_cap {
        ibv_qp_cap {
            max_send_wr: self.max_send_wr,
            max_recv_wr: self.max_recv_wr,
            max_send_sge: self.max_send_sge,
            max_recv_sge: self.max_recv_sge,
            max_inline_data: self.max_inline_data,
        }
    }
}

/// What a new QP is made of.
#[derive(Debug, Clone)]
pub struct QpInit<'a> {
    /// Where send completions go.
    pub send_cq: &'a Arc<Cq>,
    /// Where receive completions go.
    pub recv_cq: &'a Arc<Cq>,
    /// Take receives from this SRQ instead of an own receive queue.
    pub srq: Option<&'a Arc<Srq>>,
    /// Queue sizes.
    pub caps: QpCaps,
    /// Every send WR completes with an entry (else only those flagged signaled, and failures).
    pub sig_all: bool,
}

struct Inner {
    /// What slot posts may name (its own table, or one shared with other QPs) and what the
    /// posted ones named.
    books: Books,
    pd: Arc<Pd>,
    _send_cq: Arc<Cq>,
    _recv_cq: Arc<Cq>,
    _srq: Option<Arc<Srq>>,
    raw: *mut ibv_qp,
    qpn: u32,
    caps: QpCaps,
    post_send: PostSendFn,
    post_recv: PostRecvFn,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: the QP is live and destroyed once; its CQs, SRQ and PD outlive this call.
        let rc = unsafe { (self.pd.ctx.verbs.ctl.destroy_qp)(self.raw) };
        if rc != 0 {
            // The NIC may still run its WRs: keep everything they may name, for good (the
            // tracker's entries stay, and the pin table outlives every queue).
            leaked("queue pair", rc, 0);
            std::mem::forget(Arc::clone(&self.books.pins));
            return;
        }
        // Only now, with the QP gone, may the buffers of its uncompleted posts go.
        self.books.clear(&self.pd.ctx.tracker);
    }
}

impl Inner {
    fn owner(&self) -> Owner {
        Owner::Qp(self.books.owner)
    }
}

/// A queue pair of transport `T` in state `S`.
pub struct Qp<T: Transport, S: QpState> {
    inner: Inner,
    _type: PhantomData<fn() -> (T, S)>,
}

// SAFETY: libibverbs providers and softnic serialise posts on a QP internally, and the
// control verbs on it are thread-safe.
unsafe impl<T: Transport, S: QpState> Send for Qp<T, S> {}
// SAFETY: as above.
unsafe impl<T: Transport, S: QpState> Sync for Qp<T, S> {}

impl<T: Transport, S: QpState> std::fmt::Debug for Qp<T, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("transport", &T::NAME)
            .field("state", &S::KIND)
            .field("qpn", &format_args!("{:#x}", self.inner.qpn))
            .finish()
    }
}

/// A refused transition: the QP, unchanged, and why.
pub struct TransitionError<T: Transport, S: QpState> {
    /// The QP, still in its old state.
    pub qp: Qp<T, S>,
    /// What went wrong.
    pub error: Error,
}

impl<T: Transport, S: QpState> std::fmt::Debug for TransitionError<T, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransitionError")
            .field("qp", &self.qp)
            .field("error", &self.error)
            .finish()
    }
}

impl<T: Transport, S: QpState> std::fmt::Display for TransitionError<T, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl<T: Transport, S: QpState> std::error::Error for TransitionError<T, S> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<T: Transport, S: QpState> From<TransitionError<T, S>> for Error {
    fn from(e: TransitionError<T, S>) -> Error {
        e.error
    }
}

/// The required bits a mask lacks and the bits it has that a transition does not take, for
/// transport `qp_type` (`IBV_QP_STATE` is in neither).
pub fn diagnose_mask(
    from: QpStateKind,
    to: QpStateKind,
    qp_type: ibverbs_sys::ibv_qp_type::Type,
    mask: QpAttrMask,
) -> (QpAttrMask, QpAttrMask) {
    match softnic::check_transition(from.to_raw(), to.to_raw(), qp_type) {
        Some((req, opt)) => {
            let req = QpAttrMask::from_bits_truncate(req);
            let allowed = req | QpAttrMask::from_bits_truncate(opt) | QpAttrMask::STATE;
            (req - mask, mask - allowed)
        }
        // No such transition: every attribute but the state is out of place.
        None => (QpAttrMask::empty(), mask - QpAttrMask::STATE),
    }
}

impl<T: Transport> Qp<T, Reset> {
    /// A new QP in RESET on `pd`.
    pub fn new(pd: &Arc<Pd>, init: QpInit<'_>) -> Result<Self> {
        let ctx = pd.context();
        // SAFETY: reading the ops table of a live context.
        let ops = unsafe { (*ctx.raw).ops };
        let (Some(post_send), Some(post_recv)) = (ops.post_send, ops.post_recv) else {
            return Err(Error::Unsupported("post_send/post_recv"));
        };
        let mut attr = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: init.send_cq.as_raw(),
            recv_cq: init.recv_cq.as_raw(),
            srq: init.srq.map_or(std::ptr::null_mut(), |s| s.as_raw()),
            cap: init.caps.to_ibv(),
            qp_type: T::QP_TYPE,
            sq_sig_all: i32::from(init.sig_all),
        };
        // SAFETY: live PD, CQs and SRQ; `attr` is valid and receives the actual caps.
        let raw = unsafe { (ctx.verbs.ctl.create_qp)(pd.raw, &mut attr) };
        if raw.is_null() {
            return Err(Error::Create {
                what: "queue pair",
                device: ctx.name().to_string(),
                detail: format!("{} {:?}", T::NAME, init.caps),
                errno: Errno::last(),
            });
        }
        let c = attr.cap;
        Ok(Qp {
            inner: Inner {
                books: Books::new(Pins::new(), new_owner_id(), init.sig_all),
                pd: Arc::clone(pd),
                _send_cq: Arc::clone(init.send_cq),
                _recv_cq: Arc::clone(init.recv_cq),
                _srq: init.srq.cloned(),
                raw,
                // SAFETY: a created QP's struct is readable.
                qpn: unsafe { (*raw).qp_num },
                caps: QpCaps {
                    max_send_wr: c.max_send_wr,
                    max_recv_wr: c.max_recv_wr,
                    max_send_sge: c.max_send_sge,
                    max_recv_sge: c.max_recv_sge,
                    max_inline_data: c.max_inline_data,
                },
                post_send,
                post_recv,
            },
            _type: PhantomData,
        })
    }

    /// RESET -> INIT.
    pub fn init(self, attrs: T::Init) -> Result<Qp<T, Init>, TransitionError<T, Reset>> {
        self.transition(&attrs)
    }

    /// Makes slot posts on this QP check against `pins`, a table other QPs may share (pin a
    /// buffer there once, and every QP of the table may name it), instead of the QP's own.
    /// In RESET nothing is posted, so nothing counts against the old table.
    pub fn with_pins(mut self, pins: &Arc<Pins>) -> Self {
        let i = &mut self.inner;
        i.books = Books::new(Arc::clone(pins), i.books.owner, i.books.sig_all);
        self
    }
}

impl<T: Transport> Qp<T, Init> {
    /// INIT -> RTR.
    pub fn rtr(self, attrs: T::Rtr) -> Result<Qp<T, Rtr>, TransitionError<T, Init>> {
        self.transition(&attrs)
    }
}

impl<T: Transport> Qp<T, Rtr> {
    /// RTR -> RTS.
    pub fn rts(self, attrs: T::Rts) -> Result<Qp<T, Rts>, TransitionError<T, Rtr>> {
        self.transition(&attrs)
    }
}

impl<T: Transport> Qp<T, Rts> {
    /// RTS -> SQD: finish what started, start nothing new.
    pub fn drain(self) -> Result<Qp<T, Sqd>, TransitionError<T, Rts>> {
        self.transition(&attrs::UdRtr)
    }
}

impl<T: Transport> Qp<T, Sqd> {
    /// SQD -> RTS.
    pub fn resume(self) -> Result<Qp<T, Rts>, TransitionError<T, Sqd>> {
        self.transition(&attrs::UdRtr)
    }
}

impl<T: Transport> Qp<T, Errored> {
    /// ERROR -> RESET, to be brought up again.
    pub fn recover(self) -> Result<Qp<T, Reset>, TransitionError<T, Errored>> {
        self.reset()
    }
}

impl<T: Transport, S: QpState> Qp<T, S> {
    fn transition<N: QpState>(self, attrs: &impl Attrs) -> Result<Qp<T, N>, TransitionError<T, S>> {
        let mut a = ibv_qp_attr {
            qp_state: N::KIND.to_raw(),
            ..Default::default()
        };
        let mask = match attrs.apply(&mut a) {
            Ok(m) => m | QpAttrMask::STATE,
            Err(error) => return Err(TransitionError { qp: self, error }),
        };
        // SAFETY: live QP; `a` is a valid attribute struct.
        let rc = unsafe {
            (self.inner.pd.ctx.verbs.ctl.modify_qp)(self.inner.raw, &mut a, mask.bits() as i32)
        };
        if rc == 0 && N::KIND == QpStateKind::Reset {
            // RESET empties the queues without completions: nothing posted is touched again.
            self.inner.books.clear(&self.inner.pd.ctx.tracker);
        }
        if rc != 0 {
            let (missing, unexpected) = diagnose_mask(S::KIND, N::KIND, T::QP_TYPE, mask);
            let error = Error::ModifyQp {
                qpn: self.inner.qpn,
                from: S::KIND,
                to: N::KIND,
                mask,
                missing,
                unexpected,
                errno: Errno(rc),
            };
            return Err(TransitionError { qp: self, error });
        }
        Ok(Qp {
            inner: self.inner,
            _type: PhantomData,
        })
    }

    /// Any state -> RESET: every queue is emptied without completions.
    pub fn reset(self) -> Result<Qp<T, Reset>, TransitionError<T, S>> {
        self.transition(&attrs::UdRtr)
    }

    /// Any state but RESET -> ERROR: every outstanding WR completes with `WR_FLUSH_ERR`.
    pub fn into_error(self) -> Result<Qp<T, Errored>, TransitionError<T, S>> {
        self.transition(&attrs::UdRtr)
    }

    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.inner.qpn
    }

    /// The queue sizes the provider granted.
    pub fn caps(&self) -> QpCaps {
        self.inner.caps
    }

    /// The raw QP.
    pub fn as_raw(&self) -> *mut ibv_qp {
        self.inner.raw
    }

    /// The state the provider reports now. It can differ from `S`: a QP fails into ERROR on
    /// its own (retries exhausted, a remote access error); [`reset`](Self::reset) recovers it.
    pub fn current_state(&self) -> Result<QpStateKind> {
        let mut a = ibv_qp_attr::default();
        let mut i = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: std::ptr::null_mut(),
            recv_cq: std::ptr::null_mut(),
            srq: std::ptr::null_mut(),
            cap: QpCaps::default().to_ibv(),
            qp_type: 0,
            sq_sig_all: 0,
        };
        let mask = QpAttrMask::STATE.bits() as i32;
        // SAFETY: live QP; writable out-structs.
        let rc =
            unsafe { (self.inner.pd.ctx.verbs.ctl.query_qp)(self.inner.raw, &mut a, mask, &mut i) };
        if rc != 0 {
            return Err(Error::Query {
                what: "ibv_query_qp",
                object: format!("QP {:#x}", self.inner.qpn),
                errno: Errno(rc),
            });
        }
        Ok(QpStateKind::from_raw(a.qp_state))
    }
}

impl<T: Transport, S: QpState> Qp<T, S> {
    /// Pins `buf` to this QP's table ([`pins`](Self::pins)): slot posts
    /// ([`post_slots`](Self::post_slots), [`post_recv_slots`](Self::post_recv_slots)) may name
    /// its bytes, and it stays alive until it is unpinned and no posted WR names it.
    pub fn pin(&self, buf: &Arc<DmaBuf>) {
        self.inner.books.pins.pin(buf);
    }

    /// Pins an address handle to this QP's table: UD slot posts may name it (posts on a QP
    /// of another protection domain than the handle's refuse it).
    pub fn pin_ah(&self, ah: &Arc<Ah>) {
        self.inner.books.pins.pin_ah(ah);
    }

    /// The protection domain.
    pub(crate) fn pd_ref(&self) -> &Arc<Pd> {
        &self.inner.pd
    }

    /// Who owns this QP's entries in the context's tracker.
    pub(crate) fn owner(&self) -> Owner {
        self.inner.owner()
    }

    /// The table slot posts on this QP are checked against (its own, or the one given to
    /// [`with_pins`](Qp::with_pins)): [`Pins::unpin`] takes a buffer back.
    pub fn pins(&self) -> &Arc<Pins> {
        &self.inner.books.pins
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ibverbs_sys::ibv_qp_type;

    #[test]
    fn diagnosis_names_missing_and_unexpected_bits() {
        let rc = ibv_qp_type::IBV_QPT_RC;
        let sent = QpAttrMask::STATE | QpAttrMask::SQ_PSN | QpAttrMask::QKEY;
        let (missing, unexpected) = diagnose_mask(QpStateKind::Rtr, QpStateKind::Rts, rc, sent);
        assert_eq!(
            missing,
            QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC
        );
        assert_eq!(unexpected, QpAttrMask::QKEY);
        let ud = ibv_qp_type::IBV_QPT_UD;
        let (missing, _) =
            diagnose_mask(QpStateKind::Reset, QpStateKind::Init, ud, QpAttrMask::STATE);
        assert_eq!(
            missing,
            QpAttrMask::QKEY | QpAttrMask::PORT | QpAttrMask::PKEY_INDEX
        );
        // RESET -> RTR does not exist.
        let (_, unexpected) = diagnose_mask(
            QpStateKind::Reset,
            QpStateKind::Rtr,
            rc,
            QpAttrMask::STATE | QpAttrMask::AV,
        );
        assert_eq!(unexpected, QpAttrMask::AV);
    }

    #[test]
    fn state_kinds_round_trip() {
        for k in [
            QpStateKind::Reset,
            QpStateKind::Init,
            QpStateKind::Rtr,
            QpStateKind::Rts,
            QpStateKind::Sqd,
            QpStateKind::Sqe,
            QpStateKind::Error,
        ] {
            assert_eq!(QpStateKind::from_raw(k.to_raw()), k);
        }
        assert_eq!(QpStateKind::from_raw(42), QpStateKind::Unknown);
    }
}
