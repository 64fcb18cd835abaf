//! The host's TSC frequency, for the guest kernel's command line (`tsc_early_khz=`).
//!
//! Under TCG the guest reads the host's TSC (QEMU's `rdtsc` helper returns the host's
//! ticks), and the microvm machine has neither HPET nor an ACPI PM timer to calibrate it
//! against; the kernel then tries the PIT, whose calibration fails when the host is busy
//! (TCG's timing jitters), marks the TSC unstable and hangs in early boot without a
//! clock (measured here: no output after the "Marking TSC unstable" line while other
//! builds ran; 3.9 s to `/init` with the frequency given). Telling it the frequency skips
//! the calibration, and the delay loop's with it.
//!
//! Measured against `CLOCK_MONOTONIC_RAW` over a few short windows, each bracketed by
//! two clock reads so a preempted sample is recognised and dropped; only on a host whose
//! TSC is invariant (`constant_tsc` and `nonstop_tsc`).

use std::sync::OnceLock;
use std::time::Duration;

fn raw_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes a timespec on this stack frame.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_RAW, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(target_arch = "x86_64")]
fn rdtsc() -> u64 {
    // SAFETY: rdtsc has no preconditions on x86_64.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// A (ns, tsc) pair taken close together: the clock read before and after the TSC read
/// differ by at most `spread` ns.
#[cfg(target_arch = "x86_64")]
fn sample() -> (u64, u64, u64) {
    let a = raw_ns();
    let t = rdtsc();
    let b = raw_ns();
    ((a + b) / 2, t, b - a)
}

/// Whether `/proc/cpuinfo`'s flags say the TSC ticks at one rate whatever the CPU does.
pub fn invariant_tsc(cpuinfo: &str) -> bool {
    cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .is_some_and(|l| {
            let flags: Vec<&str> = l.split_whitespace().collect();
            flags.contains(&"constant_tsc") && flags.contains(&"nonstop_tsc")
        })
}

/// The middle value of the estimates.
pub fn median(mut v: Vec<u64>) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    Some(v[v.len() / 2])
}

#[cfg(target_arch = "x86_64")]
fn measure() -> Option<u64> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    if !invariant_tsc(&cpuinfo) {
        return None;
    }
    let mut estimates = Vec::new();
    for _ in 0..7 {
        let (t0, c0, s0) = sample();
        std::thread::sleep(Duration::from_millis(8));
        let (t1, c1, s1) = sample();
        // A sample that took over 20 µs was preempted between its reads.
        if s0 > 20_000 || s1 > 20_000 || t1 <= t0 || c1 <= c0 {
            continue;
        }
        estimates.push((c1 - c0) as u128 * 1_000_000 / (t1 - t0) as u128);
    }
    let khz = median(estimates.into_iter().map(|e| e as u64).collect())?;
    // Anything outside 100 MHz .. 10 GHz is a broken measurement.
    (100_000..10_000_000).contains(&khz).then_some(khz)
}

#[cfg(not(target_arch = "x86_64"))]
fn measure() -> Option<u64> {
    None
}

/// The host's TSC frequency in kHz, measured once per process; `None` when the TSC is
/// not invariant or the measurement failed.
pub fn host_khz() -> Option<u64> {
    static KHZ: OnceLock<Option<u64>> = OnceLock::new();
    *KHZ.get_or_init(measure)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invariance_needs_both_flags() {
        assert!(invariant_tsc(
            "processor : 0\nflags : fpu constant_tsc nonstop_tsc\n"
        ));
        assert!(!invariant_tsc("flags : fpu constant_tsc\n"));
        assert!(!invariant_tsc("flags : fpu nonstop_tsc_x constant_tsc\n"));
        assert!(!invariant_tsc(""));
    }

    #[test]
    fn the_median_ignores_outliers() {
        assert_eq!(median(vec![5, 1, 1_000_000, 4, 3]), Some(4));
        assert_eq!(median(vec![]), None);
    }

    #[test]
    fn this_host_measures_consistently() {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        if !invariant_tsc(&cpuinfo) {
            eprintln!("SKIP: this host's TSC is not invariant");
            return;
        }
        let (Some(a), Some(b)) = (measure(), measure()) else {
            eprintln!("SKIP: every sample was preempted (a very busy host)");
            return;
        };
        // Two measurements agree within 0.5 %.
        assert!(a.abs_diff(b) * 200 < a, "{a} vs {b}");
    }
}
