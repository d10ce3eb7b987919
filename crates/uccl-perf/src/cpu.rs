//! The CPU time of this process: `clock_gettime(CLOCK_PROCESS_CPUTIME_ID)` through rustix's
//! safe wrapper (every thread, to the nanosecond, up to date at the call). rustix is built on
//! libc (`use-libc`): its own vDSO lookup crashes under valgrind (rustix issue 1559).

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
        // No timing threshold (the machine may be busy): only that spinning is counted.
        let a = super::process_time().unwrap();
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while super::process_time().unwrap() <= a {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            assert!(
                start.elapsed().as_secs() < 10,
                "CPU time never moved from {a:?}"
            );
        }
    }
}
