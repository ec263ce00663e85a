//! The tailer: one thread that owns every tracked file, reads what was
//! appended, batches it, sends control rows (open, rename, seal) and
//! checkpoints what the sinks acknowledged.
//!
//! Files are identified by (device, inode) plus a fingerprint of their first
//! bytes, never by path alone: a rename is the same file under a new path,
//! while a new inode at an old path, or a file that shrank, is a new
//! generation. Bytes of two generations are never mixed: each generation has
//! its own key on the wire.

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

use crate::discover::{self, Change, Events, Found};
use crate::progress::{FileProgress, Progress};
use crate::seal_hash::{Hashed, Job, SealHasher};
use crate::stop::Stop;
use crate::{WatchConfig, rendezvous};

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
/// over their (path, generation) keys, hashing was a fifth of the watcher's
/// instructions in P3; foldhash is a few times cheaper. It is seeded per
/// process and per map, so names prepared to collide do not; it does not
/// claim to resist someone who can time the watcher while choosing names,
/// and need not: whoever writes into the watched tree is trusted with its
/// data already.
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
type Set<K> = HashSet<K, foldhash::fast::RandomState>;

enum Control {
    Open,
    Rename(String),
    Seal { size: u64, digest: String },
}

struct Tracked {
    key: String,
    generation: u64,
    path: String,
    dev: u64,
    ino: u64,
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
    poll_interval: Duration,
    next_poll: Instant,
    /// (size, when first seen) of recent growth, oldest first: the age of
    /// the oldest unacknowledged byte is the age of the first entry above
    /// the acknowledged offset.
    growth: VecDeque<(u64, Instant)>,
}

impl Tracked {
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
}

impl Finished {
    fn of(t: &Tracked, mtime_ns: i64) -> Self {
        Self {
            key: t.key.clone(),
            generation: t.generation,
            path: t.path.clone(),
            size: t.read_offset,
            mtime_ns,
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
    resumable: Map<(u64, u64), WatchedFile>,
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
    /// Largest single data row read at once.
    max_row_bytes: usize,
    events: Option<Events>,
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
            resumable.insert((record.dev, record.ino), record);
        }
        for (_, mark) in &watermarks {
            let g = max_generation.entry(mark.key.clone()).or_default();
            *g = (*g).max(mark.generation);
        }
        let events = if config.poll {
            None
        } else {
            Some(Events::new(&config.root)?)
        };
        let batches = (0..outboxes.len()).map(|_| new_batch(&config)).collect();
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
            progress,
            events,
            walking: false,
            attention: Set::default(),
            opened_since_shed: 0,
            next_sweep: Instant::now(),
            seal_hasher: SealHasher::start(stop.clone())
                .context("starting the seal hasher thread")?,
            stop,
        })
    }

    /// Tails until a stop is requested (see [`Stop`]) or something fails.
    pub fn run(mut self) -> anyhow::Result<()> {
        self.rescan()?;
        let mut next_rescan = Instant::now() + self.config.rescan_every;
        let mut next_checkpoint = Instant::now() + CHECKPOINT_EVERY;
        while !self.stop.is_requested() {
            let timeout = self.wait_budget();
            let changes = match &mut self.events {
                Some(events) => events.wait(timeout)?,
                None => {
                    std::thread::sleep(timeout);
                    Vec::new()
                }
            };
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
            if self.config.poll {
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
        if self.config.poll {
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

    /// Handles one inotify change; returns true when a full rescan is needed.
    fn on_change(&mut self, change: Change) -> bool {
        match change {
            Change::Overflow => {
                tracing::warn!("inotify queue overflowed; rescanning the tree");
                return true;
            }
            Change::NewDir { path } => {
                if let Some(events) = &mut self.events {
                    events.watch_dir(&path);
                }
                // Files may have been written before the watch existed.
                return true;
            }
            Change::Gone { path } => {
                if let Some(key) = self.by_path.get(&path).cloned() {
                    self.lost_path(&key);
                }
            }
            Change::Touched { path, closed } => {
                if let Some(key) = self.by_path.get(&path).cloned() {
                    if let Some(t) = self.files.get_mut(&key) {
                        // Written again after a close means open again.
                        t.closed = closed;
                    }
                    self.mark_ready(&key);
                } else if !self.finished_at.contains_key(&path) || closed {
                    self.look_at(&path, closed);
                }
            }
        }
        false
    }

    /// A tracked file's path disappeared: it was renamed (a later event or
    /// walk finds it by inode) or deleted (its descriptor still reads).
    fn lost_path(&mut self, key: &FileKey) {
        let Some(t) = self.files.get_mut(key) else {
            return;
        };
        let full = self.root.join(&t.path);
        match std::fs::symlink_metadata(&full) {
            Ok(meta) if meta.dev() == t.dev && meta.ino() == t.ino => return,
            _ => {}
        }
        self.by_path.remove(&t.path);
        if !t.deleted {
            tracing::debug!(path = %t.path, "file gone from its path (renamed or deleted); finishing what it holds");
        }
        t.deleted = true;
        t.last_change = Instant::now();
        self.dirty.insert(key.clone());
        self.mark_ready(key);
    }

    /// Stats one path and brings it under tracking (new file, rename, new generation).
    fn look_at(&mut self, path: &str, closed: bool) {
        let Ok(meta) = std::fs::symlink_metadata(self.root.join(path)) else {
            return;
        };
        if !meta.file_type().is_file() {
            return;
        }
        let found = Found {
            path: path.to_owned(),
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
            mtime_ns: discover::mtime_ns(&meta),
        };
        self.on_found(found);
        if closed
            && let Some(t) = self
                .by_path
                .get(path)
                .and_then(|key| self.files.get_mut(key))
        {
            t.closed = true;
        }
    }

    fn on_found(&mut self, found: Found) {
        let inode = (found.dev, found.ino);
        if let Some(done) = self.finished.get(&inode) {
            let unchanged = done.size == found.size && done.mtime_ns == found.mtime_ns;
            if unchanged && done.path == found.path {
                return;
            }
            let done = self.forget_finished(inode);
            if unchanged {
                // Renamed after its seal: rename it at the destination too.
                self.rename_sealed(done, &found);
            } else {
                tracing::warn!(path = %found.path, "a sealed file changed; sending it as a new generation");
                self.start_new(&found, Some(found.path.clone()));
            }
            return;
        }
        if let Some(other) = self.finished_at.remove(&found.path) {
            // Another inode now holds a sealed path: a new file replaced it.
            if let Some(done) = self.finished.get_mut(&other) {
                done.path.clear();
            }
        }
        let inode = (found.dev, found.ino);
        if let Some(key) = self.by_inode.get(&inode).cloned() {
            let at_path = self.by_path.get(&found.path).cloned();
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
        if let Some(other) = self.by_path.get(&found.path).cloned() {
            // A different inode at a tracked path: the old file was replaced.
            self.lost_path(&other);
        }
        if let Some(record) = self.resumable.remove(&inode)
            && self.resume(record, &found)
        {
            return;
        }
        match self.adopt(&found) {
            Adoption::Track(adopted) => self.insert(*adopted),
            Adoption::Complete => {}
            Adoption::Unknown => self.start_new(&found, None),
        }
    }

    fn finish(&mut self, t: &Tracked, mtime_ns: i64) {
        let mut done = Finished::of(t, mtime_ns);
        done.size = t.acked_offset().max(t.read_offset);
        self.inode_finished(t.dev, t.ino, done);
    }

    fn remember_finished(&mut self, done: Finished) {
        let inode = self
            .files
            .get(&(done.key.clone(), done.generation))
            .map(|t| (t.dev, t.ino));
        if let Some((dev, ino)) = inode {
            self.inode_finished(dev, ino, done);
        }
    }

    fn inode_finished(&mut self, dev: u64, ino: u64, done: Finished) {
        if !done.path.is_empty() {
            self.finished_at.insert(done.path.clone(), (dev, ino));
        }
        self.finished.insert((dev, ino), done);
    }

    fn forget_finished(&mut self, inode: (u64, u64)) -> Finished {
        let done = self.finished.remove(&inode).unwrap_or(Finished {
            key: String::new(),
            generation: 0,
            path: String::new(),
            size: 0,
            mtime_ns: 0,
        });
        if self.finished_at.get(&done.path) == Some(&inode) {
            self.finished_at.remove(&done.path);
        }
        done
    }

    /// Tracks a sealed file again just long enough to rename it at the sink.
    fn rename_sealed(&mut self, done: Finished, found: &Found) {
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
        t.controls.push_back(Control::Rename(found.path.clone()));
        self.insert(t);
    }

    fn renamed(&mut self, key: &FileKey, new_path: &str) {
        let Some(t) = self.files.get_mut(key) else {
            return;
        };
        let old = std::mem::replace(&mut t.path, new_path.to_owned());
        self.by_path.remove(&old);
        self.by_path.insert(new_path.to_owned(), key.clone());
        t.deleted = false;
        let suffix = &self.config.inprogress_suffix;
        if old.ends_with(suffix.as_str()) && !new_path.ends_with(suffix.as_str()) {
            t.seal_wanted = true;
        }
        tracing::debug!(from = %old, to = %new_path, "rename");
        t.controls.push_back(Control::Rename(new_path.to_owned()));
        self.dirty.insert(key.clone());
        self.mark_ready(key);
    }

    /// Picks up a file recorded by an earlier run, if it is still the same file.
    fn resume(&mut self, record: WatchedFile, found: &Found) -> bool {
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
            t.controls.push_back(Control::Rename(found.path.clone()));
        }
        self.insert(t);
        true
    }

    /// A watcher without state takes over what a sink already holds of this file.
    fn adopt(&mut self, found: &Found) -> Adoption {
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
            if let Err(error) = self.state.save(&[t.record()], false) {
                tracing::warn!(path = %found.path, %error, "cannot record an adopted sealed file");
            }
            self.finish(&t, found.mtime_ns);
            return Adoption::Complete;
        }
        tracing::info!(path = %found.path, resume_at = mark.contiguous_end, "resuming from the sink's watermark");
        Adoption::Track(Box::new(t))
    }

    fn start_new(&mut self, found: &Found, path_override: Option<String>) {
        let key = path_override.unwrap_or_else(|| found.path.clone());
        let generation = self.max_generation.get(&key).map_or(1, |g| g + 1);
        let mut t = self.tracked(&key, generation, found);
        if generation > 1 {
            t.open_acked = false;
            t.controls.push_back(Control::Open);
        }
        self.insert(t);
    }

    fn tracked(&self, key: &str, generation: u64, found: &Found) -> Tracked {
        let now = Instant::now();
        // A file found by a walk was opened (and maybe closed) where no event
        // showed it, so only idleness can tell it is done; a file first seen
        // through an event waits for its close event.
        let closed = self.walking;
        Tracked {
            key: key.to_owned(),
            generation,
            path: found.path.clone(),
            dev: found.dev,
            ino: found.ino,
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
            poll_interval: self.config.poll_min,
            next_poll: now,
            growth: VecDeque::new(),
        }
    }

    fn insert(&mut self, t: Tracked) {
        let key = (t.key.clone(), t.generation);
        let g = self.max_generation.entry(t.key.clone()).or_default();
        *g = (*g).max(t.generation);
        self.by_path.insert(t.path.clone(), key.clone());
        self.by_inode.insert((t.dev, t.ino), key.clone());
        self.files.insert(key.clone(), t);
        self.dirty.insert(key.clone());
        self.mark_ready(&key);
    }

    /// Walks the whole tree: finds new files, renames and deletions that
    /// events missed, and re-checks every tracked file.
    fn rescan(&mut self) -> anyhow::Result<()> {
        let (found, dirs) = discover::walk(&self.root)?;
        if let Some(events) = &mut self.events {
            for dir in &dirs {
                events.watch_dir(dir);
            }
        }
        let present: Set<(u64, u64)> = found.iter().map(|f| (f.dev, f.ino)).collect();
        self.walking = true;
        for f in found {
            self.on_found(f);
        }
        self.walking = false;
        let keys: Vec<FileKey> = self.files.keys().cloned().collect();
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
    fn check_fingerprint(&mut self, key: &FileKey) {
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
    fn new_generation(&mut self, key: &FileKey) {
        let Some(old) = self.files.remove(key) else {
            return;
        };
        self.by_path.remove(&old.path);
        self.by_inode.remove(&(old.dev, old.ino));
        self.ready_set.remove(key);
        let found = Found {
            path: old.path.clone(),
            dev: old.dev,
            ino: old.ino,
            size: 0,
            mtime_ns: 0,
        };
        let generation = self
            .max_generation
            .get(&old.key)
            .copied()
            .unwrap_or(old.generation)
            + 1;
        let mut t = self.tracked(&old.key, generation, &found);
        t.open_acked = false;
        t.controls.push_back(Control::Open);
        t.closed = old.closed;
        t.file = old.file;
        self.insert(t);
    }

    fn queue_due_polls(&mut self, now: Instant) {
        let due: Vec<FileKey> = self
            .files
            .iter()
            .filter(|(_, t)| t.next_poll <= now && !t.sealed)
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            self.mark_ready(&key);
        }
    }

    /// Closes the descriptors of idle, fully read files when too many are
    /// open (they are opened again when the file grows). Deleted files keep
    /// theirs: their path cannot open them again.
    fn shed_descriptors(&mut self) {
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
    fn read_ready(&mut self) {
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
    fn prepare_read(&mut self, key: &FileKey) -> std::io::Result<Option<u64>> {
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
            let file = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(self.root.join(&t.path))?;
            let meta = file.metadata()?;
            if meta.dev() != t.dev || meta.ino() != t.ino {
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
    fn read_file(&mut self, key: &FileKey) -> std::io::Result<bool> {
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
            let batch = &mut self.batches[t.sink];
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
            if self.batches[sink].builder.encoded_bytes() >= self.config.batch_bytes {
                self.flush(sink);
            }
        }
    }

    /// Sends batches whose linger time is up. When nothing is in flight the
    /// link is idle and waiting would only add latency, so a batch goes at
    /// once; under load, acks take a while and the linger gathers rows.
    fn flush_due(&mut self, now: Instant) {
        let idle = self.in_flight.is_empty();
        for sink in 0..self.batches.len() {
            if let Some(started) = self.batches[sink].started
                && (idle || now >= started + self.config.linger)
            {
                self.flush(sink);
            }
        }
    }

    fn flush_all(&mut self) {
        for sink in 0..self.batches.len() {
            self.flush(sink);
        }
    }

    /// Hands the open batch of a sink to its connections (blocking while the
    /// queue is full, until a stop: see [`hand_over`]).
    fn flush(&mut self, sink: usize) {
        let batch = &mut self.batches[sink];
        if batch.builder.rows() == 0 {
            batch.started = None;
            return;
        }
        let encoded = batch.builder.finish_encoded();
        let rows = std::mem::take(&mut batch.rows);
        batch.started = None;
        let token = self.next_token;
        self.next_token += 1;
        self.in_flight.insert(token, rows);
        let out = Outgoing {
            token,
            batch: encoded,
        };
        if let Err(why) = hand_over(&self.outboxes[sink], out, &self.stop) {
            // Never acknowledged, so never recorded: the next run reads it again.
            self.in_flight.remove(&token);
            match why {
                NotSent::Stopping => {
                    tracing::debug!(sink, "stopping; a batch waiting for room was dropped")
                }
                NotSent::PoolGone => tracing::error!(
                    sink,
                    "the connection pool is gone; batch dropped (it will be re-read after restart)"
                ),
            }
        }
    }

    /// Sends queued control rows (one in flight per file) and seals files
    /// that are complete and fully acknowledged.
    fn advance_controls(&mut self) {
        let now = Instant::now();
        // Files that changed since the last call, plus all of them now and
        // then for the idle-seal clock: no per-iteration sweep over every file.
        let keys: Vec<FileKey> = if now >= self.next_sweep {
            self.next_sweep = now + SEAL_SWEEP_EVERY;
            self.attention.clear();
            self.files.keys().cloned().collect()
        } else {
            self.attention.drain().collect()
        };
        let mut to_flush = Set::default();
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
            let Some(control) = t.controls.pop_front() else {
                continue;
            };
            let batch = &mut self.batches[t.sink];
            let kind = match &control {
                Control::Open => {
                    batch.builder.push_open(&t.key, t.generation, &t.path);
                    RowKind::Open
                }
                Control::Rename(path) => {
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
                Control::Rename(path) => (0, Some(path)),
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
            // Thousands of files sealing at once must not make one message
            // too large for the sink.
            if self.batches[sink].builder.encoded_bytes() >= self.config.batch_bytes {
                self.flush(sink);
            }
        }
        for sink in to_flush {
            self.flush(sink);
        }
    }

    /// Takes the digests the seal hasher finished and queues their seals,
    /// unless the file changed while it was being hashed.
    fn collect_seal_digests(&mut self) {
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

    fn drain_deliveries(&mut self) {
        while let Ok((_sink, delivery)) = self.deliveries.try_recv() {
            self.on_delivery(delivery);
        }
    }

    fn on_delivery(&mut self, delivery: Delivery) {
        match delivery {
            Delivery::Acked { token, ack } => {
                let Some(rows) = self.in_flight.remove(&token) else {
                    return;
                };
                let rejected: Map<usize, RejectedRow> =
                    ack.rejected.into_iter().map(|r| (r.row, r)).collect();
                self.progress
                    .add_acked(ack.placed + ack.duplicate + ack.stale);
                for (index, row) in rows.into_iter().enumerate() {
                    self.on_row_acked(row, rejected.get(&index));
                }
            }
            Delivery::Refused { token, error } => {
                let Some(rows) = self.in_flight.remove(&token) else {
                    return;
                };
                for row in rows {
                    if let Some(t) = self.files.get_mut(&row.file) {
                        tracing::error!(path = %t.path, offset = row.offset, %error, "the sink refused this file's data; it stays unacknowledged");
                        t.failed = Some(error.clone());
                    }
                }
            }
        }
    }

    fn on_row_acked(&mut self, row: RowRef, rejected: Option<&RejectedRow>) {
        let Some(t) = self.files.get_mut(&row.file) else {
            return;
        };
        self.dirty.insert(row.file.clone());
        self.attention.insert(row.file.clone());
        match row.kind {
            RowKind::Data => {
                t.acked.insert(row.offset, row.offset + row.len);
                let acked = t.acked_offset();
                while t.growth.front().is_some_and(|&(size, _)| size <= acked) {
                    t.growth.pop_front();
                }
            }
            kind => {
                t.control_in_flight = false;
                if let Some(rejection) = rejected {
                    if rejection.superseded {
                        // A newer generation took this file's place at the
                        // sink (it was replaced at the source): let it go.
                        tracing::info!(path = %t.path, generation = t.generation, "replaced by a newer generation; released");
                        t.sealed = true;
                        t.file = None;
                        return;
                    }
                    tracing::error!(path = %t.path, ?kind, error = %rejection.error, "the sink rejected a control row");
                    if kind != RowKind::Rename {
                        t.failed = Some(rejection.error.clone());
                    }
                    return;
                }
                match kind {
                    RowKind::Open => {
                        t.open_acked = true;
                        let key = row.file.clone();
                        self.mark_ready(&key);
                    }
                    RowKind::Seal => {
                        t.sealed = true;
                        t.file = None;
                        tracing::info!(path = %t.path, size = row.offset, "sealed");
                        let t = &self.files[&row.file];
                        let done = Finished::of(t, t.mtime_ns);
                        self.remember_finished(done);
                    }
                    RowKind::Rename if t.rename_only && t.controls.is_empty() => {
                        if let Some(path) = row.path {
                            t.sink_path = path;
                        }
                        // A sealed file renamed: nothing else to send.
                        t.sealed = true;
                        t.file = None;
                        let t = &self.files[&row.file];
                        let done = Finished::of(t, t.mtime_ns);
                        self.remember_finished(done);
                    }
                    RowKind::Rename => {
                        if let Some(path) = row.path {
                            t.sink_path = path;
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    /// Writes acknowledged offsets; forgets sealed files once recorded.
    fn checkpoint(&mut self) -> anyhow::Result<()> {
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

enum NotSent {
    Stopping,
    PoolGone,
}

/// Hands a batch to a sink's connections. Waiting while the outbox is full
/// is the backpressure that bounds memory, but the room comes from the sink
/// acknowledging: a stop must end that wait, or an unresponsive sink holds
/// the watcher forever.
fn hand_over(outbox: &mpsc::Sender<Outgoing>, out: Outgoing, stop: &Stop) -> Result<(), NotSent> {
    let out = match outbox.try_send(out) {
        Ok(()) => return Ok(()),
        Err(TrySendError::Closed(_)) => return Err(NotSent::PoolGone),
        Err(TrySendError::Full(out)) => out,
    };
    if stop.is_requested() {
        return Err(NotSent::Stopping);
    }
    // The tailer is a plain thread: a local executor waits for whichever
    // comes first, room or the stop.
    futures::executor::block_on(async {
        tokio::select! {
            biased;
            () = stop.requested() => Err(NotSent::Stopping),
            sent = outbox.send(out) => sent.map_err(|_| NotSent::PoolGone),
        }
    })
}

fn new_batch(config: &WatchConfig) -> OpenBatch {
    OpenBatch {
        builder: BatchBuilder::with_capacity(64, config.batch_bytes + config.max_row_bytes),
        rows: Vec::new(),
        started: None,
    }
}

fn seal_due(t: &Tracked, now: Instant, config: &WatchConfig) -> bool {
    let complete = t.read_offset == t.size_seen && t.acked.covers(0, t.read_offset) && t.open_acked;
    if !complete {
        return false;
    }
    if t.seal_wanted {
        return true;
    }
    let idle = now.duration_since(t.last_change) >= config.seal_idle;
    let may_be_done = t.closed || t.deleted || config.poll;
    idle && may_be_done && !t.path.ends_with(config.inprogress_suffix.as_str())
}

/// What sealing a complete file takes next.
enum SealStep {
    /// It grew meanwhile: not complete after all.
    Grew,
    Ready(Control),
    /// Its digest must be read from disk (by the seal hasher, see [`SealHasher`]).
    Hash(File),
}

/// The size of a tracked file now (a deleted one without a descriptor
/// cannot change any more); records its modification time.
fn current_size(t: &mut Tracked, root: &std::path::Path) -> std::io::Result<u64> {
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
fn seal_step(t: &mut Tracked, root: &std::path::Path) -> std::io::Result<SealStep> {
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

/// crc32c of the first `len` bytes, or None if the file is shorter or unreadable.
fn head_crc(path: &std::path::Path, len: u64) -> Option<u32> {
    let file = File::open(path).ok()?;
    flight_server::checksum::crc32c_of_file_prefix(&file, len).ok()
}
