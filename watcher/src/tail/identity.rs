//! File identity: what a path found by a walk or an event is (a new file,
//! a rename, a new generation, a file resumed from the checkpoint or from a
//! sink's watermark, a sealed file seen again), told to the file table
//! (`files`), which keeps the maps that say so.

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::time::Instant;

use manifest_db::{IntervalSet, WatchedFile};

use super::files::{Control, FINGERPRINT_LEN, FileKey, Finished, Set, Tracked};
use super::{Adoption, Tailer, reader};
use crate::discover::{self, Change, Found};
use crate::lag::LagHistory;
use crate::shard::rendezvous;

impl Tailer {
    /// Handles one inotify change; returns true when a full rescan is needed.
    pub(super) fn on_change(&mut self, change: Change) -> bool {
        match change {
            Change::Overflow => {
                tracing::warn!("the event queue overflowed; rescanning the tree");
                return true;
            }
            Change::NewDir { path } => {
                self.discovery.watch_dir(&path);
                // Files may have been written before the watch existed.
                return true;
            }
            Change::Gone { path } => {
                if let Some(key) = self.files.key_at(&path) {
                    self.lost_path(&key);
                }
            }
            Change::Touched { path, closed } => {
                if closed {
                    // A close or a rename onto a tracked path may be of
                    // another file that replaced it (a temporary renamed over
                    // it, its own events merged or read late): the close
                    // belongs to whatever the path holds now.
                    self.look_at(&path, true);
                } else if let Some(key) = self.files.key_at(&path) {
                    if let Some(t) = self.files.get_mut(&key) {
                        // Written again after a close means open again.
                        t.closed = false;
                    }
                    self.mark_ready(&key);
                } else if !self.files.is_finished_path(&path) {
                    self.look_at(&path, false);
                }
            }
        }
        false
    }

    /// A tracked file's path disappeared: it was renamed (a later event or
    /// walk finds it by inode) or deleted (its descriptor still reads).
    pub(super) fn lost_path(&mut self, key: &FileKey) {
        let Some(t) = self.files.get(key) else {
            return;
        };
        let full = self.root.join(&t.path);
        match std::fs::symlink_metadata(&full) {
            Ok(meta) if t.is(&meta) => return,
            _ => {}
        }
        let path = t.path.clone();
        self.files.path_gone(&path);
        let Some(t) = self.files.get_mut(key) else {
            return;
        };
        if !t.deleted {
            tracing::debug!(path = %t.path, "file gone from its path (renamed or deleted); finishing what it holds");
        }
        t.deleted = true;
        t.last_change = Instant::now();
        self.checkpoints.mark(key);
        self.mark_ready(key);
    }

    /// Stats one path and brings it under tracking (new file, rename, new generation).
    pub(super) fn look_at(&mut self, path: &str, closed: bool) {
        let meta = match std::fs::symlink_metadata(self.root.join(path)) {
            Ok(meta) if meta.file_type().is_file() => meta,
            _ => {
                // Gone (or never a file) by now: a close still ends the
                // writing of what was tracked there.
                if closed && let Some(key) = self.files.key_at(path) {
                    if let Some(t) = self.files.get_mut(&key) {
                        t.closed = true;
                    }
                    self.mark_ready(&key);
                }
                return;
            }
        };
        let found = Found {
            path: path.to_owned(),
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
            mtime_ns: discover::mtime_ns(&meta),
            born_ns: discover::born_ns(&meta),
        };
        self.on_found(found);
        if closed
            && let Some(key) = self.files.key_at(path)
            && let Some(t) = self.files.get_mut(&key)
        {
            t.closed = true;
        }
    }

    pub(super) fn on_found(&mut self, found: Found) {
        let inode = (found.dev, found.ino);
        if self
            .files
            .finished(inode)
            .is_some_and(|done| !discover::same_birth(done.born_ns, found.born_ns))
        {
            // A sealed file was deleted and a new file reused its inode.
            let _ = self.files.forget_finished(inode);
        }
        if let Some(done) = self.files.finished(inode) {
            let unchanged = done.size == found.size && done.mtime_ns == found.mtime_ns;
            if unchanged && done.path == found.path {
                return;
            }
            let done = self.files.forget_finished(inode);
            if unchanged {
                // Renamed after its seal: rename it at the destination too.
                self.rename_sealed(done, &found);
            } else {
                tracing::warn!(path = %found.path, "a sealed file changed; sending it as a new generation");
                self.start_new(&found, Some(found.path.clone()));
            }
            return;
        }
        // Another inode now holds a sealed path: a new file replaced it.
        self.files.finished_path_taken(&found.path);
        let inode = (found.dev, found.ino);
        if let Some(key) = self.files.key_on(inode)
            && self
                .files
                .get(&key)
                .is_some_and(|t| t.reused_by(found.born_ns))
        {
            // The tracked file was deleted (it held no descriptor) and a new
            // file reused its inode: that file is new, whatever its path.
            self.files.inode_reused(inode);
            self.lost_path(&key);
        }
        if let Some(key) = self.files.key_on(inode) {
            let at_path = self.files.key_at(&found.path);
            if at_path.as_ref() == Some(&key) {
                self.mark_ready(&key);
                return;
            }
            if let Some(other) = at_path {
                self.lost_path(&other);
            }
            self.renamed(&key, &found.path);
            return;
        }
        if let Some(other) = self.files.key_at(&found.path) {
            // A different inode at a tracked path: the old file was replaced.
            self.lost_path(&other);
        }
        if let Some(mut records) = self.files.take_recorded(inode) {
            // The record of this very file: the one born with it where birth
            // times are known, else the last one recorded; never one born
            // at another time.
            let born_with = records
                .iter()
                .position(|r| r.born_ns.is_some() && r.born_ns == found.born_ns);
            let candidate = born_with.or_else(|| {
                records
                    .iter()
                    .rposition(|r| discover::same_birth(r.born_ns, found.born_ns))
            });
            if let Some(at) = candidate
                && self.resume(records.swap_remove(at), &found)
            {
                return;
            }
        }
        match self.adopt(&found) {
            Adoption::Track(adopted) => self.insert(*adopted),
            Adoption::Complete => {}
            Adoption::Unknown => self.start_new(&found, None),
        }
    }

    pub(super) fn finish(&mut self, t: &Tracked, mtime_ns: i64) {
        let mut done = Finished::of(t, mtime_ns);
        done.size = t.acked_offset().max(t.read_offset);
        self.files.finish_on((t.dev, t.ino), done);
    }

    /// Tracks a sealed file again just long enough to rename it at the sink.
    pub(super) fn rename_sealed(&mut self, done: Finished, found: &Found) {
        let mut t = self.tracked(&done.key, done.generation, found);
        t.sink_path = done.path.clone();
        t.acked = IntervalSet::from_ranges([(0, done.size)]);
        t.read_offset = done.size;
        t.size_seen = done.size;
        t.hasher = None;
        t.rename_only = true;
        let fingerprint_len = done.size.min(FINGERPRINT_LEN);
        if let Some(fingerprint) = head_crc(&self.root.join(&found.path), fingerprint_len) {
            t.fingerprint = fingerprint;
            t.fingerprint_len = fingerprint_len as u32;
        }
        tracing::debug!(from = %done.path, to = %found.path, "a sealed file was renamed");
        t.controls.push_back(Control::Rename {
            path: found.path.clone(),
            after: t.read_offset,
        });
        self.insert(t);
    }

    pub(super) fn renamed(&mut self, key: &FileKey, new_path: &str) {
        let Some(old) = self.files.rename(key, new_path) else {
            return;
        };
        let Some(t) = self.files.get_mut(key) else {
            return;
        };
        t.deleted = false;
        let suffix = &self.config.inprogress_suffix;
        if old.ends_with(suffix.as_str()) && !new_path.ends_with(suffix.as_str()) {
            t.seal_wanted = true;
        }
        tracing::debug!(from = %old, to = %new_path, "rename");
        // What the file holds as it is renamed, even if the tailer has not
        // read all of it yet: the rename waits until all of it is acked.
        let size = std::fs::metadata(self.root.join(new_path)).map_or(0, |m| m.len());
        t.controls.push_back(Control::Rename {
            path: new_path.to_owned(),
            after: t.read_offset.max(size),
        });
        self.checkpoints.mark(key);
        self.mark_ready(key);
    }

    /// Picks up a file recorded by an earlier run, if it is still the same file.
    pub(super) fn resume(&mut self, record: WatchedFile, found: &Found) -> bool {
        if head_crc(&self.root.join(&found.path), record.fingerprint_len as u64)
            != Some(record.fingerprint)
            || found.size < record.acked_offset
        {
            return false;
        }
        let mut t = self.tracked(&record.key, record.generation, found);
        t.sink_path = record.path.clone();
        t.acked = IntervalSet::from_ranges([(0, record.acked_offset)]);
        t.read_offset = record.acked_offset;
        t.fingerprint = record.fingerprint;
        t.fingerprint_len = record.fingerprint_len;
        t.hasher = None;
        t.deleted = record.deleted;
        if record.sealed && found.size == record.acked_offset && found.path == record.path {
            self.finish(&t, found.mtime_ns);
            return true;
        }
        if record.generation > 1 {
            // The sink treats a repeated Open as done; it is cheap insurance.
            t.open_acked = false;
            t.controls.push_back(Control::Open);
        }
        if record.path != found.path {
            let suffix = &self.config.inprogress_suffix;
            t.seal_wanted =
                record.path.ends_with(suffix.as_str()) && !found.path.ends_with(suffix.as_str());
            t.controls.push_back(Control::Rename {
                path: found.path.clone(),
                after: t.read_offset.max(found.size),
            });
        }
        self.insert(t);
        true
    }

    /// A watcher without state takes over what a sink already holds of this file.
    pub(super) fn adopt(&mut self, found: &Found) -> Adoption {
        let Some((sink, mark)) = self
            .watermarks
            .iter()
            .filter(|(_, m)| m.path == found.path && !m.superseded)
            .max_by_key(|(_, m)| m.generation)
            .cloned()
        else {
            return Adoption::Unknown;
        };
        if mark.head_len > found.size
            || mark.contiguous_end > found.size
            || head_crc(&self.root.join(&found.path), mark.head_len) != Some(mark.head_crc32c)
        {
            return Adoption::Unknown;
        }
        let mut t = self.tracked(&mark.key, mark.generation, found);
        if t.sink != sink {
            return Adoption::Unknown;
        }
        t.acked = IntervalSet::from_ranges([(0, mark.contiguous_end)]);
        t.read_offset = mark.contiguous_end;
        t.hasher = None;
        if mark.generation > 1 {
            t.open_acked = false;
            t.controls.push_back(Control::Open);
        }
        let fingerprint_len = found.size.min(FINGERPRINT_LEN);
        if let Some(fingerprint) = head_crc(&self.root.join(&found.path), fingerprint_len) {
            t.fingerprint = fingerprint;
            t.fingerprint_len = fingerprint_len as u32;
        }
        if mark.sealed_size == Some(found.size) {
            // Already complete at the sink: remember it as sealed, so later
            // restarts (which do not reconcile) know it too.
            t.sealed = true;
            if let Err(error) = self.checkpoints.record_now(t.record()) {
                tracing::warn!(path = %found.path, %error, "cannot record an adopted sealed file");
            }
            self.finish(&t, found.mtime_ns);
            return Adoption::Complete;
        }
        tracing::info!(path = %found.path, resume_at = mark.contiguous_end, "resuming from the sink's watermark");
        Adoption::Track(Box::new(t))
    }

    pub(super) fn start_new(&mut self, found: &Found, path_override: Option<String>) {
        let key = path_override.unwrap_or_else(|| found.path.clone());
        let generation = self.files.next_generation(&key);
        let mut t = self.tracked(&key, generation, found);
        if generation > 1 {
            t.open_acked = false;
            t.controls.push_back(Control::Open);
        }
        self.insert(t);
    }

    pub(super) fn tracked(&self, key: &str, generation: u64, found: &Found) -> Tracked {
        let now = Instant::now();
        // A file found by a walk was opened (and maybe closed) where no event
        // showed it, so only idleness can tell it is done; a file first seen
        // through an event waits for its close event.
        let closed = self.walking;
        Tracked {
            key: key.into(),
            generation,
            path: found.path.clone(),
            dev: found.dev,
            ino: found.ino,
            born_ns: found.born_ns,
            file: None,
            size_seen: 0,
            read_offset: 0,
            acked: IntervalSet::new(),
            fingerprint: 0,
            fingerprint_len: 0,
            hasher: None,
            hashed_to: 0,
            sink: rendezvous(key, self.config.sinks_names()),
            last_change: now,
            closed,
            deleted: false,
            seal_wanted: false,
            open_acked: true,
            controls: VecDeque::new(),
            control_in_flight: false,
            seal_hashing: false,
            sealed: false,
            failed: None,
            rename_only: false,
            sink_path: found.path.clone(),
            mtime_ns: found.mtime_ns,
            polled: !self.discovery.covers(reader::directory_of(&found.path)),
            poll_interval: self.config.poll_min,
            next_poll: now,
            growth: VecDeque::new(),
            lag: LagHistory::new(now),
        }
    }

    pub(super) fn insert(&mut self, t: Tracked) {
        let key = self.files.insert(t);
        self.checkpoints.mark(&key);
        self.mark_ready(&key);
    }

    /// Walks the whole tree: finds new files, renames and deletions that
    /// events missed, and re-checks every tracked file.
    pub(super) fn rescan(&mut self) -> anyhow::Result<()> {
        let progress = self.progress.clone();
        let discover::Walked {
            files: found,
            dirs,
            skipped,
        } = discover::walk_with(&self.root, || progress.beat())?;
        self.tell_skipped(skipped);
        for dir in &dirs {
            self.discovery.watch_dir(dir);
        }
        self.discovery.walked(&dirs);
        self.review_coverage();
        let present: Set<(u64, u64)> = found.iter().map(|f| (f.dev, f.ino)).collect();
        self.walking = true;
        for f in found {
            self.on_found(f);
        }
        self.walking = false;
        let keys: Vec<FileKey> = self.files.keys();
        for key in keys {
            let Some(t) = self.files.get(&key) else {
                continue;
            };
            if !t.deleted && !present.contains(&(t.dev, t.ino)) {
                self.lost_path(&key);
            } else {
                self.check_fingerprint(&key);
            }
            self.mark_ready(&key);
        }
        Ok(())
    }

    /// Content rewritten in place (same inode, same or larger size) shows as a
    /// changed head: that is a new generation too.
    pub(super) fn check_fingerprint(&mut self, key: &FileKey) {
        let Some(t) = self.files.get(key) else { return };
        if t.fingerprint_len == 0 || t.sealed || t.deleted {
            return;
        }
        if head_crc(&self.root.join(&t.path), t.fingerprint_len as u64) != Some(t.fingerprint) {
            let size = std::fs::symlink_metadata(self.root.join(&t.path))
                .map(|m| m.len())
                .unwrap_or(0);
            if size >= t.fingerprint_len as u64 {
                tracing::warn!(path = %t.path, "file content changed at its head; starting a new generation");
                self.new_generation(key);
            }
        }
    }

    /// Truncation or in-place rewrite: the same file continues as a new generation.
    pub(super) fn new_generation(&mut self, key: &FileKey) {
        let Some(old) = self.files.take_for_new_generation(key) else {
            return;
        };
        self.ready_set.remove(key);
        let found = Found {
            path: old.path.clone(),
            dev: old.dev,
            ino: old.ino,
            size: 0,
            mtime_ns: 0,
            born_ns: old.born_ns,
        };
        let generation = self
            .files
            .next_generation(&old.key)
            .max(old.generation.saturating_add(1));
        let mut t = self.tracked(&old.key, generation, &found);
        t.open_acked = false;
        t.controls.push_back(Control::Open);
        t.closed = old.closed;
        t.file = old.file;
        self.insert(t);
    }
}

/// crc32c of the first `len` bytes, or None if the file is shorter or unreadable.
pub(super) fn head_crc(path: &std::path::Path, len: u64) -> Option<u32> {
    let file = File::open(path).ok()?;
    flight_server::checksum::crc32c_of_file_prefix(&file, len).ok()
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use manifest_db::WatchState;

    use super::*;
    use crate::config::WatchConfig;
    use crate::progress::Progress;
    use crate::stop::Stop;
    use crate::testkit::{Dest, FakeSinks, Scratch};

    fn tailer(scratch: &Scratch) -> (Tailer, FakeSinks) {
        let root = scratch.path().join("source");
        std::fs::create_dir_all(&root).expect("create the source");
        let config = Arc::new(WatchConfig {
            root,
            source: "identity".into(),
            sinks: vec!["one".into()],
            ..WatchConfig::default()
        });
        let state = WatchState::open(&scratch.path().join("state")).expect("open the watch state");
        let dest = Arc::new(Mutex::new(Dest::default()));
        let (sinks, outboxes, deliveries) = FakeSinks::start(1, dest);
        let tailer = Tailer::new(
            config,
            state,
            Vec::new(),
            outboxes,
            deliveries,
            Arc::new(Progress::default()),
            Arc::new(Stop::default()),
        )
        .expect("start a tailer");
        (tailer, sinks)
    }

    fn touched(path: &str, closed: bool) -> Change {
        Change::Touched {
            path: path.into(),
            closed,
        }
    }

    /// What fanotify can hand over when a new version is written to a
    /// temporary name and renamed over a tracked file: the temporary's
    /// write, close and move merged into one event (read after the rename),
    /// then the move onto the tracked name. The file now at that name is
    /// known to be closed, so it can be sealed.
    #[test]
    fn a_close_merged_into_a_rename_over_a_tracked_file_is_not_lost() {
        let scratch = Scratch::new("merged-replace");
        let (mut tailer, sinks) = tailer(&scratch);
        let root = tailer.root.clone();
        std::fs::write(root.join("c.cfg"), b"first version").expect("write c.cfg");
        tailer.on_change(touched("c.cfg", true));
        std::fs::write(root.join("c.cfg.tmp"), b"second version").expect("write c.cfg.tmp");
        tailer.on_change(touched("c.cfg.tmp", false));
        std::fs::rename(root.join("c.cfg.tmp"), root.join("c.cfg")).expect("rename over c.cfg");
        let new_inode = std::fs::metadata(root.join("c.cfg"))
            .expect("stat c.cfg")
            .ino();

        tailer.on_change(Change::Gone {
            path: "c.cfg.tmp".into(),
        });
        tailer.on_change(touched("c.cfg.tmp", true));
        tailer.on_change(touched("c.cfg", true));

        let at_path = |tailer: &Tailer| {
            let key = tailer.files.key_at("c.cfg").expect("c.cfg is tracked");
            let t = tailer.files.get(&key).expect("its file is known");
            (t.ino, t.closed)
        };
        assert_eq!(at_path(&tailer), (new_inode, true));
        tailer.rescan().expect("rescan");
        assert_eq!(at_path(&tailer), (new_inode, true), "after a rescan");
        drop(tailer);
        sinks.join();
    }
}
