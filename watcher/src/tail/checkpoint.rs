//! The checkpoint: acknowledged offsets written to the watcher's state
//! store, sealed files forgotten once recorded, and the progress snapshot
//! published for `status` and the terminal view.

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
        let snapshot = self
            .files
            .values()
            .map(|t| FileProgress {
                path: t.path.clone(),
                size: t.size_seen,
                acked: t.acked_offset(),
                seconds_behind: t
                    .growth
                    .front()
                    .map_or(0.0, |&(_, seen)| now.duration_since(seen).as_secs_f64()),
                sealed: t.sealed,
            })
            .collect();
        self.progress.publish(snapshot, self.finished.len() as u64);
        Ok(())
    }
}
