// A batch borrows its QP: the QP cannot be dropped (or reset, or moved to another state)
// while a batch of WRs for it is still being built.
use verbs_safe::{Qp, Rc, Rts};

fn build(qp: Qp<Rc, Rts>) {
    let batch = qp.send_batch();
    drop(qp);
    // SAFETY: never runs; this must not compile.
    let _ = unsafe { batch.submit() };
}

fn main() {}
