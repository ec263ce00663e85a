//! What the tailer knows of each file: the files it tracks ([`Tracked`]),
//! indexed by key, path and inode; the sealed files it finished with
//! ([`Finished`]), so walks leave them alone; what an earlier run recorded,
//! until a walk claims it; and the highest generation of each key. The
//! [`FileTable`] owns these maps and keeps them in step: nothing else
//! inserts into or removes from one of them.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flight_server::{FileHasher, FileWatermark};
use manifest_db::{IntervalSet, WatchedFile};

use crate::discover;
use crate::lag::LagHistory;

/// Bytes at the head of a file used as its fingerprint.
pub(super) const FINGERPRINT_LEN: u64 = 4096;

pub(super) type FileKey = (Arc<str>, u64);

/// The tailer looks its files up several times per append. With SipHash
/// over their (path, generation) keys, hashing was a large share of the
/// watcher's instructions (docs/measurements.md); foldhash is a few times
/// cheaper. It is seeded per
/// process and per map, so names prepared to collide do not; it does not
/// claim to resist someone who can time the watcher while choosing names,
/// and need not: whoever writes into the watched tree is trusted with its
/// data already.
pub(super) type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
pub(super) type Set<K> = HashSet<K, foldhash::fast::RandomState>;

pub(super) enum Control {
    Open,
    /// To a new path, sent once the sink has acknowledged every byte the
    /// file held when the rename was seen (`after`).
    Rename {
        path: String,
        after: u64,
    },
    Seal {
        size: u64,
        digest: String,
    },
}

pub(super) struct Tracked {
    /// Shared with every [`FileKey`] of it: the tailer clones keys several
    /// times per event (queues, sets, rows in flight).
    pub(super) key: Arc<str>,
    pub(super) generation: u64,
    pub(super) path: String,
    pub(super) dev: u64,
    pub(super) ino: u64,
    pub(super) born_ns: Option<i64>,
    pub(super) file: Option<File>,
    pub(super) size_seen: u64,
    pub(super) read_offset: u64,
    pub(super) acked: IntervalSet,
    pub(super) fingerprint: u32,
    pub(super) fingerprint_len: u32,
    /// The digest so far, from offset 0 to `hashed_to`. Started by the first
    /// read at offset 0 (a file waiting to be read holds none: with many new
    /// files queued that is ~2 KiB each); None past that point means the
    /// seal hashes the file from disk.
    pub(super) hasher: Option<FileHasher>,
    pub(super) hashed_to: u64,
    pub(super) sink: usize,
    pub(super) last_change: Instant,
    pub(super) closed: bool,
    pub(super) deleted: bool,
    pub(super) seal_wanted: bool,
    /// Data may flow (generation 1, or its Open was acknowledged).
    pub(super) open_acked: bool,
    pub(super) controls: VecDeque<Control>,
    pub(super) control_in_flight: bool,
    /// Its seal's digest is being read from disk by the seal hasher.
    pub(super) seal_hashing: bool,
    pub(super) sealed: bool,
    pub(super) failed: Option<String>,
    /// Where the sink has this file (the last acknowledged name).
    pub(super) sink_path: String,
    /// Re-tracked only to rename a sealed file; done when the rename is acknowledged.
    pub(super) rename_only: bool,
    /// Modification time when last sized up for a seal.
    pub(super) mtime_ns: i64,
    /// No event tells of its changes (`--events poll`, or its directory
    /// could not be watched): it is polled, and idleness alone tells that
    /// it is done.
    pub(super) polled: bool,
    pub(super) poll_interval: Duration,
    pub(super) next_poll: Instant,
    /// (size, when first seen) of recent growth, oldest first: the age of
    /// the oldest unacknowledged byte is the age of the first entry above
    /// the acknowledged offset.
    pub(super) growth: VecDeque<(u64, Instant)>,
    /// Recent (size, acknowledged) samples: the file's lag state and rates.
    pub(super) lag: LagHistory,
}

impl Tracked {
    /// Whether `meta` describes this file (and not a new file that reused
    /// its inode number after it was deleted). While its descriptor is
    /// open the inode cannot be reused, whatever the birth times say.
    pub(super) fn is(&self, meta: &std::fs::Metadata) -> bool {
        meta.dev() == self.dev
            && meta.ino() == self.ino
            && (self.file.is_some() || discover::same_birth(self.born_ns, discover::born_ns(meta)))
    }

    /// Whether a file found with this birth time is another file on this
    /// one's inode number: only possible once this one's descriptor is
    /// closed, and only told where both birth times are known.
    pub(super) fn reused_by(&self, born_ns: Option<i64>) -> bool {
        self.file.is_none() && !discover::same_birth(self.born_ns, born_ns)
    }

    pub(super) fn acked_offset(&self) -> u64 {
        self.acked.contiguous_end()
    }

    pub(super) fn record(&self) -> WatchedFile {
        WatchedFile {
            key: self.key.to_string(),
            // The path the sink knows: a rename not yet acknowledged must be
            // sent again after a restart, so it is not recorded before.
            path: self.sink_path.clone(),
            dev: self.dev,
            ino: self.ino,
            fingerprint: self.fingerprint,
            fingerprint_len: self.fingerprint_len,
            generation: self.generation,
            acked_offset: self.acked_offset(),
            sealed: self.sealed,
            deleted: self.deleted,
            born_ns: self.born_ns,
        }
    }
}

/// A sealed file no longer tracked, remembered so that walks leave it alone
/// and a later rename or rewrite is recognised.
pub(super) struct Finished {
    pub(super) key: String,
    pub(super) generation: u64,
    pub(super) path: String,
    pub(super) size: u64,
    pub(super) mtime_ns: i64,
    pub(super) born_ns: Option<i64>,
}

impl Finished {
    pub(super) fn of(t: &Tracked, mtime_ns: i64) -> Self {
        Self {
            key: t.key.to_string(),
            generation: t.generation,
            path: t.path.clone(),
            size: t.read_offset,
            mtime_ns,
            born_ns: t.born_ns,
        }
    }
}

/// The tracked files and their indexes, the finished ones, and what an
/// earlier run recorded.
#[derive(Default)]
pub(super) struct FileTable {
    tracked: Map<FileKey, Tracked>,
    by_path: Map<String, FileKey>,
    by_inode: Map<(u64, u64), FileKey>,
    max_generation: Map<String, u64>,
    /// Sealed files no longer tracked, so rescans leave them alone.
    finished: Map<(u64, u64), Finished>,
    /// Which inode a sealed path holds.
    finished_at: Map<String, (u64, u64)>,
    /// What an earlier run recorded, by inode, until the first walk claims it.
    /// Several records can name one inode: a file deleted before it was
    /// read, and a later file that reused its inode number.
    resumable: Map<(u64, u64), Vec<WatchedFile>>,
}

impl FileTable {
    /// Knows what an earlier run recorded and the generations the sinks
    /// hold, so a new generation never takes a number already used.
    pub(super) fn new(recorded: Vec<WatchedFile>, watermarks: &[(usize, FileWatermark)]) -> Self {
        let mut table = Self::default();
        for record in recorded {
            table.saw_generation(&record.key, record.generation);
            table
                .resumable
                .entry((record.dev, record.ino))
                .or_default()
                .push(record);
        }
        for (_, mark) in watermarks {
            table.saw_generation(&mark.key, mark.generation);
        }
        table
    }

    fn saw_generation(&mut self, key: &str, generation: u64) {
        let highest = self.max_generation.entry(key.to_owned()).or_default();
        *highest = (*highest).max(generation);
    }

    /// The generation a new file or a rewrite under `key` takes.
    pub(super) fn next_generation(&self, key: &str) -> u64 {
        self.max_generation
            .get(key)
            .map_or(1, |g| g.saturating_add(1))
    }

    pub(super) fn get(&self, key: &FileKey) -> Option<&Tracked> {
        self.tracked.get(key)
    }

    pub(super) fn get_mut(&mut self, key: &FileKey) -> Option<&mut Tracked> {
        self.tracked.get_mut(key)
    }

    pub(super) fn keys(&self) -> Vec<FileKey> {
        self.tracked.keys().cloned().collect()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&FileKey, &Tracked)> {
        self.tracked.iter()
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Tracked> {
        self.tracked.values()
    }

    pub(super) fn values_mut(&mut self) -> impl Iterator<Item = &mut Tracked> {
        self.tracked.values_mut()
    }

    /// The tracked file at `path`, if any.
    pub(super) fn key_at(&self, path: &str) -> Option<FileKey> {
        self.by_path.get(path).cloned()
    }

    /// The tracked file on `inode`, if any.
    pub(super) fn key_on(&self, inode: (u64, u64)) -> Option<FileKey> {
        self.by_inode.get(&inode).cloned()
    }

    /// Tracks `t` under its key, path and inode; returns its key.
    pub(super) fn insert(&mut self, t: Tracked) -> FileKey {
        let key = (t.key.clone(), t.generation);
        self.saw_generation(&t.key, t.generation);
        self.by_path.insert(t.path.clone(), key.clone());
        self.by_inode.insert((t.dev, t.ino), key.clone());
        self.tracked.insert(key.clone(), t);
        key
    }

    /// Stops tracking a file that goes on as a new generation: its path
    /// and inode are the new generation's.
    pub(super) fn take_for_new_generation(&mut self, key: &FileKey) -> Option<Tracked> {
        let old = self.tracked.remove(key)?;
        self.by_path.remove(&old.path);
        self.by_inode.remove(&(old.dev, old.ino));
        Some(old)
    }

    /// Stops tracking every sealed file: call it only once a checkpoint has
    /// recorded them. Their paths and inodes stay with whatever holds them
    /// now (a newer generation of the same inode may).
    pub(super) fn forget_sealed(&mut self) {
        let done: Vec<FileKey> = self
            .tracked
            .iter()
            .filter(|(_, t)| t.sealed)
            .map(|(k, _)| k.clone())
            .collect();
        for key in done {
            if let Some(t) = self.tracked.remove(&key) {
                if self.by_path.get(&t.path) == Some(&key) {
                    self.by_path.remove(&t.path);
                }
                if self.by_inode.get(&(t.dev, t.ino)) == Some(&key) {
                    self.by_inode.remove(&(t.dev, t.ino));
                }
            }
        }
    }

    /// A path no longer leads to the file tracked there.
    pub(super) fn path_gone(&mut self, path: &str) {
        self.by_path.remove(path);
    }

    /// An inode no longer holds the file tracked on it (a new file reused it).
    pub(super) fn inode_reused(&mut self, inode: (u64, u64)) {
        self.by_inode.remove(&inode);
    }

    /// A tracked file moved to `new_path`; returns its old path.
    pub(super) fn rename(&mut self, key: &FileKey, new_path: &str) -> Option<String> {
        let t = self.tracked.get_mut(key)?;
        let old = std::mem::replace(&mut t.path, new_path.to_owned());
        self.by_path.remove(&old);
        self.by_path.insert(new_path.to_owned(), key.clone());
        Some(old)
    }

    /// What an earlier run recorded of files on `inode`, claimed once.
    pub(super) fn take_recorded(&mut self, inode: (u64, u64)) -> Option<Vec<WatchedFile>> {
        self.resumable.remove(&inode)
    }

    pub(super) fn finished(&self, inode: (u64, u64)) -> Option<&Finished> {
        self.finished.get(&inode)
    }

    pub(super) fn finished_count(&self) -> usize {
        self.finished.len()
    }

    /// Whether a sealed file holds `path`.
    pub(super) fn is_finished_path(&self, path: &str) -> bool {
        self.finished_at.contains_key(path)
    }

    /// Another inode now holds a sealed file's path: the sealed file keeps
    /// no path (a rename back to it is then a change).
    pub(super) fn finished_path_taken(&mut self, path: &str) {
        if let Some(other) = self.finished_at.remove(path)
            && let Some(done) = self.finished.get_mut(&other)
        {
            done.path.clear();
        }
    }

    /// Remembers `done` as the sealed file on `inode`.
    pub(super) fn finish_on(&mut self, inode: (u64, u64), done: Finished) {
        if !done.path.is_empty() {
            self.finished_at.insert(done.path.clone(), inode);
        }
        self.finished.insert(inode, done);
    }

    /// Remembers `done` as sealed on the inode of its tracked file.
    pub(super) fn finish_tracked(&mut self, done: Finished) {
        let inode = self
            .tracked
            .get(&(Arc::from(done.key.as_str()), done.generation))
            .map(|t| (t.dev, t.ino));
        if let Some(inode) = inode {
            self.finish_on(inode, done);
        }
    }

    /// Forgets the sealed file on `inode`; returns what was known of it.
    pub(super) fn forget_finished(&mut self, inode: (u64, u64)) -> Finished {
        let done = self.finished.remove(&inode).unwrap_or(Finished {
            key: String::new(),
            generation: 0,
            path: String::new(),
            size: 0,
            mtime_ns: 0,
            born_ns: None,
        });
        if self.finished_at.get(&done.path) == Some(&inode) {
            self.finished_at.remove(&done.path);
        }
        done
    }
}

impl std::ops::Index<&FileKey> for FileTable {
    type Output = Tracked;

    fn index(&self, key: &FileKey) -> &Tracked {
        &self.tracked[key]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracked(key: &str, generation: u64, path: &str, ino: u64) -> Tracked {
        let now = Instant::now();
        Tracked {
            key: key.into(),
            generation,
            path: path.into(),
            dev: 1,
            ino,
            born_ns: None,
            file: None,
            size_seen: 0,
            read_offset: 0,
            acked: IntervalSet::new(),
            fingerprint: 0,
            fingerprint_len: 0,
            hasher: None,
            hashed_to: 0,
            sink: 0,
            last_change: now,
            closed: false,
            deleted: false,
            seal_wanted: false,
            open_acked: true,
            controls: VecDeque::new(),
            control_in_flight: false,
            seal_hashing: false,
            sealed: false,
            failed: None,
            sink_path: path.into(),
            rename_only: false,
            mtime_ns: 0,
            polled: false,
            poll_interval: Duration::from_millis(10),
            next_poll: now,
            growth: VecDeque::new(),
            lag: LagHistory::new(now),
        }
    }

    #[test]
    fn a_rename_moves_the_path_index_and_keeps_the_inode() {
        let mut table = FileTable::default();
        let key = table.insert(tracked("a.h5", 1, "a.h5.part", 7));
        assert_eq!(table.rename(&key, "a.h5").as_deref(), Some("a.h5.part"));
        assert_eq!(table.key_at("a.h5"), Some(key.clone()));
        assert_eq!(table.key_at("a.h5.part"), None);
        assert_eq!(table.key_on((1, 7)), Some(key));
    }

    #[test]
    fn a_sealed_generation_leaves_its_successors_indexes_alone() {
        let mut table = FileTable::default();
        let old = table.insert(tracked("a.h5", 1, "a.h5", 7));
        let Some(mut first) = table.take_for_new_generation(&old) else {
            panic!("generation 1 is tracked");
        };
        assert_eq!(table.next_generation("a.h5"), 2);
        let new = table.insert(tracked("a.h5", 2, "a.h5", 7));
        first.sealed = true;
        table.tracked.insert(old.clone(), first);
        table.forget_sealed();
        assert!(table.get(&old).is_none());
        assert_eq!(table.key_at("a.h5"), Some(new.clone()));
        assert_eq!(table.key_on((1, 7)), Some(new));
        assert_eq!(table.next_generation("a.h5"), 3);
    }

    #[test]
    fn generations_recorded_by_an_earlier_run_or_a_sink_are_never_reused() {
        let recorded = WatchedFile {
            key: "a.h5".into(),
            path: "a.h5".into(),
            dev: 1,
            ino: 7,
            fingerprint: 0,
            fingerprint_len: 0,
            generation: 4,
            acked_offset: 0,
            sealed: false,
            deleted: false,
            born_ns: None,
        };
        let table = FileTable::new(vec![recorded], &[]);
        assert_eq!(table.next_generation("a.h5"), 5);
        assert_eq!(table.next_generation("b.h5"), 1);
    }

    #[test]
    fn a_sealed_path_taken_by_another_file_is_no_longer_the_sealed_files() {
        let mut table = FileTable::default();
        let done = Finished {
            key: "a.h5".into(),
            generation: 1,
            path: "a.h5".into(),
            size: 10,
            mtime_ns: 0,
            born_ns: None,
        };
        table.finish_on((1, 7), done);
        assert!(table.is_finished_path("a.h5"));
        table.finished_path_taken("a.h5");
        assert!(!table.is_finished_path("a.h5"));
        assert_eq!(table.finished((1, 7)).map(|d| d.path.as_str()), Some(""));
        assert_eq!(table.forget_finished((1, 7)).size, 10);
        assert_eq!(table.finished_count(), 0);
    }
}
