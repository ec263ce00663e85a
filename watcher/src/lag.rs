//! Lag: how far each tracked file is behind at its sink, in bytes and in
//! seconds, the state that says whether it is keeping up, and the verdict
//! for a whole source.
//!
//! Bytes behind are the file's size as last seen minus its acknowledged
//! contiguous offset (acknowledged means durable at the sink). Seconds
//! behind are the age of the oldest byte not yet acknowledged, from the
//! tailer's growth marks. The state comes from a short history of samples
//! per file, taken each time the tailer publishes its progress.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Where a file stands, from best to worst as [`FileState::severity`] ranks
/// them (done and idle owe nothing; failed needs a person).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum FileState {
    /// Sealed: every byte is durable at the sink and the digest matched.
    Done,
    /// Not growing and nothing owed.
    #[default]
    Idle,
    /// Growing, and every byte seen is durable or was seen within the
    /// policy's `caught_up_within` (the pipeline's own latency).
    CaughtUp,
    /// Bytes are owed, and the sink keeps up with the growth.
    Progressing,
    /// Bytes are owed and the amount owed grew over the sampling window.
    FallingBehind,
    /// Bytes are owed and the acknowledged offset has not moved for the
    /// stall time.
    Stalled,
    /// The watcher gave up on the file (see its log).
    Failed,
}

impl FileState {
    pub const ALL: [FileState; 7] = [
        FileState::Done,
        FileState::Idle,
        FileState::CaughtUp,
        FileState::Progressing,
        FileState::FallingBehind,
        FileState::Stalled,
        FileState::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FileState::Done => "done",
            FileState::Idle => "idle",
            FileState::CaughtUp => "caught-up",
            FileState::Progressing => "progressing",
            FileState::FallingBehind => "falling-behind",
            FileState::Stalled => "stalled",
            FileState::Failed => "failed",
        }
    }

    /// Higher is worse: the worst state of a source's files is its verdict.
    pub fn severity(self) -> u8 {
        self as u8
    }
}

/// When a file counts as caught up, stalled or idle, and how far back
/// rates look.
#[derive(Clone, Copy, Debug)]
pub struct LagPolicy {
    /// Owed bytes all seen this recently are the pipeline's latency, not a
    /// lag: a file streaming steadily always has a batch in flight.
    pub caught_up_within: Duration,
    /// Owed bytes waiting this long with no acknowledgement: stalled.
    pub stall_after: Duration,
    /// No growth for this long with nothing owed: idle (else caught up).
    pub idle_after: Duration,
    /// Rates and the lag's trend are measured over this much history.
    pub window: Duration,
}

impl Default for LagPolicy {
    fn default() -> Self {
        Self {
            caught_up_within: Duration::from_secs(1),
            stall_after: Duration::from_secs(10),
            idle_after: Duration::from_secs(30),
            window: Duration::from_secs(10),
        }
    }
}

/// A file's recent history: (when, size seen, acknowledged offset) samples
/// spanning at most the policy's window, plus when the acknowledged offset
/// last moved and when the file last grew.
#[derive(Debug)]
pub(crate) struct LagHistory {
    samples: VecDeque<(Instant, u64, u64)>,
    last_ack_move: Instant,
    last_growth: Instant,
}

/// What [`LagHistory::assess`] makes of a file now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Assessment {
    pub state: FileState,
    /// Bytes per second appended and acknowledged over the window.
    pub append_rate: f64,
    pub drain_rate: f64,
    /// Seconds until caught up at today's rates, when it is catching up.
    pub eta_seconds: Option<f64>,
}

/// Samples kept per file at most, whatever the publish rate: the window
/// is then coarser, never larger in memory.
const MAX_SAMPLES: usize = 64;

/// The owed bytes must grow by more than this share of what was appended
/// in the window to count as falling behind: a steady stream always has a
/// batch or two in flight, and their coming and going is not a trend.
const FALLING_BEHIND_SHARE: f64 = 0.05;

impl LagHistory {
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            samples: VecDeque::new(),
            last_ack_move: now,
            last_growth: now,
        }
    }

    /// Records the file's size and acknowledged offset as of `now`.
    pub(crate) fn observe(&mut self, now: Instant, size: u64, acked: u64, window: Duration) {
        if let Some(&(_, last_size, last_acked)) = self.samples.back() {
            if acked != last_acked {
                self.last_ack_move = now;
            }
            if size > last_size {
                self.last_growth = now;
            }
            if size < last_size || acked < last_acked {
                // A new generation starts from zero: its history is its own.
                self.samples.clear();
            }
        }
        // Keep one sample older than the window so the window is covered.
        while self.samples.len() >= 2 && now.duration_since(self.samples[1].0) >= window {
            self.samples.pop_front();
        }
        // A file that neither grows nor drains keeps two samples (the first
        // and the last of the flat run), not one per publication.
        let len = self.samples.len();
        if len >= 2
            && (self.samples[len - 1].1, self.samples[len - 1].2) == (size, acked)
            && (self.samples[len - 2].1, self.samples[len - 2].2) == (size, acked)
        {
            self.samples[len - 1].0 = now;
            return;
        }
        if self.samples.len() == MAX_SAMPLES {
            self.samples.remove(MAX_SAMPLES / 2);
        }
        self.samples.push_back((now, size, acked));
    }

    /// The file's state and rates as of the last sample.
    /// `sink_quiet` is how long the file's sink has acknowledged nothing at
    /// all: a file whose own acknowledgements stopped while its sink keeps
    /// acknowledging others waits its turn (falling behind), it is not
    /// stalled.
    pub(crate) fn assess(
        &self,
        now: Instant,
        seconds_behind: f64,
        sealed: bool,
        failed: bool,
        sink_quiet: Duration,
        policy: &LagPolicy,
    ) -> Assessment {
        let (rates, owed, owed_before, appended) = match (self.samples.front(), self.samples.back())
        {
            (Some(&(t0, size0, acked0)), Some(&(t1, size1, acked1))) if t1 > t0 => {
                let dt = t1.duration_since(t0).as_secs_f64();
                let appended = size1.saturating_sub(size0);
                (
                    (
                        appended as f64 / dt,
                        acked1.saturating_sub(acked0) as f64 / dt,
                    ),
                    size1.saturating_sub(acked1),
                    size0.saturating_sub(acked0),
                    appended,
                )
            }
            (_, Some(&(_, size, acked))) => {
                // One sample shows no trend.
                let owed = size.saturating_sub(acked);
                ((0.0, 0.0), owed, owed, 0)
            }
            _ => ((0.0, 0.0), 0, 0, 0),
        };
        let (append_rate, drain_rate) = rates;
        let state = if sealed {
            FileState::Done
        } else if failed {
            FileState::Failed
        } else if owed == 0 {
            if now.duration_since(self.last_growth) >= policy.idle_after {
                FileState::Idle
            } else {
                FileState::CaughtUp
            }
        } else if seconds_behind < policy.caught_up_within.as_secs_f64() {
            FileState::CaughtUp
        } else if seconds_behind >= policy.stall_after.as_secs_f64()
            && now.duration_since(self.last_ack_move) >= policy.stall_after
        {
            if sink_quiet >= policy.stall_after {
                FileState::Stalled
            } else {
                FileState::FallingBehind
            }
        } else if owed > owed_before
            && (owed - owed_before) as f64 > FALLING_BEHIND_SHARE * appended as f64
        {
            FileState::FallingBehind
        } else {
            FileState::Progressing
        };
        let net = drain_rate - append_rate;
        let eta_seconds = (owed > 0 && net > 0.0).then(|| owed as f64 / net);
        Assessment {
            state,
            append_rate,
            drain_rate,
            eta_seconds,
        }
    }
}

/// What the tailer tells its owner as acknowledgements arrive, for the
/// distributions the owner keeps.
pub trait LagEvents: Send + Sync + 'static {
    /// A growth of a file that the watcher saw `latency` ago is now
    /// durable at its sink (append → durable, as the watcher sees it).
    fn seen_to_durable(&self, latency: Duration);
}

/// Files per lag class, by seconds behind: bounded labels for how many
/// files are how far behind, whatever their number.
pub const LAG_CLASSES: [(&str, f64); 5] = [
    ("0s", 0.0),
    ("1s", 1.0),
    ("10s", 10.0),
    ("60s", 60.0),
    ("inf", f64::INFINITY),
];

/// The index in [`LAG_CLASSES`] of the first class whose bound holds
/// `seconds_behind` (a class named "10s" holds up to 10 seconds).
pub fn lag_class(seconds_behind: f64) -> usize {
    LAG_CLASSES
        .iter()
        .position(|&(_, bound)| seconds_behind <= bound)
        .unwrap_or(LAG_CLASSES.len() - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    /// A sink that has acknowledged nothing for a long time.
    const QUIET: Duration = Duration::from_secs(3600);

    fn policy() -> LagPolicy {
        LagPolicy::default()
    }

    /// Feeds one sample a second; `at(i)` is second i.
    struct Clock(Instant);
    impl Clock {
        fn at(&self, secs: u64) -> Instant {
            self.0 + Duration::from_secs(secs)
        }
    }

    fn run(samples: &[(u64, u64)]) -> (LagHistory, Clock) {
        let clock = Clock(Instant::now());
        let mut history = LagHistory::new(clock.at(0));
        for (i, &(size, acked)) in samples.iter().enumerate() {
            history.observe(clock.at(i as u64), size, acked, policy().window);
        }
        (history, clock)
    }

    #[test]
    fn a_file_whose_sink_keeps_up_is_caught_up_then_idle() {
        let (history, clock) = run(&[(MIB, MIB), (2 * MIB, 2 * MIB), (3 * MIB, 3 * MIB)]);
        let now = clock.at(2);
        assert_eq!(
            history
                .assess(now, 0.0, false, false, QUIET, &policy())
                .state,
            FileState::CaughtUp
        );
        let later = clock.at(2 + 30);
        assert_eq!(
            history
                .assess(later, 0.0, false, false, QUIET, &policy())
                .state,
            FileState::Idle
        );
    }

    #[test]
    fn owed_bytes_growing_over_the_window_are_falling_behind_with_no_eta() {
        let samples: Vec<_> = (0..10).map(|i| (10 * MIB * i, 5 * MIB * i)).collect();
        let (history, clock) = run(&samples);
        let a = history.assess(clock.at(9), 1.0, false, false, QUIET, &policy());
        assert_eq!(a.state, FileState::FallingBehind);
        assert!((a.append_rate - 10.0 * MIB as f64).abs() < 1.0);
        assert!((a.drain_rate - 5.0 * MIB as f64).abs() < 1.0);
        assert_eq!(a.eta_seconds, None);
    }

    #[test]
    fn a_draining_backlog_is_progressing_with_an_eta() {
        // 100 MiB owed at the start, 2 MiB/s appended, 12 MiB/s acknowledged.
        let samples: Vec<_> = (0..6)
            .map(|i| (100 * MIB + 2 * MIB * i, 12 * MIB * i))
            .collect();
        let (history, clock) = run(&samples);
        let a = history.assess(clock.at(5), 3.0, false, false, QUIET, &policy());
        assert_eq!(a.state, FileState::Progressing);
        // 50 MiB owed, closing at 10 MiB/s.
        let eta = a.eta_seconds.expect("catching up");
        assert!((eta - 5.0).abs() < 0.01, "{eta}");
    }

    #[test]
    fn a_steady_stream_with_a_batch_in_flight_is_caught_up() {
        // 10 MiB/s with one 4 MiB batch owed, and once 4 MiB + 64 KiB.
        let mut samples: Vec<_> = (0..10)
            .map(|i| (10 * MIB * (i + 1), 10 * MIB * (i + 1) - 4 * MIB))
            .collect();
        samples[9].1 -= 64 << 10;
        let (history, clock) = run(&samples);
        let a = history.assess(clock.at(9), 0.4, false, false, QUIET, &policy());
        assert_eq!(a.state, FileState::CaughtUp);
        // The same owed bytes, older than the pipeline's latency: the trend
        // (flat) makes it progressing, not falling behind.
        let a = history.assess(clock.at(9), 2.0, false, false, QUIET, &policy());
        assert_eq!(a.state, FileState::Progressing);
    }

    #[test]
    fn owed_bytes_with_no_ack_for_the_stall_time_are_stalled() {
        let samples: Vec<_> = (0..12).map(|i| (MIB * (i + 1), MIB)).collect();
        let (history, clock) = run(&samples);
        // The oldest owed byte is 11 s old and nothing was acknowledged since second 0.
        let a = history.assess(clock.at(11), 11.0, false, false, QUIET, &policy());
        assert_eq!(a.state, FileState::Stalled);
        // Owed bytes that are fresh after a long quiet spell are not a stall.
        let a = history.assess(clock.at(11), 0.5, false, false, QUIET, &policy());
        assert_ne!(a.state, FileState::Stalled);
        // Nor is a file waiting its turn while its sink acknowledges others.
        let busy_sink = Duration::from_millis(100);
        let a = history.assess(clock.at(11), 11.0, false, false, busy_sink, &policy());
        assert_eq!(a.state, FileState::FallingBehind);
    }

    #[test]
    fn sealed_and_failed_files_say_so_whatever_their_rates() {
        let (history, clock) = run(&[(MIB, 0), (2 * MIB, 0)]);
        let now = clock.at(1);
        assert_eq!(
            history
                .assess(now, 99.0, true, false, QUIET, &policy())
                .state,
            FileState::Done
        );
        assert_eq!(
            history
                .assess(now, 99.0, false, true, QUIET, &policy())
                .state,
            FileState::Failed
        );
    }

    #[test]
    fn a_new_generation_starts_a_history_of_its_own() {
        let (mut history, clock) = run(&[(50 * MIB, 50 * MIB), (60 * MIB, 60 * MIB)]);
        history.observe(clock.at(2), MIB, 0, policy().window);
        let a = history.assess(clock.at(2), 2.0, false, false, QUIET, &policy());
        assert_eq!((a.append_rate, a.drain_rate), (0.0, 0.0));
        // One sample shows no trend.
        assert_eq!(a.state, FileState::Progressing);
    }

    #[test]
    fn the_history_stays_bounded_and_covers_the_window() {
        let clock = Clock(Instant::now());
        let mut history = LagHistory::new(clock.at(0));
        for i in 0..10_000u64 {
            let at = clock.0 + Duration::from_millis(i);
            history.observe(at, i * 100, i * 100, policy().window);
        }
        assert!(history.samples.len() <= MAX_SAMPLES);
        // Ten seconds of samples, one a millisecond: the oldest kept is the
        // first (the window is wider than the run), the newest the last.
        assert_eq!(history.samples.front().map(|s| s.1), Some(0));
        assert_eq!(history.samples.back().map(|s| s.1), Some(999_900));
    }

    #[test]
    fn a_file_at_rest_keeps_two_samples() {
        let samples: Vec<_> = (0..30).map(|_| (MIB, MIB)).collect();
        let (history, _) = run(&samples);
        assert_eq!(history.samples.len(), 2);
    }

    #[test]
    fn lag_classes_are_upper_bounds() {
        assert_eq!(LAG_CLASSES[lag_class(0.0)].0, "0s");
        assert_eq!(LAG_CLASSES[lag_class(0.2)].0, "1s");
        assert_eq!(LAG_CLASSES[lag_class(10.0)].0, "10s");
        assert_eq!(LAG_CLASSES[lag_class(59.0)].0, "60s");
        assert_eq!(LAG_CLASSES[lag_class(1e9)].0, "inf");
    }

    #[test]
    fn severities_rank_the_states() {
        let mut states = FileState::ALL;
        states.sort_by_key(|s| s.severity());
        assert_eq!(states, FileState::ALL);
        assert_eq!(states.last(), Some(&FileState::Failed));
    }
}
