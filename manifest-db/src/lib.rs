//! manifest-db owns tailflight's durable state in RocksDB: the sink's manifest of placed byte
//! ranges per file generation (`SinkManifest`) and the watcher's checkpoint of tracked source
//! files (`WatchState`). It defines the record types both sides persist and the single error
//! type for every storage failure, so callers never see raw RocksDB or serde errors.

mod interval;
mod outbox;
mod sink;
mod store;
mod watch;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use interval::IntervalSet;
pub use outbox::OutboxDepth;
pub use sink::{JournalState, PreparedCommit, RecordedRound, SinkManifest};
pub use watch::WatchState;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot open manifest at {path}: {source}")]
    Open {
        path: PathBuf,
        source: rocksdb::Error,
    },
    #[error("manifest {path}: {op} failed: {source}")]
    Db {
        path: PathBuf,
        op: &'static str,
        source: rocksdb::Error,
    },
    #[error("manifest {path}: corrupt record in column family {cf}, key {key:?}: {detail}")]
    Corrupt {
        path: PathBuf,
        cf: &'static str,
        key: String,
        detail: String,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

/// Identity of one generation of one source file on the sink side.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FileId {
    pub source: String,
    pub key: String,
    pub generation: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sealed {
    pub size: u64,
    /// Whole-file digest as the seal row named it (`crc64nvme:<hex>`, `blake3:<hex>`).
    pub digest: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    /// Relative to the sink root, '/'-separated.
    pub dest_path: String,
    /// Durably placed byte ranges.
    pub placed: IntervalSet,
    pub sealed: Option<Sealed>,
    /// A newer generation replaced this one at its path.
    pub superseded: bool,
    /// Superseded, and its file kept aside at `dest_path` (`--superseded
    /// keep`) rather than removed: it still holds acknowledged bytes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kept: bool,
    /// Set while a rename to `dest_path` from this path may not have reached
    /// the disk yet: recorded before the rename, cleared after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renamed_from: Option<String>,
    /// The inode of the file that rename moves: after a crash, whichever of
    /// the two names holds it says whether the move was made, even when a
    /// later rename has put another file at the old name. Absent in intents
    /// recorded by builds that did not keep it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renamed_inode: Option<u64>,
    /// A move made and recorded where no event told of it (the startup's
    /// replay of the journal): the path the events last told. The first
    /// round that records the file tells the move, and drops this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub untold_from: Option<String>,
    /// When the commit round that last recorded it was recorded, in
    /// milliseconds since the Unix epoch (a listing's last commit).
    /// Absent in records of builds that did not keep it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub committed_unix_ms: Option<u64>,
}

impl FileRecord {
    /// Records the intent to move the file (`inode`) from its path to `to`,
    /// before the move is made.
    pub fn begin_move(&mut self, to: String, inode: u64) {
        self.renamed_from = Some(std::mem::replace(&mut self.dest_path, to));
        self.renamed_inode = Some(inode);
    }

    /// The move is made: the file lives at `dest_path`.
    pub fn end_move(&mut self) {
        self.renamed_from = None;
        self.renamed_inode = None;
    }

    /// The move was not made: the file lives at its old path again.
    pub fn undo_move(&mut self) {
        if let Some(from) = self.renamed_from.take() {
            self.dest_path = from;
        }
        self.renamed_inode = None;
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkCounters {
    pub placed_bytes: u64,
    pub duplicate_bytes: u64,
    pub rewritten_bytes: u64,
}

/// One atomic commit of the sink: new file records, the ranges just placed, counter deltas.
#[derive(Debug, Default)]
pub struct SinkCommit {
    /// Full new record for each touched file; overwrites what was stored.
    pub records: Vec<(FileId, FileRecord)>,
    /// (file, offset, len) placed in this commit; appended to the audit log.
    pub placements: Vec<(FileId, u64, u64)>,
    /// Deltas to add to the persisted counters.
    pub counters: SinkCounters,
    /// Ranges placed in this commit whose files are not flushed yet, and where
    /// their bytes are: recorded in the same write, until
    /// [`SinkManifest::forget_journal`] of `journal_round`.
    pub journal: Vec<JournalEntry>,
    /// The round these journal entries are kept under: its number, counting
    /// from 1 in each epoch of the journal (see [`JournalState`]).
    pub journal_round: u64,
    /// Where that round starts in the journal file, for the redo of rounds
    /// recorded after it that a crash lost from the manifest.
    pub journal_start: u64,
    /// Every journal round up to this one had its bytes durable before this
    /// commit began (rounds run one at a time): none of them can have been
    /// cut short. 0: nothing new to say.
    pub journal_complete: u64,
    /// (file, offset, len) recorded by an earlier commit whose bytes never
    /// became durable (a journal round cut short by a crash, found at the
    /// replay): their newest audit entry is dropped and their bytes are taken
    /// off the placed counter. Their records come in `records`, without them.
    pub withdrawn: Vec<(FileId, u64, u64)>,
    /// Events to publish, appended to the outbox in this order under the
    /// next sequence numbers (see [`SinkManifest::outbox_after`]).
    pub outbox: Vec<OutboxEvent>,
    /// Outbox entries an earlier commit wrote that are replaced (`Some`) or
    /// removed (`None`): the startup's correction of the events of a journal
    /// round cut short by a crash, which were never published.
    pub outbox_rewrite: Vec<(u64, Option<OutboxEvent>)>,
}

/// An event in the sink's outbox, opaque here: recorded with its commit,
/// published by a relay, removed once published.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutboxEvent {
    /// The journal round of the commit that recorded it (0: none), so the
    /// startup can find the events of a round it corrects.
    pub journal_round: u64,
    /// When it was recorded (ms since the Unix epoch).
    pub recorded_unix_ms: u64,
    /// Its record key (where it goes: one file's events keep their order).
    pub key: Vec<u8>,
    pub payload: Vec<u8>,
}

impl OutboxEvent {
    /// The event as the outbox column family stores it: its journal round,
    /// when it was recorded, the key's length, the key, the payload.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut value = Vec::with_capacity(20 + self.key.len() + self.payload.len());
        value.extend_from_slice(&self.journal_round.to_be_bytes());
        value.extend_from_slice(&self.recorded_unix_ms.to_be_bytes());
        value.extend_from_slice(&(self.key.len() as u32).to_be_bytes());
        value.extend_from_slice(&self.key);
        value.extend_from_slice(&self.payload);
        value
    }

    /// An event as [`Self::encode`] stored it (`None`: not one).
    pub(crate) fn decode(value: &[u8]) -> Option<Self> {
        let number = |at: usize| Some(u64::from_be_bytes(value.get(at..at + 8)?.try_into().ok()?));
        let journal_round = number(0)?;
        let recorded_unix_ms = number(8)?;
        let key_len = u32::from_be_bytes(value.get(16..20)?.try_into().ok()?) as usize;
        let key = value.get(20..20usize.checked_add(key_len)?)?.to_vec();
        let payload = value.get(20 + key_len..)?.to_vec();
        Some(Self {
            journal_round,
            recorded_unix_ms,
            key,
            payload,
        })
    }
}

/// A journaled range: (file, offset, where its bytes are).
pub type JournalEntry = (FileId, u64, JournalBytes);

/// Where the bytes of a journaled range are kept until its file is flushed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum JournalBytes {
    /// In the sink's journal file: `len` bytes at `position`, whose CRC-32C
    /// tells a range that made it there from one that did not.
    InFile {
        position: u64,
        len: u32,
        crc32c: u32,
    },
    /// In the manifest itself, as sinks before the journal file kept them.
    Inline(Vec<u8>),
}

/// Watcher-side state of one tracked source file, keyed by `key` (its path relative to the
/// watched root when first seen, e.g. "run1/a-s01-c000.xtc2.inprogress").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchedFile {
    pub key: String,
    /// Current relative path; differs from `key` after a rename.
    pub path: String,
    pub dev: u64,
    pub ino: u64,
    /// crc32c of the first `fingerprint_len` bytes.
    pub fingerprint: u32,
    pub fingerprint_len: u32,
    pub generation: u64,
    /// Every byte below this is acknowledged durable by the sink.
    pub acked_offset: u64,
    pub sealed: bool,
    /// Deleted at the source.
    pub deleted: bool,
    /// Birth time (ns since the epoch) where the filesystem records one:
    /// tells this file from a later one that reused its inode number.
    /// Absent in records of builds that did not keep it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub born_ns: Option<i64>,
}

#[cfg(test)]
pub(crate) mod testutil {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A fresh directory under the system temp dir, removed again on drop.
    pub struct TempDir(PathBuf);

    impl TempDir {
        pub fn new(tag: &str) -> Self {
            static COUNTER: AtomicU64 = AtomicU64::new(0);
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!(
                "manifest-db-test-{tag}-{}-{nanos}-{n}",
                std::process::id()
            ));
            std::fs::create_dir_all(&dir).expect("create test dir");
            Self(dir)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
