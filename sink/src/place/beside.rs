//! Writes made beside the round. A batch's small ranges (those the journal
//! takes) go into their files after its commit request is submitted, so that
//! its round journals and records them while they are written instead of
//! after. Their bytes are durable in the journal either way; the round tells
//! no one of them, and flushes none of their files, until they are in
//! ([`crate::state::CommitRequest::wait_written`]); and after a crash the
//! journal's replay writes them again.
//!
//! What keeps the invariants:
//! - A write made beside the round cannot fail for want of space. Room is
//!   taken ahead of the file's end first (`fallocate` with
//!   `FALLOC_FL_KEEP_SIZE`, which leaves the file's size alone), so a full
//!   disk refuses the batch as retryable before its round, as a failed write
//!   always did. Only filesystems that keep such a promise are asked (ext4,
//!   XFS, tmpfs; on copy-on-write and network filesystems a later write may
//!   still find no room): elsewhere writes are made before the round. Any
//!   other failure of a deferred write poisons the sink, as its round may
//!   have recorded the range already, and leaves the file marked, so that
//!   nothing is written past the hole before the restart.
//! - A file still grows in order, and never past a hole. Its slot names the
//!   batch whose writes into it are pending ([`Slot::writing`]); every other
//!   batch waits for them before it writes the file or reads its size. A
//!   batch that must wait writes its own pending writes first, and so does
//!   one that is about to wait for anything else (a move's intent recorded
//!   by a round, a file read back for a seal), so no batch waits long, and
//!   no two wait for each other.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::SyncSender;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use rustix::fs::FallocateFlags;
use rustix::io::Errno;

use super::{BatchWork, Placer, RowError};
use crate::health::Health;
use crate::lock_order::Guard;
use crate::state::{Slot, SlotState, WriteToken, WritesDone, lock, new_write_token};

/// Room taken past a file's end at a time: an eighth of what the file
/// holds, at least [`ROOM_AHEAD_MIN`] and at most [`ROOM_AHEAD_MAX`]. A
/// small file keeps little room it may never use (until it is sealed,
/// which gives the rest back); a file that keeps growing takes room once
/// per 256 appends of 4 KiB instead of once per 16.
const ROOM_AHEAD_MIN: u64 = 64 << 10;
const ROOM_AHEAD_MAX: u64 = 1 << 20;

/// The room to take past `end`, for a file that holds `end` bytes.
pub(super) fn room_ahead(end: u64) -> u64 {
    (end / 8).clamp(ROOM_AHEAD_MIN, ROOM_AHEAD_MAX)
}

/// How long a batch waits for another batch's writes into a file before it
/// is refused as retryable. A batch makes its writes before it waits for
/// anything, or right after it submits its request: a wait this long means
/// a disk that takes seconds per write.
const WAIT_LIMIT: Duration = Duration::from_secs(10);

/// Where batches waiting for others' writes sleep, woken whenever a batch
/// clears its marks.
static WRITES_ENDED: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());

/// Filesystems whose `fallocate` reserves the blocks a later write into
/// them takes (`statfs`'s `f_type`): ext4 (and ext2/3), XFS, tmpfs.
const ROOM_KEEPING_FILESYSTEMS: [i64; 3] = [0xEF53, 0x5846_5342, 0x0102_1994];

/// One range whose write waits for its batch's request to be submitted.
struct DeferredWrite<'b> {
    slot: Arc<Slot>,
    file: Arc<File>,
    offset: u64,
    bytes: &'b [u8],
}

/// A batch's writes that wait until its commit request is submitted, and
/// the word to the round once they are in. Dropped, it makes whatever it
/// still holds: no file is ever left marked as written by a batch that is
/// gone.
pub(crate) struct DeferredWrites<'b> {
    token: WriteToken,
    /// Poisoned when a write fails; `None` when the batch defers nothing.
    health: Option<Health>,
    writes: Vec<DeferredWrite<'b>>,
    done: Option<SyncSender<Result<(), String>>>,
}

impl<'b> DeferredWrites<'b> {
    /// Writes made at once, as placement always made them.
    pub(super) fn none() -> Self {
        Self {
            token: new_write_token(),
            health: None,
            writes: Vec::new(),
            done: None,
        }
    }

    /// Writes made beside the round where they can be.
    pub(super) fn beside(health: Health) -> Self {
        Self {
            token: new_write_token(),
            health: Some(health),
            writes: Vec::new(),
            done: None,
        }
    }

    pub(super) fn enabled(&self) -> bool {
        self.health.is_some()
    }

    pub(super) fn token(&self) -> WriteToken {
        self.token
    }

    /// Whether this batch has writes pending into `slot`'s file.
    pub(super) fn pending_in(&self, slot: &Slot) -> bool {
        slot.writing.load(Ordering::Relaxed) == self.token
    }

    /// Puts `bytes` at `offset` of `slot`'s file once the request is
    /// submitted. Called under the slot's state lock, which is what others
    /// read the mark under.
    fn defer(&mut self, slot: &Arc<Slot>, file: &Arc<File>, offset: u64, bytes: &'b [u8]) {
        slot.writing.store(self.token, Ordering::Release);
        self.writes.push(DeferredWrite {
            slot: slot.clone(),
            file: file.clone(),
            offset,
            bytes,
        });
    }

    /// The word the round waits for, when there are writes to wait for.
    pub(super) fn done(&mut self) -> Option<WritesDone> {
        if self.writes.is_empty() {
            return None;
        }
        let (done, written) = std::sync::mpsc::sync_channel(1);
        self.done = Some(done);
        Some(WritesDone(written))
    }

    /// Makes the pending writes into `slot`'s file now (a write before the
    /// round must not overtake them).
    pub(super) fn write_into(&mut self, slot: &Slot) -> Result<(), RowError> {
        let (into, others) = std::mem::take(&mut self.writes)
            .into_iter()
            .partition(|write| std::ptr::eq(Arc::as_ptr(&write.slot), slot));
        self.writes = others;
        self.write(into)
    }

    /// Makes every pending write now.
    pub(super) fn write_all(&mut self) -> Result<(), RowError> {
        let writes = std::mem::take(&mut self.writes);
        self.write(writes)
    }

    /// Makes the writes, in order, and clears their files' marks. A file
    /// whose write failed takes no more of them and stays marked: nothing
    /// may be written past the hole (the sink is poisoned, and its restart
    /// finds the file's end again); the other files' writes are made.
    fn write(&self, writes: Vec<DeferredWrite<'b>>) -> Result<(), RowError> {
        if writes.is_empty() {
            return Ok(());
        }
        let mut failed: Vec<*const Slot> = Vec::new();
        let mut first_failure = None;
        for write in &writes {
            let slot = Arc::as_ptr(&write.slot);
            if failed.contains(&slot) {
                continue;
            }
            if let Err(error) = write_range(write) {
                failed.push(slot);
                first_failure.get_or_insert(format!(
                    "writing {} bytes at offset {} of file '{}' generation {} of source {} (into room taken for them): {error}",
                    write.bytes.len(),
                    write.offset,
                    write.slot.id.key,
                    write.slot.id.generation,
                    write.slot.id.source
                ));
            }
        }
        for write in &writes {
            if !failed.contains(&Arc::as_ptr(&write.slot)) {
                let _ = write.slot.writing.compare_exchange(
                    self.token,
                    0,
                    Ordering::Release,
                    Ordering::Relaxed,
                );
            }
        }
        let (lock, ended) = &WRITES_ENDED;
        drop(lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
        ended.notify_all();
        match first_failure {
            None => Ok(()),
            Some(failure) => {
                // The round may have recorded these ranges already: the sink
                // stops, and its next start writes them from the journal.
                let reason = format!(
                    "{failure}; the sink stops, and its next start takes the file up again from its journal"
                );
                if let Some(health) = &self.health {
                    health.poison(reason.clone());
                }
                Err(RowError::Storage(reason))
            }
        }
    }

    /// After the request is submitted: makes the writes, and tells the
    /// round how they went.
    pub(crate) fn finish(mut self) {
        let written = self.write_all().map_err(RowError::into_message);
        if let Some(done) = self.done.take() {
            // A round that no longer waits (the request failed) needs no word.
            let _ = done.send(written);
        }
    }
}

/// Whatever ends a batch's placement (a panic included) makes its pending
/// writes: no file stays marked by a batch that is gone.
impl Drop for DeferredWrites<'_> {
    fn drop(&mut self) {
        let written = self.write_all().map_err(RowError::into_message);
        if let Some(done) = self.done.take() {
            let _ = done.send(written);
        }
    }
}

fn write_range(write: &DeferredWrite<'_>) -> std::io::Result<()> {
    #[cfg(test)]
    crate::fault::io(
        crate::fault::Point::DeferredWrite,
        format!("{}/{}", write.slot.id.source, write.slot.id.key),
    )?;
    write.file.write_all_at(write.bytes, write.offset)
}

impl Placer {
    /// The slot's state, once no other batch has writes pending into its
    /// file. This batch's own pending writes are made first: the batch it
    /// waits for may be waiting for them.
    pub(super) fn lock_written<'s>(
        &self,
        slot: &'s Slot,
        work: &mut BatchWork<'_>,
    ) -> Result<Guard<'s, SlotState>, RowError> {
        let started = Instant::now();
        loop {
            let state = lock(&slot.state);
            let by = slot.writing.load(Ordering::Acquire);
            if by == 0 || by == work.writes.token() {
                return Ok(state);
            }
            drop(state);
            work.writes.write_all()?;
            let (lock, ended) = &WRITES_ENDED;
            let mut waiting = lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            while slot.writing.load(Ordering::Acquire) == by {
                if let Some(reason) = self.health.reason() {
                    // A write failed and left the file marked.
                    return Err(RowError::Storage(format!(
                        "sink storage failed earlier, restart it: {reason}"
                    )));
                }
                if started.elapsed() > WAIT_LIMIT {
                    return Err(RowError::Storage(format!(
                        "another batch's writes into file '{}' generation {} did not end in {WAIT_LIMIT:?}; the batch is sent again",
                        slot.id.key, slot.id.generation
                    )));
                }
                waiting = ended
                    .wait_timeout(waiting, Duration::from_millis(10))
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .0;
            }
        }
    }

    /// Defers the write of `bytes` at `start` of the slot's file to after
    /// the request's submission, if room for it is taken (or can be now).
    /// `Ok(false)`: write it now. A full filesystem refuses the batch, as a
    /// failed write would.
    pub(super) fn defer_write<'b>(
        &self,
        slot: &Arc<Slot>,
        state: &mut SlotState,
        file: &Arc<File>,
        start: u64,
        bytes: &'b [u8],
        work: &mut BatchWork<'b>,
    ) -> Result<bool, RowError> {
        if !work.writes.enabled() {
            return Ok(false);
        }
        #[cfg(test)]
        super::data::injected_write_fault(state, start, bytes.len())?;
        if !self.take_room(state, file, start, bytes.len() as u64)? {
            return Ok(false);
        }
        work.writes.defer(slot, file, start, bytes);
        Ok(true)
    }

    /// Takes room in `file` for `len` bytes at `start`, and [`room_ahead`]
    /// past them, unless it is taken already. `Ok(false)` where it cannot
    /// be taken for any reason but a full filesystem: the write is made now,
    /// and says what fails, if anything does.
    fn take_room(
        &self,
        state: &mut SlotState,
        file: &File,
        start: u64,
        len: u64,
    ) -> Result<bool, RowError> {
        // The wire keeps a range's end within a file's largest offset; the
        // room ahead of it may pass that, and is then refused below.
        let end = start.saturating_add(len);
        if state.room.refused {
            return Ok(false);
        }
        if end <= state.room.end {
            return Ok(true);
        }
        if !state.room.checked {
            state.room.checked = true;
            // `f_type` is a different integer on other targets.
            #[allow(clippy::unnecessary_cast)]
            let kept = rustix::fs::fstatfs(file)
                .is_ok_and(|fs| ROOM_KEEPING_FILESYSTEMS.contains(&(fs.f_type as i64)));
            if !kept {
                state.room.refused = true;
                return Ok(false);
            }
        }
        // Below the room taken, or below the file's end, the blocks are
        // there already.
        let from = start.max(state.room.end);
        let keep = FallocateFlags::KEEP_SIZE;
        let ahead_end = end.saturating_add(room_ahead(end));
        let taken = match rustix::fs::fallocate(file, keep, from, ahead_end - from) {
            Ok(()) => ahead_end,
            Err(Errno::NOSPC | Errno::DQUOT) => {
                // Not the room ahead, at least the write's own.
                match rustix::fs::fallocate(file, keep, from, end - from) {
                    Ok(()) => end,
                    Err(error @ (Errno::NOSPC | Errno::DQUOT)) => {
                        return Err(RowError::Storage(format!(
                            "taking room for {len} bytes at offset {start} of {}: {}{}",
                            state.record.dest_path,
                            std::io::Error::from(error),
                            self.space_left(file, len)
                        )));
                    }
                    Err(_) => return Ok(false),
                }
            }
            Err(Errno::OPNOTSUPP | Errno::NOSYS | Errno::INVAL) => {
                state.room.refused = true;
                return Ok(false);
            }
            Err(_) => return Ok(false),
        };
        state.room.end = taken;
        Ok(true)
    }
}

/// Gives back the room a sealed file took past its final size (`meta` is
/// the file's, at `size`), by this process or by one before it.
pub(super) fn trim_room(state: &mut SlotState, file: &File, meta: &std::fs::Metadata, size: u64) {
    use std::os::unix::fs::MetadataExt;
    let block = meta.blksize().max(512);
    let needed = size.div_ceil(block) * block;
    if state.room.end > size || meta.blocks() * 512 > needed {
        // Truncating to its own size frees the blocks past it.
        if let Err(error) = file.set_len(size) {
            tracing::debug!(dest = %state.record.dest_path, %error, "cannot give back the room taken past a sealed file's end");
        }
    }
    state.room = Default::default();
}
