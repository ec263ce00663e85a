//! The checkpoint: acknowledged offsets written to the watcher's state
//! store, sealed files forgotten once recorded, and the progress snapshot
//! published for `status`, metrics and the terminal view, with each
//! file's lag state.

use super::*;

impl Tailer {
    /// Writes acknowledged offsets; forgets sealed files once recorded.
    pub(super) fn checkpoint(&mut self) -> anyhow::Result<()> {
        let records: Vec<WatchedFile> = self
            .dirty
            .iter()
            .filter_map(|key| self.files.get(key))
            .map(Tracked::record)
            .collect();
        if !records.is_empty() {
            self.state.save(&records, false)?;
        }
        self.dirty.clear();
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
        let now = Instant::now();
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
        Ok(())
    }
}
