//! The checkpoint: which files changed since the last one, their
//! acknowledged offsets written to the watcher's state store, and how long
//! writing has been failing. The [`Checkpoints`] own the store; the
//! progress snapshot published beside each checkpoint, with each file's
//! lag state, is [`progress_of`].

use std::time::{Duration, Instant};

use manifest_db::{WatchState, WatchedFile};

use super::files::{FileKey, FileTable, Set, Tracked};
use crate::lag::LagPolicy;
use crate::progress::FileProgress;

/// One warning per this long while checkpoints cannot be written.
const CHECKPOINT_WARN_EVERY: Duration = Duration::from_secs(30);

/// The watcher's state store and what it does not hold yet.
pub(super) struct Checkpoints {
    state: WatchState,
    /// Files changed since the last checkpoint written.
    dirty: Set<FileKey>,
    /// Since when checkpoints have failed (the state directory full or
    /// failing), and when that was last logged.
    failing: Option<(Instant, Instant)>,
}

impl Checkpoints {
    pub(super) fn new(state: WatchState) -> Self {
        Self {
            state,
            dirty: Set::default(),
            failing: None,
        }
    }

    /// What an earlier run recorded.
    pub(super) fn load(&self) -> anyhow::Result<Vec<WatchedFile>> {
        Ok(self.state.load()?)
    }

    /// `key` changed: the next checkpoint writes it.
    pub(super) fn mark(&mut self, key: &FileKey) {
        if !self.dirty.contains(key) {
            self.dirty.insert(key.clone());
        }
    }

    /// Writes one record now, apart from the checkpoints.
    pub(super) fn record_now(&self, record: WatchedFile) -> anyhow::Result<()> {
        Ok(self.state.save(&[record], false)?)
    }

    /// Writes the acknowledged offsets of the files changed since the last
    /// checkpoint; true once written. A checkpoint that cannot be written
    /// (the state directory is full or failing) is only an optimisation
    /// lost: the transfer goes on, a warning says so (at most every
    /// [`CHECKPOINT_WARN_EVERY`]), and the next checkpoint tries again. A
    /// restart meanwhile resumes from the last checkpoint written, or
    /// reconciles with the sinks.
    pub(super) fn write(&mut self, files: &FileTable) -> bool {
        let records: Vec<WatchedFile> = self
            .dirty
            .iter()
            .filter_map(|key| files.get(key))
            .map(Tracked::record)
            .collect();
        let saved = match records.is_empty() {
            true => Ok(()),
            false => self.state.save(&records, false),
        };
        let now = Instant::now();
        match saved {
            Ok(()) => {
                if let Some((since, _)) = self.failing.take() {
                    tracing::info!(
                        failing_for_s = now.duration_since(since).as_secs(),
                        "checkpoints are written again"
                    );
                }
                self.dirty.clear();
                true
            }
            Err(error) => {
                let (since, logged) = self.failing.get_or_insert((now, now));
                if *logged == now || now.duration_since(*logged) >= CHECKPOINT_WARN_EVERY {
                    tracing::warn!(
                        %error,
                        failing_for_s = now.duration_since(*since).as_secs(),
                        files = records.len(),
                        "cannot write the watcher's checkpoint; the transfer goes on, and a restart now would resume from the last checkpoint written or reconcile with the sinks"
                    );
                    *logged = now;
                }
                false
            }
        }
    }
}

/// Each tracked file's progress and lag state now, its lag history moved on.
pub(super) fn progress_of(
    files: &mut FileTable,
    now: Instant,
    policy: &LagPolicy,
    sink_last_ack: &[Instant],
) -> Vec<FileProgress> {
    files
        .values_mut()
        .map(|t| {
            let acked = t.acked_offset();
            let seconds_behind = t
                .growth
                .front()
                .map_or(0.0, |&(_, seen)| now.duration_since(seen).as_secs_f64());
            t.lag.observe(now, t.size_seen, acked, policy.window);
            let sink_quiet = sink_last_ack
                .get(t.sink)
                .map_or(Duration::MAX, |at| now.duration_since(*at));
            let assessed = t.lag.assess(
                now,
                seconds_behind,
                t.sealed,
                t.failed.is_some(),
                sink_quiet,
                policy,
            );
            FileProgress {
                path: t.path.clone(),
                generation: t.generation,
                sink: t.sink,
                size: t.size_seen,
                acked,
                seconds_behind,
                sealed: t.sealed,
                state: assessed.state,
                append_rate: assessed.append_rate,
                drain_rate: assessed.drain_rate,
                eta_seconds: assessed.eta_seconds,
            }
        })
        .collect()
}
