//! The floor's messages, as both ends and both transports see them: a
//! message carries the ranges one read of events found, each after a small
//! header, and a landed message keeps its bytes with where each range is.

use anyhow::{Result, ensure};
use bytes::Bytes;
use std::time::{SystemTime, UNIX_EPOCH};

/// Most bytes read from one file for one message: a file far behind is
/// caught up over several messages instead of one unbounded one.
pub(super) const MAX_READ_PER_FILE: u64 = 4 << 20;

/// A message stops taking files past this size; the rest go in the next.
pub(super) const MESSAGE_TARGET: usize = 8 << 20;

/// Largest message [`super::land`] accepts: any message fits its ring.
pub(super) const MAX_MESSAGE: usize = MESSAGE_TARGET + MAX_READ_PER_FILE as usize + (64 << 10);

/// One range of a received message: where its bytes are in the message.
#[derive(Debug)]
pub(super) struct Range {
    pub(super) name: String,
    pub(super) offset: u64,
    pub(super) data: std::ops::Range<usize>,
    /// The CRC32C the shipper sent with it, if the message carries them.
    pub(super) crc: Option<u32>,
}

/// Whether a message's ranges carry their CRC32C, and what to do with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Crcs {
    /// None is carried (the bare TCP floor).
    Absent,
    /// Carried, and read as they are (the shipper, which made them).
    Carried,
    /// Carried, and each range's bytes checked against theirs.
    Checked,
}

/// A message as received, with when it was.
pub(super) struct Arrived {
    pub(super) bytes: Bytes,
    pub(super) ranges: Vec<Range>,
    pub(super) received_ns: u128,
}

/// The ranges of one message: name length (u16 LE), name, offset (u64 LE),
/// length (u32 LE), unless `crcs` is absent the bytes' CRC32C (u32 LE),
/// bytes; repeated.
pub(super) fn parse(bytes: &[u8], crcs: Crcs) -> Result<Vec<Range>> {
    let mut ranges = Vec::new();
    let mut at = 0usize;
    let mut take = |n: usize| -> Result<std::ops::Range<usize>> {
        ensure!(
            bytes.len() - at >= n,
            "a message ends inside a range (at byte {at} of {})",
            bytes.len()
        );
        at += n;
        Ok(at - n..at)
    };
    let mut rest = bytes.len();
    while rest > 0 {
        let name_len = u16::from_le_bytes(bytes[take(2)?].try_into()?) as usize;
        let name = String::from_utf8_lossy(&bytes[take(name_len)?]).into_owned();
        let offset = u64::from_le_bytes(bytes[take(8)?].try_into()?);
        let len = u32::from_le_bytes(bytes[take(4)?].try_into()?) as usize;
        let crc = match crcs {
            Crcs::Carried | Crcs::Checked => Some(u32::from_le_bytes(bytes[take(4)?].try_into()?)),
            Crcs::Absent => None,
        };
        let data = take(len)?;
        if let (Some(crc), Crcs::Checked) = (crc, crcs) {
            ensure!(
                crc_fast::crc32_iscsi(&bytes[data.clone()]) == crc,
                "the shipper's range of {name} at offset {offset} ({len} bytes) fails its CRC32C"
            );
        }
        rest = bytes.len() - data.end;
        ranges.push(Range {
            name,
            offset,
            data,
            crc,
        });
    }
    Ok(ranges)
}

pub(super) fn unix_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}
