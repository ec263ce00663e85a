//! Group commit: makes placed ranges durable, then records them, then lets
//! their acks go.
//!
//! One task drains every request queued since its last round, fdatasyncs the
//! files they touched and fsyncs the directories whose entries changed, then
//! writes all their records in one synced RocksDB WriteBatch. Only after that
//! does any of them get its answer. A request that leaned on ranges another
//! batch was writing (a duplicate in flight) waits until those are recorded.
//!
//! A failed fsync or manifest write poisons the sink: after such a failure
//! the page cache can no longer be trusted to hold what was written, so the
//! sink refuses further work until it is restarted and recovers from its
//! manifest.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use manifest_db::{SinkCommit, SinkCounters, SinkManifest};
use tokio::sync::{mpsc, oneshot};

use crate::confine::sync_dir;
use crate::placement::{Slot, lock};

/// Ranges of a file another batch already placed or is placing.
pub(crate) struct Dependency {
    pub slot: Arc<Slot>,
    pub start: u64,
    pub end: u64,
}

/// Serialises every write of file records to the manifest.
pub(crate) type CommitGate = Arc<Mutex<()>>;

/// Ranges one batch wrote into one file generation.
pub(crate) type PlacedRanges = (Arc<Slot>, Vec<(u64, u64)>);

/// What one batch needs made durable before its ack.
#[derive(Default)]
pub(crate) struct CommitRequest {
    /// Every slot whose record this batch changed (written in full).
    pub touched: Vec<Arc<Slot>>,
    /// Ranges this batch wrote, per slot.
    pub placed: Vec<PlacedRanges>,
    pub files_to_sync: Vec<Arc<File>>,
    pub dirs_to_sync: Vec<Arc<OwnedFd>>,
    pub dependencies: Vec<Dependency>,
    pub counters: SinkCounters,
    /// (device, inode) of the directories already in `dirs_to_sync`.
    dirs_seen: std::collections::HashSet<(u64, u64)>,
}

impl CommitRequest {
    /// Adds directories to fsync, once each: a batch creating thousands of
    /// files in one directory holds one descriptor for it, not thousands.
    pub fn add_dirs(&mut self, dirs: impl IntoIterator<Item = OwnedFd>) {
        for dir in dirs {
            let identity = rustix::fs::fstat(&dir).map(|st| (st.st_dev, st.st_ino));
            match identity {
                Ok(identity) if !self.dirs_seen.insert(identity) => {}
                _ => self.dirs_to_sync.push(Arc::new(dir)),
            }
        }
    }
}

pub(crate) struct Queued {
    pub request: CommitRequest,
    pub reply: oneshot::Sender<Result<(), String>>,
}

/// Handle to the committer task.
#[derive(Clone)]
pub(crate) struct Committer {
    queue: mpsc::UnboundedSender<Queued>,
    poisoned: Arc<Mutex<Option<String>>>,
}

impl Committer {
    /// `commit_log`, if given, gets one line per recorded range with the
    /// time it became durable (for latency measurements).
    pub fn start(manifest: SinkManifest, commit_log: Option<File>, gate: CommitGate) -> Self {
        let (queue, receiver) = mpsc::unbounded_channel();
        let poisoned = Arc::new(Mutex::new(None));
        let commit_log = commit_log.map(std::io::BufWriter::new);
        tokio::spawn(run(manifest, receiver, poisoned.clone(), commit_log, gate));
        Self { queue, poisoned }
    }

    /// The reason the sink stopped accepting work, if it did.
    pub fn poisoned(&self) -> Option<String> {
        lock(&self.poisoned).clone()
    }

    /// Resolves once the request is durable (or the sink failed).
    pub async fn commit(&self, request: CommitRequest) -> Result<(), String> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Queued { request, reply })
            .map_err(|_| "the committer has stopped".to_string())?;
        answer
            .await
            .map_err(|_| "the committer has stopped".to_string())?
    }
}

/// Most requests merged into one round, so one round's latency stays bounded.
const MAX_ROUND: usize = 1024;

async fn run(
    manifest: SinkManifest,
    mut receiver: mpsc::UnboundedReceiver<Queued>,
    poisoned: Arc<Mutex<Option<String>>>,
    mut commit_log: Option<std::io::BufWriter<File>>,
    gate: CommitGate,
) {
    let mut waiting: Vec<Queued> = Vec::new();
    while let Some(first) = receiver.recv().await {
        let mut round = vec![first];
        while round.len() < MAX_ROUND {
            match receiver.try_recv() {
                Ok(next) => round.push(next),
                Err(_) => break,
            }
        }
        if let Some(reason) = lock(&poisoned).clone() {
            fail_all(round, &reason);
            fail_all(std::mem::take(&mut waiting), &reason);
            continue;
        }
        let started = std::time::Instant::now();
        let targets = sync_targets(&round);
        let flushed = targets.len();
        let synced = sync_all(targets).await;
        let synced_after = started.elapsed();
        let manifest = manifest.clone();
        let gate = gate.clone();
        let outcome = tokio::task::spawn_blocking(move || {
            let result = synced.and_then(|()| record_round(&manifest, &round, &gate));
            (round, result)
        })
        .await;
        let (round, result): (Vec<Queued>, Result<Vec<Placement>, String>) = match outcome {
            Ok(done) => done,
            Err(join_error) => {
                *lock(&poisoned) = Some(format!("the commit round panicked: {join_error}"));
                continue;
            }
        };
        tracing::debug!(
            requests = round.len(),
            flushed,
            sync_us = synced_after.as_micros() as u64,
            total_us = started.elapsed().as_micros() as u64,
            "commit round"
        );
        let placements = match result {
            Ok(placements) => placements,
            Err(reason) => {
                tracing::error!(error = %reason, "commit failed; the sink refuses further batches until restarted");
                *lock(&poisoned) = Some(reason.clone());
                fail_all(round, &reason);
                fail_all(std::mem::take(&mut waiting), &reason);
                continue;
            }
        };
        if let Some(log) = &mut commit_log
            && let Err(error) = write_commit_log(log, &placements)
        {
            tracing::warn!(%error, "cannot write the commit log; it stops here");
            commit_log = None;
        }
        waiting.extend(round);
        waiting = answer_ready(waiting);
    }
}

fn fail_all(requests: Vec<Queued>, reason: &str) {
    for queued in requests {
        let _ = queued
            .reply
            .send(Err(format!("sink storage failed, restart it: {reason}")));
    }
}

/// Answers every request whose dependencies are now recorded; returns the rest.
fn answer_ready(waiting: Vec<Queued>) -> Vec<Queued> {
    let mut still_waiting = Vec::new();
    for queued in waiting {
        match verdict(&queued.request) {
            Verdict::Ready => {
                let _ = queued.reply.send(Ok(()));
            }
            Verdict::Wait => {
                if !queued.reply.is_closed() {
                    still_waiting.push(queued);
                }
            }
            Verdict::Fail(reason) => {
                let _ = queued.reply.send(Err(reason));
            }
        }
    }
    still_waiting
}

enum Verdict {
    Ready,
    Wait,
    Fail(String),
}

fn verdict(request: &CommitRequest) -> Verdict {
    let mut verdict = Verdict::Ready;
    for dependency in &request.dependencies {
        let state = lock(&dependency.slot.state);
        if state.record.superseded || state.record.placed.covers(dependency.start, dependency.end) {
            continue;
        }
        // Not recorded yet: fine while another batch is still writing it.
        let missing = state
            .record
            .placed
            .missing(dependency.start, dependency.end);
        if !missing.iter().all(|&(s, e)| state.pending.covers(s, e)) {
            return Verdict::Fail(format!(
                "range {}..{} of {} was being written by a batch that failed; send it again",
                dependency.start, dependency.end, state.record.dest_path
            ));
        }
        verdict = Verdict::Wait;
    }
    verdict
}

type Placement = (manifest_db::FileId, u64, u64);

/// One line per range: source, key, generation, offset, length, and the
/// wall-clock nanoseconds at which it was durable and recorded.
fn write_commit_log(
    log: &mut std::io::BufWriter<File>,
    placements: &[Placement],
) -> std::io::Result<()> {
    use std::io::Write;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    for (id, offset, len) in placements {
        writeln!(
            log,
            "{}\t{}\t{}\t{offset}\t{len}\t{nanos}",
            id.source, id.key, id.generation
        )?;
    }
    log.flush()
}

/// Every distinct file and directory the round touched.
fn sync_targets(round: &[Queued]) -> Vec<SyncTarget> {
    let mut files: HashMap<*const File, &Arc<File>> = HashMap::new();
    let mut dirs: HashMap<*const OwnedFd, &Arc<OwnedFd>> = HashMap::new();
    for queued in round {
        for file in &queued.request.files_to_sync {
            files.insert(Arc::as_ptr(file), file);
        }
        for dir in &queued.request.dirs_to_sync {
            dirs.insert(Arc::as_ptr(dir), dir);
        }
    }
    files
        .into_values()
        .map(|f| SyncTarget::File(f.clone()))
        .chain(dirs.into_values().map(|d| SyncTarget::Dir(d.clone())))
        .collect()
}

/// Records a round whose bytes are durable.
fn record_round(
    manifest: &SinkManifest,
    round: &[Queued],
    gate: &CommitGate,
) -> Result<Vec<Placement>, String> {
    // Snapshots and their write happen under the gate, so a record written
    // out of band (a rename's intent) is never overwritten by an older one.
    let _gate = lock(gate);
    // The bytes are durable: fold the round's ranges into the records and
    // write them all at once.
    let mut commit = SinkCommit::default();
    let mut touched: HashMap<*const Slot, &Arc<Slot>> = HashMap::new();
    for queued in round {
        let request = &queued.request;
        for (slot, ranges) in &request.placed {
            let mut state = lock(&slot.state);
            for &(start, end) in ranges {
                state.record.placed.insert(start, end);
                commit
                    .placements
                    .push((slot.id.clone(), start, end - start));
            }
            let pending: Vec<(u64, u64)> = ranges.clone();
            for (start, end) in pending {
                remove_range(&mut state.pending, start, end);
            }
        }
        for slot in &request.touched {
            touched.insert(Arc::as_ptr(slot), slot);
        }
        commit.counters.placed_bytes += request.counters.placed_bytes;
        commit.counters.duplicate_bytes += request.counters.duplicate_bytes;
        commit.counters.rewritten_bytes += request.counters.rewritten_bytes;
    }
    for slot in touched.values() {
        commit
            .records
            .push((slot.id.clone(), lock(&slot.state).record.clone()));
    }
    manifest
        .commit(&commit)
        .map_err(|e| format!("recording {} ranges: {e}", commit.placements.len()))?;
    Ok(commit.placements)
}

pub(crate) fn remove_range(set: &mut manifest_db::IntervalSet, start: u64, end: u64) {
    let kept: Vec<(u64, u64)> = set
        .ranges()
        .iter()
        .flat_map(|&(s, e)| {
            let left = (s < start).then_some((s, e.min(start)));
            let right = (e > end).then_some((s.max(end), e));
            [left, right].into_iter().flatten()
        })
        .collect();
    *set = manifest_db::IntervalSet::from_ranges(kept);
}

enum SyncTarget {
    File(Arc<File>),
    Dir(Arc<OwnedFd>),
}

impl SyncTarget {
    fn sync(&self) -> Result<(), String> {
        match self {
            SyncTarget::File(file) => file.sync_data().map_err(|e| format!("fdatasync: {e}")),
            SyncTarget::Dir(dir) => {
                sync_dir(dir.as_ref()).map_err(|e| format!("fsync of a directory: {e}"))
            }
        }
    }
}

/// Most flushes issued at once.
const SYNC_PARALLELISM: usize = 64;

/// fdatasyncs files (and fsyncs directories) all at once, on tokio's
/// blocking threads: concurrent flushes share the filesystem's journal
/// commits (ext4 and XFS batch them), so a round touching a hundred files
/// costs about one commit instead of a hundred in a row.
async fn sync_all(targets: Vec<SyncTarget>) -> Result<(), String> {
    if targets.is_empty() {
        return Ok(());
    }
    let per_task = targets.len().div_ceil(SYNC_PARALLELISM);
    let mut tasks = Vec::new();
    let mut targets = targets.into_iter().peekable();
    while targets.peek().is_some() {
        let part: Vec<SyncTarget> = targets.by_ref().take(per_task).collect();
        tasks.push(tokio::task::spawn_blocking(move || {
            part.iter().try_for_each(SyncTarget::sync)
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| format!("a sync task failed: {e}"))??;
    }
    Ok(())
}
