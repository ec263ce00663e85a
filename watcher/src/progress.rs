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
