//! The hold budget: ranges that arrive ahead of the bytes before them wait
//! in memory (see `data`), and this bounds the bytes they take across the
//! sink's files. It knows which slots hold something, so that a full budget
//! can give back the room of ranges nobody waits for any more.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use crate::lock_order::{Rank, Ranked, WouldBlock};
use crate::state::{Held, Slot, SlotState, lock};

/// Default of [`super::Placer::with_hold_limit`]: room for the windows of
/// a few watchers' connections whose batches all arrive ahead of one late
/// batch, as the sink's own default (`SinkConfig`).
const HOLD_LIMIT: u64 = 256 << 20;

/// Bytes held in memory across the sink's files, and the most it may hold.
pub(super) struct Holds {
    held_bytes: AtomicU64,
    hold_limit: u64,
    /// Slots that held something when last looked at: where a full hold
    /// budget looks for ranges nobody waits for any more.
    holders: Ranked<Vec<Weak<Slot>>>,
}

/// A range refused for want of room: the bytes held already, and the limit.
pub(super) struct Full {
    pub(super) held: u64,
    pub(super) limit: u64,
}

impl Holds {
    pub(super) fn new() -> Self {
        Self {
            held_bytes: AtomicU64::new(0),
            hold_limit: HOLD_LIMIT,
            holders: Ranked::new(Rank::Holders, Vec::new()),
        }
    }

    /// See [`super::Placer::with_hold_limit`].
    pub(super) fn set_limit(&mut self, limit: u64) {
        self.hold_limit = limit;
    }

    /// Whether ranges may be held at all: with no budget, every range is
    /// written where it belongs as it arrives.
    pub(super) fn enabled(&self) -> bool {
        self.hold_limit > 0
    }

    /// Bytes held in memory now.
    pub(super) fn held_bytes(&self) -> u64 {
        self.held_bytes.load(Ordering::Relaxed)
    }

    /// Holds `bytes` at `start` of `slot`'s file (whose state the caller
    /// holds), within the budget.
    pub(super) fn hold(
        &self,
        slot: &Arc<Slot>,
        state: &mut SlotState,
        start: u64,
        bytes: &[u8],
    ) -> Result<(), Full> {
        self.take(slot, state, bytes.len() as u64)?;
        if state.held.is_empty() {
            self.remember(slot);
        }
        state.held.insert(
            start,
            Held {
                bytes: bytes.to_vec(),
                since: std::time::Instant::now(),
            },
        );
        Ok(())
    }

    /// Takes `len` bytes of the budget; when it is full, first gives back
    /// the room of stale holds, once.
    fn take(&self, slot: &Arc<Slot>, state: &mut SlotState, len: u64) -> Result<(), Full> {
        let mut before = self.held_bytes.fetch_add(len, Ordering::Relaxed);
        if before + len > self.hold_limit {
            self.release(len);
            self.evict_stale_holds(slot, state);
            before = self.held_bytes.fetch_add(len, Ordering::Relaxed);
        }
        if before + len > self.hold_limit {
            self.release(len);
            return Err(Full {
                held: before,
                limit: self.hold_limit,
            });
        }
        Ok(())
    }

    fn release(&self, len: u64) {
        self.held_bytes.fetch_sub(len, Ordering::Relaxed);
    }

    /// Lists `slot`, which is about to hold something and held nothing.
    fn remember(&self, slot: &Arc<Slot>) {
        let mut holders = lock(&self.holders);
        // Forget slots that hold nothing now before the list doubles
        // (only a full budget looks at it otherwise). A slot's own
        // state is the caller's, and locking it again would deadlock.
        if holders.len() >= 1024 && holders.len().is_power_of_two() {
            holders.retain(|weak| {
                weak.upgrade().is_some_and(|other| {
                    Arc::ptr_eq(&other, slot)
                        || other
                            .state
                            .try_lock()
                            .map_or(true, |state| !state.held.is_empty())
                })
            });
        }
        holders.push(Arc::downgrade(slot));
    }

    /// Takes the range held at `start` out of memory, to be written; its
    /// room is given back.
    pub(super) fn take_out(&self, state: &mut SlotState, start: u64) -> Option<Held> {
        let held = state.held.remove(&start)?;
        self.release(held.bytes.len() as u64);
        Some(held)
    }

    /// Frees the hold budget of ranges held longer than [`crate::commit::HOLD_WAIT`] since
    /// they were last sent: their batches have been failed and sent again
    /// or their peers are gone (a watcher that stopped, a hostile client
    /// that sent ranges past a gap it never fills), and nobody waits for
    /// them. Kept, they would take the budget from every other stream for
    /// as long as the sink runs. Their bytes were never acknowledged: a
    /// watcher still alive sends them again. `current` is the slot whose
    /// state the caller holds locked; other slots busy now are skipped
    /// (locking them could deadlock against their holder).
    fn evict_stale_holds(&self, current: &Arc<Slot>, current_state: &mut SlotState) {
        let mut holders = lock(&self.holders);
        let evict = |state: &mut SlotState| {
            let stale: Vec<u64> = state
                .held
                .iter()
                .filter(|(_, held)| held.since.elapsed() > crate::commit::HOLD_WAIT)
                .map(|(&start, _)| start)
                .collect();
            for start in stale {
                if let Some(held) = state.held.remove(&start) {
                    let len = held.bytes.len() as u64;
                    self.release(len);
                    state.pending.remove(start, start + len);
                    tracing::info!(file = %state.record.dest_path, start, len, "dropped a range held past the hold wait: nobody waits for it (its sender may send it again)");
                }
            }
            !state.held.is_empty()
        };
        holders.retain(|weak| {
            let Some(slot) = weak.upgrade() else {
                return false;
            };
            if Arc::ptr_eq(&slot, current) {
                return evict(current_state);
            }
            match slot.state.try_lock() {
                Ok(mut state) => evict(&mut state),
                // Busy: looked at on the next full budget.
                Err(WouldBlock) => true,
            }
        });
        // A slot that emptied and held again is listed twice: keep one.
        let mut seen = std::collections::HashSet::new();
        holders.retain(|weak| seen.insert(weak.as_ptr() as usize));
    }

    /// Drops what a batch that failed still holds (nobody drained it): no
    /// one waits for it once its batch is sent again.
    pub(super) fn drop_failed(&self, held: &[(Arc<Slot>, u64, u64)]) {
        for (slot, start, end) in held {
            let mut state = lock(&slot.state);
            let ours = state
                .held
                .get(start)
                .is_some_and(|held| *start + held.bytes.len() as u64 == *end);
            if ours && self.take_out(&mut state, *start).is_some() {
                state.pending.remove(*start, *end);
            }
        }
    }

    /// Drops everything a file holds: a newer generation replaced it, and
    /// its batches are answered as superseded.
    pub(super) fn drop_all(&self, state: &mut SlotState) {
        for (start, held) in std::mem::take(&mut state.held) {
            let len = held.bytes.len() as u64;
            self.release(len);
            state.pending.remove(start, start + len);
        }
    }

    /// The slots listed as holding something.
    #[cfg(test)]
    pub(super) fn holders(&self) -> Vec<Arc<Slot>> {
        lock(&self.holders)
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }
}
