//! The journal's backlog: files whose journaled ranges are durable in the
//! journal but not yet in the files themselves, flushed in the background
//! (after [`FLUSH_AFTER`] or once [`FLUSH_AT_BYTES`] wait) before their
//! journal space is given back; and the thread that writes journal rounds.

use std::collections::HashMap;
use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use manifest_db::SinkManifest;

use crate::blocking::run_blocking;
use crate::durability::flush::{Flusher, SyncTarget};
use crate::durability::journal::{JournalFile, JournalSpace, RoundWrite};
use crate::error::{SinkError, panic_message};
use crate::health::Health;
use crate::stage_cpu::{Stage, StageTimer};

/// The journal file, and what bounds the files waiting for its background flush.
pub(crate) struct CommitJournal {
    pub file: Option<JournalFile>,
    /// Journaled bytes whose files are not flushed yet (placement reads it).
    pub backlog_bytes: Arc<AtomicU64>,
    /// A background flush starts once this many files wait for one: each
    /// keeps its descriptor open until then, beyond the placement's cache.
    pub flush_at_files: usize,
}

/// Journaled files are flushed at the latest this long after their first
/// range (their rounds hold journal space until then; a replay after a
/// machine crash writes back what they hold: with a flush running late, up
/// to the whole journal file). Each flush costs the disk a cache flush per
/// file, on top of the rounds' own, and the rounds' fdatasyncs queue behind
/// them: flushing more often hurts the latency it was meant to help
/// (docs/measurements.md)...
pub(super) const FLUSH_AFTER: Duration = Duration::from_millis(400);

/// ...or once the rounds waiting hold this much of the journal file (their
/// regions: ranges, headers and manifest batches): a quarter of it, so
/// rounds keep finding room while a flush runs. Counting only the ranges
/// would let rounds of tiny appends, mostly header and batch, fill the
/// file first, and rounds would then flush in place.
pub(super) const FLUSH_AT_BYTES: u64 = crate::durability::journal::JOURNAL_FILE_BYTES / 4;

/// The journal file, and the journal rounds whose files still need a flush.
pub(super) struct Backlog {
    /// Rounds reserve their regions in it, one round at a time.
    pub(super) file: Option<JournalFile>,
    pub(super) rounds: Vec<u64>,
    /// Keyed by address: each file once, however many ranges it got.
    pub(super) files: HashMap<usize, Arc<File>>,
    /// Range bytes of the rounds waiting (what their files must write back).
    pub(super) bytes: u64,
    /// Journal space the rounds waiting hold.
    pub(super) held: u64,
    pub(super) since: Option<Instant>,
    /// `bytes` of this backlog and of flushes under way, for placement to see.
    pub(super) shared_bytes: Arc<AtomicU64>,
    /// The flush under way, until the committer has seen it end: flushes
    /// run one at a time, so journal space is given back in order.
    pub(super) flushing: Option<tokio::task::JoinHandle<()>>,
    pub(super) flusher: Flusher,
    /// Journal space to give back after a flush, up to where the last round
    /// added to the backlog starts: that round's region stays, so that the
    /// newest round the manifest holds durably is always still there, for
    /// the startup to find the rounds after it (see `journal::redo_lost_rounds`).
    pub(super) space: Option<JournalSpace>,
    pub(super) last_round_start: u64,
    pub(super) flush_at_files: usize,
    /// Writes each round's journal bytes while the round writes its records.
    pub(super) writer: Option<JournalWriter>,
    /// The last journal round whose bytes were durable: the next commit says so.
    pub(super) complete: u64,
}

/// A thread of its own for journal writes: a round waits for its write on a
/// blocking thread, and must not depend on another one being free. Owned by
/// the committer and joined when it goes away; a panic in it poisons the sink.
pub(super) struct JournalWriter {
    pub(super) jobs: Option<std::sync::mpsc::Sender<JournalJob>>,
    pub(super) thread: Option<std::thread::JoinHandle<()>>,
}

pub(super) struct JournalJob {
    pub(super) write: RoundWrite,
    pub(super) ranges: Vec<crate::state::JournalRange>,
    /// The round's manifest batch once it is built (empty if the manifest
    /// writes it synced): the ranges are written meanwhile.
    pub(super) batch: std::sync::mpsc::Receiver<Vec<u8>>,
    /// Answers how long the write took from the batch on (µs), and where
    /// the round ends.
    pub(super) done: std::sync::mpsc::SyncSender<JournalWritten>,
}

pub(super) type JournalWritten = Result<(u64, u64), SinkError>;

/// Writes a round's ranges, then, once the round sends it, its manifest
/// batch and header, durably.
pub(super) fn write_journal_round(job: &JournalJob) -> JournalWritten {
    let pieces: Vec<&[u8]> = job.ranges.iter().map(|r| r.bytes.as_slice()).collect();
    let failed = |e: std::io::Error| {
        SinkError::storage(
            format_args!(
                "writing {} ranges to the journal file {}",
                pieces.len(),
                job.write.path().display()
            ),
            e,
        )
    };
    let ranges_crc = job.write.write_ranges(&pieces).map_err(failed)?;
    let batch = job
        .batch
        .recv()
        // The round ended without its batch: it failed, and says why itself.
        .map_err(|_| {
            SinkError::Internal(
                "the commit round failed before its journal write ended".to_string(),
            )
        })?;
    let sealing = Instant::now();
    let end = job.write.seal(ranges_crc, &batch).map_err(failed)?;
    Ok((sealing.elapsed().as_micros() as u64, end))
}

impl JournalWriter {
    pub(super) fn spawn(health: Health) -> std::io::Result<Self> {
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

    pub(super) fn send(&self, job: JournalJob) -> Result<(), SinkError> {
        self.jobs
            .as_ref()
            .and_then(|jobs| jobs.send(job).ok())
            .ok_or_else(|| SinkError::Internal("the journal writer thread has stopped".to_string()))
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
    pub(super) fn new(journal: CommitJournal, flusher: Flusher, health: Health) -> Self {
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
    pub(super) fn add(
        &mut self,
        round: Option<(u64, u64, u64)>,
        bytes: u64,
        files: Vec<Arc<File>>,
    ) {
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
    pub(super) fn journal_for_round(&self) -> Option<&JournalFile> {
        self.file
            .as_ref()
            .filter(|_| self.files.len() < self.flush_at_files)
    }

    pub(super) fn deadline(&self) -> Option<tokio::time::Instant> {
        self.since.map(|since| (since + FLUSH_AFTER).into())
    }

    /// Starts a flush of everything waiting, if one is due and none is running.
    pub(super) fn flush_if_due(&mut self, manifest: &SinkManifest, health: &Health) {
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
        let flushing = async move {
            #[cfg(test)]
            for target in &targets {
                if let SyncTarget::File(file) = target
                    && crate::fault::io(
                        crate::fault::Point::BackgroundFlush,
                        crate::durability::flush::describe(file.as_ref()),
                    )
                    .is_err()
                {
                    panic!("a panic injected into the background flush");
                }
            }
            // Few flushes at a time: this one is in no hurry, and the
            // commit rounds' manifest flushes must not queue behind it.
            match flusher
                .flush_in_background(targets, BACKGROUND_SYNC_PARALLELISM)
                .await
            {
                // Another flush failing meanwhile may have taken the error
                // of one of these files: their entries must stay.
                Ok(()) if flusher.has_failed() => Err(SinkError::Storage(
                    "another flush failed; journal entries are kept for the replay".to_string(),
                )),
                Ok(()) => run_blocking(move || {
                    let count = rounds.len();
                    manifest.forget_journal(&rounds).map_err(|e| {
                        SinkError::storage(
                            format_args!("dropping the entries of {count} flushed journal rounds"),
                            e,
                        )
                    })
                })
                .await
                .unwrap_or_else(|e| Err(e.context("the journal flush"))),
                Err(e) => Err(e),
            }
        };
        self.flushing = Some(tokio::spawn(async move {
            // A panic (a bug) is a failure like any other: it poisons the
            // sink with its reason, and the entries stay for the replay.
            use futures::FutureExt;
            let result = std::panic::AssertUnwindSafe(flushing)
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| {
                    Err(SinkError::Internal(format!(
                        "the background flush panicked: {}",
                        panic_message(panic.as_ref())
                    )))
                });
            match result {
                Ok(()) => {
                    shared_bytes.fetch_sub(bytes, Ordering::Relaxed);
                    if let Some((space, end)) = release {
                        space.release_to(end);
                    }
                }
                Err(error) => {
                    health.poison(format!("flushing journaled files: {}", error.into_detail()));
                }
            }
        }));
    }
}

/// Most flushes the background journal flush issues at once.
pub(super) const BACKGROUND_SYNC_PARALLELISM: usize = 2;

/// The end of the background flush under way; never, when none is.
pub(super) async fn flush_ended(flushing: &mut Option<tokio::task::JoinHandle<()>>) {
    match flushing {
        Some(task) => {
            // Its own failures and panics poisoned the sink (the entries
            // stay); it is never aborted.
            let _ = task.await;
        }
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::confine::Root;
    use crate::durability::flush::SyncStrategy;
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
