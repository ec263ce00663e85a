//! File generations: finding a file's slot (or creating it and its file),
//! opening its file again once the cache closed it (a recorded move is
//! settled first), and what becomes of an older generation that a newer
//! one replaces at its path (removed under `mirror`, moved aside under
//! `keep`).

use std::fs::File;
use std::sync::Arc;

use flight_server::Row;
use manifest_db::{FileId, FileRecord, IntervalSet};

use super::moves::Moving;
use super::sources::{PathIndex, Source, SourceFiles};
use super::{BatchWork, Placer, RowError, confine_error, confined_path};
use crate::config::SupersededPolicy;
use crate::confine::ConfineError;
use crate::durability::direct::DirectFile;
use crate::lock_order::{Rank, Ranked};
use crate::state::{Slot, SlotState, lock};
use crate::written_crc::WrittenCrc;

impl Placer {
    /// The slot of (key, generation); generation 1 is created on first sight
    /// at the key's own path, later generations need an Open row first.
    /// Lookup and creation happen under the source's lock, so two streams
    /// carrying the same new file end up with one slot.
    pub(super) fn slot_or_create(
        &self,
        source: &Source,
        row: &Row<'_>,
        work: &mut BatchWork,
    ) -> Result<Arc<Slot>, RowError> {
        let mut files = lock(&source.files);
        if let Some(slot) = self.lookup(source, &mut files, row.file_key, row.generation)? {
            return Ok(slot);
        }
        if row.generation != 1 {
            return Err(RowError::Peer(format!(
                "generation {} was never opened (send an Open row before its data)",
                row.generation
            )));
        }
        self.create(source, &mut files, row.file_key, 1, row.file_key, work)
    }

    pub(super) fn create(
        &self,
        source: &Source,
        files: &mut SourceFiles,
        key: &str,
        generation: u64,
        path: &str,
        work: &mut BatchWork,
    ) -> Result<Arc<Slot>, RowError> {
        crate::confine::components(key).map_err(|e| RowError::Peer(e.to_string()))?;
        let dest = self.dest(source, path);
        // A file an earlier process meant to move away from `dest` leaves
        // first: the new one must not be written into it.
        self.settle_recorded_move_from(source, files, &dest, work)?;
        self.supersede_at(source, files, &dest, work)?;
        self.open_files.take_descriptor(None)?;
        let opened = self.root.open_for_write(&dest).map_err(confine_error)?;
        let disk_len = opened.file.metadata().map(|m| m.len()).ok();
        let file = Arc::new(opened.file);
        let mut unsynced = Vec::new();
        let created = !opened.dirs_to_sync.is_empty();
        if created {
            work.request
                .flush_before_record(&mut unsynced, Some(&file), opened.dirs_to_sync);
        }
        let slot = Arc::new(Slot {
            id: FileId {
                source: source.name.clone(),
                key: key.to_owned(),
                generation,
            },
            state: Ranked::new(
                Rank::SlotState,
                SlotState {
                    record: FileRecord {
                        dest_path: dest.clone(),
                        ..FileRecord::default()
                    },
                    pending: IntervalSet::new(),
                    disk_len,
                    file: Some(file.clone()),
                    direct: DirectFile::NotOpened,
                    recorded: false,
                    recorded_sealed: false,
                    recorded_path: None,
                    recorded_superseded: false,
                    moving: false,
                    file_end: disk_len.unwrap_or(0),
                    held: Default::default(),
                    written_crc: WrittenCrc::new(true),
                    inode: None,
                    room: Default::default(),
                },
            ),
            unsynced: Ranked::new(Rank::Unsynced, unsynced),
            writing: Default::default(),
        });
        lock(&slot.state).opened(&file);
        if created {
            self.open_files.awaits_flush(&slot);
        }
        files
            .slots
            .insert((key.to_owned(), generation), slot.clone());
        files.by_path.insert(dest, (key.to_owned(), generation));
        self.open_files.remember_open(&slot);
        work.request.touched.push(slot.clone());
        Ok(slot)
    }

    /// The slot's file, opened again if the cache closed it or this process
    /// has not opened it yet. A move recorded and not made is finished
    /// first, so that what opens is the file the record names, not a new
    /// empty one at its new name.
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
        self.open_files.take_descriptor(Some(slot))?;
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
            self.open_files.awaits_flush(slot);
        }
        state.file = Some(file.clone());
        self.open_files.remember_open(slot);
        Ok(file)
    }

    pub(super) fn open_generation(
        &self,
        source: &Source,
        row: &Row<'_>,
        work: &mut BatchWork,
    ) -> Result<(), RowError> {
        let path = confined_path(row, "an Open row needs a path")?;
        if row.generation == 0 {
            return Err(RowError::Peer("generations start at 1".into()));
        }
        let mut files = lock(&source.files);
        if let Some(slot) = self.lookup(source, &mut files, row.file_key, row.generation)? {
            // A re-delivered Open: already done.
            work.request.touched.push(slot);
            return Ok(());
        }
        self.create(source, &mut files, row.file_key, row.generation, path, work)?;
        Ok(())
    }

    /// A new generation or a rename takes `dest`: whatever live generation
    /// was there is superseded (removed, or kept aside by policy), and a
    /// generation kept aside there before moves on to `<dest>.<n>` (it is
    /// kept, not overwritten). Returns the files whose records it changed.
    pub(super) fn supersede_at(
        &self,
        source: &Source,
        files: &mut SourceFiles,
        dest: &str,
        work: &mut BatchWork,
    ) -> Result<Vec<Arc<Slot>>, RowError> {
        let mut changed = Vec::new();
        if let Some((kept, key, generation)) = self.slot_at(source, files, PathIndex::Kept, dest)? {
            let moved = self.free_name(files, (1..1000).map(|n| format!("{dest}.{n}")))?;
            // Still indexed at `dest` if the move fails: a retried batch
            // must not take the kept file for a free path.
            let moved_on = self.move_superseded(source, files, &kept, dest, &moved, work)?;
            files.kept.remove(dest);
            if moved_on {
                files.kept.insert(moved, (key, generation));
            }
            changed.push(kept);
        }
        let Some((old, key, generation)) = self.slot_at(source, files, PathIndex::Live, dest)?
        else {
            return Ok(changed);
        };
        let mut state = lock(&old.state);
        // A move of it recorded and not seen through is finished first: its
        // file is then the one at `dest`, and no later settle can move it
        // back over whatever takes its place.
        self.settle_rename(source, &old, &mut state, work)?;
        match self.superseded {
            SupersededPolicy::Mirror => {
                // Nothing changes in memory until the file is out of the way:
                // a failure leaves the old generation live at `dest`, and the
                // retried batch supersedes it again instead of writing into
                // its file.
                if let Some(dir) = self.root.remove(dest).map_err(confine_error)? {
                    work.request
                        .flush_before_record(&mut lock(&old.unsynced), None, [dir]);
                }
                state.close_file();
                state.record.superseded = true;
                self.holds.drop_all(&mut state);
                drop(state);
                work.request.touched.push(old.clone());
            }
            SupersededPolicy::Keep => {
                drop(state);
                let aside = self.free_name(
                    files,
                    (0..1000).map(|n| match n {
                        0 => format!("{dest}.gen{generation}"),
                        n => format!("{dest}.gen{generation}.{n}"),
                    }),
                )?;
                if self.move_superseded(source, files, &old, dest, &aside, work)? {
                    files.kept.insert(aside, (key.clone(), generation));
                }
            }
        }
        files.by_path.remove(dest);
        changed.push(old);
        Ok(changed)
    }

    /// Moves a superseded generation's file from `from` to `to` (kept aside,
    /// or moved on from a kept name) and marks it kept; returns false if the
    /// file was gone, and then records the generation superseded and not
    /// kept. Either way the record is durable before `from` is free: a
    /// move's intent is recorded before the move is made, as a rename's is
    /// (see [`Self::rename`]). Otherwise a crash before the round that
    /// records it would leave the record naming `from`, where a new file is
    /// about to be written, and the kept bytes under no record. The caller
    /// holds `files`, and neither the gate nor a slot's state.
    pub(super) fn move_superseded(
        &self,
        source: &Source,
        files: &mut SourceFiles,
        slot: &Arc<Slot>,
        from: &str,
        to: &str,
        work: &mut BatchWork,
    ) -> Result<bool, RowError> {
        // Its intent is recorded by a round: no batch waits for this one's
        // writes meanwhile.
        work.writes.write_all()?;
        let moved_away = self.moves_away_from(source, files, to, work)?;
        let before = {
            let state = lock(&slot.state);
            (state.record.superseded, state.record.kept)
        };
        let moving = {
            let mut state = lock(&slot.state);
            self.settle_rename(source, slot, &mut state, work)?;
            match self.inode_at(from)? {
                None => {
                    state.record.superseded = true;
                    state.record.kept = false;
                    state.close_file();
                    // What it held is never written.
                    self.holds.drop_all(&mut state);
                    None
                }
                Some(inode) => {
                    state.record.begin_move(to.to_owned(), inode);
                    state.record.superseded = true;
                    state.record.kept = true;
                    Some(Moving::mark(slot, &mut state))
                }
            }
        };
        let mut intent = moved_away;
        intent.push(slot.clone());
        let Some(moving) = moving else {
            tracing::warn!(path = %from, "a superseded file to keep aside is gone from the sink; nothing to keep");
            self.record_durably(intent, || {
                format!("recording the superseded file {from}, which is gone")
            })?;
            work.request.touched.push(slot.clone());
            return Ok(false);
        };
        if let Err(error) = self.record_durably(intent, || {
            format!("recording the move of {from} aside to {to}")
        }) {
            // Nothing moved: memory goes back to what the disk holds (see
            // `Moving::abandon`).
            {
                let mut state = lock(&slot.state);
                (state.record.superseded, state.record.kept) = before;
            }
            moving.abandon(slot);
            return Err(error);
        }
        let dirs = match self.root.rename(from, to) {
            Ok(dirs) => dirs,
            Err(error) => {
                // Nothing moved: the record says so again, durably, so that
                // no settle makes the move later behind the live record.
                {
                    let mut state = lock(&slot.state);
                    state.record.undo_move();
                    (state.record.superseded, state.record.kept) = before;
                    moving.made(&mut state);
                }
                self.record_durably(vec![slot.clone()], || {
                    format!("withdrawing the intent to move {from} aside to {to}")
                })?;
                return Err(confine_error(error));
            }
        };
        {
            let mut state = lock(&slot.state);
            work.request
                .flush_before_record(&mut lock(&slot.unsynced), None, dirs);
            state.record.end_move();
            state.close_file();
            // Superseded for good only now (a failed move above makes it
            // live again): what it held is never written.
            self.holds.drop_all(&mut state);
            moving.made(&mut state);
        }
        lock(&source.moved_away).made(from.to_owned(), slot.clone());
        work.request.touched.push(slot.clone());
        Ok(true)
    }

    /// The slot a path index names at `dest`, with its key and generation;
    /// a name whose record is gone is dropped from the index.
    pub(super) fn slot_at(
        &self,
        source: &Source,
        files: &mut SourceFiles,
        which: PathIndex,
        dest: &str,
    ) -> Result<Option<(Arc<Slot>, String, u64)>, RowError> {
        let Some((key, generation)) = files.index(which).get(dest).cloned() else {
            return Ok(None);
        };
        match self.lookup(source, files, &key, generation)? {
            Some(slot) => Ok(Some((slot, key, generation))),
            None => {
                files.index(which).remove(dest);
                Ok(None)
            }
        }
    }

    /// The first of `names` that no live or kept file of the source has and
    /// nothing on disk has either (renaming over it would lose that file).
    pub(super) fn free_name(
        &self,
        files: &SourceFiles,
        names: impl Iterator<Item = String>,
    ) -> Result<String, RowError> {
        let mut last = String::new();
        for name in names {
            if !files.by_path.contains_key(&name) && !files.kept.contains_key(&name) {
                match self.root.open_for_read(&name) {
                    Err(ConfineError::Io { source, .. })
                        if source.kind() == std::io::ErrorKind::NotFound =>
                    {
                        return Ok(name);
                    }
                    _ => {}
                }
            }
            last = name;
        }
        Err(RowError::Storage(format!(
            "no free name to move a superseded file aside (tried up to {last})"
        )))
    }
}
