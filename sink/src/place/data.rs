//! Data rows: a range is written at its offset, its aligned middle directly
//! when it is large enough ([`crate::durability::direct`]); a small one is also journaled,
//! and written into its file only once its batch is handed to the committer
//! ([`DeferredWrites`]), so the write overlaps the round's journal write.

use super::*;

/// Writes a range at its offset; the error names the destination (asked
/// for only then).
pub(super) fn write_range(
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

/// Most bytes one batch puts in the journal.
const JOURNAL_BATCH_MAX: u64 = 1 << 20;
/// Journaled bytes whose files are not flushed yet, past which ranges are
/// flushed in place again (the background flush has fallen behind).
const JOURNAL_BACKLOG_MAX: u64 = crate::durability::journal::JOURNAL_FILE_BYTES;

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
    /// Writes a range in place: its aligned middle directly when it is
    /// large enough and the filesystem allows, the rest through the page
    /// cache. An error names the destination and offset.
    pub(super) fn write_in_place(
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

    pub(super) fn place_data(
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
}
