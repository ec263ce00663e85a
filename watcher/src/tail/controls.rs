//! Control rows: one in flight per file (open, rename, seal), and when a
//! file is complete enough to seal, with digests from the seal hasher.

use std::fs::File;
use std::time::{Duration, Instant};

use flight_server::RowKind;

use super::Tailer;
use super::batcher::RowRef;
use super::files::{Control, FileKey, Set, Tracked};
use crate::config::WatchConfig;
use crate::discover;
use crate::seal_hash::{Hashed, Job};

/// How often every file is checked for an idle seal.
const SEAL_SWEEP_EVERY: Duration = Duration::from_millis(250);

impl Tailer {
    /// Sends queued control rows (one in flight per file) and seals files
    /// that are complete and fully acknowledged.
    pub(super) fn advance_controls(&mut self) {
        let now = Instant::now();
        // Files that changed since the last call, plus all of them now and
        // then for the idle-seal clock: no per-iteration sweep over every file.
        let keys: Vec<FileKey> = if now >= self.next_sweep {
            self.next_sweep = now + SEAL_SWEEP_EVERY;
            self.attention.clear();
            self.files.keys()
        } else {
            self.attention.drain().collect()
        };
        let mut to_flush = Set::default();
        let mut rewritten = Vec::new();
        for key in keys {
            let Some(t) = self.files.get_mut(&key) else {
                continue;
            };
            if t.control_in_flight || t.sealed || t.failed.is_some() {
                continue;
            }
            if t.controls.is_empty()
                && !t.seal_hashing
                && self.config.seal
                && seal_due(t, now, &self.config)
            {
                // A rewrite in place that grew past what was read shows only
                // at the head (walks check it, but a seal may come first):
                // sealing now would make the mixed bytes final.
                if !head_unchanged(t, &self.root) {
                    rewritten.push(key);
                    continue;
                }
                match seal_step(t, &self.root) {
                    Ok(SealStep::Ready(control)) => t.controls.push_back(control),
                    Ok(SealStep::Grew) => {}
                    Ok(SealStep::Hash(file)) => {
                        let job = Job {
                            id: key.clone(),
                            file,
                            size: t.read_offset,
                            kind: self.config.seal_digest,
                        };
                        // With the queue full, a later sweep asks again.
                        t.seal_hashing = self.seal_hasher.submit(job).is_ok();
                    }
                    Err(error) => {
                        tracing::warn!(path = %t.path, %error, "cannot size the file up for its seal; will retry")
                    }
                }
            }
            // A rename goes out once every byte read before it was seen is
            // acknowledged: a reader at the destination that stops waiting
            // at the new name (a DAQ's final name) then finds the file
            // whole there. Acks bring the file back here.
            if let Some(Control::Rename { after, .. }) = t.controls.front()
                && t.acked_offset() < *after
            {
                continue;
            }
            let Some(control) = t.controls.pop_front() else {
                continue;
            };
            let batch = self.outbound.batch(t.sink);
            let kind = match &control {
                Control::Open => {
                    batch.builder.push_open(&t.key, t.generation, &t.path);
                    RowKind::Open
                }
                Control::Rename { path, .. } => {
                    batch.builder.push_rename(&t.key, t.generation, path);
                    RowKind::Rename
                }
                Control::Seal { size, digest } => {
                    batch.builder.push_seal(&t.key, t.generation, *size, digest);
                    RowKind::Seal
                }
            };
            let (offset, path) = match control {
                Control::Seal { size, .. } => (size, None),
                Control::Rename { path, .. } => (0, Some(path)),
                Control::Open => (0, None),
            };
            batch.rows.push(RowRef {
                file: key.clone(),
                kind,
                offset,
                len: 0,
                path,
            });
            t.control_in_flight = true;
            let sink = t.sink;
            to_flush.insert(sink);
            self.outbound.flush_if_full(sink);
        }
        for sink in to_flush {
            self.outbound.flush(sink);
        }
        for key in rewritten {
            self.check_fingerprint(&key);
        }
    }

    /// Takes the digests the seal hasher finished and queues their seals,
    /// unless the file changed while it was being hashed.
    pub(super) fn collect_seal_digests(&mut self) {
        while let Some(Hashed { id, size, digest }) = self.seal_hasher.try_result() {
            let Some(t) = self.files.get_mut(&id) else {
                continue;
            };
            t.seal_hashing = false;
            self.attention.insert(id);
            let digest = match digest {
                Ok(digest) => digest,
                Err(error) => {
                    tracing::warn!(path = %t.path, %error, "cannot hash the file for its seal; will retry");
                    continue;
                }
            };
            let unchanged = t.read_offset == size
                && t.size_seen == size
                && current_size(t, &self.root).is_ok_and(|now| now == size);
            if unchanged
                && t.controls.is_empty()
                && !t.control_in_flight
                && !t.sealed
                && t.failed.is_none()
            {
                t.controls.push_back(Control::Seal { size, digest });
            }
        }
    }
}

pub(super) fn seal_due(t: &Tracked, now: Instant, config: &WatchConfig) -> bool {
    let complete = t.read_offset == t.size_seen && t.acked.covers(0, t.read_offset) && t.open_acked;
    if !complete {
        return false;
    }
    if t.seal_wanted {
        return true;
    }
    let idle = now.duration_since(t.last_change) >= config.seal_idle;
    // A polled file raises no close event: only idleness tells it is done.
    let may_be_done = t.closed || t.deleted || t.polled;
    idle && may_be_done && !t.path.ends_with(config.inprogress_suffix.as_str())
}

/// What sealing a complete file takes next.
pub(super) enum SealStep {
    /// It grew meanwhile: not complete after all.
    Grew,
    Ready(Control),
    /// Its digest must be read from disk (by the seal hasher, see [`crate::seal_hash::SealHasher`]).
    Hash(File),
}

/// The size of a tracked file now (a deleted one without a descriptor
/// cannot change any more); records its modification time.
pub(super) fn current_size(t: &mut Tracked, root: &std::path::Path) -> std::io::Result<u64> {
    let meta = match &t.file {
        Some(file) => file.metadata()?,
        None if t.deleted => return Ok(t.read_offset),
        None => std::fs::symlink_metadata(root.join(&t.path))?,
    };
    t.mtime_ns = discover::mtime_ns(&meta);
    Ok(meta.len())
}

/// The next step towards the seal of a complete file: its digest if it was
/// hashed while read, else a handle to hash it from.
pub(super) fn seal_step(t: &mut Tracked, root: &std::path::Path) -> std::io::Result<SealStep> {
    let size = t.read_offset;
    if current_size(t, root)? != size {
        return Ok(SealStep::Grew);
    }
    if let Some(hasher) = t.hasher.take()
        && t.hashed_to == size
    {
        let digest = hasher.finish();
        return Ok(SealStep::Ready(Control::Seal { size, digest }));
    }
    let file = match &t.file {
        Some(file) => file.try_clone()?,
        None => File::open(root.join(&t.path))?,
    };
    Ok(SealStep::Hash(file))
}

/// Whether a file's head still matches its fingerprint, read through its
/// descriptor when it has one: a file renamed or deleted a moment ago has
/// no path to read it by.
fn head_unchanged(t: &Tracked, root: &std::path::Path) -> bool {
    let len = t.fingerprint_len as u64;
    if len == 0 {
        return true;
    }
    let head = match &t.file {
        Some(file) => flight_server::checksum::crc32c_of_file_prefix(file, len).ok(),
        // Gone with no descriptor: nothing can be read, nor rewritten.
        None if t.deleted => return true,
        None => super::identity::head_crc(&root.join(&t.path), len),
    };
    head == Some(t.fingerprint)
}
