//! The names libibverbs gives its enumerations (`ibv_wc_status_str` and friends) and its rate
//! conversions: tables indexed by the enumeration's value.

use std::ffi::{CStr, c_char};

/// `ibv_wc_status` names, by value.
const WC_STATUS: [&CStr; 24] = [
    c"success",
    c"local length error",
    c"local QP operation error",
    c"local EE context operation error",
    c"local protection error",
    c"Work Request Flushed Error",
    c"memory management operation error",
    c"bad response error",
    c"local access error",
    c"remote invalid request error",
    c"remote access error",
    c"remote operation error",
    c"transport retry counter exceeded",
    c"RNR retry counter exceeded",
    c"local RDD violation error",
    c"remote invalid RD request",
    c"aborted error",
    c"invalid EE context number",
    c"invalid EE context state",
    c"fatal error",
    c"response timeout error",
    c"general error",
    c"TM error",
    c"TM software rendezvous",
];

/// `ibv_event_type` names, by value.
const EVENT_TYPE: [&CStr; 21] = [
    c"CQ error",
    c"local work queue catastrophic error",
    c"invalid request local work queue error",
    c"local access violation work queue error",
    c"communication established",
    c"send queue drained",
    c"path migrated",
    c"path migration request error",
    c"local catastrophic error",
    c"port active",
    c"port error",
    c"LID change",
    c"P_Key change",
    c"SM change",
    c"SRQ catastrophic error",
    c"SRQ limit reached",
    c"last WQE reached",
    c"client reregistration",
    c"GID table change",
    c"WQ fatal",
    c"device fatal",
];

/// `ibv_port_state` names, by value.
const PORT_STATE: [&CStr; 6] = [
    c"no state change (NOP)",
    c"down",
    c"init",
    c"armed",
    c"active",
    c"active defer",
];

/// `ibv_node_type` names, by value from -1 (unknown).
const NODE_TYPE: [&CStr; 8] = [
    c"unknown",
    c"unknown",
    c"InfiniBand channel adapter",
    c"InfiniBand switch",
    c"InfiniBand router",
    c"iWARP NIC",
    c"usNIC",
    c"usNIC UDP",
];

fn pick(table: &[&'static CStr], i: i64, unknown: &'static CStr) -> *const c_char {
    usize::try_from(i)
        .ok()
        .and_then(|i| table.get(i))
        .copied()
        .unwrap_or(unknown)
        .as_ptr()
}

/// The name of a completion status.
pub(crate) fn wc_status(status: u32) -> *const c_char {
    pick(&WC_STATUS, i64::from(status), c"unknown")
}

/// The name of an async event type.
pub(crate) fn event_type(kind: u32) -> *const c_char {
    pick(&EVENT_TYPE, i64::from(kind), c"unknown")
}

/// The name of a port state.
pub(crate) fn port_state(state: u32) -> *const c_char {
    pick(&PORT_STATE, i64::from(state), c"unknown")
}

/// The name of a node type (`-1` is unknown).
pub(crate) fn node_type(kind: i32) -> *const c_char {
    pick(&NODE_TYPE, i64::from(kind) + 1, c"unknown")
}

/// `ibv_rate` values with their multiple of 2.5 Gb/s (-1: not a multiple) and their Mb/s.
const RATES: [(i32, i32, i32); 23] = [
    (2, 1, 2_500),
    (5, 2, 5_000),
    (3, 4, 10_000),
    (6, 8, 20_000),
    (4, 12, 30_000),
    (7, 16, 40_000),
    (8, 24, 60_000),
    (9, 32, 80_000),
    (10, 48, 120_000),
    (11, -1, 14_062),
    (12, -1, 56_250),
    (13, -1, 112_500),
    (14, -1, 168_750),
    (15, -1, 25_781),
    (16, -1, 103_125),
    (17, -1, 206_250),
    (18, -1, 309_375),
    (19, 11, 28_125),
    (20, 20, 53_125),
    (21, 160, 425_000),
    (22, 240, 637_500),
    (23, 320, 850_000),
    (24, 480, 1_275_000),
];

/// Column `to` of the row of `RATES` whose column `from` is `key` (a multiple must be
/// positive to name a rate), or `missing`.
fn rate_column(from: usize, key: i32, to: usize, missing: i32) -> i32 {
    let col = |r: &(i32, i32, i32)| [r.0, r.1, r.2];
    RATES
        .iter()
        .map(col)
        .find(|r| r[from] == key && (from != 1 || key > 0))
        .map_or(missing, |r| r[to])
}

/// `ibv_rate_to_mult`: the multiple of 2.5 Gb/s, -1 if none.
pub(crate) fn rate_to_mult(rate: i32) -> i32 {
    rate_column(0, rate, 1, -1)
}

/// `mult_to_ibv_rate`: the rate of a multiple of 2.5 Gb/s, 0 (`IBV_RATE_MAX`) if none.
pub(crate) fn mult_to_rate(mult: i32) -> i32 {
    rate_column(1, mult, 0, 0)
}

/// `ibv_rate_to_mbps`: the rate in Mb/s, -1 if unknown.
pub(crate) fn rate_to_mbps(rate: i32) -> i32 {
    rate_column(0, rate, 2, -1)
}

/// `mbps_to_ibv_rate`: the rate of a speed in Mb/s, 0 (`IBV_RATE_MAX`) if none.
pub(crate) fn mbps_to_rate(mbps: i32) -> i32 {
    rate_column(2, mbps, 0, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_rates() {
        // SAFETY: every pointer returned points into a static C string.
        let s = |p| unsafe { CStr::from_ptr(p) }.to_str().unwrap();
        assert_eq!(s(wc_status(0)), "success");
        assert_eq!(s(wc_status(5)), "Work Request Flushed Error");
        assert_eq!(s(wc_status(999)), "unknown");
        assert_eq!(s(event_type(15)), "SRQ limit reached");
        assert_eq!(s(port_state(4)), "active");
        assert_eq!(s(node_type(1)), "InfiniBand channel adapter");
        assert_eq!(s(node_type(-1)), "unknown");
        assert_eq!(s(wc_status(23)), "TM software rendezvous");
        // 40 Gb/s (IBV_RATE_40_GBPS = 7) is 16 x 2.5; 30 Gb/s (4) is 12 x 2.5.
        assert_eq!(
            (rate_to_mult(7), rate_to_mult(4), mult_to_rate(16)),
            (16, 12, 7)
        );
        // 100 Gb/s (IBV_RATE_100_GBPS = 16) is 103125 Mb/s of signalling, no multiple.
        assert_eq!(
            (rate_to_mbps(16), rate_to_mult(16), mbps_to_rate(103_125)),
            (103_125, -1, 16)
        );
        assert_eq!(
            (rate_to_mult(99), rate_to_mbps(99), mbps_to_rate(1)),
            (-1, -1, 0)
        );
    }
}
