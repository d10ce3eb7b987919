//! Both ends of every flow in this process: on softnic, on one fabric's virtual clock under
//! its faults (the same seed gives the same run); on a real device, in loopback on the wall
//! clock. Flow `f` runs from the even engine to the odd one of pair `f % --engines`.

use uccl_engine::{Access, Clock, Engine, connect_pair};
use verbs_safe::Verbs;

use super::flow::{Flow, RxSide, TxSide};
use super::measure::execute;
use super::{Measured, Role, buffer, engine_config, inflight, open};
use crate::args::{Args, OpArg};

/// Runs both ends of every flow in this process.
pub(super) fn run(args: &Args) -> Result<Measured, String> {
    let pairs = usize::from(args.engines);
    let flows = usize::from(args.flows);
    let per_engine = flows.div_ceil(pairs) as u32;
    let cfg = engine_config(args, per_engine);
    let (fabric, verbs, names) = if args.soft() {
        let fabric = softnic::Fabric::new(softnic::FabricConfig {
            devices: 2 * pairs,
            seed: args.seed,
            auto_advance: false,
            copy_payload: !args.no_payload,
            ..Default::default()
        });
        fabric.set_default_faults(args.faults());
        let verbs = Verbs::soft(&fabric);
        let names = (0..2 * pairs).map(|i| format!("soft{i}")).collect();
        (Some(fabric), verbs, names)
    } else {
        (None, Verbs::system(), vec![args.device.clone(); 2 * pairs])
    };
    let clock = fabric
        .as_ref()
        .map_or_else(Clock::wall, |f| Clock::Fabric(f.clone()));
    let mut engines = Vec::with_capacity(2 * pairs);
    for name in &names {
        let ctx = open(&verbs, name)?;
        engines.push(
            Engine::new(&ctx, cfg.clone(), clock.clone())
                .map_err(|e| format!("starting an engine on {name}: {e}"))?,
        );
    }
    let window = u64::from(inflight(args));
    let msg = args.msg_size();
    let mut list = Vec::with_capacity(flows);
    for f in 0..flows {
        let p = f % pairs;
        let (a, b) = engines.split_at_mut(2 * p + 1);
        let (sender, receiver) = (&mut a[2 * p], &mut b[0]);
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
            tx: Some(TxSide::new(2 * p, ca, src)),
            rx: Some(RxSide::new(2 * p + 1, cb, dst, desc)),
        });
    }
    execute(args, Role::Both, engines, names, fabric, list, false)
}
