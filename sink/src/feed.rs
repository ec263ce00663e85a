//! The commit feed: one in-process stream of what became durable.
//!
//! The committer publishes one [`CommitRound`] per commit round, after the
//! round's bytes and records are durable and before its acks go out: for
//! each file the round touched, its identity, current path, the ranges the
//! round made durable, the new contiguous watermark and what happened to
//! the file (opened, renamed, sealed, superseded). Live subscriptions,
//! commit events and metrics are its listeners; none of them is known here.
//!
//! The feed is bounded: a listener that falls more than its capacity behind
//! is told how many rounds it missed (`RecvError::Lagged`) and re-reads
//! what it needs from the manifest (a [`DurableSnapshot`], which names the
//! last round it includes); the committer never waits for anyone.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use manifest_db::{FileId, FileRecord};
use serde::Serialize;
use tokio::sync::broadcast;

/// Rounds a listener may fall behind before it misses some.
pub const FEED_CAPACITY: usize = 1024;

/// What one commit round made durable.
#[derive(Clone, Debug, Serialize)]
pub struct CommitRound {
    /// Counts recorded rounds from 1 within one run of the sink; rounds
    /// recorded while nobody listened are counted but not sent.
    pub sequence: u64,
    /// When the round was durable.
    pub committed_at: SystemTime,
    pub files: Vec<FileCommit>,
    /// How long its stages took.
    pub stages: RoundStages,
}

/// How long a commit round's stages took, in microseconds; where each of
/// its batches had its own, the slowest batch's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RoundStages {
    /// From a batch's arrival until its placement began (waiting for a
    /// placement thread).
    pub receive_us: u64,
    /// Placing a batch: writing its ranges into their files.
    pub write_us: u64,
    /// From a placed batch's hand-over until its round began (behind the
    /// round before).
    pub queue_us: u64,
    /// Making the round's files durable (fdatasync or syncfs).
    pub flush_us: u64,
    /// Recording the round in the manifest (a synced RocksDB write, or one
    /// whose batch the journal makes durable).
    pub manifest_us: u64,
    /// The journal's write and fdatasync, for a round that journals.
    pub journal_us: u64,
}

/// One file generation in a commit round.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FileCommit {
    pub id: FileId,
    /// Its destination path, relative to the sink's root, after this round.
    pub path: String,
    /// The ranges `[start, end)` this round made durable, coalesced; empty
    /// for a round that only changed what the file is (a rename, a seal).
    pub ranges: Vec<(u64, u64)>,
    /// Every byte below this is durable.
    pub contiguous_end: u64,
    /// What else the round recorded of the file, in this order.
    pub changes: Vec<FileChange>,
    /// When the last batch that brought this round's ranges of the file
    /// reached the sink (none for a round of control changes only): the
    /// commit's share of a range's latency is `committed_at` minus this.
    pub received: Option<SystemTime>,
    /// (device, inode) of the file its bytes went to, when known: a reader
    /// that opens `path` checks it holds this file, not one that took the
    /// name after a move the feed has not told of yet.
    pub inode: Option<(u64, u64)>,
    /// Its seal, whether this round or an earlier one made it: a listener
    /// that starts following a file now (renamed into what it follows)
    /// learns it is complete.
    pub sealed: Option<manifest_db::Sealed>,
}

/// A change to a file other than its bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "change")]
pub enum FileChange {
    /// First recorded: a new file or a new generation.
    Opened,
    /// Recorded under a new path (the commit's `path`).
    Renamed { from: String },
    /// Sealed at its final size, with the whole file's digest.
    Sealed { size: u64, digest: String },
    /// A newer generation replaced this one.
    Superseded,
}

/// The sending side, owned by the committer: the feed closes (listeners
/// get `RecvError::Closed`) when the committer stops.
pub(crate) struct CommitFeed {
    sender: broadcast::Sender<Arc<CommitRound>>,
    /// The last round recorded, described or not; moved on under the
    /// commit gate, so a snapshot read under it knows where it stands.
    sequence: Arc<AtomicU64>,
}

impl CommitFeed {
    /// The feed, and the handle listeners subscribe through.
    pub(crate) fn new(capacity: usize) -> (Self, FeedHandle) {
        let (sender, _) = broadcast::channel(capacity.max(1));
        let sequence = Arc::new(AtomicU64::new(0));
        let handle = FeedHandle {
            sender: sender.downgrade(),
            sequence: sequence.clone(),
        };
        (Self { sender, sequence }, handle)
    }

    /// Whether anyone listens: a round is described only if so. Asked under
    /// the commit gate, as a snapshot's reader subscribes before it waits
    /// for the gate: a round it misses in its snapshot is described to it.
    pub(crate) fn has_listeners(&self) -> bool {
        self.sender.receiver_count() > 0
    }

    /// Counts a recorded round, and tells its listeners what it made
    /// durable (`None` if it was not described: nobody listened). Called
    /// under the commit gate.
    pub(crate) fn recorded(&self, files: Option<Vec<FileCommit>>, stages: RoundStages) {
        let sequence = self.sequence.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some(files) = files {
            // No listener (any more) is not an error: the feed is for them.
            let _ = self.sender.send(Arc::new(CommitRound {
                sequence,
                committed_at: SystemTime::now(),
                files,
                stages,
            }));
        }
    }
}

/// Where listeners subscribe; it does not keep the feed open.
#[derive(Clone)]
pub struct FeedHandle {
    sender: broadcast::WeakSender<Arc<CommitRound>>,
    sequence: Arc<AtomicU64>,
}

impl FeedHandle {
    /// A listener from the next round on; `None` once the committer has
    /// stopped (nothing will be committed any more).
    pub fn subscribe(&self) -> Option<broadcast::Receiver<Arc<CommitRound>>> {
        self.sender.upgrade().map(|sender| sender.subscribe())
    }

    /// The last round recorded (read it under the commit gate).
    pub(crate) fn sequence(&self) -> u64 {
        self.sequence.load(Ordering::SeqCst)
    }
}

/// What the manifest held at one moment: the files, and the last round
/// they include. A listener that subscribed before reading it skips the
/// rounds up to that one.
#[derive(Clone, Debug, Serialize)]
pub struct DurableSnapshot {
    pub sequence: u64,
    pub files: Vec<DurableFile>,
}

/// What the manifest holds of one file generation: where a listener starts,
/// or what it re-reads after it missed rounds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DurableFile {
    pub id: FileId,
    pub path: String,
    /// Every durable range `[start, end)`.
    pub ranges: Vec<(u64, u64)>,
    pub contiguous_end: u64,
    pub sealed: Option<manifest_db::Sealed>,
    pub superseded: bool,
    /// When it was last recorded (ms since the Unix epoch), if known.
    pub committed_unix_ms: Option<u64>,
}

impl DurableFile {
    pub(crate) fn of(id: FileId, record: FileRecord) -> Self {
        Self {
            contiguous_end: record.placed.contiguous_end(),
            ranges: record.placed.ranges().to_vec(),
            // Where the file is: a recorded move not made yet leaves it at
            // its old name.
            path: record.renamed_from.unwrap_or(record.dest_path),
            sealed: record.sealed,
            superseded: record.superseded,
            committed_unix_ms: record.committed_unix_ms,
            id,
        }
    }
}
