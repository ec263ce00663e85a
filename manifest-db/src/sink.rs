//! Owns the sink-side manifest: per file generation, where it lives and which byte ranges are
//! durably placed ("files"), an append-only audit log of every placement ("placements"), and
//! running byte counters plus the audit sequence number ("counters"), and the journal of small
//! ranges acknowledged before their destination files were flushed ("journal_rounds": where in
//! the sink's journal file their bytes are, one entry per commit; "journal": the bytes
//! themselves, one entry per range, as older sinks kept them); a commit also appends to the
//! event outbox ("outbox", read and removed through the `outbox` module).
//!
//! Key layout in "files" and "placements": `source, 0x00, key, 0x00, generation (u64 BE)`.
//! Source and key never contain NUL, so the NUL terminators make the byte order equal to
//! (source, key, generation) order and no file's key is a prefix of another file's key.
//! "placements" appends `offset (u64 BE), seq (u64 BE)` so two placements at the same offset
//! never overwrite each other and the audit can show duplicates. "journal" appends
//! `offset (u64 BE)`. "journal_rounds" is keyed by the commit's round (u64 BE); its value is,
//! per range, `file key length (u32 BE), file key, offset (u64 BE), position (u64 BE),
//! len (u32 BE), crc32c (u32 BE)`.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rocksdb::WriteBatch;

use crate::store::{Entry, Store, decode_u64};
use crate::{FileId, FileRecord, JournalBytes, JournalEntry, Result, SinkCommit, SinkCounters};

const CF_FILES: &str = "files";
const CF_PLACEMENTS: &str = "placements";
pub(crate) const CF_COUNTERS: &str = "counters";
const CF_JOURNAL: &str = "journal";
const CF_JOURNAL_ROUNDS: &str = "journal_rounds";
pub(crate) const CF_OUTBOX: &str = "outbox";

const KEY_PLACED: &[u8] = b"placed_bytes";
const KEY_DUPLICATE: &[u8] = b"duplicate_bytes";
const KEY_REWRITTEN: &[u8] = b"rewritten_bytes";
const KEY_PLACEMENT_SEQ: &[u8] = b"placement_seq";
/// The newest journal round known to have its bytes durable (see
/// [`SinkCommit::journal_complete`]); rounds after it are in doubt.
const KEY_JOURNAL_COMPLETE: &[u8] = b"journal_complete";
/// The newest journal round recorded: its number and where it starts in the journal file
/// (`u64 BE` each). Rounds written after it may still be in the journal file.
const KEY_JOURNAL_LAST: &[u8] = b"journal_last";
/// The journal's epoch (see [`JournalState::epoch`]): the rounds of each sink run number
/// from 1 again.
const KEY_JOURNAL_EPOCH: &[u8] = b"journal_epoch";
/// The sequence number of the newest outbox event recorded (`u64 BE`);
/// numbers are never reused, even once their events are published.
pub(crate) const KEY_OUTBOX_LAST: &[u8] = b"outbox_last";
/// The event relay's mark (see [`SinkManifest::outbox_remove`]).
pub(crate) const KEY_RELAY_MARK: &[u8] = b"relay_mark";
/// This manifest's identity (random, made at its first open): what names
/// the sink to consumers of its events when no name is configured.
const KEY_MANIFEST_ID: &[u8] = b"manifest_id";
const KEY_ROOT_ID: &[u8] = b"root_id";

/// What the manifest knows of the journal file's rounds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JournalState {
    /// The epoch the journal's current rounds are written in: random, new
    /// for each run of the sink, so that no round of an earlier run (or of
    /// another manifest) is taken for one of this run.
    pub epoch: u64,
    /// The newest round recorded, if any.
    pub last: Option<RecordedRound>,
}

/// A journal round the manifest holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordedRound {
    /// Its number, counting from 1 in its epoch.
    pub round: u64,
    /// Where it starts in the journal file.
    pub start: u64,
}

/// A fresh journal epoch: 64 bits from the standard library's randomly
/// seeded hasher, over the time and the process, never 0.
fn new_epoch() -> u64 {
    use std::hash::BuildHasher;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    std::collections::hash_map::RandomState::new()
        .hash_one((nanos, std::process::id()))
        .max(1)
}

/// A commit's WriteBatch, built and not yet written; other commits (which
/// read the counters it changes) wait for it.
pub struct PreparedCommit<'a> {
    manifest: &'a SinkManifest,
    batch: WriteBatch,
    outbox_last: Option<u64>,
    _guard: std::sync::MutexGuard<'a, ()>,
}

impl PreparedCommit<'_> {
    /// The batch as bytes, for [`SinkManifest::redo`].
    pub fn data(&self) -> &[u8] {
        self.batch.data()
    }

    /// The sequence number of the last outbox event it appends, if any.
    pub fn outbox_last(&self) -> Option<u64> {
        self.outbox_last
    }

    /// Writes it with a synced WAL.
    pub fn write_synced(self) -> Result<()> {
        self.manifest.store().write(self.batch, true, "commit")
    }

    /// Writes it without syncing the WAL: the caller has made [`Self::data`]
    /// durable itself, to [`SinkManifest::redo`] after a crash.
    pub fn write_logged_elsewhere(self) -> Result<()> {
        self.manifest
            .store()
            .write(self.batch, false, "commit (logged in the journal)")
    }
}

/// Sink-side manifest (RocksDB, column families "files", "placements", "counters").
/// Cheap to clone; clones share one database.
#[derive(Clone)]
pub struct SinkManifest {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    /// Commits read-modify-write the counters and the placement sequence; serialise them so
    /// concurrent commits cannot lose each other's increments.
    commit_lock: Mutex<()>,
}

fn prefix_source(source: &str) -> Vec<u8> {
    debug_assert!(!source.contains('\0'), "source contains NUL: {source:?}");
    let mut k = Vec::with_capacity(source.len() + 1);
    k.extend_from_slice(source.as_bytes());
    k.push(0);
    k
}

fn prefix_key(source: &str, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(source.len() + key.len() + 2);
    extend_prefix_key(&mut k, source, key);
    k
}

/// Appends [`prefix_key`] to `buf`.
fn extend_prefix_key(buf: &mut Vec<u8>, source: &str, key: &str) {
    debug_assert!(!source.contains('\0'), "source contains NUL: {source:?}");
    debug_assert!(!key.contains('\0'), "key contains NUL: {key:?}");
    buf.extend_from_slice(source.as_bytes());
    buf.push(0);
    buf.extend_from_slice(key.as_bytes());
    buf.push(0);
}

fn file_key(id: &FileId) -> Vec<u8> {
    file_key_with_room(id, 0)
}

/// [`file_key`] with room for `more` bytes after it: a commit builds
/// several keys for each of its ranges, each in one allocation.
fn file_key_with_room(id: &FileId, more: usize) -> Vec<u8> {
    let mut k = Vec::with_capacity(file_key_len(id) + more);
    extend_file_key(&mut k, id);
    k
}

fn file_key_len(id: &FileId) -> usize {
    id.source.len() + id.key.len() + 2 + 8
}

/// Appends [`file_key`] to `buf`.
fn extend_file_key(buf: &mut Vec<u8>, id: &FileId) {
    buf.reserve(file_key_len(id));
    extend_prefix_key(buf, &id.source, &id.key);
    buf.extend_from_slice(&id.generation.to_be_bytes());
}

fn journal_key(id: &FileId, offset: u64) -> Vec<u8> {
    let mut k = file_key_with_room(id, 8);
    k.extend_from_slice(&offset.to_be_bytes());
    k
}

/// A journal entry with what it sorts by: (file key, offset).
type KeyedJournalEntry = ((Vec<u8>, u64), JournalEntry);

fn decode_journal_round(mut value: &[u8]) -> Option<Vec<KeyedJournalEntry>> {
    fn take<'a>(value: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, rest) = value.split_at_checked(n)?;
        *value = rest;
        Some(head)
    }
    fn word(bytes: &[u8]) -> Option<u32> {
        Some(u32::from_be_bytes(bytes.try_into().ok()?))
    }
    let mut entries = Vec::new();
    while !value.is_empty() {
        let key_len = word(take(&mut value, 4)?)? as usize;
        let key = take(&mut value, key_len)?;
        let id = decode_file_key(key)?;
        let offset = decode_u64(take(&mut value, 8)?)?;
        let position = decode_u64(take(&mut value, 8)?)?;
        let len = word(take(&mut value, 4)?)?;
        let crc32c = word(take(&mut value, 4)?)?;
        let bytes = JournalBytes::InFile {
            position,
            len,
            crc32c,
        };
        entries.push(((key.to_vec(), offset), (id, offset, bytes)));
    }
    Some(entries)
}

fn decode_file_key(raw: &[u8]) -> Option<FileId> {
    let (head, generation) = raw.split_at_checked(raw.len().checked_sub(8)?)?;
    let head = head.strip_suffix(&[0])?;
    let nul = head.iter().position(|&b| b == 0)?;
    let source = std::str::from_utf8(&head[..nul]).ok()?;
    let key = std::str::from_utf8(&head[nul + 1..]).ok()?;
    if key.contains('\0') {
        return None;
    }
    Some(FileId {
        source: source.to_owned(),
        key: key.to_owned(),
        generation: decode_u64(generation)?,
    })
}

const SINK_CFS: [&str; 6] = [
    CF_FILES,
    CF_PLACEMENTS,
    CF_COUNTERS,
    CF_JOURNAL,
    CF_JOURNAL_ROUNDS,
    CF_OUTBOX,
];

impl SinkManifest {
    pub fn open(dir: &Path) -> Result<Self> {
        let store = Store::open(dir, &SINK_CFS)?;
        Ok(Self {
            inner: Arc::new(Inner {
                store,
                commit_lock: Mutex::new(()),
            }),
        })
    }

    pub(crate) fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Applies one commit in a single WriteBatch with a synced WAL (WriteOptions::set_sync(true)).
    pub fn commit(&self, commit: &SinkCommit) -> Result<()> {
        self.prepare(commit)?.write_synced()
    }

    /// Keeps other commits out. The lock guards no data of its own, so a
    /// panic in another commit leaves nothing inconsistent behind; carry on
    /// past poisoning.
    fn commit_guard(&self) -> std::sync::MutexGuard<'_, ()> {
        self.inner
            .commit_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Builds one commit's WriteBatch without writing it. Until the returned
    /// commit is written or dropped, other commits wait: they read the
    /// counters it is about to change.
    pub fn prepare(&self, commit: &SinkCommit) -> Result<PreparedCommit<'_>> {
        let guard = self.commit_guard();
        let store = self.store();
        let files = store.cf(CF_FILES)?;
        let placements = store.cf(CF_PLACEMENTS)?;
        let counters = store.cf(CF_COUNTERS)?;
        let mut batch = WriteBatch::default();

        // One key for the round's ranges: few memtable inserts per commit,
        // one delete when they are flushed.
        let mut round = Vec::with_capacity(
            commit
                .journal
                .iter()
                .map(|(id, _, _)| 4 + file_key_len(id) + 24)
                .sum(),
        );
        for (id, offset, bytes) in &commit.journal {
            match bytes {
                JournalBytes::InFile {
                    position,
                    len,
                    crc32c,
                } => {
                    round.extend_from_slice(&(file_key_len(id) as u32).to_be_bytes());
                    extend_file_key(&mut round, id);
                    round.extend_from_slice(&offset.to_be_bytes());
                    round.extend_from_slice(&position.to_be_bytes());
                    round.extend_from_slice(&len.to_be_bytes());
                    round.extend_from_slice(&crc32c.to_be_bytes());
                }
                JournalBytes::Inline(bytes) => {
                    batch.put_cf(store.cf(CF_JOURNAL)?, journal_key(id, *offset), bytes)
                }
            }
        }
        if !round.is_empty() {
            let key = commit.journal_round.to_be_bytes();
            batch.put_cf(store.cf(CF_JOURNAL_ROUNDS)?, key, round);
            let mut last = commit.journal_round.to_be_bytes().to_vec();
            last.extend_from_slice(&commit.journal_start.to_be_bytes());
            batch.put_cf(counters, KEY_JOURNAL_LAST, last);
        }

        for (id, record) in &commit.records {
            // FileRecord holds only strings, integers and plain structs, which always serialise.
            let value = serde_json::to_vec(record).expect("FileRecord serialises to JSON");
            batch.put_cf(files, file_key(id), value);
        }

        let mut seq = self.read_counter(KEY_PLACEMENT_SEQ)?;
        for (id, offset, len) in &commit.placements {
            seq += 1;
            let mut key = file_key_with_room(id, 16);
            key.extend_from_slice(&offset.to_be_bytes());
            key.extend_from_slice(&seq.to_be_bytes());
            batch.put_cf(placements, key, len.to_be_bytes());
        }
        if !commit.placements.is_empty() {
            batch.put_cf(counters, KEY_PLACEMENT_SEQ, seq.to_be_bytes());
        }

        let mut withdrawn_bytes = 0u64;
        for (id, offset, len) in &commit.withdrawn {
            let mut prefix = file_key(id);
            prefix.extend_from_slice(&offset.to_be_bytes());
            // Sequence numbers ascend: the last entry is the newest.
            let newest = store
                .scan_prefix(CF_PLACEMENTS, &prefix, "scan placements")?
                .pop();
            if let Some((key, _)) = newest {
                batch.delete_cf(placements, key);
                withdrawn_bytes += len;
            }
        }

        // (counter, added, taken off)
        let deltas = [
            (KEY_PLACED, commit.counters.placed_bytes, withdrawn_bytes),
            (KEY_DUPLICATE, commit.counters.duplicate_bytes, 0),
            (KEY_REWRITTEN, commit.counters.rewritten_bytes, 0),
        ];
        for (key, added, taken) in deltas {
            if added != 0 || taken != 0 {
                // Statistics only: pinning at u64::MAX beats failing a placement commit.
                let total = self
                    .read_counter(key)?
                    .saturating_add(added)
                    .saturating_sub(taken);
                batch.put_cf(counters, key, total.to_be_bytes());
            }
        }
        if commit.journal_complete > 0 {
            batch.put_cf(
                counters,
                KEY_JOURNAL_COMPLETE,
                commit.journal_complete.to_be_bytes(),
            );
        }

        let mut outbox_last = None;
        if !commit.outbox.is_empty() || !commit.outbox_rewrite.is_empty() {
            let outbox = store.cf(CF_OUTBOX)?;
            for (seq, event) in &commit.outbox_rewrite {
                match event {
                    Some(event) => batch.put_cf(outbox, seq.to_be_bytes(), event.encode()),
                    None => batch.delete_cf(outbox, seq.to_be_bytes()),
                }
            }
            if !commit.outbox.is_empty() {
                let mut seq = self.outbox_last()?;
                for event in &commit.outbox {
                    seq += 1;
                    batch.put_cf(outbox, seq.to_be_bytes(), event.encode());
                }
                batch.put_cf(counters, KEY_OUTBOX_LAST, seq.to_be_bytes());
                outbox_last = Some(seq);
            }
        }

        Ok(PreparedCommit {
            manifest: self,
            batch,
            outbox_last,
            _guard: guard,
        })
    }

    /// This manifest's random identity, made and stored at the first call.
    pub fn manifest_id(&self) -> Result<String> {
        let _guard = self.commit_guard();
        if let Some(id) = self
            .store()
            .get(CF_COUNTERS, KEY_MANIFEST_ID, "read the manifest id")?
        {
            return Ok(String::from_utf8_lossy(&id).into_owned());
        }
        let id = format!("{:016x}", new_epoch());
        let mut batch = WriteBatch::default();
        batch.put_cf(
            self.store().cf(CF_COUNTERS)?,
            KEY_MANIFEST_ID,
            id.as_bytes(),
        );
        self.store().write(batch, true, "store the manifest id")?;
        Ok(id)
    }

    /// The mark of the destination root this manifest's files were placed
    /// under, once recorded.
    pub fn root_id(&self) -> Result<Option<String>> {
        Ok(self
            .store()
            .get(CF_COUNTERS, KEY_ROOT_ID, "read the root's mark")?
            .map(|id| String::from_utf8_lossy(&id).into_owned()))
    }

    /// Records the mark of the destination root (durably).
    pub fn record_root_id(&self, id: &str) -> Result<()> {
        let _guard = self.commit_guard();
        let mut batch = WriteBatch::default();
        batch.put_cf(self.store().cf(CF_COUNTERS)?, KEY_ROOT_ID, id.as_bytes());
        self.store().write(batch, true, "record the root's mark")
    }

    /// Writes a commit that a crash may have lost before it was durable,
    /// from the bytes its [`PreparedCommit::data`] gave (synced). The caller
    /// knows it was lost: applying it again over later commits would undo them.
    pub fn redo(&self, data: &[u8]) -> Result<()> {
        let _guard = self.commit_guard();
        self.store()
            .write(WriteBatch::from_data(data), true, "redo a journaled commit")
    }

    /// What the manifest knows of the journal file's rounds (see [`JournalState`]).
    pub fn journal_state(&self) -> Result<JournalState> {
        let last = match self
            .store()
            .get(CF_COUNTERS, KEY_JOURNAL_LAST, "read counter")?
        {
            None => None,
            Some(value) => {
                let decoded = value.split_at_checked(8).and_then(|(round, start)| {
                    Some(RecordedRound {
                        round: decode_u64(round)?,
                        start: decode_u64(start)?,
                    })
                });
                Some(decoded.ok_or_else(|| {
                    self.store().corrupt(
                        CF_COUNTERS,
                        KEY_JOURNAL_LAST,
                        format!("value is {} bytes, expected 16", value.len()),
                    )
                })?)
            }
        };
        Ok(JournalState {
            epoch: self.read_counter(KEY_JOURNAL_EPOCH)?,
            last,
        })
    }

    /// Drops the journal entries of these rounds: their files are flushed. Synced, because the
    /// journal file's space they pointed to is written again next: an entry that came back
    /// after a crash would point to other bytes.
    pub fn forget_journal(&self, rounds: &[u64]) -> Result<()> {
        if rounds.is_empty() {
            return Ok(());
        }
        let cf = self.store().cf(CF_JOURNAL_ROUNDS)?;
        let mut batch = WriteBatch::default();
        for round in rounds {
            batch.delete_cf(cf, round.to_be_bytes());
        }
        self.store().write(batch, true, "forget journal entries")
    }

    /// Drops every journal entry (after they were all written back), and
    /// what was known of their rounds: the next rounds number afresh, in a
    /// new epoch, so that none is taken for one written before.
    pub fn clear_journal(&self) -> Result<()> {
        let epoch = new_epoch();
        let mut batch = WriteBatch::default();
        let counters = self.store().cf(CF_COUNTERS)?;
        batch.delete_cf(counters, KEY_JOURNAL_COMPLETE);
        batch.delete_cf(counters, KEY_JOURNAL_LAST);
        batch.put_cf(counters, KEY_JOURNAL_EPOCH, epoch.to_be_bytes());
        for name in [CF_JOURNAL_ROUNDS, CF_JOURNAL] {
            let cf = self.store().cf(name)?;
            for (key, _) in self.store().scan_prefix(name, &[], "scan journal")? {
                batch.delete_cf(cf, key);
            }
        }
        self.store().write(batch, true, "clear the journal")
    }

    /// Every journal entry, ascending by file then offset.
    pub fn journal(&self) -> Result<Vec<JournalEntry>> {
        let mut keyed = Vec::new();
        for (key, value) in self.store().scan_prefix(CF_JOURNAL, &[], "scan journal")? {
            let split = key.len().checked_sub(8);
            let decoded = split.and_then(|at| {
                let (file, offset) = key.split_at(at);
                Some((decode_file_key(file)?, decode_u64(offset)?))
            });
            let (id, offset) = decoded.ok_or_else(|| {
                self.store()
                    .corrupt(CF_JOURNAL, &key, "key is not file key + offset")
            })?;
            let file = key[..key.len() - 8].to_vec();
            keyed.push((
                (file, offset),
                (id, offset, JournalBytes::Inline(value.into_vec())),
            ));
        }
        for (_, entries) in self.journal_rounds()? {
            keyed.extend(entries);
        }
        keyed.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(keyed.into_iter().map(|(_, entry)| entry).collect())
    }

    /// The journal entries of the round whose bytes a crash may have cut
    /// short: the newest one, unless a later commit said it was complete
    /// (rounds write one at a time, so no older one can be); and its number.
    pub fn journal_round_in_doubt(&self) -> Result<(u64, Vec<JournalEntry>)> {
        let complete = self.read_counter(KEY_JOURNAL_COMPLETE)?;
        let newest = self
            .journal_rounds()?
            .pop()
            .filter(|(round, _)| *round > complete);
        Ok(newest.map_or((0, Vec::new()), |(round, entries)| {
            (round, entries.into_iter().map(|(_, entry)| entry).collect())
        }))
    }

    /// Every journal round, ascending by round.
    fn journal_rounds(&self) -> Result<Vec<(u64, Vec<KeyedJournalEntry>)>> {
        let store = self.store();
        store
            .scan_prefix(CF_JOURNAL_ROUNDS, &[], "scan journal")?
            .into_iter()
            .map(|(key, value)| {
                let round = decode_u64(&key);
                let entries = decode_journal_round(&value);
                round.zip(entries).ok_or_else(|| {
                    store.corrupt(
                        CF_JOURNAL_ROUNDS,
                        &key,
                        "not a round number with a list of journal entries",
                    )
                })
            })
            .collect()
    }

    pub fn get(&self, id: &FileId) -> Result<Option<FileRecord>> {
        let key = file_key(id);
        match self.store().get(CF_FILES, &key, "read file record")? {
            Some(value) => self.decode_record(&key, &value).map(Some),
            None => Ok(None),
        }
    }

    // The scans below read records that commits rewrite in place (see
    // `REWRITTEN_CFS` in the store): a scan concurrent with a commit to a
    // record it reads may see that value half written. Callers scan only
    // what no commit can touch meanwhile.

    /// All generations recorded for (source, key), ascending by generation.
    pub fn generations(&self, source: &str, key: &str) -> Result<Vec<(u64, FileRecord)>> {
        let entries =
            self.store()
                .scan_prefix(CF_FILES, &prefix_key(source, key), "scan generations")?;
        Ok(self
            .decode_files(entries)?
            .into_iter()
            .map(|(id, record)| (id.generation, record))
            .collect())
    }

    /// Every file record of a source (all keys, all generations), ordered by key then generation.
    pub fn files_of_source(&self, source: &str) -> Result<Vec<(FileId, FileRecord)>> {
        let entries =
            self.store()
                .scan_prefix(CF_FILES, &prefix_source(source), "scan files of source")?;
        self.decode_files(entries)
    }

    /// Every file record of every source.
    /// The source of the first file record in key order, if there is one.
    /// Reads one key: cheap however many records there are.
    pub fn first_source(&self) -> Result<Option<String>> {
        let store = self.store();
        let Some(key) = store.first_key(CF_FILES, "read the first file record")? else {
            return Ok(None);
        };
        let id = decode_file_key(&key)
            .ok_or_else(|| store.corrupt(CF_FILES, &key, "key is not source\\0key\\0generation"))?;
        Ok(Some(id.source))
    }

    pub fn all_files(&self) -> Result<Vec<(FileId, FileRecord)>> {
        let entries = self.store().scan_prefix(CF_FILES, &[], "scan all files")?;
        self.decode_files(entries)
    }

    /// Audit log: every (offset, len) ever recorded as placed for this file, ascending by
    /// offset (then by commit order); an offset placed twice appears twice.
    pub fn placements(&self, id: &FileId) -> Result<Vec<(u64, u64)>> {
        let prefix = file_key(id);
        let entries = self
            .store()
            .scan_prefix(CF_PLACEMENTS, &prefix, "scan placements")?;
        entries
            .into_iter()
            .map(|(k, v)| {
                let suffix = &k[prefix.len()..];
                let offset = suffix
                    .get(..8)
                    .and_then(decode_u64)
                    .filter(|_| suffix.len() == 16)
                    .ok_or_else(|| {
                        self.store().corrupt(
                            CF_PLACEMENTS,
                            &k,
                            format!("key suffix is {} bytes, expected 16", suffix.len()),
                        )
                    })?;
                let len = decode_u64(&v).ok_or_else(|| {
                    self.store().corrupt(
                        CF_PLACEMENTS,
                        &k,
                        format!("length value is {} bytes, expected 8", v.len()),
                    )
                })?;
                Ok((offset, len))
            })
            .collect()
    }

    /// Bytes the manifest's RocksDB holds in memory: memtables (the
    /// journal's up to 64 MiB before a flush, 8 MiB for each other family)
    /// and the block cache.
    pub fn memory_bytes(&self) -> u64 {
        self.inner.store.memory_bytes(&SINK_CFS)
    }

    pub fn counters(&self) -> Result<SinkCounters> {
        Ok(SinkCounters {
            placed_bytes: self.read_counter(KEY_PLACED)?,
            duplicate_bytes: self.read_counter(KEY_DUPLICATE)?,
            rewritten_bytes: self.read_counter(KEY_REWRITTEN)?,
        })
    }

    /// A counter's persisted value; absent means nothing was ever added.
    pub(crate) fn read_counter(&self, key: &'static [u8]) -> Result<u64> {
        match self.store().get(CF_COUNTERS, key, "read counter")? {
            None => Ok(0),
            Some(v) => decode_u64(&v).ok_or_else(|| {
                self.store().corrupt(
                    CF_COUNTERS,
                    key,
                    format!("value is {} bytes, expected 8", v.len()),
                )
            }),
        }
    }

    fn decode_record(&self, key: &[u8], value: &[u8]) -> Result<FileRecord> {
        serde_json::from_slice(value).map_err(|e| {
            self.store()
                .corrupt(CF_FILES, key, format!("bad record: {e}"))
        })
    }

    fn decode_files(&self, entries: Vec<Entry>) -> Result<Vec<(FileId, FileRecord)>> {
        entries
            .into_iter()
            .map(|(k, v)| {
                let id = decode_file_key(&k).ok_or_else(|| {
                    self.store()
                        .corrupt(CF_FILES, &k, "key is not source\\0key\\0generation")
                })?;
                Ok((id, self.decode_record(&k, &v)?))
            })
            .collect()
    }
}

impl std::fmt::Debug for SinkManifest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkManifest")
            .field("path", &self.store().path())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
