//! With `--checksums`: the checks the pipeline makes on every byte, made
//! by the copy too, so that a floor with end-to-end integrity can be told
//! from the bare copy. The sender sends each payload's CRC-32C (the watcher
//! checksums each row) and its file's CRC-64/NVME through the end of the
//! payload (the watcher's running seal digest); the receiver checks the
//! CRC-32C when the payload has arrived (as the sink checks each row) and
//! keeps each file's CRC-64/NVME of the bytes it wrote (as the sink keeps
//! the digest its seal compares), comparing it with the sender's every frame.
//! Both use flight-server's checksums, the pipeline's own.

use std::collections::HashMap;

use anyhow::{Result, ensure};
use flight_server::checksum::{crc32c, crc64nvme_append};

/// Bytes the checks add to a frame's header: the payload's CRC-32C (`u32`)
/// and its file's CRC-64/NVME through the payload (`u64`), little-endian.
pub const FIELDS: usize = 12;

/// Bytes the checks add to each frame's header when made (`checksums`).
pub fn header_bytes(checksums: bool) -> usize {
    if checksums { FIELDS } else { 0 }
}

/// Fills the checks into a frame read whole: its header, ending with
/// [`FIELDS`] bytes for them, is `frame[..head]` and its payload the rest,
/// the next bytes of the file whose running CRC-64/NVME is `file_crc`
/// (updated).
pub fn fill(frame: &mut [u8], head: usize, file_crc: &mut u64) {
    let (header, payload) = frame.split_at_mut(head);
    *file_crc = crc64nvme_append(*file_crc, payload);
    let fields = &mut header[head - FIELDS..];
    fields[..4].copy_from_slice(&crc32c(payload).to_le_bytes());
    fields[4..].copy_from_slice(&file_crc.to_le_bytes());
}

/// A connection's view of the files it receives: each one's CRC-64/NVME of
/// the bytes written so far. A file's frames come in order on one connection.
#[derive(Default)]
pub struct Receiver {
    files: HashMap<String, u64>,
}

impl Receiver {
    /// Checks a payload as it arrived, before it is written.
    pub fn arrived(
        payload: &[u8],
        fields: &[u8; FIELDS],
        what: impl std::fmt::Display,
    ) -> Result<()> {
        let sent = u32::from_le_bytes(fields[..4].try_into()?);
        let got = crc32c(payload);
        ensure!(
            got == sent,
            "{what}: CRC-32C {got:08x}, the sender's {sent:08x}"
        );
        Ok(())
    }

    /// Adds a written payload to its file's digest and compares the digest
    /// with the sender's.
    pub fn written(
        &mut self,
        name: &str,
        payload: &[u8],
        fields: &[u8; FIELDS],
        what: impl std::fmt::Display,
    ) -> Result<()> {
        let sent = u64::from_le_bytes(fields[4..].try_into()?);
        let crc = match self.files.get_mut(name) {
            Some(crc) => crc,
            None => self.files.entry(name.to_owned()).or_insert(0),
        };
        *crc = crc64nvme_append(*crc, payload);
        ensure!(
            *crc == sent,
            "{what}: the file's CRC-64/NVME is {crc:016x}, the sender's {sent:016x}"
        );
        Ok(())
    }
}
