//! What the watcher reports about itself: bytes read and acknowledged, and
//! how far behind each file is, for the terminal view and metrics.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// One tracked file as last published by the tailer.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct FileProgress {
    pub path: String,
    pub size: u64,
    pub acked: u64,
    /// Seconds since the oldest byte not yet acknowledged was seen.
    pub seconds_behind: f64,
    pub sealed: bool,
}

impl FileProgress {
    pub fn bytes_behind(&self) -> u64 {
        self.size.saturating_sub(self.acked)
    }
}

#[derive(Default)]
pub struct Progress {
    bytes_read: AtomicU64,
    bytes_acked: AtomicU64,
    files: Mutex<Vec<FileProgress>>,
    sealed_files: AtomicU64,
}

impl Progress {
    pub fn add_read(&self, bytes: u64) {
        self.bytes_read.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn add_acked(&self, bytes: u64) {
        self.bytes_acked.fetch_add(bytes, Ordering::Relaxed);
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
        self.sealed_files.store(sealed, Ordering::Relaxed);
        *self.files.lock().unwrap_or_else(|p| p.into_inner()) = files;
    }

    /// The files still being tracked (not yet sealed).
    pub fn files(&self) -> Vec<FileProgress> {
        self.files.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
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
}
