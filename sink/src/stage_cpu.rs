//! CPU time each stage of the sink spends on its own threads, summed since
//! the process started, so that the commit round's trace can say where a
//! small write's CPU goes. Sampling profilers on virtual machines charge
//! stalls to whichever instruction is running; a thread's own CPU clock,
//! read around a stage, does not.
//!
//! A benchmark aid: compiled in only with the `stage-clocks` feature (the
//! binary's `bench` feature), so production builds read no clock here.

#[cfg(feature = "stage-clocks")]
use std::sync::atomic::{AtomicU64, Ordering};

/// The stages timed. Whatever the sink spends outside them (receiving,
/// decoding, answering, RocksDB's own threads) is the process's CPU time
/// less their sum.
#[derive(Clone, Copy)]
pub(crate) enum Stage {
    /// Placing a batch: checks, records in memory, every write into files.
    Place,
    /// A commit round on its blocking thread: folding the ranges into the
    /// records and writing the manifest batch. Its waits for the journal
    /// write take no CPU time, so they do not count.
    Round,
    /// The journal thread's writes and fdatasyncs.
    Journal,
}

#[cfg(feature = "stage-clocks")]
const STAGES: usize = 3;
#[cfg(feature = "stage-clocks")]
static TOTAL_NANOS: [AtomicU64; STAGES] = [const { AtomicU64::new(0) }; STAGES];

/// CPU time of the calling thread, in nanoseconds.
#[cfg(feature = "stage-clocks")]
fn thread_cpu_nanos() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec for the call to fill in.
    let failed = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) } != 0;
    if failed {
        return 0;
    }
    (now.tv_sec as u64) * 1_000_000_000 + now.tv_nsec as u64
}

/// Adds the calling thread's CPU time to `stage` from its creation to its
/// drop; nothing at all without the `stage-clocks` feature.
pub(crate) struct StageTimer {
    #[cfg(feature = "stage-clocks")]
    stage: Stage,
    #[cfg(feature = "stage-clocks")]
    started: u64,
}

impl StageTimer {
    #[cfg(feature = "stage-clocks")]
    pub fn start(stage: Stage) -> Self {
        Self {
            stage,
            started: thread_cpu_nanos(),
        }
    }

    #[cfg(not(feature = "stage-clocks"))]
    pub fn start(_stage: Stage) -> Self {
        Self {}
    }
}

impl Drop for StageTimer {
    fn drop(&mut self) {
        #[cfg(feature = "stage-clocks")]
        {
            let spent = thread_cpu_nanos().saturating_sub(self.started);
            TOTAL_NANOS[self.stage as usize].fetch_add(spent, Ordering::Relaxed);
        }
    }
}

/// Microseconds spent so far in place, round and journal.
#[cfg(feature = "stage-clocks")]
pub(crate) fn totals_us() -> [u64; STAGES] {
    TOTAL_NANOS
        .each_ref()
        .map(|n| n.load(Ordering::Relaxed) / 1000)
}

/// The totals for the commit round's trace: `[place, round, journal]` in microseconds, or `off` in a build without the clocks.
pub(crate) fn totals_text() -> String {
    #[cfg(feature = "stage-clocks")]
    return format!("{:?}", totals_us());
    #[cfg(not(feature = "stage-clocks"))]
    return "off".to_owned();
}

#[cfg(all(test, feature = "stage-clocks"))]
mod tests {
    use super::*;

    #[test]
    fn a_timed_stage_adds_its_threads_cpu_time() {
        let before = totals_us()[Stage::Journal as usize];
        {
            let _timer = StageTimer::start(Stage::Journal);
            let started = std::time::Instant::now();
            let mut spin = 0u64;
            while started.elapsed() < std::time::Duration::from_millis(20) {
                spin = std::hint::black_box(spin.wrapping_add(1));
            }
        }
        // Spinning 20 ms of wall time on this thread is at least some CPU
        // time; only its presence is asserted, not an amount.
        assert!(totals_us()[Stage::Journal as usize] > before);
    }
}
