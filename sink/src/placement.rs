//! Placement: puts each received range at its offset in its destination file,
//! applies control rows (open, rename, seal), and hands the result to the
//! group committer. Nothing here acknowledges: the ack waits for the commit.
//!
//! State per file generation lives in a [`Slot`]: the record as the manifest
//! will hold it, the ranges written but not yet committed (`pending`), and a
//! cached file descriptor (with a second one for direct writes of large
//! ranges, see [`crate::direct`]). A range already placed or pending is never
//! written again; only the parts nobody wrote are.
//!
//! Small ranges go to the journal as well: they are durable once the
//! commit's journal and manifest writes are, and their files are flushed later
//! in the background. A few hundred appends to a hundred files then cost one
//! flush of the manifest instead of a hundred file flushes; after a crash,
//! [`Placer::replay_journal`] writes them back before the sink serves.
//! Their writes into their files are deferred until the batch is handed to
//! the committer ([`DeferredWrites`]), so they overlap its journal round.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use flight_server::{Ack, RangeBatch, RejectedRow, Row, RowKind, SealDigest, checksum};
use manifest_db::{
    FileId, FileRecord, IntervalSet, JournalBytes, Sealed, SinkCommit, SinkManifest,
};

use crate::SinkError;
use crate::commit::Committer;
use crate::confine::{ConfineError, Root, SettledMove};
use crate::direct::{self, DirectFile};
use crate::health::Health;
use crate::state::{CommitGate, CommitRequest, Dependency, Slot, SlotState, lock};
use crate::written_crc::WrittenCrc;
use crate::{Layout, SupersededPolicy};

/// Writes a range at its offset; the error names the destination (asked
/// for only then).
fn write_range(
    file: &File,
    bytes: &[u8],
    offset: u64,
    dest: impl FnOnce() -> String,
) -> Result<(), String> {
    file.write_all_at(bytes, offset).map_err(|e| {
        format!(
            "writing {} bytes at offset {offset} of {}: {e}",
            bytes.len(),
            dest()
        )
    })
}

/// Reads `len` bytes at `offset`, checking first that the file has them
/// (`len` comes from the manifest and is not trusted to allocate).
fn read_exact(file: &File, offset: u64, len: u32) -> std::io::Result<Vec<u8>> {
    let size = file.metadata()?.len();
    if offset.saturating_add(u64::from(len)) > size {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("{offset}+{len} is past the end of the file ({size} bytes)"),
        ));
    }
    let mut bytes = vec![0u8; len as usize];
    file.read_exact_at(&mut bytes, offset)?;
    Ok(bytes)
}

/// Most bytes one batch puts in the journal.
const JOURNAL_BATCH_MAX: u64 = 1 << 20;
/// Journaled bytes whose files are not flushed yet, past which ranges are
/// flushed in place again (the background flush has fallen behind).
const JOURNAL_BACKLOG_MAX: u64 = crate::journal::JOURNAL_FILE_BYTES;

/// Slots kept in memory before sealed, idle ones are dropped.
const SLOT_CACHE: usize = 4096;

#[derive(Default)]
struct SourceFiles {
    /// Sweep the slot cache when it grows past this.
    sweep_above: usize,
    slots: HashMap<(String, u64), Arc<Slot>>,
    /// Live (not superseded) generation at each destination path.
    by_path: HashMap<String, (String, u64)>,
    /// Superseded generations kept aside (`--superseded keep`), by the
    /// path they were moved to: a new file or a rename there moves them on.
    kept: HashMap<String, (String, u64)>,
}

/// Paths of a source a file may still have to leave, or may have left not
/// durably yet: a move of another file there must wait for that move (see
/// [`Placer::moves_away_from`]).
#[derive(Default)]
struct MovedAway {
    /// Moves this process made, by the path they left, with the files moved.
    made: HashMap<String, Vec<Arc<Slot>>>,
    /// Moves an earlier process recorded and may not have made, by the
    /// path they leave: the file's (key, generation).
    recorded: HashMap<String, (String, u64)>,
    /// Sweep `made` of moves already durable when it grows past this.
    sweep_above: usize,
}

/// Moves kept in `MovedAway::made` before the durable ones are dropped.
const MOVED_AWAY_SWEEP: usize = 1024;

impl MovedAway {
    /// Notes that a move took `slot`'s file away from `from`.
    fn made(&mut self, from: String, slot: Arc<Slot>) {
        if self.made.len() >= self.sweep_above.max(MOVED_AWAY_SWEEP) {
            self.made.retain(|_, moved| {
                moved.retain(|slot| !lock(&slot.unsynced).is_empty());
                !moved.is_empty()
            });
            self.sweep_above = 2 * self.made.len();
        }
        let moved = self.made.entry(from).or_default();
        if !moved.iter().any(|known| Arc::ptr_eq(known, &slot)) {
            moved.push(slot);
        }
    }
}

/// Which path index of a source.
#[derive(Clone, Copy)]
enum PathIndex {
    Live,
    Kept,
}

impl SourceFiles {
    fn index(&mut self, which: PathIndex) -> &mut HashMap<String, (String, u64)> {
        match which {
            PathIndex::Live => &mut self.by_path,
            PathIndex::Kept => &mut self.kept,
        }
    }
}

pub(crate) struct Source {
    name: String,
    files: Mutex<SourceFiles>,
    /// Taken on its own, after any other lock (and before `unsynced`).
    moved_away: Mutex<MovedAway>,
}

/// Most sources one sink serves: each keeps some state for the life of the
/// process, and a peer must not make that grow without end. Far more than
/// the beamlines and hutches one sink serves.
const MAX_SOURCES: usize = 4096;

/// A source's state once loaded; locked while it loads.
type SourceCell = Mutex<Option<Arc<Source>>>;

/// Everything placement needs; shared by all streams.
pub(crate) struct Placer {
    pub root: Root,
    pub manifest: SinkManifest,
    pub layout: Layout,
    pub superseded: SupersededPolicy,
    /// Per source, its state once loaded: each behind a lock of its own,
    /// so that loading one source holds up only that source's batches.
    sources: Mutex<HashMap<String, Arc<SourceCell>>>,
    open_files: Mutex<VecDeque<Arc<Slot>>>,
    commit_gate: CommitGate,
    max_open_files: usize,
    pub journal: Journal,
    /// Ranges whose aligned middle holds at least this many bytes write it
    /// with O_DIRECT (0: never).
    direct_min: u64,
    direct_buffers: direct::Buffers,
    /// Seals compare the digest of the file read back from disk, even when
    /// the checksum of the bytes as written is known.
    seal_read_back: bool,
    /// Poisoned by any failure memory cannot follow: a flush placement makes
    /// itself, a failed round recording a move's intent, a panic.
    pub health: Health,
    /// With the flat layout, the one source this sink serves (the first
    /// one seen, in the manifest or on the wire).
    flat_source: Mutex<Option<String>>,
    /// Most sources served at once (their state stays for the process).
    max_sources: usize,
    /// The manifest's one writer once the sink runs: records changed out of
    /// a batch's own round (a move's intent) are written by a round of
    /// their own. Unset during the startup replay and in unit tests, where
    /// nothing runs beside placement.
    committer: std::sync::OnceLock<Committer>,
}

/// Which ranges go to the manifest's journal.
pub(crate) struct Journal {
    /// Largest range journaled; bigger ones are flushed in place, so bulk
    /// data is written once. 0 turns the journal off.
    pub max_range: u64,
    /// Journaled bytes not yet flushed to their files (kept by the committer).
    pub backlog: Arc<AtomicU64>,
}

struct BatchWork {
    request: CommitRequest,
    ack: Ack,
    deferred: DeferredWrites,
    /// Slots (by address) this batch moved ahead of their Rename rows.
    renamed: std::collections::HashSet<usize>,
}

/// A batch's journaled ranges, placed in their files only after the batch is
/// handed to the committer: the writes then overlap the round that makes the
/// same bytes durable in the journal, instead of delaying its start. The
/// round does not end (nor let go of the commit gate, nor answer anyone, nor
/// hand the files to the background flush) before they are done, so a range
/// is in its file whenever a record visible outside the round says so. A
/// crash before they are done loses nothing: the journal holds the bytes
/// and the replay writes them.
#[derive(Default)]
pub(crate) struct DeferredWrites {
    writes: Vec<DeferredWrite>,
}

struct DeferredWrite {
    /// Counted off the slot's `deferred_writes` when dropped, unless it
    /// failed after its batch was submitted: then its range may be
    /// recorded without its bytes, and seals must keep waiting for the
    /// gate (where they find the sink stopped).
    count_off: bool,
    slot: Arc<Slot>,
    file: Arc<File>,
    /// The row of the batch holding the bytes, and where in its data.
    row: usize,
    within: std::ops::Range<usize>,
    /// Where they go in the file.
    offset: u64,
}

impl Drop for DeferredWrite {
    /// Done, failed or never to be done: the file no longer waits for it.
    fn drop(&mut self) {
        if self.count_off {
            let mut state = lock(&self.slot.state);
            state.deferred_writes = state.deferred_writes.saturating_sub(1);
        }
    }
}

impl DeferredWrites {
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// Writes every deferred range of `batch` (the batch they were placed
    /// from) into its file; an error names the file and offset.
    pub fn write(self, batch: &RangeBatch) -> Result<(), String> {
        let mut writes = self.writes.into_iter();
        while let Some(write) = writes.next() {
            if let Err(error) = write.write(batch) {
                let mut unwritten: Vec<DeferredWrite> =
                    std::iter::once(write).chain(writes).collect();
                for write in &mut unwritten {
                    write.count_off = false;
                }
                return Err(error);
            }
        }
        Ok(())
    }
}

impl DeferredWrite {
    fn write(&self, batch: &RangeBatch) -> Result<(), String> {
        let row = batch.row(self.row);
        let bytes = row
            .data
            .get(self.within.clone())
            .ok_or_else(|| format!("row {} has no bytes {:?}", self.row, self.within))?;
        write_range(&self.file, bytes, self.offset, || {
            lock(&self.slot.state).record.dest_path.clone()
        })
    }
}

impl Placer {
    pub fn new(
        root: Root,
        manifest: SinkManifest,
        layout: Layout,
        superseded: SupersededPolicy,
        max_open_files: usize,
        commit_gate: CommitGate,
        journal: Journal,
    ) -> Self {
        Self {
            journal,
            commit_gate,
            root,
            manifest,
            layout,
            superseded,
            sources: Mutex::new(HashMap::new()),
            open_files: Mutex::new(VecDeque::new()),
            max_open_files: max_open_files.max(16),
            direct_min: 0,
            direct_buffers: direct::Buffers::default(),
            seal_read_back: false,
            health: Health::default(),
            flat_source: Mutex::new(None),
            max_sources: MAX_SOURCES,
            committer: std::sync::OnceLock::new(),
        }
    }

    /// From now on, records written ahead of a batch's round go through
    /// `committer`'s rounds. Called once, after the startup replay.
    pub fn attach_committer(&self, committer: Committer) {
        let _ = self.committer.set(committer);
    }

    /// Writes the aligned middle of ranges of at least `min` bytes with
    /// O_DIRECT (0: never); see [`crate::direct`].
    pub fn with_direct_writes(mut self, min: u64) -> Self {
        self.direct_min = min;
        self
    }

    /// Shares the sink's health (and with it the flusher's: after a failed
    /// flush, the background flush must not trust a later successful one).
    pub fn with_health(mut self, health: Health) -> Self {
        self.health = health;
        self
    }

    /// Makes seals read every file back from disk to compare its digest,
    /// instead of trusting the CRC-64 of the bytes as they were written.
    pub fn with_seal_read_back(mut self, read_back: bool) -> Self {
        self.seal_read_back = read_back;
        self
    }

    /// Writes a range in place: its aligned middle directly when it is
    /// large enough and the filesystem allows, the rest through the page
    /// cache. An error names the destination and offset.
    fn write_in_place(
        &self,
        state: &mut SlotState,
        file: &File,
        bytes: &[u8],
        offset: u64,
    ) -> Result<(), String> {
        // Journaled ranges of this file still being written through the
        // page cache (they take no slot lock) could share a page-cache
        // folio with the middle: write around them the usual way.
        let middle = match (self.direct_min, state.deferred_writes) {
            (0, _) | (_, 1..) => None,
            (min, 0) => direct::aligned_middle(offset, bytes.len() as u64, min),
        };
        let direct = match (middle, &state.direct) {
            (None, _) | (_, DirectFile::Refused) => None,
            (Some(_), DirectFile::Open(direct)) => Some(direct.clone()),
            (Some(_), DirectFile::NotOpened) => {
                match direct::reopen_direct(file, &state.record.dest_path) {
                    direct::Reopened::Open(direct) => {
                        let direct = Arc::new(direct);
                        state.direct = DirectFile::Open(direct.clone());
                        Some(direct)
                    }
                    direct::Reopened::Refused => {
                        state.direct = DirectFile::Refused;
                        None
                    }
                    direct::Reopened::NotNow => None,
                }
            }
        };
        let dest = || state.record.dest_path.clone();
        let (Some((start, end)), Some(direct)) = (middle, direct) else {
            return write_range(file, bytes, offset, dest);
        };
        let at = |o: u64| (o - offset) as usize;
        write_range(file, &bytes[..at(start)], offset, dest)?;
        let middle_bytes = &bytes[at(start)..at(end)];
        match self.direct_buffers.write(&direct, middle_bytes, start) {
            Ok(true) => {}
            // Every aligned buffer is busy: this once, the usual way.
            Ok(false) => write_range(file, middle_bytes, start, dest)?,
            // An alignment this device does not take after all. Chunks
            // before the failed one are in the file; writing them again
            // through the page cache puts the same bytes there.
            Err(failed) if failed.error.raw_os_error() == Some(libc::EINVAL) => {
                tracing::debug!(dest = %state.record.dest_path, error = %failed.error, "direct write refused; writing through the page cache");
                state.direct = DirectFile::Refused;
                write_range(file, middle_bytes, start, || state.record.dest_path.clone())?;
            }
            Err(failed) => {
                return Err(format!(
                    "writing {} bytes at offset {} of {} (O_DIRECT): {}",
                    failed.len, failed.offset, state.record.dest_path, failed.error
                ));
            }
        }
        write_range(file, &bytes[at(end)..], end, || {
            state.record.dest_path.clone()
        })
    }

    /// The source's state, loaded from the manifest on first use.
    pub fn source(&self, name: &str) -> Result<Arc<Source>, SinkError> {
        loop {
            let cell = {
                let mut sources = lock(&self.sources);
                if sources.len() >= self.max_sources && !sources.contains_key(name) {
                    return Err(SinkError::Peer(format!(
                        "this sink serves at most {} sources, and source {name:?} is not one of them",
                        self.max_sources
                    )));
                }
                sources.entry(name.to_owned()).or_default().clone()
            };
            // Held across the scan: no batch of this source is placed, and so
            // none of its records rewritten in the manifest (in place, see
            // manifest_db's store), while they are read. Other sources go on:
            // the scan reads no key past this source's.
            let mut loaded = lock(&cell);
            if let Some(source) = loaded.as_ref() {
                return Ok(source.clone());
            }
            let current = |sources: &HashMap<_, Arc<_>>| {
                sources.get(name).is_some_and(|c| Arc::ptr_eq(c, &cell))
            };
            if !current(&lock(&self.sources)) {
                // Its load failed and it left the map: one state per source,
                // so start over with the map's.
                continue;
            }
            return match self.load_source(name) {
                Ok(source) => {
                    *loaded = Some(source.clone());
                    Ok(source)
                }
                Err(error) => {
                    // Names that fail (refused, unreadable) keep no entry:
                    // the map holds only sources being served.
                    let mut sources = lock(&self.sources);
                    if current(&sources) {
                        sources.remove(name);
                    }
                    Err(error)
                }
            };
        }
    }

    fn load_source(&self, name: &str) -> Result<Arc<Source>, SinkError> {
        if self.layout == Layout::Flat {
            self.claim_flat_root(name)?;
        }
        self.read_source(name)
    }

    /// A source's state as the manifest has it (no claim on a flat root).
    fn read_source(&self, name: &str) -> Result<Arc<Source>, SinkError> {
        let records = self.manifest.files_of_source(name).map_err(|e| {
            SinkError::Storage(format!("loading the manifest of source {name:?}: {e}"))
        })?;
        // Only the path index is kept for every file; slots are loaded on
        // demand and sealed ones are dropped again, so memory follows the
        // files in use, not every file the source ever sent.
        let mut files = SourceFiles {
            sweep_above: SLOT_CACHE,
            ..SourceFiles::default()
        };
        let mut moved_away = MovedAway::default();
        for (id, record) in records {
            if let Some(from) = &record.renamed_from {
                moved_away
                    .recorded
                    .insert(from.clone(), (id.key.clone(), id.generation));
            }
            if !record.superseded {
                files
                    .by_path
                    .insert(record.dest_path, (id.key, id.generation));
            } else if record.kept {
                files.kept.insert(record.dest_path, (id.key, id.generation));
            }
        }
        Ok(Arc::new(Source {
            name: name.to_owned(),
            files: Mutex::new(files),
            moved_away: Mutex::new(moved_away),
        }))
    }

    /// The flat layout puts every source's files straight under the root,
    /// where two sources' files of the same name would be one file: the
    /// first source (in the manifest's order, else on the wire) is the only
    /// one, whichever connects first.
    fn claim_flat_root(&self, name: &str) -> Result<(), SinkError> {
        let mut owner = lock(&self.flat_source);
        if owner.is_none() {
            let first = self
                .manifest
                .first_source()
                .map_err(|e| SinkError::Storage(format!("reading the manifest's sources: {e}")))?;
            *owner = Some(first.unwrap_or_else(|| name.to_owned()));
        }
        match owner.as_deref() {
            Some(only) if only != name => Err(SinkError::Peer(format!(
                "this sink writes the flat layout, which serves one source, {only:?}: \
                 source {name:?} needs a sink of its own or the per-source layout"
            ))),
            _ => Ok(()),
        }
    }

    /// Holds off commit rounds while held. A round holds it from before its
    /// records are written until its journal write and its deferred writes
    /// are done too; it says why
    /// the sink stopped if a round failed meanwhile.
    pub fn commit_gate(&self) -> MutexGuard<'_, ()> {
        lock(&self.commit_gate)
    }

    /// Writes the ranges left in the journal back into their files, flushes
    /// them and empties the journal. They were acknowledged, but a crash of
    /// the machine may have lost them from the files with the page cache.
    /// Runs at startup, before any batch; returns the bytes written back.
    /// `journal_path` is the journal file the entries point into.
    pub fn replay_journal(&self, journal_path: &Path) -> Result<u64, SinkError> {
        let storage = |e: String| SinkError::Storage(format!("replaying the journal: {e}"));
        let redone =
            crate::journal::redo_lost_rounds(&self.manifest, journal_path).map_err(storage)?;
        if redone > 0 {
            tracing::warn!(
                rounds = redone,
                "the manifest had lost its newest records (a machine crash); redid them from the journal"
            );
        }
        let entries = self
            .manifest
            .journal()
            .map_err(|e| storage(e.to_string()))?;
        let mut work = BatchWork {
            request: CommitRequest::default(),
            ack: Ack::default(),
            deferred: DeferredWrites::default(),
            renamed: Default::default(),
        };
        // The round a crash may have cut short, if any: its entries were
        // written while its bytes were, and none of its ranges was acknowledged.
        let in_doubt: std::collections::HashSet<_> = self
            .manifest
            .journal_round_in_doubt()
            .map_err(|e| storage(e.to_string()))?
            .into_iter()
            .collect();
        let mut withdrawn = Vec::new();
        let mut journal_file = None;
        let mut replayed = 0u64;
        // Sources a flat sink refuses whose acknowledged ranges the journal
        // still holds (a manifest from before the flat layout served one).
        let mut refused: HashMap<String, Arc<Source>> = HashMap::new();
        for (id, offset, stored) in entries {
            let source = match self.source(&id.source) {
                Err(SinkError::Peer(why)) if self.layout == Layout::Flat => {
                    match refused.get(&id.source) {
                        Some(source) => source.clone(),
                        None => {
                            tracing::warn!(source = %id.source, %why, "writing the acknowledged ranges the journal holds of a source this sink no longer serves");
                            let source = self.read_source(&id.source)?;
                            refused.insert(id.source.clone(), source.clone());
                            source
                        }
                    }
                }
                loaded => loaded?,
            };
            let slot = {
                let mut files = lock(&source.files);
                self.lookup(&source, &mut files, &id.key, id.generation)
                    .map_err(|e| storage(e.into_message()))?
            };
            // Entries are committed with their record, so a missing record
            // means nothing of this file was acknowledged.
            let Some(slot) = slot else { continue };
            let mut state = lock(&slot.state);
            // A removed generation's path may now belong to its successor;
            // one kept aside still needs its bytes.
            if state.record.superseded && !state.record.kept {
                continue;
            }
            let file = self
                .file_of(&source, &slot, &mut state, &mut work)
                .map_err(|e| storage(e.into_message()))?;
            let dest = &state.record.dest_path;
            let in_doubt =
                !in_doubt.is_empty() && in_doubt.contains(&(id.clone(), offset, stored.clone()));
            let bytes = match stored {
                JournalBytes::Inline(bytes) => bytes,
                JournalBytes::InFile {
                    position,
                    len,
                    crc32c,
                } => {
                    if journal_file.is_none() {
                        let opened = File::open(journal_path).map_err(|e| {
                            storage(format!(
                                "the manifest's journal points into {}, which cannot be opened: {e}",
                                journal_path.display()
                            ))
                        })?;
                        journal_file = Some(opened);
                    }
                    let journal = journal_file.as_ref().expect("opened above");
                    let in_journal = read_exact(journal, position, len);
                    match in_journal {
                        Ok(bytes) if checksum::crc32c(&bytes) == crc32c => bytes,
                        outcome => {
                            // A write cut short leaves other bytes there;
                            // failing to read them is damage.
                            let (found, cut_short) = match outcome {
                                Ok(_) => ("other bytes".to_string(), in_doubt),
                                Err(e) => (format!("no bytes ({e})"), false),
                            };
                            // The range is fine if its file already holds
                            // it (flushed below with the rest).
                            let in_place = self
                                .root
                                .open_for_read(dest)
                                .ok()
                                .and_then(|file| read_exact(&file, offset, len).ok())
                                .is_some_and(|bytes| checksum::crc32c(&bytes) == crc32c);
                            if in_place {
                                work.request.files_to_sync.push(file);
                                continue;
                            }
                            let end = offset + u64::from(len);
                            if cut_short {
                                // Recorded, never acknowledged: the sender
                                // still has it and sends it again. A seal of
                                // its file can only have come from a later
                                // batch, unacknowledged too: it goes with it.
                                if state.record.sealed.take().is_some() {
                                    work.request.touched.push(slot.clone());
                                }
                                if state.record.placed.covers(offset, end) {
                                    state.record.placed.remove(offset, end);
                                    withdrawn.push((id.clone(), offset, u64::from(len)));
                                    work.request.touched.push(slot.clone());
                                }
                                continue;
                            }
                            // Any other round's bytes were durable before it
                            // was recorded: only a damaged journal file gets here.
                            return Err(storage(format!(
                                "{len} acknowledged bytes at offset {offset} of {dest} are neither in the \
                                 journal file {} (position {position}: {found}) nor in the file: the \
                                 journal file was damaged or replaced",
                                journal_path.display()
                            )));
                        }
                    }
                }
            };
            write_range(&file, &bytes, offset, || dest.clone()).map_err(storage)?;
            work.request.files_to_sync.push(file);
            replayed += bytes.len() as u64;
        }
        let request = work.request;
        request.sync_now().map_err(storage)?;
        for slot in &request.touched {
            lock(&slot.unsynced).clear();
        }
        let records: Vec<_> = request
            .touched
            .iter()
            .map(|slot| (slot.id.clone(), lock(&slot.state).record.clone()))
            .collect();
        if !withdrawn.is_empty() {
            tracing::warn!(
                ranges = withdrawn.len(),
                bytes = withdrawn.iter().map(|(_, _, len)| len).sum::<u64>(),
                "a commit round was cut short before its journal write ended; \
                 its ranges were never acknowledged and are withdrawn for the senders to resend"
            );
        }
        if !records.is_empty() {
            let _gate = lock(&self.commit_gate);
            self.manifest
                .commit(&SinkCommit {
                    records,
                    withdrawn,
                    ..SinkCommit::default()
                })
                .map_err(|e| storage(e.to_string()))?;
        }
        self.manifest
            .clear_journal()
            .map_err(|e| storage(e.to_string()))?;
        Ok(replayed)
    }

    /// The commit gate, unless the sink is poisoned (then it refuses work
    /// until it is restarted). Checked under the gate: a round that fails
    /// poisons the health before it lets go.
    fn open_gate(&self) -> Result<MutexGuard<'_, ()>, RowError> {
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

    /// Places one batch (blocking I/O). Returns the commit to wait for, the
    /// ack to send once it is durable, and the writes to do once the commit
    /// is submitted (its answer waits for them).
    pub fn place(
        &self,
        source: &Source,
        seq: u64,
        batch: &RangeBatch,
    ) -> Result<(CommitRequest, Ack, DeferredWrites), SinkError> {
        let mut work = BatchWork {
            request: CommitRequest::default(),
            ack: Ack {
                seq,
                ..Ack::default()
            },
            deferred: DeferredWrites::default(),
            renamed: Default::default(),
        };
        for (index, row) in batch.rows().enumerate() {
            let context = |e: String| {
                format!(
                    "batch {seq} row {index} ('{}' generation {}): {e}",
                    row.file_key, row.generation
                )
            };
            let result = match row.kind {
                RowKind::Data => self.place_data(source, &row, index, &mut work),
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
            // What this batch wrote will not be recorded: others must not
            // wait for it, and a re-delivery must write it again.
            for (slot, ranges) in &work.request.placed {
                let mut state = lock(&slot.state);
                for &(start, end) in ranges {
                    state.pending.remove(start, end);
                }
            }
            return Err(failure);
        }
        work.request.counters.placed_bytes = work.ack.placed;
        work.request.counters.duplicate_bytes = work.ack.duplicate;
        Ok((work.request, work.ack, work.deferred))
    }

    /// The slot of (key, generation), from memory or from the manifest.
    fn lookup(
        &self,
        source: &Source,
        files: &mut SourceFiles,
        key: &str,
        generation: u64,
    ) -> Result<Option<Arc<Slot>>, RowError> {
        let cache_key = (key.to_owned(), generation);
        if let Some(slot) = files.slots.get(&cache_key) {
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
            state: Mutex::new(SlotState {
                recorded: true,
                recorded_sealed: record.sealed.is_some(),
                recorded_path: Some(record.dest_path.clone()),
                recorded_superseded: record.superseded,
                moving: false,
                deferred_writes: 0,
                // Bytes placed by an earlier run are vouched for only by the
                // file itself.
                written_crc: WrittenCrc::new(record.placed.is_empty()),
                inode: None,
                record,
                pending: IntervalSet::new(),
                disk_len: None,
                file: None,
                direct: DirectFile::NotOpened,
            }),
            unsynced: Mutex::new(Vec::new()),
        });
        self.cache(files, cache_key, slot.clone());
        Ok(Some(slot))
    }

    /// Keeps a slot in memory; past a size, drops sealed slots nobody holds
    /// (their record is in the manifest and they take no more writes).
    fn cache(&self, files: &mut SourceFiles, key: (String, u64), slot: Arc<Slot>) {
        files.slots.insert(key, slot);
        if files.slots.len() > files.sweep_above.max(SLOT_CACHE) {
            files.slots.retain(|_, slot| {
                let idle_and_sealed = Arc::strong_count(slot) == 1
                    && slot.state.try_lock().is_ok_and(|state| {
                        state.record.sealed.is_some() && state.pending.is_empty()
                    })
                    && slot
                        .unsynced
                        .try_lock()
                        .is_ok_and(|unsynced| unsynced.is_empty());
                !idle_and_sealed
            });
            files.sweep_above = files.slots.len() * 2;
        }
    }

    /// The slot of (key, generation); generation 1 is created on first sight
    /// at the key's own path, later generations need an Open row first.
    /// Lookup and creation happen under the source's lock, so two streams
    /// carrying the same new file end up with one slot.
    fn slot_or_create(
        &self,
        source: &Source,
        row: &Row<'_>,
        work: &mut BatchWork,
    ) -> Result<Arc<Slot>, RowError> {
        let mut files = lock(&source.files);
        if let Some(slot) = self.lookup(source, &mut files, row.file_key, row.generation)? {
            return Ok(slot);
        }
        if row.generation != 1 {
            return Err(RowError::Peer(format!(
                "generation {} was never opened (send an Open row before its data)",
                row.generation
            )));
        }
        self.create(source, &mut files, row.file_key, 1, row.file_key, work)
    }

    fn create(
        &self,
        source: &Source,
        files: &mut SourceFiles,
        key: &str,
        generation: u64,
        path: &str,
        work: &mut BatchWork,
    ) -> Result<Arc<Slot>, RowError> {
        crate::confine::components(key).map_err(|e| RowError::Peer(e.to_string()))?;
        let dest = self.dest(source, path);
        // A file an earlier process meant to move away from `dest` leaves
        // first: the new one must not be written into it.
        self.settle_recorded_move_from(source, files, &dest, work)?;
        self.supersede_at(source, files, &dest, work)?;
        let opened = self.root.open_for_write(&dest).map_err(confine_error)?;
        let disk_len = opened.file.metadata().map(|m| m.len()).ok();
        let file = Arc::new(opened.file);
        let mut unsynced = Vec::new();
        if !opened.dirs_to_sync.is_empty() {
            work.request
                .flush_before_record(&mut unsynced, Some(&file), opened.dirs_to_sync);
        }
        let slot = Arc::new(Slot {
            id: FileId {
                source: source.name.clone(),
                key: key.to_owned(),
                generation,
            },
            state: Mutex::new(SlotState {
                record: FileRecord {
                    dest_path: dest.clone(),
                    ..FileRecord::default()
                },
                pending: IntervalSet::new(),
                disk_len,
                file: Some(file.clone()),
                direct: DirectFile::NotOpened,
                recorded: false,
                recorded_sealed: false,
                recorded_path: None,
                recorded_superseded: false,
                moving: false,
                deferred_writes: 0,
                written_crc: WrittenCrc::new(true),
                inode: None,
            }),
            unsynced: Mutex::new(unsynced),
        });
        lock(&slot.state).opened(&file);
        files
            .slots
            .insert((key.to_owned(), generation), slot.clone());
        files.by_path.insert(dest, (key.to_owned(), generation));
        self.remember_open(&slot);
        work.request.touched.push(slot.clone());
        Ok(slot)
    }

    /// A new generation or a rename takes `dest`: whatever live generation
    /// was there is superseded (removed, or kept aside by policy), and a
    /// generation kept aside there before moves on to `<dest>.<n>` (it is
    /// kept, not overwritten). Returns the files whose records it changed.
    fn supersede_at(
        &self,
        source: &Source,
        files: &mut SourceFiles,
        dest: &str,
        work: &mut BatchWork,
    ) -> Result<Vec<Arc<Slot>>, RowError> {
        let mut changed = Vec::new();
        if let Some((kept, key, generation)) = self.slot_at(source, files, PathIndex::Kept, dest)? {
            let moved = self.free_name(files, (1..1000).map(|n| format!("{dest}.{n}")))?;
            // Still indexed at `dest` if the move fails: a retried batch
            // must not take the kept file for a free path.
            let moved_on = self.move_superseded(source, files, &kept, dest, &moved, work)?;
            files.kept.remove(dest);
            if moved_on {
                files.kept.insert(moved, (key, generation));
            }
            changed.push(kept);
        }
        let Some((old, key, generation)) = self.slot_at(source, files, PathIndex::Live, dest)?
        else {
            return Ok(changed);
        };
        let mut state = lock(&old.state);
        // A move of it recorded and not seen through is finished first: its
        // file is then the one at `dest`, and no later settle can move it
        // back over whatever takes its place.
        self.settle_rename(source, &old, &mut state, work)?;
        match self.superseded {
            SupersededPolicy::Mirror => {
                // Nothing changes in memory until the file is out of the way:
                // a failure leaves the old generation live at `dest`, and the
                // retried batch supersedes it again instead of writing into
                // its file.
                if let Some(dir) = self.root.remove(dest).map_err(confine_error)? {
                    work.request
                        .flush_before_record(&mut lock(&old.unsynced), None, [dir]);
                }
                state.close_file();
                state.record.superseded = true;
                drop(state);
                work.request.touched.push(old.clone());
            }
            SupersededPolicy::Keep => {
                drop(state);
                let aside = self.free_name(
                    files,
                    (0..1000).map(|n| match n {
                        0 => format!("{dest}.gen{generation}"),
                        n => format!("{dest}.gen{generation}.{n}"),
                    }),
                )?;
                if self.move_superseded(source, files, &old, dest, &aside, work)? {
                    files.kept.insert(aside, (key.clone(), generation));
                }
            }
        }
        files.by_path.remove(dest);
        changed.push(old);
        Ok(changed)
    }

    /// Moves a superseded generation's file from `from` to `to` (kept aside,
    /// or moved on from a kept name) and marks it kept; returns false if the
    /// file was gone, and then records the generation superseded and not
    /// kept. Either way the record is durable before `from` is free: a
    /// move's intent is recorded before the move is made, as a rename's is
    /// (see [`Self::rename`]). Otherwise a crash before the round that
    /// records it would leave the record naming `from`, where a new file is
    /// about to be written, and the kept bytes under no record. The caller
    /// holds `files`, and neither the gate nor a slot's state.
    fn move_superseded(
        &self,
        source: &Source,
        files: &mut SourceFiles,
        slot: &Arc<Slot>,
        from: &str,
        to: &str,
        work: &mut BatchWork,
    ) -> Result<bool, RowError> {
        let moved_away = self.moves_away_from(source, files, to, work)?;
        let before = {
            let state = lock(&slot.state);
            (state.record.superseded, state.record.kept)
        };
        let moving = {
            let mut state = lock(&slot.state);
            self.settle_rename(source, slot, &mut state, work)?;
            match self.inode_at(from)? {
                None => {
                    state.record.superseded = true;
                    state.record.kept = false;
                    state.close_file();
                    None
                }
                Some(inode) => {
                    state.record.begin_move(to.to_owned(), inode);
                    state.record.superseded = true;
                    state.record.kept = true;
                    Some(Moving::mark(slot, &mut state))
                }
            }
        };
        let mut intent = moved_away;
        intent.push(slot.clone());
        let Some(moving) = moving else {
            tracing::warn!(path = %from, "a superseded file to keep aside is gone from the sink; nothing to keep");
            self.record_durably(intent, || {
                format!("recording the superseded file {from}, which is gone")
            })?;
            work.request.touched.push(slot.clone());
            return Ok(false);
        };
        self.record_durably(intent, || {
            format!("recording the move of {from} aside to {to}")
        })?;
        let dirs = match self.root.rename(from, to) {
            Ok(dirs) => dirs,
            Err(error) => {
                // Nothing moved: the record says so again, durably, so that
                // no settle makes the move later behind the live record.
                {
                    let mut state = lock(&slot.state);
                    state.record.undo_move();
                    (state.record.superseded, state.record.kept) = before;
                    moving.made(&mut state);
                }
                self.record_durably(vec![slot.clone()], || {
                    format!("withdrawing the intent to move {from} aside to {to}")
                })?;
                return Err(confine_error(error));
            }
        };
        {
            let mut state = lock(&slot.state);
            work.request
                .flush_before_record(&mut lock(&slot.unsynced), None, dirs);
            state.record.end_move();
            state.close_file();
            moving.made(&mut state);
        }
        lock(&source.moved_away).made(from.to_owned(), slot.clone());
        work.request.touched.push(slot.clone());
        Ok(true)
    }

    /// The slot a path index names at `dest`, with its key and generation;
    /// a name whose record is gone is dropped from the index.
    fn slot_at(
        &self,
        source: &Source,
        files: &mut SourceFiles,
        which: PathIndex,
        dest: &str,
    ) -> Result<Option<(Arc<Slot>, String, u64)>, RowError> {
        let Some((key, generation)) = files.index(which).get(dest).cloned() else {
            return Ok(None);
        };
        match self.lookup(source, files, &key, generation)? {
            Some(slot) => Ok(Some((slot, key, generation))),
            None => {
                files.index(which).remove(dest);
                Ok(None)
            }
        }
    }

    /// The first of `names` that no live or kept file of the source has and
    /// nothing on disk has either (renaming over it would lose that file).
    fn free_name(
        &self,
        files: &SourceFiles,
        names: impl Iterator<Item = String>,
    ) -> Result<String, RowError> {
        let mut last = String::new();
        for name in names {
            if !files.by_path.contains_key(&name) && !files.kept.contains_key(&name) {
                match self.root.open_for_read(&name) {
                    Err(ConfineError::Io { source, .. })
                        if source.kind() == std::io::ErrorKind::NotFound =>
                    {
                        return Ok(name);
                    }
                    _ => {}
                }
            }
            last = name;
        }
        Err(RowError::Storage(format!(
            "no free name to move a superseded file aside (tried up to {last})"
        )))
    }

    /// Finishes a rename recorded before a crash (or a failed attempt): the
    /// file is moved to where the record says it lives before anything opens
    /// it there, so nothing writes into a new empty file by mistake.
    fn settle_rename(
        &self,
        source: &Source,
        slot: &Arc<Slot>,
        state: &mut SlotState,
        work: &mut BatchWork,
    ) -> Result<(), RowError> {
        let Some(from) = state.record.renamed_from.clone() else {
            return Ok(());
        };
        let to = &state.record.dest_path;
        if state.moving {
            // Another batch makes this move once its intent is durable.
            return Err(RowError::Storage(format!(
                "{from} is being moved to {to} by another batch; this one is sent again"
            )));
        }
        let inode = match state.record.renamed_inode {
            Some(inode) => Ok(Some(inode)),
            // Recorded by a build that did not keep the inode: the file at
            // `from` is taken for it, else the one at `to`.
            None => match self.root.inode_at(&from) {
                Ok(None) => self.root.inode_at(to),
                found => found,
            },
        };
        let settled = inode.and_then(|inode| match inode {
            Some(inode) => self.root.settle_move(&from, to, inode),
            None => Ok(SettledMove::Missing),
        });
        match settled {
            Ok(SettledMove::Made(dirs)) => {
                work.request
                    .flush_before_record(&mut lock(&slot.unsynced), None, dirs);
                lock(&source.moved_away).made(from.clone(), slot.clone());
            }
            Ok(SettledMove::Missing) => {
                // Its bytes are gone (removed behind the sink's back): the
                // record must not claim them, so that they are sent again.
                tracing::error!(
                    from = %from,
                    to = %to,
                    bytes = state.record.placed.total_len(),
                    "a recorded move found its file under neither name; its ranges are dropped from the manifest to be sent again"
                );
                state.record.placed = IntervalSet::new();
                state.record.sealed = None;
            }
            // Recorded before this sink took back intents whose move failed
            // (or just before a crash): not this batch's fault, and the
            // batch is tried again.
            Err(e) => {
                return Err(RowError::Storage(format!(
                    "finishing the recorded move of {from} to {to}: {e}"
                )));
            }
        }
        state.record.end_move();
        work.request.touched.push(slot.clone());
        Ok(())
    }

    /// Flushes what earlier changes to this file still wait for, at once:
    /// a record written outside a round (an intent) is about to take the
    /// place of the one they lead up to. The caller holds the gate (and the
    /// slot's state). A failed flush stops the sink, as a round's does: the
    /// page cache proves nothing after one.
    fn flush_unsynced_now(&self, slot: &Slot, _gate: &MutexGuard<'_, ()>) -> Result<(), RowError> {
        // Not holding `unsynced` across a flush: the committer reads it. No
        // move of this file can queue more meanwhile (the caller holds its
        // state), and a round can only take some off.
        loop {
            let Some((token, target)) = lock(&slot.unsynced)
                .first()
                .map(|pending| (pending.token(), pending.target.clone()))
            else {
                return Ok(());
            };
            if let Err(error) = target.sync() {
                let reason = format!(
                    "flushing a change to {:?} before recording it again: {error}",
                    slot.id.key
                );
                self.health.poison(reason.clone());
                return Err(RowError::Storage(reason));
            }
            lock(&slot.unsynced).retain(|pending| pending.token() != token);
        }
    }

    fn file_of(
        &self,
        source: &Source,
        slot: &Arc<Slot>,
        state: &mut SlotState,
        work: &mut BatchWork,
    ) -> Result<Arc<File>, RowError> {
        if let Some(file) = &state.file {
            return Ok(file.clone());
        }
        self.settle_rename(source, slot, state, work)?;
        let opened = self
            .root
            .open_for_write(&state.record.dest_path)
            .map_err(confine_error)?;
        if state.disk_len.is_none() {
            state.disk_len = opened.file.metadata().map(|m| m.len()).ok();
        }
        state.opened(&opened.file);
        let file = Arc::new(opened.file);
        if !opened.dirs_to_sync.is_empty() {
            // Created again (it was missing).
            work.request.flush_before_record(
                &mut lock(&slot.unsynced),
                Some(&file),
                opened.dirs_to_sync,
            );
        }
        state.file = Some(file.clone());
        self.remember_open(slot);
        Ok(file)
    }

    /// Keeps the number of cached descriptors bounded: the oldest opened is
    /// closed first (a commit still holding it keeps it open until synced).
    /// The caller may hold another slot's lock, so eviction never waits for
    /// one: a busy slot is skipped and stays open a little longer.
    fn remember_open(&self, slot: &Arc<Slot>) {
        let mut open = lock(&self.open_files);
        open.push_back(slot.clone());
        let mut attempts = open.len();
        while open.len() > self.max_open_files && attempts > 0 {
            attempts -= 1;
            let Some(evicted) = open.pop_front() else {
                break;
            };
            if Arc::ptr_eq(&evicted, slot) {
                open.push_back(evicted);
                continue;
            }
            // A file being moved keeps its descriptor: reopening it would
            // have to settle the move.
            let closed = match evicted.state.try_lock() {
                Ok(mut state) if !state.moving => {
                    state.close_file();
                    true
                }
                _ => false,
            };
            if !closed {
                open.push_back(evicted);
            }
        }
    }

    fn place_data(
        &self,
        source: &Source,
        row: &Row<'_>,
        index: usize,
        work: &mut BatchWork,
    ) -> Result<(), RowError> {
        let slot = self.slot_or_create(source, row, work)?;
        let len = row.data.len() as u64;
        let (start, end) = (row.offset, row.offset + len);
        let mut state = lock(&slot.state);
        if state.record.superseded {
            work.ack.stale += len;
            return Ok(());
        }
        let unplaced = state.record.placed.missing(start, end);
        let mut to_write = Vec::new();
        for (s, e) in unplaced {
            for part in state.pending.missing(s, e) {
                to_write.push(part);
            }
        }
        let written: u64 = to_write.iter().map(|(s, e)| e - s).sum();
        if written < len {
            // Parts already recorded or being written by another batch: this
            // ack must not overtake theirs.
            work.request.dependencies.push(Dependency {
                slot: slot.clone(),
                start,
                end,
            });
        }
        work.ack.duplicate += len - written;
        if to_write.is_empty() {
            return Ok(());
        }
        if let Some(sealed) = &state.record.sealed {
            return Err(RowError::Peer(format!(
                "range {start}..{end} is beyond what was sealed at size {}",
                sealed.size
            )));
        }
        let file = self.file_of(source, &slot, &mut state, work)?;
        let known = state.disk_len.unwrap_or(0);
        // A batch that flushes files anyway (new files, large ranges) has
        // them flushed together; copying its small ranges would be for nothing.
        let journal = len <= self.journal.max_range
            && !work.request.flushes_anyway()
            && work.request.journal_bytes + written <= JOURNAL_BATCH_MAX
            && self.journal.backlog.load(Ordering::Relaxed) < JOURNAL_BACKLOG_MAX;
        for (i, &(s, e)) in to_write.iter().enumerate() {
            let within = (s - start) as usize..(e - start) as usize;
            state.written_crc.add(s, &row.data[within.clone()]);
            if journal {
                // Written once the batch is handed to the committer, while
                // its round writes the journal (see `DeferredWrites`).
                state.deferred_writes += 1;
                let bytes = row.data[within.clone()].to_vec();
                work.request.journal.push((slot.id.clone(), s, bytes));
                work.deferred.writes.push(DeferredWrite {
                    count_off: true,
                    slot: slot.clone(),
                    file: file.clone(),
                    row: index,
                    within,
                    offset: s,
                });
            } else if let Err(error) = self.write_in_place(&mut state, &file, &row.data[within], s)
            {
                for &(ws, we) in &to_write[..i] {
                    state.pending.remove(ws, we);
                }
                state.written_crc = WrittenCrc::Unknown;
                return Err(RowError::Storage(error));
            }
            if s < known {
                work.request.counters.rewritten_bytes += e.min(known) - s;
            }
            state.pending.insert(s, e);
        }
        drop(state);
        work.ack.placed += written;
        if journal {
            work.request.journal_bytes += written;
            work.request.journaled_files.push(file);
        } else {
            work.request.files_to_sync.push(file);
        }
        work.request.placed.push((slot.clone(), to_write));
        work.request.touched.push(slot);
        Ok(())
    }

    fn open_generation(
        &self,
        source: &Source,
        row: &Row<'_>,
        work: &mut BatchWork,
    ) -> Result<(), RowError> {
        let path = row
            .path
            .ok_or_else(|| RowError::Peer("an Open row needs a path".into()))?;
        crate::confine::components(path).map_err(|e| RowError::Peer(e.to_string()))?;
        if row.generation == 0 {
            return Err(RowError::Peer("generations start at 1".into()));
        }
        let mut files = lock(&source.files);
        if let Some(slot) = self.lookup(source, &mut files, row.file_key, row.generation)? {
            // A re-delivered Open: already done.
            work.request.touched.push(slot);
            return Ok(());
        }
        self.create(source, &mut files, row.file_key, row.generation, path, work)?;
        Ok(())
    }

    fn rename(&self, source: &Source, row: &Row<'_>, work: &mut BatchWork) -> Result<(), RowError> {
        let path = row
            .path
            .ok_or_else(|| RowError::Peer("a Rename row needs the new path".into()))?;
        crate::confine::components(path).map_err(|e| RowError::Peer(e.to_string()))?;
        let slot = self.slot_or_create(source, row, work)?;
        // Renames of one source are serialised: a re-delivered rename racing
        // the original must see its effect, not undo it.
        let mut files = lock(&source.files);
        let new_dest = self.dest(source, path);
        let (old_dest, superseded) = {
            let state = lock(&slot.state);
            (state.record.dest_path.clone(), state.record.superseded)
        };
        if superseded {
            return Err(RowError::Superseded(
                "a newer generation replaced this one; rename ignored".into(),
            ));
        }
        if old_dest == new_dest {
            if work.renamed.contains(&(Arc::as_ptr(&slot) as usize)) {
                // Moved by this batch, ahead of this row.
                return Ok(());
            }
            // Done before (perhaps only recorded, before a crash): make sure.
            let mut state = lock(&slot.state);
            let unsettled = state.record.renamed_from.clone();
            self.settle_rename(source, &slot, &mut state, work)?;
            drop(state);
            if let Some(from) = unsettled {
                // A move an earlier delivery recorded (or made) and did not
                // see through: its row finishes it, and this round fsyncs it.
                let this = (row.file_key.to_owned(), row.generation);
                if files.by_path.get(&from) == Some(&this) {
                    files.by_path.remove(&from);
                }
                files.by_path.insert(new_dest, this);
            }
            work.request.touched.push(slot);
            return Ok(());
        }
        {
            // Nothing is changed (no file at `new_dest` superseded) for a
            // rename that cannot be made: its file must be there, once any
            // move of it recorded before is finished.
            let mut state = lock(&slot.state);
            self.settle_rename(source, &slot, &mut state, work)?;
            if self.inode_at(&old_dest)?.is_none() {
                // Removed or replaced behind the sink's back.
                return Err(RowError::Reject(format!(
                    "cannot rename to {new_dest}: the sink holds no file at {old_dest}"
                )));
            }
        }
        // Record the rename before making it: a crash in between leaves a
        // record that knows both names, and settle_rename finishes the move
        // before the file is opened again. The files it supersedes are
        // recorded with it (after a crash, two live records must not name
        // one path), and so are those whose moves away from the new name
        // must be durable first.
        let mut intent = self.supersede_at(source, &mut files, &new_dest, work)?;
        intent.extend(self.moves_away_from(source, &mut files, &new_dest, work)?);
        let moving = {
            let mut state = lock(&slot.state);
            // A move recorded before and not seen through is finished, and
            // made durable, before this intent takes the place of its record.
            self.settle_rename(source, &slot, &mut state, work)?;
            let Some(inode) = self.inode_at(&old_dest)? else {
                return Err(RowError::Storage(format!(
                    "the file at {old_dest} went away while it was renamed to {new_dest}"
                )));
            };
            state.record.begin_move(new_dest.clone(), inode);
            Moving::mark(&slot, &mut state)
        };
        intent.push(slot.clone());
        #[cfg(test)]
        crate::fault::hit(crate::fault::Point::MoveIntent, &slot.id.source);
        self.record_durably(intent, || format!("recording the rename to {new_dest}"))?;
        let dirs = match self.root.rename(&old_dest, &new_dest) {
            Ok(dirs) => dirs,
            Err(error) => {
                self.withdraw_intents(std::slice::from_ref(&slot))?;
                drop(moving);
                return Err(match confine_error(error) {
                    // The new name cannot be made (a file where a directory
                    // should be, a link in the way): the file keeps its name
                    // and goes on; the watcher is told.
                    RowError::Peer(reason) => {
                        RowError::Reject(format!("cannot rename to {new_dest}: {reason}"))
                    }
                    other => other,
                });
            }
        };
        {
            let mut state = lock(&slot.state);
            work.request
                .flush_before_record(&mut lock(&slot.unsynced), None, dirs);
            state.record.end_move();
            moving.made(&mut state);
        }
        files.by_path.remove(&old_dest);
        files
            .by_path
            .insert(new_dest, (row.file_key.to_owned(), row.generation));
        lock(&source.moved_away).made(old_dest, slot.clone());
        drop(files);
        work.request.touched.push(slot);
        Ok(())
    }

    /// At the first row of a run of consecutive Rename rows, makes the
    /// run's plain renames with one synced manifest write for all their
    /// intents, instead of one each.
    ///
    /// A writer that rotates its chunks renames a hundred files at once, and
    /// each rename's intent must be durable before its file moves (see
    /// [`Self::rename`]): one after another, those synced writes held up
    /// every batch behind them for tens of milliseconds.
    ///
    /// The renames of a run may be made in any order when no two of them
    /// name the same path, or one inside the other, and no file is renamed
    /// twice. Then those whose file is known, lives at its recorded path and
    /// goes where no file lives or is kept are made here, at the run's place
    /// in the batch; their rows find them done. The others, and every rename
    /// of a run that does not qualify, are left to their rows.
    fn rename_run_at(
        &self,
        source: &Source,
        batch: &RangeBatch,
        start: usize,
        work: &mut BatchWork,
    ) -> Result<(), RowError> {
        let is_rename = |i: usize| batch.row(i).kind == RowKind::Rename;
        if start > 0 && is_rename(start - 1) {
            return Ok(());
        }
        let end = (start..batch.len())
            .find(|&i| !is_rename(i))
            .unwrap_or(batch.len());
        if end - start < 2 {
            return Ok(());
        }
        struct Move {
            slot: Arc<Slot>,
            from: String,
            to: String,
            inode: u64,
        }
        // Renames of one source are serialised (see `rename`).
        let mut files = lock(&source.files);
        let mut named: Vec<String> = Vec::new();
        let mut files_renamed = std::collections::HashSet::new();
        let mut moves = Vec::new();
        // Only the plain renames ahead of any other in the run: one left to
        // its row may fail, and what follows it must not have happened.
        let mut in_order = true;
        for row in (start..end).map(|i| batch.row(i)) {
            let Some(path) = row.path else {
                return Ok(());
            };
            if crate::confine::components(path).is_err()
                || !files_renamed.insert((row.file_key, row.generation))
            {
                return Ok(());
            }
            let to = self.dest(source, path);
            let Some(slot) = self.lookup(source, &mut files, row.file_key, row.generation)? else {
                // Its row creates it at its key's path, then moves it; or
                // refuses it, and then nothing after it may happen first.
                if row.generation != 1 || crate::confine::components(row.file_key).is_err() {
                    return Ok(());
                }
                named.push(self.dest(source, row.file_key));
                named.push(to);
                in_order = false;
                continue;
            };
            let state = lock(&slot.state);
            let from = state.record.dest_path.clone();
            // Into a directory that is there, onto no directory, of a file
            // that is where its record says: a move that would have to make
            // one, or could fail, is left to its row.
            let inode = match (in_order, &state.record.renamed_from) {
                (true, None) => self.inode_at(&from).ok().flatten(),
                _ => None,
            };
            let plain = !state.record.superseded
                && inode.is_some()
                && state.record.renamed_from.is_none()
                && from != to
                && !files.by_path.contains_key(&to)
                && !files.kept.contains_key(&to)
                && self.root.can_move_to(&to);
            named.extend(state.record.renamed_from.clone());
            drop(state);
            named.push(from.clone());
            named.push(to.clone());
            in_order &= plain;
            if let (true, Some(inode)) = (in_order, inode) {
                moves.push(Move {
                    slot,
                    from,
                    to,
                    inode,
                });
            }
        }
        let run = end - start;
        if moves.len() < 2 || paths_overlap(&named) {
            tracing::debug!(run, "renames left to their rows");
            return Ok(());
        }
        tracing::debug!(run, together = moves.len(), "renames made together");
        // As in `rename`: the intents are durable before any file moves.
        let mut intent = Vec::with_capacity(moves.len());
        for m in &moves {
            intent.extend(self.moves_away_from(source, &mut files, &m.to, work)?);
        }
        let mut marked = Vec::with_capacity(moves.len());
        for m in &moves {
            let mut state = lock(&m.slot.state);
            if state.moving || state.record.renamed_from.is_some() {
                // Another batch began moving it since it was looked at.
                drop(state);
                drop(marked);
                tracing::debug!(run, "renames left to their rows");
                return Ok(());
            }
            state.record.begin_move(m.to.clone(), m.inode);
            marked.push(Moving::mark(&m.slot, &mut state));
            intent.push(m.slot.clone());
        }
        let count = moves.len();
        self.record_durably(intent, || format!("recording the renames of {count} files"))?;
        let mut first_failure = None;
        let mut not_moved = Vec::new();
        for (m, moving) in moves.into_iter().zip(marked) {
            // A failure withdraws this file's intent (below): it keeps its
            // name and is left to its row, which tries again and refuses
            // the rename if the peer named a path that cannot be made. A
            // storage failure fails the batch. The other moves go on.
            let dirs = match self.root.rename(&m.from, &m.to) {
                Ok(dirs) => dirs,
                Err(error) => {
                    if !error.is_peer_error() {
                        first_failure.get_or_insert(confine_error(error));
                    }
                    not_moved.push((m.slot, moving));
                    continue;
                }
            };
            {
                let mut state = lock(&m.slot.state);
                work.request
                    .flush_before_record(&mut lock(&m.slot.unsynced), None, dirs);
                state.record.end_move();
                moving.made(&mut state);
            }
            files.by_path.remove(&m.from);
            files
                .by_path
                .insert(m.to, (m.slot.id.key.clone(), m.slot.id.generation));
            lock(&source.moved_away).made(m.from, m.slot.clone());
            work.renamed.insert(Arc::as_ptr(&m.slot) as usize);
            work.request.touched.push(m.slot);
        }
        if !not_moved.is_empty() {
            let (slots, moving): (Vec<_>, Vec<_>) = not_moved.into_iter().unzip();
            self.withdraw_intents(&slots)?;
            drop(moving);
        }
        first_failure.map_or(Ok(()), Err)
    }

    /// The inode of the file at `dest`, one of this sink's files, if it is there.
    fn inode_at(&self, dest: &str) -> Result<Option<u64>, RowError> {
        self.root.inode_at(dest).map_err(|e| {
            RowError::Storage(format!("finding the file at {dest} before moving it: {e}"))
        })
    }

    /// The files that moved away from `to` and whose moves may not be
    /// durable yet, once a move away from it that an earlier process
    /// recorded (and may not have made) is made: the round recording an
    /// intent to move another file to `to` flushes their moves first.
    /// Otherwise a crash could keep the intent and lose such a move, and
    /// settling the intent would move its file over the one that never
    /// left. The caller holds `files`, and no slot's state.
    fn moves_away_from(
        &self,
        source: &Source,
        files: &mut SourceFiles,
        to: &str,
        work: &mut BatchWork,
    ) -> Result<Vec<Arc<Slot>>, RowError> {
        self.settle_recorded_move_from(source, files, to, work)?;
        Ok(lock(&source.moved_away).made.remove(to).unwrap_or_default())
    }

    /// Makes a move away from `path` that an earlier process recorded (and
    /// may not have made) before anything else takes the path. The caller
    /// holds `files` and no slot's state.
    fn settle_recorded_move_from(
        &self,
        source: &Source,
        files: &mut SourceFiles,
        path: &str,
        work: &mut BatchWork,
    ) -> Result<(), RowError> {
        // Forgotten only once settled: a failure leaves it for the retry.
        let recorded = lock(&source.moved_away).recorded.get(path).cloned();
        let Some((key, generation)) = recorded else {
            return Ok(());
        };
        if let Some(slot) = self.lookup(source, files, &key, generation)? {
            let mut state = lock(&slot.state);
            if state.record.renamed_from.as_deref() == Some(path) {
                self.settle_rename(source, &slot, &mut state, work)?;
            }
        }
        lock(&source.moved_away).recorded.remove(path);
        Ok(())
    }

    /// Writes the records of `slots` as memory holds them now, synced, and
    /// returns once they are durable: by a commit round of their own once
    /// the committer runs, so the manifest has one writer and no placement
    /// thread holds the gate (which every round needs) across a synced
    /// write. Either way each file's pending flushes (`Slot::unsynced`) are
    /// done before its record is written, and a failure poisons the sink:
    /// memory may then be ahead of the manifest, and the restart settles
    /// every recorded intent by inode. The caller holds no slot's state.
    fn record_durably(
        &self,
        slots: Vec<Arc<Slot>>,
        what: impl FnOnce() -> String,
    ) -> Result<(), RowError> {
        let Some(committer) = self.committer.get() else {
            return self.record_without_committer(&slots, what);
        };
        let mut request = CommitRequest::default();
        request.touched = slots;
        committer
            .submit(request)
            .map_err(|e| e.to_string())
            .and_then(|answer| answer.wait())
            .map_err(|reason| RowError::Storage(format!("{}: {reason}", what())))
    }

    /// [`Self::record_durably`] before the committer runs: under the gate,
    /// as a round would.
    fn record_without_committer(
        &self,
        slots: &[Arc<Slot>],
        what: impl FnOnce() -> String,
    ) -> Result<(), RowError> {
        let gate = self.open_gate()?;
        let mut records = Vec::with_capacity(slots.len());
        for slot in slots {
            let state = lock(&slot.state);
            self.flush_unsynced_now(slot, &gate)?;
            records.push((slot.id.clone(), state.record.clone()));
        }
        self.record_now(records, what)
    }

    /// Writes `records` to the manifest at once, synced, outside a commit
    /// round (before the committer runs). The caller holds the gate.
    /// A failed write may or may not have left the records in the manifest,
    /// and memory cannot follow both: it poisons the sink, as a failed round
    /// does, and the restart settles an intent by inode.
    fn record_now(
        &self,
        records: Vec<(FileId, FileRecord)>,
        what: impl FnOnce() -> String,
    ) -> Result<(), RowError> {
        let commit = SinkCommit {
            records,
            ..SinkCommit::default()
        };
        self.manifest.commit(&commit).map_err(|e| {
            let reason = format!("{}: {e}", what());
            self.health.poison(reason.clone());
            RowError::Storage(reason)
        })
    }

    /// Takes back the rename intents of files whose move failed: each lives
    /// at its old name again, in memory and (durably) in the manifest, so no
    /// later open tries to finish a move that cannot be made. A rename fails
    /// before the file moves or not at all, so the old name is where it is.
    /// Should the write fail, the sink is poisoned, and its restart settles
    /// the intents the manifest still holds by inode.
    fn withdraw_intents(&self, slots: &[Arc<Slot>]) -> Result<(), RowError> {
        let mut withdrawn = Vec::with_capacity(slots.len());
        for slot in slots {
            let mut state = lock(&slot.state);
            if state.record.renamed_from.is_some() {
                state.record.undo_move();
                withdrawn.push(slot.clone());
            }
        }
        if withdrawn.is_empty() {
            return Ok(());
        }
        let count = withdrawn.len();
        self.record_durably(withdrawn, || {
            format!("withdrawing the rename intents of {count} files whose move failed")
        })
    }

    /// Whether `dest` is still the file `written` describes (the slot's
    /// descriptor): not replaced or removed behind the sink's back, nor
    /// taken by another file's rename.
    fn still_at(&self, dest: &str, written: &std::fs::Metadata) -> bool {
        use std::os::unix::fs::MetadataExt;
        let Ok(Ok(there)) = self.root.open_for_read(dest).map(|file| file.metadata()) else {
            return false;
        };
        written.nlink() > 0 && there.dev() == written.dev() && there.ino() == written.ino()
    }

    /// Digest of the first `size` bytes of `dest` as they are on disk.
    fn digest_on_disk(&self, dest: &str, size: u64, kind: SealDigest) -> Result<String, RowError> {
        let reader = self.root.open_for_read(dest).map_err(confine_error)?;
        kind.of_file_prefix(&reader, size)
            .map_err(|e| RowError::Storage(format!("hashing {dest}: {e}")))
    }

    /// A watcher that switched algorithms re-sends the seal of a sealed file:
    /// the bytes on disk decide. Failing to read them refuses only this row
    /// (a storage error would have the whole batch retried forever).
    /// The caller has settled any recorded move of the file.
    fn reseal_matches(
        &self,
        state: &SlotState,
        size: u64,
        kind: SealDigest,
        digest: &str,
    ) -> Result<bool, RowError> {
        if state.record.superseded {
            return Err(RowError::Superseded(
                "a newer generation replaced this one; seal ignored".into(),
            ));
        }
        let dest = &state.record.dest_path;
        self.digest_on_disk(dest, size, kind)
            .map(|actual| actual == digest)
            .map_err(|e| {
                RowError::Reject(format!(
                    "already sealed at size {size}; cannot check its {kind} digest: {}",
                    e.into_message()
                ))
            })
    }

    fn seal(&self, source: &Source, row: &Row<'_>, work: &mut BatchWork) -> Result<(), RowError> {
        let digest = row
            .digest
            .ok_or_else(|| RowError::Peer("a Seal row needs a digest".into()))?;
        // Only this seal is refused: other rows of the batch are unaffected.
        let kind = SealDigest::of_digest(digest).map_err(|e| RowError::Reject(e.to_string()))?;
        let size = row.offset;
        let slot = self.slot_or_create(source, row, work)?;
        let mut state = lock(&slot.state);
        if state.deferred_writes > 0 {
            // A round in progress may have recorded ranges whose deferred
            // writes are still under way: the digest below must see their
            // bytes. Once the gate is free no round is in progress, and with
            // it held until the slot is locked again, every range the record
            // holds was recorded by a round that has ended.
            drop(state);
            let gate = self.open_gate()?;
            state = lock(&slot.state);
            drop(gate);
        }
        if let Some(sealed) = state.record.sealed.clone() {
            let same = sealed.size == size
                && (sealed.digest == digest
                    || (SealDigest::of_digest(&sealed.digest).ok() != Some(kind)
                        && self
                            .settle_rename(source, &slot, &mut state, work)
                            .and_then(|()| self.reseal_matches(&state, size, kind, digest))?));
            return if same {
                drop(state);
                work.request.touched.push(slot);
                Ok(())
            } else {
                Err(RowError::Reject(format!(
                    "already sealed at size {} with another digest",
                    sealed.size
                )))
            };
        }
        if state.record.superseded {
            return Err(RowError::Superseded(
                "a newer generation replaced this one; seal ignored".into(),
            ));
        }
        let placed = &state.record.placed;
        if !placed.covers(0, size) || placed.total_len() != size {
            let missing = placed.missing(0, size);
            return Err(RowError::Reject(format!(
                "cannot seal at size {size}: {} bytes placed, missing {:?}",
                placed.total_len(),
                &missing[..missing.len().min(8)]
            )));
        }
        if let Some(&(start, end)) = state.pending.ranges().first() {
            // All of 0..size is recorded, so these lie past it: data the
            // sender wrote after the size it seals at.
            return Err(RowError::Reject(format!(
                "cannot seal at size {size}: bytes {start}..{end} past it are being written"
            )));
        }
        let file = self.file_of(source, &slot, &mut state, work)?;
        let dest = state.record.dest_path.clone();
        let meta = file
            .metadata()
            .map_err(|e| RowError::Storage(format!("stat {dest}: {e}")))?;
        let len = meta.len();
        if len > size {
            // Bytes past the final size were never recorded (an earlier crash
            // or an older file): the destination must end where the source does.
            file.set_len(size)
                .map_err(|e| RowError::Storage(format!("truncating {dest} to {size}: {e}")))?;
            work.request
                .flush_before_record(&mut lock(&slot.unsynced), Some(&file), []);
        }
        // The checksum of the bytes written vouches for the file they were
        // written to: only while that is still the file at `dest`, whole.
        let written = match kind {
            SealDigest::Crc64Nvme if !self.seal_read_back && len >= size => state
                .written_crc
                .of_whole(size)
                .filter(|_| self.still_at(&dest, &meta)),
            _ => None,
        };
        let (actual, of_what) = match written {
            Some(crc) => (checksum::crc64nvme_digest(crc), "the bytes written to"),
            None => {
                // Reading a whole file back must not hold up the batches of
                // this file (nor the rounds recording it) meanwhile: bytes
                // 0..size are all recorded, and only a sealed file is never
                // written again, so what may change while unlocked is checked
                // again after.
                drop(state);
                let actual = self.digest_on_disk(&dest, size, kind)?;
                state = lock(&slot.state);
                let sealed_alike = state
                    .record
                    .sealed
                    .as_ref()
                    .is_some_and(|sealed| sealed.size == size && sealed.digest == digest);
                if sealed_alike {
                    // The same seal, sent again and placed meanwhile.
                    drop(state);
                    work.request.touched.push(slot);
                    return Ok(());
                }
                let unchanged = state.record.sealed.is_none()
                    && !state.record.superseded
                    && state.record.dest_path == dest
                    && state.record.renamed_from.is_none()
                    && state.pending.is_empty()
                    && state.record.placed.total_len() == size;
                if !unchanged {
                    return Err(RowError::Storage(format!(
                        "{dest} changed while its seal at size {size} was checked; the batch is sent again"
                    )));
                }
                (actual, "the file")
            }
        };
        if actual != digest {
            return Err(RowError::Reject(format!(
                "digest of {of_what} {dest} is {actual}, the source says {digest}"
            )));
        }
        state.record.sealed = Some(Sealed {
            size,
            digest: digest.to_owned(),
        });
        // A sealed file takes no more writes: give its descriptor back.
        state.close_file();
        state.written_crc = WrittenCrc::Unknown;
        drop(state);
        work.request.touched.push(slot);
        Ok(())
    }
}

/// A move this batch is making (see [`SlotState::moving`]): marked under
/// the file's state, together with the intent; unmarked by
/// [`Self::made`] once the move is made or taken back, or when dropped on
/// a failure. Dropping it locks the file's state, so a holder lets go of
/// that lock first.
struct Moving(Option<Arc<Slot>>);

impl Moving {
    fn mark(slot: &Arc<Slot>, state: &mut SlotState) -> Self {
        state.moving = true;
        Self(Some(slot.clone()))
    }

    /// The move is over; the caller holds the file's state.
    fn made(mut self, state: &mut SlotState) {
        state.moving = false;
        self.0 = None;
    }
}

impl Drop for Moving {
    fn drop(&mut self) {
        if let Some(slot) = self.0.take() {
            lock(&slot.state).moving = false;
        }
    }
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

/// Whether two of `paths` are the same, or one lies inside the other.
fn paths_overlap(paths: &[String]) -> bool {
    let mut seen = std::collections::HashSet::with_capacity(paths.len());
    if !paths.iter().all(|path| seen.insert(path.as_str())) {
        return true;
    }
    paths.iter().any(|path| {
        path.match_indices('/')
            .any(|(slash, _)| seen.contains(&path[..slash]))
    })
}

fn confine_error(e: ConfineError) -> RowError {
    if e.is_peer_error() {
        RowError::Peer(e.to_string())
    } else {
        RowError::Storage(e.to_string())
    }
}

/// The CRC-32C of the first `len` bytes of a destination file, for
/// reconciliation; an error says which file could not be read, and why.
pub(crate) fn head_crc(root: &Root, dest: &str, len: u64) -> Result<u32, String> {
    let file = root
        .open_for_read(dest)
        .map_err(|e| format!("opening {dest}: {e}"))?;
    flight_server::checksum::crc32c_of_file_prefix(&file, len)
        .map_err(|e| format!("reading the first {len} bytes of {dest}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flush::SyncTarget;
    use flight_server::BatchBuilder;

    /// A scratch root and state directory, removed on drop.
    struct Fixture {
        dir: std::path::PathBuf,
    }

    impl Fixture {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!(
                "tailflight-placement-{name}-{}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(dir.join("root")).unwrap();
            Self { dir }
        }

        fn placer(&self) -> Placer {
            self.placer_with(Layout::PerSource, SupersededPolicy::Mirror, 64 << 10)
        }

        fn placer_with(
            &self,
            layout: Layout,
            superseded: SupersededPolicy,
            journal_max_range: u64,
        ) -> Placer {
            Placer::new(
                Root::open(&self.dir.join("root")).unwrap(),
                SinkManifest::open(&self.dir.join("state")).unwrap(),
                layout,
                superseded,
                64,
                CommitGate::default(),
                Journal {
                    max_range: journal_max_range,
                    backlog: Arc::default(),
                },
            )
        }

        fn dest(&self, path: &str) -> std::path::PathBuf {
            self.dir.join("root").join(path)
        }

        fn journal_file(&self) -> std::path::PathBuf {
            self.dir.join("journal.ring")
        }
    }

    /// What a commit round does to the records of a batch it recorded.
    fn record_placed(request: &CommitRequest) {
        for (slot, ranges) in &request.placed {
            let mut state = lock(&slot.state);
            for &(start, end) in ranges {
                state.record.placed.insert(start, end);
                state.pending.remove(start, end);
            }
        }
    }

    /// Places `batch` and does what its round would: its deferred writes,
    /// then its records in memory.
    fn place_and_record(placer: &Placer, source: &Source, seq: u64, batch: &RangeBatch) {
        let (request, _, deferred) = placer.place(source, seq, batch).unwrap();
        deferred.write(batch).unwrap();
        record_placed(&request);
    }

    /// A validated batch of the rows `build` pushes.
    fn rows(build: impl FnOnce(&mut BatchBuilder)) -> RangeBatch {
        let mut builder = BatchBuilder::with_capacity(4, 64);
        build(&mut builder);
        RangeBatch::validate(builder.finish()).unwrap()
    }

    /// Where `bytes` are in a journal file written as the concatenation of
    /// "head", "tail", "gone".
    fn in_journal(bytes: &[u8]) -> JournalBytes {
        let position = match bytes {
            b"head" => 0,
            b"tail" => 4,
            _ => 8,
        };
        JournalBytes::InFile {
            position,
            len: bytes.len() as u32,
            crc32c: checksum::crc32c(bytes),
        }
    }

    /// Small ranges of a file the batch does not create go to the journal,
    /// and reach their file only through the deferred writes, once the
    /// batch is submitted; a seal is refused while ranges past its size are
    /// still in flight.
    #[test]
    fn journaled_ranges_reach_their_file_through_the_deferred_writes() {
        let fixture = Fixture::new("deferred");
        let placer = fixture.placer();
        let source = placer.source("s").unwrap();
        let dest = fixture.dest("s/a.dat");
        let batch = |build: &dyn Fn(&mut BatchBuilder)| {
            let mut builder = BatchBuilder::with_capacity(4, 64);
            build(&mut builder);
            RangeBatch::validate(builder.finish()).unwrap()
        };
        let record = record_placed;
        let digest = |bytes: &[u8]| {
            let mut hasher = SealDigest::Crc64Nvme.hasher();
            hasher.update(bytes);
            hasher.finish()
        };

        let first = batch(&|b| b.push_data("a.dat", 1, 0, b"head"));
        let (request, _, deferred) = placer.place(&source, 1, &first).unwrap();
        assert!(deferred.is_empty(), "a new file is flushed, not journaled");
        assert_eq!(std::fs::read(&dest).unwrap(), b"head");
        record(&request);

        let second = batch(&|b| b.push_data("a.dat", 1, 4, b"tail"));
        let (request, ack, deferred) = placer.place(&source, 2, &second).unwrap();
        assert_eq!((ack.placed, request.journal_bytes), (4, 4));
        assert!(!deferred.is_empty());
        assert_eq!(
            std::fs::read(&dest).unwrap(),
            b"head",
            "written only once submitted"
        );

        let early_seal = batch(&|b| b.push_seal("a.dat", 1, 4, &digest(b"head")));
        let (_, ack, _) = placer.place(&source, 3, &early_seal).unwrap();
        assert_eq!(ack.rejected.len(), 1);
        assert!(
            ack.rejected[0]
                .error
                .contains("4..8 past it are being written"),
            "{}",
            ack.rejected[0].error
        );

        let slot = request.placed[0].0.clone();
        assert_eq!(lock(&slot.state).deferred_writes, 1);
        deferred.write(&second).unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"headtail");
        // Nothing in flight: a seal need not wait for a round to end.
        assert_eq!(lock(&slot.state).deferred_writes, 0);
        record(&request);
        let seal = batch(&|b| b.push_seal("a.dat", 1, 8, &digest(b"headtail")));
        let (_, ack, _) = placer.place(&source, 4, &seal).unwrap();
        assert!(ack.rejected.is_empty(), "{:?}", ack.rejected[0].error);
    }

    /// Large ranges written in place put their aligned middle through the
    /// direct descriptor (where the filesystem allows) and their head and
    /// tail through the page cache; the file comes out byte-exact, a
    /// re-delivery writes nothing, and the seal (told to) reads it back whole.
    #[test]
    fn large_ranges_write_their_aligned_middle_directly_and_land_byte_exact() {
        let fixture = Fixture::new("direct");
        let placer = fixture
            .placer()
            .with_direct_writes(8192)
            .with_seal_read_back(true);
        let source = placer.source("s").unwrap();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 253) as u8).collect();
        let batch = |offset: usize, len: usize| {
            let mut builder = BatchBuilder::with_capacity(4, len + 64);
            builder.push_data("big.dat", 1, offset as u64, &data[offset..offset + len]);
            RangeBatch::validate(builder.finish()).unwrap()
        };
        // Past the journal's 64 KiB: an aligned start, then two unaligned ones.
        for (seq, (offset, len)) in [(0, 70_000), (70_000, 100_123), (170_123, 129_877)]
            .into_iter()
            .enumerate()
        {
            let (request, ack, deferred) = placer
                .place(&source, seq as u64 + 1, &batch(offset, len))
                .unwrap();
            assert!(deferred.is_empty(), "ranges this large are not journaled");
            assert_eq!(ack.placed, len as u64);
            record_placed(&request);
            if seq == 0 {
                let state = lock(&request.placed[0].0.state);
                assert!(
                    !matches!(state.direct, DirectFile::NotOpened),
                    "the first large range opens the direct descriptor (or finds it refused)"
                );
            }
        }
        assert!(std::fs::read(fixture.dest("s/big.dat")).unwrap() == data);

        let (_, ack, _) = placer.place(&source, 4, &batch(70_000, 100_123)).unwrap();
        assert_eq!((ack.placed, ack.duplicate), (0, 100_123));
        assert!(std::fs::read(fixture.dest("s/big.dat")).unwrap() == data);

        let mut hasher = SealDigest::Crc64Nvme.hasher();
        hasher.update(&data);
        let mut builder = BatchBuilder::with_capacity(1, 64);
        builder.push_seal("big.dat", 1, data.len() as u64, &hasher.finish());
        let seal = RangeBatch::validate(builder.finish()).unwrap();
        let (_, ack, _) = placer.place(&source, 5, &seal).unwrap();
        assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
    }

    /// A seal is checked against the CRC-64 of the bytes as this process
    /// wrote them; the file is read back when told to, when its ranges were
    /// placed by an earlier process, and when the path no longer leads to
    /// the file they were written to. (Bytes changed inside that file behind
    /// the sink's back show only in a read-back: the check is on the
    /// transfer, not on the disk.)
    #[test]
    fn seals_check_the_bytes_as_written_and_read_back_what_an_earlier_run_wrote() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 11 + i / 97) as u8).collect();
        let digest = |bytes: &[u8]| {
            let mut hasher = SealDigest::Crc64Nvme.hasher();
            hasher.update(bytes);
            hasher.finish()
        };
        let seal_batch = |digest: &str| {
            let mut builder = BatchBuilder::with_capacity(1, 64);
            builder.push_seal("f.dat", 1, data.len() as u64, digest);
            RangeBatch::validate(builder.finish()).unwrap()
        };
        // Places `data` in three ranges, the last one first, and records
        // them as a commit round would (in the manifest too).
        let place_all = |placer: &Placer, source: &Source| {
            for (seq, (start, end)) in [(150_000, 200_000), (0, 70_000), (70_000, 150_000)]
                .into_iter()
                .enumerate()
            {
                let mut builder = BatchBuilder::with_capacity(1, end - start + 64);
                builder.push_data("f.dat", 1, start as u64, &data[start..end]);
                let batch = RangeBatch::validate(builder.finish()).unwrap();
                let (request, ack, _) = placer.place(source, seq as u64 + 1, &batch).unwrap();
                assert_eq!(ack.placed, (end - start) as u64);
                for (slot, ranges) in &request.placed {
                    let mut state = lock(&slot.state);
                    for &(s, e) in ranges {
                        state.record.placed.insert(s, e);
                        state.pending.remove(s, e);
                    }
                    let commit = SinkCommit {
                        records: vec![(slot.id.clone(), state.record.clone())],
                        ..SinkCommit::default()
                    };
                    placer.manifest.commit(&commit).unwrap();
                }
            }
        };
        let damage = |path: &Path| {
            let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            file.write_all_at(b"X", 100).unwrap();
        };
        let rejected = |placer: &Placer, source: &Source, digest: &str| {
            let (_, ack, _) = placer.place(source, 10, &seal_batch(digest)).unwrap();
            ack.rejected.first().map(|r| r.error.clone())
        };

        // Written here: the seal is checked without reading the file.
        let fixture = Fixture::new("seal-written");
        let placer = fixture.placer();
        let source = placer.source("s").unwrap();
        place_all(&placer, &source);
        damage(&fixture.dest("s/f.dat"));
        let wrong = rejected(&placer, &source, &digest(&data[1..])).expect("a wrong digest");
        assert!(wrong.contains("the source says"), "{wrong}");
        assert_eq!(rejected(&placer, &source, &digest(&data)), None);

        // Told to read back: the damage shows.
        let fixture = Fixture::new("seal-read-back");
        let placer = fixture.placer().with_seal_read_back(true);
        let source = placer.source("s").unwrap();
        place_all(&placer, &source);
        damage(&fixture.dest("s/f.dat"));
        assert!(rejected(&placer, &source, &digest(&data)).is_some());

        // Replaced behind the sink's back: the file at the path is read.
        let fixture = Fixture::new("seal-replaced");
        let placer = fixture.placer();
        let source = placer.source("s").unwrap();
        place_all(&placer, &source);
        let path = fixture.dest("s/f.dat");
        std::fs::remove_file(&path).unwrap();
        let mut other = data.clone();
        other[5] ^= 1;
        std::fs::write(&path, &other).unwrap();
        let error = rejected(&placer, &source, &digest(&data)).expect("read back");
        assert!(error.contains("digest of the file"), "{error}");

        // Replaced while its descriptor was evicted: the descriptor opened
        // again reaches another file, and what was written before is not
        // vouched for any more.
        let fixture = Fixture::new("seal-reopened");
        let placer = fixture.placer();
        let source = placer.source("s").unwrap();
        let mut builder = BatchBuilder::with_capacity(1, 120_064);
        builder.push_data("f.dat", 1, 0, &data[..120_000]);
        let batch = RangeBatch::validate(builder.finish()).unwrap();
        let (request, _, _) = placer.place(&source, 1, &batch).unwrap();
        let slot = request.placed[0].0.clone();
        {
            let mut state = lock(&slot.state);
            state.record.placed.insert(0, 120_000);
            state.pending.remove(0, 120_000);
            state.close_file();
        }
        std::fs::remove_file(fixture.dest("s/f.dat")).unwrap();
        let mut builder = BatchBuilder::with_capacity(1, 80_064);
        builder.push_data("f.dat", 1, 120_000, &data[120_000..]);
        let batch = RangeBatch::validate(builder.finish()).unwrap();
        placer.place(&source, 2, &batch).unwrap();
        {
            let mut state = lock(&slot.state);
            state.record.placed.insert(120_000, 200_000);
            state.pending.remove(120_000, 200_000);
        }
        let error = rejected(&placer, &source, &digest(&data)).expect("read back");
        assert!(error.contains("digest of the file"), "{error}");

        // Placed by an earlier process: read back, and the damage shows.
        let fixture = Fixture::new("seal-restarted");
        let placer = fixture.placer();
        let source = placer.source("s").unwrap();
        place_all(&placer, &source);
        drop((source, placer));
        damage(&fixture.dest("s/f.dat"));
        let placer = fixture.placer();
        let source = placer.source("s").unwrap();
        let error = rejected(&placer, &source, &digest(&data)).expect("read back");
        assert!(error.contains("the source says"), "{error}");
        std::fs::write(fixture.dest("s/f.dat"), &data).unwrap();
        assert_eq!(rejected(&placer, &source, &digest(&data)), None);
    }

    /// Keeping a superseded generation aside never renames it over another
    /// file: a live file of the source named `<dest>.gen<N>` stays, and the
    /// old generation goes to the next free name; a file created later under
    /// the kept name moves the kept one on instead of writing into it.
    #[test]
    fn a_kept_generation_goes_aside_without_replacing_a_live_file() {
        let fixture = Fixture::new("keep-aside");
        let placer = fixture.placer_with(Layout::PerSource, SupersededPolicy::Keep, 0);
        let source = placer.source("s").unwrap();
        let mut builder = BatchBuilder::with_capacity(4, 256);
        builder.push_data("a.dat", 1, 0, b"old generation");
        builder.push_data("a.dat.gen1", 1, 0, b"a live file");
        let (request, ack, _) = placer
            .place(&source, 1, &RangeBatch::validate(builder.finish()).unwrap())
            .unwrap();
        assert!(ack.rejected.is_empty());
        record_placed(&request);
        let mut builder = BatchBuilder::with_capacity(2, 256);
        builder.push_open("a.dat", 2, "a.dat");
        builder.push_data("a.dat", 2, 0, b"new");
        let (_, ack, _) = placer
            .place(&source, 2, &RangeBatch::validate(builder.finish()).unwrap())
            .unwrap();
        assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
        let read = |path: &str| std::fs::read(fixture.dest(path)).unwrap();
        assert_eq!(read("s/a.dat.gen1"), b"a live file");
        assert_eq!(read("s/a.dat.gen1.1"), b"old generation");
        assert_eq!(read("s/a.dat"), b"new");

        // A new source file named like the kept one: the kept file moves on
        // (and its record with it), the new one gets the name.
        let mut builder = BatchBuilder::with_capacity(1, 256);
        builder.push_data("a.dat.gen1.1", 1, 0, b"newcomer");
        let (request, ack, _) = placer
            .place(&source, 3, &RangeBatch::validate(builder.finish()).unwrap())
            .unwrap();
        assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
        assert_eq!(read("s/a.dat.gen1.1"), b"newcomer");
        assert_eq!(read("s/a.dat.gen1.1.1"), b"old generation");
        let moved = request
            .touched
            .iter()
            .find(|slot| slot.id.key == "a.dat" && slot.id.generation == 1)
            .expect("the kept generation's record is committed");
        assert_eq!(lock(&moved.state).record.dest_path, "s/a.dat.gen1.1.1");
    }

    /// Under `--superseded keep`, the move aside of the old generation is
    /// recorded before the new generation's file takes its path: a crash
    /// before their round leaves the old record naming the kept file, not
    /// the new one. An intent whose move the crash lost is made when the new
    /// generation comes again.
    #[test]
    fn a_generation_kept_aside_is_recorded_before_its_path_is_taken() {
        let fixture = Fixture::new("keep-crash");
        std::fs::create_dir_all(fixture.dest("s")).unwrap();
        std::fs::write(fixture.dest("s/a.dat"), b"old generation").unwrap();
        let live = (file_of_s("a.dat"), record("s/a.dat", 14));
        fixture
            .placer()
            .manifest
            .commit(&SinkCommit {
                records: vec![live],
                ..SinkCommit::default()
            })
            .unwrap();
        let keeping = || fixture.placer_with(Layout::PerSource, SupersededPolicy::Keep, 0);
        let new = rows(|b| {
            b.push_open("a.dat", 2, "a.dat");
            b.push_data("a.dat", 2, 0, b"new");
        });
        let old_record = |placer: &Placer| {
            let records = placer.manifest.files_of_source("s").unwrap();
            let (_, record) = records
                .into_iter()
                .find(|(id, _)| id.key == "a.dat" && id.generation == 1)
                .unwrap();
            record
        };

        let placer = keeping();
        let source = placer.source("s").unwrap();
        let (_, ack, deferred) = placer.place(&source, 1, &new).unwrap();
        assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
        deferred.write(&new).unwrap();
        // The crash: no round ran.
        drop(source);
        let kept = old_record(&placer);
        assert_eq!(kept.dest_path, "s/a.dat.gen1");
        assert!(kept.superseded && kept.kept, "{kept:?}");
        assert_eq!(
            std::fs::read(fixture.dest("s/a.dat.gen1")).unwrap(),
            b"old generation"
        );
        assert_eq!(std::fs::read(fixture.dest("s/a.dat")).unwrap(), b"new");
        drop(placer);

        // The same intent, with its move lost: the old file is back at
        // a.dat and the new one never made.
        std::fs::rename(fixture.dest("s/a.dat.gen1"), fixture.dest("s/a.dat")).unwrap();
        let placer = keeping();
        let source = placer.source("s").unwrap();
        let (_, ack, deferred) = placer.place(&source, 1, &new).unwrap();
        assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
        deferred.write(&new).unwrap();
        assert_eq!(
            std::fs::read(fixture.dest("s/a.dat.gen1")).unwrap(),
            b"old generation"
        );
        assert_eq!(std::fs::read(fixture.dest("s/a.dat")).unwrap(), b"new");
        assert_eq!(old_record(&placer).dest_path, "s/a.dat.gen1");
    }

    /// Every file under a fixture's root, with its bytes.
    fn tree(fixture: &Fixture) -> std::collections::BTreeMap<String, Vec<u8>> {
        fn walk(dir: &Path, prefix: &str, out: &mut std::collections::BTreeMap<String, Vec<u8>>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let entry = entry.unwrap();
                let name = format!("{prefix}{}", entry.file_name().to_string_lossy());
                if entry.file_type().unwrap().is_dir() {
                    walk(&entry.path(), &format!("{name}/"), out);
                } else {
                    out.insert(name, std::fs::read(entry.path()).unwrap());
                }
            }
        }
        let mut out = std::collections::BTreeMap::new();
        walk(&fixture.dir.join("root"), "", &mut out);
        out
    }

    /// A writer rotating its chunks renames many files in one batch. A run
    /// of Rename rows that name no path twice has its plain renames made
    /// together, with one manifest write, at the run's place in the batch;
    /// one over a live file waits for its row, and so do those after it.
    /// Every file ends up where placing the rows one by one puts it, also
    /// when the batch comes again.
    #[test]
    fn a_run_of_renames_is_made_together() {
        enum Step {
            Data(&'static str),
            Rename(&'static str, &'static str),
        }
        use Step::{Data, Rename};
        let steps = [
            Data("x"),
            Rename("a.tmp", "a"),
            Rename("b.tmp", "b"),
            Data("z"),
            Rename("d.tmp", "d"),
            Rename("e.tmp", "e"),
            Rename("c.tmp", "c"),
            Rename("f.tmp", "f"),
        ];
        let batch_of = |steps: &[Step]| {
            let mut builder = BatchBuilder::with_capacity(steps.len(), 256);
            for step in steps {
                match step {
                    Data(key) => builder.push_data(key, 1, 0, format!("bytes of {key}").as_bytes()),
                    Rename(key, to) => builder.push_rename(key, 1, to),
                }
            }
            RangeBatch::validate(builder.finish()).unwrap()
        };
        let start = |name: &str| {
            let fixture = Fixture::new(name);
            let placer = fixture.placer();
            let source = placer.source("s").unwrap();
            let setup = ["a.tmp", "b.tmp", "c.tmp", "d.tmp", "e.tmp", "f.tmp", "c"].map(Data);
            let (request, ack, _) = placer.place(&source, 1, &batch_of(&setup)).unwrap();
            assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
            record_placed(&request);
            (fixture, placer, source)
        };

        // One row per batch: the order the batch's rows ask for.
        let (one_by_one, placer, source) = start("renames-one-by-one");
        for (seq, step) in steps.iter().enumerate() {
            let batch = batch_of(std::slice::from_ref(step));
            let (_, ack, _) = placer.place(&source, seq as u64 + 2, &batch).unwrap();
            assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
        }
        let expected = tree(&one_by_one);
        assert_eq!(
            expected["s/c"], b"bytes of c.tmp",
            "the live c was superseded"
        );
        assert_eq!(expected["s/e"], b"bytes of e.tmp");
        assert!(!expected.contains_key("s/a.tmp"));

        // The whole batch at once.
        let (together, placer, source) = start("renames-together");
        let (request, ack, _) = placer.place(&source, 2, &batch_of(&steps)).unwrap();
        assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
        assert_eq!(tree(&together), expected);
        // Each moved file waits for its directories to be flushed before any
        // round may write its record: this batch's, or another's first.
        let to_flush: std::collections::HashSet<usize> = request
            .dirs_to_sync
            .iter()
            .map(|dir| Arc::as_ptr(dir) as usize)
            .collect();
        let mut moved = 0;
        for slot in &request.touched {
            let state = lock(&slot.state);
            if state.record.renamed_from.is_none() && slot.id.key.ends_with(".tmp") {
                moved += 1;
                let unsynced = lock(&slot.unsynced);
                assert!(
                    !unsynced.is_empty(),
                    "{} waits for its directories",
                    slot.id.key
                );
                for pending in unsynced.iter() {
                    assert!(matches!(pending.target, SyncTarget::Dir(_)));
                    assert!(to_flush.contains(&pending.target.address()));
                }
            }
        }
        assert_eq!(moved, 6);

        // The runs alone, then the batch again (as a re-delivery would).
        let (runs, placer, source) = start("renames-runs");
        let batch = batch_of(&steps);
        let mut work = BatchWork {
            request: CommitRequest::default(),
            ack: Ack::default(),
            deferred: DeferredWrites::default(),
            renamed: Default::default(),
        };
        for first in [1, 4] {
            if let Err(e) = placer.rename_run_at(&source, &batch, first, &mut work) {
                panic!("{}", e.into_message());
            }
        }
        let moved = tree(&runs);
        for (key, to) in [
            ("a.tmp", "s/a"),
            ("b.tmp", "s/b"),
            ("d.tmp", "s/d"),
            ("e.tmp", "s/e"),
        ] {
            assert!(
                moved.contains_key(to) && !moved.contains_key(&format!("s/{key}")),
                "{key} moved"
            );
            let id = FileId {
                source: "s".into(),
                key: key.into(),
                generation: 1,
            };
            // Its intent was durable before it moved.
            let recorded = placer.manifest.get(&id).unwrap().unwrap();
            assert_eq!(recorded.dest_path, to);
            assert_eq!(recorded.renamed_from, Some(format!("s/{key}")));
        }
        assert_eq!(
            moved["s/c"], b"bytes of c",
            "the rename over a live file waits for its row"
        );
        assert!(
            moved.contains_key("s/f.tmp"),
            "and so does every rename after it in the run"
        );
        assert!(!moved.contains_key("s/x"), "no other row ran");
        assert_eq!(work.request.touched.len(), 4);
        let (_, ack, _) = placer.place(&source, 2, &batch).unwrap();
        assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
        assert_eq!(tree(&runs), expected);
    }

    /// A batch that moved a file and then failed never reaches a round, and
    /// its request held the directories to fsync: the file keeps them, and
    /// the next round that records it (any batch's) flushes them first.
    #[test]
    fn a_failed_batchs_move_is_flushed_by_the_next_round_recording_the_file() {
        let fixture = Fixture::new("failed-move");
        let placer = fixture.placer();
        let source = placer.source("s").unwrap();
        let place = |seq, build: &dyn Fn(&mut BatchBuilder)| {
            let mut builder = BatchBuilder::with_capacity(2, 64);
            build(&mut builder);
            placer.place(
                &source,
                seq,
                &RangeBatch::validate(builder.finish()).unwrap(),
            )
        };
        let (request, _, _) = place(1, &|b| b.push_data("a.tmp", 1, 0, b"first")).unwrap();
        record_placed(&request);
        let failed = place(2, &|b| {
            b.push_rename("a.tmp", 1, "a");
            b.push_data("never-opened", 5, 0, b"refused");
        });
        assert!(matches!(failed, Err(SinkError::Peer(_))));
        assert!(
            fixture.dest("s/a").exists(),
            "moved before the batch failed"
        );

        let (request, _, _) = place(3, &|b| b.push_data("a.tmp", 1, 5, b" more")).unwrap();
        assert!(request.dirs_to_sync.is_empty(), "this batch moved nothing");
        let round = [crate::commit::Queued {
            request,
            queued: std::time::Instant::now(),
            reply: tokio::sync::oneshot::channel().0,
        }];
        let slot = round[0].request.touched[0].clone();
        let waiting: Vec<usize> = lock(&slot.unsynced)
            .iter()
            .map(|pending| pending.target.address())
            .collect();
        assert!(!waiting.is_empty());
        let (targets, _) = crate::commit::sync_targets(&round);
        let targets: std::collections::HashSet<usize> =
            targets.iter().map(SyncTarget::address).collect();
        assert!(
            waiting.iter().all(|w| targets.contains(w)),
            "the round flushes the move"
        );

        // A later change queued meanwhile, through the same directory handle
        // (one request opens a directory once): it waits for a flush of its
        // own, though the round flushed that very handle.
        let open_dir = || {
            rustix::fs::open(
                fixture.dest("s"),
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
                rustix::fs::Mode::empty(),
            )
            .unwrap()
        };
        let mut other = CommitRequest::default();
        other.flush_before_record(&mut lock(&slot.unsynced), None, [open_dir()]);
        let (_, tokens) = crate::commit::sync_targets(&round);
        other.flush_before_record(&mut lock(&slot.unsynced), None, [open_dir()]);
        assert_eq!(other.dirs_to_sync.len(), 1, "one handle for the directory");
        crate::commit::forget_flushed(&round, &tokens);
        let left: Vec<usize> = lock(&slot.unsynced)
            .iter()
            .map(|pending| pending.target.address())
            .collect();
        assert_eq!(left, [Arc::as_ptr(&other.dirs_to_sync[0]) as usize]);
    }

    /// A rename whose new name cannot be made (a file where its directory
    /// should be) is refused: its intent is taken back, durably, and the
    /// file goes on under its old name.
    #[test]
    fn a_rename_that_cannot_be_made_leaves_the_file_at_its_name() {
        let fixture = Fixture::new("rename-refused");
        let placer = fixture.placer();
        let source = placer.source("s").unwrap();
        let first = rows(|b| b.push_data("a.tmp", 1, 0, b"first"));
        let (request, _, _) = placer.place(&source, 1, &first).unwrap();
        record_placed(&request);
        std::fs::write(fixture.dest("s/blocker"), b"a file, not a directory").unwrap();
        let id = FileId {
            source: "s".into(),
            key: "a.tmp".into(),
            generation: 1,
        };

        for (seq, to) in [(2, "blocker/a"), (3, "blocker")] {
            if to == "blocker" {
                std::fs::remove_file(fixture.dest("s/blocker")).unwrap();
                std::fs::create_dir_all(fixture.dest("s/blocker/inside")).unwrap();
            }
            let more = rows(|b| {
                b.push_rename("a.tmp", 1, to);
                b.push_data("a.tmp", 1, 5, b" more");
            });
            let (request, ack, deferred) = placer.place(&source, seq, &more).unwrap();
            assert_eq!(ack.rejected.len(), 1, "{:?}", ack.rejected);
            assert_eq!(ack.rejected[0].row, 0);
            assert!(!ack.rejected[0].superseded);
            assert!(
                ack.rejected[0].error.contains("cannot rename"),
                "{}",
                ack.rejected[0].error
            );
            deferred.write(&more).unwrap();
            record_placed(&request);
            assert_eq!(
                std::fs::read(fixture.dest("s/a.tmp")).unwrap(),
                b"first more"
            );
            let recorded = placer.manifest.get(&id).unwrap().unwrap();
            assert_eq!(recorded.dest_path, "s/a.tmp");
            assert_eq!(recorded.renamed_from, None);
            let slot = placer.lookup(&source, &mut lock(&source.files), "a.tmp", 1);
            let slot = slot.ok().flatten().unwrap();
            assert_eq!(lock(&slot.state).record.dest_path, "s/a.tmp");
        }
    }

    /// The intent of a rename over a live file records that file as
    /// superseded too: a crash before the round must not leave two live
    /// records naming one path.
    #[test]
    fn a_rename_over_a_live_file_records_it_superseded_with_the_intent() {
        let fixture = Fixture::new("rename-over-live");
        let placer = fixture.placer();
        let source = placer.source("s").unwrap();
        let setup = rows(|b| {
            b.push_data("a.tmp", 1, 0, b"new");
            b.push_data("a", 1, 0, b"old");
        });
        let (request, _, _) = placer.place(&source, 1, &setup).unwrap();
        record_placed(&request);

        let rename = rows(|b| b.push_rename("a.tmp", 1, "a"));
        let (_, ack, _) = placer.place(&source, 2, &rename).unwrap();
        assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
        assert_eq!(std::fs::read(fixture.dest("s/a")).unwrap(), b"new");
        // Only the intent has reached the manifest: no round ran.
        let record = |key: &str| {
            let id = FileId {
                source: "s".into(),
                key: key.into(),
                generation: 1,
            };
            placer.manifest.get(&id).unwrap()
        };
        let renamed = record("a.tmp").expect("the intent is recorded");
        assert_eq!(renamed.dest_path, "s/a");
        let superseded = record("a").expect("recorded with the intent");
        assert!(superseded.superseded);
    }

    /// A rotation (a.1 to a.2, then a to a.1) cut short by a crash after
    /// both moves and before the round that records them: both intents
    /// are in the manifest, and each file is already at its new name. The
    /// start finishes each move by the file's inode, so the later file now
    /// at a.1 is not taken for the earlier one and moved over it.
    #[test]
    fn a_rotation_cut_short_by_a_crash_keeps_both_files() {
        let fixture = Fixture::new("rotation-crash");
        let placer = fixture.placer();
        let source = placer.source("s").unwrap();
        let setup = rows(|b| {
            b.push_data("a.1", 1, 0, b"first");
            b.push_data("a", 1, 0, b"second");
        });
        place_and_record(&placer, &source, 1, &setup);
        let rotate = rows(|b| {
            b.push_rename("a.1", 1, "a.2");
            b.push_rename("a", 1, "a.1");
        });
        let (_, ack, _) = placer.place(&source, 2, &rotate).unwrap();
        assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
        // The move out of a.1 was made durable before the intent to move
        // into it was recorded; the later move waits for its round.
        let unsynced = |key: &str| {
            let files = lock(&source.files);
            let slot = files.slots.get(&(key.to_owned(), 1)).unwrap();
            lock(&slot.unsynced).len()
        };
        assert_eq!(unsynced("a.1"), 0);
        assert_ne!(unsynced("a"), 0);
        // The crash: no round ran, the intents stay in the manifest.
        drop((source, placer));

        let restarted = fixture.placer();
        let source = restarted.source("s").unwrap();
        let more = rows(|b| {
            b.push_data("a.1", 1, 5, b"+1");
            b.push_data("a", 1, 6, b"+2");
        });
        let (_, ack, deferred) = restarted.place(&source, 3, &more).unwrap();
        assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
        deferred.write(&more).unwrap();
        assert_eq!(std::fs::read(fixture.dest("s/a.2")).unwrap(), b"first+1");
        assert_eq!(std::fs::read(fixture.dest("s/a.1")).unwrap(), b"second+2");
        assert!(!fixture.dest("s/a").exists());
    }

    fn file_of_s(key: &str) -> FileId {
        FileId {
            source: "s".into(),
            key: key.into(),
            generation: 1,
        }
    }

    /// Leaves the manifest as an earlier process that crashed would: the
    /// file `s/<name>` holding `bytes`, the intent to move it to `to`
    /// recorded (under the key `moved-<name>`), and `others` beside it.
    fn recorded_move(
        fixture: &Fixture,
        (name, bytes): (&str, &[u8]),
        to: &str,
        mut others: Vec<(FileId, FileRecord)>,
    ) {
        use std::os::unix::fs::MetadataExt;
        let from = format!("s/{name}");
        std::fs::create_dir_all(fixture.dest("s")).unwrap();
        std::fs::write(fixture.dest(&from), bytes).unwrap();
        let inode = std::fs::metadata(fixture.dest(&from)).unwrap().ino();
        let mut intent = record(&from, bytes.len() as u64);
        intent.begin_move(to.into(), inode);
        others.push((file_of_s(&format!("moved-{name}")), intent));
        let placer = fixture.placer();
        placer
            .manifest
            .commit(&SinkCommit {
                records: others,
                ..SinkCommit::default()
            })
            .unwrap();
    }

    /// An earlier process recorded a.1's move to a.2 and did not make it;
    /// a rename of a to a.1 now makes that move first, instead of putting
    /// its file over the one still at a.1.
    #[test]
    fn a_rename_into_a_path_an_earlier_run_meant_to_leave_moves_that_file_first() {
        let fixture = Fixture::new("rename-after-intent");
        std::fs::create_dir_all(fixture.dest("s")).unwrap();
        std::fs::write(fixture.dest("s/a"), b"second").unwrap();
        let live = (file_of_s("a"), record("s/a", 6));
        recorded_move(&fixture, ("a.1", b"first"), "s/a.2", vec![live]);

        let placer = fixture.placer();
        let source = placer.source("s").unwrap();
        let rename = rows(|b| b.push_rename("a", 1, "a.1"));
        let (_, ack, _) = placer.place(&source, 1, &rename).unwrap();
        assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
        assert_eq!(std::fs::read(fixture.dest("s/a.2")).unwrap(), b"first");
        assert_eq!(std::fs::read(fixture.dest("s/a.1")).unwrap(), b"second");
        assert!(!fixture.dest("s/a").exists());
    }

    /// A new file at a path an earlier process recorded a move away from,
    /// and did not make: that move is made first, and the new file gets a
    /// file of its own.
    #[test]
    fn a_new_file_where_a_recorded_move_starts_waits_for_that_move() {
        let fixture = Fixture::new("create-after-intent");
        recorded_move(&fixture, ("a", b"first"), "s/a.1", Vec::new());

        let placer = fixture.placer();
        let source = placer.source("s").unwrap();
        let new = rows(|b| b.push_data("a", 1, 0, b"second"));
        let (_, ack, deferred) = placer.place(&source, 1, &new).unwrap();
        assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
        deferred.write(&new).unwrap();
        assert_eq!(std::fs::read(fixture.dest("s/a.1")).unwrap(), b"first");
        assert_eq!(std::fs::read(fixture.dest("s/a")).unwrap(), b"second");
    }

    /// The same move in a run of renames, after a rename away from its
    /// target made by this process: that move is made durable first.
    #[test]
    fn a_run_of_renames_waits_for_moves_away_from_its_targets() {
        let fixture = Fixture::new("run-after-move");
        let placer = fixture.placer();
        let source = placer.source("s").unwrap();
        let setup = rows(|b| {
            b.push_data("a.1", 1, 0, b"first");
            b.push_data("a", 1, 0, b"second");
            b.push_data("b", 1, 0, b"third");
        });
        place_and_record(&placer, &source, 1, &setup);
        let unsynced = |key: &str| {
            let files = lock(&source.files);
            let slot = files.slots.get(&(key.to_owned(), 1)).unwrap();
            lock(&slot.unsynced).len()
        };
        let away = rows(|b| b.push_rename("a.1", 1, "a.2"));
        placer.place(&source, 2, &away).unwrap();
        assert_ne!(unsynced("a.1"), 0);
        let run = rows(|b| {
            b.push_rename("a", 1, "a.1");
            b.push_rename("b", 1, "b.1");
        });
        let (_, ack, _) = placer.place(&source, 3, &run).unwrap();
        assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
        assert_eq!(unsynced("a.1"), 0);
        assert_eq!(std::fs::read(fixture.dest("s/a.2")).unwrap(), b"first");
        assert_eq!(std::fs::read(fixture.dest("s/a.1")).unwrap(), b"second");
        assert_eq!(std::fs::read(fixture.dest("s/b.1")).unwrap(), b"third");
    }

    /// A rename of a file removed from the sink behind its back changes
    /// nothing and says why.
    #[test]
    fn a_rename_of_a_file_the_sink_lost_is_refused() {
        let fixture = Fixture::new("rename-lost");
        let placer = fixture.placer();
        let source = placer.source("s").unwrap();
        let setup = rows(|b| {
            b.push_data("a.tmp", 1, 0, b"first");
            b.push_data("a", 1, 0, b"live");
        });
        place_and_record(&placer, &source, 1, &setup);
        std::fs::remove_file(fixture.dest("s/a.tmp")).unwrap();
        let rename = rows(|b| b.push_rename("a.tmp", 1, "a"));
        let (_, ack, _) = placer.place(&source, 2, &rename).unwrap();
        assert_eq!(ack.rejected.len(), 1, "{:?}", ack.rejected);
        assert!(
            ack.rejected[0].error.contains("holds no file"),
            "{}",
            ack.rejected[0].error
        );
        let slot = placer.lookup(&source, &mut lock(&source.files), "a.tmp", 1);
        let slot = slot.ok().flatten().unwrap();
        assert_eq!(lock(&slot.state).record.dest_path, "s/a.tmp");
        assert_eq!(lock(&slot.state).record.renamed_from, None);
        // The live file at the name it asked for is left alone.
        assert_eq!(std::fs::read(fixture.dest("s/a")).unwrap(), b"live");
        let live = placer.lookup(&source, &mut lock(&source.files), "a", 1);
        assert!(!lock(&live.ok().flatten().unwrap().state).record.superseded);
    }

    /// An intent recorded without its inode (by an earlier build) whose move
    /// was made, and whose old directory is gone since: the file is found
    /// at its new name, and its ranges stay recorded.
    #[test]
    fn an_older_intent_whose_old_directory_is_gone_finds_its_file_moved() {
        let fixture = Fixture::new("old-intent");
        std::fs::create_dir_all(fixture.dest("src/new")).unwrap();
        std::fs::write(fixture.dest("src/new/x"), b"moved").unwrap();
        let placer = fixture.placer();
        let mut moved = record("src/new/x", 5);
        moved.renamed_from = Some("src/gone/x".into());
        placer
            .manifest
            .commit(&SinkCommit {
                records: vec![(id("gone/x", 1), moved)],
                ..SinkCommit::default()
            })
            .unwrap();
        drop(placer);

        let placer = fixture.placer();
        let source = placer.source("src").unwrap();
        let more = rows(|b| b.push_data("gone/x", 1, 5, b"+more"));
        let (request, ack, deferred) = placer.place(&source, 1, &more).unwrap();
        assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
        assert_eq!(ack.placed, 5);
        deferred.write(&more).unwrap();
        record_placed(&request);
        assert_eq!(
            std::fs::read(fixture.dest("src/new/x")).unwrap(),
            b"moved+more"
        );
        let slot = placer.lookup(&source, &mut lock(&source.files), "gone/x", 1);
        let slot = slot.ok().flatten().unwrap();
        let state = lock(&slot.state);
        assert_eq!(state.record.renamed_from, None);
        assert!(state.record.placed.covers(0, 10));
    }

    /// Runs that name a path twice, or one inside another, keep their order.
    #[test]
    fn overlapping_paths_are_told_apart() {
        let paths = |list: &[&str]| list.iter().map(|p| p.to_string()).collect::<Vec<_>>();
        assert!(!paths_overlap(&paths(&[
            "s/a", "s/a.tmp", "s/a-b", "s/ab/c"
        ])));
        assert!(paths_overlap(&paths(&["s/a", "s/b", "s/a"])));
        assert!(paths_overlap(&paths(&["s/a-b", "s/a/c", "s/a"])));
        assert!(paths_overlap(&paths(&["s/d/e/f", "s/d"])));
    }

    /// Renaming a file only needs its directory fsynced: the small ranges
    /// of the same batch still go to the journal rather than flushing every
    /// file they touch. A file a batch creates is flushed itself, not just
    /// its directory entry.
    #[test]
    fn a_rename_leaves_the_batchs_small_ranges_journaled() {
        let fixture = Fixture::new("rename-journaled");
        let placer = fixture.placer();
        let source = placer.source("s").unwrap();
        let mut builder = BatchBuilder::with_capacity(2, 64);
        builder.push_data("a.tmp", 1, 0, b"first");
        builder.push_data("b", 1, 0, b"first");
        let (request, _, deferred) = placer
            .place(&source, 1, &RangeBatch::validate(builder.finish()).unwrap())
            .unwrap();
        let flushed: std::collections::HashSet<_> =
            request.files_to_sync.iter().map(Arc::as_ptr).collect();
        assert_eq!(flushed.len(), 2, "new files are flushed");
        assert!(request.journal.is_empty() && deferred.is_empty());
        record_placed(&request);

        let mut builder = BatchBuilder::with_capacity(3, 64);
        builder.push_data("a.tmp", 1, 5, b" more");
        builder.push_rename("a.tmp", 1, "a");
        builder.push_data("b", 1, 5, b" more");
        let batch = RangeBatch::validate(builder.finish()).unwrap();
        let (request, ack, deferred) = placer.place(&source, 2, &batch).unwrap();
        assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
        assert!(!request.dirs_to_sync.is_empty(), "the rename's directory");
        assert!(request.files_to_sync.is_empty(), "no file flushed");
        assert!(!request.flushes_anyway());
        assert_eq!(request.journal.len(), 2, "both small ranges journaled");
        deferred.write(&batch).unwrap();
        assert_eq!(std::fs::read(fixture.dest("s/a")).unwrap(), b"first more");
        assert_eq!(std::fs::read(fixture.dest("s/b")).unwrap(), b"first more");
    }

    /// A flat-layout sink serves the first source it sees, also after a
    /// restart; another one is refused, naming both.
    #[test]
    fn a_flat_layout_serves_one_source() {
        let fixture = Fixture::new("flat-one-source");
        let placer =
            |fixture: &Fixture| fixture.placer_with(Layout::Flat, SupersededPolicy::Mirror, 0);
        let first = placer(&fixture);
        let source = first.source("cam").unwrap();
        let mut builder = BatchBuilder::with_capacity(1, 64);
        builder.push_data("f.dat", 1, 0, b"bytes");
        let (request, _, _) = first
            .place(&source, 1, &RangeBatch::validate(builder.finish()).unwrap())
            .unwrap();
        for (slot, _) in &request.placed {
            let state = lock(&slot.state);
            let commit = SinkCommit {
                records: vec![(slot.id.clone(), state.record.clone())],
                ..SinkCommit::default()
            };
            first.manifest.commit(&commit).unwrap();
        }
        let refused = |placer: &Placer| match placer.source("other") {
            Err(SinkError::Peer(message)) => message,
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a second source was accepted"),
        };
        let message = refused(&first);
        assert!(
            message.contains("\"cam\"") && message.contains("\"other\""),
            "{message}"
        );
        // A refused name keeps no state: peers cannot grow the map.
        assert!(!lock(&first.sources).contains_key("other"));
        drop((source, first));

        let restarted = placer(&fixture);
        refused(&restarted);
        restarted.source("cam").unwrap();
    }

    /// Loading a source (a scan of its records, long for a long history)
    /// holds up that source's batches only: others are served meanwhile.
    #[test]
    fn loading_one_source_holds_up_no_other() {
        let fixture = Fixture::new("source-loading");
        let placer = Arc::new(fixture.placer());
        let served = placer.source("served").unwrap();
        // As if "slow" were being loaded by another stream right now.
        let loading = lock(&placer.sources)
            .entry("slow".to_owned())
            .or_default()
            .clone();
        let scan = lock(&loading);
        let (answer, answered) = std::sync::mpsc::channel();
        let other = placer.clone();
        let asker = std::thread::spawn(move || {
            let again = other.source("served").map(|s| s.name.clone());
            let fresh = other.source("fresh").map(|s| s.name.clone());
            let _ = answer.send((again, fresh));
        });
        // A guard against a hang, not a measure of speed.
        let (again, fresh) = answered
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("other sources waited for the one being loaded");
        assert_eq!(again.unwrap(), served.name);
        assert_eq!(fresh.unwrap(), "fresh");
        asker.join().unwrap();
        drop(scan);
        assert_eq!(placer.source("slow").unwrap().name, "slow");
        assert!(Arc::ptr_eq(&placer.source("served").unwrap(), &served));
    }

    /// Sources are capped: a peer cannot grow the sink's state by naming
    /// new ones; those already served go on.
    #[test]
    fn sources_past_the_cap_are_refused() {
        let fixture = Fixture::new("source-cap");
        let mut placer = fixture.placer();
        placer.max_sources = 2;
        placer.source("a").unwrap();
        placer.source("b").unwrap();
        match placer.source("c") {
            Err(SinkError::Peer(message)) => assert!(message.contains("\"c\""), "{message}"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a source past the cap was served"),
        }
        assert_eq!(lock(&placer.sources).len(), 2);
        placer.source("a").unwrap();
    }

    /// A journal file damaged after a crash: a range its file already holds
    /// is fine, one it does not is refused (unless its round may have been
    /// cut short, see below), naming the file and offset.
    #[test]
    fn replay_checks_journal_bytes_against_their_crc() {
        let fixture = Fixture::new("replay-damaged");
        let placer = fixture.placer();
        std::fs::create_dir_all(fixture.dest("src")).unwrap();
        std::fs::write(fixture.dest("src/kept.dat"), b"headtail").unwrap();
        std::fs::write(fixture.dest("src/later.dat"), b"head").unwrap();
        let commit = |name: &str, end, round, bytes: &[u8]| {
            placer
                .manifest
                .commit(&SinkCommit {
                    records: vec![(id(name, 1), record(&format!("src/{name}"), end))],
                    journal: vec![(id(name, 1), end - 4, in_journal(bytes))],
                    journal_round: round,
                    ..SinkCommit::default()
                })
                .unwrap()
        };
        commit("kept.dat", 8, 1, b"tail");
        std::fs::write(fixture.journal_file(), b"headXXXXgone").unwrap();
        assert_eq!(placer.replay_journal(&fixture.journal_file()).unwrap(), 0);
        assert!(placer.manifest.journal().unwrap().is_empty());

        commit("lost.dat", 8, 1, b"tail");
        commit("later.dat", 4, 2, b"head");
        let err = placer
            .replay_journal(&fixture.journal_file())
            .unwrap_err()
            .to_string();
        assert!(err.contains("offset 4 of src/lost.dat"), "{err}");
        assert!(err.contains("journal.ring"), "{err}");
        assert_eq!(placer.manifest.journal().unwrap().len(), 2);
    }

    /// A crash while the newest round's bytes were being journaled, after its
    /// records were written: ranges whose bytes are neither in the journal
    /// nor in their file are withdrawn (never acknowledged), from the record,
    /// the audit and the placed counter; ranges found in either stay.
    #[test]
    fn replay_withdraws_the_ranges_of_a_round_cut_short() {
        let fixture = Fixture::new("replay-torn");
        let placer = fixture.placer();
        std::fs::create_dir_all(fixture.dest("src")).unwrap();
        std::fs::write(fixture.dest("src/torn.dat"), b"head").unwrap();
        std::fs::write(fixture.dest("src/cached.dat"), b"headtail").unwrap();
        let (torn, cached) = (id("torn.dat", 1), id("cached.dat", 1));
        // One round per commit, each putting `bytes` at `end - 4` of both files.
        let commit = |end, round, bytes: &[u8]| {
            let files = [&torn, &cached];
            placer
                .manifest
                .commit(&SinkCommit {
                    records: files
                        .map(|f| (f.clone(), record(&format!("src/{}", f.key), end)))
                        .into(),
                    placements: files.map(|f| (f.clone(), end - 4, 4)).into(),
                    counters: manifest_db::SinkCounters {
                        placed_bytes: 8,
                        ..Default::default()
                    },
                    journal: files
                        .map(|f| (f.clone(), end - 4, in_journal(bytes)))
                        .into(),
                    journal_round: round,
                    ..SinkCommit::default()
                })
                .unwrap()
        };
        commit(4, 1, b"head");
        // The newest round: records written, journal bytes never were.
        commit(8, 2, b"tail");
        std::fs::write(fixture.journal_file(), b"head\0\0\0\0").unwrap();

        assert_eq!(placer.replay_journal(&fixture.journal_file()).unwrap(), 8);
        let manifest = &placer.manifest;
        let placed = |file: &FileId| manifest.get(file).unwrap().unwrap().placed;
        assert_eq!(placed(&torn), IntervalSet::from_ranges([(0, 4)]));
        assert_eq!(manifest.placements(&torn).unwrap(), [(0, 4)]);
        assert_eq!(placed(&cached), IntervalSet::from_ranges([(0, 8)]));
        assert_eq!(manifest.placements(&cached).unwrap(), [(0, 4), (4, 4)]);
        assert_eq!(manifest.counters().unwrap().placed_bytes, 12);
        assert!(manifest.journal().unwrap().is_empty());
        assert_eq!(
            std::fs::read(fixture.dest("src/torn.dat")).unwrap(),
            b"head"
        );
    }

    /// A seal placed while the round in doubt was recording rides in its
    /// record. It came from a later batch, never acknowledged either: the
    /// replay withdraws the range and the seal with it instead of refusing
    /// to start.
    #[test]
    fn replay_unseals_a_file_sealed_behind_a_round_cut_short() {
        let fixture = Fixture::new("replay-sealed");
        let placer = fixture.placer();
        std::fs::create_dir_all(fixture.dest("src")).unwrap();
        std::fs::write(fixture.dest("src/late.dat"), b"head").unwrap();
        let late = id("late.dat", 1);
        let mut sealed = record("src/late.dat", 8);
        sealed.sealed = Some(Sealed {
            size: 8,
            digest: "crc64nvme:0000000000000000".into(),
        });
        let rounds = [
            (1, record("src/late.dat", 4), 0, &b"head"[..]),
            (2, sealed, 4, &b"tail"[..]),
        ];
        for (round, record, offset, bytes) in rounds {
            placer
                .manifest
                .commit(&SinkCommit {
                    records: vec![(late.clone(), record)],
                    journal: vec![(late.clone(), offset, in_journal(bytes))],
                    journal_round: round,
                    ..SinkCommit::default()
                })
                .unwrap();
        }
        std::fs::write(fixture.journal_file(), b"head\0\0\0\0").unwrap();

        assert_eq!(placer.replay_journal(&fixture.journal_file()).unwrap(), 4);
        let after = placer.manifest.get(&late).unwrap().unwrap();
        assert_eq!(after.placed, IntervalSet::from_ranges([(0, 4)]));
        assert_eq!(after.sealed, None);
    }

    /// The newest round is in doubt only until a later commit says its bytes
    /// were durable; then, and for bytes that cannot be read at all, a bad
    /// journal is damage: refused, never withdrawn.
    #[test]
    fn replay_refuses_damage_to_a_round_known_complete() {
        let fixture = Fixture::new("replay-complete");
        let placer = fixture.placer();
        std::fs::create_dir_all(fixture.dest("src")).unwrap();
        std::fs::write(fixture.dest("src/acked.dat"), b"head").unwrap();
        let acked = id("acked.dat", 1);
        let commit = |journal_round, journal_complete| {
            placer
                .manifest
                .commit(&SinkCommit {
                    records: vec![(acked.clone(), record("src/acked.dat", 8))],
                    journal: vec![(acked.clone(), 4, in_journal(b"tail"))],
                    journal_round,
                    journal_complete,
                    ..SinkCommit::default()
                })
                .unwrap()
        };
        // A round, then a commit made after its journal write had ended.
        commit(1, 0);
        placer
            .manifest
            .commit(&SinkCommit {
                journal_complete: 1,
                ..SinkCommit::default()
            })
            .unwrap();
        std::fs::write(fixture.journal_file(), b"headXXXX").unwrap();
        let err = placer
            .replay_journal(&fixture.journal_file())
            .unwrap_err()
            .to_string();
        assert!(err.contains("offset 4 of src/acked.dat"), "{err}");

        // In doubt, but the journal file ends before the range: damage too.
        placer.manifest.clear_journal().unwrap();
        commit(1, 0);
        std::fs::write(fixture.journal_file(), b"head").unwrap();
        let err = placer
            .replay_journal(&fixture.journal_file())
            .unwrap_err()
            .to_string();
        assert!(err.contains("no bytes"), "{err}");
        let placed = placer.manifest.get(&acked).unwrap().unwrap().placed;
        assert_eq!(placed, IntervalSet::from_ranges([(0, 8)]));
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn id(key: &str, generation: u64) -> FileId {
        FileId {
            source: "src".into(),
            key: key.into(),
            generation,
        }
    }

    fn record(dest: &str, end: u64) -> FileRecord {
        FileRecord {
            dest_path: dest.into(),
            placed: IntervalSet::from_ranges([(0, end)]),
            ..FileRecord::default()
        }
    }

    /// A flat manifest from before a flat sink served one source, with
    /// acknowledged ranges of two sources in its journal: the start writes
    /// both back, and then serves the first source in the manifest only,
    /// whichever connects first.
    #[test]
    fn a_flat_replay_writes_back_a_refused_sources_ranges() {
        let fixture = Fixture::new("flat-replay");
        let placer = fixture.placer_with(Layout::Flat, SupersededPolicy::Mirror, 0);
        let of = |source: &str, key: &str| FileId {
            source: source.into(),
            key: key.into(),
            generation: 1,
        };
        placer
            .manifest
            .commit(&SinkCommit {
                records: vec![
                    (of("alpha", "a.dat"), record("a.dat", 4)),
                    (of("beta", "b.dat"), record("b.dat", 4)),
                ],
                journal: vec![
                    (
                        of("alpha", "a.dat"),
                        0,
                        JournalBytes::Inline(b"AAAA".to_vec()),
                    ),
                    (
                        of("beta", "b.dat"),
                        0,
                        JournalBytes::Inline(b"BBBB".to_vec()),
                    ),
                ],
                ..SinkCommit::default()
            })
            .unwrap();

        assert_eq!(placer.replay_journal(&fixture.journal_file()).unwrap(), 8);
        assert_eq!(std::fs::read(fixture.dest("a.dat")).unwrap(), b"AAAA");
        assert_eq!(std::fs::read(fixture.dest("b.dat")).unwrap(), b"BBBB");
        assert!(matches!(placer.source("beta"), Err(SinkError::Peer(_))));
        placer.source("alpha").unwrap();
        // The same source wins when the other one asks first.
        drop(placer);
        let restarted = fixture.placer_with(Layout::Flat, SupersededPolicy::Mirror, 0);
        assert!(matches!(restarted.source("beta"), Err(SinkError::Peer(_))));
        restarted.source("alpha").unwrap();
    }

    /// A machine crash after the ack: the bytes are in the journal, the
    /// destination lost them (or the whole file) with the page cache.
    #[test]
    fn replay_writes_journaled_ranges_back_and_empties_the_journal() {
        let fixture = Fixture::new("replay");
        let placer = fixture.placer();
        let mut old = record("src/old.dat", 4);
        old.superseded = true;
        // Superseded under `--superseded keep`: its file stays, aside.
        let mut aside = record("src/run/aside.dat.gen1", 4);
        aside.superseded = true;
        aside.kept = true;
        let mut moved = record("src/run/new-name.dat", 6);
        moved.renamed_from = Some("src/run/old-name.dat".into());
        std::fs::create_dir_all(fixture.dest("src/run")).unwrap();
        std::fs::write(fixture.dest("src/run/old-name.dat"), b"\0\0\0\0\0\0").unwrap();
        placer
            .manifest
            .commit(&SinkCommit {
                records: vec![
                    (id("lost.dat", 1), record("src/lost.dat", 8)),
                    (id("old.dat", 1), old),
                    (id("run/old-name.dat", 1), moved),
                    (id("run/aside.dat", 1), aside),
                ],
                journal: vec![
                    (id("lost.dat", 1), 0, in_journal(b"head")),
                    (id("lost.dat", 1), 4, in_journal(b"tail")),
                    (id("old.dat", 1), 0, in_journal(b"gone")),
                    // As sinks before the journal file kept them.
                    (
                        id("run/old-name.dat", 1),
                        0,
                        JournalBytes::Inline(b"moved!".to_vec()),
                    ),
                    (
                        id("run/aside.dat", 1),
                        0,
                        JournalBytes::Inline(b"kept".to_vec()),
                    ),
                ],
                ..SinkCommit::default()
            })
            .unwrap();
        std::fs::write(fixture.journal_file(), b"headtailgone").unwrap();

        assert_eq!(placer.replay_journal(&fixture.journal_file()).unwrap(), 18);
        assert_eq!(
            std::fs::read(fixture.dest("src/lost.dat")).unwrap(),
            b"headtail"
        );
        // The rename recorded before the crash is finished first, then written into.
        assert_eq!(
            std::fs::read(fixture.dest("src/run/new-name.dat")).unwrap(),
            b"moved!"
        );
        assert!(!fixture.dest("src/run/old-name.dat").exists());
        // A removed superseded generation is not brought back; one kept
        // aside gets its bytes.
        assert!(!fixture.dest("src/old.dat").exists());
        assert_eq!(
            std::fs::read(fixture.dest("src/run/aside.dat.gen1")).unwrap(),
            b"kept"
        );
        let manifest = &placer.manifest;
        assert!(manifest.journal().unwrap().is_empty());
        let settled = manifest.get(&id("run/old-name.dat", 1)).unwrap().unwrap();
        assert_eq!(settled.renamed_from, None);

        // Replaying again (a crash during the first replay) changes nothing.
        drop(placer);
        let again = fixture.placer();
        assert_eq!(again.replay_journal(&fixture.journal_file()).unwrap(), 0);
        assert_eq!(
            std::fs::read(fixture.dest("src/lost.dat")).unwrap(),
            b"headtail"
        );
    }
}
