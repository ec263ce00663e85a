//! Records that must be durable ahead of their batch's own round (a move's
//! intent): written by a commit round of their own, so the manifest has one
//! writer; before the committer runs, directly under the gate.

use std::sync::Arc;

use manifest_db::{FileId, FileRecord, SinkCommit};

use super::{Placer, RowError};
use crate::SinkError;
use crate::lock_order::Guard;
use crate::state::{CommitRequest, Slot, lock};

impl Placer {
    /// Writes the records of `slots` as memory holds them now, synced, and
    /// returns once they are durable: by a commit round of their own once
    /// the committer runs, so the manifest has one writer and no placement
    /// thread holds the gate (which every round needs) across a synced
    /// write. Either way each file's pending flushes (`Slot::unsynced`) are
    /// done before its record is written, and a failure poisons the sink:
    /// memory may then be ahead of the manifest, and the restart settles
    /// every recorded intent by inode. The caller holds no slot's state.
    pub(super) fn record_durably(
        &self,
        slots: Vec<Arc<Slot>>,
        what: impl FnOnce() -> String,
    ) -> Result<(), RowError> {
        let Some(committer) = self.committer.get() else {
            return self.record_without_committer(&slots, what);
        };
        let mut request = CommitRequest::default();
        request.touched = slots;
        committer
            .submit(request)
            .and_then(|answer| answer.wait())
            .map_err(|error| {
                // A stopped sink's errors keep their words ("refuses work
                // until restarted"); others, their detail.
                let detail = match error {
                    SinkError::Poisoned(_) | SinkError::Shutdown => error.to_string(),
                    other => other.into_detail(),
                };
                RowError::Storage(format!("{}: {detail}", what()))
            })
    }

    /// [`Self::record_durably`] before the committer runs: under the gate,
    /// as a round would.
    pub(super) fn record_without_committer(
        &self,
        slots: &[Arc<Slot>],
        what: impl FnOnce() -> String,
    ) -> Result<(), RowError> {
        let gate = self.open_gate()?;
        let mut records = Vec::with_capacity(slots.len());
        for slot in slots {
            let state = lock(&slot.state);
            self.flush_unsynced_now(slot, &gate)?;
            records.push((slot.id.clone(), state.record.clone()));
        }
        self.record_now(records, what)
    }

    /// Writes `records` to the manifest at once, synced, outside a commit
    /// round (before the committer runs). The caller holds the gate.
    /// A failed write may or may not have left the records in the manifest,
    /// and memory cannot follow both: it poisons the sink, as a failed round
    /// does, and the restart settles an intent by inode.
    pub(super) fn record_now(
        &self,
        records: Vec<(FileId, FileRecord)>,
        what: impl FnOnce() -> String,
    ) -> Result<(), RowError> {
        let commit = SinkCommit {
            records,
            ..SinkCommit::default()
        };
        self.manifest.commit(&commit).map_err(|e| {
            let reason = format!("{}: {e}", what());
            self.health.poison(reason.clone());
            RowError::Storage(reason)
        })
    }

    /// Flushes what earlier changes to this file still wait for, at once:
    /// a record written outside a round (an intent) is about to take the
    /// place of the one they lead up to. The caller holds the gate (and the
    /// slot's state). A failed flush stops the sink, as a round's does: the
    /// page cache proves nothing after one.
    pub(super) fn flush_unsynced_now(
        &self,
        slot: &Slot,
        _gate: &Guard<'_, ()>,
    ) -> Result<(), RowError> {
        // Not holding `unsynced` across a flush: the committer reads it. No
        // move of this file can queue more meanwhile (the caller holds its
        // state), and a round can only take some off.
        loop {
            let Some((token, target)) = lock(&slot.unsynced)
                .first()
                .map(|pending| (pending.token(), pending.target.clone()))
            else {
                return Ok(());
            };
            if let Err(error) = target.sync() {
                let reason = format!(
                    "flushing a change to {:?} before recording it again: {}",
                    slot.id.key,
                    error.into_detail()
                );
                self.health.poison(reason.clone());
                return Err(RowError::Storage(reason));
            }
            lock(&slot.unsynced).retain(|pending| pending.token() != token);
        }
    }
}
