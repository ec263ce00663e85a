//! The order in which placement, the committer and the journal replay take
//! the sink's locks, in one place, and its check. A thread holding a lock
//! takes only locks ranked after it. In builds with debug assertions (the
//! project's one profile has them) a lock taken out of order is caught
//! before it blocks, naming both: a reversed pair is found by any test
//! that takes the two, not only by one whose threads happen to race. Unit
//! tests, and processes run with `TAILFLIGHT_LOCK_ORDER=panic` (as
//! `ops/test.sh` runs every test), panic; other processes log an error
//! once per pair and go on, as they would have without the check.

use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard, TryLockError};

/// The sink's locks, in the order a thread may take them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Rank {
    /// One source's cell, held while it loads (and while it looks at the
    /// map again).
    SourceCell,
    /// `Sources::sources` (`place::sources`): which sources are loaded.
    Sources,
    /// `Sources::flat_source`: the flat layout's one source.
    FlatSource,
    /// `Source::files`: a source's files by key and path.
    SourceFiles,
    /// The commit gate (`state::CommitGate`): a round's records, a move's
    /// intent (placement holds the source's files then), a snapshot of the
    /// records, the replay.
    CommitGate,
    /// `Slot::state`: one file generation's record, pending and held ranges.
    /// A rename holds the state of the generation it moves aside and of its
    /// successor at once.
    SlotState,
    /// `OpenFiles::open_files` (`place::fds`): the cache of open
    /// destination files.
    OpenFiles,
    /// `Holds::holders` (`place::holds`): the slots that held ranges.
    Holders,
    /// `OpenFiles::awaiting_flush`: new files whose flush is pending.
    AwaitingFlush,
    /// `Source::moved_away`: the paths moved aside and not yet recorded.
    MovedAway,
    /// `Slot::unsynced`: a file's pending flushes, read by the committer;
    /// never held across other work.
    Unsynced,
}

impl Rank {
    /// Whether a thread may hold two locks of this rank at once.
    fn nests(self) -> bool {
        matches!(self, Rank::SlotState)
    }
}

/// A mutex with its place in the order.
pub(crate) struct Ranked<T> {
    rank: Rank,
    mutex: Mutex<T>,
}

impl<T> Ranked<T> {
    pub(crate) const fn new(rank: Rank, value: T) -> Self {
        Self {
            rank,
            mutex: Mutex::new(value),
        }
    }

    /// Locks it, after checking the order (see the module's doc). A mutex
    /// a panic left poisoned is taken anyway: see [`crate::state::lock`].
    pub(crate) fn lock(&self) -> Guard<'_, T> {
        let held = Held::take(self.rank);
        let guard = self
            .mutex
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Guard { guard, _held: held }
    }

    /// Locks it if no one holds it. A try never waits, so it may go against
    /// the order; what it holds counts for the locks taken after it. A
    /// mutex a panic left poisoned counts as busy: its callers (sweeps of
    /// caches) leave it alone.
    pub(crate) fn try_lock(&self) -> Result<Guard<'_, T>, WouldBlock> {
        let guard = match self.mutex.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(_) | TryLockError::WouldBlock) => return Err(WouldBlock),
        };
        Ok(Guard {
            guard,
            _held: Held::record(self.rank),
        })
    }
}

/// Someone else holds the lock.
#[derive(Debug)]
pub(crate) struct WouldBlock;

/// A held [`Ranked`] lock.
pub(crate) struct Guard<'a, T> {
    guard: MutexGuard<'a, T>,
    _held: Held,
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

/// This thread's hold of one lock, in the thread's list while it lasts.
struct Held {
    #[cfg(debug_assertions)]
    id: u64,
}

#[cfg(debug_assertions)]
thread_local! {
    /// The ranks this thread holds, with each hold's id.
    static HELD: std::cell::RefCell<Vec<(Rank, u64)>> = const { std::cell::RefCell::new(Vec::new()) };
    static NEXT_HOLD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

impl Held {
    #[cfg(debug_assertions)]
    fn next_id() -> u64 {
        NEXT_HOLD.with(|next| {
            next.set(next.get() + 1);
            next.get()
        })
    }

    /// Records a hold without checking the order.
    #[cfg(debug_assertions)]
    fn record(rank: Rank) -> Self {
        let id = Self::next_id();
        HELD.with(|held| held.borrow_mut().push((rank, id)));
        Self { id }
    }

    #[cfg(not(debug_assertions))]
    fn record(_rank: Rank) -> Self {
        Self {}
    }

    #[cfg(debug_assertions)]
    fn take(rank: Rank) -> Self {
        let after = HELD.with(|held| {
            held.borrow()
                .iter()
                .find(|&&(h, _)| h > rank || (h == rank && !rank.nests()))
                .map(|&(h, _)| h)
        });
        // Before the hold is listed: a panic must not leave it in the list
        // of a pool thread that lives on.
        if let Some(after) = after {
            out_of_order(rank, after);
        }
        Self::record(rank)
    }

    #[cfg(not(debug_assertions))]
    fn take(_rank: Rank) -> Self {
        Self {}
    }
}

/// A lock taken out of order: a panic where the order is checked, else an
/// error logged once per pair (a violation repeats with every batch).
#[cfg(debug_assertions)]
fn out_of_order(taking: Rank, held: Rank) {
    let message = format!(
        "lock order: taking {taking:?} while this thread holds {held:?} (the order is in sink/src/lock_order.rs)"
    );
    static PANICS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let panics = cfg!(test)
        || *PANICS.get_or_init(|| {
            std::env::var("TAILFLIGHT_LOCK_ORDER").is_ok_and(|value| value == "panic")
        });
    if panics {
        panic!("{message}");
    }
    static SEEN: Mutex<std::collections::BTreeSet<(Rank, Rank)>> =
        Mutex::new(std::collections::BTreeSet::new());
    let first = SEEN
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .insert((held, taking));
    if first {
        tracing::error!("{message}: a bug of the sink's, which may deadlock");
    }
}

#[cfg(debug_assertions)]
impl Drop for Held {
    fn drop(&mut self) {
        let _ = HELD.try_with(|held| held.borrow_mut().retain(|&(_, id)| id != self.id));
    }
}

#[cfg(all(test, debug_assertions))]
mod tests {
    use super::*;

    #[test]
    fn locks_taken_in_order_and_let_go_in_any_order() {
        let gate = Ranked::new(Rank::CommitGate, ());
        let state = Ranked::new(Rank::SlotState, 1);
        let other = Ranked::new(Rank::SlotState, 2);
        let unsynced = Ranked::new(Rank::Unsynced, ());
        let g = gate.lock();
        let s = state.lock();
        let o = other.lock();
        drop(s);
        let u = unsynced.lock();
        drop(g);
        drop((o, u));
        // All let go: any lock may come first again.
        let _u = unsynced.lock();
    }

    #[test]
    #[should_panic(expected = "lock order: taking SlotState while this thread holds Unsynced")]
    fn a_lock_ranked_before_one_held_panics_before_it_blocks() {
        let state = Ranked::new(Rank::SlotState, ());
        let unsynced = Ranked::new(Rank::Unsynced, ());
        let _u = unsynced.lock();
        let _s = state.lock();
    }

    #[test]
    #[should_panic(expected = "lock order: taking SourceFiles while this thread holds SourceFiles")]
    fn two_locks_of_a_rank_that_does_not_nest_panic() {
        let a = Ranked::new(Rank::SourceFiles, ());
        let b = Ranked::new(Rank::SourceFiles, ());
        let _a = a.lock();
        let _b = b.lock();
    }
}
