//! Seals: a file's final size and digest, checked against the CRC of the
//! bytes as written or against the file read back, then recorded.

use flight_server::{Row, SealDigest, checksum};
use manifest_db::Sealed;

use super::sources::Source;
use super::{BatchWork, Placer, RowError, confine_error};
use crate::SinkError;
use crate::confine::Root;
use crate::state::{SlotState, lock};
use crate::written_crc::WrittenCrc;

impl Placer {
    pub(super) fn seal(
        &self,
        source: &Source,
        row: &Row<'_>,
        work: &mut BatchWork,
    ) -> Result<(), RowError> {
        let digest = row
            .digest
            .ok_or_else(|| RowError::Peer("a Seal row needs a digest".into()))?;
        // Only this seal is refused: other rows of the batch are unaffected.
        let kind = SealDigest::of_digest(digest).map_err(|e| RowError::Reject(e.to_string()))?;
        let size = row.offset;
        let slot = self.slot_or_create(source, row, work)?;
        let mut state = self.lock_written(&slot, work)?;
        if let Some(sealed) = state.record.sealed.clone() {
            let same = sealed.size == size
                && (sealed.digest == digest
                    || (SealDigest::of_digest(&sealed.digest).ok() != Some(kind)
                        && self
                            .settle_rename(source, &slot, &mut state, work)
                            .and_then(|()| self.reseal_matches(&state, size, kind, digest))?));
            return if same {
                drop(state);
                work.request.touched.push(slot);
                Ok(())
            } else {
                Err(RowError::Reject(format!(
                    "already sealed at size {} with another digest",
                    sealed.size
                )))
            };
        }
        if state.record.superseded {
            return Err(RowError::Superseded(
                "a newer generation replaced this one; seal ignored".into(),
            ));
        }
        let placed = &state.record.placed;
        if !placed.covers(0, size) || placed.total_len() != size {
            let missing = placed.missing(0, size);
            return Err(RowError::Reject(format!(
                "cannot seal at size {size}: {} bytes placed, missing {:?}",
                placed.total_len(),
                &missing[..missing.len().min(8)]
            )));
        }
        if let Some(&(start, end)) = state.pending.ranges().first() {
            // All of 0..size is recorded, so these lie past it: data the
            // sender wrote after the size it seals at.
            return Err(RowError::Reject(format!(
                "cannot seal at size {size}: bytes {start}..{end} past it are being written"
            )));
        }
        let file = self.file_of(source, &slot, &mut state, work)?;
        let dest = state.record.dest_path.clone();
        let meta = file
            .metadata()
            .map_err(|e| RowError::Storage(format!("stat {dest}: {e}")))?;
        let len = meta.len();
        if len > size {
            // Bytes past the final size were never recorded (an earlier crash
            // or an older file): the destination must end where the source does.
            file.set_len(size)
                .map_err(|e| RowError::Storage(format!("truncating {dest} to {size}: {e}")))?;
            state.file_end = size;
            work.request
                .flush_before_record(&mut lock(&slot.unsynced), Some(&file), []);
        }
        // The checksum of the bytes written vouches for the file they were
        // written to: only while that is still the file at `dest`, whole.
        let written = match kind {
            SealDigest::Crc64Nvme if !self.seal_read_back && len >= size => state
                .written_crc
                .of_whole(size)
                .filter(|_| self.still_at(&dest, &meta)),
            _ => None,
        };
        let (actual, of_what) = match written {
            Some(crc) => (checksum::crc64nvme_digest(crc), "the bytes written to"),
            None => {
                // Reading a whole file back must not hold up the batches of
                // this file (nor the rounds recording it) meanwhile: bytes
                // 0..size are all recorded, and only a sealed file is never
                // written again, so what may change while unlocked is checked
                // again after.
                drop(state);
                // No other batch waits for this one's writes meanwhile.
                work.writes.write_all()?;
                let actual = self.digest_on_disk(&dest, size, kind)?;
                state = lock(&slot.state);
                let sealed_alike = state
                    .record
                    .sealed
                    .as_ref()
                    .is_some_and(|sealed| sealed.size == size && sealed.digest == digest);
                if sealed_alike {
                    // The same seal, sent again and placed meanwhile.
                    drop(state);
                    work.request.touched.push(slot);
                    return Ok(());
                }
                let unchanged = state.record.sealed.is_none()
                    && !state.record.superseded
                    && state.record.dest_path == dest
                    && state.record.renamed_from.is_none()
                    && state.pending.is_empty()
                    && state.record.placed.total_len() == size;
                if !unchanged {
                    return Err(RowError::Storage(format!(
                        "{dest} changed while its seal at size {size} was checked; the batch is sent again"
                    )));
                }
                (actual, "the file")
            }
        };
        if actual != digest {
            return Err(RowError::Reject(format!(
                "digest of {of_what} {dest} is {actual}, the source says {digest}"
            )));
        }
        state.record.sealed = Some(Sealed {
            size,
            digest: digest.to_owned(),
        });
        // A sealed file takes no more writes: give its room and its
        // descriptor back.
        super::beside::trim_room(&mut state, &file, &meta, size);
        state.close_file();
        state.written_crc = WrittenCrc::Unknown;
        drop(state);
        work.request.touched.push(slot);
        Ok(())
    }

    /// A watcher that switched algorithms re-sends the seal of a sealed file:
    /// the bytes on disk decide. Failing to read them refuses only this row
    /// (a storage error would have the whole batch retried forever).
    /// The caller has settled any recorded move of the file.
    pub(super) fn reseal_matches(
        &self,
        state: &SlotState,
        size: u64,
        kind: SealDigest,
        digest: &str,
    ) -> Result<bool, RowError> {
        if state.record.superseded {
            return Err(RowError::Superseded(
                "a newer generation replaced this one; seal ignored".into(),
            ));
        }
        let dest = &state.record.dest_path;
        self.digest_on_disk(dest, size, kind)
            .map(|actual| actual == digest)
            .map_err(|e| {
                RowError::Reject(format!(
                    "already sealed at size {size}; cannot check its {kind} digest: {}",
                    e.into_message()
                ))
            })
    }

    /// Whether `dest` is still the file `written` describes (the slot's
    /// descriptor): not replaced or removed behind the sink's back, nor
    /// taken by another file's rename.
    pub(super) fn still_at(&self, dest: &str, written: &std::fs::Metadata) -> bool {
        use std::os::unix::fs::MetadataExt;
        let Ok(Ok(there)) = self.root.open_for_read(dest).map(|file| file.metadata()) else {
            return false;
        };
        written.nlink() > 0 && there.dev() == written.dev() && there.ino() == written.ino()
    }

    /// Digest of the first `size` bytes of `dest` as they are on disk.
    pub(super) fn digest_on_disk(
        &self,
        dest: &str,
        size: u64,
        kind: SealDigest,
    ) -> Result<String, RowError> {
        let reader = self.root.open_for_read(dest).map_err(confine_error)?;
        kind.of_file_prefix(&reader, size)
            .map_err(|e| RowError::Storage(format!("hashing {dest}: {e}")))
    }
}

/// The CRC-32C of the first `len` bytes of a destination file, for
/// reconciliation; an error says which file could not be read, and why.
pub(crate) fn head_crc(root: &Root, dest: &str, len: u64) -> Result<u32, SinkError> {
    let file = root
        .open_for_read(dest)
        .map_err(|e| SinkError::storage(format_args!("opening {dest}"), e))?;
    flight_server::checksum::crc32c_of_file_prefix(&file, len)
        .map_err(|e| SinkError::storage(format_args!("reading the first {len} bytes of {dest}"), e))
}
