//! Renames. A move's intent is durable before the file moves, so a crash in
//! between leaves a record that knows both names; a move recorded and not
//! made is finished before anything opens the file or takes its paths.

use std::sync::Arc;

use flight_server::{RangeBatch, Row, RowKind};
use manifest_db::IntervalSet;

use super::moves::Moving;
use super::sources::{Source, SourceFiles};
use super::{BatchWork, Placer, RowError, confine_error, confined_path};
use crate::confine::SettledMove;
use crate::state::{Slot, SlotState, lock};

impl Placer {
    pub(super) fn rename(
        &self,
        source: &Source,
        row: &Row<'_>,
        work: &mut BatchWork,
    ) -> Result<(), RowError> {
        let path = confined_path(row, "a Rename row needs the new path")?;
        // Its intent is recorded by a round: no batch waits for this one's
        // writes meanwhile.
        work.writes.write_all()?;
        let slot = self.slot_or_create(source, row, work)?;
        // Renames of one source are serialised: a re-delivered rename racing
        // the original must see its effect, not undo it.
        let mut files = lock(&source.files);
        let new_dest = self.dest(source, path);
        let (old_dest, superseded) = {
            let state = lock(&slot.state);
            (state.record.dest_path.clone(), state.record.superseded)
        };
        if superseded {
            return Err(RowError::Superseded(
                "a newer generation replaced this one; rename ignored".into(),
            ));
        }
        if old_dest == new_dest {
            if work.renamed.contains(&(Arc::as_ptr(&slot) as usize)) {
                // Moved by this batch, ahead of this row.
                return Ok(());
            }
            // Done before (perhaps only recorded, before a crash): make sure.
            let mut state = lock(&slot.state);
            let unsettled = state.record.renamed_from.clone();
            self.settle_rename(source, &slot, &mut state, work)?;
            drop(state);
            if let Some(from) = unsettled {
                // A move an earlier delivery recorded (or made) and did not
                // see through: its row finishes it, and this round fsyncs it.
                let this = (row.file_key.to_owned(), row.generation);
                if files.by_path.get(&from) == Some(&this) {
                    files.by_path.remove(&from);
                }
                files.by_path.insert(new_dest, this);
            }
            work.request.touched.push(slot);
            return Ok(());
        }
        {
            // Nothing is changed (no file at `new_dest` superseded) for a
            // rename that cannot be made: its file must be there, once any
            // move of it recorded before is finished.
            let mut state = lock(&slot.state);
            self.settle_rename(source, &slot, &mut state, work)?;
            if self.inode_at(&old_dest)?.is_none() {
                // Removed or replaced behind the sink's back.
                return Err(RowError::Reject(format!(
                    "cannot rename to {new_dest}: the sink holds no file at {old_dest}"
                )));
            }
        }
        // Record the rename before making it: a crash in between leaves a
        // record that knows both names, and settle_rename finishes the move
        // before the file is opened again. The files it supersedes are
        // recorded with it (after a crash, two live records must not name
        // one path), and so are those whose moves away from the new name
        // must be durable first.
        let mut intent = self.supersede_at(source, &mut files, &new_dest, work)?;
        intent.extend(self.moves_away_from(source, &mut files, &new_dest, work)?);
        let moving = {
            let mut state = lock(&slot.state);
            // A move recorded before and not seen through is finished, and
            // made durable, before this intent takes the place of its record.
            self.settle_rename(source, &slot, &mut state, work)?;
            let Some(inode) = self.inode_at(&old_dest)? else {
                return Err(RowError::Storage(format!(
                    "the file at {old_dest} went away while it was renamed to {new_dest}"
                )));
            };
            state.record.begin_move(new_dest.clone(), inode);
            Moving::mark(&slot, &mut state)
        };
        intent.push(slot.clone());
        #[cfg(test)]
        crate::fault::hit(crate::fault::Point::MoveIntent, &slot.id.source);
        if let Err(error) =
            self.record_durably(intent, || format!("recording the rename to {new_dest}"))
        {
            moving.abandon(&slot);
            return Err(error);
        }
        let dirs = match self.root.rename(&old_dest, &new_dest) {
            Ok(dirs) => dirs,
            Err(error) => {
                self.withdraw_intents(std::slice::from_ref(&slot))?;
                drop(moving);
                return Err(match confine_error(error) {
                    // The new name cannot be made (a file where a directory
                    // should be, a link in the way): the file keeps its name
                    // and goes on; the watcher is told.
                    RowError::Peer(reason) => {
                        RowError::Reject(format!("cannot rename to {new_dest}: {reason}"))
                    }
                    other => other,
                });
            }
        };
        {
            let mut state = lock(&slot.state);
            work.request
                .flush_before_record(&mut lock(&slot.unsynced), None, dirs);
            state.record.end_move();
            moving.made(&mut state);
        }
        files.by_path.remove(&old_dest);
        files
            .by_path
            .insert(new_dest, (row.file_key.to_owned(), row.generation));
        lock(&source.moved_away).made(old_dest, slot.clone());
        drop(files);
        work.request.touched.push(slot);
        Ok(())
    }

    /// At the first row of a run of consecutive Rename rows, makes the
    /// run's plain renames with one synced manifest write for all their
    /// intents, instead of one each.
    ///
    /// A writer that rotates its chunks renames a hundred files at once, and
    /// each rename's intent must be durable before its file moves (see
    /// [`Self::rename`]): one after another, those synced writes held up
    /// every batch behind them for tens of milliseconds.
    ///
    /// The renames of a run may be made in any order when no two of them
    /// name the same path, or one inside the other, and no file is renamed
    /// twice. Then those whose file is known, lives at its recorded path and
    /// goes where no file lives or is kept are made here, at the run's place
    /// in the batch; their rows find them done. The others, and every rename
    /// of a run that does not qualify, are left to their rows.
    pub(super) fn rename_run_at(
        &self,
        source: &Source,
        batch: &RangeBatch,
        start: usize,
        work: &mut BatchWork,
    ) -> Result<(), RowError> {
        let Some(run) = rename_run_from(batch, start) else {
            return Ok(());
        };
        // Renames of one source are serialised (see `rename`).
        let mut files = lock(&source.files);
        let Some(moves) = self.plan_rename_run(source, &mut files, batch, run.clone())? else {
            tracing::debug!(run = run.len(), "renames left to their rows");
            return Ok(());
        };
        tracing::debug!(
            run = run.len(),
            together = moves.len(),
            "renames made together"
        );
        let Some(marked) = self.record_rename_run(source, &mut files, &moves, work)? else {
            tracing::debug!(run = run.len(), "renames left to their rows");
            return Ok(());
        };
        self.make_rename_run(source, &mut files, moves, marked, work)
    }

    /// The plain renames of the run that can be made together, in order,
    /// or none if the run does not qualify (see [`Self::rename_run_at`]).
    fn plan_rename_run(
        &self,
        source: &Source,
        files: &mut SourceFiles,
        batch: &RangeBatch,
        run: std::ops::Range<usize>,
    ) -> Result<Option<Vec<PlannedMove>>, RowError> {
        let mut named: Vec<String> = Vec::new();
        let mut files_renamed = std::collections::HashSet::new();
        let mut moves = Vec::new();
        // Only the plain renames ahead of any other in the run: one left to
        // its row may fail, and what follows it must not have happened.
        let mut in_order = true;
        for row in run.map(|i| batch.row(i)) {
            let Some(path) = row.path else {
                return Ok(None);
            };
            if crate::confine::components(path).is_err()
                || !files_renamed.insert((row.file_key, row.generation))
            {
                return Ok(None);
            }
            let to = self.dest(source, path);
            let Some(slot) = self.lookup(source, files, row.file_key, row.generation)? else {
                // Its row creates it at its key's path, then moves it; or
                // refuses it, and then nothing after it may happen first.
                if row.generation != 1 || crate::confine::components(row.file_key).is_err() {
                    return Ok(None);
                }
                named.push(self.dest(source, row.file_key));
                named.push(to);
                in_order = false;
                continue;
            };
            let state = lock(&slot.state);
            let from = state.record.dest_path.clone();
            // Into a directory that is there, onto no directory, of a file
            // that is where its record says: a move that would have to make
            // one, or could fail, is left to its row.
            let inode = match (in_order, &state.record.renamed_from) {
                (true, None) => self.inode_at(&from).ok().flatten(),
                _ => None,
            };
            let plain = !state.record.superseded
                && inode.is_some()
                && state.record.renamed_from.is_none()
                && from != to
                && !files.by_path.contains_key(&to)
                && !files.kept.contains_key(&to)
                && self.root.can_move_to(&to);
            named.extend(state.record.renamed_from.clone());
            drop(state);
            named.push(from.clone());
            named.push(to.clone());
            in_order &= plain;
            if let (true, Some(inode)) = (in_order, inode) {
                moves.push(PlannedMove {
                    slot,
                    from,
                    to,
                    inode,
                });
            }
        }
        Ok((moves.len() >= 2 && !paths_overlap(&named)).then_some(moves))
    }

    /// As in `rename`: every move's intent durable before any file moves.
    /// Returns the moves marked, or none if another batch began moving one
    /// of the files since it was looked at.
    fn record_rename_run(
        &self,
        source: &Source,
        files: &mut SourceFiles,
        moves: &[PlannedMove],
        work: &mut BatchWork,
    ) -> Result<Option<Vec<Moving>>, RowError> {
        work.writes.write_all()?;
        let mut intent = Vec::with_capacity(moves.len());
        for m in moves {
            intent.extend(self.moves_away_from(source, files, &m.to, work)?);
        }
        let mut marked = Vec::with_capacity(moves.len());
        for m in moves {
            let mut state = lock(&m.slot.state);
            if state.moving || state.record.renamed_from.is_some() {
                drop(state);
                drop(marked);
                return Ok(None);
            }
            state.record.begin_move(m.to.clone(), m.inode);
            marked.push(Moving::mark(&m.slot, &mut state));
            intent.push(m.slot.clone());
        }
        let count = moves.len();
        if let Err(error) =
            self.record_durably(intent, || format!("recording the renames of {count} files"))
        {
            for (m, moving) in moves.iter().zip(marked) {
                moving.abandon(&m.slot);
            }
            return Err(error);
        }
        Ok(Some(marked))
    }

    /// Makes the recorded moves. A failure withdraws that file's intent: it
    /// keeps its name and is left to its row, which tries again and refuses
    /// the rename if the peer named a path that cannot be made. A storage
    /// failure fails the batch. The other moves go on.
    fn make_rename_run(
        &self,
        source: &Source,
        files: &mut SourceFiles,
        moves: Vec<PlannedMove>,
        marked: Vec<Moving>,
        work: &mut BatchWork,
    ) -> Result<(), RowError> {
        let mut first_failure = None;
        let mut not_moved = Vec::new();
        for (m, moving) in moves.into_iter().zip(marked) {
            let dirs = match self.root.rename(&m.from, &m.to) {
                Ok(dirs) => dirs,
                Err(error) => {
                    if !error.is_peer_error() {
                        first_failure.get_or_insert(confine_error(error));
                    }
                    not_moved.push((m.slot, moving));
                    continue;
                }
            };
            {
                let mut state = lock(&m.slot.state);
                work.request
                    .flush_before_record(&mut lock(&m.slot.unsynced), None, dirs);
                state.record.end_move();
                moving.made(&mut state);
            }
            files.by_path.remove(&m.from);
            files
                .by_path
                .insert(m.to, (m.slot.id.key.clone(), m.slot.id.generation));
            lock(&source.moved_away).made(m.from, m.slot.clone());
            work.renamed.insert(Arc::as_ptr(&m.slot) as usize);
            work.request.touched.push(m.slot);
        }
        if !not_moved.is_empty() {
            let (slots, moving): (Vec<_>, Vec<_>) = not_moved.into_iter().unzip();
            self.withdraw_intents(&slots)?;
            drop(moving);
        }
        first_failure.map_or(Ok(()), Err)
    }

    /// Finishes a rename recorded before a crash (or a failed attempt): the
    /// file is moved to where the record says it lives before anything opens
    /// it there, so nothing writes into a new empty file by mistake.
    pub(super) fn settle_rename(
        &self,
        source: &Source,
        slot: &Arc<Slot>,
        state: &mut SlotState,
        work: &mut BatchWork,
    ) -> Result<(), RowError> {
        let Some(from) = state.record.renamed_from.clone() else {
            return Ok(());
        };
        let to = &state.record.dest_path;
        if state.moving {
            // Another batch makes this move once its intent is durable.
            return Err(RowError::Storage(format!(
                "{from} is being moved to {to} by another batch; this one is sent again"
            )));
        }
        let inode = match state.record.renamed_inode {
            Some(inode) => Ok(Some(inode)),
            // Recorded by a build that did not keep the inode: the file at
            // `from` is taken for it, else the one at `to`.
            None => match self.root.inode_at(&from) {
                Ok(None) => self.root.inode_at(to),
                found => found,
            },
        };
        let settled = inode.and_then(|inode| match inode {
            Some(inode) => self.root.settle_move(&from, to, inode),
            None => Ok(SettledMove::Missing),
        });
        match settled {
            Ok(SettledMove::Made(dirs)) => {
                work.request
                    .flush_before_record(&mut lock(&slot.unsynced), None, dirs);
                lock(&source.moved_away).made(from.clone(), slot.clone());
            }
            Ok(SettledMove::Missing) => {
                // Its bytes are gone (removed behind the sink's back): the
                // record must not claim them, so that they are sent again.
                tracing::error!(
                    from = %from,
                    to = %to,
                    bytes = state.record.placed.total_len(),
                    "a recorded move found its file under neither name; its ranges are dropped from the manifest to be sent again"
                );
                state.record.placed = IntervalSet::new();
                state.record.sealed = None;
            }
            // Recorded before this sink took back intents whose move failed
            // (or just before a crash): not this batch's fault, and the
            // batch is tried again.
            Err(e) => {
                return Err(RowError::Storage(format!(
                    "finishing the recorded move of {from} to {to}: {e}"
                )));
            }
        }
        state.record.end_move();
        work.request.touched.push(slot.clone());
        Ok(())
    }

    /// The inode of the file at `dest`, one of this sink's files, if it is there.
    pub(super) fn inode_at(&self, dest: &str) -> Result<Option<u64>, RowError> {
        self.root.inode_at(dest).map_err(|e| {
            RowError::Storage(format!("finding the file at {dest} before moving it: {e}"))
        })
    }

    /// The files that moved away from `to` and whose moves may not be
    /// durable yet, once a move away from it that an earlier process
    /// recorded (and may not have made) is made: the round recording an
    /// intent to move another file to `to` flushes their moves first.
    /// Otherwise a crash could keep the intent and lose such a move, and
    /// settling the intent would move its file over the one that never
    /// left. The caller holds `files`, and no slot's state.
    pub(super) fn moves_away_from(
        &self,
        source: &Source,
        files: &mut SourceFiles,
        to: &str,
        work: &mut BatchWork,
    ) -> Result<Vec<Arc<Slot>>, RowError> {
        self.settle_recorded_move_from(source, files, to, work)?;
        Ok(lock(&source.moved_away).take_made(to))
    }

    /// Makes a move away from `path` that an earlier process recorded (and
    /// may not have made) before anything else takes the path. The caller
    /// holds `files` and no slot's state.
    pub(super) fn settle_recorded_move_from(
        &self,
        source: &Source,
        files: &mut SourceFiles,
        path: &str,
        work: &mut BatchWork,
    ) -> Result<(), RowError> {
        // Forgotten only once settled: a failure leaves it for the retry.
        let recorded = lock(&source.moved_away).recorded.get(path).cloned();
        let Some((key, generation)) = recorded else {
            return Ok(());
        };
        if let Some(slot) = self.lookup(source, files, &key, generation)? {
            let mut state = lock(&slot.state);
            if state.record.renamed_from.as_deref() == Some(path) {
                self.settle_rename(source, &slot, &mut state, work)?;
            }
        }
        lock(&source.moved_away).recorded.remove(path);
        Ok(())
    }

    /// Takes back the rename intents of files whose move failed: each lives
    /// at its old name again, in memory and (durably) in the manifest, so no
    /// later open tries to finish a move that cannot be made. A rename fails
    /// before the file moves or not at all, so the old name is where it is.
    /// Should the write fail, the sink is poisoned, and its restart settles
    /// the intents the manifest still holds by inode.
    pub(super) fn withdraw_intents(&self, slots: &[Arc<Slot>]) -> Result<(), RowError> {
        let mut withdrawn = Vec::with_capacity(slots.len());
        for slot in slots {
            let mut state = lock(&slot.state);
            if state.record.renamed_from.is_some() {
                state.record.undo_move();
                withdrawn.push(slot.clone());
            }
        }
        if withdrawn.is_empty() {
            return Ok(());
        }
        let count = withdrawn.len();
        self.record_durably(withdrawn, || {
            format!("withdrawing the rename intents of {count} files whose move failed")
        })
    }
}

/// A rename of a run made together with the others.
struct PlannedMove {
    slot: Arc<Slot>,
    from: String,
    to: String,
    inode: u64,
}

/// The run of two or more consecutive Rename rows that starts at `start`,
/// if one does (a row inside a run is not its start).
fn rename_run_from(batch: &RangeBatch, start: usize) -> Option<std::ops::Range<usize>> {
    let is_rename = |i: usize| batch.row(i).kind == RowKind::Rename;
    if start > 0 && is_rename(start - 1) {
        return None;
    }
    let end = (start..batch.len())
        .find(|&i| !is_rename(i))
        .unwrap_or(batch.len());
    (end - start >= 2).then_some(start..end)
}

/// Whether two of `paths` are the same, or one lies inside the other.
pub(super) fn paths_overlap(paths: &[String]) -> bool {
    let mut seen = std::collections::HashSet::with_capacity(paths.len());
    if !paths.iter().all(|path| seen.insert(path.as_str())) {
        return true;
    }
    paths.iter().any(|path| {
        path.match_indices('/')
            .any(|(slash, _)| seen.contains(&path[..slash]))
    })
}
