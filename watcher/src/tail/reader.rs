//! Reading: opening and sizing up ready files, reading what was appended
//! into the open batch of their sink, round robin and a batch's worth at a
//! time, keeping the number of open descriptors bounded, and polling the
//! files no event tells of.

use std::os::unix::fs::OpenOptionsExt;
use std::time::Instant;

use flight_server::RowKind;

use super::Tailer;
use super::batcher::RowRef;
use super::files::{FINGERPRINT_LEN, FileKey};
use crate::discover;

/// Growth observations kept per file for its lag in seconds.
const MAX_GROWTH_MARKS: usize = 64;

/// Skipped entries the status names (all are counted).
const SKIPPED_EXAMPLES: usize = 5;

impl Tailer {
    pub(super) fn queue_due_polls(&mut self, now: Instant) {
        let due: Vec<FileKey> = self
            .files
            .iter()
            .filter(|(_, t)| t.polled && t.next_poll <= now && !t.sealed)
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            self.mark_ready(&key);
        }
    }

    /// After a walk: which files no event reaches (their directory could
    /// not be watched, inotify's watch limit most likely) and are polled,
    /// as `--events poll` polls every file; new files there are found by
    /// the walks. Told in the log when it starts and when it ends, and
    /// always in the status.
    pub(super) fn review_coverage(&mut self) {
        let coverage = self.discovery.coverage();
        let everything_polled = coverage.events == discover::EventSource::Poll;
        let polling_some = everything_polled || coverage.unwatched_dirs > 0;
        if polling_some || self.polling_some {
            for t in self.files.values_mut() {
                t.polled = everything_polled || !self.discovery.covers(directory_of(&t.path));
            }
        }
        self.polling_some = polling_some;
        if coverage.unwatched_dirs > 0 && self.unwatched_told == 0 {
            tracing::warn!(
                unwatched_dirs = coverage.unwatched_dirs,
                watched_dirs = coverage.watched_dirs,
                "{} directories cannot be watched: {}; files under them are polled (as --events poll does) and new files there are found by rescans (every {:?})",
                coverage.unwatched_dirs,
                coverage
                    .why_unwatched
                    .as_deref()
                    .unwrap_or("unknown reason"),
                self.config.rescan_every,
            );
        } else if coverage.unwatched_dirs == 0 && self.unwatched_told > 0 {
            tracing::info!(
                watched_dirs = coverage.watched_dirs,
                "every directory is watched again; files are no longer polled"
            );
        }
        self.unwatched_told = coverage.unwatched_dirs;
        self.progress
            .set_discovery(crate::progress::DiscoveryStatus {
                events: coverage.events.as_str().to_owned(),
                watched_directories: coverage.watched_dirs as u64,
                unwatched_directories: coverage.unwatched_dirs as u64,
                unwatched_reason: coverage.why_unwatched,
                polled_files: self.files.values().filter(|t| t.polled).count() as u64,
                skipped_entries: self.skipped.len() as u64,
                skipped_examples: self
                    .skipped
                    .iter()
                    .take(SKIPPED_EXAMPLES)
                    .map(|s| format!("{}: {}", s.path, s.why))
                    .collect(),
            });
    }

    /// Says once per entry what a walk passes over, so that nothing is
    /// skipped silently; the status shows the count and a few of them.
    pub(super) fn tell_skipped(&mut self, skipped: Vec<discover::Skipped>) {
        for entry in &skipped {
            if !self.skipped.contains(entry) {
                tracing::warn!(path = %entry.path, reason = entry.why, "not transferred");
            }
        }
        self.skipped = skipped.into_iter().collect();
    }

    /// Closes the descriptors of idle, fully read files when too many are
    /// open (they are opened again when the file grows). Deleted files keep
    /// theirs: their path cannot open them again.
    pub(super) fn shed_descriptors(&mut self) {
        self.opened_since_shed = 0;
        let cap = self.config.max_open_files.max(16);
        let open = self.files.values().filter(|t| t.file.is_some()).count();
        if open <= cap {
            return;
        }
        let mut idle: Vec<(Instant, FileKey)> = self
            .files
            .iter()
            .filter(|(_, t)| t.file.is_some() && !t.deleted && t.read_offset >= t.size_seen)
            .map(|(key, t)| (t.last_change, key.clone()))
            .collect();
        idle.sort();
        for (_, key) in idle.into_iter().take(open - cap / 2) {
            if let Some(t) = self.files.get_mut(&key) {
                t.file = None;
            }
        }
    }

    /// Reads appended bytes of ready files, a bounded amount each, round robin.
    pub(super) fn read_ready(&mut self) {
        let rounds = self.ready.len();
        for _ in 0..rounds {
            if self.opened_since_shed >= self.config.max_open_files.max(16) / 4 {
                self.shed_descriptors();
            }
            let Some(key) = self.ready.pop_front() else {
                break;
            };
            self.ready_set.remove(&key);
            match self.read_file(&key) {
                Ok(true) => self.mark_ready(&key),
                Ok(false) => {}
                Err(error) => {
                    if let Some(t) = self.files.get_mut(&key) {
                        tracing::warn!(path = %t.path, offset = t.read_offset, %error, "cannot read; will retry");
                        t.file = None;
                    }
                }
            }
        }
    }

    /// Opens and stats a ready file; returns its size when there is
    /// something to read.
    pub(super) fn prepare_read(&mut self, key: &FileKey) -> std::io::Result<Option<u64>> {
        let Some(t) = self.files.get_mut(key) else {
            return Ok(None);
        };
        if t.sealed || t.failed.is_some() || !t.open_acked {
            return Ok(None);
        }
        if t.file.is_none() {
            if t.deleted {
                return Ok(None);
            }
            let file = open_source(&self.root.join(&t.path))?;
            let meta = file.metadata()?;
            if !t.is(&meta) {
                // The path now holds another file; a walk will sort it out.
                return Ok(None);
            }
            t.file = Some(file);
            self.opened_since_shed += 1;
        }
        let Some(file) = &t.file else { return Ok(None) };
        let size = file.metadata()?.len();
        let now = Instant::now();
        if size < t.read_offset {
            tracing::warn!(path = %t.path, size, read = t.read_offset, "file shrank (truncated); starting a new generation");
            self.new_generation(key);
            return Ok(None);
        }
        // A file resumed from the checkpoint owes nothing below its
        // acknowledged offset: only what lies above is news.
        let seen_before = t.size_seen.max(t.acked_offset());
        if size > seen_before {
            self.progress.add_observed(size - seen_before);
        }
        t.size_seen = size;
        if size == t.read_offset {
            t.poll_interval = (t.poll_interval * 2).min(self.config.poll_max);
            t.next_poll = now + t.poll_interval;
            return Ok(None);
        }
        t.last_change = now;
        t.poll_interval = self.config.poll_min;
        t.next_poll = now + t.poll_interval;
        if t.growth.len() < MAX_GROWTH_MARKS {
            t.growth.push_back((size, now));
        } else if let Some(last) = t.growth.back_mut() {
            // Coarser but bounded: the newest mark absorbs further growth.
            last.0 = size;
        }
        Ok(Some(size))
    }

    /// Reads up to one batch worth of a file; returns true when more is waiting.
    pub(super) fn read_file(&mut self, key: &FileKey) -> std::io::Result<bool> {
        let Some(size) = self.prepare_read(key)? else {
            return Ok(false);
        };
        let budget = self.config.batch_bytes as u64;
        let mut sent = 0u64;
        loop {
            let Some(t) = self.files.get_mut(key) else {
                return Ok(false);
            };
            if t.read_offset >= size || sent >= budget {
                return Ok(t.read_offset < size);
            }
            let Some(file) = &t.file else {
                return Ok(false);
            };
            let offset = t.read_offset;
            let want = (size - offset).min(self.max_row_bytes as u64) as usize;
            let batch = self.outbound.batch(t.sink);
            let data =
                batch
                    .builder
                    .push_data_in_place(&t.key, t.generation, offset, want, |room| {
                        rustix::io::pread(file, room, offset).map(|(filled, _)| filled)
                    })?;
            let got = data.len();
            if got == 0 {
                return Ok(false);
            }
            if offset == 0 && t.hashed_to == 0 {
                t.hasher
                    .get_or_insert_with(|| self.config.seal_digest.hasher());
            }
            if let Some(hasher) = &mut t.hasher
                && t.hashed_to == offset
            {
                hasher.update(data);
                t.hashed_to += got as u64;
            }
            if offset < FINGERPRINT_LEN && offset == t.fingerprint_len as u64 {
                let head_end = (offset + got as u64).min(FINGERPRINT_LEN);
                t.fingerprint = flight_server::checksum::crc32c_append(
                    t.fingerprint,
                    &data[..(head_end - offset) as usize],
                );
                t.fingerprint_len = head_end as u32;
            }
            let sink = t.sink;
            batch.rows.push(RowRef {
                file: key.clone(),
                kind: RowKind::Data,
                offset,
                len: got as u64,
                path: None,
            });
            batch.started.get_or_insert_with(Instant::now);
            t.read_offset += got as u64;
            sent += got as u64;
            self.progress.add_read(got as u64);
            self.outbound.flush_if_full(sink);
        }
    }
}

/// Opens a source file for tailing, never through a link, and without
/// moving its access time where the kernel lets us (the owner, or
/// CAP_FOWNER), as backup tools read: the tailer reads a file once per
/// append, and the kernel's atime check was a visible share of each read.
fn open_source(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    let open = |flags| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(flags)
            .open(path)
    };
    match open(libc::O_NOFOLLOW | libc::O_NOATIME) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => open(libc::O_NOFOLLOW),
        opened => opened,
    }
}

/// The directory of a path relative to the root ("" for the root).
pub(super) fn directory_of(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(dir, _)| dir)
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;

    use super::*;
    use crate::testkit::Scratch;

    /// Tailing reads a file once per append; it leaves the file's access
    /// time where the writer's tools last put it.
    #[test]
    fn tailing_a_file_leaves_its_access_time_alone() {
        let scratch = Scratch::new("noatime");
        let path = scratch.path().join("run.xtc2");
        std::fs::write(&path, b"appended bytes").expect("write the source");
        // Older than its change: a read would move it under relatime too.
        let long_ago = rustix::fs::Timestamps {
            last_access: rustix::fs::Timespec {
                tv_sec: 1_000_000,
                tv_nsec: 0,
            },
            last_modification: rustix::fs::Timespec {
                tv_sec: 2_000_000,
                tv_nsec: 0,
            },
        };
        rustix::fs::utimensat(
            rustix::fs::CWD,
            &path,
            &long_ago,
            rustix::fs::AtFlags::empty(),
        )
        .expect("set the times");
        let mut read = Vec::new();
        open_source(&path)
            .expect("open the source")
            .read_to_end(&mut read)
            .expect("read the source");
        assert_eq!(read, b"appended bytes");
        let atime = std::fs::metadata(&path).expect("stat").atime();
        assert_eq!(atime, 1_000_000, "the tailer's read moved the access time");
    }
}
