//! The sink: receives byte ranges over Flight, places each at its offset in
//! its destination file under the root, makes it durable, records it in the
//! manifest, and only then acknowledges.
//!
//! - `config`: what the sink is told to do (root, layout, policies, limits);
//! - [`confine`]: keeps destination paths under the root;
//! - [`error`]: what can go wrong, by whose fault;
//! - [`health`]: whether the sink can still be trusted with work;
//! - [`feed`]: the commit feed, what became durable, for listeners;
//! - `service`: the Flight-facing side (the only place gRPC codes appear);
//! - `state`: what placement and the committer share (slots, commit requests);
//! - `place`: writes ranges and applies control rows, exactly once;
//! - `commit`: group commit (fdatasync, then one synced manifest write);
//! - `durability`: how bytes become durable: `flush` (syncfs or fdatasync
//!   each), `journal` (where small ranges become durable first) and
//!   `direct` (the aligned middle of large ranges, past the page cache);

mod commit;
mod config;
pub mod confine;
mod durability;
pub mod error;
pub mod feed;
pub mod health;
mod place;
mod service;
mod stage_cpu;
mod state;
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
/// could. Armed per source name, so tests running at once in one process
/// only hit their own.
#[cfg(test)]
pub(crate) mod fault {
    use std::sync::Mutex;

    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    pub enum Point {
        /// In a placement thread, after the batch was placed and before its
        /// commit request was submitted.
        AfterPlacement,
        /// In the committer's task, outside the parts that catch panics.
        CommitterLoop,
        /// In a placement thread making a rename, once the intent is in
        /// memory and before it is recorded (the gate was held here once).
        MoveIntent,
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

pub use crate::config::{Layout, SinkConfig, SupersededPolicy};
pub use crate::durability::flush::SyncStrategy;
use crate::durability::{direct, flush, journal};
pub use crate::error::SinkError;
pub use crate::feed::{
    CommitRound, DurableFile, DurableSnapshot, FeedHandle, FileChange, FileCommit,
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
    pub poisoned: Option<String>,
}

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
        let gate = state::CommitGate::default();
        let journal_backlog = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let placer = Placer::new(
            root,
            manifest.clone(),
            config.layout,
            config.superseded,
            config.max_open_files,
            gate.clone(),
            place::Journal {
                max_range: config.journal_max_range,
                backlog: journal_backlog.clone(),
            },
        )
        .with_direct_writes(direct_min)
        .with_seal_read_back(config.seal_read_back)
        .with_hold_limit(config.hold_limit)
        .with_health(health.clone());
        let journal_path = config.state_dir.join(journal::JOURNAL_FILE_NAME);
        let replayed = placer.replay_journal(&journal_path)?;
        if replayed > 0 {
            tracing::info!(
                bytes = replayed,
                "wrote journaled ranges back into their files"
            );
        }
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
        });
        placer.attach_committer(committer.clone());
        Ok(Self {
            placer: Arc::new(placer),
            committer,
            counts,
            placing: PlacementThreads::new(config.placement_threads),
            health,
            feed: feed_handle,
        })
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

    fn status(&self) -> Result<SinkStatus, SinkError> {
        let counters = self
            .placer
            .manifest
            .counters()
            .map_err(|e| SinkError::Storage(format!("reading the manifest's counters: {e}")))?;
        let count = |n: &std::sync::atomic::AtomicU64| n.load(std::sync::atomic::Ordering::Relaxed);
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
            poisoned: self.health.reason().map(|reason| reason.to_string()),
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
    /// durable. A panic while placing it poisons the sink: the slots it
    /// held may be half updated, and nothing may be acknowledged from them.
    async fn ingest_batch(
        &self,
        source: Arc<str>,
        seq: u64,
        batch: RangeBatch,
    ) -> Result<Ack, SinkError> {
        self.health.check()?;
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
        answer
            .durable()
            .await
            .map_err(|reason| match self.health.reason() {
                Some(poisoned) => SinkError::Poisoned(poisoned),
                None => SinkError::Storage(reason),
            })?;
        Ok(ack)
    }
}

/// Bytes at the head of a file compared during reconciliation.
pub const HEAD_LEN: u64 = 4096;

/// Places a batch (its ranges are in their files once this returns) and
/// hands its commit to the committer. Blocking.
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
    let (mut request, ack) = placer.place(&source_state, seq, batch)?;
    drop(placing);
    request.place_us = started.elapsed().as_micros() as u64;
    request.received = Some(received);
    request.placing_us = received.elapsed().map_or(0, |d| d.as_micros() as u64);
    #[cfg(test)]
    fault::hit(fault::Point::AfterPlacement, source);
    let answer = committer.submit(request)?;
    Ok((answer, ack))
}

/// Runs a sink until `shutdown` resolves.
pub async fn run(
    config: SinkConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let sink = Sink::open(&config)?;
    serve(sink, &config, shutdown).await
}

/// Serves an opened sink until `shutdown` resolves, then drains its commit
/// rounds and joins its tasks (listeners of its feed attach in between).
pub async fn serve(
    sink: Sink,
    config: &SinkConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let sink = Arc::new(sink);
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    tracing::info!(listen = %listener.local_addr()?, root = %config.root.display(), tls = config.tls.is_some(), "sink serving");
    let server = ServerConfig {
        listen: config.listen,
        tls: config.tls.clone(),
        max_message_bytes: config.max_message_bytes,
        stream_window_bytes: config.window_bytes,
        connection_window_bytes: config.window_bytes,
        ..ServerConfig::default()
    };
    let served = flight_server::serve(sink.clone(), server, listener, shutdown)
        .await
        .map_err(|e| anyhow::anyhow!("sink server on {} failed: {e}", config.listen));
    sink.shutdown().await;
    if let Some(reason) = sink.health.reason() {
        tracing::warn!(%reason, "the sink stopped poisoned; its next start recovers from the manifest");
    }
    served
}

/// What `tailflight audit` reports about a manifest.
#[derive(Debug, Serialize)]
pub struct AuditReport {
    pub placed_bytes: u64,
    pub duplicate_bytes: u64,
    pub rewritten_bytes: u64,
    pub files: u64,
    pub sealed_files: u64,
    pub placements: u64,
    /// Placements that overlap an earlier one of the same file: must be 0.
    pub overlapping_placements: u64,
    /// Files whose record disagrees with their audit log: must be 0.
    pub record_mismatches: u64,
    /// Journal rounds whose manifest writes a machine crash had lost, redone
    /// before the audit (as the sink's next start would have).
    pub redone_journal_rounds: usize,
    pub examples: Vec<String>,
    /// Every file record, with `--files`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub records: Vec<(manifest_db::FileId, manifest_db::FileRecord)>,
}

/// Reads a manifest (of a stopped sink) and checks that no byte range was
/// ever recorded twice, and that each file's record matches its audit log.
/// Manifest writes a machine crash lost are redone from the journal first,
/// as the sink's start does: those ranges were acknowledged, and an audit
/// without them would report a manifest the sink never serves.
pub fn audit(state_dir: &std::path::Path, with_records: bool) -> anyhow::Result<AuditReport> {
    let manifest = SinkManifest::open(state_dir)?;
    let redone_journal_rounds =
        journal::redo_lost_rounds(&manifest, &state_dir.join(journal::JOURNAL_FILE_NAME))
            .map_err(|e| anyhow::anyhow!("redoing lost manifest writes from the journal: {e}"))?;
    let counters = manifest.counters()?;
    let files = manifest.all_files()?;
    let mut report = AuditReport {
        placed_bytes: counters.placed_bytes,
        duplicate_bytes: counters.duplicate_bytes,
        rewritten_bytes: counters.rewritten_bytes,
        files: files.len() as u64,
        sealed_files: files.iter().filter(|(_, r)| r.sealed.is_some()).count() as u64,
        placements: 0,
        overlapping_placements: 0,
        record_mismatches: 0,
        redone_journal_rounds,
        examples: Vec::new(),
        records: Vec::new(),
    };
    for (id, record) in &files {
        let placements = manifest.placements(id)?;
        report.placements += placements.len() as u64;
        let mut covered = manifest_db::IntervalSet::new();
        for &(offset, len) in &placements {
            if covered.missing(offset, offset + len) != vec![(offset, offset + len)] {
                report.overlapping_placements += 1;
                if report.examples.len() < 10 {
                    report.examples.push(format!(
                        "{}/{} gen {}: {offset}+{len} recorded twice",
                        id.source, id.key, id.generation
                    ));
                }
            }
            covered.insert(offset, offset + len);
        }
        if covered != record.placed {
            report.examples.push(format!(
                "{}/{} gen {}: record says {:?}, audit log says {:?}",
                id.source,
                id.key,
                id.generation,
                record.placed.ranges(),
                covered.ranges()
            ));
            report.record_mismatches += 1;
        }
    }
    if with_records {
        report.records = files;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flight_server::BatchBuilder;

    /// Many batches arriving at once are all placed and acknowledged, never
    /// more of them at once than the placement threads allow.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn placements_beyond_the_thread_limit_wait_their_turn() {
        let dir = test_support::scratch("placement-threads");
        std::fs::create_dir_all(dir.join("root")).unwrap();
        let sink = Sink::open(&SinkConfig {
            root: dir.join("root"),
            state_dir: dir.join("state"),
            placement_threads: Some(2),
            ..SinkConfig::default()
        })
        .unwrap();
        let content =
            |file: u64| -> Vec<u8> { (0..256 << 10).map(|i: u64| (i * 31 + file) as u8).collect() };
        let placing: Vec<_> = (1..=24u64)
            .map(|file| {
                let sink = sink.clone();
                let mut builder = BatchBuilder::with_capacity(1, 256 << 10);
                builder.push_data(&format!("f{file}.dat"), 1, 0, &content(file));
                let batch = RangeBatch::validate(builder.finish()).unwrap();
                tokio::spawn(async move { sink.ingest_batch(Arc::from("s"), file, batch).await })
            })
            .collect();
        for (file, placed) in (1..=24u64).zip(placing) {
            let ack = placed.await.unwrap().unwrap();
            assert_eq!(ack.seq, file);
        }
        for file in 1..=24u64 {
            let written = std::fs::read(dir.join(format!("root/s/f{file}.dat"))).unwrap();
            assert!(
                written == content(file),
                "file {file} differs from what was sent"
            );
        }
        let status = sink.status().unwrap();
        assert_eq!(status.placement_threads, 2);
        assert!(
            (1..=2).contains(&status.placements_running_peak),
            "{} placements ran at once",
            status.placements_running_peak
        );
        assert_eq!(status.placements_running, 0);
        assert_eq!(status.placements_waiting, 0);
        drop(sink);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn open_sink(dir: &std::path::Path) -> Sink {
        std::fs::create_dir_all(dir.join("root")).unwrap();
        Sink::open(&SinkConfig {
            root: dir.join("root"),
            state_dir: dir.join("state"),
            ..SinkConfig::default()
        })
        .unwrap()
    }

    fn data_batch(key: &str, offset: u64, bytes: &[u8]) -> RangeBatch {
        let mut builder = BatchBuilder::with_capacity(1, bytes.len());
        builder.push_data(key, 1, offset, bytes);
        RangeBatch::validate(builder.finish()).unwrap()
    }

    /// Waits (bounded) until the sink reports itself poisoned.
    async fn poisoned_reason(sink: &Sink) -> String {
        tokio::time::timeout(std::time::Duration::from_secs(30), sink.health().poisoned())
            .await
            .expect("the sink never reported the failure")
            .to_string()
    }

    /// A panic while placing is the sink's bug: reported as internal (never
    /// as the peer's bad input), it poisons the sink (its slots may be half
    /// updated), and a re-sent batch leaning on the ranges the panicked one
    /// had claimed gets an answer instead of waiting for them forever.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panic_while_placing_poisons_the_sink_and_strands_no_batch() {
        let dir = test_support::scratch("placement-panic");
        let sink = open_sink(&dir);
        fault::arm(fault::Point::AfterPlacement, "panicky");
        let bytes = vec![42u8; 4096];
        let first = sink
            .ingest_batch(Arc::from("panicky"), 1, data_batch("f", 0, &bytes))
            .await;
        assert!(
            matches!(first, Err(SinkError::Internal(_))),
            "a panic must be an internal error: {first:?}"
        );
        assert!(poisoned_reason(&sink).await.contains("panicked"));
        assert!(sink.status().unwrap().poisoned.is_some());
        let again = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            sink.ingest_batch(Arc::from("panicky"), 2, data_batch("f", 0, &bytes)),
        )
        .await
        .expect("the re-sent batch waited forever for ranges a panicked batch had claimed");
        assert!(
            matches!(again, Err(SinkError::Poisoned(_))),
            "a poisoned sink refuses work until restarted: {again:?}"
        );
        sink.shutdown().await;
        drop(sink);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A committer task that dies poisons the sink, visibly in `status`,
    /// instead of leaving it healthy while nothing commits; shutdown still
    /// joins everything.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_committer_poisons_the_sink() {
        let dir = test_support::scratch("committer-dies");
        let sink = open_sink(&dir);
        fault::arm(fault::Point::CommitterLoop, "doomed");
        let first = sink
            .ingest_batch(Arc::from("doomed"), 1, data_batch("f", 0, b"0123456789"))
            .await;
        assert!(first.is_err(), "nothing may be acknowledged: {first:?}");
        let reason = poisoned_reason(&sink).await;
        assert!(reason.contains("committer"), "{reason}");
        assert_eq!(
            sink.status().unwrap().poisoned.as_deref(),
            Some(reason.as_str())
        );
        let later = sink
            .ingest_batch(Arc::from("other"), 1, data_batch("g", 0, b"abc"))
            .await;
        assert!(matches!(later, Err(SinkError::Poisoned(_))), "{later:?}");
        sink.shutdown().await;
        drop(sink);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Shutdown finishes the rounds of what was queued: every batch
    /// acknowledged before it is in the manifest after a restart.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_drains_and_joins_the_committer() {
        let dir = test_support::scratch("shutdown-drains");
        let sink = open_sink(&dir);
        for seq in 0..8u64 {
            let ack = sink
                .ingest_batch(
                    Arc::from("s"),
                    seq,
                    data_batch("f", seq * 10, b"0123456789"),
                )
                .await
                .unwrap();
            assert_eq!(ack.placed, 10);
        }
        sink.shutdown().await;
        let after = sink
            .ingest_batch(Arc::from("s"), 9, data_batch("f", 80, b"0123456789"))
            .await;
        assert!(after.is_err(), "a stopped committer takes no more work");
        drop(sink);
        let report = audit(&dir.join("state"), false).unwrap();
        assert_eq!(report.placed_bytes, 80);
        assert_eq!(report.overlapping_placements, 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A rename waiting for its intent to be recorded holds up no other
    /// source's commits (it once held the commit gate across a synced
    /// manifest write and flushes, which every round needs), and the feed
    /// tells of the rename once, after the file has moved.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rename_waiting_for_its_intent_holds_up_no_other_commit() {
        let dir = test_support::scratch("rename-intent");
        let sink = open_sink(&dir);
        let mut feed = sink.feed().subscribe().unwrap();
        sink.ingest_batch(Arc::from("movers"), 1, data_batch("a", 0, b"moved bytes"))
            .await
            .unwrap();
        let paused = fault::pause(fault::Point::MoveIntent, "movers");
        let mut builder = BatchBuilder::with_capacity(1, 0);
        builder.push_rename("a", 1, "b");
        let rename = RangeBatch::validate(builder.finish()).unwrap();
        let renaming = {
            let sink = sink.clone();
            tokio::spawn(async move { sink.ingest_batch(Arc::from("movers"), 2, rename).await })
        };
        let waiting = tokio::task::spawn_blocking(move || {
            paused.reached();
            paused
        });
        let paused = waiting.await.unwrap();
        let other = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            sink.ingest_batch(Arc::from("others"), 1, data_batch("c", 0, b"not held up")),
        )
        .await
        .expect("a rename on its way to its intent held up another source's commit");
        assert_eq!(other.unwrap().placed, 11);
        tokio::task::spawn_blocking(move || paused.release())
            .await
            .unwrap();
        renaming.await.unwrap().unwrap();
        assert_eq!(
            std::fs::read(dir.join("root/movers/b")).unwrap(),
            b"moved bytes"
        );
        assert!(!dir.join("root/movers/a").exists());
        sink.shutdown().await;
        let mut renames = Vec::new();
        while let Ok(round) = feed.try_recv() {
            for file in &round.files {
                for change in &file.changes {
                    if let FileChange::Renamed { from } = change {
                        renames.push((from.clone(), file.path.clone()));
                    }
                }
            }
        }
        assert_eq!(
            renames,
            [("movers/a".to_string(), "movers/b".to_string())],
            "the feed tells of the rename once, made"
        );
        drop(sink);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The commit feed's listener sees each durable byte exactly once: the
    /// ranges it is told of per file never overlap and add up to what the
    /// manifest holds, whatever order and however often batches arrive, and
    /// each file is opened once, with a watermark that only grows.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_feed_tells_each_durable_range_once() {
        let dir = test_support::scratch("feed-once");
        let sink = open_sink(&dir);
        let mut feed = sink.feed().subscribe().unwrap();
        let content: Vec<u8> = (0..64 * 1024u32).map(|i| (i * 7) as u8).collect();
        // Pieces of two files, overlapping and repeated, out of order.
        let mut pieces = Vec::new();
        for (i, key) in ["a", "b"].iter().enumerate() {
            for start in (0..64u64).rev().step_by(3) {
                let end = (start + 1 + (start + i as u64) % 5).min(64);
                pieces.push((*key, start * 1024, end * 1024));
            }
            pieces.push((*key, 0, 64 * 1024));
        }
        let placing: Vec<_> = pieces
            .iter()
            .enumerate()
            .map(|(seq, &(key, start, end))| {
                let sink = sink.clone();
                let batch = data_batch(key, start, &content[start as usize..end as usize]);
                tokio::spawn(
                    async move { sink.ingest_batch(Arc::from("s"), seq as u64, batch).await },
                )
            })
            .collect();
        for placed in placing {
            placed.await.unwrap().unwrap();
        }
        sink.shutdown().await;
        let mut told: std::collections::HashMap<String, manifest_db::IntervalSet> =
            Default::default();
        let mut opened: std::collections::HashMap<String, usize> = Default::default();
        let mut watermark: std::collections::HashMap<String, u64> = Default::default();
        let mut last_sequence = 0;
        while let Ok(round) = feed.try_recv() {
            assert_eq!(round.sequence, last_sequence + 1, "no round is missed");
            last_sequence = round.sequence;
            for file in &round.files {
                let key = file.id.key.clone();
                let set = told.entry(key.clone()).or_default();
                for &(start, end) in &file.ranges {
                    assert_eq!(
                        set.missing(start, end),
                        vec![(start, end)],
                        "{key}: {start}..{end} told twice"
                    );
                    set.insert(start, end);
                }
                *opened.entry(key.clone()).or_default() += file
                    .changes
                    .iter()
                    .filter(|c| **c == FileChange::Opened)
                    .count();
                let mark = watermark.entry(key.clone()).or_default();
                assert!(
                    file.contiguous_end >= *mark,
                    "{key}: the watermark went back"
                );
                *mark = file.contiguous_end;
                assert_eq!(file.path, format!("s/{key}"));
            }
        }
        for key in ["a", "b"] {
            assert_eq!(
                told[key].ranges(),
                [(0, 64 * 1024)],
                "{key}: every byte told"
            );
            assert_eq!(opened[key], 1, "{key} opened once");
            assert_eq!(watermark[key], 64 * 1024);
        }
        drop(sink);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A recorded file whose head cannot be read is left out of the
    /// watermarks (the watcher sends it again, and the manifest recognises
    /// it), instead of being vouched for with a checksum of 0, a value a
    /// real CRC takes too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn watermarks_leave_out_files_whose_head_cannot_be_read() {
        let dir = test_support::scratch("watermarks-unreadable");
        let sink = open_sink(&dir);
        for key in ["kept", "lost"] {
            sink.ingest_batch(Arc::from("s"), 1, data_batch(key, 0, b"head bytes"))
                .await
                .unwrap();
        }
        std::fs::remove_file(dir.join("root/s/lost")).unwrap();
        let marks = sink.watermarks("s").unwrap();
        let keys: Vec<&str> = marks.iter().map(|m| m.key.as_str()).collect();
        assert_eq!(keys, ["kept"]);
        assert_eq!(
            marks[0].head_crc32c,
            flight_server::checksum::crc32c(b"head bytes")
        );
        sink.shutdown().await;
        drop(sink);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
