//! The tailer: one thread that owns every tracked file, reads what was
//! appended, batches it, sends control rows (open, rename, seal) and
//! checkpoints what the sinks acknowledged.
//!
//! Files are identified by (device, inode), their birth time where the
//! filesystem keeps one (a freed inode number is reused by the next file)
//! and a fingerprint of their first bytes, never by path alone: a rename
//! is the same file under a new path,
//! while a new inode at an old path, or a file that shrank, is a new
//! generation. Bytes of two generations are never mixed: each generation has
//! its own key on the wire.
//!
//! This file holds the state and the loop; the work is split by concern:
//! - `identity`: what a path is (new file, rename, new generation, resumed);
//! - `reader`: reading appended bytes into batches;
//! - `batcher`: handing batches to the sinks' connections;
//! - `controls`: open, rename and seal rows, and when a file is sealed;
//! - `acks`: acknowledgements, applied to each file;
//! - `checkpoint`: acknowledged offsets to the state store, and progress.

mod acks;
mod batcher;
mod checkpoint;
mod controls;
mod identity;
mod reader;

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use anyhow::Context;
use flight_server::{
    BatchBuilder, Delivery, FileHasher, FileWatermark, Outgoing, RejectedRow, RowKind,
};
use manifest_db::{IntervalSet, WatchState, WatchedFile};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use crate::config::WatchConfig;
use crate::discover::{self, Change, Discovery, Found};
use crate::lag::{LagEvents, LagHistory};
use crate::progress::{FileProgress, Progress};
use crate::seal_hash::{Hashed, Job, SealHasher};
use crate::shard::rendezvous;
use crate::stop::Stop;

/// Bytes at the head of a file used as its fingerprint.
const FINGERPRINT_LEN: u64 = 4096;
/// How often every file is checked for an idle seal.
const SEAL_SWEEP_EVERY: Duration = Duration::from_millis(250);
/// Growth observations kept per file for its lag in seconds.
const MAX_GROWTH_MARKS: usize = 64;
/// How often acknowledged offsets are written to the state store.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(200);
/// After a stop, how long acknowledgements of what was already sent are
/// awaited: long enough that a clean stop with healthy sinks records nearly
/// everything (less to send again), short enough that a stop does not
/// depend on the sinks.
const STOP_GRACE: Duration = Duration::from_secs(2);

type FileKey = (String, u64);

/// The tailer looks its files up several times per append. With SipHash
/// over their (path, generation) keys, hashing was a large share of the
/// watcher's instructions (docs/measurements.md); foldhash is a few times
/// cheaper. It is seeded per
/// process and per map, so names prepared to collide do not; it does not
/// claim to resist someone who can time the watcher while choosing names,
/// and need not: whoever writes into the watched tree is trusted with its
/// data already.
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
type Set<K> = HashSet<K, foldhash::fast::RandomState>;

enum Control {
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

struct Tracked {
    key: String,
    generation: u64,
    path: String,
    dev: u64,
    ino: u64,
    born_ns: Option<i64>,
    file: Option<File>,
    size_seen: u64,
    read_offset: u64,
    acked: IntervalSet,
    fingerprint: u32,
    fingerprint_len: u32,
    /// The digest so far, from offset 0 to `hashed_to`. Started by the first
    /// read at offset 0 (a file waiting to be read holds none: with many new
    /// files queued that is ~2 KiB each); None past that point means the
    /// seal hashes the file from disk.
    hasher: Option<FileHasher>,
    hashed_to: u64,
    sink: usize,
    last_change: Instant,
    closed: bool,
    deleted: bool,
    seal_wanted: bool,
    /// Data may flow (generation 1, or its Open was acknowledged).
    open_acked: bool,
    controls: VecDeque<Control>,
    control_in_flight: bool,
    /// Its seal's digest is being read from disk by the seal hasher.
    seal_hashing: bool,
    sealed: bool,
    failed: Option<String>,
    /// Where the sink has this file (the last acknowledged name).
    sink_path: String,
    /// Re-tracked only to rename a sealed file; done when the rename is acknowledged.
    rename_only: bool,
    /// Modification time when last sized up for a seal.
    mtime_ns: i64,
    /// No event tells of its changes (`--events poll`, or its directory
    /// could not be watched): it is polled, and idleness alone tells that
    /// it is done.
    polled: bool,
    poll_interval: Duration,
    next_poll: Instant,
    /// (size, when first seen) of recent growth, oldest first: the age of
    /// the oldest unacknowledged byte is the age of the first entry above
    /// the acknowledged offset.
    growth: VecDeque<(u64, Instant)>,
    /// Recent (size, acknowledged) samples: the file's lag state and rates.
    lag: LagHistory,
}

impl Tracked {
    /// Whether `meta` describes this file (and not a new file that reused
    /// its inode number after it was deleted). While its descriptor is
    /// open the inode cannot be reused, whatever the birth times say.
    fn is(&self, meta: &std::fs::Metadata) -> bool {
        meta.dev() == self.dev
            && meta.ino() == self.ino
            && (self.file.is_some() || discover::same_birth(self.born_ns, discover::born_ns(meta)))
    }

    /// Whether a file found with this birth time is another file on this
    /// one's inode number: only possible once this one's descriptor is
    /// closed, and only told where both birth times are known.
    fn reused_by(&self, born_ns: Option<i64>) -> bool {
        self.file.is_none() && !discover::same_birth(self.born_ns, born_ns)
    }

    fn acked_offset(&self) -> u64 {
        self.acked.contiguous_end()
    }

    fn record(&self) -> WatchedFile {
        WatchedFile {
            key: self.key.clone(),
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
struct Finished {
    key: String,
    generation: u64,
    path: String,
    size: u64,
    mtime_ns: i64,
    born_ns: Option<i64>,
}

impl Finished {
    fn of(t: &Tracked, mtime_ns: i64) -> Self {
        Self {
            key: t.key.clone(),
            generation: t.generation,
            path: t.path.clone(),
            size: t.read_offset,
            mtime_ns,
            born_ns: t.born_ns,
        }
    }
}

/// What reconciliation made of a file found on disk.
enum Adoption {
    /// Part of it is at the sink: continue from there.
    Track(Box<Tracked>),
    /// All of it is at the sink, sealed.
    Complete,
    /// The sink holds nothing of it.
    Unknown,
}

struct RowRef {
    file: FileKey,
    kind: RowKind,
    offset: u64,
    len: u64,
    /// A rename's new path.
    path: Option<String>,
}

struct OpenBatch {
    builder: BatchBuilder,
    rows: Vec<RowRef>,
    started: Option<Instant>,
}

impl OpenBatch {
    fn new(config: &WatchConfig) -> Self {
        Self {
            builder: BatchBuilder::with_capacity(64, config.batch_bytes + config.max_row_bytes),
            rows: Vec::new(),
            started: None,
        }
    }
}

pub(crate) struct Tailer {
    config: Arc<WatchConfig>,
    root: PathBuf,
    state: WatchState,
    files: Map<FileKey, Tracked>,
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
    /// What the sinks hold, for a watcher that lost its state.
    watermarks: Vec<(usize, FileWatermark)>,
    batches: Vec<OpenBatch>,
    outboxes: Vec<mpsc::Sender<Outgoing>>,
    in_flight: Map<u64, Vec<RowRef>>,
    next_token: u64,
    deliveries: std::sync::mpsc::Receiver<(usize, Delivery)>,
    ready: VecDeque<FileKey>,
    ready_set: Set<FileKey>,
    dirty: Set<FileKey>,
    progress: Arc<Progress>,
    /// Told how long each growth took to become durable.
    lag_events: Option<Arc<dyn LagEvents>>,
    /// When each sink last acknowledged anything.
    sink_last_ack: Vec<Instant>,
    /// Since when checkpoints have failed (the state directory full or
    /// failing), and when that was last logged.
    checkpoint_failing: Option<(Instant, Instant)>,
    /// Largest single data row read at once.
    max_row_bytes: usize,
    discovery: Box<dyn Discovery>,
    /// Some files are polled (see [`Tracked::polled`]).
    polling_some: bool,
    /// Directories left unwatched, as last told in the log.
    unwatched_told: usize,
    /// What the last walk passed over (each told in the log once).
    skipped: std::collections::BTreeSet<discover::Skipped>,
    /// Set while a walk (not an event) brings files under tracking.
    walking: bool,
    /// Files whose controls or seal may be able to move.
    attention: Set<FileKey>,
    /// Descriptors opened since the last check against the open-file cap.
    opened_since_shed: usize,
    next_sweep: Instant,
    seal_hasher: SealHasher<FileKey>,
    stop: Arc<Stop>,
}

impl Tailer {
    pub fn new(
        config: Arc<WatchConfig>,
        state: WatchState,
        watermarks: Vec<(usize, FileWatermark)>,
        outboxes: Vec<mpsc::Sender<Outgoing>>,
        deliveries: std::sync::mpsc::Receiver<(usize, Delivery)>,
        progress: Arc<Progress>,
        stop: Arc<Stop>,
    ) -> anyhow::Result<Self> {
        let mut max_generation: Map<String, u64> = Map::default();
        let mut resumable = Map::default();
        for record in state.load()? {
            let g = max_generation.entry(record.key.clone()).or_default();
            *g = (*g).max(record.generation);
            resumable
                .entry((record.dev, record.ino))
                .or_insert_with(Vec::new)
                .push(record);
        }
        for (_, mark) in &watermarks {
            let g = max_generation.entry(mark.key.clone()).or_default();
            *g = (*g).max(mark.generation);
        }
        let discovery = discover::discovery(&config.root, config.events)
            .with_context(|| format!("watching {} for changes", config.root.display()))?;
        let polling_some = config.events == discover::EventSource::Poll;
        let batches = (0..outboxes.len())
            .map(|_| OpenBatch::new(&config))
            .collect();
        let sink_last_ack = vec![Instant::now(); config.sinks.len().max(1)];
        Ok(Self {
            root: config.root.clone(),
            max_row_bytes: config.max_row_bytes.max(4096),
            config,
            state,
            files: Map::default(),
            by_path: Map::default(),
            by_inode: Map::default(),
            max_generation,
            finished: Map::default(),
            finished_at: Map::default(),
            resumable,
            watermarks,
            batches,
            outboxes,
            in_flight: Map::default(),
            next_token: 0,
            deliveries,
            ready: VecDeque::new(),
            ready_set: Set::default(),
            dirty: Set::default(),
            lag_events: progress.lag_events(),
            sink_last_ack,
            checkpoint_failing: None,
            progress,
            polling_some,
            unwatched_told: 0,
            skipped: Default::default(),
            discovery,
            walking: false,
            attention: Set::default(),
            opened_since_shed: 0,
            next_sweep: Instant::now(),
            seal_hasher: SealHasher::start(stop.clone())
                .context("starting the seal hasher thread")?,
            stop,
        })
    }

    /// Makes the seal hasher take each job only once `gate` yields.
    #[cfg(test)]
    pub fn hold_seal_hashing(&mut self, gate: std::sync::mpsc::Receiver<()>) -> anyhow::Result<()> {
        self.seal_hasher = SealHasher::start_held(self.stop.clone(), gate)
            .context("starting the seal hasher thread")?;
        Ok(())
    }

    /// Tails until a stop is requested (see [`Stop`]) or something fails.
    pub fn run(mut self) -> anyhow::Result<()> {
        self.rescan()?;
        let mut next_rescan = Instant::now() + self.config.rescan_every;
        let mut next_checkpoint = Instant::now() + CHECKPOINT_EVERY;
        while !self.stop.is_requested() {
            let timeout = self.wait_budget();
            let changes = self.discovery.wait(timeout)?;
            self.drain_deliveries();
            self.collect_seal_digests();
            let mut overflow = false;
            for change in changes {
                overflow |= self.on_change(change);
            }
            let now = Instant::now();
            if overflow || now >= next_rescan {
                self.rescan()?;
                next_rescan = now + self.config.rescan_every;
            }
            if self.polling_some {
                self.queue_due_polls(now);
            }
            self.read_ready();
            self.flush_due(Instant::now());
            self.advance_controls();
            if Instant::now() >= next_checkpoint {
                self.checkpoint()?;
                next_checkpoint = Instant::now() + CHECKPOINT_EVERY;
            }
        }
        self.settle();
        self.checkpoint()?;
        Ok(())
    }

    /// After a stop: sends what is batched if there is room and collects
    /// the acknowledgements that arrive within [`STOP_GRACE`]. Whatever is
    /// still unacknowledged then stays unrecorded and is read again by the
    /// next run.
    fn settle(&mut self) {
        self.drain_deliveries();
        self.flush_all();
        let deadline = Instant::now() + STOP_GRACE;
        while !self.in_flight.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.deliveries.recv_timeout(left) {
                Ok((_, delivery)) => self.on_delivery(delivery),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
            }
        }
        if !self.in_flight.is_empty() {
            tracing::info!(
                batches = self.in_flight.len(),
                "stopping with batches unacknowledged; they are sent again after a restart"
            );
        }
    }

    /// How long to wait for events: short while a batch lingers or polls are due.
    fn wait_budget(&self) -> Duration {
        let mut budget = Duration::from_millis(10);
        if !self.ready.is_empty() {
            return Duration::ZERO;
        }
        let now = Instant::now();
        for batch in &self.batches {
            if let Some(started) = batch.started {
                budget = budget.min((started + self.config.linger).saturating_duration_since(now));
            }
        }
        if self.polling_some {
            budget = budget.min(self.config.poll_min);
        }
        budget
    }

    fn mark_ready(&mut self, key: &FileKey) {
        self.attention.insert(key.clone());
        if self.ready_set.insert(key.clone()) {
            self.ready.push_back(key.clone());
        }
    }
}
