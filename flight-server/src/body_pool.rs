//! Memory for large batch bodies, used again by the builder that filled it.
//!
//! A body of megabytes lives from its first `pread` until its batch is
//! answered: it is written to a connection and kept for a resend meanwhile.
//! Handed back to the allocator then, such a block goes back to the kernel
//! before long, and the next batch is read into fresh pages that the kernel
//! zeroes first (a huge page at a time), a pass over the memory as costly as
//! a copy. The watcher's batches in flight also kept ten times its window
//! resident that way. A [`BodyPool`] takes a large body back from its last
//! holder instead and gives it to the builder's next batch, its pages
//! already in place; the builder's small bodies (a trickle of appends) go
//! to the allocator as before.

use std::sync::{Arc, Mutex, MutexGuard, Weak};

use bytes::Bytes;

/// Bodies this large or larger come from the pool and go back to it.
pub(crate) const POOLED_FROM: usize = 1 << 20;

/// Pooled bodies' sizes are multiples of this.
pub(crate) const GRANULE: usize = 64 << 10;

/// Idle bodies a pool keeps; more go back to the allocator. Batches in
/// flight are bounded by the window, so the builder has a body back about
/// as often as it needs one: a few idle cover the uneven moments.
const MAX_IDLE: usize = 4;

/// The idle bodies of one batch builder, shared with the bodies it lent.
#[derive(Clone, Default)]
pub(crate) struct BodyPool {
    idle: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl BodyPool {
    /// An empty buffer with room for `wanted` bytes: an idle body if one
    /// fits without being more than twice as large (a body counts against
    /// the window for all the memory it holds), else a new allocation.
    /// Pooled sizes are rounded up to [`GRANULE`], so that bodies of batches
    /// of about the same size fit each other.
    pub(crate) fn take(&self, wanted: usize) -> Vec<u8> {
        if wanted < POOLED_FROM {
            return Vec::with_capacity(wanted);
        }
        let capacity = wanted.next_multiple_of(GRANULE);
        let mut idle = lock(&self.idle);
        let best = idle
            .iter()
            .enumerate()
            .filter(|(_, body)| (capacity..=capacity * 2).contains(&body.capacity()))
            .min_by_key(|(_, body)| body.capacity())
            .map(|(at, _)| at);
        if let Some(at) = best {
            return idle.swap_remove(at);
        }
        // Batches have grown: a body too small for them is not kept.
        if let Some(at) = idle.iter().position(|body| body.capacity() < capacity) {
            idle.swap_remove(at);
        }
        drop(idle);
        Vec::with_capacity(capacity)
    }

    /// The finished body as `Bytes`, going back to this pool when its last
    /// holder drops it, if it is large enough to be pooled.
    pub(crate) fn lend(&self, body: Vec<u8>) -> Bytes {
        match body.capacity() >= POOLED_FROM {
            true => Bytes::from_owner(Lent {
                body,
                home: Arc::downgrade(&self.idle),
            }),
            false => Bytes::from(body),
        }
    }

    /// Takes a large body back at once (its bytes were copied out).
    pub(crate) fn give_back(&self, body: Vec<u8>) {
        put_back(&self.idle, body);
    }

    #[cfg(test)]
    pub(crate) fn idle(&self) -> usize {
        lock(&self.idle).len()
    }
}

/// A body lent out as `Bytes`.
struct Lent {
    body: Vec<u8>,
    /// Weak: a body outliving its builder goes to the allocator.
    home: Weak<Mutex<Vec<Vec<u8>>>>,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        &self.body
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(home) = self.home.upgrade() {
            put_back(&home, std::mem::take(&mut self.body));
        }
    }
}

fn put_back(idle: &Mutex<Vec<Vec<u8>>>, mut body: Vec<u8>) {
    if body.capacity() < POOLED_FROM {
        return;
    }
    let mut idle = lock(idle);
    if idle.len() < MAX_IDLE {
        body.clear();
        idle.push(body);
    }
}

fn lock(idle: &Mutex<Vec<Vec<u8>>>) -> MutexGuard<'_, Vec<Vec<u8>>> {
    // The list is whole between any two statements; a panic elsewhere
    // leaves nothing half-done in it.
    idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_body_comes_back_to_the_next_batch_with_its_memory() {
        let pool = BodyPool::default();
        let mut body = pool.take(POOLED_FROM);
        body.extend_from_slice(&[7; 100]);
        let at = body.as_ptr();
        let bytes = pool.lend(body);
        let shared = bytes.clone();
        drop(bytes);
        assert_eq!(pool.idle(), 0, "still held by a clone");
        assert_eq!(&shared[..], &[7; 100]);
        drop(shared);
        assert_eq!(pool.idle(), 1);
        let again = pool.take(POOLED_FROM);
        assert_eq!(again.as_ptr(), at, "the same memory");
        assert!(again.is_empty());
    }

    #[test]
    fn small_bodies_and_ill_fitting_ones_go_to_the_allocator() {
        let pool = BodyPool::default();
        drop(pool.lend(pool.take(POOLED_FROM - 1)));
        assert_eq!(pool.idle(), 0, "small bodies are not pooled");

        drop(pool.lend(pool.take(4 * POOLED_FROM)));
        assert_eq!(pool.idle(), 1);
        let smaller = pool.take(POOLED_FROM);
        assert!(
            smaller.capacity() < 4 * POOLED_FROM,
            "too large to lend for it"
        );
        assert_eq!(pool.idle(), 1);
        let larger = pool.take(5 * POOLED_FROM);
        assert!(larger.capacity() >= 5 * POOLED_FROM);
        assert_eq!(pool.idle(), 0, "too small for batches this size: not kept");
    }

    #[test]
    fn bodies_of_about_the_same_size_fit_each_other() {
        let pool = BodyPool::default();
        let first = pool.take(4 * POOLED_FROM + 1000);
        let at = first.as_ptr();
        drop(pool.lend(first));
        let next = pool.take(4 * POOLED_FROM + 5000);
        assert_eq!(next.as_ptr(), at);
    }

    #[test]
    fn the_pool_keeps_a_few_idle_bodies_and_none_past_its_builder() {
        let pool = BodyPool::default();
        let lent: Vec<Bytes> = (0..MAX_IDLE + 2)
            .map(|_| pool.lend(pool.take(POOLED_FROM)))
            .collect();
        drop(lent);
        assert_eq!(pool.idle(), MAX_IDLE);

        let outliving = pool.lend(pool.take(POOLED_FROM));
        drop(pool);
        drop(outliving);
    }
}
