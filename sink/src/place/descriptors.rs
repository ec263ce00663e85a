//! The process's file descriptors as a budget. A destination file created
//! by a batch, and the directories whose entries it changed, stay open
//! until the commit round that flushes them; a burst of new files (100,000
//! small files in 10,000 directories) would hold more of them than the
//! process may open, and every open then fails. Under pressure a batch
//! first has the lately created files flushed early and the cache of open
//! files cut (see `OpenFiles::ease_pressure`), waits briefly while a
//! burst's rounds release the rest, and a row that would open a file past
//! the budget fails its batch as retryable instead of reaching EMFILE
//! half-way.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Batches start only below this share of the limit (in tenths)...
const START_BELOW_TENTHS: usize = 6;
/// ...and a new file is opened only below this one.
const OPEN_BELOW_TENTHS: usize = 9;
/// How long a batch waits for room before it goes on regardless (a round
/// that needs a slot a waiting batch holds cannot be waited for forever).
const MOST_WAIT: Duration = Duration::from_secs(5);
/// Counting the process's descriptors reads `/proc/self/fd`: at most this
/// often; opens since the last count are added to it.
const RECOUNT_EVERY: Duration = Duration::from_millis(50);

pub(crate) struct Descriptors {
    limit: usize,
    counted: AtomicUsize,
    opened_since: AtomicUsize,
    counted_at: Mutex<Instant>,
}

impl Descriptors {
    /// The budget of this process: its soft `RLIMIT_NOFILE`.
    pub fn of_process() -> Self {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into a valid, initialised struct.
        let known = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
        let current = if known && limit.rlim_cur != libc::RLIM_INFINITY {
            usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
        } else {
            usize::MAX
        };
        Self::with_limit(current)
    }

    pub fn with_limit(limit: usize) -> Self {
        let descriptors = Self {
            limit,
            counted: AtomicUsize::new(0),
            opened_since: AtomicUsize::new(0),
            counted_at: Mutex::new(Instant::now()),
        };
        descriptors.recount();
        descriptors
    }

    /// Descriptors the process may hold.
    pub fn limit(&self) -> usize {
        self.limit
    }

    fn recount(&self) {
        // Since Linux 6.2 the size of `/proc/self/fd` is the number of
        // descriptors open: one stat, where listing the directory took
        // placement about 175 µs with a hundred files open. Older kernels
        // say 0 there, and are listed.
        let counted = match rustix::fs::stat("/proc/self/fd") {
            Ok(st) if st.st_size > 0 => usize::try_from(st.st_size).ok(),
            _ => std::fs::read_dir("/proc/self/fd")
                .ok()
                .map(|entries| entries.count()),
        };
        if let Some(counted) = counted {
            self.counted.store(counted, Ordering::Relaxed);
            self.opened_since.store(0, Ordering::Relaxed);
        }
    }

    /// Descriptors in use, at least (a recent count plus opens since).
    fn in_use(&self) -> usize {
        let mut counted_at = crate::state::lock(&self.counted_at);
        if counted_at.elapsed() >= RECOUNT_EVERY {
            *counted_at = Instant::now();
            self.recount();
        }
        drop(counted_at);
        self.counted.load(Ordering::Relaxed) + self.opened_since.load(Ordering::Relaxed)
    }

    fn share(&self, tenths: usize) -> usize {
        self.limit / 10 * tenths
    }

    /// Whether batches should not start now (most descriptors are held).
    pub fn pressed(&self) -> bool {
        self.in_use() >= self.share(START_BELOW_TENTHS)
    }

    /// Waits (bounded) until the process holds few enough descriptors to
    /// start placing a batch. Called holding no lock.
    pub fn wait_to_start(&self) {
        let started = Instant::now();
        let mut warned = false;
        while self.pressed() && started.elapsed() < MOST_WAIT {
            if !warned {
                warned = true;
                tracing::info!(
                    in_use = self.in_use(),
                    limit = self.limit,
                    "most file descriptors are held by files awaiting their commit round; placing waits for the round"
                );
            }
            std::thread::sleep(RECOUNT_EVERY);
        }
    }

    /// Room to open one more destination file, or why not (retryable).
    /// Short of room, `relieve` is called (it closes what it can) and the
    /// descriptors are counted again before refusing.
    pub fn take_one(&self, relieve: impl FnOnce()) -> Result<(), DescriptorsShort> {
        let mut in_use = self.in_use();
        if in_use >= self.share(OPEN_BELOW_TENTHS) {
            relieve();
            self.recount();
            in_use = self.in_use();
        }
        if in_use >= self.share(OPEN_BELOW_TENTHS) {
            return Err(DescriptorsShort {
                in_use,
                limit: self.limit,
            });
        }
        // A file and, when new, up to a few directories.
        self.opened_since.fetch_add(2, Ordering::Relaxed);
        Ok(())
    }
}

/// A destination file not opened for want of descriptors: retryable.
#[derive(Debug, thiserror::Error)]
#[error(
    "the sink holds {in_use} of its {limit} file descriptors (files and directories awaiting their commit round, cached files, subscriptions); the batch is sent again once some are released"
)]
pub(crate) struct DescriptorsShort {
    in_use: usize,
    limit: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A budget a few descriptors above what the process holds refuses
    /// within a few opens, as retryable, after trying to relieve itself.
    #[test]
    fn opening_past_the_budget_is_refused_after_relief() {
        let base = Descriptors::with_limit(usize::MAX).in_use();
        let tight = Descriptors::with_limit((base + 8) * 10 / 9 + 10);
        let mut held = Vec::new();
        let mut relieved = 0;
        let mut refused = None;
        for opened in 0..1000 {
            match tight.take_one(|| relieved += 1) {
                Ok(()) => held.push(std::fs::File::open("/dev/null").expect("open /dev/null")),
                Err(reason) => {
                    refused = Some((opened, reason));
                    break;
                }
            }
        }
        let (opened, reason) = refused.expect("the budget refused an open");
        assert!(opened < 40, "{opened} opens were let through");
        assert!(relieved >= 1, "refused without trying to relieve");
        let reason = reason.to_string();
        assert!(reason.contains("file descriptors"), "{reason}");
    }
}
