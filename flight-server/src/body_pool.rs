//! Spare DoPut body buffers, handed back when the last view of a body drops.
//!
//! Every batch body is copied once out of HTTP/2's frames into a buffer of
//! its own (see [`crate::put_receive`]). A fresh buffer for each body means
//! fresh pages: the kernel faults and zeroes each of them on the copy's
//! first touch, however the allocator is told to keep freed memory, because
//! the bodies are freed on other threads than the one that allocates them
//! (docs/profile.md: two thirds of the sink's page faults). A body whose
//! buffer came from here goes back here when its last `Bytes` drops, and
//! the next body of about its size is copied into pages already mapped.
//!
//! Memory stays bounded: the spares kept never exceed the pool's byte limit
//! (the oldest are freed first), and a body in use is not the pool's: it is
//! bounded by the connections' flow-control windows as before.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;

/// Buffers are allocated in multiples of this, so that bodies of nearby
/// sizes (small writes batched a few more or less at a time) reuse each
/// other's buffers.
const CAPACITY_STEP: usize = 64 << 10;

/// Buffers spared for later bodies, shared by every stream of a server.
#[derive(Clone)]
pub(crate) struct BodyPool {
    spares: Arc<Mutex<Spares>>,
}

struct Spares {
    /// Oldest first.
    buffers: VecDeque<Vec<u8>>,
    bytes: usize,
    limit: usize,
}

impl BodyPool {
    /// A pool that keeps at most `limit` bytes of spare buffers; 0 keeps none.
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            spares: Arc::new(Mutex::new(Spares {
                buffers: VecDeque::new(),
                bytes: 0,
                limit,
            })),
        }
    }

    /// An empty buffer of at least `capacity` bytes: the smallest spare that
    /// is large enough and not more than twice as large, or a new one.
    pub(crate) fn take(&self, capacity: usize) -> Vec<u8> {
        let mut spares = self.lock();
        let best = spares
            .buffers
            .iter()
            .enumerate()
            // Newest first: of equal sizes, the one last touched.
            .rev()
            .filter(|(_, buffer)| {
                buffer.capacity() >= capacity && buffer.capacity() / 2 <= capacity
            })
            .min_by_key(|(_, buffer)| buffer.capacity())
            .map(|(i, _)| i);
        if let Some(buffer) = best.and_then(|i| spares.buffers.remove(i)) {
            spares.bytes -= buffer.capacity();
            return buffer;
        }
        drop(spares);
        Vec::with_capacity(capacity.next_multiple_of(CAPACITY_STEP))
    }

    /// `buffer[range]` as `Bytes` whose buffer comes back to this pool when
    /// the last of its views drops.
    pub(crate) fn freeze(&self, buffer: Vec<u8>, start: usize) -> Bytes {
        Bytes::from_owner(Lent {
            buffer,
            pool: self.clone(),
        })
        .slice(start..)
    }

    fn give_back(&self, mut buffer: Vec<u8>) {
        buffer.clear();
        let mut spares = self.lock();
        if buffer.capacity() > spares.limit {
            return;
        }
        while spares.bytes + buffer.capacity() > spares.limit {
            match spares.buffers.pop_front() {
                Some(oldest) => spares.bytes -= oldest.capacity(),
                None => break,
            }
        }
        spares.bytes += buffer.capacity();
        spares.buffers.push_back(buffer);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Spares> {
        // The spares are consistent between any two statements that touch
        // them; a panic elsewhere leaves nothing half done.
        self.spares.lock().unwrap_or_else(PoisonError::into_inner)
    }

    #[cfg(test)]
    fn spare_bytes(&self) -> usize {
        self.lock().bytes
    }
}

/// A pooled buffer while `Bytes` views of it live.
struct Lent {
    buffer: Vec<u8>,
    pool: BodyPool,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        &self.buffer
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.buffer));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_body_lends_its_pages_to_the_next() {
        let pool = BodyPool::new(8 << 20);
        let mut buffer = pool.take(200_000);
        buffer.extend_from_slice(&[7; 200_000]);
        let address = buffer.as_ptr();
        let body = pool.freeze(buffer, 100);
        let view = body.slice(10..20);
        assert_eq!(body.len(), 199_900);
        drop(body);
        assert_eq!(pool.spare_bytes(), 0, "a view still holds the buffer");
        assert_eq!(&view[..], &[7; 10]);
        drop(view);
        assert!(pool.spare_bytes() >= 200_000);
        let again = pool.take(190_000);
        assert_eq!(again.as_ptr(), address);
        assert!(again.is_empty());
        assert_eq!(pool.spare_bytes(), 0);
    }

    #[test]
    fn a_spare_far_larger_than_asked_is_left_for_larger_bodies() {
        let pool = BodyPool::new(8 << 20);
        drop(pool.freeze(pool.take(4 << 20), 0));
        let small = pool.take(100_000);
        assert!(small.capacity() < 1 << 20);
        assert!(pool.spare_bytes() >= 4 << 20);
    }

    #[test]
    fn spares_stay_under_the_limit_oldest_freed_first() {
        let limit = 1 << 20;
        let pool = BodyPool::new(limit);
        let buffers: Vec<_> = (0..6).map(|_| pool.take(300_000)).collect();
        let newest = buffers[5].as_ptr();
        for buffer in buffers {
            drop(pool.freeze(buffer, 0));
            assert!(pool.spare_bytes() <= limit);
        }
        let reused = pool.take(300_000);
        assert_eq!(reused.as_ptr(), newest);
        drop(reused);
        drop(pool.freeze(pool.take(2 << 20), 0));
        assert!(pool.spare_bytes() <= limit);
    }

    #[test]
    fn a_pool_of_no_bytes_keeps_nothing() {
        let pool = BodyPool::new(0);
        drop(pool.freeze(pool.take(100_000), 0));
        assert_eq!(pool.spare_bytes(), 0);
    }
}
