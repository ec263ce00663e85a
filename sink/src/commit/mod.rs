//! Group commit: makes placed ranges durable, then records them, then lets
//! their acks go.
//!
//! One task drains every request queued since its last round, makes the
//! files they touched and the directories whose entries changed durable (one
//! `syncfs` or a flush each, see [`crate::durability::flush`]), then writes all their
//! records in one synced RocksDB WriteBatch. Only after that does any of them
//! get its answer. A request that leaned on ranges another batch was writing
//! (a duplicate in flight) waits until those are recorded.
//!
//! A round that has no file or directory to flush but small ranges to
//! journal writes their bytes into the journal file instead, with the
//! round's manifest batch after them (one write, one fdatasync, see
//! [`crate::durability::journal`]), and that batch into the manifest without a sync of
//! its own, both at once. A machine crash may lose the manifest write: the
//! startup redoes it from the journal. A process crash may cut the journal
//! write short after the manifest write: each entry carries its range's CRC,
//! so the replay finds which bytes made it, and withdraws the records of
//! those that did not (none was acknowledged).
//! Placement writes every range into its file (in order, see
//! `place::data`) before it submits the request, so a record never names
//! bytes that are not in their file.
//! Journaled ranges' files join a backlog that a background flush
//! makes durable (every [`FLUSH_AFTER`] or [`FLUSH_AT_BYTES`]) before
//! dropping the entries and giving their journal space back. A round that
//! flushes anyway, or finds the journal full, flushes those files with it.
//!
//! A failed fsync or manifest write poisons the sink: after such a failure
//! the page cache can no longer be trusted to hold what was written, so the
//! sink refuses further work until it is restarted and recovers from its
//! manifest.
//!
//! Here: the [`Committer`] handle and the task's loop. Beside it: `round`
//! (a round's flush targets, records and feed), `journal_round` (its
//! journal write), `backlog` (the background flush of journaled files),
//! and `deps` (answers that wait for other batches' ranges).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use manifest_db::SinkManifest;
use tokio::sync::{mpsc, oneshot};

use crate::SinkError;
use crate::blocking::run_blocking;
use crate::durability::flush::Flusher;
use crate::error::panic_message;
use crate::feed::{CommitFeed, RoundStages};
use crate::health::Health;
use crate::stage_cpu::{Stage, StageTimer};
use crate::state::{CommitGate, CommitRequest, FileCounts, lock};

mod backlog;
mod deps;
mod journal_round;
mod queued;
mod round;

pub(crate) use backlog::CommitJournal;
use backlog::{Backlog, flush_ended};
pub(crate) use deps::HOLD_WAIT;
use deps::{HOLD_RECHECK, answer_ready};
use journal_round::{JournalRound, journal_or_flush, reserve_journal_round};
pub(crate) use queued::Queued;
use round::{RoundSink, record_round};
pub(crate) use round::{forget_flushed, sync_targets};

/// Handle to the committer task. Clones share the task; [`Self::stop`]
/// drains what is queued and joins it.
#[derive(Clone)]
pub(crate) struct Committer {
    queue: mpsc::Sender<Queued>,
    health: Health,
    stopping: Arc<tokio::sync::Notify>,
    task: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

/// Requests queued for rounds at most. Fewer are ever in flight (batches
/// are placed by a bounded pool of threads, each submitting one at a time),
/// so this only guards memory against a bug; a placement thread that finds
/// it full waits.
const QUEUE_DEPTH: usize = 4 * MAX_ROUND;

/// What the committer task is given to own or share.
pub(crate) struct CommitterParts {
    pub manifest: SinkManifest,
    pub gate: CommitGate,
    pub journal: CommitJournal,
    pub counts: Arc<FileCounts>,
    pub flusher: Flusher,
    pub health: Health,
    pub feed: CommitFeed,
    /// Where each round's events go, when the sink records events.
    pub outbox: Option<Arc<crate::outbox::Outbox>>,
}

impl Committer {
    pub fn start(parts: CommitterParts) -> Self {
        use futures::FutureExt;
        let CommitterParts {
            manifest,
            gate,
            journal,
            counts,
            flusher,
            health,
            feed,
            outbox,
        } = parts;
        let (queue, receiver) = mpsc::channel(QUEUE_DEPTH);
        let backlog = Backlog::new(journal, flusher, health.clone());
        let stopping = Arc::new(tokio::sync::Notify::new());
        let rounds = Rounds {
            manifest,
            receiver,
            health: health.clone(),
            gate,
            backlog,
            counts,
            stopping: stopping.clone(),
            feed: Arc::new(feed),
            outbox,
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
    pub fn submit(&self, request: CommitRequest) -> Result<CommitAnswer, SinkError> {
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
    fn stopped(&self) -> SinkError {
        match self.health.reason() {
            Some(reason) => SinkError::Poisoned(reason),
            None => SinkError::Shutdown,
        }
    }
}

/// The outcome of a submitted commit request.
pub(crate) struct CommitAnswer(oneshot::Receiver<Result<(), SinkError>>);

impl CommitAnswer {
    pub async fn durable(self) -> Result<(), SinkError> {
        self.0.await.map_err(|_| committer_gone())?
    }

    /// [`Self::durable`], for a blocking thread (placement waiting for the
    /// intent of a move it is about to make).
    pub fn wait(self) -> Result<(), SinkError> {
        self.0.blocking_recv().map_err(|_| committer_gone())?
    }
}

/// A request the committer dropped unanswered: it ended without failing
/// the requests it held, which only a bug does.
fn committer_gone() -> SinkError {
    SinkError::Internal("the committer stopped without answering a commit request".to_string())
}

/// Most requests merged into one round, so one round's latency stays bounded.
const MAX_ROUND: usize = 1024;

/// What the committer task owns.
struct Rounds {
    manifest: SinkManifest,
    receiver: mpsc::Receiver<Queued>,
    health: Health,
    gate: CommitGate,
    backlog: Backlog,
    counts: Arc<FileCounts>,
    stopping: Arc<tokio::sync::Notify>,
    feed: Arc<CommitFeed>,
    outbox: Option<Arc<crate::outbox::Outbox>>,
}

async fn run(rounds: Rounds) {
    let Rounds {
        manifest,
        mut receiver,
        health,
        gate,
        mut backlog,
        counts,
        stopping,
        feed,
        outbox,
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
                fail_all(std::mem::take(&mut waiting), &SinkError::Poisoned(reason));
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
            // Requests waiting for held ranges are looked at again even
            // when no round runs: one held too long is failed (see `deps`).
            () = tokio::time::sleep(HOLD_RECHECK), if !waiting.is_empty() => {
                waiting = answer_ready(std::mem::take(&mut waiting));
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
            let error = SinkError::Poisoned(reason);
            fail_all(round, &error);
            fail_all(std::mem::take(&mut waiting), &error);
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
        // Placement wrote every range into its file before it submitted
        // the request, so a flush finds them there. A journaling round
        // still flushes its directories and the files' pending changes (a
        // rename, a new file): the journal holds only ranges.
        let synced = flusher.flush(targets, SYNC_PARALLELISM).await;
        if synced.is_ok() {
            forget_flushed(&round, &pending_flushed);
        }
        let synced_after = started.elapsed();
        let stages = RoundStages {
            receive_us: round
                .iter()
                .map(|q| q.request.placing_us.saturating_sub(q.request.place_us))
                .max()
                .unwrap_or(0),
            write_us: place_us,
            queue_us: queued_us,
            flush_us: synced_after.as_micros() as u64,
            ..RoundStages::default()
        };
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
        let round_outbox = outbox.clone();
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
                    outbox: round_outbox.as_deref(),
                };
                record_round(&sink, &mut round, journal, complete, stages).map(|mut recorded| {
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
                let reason = format!("the commit round panicked: {}", panic.into_detail());
                health.poison(reason.clone());
                fail_all(
                    std::mem::take(&mut waiting),
                    &SinkError::Poisoned(reason.into()),
                );
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
            blocking_us = result.as_ref().map_or(0, |r| r.blocking_us),
            gate_us = result.as_ref().map_or(0, |r| r.gate_us),
            manifest_us = result.as_ref().map_or(0, |r| r.manifest_us),
            total_us = started.elapsed().as_micros() as u64,
            cpu_totals_us = %crate::stage_cpu::totals_text(),
            "commit round"
        );
        let recorded = match result {
            Ok(recorded) => recorded,
            Err(error) => {
                // A round that failed before its records (a flush) stops
                // placement too, which checks the health.
                let reason = format!("a commit round failed: {}", error.into_detail());
                health.poison(reason.clone());
                let error = SinkError::Poisoned(reason.into());
                fail_all(round, &error);
                fail_all(std::mem::take(&mut waiting), &error);
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
        waiting.extend(round.into_iter().map(|mut queued| {
            queued.request.keep_dependencies_only();
            queued
        }));
        waiting = answer_ready(waiting);
    }
    // Stopping: a background flush in progress ends before its files and
    // journal go away (what it does not cover, the next start replays).
    if let Some(flushing) = backlog.flushing.take() {
        let _ = flushing.await;
    }
    fail_all(waiting, &SinkError::Shutdown);
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

fn fail_all(requests: Vec<Queued>, error: &SinkError) {
    for queued in requests {
        let _ = queued.reply.send(Err(error.clone()));
    }
}

/// Most flushes a round issues at once.
const SYNC_PARALLELISM: usize = 64;
