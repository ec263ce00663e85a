//! A round's journal write: whether its small ranges go to the journal or
//! its files are flushed, and the journal region it reserves.

use super::backlog::{JournalJob, JournalWriter, JournalWritten};

use manifest_db::JournalEntry;

use super::queued::Queued;
use crate::durability::journal::JournalFile;
use crate::error::SinkError;
use crate::state::JournalRange;

/// Decides whether the round's small ranges go to the journal file: only if
/// the round flushes nothing else (a flush it pays anyway covers them too)
/// and the journal has room. Otherwise their files are flushed with the rest.
pub(super) fn journal_or_flush(round: &mut [Queued], journal: Option<&JournalFile>) -> bool {
    let bytes: u64 = round.iter().map(|q| q.request.journal_bytes).sum();
    let flushes_anyway = round.iter().any(|q| q.request.flushes_anyway());
    if bytes > 0 && !flushes_anyway && journal.is_some_and(|j| j.has_room(bytes)) {
        return true;
    }
    for queued in round {
        let request = &mut queued.request;
        request.journal.clear();
        request.journal_bytes = 0;
        let files = std::mem::take(&mut request.journaled_files);
        request.files_to_sync.extend(files);
    }
    false
}

/// A round's journal entries, and the write of their region, to start once
/// the round's manifest batch is built.
#[derive(Default)]
pub(super) struct JournalRound {
    pub(super) entries: Vec<JournalEntry>,
    /// The round's number: the key its entries are kept under.
    pub(super) round: u64,
    /// Where its region starts in the journal.
    pub(super) start: u64,
    pub(super) write: Option<PendingJournalWrite>,
}

/// A round's journal write under way: its ranges are being written, its
/// manifest batch is still to come.
pub(super) struct PendingJournalWrite {
    pub(super) batch: std::sync::mpsc::SyncSender<Vec<u8>>,
    pub(super) written: std::sync::mpsc::Receiver<JournalWritten>,
    pub(super) batch_room: usize,
}

impl PendingJournalWrite {
    /// Whether a manifest batch of `len` bytes fits in the round's region.
    pub(super) fn batch_fits(&self, len: usize) -> bool {
        len <= self.batch_room
    }

    /// Hands over the round's manifest batch; the receiver answers once the
    /// whole region is durable.
    pub(super) fn finish(self, batch: Vec<u8>) -> std::sync::mpsc::Receiver<JournalWritten> {
        // Should the writer have failed already, the receiver says why.
        let _ = self.batch.send(batch);
        self.written
    }
}

/// Reserves the journal region for the round's journaled ranges. Returns
/// their manifest entries and the write to start.
pub(super) fn reserve_journal_round(
    journal: &mut JournalFile,
    writer: &JournalWriter,
    round: &mut [Queued],
) -> Result<JournalRound, SinkError> {
    let ranges: Vec<JournalRange> = round
        .iter_mut()
        .flat_map(|q| std::mem::take(&mut q.request.journal))
        .collect();
    if ranges.is_empty() {
        return Ok(JournalRound::default());
    }
    let pieces: Vec<(&[u8], u32)> = ranges
        .iter()
        .map(|range| (range.bytes.as_slice(), range.crc32c))
        .collect();
    let reservation = journal
        .reserve(&pieces)
        .map_err(|e| SinkError::storage(format_args!("journaling {} ranges", ranges.len()), e))?;
    let entries = ranges
        .iter()
        .zip(reservation.refs)
        .map(|(range, bytes)| (range.id.clone(), range.offset, bytes))
        .collect();
    let batch_room = reservation.write.batch_room();
    let (batch, batch_receiver) = std::sync::mpsc::sync_channel(1);
    let (done, written) = std::sync::mpsc::sync_channel(1);
    writer.send(JournalJob {
        write: reservation.write,
        ranges,
        batch: batch_receiver,
        done,
    })?;
    Ok(JournalRound {
        entries,
        round: reservation.round,
        start: reservation.start,
        write: Some(PendingJournalWrite {
            batch,
            written,
            batch_room,
        }),
    })
}
