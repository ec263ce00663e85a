//! The sink: receives byte ranges over Flight, places each at its offset in
//! its destination file under the root, makes it durable, records it in the
//! manifest, and only then acknowledges.
//!
//! - `config`: what the sink is told to do (root, layout, policies, limits);
//! - `audit`: checks a stopped sink's manifest (`tailflight audit`);
//! - [`confine`]: keeps destination paths under the root;
//! - [`error`]: what can go wrong, by whose fault;
//! - [`health`]: whether the sink can still be trusted with work;
//! - [`feed`]: the commit feed, what became durable, for listeners;
//! - [`outbox`]: the events each commit records for a relay to publish;
//! - `service`: the Flight-facing side (the only place gRPC codes appear);
//! - `state`: what placement and the committer share (slots, commit requests);
//! - `place`: writes ranges and applies control rows, exactly once;
//! - `commit`: group commit (fdatasync, then one synced manifest write);
//! - `durability`: how bytes become durable: `flush` (syncfs or fdatasync
//!   each), `journal` (where small ranges become durable first) and
//!   `direct` (the aligned middle of large ranges, past the page cache);

mod audit;
mod blocking;
mod commit;
mod config;
pub mod confine;
mod durability;
pub mod error;
pub mod feed;
pub mod health;
mod lock_order;
pub mod outbox;
mod place;
pub mod root_mark;
mod service;
mod stage_cpu;
mod state;
pub mod subscribe;
mod written_crc;

/// Helpers shared by the unit tests of this crate's modules.
#[cfg(test)]
mod test_support {
    /// An empty folder of its own under the temp directory, per test and process.
    pub fn scratch(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("tailflight-sink-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}

/// Fault points the unit tests arm to make the sink panic where a bug
/// could, or an I/O call fail where a disk could. Armed per source name,
/// so tests running at once in one process only hit their own.
#[cfg(test)]
pub(crate) mod fault {
    use std::sync::Mutex;

    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    pub enum Point {
        /// In a placement thread, after the batch was placed and before its
        /// commit request was submitted.
        AfterPlacement,
        /// On the committer's thread, outside the parts that catch panics.
        CommitterLoop,
        /// In a placement thread making a rename, once the intent is in
        /// memory and before it is recorded (the gate was held here once).
        MoveIntent,
        /// Instead of a destination file's fdatasync (an I/O fault: see
        /// [`fail_io`]).
        FileSync,
        /// Instead of the journal file's fdatasync ending a round.
        JournalSync,
        /// Instead of writing a range into its destination file.
        FileWrite,
        /// Instead of a range's write made after its request's submission
        /// (see `place::beside`).
        DeferredWrite,
        /// In the background flush of journaled files, before it flushes a
        /// file (armed with [`fail_io`]; it panics instead of failing).
        BackgroundFlush,
    }

    static ARMED: Mutex<Vec<(Point, String)>> = Mutex::new(Vec::new());
    static PAUSED: Mutex<Vec<(Point, String, Pause)>> = Mutex::new(Vec::new());

    /// Where a paused thread tells it got there, and waits to be let go.
    #[derive(Clone)]
    struct Pause {
        reached: std::sync::mpsc::SyncSender<()>,
        release: std::sync::Arc<std::sync::Barrier>,
    }

    /// A paused point: [`Self::reached`] returns once a thread stops there,
    /// [`Self::release`] lets it go on.
    pub struct Paused {
        reached: std::sync::mpsc::Receiver<()>,
        release: std::sync::Arc<std::sync::Barrier>,
    }

    impl Paused {
        pub fn reached(&self) {
            self.reached
                .recv_timeout(std::time::Duration::from_secs(30))
                .expect("no thread reached the paused point");
        }

        pub fn release(self) {
            self.release.wait();
        }
    }

    /// The next thread of `source` to reach `point` stops there until released.
    pub fn pause(point: Point, source: &str) -> Paused {
        let (reached, reached_rx) = std::sync::mpsc::sync_channel(1);
        let release = std::sync::Arc::new(std::sync::Barrier::new(2));
        let pause = Pause {
            reached,
            release: release.clone(),
        };
        crate::state::lock(&PAUSED).push((point, source.to_owned(), pause));
        Paused {
            reached: reached_rx,
            release,
        }
    }

    /// The next batch of `source` to reach `point` panics there (once).
    pub fn arm(point: Point, source: &str) {
        crate::state::lock(&ARMED).push((point, source.to_owned()));
    }

    static FAILING: Mutex<Vec<(Point, String)>> = Mutex::new(Vec::new());

    /// The next I/O at `point` on a path under a directory named `key` (a
    /// source, as in `<root>/<source>/...`), or on the path `key` itself,
    /// fails with EIO (once: as a kernel reports a writeback error once,
    /// and the next fdatasync of the file succeeds).
    pub fn fail_io(point: Point, key: impl Into<String>) {
        crate::state::lock(&FAILING).push((point, key.into()));
    }

    /// The error an armed [`fail_io`] injects at `point` for `path`, if any.
    pub fn io(point: Point, path: impl AsRef<std::path::Path>) -> std::io::Result<()> {
        let path = path.as_ref();
        let mut failing = crate::state::lock(&FAILING);
        let armed = failing.iter().position(|(p, key)| {
            *p == point
                && (path == std::path::Path::new(key)
                    || path.components().any(|c| c.as_os_str() == key.as_str()))
        });
        match armed {
            Some(at) => {
                failing.remove(at);
                Err(std::io::Error::from_raw_os_error(
                    rustix::io::Errno::IO.raw_os_error(),
                ))
            }
            None => Ok(()),
        }
    }

    pub fn hit(point: Point, source: &str) {
        let mut paused = crate::state::lock(&PAUSED);
        if let Some(at) = paused
            .iter()
            .position(|(p, s, _)| *p == point && s == source)
        {
            let (_, _, pause) = paused.remove(at);
            drop(paused);
            let _ = pause.reached.send(());
            pause.release.wait();
            return;
        }
        drop(paused);
        let mut armed = crate::state::lock(&ARMED);
        if let Some(at) = armed.iter().position(|(p, s)| *p == point && s == source) {
            armed.remove(at);
            drop(armed);
            panic!("fault injected at {point:?} for source {source}");
        }
    }
}

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context;
use flight_server::protocol::FileWatermark;
use flight_server::service::ServerConfig;
use flight_server::{Ack, RangeBatch};
use manifest_db::SinkManifest;
use serde::{Deserialize, Serialize};

use crate::commit::{CommitAnswer, Committer};
use crate::confine::Root;
use crate::place::Placer;

pub use crate::audit::{AuditReport, audit};
pub use crate::config::{Layout, SinkConfig, SupersededPolicy};
pub use crate::durability::flush::SyncStrategy;
use crate::durability::{direct, flush, journal};
pub use crate::error::SinkError;
pub use crate::feed::{
    CommitRound, DurableFile, DurableSnapshot, FeedHandle, FileChange, FileCommit, RoundStages,
};
pub use crate::health::Health;

/// Counters and state answered by the `status` action.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct SinkStatus {
    pub placed_bytes: u64,
    pub duplicate_bytes: u64,
    pub rewritten_bytes: u64,
    pub files: u64,
    pub sealed_files: u64,
    /// Journaled bytes whose destination files are not flushed yet.
    #[serde(default)]
    pub journal_backlog_bytes: u64,
    /// Batches placed at once at most.
    #[serde(default)]
    pub placement_threads: usize,
    /// Batches being placed now, and the most at once since the start.
    #[serde(default)]
    pub placements_running: usize,
    #[serde(default)]
    pub placements_running_peak: usize,
    /// Received batches waiting for a placement thread: the disk or the
    /// CPU is behind what the peers send.
    #[serde(default)]
    pub placements_waiting: usize,
    /// Bytes that arrived ahead of the bytes before them in their file,
    /// waiting in memory (a file grows only over bytes written in order).
    #[serde(default)]
    pub held_bytes: u64,
    /// Bytes the manifest's RocksDB holds in memory (memtables and block
    /// cache): bounded by its options, not by the traffic.
    #[serde(default)]
    pub manifest_memory_bytes: u64,
    /// Bytes written past the page cache (O_DIRECT) since the start, and
    /// those of them copied into an aligned buffer first because they were
    /// not received aligned like their file offset.
    #[serde(default)]
    pub direct_written_bytes: u64,
    #[serde(default)]
    pub direct_staged_bytes: u64,
    /// Live-tail subscriptions, with how far behind each is.
    #[serde(default)]
    pub subscriptions: Vec<subscribe::SubscriptionStatus>,
    pub poisoned: Option<String>,
    /// The event outbox and its relay, when the sink records events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<outbox::OutboxStatus>,
    /// The process's place in a fleet (identity, role, epoch, lease), as
    /// whoever runs the sink describes it (see [`Sink::describe_fleet`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<serde_json::Value>,
    /// The process's own figures (its heap by the allocator's count), as
    /// whoever runs the sink describes them (see [`Sink::describe_process`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<serde_json::Value>,
}

/// Describes the process's place in a fleet, or its figures, for `status`.
type FleetDescription = Box<dyn Fn() -> serde_json::Value + Send + Sync>;

/// Bounds the batches placed at once. Placement blocks (it writes files and
/// may wait for the commit gate), so each one runs on a thread of tokio's
/// blocking pool, and every thread that has placed batches keeps an
/// allocator heap of its own. Unbounded, a congested disk grows the pool
/// toward tokio's 512 threads, and the sink's memory with it; bounded,
/// received batches wait here, each stream holding at most its pipeline
/// depth of them.
struct PlacementThreads {
    permits: Arc<tokio::sync::Semaphore>,
    limit: usize,
    waiting: AtomicUsize,
    running: AtomicUsize,
    running_peak: AtomicUsize,
}

impl PlacementThreads {
    /// Placement is mostly CPU and page-cache writes: more threads than a
    /// few per core add no throughput, only heaps, and a blocked disk is not
    /// unblocked by more writers.
    fn auto_limit() -> usize {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        (cores * 4).clamp(8, 64)
    }

    fn new(limit: Option<usize>) -> Arc<Self> {
        let limit = limit.unwrap_or_else(Self::auto_limit).max(1);
        Arc::new(Self {
            permits: Arc::new(tokio::sync::Semaphore::new(limit)),
            limit,
            waiting: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            running_peak: AtomicUsize::new(0),
        })
    }

    /// Runs `work` on a blocking thread once one of the placement threads is
    /// free. Once started it runs to its end, even if the caller goes away.
    async fn run<T: Send + 'static>(
        self: &Arc<Self>,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, tokio::task::JoinError> {
        let permit = {
            let _waiting = Gauge::enter(&self.waiting);
            // The semaphore is never closed: this always yields a permit.
            self.permits.clone().acquire_owned().await.ok()
        };
        let threads = self.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let running = Gauge::enter(&threads.running);
            threads
                .running_peak
                .fetch_max(running.now, Ordering::Relaxed);
            work()
        })
        .await
    }
}

/// One count in a gauge, taken back when dropped (a cancelled wait or a
/// panicked placement too).
struct Gauge<'a> {
    counter: &'a AtomicUsize,
    /// The gauge's value right after this entered it.
    now: usize,
}

impl<'a> Gauge<'a> {
    fn enter(counter: &'a AtomicUsize) -> Self {
        let now = counter.fetch_add(1, Ordering::Relaxed) + 1;
        Self { counter, now }
    }
}

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.counter.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A running sink's ingest side (what the Flight service calls). Cheap to
/// clone: clones share everything.
#[derive(Clone)]
pub struct Sink {
    placer: Arc<Placer>,
    committer: Committer,
    counts: Arc<state::FileCounts>,
    placing: Arc<PlacementThreads>,
    health: Health,
    feed: feed::FeedHandle,
    subscribers: Arc<subscribe::Subscribers>,
    outbox: Option<Arc<outbox::Outbox>>,
    fleet: Arc<std::sync::OnceLock<FleetDescription>>,
    process: Arc<std::sync::OnceLock<FleetDescription>>,
}

impl Sink {
    /// Opens the root and the manifest and starts the committer. Must run inside a tokio runtime.
    pub fn open(config: &SinkConfig) -> anyhow::Result<Self> {
        let root = Root::open(&config.root)
            .with_context(|| format!("cannot open the sink root {}", config.root.display()))?;
        let health = Health::default();
        let (feed, feed_handle) = feed::CommitFeed::new(feed::FEED_CAPACITY);
        let flusher = flush::Flusher::new(&root, config.sync, health.clone())
            .with_context(|| format!("cannot inspect the sink root {}", config.root.display()))?;
        let direct_min = config
            .direct_min
            .unwrap_or_else(|| direct::default_min(root.dir()));
        tracing::info!(
            direct_min,
            "ranges with at least this many aligned bytes in the middle write them with O_DIRECT (0: none)"
        );
        let manifest = SinkManifest::open(&config.state_dir)?;
        root_mark::check(&config.root, &manifest)?;
        let gate = state::new_commit_gate();
        let journal_backlog = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let placer = Placer::new(
            root,
            manifest.clone(),
            config.layout,
            config.superseded,
            config.max_open_files,
            place::Shared {
                commit_gate: gate.clone(),
                journal: place::Journal {
                    max_range: config.journal_max_range,
                    backlog: journal_backlog.clone(),
                },
                health: health.clone(),
            },
        )
        .with_direct_writes(direct_min)
        .with_seal_read_back(config.seal_read_back)
        .with_hold_limit(config.hold_limit);
        let journal_path = config.state_dir.join(journal::JOURNAL_FILE_NAME);
        let replayed = placer.replay_journal(&journal_path)?;
        if replayed > 0 {
            tracing::info!(
                bytes = replayed,
                "wrote journaled ranges back into their files"
            );
        }
        // After the replay, which may redo lost rounds (their events with
        // them) or correct the events of a round cut short.
        let outbox = match &config.events {
            Some(events) => Some(Arc::new(
                outbox::Outbox::open(manifest.clone(), events)
                    .context("opening the event outbox")?,
            )),
            None => None,
        };
        let counts = Arc::new(
            state::FileCounts::from_manifest(&manifest)
                .context("counting the manifest's file records")?,
        );
        // Opened after the replay, which leaves no entry pointing into it:
        // its rounds start over at the beginning.
        let journal = match config.journal_max_range {
            0 => None,
            _ => Some(
                journal::JournalFile::open(
                    &journal_path,
                    journal::JOURNAL_FILE_BYTES,
                    manifest.journal_state()?.epoch,
                )
                .with_context(|| {
                    format!("cannot open the journal file {}", journal_path.display())
                })?,
            ),
        };
        let committer = Committer::start(commit::CommitterParts {
            manifest,
            gate,
            journal: commit::CommitJournal {
                file: journal,
                backlog_bytes: journal_backlog,
                flush_at_files: config.max_open_files,
            },
            counts: counts.clone(),
            flusher,
            health: health.clone(),
            feed,
            outbox: outbox.clone(),
        });
        placer.attach_committer(committer.clone());
        Ok(Self {
            placer: Arc::new(placer),
            committer,
            counts,
            placing: PlacementThreads::new(config.placement_threads),
            health,
            feed: feed_handle,
            subscribers: Arc::new(subscribe::Subscribers::new(config.max_open_files)),
            outbox,
            fleet: Arc::default(),
            process: Arc::default(),
        })
    }

    /// The event outbox, when the sink records events.
    pub fn outbox(&self) -> Option<&Arc<outbox::Outbox>> {
        self.outbox.as_ref()
    }

    /// The commit feed: every durable commit, for in-process listeners.
    pub fn feed(&self) -> &feed::FeedHandle {
        &self.feed
    }

    /// Every file generation the manifest holds, and the last commit round
    /// that includes: read under the commit gate, so a listener that
    /// subscribed before this call skips the feed's rounds up to that one
    /// and misses none after it. Blocking: call it off the async workers
    /// (or before serving).
    pub fn durable_files(&self) -> Result<feed::DurableSnapshot, SinkError> {
        let _gate = self.placer.commit_gate();
        self.health.check()?;
        let files =
            self.placer.manifest.all_files().map_err(|e| {
                SinkError::Storage(format!("reading the manifest's file records: {e}"))
            })?;
        Ok(feed::DurableSnapshot {
            sequence: self.feed.sequence(),
            files: files
                .into_iter()
                .map(|(id, record)| DurableFile::of(id, record))
                .collect(),
        })
    }

    /// Starts a live-tail subscription: the stream of its Flight messages.
    pub(crate) async fn subscribe(
        &self,
        ticket: flight_server::subscription::Ticket,
        peer: String,
    ) -> Result<futures::stream::BoxStream<'static, subscribe::Sent>, SinkError> {
        self.subscribers
            .open(
                self.clone(),
                &self.placer.root,
                self.placer.layout,
                &self.feed,
                ticket,
                peer,
            )
            .await
    }

    /// The files a ListFlights criteria names (see [`subscribe::list_files`]).
    /// Blocking.
    pub(crate) fn list_files(
        &self,
        criteria: &str,
    ) -> Result<Vec<arrow_flight::FlightInfo>, SinkError> {
        let criteria = subscribe::Criteria::parse(criteria)?;
        let snapshot = self.durable_files()?;
        subscribe::list_files(&snapshot.files, self.placer.layout, &criteria)
    }

    /// Makes `status` include `describe()`'s account of the process's place
    /// in a fleet. The first description given stays.
    pub fn describe_fleet(&self, describe: impl Fn() -> serde_json::Value + Send + Sync + 'static) {
        let _ = self.fleet.set(Box::new(describe));
    }

    /// Makes `status` include `describe()`'s figures of the process (the
    /// sink library cannot count the program's heap). The first stays.
    pub fn describe_process(
        &self,
        describe: impl Fn() -> serde_json::Value + Send + Sync + 'static,
    ) {
        let _ = self.process.set(Box::new(describe));
    }

    /// The sink's health, shared by everything in it.
    pub fn health(&self) -> &Health {
        &self.health
    }

    /// Finishes the commit rounds of what is queued and joins the
    /// committer and its threads. Batches still being placed are not
    /// acknowledged; their senders send them again.
    pub async fn shutdown(&self) {
        self.committer.stop().await;
    }

    /// The counters and state the `status` action answers with.
    pub fn status(&self) -> Result<SinkStatus, SinkError> {
        let counters = self
            .placer
            .manifest
            .counters()
            .map_err(|e| SinkError::Storage(format!("reading the manifest's counters: {e}")))?;
        let count = |n: &std::sync::atomic::AtomicU64| n.load(std::sync::atomic::Ordering::Relaxed);
        let direct = self.placer.direct_figures();
        Ok(SinkStatus {
            placed_bytes: counters.placed_bytes,
            duplicate_bytes: counters.duplicate_bytes,
            rewritten_bytes: counters.rewritten_bytes,
            files: count(&self.counts.files),
            sealed_files: count(&self.counts.sealed),
            journal_backlog_bytes: count(&self.placer.journal.backlog),
            placement_threads: self.placing.limit,
            placements_running: self.placing.running.load(Ordering::Relaxed),
            placements_running_peak: self.placing.running_peak.load(Ordering::Relaxed),
            placements_waiting: self.placing.waiting.load(Ordering::Relaxed),
            held_bytes: self.placer.held_bytes(),
            manifest_memory_bytes: self.placer.manifest.memory_bytes(),
            direct_written_bytes: direct.written_bytes,
            direct_staged_bytes: direct.staged_bytes,
            subscriptions: self.subscribers.status(),
            poisoned: self.health.reason().map(|reason| reason.to_string()),
            events: self.outbox.as_ref().map(|outbox| outbox.status()),
            fleet: self.fleet.get().map(|describe| describe()),
            process: self.process.get().map(|describe| describe()),
        })
    }

    /// Blocks on the commit gate and scans the manifest: call it off the
    /// async workers.
    fn watermarks(&self, source: &str) -> Result<Vec<FileWatermark>, SinkError> {
        let records = {
            let _gate = self.placer.commit_gate();
            // A round that failed after changing records poisoned the health
            // before it let go: those records may name ranges to be withdrawn.
            self.health.check()?;
            self.placer.manifest.files_of_source(source).map_err(|e| {
                SinkError::Storage(format!("reading the records of source {source:?}: {e}"))
            })?
        };
        let prefix = match self.placer.layout {
            Layout::PerSource => format!("{source}/"),
            Layout::Flat => String::new(),
        };
        Ok(records
            .into_iter()
            .filter_map(|(id, record)| {
                let contiguous_end = record.placed.contiguous_end();
                let head_len = contiguous_end.min(HEAD_LEN);
                // A head that cannot be read proves nothing: the watcher is
                // not told of the file and sends it again, which the
                // manifest recognises byte for byte.
                let head_crc32c =
                    match place::head_crc(&self.placer.root, &record.dest_path, head_len) {
                        Ok(crc) => crc,
                        Err(error) => {
                            tracing::warn!(file = %record.dest_path, %error, "cannot read the head of a recorded file; leaving it out of the watermarks");
                            return None;
                        }
                    };
                Some(FileWatermark {
                    head_crc32c,
                    head_len,
                    key: id.key,
                    generation: id.generation,
                    path: record
                        .dest_path
                        .strip_prefix(&prefix)
                        .unwrap_or(&record.dest_path)
                        .to_owned(),
                    contiguous_end,
                    placed_bytes: record.placed.total_len(),
                    sealed_size: record.sealed.map(|s| s.size),
                    superseded: record.superseded,
                })
            })
            .collect())
    }

    /// Places one batch and waits until everything its ack reports is
    /// durable (see [`Self::place_batch`]).
    #[cfg(test)]
    async fn ingest_batch(
        &self,
        source: Arc<str>,
        seq: u64,
        batch: RangeBatch,
    ) -> Result<Ack, SinkError> {
        self.place_batch(source, seq, batch).await?.await
    }

    /// Places one batch and returns the wait until everything its ack
    /// reports is durable; the batch is dropped once placed. A panic while
    /// placing it poisons the sink: the slots it held may be half updated,
    /// and nothing may be acknowledged from them.
    async fn place_batch(
        &self,
        source: Arc<str>,
        seq: u64,
        batch: RangeBatch,
    ) -> Result<impl Future<Output = Result<Ack, SinkError>> + Send + 'static, SinkError> {
        self.health.check()?;
        if let Some(outbox) = &self.outbox {
            outbox.check_room()?;
        }
        let placer = self.placer.clone();
        let committer = self.committer.clone();
        let health = self.health.clone();
        // Placing and submitting run on a blocking thread, which runs to the
        // end even if the stream goes away mid-batch (a blocking task cannot
        // be cancelled once started): the batch still reaches its commit
        // instead of leaving written-but-unrecorded ranges others wait on.
        let received = std::time::SystemTime::now();
        let placed = self
            .placing
            .run(move || {
                let _guard = health.guard_thread();
                place_and_submit(&placer, &committer, &source, seq, &batch, received)
            })
            .await
            .map_err(|e| match e.try_into_panic() {
                Ok(panic) => {
                    let reason = format!(
                        "placing batch {seq} panicked: {}",
                        error::panic_message(panic.as_ref())
                    );
                    self.health.poison(reason.clone());
                    SinkError::Internal(reason)
                }
                Err(_) => SinkError::Shutdown,
            })?;
        let (answer, ack) = placed?;
        let health = self.health.clone();
        Ok(async move {
            answer
                .durable()
                .await
                .map_err(|error| match health.reason() {
                    Some(poisoned) => SinkError::Poisoned(poisoned),
                    None => error,
                })?;
            Ok(ack)
        })
    }
}

impl subscribe::DurableFiles for Sink {
    fn knows_source(&self, source: &str) -> Result<bool, SinkError> {
        let files = self.placer.manifest.files_of_source(source).map_err(|e| {
            SinkError::storage(format_args!("reading the files of source {source:?}"), e)
        })?;
        Ok(!files.is_empty())
    }

    fn durable_files(&self) -> Result<feed::DurableSnapshot, SinkError> {
        Sink::durable_files(self)
    }
}

/// Bytes at the head of a file compared during reconciliation.
pub const HEAD_LEN: u64 = 4096;

/// Places a batch and hands its commit to the committer, then writes the
/// small ranges it left for after (see `place::beside`): its ranges are
/// in their files once this returns. Blocking.
fn place_and_submit(
    placer: &Placer,
    committer: &Committer,
    source: &str,
    seq: u64,
    batch: &RangeBatch,
    received: std::time::SystemTime,
) -> Result<(CommitAnswer, Ack), SinkError> {
    let started = std::time::Instant::now();
    let source_state = placer.source(source)?;
    let placing = stage_cpu::StageTimer::start(stage_cpu::Stage::Place);
    let place::Placed {
        mut request,
        ack,
        writes,
    } = placer.place_beside(&source_state, seq, batch)?;
    drop(placing);
    request.place_us = started.elapsed().as_micros() as u64;
    request.received = Some(received);
    request.placing_us = received.elapsed().map_or(0, |d| d.as_micros() as u64);
    #[cfg(test)]
    fault::hit(fault::Point::AfterPlacement, source);
    let answer = committer.submit(request);
    // Made even when the submission failed: the files' marks must go.
    writes.finish();
    Ok((answer?, ack))
}

/// Runs a sink until `shutdown` resolves.
pub async fn run(
    config: SinkConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let sink = Arc::new(Sink::open(&config)?);
    serve(sink, &config, shutdown).await
}

/// Serves an opened sink until `shutdown` resolves, then drains its commit
/// rounds and joins its tasks (listeners of its feed attach in between).
pub async fn serve(
    sink: Arc<Sink>,
    config: &SinkConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_and_tell(sink, config, shutdown, || {}).await
}

/// [`serve`], calling `listening` once the sink listens. Whatever ends
/// the serving (a failed bind included), the committer is drained and
/// joined, so that the feed closes and its listeners end.
pub async fn serve_and_tell(
    sink: Arc<Sink>,
    config: &SinkConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    listening: impl FnOnce(),
) -> anyhow::Result<()> {
    let served = async {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.listen))?;
        tracing::info!(listen = %listener.local_addr()?, root = %config.root.display(), tls = config.tls.is_some(), "sink serving");
        listening();
        let server = ServerConfig {
            listen: config.listen,
            tls: config.tls.clone(),
            max_message_bytes: config.max_message_bytes,
            stream_window_bytes: config.window_bytes,
            connection_window_bytes: config.window_bytes,
            read_access: config.read_access.clone(),
            federation: config.federation.clone(),
            ..ServerConfig::default()
        };
        flight_server::serve(sink.clone(), server, listener, shutdown)
            .await
            .map_err(|e| anyhow::anyhow!("sink server on {} failed: {e}", config.listen))
    }
    .await;
    sink.shutdown().await;
    if let Some(reason) = sink.health.reason() {
        tracing::warn!(%reason, "the sink stopped poisoned; its next start recovers from the manifest");
    }
    served
}

#[cfg(test)]
mod tests;
