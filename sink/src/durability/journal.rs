//! The journal file: a ring of preallocated, already written blocks where a
//! commit round's small ranges and its manifest records become durable with
//! one write and one fdatasync, instead of a writeback of every file they
//! grew and a synced manifest write beside it.
//!
//! Flushing a file that grew costs a metadata commit of its new size and
//! blocks; a round of many appended files costs one per file, even under a
//! single `syncfs`. Overwriting blocks that are already allocated and written
//! changes no metadata, so its fdatasync is a data write and a cache flush.
//! The ranges' manifest entries point into this file (position, length,
//! CRC-32C); the files themselves are flushed later, in the background, and
//! only then are their entries dropped and their space here reused.
//!
//! A round's region is a header, the ranges' bytes, then the round's manifest
//! WriteBatch ([`manifest_db::PreparedCommit::data`]), which the manifest
//! writes without a sync of its own. A machine crash may lose those unsynced
//! manifest writes; at startup [`redo_lost_rounds`] finds the rounds written
//! after the newest one the manifest holds and applies their batches again.
//! The header names the journal's epoch (one per sink run), the round's number
//! and where it starts, and carries a CRC-32C of the whole region: a stale
//! round from an earlier lap or run, or one cut short, is never redone.
//!
//! Positions count up across the ring's laps; the file offset is the position
//! modulo the capacity. A round's region is contiguous: one that would cross
//! the end of the file starts at the beginning of the next lap.
//!
//! A round's region is reserved first ([`JournalFile::reserve`]): where each
//! range goes and its CRC are known before a byte is written, so the round's
//! manifest entries can be built before its bytes are written. An entry whose
//! bytes did not make it (a process crash after the manifest write, before
//! the journal write ended) fails its CRC at the replay, which tells it from
//! one that did.

use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use flight_server::checksum::{crc32c, crc32c_append};
use manifest_db::{JournalBytes, SinkManifest};

use crate::error::SinkError;

/// Size of the journal file: enough for the ranges of the rounds between
/// two background flushes, with room for one flush running late.
pub(crate) const JOURNAL_FILE_BYTES: u64 = 64 << 20;

/// File name of the journal, in the sink's state directory.
pub(crate) const JOURNAL_FILE_NAME: &str = "tailflight-journal.ring";

/// Bytes of a round's header: magic, epoch, round, start, length of its
/// ranges' bytes, length of its manifest batch (`u64` LE each), CRC-32C of
/// the ranges, the batch and the header before it (`u32` LE), zeros.
const ROUND_HEADER_BYTES: u64 = 64;
const ROUND_MAGIC: [u8; 8] = *b"TFJRND01";
/// Room kept in each round's region for its manifest batch (at most a
/// quarter of the journal file). A larger batch (a round of thousands of
/// ranges) stays out of the journal: the manifest then writes it synced.
const MAX_ROUND_BATCH: u64 = 1 << 20;

pub(crate) struct JournalFile {
    file: Arc<File>,
    path: PathBuf,
    capacity: u64,
    /// Position where the next round's region may start.
    head: u64,
    /// Where the space still in use starts: the start of the last round
    /// the background flush was done with (see `Backlog` in the committer).
    tail: Arc<AtomicU64>,
    /// Rounds of this sink run name this epoch, and number from 1.
    epoch: u64,
    next_round: u64,
    /// Room kept in each region for the round's manifest batch.
    batch_room: u64,
}

/// A round's region, reserved: where its ranges go, and its write.
pub(crate) struct RoundReservation {
    /// Where each range will be, with its CRC, in the order given.
    pub refs: Vec<JournalBytes>,
    pub round: u64,
    /// Where the region starts (a position, counting laps).
    pub start: u64,
    pub write: RoundWrite,
}

/// Lets the background flush give space back once the entries using it are
/// dropped from the manifest.
#[derive(Clone)]
pub(crate) struct JournalSpace(Arc<AtomicU64>);

impl JournalSpace {
    /// Everything written before `end` may be overwritten.
    pub fn release_to(&self, end: u64) {
        self.0.fetch_max(end, Ordering::AcqRel);
    }
}

impl JournalFile {
    /// Opens the journal file at `path`, creating it and writing every block
    /// of it once if it is new or shorter than `capacity`. Its rounds are
    /// written in `epoch`: the manifest's, after every earlier round was
    /// replayed and forgotten.
    pub fn open(path: &Path, capacity: u64, epoch: u64) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let len = file.metadata()?.len();
        if len > capacity {
            // The startup's redo reads the ring at the file's size: it must
            // be the one the rounds are written with. Nothing points into
            // it any more (the replay ran before).
            file.set_len(capacity)?;
            file.sync_all()?;
        }
        if len < capacity {
            // Zeros written, not fallocated: an unwritten extent would turn
            // each first overwrite into a metadata change again.
            let zeros = vec![0u8; 1 << 20];
            let mut at = len;
            while at < capacity {
                let n = (capacity - at).min(zeros.len() as u64) as usize;
                file.write_all_at(&zeros[..n], at)?;
                at += n as u64;
            }
            file.sync_all()?;
            if let Some(dir) = path.parent() {
                File::open(dir)?.sync_all()?;
            }
        }
        Ok(Self {
            file: Arc::new(file),
            path: path.to_path_buf(),
            capacity,
            head: 0,
            tail: Arc::new(AtomicU64::new(0)),
            epoch,
            next_round: 1,
            batch_room: MAX_ROUND_BATCH.min(capacity / 4),
        })
    }

    pub fn space(&self) -> JournalSpace {
        JournalSpace(self.tail.clone())
    }

    /// Where `len` bytes would go, if the ring has room for them now.
    fn place(&self, len: u64) -> Option<u64> {
        if len == 0 || len > self.capacity {
            return None;
        }
        let offset = self.head % self.capacity;
        let start = if offset + len > self.capacity {
            self.head + (self.capacity - offset)
        } else {
            self.head
        };
        let tail = self.tail.load(Ordering::Acquire);
        (start + len - tail <= self.capacity).then_some(start)
    }

    /// Whether a round of ranges of `len` bytes fits now (space only grows
    /// until the next [`Self::reserve`]).
    pub fn has_room(&self, len: u64) -> bool {
        self.place(self.region_bound(len)).is_some()
    }

    /// Reserves a region for `pieces` (bytes, and their CRC-32C), back to
    /// back after the header, with room for the round's manifest batch
    /// after them. Rounds reserve and write one at a time: the next region
    /// follows this one's end, given to [`Self::settle`] once the round is
    /// written.
    pub fn reserve(&mut self, pieces: &[(&[u8], u32)]) -> io::Result<RoundReservation> {
        let len: u64 = pieces.iter().map(|(p, _)| p.len() as u64).sum();
        let start = self.place(self.region_bound(len)).ok_or_else(|| {
            io::Error::other(format!(
                "no room for {len} bytes in the journal file {}",
                self.path.display()
            ))
        })?;
        let offset = start % self.capacity;
        let mut refs = Vec::with_capacity(pieces.len());
        let mut position = offset + ROUND_HEADER_BYTES;
        for &(piece, crc32c) in pieces {
            refs.push(JournalBytes::InFile {
                position,
                len: piece.len() as u32,
                crc32c,
            });
            position += piece.len() as u64;
        }
        let round = self.next_round;
        self.next_round += 1;
        // Until the round settles, as if its batch took all the room it has.
        self.head = start + self.region_bound(len);
        let write = RoundWrite {
            file: self.file.clone(),
            path: self.path.clone(),
            offset,
            batch_room: self.batch_room,
            header: RoundHeader {
                epoch: self.epoch,
                round,
                start,
                bytes_len: len,
                batch_len: 0,
            },
        };
        Ok(RoundReservation {
            refs,
            round,
            start,
            write,
        })
    }

    /// Most room a round of ranges of `len` bytes takes.
    fn region_bound(&self, len: u64) -> u64 {
        ROUND_HEADER_BYTES + len + self.batch_room
    }

    /// The last round reserved was written and ends at `end`.
    pub fn settle(&mut self, end: u64) {
        self.head = self.head.min(end);
    }

    /// Reserves a region for `pieces` and writes them there durably, with
    /// no manifest batch.
    #[cfg(test)]
    pub fn write(&mut self, pieces: &[&[u8]]) -> io::Result<(Vec<JournalBytes>, u64)> {
        let with_crcs: Vec<(&[u8], u32)> = pieces.iter().map(|p| (*p, crc32c(p))).collect();
        let reservation = self.reserve(&with_crcs)?;
        let end = reservation.write.write_durably(pieces, &[])?;
        self.settle(end);
        Ok((reservation.refs, end))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RoundHeader {
    epoch: u64,
    round: u64,
    start: u64,
    bytes_len: u64,
    batch_len: u64,
}

impl RoundHeader {
    /// The header's fields, before its CRC.
    fn fields(&self) -> [u8; 48] {
        let mut out = [0u8; 48];
        out[..8].copy_from_slice(&ROUND_MAGIC);
        for (i, value) in [
            self.epoch,
            self.round,
            self.start,
            self.bytes_len,
            self.batch_len,
        ]
        .into_iter()
        .enumerate()
        {
            out[8 + i * 8..16 + i * 8].copy_from_slice(&value.to_le_bytes());
        }
        out
    }

    fn parse(bytes: &[u8]) -> Option<(Self, u32)> {
        let word = |i: usize| Some(u64::from_le_bytes(bytes.get(i..i + 8)?.try_into().ok()?));
        if bytes.get(..8)? != ROUND_MAGIC {
            return None;
        }
        let header = Self {
            epoch: word(8)?,
            round: word(16)?,
            start: word(24)?,
            bytes_len: word(32)?,
            batch_len: word(40)?,
        };
        let crc = u32::from_le_bytes(bytes.get(48..52)?.try_into().ok()?);
        Some((header, crc))
    }

    fn len(&self) -> u64 {
        ROUND_HEADER_BYTES + self.bytes_len + self.batch_len
    }
}

/// The write of one reserved round: its header, its pieces in the order
/// reserved, and its manifest batch.
pub(crate) struct RoundWrite {
    file: Arc<File>,
    path: PathBuf,
    offset: u64,
    batch_room: u64,
    header: RoundHeader,
}

impl RoundWrite {
    /// Writes the round's ranges (not durably yet): this can run while the
    /// round's manifest batch is built. Returns their CRC, for [`Self::seal`].
    pub fn write_ranges(&self, pieces: &[&[u8]]) -> io::Result<u32> {
        let at = self.offset + ROUND_HEADER_BYTES;
        write_all_vectored_at(&self.file, pieces, at)?;
        Ok(pieces
            .iter()
            .fold(crc32c(&[]), |crc, piece| crc32c_append(crc, piece)))
    }

    /// Writes the round's manifest batch (empty if the manifest writes it
    /// synced) after its ranges and the header before them, and makes the
    /// region durable (fdatasync). Returns where the region ends.
    pub fn seal(&self, ranges_crc: u32, batch: &[u8]) -> io::Result<u64> {
        let header = RoundHeader {
            batch_len: batch.len() as u64,
            ..self.header
        };
        if batch.len() as u64 > self.batch_room {
            return Err(io::Error::other(format!(
                "a manifest batch of {} bytes does not fit in a journal round",
                batch.len()
            )));
        }
        let fields = header.fields();
        let crc = crc32c_append(crc32c_append(ranges_crc, batch), &fields);
        let mut head = [0u8; ROUND_HEADER_BYTES as usize];
        head[..48].copy_from_slice(&fields);
        head[48..52].copy_from_slice(&crc.to_le_bytes());
        let batch_at = self.offset + ROUND_HEADER_BYTES + header.bytes_len;
        write_all_vectored_at(&self.file, &[batch], batch_at)?;
        write_all_vectored_at(&self.file, &[&head], self.offset)?;
        #[cfg(test)]
        crate::fault::io(crate::fault::Point::JournalSync, &self.path)?;
        self.file.sync_data()?;
        Ok(header.start + header.len())
    }

    /// Both: the whole region, durably.
    #[cfg(test)]
    pub fn write_durably(&self, pieces: &[&[u8]], batch: &[u8]) -> io::Result<u64> {
        let crc = self.write_ranges(pieces)?;
        self.seal(crc, batch)
    }

    /// Most bytes of manifest batch the round's region has room for.
    pub fn batch_room(&self) -> usize {
        self.batch_room as usize
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Applies again the manifest batches of the rounds the journal file holds
/// after the newest round the manifest has: a machine crash lost those
/// unsynced manifest writes, and some of their ranges were acknowledged.
/// Returns how many rounds it redid. A round cut short (its CRC fails) ends
/// the search: rounds are written one at a time, so none follows it.
pub(crate) fn redo_lost_rounds(manifest: &SinkManifest, path: &Path) -> Result<usize, SinkError> {
    let state = manifest
        .journal_state()
        .map_err(|e| SinkError::storage("reading the journal's state from the manifest", e))?;
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => {
            return Err(SinkError::storage(
                format_args!("cannot open the journal file {}", path.display()),
                e,
            ));
        }
    };
    let capacity = file
        .metadata()
        .map_err(|e| {
            SinkError::storage(
                format_args!("cannot read the size of {}", path.display()),
                e,
            )
        })?
        .len();
    if capacity < ROUND_HEADER_BYTES {
        return Ok(0);
    }
    let ring = Ring {
        file: &file,
        path,
        capacity,
        epoch: state.epoch,
    };
    let (mut round, mut at) = match state.last {
        // The newest recorded round: its end is where a lost one would start.
        Some(last) => match ring.read_round(last.start, last.round)? {
            Some((header, _)) => (last.round + 1, header.start + header.len()),
            None => {
                // Space is given back only behind it, so only a crash
                // during its own write leaves it incomplete: it was never
                // acknowledged, and no round followed it.
                tracing::warn!(
                    round = last.round,
                    "the newest journal round the manifest holds was cut short"
                );
                return Ok(0);
            }
        },
        None => (1, 0),
    };
    let mut redone = 0;
    loop {
        let next_lap = at.div_ceil(capacity) * capacity;
        let mut found = None;
        for start in [at, next_lap] {
            found = ring.read_round(start, round)?;
            if found.is_some() {
                break;
            }
        }
        let Some((header, batch)) = found else {
            return Ok(redone);
        };
        if batch.is_empty() {
            // Its manifest write was synced: had it completed, the manifest
            // would name this round as its newest. It failed, so the round
            // was never acknowledged, and the sink stopped after it.
            return Ok(redone);
        }
        manifest.redo(&batch).map_err(|e| {
            SinkError::storage(
                format_args!(
                    "redoing the manifest write of journal round {round} (position {})",
                    header.start
                ),
                e,
            )
        })?;
        redone += 1;
        round += 1;
        at = header.start + header.len();
    }
}

struct Ring<'a> {
    file: &'a File,
    path: &'a Path,
    capacity: u64,
    epoch: u64,
}

/// A whole round found in the ring: its header and its manifest batch.
type FoundRound = (RoundHeader, Vec<u8>);

impl Ring<'_> {
    /// Round `round` of this epoch, if it starts at `start` and is whole.
    /// Fails only if the file cannot be read: a round silently skipped would
    /// be lost for good.
    fn read_round(&self, start: u64, round: u64) -> Result<Option<FoundRound>, SinkError> {
        let offset = start % self.capacity;
        let mut head = [0u8; ROUND_HEADER_BYTES as usize];
        if !self.read_at(&mut head, offset)? {
            return Ok(None);
        }
        let Some((header, crc)) = RoundHeader::parse(&head) else {
            return Ok(None);
        };
        let wanted = (header.epoch, header.round, header.start) == (self.epoch, round, start);
        let fits = header.batch_len <= MAX_ROUND_BATCH
            && header
                .bytes_len
                .checked_add(header.batch_len)
                .and_then(|len| len.checked_add(ROUND_HEADER_BYTES + offset))
                .is_some_and(|end| end <= self.capacity);
        if !wanted || !fits {
            return Ok(None);
        }
        let mut body = vec![0u8; (header.bytes_len + header.batch_len) as usize];
        if !self.read_at(&mut body, offset + ROUND_HEADER_BYTES)?
            || crc32c_append(crc32c(&body), &header.fields()) != crc
        {
            return Ok(None);
        }
        let batch = body.split_off(header.bytes_len as usize);
        Ok(Some((header, batch)))
    }

    /// Reads `buf.len()` bytes at `offset`; false if the file ends first.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<bool, SinkError> {
        match self.file.read_exact_at(buf, offset) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
            Err(e) => Err(SinkError::storage(
                format_args!(
                    "reading {} bytes at offset {offset} of the journal file {}",
                    buf.len(),
                    self.path.display()
                ),
                e,
            )),
        }
    }
}

/// Most buffers one `pwritev` takes (Linux's `IOV_MAX`).
const MAX_IOVECS: usize = 1024;

/// Writes `pieces` back to back from `offset`, straight from where they are:
/// `pwritev` calls until all is written (one may stop short).
fn write_all_vectored_at(file: &File, pieces: &[&[u8]], mut offset: u64) -> io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = pieces
        .iter()
        .filter(|piece| !piece.is_empty())
        .map(|piece| IoSlice::new(piece))
        .collect();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        let batch = rest.len().min(MAX_IOVECS);
        let written = match rustix::io::pwritev(file, &rest[..batch], offset) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(written) => written,
            Err(rustix::io::Errno::INTR) => continue,
            Err(errno) => return Err(errno.into()),
        };
        offset += written as u64;
        IoSlice::advance_slices(&mut rest, written);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::scratch;

    fn position(r: &JournalBytes) -> u64 {
        match r {
            JournalBytes::InFile { position, .. } => *position,
            JournalBytes::Inline(_) => panic!("inline"),
        }
    }

    /// More pieces than one pwritev takes, some empty: every piece lands
    /// where its reference says, with its CRC.
    #[test]
    fn a_round_of_many_pieces_is_written_in_place() {
        let dir = scratch("journal-many-pieces");
        let path = dir.join(JOURNAL_FILE_NAME);
        let mut journal = JournalFile::open(&path, 1 << 20, 1).unwrap();
        let pieces: Vec<Vec<u8>> = (0..3000u32)
            .map(|i| vec![(i % 251) as u8; (i % 7) as usize * 13])
            .collect();
        let borrowed: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
        let (refs, end) = journal.write(&borrowed).unwrap();
        let total: usize = pieces.iter().map(Vec::len).sum();
        assert_eq!(end, ROUND_HEADER_BYTES + total as u64);
        let file = File::open(&path).unwrap();
        for (piece, reference) in pieces.iter().zip(&refs) {
            let JournalBytes::InFile {
                position,
                len,
                crc32c: crc,
            } = *reference
            else {
                unreachable!()
            };
            let mut bytes = vec![0u8; len as usize];
            file.read_exact_at(&mut bytes, position).unwrap();
            assert_eq!(&bytes, piece);
            assert_eq!(crc32c(&bytes), crc);
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn rounds_wrap_to_the_start_and_wait_for_released_space() {
        let dir = scratch("journal-ring");
        let path = dir.join(JOURNAL_FILE_NAME);
        // Room for a batch: a quarter, 250 bytes; a header: 64.
        let mut journal = JournalFile::open(&path, 1000, 1).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 1000);
        let space = journal.space();

        let (refs, end) = journal
            .write(&[b"0123456789", b"abcdefghijklmnopqrst"])
            .unwrap();
        assert_eq!(refs.iter().map(position).collect::<Vec<_>>(), [64, 74]);
        assert_eq!(end, 94);
        let (refs, end) = journal.write(&[&[7u8; 400]]).unwrap();
        assert_eq!(refs.iter().map(position).collect::<Vec<_>>(), [158]);
        assert_eq!(end, 558);
        // 200 bytes and room for their batch do not fit in the last 442;
        // the next lap's start is still in use.
        assert!(!journal.has_room(200));
        assert!(journal.write(&[&[1u8; 200]]).is_err());
        space.release_to(94);
        assert!(!journal.has_room(200));
        space.release_to(558);
        let (refs, end) = journal.write(&[&[1u8; 200]]).unwrap();
        assert_eq!(refs.iter().map(position).collect::<Vec<_>>(), [64]);
        assert_eq!(end, 1264);
        assert!(!journal.has_room(800));

        let JournalBytes::InFile {
            position,
            len,
            crc32c: crc,
        } = refs[0]
        else {
            unreachable!()
        };
        let mut bytes = vec![0u8; len as usize];
        File::open(&path)
            .unwrap()
            .read_exact_at(&mut bytes, position)
            .unwrap();
        assert_eq!(bytes, [1u8; 200]);
        assert_eq!(crc32c(&bytes), crc);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A machine crash lost the manifest's unsynced writes of the newest
    /// rounds: the journal holds their batches, and the startup redoes
    /// those that are whole, in order, and no other. The result is the
    /// manifest those writes would have made (records, audit log, counters).
    #[test]
    fn manifest_writes_a_crash_lost_are_redone_from_the_journal() {
        use manifest_db::{FileId, FileRecord, IntervalSet, SinkCommit, SinkCounters};
        let dir = scratch("journal-redo");
        // What survived the crash (a sink's state: manifest and journal),
        // and what every write made.
        let state = dir.join("survived");
        let path = state.join(JOURNAL_FILE_NAME);
        let survived = SinkManifest::open(&state).unwrap();
        let whole = SinkManifest::open(&dir.join("whole")).unwrap();
        survived.clear_journal().unwrap();
        let epoch = survived.journal_state().unwrap().epoch;
        let mut journal = JournalFile::open(&path, 1 << 20, epoch).unwrap();
        let id = FileId {
            source: "src".into(),
            key: "a.dat".into(),
            generation: 1,
        };
        // Round n places bytes 4n..4n+4; returns its batch and its region.
        let mut round = |n: u64| {
            let bytes = [b'a' + n as u8; 4];
            let reservation = journal.reserve(&[(&bytes, crc32c(&bytes))]).unwrap();
            let commit = SinkCommit {
                records: vec![(
                    id.clone(),
                    FileRecord {
                        dest_path: "src/a.dat".into(),
                        placed: IntervalSet::from_ranges([(0, n * 4 + 4)]),
                        ..FileRecord::default()
                    },
                )],
                placements: vec![(id.clone(), n * 4, 4)],
                counters: SinkCounters {
                    placed_bytes: 4,
                    ..SinkCounters::default()
                },
                journal: vec![(id.clone(), n * 4, reservation.refs[0].clone())],
                journal_round: reservation.round,
                journal_start: reservation.start,
                journal_complete: reservation.round - 1,
                ..SinkCommit::default()
            };
            let prepared = whole.prepare(&commit).unwrap();
            let batch = prepared.data().to_vec();
            let end = reservation.write.write_durably(&[&bytes], &batch).unwrap();
            prepared.write_synced().unwrap();
            journal.settle(end);
            (batch, reservation.start, end)
        };
        let (first, _, _) = round(0);
        survived.redo(&first).unwrap();
        round(1);
        let (_, third, _) = round(2);
        let snapshot = |m: &SinkManifest| {
            (
                m.all_files().unwrap(),
                m.placements(&id).unwrap(),
                m.counters().unwrap(),
                m.journal().unwrap(),
            )
        };
        let before_the_last = snapshot(&whole);
        // The last round's write was cut short: one byte of it never landed.
        let (_, _, end) = round(3);
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(b"?", end - 1).unwrap();

        // An audit of the stopped sink redoes them first, as its start would.
        drop(survived);
        let audit = crate::audit(&state, false).unwrap();
        assert_eq!(audit.redone_journal_rounds, 2);
        assert_eq!((audit.placements, audit.placed_bytes), (3, 12));
        assert_eq!(audit.overlapping_placements + audit.record_mismatches, 0);
        let survived = SinkManifest::open(&state).unwrap();
        assert_eq!(snapshot(&survived), before_the_last);
        assert_eq!(survived.counters().unwrap().placed_bytes, 12);
        let last = survived.journal_state().unwrap().last;
        assert_eq!(
            last,
            Some(manifest_db::RecordedRound {
                round: 3,
                start: third
            })
        );
        // Nothing is redone twice.
        assert_eq!(redo_lost_rounds(&survived, &path).expect("redo"), 0);
        // A new epoch's rounds start at the beginning again: the old ones
        // there are not taken for them.
        survived.clear_journal().unwrap();
        assert_eq!(redo_lost_rounds(&survived, &path).expect("redo"), 0);
        assert_eq!(survived.placements(&id).unwrap().len(), 3);
        let _ = std::fs::remove_dir_all(dir);
    }
}
