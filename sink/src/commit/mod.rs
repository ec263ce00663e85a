//! Group commit: makes placed ranges durable, then records them, then lets
//! their acks go.
//!
//! One thread drains every request queued since its last round, makes the
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
//! `place::data`) before it submits the request, except small ranges it
//! writes beside the round (see `place::beside`): the round waits for those
//! before it flushes any file, and before it tells anyone of them. So a
//! flush always finds its ranges in their files, and a record that names
//! bytes not yet in their file is one whose journal holds them (the startup
//! replay writes them) and of which no one has heard.
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
//! Here: the [`Committer`] handle and its thread's loop. Beside it: `round`
//! (a round's flush targets, records and feed), `journal_round` (its
//! journal write), `backlog` (the background flush of journaled files),
//! and `deps` (answers that wait for other batches' ranges).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
use round::{Recorded, RoundSink, record_round, wait_written};
pub(crate) use round::{forget_flushed, sync_targets};

/// Handle to the committer. Clones share its thread; [`Self::stop`]
/// drains what is queued and joins it.
#[derive(Clone)]
pub(crate) struct Committer {
    queue: mpsc::Sender<Queued>,
    health: Health,
    stopping: Arc<tokio::sync::Notify>,
    thread: Arc<Mutex<Option<CommitThread>>>,
}

/// The committer's own thread, and word of its end for an async joiner.
struct CommitThread {
    ended: oneshot::Receiver<()>,
    thread: std::thread::JoinHandle<()>,
}

/// Requests queued for rounds at most. Fewer are ever in flight (batches
/// are placed by a bounded pool of threads, each submitting one at a time),
/// so this only guards memory against a bug; a placement thread that finds
/// it full waits.
const QUEUE_DEPTH: usize = 4 * MAX_ROUND;

/// What the committer is given to own or share.
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
            waiting: Vec::new(),
            draining: false,
        };
        let watched = health.clone();
        let runtime = tokio::runtime::Handle::current();
        let (ended_tx, ended) = oneshot::channel();
        // Rounds run on a thread of their own, which drives the committer's
        // future and records each round in place: a round costs no hand-off
        // to the blocking pool and back, and no async worker ever blocks.
        let spawned = std::thread::Builder::new()
            .name("tailflight-commit".into())
            .spawn(move || {
                // A committer that dies takes every later ack with it: the
                // sink must say so instead of looking healthy while nothing
                // commits.
                let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    runtime.block_on(run(rounds))
                }));
                if let Err(panic) = ended {
                    watched.poison(format!(
                        "the committer panicked: {}",
                        panic_message(panic.as_ref())
                    ));
                }
                let _ = ended_tx.send(());
            });
        let thread = match spawned {
            Ok(thread) => Some(CommitThread { ended, thread }),
            Err(error) => {
                health.poison(format!("cannot start the committer's thread: {error}"));
                None
            }
        };
        Self {
            queue,
            health,
            stopping,
            thread: Arc::new(Mutex::new(thread)),
        }
    }

    /// Stops taking requests, finishes the rounds of those already queued
    /// (their acks go out), waits for a background flush in progress, and
    /// joins the committer and its journal thread. Idempotent.
    pub async fn stop(&self) {
        self.stopping.notify_one();
        let thread = lock(&self.thread).take();
        if let Some(CommitThread { ended, thread }) = thread {
            let _ = ended.await;
            // It has sent its last word: the join is immediate.
            let _ = run_blocking(move || thread.join()).await;
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

/// A request the committer dropped unanswered: its thread ended (the sink
/// is stopping), or its loop panicked, which poisons the sink (and the
/// caller then says so).
fn committer_gone() -> SinkError {
    SinkError::Shutdown
}

/// Most requests merged into one round, so one round's latency stays bounded.
const MAX_ROUND: usize = 1024;

/// What the committer's thread owns.
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
    /// Requests recorded but not answered: they wait for other batches'
    /// ranges (see `deps`).
    waiting: Vec<Queued>,
    /// Told to stop: it takes no more requests, and ends once the queue is
    /// empty.
    draining: bool,
}

async fn run(mut rounds: Rounds) {
    while let Some(round) = rounds.next_round().await {
        rounds.commit(round).await;
    }
    rounds.finish().await;
}

/// When a round started, and how long its requests took to reach it: its
/// stages for the feed, and its trace.
struct RoundTimes {
    started: Instant,
    /// How long the oldest batch of the round waited since it arrived
    /// (placement, then the queue behind the previous round).
    waited_us: u64,
    placing_us: u64,
    place_us: u64,
    queued_us: u64,
    receive_us: u64,
}

impl RoundTimes {
    fn of(round: &[Queued]) -> Self {
        let most = |of: fn(&Queued) -> u64| round.iter().map(of).max().unwrap_or(0);
        Self {
            started: Instant::now(),
            waited_us: round
                .iter()
                .filter_map(|q| q.request.received)
                .min()
                .and_then(|received| received.elapsed().ok())
                .map_or(0, |waited| waited.as_micros() as u64),
            placing_us: most(|q| q.request.placing_us),
            place_us: most(|q| q.request.place_us),
            queued_us: most(|q| q.queued.elapsed().as_micros() as u64),
            receive_us: most(|q| q.request.placing_us.saturating_sub(q.request.place_us)),
        }
    }

    fn stages(&self, flushed_after: Duration) -> RoundStages {
        RoundStages {
            receive_us: self.receive_us,
            write_us: self.place_us,
            queue_us: self.queued_us,
            flush_us: flushed_after.as_micros() as u64,
            ..RoundStages::default()
        }
    }
}

impl Rounds {
    /// The next round: the first request to arrive and those queued behind
    /// it (at most [`MAX_ROUND`]); none once the queue is closed and empty.
    /// A sink poisoned meanwhile fails what it gathered, and waits again.
    async fn next_round(&mut self) -> Option<Vec<Queued>> {
        loop {
            let Some(first) = self.next_request().await? else {
                continue;
            };
            let mut round = vec![first];
            while round.len() < MAX_ROUND {
                match self.receiver.try_recv() {
                    Ok(next) => round.push(next),
                    Err(_) => break,
                }
            }
            if let Some(reason) = self.health.reason() {
                let error = SinkError::Poisoned(reason);
                fail_all(round, &error);
                fail_all(std::mem::take(&mut self.waiting), &error);
                continue;
            }
            #[cfg(test)]
            for queued in &round {
                for slot in &queued.request.touched {
                    crate::fault::hit(crate::fault::Point::CommitterLoop, &slot.id.source);
                }
            }
            return Some(round);
        }
    }

    /// Waits for a request, seeing to whatever comes first meanwhile:
    /// `Some(None)` after anything else, `None` once the queue is closed and
    /// empty.
    async fn next_request(&mut self) -> Option<Option<Queued>> {
        let deadline = self.backlog.deadline();
        let flushing = self.backlog.flushing.is_some();
        tokio::select! {
            next = self.receiver.recv() => return next.map(Some),
            // Requests waiting on others' ranges get their answer now: no
            // round may record those ranges any more.
            reason = self.health.poisoned(), if !self.waiting.is_empty() => {
                fail_all(std::mem::take(&mut self.waiting), &SinkError::Poisoned(reason));
            }
            () = self.stopping.notified(), if !self.draining => {
                // Whatever is queued already still gets its round; a
                // placement thread submitting later finds the queue closed.
                self.draining = true;
                self.receiver.close();
            }
            // A flush is running: the next one waits for its end.
            _ = flush_ended(&mut self.backlog.flushing), if flushing => {
                self.backlog.flushing = None;
                self.backlog.flush_if_due(&self.manifest, &self.health);
            }
            () = sleep_until(deadline), if deadline.is_some() && !flushing && !self.draining => {
                self.backlog.flush_if_due(&self.manifest, &self.health);
            }
            // Requests waiting for held ranges are looked at again even
            // when no round runs: one held too long is failed (see `deps`).
            () = tokio::time::sleep(HOLD_RECHECK), if !self.waiting.is_empty() => {
                self.waiting = answer_ready(std::mem::take(&mut self.waiting));
            }
        }
        Some(None)
    }

    /// Makes a round durable (flushed, or journaled with its records),
    /// records it, and answers its requests once what they wait for is
    /// recorded too. A failure poisons the sink and fails every request
    /// that waits.
    async fn commit(&mut self, mut round: Vec<Queued>) {
        let times = RoundTimes::of(&round);
        let journaling = journal_or_flush(&mut round, self.backlog.journal_for_round());
        let (targets, pending_flushed) = sync_targets(&round);
        let flushed = targets.len();
        // A flush must find every range in its file: those written beside
        // the round (see `place::beside`) are waited for first. A journaling
        // round still flushes its directories and the files' pending changes
        // (a rename, a new file): the journal holds only ranges.
        // A blocking wait, on the committer's own thread (whose runtime
        // drives nothing else meanwhile): the writes follow their request's
        // submission at once.
        let written = if journaling {
            Ok(())
        } else {
            wait_written(&mut round)
        };
        let flusher = self.backlog.flusher.clone();
        let synced = match written {
            Ok(()) => flusher.flush(targets, SYNC_PARALLELISM).await,
            Err(error) => Err(error),
        };
        if synced.is_ok() {
            forget_flushed(&round, &pending_flushed);
        }
        let synced_after = times.started.elapsed();
        // The journal region is reserved now: the manifest's entries then
        // know where the bytes go and their CRC.
        let journal =
            synced.and_then(
                |()| match (self.backlog.file.as_mut(), &self.backlog.writer) {
                    (Some(file), Some(writer)) if journaling => {
                        reserve_journal_round(file, writer, &mut round)
                    }
                    _ => Ok(JournalRound::default()),
                },
            );
        let reserved_after = times.started.elapsed();
        let Some((round, result)) = self.record(round, journal, times.stages(synced_after)) else {
            return;
        };
        let recorded_after = times.started.elapsed();
        trace_round(
            &round,
            &times,
            flushed,
            [synced_after, reserved_after, recorded_after],
            &result,
        );
        match result {
            Ok(recorded) => self.settle(round, recorded),
            Err(error) => {
                // A round that failed before its records (a flush) stops
                // placement too, which checks the health. Those who wait
                // are told the sink's first reason.
                let reason = format!("a commit round failed: {}", error.into_detail());
                self.health.poison(reason.clone());
                let error =
                    SinkError::Poisoned(self.health.reason().unwrap_or_else(|| reason.into()));
                fail_all(round, &error);
                fail_all(std::mem::take(&mut self.waiting), &error);
            }
        }
    }

    /// Records the round in place, on the committer's own thread (see
    /// [`record_round`]). A panic there poisons the sink and fails what
    /// waits: then there is nothing to return (the round's requests went
    /// with the unwinding).
    fn record(
        &mut self,
        round: Vec<Queued>,
        journal: Result<JournalRound, SinkError>,
        stages: RoundStages,
    ) -> Option<(Vec<Queued>, Result<Recorded, SinkError>)> {
        let manifest = self.manifest.clone();
        let gate = self.gate.clone();
        let counts = self.counts.clone();
        let health = self.health.clone();
        let feed = self.feed.clone();
        let outbox = self.outbox.clone();
        let complete = self.backlog.complete;
        let handed = Instant::now();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _guard = health.guard_thread();
            let blocking_us = handed.elapsed().as_micros() as u64;
            let _timer = StageTimer::start(Stage::Round);
            let mut round = round;
            let result = journal.and_then(|journal| {
                let sink = RoundSink {
                    manifest: &manifest,
                    gate: &gate,
                    counts: &counts,
                    health: &health,
                    feed: &feed,
                    outbox: outbox.as_deref(),
                };
                record_round(&sink, &mut round, journal, complete, stages).map(|mut recorded| {
                    recorded.blocking_us = blocking_us;
                    recorded
                })
            });
            (round, result)
        }));
        match outcome {
            Ok(done) => Some(done),
            Err(panic) => {
                let reason = format!(
                    "the commit round panicked: {}",
                    panic_message(panic.as_ref())
                );
                self.health.poison(reason.clone());
                fail_all(
                    std::mem::take(&mut self.waiting),
                    &SinkError::Poisoned(reason.into()),
                );
                None
            }
        }
    }

    /// After a recorded round: the journal's backlog takes its journaled
    /// files (and starts a background flush when one is due), and its
    /// requests are answered once what they depend on is recorded too.
    fn settle(&mut self, mut round: Vec<Queued>, recorded: Recorded) {
        let backlog = &mut self.backlog;
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
        backlog.flush_if_due(&self.manifest, &self.health);
        self.waiting.extend(round.into_iter().map(|mut queued| {
            queued.request.keep_dependencies_only();
            queued
        }));
        self.waiting = answer_ready(std::mem::take(&mut self.waiting));
    }

    /// Stopping: a background flush in progress ends before its files and
    /// journal go away (what it does not cover, the next start replays).
    async fn finish(mut self) {
        if let Some(flushing) = self.backlog.flushing.take() {
            let _ = flushing.await;
        }
        fail_all(self.waiting, &SinkError::Shutdown);
    }
}

/// A round's trace: where its time went.
fn trace_round(
    round: &[Queued],
    times: &RoundTimes,
    flushed: usize,
    [synced_after, reserved_after, recorded_after]: [Duration; 3],
    result: &Result<Recorded, SinkError>,
) {
    tracing::debug!(
        requests = round.len(),
        waited_us = times.waited_us,
        placing_us = times.placing_us,
        place_us = times.place_us,
        queued_us = times.queued_us,
        flushed,
        journaled = round.iter().map(|q| q.request.journal_bytes).sum::<u64>(),
        sync_us = synced_after.as_micros() as u64,
        reserve_us = (reserved_after - synced_after).as_micros() as u64,
        record_us = (recorded_after - reserved_after).as_micros() as u64,
        told_us = result.as_ref().map_or(0, |r| r.told_us),
        journal_us = result.as_ref().map_or(0, |r| r.journal_us),
        fold_us = result.as_ref().map_or(0, |r| r.fold_us),
        prepare_us = result.as_ref().map_or(0, |r| r.prepare_us),
        written_us = result.as_ref().map_or(0, |r| r.written_us),
        blocking_us = result.as_ref().map_or(0, |r| r.blocking_us),
        gate_us = result.as_ref().map_or(0, |r| r.gate_us),
        manifest_us = result.as_ref().map_or(0, |r| r.manifest_us),
        total_us = times.started.elapsed().as_micros() as u64,
        cpu_totals_us = %crate::stage_cpu::totals_text(),
        "commit round"
    );
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
