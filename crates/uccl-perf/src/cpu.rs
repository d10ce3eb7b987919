//! The CPU time of this process: `clock_gettime(CLOCK_PROCESS_CPUTIME_ID)` through rustix's
//! safe wrapper (every thread, to the nanosecond, up to date at the call).

use std::time::Duration;

/// The CPU time the process has used so far.
pub(crate) fn process_time() -> Option<Duration> {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    let secs = u64::try_from(t.tv_sec).ok()?;
    let nanos = u32::try_from(t.tv_nsec).ok()?;
    Some(Duration::new(secs, nanos))
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_time_grows_with_work() {
        let a = super::process_time().unwrap();
        let mut x = 0u64;
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_millis(5) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let b = super::process_time().unwrap();
        assert!(b >= a + std::time::Duration::from_millis(4), "{a:?} {b:?}");
    }
}
