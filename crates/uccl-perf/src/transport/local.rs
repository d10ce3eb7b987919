//! Both ends of every flow in this process: on softnic, on one fabric's virtual clock under
//! its faults (the same seed gives the same run); on a real device, in loopback on the wall
//! clock. Flow `f` runs from the even engine to the odd one of pair `f % --engines`; with
//! `--senders N` (an incast), engine 0 receives every flow and engines 1..=N send `--flows`
//! each.

use uccl_engine::{Access, Clock, Engine, connect_pair};
use verbs_safe::Verbs;

use super::flow::{Flow, RxSide, TxSide};
use super::measure::execute;
use super::{Measured, Role, buffer, engine_config, inflight, open};
use crate::args::{Args, OpArg};

/// Runs both ends of every flow in this process.
pub(super) fn run(args: &Args) -> Result<Measured, String> {
    let senders = usize::from(args.fabric.senders);
    let (devices, flows, per_engine) = if senders > 0 {
        let flows = senders * usize::from(args.flows);
        (senders + 1, flows, flows as u32)
    } else {
        let pairs = usize::from(args.engines);
        let flows = usize::from(args.flows);
        (2 * pairs, flows, flows.div_ceil(pairs) as u32)
    };
    // Flow f's sending and receiving engines.
    let ends = |f: usize| match senders {
        0 => {
            let p = f % usize::from(args.engines);
            (2 * p, 2 * p + 1)
        }
        n => (1 + f % n, 0),
    };
    let cfg = engine_config(args, per_engine);
    let (fabric, verbs, names) = if args.soft() {
        let fabric = softnic::Fabric::new(softnic::FabricConfig {
            devices,
            seed: args.seed,
            auto_advance: false,
            copy_payload: !args.no_payload,
            topology: args.fabric.topology(),
            ..Default::default()
        });
        fabric
            .set_default_faults(args.faults())
            .map_err(|e| e.to_string())?;
        let verbs = Verbs::soft(&fabric);
        let names = (0..devices).map(|i| format!("soft{i}")).collect();
        (Some(fabric), verbs, names)
    } else {
        (None, Verbs::system(), vec![args.device.clone(); devices])
    };
    let clock = fabric
        .as_ref()
        .map_or_else(Clock::wall, |f| Clock::Fabric(f.clone()));
    let mut engines = Vec::with_capacity(devices);
    for name in &names {
        let ctx = open(&verbs, name)?;
        engines.push(
            Engine::new(&ctx, cfg.clone(), clock.clone())
                .map_err(|e| super::engine_error(name, &e))?,
        );
    }
    let window = u64::from(inflight(args));
    let msg = args.msg_size();
    let mut list = Vec::with_capacity(flows);
    for f in 0..flows {
        let (s, r) = ends(f);
        let (sender, receiver) = two(&mut engines, s, r);
        let (ca, cb) =
            connect_pair(sender, receiver).map_err(|e| format!("connecting flow {f}: {e}"))?;
        let src = buffer(sender, window * msg)?;
        let dst = buffer(receiver, window * msg)?;
        let desc = match args.op {
            OpArg::Send => None,
            OpArg::Write | OpArg::Writev => Some(
                receiver
                    .export(&dst, 0, window * msg)
                    .map_err(|e| format!("exporting flow {f}'s region: {e}"))?,
            ),
            // The receiver reads the sender's buffer.
            OpArg::Read | OpArg::Readv => Some(
                sender
                    .export_with(&src, 0, window * msg, Access::READ)
                    .map_err(|e| format!("exporting flow {f}'s region: {e}"))?,
            ),
        };
        list.push(Flow {
            id: f as u64,
            tx: Some(TxSide::new(s, ca, src)),
            rx: Some(RxSide::new(r, cb, dst, desc)),
        });
    }
    execute(args, Role::Both, engines, names, fabric, list, false)
}

/// Engines `a` and `b` (different) of `all`, both mutable.
fn two(all: &mut [Engine], a: usize, b: usize) -> (&mut Engine, &mut Engine) {
    if a < b {
        let (x, y) = all.split_at_mut(b);
        (&mut x[a], &mut y[0])
    } else {
        let (x, y) = all.split_at_mut(a);
        (&mut y[0], &mut x[b])
    }
}
