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
        }
        state.file = Some(file.clone());
        self.remember_open(slot);
        Ok(file)
    }

    /// Keeps the number of cached descriptors bounded: the oldest opened is
    /// closed first (a commit still holding it keeps it open until synced).
    /// The caller may hold another slot's lock, so eviction never waits for
    /// one: a busy slot is skipped and stays open a little longer.
    pub(super) fn remember_open(&self, slot: &Arc<Slot>) {
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
}
