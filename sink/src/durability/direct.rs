//! Writes the block-aligned middle of large ranges with O_DIRECT, past the
//! page cache.
//!
//! Through the page cache every byte is first copied into page-cache
//! memory, then written back from it. Where new memory is expensive (a VM
//! whose host backs guest pages lazily: the benchmark's ceilings measure
//! both rates) that copy, not the disk, bounds bulk throughput, and it
//! costs CPU everywhere. A range's unaligned head and tail still go
//! through the page cache; only whole blocks in between are written
//! directly: from where they are received when the receive path laid them
//! out aligned, else through a reused aligned buffer. Pages written one way are never
//! written the other way: a range's middle blocks belong to it alone, and
//! the blocks it shares with its neighbours are its head and tail.
//!
//! Durability is unchanged: the commit round's fdatasync (or syncfs) of the
//! file makes the new size and block map durable and flushes the device's
//! write cache, which the directly written blocks may still sit in.
//! A filesystem that refuses O_DIRECT is written through the page cache as
//! before.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Size of one direct write, and of each aligned buffer.
const CHUNK: usize = 1 << 20;

/// Aligned buffers one sink uses at most; a writer finding none free
/// writes through the page cache. Bounds their memory at 8 MiB.
const MAX_BUFFERS: usize = 8;

/// Alignment of offsets, lengths and memory for direct writes: 4 KiB, or
/// the page size where pages are larger. A block written directly then
/// never shares a page with bytes written through the page cache, so no
/// dirty cached page can later overwrite it. 4 KiB covers the logical
/// block sizes of the disks and filesystems tailflight targets; a device
/// that wants more refuses with EINVAL, and the file falls back.
pub(crate) fn alignment() -> u64 {
    static ALIGNMENT: OnceLock<u64> = OnceLock::new();
    *ALIGNMENT.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        u64::try_from(page).unwrap_or(0).max(4096)
    })
}

/// The smallest aligned middle written directly by default. Half the
/// watcher's largest row (1 MiB), so that rows of a file whose end is not
/// block-aligned qualify too; 64 KiB files written directly were slower
/// than through the page cache (each is its own synchronous device write).
const DEFAULT_MIN: u64 = 512 << 10;

/// `--direct-min auto`: 512 KiB on the local filesystems that have a disk
/// (those of [`crate::durability::flush::LOCAL_FILESYSTEMS`] but tmpfs), whose O_DIRECT
/// is a plain device write; never elsewhere. On network and parallel
/// filesystems a direct write may be a synchronous round trip per chunk,
/// slower than the client's write-behind.
pub(crate) fn default_min(root: &impl std::os::fd::AsFd) -> u64 {
    let Ok(stat) = rustix::fs::fstatfs(root) else {
        return 0;
    };
    // f_type is i64 here but narrower or unsigned on other targets.
    #[allow(clippy::unnecessary_cast)]
    let filesystem = stat.f_type as i64;
    let on_disk = crate::durability::flush::LOCAL_FILESYSTEMS
        .iter()
        .any(|&(magic, name)| magic == filesystem && name != "tmpfs");
    if on_disk { DEFAULT_MIN } else { 0 }
}

/// A file's descriptor for direct writes, opened the first time one is due.
#[derive(Default)]
pub(crate) enum DirectFile {
    #[default]
    NotOpened,
    Open(Arc<File>),
    /// The filesystem refused O_DIRECT for this file: write through the
    /// page cache.
    Refused,
}

/// The aligned middle of `len` bytes at `offset`, as (start, end) in file
/// offsets, if it holds at least `min` bytes.
pub(crate) fn aligned_middle(offset: u64, len: u64, min: u64) -> Option<(u64, u64)> {
    let align = alignment();
    let end = offset.checked_add(len)?;
    let start = offset.checked_next_multiple_of(align)?;
    let stop = end - end % align;
    (stop > start && stop - start >= min.max(align)).then_some((start, stop))
}

/// What became of an attempt to open a file for direct writes.
pub(crate) enum Reopened {
    Open(File),
    /// The filesystem refuses O_DIRECT for it.
    Refused,
    /// Failed for now (no descriptor left, ...): try again later.
    NotNow,
}

/// Opens a second descriptor on the same open file, with O_DIRECT. Going
/// through the descriptor's own /proc entry reaches the very inode already
/// open, so no path is looked up again.
pub(crate) fn reopen_direct(file: &File, dest: &str) -> Reopened {
    static WARNED: AtomicBool = AtomicBool::new(false);
    let path = format!("/proc/self/fd/{}", file.as_raw_fd());
    let opened = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
        .open(path);
    match opened {
        Ok(direct) => Reopened::Open(direct),
        Err(e) => {
            let transient = matches!(
                e.raw_os_error(),
                Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM)
            );
            let refused = matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP));
            if refused {
                tracing::debug!(
                    dest,
                    "the filesystem refuses O_DIRECT; writing through the page cache"
                );
            } else if !WARNED.swap(true, Ordering::Relaxed) {
                tracing::warn!(dest, error = %e, "cannot open a file for direct writes (through /proc/self/fd); writing through the page cache");
            }
            if transient {
                Reopened::NotNow
            } else {
                Reopened::Refused
            }
        }
    }
}

/// Page-aligned memory for direct writes.
struct AlignedBuffer {
    ptr: std::ptr::NonNull<u8>,
}

// SAFETY: the buffer is plain bytes, reached only through `&mut self` by
// whoever owns it; nothing ties it to the thread that allocated it.
unsafe impl Send for AlignedBuffer {}

impl AlignedBuffer {
    fn layout() -> std::alloc::Layout {
        // CHUNK is a power of two and a multiple of any page size in use.
        std::alloc::Layout::from_size_align(CHUNK, alignment() as usize).expect("valid layout")
    }

    fn new() -> Self {
        let layout = Self::layout();
        // SAFETY: the layout has a non-zero size. Zeroed, so the slice
        // below only ever covers initialised bytes.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Self { ptr }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` holds CHUNK initialised bytes, allocated by `new`,
        // uniquely borrowed through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), CHUNK) }
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout()) }
    }
}

/// The aligned buffers of one sink: made on demand, kept for reuse (new
/// memory is what direct writes avoid), at most [`MAX_BUFFERS`]; and the
/// bytes written directly, with those of them that needed a buffer.
#[derive(Default)]
pub(crate) struct Buffers {
    pool: Mutex<BufferPool>,
    /// Direct writes from received memory under way: as many at most as
    /// staged ones may be (one per buffer), so that placement threads do
    /// not all wait on the device at once.
    unstaged: AtomicUsize,
    written: AtomicU64,
    staged: AtomicU64,
}

/// Bytes written with O_DIRECT since the start, and those of them copied
/// into an aligned buffer first (their memory was not aligned).
#[derive(Clone, Copy, Debug, Default)]
pub struct DirectFigures {
    pub written_bytes: u64,
    pub staged_bytes: u64,
}

#[derive(Default)]
struct BufferPool {
    free: Vec<AlignedBuffer>,
    made: usize,
}

/// A direct write that failed: where, and why.
pub(crate) struct DirectWriteError {
    pub offset: u64,
    pub len: usize,
    pub error: std::io::Error,
}

impl Buffers {
    fn take(&self) -> Option<AlignedBuffer> {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(buffer) = pool.free.pop() {
            return Some(buffer);
        }
        if pool.made < MAX_BUFFERS {
            pool.made += 1;
            return Some(AlignedBuffer::new());
        }
        None
    }

    fn give_back(&self, buffer: AlignedBuffer) {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        pool.free.push(buffer);
    }

    /// Writes `bytes` at `offset` (both aligned) with the direct
    /// descriptor: from where they are if their memory is aligned too (the
    /// DoPut receive path lays ranges out so), else a chunk at a time
    /// through an aligned buffer, so the memory the kernel reads is the
    /// same few pages every time. Ok(false): as many direct writes as there
    /// are buffers are under way; nothing was written.
    pub(crate) fn write(
        &self,
        direct: &File,
        bytes: &[u8],
        offset: u64,
    ) -> Result<bool, DirectWriteError> {
        debug_assert!(
            offset.is_multiple_of(alignment()) && (bytes.len() as u64).is_multiple_of(alignment())
        );
        if (bytes.as_ptr() as u64).is_multiple_of(alignment()) {
            let taken =
                self.unstaged
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |running| {
                        (running < MAX_BUFFERS).then_some(running + 1)
                    });
            if taken.is_err() {
                return Ok(false);
            }
            let result = write_chunks(direct, bytes, offset, None);
            self.unstaged.fetch_sub(1, Ordering::AcqRel);
            result?;
            self.written
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            return Ok(true);
        }
        let Some(mut buffer) = self.take() else {
            return Ok(false);
        };
        let result = write_chunks(direct, bytes, offset, Some(&mut buffer));
        self.give_back(buffer);
        result?;
        self.written
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        self.staged.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(true)
    }

    pub(crate) fn figures(&self) -> DirectFigures {
        DirectFigures {
            written_bytes: self.written.load(Ordering::Relaxed),
            staged_bytes: self.staged.load(Ordering::Relaxed),
        }
    }
}

/// Writes `bytes` at `offset` a chunk at a time, each copied into `staging`
/// first if there is one.
fn write_chunks(
    direct: &File,
    bytes: &[u8],
    offset: u64,
    mut staging: Option<&mut AlignedBuffer>,
) -> Result<(), DirectWriteError> {
    for (i, chunk) in bytes.chunks(CHUNK).enumerate() {
        let memory = match staging.as_mut() {
            Some(buffer) => {
                let slice = &mut buffer.as_mut_slice()[..chunk.len()];
                slice.copy_from_slice(chunk);
                &*slice
            }
            None => chunk,
        };
        let at = offset + (i * CHUNK) as u64;
        direct
            .write_all_at(memory, at)
            .map_err(|error| DirectWriteError {
                offset: at,
                len: chunk.len(),
                error,
            })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_middle_is_whole_blocks_and_only_when_large_enough() {
        let a = alignment();
        assert_eq!(aligned_middle(0, 2 * a, a), Some((0, 2 * a)));
        assert_eq!(aligned_middle(1, 2 * a, a), Some((a, 2 * a)));
        assert_eq!(aligned_middle(100, 3 * a, a), Some((a, 3 * a)));
        assert_eq!(aligned_middle(100, 3 * a, 3 * a), None);
        assert_eq!(aligned_middle(a - 96, 200, 1), None);
        assert_eq!(aligned_middle(0, a - 1, 1), None);
        assert_eq!(aligned_middle(u64::MAX - 10, 5, 1), None);
        assert_eq!(aligned_middle(u64::MAX - 10, 50, 1), None);
    }

    #[test]
    fn buffers_are_bounded_and_reused() {
        let buffers = Buffers::default();
        let taken: Vec<_> = (0..MAX_BUFFERS).map(|_| buffers.take().unwrap()).collect();
        assert!(buffers.take().is_none(), "no more than MAX_BUFFERS at once");
        for buffer in taken {
            buffers.give_back(buffer);
        }
        assert!(buffers.take().is_some());
        assert_eq!(lock_pool(&buffers).made, MAX_BUFFERS);
    }

    fn lock_pool(buffers: &Buffers) -> std::sync::MutexGuard<'_, BufferPool> {
        buffers.pool.lock().unwrap()
    }

    /// Bytes already aligned in memory need no buffer: they are written
    /// even while every buffer is taken.
    #[test]
    fn aligned_memory_is_written_without_a_buffer() {
        let dir = crate::test_support::scratch("direct-aligned");
        let file = File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(dir.join("f"))
            .unwrap();
        let a = alignment() as usize;
        let mut memory = vec![0u8; 4 * a];
        let skip = memory.as_ptr().align_offset(a);
        let len = 2 * a;
        for (i, byte) in memory[skip..skip + len].iter_mut().enumerate() {
            *byte = (i % 253) as u8;
        }
        let bytes = &memory[skip..skip + len];
        let buffers = Buffers::default();
        let _taken: Vec<_> = (0..MAX_BUFFERS).map(|_| buffers.take().unwrap()).collect();
        match reopen_direct(&file, "f") {
            Reopened::Open(direct) => {
                assert!(matches!(buffers.write(&direct, bytes, a as u64), Ok(true)));
                let figures = buffers.figures();
                assert_eq!(
                    (figures.written_bytes, figures.staged_bytes),
                    (len as u64, 0)
                );
                let mut back = vec![0u8; len];
                file.read_exact_at(&mut back, a as u64).unwrap();
                assert!(back == bytes);
            }
            // This temp directory's filesystem refuses O_DIRECT.
            Reopened::Refused | Reopened::NotNow => {}
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn direct_writes_land_where_buffered_ones_would() {
        let dir = crate::test_support::scratch("direct-writes");
        let path = dir.join("f");
        let file = File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let data: Vec<u8> = (0..3 * CHUNK + 5000).map(|i| (i % 251) as u8).collect();
        let offset = 777u64;
        let (start, end) = aligned_middle(offset, data.len() as u64, 1).unwrap();
        let at = |o: u64| (o - offset) as usize;
        file.write_all_at(&data[..at(start)], offset).unwrap();
        match reopen_direct(&file, "f") {
            Reopened::Open(direct) => {
                let written = Buffers::default().write(&direct, &data[at(start)..at(end)], start);
                assert!(matches!(written, Ok(true)));
            }
            // This temp directory's filesystem refuses O_DIRECT.
            Reopened::Refused | Reopened::NotNow => {
                file.write_all_at(&data[at(start)..at(end)], start).unwrap()
            }
        }
        file.write_all_at(&data[at(end)..], end).unwrap();
        let mut back = vec![0u8; data.len()];
        file.read_exact_at(&mut back, offset).unwrap();
        assert!(back == data);
        assert_eq!(file.metadata().unwrap().len(), offset + data.len() as u64);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
