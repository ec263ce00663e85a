//! The state placement and the committer share, and how they hand work
//! over: a file generation's [`Slot`] (its record as it will be committed,
//! the ranges being written, its descriptors), the [`CommitRequest`] a
//! placed batch hands to the committer, the gate that serialises record
//! writes, and the file counts. Both sides depend on this module; it
//! depends on neither.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use manifest_db::{FileId, FileRecord, IntervalSet, SinkCounters, SinkManifest};

use crate::durability::direct::DirectFile;
use crate::durability::flush::{SyncTarget, flush_now};
use crate::lock_order::{self, Rank, Ranked};
use crate::written_crc::WrittenCrc;

/// Locks a mutex of the sink's shared state. A mutex a panic left poisoned
/// may hold half-updated state; it is taken anyway, because placement
/// threads, commit rounds and the journal thread guard themselves (see
/// [`crate::health::Health::guard_thread`]): their panics poison the sink's
/// health before unwinding lets go of any lock, and from then on nothing
/// read under these locks is recorded or acknowledged.
pub(crate) fn lock<L: Lock + ?Sized>(mutex: &L) -> L::Guard<'_> {
    mutex.acquire()
}

/// A mutex [`lock`] takes: a plain one, or one with its place in the
/// order ([`crate::lock_order`]).
pub(crate) trait Lock {
    type Guard<'a>
    where
        Self: 'a;
    fn acquire(&self) -> Self::Guard<'_>;
}

impl<T: ?Sized> Lock for Mutex<T> {
    type Guard<'a>
        = MutexGuard<'a, T>
    where
        T: 'a;
    fn acquire(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl<L: Lock + ?Sized> Lock for Arc<L> {
    type Guard<'a>
        = L::Guard<'a>
    where
        L: 'a;
    fn acquire(&self) -> L::Guard<'_> {
        (**self).acquire()
    }
}

impl<T> Lock for Ranked<T> {
    type Guard<'a>
        = lock_order::Guard<'a, T>
    where
        T: 'a;
    fn acquire(&self) -> lock_order::Guard<'_, T> {
        self.lock()
    }
}

/// One generation of one source file.
pub(crate) struct Slot {
    pub id: FileId,
    pub state: Ranked<SlotState>,
    /// Flushes a change to this file's name or existence still needs
    /// before its record may be written (see
    /// [`CommitRequest::flush_before_record`]). Locked after `state`, never
    /// before it, and never held across other work, so the committer can
    /// read it without waiting for placement.
    pub unsynced: Ranked<Vec<Pending>>,
    /// The batch (its [`WriteToken`]) whose writes into this file wait
    /// until its commit is submitted (see `place::beside`); 0 when none.
    /// Every other batch waits for them before it writes data into the file
    /// or seals it, so the file still grows in order. (Moves need not wait:
    /// the writes go through a descriptor.)
    pub writing: AtomicU64,
}

/// Tells one batch's deferred writes from another's (see [`Slot::writing`]).
pub(crate) type WriteToken = u64;

/// A token no batch had before (never 0).
pub(crate) fn new_write_token() -> WriteToken {
    static TOKENS: AtomicU64 = AtomicU64::new(1);
    TOKENS.fetch_add(1, Ordering::Relaxed)
}

pub(crate) struct SlotState {
    /// The record as it will be committed; `placed` holds only ranges that
    /// are committed or being committed by the committer right now.
    pub record: FileRecord,
    /// Written, not yet handed to the committer's merge.
    pub pending: IntervalSet,
    /// Length of the destination file when this process first opened it:
    /// bytes below it that are not recorded were written by an earlier run
    /// that crashed before recording them, and writing them again counts as
    /// a rewrite.
    pub disk_len: Option<u64>,
    pub file: Option<Arc<File>>,
    /// A second descriptor on `file` for direct writes (see [`crate::durability::direct`]).
    pub direct: DirectFile,
    /// What the manifest holds of this record, for the file counts: whether
    /// it is recorded at all, and recorded as sealed.
    pub recorded: bool,
    pub recorded_sealed: bool,
    /// The path and superseded flag the manifest holds for it, so the
    /// commit feed can tell what a round changed (a rename reaches the feed
    /// with the first round that records it made, not with its intent).
    pub recorded_path: Option<String>,
    pub recorded_superseded: bool,
    /// A batch is moving this file (a rename, or a superseded generation
    /// going aside): its intent is in memory and on its way to the manifest,
    /// and the move is not made yet. No one else may settle the move then
    /// (it would be made before its intent is durable), nor close the
    /// descriptor data goes through.
    pub moving: bool,
    /// How far the destination file reaches: every byte below it is the
    /// source's (written in order by this process, or found there when the
    /// file was first opened), and nothing is written past it, so a reader
    /// never finds a hole below the file's size.
    pub file_end: u64,
    /// Parts that start past `file_end`, by start, waiting in memory for
    /// the bytes before them; they count as `pending` too.
    pub held: std::collections::BTreeMap<u64, Held>,
    /// CRC-64 of the bytes written so far, for the seal.
    pub written_crc: WrittenCrc,
    /// (device, inode) of the file those bytes went to: a descriptor
    /// reopened after eviction that finds another file there (replaced
    /// behind the sink's back) ends what `written_crc` can vouch for.
    pub inode: Option<(u64, u64)>,
    /// Room taken for the file ahead of its end (see `place::beside`).
    pub room: Room,
}

/// How far a file's room is taken ahead of its end (`fallocate` with
/// `FALLOC_FL_KEEP_SIZE`): a write below `end` cannot fail for want of
/// space. `refused` once its filesystem does not take such reservations:
/// its writes are made before their round, as they always were.
#[derive(Default, Clone, Copy)]
pub(crate) struct Room {
    pub end: u64,
    /// Whether the file's filesystem was asked whether it keeps room.
    pub checked: bool,
    pub refused: bool,
}

impl SlotState {
    /// Notes the file a descriptor just opened on the destination refers to.
    pub fn opened(&mut self, file: &File) {
        use std::os::unix::fs::MetadataExt;
        let inode = file.metadata().ok().map(|meta| (meta.dev(), meta.ino()));
        if self.inode.is_some() && self.inode != inode {
            self.written_crc = WrittenCrc::Unknown;
            self.room = Room::default();
        }
        self.inode = inode;
    }
}

impl SlotState {
    /// The record to write where no event tells of it (the startup's
    /// replay): a move made since the events last told the file's path
    /// keeps that path, so that the first round that records the file
    /// tells the move, in this run or after another crash in the next. (A
    /// generation moved aside is never recorded by a round again.)
    pub fn record_untold(&self) -> FileRecord {
        let mut record = self.record.clone();
        if !record.superseded
            && record.renamed_from.is_none()
            && let Some(told) = &self.recorded_path
            && *told != record.dest_path
        {
            record.untold_from = Some(told.clone());
        }
        record
    }

    /// Lets go of the file's descriptors (a commit still holding one keeps
    /// it open until synced).
    pub fn close_file(&mut self) {
        self.file = None;
        self.direct = DirectFile::NotOpened;
    }
}

/// How many file records the manifest holds, and how many are sealed;
/// counted once at startup and kept up by the committer, so `status` does
/// not read every record.
#[derive(Default)]
pub(crate) struct FileCounts {
    pub files: AtomicU64,
    pub sealed: AtomicU64,
}

impl FileCounts {
    pub fn from_manifest(manifest: &SinkManifest) -> Result<Self, manifest_db::Error> {
        let records = manifest.all_files()?;
        let sealed = records.iter().filter(|(_, r)| r.sealed.is_some()).count();
        Ok(Self {
            files: AtomicU64::new(records.len() as u64),
            sealed: AtomicU64::new(sealed as u64),
        })
    }

    /// Counts what a successful commit of this slot's record changed;
    /// `sealed` says whether the record it wrote was sealed.
    pub fn committed(&self, state: &mut SlotState, sealed: bool) {
        if !state.recorded {
            state.recorded = true;
            self.files.fetch_add(1, Ordering::Relaxed);
        }
        if sealed && !state.recorded_sealed {
            state.recorded_sealed = true;
            self.sealed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A part of a file held in memory until the bytes before it are written.
pub(crate) struct Held {
    pub bytes: Vec<u8>,
    /// When it was held, for how long its batch may wait.
    pub since: std::time::Instant,
}

/// Ranges of a file another batch already placed or is placing.
pub(crate) struct Dependency {
    pub slot: Arc<Slot>,
    pub start: u64,
    pub end: u64,
}

/// Dependencies of requests not answered yet, across the sink: a request
/// carries its share and gives it back when it is dropped (answered or
/// failed). Placement refuses a batch that would go past the bound.
pub(crate) struct DependencyCharge {
    count: usize,
    total: Arc<std::sync::atomic::AtomicUsize>,
}

impl DependencyCharge {
    /// Charges `count` dependencies to `total`, or says how many wait already.
    pub fn take(
        total: &Arc<std::sync::atomic::AtomicUsize>,
        count: usize,
        limit: usize,
    ) -> Result<Self, usize> {
        let before = total.fetch_add(count, Ordering::Relaxed);
        if before + count > limit {
            total.fetch_sub(count, Ordering::Relaxed);
            return Err(before);
        }
        Ok(Self {
            count,
            total: total.clone(),
        })
    }
}

impl Drop for DependencyCharge {
    fn drop(&mut self) {
        self.total.fetch_sub(self.count, Ordering::Relaxed);
    }
}

/// Serialises every write of file records to the manifest. A round that
/// fails after changing records in memory poisons the sink's [`Health`]
/// before it lets go of the gate: from then on those records may name
/// ranges that are not durable, so whoever takes the gate checks the health
/// before it writes or hands out records.
pub(crate) type CommitGate = Arc<Ranked<()>>;

/// A commit gate of its own (a sink's, or a test's).
pub(crate) fn new_commit_gate() -> CommitGate {
    Arc::new(Ranked::new(Rank::CommitGate, ()))
}

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
    /// Their share of the sink's bound on dependencies waiting.
    pub dependency_charge: Option<DependencyCharge>,
    pub counters: SinkCounters,
    /// Ranges to journal, if the round can...
    pub journal: Vec<JournalRange>,
    pub journal_bytes: u64,
    /// ...so their files are flushed later, in the background.
    pub journaled_files: Vec<Arc<File>>,
    /// When the batch reached the sink (for the commit log).
    pub received: Option<std::time::SystemTime>,
    /// How long placing it took, from the moment it reached the sink (µs).
    pub placing_us: u64,
    /// How much of that the placement itself took, on its thread (µs).
    pub place_us: u64,
    /// The directories in `dirs_to_sync`, by (device, inode).
    dirs_seen: HashMap<(u64, u64), Arc<OwnedFd>>,
    /// Word that the batch's ranges are in their files, when placement
    /// writes them after submitting the request (see `place::beside`): the
    /// round tells no one of them, and flushes none of their files, before.
    pub written: Option<WritesDone>,
}

/// The end of a batch's writes made after its request was submitted: `Err`
/// says which write failed, and a sender dropped unanswered that its thread
/// ended first.
pub(crate) struct WritesDone(pub std::sync::mpsc::Receiver<Result<(), String>>);

impl CommitRequest {
    /// Waits until the batch's deferred writes are in their files (at once
    /// when it has none). A write that failed fails the request: the round
    /// that recorded its ranges must not tell anyone of them.
    pub fn wait_written(&mut self) -> Result<(), crate::SinkError> {
        let Some(WritesDone(done)) = self.written.take() else {
            return Ok(());
        };
        match done.recv() {
            Ok(Ok(())) => Ok(()),
            Ok(Err(failed)) => Err(crate::SinkError::Storage(failed)),
            Err(_) => Err(crate::SinkError::Internal(
                "a placement thread ended before writing the ranges it had submitted".into(),
            )),
        }
    }
}

/// A small range to journal: its file, where it goes, its bytes, and
/// their CRC-32C (the row's, checked on arrival, when the range is a whole
/// row: not computed again).
pub(crate) struct JournalRange {
    pub id: FileId,
    pub offset: u64,
    /// The range's bytes: those of the batch that brought them where it
    /// can share them (kept alive until the journal's write, not copied).
    pub bytes: flight_server::wire::Buffer,
    pub crc32c: u32,
}

impl CommitRequest {
    /// Depends on `start..end` of `slot`; merged into the last dependency
    /// when it is the same file's and touches it, as a batch's rows of one
    /// file usually are.
    pub fn depend_on(&mut self, slot: &Arc<Slot>, start: u64, end: u64) {
        if let Some(last) = self.dependencies.last_mut()
            && Arc::ptr_eq(&last.slot, slot)
            && start <= last.end
            && end >= last.start
        {
            last.start = last.start.min(start);
            last.end = last.end.max(end);
            return;
        }
        self.dependencies.push(Dependency {
            slot: slot.clone(),
            start,
            end,
        });
    }

    /// What is left of a recorded request that waits for others: its
    /// dependencies only. Its files, ranges and journal copies are let go,
    /// so a waiting batch costs little whatever it carried.
    pub fn keep_dependencies_only(&mut self) {
        *self = Self {
            dependencies: std::mem::take(&mut self.dependencies),
            dependency_charge: self.dependency_charge.take(),
            ..Self::default()
        };
    }

    /// The files and directories a request touched, for a flush at startup
    /// (the journal replay), before any round runs.
    pub fn sync_now(&self) -> Result<(), crate::SinkError> {
        let mut files: HashMap<*const File, &Arc<File>> = HashMap::new();
        for file in &self.files_to_sync {
            files.insert(Arc::as_ptr(file), file);
        }
        let targets: Vec<SyncTarget> = files
            .into_values()
            .map(|f| SyncTarget::File(f.clone()))
            .chain(self.dirs_to_sync.iter().map(|d| SyncTarget::Dir(d.clone())))
            .collect();
        flush_now(&targets)
    }

    /// Whether its round must flush files anyway: then the journal saves
    /// nothing for its small ranges. Directories alone (a renamed or removed
    /// file) do not count: a round fsyncs those on their own, a few small
    /// writes, and its ranges still go to the journal instead of making it
    /// flush every file they touched.
    pub fn flushes_anyway(&self) -> bool {
        !self.files_to_sync.is_empty()
    }

    /// Adds a directory to fsync, once: a batch creating thousands of files
    /// in one directory holds one descriptor for it, not thousands.
    fn add_dir(&mut self, dir: OwnedFd) -> Arc<OwnedFd> {
        let Ok(st) = rustix::fs::fstat(&dir) else {
            let dir = Arc::new(dir);
            self.dirs_to_sync.push(dir.clone());
            return dir;
        };
        let identity = (st.st_dev, st.st_ino);
        if let Some(known) = self.dirs_seen.get(&identity) {
            return known.clone();
        }
        let dir = Arc::new(dir);
        self.dirs_seen.insert(identity, dir.clone());
        self.dirs_to_sync.push(dir.clone());
        dir
    }

    /// What a change to a file's name, existence or size needs flushed
    /// before any record of that file may be written: its directories, and
    /// the file itself when it is new (fsyncing a directory makes the entry
    /// durable, not the inode the entry names) or was cut short. They go to this request, and to the
    /// file's own `unsynced` list (`Slot::unsynced`): a round that writes
    /// the file's record flushes what is still there first, even when this
    /// request never reaches a round (its batch failed) or another batch's
    /// round records the file before this one.
    pub fn flush_before_record(
        &mut self,
        unsynced: &mut Vec<Pending>,
        file: Option<&Arc<File>>,
        dirs: impl IntoIterator<Item = OwnedFd>,
    ) {
        if let Some(file) = file {
            self.files_to_sync.push(file.clone());
            unsynced.push(Pending::new(SyncTarget::File(file.clone())));
        }
        for dir in dirs {
            let dir = self.add_dir(dir);
            unsynced.push(Pending::new(SyncTarget::Dir(dir)));
        }
    }
}

/// A flush one change to a file still needs before the file's record may
/// be written. Its token tells it apart from a later change that needs the
/// same directory flushed again: a round forgets only what it flushed.
pub(crate) struct Pending {
    token: u64,
    pub target: SyncTarget,
}

impl Pending {
    pub fn token(&self) -> u64 {
        self.token
    }

    pub fn new(target: SyncTarget) -> Self {
        static TOKENS: AtomicU64 = AtomicU64::new(0);
        Self {
            token: TOKENS.fetch_add(1, Ordering::Relaxed),
            target,
        }
    }
}
