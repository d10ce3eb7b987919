//! Row 3: receive-buffer memory with one shared receive queue against a receive queue per
//! QP, computed from the engine's default configuration.

use uccl_engine::EngineConfig;

use super::{Out, Row, mib};

/// Row 3: SRQ vs per-QP receive queues, computed.
pub(super) fn rows(out: &mut Out) {
    let cfg = EngineConfig::default();
    let slot = u64::from(cfg.tx.chunk_size) + uccl_tx::wire::RETR_HDR_LEN as u64;
    let srq = u64::from(cfg.srq_depth) * slot;
    let rq_depth = u64::from(cfg.tx.flow_window);
    for n in [1u64, 16, 256, 1024] {
        let per_qp = n * rq_depth * slot;
        out.rows.push(Row::new(
            "3",
            "receive-buffer memory: per-QP RQs vs **SRQ**",
            format!("{n} QP{}", if n == 1 { "" } else { "s" }),
            mib(per_qp),
            mib(srq),
            srq as f64 / per_qp as f64,
            "",
        ));
    }
    out.notes.push(format!(
        "Row 3 (computed, not measured): `EngineConfig::default()`, {:?}, chunk {} B: a receive \
         buffer holds a retransmitted chunk, `[{}-byte header | chunk]` = {slot} B. SRQ: \
         `srq_depth` = {} buffers for the whole engine, whatever the number of QPs. Per-QP RQs: \
         each QP must absorb what its peer may put on it, and the path chooser may put a \
         connection's whole window on one QP: `flow_window` = {rq_depth} buffers per QP. (RC \
         posts zero-SGE WQEs: no buffers either way.)",
        cfg.mode,
        cfg.tx.chunk_size,
        uccl_tx::wire::RETR_HDR_LEN,
        cfg.srq_depth,
    ));
}
