//! Step timings for the debug events of the cold path: one [`Stopwatch`] per procedure,
//! one lap per step, all laps in one `tracing::debug!` event as `*_us` fields.
//!
//! Two `Instant::now()` reads per step (a vDSO call, tens of nanoseconds), no allocation:
//! cheap enough to run whether or not debug logging is on.

use std::time::Instant;

/// Microseconds per step since the previous lap.
#[derive(Debug, Clone, Copy)]
pub struct Stopwatch {
    start: Instant,
    last: Instant,
}

impl Stopwatch {
    pub fn start() -> Stopwatch {
        let now = Instant::now();
        Stopwatch {
            start: now,
            last: now,
        }
    }

    /// Microseconds since the previous lap (or the start); starts the next lap.
    pub fn lap_us(&mut self) -> u64 {
        let now = Instant::now();
        let us = micros(now - self.last);
        self.last = now;
        us
    }

    /// Microseconds since the start.
    pub fn total_us(&self) -> u64 {
        micros(self.start.elapsed())
    }
}

fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn laps_add_up_to_at_most_the_total() {
        let mut sw = Stopwatch::start();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let a = sw.lap_us();
        let b = sw.lap_us();
        assert!(a >= 2000, "{a}");
        assert!(a + b <= sw.total_us());
    }
}
