//! What the watcher reports about itself: bytes seen, read and
//! acknowledged, each tracked file's lag and state, the source's verdict,
//! its links to the sinks and whether it is ready, for `status`, metrics
//! and the terminal view. The tailer and the run publish here; exporters
//! read snapshots and never reach into the tailer.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use flight_server::{ConnectionStats, PoolEvents};

use crate::lag::{FileState, LAG_CLASSES, LagEvents, lag_class};

/// One tracked file as last published by the tailer.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct FileProgress {
    pub path: String,
    pub generation: u64,
    /// Which of the watcher's sinks the file goes to (an index into
    /// [`Progress::sinks`]).
    pub sink: usize,
    pub size: u64,
    pub acked: u64,
    /// Seconds since the oldest byte not yet acknowledged was seen.
    pub seconds_behind: f64,
    pub sealed: bool,
    pub state: FileState,
    /// Bytes per second appended at the source and acknowledged by the
    /// sink, over the lag window.
    pub append_rate: f64,
    pub drain_rate: f64,
    /// Seconds until caught up at today's rates, while catching up.
    pub eta_seconds: Option<f64>,
}

impl FileProgress {
    pub fn bytes_behind(&self) -> u64 {
        self.size.saturating_sub(self.acked)
    }
}

/// Where the watcher is in its life, for readiness checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    Starting,
    /// Asking the sinks what they hold (a watcher without state).
    Reconciling,
    Tailing,
    Stopped,
}

/// One sink as the watcher sees it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SinkLink {
    pub endpoint: String,
    pub connections: usize,
    pub connected: usize,
    /// Each connection's figures.
    pub connection_stats: Vec<ConnectionStats>,
}

/// How the watcher hears of changes, and what it cannot hear of.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct DiscoveryStatus {
    /// inotify, fanotify or poll: what is in use, after any fallback.
    pub events: String,
    pub watched_directories: u64,
    /// Directories no event reaches (inotify's watch limit reached, or
    /// another error): their files are polled, new files found by rescans.
    pub unwatched_directories: u64,
    /// Why, while any directory is unwatched.
    pub unwatched_reason: Option<String>,
    /// Files polled because no event tells of them (every file with
    /// `--events poll`).
    pub polled_files: u64,
    /// Entries the last walk passed over (symbolic links, names that are
    /// not UTF-8, unreadable directories, FIFOs...), and a few of them
    /// with the reason.
    pub skipped_entries: u64,
    pub skipped_examples: Vec<String>,
}

/// A source's files summed up: what operators alert on.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct SourceSummary {
    /// The worst state of its files (idle with none).
    pub verdict: FileState,
    /// Files by state, in [`FileState::ALL`] order (done counts every
    /// file sealed since the start).
    pub files_by_state: Vec<(FileState, u64)>,
    /// Files by seconds behind, in [`LAG_CLASSES`] order.
    pub files_by_lag_class: Vec<(&'static str, u64)>,
    pub lag_bytes_sum: u64,
    pub lag_bytes_max: u64,
    pub lag_seconds_sum: f64,
    pub lag_seconds_max: f64,
    pub append_rate: f64,
    pub drain_rate: f64,
}

#[derive(Default)]
pub struct Progress {
    bytes_observed: AtomicU64,
    bytes_read: AtomicU64,
    bytes_acked: AtomicU64,
    files: Mutex<Vec<FileProgress>>,
    sealed_files: AtomicU64,
    phase: AtomicU8,
    sinks: Mutex<Vec<SinkLink>>,
    pool_events: OnceLock<Arc<dyn PoolEvents>>,
    lag_events: OnceLock<Arc<dyn LagEvents>>,
    /// The tailer's heartbeat: it publishes every checkpoint (200 ms) and
    /// beats while it walks a tree, so a count that stops moving is a
    /// tailer that stopped.
    publications: AtomicU64,
    /// Seals acknowledged since the start.
    seals: AtomicU64,
    discovery: Mutex<DiscoveryStatus>,
}

impl Progress {
    /// Growth seen at the source (bytes appended since the watcher started
    /// following each file).
    pub fn add_observed(&self, bytes: u64) {
        self.bytes_observed.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn add_read(&self, bytes: u64) {
        self.bytes_read.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn add_acked(&self, bytes: u64) {
        self.bytes_acked.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn bytes_observed(&self) -> u64 {
        self.bytes_observed.load(Ordering::Relaxed)
    }

    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }

    pub fn bytes_acked(&self) -> u64 {
        self.bytes_acked.load(Ordering::Relaxed)
    }

    pub fn sealed_files(&self) -> u64 {
        self.sealed_files.load(Ordering::Relaxed)
    }

    pub(crate) fn publish(&self, files: Vec<FileProgress>, sealed: u64) {
        self.publications.fetch_add(1, Ordering::Relaxed);
        self.sealed_files.store(sealed, Ordering::Relaxed);
        *self.files.lock().unwrap_or_else(|p| p.into_inner()) = files;
    }

    /// The tailer's heartbeat: publications and walks.
    pub fn publications(&self) -> u64 {
        self.publications.load(Ordering::Relaxed)
    }

    pub(crate) fn beat(&self) {
        self.publications.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn add_sealed(&self) {
        self.seals.fetch_add(1, Ordering::Relaxed);
    }

    /// Files whose seal the sink acknowledged since the start (never goes
    /// down, unlike [`Progress::sealed_files`]).
    pub fn seals(&self) -> u64 {
        self.seals.load(Ordering::Relaxed)
    }

    /// The files still being tracked (not yet sealed).
    pub fn files(&self) -> Vec<FileProgress> {
        self.files.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Published after each walk of the tree.
    pub(crate) fn set_discovery(&self, status: DiscoveryStatus) {
        *self.discovery.lock().unwrap_or_else(|p| p.into_inner()) = status;
    }

    pub fn discovery(&self) -> DiscoveryStatus {
        self.discovery
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn set_phase(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::Relaxed);
    }

    pub fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Relaxed) {
            0 => Phase::Starting,
            1 => Phase::Reconciling,
            2 => Phase::Tailing,
            _ => Phase::Stopped,
        }
    }

    pub(crate) fn set_sinks(&self, sinks: Vec<SinkLink>) {
        *self.sinks.lock().unwrap_or_else(|p| p.into_inner()) = sinks;
    }

    pub fn sinks(&self) -> Vec<SinkLink> {
        self.sinks.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Where the connections to the sinks tell what happens to batches
    /// (acknowledgement latencies); set it before the watcher runs.
    pub fn set_pool_events(&self, events: Arc<dyn PoolEvents>) {
        if self.pool_events.set(events).is_err() {
            tracing::warn!("pool events were set twice; the first stay");
        }
    }

    pub(crate) fn pool_events(&self) -> Option<Arc<dyn PoolEvents>> {
        self.pool_events.get().cloned()
    }

    /// Where the tailer tells how long growth took to become durable; set
    /// it before the watcher runs.
    pub fn set_lag_events(&self, events: Arc<dyn LagEvents>) {
        if self.lag_events.set(events).is_err() {
            tracing::warn!("lag events were set twice; the first stay");
        }
    }

    pub(crate) fn lag_events(&self) -> Option<Arc<dyn LagEvents>> {
        self.lag_events.get().cloned()
    }

    /// The source's files summed up from one snapshot of them.
    pub fn summary(&self, files: &[FileProgress]) -> SourceSummary {
        summarize(files, self.sealed_files())
    }
}

fn summarize(files: &[FileProgress], sealed: u64) -> SourceSummary {
    let mut by_state = [0u64; FileState::ALL.len()];
    let mut by_class = [0u64; LAG_CLASSES.len()];
    let mut summary = SourceSummary::default();
    for file in files {
        by_state[file.state as usize] += 1;
        by_class[lag_class(file.seconds_behind)] += 1;
        let behind = file.bytes_behind();
        summary.lag_bytes_sum += behind;
        summary.lag_bytes_max = summary.lag_bytes_max.max(behind);
        summary.lag_seconds_sum += file.seconds_behind;
        summary.lag_seconds_max = summary.lag_seconds_max.max(file.seconds_behind);
        summary.append_rate += file.append_rate;
        summary.drain_rate += file.drain_rate;
    }
    summary.verdict = match files.iter().map(|f| f.state).max_by_key(|s| s.severity()) {
        Some(worst) => worst,
        None if sealed > 0 => FileState::Done,
        None => FileState::Idle,
    };
    by_state[FileState::Done as usize] += sealed;
    summary.files_by_state = FileState::ALL
        .iter()
        .map(|&s| (s, by_state[s as usize]))
        .collect();
    summary.files_by_lag_class = LAG_CLASSES
        .iter()
        .zip(by_class)
        .map(|(&(name, _), n)| (name, n))
        .collect();
    summary
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_add_up_and_snapshots_replace_each_other() {
        let progress = Progress::default();
        progress.add_read(10);
        progress.add_read(5);
        progress.add_acked(7);
        assert_eq!((progress.bytes_read(), progress.bytes_acked()), (15, 7));
        let file = |path: &str, size, acked| FileProgress {
            path: path.into(),
            size,
            acked,
            ..FileProgress::default()
        };
        progress.publish(vec![file("a", 10, 4), file("b", 3, 3)], 2);
        assert_eq!(progress.sealed_files(), 2);
        let files = progress.files();
        assert_eq!(files.len(), 2);
        assert_eq!(files[0].bytes_behind(), 6);
        assert_eq!(files[1].bytes_behind(), 0);
        progress.publish(vec![file("c", 1, 0)], 3);
        let files = progress.files();
        assert_eq!((files.len(), files[0].path.as_str()), (1, "c"));
        assert_eq!(progress.sealed_files(), 3);
    }

    #[test]
    fn bytes_behind_never_underflows() {
        // Acknowledged beyond what was last sized up (a stat racing an ack).
        let file = FileProgress {
            size: 3,
            acked: 5,
            ..FileProgress::default()
        };
        assert_eq!(file.bytes_behind(), 0);
    }

    #[test]
    fn a_summary_sums_lag_and_takes_the_worst_state_as_its_verdict() {
        let file = |size, acked, seconds_behind, state| FileProgress {
            size,
            acked,
            seconds_behind,
            state,
            ..FileProgress::default()
        };
        let files = [
            file(10, 10, 0.0, FileState::CaughtUp),
            file(100, 40, 2.5, FileState::Progressing),
            file(50, 20, 12.0, FileState::Stalled),
        ];
        let summary = summarize(&files, 4);
        assert_eq!(summary.verdict, FileState::Stalled);
        assert_eq!((summary.lag_bytes_sum, summary.lag_bytes_max), (90, 60));
        assert_eq!(summary.lag_seconds_max, 12.0);
        let count = |state| {
            summary
                .files_by_state
                .iter()
                .find(|(s, _)| *s == state)
                .map(|(_, n)| *n)
        };
        assert_eq!(count(FileState::Done), Some(4));
        assert_eq!(count(FileState::Stalled), Some(1));
        assert_eq!(count(FileState::Failed), Some(0));
        let classes: Vec<u64> = summary.files_by_lag_class.iter().map(|(_, n)| *n).collect();
        assert_eq!(classes, [1, 0, 1, 1, 0]);
        assert_eq!(summarize(&[], 0).verdict, FileState::Idle);
        assert_eq!(summarize(&[], 3).verdict, FileState::Done);
    }
}
