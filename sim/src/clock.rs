//! The two clocks the simulation runs on, for both stand-ins.
//!
//! Device timelines and utilization samples use `CLOCK_MONOTONIC`, which
//! every process on the host shares, so the NVML stand-in in another process
//! can compare a sample with its own "now". NVML reports sample times on
//! the wall clock, so each sample also carries `CLOCK_REALTIME`.

fn read(clock: libc::clockid_t) -> libc::timespec {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec to a valid, exclusively
    // borrowed local; both clocks exist on every Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts
}

/// `CLOCK_MONOTONIC` in nanoseconds.
#[inline]
pub fn monotonic_ns() -> u64 {
    let ts = read(libc::CLOCK_MONOTONIC);
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// `CLOCK_REALTIME` in microseconds since the epoch (NVML's timestamps).
pub fn realtime_us() -> u64 {
    let ts = read(libc::CLOCK_REALTIME);
    (ts.tv_sec as u64) * 1_000_000 + ts.tv_nsec as u64 / 1_000
}
