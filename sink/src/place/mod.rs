//! Placement: puts each received range at its offset in its destination file,
//! applies control rows (open, rename, seal), and hands the result to the
//! group committer. Nothing here acknowledges: the ack waits for the commit.
//!
//! State per file generation lives in a [`Slot`]: the record as the manifest
//! will hold it, the ranges written but not yet committed (`pending`), and a
//! cached file descriptor (with a second one for direct writes of large
//! ranges, see [`crate::durability::direct`]). A range already placed or pending is never
//! written again; only the parts nobody wrote are.
//!
//! Small ranges go to the journal as well: they are durable once the
//! commit's journal and manifest writes are, and their files are flushed later
//! in the background. A few hundred appends to a hundred files then cost one
//! flush of the manifest instead of a hundred file flushes; after a crash,
//! [`Placer::replay_journal`] writes them back before the sink serves.
//! Their writes are made once the batch's request is submitted, so that
//! its round journals them meanwhile (see `beside`).
//! Every range is written in order: a file never grows past a hole, and
//! a range that arrives ahead of the bytes before it waits in memory (see
//! `data`).
//!
//! Here: the [`Placer`], the lookup of a file's slot, and the walk over a
//! batch's rows. Beside it, parts that each own their state: `sources`
//! (the sources served, each with its path indexes), `holds` (the budget
//! of ranges held ahead of the bytes before them), `fds` (the cache of
//! open files, within the process's descriptors) and `write` (writing a
//! range in place, its large middle directly). The placer's own work, by
//! kind: `data` (ranges), `beside` (small ranges' writes made after their
//! request's submission, and the room they are written into),
//! `generation` (slots, new and superseded generations), `rename` (moves
//! and their intents), `seal`, `record` (records durable ahead of their
//! batch's round) and `replay` (the journal at startup).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use flight_server::{Ack, RangeBatch, RejectedRow, Row, RowKind};
use manifest_db::{FileId, IntervalSet, SinkManifest};

use crate::SinkError;
use crate::commit::Committer;
use crate::config::{Layout, SupersededPolicy};
use crate::confine::{ConfineError, Root};
use crate::durability::direct::DirectFile;
use crate::health::Health;
use crate::lock_order::{Guard, Rank, Ranked};
use crate::state::{CommitGate, CommitRequest, DependencyCharge, Slot, SlotState, lock};
use crate::written_crc::WrittenCrc;

mod beside;
mod data;
mod descriptors;
mod fds;
mod generation;
mod holds;
mod moves;
mod record;
mod rename;
mod replay;
mod seal;
mod sources;
#[cfg(test)]
mod tests;
mod write;

pub(crate) use beside::DeferredWrites;
use fds::OpenFiles;
use holds::Holds;
pub(crate) use seal::head_crc;
use sources::{Source, SourceFiles, Sources};
use write::DirectWrites;

/// Everything placement needs; shared by all streams.
pub(crate) struct Placer {
    /// Shared with subscriptions, which read the files under it.
    pub root: Arc<Root>,
    pub manifest: SinkManifest,
    pub layout: Layout,
    pub superseded: SupersededPolicy,
    /// The sources served, loaded on first use.
    sources: Sources,
    /// Destination files kept open between batches, within the process's
    /// descriptor budget, and the new files whose flush is pending.
    open_files: OpenFiles,
    commit_gate: CommitGate,
    pub journal: Journal,
    /// Large ranges' aligned middle, written with O_DIRECT.
    direct: DirectWrites,
    /// Seals compare the digest of the file read back from disk, even when
    /// the checksum of the bytes as written is known.
    seal_read_back: bool,
    /// Poisoned by any failure memory cannot follow: a flush placement makes
    /// itself, a failed round recording a move's intent, a panic.
    pub health: Health,
    /// The manifest's one writer once the sink runs: records changed out of
    /// a batch's own round (a move's intent) are written by a round of
    /// their own. Unset during the startup replay and in unit tests, where
    /// nothing runs beside placement.
    committer: std::sync::OnceLock<Committer>,
    /// Bytes held in memory, waiting for the bytes before them (see `data`).
    holds: Holds,
    /// Ranges that batches not answered yet wait for (see [`DependencyCharge`]).
    waiting_dependencies: Arc<std::sync::atomic::AtomicUsize>,
}

/// Most ranges batches may wait for across the sink (a few tens of bytes
/// each): duplicates of ranges others are writing and ranges held ahead of
/// the bytes before them. What bounds the memory of waiting batches, as a
/// stream's placed batches wait on their own (a watcher's batches rarely
/// wait for more than a few ranges each).
const MAX_WAITING_DEPENDENCIES: usize = 1 << 20;

/// What placement shares with the rest of the sink, given at construction.
pub(crate) struct Shared {
    pub commit_gate: CommitGate,
    pub journal: Journal,
    /// The sink's health (and with it the flusher's: after a failed flush,
    /// the background flush must not trust a later successful one).
    pub health: Health,
}

/// Which ranges go to the manifest's journal.
pub(crate) struct Journal {
    /// Largest range journaled; bigger ones are flushed in place, so bulk
    /// data is written once. 0 turns the journal off.
    pub max_range: u64,
    /// Journaled bytes not yet flushed to their files (kept by the committer).
    pub backlog: Arc<AtomicU64>,
}

struct BatchWork<'b> {
    /// The batch being placed (none for the journal's replay): its ranges'
    /// bytes are shared from it rather than copied.
    batch: Option<&'b RangeBatch>,
    request: CommitRequest,
    /// Writes made once the request is submitted (see `beside`).
    writes: DeferredWrites<'b>,
    ack: Ack,
    /// Slots (by address) this batch moved ahead of their Rename rows.
    renamed: std::collections::HashSet<usize>,
    /// Parts this batch holds in memory, ahead of the bytes before them
    /// (slot, start, end): dropped if the batch fails.
    held: Vec<(Arc<Slot>, u64, u64)>,
    /// Why the batch fails once all its rows are placed (a part it could
    /// not hold within the sink's limit).
    refused: Option<String>,
}

impl BatchWork<'_> {
    /// Nothing placed yet, for the batch numbered `seq` (0 for work that
    /// is not a received batch, such as the journal's replay).
    fn new(seq: u64) -> Self {
        Self {
            batch: None,
            request: CommitRequest::default(),
            writes: DeferredWrites::none(),
            ack: Ack {
                seq,
                ..Ack::default()
            },
            renamed: Default::default(),
            held: Vec::new(),
            refused: None,
        }
    }
}

impl Placer {
    pub fn new(
        root: Root,
        manifest: SinkManifest,
        layout: Layout,
        superseded: SupersededPolicy,
        max_open_files: usize,
        shared: Shared,
    ) -> Self {
        let Shared {
            commit_gate,
            journal,
            health,
        } = shared;
        Self {
            journal,
            commit_gate,
            root: Arc::new(root),
            sources: Sources::new(manifest.clone(), layout),
            manifest,
            layout,
            superseded,
            open_files: OpenFiles::new(max_open_files, health.clone()),
            direct: DirectWrites::default(),
            seal_read_back: false,
            health,
            committer: std::sync::OnceLock::new(),
            holds: Holds::new(),
            waiting_dependencies: Default::default(),
        }
    }

    /// Bounds the bytes held in memory ahead of the bytes before them; a
    /// batch that would hold more is refused as retryable. 0 holds nothing:
    /// every range is written where it belongs as it arrives, and a file
    /// may grow past a hole for a while.
    pub fn with_hold_limit(mut self, limit: u64) -> Self {
        self.holds.set_limit(limit);
        self
    }

    /// Bytes held in memory now, ahead of the bytes before them.
    pub fn held_bytes(&self) -> u64 {
        self.holds.held_bytes()
    }

    /// Bytes written with O_DIRECT, and those of them staged first.
    pub(crate) fn direct_figures(&self) -> crate::durability::direct::DirectFigures {
        self.direct.figures()
    }

    /// From now on, records written ahead of a batch's round go through
    /// `committer`'s rounds. Called once, after the startup replay.
    pub fn attach_committer(&self, committer: Committer) {
        let _ = self.committer.set(committer);
    }

    /// Writes the aligned middle of ranges of at least `min` bytes with
    /// O_DIRECT (0: never); see [`crate::durability::direct`].
    pub fn with_direct_writes(mut self, min: u64) -> Self {
        self.direct = DirectWrites::new(min);
        self
    }

    /// Makes seals read every file back from disk to compare its digest,
    /// instead of trusting the CRC-64 of the bytes as they were written.
    pub fn with_seal_read_back(mut self, read_back: bool) -> Self {
        self.seal_read_back = read_back;
        self
    }

    /// The source's state, loaded from the manifest on first use.
    pub fn source(&self, name: &str) -> Result<Arc<Source>, SinkError> {
        self.sources.source(name)
    }

    /// Holds off commit rounds while held. A round holds it from before its
    /// records are written until its journal write and its deferred writes
    /// are done too; it says why
    /// the sink stopped if a round failed meanwhile.
    pub fn commit_gate(&self) -> Guard<'_, ()> {
        lock(&self.commit_gate)
    }

    /// The commit gate, unless the sink is poisoned (then it refuses work
    /// until it is restarted). Checked under the gate: a round that fails
    /// poisons the health before it lets go.
    fn open_gate(&self) -> Result<Guard<'_, ()>, RowError> {
        let gate = lock(&self.commit_gate);
        match self.health.reason() {
            Some(reason) => Err(RowError::Storage(format!(
                "sink storage failed earlier, restart it: {reason}"
            ))),
            None => Ok(gate),
        }
    }

    /// Destination path of a source-relative path, relative to the root.
    fn dest(&self, source: &Source, path: &str) -> String {
        match self.layout {
            Layout::PerSource => format!("{}/{path}", source.name),
            Layout::Flat => path.to_owned(),
        }
    }

    /// Places one batch (blocking I/O), every range written before this
    /// returns. Returns the commit to wait for and the ack to send once it
    /// is durable. (The sink places with [`Self::place_beside`].)
    #[cfg(test)]
    pub fn place(
        &self,
        source: &Source,
        seq: u64,
        batch: &RangeBatch,
    ) -> Result<(CommitRequest, Ack), SinkError> {
        let Placed { request, ack, .. } = self.place_with(source, seq, batch, false)?;
        Ok((request, ack))
    }

    /// [`Self::place`], with the small ranges' writes left to after the
    /// request's submission where they can be (see `beside`): the caller
    /// submits the request, then finishes the writes, which the round waits
    /// for before it tells anyone of them.
    pub fn place_beside<'b>(
        &self,
        source: &Source,
        seq: u64,
        batch: &'b RangeBatch,
    ) -> Result<Placed<'b>, SinkError> {
        self.place_with(source, seq, batch, true)
    }

    fn place_with<'b>(
        &self,
        source: &Source,
        seq: u64,
        batch: &'b RangeBatch,
        beside: bool,
    ) -> Result<Placed<'b>, SinkError> {
        self.open_files.ease_pressure()?;
        let mut work = BatchWork::new(seq);
        work.batch = Some(batch);
        if beside {
            work.writes = DeferredWrites::beside(self.health.clone());
        }
        for (index, row) in batch.rows().enumerate() {
            let context = |e: String| {
                format!(
                    "batch {seq} row {index} ('{}' generation {}): {e}",
                    row.file_key, row.generation
                )
            };
            let result = match row.kind {
                RowKind::Data => self.place_data(source, &row, &mut work),
                RowKind::Open => self.open_generation(source, &row, &mut work),
                RowKind::Rename => self
                    .rename_run_at(source, batch, index, &mut work)
                    .and_then(|()| self.rename(source, &row, &mut work)),
                RowKind::Seal => self.seal(source, &row, &mut work),
            };
            let failure = match result {
                Ok(()) => continue,
                Err(RowError::Reject(error)) => {
                    work.ack.rejected.push(RejectedRow {
                        row: index,
                        error: context(error),
                        superseded: false,
                    });
                    continue;
                }
                Err(RowError::Superseded(error)) => {
                    work.ack.rejected.push(RejectedRow {
                        row: index,
                        error: context(error),
                        superseded: true,
                    });
                    continue;
                }
                Err(RowError::Peer(error)) => SinkError::Peer(context(error)),
                Err(RowError::Storage(error)) => SinkError::Storage(context(error)),
            };
            self.give_back(&mut work);
            return Err(failure);
        }
        if !work.request.dependencies.is_empty() && work.refused.is_none() {
            match DependencyCharge::take(
                &self.waiting_dependencies,
                work.request.dependencies.len(),
                MAX_WAITING_DEPENDENCIES,
            ) {
                Ok(charge) => work.request.dependency_charge = Some(charge),
                Err(waiting) => {
                    work.refused = Some(format!(
                        "it waits for {} ranges other batches are writing, and {waiting} such ranges wait already (limit {MAX_WAITING_DEPENDENCIES}); the batch is sent again",
                        work.request.dependencies.len()
                    ))
                }
            }
        }
        if let Some(reason) = work.refused.take() {
            self.give_back(&mut work);
            return Err(SinkError::Storage(format!("batch {seq}: {reason}")));
        }
        // Counted by the batch whose round records them: a range held for
        // another batch counts when that batch writes it.
        work.request.counters.placed_bytes = work
            .request
            .placed
            .iter()
            .flat_map(|(_, ranges)| ranges.iter().map(|(start, end)| end - start))
            .sum();
        work.request.counters.duplicate_bytes = work.ack.duplicate;
        work.request.written = work.writes.done();
        Ok(Placed {
            request: work.request,
            ack: work.ack,
            writes: work.writes,
        })
    }

    /// Undoes what a failed batch claimed: what it wrote (or was to write)
    /// will not be recorded (others must not wait for it, and a re-delivery
    /// writes it again, at or below the file's end), and what it held is
    /// dropped.
    fn give_back(&self, work: &mut BatchWork<'_>) {
        // Its deferred writes are made like any other: the file's end
        // counts them already. (A failure poisons the sink.)
        let _ = work.writes.write_all();
        for (slot, ranges) in &work.request.placed {
            let mut state = lock(&slot.state);
            for &(start, end) in ranges {
                state.pending.remove(start, end);
            }
        }
        self.holds.drop_failed(&work.held);
    }

    /// The slot of (key, generation), from memory or from the manifest.
    fn lookup(
        &self,
        source: &Source,
        files: &mut SourceFiles,
        key: &str,
        generation: u64,
    ) -> Result<Option<Arc<Slot>>, RowError> {
        if let Some(slot) = files.slots.get(&sources::SlotLookup(key, generation)) {
            return Ok(Some(slot.clone()));
        }
        let id = FileId {
            source: source.name.clone(),
            key: key.to_owned(),
            generation,
        };
        let record = self
            .manifest
            .get(&id)
            .map_err(|e| RowError::Storage(format!("reading the manifest: {e}")))?;
        let Some(record) = record else {
            return Ok(None);
        };
        let slot = Arc::new(Slot {
            id,
            state: Ranked::new(
                Rank::SlotState,
                SlotState {
                    recorded: true,
                    recorded_sealed: record.sealed.is_some(),
                    // Where the feed last told the file was: a move recorded
                    // and not made yet (a crash between) is told once a round
                    // records it made.
                    recorded_path: Some(
                        record
                            .renamed_from
                            .clone()
                            .or_else(|| record.untold_from.clone())
                            .unwrap_or_else(|| record.dest_path.clone()),
                    ),
                    recorded_superseded: record.superseded,
                    moving: false,
                    // Set from the file when it is first opened.
                    file_end: 0,
                    held: Default::default(),
                    // Bytes placed by an earlier run are vouched for only by the
                    // file itself.
                    written_crc: WrittenCrc::new(record.placed.is_empty()),
                    inode: None,
                    room: Default::default(),
                    record,
                    pending: IntervalSet::new(),
                    disk_len: None,
                    file: None,
                    direct: DirectFile::NotOpened,
                },
            ),
            unsynced: Ranked::new(Rank::Unsynced, Vec::new()),
            writing: Default::default(),
        });
        files.cache((key.to_owned(), generation), slot.clone());
        Ok(Some(slot))
    }
}

/// A placed batch: its commit request, its ack once that is durable, and
/// the writes to finish once the request is submitted.
pub(crate) struct Placed<'b> {
    pub request: CommitRequest,
    pub ack: Ack,
    pub writes: DeferredWrites<'b>,
}

/// How one row failed.
enum RowError {
    /// Refuse this row only, in the ack.
    Reject(String),
    /// Refuse this row only: its generation was replaced by a newer one.
    Superseded(String),
    /// Fail the batch: the peer sent something invalid.
    Peer(String),
    /// Fail the batch: storage failed.
    Storage(String),
}

/// Descriptors ran short: the batch is sent again once there are some.
impl From<descriptors::DescriptorsShort> for RowError {
    fn from(short: descriptors::DescriptorsShort) -> Self {
        RowError::Storage(short.to_string())
    }
}

impl RowError {
    fn into_message(self) -> String {
        match self {
            RowError::Reject(m)
            | RowError::Superseded(m)
            | RowError::Peer(m)
            | RowError::Storage(m) => m,
        }
    }
}

/// A control row's path, which must be there and stay under the root.
fn confined_path<'a>(row: &Row<'a>, missing: &str) -> Result<&'a str, RowError> {
    let path = row.path.ok_or_else(|| RowError::Peer(missing.into()))?;
    crate::confine::components(path).map_err(|e| RowError::Peer(e.to_string()))?;
    Ok(path)
}

fn confine_error(e: ConfineError) -> RowError {
    if e.is_peer_error() {
        RowError::Peer(e.to_string())
    } else {
        RowError::Storage(e.to_string())
    }
}
