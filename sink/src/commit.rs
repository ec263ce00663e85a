//! Group commit: makes placed ranges durable, then records them, then lets
//! their acks go.
//!
//! One task drains every request queued since its last round, makes the
//! files they touched and the directories whose entries changed durable (one
//! `syncfs` or a flush each, see [`crate::flush`]), then writes all their
//! records in one synced RocksDB WriteBatch. Only after that does any of them
//! get its answer. A request that leaned on ranges another batch was writing
//! (a duplicate in flight) waits until those are recorded.
//!
//! A round that has no file or directory to flush but small ranges to
//! journal writes their bytes into the journal file instead, with the
//! round's manifest batch after them (one write, one fdatasync, see
//! [`crate::journal`]), and that batch into the manifest without a sync of
//! its own, both at once. A machine crash may lose the manifest write: the
//! startup redoes it from the journal. A process crash may cut the journal
//! write short after the manifest write: each entry carries its range's CRC,
//! so the replay finds which bytes made it, and withdraws the records of
//! those that did not (none was acknowledged).
//! A journal round ends only once its batches have also written those
//! ranges into their files (they do so while the round runs): the records
//! it wrote are read (under the gate) and its acks sent only after that.
//! Placement sees the records in memory sooner, as it must, to know what is
//! placed; a seal of a file with writes still in flight waits for the gate.
//! Their files join a backlog that a background flush
//! makes durable (every [`FLUSH_AFTER`] or [`FLUSH_AT_BYTES`]) before
//! dropping the entries and giving their journal space back. A round that
//! flushes anyway, or finds the journal full, flushes those files with it.
//!
//! A failed fsync or manifest write poisons the sink: after such a failure
//! the page cache can no longer be trusted to hold what was written, so the
//! sink refuses further work until it is restarted and recovers from its
//! manifest.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use manifest_db::{FileId, JournalEntry, SinkCommit, SinkManifest};
use tokio::sync::{mpsc, oneshot};

use crate::error::panic_message;
use crate::feed::{CommitFeed, FileChange, FileCommit};
use crate::flush::{Flusher, SyncTarget};
use crate::health::Health;
use crate::journal::{JournalFile, JournalSpace, RoundWrite};
use crate::stage_cpu::{Stage, StageTimer};
use crate::state::{CommitGate, CommitRequest, FileCounts, Slot, lock};

pub(crate) struct Queued {
    pub request: CommitRequest,
    /// When it was queued (for the commit round's trace).
    pub queued: Instant,
    pub reply: oneshot::Sender<Result<(), String>>,
}

/// Handle to the committer task. Clones share the task; [`Self::stop`]
/// drains what is queued and joins it.
#[derive(Clone)]
pub(crate) struct Committer {
    queue: mpsc::Sender<Queued>,
    health: Health,
    stopping: Arc<tokio::sync::Notify>,
    task: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

/// Requests queued for rounds at most. Fewer are ever in flight (each
/// stream holds at most its pipeline depth of batches, and the streams are
/// bounded), so this only guards memory against a bug; a placement thread
/// that finds it full waits.
const QUEUE_DEPTH: usize = 4 * MAX_ROUND;

/// What the committer task is given to own or share.
pub(crate) struct CommitterParts {
    pub manifest: SinkManifest,
    /// If given, gets one line per recorded range with the time it became
    /// durable (for latency measurements).
    pub commit_log: Option<File>,
    pub gate: CommitGate,
    pub journal: CommitJournal,
    pub counts: Arc<FileCounts>,
    pub flusher: Flusher,
    pub health: Health,
    pub feed: CommitFeed,
}

impl Committer {
    pub fn start(parts: CommitterParts) -> Self {
        use futures::FutureExt;
        let CommitterParts {
            manifest,
            commit_log,
            gate,
            journal,
            counts,
            flusher,
            health,
            feed,
        } = parts;
        let (queue, receiver) = mpsc::channel(QUEUE_DEPTH);
        let commit_log = commit_log.map(std::io::BufWriter::new);
        let backlog = Backlog::new(journal, flusher, health.clone());
        let stopping = Arc::new(tokio::sync::Notify::new());
        let rounds = Rounds {
            manifest,
            receiver,
            health: health.clone(),
            commit_log,
            gate,
            backlog,
            counts,
            stopping: stopping.clone(),
            feed: Arc::new(feed),
        };
        let watched = health.clone();
        let task = tokio::spawn(async move {
            // A committer that dies takes every later ack with it: the sink
            // must say so instead of looking healthy while nothing commits.
            let ended = std::panic::AssertUnwindSafe(run(rounds))
                .catch_unwind()
                .await;
            if let Err(panic) = ended {
                watched.poison(format!(
                    "the committer task panicked: {}",
                    panic_message(panic.as_ref())
                ));
            }
        });
        Self {
            queue,
            health,
            stopping,
            task: Arc::new(Mutex::new(Some(task))),
        }
    }

    /// Stops taking requests, finishes the rounds of those already queued
    /// (their acks go out), waits for a background flush in progress, and
    /// joins the committer and its journal thread. Idempotent.
    pub async fn stop(&self) {
        self.stopping.notify_one();
        let task = lock(&self.task).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    /// Queues the request for the next round; the answer resolves once it
    /// is durable (or the sink failed). Callable from a blocking thread, so
    /// a placed batch joins the queue without waiting for an async worker.
    pub fn submit(&self, request: CommitRequest) -> Result<CommitAnswer, crate::SinkError> {
        self.health.check()?;
        let (reply, answer) = oneshot::channel();
        self.queue
            .blocking_send(Queued {
                request,
                reply,
                queued: Instant::now(),
            })
            .map_err(|_| self.stopped())?;
        Ok(CommitAnswer(answer))
    }

    /// Why the committer takes nothing any more: it died (the health says
    /// why), or the sink is stopping.
    fn stopped(&self) -> crate::SinkError {
        match self.health.reason() {
            Some(reason) => crate::SinkError::Poisoned(reason),
            None => crate::SinkError::Shutdown,
        }
    }
}

/// The outcome of a submitted commit request.
pub(crate) struct CommitAnswer(oneshot::Receiver<Result<(), String>>);

impl CommitAnswer {
    pub async fn durable(self) -> Result<(), String> {
        self.0
            .await
            .map_err(|_| "the committer has stopped".to_string())?
    }

    /// [`Self::durable`], for a blocking thread (placement waiting for the
    /// intent of a move it is about to make).
    pub fn wait(self) -> Result<(), String> {
        self.0
            .blocking_recv()
            .map_err(|_| "the committer has stopped".to_string())?
    }
}

/// The journal file, and what bounds the files waiting for its background flush.
pub(crate) struct CommitJournal {
    pub file: Option<JournalFile>,
    /// Journaled bytes whose files are not flushed yet (placement reads it).
    pub backlog_bytes: Arc<AtomicU64>,
    /// A background flush starts once this many files wait for one: each
    /// keeps its descriptor open until then, beyond the placement's cache.
    pub flush_at_files: usize,
}

/// Most requests merged into one round, so one round's latency stays bounded.
const MAX_ROUND: usize = 1024;

/// Journaled files are flushed at the latest this long after their first
/// range (their rounds hold journal space until then; a replay after a
/// machine crash writes back what they hold: with a flush running late, up
/// to the whole journal file). Each flush costs the disk
/// a cache flush per file: every 100 ms, 100 files growing made 1,000 a
/// second, on top of the rounds' own, and the rounds' fdatasyncs queued
/// behind them (P3: 1,120 flushes/s at 100 ms, 440 at 400 ms; the start-up's
/// p99 fell from 100-170 ms to 14-26 ms)...
const FLUSH_AFTER: Duration = Duration::from_millis(400);
/// ...or once the rounds waiting hold this much of the journal file (their
/// regions: ranges, headers and manifest batches): a quarter of it, so
/// rounds keep finding room while a flush runs. Counting only the ranges
/// would let rounds of tiny appends, mostly header and batch, fill the
/// file first, and rounds would then flush in place.
const FLUSH_AT_BYTES: u64 = crate::journal::JOURNAL_FILE_BYTES / 4;

/// The journal file, and the journal rounds whose files still need a flush.
struct Backlog {
    /// Rounds reserve their regions in it, one round at a time.
    file: Option<JournalFile>,
    rounds: Vec<u64>,
    /// Keyed by address: each file once, however many ranges it got.
    files: HashMap<usize, Arc<File>>,
    /// Range bytes of the rounds waiting (what their files must write back).
    bytes: u64,
    /// Journal space the rounds waiting hold.
    held: u64,
    since: Option<Instant>,
    /// `bytes` of this backlog and of flushes under way, for placement to see.
    shared_bytes: Arc<AtomicU64>,
    /// The flush under way, until the committer has seen it end: flushes
    /// run one at a time, so journal space is given back in order.
    flushing: Option<tokio::task::JoinHandle<()>>,
    flusher: Flusher,
    /// Journal space to give back after a flush, up to where the last round
    /// added to the backlog starts: that round's region stays, so that the
    /// newest round the manifest holds durably is always still there, for
    /// the startup to find the rounds after it (see `journal::redo_lost_rounds`).
    space: Option<JournalSpace>,
    last_round_start: u64,
    flush_at_files: usize,
    /// Writes each round's journal bytes while the round writes its records.
    writer: Option<JournalWriter>,
    /// The last journal round whose bytes were durable: the next commit says so.
    complete: u64,
}

/// A thread of its own for journal writes: a round waits for its write on a
/// blocking thread, and must not depend on another one being free. Owned by
/// the committer and joined when it goes away; a panic in it poisons the sink.
struct JournalWriter {
    jobs: Option<std::sync::mpsc::Sender<JournalJob>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct JournalJob {
    write: RoundWrite,
    ranges: Vec<(FileId, u64, Vec<u8>)>,
    /// The round's manifest batch once it is built (empty if the manifest
    /// writes it synced): the ranges are written meanwhile.
    batch: std::sync::mpsc::Receiver<Vec<u8>>,
    /// Answers how long the write took from the batch on (µs), and where
    /// the round ends.
    done: std::sync::mpsc::SyncSender<JournalWritten>,
}

type JournalWritten = Result<(u64, u64), String>;

/// Writes a round's ranges, then, once the round sends it, its manifest
/// batch and header, durably.
fn write_journal_round(job: &JournalJob) -> JournalWritten {
    let pieces: Vec<&[u8]> = job.ranges.iter().map(|(_, _, b)| b.as_slice()).collect();
    let failed = |e: std::io::Error| {
        format!(
            "writing {} ranges to the journal file {}: {e}",
            pieces.len(),
            job.write.path().display()
        )
    };
    let ranges_crc = job.write.write_ranges(&pieces).map_err(failed)?;
    let batch = job
        .batch
        .recv()
        .map_err(|_| "the commit round failed before its journal write ended".to_string())?;
    let sealing = Instant::now();
    let end = job.write.seal(ranges_crc, &batch).map_err(failed)?;
    Ok((sealing.elapsed().as_micros() as u64, end))
}

impl JournalWriter {
    fn spawn(health: Health) -> std::io::Result<Self> {
        let (jobs, queue) = std::sync::mpsc::channel::<JournalJob>();
        let thread = std::thread::Builder::new()
            .name("tailflight-journal".into())
            .spawn(move || {
                let _guard = health.guard_thread();
                let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    for job in queue {
                        let timer = StageTimer::start(Stage::Journal);
                        let written = write_journal_round(&job);
                        drop(timer);
                        let _ = job.done.send(written);
                    }
                }));
                if let Err(panic) = written {
                    health.poison(format!(
                        "the journal writer thread panicked: {}",
                        panic_message(panic.as_ref())
                    ));
                }
            })?;
        Ok(Self {
            jobs: Some(jobs),
            thread: Some(thread),
        })
    }

    fn send(&self, job: JournalJob) -> Result<(), String> {
        self.jobs
            .as_ref()
            .and_then(|jobs| jobs.send(job).ok())
            .ok_or_else(|| "the journal writer thread has stopped".to_string())
    }
}

impl Drop for JournalWriter {
    /// Ends the thread once it has written what it was given, and joins it.
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Backlog {
    fn new(journal: CommitJournal, flusher: Flusher, health: Health) -> Self {
        let mut file = journal.file;
        let writer = match file.as_ref().map(|_| JournalWriter::spawn(health)) {
            Some(Ok(writer)) => Some(writer),
            Some(Err(error)) => {
                tracing::error!(%error, "cannot start the journal writer thread; small ranges are flushed in place");
                file = None;
                None
            }
            None => None,
        };
        Self {
            writer,
            complete: 0,
            space: file.as_ref().map(JournalFile::space),
            file,
            rounds: Vec::new(),
            files: HashMap::new(),
            bytes: 0,
            held: 0,
            since: None,
            shared_bytes: journal.backlog_bytes,
            flush_at_files: journal.flush_at_files.max(1),
            flushing: None,
            flusher,
            last_round_start: 0,
        }
    }

    /// Adds a journal round (its number, where its region starts and ends),
    /// the bytes of its ranges, and its files.
    fn add(&mut self, round: Option<(u64, u64, u64)>, bytes: u64, files: Vec<Arc<File>>) {
        let Some((round, start, end)) = round else {
            return;
        };
        self.rounds.push(round);
        self.last_round_start = start;
        self.since.get_or_insert_with(Instant::now);
        self.bytes += bytes;
        self.held += end.saturating_sub(start);
        self.shared_bytes.fetch_add(bytes, Ordering::Relaxed);
        for file in files {
            self.files.insert(Arc::as_ptr(&file) as usize, file);
        }
    }

    /// The journal file, if a round may add to the backlog: not while as many
    /// files wait as may, which only happens while a flush runs late. Rounds
    /// then flush their files in place, so open descriptors stay bounded.
    fn journal_for_round(&self) -> Option<&JournalFile> {
        self.file
            .as_ref()
            .filter(|_| self.files.len() < self.flush_at_files)
    }

    fn deadline(&self) -> Option<tokio::time::Instant> {
        self.since.map(|since| (since + FLUSH_AFTER).into())
    }

    /// Starts a flush of everything waiting, if one is due and none is running.
    fn flush_if_due(&mut self, manifest: &SinkManifest, health: &Health) {
        if health.is_poisoned() {
            // Entries stay for the replay after the restart, and no flush is
            // due any more: a deadline left behind would wake the committer
            // again at once, and it would spin.
            self.since = None;
            return;
        }
        let due = self.held >= FLUSH_AT_BYTES
            || self.files.len() >= self.flush_at_files
            || self
                .since
                .is_some_and(|since| since.elapsed() >= FLUSH_AFTER);
        // Until the committer has seen the last flush end, even if its task
        // is done: flushes must not overlap.
        let running = self.flushing.is_some();
        if !due || running || self.rounds.is_empty() {
            return;
        }
        let rounds = std::mem::take(&mut self.rounds);
        let targets: Vec<SyncTarget> = self
            .files
            .drain()
            .map(|(_, f)| SyncTarget::File(f))
            .collect();
        let bytes = std::mem::take(&mut self.bytes);
        self.held = 0;
        self.since = None;
        let shared_bytes = self.shared_bytes.clone();
        let manifest = manifest.clone();
        let health = health.clone();
        let flusher = self.flusher.clone();
        let release = self
            .space
            .clone()
            .map(|space| (space, self.last_round_start));
        self.flushing = Some(tokio::spawn(async move {
            // Few flushes at a time: this one is in no hurry, and the
            // commit rounds' manifest flushes must not queue behind it.
            let result = match flusher
                .flush_in_background(targets, BACKGROUND_SYNC_PARALLELISM)
                .await
            {
                // Another flush failing meanwhile may have taken the error
                // of one of these files: their entries must stay.
                Ok(()) if flusher.has_failed() => {
                    Err("another flush failed; journal entries are kept for the replay".to_string())
                }
                Ok(()) => tokio::task::spawn_blocking(move || {
                    let count = rounds.len();
                    manifest.forget_journal(&rounds).map_err(|e| {
                        format!("dropping the entries of {count} flushed journal rounds: {e}")
                    })
                })
                .await
                .unwrap_or_else(|e| Err(format!("the journal flush panicked: {e}"))),
                Err(e) => Err(e),
            };
            match result {
                Ok(()) => {
                    shared_bytes.fetch_sub(bytes, Ordering::Relaxed);
                    if let Some((space, end)) = release {
                        space.release_to(end);
                    }
                }
                Err(reason) => {
                    health.poison(format!("flushing journaled files: {reason}"));
                }
            }
        }));
    }
}

/// What the committer task owns.
struct Rounds {
    manifest: SinkManifest,
    receiver: mpsc::Receiver<Queued>,
    health: Health,
    commit_log: Option<std::io::BufWriter<File>>,
    gate: CommitGate,
    backlog: Backlog,
    counts: Arc<FileCounts>,
    stopping: Arc<tokio::sync::Notify>,
    feed: Arc<CommitFeed>,
}

async fn run(rounds: Rounds) {
    let Rounds {
        manifest,
        mut receiver,
        health,
        mut commit_log,
        gate,
        mut backlog,
        counts,
        stopping,
        feed,
    } = rounds;
    let flusher = backlog.flusher.clone();
    let mut waiting: Vec<Queued> = Vec::new();
    let mut draining = false;
    loop {
        let deadline = backlog.deadline();
        let flushing = backlog.flushing.is_some();
        let first = tokio::select! {
            next = receiver.recv() => match next {
                Some(first) => first,
                None => break,
            },
            // Requests waiting on others' ranges get their answer now: no
            // round may record those ranges any more.
            reason = health.poisoned(), if !waiting.is_empty() => {
                fail_all(std::mem::take(&mut waiting), &reason);
                continue;
            }
            () = stopping.notified(), if !draining => {
                // Whatever is queued already still gets its round; a
                // placement thread submitting later finds the queue closed.
                draining = true;
                receiver.close();
                continue;
            }
            // A flush is running: the next one waits for its end.
            _ = flush_ended(&mut backlog.flushing), if flushing => {
                backlog.flushing = None;
                backlog.flush_if_due(&manifest, &health);
                continue;
            }
            () = sleep_until(deadline), if deadline.is_some() && !flushing && !draining => {
                backlog.flush_if_due(&manifest, &health);
                continue;
            }
        };
        let mut round = vec![first];
        while round.len() < MAX_ROUND {
            match receiver.try_recv() {
                Ok(next) => round.push(next),
                Err(_) => break,
            }
        }
        if let Some(reason) = health.reason() {
            fail_all(round, &reason);
            fail_all(std::mem::take(&mut waiting), &reason);
            continue;
        }
        #[cfg(test)]
        for queued in &round {
            for slot in &queued.request.touched {
                crate::fault::hit(crate::fault::Point::CommitterLoop, &slot.id.source);
            }
        }
        let started = Instant::now();
        // How long the oldest batch of the round waited since it arrived
        // (placement, then the queue behind the previous round).
        let waited_us = round
            .iter()
            .filter_map(|q| q.request.received)
            .min()
            .and_then(|received| received.elapsed().ok())
            .map_or(0, |waited| waited.as_micros() as u64);
        let placing_us = round
            .iter()
            .map(|q| q.request.placing_us)
            .max()
            .unwrap_or(0);
        let place_us = round.iter().map(|q| q.request.place_us).max().unwrap_or(0);
        let queued_us = round
            .iter()
            .map(|q| q.queued.elapsed().as_micros() as u64)
            .max()
            .unwrap_or(0);
        let journaling = journal_or_flush(&mut round, backlog.journal_for_round());
        let (targets, pending_flushed) = sync_targets(&round);
        let flushed = targets.len();
        // A flush must find the bytes in the files.
        let synced = match journaling {
            true => Ok(()),
            false => deferred_writes_done(&mut round).await,
        };
        let synced = match synced {
            Ok(()) => flusher.flush(targets, SYNC_PARALLELISM).await,
            Err(e) => Err(e),
        };
        if synced.is_ok() {
            forget_flushed(&round, &pending_flushed);
        }
        let synced_after = started.elapsed();
        // The journal region is reserved now: the manifest's entries then
        // know where the bytes go and their CRC.
        let journal = synced.and_then(|()| match (backlog.file.as_mut(), &backlog.writer) {
            (Some(file), Some(writer)) if journaling => {
                reserve_journal_round(file, writer, &mut round)
            }
            _ => Ok(JournalRound::default()),
        });
        let manifest_for_round = manifest.clone();
        let round_gate = gate.clone();
        let counts = counts.clone();
        let round_health = health.clone();
        let round_feed = feed.clone();
        let complete = backlog.complete;
        let handed = Instant::now();
        let outcome = run_blocking(move || {
            let _guard = round_health.guard_thread();
            let blocking_us = handed.elapsed().as_micros() as u64;
            let _timer = StageTimer::start(Stage::Round);
            let mut round = round;
            let result = journal.and_then(|journal| {
                let sink = RoundSink {
                    manifest: &manifest_for_round,
                    gate: &round_gate,
                    counts: &counts,
                    health: &round_health,
                    feed: &round_feed,
                };
                record_round(&sink, &mut round, journal, complete).map(|mut recorded| {
                    recorded.blocking_us = blocking_us;
                    recorded
                })
            });
            (round, result)
        })
        .await;
        let (mut round, result) = match outcome {
            Ok(done) => done,
            Err(panic) => {
                let reason = format!("the commit round panicked: {panic}");
                health.poison(reason.clone());
                fail_all(std::mem::take(&mut waiting), &reason);
                continue;
            }
        };
        tracing::debug!(
            requests = round.len(),
            waited_us,
            placing_us,
            place_us,
            queued_us,
            flushed,
            journaled = round.iter().map(|q| q.request.journal_bytes).sum::<u64>(),
            sync_us = synced_after.as_micros() as u64,
            journal_us = result.as_ref().map_or(0, |r| r.journal_us),
            fold_us = result.as_ref().map_or(0, |r| r.fold_us),
            prepare_us = result.as_ref().map_or(0, |r| r.prepare_us),
            deferred_us = result.as_ref().map_or(0, |r| r.deferred_us),
            blocking_us = result.as_ref().map_or(0, |r| r.blocking_us),
            gate_us = result.as_ref().map_or(0, |r| r.gate_us),
            manifest_us = result.as_ref().map_or(0, |r| r.manifest_us),
            total_us = started.elapsed().as_micros() as u64,
            cpu_totals_us = ?crate::stage_cpu::totals_us(),
            "commit round"
        );
        let recorded = match result {
            Ok(recorded) => recorded,
            Err(reason) => {
                // A round that failed before its records (a flush, a deferred
                // write) stops placement too, which checks the health.
                health.poison(format!("a commit round failed: {reason}"));
                fail_all(round, &reason);
                fail_all(std::mem::take(&mut waiting), &reason);
                continue;
            }
        };
        let mut journal_round = None;
        if let Some((round, start, end)) = recorded.journal_round {
            backlog.complete = round;
            if let Some(file) = backlog.file.as_mut() {
                file.settle(end);
            }
            journal_round = Some((round, start, end));
        }
        let files = round
            .iter_mut()
            .flat_map(|queued| std::mem::take(&mut queued.request.journaled_files))
            .collect();
        backlog.add(journal_round, recorded.journal_bytes, files);
        backlog.flush_if_due(&manifest, &health);
        if let Some(log) = &mut commit_log
            && let Err(error) = write_commit_log(log, &recorded.placements, &recorded.received_at)
        {
            tracing::warn!(%error, "cannot write the commit log; it stops here");
            commit_log = None;
        }
        waiting.extend(round);
        waiting = answer_ready(waiting);
    }
    // Stopping: a background flush in progress ends before its files and
    // journal go away (what it does not cover, the next start replays).
    if let Some(flushing) = backlog.flushing.take() {
        let _ = flushing.await;
    }
    fail_all(waiting, "the sink is shutting down");
}

/// Runs a commit round's blocking part: in place on a multi-threaded
/// runtime (the worker hands its other tasks to another thread), on the
/// blocking pool otherwise. In place spares the round two hand-offs between
/// threads, which cost it 90 µs at p50 and 450 µs at p90 in P3 on two busy
/// cores. A panic comes back as an error either way.
async fn run_blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    use tokio::runtime::{Handle, RuntimeFlavor};
    if Handle::current().runtime_flavor() == RuntimeFlavor::MultiThread {
        return tokio::task::block_in_place(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
                .map_err(|panic| panic_message(panic.as_ref()))
        });
    }
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| e.to_string())
}

/// What a batch's placement said of its deferred writes.
fn deferred_outcome(
    answer: Result<Result<(), String>, oneshot::error::RecvError>,
) -> Result<(), String> {
    answer.unwrap_or_else(|_| {
        Err("a batch's placement thread ended before it wrote its journaled ranges into their files (it panicked)".to_string())
    })
}

/// Waits until every request's deferred writes are done.
async fn deferred_writes_done(round: &mut [Queued]) -> Result<(), String> {
    for queued in round.iter_mut() {
        if let Some(deferred) = queued.request.written.take() {
            deferred_outcome(deferred.await)?;
        }
    }
    Ok(())
}

async fn flush_ended(flushing: &mut Option<tokio::task::JoinHandle<()>>) {
    match flushing {
        Some(task) => {
            // A panic in it was logged by the runtime; the entries stay.
            let _ = task.await;
        }
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
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

/// One line per range: source, key, generation, offset, length, the
/// wall-clock nanoseconds at which it was durable and recorded, and those at
/// which its batch reached the sink (so a latency splits into the way there
/// and the commit).
fn write_commit_log(
    log: &mut std::io::BufWriter<File>,
    placements: &[Placement],
    received_at: &[u128],
) -> std::io::Result<()> {
    use std::io::Write;
    let nanos = unix_nanos(std::time::SystemTime::now());
    for ((id, offset, len), received) in placements.iter().zip(received_at) {
        writeln!(
            log,
            "{}\t{}\t{}\t{offset}\t{len}\t{nanos}\t{received}",
            id.source, id.key, id.generation
        )?;
    }
    log.flush()
}

fn unix_nanos(time: std::time::SystemTime) -> u128 {
    time.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// Every distinct file and directory the round must flush: those its
/// batches touched, and what earlier changes to the files it records still
/// wait for (see [`CommitRequest::flush_before_record`]); and the tokens of
/// those pending flushes, to forget once they are done.
pub(crate) fn sync_targets(round: &[Queued]) -> (Vec<SyncTarget>, HashSet<u64>) {
    // Each batch opens the directories it changed on its own: one fsync
    // each is enough (and a few more would tip `Auto` into a syncfs).
    let mut targets: HashMap<(u64, u64), SyncTarget> = HashMap::new();
    let mut add = |target: SyncTarget| {
        let identity = match &target {
            SyncTarget::Dir(dir) => rustix::fs::fstat(dir.as_ref())
                .map_or((u64::MAX, target.address() as u64), |st| {
                    (st.st_dev, st.st_ino)
                }),
            SyncTarget::File(_) => (u64::MAX, target.address() as u64),
        };
        targets.entry(identity).or_insert(target);
    };
    let mut tokens = HashSet::new();
    for queued in round {
        let request = &queued.request;
        for file in &request.files_to_sync {
            add(SyncTarget::File(file.clone()));
        }
        for dir in &request.dirs_to_sync {
            add(SyncTarget::Dir(dir.clone()));
        }
        for slot in &request.touched {
            for pending in lock(&slot.unsynced).iter() {
                tokens.insert(pending.token());
                add(pending.target.clone());
            }
        }
    }
    (targets.into_values().collect(), tokens)
}

/// After a round's flush: the pending flushes it covered are done. Later
/// ones (a move made while it flushed) stay, even in the same directory.
pub(crate) fn forget_flushed(round: &[Queued], flushed: &HashSet<u64>) {
    for queued in round {
        for slot in &queued.request.touched {
            lock(&slot.unsynced).retain(|pending| !flushed.contains(&pending.token()));
        }
    }
}

/// What a round recorded.
struct Recorded {
    /// Per file, what the round made durable (only if the feed has listeners).
    feed: Option<Vec<FileCommit>>,
    placements: Vec<Placement>,
    /// Per placement, when its batch reached the sink (unix nanos).
    received_at: Vec<u128>,
    /// How long building and writing the manifest batch took (synced only
    /// when the round journals nothing), and then the journal's write of
    /// that batch and its fdatasync (its ranges were written meanwhile).
    journal_us: u64,
    manifest_us: u64,
    /// Of which building the batch (the rest is RocksDB's write).
    prepare_us: u64,
    /// Folding the round's ranges into the records, before that.
    fold_us: u64,
    /// Waiting for the batches' deferred writes, after the journal write.
    deferred_us: u64,
    /// Before all that: from the hand-off until the round ran (in place, or
    /// on the blocking pool under a current-thread runtime), then waiting
    /// for the commit gate.
    blocking_us: u64,
    gate_us: u64,
    /// The journal round written, if any (its number, where it starts and
    /// ends in the journal), and its bytes.
    journal_round: Option<(u64, u64, u64)>,
    journal_bytes: u64,
}

/// Decides whether the round's small ranges go to the journal file: only if
/// the round flushes nothing else (a flush it pays anyway covers them too)
/// and the journal has room. Otherwise their files are flushed with the rest.
fn journal_or_flush(round: &mut [Queued], journal: Option<&JournalFile>) -> bool {
    let bytes: u64 = round.iter().map(|q| q.request.journal_bytes).sum();
    let flushes_anyway = round.iter().any(|q| q.request.flushes_anyway());
    if bytes > 0 && !flushes_anyway && journal.is_some_and(|j| j.has_room(bytes)) {
        return true;
    }
    for queued in round {
        let request = &mut queued.request;
        request.journal.clear();
        request.journal_bytes = 0;
        let files = std::mem::take(&mut request.journaled_files);
        request.files_to_sync.extend(files);
    }
    false
}

/// A round's journal entries, and the write of their region, to start once
/// the round's manifest batch is built.
#[derive(Default)]
struct JournalRound {
    entries: Vec<JournalEntry>,
    /// The round's number: the key its entries are kept under.
    round: u64,
    /// Where its region starts in the journal.
    start: u64,
    write: Option<PendingJournalWrite>,
}

/// A round's journal write under way: its ranges are being written, its
/// manifest batch is still to come.
struct PendingJournalWrite {
    batch: std::sync::mpsc::SyncSender<Vec<u8>>,
    written: std::sync::mpsc::Receiver<JournalWritten>,
    batch_room: usize,
}

impl PendingJournalWrite {
    /// Whether a manifest batch of `len` bytes fits in the round's region.
    fn batch_fits(&self, len: usize) -> bool {
        len <= self.batch_room
    }

    /// Hands over the round's manifest batch; the receiver answers once the
    /// whole region is durable.
    fn finish(self, batch: Vec<u8>) -> std::sync::mpsc::Receiver<JournalWritten> {
        // Should the writer have failed already, the receiver says why.
        let _ = self.batch.send(batch);
        self.written
    }
}

/// Reserves the journal region for the round's journaled ranges. Returns
/// their manifest entries and the write to start.
fn reserve_journal_round(
    journal: &mut JournalFile,
    writer: &JournalWriter,
    round: &mut [Queued],
) -> Result<JournalRound, String> {
    let ranges: Vec<(FileId, u64, Vec<u8>)> = round
        .iter_mut()
        .flat_map(|q| std::mem::take(&mut q.request.journal))
        .collect();
    if ranges.is_empty() {
        return Ok(JournalRound::default());
    }
    let pieces: Vec<&[u8]> = ranges.iter().map(|(_, _, b)| b.as_slice()).collect();
    let reservation = journal
        .reserve(&pieces)
        .map_err(|e| format!("journaling {} ranges: {e}", ranges.len()))?;
    let entries = ranges
        .iter()
        .zip(reservation.refs)
        .map(|((id, offset, _), bytes)| (id.clone(), *offset, bytes))
        .collect();
    let batch_room = reservation.write.batch_room();
    let (batch, batch_receiver) = std::sync::mpsc::sync_channel(1);
    let (done, written) = std::sync::mpsc::sync_channel(1);
    writer.send(JournalJob {
        write: reservation.write,
        ranges,
        batch: batch_receiver,
        done,
    })?;
    Ok(JournalRound {
        entries,
        round: reservation.round,
        start: reservation.start,
        write: Some(PendingJournalWrite {
            batch,
            written,
            batch_room,
        }),
    })
}

/// What a round records into, and whom it tells of a failure.
struct RoundSink<'a> {
    manifest: &'a SinkManifest,
    gate: &'a CommitGate,
    counts: &'a FileCounts,
    health: &'a Health,
    /// Told of the round under the gate, once it is durable.
    feed: &'a CommitFeed,
}

/// What a round's record of a file tells the feed's listeners, against what
/// the manifest held of it before (kept in the slot's state).
fn describe_commit(
    id: &FileId,
    before: &crate::state::SlotState,
    record: &manifest_db::FileRecord,
    made: manifest_db::IntervalSet,
) -> FileCommit {
    let mut changes = Vec::new();
    let path = path_on_disk(record);
    match &before.recorded_path {
        _ if !before.recorded => changes.push(FileChange::Opened),
        Some(from) if from != path => changes.push(FileChange::Renamed { from: from.clone() }),
        _ => {}
    }
    if let Some(sealed) = record.sealed.as_ref().filter(|_| !before.recorded_sealed) {
        changes.push(FileChange::Sealed {
            size: sealed.size,
            digest: sealed.digest.clone(),
        });
    }
    if record.superseded && !before.recorded_superseded {
        changes.push(FileChange::Superseded);
    }
    FileCommit {
        id: id.clone(),
        path: path.to_owned(),
        ranges: made.ranges().to_vec(),
        contiguous_end: record.placed.contiguous_end(),
        changes,
    }
}

/// Where a record's file lives: a move whose intent is recorded and which
/// is not made yet leaves it at its old name, and the feed tells of the
/// rename with the round that records it made.
fn path_on_disk(record: &manifest_db::FileRecord) -> &str {
    record.renamed_from.as_deref().unwrap_or(&record.dest_path)
}

/// Records a round whose bytes are durable (flushed), or become durable in
/// the journal while its records are written: it returns only once both are.
fn record_round(
    sink: &RoundSink<'_>,
    round: &mut [Queued],
    journal: JournalRound,
    journal_complete: u64,
) -> Result<Recorded, String> {
    // Snapshots and their write happen under the gate, which is also what
    // the journal replay writes records under before the committer runs.
    // It is held until the journal write and the round's deferred writes
    // are done too, and a failure (or a panic) poisons the sink and the gate
    // before it is let go: whoever writes or reads records under it
    // (renames, watermarks) never sees ranges whose bytes may still be lost
    // or not yet in their files.
    let asking = Instant::now();
    let _gate = lock(sink.gate);
    let gate_us = asking.elapsed().as_micros() as u64;
    if let Some(reason) = sink.health.reason() {
        // Placement stopped the sink (a failed flush) while this round ran.
        return Err(format!("the sink stopped: {reason}"));
    }
    let recorded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        record_round_under_gate(sink, round, journal, journal_complete)
    }))
    .unwrap_or_else(|panic| {
        Err(format!(
            "the commit round panicked: {}",
            panic_message(panic.as_ref())
        ))
    });
    match recorded {
        Ok(mut recorded) => {
            // Still under the gate: a snapshot read under it either holds
            // this round or names the round before it.
            sink.feed.recorded(recorded.feed.take());
            recorded.gate_us = gate_us;
            Ok(recorded)
        }
        Err(reason) => {
            sink.health
                .poison(format!("a commit round failed: {reason}"));
            Err(reason)
        }
    }
}

fn record_round_under_gate(
    sink: &RoundSink<'_>,
    round: &mut [Queued],
    journal: JournalRound,
    journal_complete: u64,
) -> Result<Recorded, String> {
    let folding = Instant::now();
    let deferred_writes: Vec<_> = round
        .iter_mut()
        .filter_map(|queued| queued.request.written.take())
        .collect();
    let RoundSink {
        manifest, counts, ..
    } = sink;
    let JournalRound {
        entries: journal,
        round: journal_round,
        start: journal_start,
        write: journal_write,
    } = journal;
    // The bytes are durable (flushed), or go to the journal with the records:
    // fold the round's ranges into the records and write them all at once.
    let mut commit = SinkCommit {
        journal,
        journal_round,
        journal_start,
        journal_complete,
        ..SinkCommit::default()
    };
    let mut received_at = Vec::new();
    let mut touched: HashMap<*const Slot, &Arc<Slot>> = HashMap::new();
    // What the round makes durable of each file, for the feed's listeners.
    let mut fed: Option<HashMap<*const Slot, manifest_db::IntervalSet>> =
        sink.feed.has_listeners().then(HashMap::new);
    for queued in round.iter() {
        let request = &queued.request;
        let received = request.received.map_or(0, unix_nanos);
        for (slot, ranges) in &request.placed {
            let mut state = lock(&slot.state);
            if let Some(fed) = fed.as_mut() {
                let made = fed.entry(Arc::as_ptr(slot)).or_default();
                for &(start, end) in ranges {
                    made.insert(start, end);
                }
            }
            for &(start, end) in ranges {
                state.record.placed.insert(start, end);
                commit
                    .placements
                    .push((slot.id.clone(), start, end - start));
                received_at.push(received);
            }
            let pending: Vec<(u64, u64)> = ranges.clone();
            for (start, end) in pending {
                state.pending.remove(start, end);
            }
        }
        for slot in &request.touched {
            touched.insert(Arc::as_ptr(slot), slot);
        }
        commit.counters.placed_bytes += request.counters.placed_bytes;
        commit.counters.duplicate_bytes += request.counters.duplicate_bytes;
        commit.counters.rewritten_bytes += request.counters.rewritten_bytes;
    }
    let mut written = Vec::with_capacity(touched.len());
    for slot in touched.values() {
        let state = lock(&slot.state);
        // Whatever the round's flush did not cover (a move made since, by a
        // batch that has not reached a round): the record must not outrun
        // it. Under the slot's state, which every move holds while it makes
        // its change and queues its flush.
        let mut unsynced = lock(&slot.unsynced);
        while let Some(pending) = unsynced.first() {
            pending.target.sync().inspect_err(|reason| {
                sink.health.poison(reason.clone());
            })?;
            unsynced.remove(0);
        }
        drop(unsynced);
        let record = state.record.clone();
        drop(state);
        written.push((*slot, record.sealed.is_some()));
        commit.records.push((slot.id.clone(), record));
    }
    let writing = Instant::now();
    let fold_us = (writing - folding).as_micros() as u64;
    let recording =
        |e: manifest_db::Error| format!("recording {} ranges: {e}", commit.placements.len());
    let prepared = manifest.prepare(&commit).map_err(recording)?;
    let prepare_us = writing.elapsed().as_micros() as u64;
    // A journal round carries the records' batch too, and the manifest
    // writes it without a sync of its own: one fdatasync makes the round
    // durable, and the startup redoes a batch a machine crash lost.
    let journal_written = match journal_write {
        Some(write) if write.batch_fits(prepared.data().len()) => {
            let written = write.finish(prepared.data().to_vec());
            prepared.write_logged_elsewhere().map_err(recording)?;
            Some(written)
        }
        Some(write) => {
            let written = write.finish(Vec::new());
            prepared.write_synced().map_err(recording)?;
            Some(written)
        }
        None => {
            prepared.write_synced().map_err(recording)?;
            None
        }
    };
    let manifest_us = writing.elapsed().as_micros() as u64;
    // Nothing of this round is acknowledged before its journal write ends.
    // A process crash before then may leave its entries recorded with bytes
    // that fail their CRC: the replay withdraws them. A machine crash may
    // also lose the manifest write: then the round is simply not recorded,
    // unless its journal write had ended, and the startup redoes it.
    let (journal_us, journal_end) = match journal_written {
        Some(written) => {
            let (us, end) = written.recv().unwrap_or_else(|_| {
                Err("the journal writer thread died (panicked) before it answered".to_string())
            })?;
            (us, Some(end))
        }
        None => (0, None),
    };
    // The records may be seen once the round ends: their ranges must be in
    // their files by then (they are durable in the journal already).
    let deferring = Instant::now();
    for deferred in deferred_writes {
        deferred_outcome(deferred.blocking_recv())?;
    }
    let deferred_us = deferring.elapsed().as_micros() as u64;
    let mut feed = fed.as_ref().map(|_| Vec::with_capacity(written.len()));
    for ((slot, sealed), (_, record)) in written.into_iter().zip(&commit.records) {
        let mut state = lock(&slot.state);
        if let (Some(feed), Some(fed)) = (feed.as_mut(), fed.as_mut()) {
            let made = fed.remove(&Arc::as_ptr(slot)).unwrap_or_default();
            feed.push(describe_commit(&slot.id, &state, record, made));
        }
        state.recorded_path = Some(path_on_disk(record).to_owned());
        state.recorded_superseded = record.superseded;
        counts.committed(&mut state, sealed);
    }
    let journal_bytes = commit
        .journal
        .iter()
        .map(|(_, _, bytes)| match bytes {
            manifest_db::JournalBytes::InFile { len, .. } => u64::from(*len),
            manifest_db::JournalBytes::Inline(bytes) => bytes.len() as u64,
        })
        .sum();
    let journal_round = journal_end.map(|end| (commit.journal_round, commit.journal_start, end));
    Ok(Recorded {
        feed,
        placements: commit.placements,
        received_at,
        journal_us,
        manifest_us,
        prepare_us,
        fold_us,
        deferred_us,
        blocking_us: 0,
        gate_us: 0,
        journal_round,
        journal_bytes,
    })
}

/// Most flushes the background journal flush issues at once.
const BACKGROUND_SYNC_PARALLELISM: usize = 2;

/// Most flushes a round issues at once.
const SYNC_PARALLELISM: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::confine::Root;
    use crate::flush::SyncStrategy;
    use crate::test_support::scratch;

    /// A backlog over a scratch directory: it, the manifest its flushes
    /// write to, and the bytes it tells placement about.
    fn backlog_in(
        dir: &std::path::Path,
        flush_at_files: usize,
    ) -> (Backlog, SinkManifest, Arc<AtomicU64>) {
        let root = Root::open(dir).unwrap();
        let flusher = Flusher::new(&root, SyncStrategy::Files, Health::default()).unwrap();
        let manifest = SinkManifest::open(&dir.join("state")).unwrap();
        let backlog_bytes = Arc::new(AtomicU64::new(0));
        let journal = CommitJournal {
            file: Some(JournalFile::open(&dir.join("journal"), 1 << 20, 1).unwrap()),
            backlog_bytes: backlog_bytes.clone(),
            flush_at_files,
        };
        (
            Backlog::new(journal, flusher, Health::default()),
            manifest,
            backlog_bytes,
        )
    }

    /// Each journaled file waiting for the background flush holds a
    /// descriptor: as many as the sink may keep open start the flush, well
    /// before its time or byte limit.
    #[tokio::test]
    async fn a_backlog_of_many_files_is_flushed_before_its_time() {
        let dir = scratch("backlog-files");
        let (mut backlog, manifest, backlog_bytes) = backlog_in(&dir, 2);
        let health = Health::default();
        let file = |name: &str| Arc::new(File::create(dir.join(name)).unwrap());

        // One file twice (two of its ranges) counts once.
        let a = file("a");
        backlog.add(Some((1, 10, 20)), 10, vec![a.clone(), a]);
        backlog.flush_if_due(&manifest, &health);
        assert!(backlog.flushing.is_none(), "one file, just now: not due");

        backlog.add(Some((2, 20, 30)), 10, vec![file("b")]);
        backlog.flush_if_due(&manifest, &health);
        assert!(backlog.flushing.is_some(), "two files: due");
        assert!(backlog.files.is_empty());

        // While that flush runs, the next files wait; at the limit, rounds
        // stop journaling instead of holding more descriptors.
        backlog.add(Some((3, 30, 40)), 10, vec![file("c")]);
        backlog.flush_if_due(&manifest, &health);
        assert!(backlog.journal_for_round().is_some());
        backlog.add(Some((4, 40, 50)), 10, vec![file("d")]);
        assert!(backlog.journal_for_round().is_none());
        flush_ended(&mut backlog.flushing).await;
        backlog.flushing = None;
        backlog.flush_if_due(&manifest, &health);
        assert!(
            backlog.journal_for_round().is_some(),
            "the next flush took them"
        );
        flush_ended(&mut backlog.flushing).await;
        assert!(!health.is_poisoned());
        assert_eq!(backlog_bytes.load(Ordering::Relaxed), 0);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Rounds of tiny appends are mostly header and manifest batch: the
    /// journal space they hold, not their range bytes, makes a flush due.
    #[tokio::test]
    async fn rounds_holding_a_quarter_of_the_journal_are_flushed() {
        let dir = scratch("backlog-held");
        let (mut backlog, manifest, _) = backlog_in(&dir, 100);
        let health = Health::default();
        let file = Arc::new(File::create(dir.join("a")).unwrap());
        let quarter = FLUSH_AT_BYTES;
        backlog.add(Some((1, 0, quarter / 2)), 10, vec![file.clone()]);
        backlog.flush_if_due(&manifest, &health);
        assert!(
            backlog.flushing.is_none(),
            "an eighth of the journal: not due"
        );
        backlog.add(Some((2, quarter / 2, quarter)), 10, vec![file]);
        backlog.flush_if_due(&manifest, &health);
        assert!(
            backlog.flushing.is_some(),
            "20 range bytes, but a quarter held"
        );
        flush_ended(&mut backlog.flushing).await;
        assert!(!health.is_poisoned());
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A stopped sink keeps its journaled files for the replay, and has no
    /// flush deadline left: one already past would wake the committer's loop
    /// at once, over and over.
    #[tokio::test]
    async fn a_poisoned_backlog_keeps_its_files_and_drops_its_deadline() {
        let dir = scratch("backlog-poisoned");
        let (mut backlog, manifest, _) = backlog_in(&dir, 100);
        let health = Health::default();
        health.poison("a flush failed");
        let file = Arc::new(File::create(dir.join("a")).unwrap());
        backlog.add(Some((1, 10, 20)), 10, vec![file]);
        assert!(backlog.deadline().is_some());

        backlog.flush_if_due(&manifest, &health);
        assert!(backlog.flushing.is_none());
        assert_eq!(backlog.files.len(), 1, "kept for the replay");
        assert!(backlog.deadline().is_none());
        let _ = std::fs::remove_dir_all(dir);
    }
}
