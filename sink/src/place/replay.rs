//! The journal's replay at startup: ranges a crash left durable only in the
//! journal are written back into their files (and rounds cut short are
//! withdrawn) before the sink serves.

use super::*;

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

impl Placer {
    /// Writes the ranges left in the journal back into their files, flushes
    /// them and empties the journal. They were acknowledged, but a crash of
    /// the machine may have lost them from the files with the page cache.
    /// Runs at startup, before any batch; returns the bytes written back.
    /// `journal_path` is the journal file the entries point into.
    pub fn replay_journal(&self, journal_path: &Path) -> Result<u64, SinkError> {
        let storage = |e: String| SinkError::Storage(format!("replaying the journal: {e}"));
        let redone = crate::durability::journal::redo_lost_rounds(&self.manifest, journal_path)
            .map_err(|e| e.context("replaying the journal"))?;
        if redone > 0 {
            tracing::warn!(
                rounds = redone,
                "the manifest had lost its newest records (a machine crash); redid them from the journal"
            );
        }
        let entries = self
            .manifest
            .journal()
            .map_err(|e| SinkError::storage("replaying the journal", e))?;
        let mut work = BatchWork::new(0);
        // The round a crash may have cut short, if any: its entries were
        // written while its bytes were, and none of its ranges was acknowledged.
        let (round_in_doubt, in_doubt) = self
            .manifest
            .journal_round_in_doubt()
            .map_err(|e| SinkError::storage("replaying the journal", e))?;
        let in_doubt: std::collections::HashSet<_> = in_doubt.into_iter().collect();
        let mut withdrawn = Vec::new();
        let mut unsealed = Vec::new();
        let mut journal_file = None;
        let mut replayed = 0u64;
        // Sources a flat sink refuses whose acknowledged ranges the journal
        // still holds (a manifest from before the flat layout served one).
        let mut refused: HashMap<String, Arc<Source>> = HashMap::new();
        for (id, offset, stored) in entries {
            let source = match self.source(&id.source) {
                Err(SinkError::Peer(why)) if self.layout == Layout::Flat => {
                    match refused.get(&id.source) {
                        Some(source) => source.clone(),
                        None => {
                            tracing::warn!(source = %id.source, %why, "writing the acknowledged ranges the journal holds of a source this sink no longer serves");
                            let source = self.read_source(&id.source)?;
                            refused.insert(id.source.clone(), source.clone());
                            source
                        }
                    }
                }
                loaded => loaded?,
            };
            let slot = {
                let mut files = lock(&source.files);
                self.lookup(&source, &mut files, &id.key, id.generation)
                    .map_err(|e| storage(e.into_message()))?
            };
            // Entries are committed with their record, so a missing record
            // means nothing of this file was acknowledged.
            let Some(slot) = slot else { continue };
            let mut state = lock(&slot.state);
            // A removed generation's path may now belong to its successor;
            // one kept aside still needs its bytes.
            if state.record.superseded && !state.record.kept {
                continue;
            }
            let file = self
                .file_of(&source, &slot, &mut state, &mut work)
                .map_err(|e| storage(e.into_message()))?;
            let dest = &state.record.dest_path;
            let in_doubt =
                !in_doubt.is_empty() && in_doubt.contains(&(id.clone(), offset, stored.clone()));
            let bytes = match stored {
                JournalBytes::Inline(bytes) => bytes,
                JournalBytes::InFile {
                    position,
                    len,
                    crc32c,
                } => {
                    if journal_file.is_none() {
                        let opened = File::open(journal_path).map_err(|e| {
                            storage(format!(
                                "the manifest's journal points into {}, which cannot be opened: {e}",
                                journal_path.display()
                            ))
                        })?;
                        journal_file = Some(opened);
                    }
                    let journal = journal_file.as_ref().expect("opened above");
                    let in_journal = read_exact(journal, position, len);
                    match in_journal {
                        Ok(bytes) if checksum::crc32c(&bytes) == crc32c => bytes,
                        outcome => {
                            // A write cut short leaves other bytes there;
                            // failing to read them is damage.
                            let (found, cut_short) = match outcome {
                                Ok(_) => ("other bytes".to_string(), in_doubt),
                                Err(e) => (format!("no bytes ({e})"), false),
                            };
                            // The range is fine if its file already holds
                            // it (flushed below with the rest).
                            let in_place = self
                                .root
                                .open_for_read(dest)
                                .ok()
                                .and_then(|file| read_exact(&file, offset, len).ok())
                                .is_some_and(|bytes| checksum::crc32c(&bytes) == crc32c);
                            if in_place {
                                work.request.files_to_sync.push(file);
                                continue;
                            }
                            let end = offset + u64::from(len);
                            if cut_short {
                                // Recorded, never acknowledged: the sender
                                // still has it and sends it again. A seal of
                                // its file can only have come from a later
                                // batch, unacknowledged too: it goes with it.
                                if state.record.sealed.take().is_some() {
                                    unsealed.push(id.clone());
                                    work.request.touched.push(slot.clone());
                                }
                                if state.record.placed.covers(offset, end) {
                                    state.record.placed.remove(offset, end);
                                    withdrawn.push((id.clone(), offset, u64::from(len)));
                                    work.request.touched.push(slot.clone());
                                }
                                continue;
                            }
                            // Any other round's bytes were durable before it
                            // was recorded: only a damaged journal file gets here.
                            return Err(storage(format!(
                                "{len} acknowledged bytes at offset {offset} of {dest} are neither in the \
                                 journal file {} (position {position}: {found}) nor in the file: the \
                                 journal file was damaged or replaced",
                                journal_path.display()
                            )));
                        }
                    }
                }
            };
            write_range(&file, &bytes, offset, || dest.clone())
                .map_err(|e| e.context("replaying the journal"))?;
            state.file_end = state.file_end.max(offset + bytes.len() as u64);
            work.request.files_to_sync.push(file);
            replayed += bytes.len() as u64;
        }
        let request = work.request;
        request
            .sync_now()
            .map_err(|e| e.context("replaying the journal"))?;
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
        if !records.is_empty() {
            // The round's events were never published (the relay waits for
            // a round to be durable): they lose what the round lost.
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
                .map_err(|e| SinkError::storage("replaying the journal", e))?
            };
            let _gate = lock(&self.commit_gate);
            self.manifest
                .commit(&SinkCommit {
                    records,
                    withdrawn,
                    outbox_rewrite,
                    ..SinkCommit::default()
                })
                .map_err(|e| SinkError::storage("replaying the journal", e))?;
        }
        self.manifest
            .clear_journal()
            .map_err(|e| SinkError::storage("replaying the journal", e))?;
        Ok(replayed)
    }
}
