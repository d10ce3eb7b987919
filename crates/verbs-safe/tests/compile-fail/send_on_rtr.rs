use verbs_safe::{Qp, Rtr, Uc};

fn post(qp: &Qp<Uc, Rtr>) {
    let _batch = qp.send_batch();
}

fn main() {}
