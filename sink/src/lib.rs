//! The sink: receives byte ranges over Flight, places each at its offset in
//! its destination file under the root, makes it durable, records it in the
//! manifest, and only then acknowledges.
//!
//! - [`confine`]: keeps destination paths under the root;
//! - `placement`: writes ranges and applies control rows, exactly once;
//! - `commit`: group commit (fdatasync, then one synced manifest write);
//! - `flush`: how a round makes files durable (syncfs or fdatasync each);
//! - `journal`: the journal file, where small ranges become durable first;
//! - `direct`: writes the aligned middle of large ranges past the page cache;
//! - [`verify`]: compares a source tree with a destination tree.

mod commit;
pub mod confine;
mod direct;
mod flush;
mod journal;
mod placement;
mod stage_cpu;
pub mod verify;
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

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context;
use flight_server::protocol::{ACTION_STATUS, ACTION_WATERMARKS, FileWatermark};
use flight_server::service::ServerConfig;
use flight_server::tls::ServerTls;
use flight_server::{Ack, Ingest, RangeBatch};
use manifest_db::SinkManifest;
use serde::{Deserialize, Serialize};
use tonic::Status;

use crate::commit::{CommitAnswer, Committer};
use crate::confine::Root;
use crate::placement::{PlaceError, Placer};

pub use crate::flush::SyncStrategy;

/// Where files of a source land under the root.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Layout {
    /// `<root>/<source>/<relative path>`.
    #[default]
    PerSource,
    /// `<root>/<relative path>`: for a sink that serves one source (the
    /// first it sees, in its manifest or on the wire; others are refused).
    Flat,
}

/// What happens at the destination to a generation that a newer one replaces
/// (the source file was truncated, or deleted and created again).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum SupersededPolicy {
    /// Mirror the source: the old generation's file is removed.
    #[default]
    Mirror,
    /// Keep the old generation beside the new one as `<path>.gen<N>`.
    Keep,
}

#[derive(Clone, Debug)]
pub struct SinkConfig {
    /// Destination root; files land under it and nowhere else.
    pub root: PathBuf,
    /// The manifest's directory (RocksDB).
    pub state_dir: PathBuf,
    pub listen: SocketAddr,
    pub tls: Option<ServerTls>,
    pub layout: Layout,
    pub superseded: SupersededPolicy,
    pub max_message_bytes: usize,
    pub window_bytes: u32,
    pub max_open_files: usize,
    /// Ranges up to this many bytes may go to the journal file (0: none).
    pub journal_max_range: u64,
    /// Ranges whose block-aligned middle holds at least this many bytes
    /// write it with O_DIRECT, past the page cache (0: never; None: 512 KiB
    /// on local disk filesystems, never elsewhere).
    pub direct_min: Option<u64>,
    /// How commit rounds make their files durable.
    pub sync: SyncStrategy,
    /// Seals read each file back from disk to check its digest (otherwise a
    /// CRC-64 seal is checked against the bytes as they were written).
    pub seal_read_back: bool,
    /// Append one line per recorded range with its commit time (benchmarks).
    pub commit_log: Option<PathBuf>,
    /// Batches placed at once, each on a thread of its own (None: four per
    /// core, at least 8 and at most 64).
    pub placement_threads: Option<usize>,
}

impl Default for SinkConfig {
    fn default() -> Self {
        Self {
            root: PathBuf::from("dest"),
            state_dir: PathBuf::from("sink-state"),
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            tls: None,
            layout: Layout::PerSource,
            superseded: SupersededPolicy::Mirror,
            max_message_bytes: 64 << 20,
            window_bytes: 64 << 20,
            max_open_files: 1024,
            journal_max_range: 64 << 10,
            direct_min: None,
            sync: SyncStrategy::Auto,
            seal_read_back: false,
            commit_log: None,
            placement_threads: None,
        }
    }
}

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
    counts: Arc<placement::FileCounts>,
    placing: Arc<PlacementThreads>,
}

impl Sink {
    /// Opens the root and the manifest and starts the committer. Must run inside a tokio runtime.
    pub fn open(config: &SinkConfig) -> anyhow::Result<Self> {
        let root = Root::open(&config.root)
            .with_context(|| format!("cannot open the sink root {}", config.root.display()))?;
        let flusher = flush::Flusher::new(&root, config.sync)
            .with_context(|| format!("cannot inspect the sink root {}", config.root.display()))?;
        let direct_min = config
            .direct_min
            .unwrap_or_else(|| direct::default_min(root.dir()));
        tracing::info!(
            direct_min,
            "ranges with at least this many aligned bytes in the middle write them with O_DIRECT (0: none)"
        );
        let manifest = SinkManifest::open(&config.state_dir)?;
        let commit_log = match &config.commit_log {
            Some(path) => Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .with_context(|| format!("cannot open the commit log {}", path.display()))?,
            ),
            None => None,
        };
        let gate = commit::CommitGate::default();
        let journal_backlog = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let placer = Placer::new(
            root,
            manifest.clone(),
            config.layout,
            config.superseded,
            config.max_open_files,
            gate.clone(),
            placement::Journal {
                max_range: config.journal_max_range,
                backlog: journal_backlog.clone(),
            },
        )
        .with_direct_writes(direct_min)
        .with_seal_read_back(config.seal_read_back)
        .with_flush_failures(flusher.failures());
        let journal_path = config.state_dir.join(journal::JOURNAL_FILE_NAME);
        let replayed = placer.replay_journal(&journal_path)?;
        if replayed > 0 {
            tracing::info!(
                bytes = replayed,
                "wrote journaled ranges back into their files"
            );
        }
        let counts = Arc::new(
            placement::FileCounts::from_manifest(&manifest)
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
        let committer = Committer::start(
            manifest,
            commit_log,
            gate,
            commit::CommitJournal {
                file: journal,
                backlog_bytes: journal_backlog,
                flush_at_files: config.max_open_files,
            },
            counts.clone(),
            flusher,
        );
        Ok(Self {
            placer: Arc::new(placer),
            committer,
            counts,
            placing: PlacementThreads::new(config.placement_threads),
        })
    }

    fn status(&self) -> Result<SinkStatus, Status> {
        let counters = self
            .placer
            .manifest
            .counters()
            .map_err(|e| Status::internal(e.to_string()))?;
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
            poisoned: self.committer.poisoned(),
        })
    }

    /// Blocks on the commit gate and scans the manifest: call it off the
    /// async workers.
    fn watermarks(&self, source: &str) -> Result<Vec<FileWatermark>, Status> {
        let records = {
            let gate = self.placer.commit_gate();
            // A round that failed after changing records said so in the gate
            // before it let go: those records may name ranges to be withdrawn.
            if let Some(reason) = gate.clone().or_else(|| self.committer.poisoned()) {
                return Err(Status::unavailable(format!(
                    "sink storage failed earlier, restart it: {reason}"
                )));
            }
            self.placer
                .manifest
                .files_of_source(source)
                .map_err(|e| Status::internal(e.to_string()))?
        };
        let prefix = match self.placer.layout {
            Layout::PerSource => format!("{source}/"),
            Layout::Flat => String::new(),
        };
        Ok(records
            .into_iter()
            .map(|(id, record)| {
                let contiguous_end = record.placed.contiguous_end();
                let head_len = contiguous_end.min(HEAD_LEN);
                FileWatermark {
                    head_crc32c: placement::head_crc(
                        &self.placer.root,
                        &record.dest_path,
                        head_len,
                    ),
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
                }
            })
            .collect())
    }
}

/// Bytes at the head of a file compared during reconciliation.
pub const HEAD_LEN: u64 = 4096;

impl Ingest for Sink {
    fn accept_source(&self, source: &str) -> Result<(), Status> {
        match confine::components(source) {
            Ok(parts) if parts.len() == 1 => Ok(()),
            _ => Err(Status::invalid_argument(format!(
                "source name {source:?} must be one plain path component (letters, digits, '-', '_', '.')"
            ))),
        }
    }

    async fn ingest(&self, source: Arc<str>, seq: u64, batch: RangeBatch) -> Result<Ack, Status> {
        if let Some(reason) = self.committer.poisoned() {
            return Err(Status::unavailable(format!(
                "sink storage failed earlier, restart it: {reason}"
            )));
        }
        let placer = self.placer.clone();
        let committer = self.committer.clone();
        // Placing and submitting run on a blocking thread, which runs to the
        // end even if the stream goes away mid-batch (a blocking task cannot
        // be cancelled once started): the batch still reaches its commit
        // instead of leaving written-but-unrecorded ranges others wait on.
        let received = std::time::SystemTime::now();
        let placed = self
            .placing
            .run(move || place_and_submit(&placer, &committer, &source, seq, &batch, received))
            .await
            .map_err(|e| match e.is_panic() {
                true => Status::internal(format!("placing batch {seq} panicked: {e}")),
                false => {
                    Status::unavailable(format!("placing batch {seq}: the sink is shutting down"))
                }
            })?;
        let (answer, ack) = placed.map_err(|e| match e {
            PlaceError::Peer(detail) => Status::invalid_argument(detail),
            PlaceError::Storage(detail) => Status::unavailable(format!("sink storage: {detail}")),
        })?;
        answer.durable().await.map_err(Status::unavailable)?;
        Ok(ack)
    }

    async fn action(&self, name: &str, body: &[u8]) -> Result<Vec<u8>, Status> {
        let json =
            |value: serde_json::Result<Vec<u8>>| value.map_err(|e| Status::internal(e.to_string()));
        match name {
            ACTION_STATUS => json(serde_json::to_vec(&self.status()?)),
            ACTION_WATERMARKS => {
                #[derive(Deserialize)]
                struct Request {
                    source: String,
                }
                let request: Request = serde_json::from_slice(body).map_err(|e| {
                    Status::invalid_argument(format!("watermarks wants {{\"source\": NAME}}: {e}"))
                })?;
                let sink = self.clone();
                // On a placement thread: these too may wait for the commit
                // gate, and peers could ask for many at once.
                let marks = self
                    .placing
                    .run(move || sink.watermarks(&request.source))
                    .await
                    .map_err(|e| Status::internal(format!("reading watermarks: {e}")))??;
                json(serde_json::to_vec(&marks))
            }
            other => Err(Status::invalid_argument(format!(
                "unknown action {other:?} (known: {ACTION_STATUS}, {ACTION_WATERMARKS})"
            ))),
        }
    }
}

/// Places a batch, hands its commit to the committer, then does its
/// deferred writes (the round waits for them). Blocking.
fn place_and_submit(
    placer: &Placer,
    committer: &Committer,
    source: &str,
    seq: u64,
    batch: &RangeBatch,
    received: std::time::SystemTime,
) -> Result<(CommitAnswer, Ack), PlaceError> {
    let started = std::time::Instant::now();
    let source_state = placer.source(source)?;
    let placing = stage_cpu::StageTimer::start(stage_cpu::Stage::Place);
    let (mut request, ack, deferred) = placer.place(&source_state, seq, batch)?;
    drop(placing);
    request.place_us = started.elapsed().as_micros() as u64;
    request.received = Some(received);
    request.placing_us = received.elapsed().map_or(0, |d| d.as_micros() as u64);
    let written = (!deferred.is_empty()).then(|| {
        let (done, written) = tokio::sync::oneshot::channel();
        request.written = Some(written);
        done
    });
    let answer = committer.submit(request).map_err(PlaceError::Storage)?;
    if let Some(done) = written {
        // The round waits for this, and a failure stops the sink: the
        // ranges are recorded, and only the replay of the journal at the
        // next start puts them in their files.
        let writing = stage_cpu::StageTimer::start(stage_cpu::Stage::FileWrite);
        let outcome = deferred.write(batch).map_err(|e| {
            format!("batch {seq} of source '{source}', writing its journaled ranges into their files: {e}")
        });
        drop(writing);
        if let Err(Err(error)) = done.send(outcome) {
            // The round failed before it waited for them.
            tracing::error!(%error, "a deferred write failed after its commit round had failed");
        }
    }
    Ok((answer, ack))
}

/// Runs a sink until `shutdown` resolves.
pub async fn run(
    config: SinkConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let sink = Arc::new(Sink::open(&config)?);
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
    flight_server::serve(sink, server, listener, shutdown)
        .await
        .map_err(|e| anyhow::anyhow!("sink server on {} failed: {e}", config.listen))
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
                tokio::spawn(async move { sink.ingest(Arc::from("s"), file, batch).await })
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
}
