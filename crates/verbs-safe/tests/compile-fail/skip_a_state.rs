use verbs_safe::{Init, Qp, Rc, RcRts};

fn up(qp: Qp<Rc, Init>) {
    let _ = qp.rts(RcRts::new(0));
}

fn main() {}
