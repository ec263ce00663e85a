//! The journal file: a ring of preallocated, already written blocks where a
//! commit round's small ranges become durable with one write and one
//! fdatasync, instead of a writeback of every file they grew.
//!
//! Flushing a file that grew costs a metadata commit of its new size and
//! blocks; a round of many appended files costs one per file, even under a
//! single `syncfs`. Overwriting blocks that are already allocated and written
//! changes no metadata, so its fdatasync is a data write and a cache flush.
//! The ranges' manifest entries point into this file (position, length,
//! CRC-32C); the files themselves are flushed later, in the background, and
//! only then are their entries dropped and their space here reused.
//!
//! Positions count up across the ring's laps; the file offset is the position
//! modulo the capacity. A round's bytes are one contiguous region: one that
//! would cross the end of the file starts at the beginning of the next lap.
//!
//! A round's region is reserved first ([`JournalFile::reserve`]): where each
//! range goes and its CRC are known before a byte is written, so the round's
//! manifest entries can be written while its bytes are ([`RoundWrite`]). An
//! entry whose bytes did not make it (a crash between the two) fails its CRC
//! at the replay, which tells it from one that did.

use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use flight_server::checksum::crc32c;
use manifest_db::JournalBytes;

/// Size of the journal file: enough for the ranges of the rounds between
/// two background flushes, with room for one flush running late.
pub(crate) const JOURNAL_FILE_BYTES: u64 = 64 << 20;

/// File name of the journal, in the sink's state directory.
pub(crate) const JOURNAL_FILE_NAME: &str = "tailflight-journal.ring";

pub(crate) struct JournalFile {
    file: Arc<File>,
    path: PathBuf,
    capacity: u64,
    /// Position where the next round's bytes go.
    head: u64,
    /// Oldest position still referenced by a manifest entry.
    tail: Arc<AtomicU64>,
}

/// Lets the background flush give space back once the entries using it are
/// dropped from the manifest.
#[derive(Clone)]
pub(crate) struct JournalSpace(Arc<AtomicU64>);

impl JournalSpace {
    /// Everything written before `end` may be overwritten.
    pub fn release_to(&self, end: u64) {
        self.0.fetch_max(end, Ordering::AcqRel);
    }
}

impl JournalFile {
    /// Opens the journal file at `path`, creating it and writing every block
    /// of it once if it is new or shorter than `capacity`.
    pub fn open(path: &Path, capacity: u64) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let len = file.metadata()?.len();
        if len < capacity {
            // Zeros written, not fallocated: an unwritten extent would turn
            // each first overwrite into a metadata change again.
            let zeros = vec![0u8; 1 << 20];
            let mut at = len;
            while at < capacity {
                let n = (capacity - at).min(zeros.len() as u64) as usize;
                file.write_all_at(&zeros[..n], at)?;
                at += n as u64;
            }
            file.sync_all()?;
            if let Some(dir) = path.parent() {
                File::open(dir)?.sync_all()?;
            }
        }
        Ok(Self {
            file: Arc::new(file),
            path: path.to_path_buf(),
            capacity,
            head: 0,
            tail: Arc::new(AtomicU64::new(0)),
        })
    }

    pub fn space(&self) -> JournalSpace {
        JournalSpace(self.tail.clone())
    }

    /// Where `len` bytes would go, if the ring has room for them now.
    fn place(&self, len: u64) -> Option<u64> {
        if len == 0 || len > self.capacity {
            return None;
        }
        let offset = self.head % self.capacity;
        let start = if offset + len > self.capacity {
            self.head + (self.capacity - offset)
        } else {
            self.head
        };
        let tail = self.tail.load(Ordering::Acquire);
        (start + len - tail <= self.capacity).then_some(start)
    }

    /// Whether a round of `len` bytes fits now (space only grows until the
    /// next [`Self::reserve`]).
    pub fn has_room(&self, len: u64) -> bool {
        self.place(len).is_some()
    }

    /// Reserves a region for `pieces`, back to back. Returns where each piece
    /// will be (with its CRC), the position after the region (to release
    /// later), and the write that puts them there. Rounds reserve and write
    /// one at a time: the next reservation follows this one.
    pub fn reserve(
        &mut self,
        pieces: &[&[u8]],
    ) -> io::Result<(Vec<JournalBytes>, u64, RoundWrite)> {
        let len: u64 = pieces.iter().map(|p| p.len() as u64).sum();
        let start = self.place(len).ok_or_else(|| {
            io::Error::other(format!(
                "no room for {len} bytes in the journal file {}",
                self.path.display()
            ))
        })?;
        let offset = start % self.capacity;
        let mut refs = Vec::with_capacity(pieces.len());
        let mut position = offset;
        for piece in pieces {
            refs.push(JournalBytes::InFile {
                position,
                len: piece.len() as u32,
                crc32c: crc32c(piece),
            });
            position += piece.len() as u64;
        }
        self.head = start + len;
        let write = RoundWrite {
            file: self.file.clone(),
            path: self.path.clone(),
            offset,
        };
        Ok((refs, self.head, write))
    }

    /// Reserves a region for `pieces` and writes them there durably.
    #[cfg(test)]
    pub fn write(&mut self, pieces: &[&[u8]]) -> io::Result<(Vec<JournalBytes>, u64)> {
        let (refs, end, write) = self.reserve(pieces)?;
        write.write_durably(pieces)?;
        Ok((refs, end))
    }
}

/// The write of one reserved round: its pieces, in the order reserved.
pub(crate) struct RoundWrite {
    file: Arc<File>,
    path: PathBuf,
    offset: u64,
}

impl RoundWrite {
    /// Writes the round's region and makes it durable (write, fdatasync).
    pub fn write_durably(&self, pieces: &[&[u8]]) -> io::Result<()> {
        write_all_vectored_at(&self.file, pieces, self.offset)?;
        self.file.sync_data()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Most buffers one `pwritev` takes (Linux's `IOV_MAX`).
const MAX_IOVECS: usize = 1024;

/// Writes `pieces` back to back from `offset`, straight from where they are:
/// `pwritev` calls until all is written (one may stop short).
fn write_all_vectored_at(file: &File, pieces: &[&[u8]], mut offset: u64) -> io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = pieces
        .iter()
        .filter(|piece| !piece.is_empty())
        .map(|piece| IoSlice::new(piece))
        .collect();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        let batch = rest.len().min(MAX_IOVECS);
        let written = match rustix::io::pwritev(file, &rest[..batch], offset) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(written) => written,
            Err(rustix::io::Errno::INTR) => continue,
            Err(errno) => return Err(errno.into()),
        };
        offset += written as u64;
        IoSlice::advance_slices(&mut rest, written);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::scratch;

    fn position(r: &JournalBytes) -> u64 {
        match r {
            JournalBytes::InFile { position, .. } => *position,
            JournalBytes::Inline(_) => panic!("inline"),
        }
    }

    /// More pieces than one pwritev takes, some empty: every piece lands
    /// where its reference says, with its CRC.
    #[test]
    fn a_round_of_many_pieces_is_written_in_place() {
        let dir = scratch("journal-many-pieces");
        let path = dir.join(JOURNAL_FILE_NAME);
        let mut journal = JournalFile::open(&path, 1 << 20).unwrap();
        let pieces: Vec<Vec<u8>> = (0..3000u32)
            .map(|i| vec![(i % 251) as u8; (i % 7) as usize * 13])
            .collect();
        let borrowed: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
        let (refs, end) = journal.write(&borrowed).unwrap();
        let total: usize = pieces.iter().map(Vec::len).sum();
        assert_eq!(end, total as u64);
        let file = File::open(&path).unwrap();
        for (piece, reference) in pieces.iter().zip(&refs) {
            let JournalBytes::InFile {
                position,
                len,
                crc32c: crc,
            } = *reference
            else {
                unreachable!()
            };
            let mut bytes = vec![0u8; len as usize];
            file.read_exact_at(&mut bytes, position).unwrap();
            assert_eq!(&bytes, piece);
            assert_eq!(crc32c(&bytes), crc);
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn rounds_wrap_to_the_start_and_wait_for_released_space() {
        let dir = scratch("journal-ring");
        let path = dir.join(JOURNAL_FILE_NAME);
        let mut journal = JournalFile::open(&path, 100).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 100);
        let space = journal.space();

        let (refs, end) = journal
            .write(&[b"0123456789", b"abcdefghijklmnopqrst"])
            .unwrap();
        assert_eq!(refs.iter().map(position).collect::<Vec<_>>(), [0, 10]);
        assert_eq!(end, 30);
        let (_, end) = journal.write(&[&[7u8; 60]]).unwrap();
        assert_eq!(end, 90);
        // 20 bytes do not fit in the last 10; the next lap's start is still in use.
        assert!(!journal.has_room(20));
        assert!(journal.write(&[&[1u8; 20]]).is_err());
        space.release_to(30);
        let (refs, end) = journal.write(&[&[1u8; 20]]).unwrap();
        assert_eq!(refs.iter().map(position).collect::<Vec<_>>(), [0]);
        assert_eq!(end, 120);
        assert!(!journal.has_room(101));

        let JournalBytes::InFile {
            position,
            len,
            crc32c: crc,
        } = refs[0]
        else {
            unreachable!()
        };
        let mut bytes = vec![0u8; len as usize];
        File::open(&path)
            .unwrap()
            .read_exact_at(&mut bytes, position)
            .unwrap();
        assert_eq!(bytes, [1u8; 20]);
        assert_eq!(crc32c(&bytes), crc);
        let _ = std::fs::remove_dir_all(dir);
    }
}
