//! What placement knows of files on the move: the paths a file may still
//! have to leave ([`MovedAway`]), and the mark a move under way leaves on
//! its file ([`Moving`]).

use std::collections::HashMap;
use std::sync::Arc;

use crate::state::{Slot, SlotState, lock};

/// Paths of a source a file may still have to leave, or may have left not
/// durably yet: a move of another file there must wait for that move (see
/// `Placer::moves_away_from`).
#[derive(Default)]
pub(crate) struct MovedAway {
    /// Moves this process made, by the path they left, with the files moved.
    made: HashMap<String, Vec<Arc<Slot>>>,
    /// Moves an earlier process recorded and may not have made, by the
    /// path they leave: the file's (key, generation).
    pub(crate) recorded: HashMap<String, (String, u64)>,
    /// Sweep `made` of moves already durable when it grows past this.
    sweep_above: usize,
}

/// Moves kept in `MovedAway::made` before the durable ones are dropped.
const MOVED_AWAY_SWEEP: usize = 1024;

impl MovedAway {
    /// The files moves made away from `path`, no longer kept here.
    pub(crate) fn take_made(&mut self, path: &str) -> Vec<Arc<Slot>> {
        self.made.remove(path).unwrap_or_default()
    }

    /// Notes that a move took `slot`'s file away from `from`.
    pub(crate) fn made(&mut self, from: String, slot: Arc<Slot>) {
        if self.made.len() >= self.sweep_above.max(MOVED_AWAY_SWEEP) {
            self.made.retain(|_, moved| {
                moved.retain(|slot| !lock(&slot.unsynced).is_empty());
                !moved.is_empty()
            });
            self.sweep_above = 2 * self.made.len();
        }
        let moved = self.made.entry(from).or_default();
        if !moved.iter().any(|known| Arc::ptr_eq(known, &slot)) {
            moved.push(slot);
        }
    }
}

/// A move this batch is making (see [`SlotState::moving`]): marked under
/// the file's state, together with the intent; unmarked by
/// [`Self::made`] once the move is made or taken back, or when dropped on
/// a failure. Dropping it locks the file's state, so a holder lets go of
/// that lock first.
pub(crate) struct Moving(Option<Arc<Slot>>);

impl Moving {
    pub(crate) fn mark(slot: &Arc<Slot>, state: &mut SlotState) -> Self {
        state.moving = true;
        Self(Some(slot.clone()))
    }

    /// The move is over; the caller holds the file's state.
    pub(crate) fn made(mut self, state: &mut SlotState) {
        state.moving = false;
        self.0 = None;
    }

    /// The move's intent could not be recorded (a failed or refused
    /// commit: the sink stopping, a full state directory) and nothing
    /// moved: the record goes back to naming the file where it is, before
    /// the mark is lifted. Left as it was, the record would say "recorded,
    /// not yet moved", and the next batch to touch the file would make the
    /// move behind a manifest that never heard of it (a restart's journal
    /// replay then recreated the old name, and the renamed file was
    /// replaced by that empty-headed copy).
    pub(crate) fn abandon(self, slot: &Arc<Slot>) {
        let mut state = lock(&slot.state);
        state.record.undo_move();
        self.made(&mut state);
    }
}

impl Drop for Moving {
    fn drop(&mut self) {
        if let Some(slot) = self.0.take() {
            lock(&slot.state).moving = false;
        }
    }
}
