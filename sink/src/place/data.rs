//! Data rows, written in order. A destination file grows only over bytes
//! already written: a range that starts at or below the file's end is
//! written now (its aligned middle directly when it is large enough, see
//! [`crate::durability::direct`]; a small one is also journaled); a range
//! that starts past the end waits in memory ([`Held`]) until the range
//! before it arrives, and is written then, by that batch, which records it.
//! A reader of the destination file thus never reads a hole:
//! whatever lies below the file's size is the source's bytes.
//!
//! Holding costs memory: the hold budget (see `holds`) bounds it for the
//! whole sink, and a batch that would go past it is refused as retryable
//! (the watcher sends it again), while the ranges that fill gaps are never
//! held.

use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use flight_server::Row;

use super::sources::Source;
use super::write::write_range;
use super::{BatchWork, Placer, RowError};
use crate::state::{JournalRange, Slot, SlotState};
use crate::written_crc::WrittenCrc;

/// Most bytes one batch puts in the journal.
const JOURNAL_BATCH_MAX: u64 = 1 << 20;
/// Journaled bytes whose files are not flushed yet, past which ranges are
/// flushed in place again (the background flush has fallen behind).
const JOURNAL_BACKLOG_MAX: u64 = crate::durability::journal::JOURNAL_FILE_BYTES;

/// Whether a part starting at `start` may be written now: the file reaches
/// it, or all it lacks before it is recorded already (bytes a crash of the
/// machine took from the file, or the journal's replay put back), which no
/// one will send again: waiting for them would wait forever.
fn writable_at(state: &SlotState, start: u64) -> bool {
    start <= state.file_end || state.record.placed.covers(state.file_end, start)
}

/// How a part is written: in place (large ranges directly, flushed with
/// their file), with its CRC-64/NVME when validation made it (a whole
/// row's), or through the page cache and into the journal too, with its
/// CRC-32C when it is known already (a whole row's, checked on arrival).
#[derive(Clone, Copy)]
enum Write {
    InPlace { crc64nvme: Option<u64> },
    Journaled { crc32c: Option<u32> },
}

impl Write {
    /// How a part is written, with the checksums of its row when the part
    /// is the whole row (`None` for a part).
    fn how(journal: bool, row: Option<&Row<'_>>) -> Self {
        if journal {
            Self::Journaled {
                crc32c: row.map(|row| row.crc32c),
            }
        } else {
            Self::InPlace {
                crc64nvme: row.and_then(|row| row.crc64nvme),
            }
        }
    }
}

impl Placer {
    pub(super) fn place_data<'b>(
        &self,
        source: &Source,
        row: &Row<'b>,
        work: &mut BatchWork<'b>,
    ) -> Result<(), RowError> {
        let slot = self.slot_or_create(source, row, work)?;
        let data: &'b [u8] = row.data;
        let len = data.len() as u64;
        let (start, end) = (row.offset, row.offset + len);
        let mut state = self.lock_written(&slot, work)?;
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
            // ack must not overtake theirs. Parts held for the bytes before
            // them were sent again: their wait starts over, or this copy
            // would be failed at once, again and again, taking down each
            // new stream before the batch that fills the gap is read.
            let now = std::time::Instant::now();
            for (&held_start, held) in state.held.range_mut(..end) {
                if held_start + held.bytes.len() as u64 > start {
                    held.since = now;
                }
            }
            work.request.depend_on(&slot, start, end);
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
        // A batch that flushes files anyway (new files, large ranges) has
        // them flushed together; copying its small ranges would be for nothing.
        let journal = len <= self.journal.max_range
            && !work.request.flushes_anyway()
            && work.request.journal_bytes + written <= JOURNAL_BATCH_MAX
            && self.journal.backlog.load(Ordering::Relaxed) < JOURNAL_BACKLOG_MAX;
        let mut placed = Vec::with_capacity(to_write.len());
        for &(s, e) in &to_write {
            let bytes = &data[(s - start) as usize..(e - start) as usize];
            let whole_row = ((s, e) == (start, end)).then_some(row);
            let outcome = if self.holds.enabled() && !writable_at(&state, s) {
                self.hold(&slot, &mut state, s, bytes, work)
            } else {
                let how = Write::how(journal, whole_row);
                self.put_part(&slot, &mut state, &file, s, bytes, how, work)
                    .map(|()| placed.push((s, e)))
                    .and_then(|()| {
                        self.drain_held(&slot, &mut state, &file, journal, &mut placed, work)
                    })
            };
            if let Err(error) = outcome {
                // What this row wrote (or wrote of others' held ranges) will
                // not be recorded: whoever waits for it sends it again.
                for &(ws, we) in &placed {
                    state.pending.remove(ws, we);
                }
                return Err(error);
            }
        }
        drop(state);
        work.ack.placed += written;
        if !placed.is_empty() {
            if journal {
                work.request.journaled_files.push(file);
            } else {
                work.request.files_to_sync.push(file);
            }
            work.request.placed.push((slot.clone(), placed));
        }
        work.request.touched.push(slot);
        Ok(())
    }

    /// Writes one part at or below the file's end: a journaled one once
    /// the request is submitted where room for it is taken (see `beside`),
    /// any other now.
    #[allow(clippy::too_many_arguments)]
    fn put_part<'b>(
        &self,
        slot: &Arc<Slot>,
        state: &mut SlotState,
        file: &Arc<File>,
        start: u64,
        bytes: &'b [u8],
        how: Write,
        work: &mut BatchWork<'b>,
    ) -> Result<(), RowError> {
        if let Write::Journaled { .. } = how
            && self.defer_write(slot, state, file, start, bytes, work)?
        {
            self.note_written(slot, state, start, bytes, how, work);
            return Ok(());
        }
        self.write_part(slot, state, file, start, bytes, how, work)
    }

    /// Writes one part now, at or below the file's end (so the file never grows
    /// past a hole), journaling it too if `how` says so, and advances the
    /// end. A failed write leaves the end where the file now says it is.
    #[allow(clippy::too_many_arguments)]
    fn write_part(
        &self,
        slot: &Slot,
        state: &mut SlotState,
        file: &Arc<File>,
        start: u64,
        bytes: &[u8],
        how: Write,
        work: &mut BatchWork<'_>,
    ) -> Result<(), RowError> {
        // This batch's deferred writes into the file come before this one.
        if work.writes.pending_in(slot) {
            work.writes.write_into(slot)?;
        }
        debug_assert!(
            !self.holds.enabled() || writable_at(state, start),
            "a write past a hole"
        );
        #[cfg(test)]
        injected_write_fault(state, start, bytes.len())?;
        let written = if let Write::Journaled { .. } = how {
            write_range(file, bytes, start, || state.record.dest_path.clone())
        } else {
            self.direct.write_in_place(state, file, bytes, start)
        };
        if let Err(error) = written {
            state.written_crc = WrittenCrc::Unknown;
            if let Ok(meta) = file.metadata() {
                state.file_end = meta.len();
            }
            // A failed write leaves nothing the page cache claims: it is
            // refused as retryable (only a failed flush poisons the sink).
            return Err(RowError::Storage(format!(
                "{}{}",
                error.into_detail(),
                self.space_left(file, bytes.len() as u64)
            )));
        }
        self.note_written(slot, state, start, bytes, how, work);
        Ok(())
    }

    /// What writing a part changes besides the file (made now, or deferred
    /// to after the request's submission): the checksum of the bytes
    /// written, the file's end, the counters, the journal's copy, and the
    /// part pending.
    fn note_written(
        &self,
        slot: &Slot,
        state: &mut SlotState,
        start: u64,
        bytes: &[u8],
        how: Write,
        work: &mut BatchWork<'_>,
    ) {
        let end = start + bytes.len() as u64;
        match how {
            Write::InPlace {
                crc64nvme: Some(crc),
            } => state
                .written_crc
                .add_checksummed(start, bytes.len() as u64, crc),
            _ => state.written_crc.add(start, bytes),
        }
        state.file_end = state.file_end.max(end);
        let known = state.disk_len.unwrap_or(0);
        if start < known {
            work.request.counters.rewritten_bytes += end.min(known) - start;
        }
        if let Write::Journaled { crc32c } = how {
            let shared = work.batch.and_then(|batch| batch.share_data(bytes));
            work.request.journal.push(JournalRange {
                id: slot.id.clone(),
                offset: start,
                bytes: shared.unwrap_or_else(|| flight_server::wire::Buffer::from(bytes)),
                crc32c: crc32c.unwrap_or_else(|| flight_server::checksum::crc32c(bytes)),
            });
            work.request.journal_bytes += bytes.len() as u64;
        }
        state.pending.insert(start, end);
    }

    /// Says so when the filesystem of the sink's root is (nearly) full, to
    /// go with a failed write into `file`.
    pub(super) fn space_left(&self, file: &File, wanted: u64) -> String {
        match rustix::fs::fstatvfs(file) {
            Ok(fs) if fs.f_bavail.saturating_mul(fs.f_frsize) < wanted.saturating_mul(2) => {
                format!(
                    "; the filesystem holding the sink's root {} is full ({} bytes free of {}): the batch is sent again until there is room",
                    self.root.path().display(),
                    fs.f_bavail.saturating_mul(fs.f_frsize),
                    fs.f_blocks.saturating_mul(fs.f_frsize),
                )
            }
            _ => String::new(),
        }
    }

    /// Writes the held ranges the file's end has reached, in order; they
    /// join this batch's placed ranges (its round records them, and the
    /// batches that sent them are answered once that is durable).
    fn drain_held(
        &self,
        slot: &Slot,
        state: &mut SlotState,
        file: &Arc<File>,
        journal: bool,
        placed: &mut Vec<(u64, u64)>,
        work: &mut BatchWork,
    ) -> Result<(), RowError> {
        while let Some(start) = state.held.keys().next().copied() {
            if !writable_at(state, start) {
                break;
            }
            let Some(held) = self.holds.take_out(state, start) else {
                break;
            };
            let len = held.bytes.len() as u64;
            let end = start + len;
            // Journaled only if it would have been on its own: a large held
            // range goes in place (directly, past the page cache), and is
            // flushed with its file.
            let journal = journal
                && len <= self.journal.max_range
                && work.request.journal_bytes + len <= JOURNAL_BATCH_MAX;
            if !journal {
                work.request.files_to_sync.push(file.clone());
            }
            // Pending already (the holder put it there): write_part adds it
            // again. Failing, it is no one's any more: its holder sends it again.
            let how = Write::how(journal, None);
            if let Err(error) = self.write_part(slot, state, file, start, &held.bytes, how, work) {
                state.pending.remove(start, end);
                return Err(error);
            }
            placed.push((start, end));
        }
        Ok(())
    }

    /// Keeps a part that starts past the file's end in memory until the
    /// bytes before it arrive (see [`Self::drain_held`]); the batch's ack
    /// waits until whoever writes it has recorded it. Refused, as a storage
    /// condition the sender retries, when the sink holds too much already.
    fn hold(
        &self,
        slot: &Arc<Slot>,
        state: &mut SlotState,
        start: u64,
        bytes: &[u8],
        work: &mut BatchWork,
    ) -> Result<(), RowError> {
        let len = bytes.len() as u64;
        if let Err(full) = self.holds.hold(slot, state, start, bytes) {
            // The batch fails, but only once its other rows are written:
            // those that fill gaps move the files' ends on, so the next
            // attempt holds less, and a full budget cannot lock two batches
            // that each fill the other's gap out for good.
            work.refused.get_or_insert(format!(
                "{} bytes at {start} of {} arrived ahead of the bytes before them, and the sink already holds {} such bytes (limit {}); the batch is sent again",
                len, state.record.dest_path, full.held, full.limit
            ));
            return Ok(());
        }
        let end = start + len;
        state.pending.insert(start, end);
        work.held.push((slot.clone(), start, end));
        work.request.depend_on(slot, start, end);
        Ok(())
    }
}

/// A write failure a test arranged for this file (see [`crate::fault`]).
#[cfg(test)]
pub(super) fn injected_write_fault(
    state: &SlotState,
    start: u64,
    len: usize,
) -> Result<(), RowError> {
    crate::fault::io(crate::fault::Point::FileWrite, &state.record.dest_path).map_err(|error| {
        RowError::Storage(format!(
            "writing {len} bytes at offset {start} of {}: {error}",
            state.record.dest_path
        ))
    })
}
