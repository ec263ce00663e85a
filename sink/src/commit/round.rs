//! One commit round's record: what it flushes, the records it folds and
//! writes under the gate, and what it tells the feed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use manifest_db::{FileId, SinkCommit, SinkManifest};

use super::backlog::JournalWritten;
use super::journal_round::{JournalRound, PendingJournalWrite};
use super::queued::Queued;
use crate::durability::flush::SyncTarget;
use crate::error::{SinkError, panic_message};
use crate::feed::{CommitFeed, FileChange, FileCommit, RoundStages};
use crate::health::Health;
use crate::state::{CommitGate, FileCounts, Slot, lock};

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

/// Waits until every request's ranges written beside the round are in
/// their files (see `place::beside`).
pub(crate) fn wait_written(round: &mut [Queued]) -> Result<(), SinkError> {
    round
        .iter_mut()
        .try_for_each(|queued| queued.request.wait_written())
}

/// What a round recorded.
pub(super) struct Recorded {
    /// Per file, what the round made durable (only if the feed has listeners).
    pub(super) feed: Option<Vec<FileCommit>>,
    /// The last outbox event the round recorded, and the outbox bytes its
    /// events take.
    pub(super) outbox: Option<(u64, u64)>,
    /// How long building and writing the manifest batch took (synced only
    /// when the round journals nothing), and then the journal's write of
    /// that batch and its fdatasync (its ranges were written meanwhile).
    pub(super) journal_us: u64,
    pub(super) manifest_us: u64,
    /// Of which building the batch (the rest is RocksDB's write).
    pub(super) prepare_us: u64,
    /// Folding the round's ranges into the records, before that.
    pub(super) fold_us: u64,
    /// After all that: waiting for the ranges written beside the round
    /// (see `place::beside`).
    pub(super) written_us: u64,
    /// Before all that: from the hand-off until the round ran (in place, or
    /// on the blocking pool under a current-thread runtime), then waiting
    /// for the commit gate.
    pub(super) blocking_us: u64,
    pub(super) gate_us: u64,
    /// The journal round written, if any (its number, where it starts and
    /// ends in the journal), and its bytes.
    pub(super) journal_round: Option<(u64, u64, u64)>,
    pub(super) journal_bytes: u64,
    /// When the round became durable (its journal write ended, or its
    /// manifest write without one), and from then until the feed was told
    /// (µs).
    pub(super) durable_at: Option<Instant>,
    pub(super) told_us: u64,
}

/// What a round records into, and whom it tells of a failure.
pub(super) struct RoundSink<'a> {
    pub(super) manifest: &'a SinkManifest,
    pub(super) gate: &'a CommitGate,
    pub(super) counts: &'a FileCounts,
    pub(super) health: &'a Health,
    /// Told of the round under the gate, once it is durable.
    pub(super) feed: &'a CommitFeed,
    /// Takes the round's events in its manifest write, when the sink
    /// records events.
    pub(super) outbox: Option<&'a crate::outbox::Outbox>,
}

/// What a round's record of a file tells the feed's listeners, against what
/// the manifest held of it before (kept in the slot's state).
/// What a round made durable of one file, for the feed.
#[derive(Default)]
pub(super) struct Made {
    ranges: manifest_db::IntervalSet,
    /// When the last of the batches that brought them reached the sink.
    received: Option<std::time::SystemTime>,
}

pub(super) fn describe_commit(
    id: &FileId,
    before: &crate::state::SlotState,
    record: &manifest_db::FileRecord,
    made: Made,
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
        ranges: made.ranges.ranges().to_vec(),
        contiguous_end: record.placed.contiguous_end(),
        changes,
        received: made.received,
        inode: before.inode,
        sealed: record.sealed.clone(),
    }
}

/// Where a record's file lives: a move whose intent is recorded and which
/// is not made yet leaves it at its old name, and the feed tells of the
/// rename with the round that records it made.
pub(super) fn path_on_disk(record: &manifest_db::FileRecord) -> &str {
    record.renamed_from.as_deref().unwrap_or(&record.dest_path)
}

/// Records a round whose bytes are durable (flushed), or become durable in
/// the journal while its records are written: it returns only once both are.
pub(super) fn record_round(
    sink: &RoundSink<'_>,
    round: &mut [Queued],
    journal: JournalRound,
    journal_complete: u64,
    stages: RoundStages,
) -> Result<Recorded, SinkError> {
    // Snapshots and their write happen under the gate, which is also what
    // the journal replay writes records under before the committer runs.
    // It is held until the journal write is done too, and the writes made
    // beside the round (see `place::beside`); a failure (or a panic)
    // poisons the sink and the gate before it is let go: whoever writes or
    // reads records under it (renames, watermarks) never sees ranges whose
    // bytes may still be lost or not yet in their files.
    let asking = Instant::now();
    let _gate = lock(sink.gate);
    let gate_us = asking.elapsed().as_micros() as u64;
    if let Some(reason) = sink.health.reason() {
        // Placement stopped the sink (a failed flush) while this round ran.
        return Err(SinkError::Poisoned(reason));
    }
    let recorded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        record_round_under_gate(sink, round, journal, journal_complete)
            // Written beside the round: told of once they are in their files.
            .and_then(|mut recorded| {
                let waiting = Instant::now();
                wait_written(round)?;
                recorded.written_us = waiting.elapsed().as_micros() as u64;
                Ok(recorded)
            })
    }))
    .unwrap_or_else(|panic| {
        Err(SinkError::Internal(format!(
            "the commit round panicked: {}",
            panic_message(panic.as_ref())
        )))
    });
    match recorded {
        Ok(mut recorded) => {
            // Still under the gate: a snapshot read under it either holds
            // this round or names the round before it.
            let stages = RoundStages {
                manifest_us: recorded.manifest_us,
                journal_us: recorded.journal_us,
                ..stages
            };
            sink.feed.recorded(recorded.feed.take(), stages);
            if let (Some(outbox), Some((last, bytes))) = (sink.outbox, recorded.outbox) {
                outbox.recorded(last, bytes);
            }
            recorded.told_us = recorded
                .durable_at
                .map_or(0, |at| at.elapsed().as_micros() as u64);
            recorded.gate_us = gate_us;
            Ok(recorded)
        }
        Err(error) => {
            sink.health.poison(format!(
                "a commit round failed: {}",
                error.clone().into_detail()
            ));
            Err(error)
        }
    }
}

pub(super) fn record_round_under_gate(
    sink: &RoundSink<'_>,
    round: &mut [Queued],
    journal: JournalRound,
    journal_complete: u64,
) -> Result<Recorded, SinkError> {
    let folding = Instant::now();
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
    let listened = sink.feed.has_listeners();
    // What the round makes durable of each file, for the feed's listeners
    // and the round's events.
    let mut made = (listened || sink.outbox.is_some()).then(HashMap::new);
    let touched = fold_ranges(round, &mut commit, made.as_mut());
    // One time for the records and the events.
    let committed_at = SystemTime::now();
    let Snapshot { written, told } =
        snapshot_records(sink, &touched, &mut commit, made, committed_at)?;
    let mut outbox_bytes = 0;
    if let (Some(outbox), Some(told)) = (sink.outbox, told.as_ref()) {
        commit.outbox = outbox.events_of(told, committed_at, journal_round);
        outbox_bytes = commit.outbox.iter().map(crate::outbox::stored_len).sum();
    }
    let writing = Instant::now();
    let fold_us = (writing - folding).as_micros() as u64;
    let ManifestWrite {
        journal_written,
        outbox_last,
        prepare_us,
    } = write_manifest(sink.manifest, &commit, journal_write)?;
    let manifest_us = writing.elapsed().as_micros() as u64;
    let (journal_us, journal_end) = journal_written.map_or(Ok((0, None)), wait_for_journal)?;
    let durable_at = Some(Instant::now());
    for ((slot, sealed), (_, record)) in written.into_iter().zip(&commit.records) {
        let mut state = lock(&slot.state);
        let path = path_on_disk(record);
        if state.recorded_path.as_deref() != Some(path) {
            state.recorded_path = Some(path.to_owned());
        }
        state.record.untold_from = None;
        state.recorded_superseded = record.superseded;
        sink.counts.committed(&mut state, sealed);
    }
    Ok(Recorded {
        feed: told.filter(|_| listened),
        outbox: outbox_last.map(|last| (last, outbox_bytes)),
        journal_us,
        manifest_us,
        prepare_us,
        fold_us,
        written_us: 0,
        blocking_us: 0,
        gate_us: 0,
        journal_round: journal_end.map(|end| (commit.journal_round, commit.journal_start, end)),
        journal_bytes: journaled_bytes(&commit),
        durable_at,
        told_us: 0,
    })
}

/// Folds the round's ranges into their files' records (in memory) and the
/// commit's placements and counters; notes what each file got in `made`.
/// Returns every file the round touched.
fn fold_ranges<'r>(
    round: &'r [Queued],
    commit: &mut SinkCommit,
    mut made: Option<&mut HashMap<*const Slot, Made>>,
) -> HashMap<*const Slot, &'r Arc<Slot>> {
    let mut touched: HashMap<*const Slot, &Arc<Slot>> = HashMap::new();
    for queued in round {
        let request = &queued.request;
        for (slot, ranges) in &request.placed {
            let mut state = lock(&slot.state);
            if let Some(made) = made.as_deref_mut() {
                let made = made.entry(Arc::as_ptr(slot)).or_default();
                for &(start, end) in ranges {
                    made.ranges.insert(start, end);
                }
                made.received = made.received.max(request.received);
            }
            for &(start, end) in ranges {
                state.record.placed.insert(start, end);
                commit
                    .placements
                    .push((slot.id.clone(), start, end - start));
            }
            for &(start, end) in ranges {
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
    touched
}

/// The records a round wrote, and what it tells of them.
struct Snapshot<'r> {
    /// Each file, and whether it is sealed.
    written: Vec<(&'r Arc<Slot>, bool)>,
    /// What the round tells of each file (when someone listens, or events
    /// are recorded).
    told: Option<Vec<FileCommit>>,
}

/// The records of the files the round touched, as they are now, into the
/// commit: each file's pending flushes done first.
fn snapshot_records<'r>(
    sink: &RoundSink<'_>,
    touched: &HashMap<*const Slot, &'r Arc<Slot>>,
    commit: &mut SinkCommit,
    mut made: Option<HashMap<*const Slot, Made>>,
    committed_at: SystemTime,
) -> Result<Snapshot<'r>, SinkError> {
    let mut written = Vec::with_capacity(touched.len());
    let committed_unix_ms = committed_at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64);
    let mut told = made.as_ref().map(|_| Vec::with_capacity(touched.len()));
    for &slot in touched.values() {
        let state = lock(&slot.state);
        // Whatever the round's flush did not cover (a move made since, by a
        // batch that has not reached a round): the record must not outrun
        // it. Under the slot's state, which every move holds while it makes
        // its change and queues its flush.
        let mut unsynced = lock(&slot.unsynced);
        while let Some(pending) = unsynced.first() {
            pending.target.sync().inspect_err(|error| {
                sink.health.poison(error.clone().into_detail());
            })?;
            unsynced.remove(0);
        }
        drop(unsynced);
        let mut record = state.record.clone();
        record.committed_unix_ms = Some(committed_unix_ms);
        // This round tells whatever move is still untold (see describe_commit).
        record.untold_from = None;
        if let (Some(told), Some(made)) = (told.as_mut(), made.as_mut()) {
            let made = made.remove(&Arc::as_ptr(slot)).unwrap_or_default();
            let commit = describe_commit(&slot.id, &state, &record, made);
            // A file recorded again with nothing new (a duplicate batch, a
            // move's intent, a seal sent again) is not news to listeners.
            if !commit.ranges.is_empty() || !commit.changes.is_empty() {
                told.push(commit);
            }
        }
        drop(state);
        written.push((slot, record.sealed.is_some()));
        commit.records.push((slot.id.clone(), record));
    }
    Ok(Snapshot { written, told })
}

/// A round's manifest write under way.
struct ManifestWrite {
    /// The journal write's answer, to wait for.
    journal_written: Option<std::sync::mpsc::Receiver<JournalWritten>>,
    /// The last outbox event the batch holds.
    outbox_last: Option<u64>,
    /// How long building the batch took (µs).
    prepare_us: u64,
}

/// Writes the round's manifest batch. A journal round carries the batch
/// too, and the manifest writes it without a sync of its own: one
/// fdatasync makes the round durable, and the startup redoes a batch a
/// machine crash lost.
fn write_manifest(
    manifest: &SinkManifest,
    commit: &SinkCommit,
    journal_write: Option<PendingJournalWrite>,
) -> Result<ManifestWrite, SinkError> {
    let preparing = Instant::now();
    let recording = |e: manifest_db::Error| {
        SinkError::storage(
            format_args!("recording {} ranges", commit.placements.len()),
            e,
        )
    };
    let prepared = manifest.prepare(commit).map_err(recording)?;
    let outbox_last = prepared.outbox_last();
    let prepare_us = preparing.elapsed().as_micros() as u64;
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
    Ok(ManifestWrite {
        journal_written,
        outbox_last,
        prepare_us,
    })
}

/// Waits for the round's journal write: how long it took from the batch on
/// (µs), and where the round ends in the journal. Nothing of the round is
/// acknowledged before it ends. A process crash before then may leave its
/// entries recorded with bytes that fail their CRC: the replay withdraws
/// them. A machine crash may also lose the manifest write: then the round
/// is simply not recorded, unless its journal write had ended, and the
/// startup redoes it.
fn wait_for_journal(
    written: std::sync::mpsc::Receiver<JournalWritten>,
) -> Result<(u64, Option<u64>), SinkError> {
    let (us, end) = written.recv().unwrap_or_else(|_| {
        Err(SinkError::Internal(
            "the journal writer thread died (panicked) before it answered".to_string(),
        ))
    })?;
    Ok((us, Some(end)))
}

/// The bytes the round put in the journal.
fn journaled_bytes(commit: &SinkCommit) -> u64 {
    commit
        .journal
        .iter()
        .map(|(_, _, bytes)| match bytes {
            manifest_db::JournalBytes::InFile { len, .. } => u64::from(*len),
            manifest_db::JournalBytes::Inline(bytes) => bytes.len() as u64,
        })
        .sum()
}
