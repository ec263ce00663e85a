//! The journal's replay at startup: ranges a crash left durable only in the
//! journal are written back into their files (and rounds cut short are
//! withdrawn) before the sink serves.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use flight_server::checksum;
use manifest_db::{FileId, JournalBytes, SinkCommit};

use super::sources::Source;
use super::write::write_range;
use super::{BatchWork, Placer};
use crate::SinkError;
use crate::config::Layout;
use crate::state::{Slot, SlotState, lock};

/// Reads `len` bytes at `offset`, checking first that the file has them
/// (`len` comes from the manifest and is not trusted to allocate).
fn read_exact(file: &File, offset: u64, len: u32) -> std::io::Result<Vec<u8>> {
    let size = file.metadata()?.len();
    if offset.saturating_add(u64::from(len)) > size {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("{offset}+{len} is past the end of the file ({size} bytes)"),
        ));
    }
    let mut bytes = vec![0u8; len as usize];
    file.read_exact_at(&mut bytes, offset)?;
    Ok(bytes)
}

/// What every error of the replay says it was doing.
const REPLAYING: &str = "replaying the journal";

fn replaying(detail: String) -> SinkError {
    SinkError::Storage(format!("{REPLAYING}: {detail}"))
}

/// A journal's bytes that are not what its entry says.
struct NotInJournal {
    /// What was found instead, for the error.
    found: String,
    /// Other bytes were there: a write cut short can leave them.
    other_bytes: bool,
}

/// One replay's progress over the journal's entries.
struct Replay<'a> {
    journal_path: &'a Path,
    /// Opened at the first entry whose bytes are in it.
    journal_file: Option<File>,
    /// The round a crash may have cut short, if any, and its entries: they
    /// were written while its bytes were, and none of its ranges was
    /// acknowledged.
    round_in_doubt: u64,
    in_doubt: std::collections::HashSet<(FileId, u64, JournalBytes)>,
    work: BatchWork<'static>,
    /// Ranges of the round cut short, withdrawn for their senders to send
    /// again, and the files whose seal went with them.
    withdrawn: Vec<(FileId, u64, u64)>,
    unsealed: Vec<FileId>,
    /// Sources a flat sink refuses whose acknowledged ranges the journal
    /// still holds (a manifest from before the flat layout served one).
    refused: HashMap<String, Arc<Source>>,
    replayed: u64,
}

impl Replay<'_> {
    fn in_doubt(&self, id: &FileId, offset: u64, stored: &JournalBytes) -> bool {
        !self.in_doubt.is_empty()
            && self
                .in_doubt
                .contains(&(id.clone(), offset, stored.clone()))
    }

    /// The bytes at `position` of the journal file, if they are the ones
    /// the entry's CRC names.
    fn read_from_journal_file(
        &mut self,
        position: u64,
        len: u32,
        crc32c: u32,
    ) -> Result<Result<Vec<u8>, NotInJournal>, SinkError> {
        let journal = match &self.journal_file {
            Some(journal) => journal,
            None => {
                let opened = File::open(self.journal_path).map_err(|e| {
                    replaying(format!(
                        "the manifest's journal points into {}, which cannot be opened: {e}",
                        self.journal_path.display()
                    ))
                })?;
                self.journal_file.insert(opened)
            }
        };
        Ok(match read_exact(journal, position, len) {
            Ok(bytes) if checksum::crc32c(&bytes) == crc32c => Ok(bytes),
            Ok(_) => Err(NotInJournal {
                found: "other bytes".into(),
                other_bytes: true,
            }),
            Err(e) => Err(NotInJournal {
                found: format!("no bytes ({e})"),
                other_bytes: false,
            }),
        })
    }

    /// A range of the round cut short: recorded, never acknowledged, so
    /// the sender still has it and sends it again. A seal of its file can
    /// only have come from a later batch, unacknowledged too: it goes with
    /// it.
    fn withdraw(
        &mut self,
        id: &FileId,
        slot: &Arc<Slot>,
        state: &mut SlotState,
        offset: u64,
        len: u32,
    ) {
        if state.record.sealed.take().is_some() {
            self.unsealed.push(id.clone());
            self.work.request.touched.push(slot.clone());
        }
        let end = offset + u64::from(len);
        if state.record.placed.covers(offset, end) {
            state.record.placed.remove(offset, end);
            self.withdrawn.push((id.clone(), offset, u64::from(len)));
            self.work.request.touched.push(slot.clone());
        }
    }
}

impl Placer {
    /// Writes the ranges left in the journal back into their files, flushes
    /// them and empties the journal. They were acknowledged, but a crash of
    /// the machine may have lost them from the files with the page cache.
    /// Runs at startup, before any batch; returns the bytes written back.
    /// `journal_path` is the journal file the entries point into.
    pub fn replay_journal(&self, journal_path: &Path) -> Result<u64, SinkError> {
        let redone = crate::durability::journal::redo_lost_rounds(&self.manifest, journal_path)
            .map_err(|e| e.context(REPLAYING))?;
        if redone > 0 {
            tracing::warn!(
                rounds = redone,
                "the manifest had lost its newest records (a machine crash); redid them from the journal"
            );
        }
        let entries = self
            .manifest
            .journal()
            .map_err(|e| SinkError::storage(REPLAYING, e))?;
        let (round_in_doubt, in_doubt) = self
            .manifest
            .journal_round_in_doubt()
            .map_err(|e| SinkError::storage(REPLAYING, e))?;
        let mut replay = Replay {
            journal_path,
            journal_file: None,
            round_in_doubt,
            in_doubt: in_doubt.into_iter().collect(),
            work: BatchWork::new(0),
            withdrawn: Vec::new(),
            unsealed: Vec::new(),
            refused: HashMap::new(),
            replayed: 0,
        };
        for (id, offset, stored) in entries {
            self.replay_entry(&mut replay, id, offset, stored)?;
        }
        let replayed = replay.replayed;
        self.record_replay(replay)?;
        self.manifest
            .clear_journal()
            .map_err(|e| SinkError::storage(REPLAYING, e))?;
        Ok(replayed)
    }

    /// The source of a journal entry: one a flat sink refuses is still
    /// read, for the acknowledged ranges the journal holds of it.
    fn replay_source(&self, replay: &mut Replay<'_>, name: &str) -> Result<Arc<Source>, SinkError> {
        match self.source(name) {
            Err(SinkError::Peer(why)) if self.layout == Layout::Flat => {
                if let Some(source) = replay.refused.get(name) {
                    return Ok(source.clone());
                }
                tracing::warn!(source = %name, %why, "writing the acknowledged ranges the journal holds of a source this sink no longer serves");
                let source = self.sources.read_source(name)?;
                replay.refused.insert(name.to_owned(), source.clone());
                Ok(source)
            }
            loaded => loaded,
        }
    }

    /// Writes one entry's range back into its file, or withdraws it (a
    /// round cut short), or finds it there already.
    fn replay_entry(
        &self,
        replay: &mut Replay<'_>,
        id: FileId,
        offset: u64,
        stored: JournalBytes,
    ) -> Result<(), SinkError> {
        let source = self.replay_source(replay, &id.source)?;
        let slot = {
            let mut files = lock(&source.files);
            self.lookup(&source, &mut files, &id.key, id.generation)
                .map_err(|e| replaying(e.into_message()))?
        };
        // Entries are committed with their record, so a missing record
        // means nothing of this file was acknowledged.
        let Some(slot) = slot else { return Ok(()) };
        let mut state = lock(&slot.state);
        // A removed generation's path may now belong to its successor;
        // one kept aside still needs its bytes.
        if state.record.superseded && !state.record.kept {
            return Ok(());
        }
        let file = self
            .file_of(&source, &slot, &mut state, &mut replay.work)
            .map_err(|e| replaying(e.into_message()))?;
        let in_doubt = replay.in_doubt(&id, offset, &stored);
        let bytes = match stored {
            JournalBytes::Inline(bytes) => bytes,
            JournalBytes::InFile {
                position,
                len,
                crc32c,
            } => match replay.read_from_journal_file(position, len, crc32c)? {
                Ok(bytes) => bytes,
                Err(missing) => {
                    let dest = &state.record.dest_path;
                    // The range is fine if its file already holds it
                    // (flushed below with the rest).
                    let in_place = self
                        .root
                        .open_for_read(dest)
                        .ok()
                        .and_then(|file| read_exact(&file, offset, len).ok())
                        .is_some_and(|bytes| checksum::crc32c(&bytes) == crc32c);
                    if in_place {
                        replay.work.request.files_to_sync.push(file);
                        return Ok(());
                    }
                    // A write cut short leaves other bytes there; failing
                    // to read them is damage.
                    if in_doubt && missing.other_bytes {
                        replay.withdraw(&id, &slot, &mut state, offset, len);
                        return Ok(());
                    }
                    // Any other round's bytes were durable before it was
                    // recorded: only a damaged journal file gets here.
                    return Err(replaying(format!(
                        "{len} acknowledged bytes at offset {offset} of {dest} are neither in the \
                         journal file {} (position {position}: {}) nor in the file: the journal \
                         file was damaged or replaced",
                        replay.journal_path.display(),
                        missing.found
                    )));
                }
            },
        };
        let dest = &state.record.dest_path;
        write_range(&file, &bytes, offset, || dest.clone()).map_err(|e| e.context(REPLAYING))?;
        state.file_end = state.file_end.max(offset + bytes.len() as u64);
        replay.work.request.files_to_sync.push(file);
        replay.replayed += bytes.len() as u64;
        Ok(())
    }

    /// Flushes what the replay wrote, and records what it changed: ranges
    /// withdrawn, seals gone with them, and the events their round would
    /// have published.
    fn record_replay(&self, replay: Replay<'_>) -> Result<(), SinkError> {
        let Replay {
            work,
            withdrawn,
            unsealed,
            round_in_doubt,
            ..
        } = replay;
        let request = work.request;
        request.sync_now().map_err(|e| e.context(REPLAYING))?;
        for slot in &request.touched {
            lock(&slot.unsynced).clear();
        }
        let records: Vec<_> = request
            .touched
            .iter()
            .map(|slot| (slot.id.clone(), lock(&slot.state).record_untold()))
            .collect();
        if !withdrawn.is_empty() {
            tracing::warn!(
                ranges = withdrawn.len(),
                bytes = withdrawn.iter().map(|(_, _, len)| len).sum::<u64>(),
                "a commit round was cut short before its journal write ended; \
                 its ranges were never acknowledged and are withdrawn for the senders to resend"
            );
        }
        if records.is_empty() {
            return Ok(());
        }
        // The round's events were never published (the relay waits for a
        // round to be durable): they lose what the round lost.
        let outbox_rewrite = if withdrawn.is_empty() && unsealed.is_empty() {
            Vec::new()
        } else {
            let ends: HashMap<FileId, u64> = records
                .iter()
                .map(|(id, record)| (id.clone(), record.placed.contiguous_end()))
                .collect();
            crate::outbox::withdraw(
                &self.manifest,
                round_in_doubt,
                &withdrawn,
                &unsealed,
                |id| ends.get(id).copied().unwrap_or(0),
            )
            .map_err(|e| SinkError::storage(REPLAYING, e))?
        };
        let _gate = lock(&self.commit_gate);
        self.manifest
            .commit(&SinkCommit {
                records,
                withdrawn,
                outbox_rewrite,
                ..SinkCommit::default()
            })
            .map_err(|e| SinkError::storage(REPLAYING, e))
    }
}
