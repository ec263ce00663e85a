//! Data rows, written in order. A destination file grows only over bytes
//! already written: a range that starts at or below the file's end is
//! written now (its aligned middle directly when it is large enough, see
//! [`crate::durability::direct`]; a small one is also journaled); a range
//! that starts past the end waits in memory ([`Held`]) until the range
//! before it arrives, and is written then, by that batch, which records it.
//! A reader of the destination file thus never reads a hole:
//! whatever lies below the file's size is the source's bytes.
//!
//! Holding costs memory: [`Placer::hold_limit`] bounds it for the whole
//! sink, and a batch that would go past it is refused as retryable (the
//! watcher sends it again), while the ranges that fill gaps are never held.

use super::*;

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
    ) -> Result<(), SinkError> {
        let middle = match self.direct_min {
            0 => None,
            min => direct::aligned_middle(offset, bytes.len() as u64, min),
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
                return Err(SinkError::storage(
                    format_args!(
                        "writing {} bytes at offset {} of {} (O_DIRECT)",
                        failed.len, failed.offset, state.record.dest_path
                    ),
                    failed.error,
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
            let bytes = &row.data[(s - start) as usize..(e - start) as usize];
            let outcome = if self.hold_limit > 0 && !writable_at(&state, s) {
                self.hold(&slot, &mut state, s, bytes, work)
            } else {
                self.write_part(&slot, &mut state, &file, s, bytes, journal, work)
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

    /// Writes one part at or below the file's end (so the file never grows
    /// past a hole), journaling it too if `journal`, and advances the end.
    /// A failed write leaves the end where the file now says it is.
    #[allow(clippy::too_many_arguments)]
    fn write_part(
        &self,
        slot: &Slot,
        state: &mut SlotState,
        file: &Arc<File>,
        start: u64,
        bytes: &[u8],
        journal: bool,
        work: &mut BatchWork,
    ) -> Result<(), RowError> {
        let end = start + bytes.len() as u64;
        debug_assert!(
            self.hold_limit == 0 || writable_at(state, start),
            "a write past a hole"
        );
        #[cfg(test)]
        if let Err(error) =
            crate::fault::io(crate::fault::Point::FileWrite, &state.record.dest_path)
        {
            return Err(RowError::Storage(format!(
                "writing {} bytes at offset {start} of {}: {error}",
                bytes.len(),
                state.record.dest_path
            )));
        }
        let written = if journal {
            write_range(file, bytes, start, || state.record.dest_path.clone())
        } else {
            self.write_in_place(state, file, bytes, start)
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
        state.written_crc.add(start, bytes);
        state.file_end = state.file_end.max(end);
        let known = state.disk_len.unwrap_or(0);
        if start < known {
            work.request.counters.rewritten_bytes += end.min(known) - start;
        }
        if journal {
            work.request
                .journal
                .push((slot.id.clone(), start, bytes.to_vec()));
            work.request.journal_bytes += bytes.len() as u64;
        }
        state.pending.insert(start, end);
        Ok(())
    }

    /// Says so when the filesystem of the sink's root is (nearly) full, to
    /// go with a failed write into `file`.
    fn space_left(&self, file: &File, wanted: u64) -> String {
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
            let Some(held) = state.held.remove(&start) else {
                break;
            };
            self.held_bytes
                .fetch_sub(held.bytes.len() as u64, Ordering::Relaxed);
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
            if let Err(error) =
                self.write_part(slot, state, file, start, &held.bytes, journal, work)
            {
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
        let mut before = self.held_bytes.fetch_add(len, Ordering::Relaxed);
        if before + len > self.hold_limit {
            self.held_bytes.fetch_sub(len, Ordering::Relaxed);
            self.evict_stale_holds(slot, state);
            before = self.held_bytes.fetch_add(len, Ordering::Relaxed);
        }
        if before + len > self.hold_limit {
            self.held_bytes.fetch_sub(len, Ordering::Relaxed);
            // The batch fails, but only once its other rows are written:
            // those that fill gaps move the files' ends on, so the next
            // attempt holds less, and a full budget cannot lock two batches
            // that each fill the other's gap out for good.
            work.refused.get_or_insert(format!(
                "{} bytes at {start} of {} arrived ahead of the bytes before them, and the sink already holds {before} such bytes (limit {}); the batch is sent again",
                len, state.record.dest_path, self.hold_limit
            ));
            return Ok(());
        }
        let end = start + len;
        if state.held.is_empty() {
            let mut holders = lock(&self.holders);
            // Forget slots that hold nothing now before the list doubles
            // (only a full budget looks at it otherwise). A slot's own
            // state is the caller's, and locking it again would deadlock.
            if holders.len() >= 1024 && holders.len().is_power_of_two() {
                holders.retain(|weak| {
                    weak.upgrade().is_some_and(|other| {
                        Arc::ptr_eq(&other, slot)
                            || other
                                .state
                                .try_lock()
                                .map_or(true, |state| !state.held.is_empty())
                    })
                });
            }
            holders.push(Arc::downgrade(slot));
        }
        state.held.insert(
            start,
            Held {
                bytes: bytes.to_vec(),
                since: std::time::Instant::now(),
            },
        );
        state.pending.insert(start, end);
        work.held.push((slot.clone(), start, end));
        work.request.depend_on(slot, start, end);
        Ok(())
    }

    /// Frees the hold budget of ranges held longer than [`crate::commit::HOLD_WAIT`] since
    /// they were last sent: their batches have been failed and sent again
    /// or their peers are gone (a watcher that stopped, a hostile client
    /// that sent ranges past a gap it never fills), and nobody waits for
    /// them. Kept, they would take the budget from every other stream for
    /// as long as the sink runs. Their bytes were never acknowledged: a
    /// watcher still alive sends them again. `current` is the slot whose
    /// state the caller holds locked; other slots busy now are skipped
    /// (locking them could deadlock against their holder).
    fn evict_stale_holds(&self, current: &Arc<Slot>, current_state: &mut SlotState) {
        let mut holders = lock(&self.holders);
        let evict = |state: &mut SlotState| {
            let stale: Vec<u64> = state
                .held
                .iter()
                .filter(|(_, held)| held.since.elapsed() > crate::commit::HOLD_WAIT)
                .map(|(&start, _)| start)
                .collect();
            for start in stale {
                if let Some(held) = state.held.remove(&start) {
                    let len = held.bytes.len() as u64;
                    self.held_bytes.fetch_sub(len, Ordering::Relaxed);
                    state.pending.remove(start, start + len);
                    tracing::info!(file = %state.record.dest_path, start, len, "dropped a range held past the hold wait: nobody waits for it (its sender may send it again)");
                }
            }
            !state.held.is_empty()
        };
        holders.retain(|weak| {
            let Some(slot) = weak.upgrade() else {
                return false;
            };
            if Arc::ptr_eq(&slot, current) {
                return evict(current_state);
            }
            match slot.state.try_lock() {
                Ok(mut state) => evict(&mut state),
                // Busy: looked at on the next full budget.
                Err(crate::lock_order::WouldBlock) => true,
            }
        });
        // A slot that emptied and held again is listed twice: keep one.
        let mut seen = std::collections::HashSet::new();
        holders.retain(|weak| seen.insert(weak.as_ptr() as usize));
    }

    /// Drops what a batch that failed still holds (nobody drained it): no
    /// one waits for it once its batch is sent again.
    pub(super) fn drop_holds_of(&self, held: &[(Arc<Slot>, u64, u64)]) {
        for (slot, start, end) in held {
            let mut state = lock(&slot.state);
            let ours = state
                .held
                .get(start)
                .is_some_and(|held| *start + held.bytes.len() as u64 == *end);
            if ours && let Some(held) = state.held.remove(start) {
                self.held_bytes
                    .fetch_sub(held.bytes.len() as u64, Ordering::Relaxed);
                state.pending.remove(*start, *end);
            }
        }
    }

    /// Drops everything a file holds: a newer generation replaced it, and
    /// its batches are answered as superseded.
    pub(super) fn drop_all_holds(&self, state: &mut SlotState) {
        for (start, held) in std::mem::take(&mut state.held) {
            let len = held.bytes.len() as u64;
            self.held_bytes.fetch_sub(len, Ordering::Relaxed);
            state.pending.remove(start, start + len);
        }
    }
}
