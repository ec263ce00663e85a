//! When each stream's next write is due: a fixed schedule with optional bursts.
//!
//! The schedule advances by whole periods from the run's start (`next += period`)
//! rather than sleeping a period after each write, so time spent writing or oversleeping
//! does not accumulate as drift and the long-run rate holds.

use std::time::{Duration, Instant};

/// How far behind schedule a stream may fall before it gives up catching up. A DAQ
/// buffers about this much and writes it out in a burst after a stall; beyond that,
/// replaying an arbitrarily long backlog back to back would no longer look like a detector.
const MAX_LAG: Duration = Duration::from_secs(1);

/// Longest single sleep, so a stop request is noticed promptly even at low rates.
const SLEEP_SLICE: Duration = Duration::from_millis(20);

#[derive(Clone, Copy, Debug)]
pub(crate) struct Burst {
    pub every: Duration,
    pub len: Duration,
    pub factor: f64,
}

pub(crate) struct Pacer {
    start: Instant,
    next: Instant,
    /// None: write back to back.
    rate_hz: Option<f64>,
    burst: Option<Burst>,
    /// Writes skipped because the stream fell more than MAX_LAG behind.
    pub dropped_schedule: u64,
}

/// What the stream should do after waiting.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    Write,
    Stop,
}

impl Pacer {
    pub fn new(start: Instant, rate_hz: f64, burst: Option<Burst>) -> Self {
        Pacer {
            start,
            next: start,
            rate_hz: (rate_hz > 0.0).then_some(rate_hz),
            burst,
            dropped_schedule: 0,
        }
    }

    /// Rate in force at `at`: bursts start at every multiple of `every` after the start
    /// and last `len`.
    fn rate_at(&self, rate: f64, at: Instant) -> f64 {
        match self.burst {
            Some(b) if !b.every.is_zero() => {
                let since = at.saturating_duration_since(self.start).as_nanos();
                let phase = since % b.every.as_nanos();
                if phase < b.len.as_nanos() {
                    rate * b.factor
                } else {
                    rate
                }
            }
            _ => rate,
        }
    }

    /// When the next write is due; `None` when writing back to back (always due).
    pub fn due(&self) -> Option<Instant> {
        self.rate_hz.map(|_| self.next)
    }

    /// Waits until the next write is due. Returns `Stop` instead of sleeping past
    /// `end` or once `stopping()` says so.
    pub fn wait(&self, end: Option<Instant>, stopping: impl Fn() -> bool) -> Wait {
        loop {
            if stopping() {
                return Wait::Stop;
            }
            let now = Instant::now();
            if end.is_some_and(|e| now >= e || self.next >= e) {
                return Wait::Stop;
            }
            if self.rate_hz.is_none() || now >= self.next {
                return Wait::Write;
            }
            std::thread::sleep((self.next - now).min(SLEEP_SLICE));
        }
    }

    /// Records that the due write happened and schedules the next one.
    pub fn advance(&mut self) {
        let Some(rate) = self.rate_hz else {
            return;
        };
        // Capped so a vanishing rate cannot overflow the Instant arithmetic.
        let secs = (1.0 / self.rate_at(rate, self.next)).min(86_400.0);
        let period = Duration::from_secs_f64(secs);
        self.next += period;
        let now = Instant::now();
        if now > self.next + MAX_LAG {
            let behind = now - self.next;
            let skipped = (behind.as_secs_f64() / period.as_secs_f64()) as u64;
            self.dropped_schedule += skipped;
            tracing::warn!(
                behind_ms = behind.as_millis() as u64,
                skipped,
                "writer fell behind its schedule; dropping the backlog"
            );
            self.next = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_window_multiplies_rate() {
        let start = Instant::now();
        let p = Pacer::new(
            start,
            100.0,
            Some(Burst {
                every: Duration::from_secs(1),
                len: Duration::from_millis(200),
                factor: 5.0,
            }),
        );
        assert_eq!(p.rate_at(100.0, start), 500.0);
        assert_eq!(p.rate_at(100.0, start + Duration::from_millis(199)), 500.0);
        assert_eq!(p.rate_at(100.0, start + Duration::from_millis(200)), 100.0);
        assert_eq!(p.rate_at(100.0, start + Duration::from_millis(999)), 100.0);
        assert_eq!(p.rate_at(100.0, start + Duration::from_millis(1100)), 500.0);
    }

    #[test]
    fn schedule_does_not_drift() {
        // Advancing without waiting must move `next` by exact periods from the start.
        let start = Instant::now();
        let mut p = Pacer::new(start, 1000.0, None);
        for _ in 0..500 {
            p.advance();
        }
        let elapsed = p.next - start;
        assert!(
            elapsed >= Duration::from_millis(499) && elapsed <= Duration::from_millis(501),
            "{elapsed:?}"
        );
    }
}
