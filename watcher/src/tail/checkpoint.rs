//! The checkpoint: acknowledged offsets written to the watcher's state
//! store, sealed files forgotten once recorded, and the progress snapshot
//! published for `status`, metrics and the terminal view, with each
//! file's lag state.

use super::*;

/// One warning per this long while checkpoints cannot be written.
const CHECKPOINT_WARN_EVERY: Duration = Duration::from_secs(30);

impl Tailer {
    /// Writes acknowledged offsets; forgets sealed files once recorded.
    /// A checkpoint that cannot be written (the state directory is full or
    /// failing) is only an optimisation lost: the transfer goes on, a
    /// warning says so (at most every [`CHECKPOINT_WARN_EVERY`]), and the
    /// next checkpoint tries again. A restart meanwhile resumes from the
    /// last checkpoint written, or reconciles with the sinks.
    pub(super) fn checkpoint(&mut self) -> anyhow::Result<()> {
        let records: Vec<WatchedFile> = self
            .dirty
            .iter()
            .filter_map(|key| self.files.get(key))
            .map(Tracked::record)
            .collect();
        let saved = match records.is_empty() {
            true => Ok(()),
            false => self.state.save(&records, false),
        };
        let now = Instant::now();
        match saved {
            Ok(()) => {
                if let Some((since, _)) = self.checkpoint_failing.take() {
                    tracing::info!(
                        failing_for_s = now.duration_since(since).as_secs(),
                        "checkpoints are written again"
                    );
                }
                self.dirty.clear();
            }
            Err(error) => {
                let (since, logged) = self.checkpoint_failing.get_or_insert((now, now));
                if *logged == now || now.duration_since(*logged) >= CHECKPOINT_WARN_EVERY {
                    tracing::warn!(
                        %error,
                        failing_for_s = now.duration_since(*since).as_secs(),
                        files = records.len(),
                        "cannot write the watcher's checkpoint; the transfer goes on, and a restart now would resume from the last checkpoint written or reconcile with the sinks"
                    );
                    *logged = now;
                }
                // Sealed files stay tracked until their records are written.
                self.publish_progress(now);
                return Ok(());
            }
        }
        let done: Vec<FileKey> = self
            .files
            .iter()
            .filter(|(_, t)| t.sealed)
            .map(|(k, _)| k.clone())
            .collect();
        for key in done {
            if let Some(t) = self.files.remove(&key) {
                if self.by_path.get(&t.path) == Some(&key) {
                    self.by_path.remove(&t.path);
                }
                // A newer generation of the same inode may own the entry now.
                if self.by_inode.get(&(t.dev, t.ino)) == Some(&key) {
                    self.by_inode.remove(&(t.dev, t.ino));
                }
            }
        }
        self.publish_progress(now);
        Ok(())
    }

    /// Publishes the progress snapshot, with each file's lag state.
    fn publish_progress(&mut self, now: Instant) {
        let policy = self.config.lag;
        let sink_last_ack = &self.sink_last_ack;
        let snapshot = self
            .files
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
                    &policy,
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
            .collect();
        self.progress.publish(snapshot, self.finished.len() as u64);
    }
}
