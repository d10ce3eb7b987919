use verbs_safe::{ConnInit, Qp, Reset, Ud};

fn init(qp: Qp<Ud, Reset>) {
    let _ = qp.init(ConnInit::default());
}

fn main() {}
