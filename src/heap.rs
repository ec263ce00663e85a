//! The process's global allocator, and its heap by its own count: every
//! allocation through it (mimalloc, or the C library's with the
//! `system-allocator` feature) counted in and out, so `status` can tell the
//! bytes the program holds from what the allocator keeps around them
//! (RSS). Memory allocated in C and C++ (RocksDB, librdkafka) is not
//! counted here; the sink reports RocksDB's own in `manifest_memory_bytes`.
//! Beside it, the resident memory the kernel counts for the process, which
//! is what an allocator that keeps pages makes grow. And the sink's refusal
//! of transparent huge pages (`refuse_transparent_huge_pages`).

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Wraps an allocator and counts the bytes live through it.
pub struct Counting<A> {
    inner: A,
    live: AtomicUsize,
    peak: AtomicUsize,
}

impl<A> Counting<A> {
    pub const fn new(inner: A) -> Self {
        Self {
            inner,
            live: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    fn added(&self, bytes: usize) {
        let now = self.live.fetch_add(bytes, Ordering::Relaxed) + bytes;
        // Read first: the common case (no new peak) writes nothing shared.
        if now > self.peak.load(Ordering::Relaxed) {
            self.peak.fetch_max(now, Ordering::Relaxed);
        }
    }

    fn removed(&self, bytes: usize) {
        self.live.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Bytes live now, and the most live at once since the start.
    pub fn figures(&self) -> HeapFigures {
        HeapFigures {
            live_bytes: self.live.load(Ordering::Relaxed) as u64,
            peak_bytes: self.peak.load(Ordering::Relaxed) as u64,
        }
    }
}

/// The heap as `status` shows it.
#[derive(Debug, serde::Serialize)]
pub struct HeapFigures {
    pub live_bytes: u64,
    pub peak_bytes: u64,
}

// SAFETY: every call is passed to `inner` unchanged; the counters only
// observe the sizes.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let block = unsafe { self.inner.alloc(layout) };
        if !block.is_null() {
            self.added(layout.size());
        }
        block
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let block = unsafe { self.inner.alloc_zeroed(layout) };
        if !block.is_null() {
            self.added(layout.size());
        }
        block
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.dealloc(block, layout) };
        self.removed(layout.size());
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let moved = unsafe { self.inner.realloc(block, layout, new_size) };
        if !moved.is_null() {
            self.removed(layout.size());
            self.added(new_size);
        }
        moved
    }
}

/// The process's resident memory as the kernel counts it: all of it, and
/// the anonymous part (heaps of every allocator, stacks), where memory an
/// allocator keeps for itself shows.
#[derive(Debug, Default, serde::Serialize)]
pub struct ResidentFigures {
    pub resident_bytes: u64,
    pub anonymous_bytes: u64,
}

/// Reads `/proc/self/status`; zeros where it cannot be read (not Linux).
pub fn resident_figures() -> ResidentFigures {
    let Ok(text) = std::fs::read_to_string("/proc/self/status") else {
        return ResidentFigures::default();
    };
    let kib = |field: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(field))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map_or(0, |kib| kib * 1024)
    };
    ResidentFigures {
        resident_bytes: kib("VmRSS:"),
        anonymous_bytes: kib("RssAnon:"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusing_huge_pages_turns_them_off_for_the_process() {
        refuse_transparent_huge_pages().unwrap();
        let unused: libc::c_ulong = 0;
        // SAFETY: PR_GET_THP_DISABLE takes integers only.
        let refused =
            unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, unused, unused, unused, unused) };
        assert_eq!(refused, 1);
    }

    #[test]
    fn the_kernel_counts_this_process_resident() {
        let figures = resident_figures();
        assert!(figures.anonymous_bytes > 0);
        assert!(figures.resident_bytes >= figures.anonymous_bytes);
    }
}

/// Batches are megabytes and short-lived: glibc's malloc hands such blocks
/// back to the kernel and faults fresh zeroed pages in for the next batch,
/// a measurable share of each process's CPU at full rate. mimalloc keeps them.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: Counting<mimalloc::MiMalloc> = Counting::new(mimalloc::MiMalloc);
#[cfg(feature = "system-allocator")]
#[global_allocator]
static ALLOCATOR: Counting<std::alloc::System> = Counting::new(std::alloc::System);

/// Keeps the kernel from backing this process's memory with transparent
/// huge pages from now on (pages it has already are left as they are).
/// mimalloc asks for them (`MADV_HUGEPAGE`) on its memory, and a fault on
/// one zeroes 2 MiB at once: when a hundred new files reached a sink that
/// had just started, that zeroing took nearly half its CPU, and the writes
/// of its first second waited up to 300 ms for their commits.
pub fn refuse_transparent_huge_pages() -> std::io::Result<()> {
    // prctl is variadic and the kernel reads unsigned longs, refusing
    // non-zero garbage in the unused ones: pass them at that width.
    let (refuse, unused): (libc::c_ulong, libc::c_ulong) = (1, 0);
    // SAFETY: PR_SET_THP_DISABLE takes integers only and touches no memory.
    let answer = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, refuse, unused, unused, unused) };
    match answer {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// The heap's figures by the global allocator's count.
pub fn figures() -> HeapFigures {
    ALLOCATOR.figures()
}
