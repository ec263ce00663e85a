//! Open destination descriptors: opened on first write (settling a recorded
//! move first) and kept in a bounded cache, oldest closed first.

use super::*;

impl Placer {
    pub(super) fn file_of(
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
        self.take_descriptor(Some(slot))?;
        let opened = self
            .root
            .open_for_write(&state.record.dest_path)
            .map_err(confine_error)?;
        let len = opened.file.metadata().map(|m| m.len()).ok();
        if state.disk_len.is_none() {
            state.disk_len = len;
        }
        // Evicted and opened again, or opened for the first time: what the
        // file holds now is where writing may go on.
        state.file_end = state.file_end.max(len.unwrap_or(0));
        state.opened(&opened.file);
        let file = Arc::new(opened.file);
        if !opened.dirs_to_sync.is_empty() {
            // Created again (it was missing).
            work.request.flush_before_record(
                &mut lock(&slot.unsynced),
                Some(&file),
                opened.dirs_to_sync,
            );
            self.awaits_flush(slot);
        }
        state.file = Some(file.clone());
        self.remember_open(slot);
        Ok(file)
    }

    /// Keeps the number of cached descriptors bounded: the oldest opened is
    /// closed first (a commit still holding it keeps it open until synced).
    pub(super) fn remember_open(&self, slot: &Arc<Slot>) {
        lock(&self.open_files).push_back(slot.clone());
        self.trim_open_files(self.max_open_files, Some(slot));
    }

    /// Closes cached descriptors, oldest first, down to `keep`. The caller
    /// may hold a slot's lock (`current`'s, or another's), so eviction never
    /// waits for one: a busy slot is skipped and stays open a little longer.
    pub(super) fn trim_open_files(&self, keep: usize, current: Option<&Arc<Slot>>) {
        let mut open = lock(&self.open_files);
        let mut attempts = open.len();
        while open.len() > keep && attempts > 0 {
            attempts -= 1;
            let Some(evicted) = open.pop_front() else {
                break;
            };
            if current.is_some_and(|slot| Arc::ptr_eq(&evicted, slot)) {
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

    /// Room for one more new destination file, or a retryable refusal:
    /// under pressure the cache of open files is cut to a quarter first (a
    /// row holding `slot`'s lock may ask).
    pub(super) fn take_descriptor(&self, slot: Option<&Arc<Slot>>) -> Result<(), RowError> {
        self.descriptors
            .take_one(|| self.trim_open_files(self.max_open_files / 4, slot))
            .map_err(|short| RowError::Storage(short.to_string()))
    }

    /// Notes a slot whose new file and directories wait for their round's
    /// flush, holding descriptors until then.
    pub(super) fn awaits_flush(&self, slot: &Arc<Slot>) {
        let mut awaiting = lock(&self.awaiting_flush);
        // Forget the slots flushed since, before the list doubles.
        if awaiting.len() >= 1024 && awaiting.len().is_power_of_two() {
            awaiting.retain(|weak| {
                weak.upgrade()
                    .is_some_and(|slot| !lock(&slot.unsynced).is_empty())
            });
        }
        awaiting.push(Arc::downgrade(slot));
    }

    /// Flushes, ahead of their rounds, what the files created lately still
    /// wait for, and lets go of the descriptors held for it. A round flushes
    /// the same targets before it records those files; flushing them
    /// earlier costs a few fsyncs and is never wrong. Without it, a burst of
    /// new files in many directories holds descriptors up to the limit, and
    /// every batch sent again fails on the next new file before any round
    /// can record (and so flush) the files its earlier attempt created.
    /// Holds no slot's state: called where a batch starts. A failed flush
    /// poisons the sink, as a round's does.
    pub(super) fn flush_early(&self) -> Result<usize, SinkError> {
        let slots: Vec<Arc<Slot>> = std::mem::take(&mut *lock(&self.awaiting_flush))
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .collect();
        let mut flushed = 0usize;
        for slot in &slots {
            let pending: Vec<(u64, crate::durability::flush::SyncTarget)> = lock(&slot.unsynced)
                .iter()
                .map(|pending| (pending.token(), pending.target.clone()))
                .collect();
            for (token, target) in pending {
                if let Err(error) = target.sync() {
                    let reason = format!(
                        "flushing a new file of {:?} early (descriptors ran short): {}",
                        slot.id.key,
                        error.into_detail()
                    );
                    self.health.poison(reason.clone());
                    return Err(SinkError::Storage(reason));
                }
                lock(&slot.unsynced).retain(|p| p.token() != token);
                flushed += 1;
            }
        }
        if flushed > 0 {
            tracing::info!(
                files = slots.len(),
                flushed,
                "descriptors ran short: flushed new files and directories ahead of their rounds"
            );
        }
        Ok(flushed)
    }
}
