//! The CRC-64/NVME of the bytes this process wrote into a file, kept up as
//! ranges are placed, so that sealing the file need not read it back.
//!
//! Ranges of one file mostly arrive in order, each continuing the run before
//! it: its checksum is computed once, from the bytes already in memory.
//! Reading a sealed file back instead costs a second pass over the disk and,
//! for files written past the page cache, new page-cache memory for all of it.
//!
//! Out-of-order ranges start runs of their own, joined by CRC combination
//! when the gap between them fills. Anything that breaks the picture (an
//! overlap, too many runs, a slot loaded with bytes already placed by an
//! earlier process) makes the state `Unknown`, and the seal reads the file.
//! So does a path that no longer leads to the file the bytes were written to
//! (checked at the seal).

use std::collections::BTreeMap;

use flight_server::checksum;

/// Runs kept per file before giving up on it: a sender whose ranges arrive
/// this scattered has its file read back at the seal instead.
const MAX_RUNS: usize = 64;

/// The bytes taken in, or their checksum when it is known already.
#[derive(Clone, Copy)]
enum Checksum<'a> {
    Of(&'a [u8]),
    Known(u64),
}

#[derive(Debug)]
pub(crate) enum WrittenCrc {
    /// Contiguous runs of written bytes by start offset: (end, checksum).
    Tracking(BTreeMap<u64, (u64, u64)>),
    Unknown,
}

impl WrittenCrc {
    /// State for a file of which this process will write every byte
    /// (`from_start`), or whose earlier bytes it cannot vouch for.
    pub fn new(from_start: bool) -> Self {
        if from_start {
            Self::Tracking(BTreeMap::new())
        } else {
            Self::Unknown
        }
    }

    /// Takes in `bytes`, written at `offset`.
    pub fn add(&mut self, offset: u64, bytes: &[u8]) {
        self.take_in(offset, bytes.len() as u64, Checksum::Of(bytes));
    }

    /// Takes in `len` bytes written at `offset` whose CRC-64/NVME is `crc`.
    pub fn add_checksummed(&mut self, offset: u64, len: u64, crc: u64) {
        self.take_in(offset, len, Checksum::Known(crc));
    }

    fn take_in(&mut self, offset: u64, len: u64, checksum: Checksum<'_>) {
        let Self::Tracking(runs) = self else {
            return;
        };
        if len == 0 {
            return;
        }
        let end = offset + len;
        let before = runs.range(..=offset).next_back().map(|(&s, &r)| (s, r));
        let after = runs.range(offset..).next().map(|(&s, &r)| (s, r));
        let overlaps = before.is_some_and(|(_, (run_end, _))| run_end > offset)
            || after.is_some_and(|(start, _)| start < end);
        if overlaps {
            // The same bytes written twice: this process's bookkeeping went
            // somewhere this state does not follow.
            *self = Self::Unknown;
            return;
        }
        let (start, crc) = match (before, checksum) {
            (Some((start, (run_end, crc))), Checksum::Of(bytes)) if run_end == offset => {
                (start, checksum::crc64nvme_append(crc, bytes))
            }
            (Some((start, (run_end, crc))), Checksum::Known(known)) if run_end == offset => {
                (start, checksum::crc64nvme_combine(crc, known, len))
            }
            (_, Checksum::Of(bytes)) => (offset, checksum::crc64nvme(bytes)),
            (_, Checksum::Known(known)) => (offset, known),
        };
        let (end, crc) = match after {
            Some((next, (next_end, next_crc))) if next == end => {
                runs.remove(&next);
                (
                    next_end,
                    checksum::crc64nvme_combine(crc, next_crc, next_end - next),
                )
            }
            _ => (end, crc),
        };
        runs.insert(start, (end, crc));
        if runs.len() > MAX_RUNS {
            *self = Self::Unknown;
        }
    }

    /// The checksum of bytes `0..size`, if this process wrote exactly those.
    pub fn of_whole(&self, size: u64) -> Option<u64> {
        match self {
            Self::Tracking(runs) if size == 0 && runs.is_empty() => Some(checksum::crc64nvme(&[])),
            Self::Tracking(runs) if runs.len() == 1 => match runs.first_key_value() {
                Some((&0, &(end, crc))) if end == size => Some(crc),
                _ => None,
            },
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize) -> Vec<u8> {
        (0..len as u32).map(|i| (i * 131 + i / 509) as u8).collect()
    }

    #[test]
    fn in_order_ranges_give_the_checksum_of_the_whole() {
        let bytes = data(100_000);
        let mut crc = WrittenCrc::new(true);
        for (i, piece) in bytes.chunks(4093).enumerate() {
            crc.add(i as u64 * 4093, piece);
        }
        assert_eq!(crc.of_whole(100_000), Some(checksum::crc64nvme(&bytes)));
        assert_eq!(crc.of_whole(99_999), None);
    }

    /// Out-of-order ranges join as the gaps between them fill, whether
    /// their checksums come with them (rows checksummed at validation) or
    /// are computed here.
    #[test]
    fn out_of_order_ranges_join_when_the_gaps_fill() {
        let bytes = data(300_000);
        let pieces = [
            (150_000, 300_000),
            (0, 10),
            (70_000, 100_000),
            (10, 70_000),
            (100_000, 150_000),
        ];
        let ways: [fn(usize) -> bool; 2] = [|_| false, |i| i % 2 == 0];
        for known in ways {
            let mut crc = WrittenCrc::new(true);
            for (i, &(s, e)) in pieces.iter().enumerate() {
                let piece = &bytes[s..e];
                if known(i) {
                    crc.add_checksummed(s as u64, piece.len() as u64, checksum::crc64nvme(piece));
                } else {
                    crc.add(s as u64, piece);
                }
                let done = i == pieces.len() - 1;
                assert_eq!(crc.of_whole(300_000).is_some(), done, "after {i}");
            }
            assert_eq!(crc.of_whole(300_000), Some(checksum::crc64nvme(&bytes)));
        }
    }

    #[test]
    fn overlaps_scatter_and_unknown_starts_give_up() {
        let bytes = data(10_000);
        let mut crc = WrittenCrc::new(true);
        crc.add(0, &bytes[..6000]);
        crc.add(5000, &bytes[5000..]);
        assert!(matches!(crc, WrittenCrc::Unknown));
        crc.add(0, &bytes);
        assert_eq!(crc.of_whole(10_000), None);

        let mut overlapping = WrittenCrc::new(true);
        overlapping.add(0, &bytes[..10]);
        overlapping.add_checksummed(5, 10, checksum::crc64nvme(&bytes[5..15]));
        assert!(matches!(overlapping, WrittenCrc::Unknown));

        let mut scattered = WrittenCrc::new(true);
        for i in 0..=MAX_RUNS as u64 {
            scattered.add(i * 100, &bytes[..10]);
        }
        assert!(matches!(scattered, WrittenCrc::Unknown));

        let mut loaded = WrittenCrc::new(false);
        loaded.add(0, &bytes);
        assert_eq!(loaded.of_whole(10_000), None);

        assert_eq!(
            WrittenCrc::new(true).of_whole(0),
            Some(checksum::crc64nvme(&[]))
        );
    }
}
