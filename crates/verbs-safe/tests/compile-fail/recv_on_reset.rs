use verbs_safe::{Qp, Rc, RecvWr, Reset};

fn post(qp: &Qp<Rc, Reset>) {
    // SAFETY: never runs; this must not compile.
    let _ = unsafe { qp.post_recv(&mut [RecvWr::new(1)]) };
}

fn main() {}
