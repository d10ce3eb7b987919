use verbs_safe::{Init, Qp, Rc, SendOp, SendWr};

fn post(qp: &Qp<Rc, Init>) {
    // SAFETY: never runs; this must not compile.
    let _ = unsafe { qp.post_send(&mut [SendWr::new(1, SendOp::Send)]) };
}

fn main() {}
