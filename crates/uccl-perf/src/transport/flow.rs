//! A flow's two ends, and its payload: each message's pattern written into the sender's slot
//! and checked in the receiver's.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use uccl_engine::{Buffer, ConnId, Descriptor, Request};

use crate::args::Args;
use crate::pattern;
use crate::scatter::Scatter;

/// The sending end of a flow.
pub(super) struct TxSide {
    /// The engine (an index into the run's) that holds the connection.
    pub(super) engine: usize,
    pub(super) conn: ConnId,
    pub(super) src: Buffer,
    /// Sends (or writes) in flight: (message, request); the end marker is `u64::MAX`.
    pub(super) reqs: VecDeque<(u64, Request)>,
    /// The next message to send.
    pub(super) next: u64,
    /// Messages whose send completed.
    pub(super) completed: u64,
    /// The end marker (a 0-byte message; two processes only) is posted.
    pub(super) marker_sent: bool,
    /// The end marker's send completed.
    pub(super) marker_done: bool,
    /// Two processes, `--op write`: the receiver's export, and its credits (see [`Credits`]).
    pub(super) remote: Option<(Descriptor, Credits)>,
}

/// Two processes, `--op write`: the receiver hands a slot back (a 0-byte send) once it checked
/// the message in it, so a write never lands in a slot still being checked. The sender's side:
/// the small buffer the credits arrive in, the receives posted for them, and how many came.
pub(super) struct Credits {
    pub(super) buf: Buffer,
    pub(super) reqs: VecDeque<Request>,
    pub(super) posted: u64,
    pub(super) got: u64,
}

impl Credits {
    /// Credits arriving in `buf`, none yet.
    pub(super) fn new(buf: Buffer) -> Credits {
        Credits {
            buf,
            reqs: VecDeque::new(),
            posted: 0,
            got: 0,
        }
    }
}

impl TxSide {
    /// A sending end on `conn` of engine `engine`, sending from `src`, nothing sent yet.
    pub(super) fn new(engine: usize, conn: ConnId, src: Buffer) -> Self {
        TxSide {
            engine,
            conn,
            src,
            reqs: VecDeque::new(),
            next: 0,
            completed: 0,
            marker_sent: false,
            marker_done: false,
            remote: None,
        }
    }
}

/// The receiving end of a flow.
pub(super) struct RxSide {
    /// The engine (an index into the run's) that holds the connection.
    pub(super) engine: usize,
    pub(super) conn: ConnId,
    pub(super) dst: Buffer,
    /// The region exported for `--op write`.
    pub(super) desc: Option<Descriptor>,
    /// Receives posted: (message, request).
    pub(super) reqs: VecDeque<(u64, Request)>,
    /// The next message to post a receive for.
    pub(super) next_post: u64,
    /// Messages that arrived (and were checked).
    pub(super) received: u64,
    /// The end marker arrived (two processes only).
    pub(super) ended: bool,
    /// Two processes, `--op write`: the buffer credits are sent from, and the sends in flight.
    pub(super) credits: Option<(Buffer, VecDeque<Request>)>,
    /// Two processes, `--op read|readv`: the reads in flight, by message.
    pub(super) reads: VecDeque<(u64, Request)>,
}

impl RxSide {
    /// A receiving end on `conn` of engine `engine`, receiving into `dst` (`desc`: exported
    /// for `--op write`), nothing received yet.
    pub(super) fn new(engine: usize, conn: ConnId, dst: Buffer, desc: Option<Descriptor>) -> Self {
        RxSide {
            engine,
            conn,
            dst,
            desc,
            reqs: VecDeque::new(),
            next_post: 0,
            received: 0,
            ended: false,
            credits: None,
            reads: VecDeque::new(),
        }
    }
}

/// A flow: the ends of it that this process runs.
pub(super) struct Flow {
    /// Its number (`0..--flows`), which picks its patterns.
    pub(super) id: u64,
    pub(super) tx: Option<TxSide>,
    pub(super) rx: Option<RxSide>,
}

/// The bytes of a message written or checked at a time: the pattern's piece stays in the
/// first-level cache between its making and its copy.
const PIECE: usize = 4096;

/// The pieces of a `len`-byte message: (offset, length), [`PIECE`] bytes each but the last.
fn pieces(len: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..len)
        .step_by(PIECE)
        .map(move |at| (at, PIECE.min(len - at)))
}

/// Writes each message's pattern into its slot of the sender's buffer and checks it in the
/// receiver's (nothing with `--no-payload`), timing both.
pub(super) struct Payload<'a> {
    args: &'a Args,
    /// The message size.
    msg: u64,
    /// Messages per flow in flight: the slots of each buffer.
    window: u64,
    /// A piece of a message's bytes (all of them for vectored messages).
    scratch: Vec<u8>,
    /// Vectored messages: where their blocks lie, and a message's bytes put back in order.
    scatter: Option<(Scatter, Vec<u8>)>,
    /// The time spent writing and checking.
    pub(super) time: Duration,
}

impl<'a> Payload<'a> {
    /// Where the blocks of vectored messages lie (`--op writev|readv`).
    pub(super) fn scatter(&self) -> Option<&Scatter> {
        self.scatter.as_ref().map(|(s, _)| s)
    }

    /// The payload of `args`' flows: `msg`-byte messages in `window` slots.
    pub(super) fn new(args: &'a Args, msg: u64, window: u64) -> Self {
        let scatter = args.op.vectored().then(|| {
            let writes = !args.op.reads();
            let sc = Scatter::new(u64::from(args.iov), args.block_size, args.seed, writes);
            (sc, vec![0u8; msg as usize])
        });
        // A piece at a time, unless the blocks of a message are gathered whole.
        let scratch = match scatter {
            Some(_) => msg as usize,
            None => (msg as usize).min(PIECE),
        };
        Payload {
            args,
            msg,
            window,
            scratch: vec![0u8; scratch],
            scatter,
            time: Duration::ZERO,
        }
    }

    /// Writes message `m` of flow `f` into its slot of the source buffer, a piece at a time.
    pub(super) fn fill(&mut self, f: &Flow, m: u64) -> Result<(), String> {
        if self.args.no_payload || self.msg == 0 {
            return Ok(());
        }
        let t = Instant::now();
        let tx = f.tx.as_ref().expect("a sending end");
        let p = pattern::Pattern::new(self.args.seed, f.id, m);
        let slot = ((m % self.window) * self.msg) as usize;
        let piece = &mut self.scratch[..PIECE.min(self.msg as usize)];
        for (at, n) in pieces(self.msg as usize) {
            p.fill(at, &mut piece[..n]);
            tx.src
                .write_at(slot + at, &piece[..n])
                .map_err(|e| format!("flow {}: writing message {m}: {e}", f.id))?;
        }
        self.time += t.elapsed();
        Ok(())
    }

    /// Checks message `m` of flow `f` in its slot of the destination buffer (a piece at a
    /// time, unless its blocks are to be gathered first).
    pub(super) fn verify(&mut self, f: &Flow, m: u64) -> Result<(), String> {
        if self.args.no_payload || self.msg == 0 {
            return Ok(());
        }
        let t = Instant::now();
        let rx = f.rx.as_ref().expect("a receiving end");
        let off = ((m % self.window) * self.msg) as usize;
        let p = pattern::Pattern::new(self.args.seed, f.id, m);
        let tamper = self
            .args
            .tamper
            .filter(|&(tf, tm, _)| (tf, tm) == (f.id, m))
            .map(|(_, _, at)| at as usize);
        let read = |at: usize, into: &mut [u8]| {
            rx.dst
                .read_at(off + at, into)
                .map_err(|e| format!("flow {}: reading message {m}: {e}", f.id))?;
            if let Some(b) = tamper.and_then(|x| into.get_mut(x.checked_sub(at)?)) {
                *b ^= 0x40;
            }
            Ok::<(), String>(())
        };
        let bad = match &mut self.scatter {
            Some((sc, back)) => {
                read(0, &mut self.scratch)?;
                sc.gather(&self.scratch, back);
                p.first_mismatch(0, back)
            }
            None => {
                let piece = &mut self.scratch[..PIECE.min(self.msg as usize)];
                let mut bad = None;
                for (at, n) in pieces(self.msg as usize) {
                    read(at, &mut piece[..n])?;
                    bad = p.first_mismatch(at, &piece[..n]);
                    if bad.is_some() {
                        break;
                    }
                }
                bad
            }
        };
        self.time += t.elapsed();
        match bad {
            None => Ok(()),
            Some(at) => Err(format!(
                "flow {} message {m}: byte {at} of {} differs from the pattern (seed {})",
                f.id, self.msg, self.args.seed
            )),
        }
    }
}
