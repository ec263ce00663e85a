//! Typed access to the rows of a tailflight batch ([`RangeBatch`]), and the
//! builder that makes one ([`BatchBuilder`]). The schema itself is
//! [`crate::schema`]'s.

use std::mem::MaybeUninit;
use std::sync::Arc;

use arrow_array::builder::{StringBuilder, UInt8Builder, UInt32Builder, UInt64Builder};
use arrow_array::{
    Array, ArrayRef, BinaryArray, RecordBatch, StringArray, UInt8Array, UInt32Array, UInt64Array,
};
pub use arrow_buffer::Buffer;
use arrow_buffer::{OffsetBuffer, ScalarBuffer};

use crate::WireError;
use crate::encode::{BodyWriter, EncodedBatch};
pub use crate::schema::{RowKind, range_schema};

/// One row of a batch, borrowed from its Arrow buffers (no copy of `data`).
#[derive(Clone, Copy, Debug)]
pub struct Row<'a> {
    pub kind: RowKind,
    pub file_key: &'a str,
    pub generation: u64,
    pub offset: u64,
    pub data: &'a [u8],
    /// The CRC-32C of `data`, as the batch claimed it and validation
    /// checked it (0 for control rows).
    pub crc32c: u32,
    /// The CRC-64/NVME of `data` (a seal's digest is made of these), for
    /// data rows longer than [`CRC64_AT_VALIDATION_ABOVE`]: computed by
    /// validation right after its CRC-32C pass over the same bytes, which
    /// has brought as much of them into the CPU's cache as it holds, so
    /// that whoever writes them need not read them again, later, for it.
    pub crc64nvme: Option<u64>,
    pub path: Option<&'a str>,
    pub digest: Option<&'a str>,
}

/// Longest file key a batch may carry: a key is the file's path relative
/// to the watched root when it was first seen, and Linux paths are at most
/// 4096 bytes.
pub const MAX_FILE_KEY_BYTES: usize = 4096;

/// Data rows longer than this have their CRC-64/NVME computed at
/// validation ([`Row::crc64nvme`]). A shorter row's is cheaper to continue
/// from the checksum of the bytes before it than to combine with it, and
/// a sink journals rows up to this size by default (`journal_max_range`),
/// which takes them that way. The pass is made for every longer row, also
/// for one the sink turns out not to write whole or not to need it for (a
/// duplicate, a file resumed after a restart, whose seal reads it back).
pub const CRC64_AT_VALIDATION_ABOVE: usize = 64 << 10;

/// Where the last byte any file can hold ends: file offsets are `off_t`,
/// a signed 64-bit integer, so a range ending past this can never be
/// written, and offsets past it do not even reach the filesystem intact.
pub const MAX_FILE_END: u64 = i64::MAX as u64;

/// A batch whose schema and checksums have been validated.
pub struct RangeBatch {
    batch: RecordBatch,
    kind: UInt8Array,
    file_key: StringArray,
    generation: UInt64Array,
    offset: UInt64Array,
    data: BinaryArray,
    crc: UInt32Array,
    path: StringArray,
    digest: StringArray,
    /// Each row's [`Row::crc64nvme`].
    crc64: Vec<Option<u64>>,
}

impl RangeBatch {
    /// Checks the schema (exactly, nullability included), each row's kind and the
    /// crc32c of each data row; computes the CRC-64/NVME of each data row
    /// longer than [`CRC64_AT_VALIDATION_ABOVE`].
    pub fn validate(batch: RecordBatch) -> Result<Self, WireError> {
        if batch.schema().fields() != range_schema().fields() {
            return Err(WireError::Schema(format!(
                "expected {:?}, got {:?}",
                range_schema().fields(),
                batch.schema().fields()
            )));
        }
        let column = |i: usize| batch.column(i).clone();
        let mut view = Self {
            kind: downcast::<UInt8Array>(column(0))?,
            file_key: downcast::<StringArray>(column(1))?,
            generation: downcast::<UInt64Array>(column(2))?,
            offset: downcast::<UInt64Array>(column(3))?,
            data: downcast::<BinaryArray>(column(4))?,
            crc: downcast::<UInt32Array>(column(5))?,
            path: downcast::<StringArray>(column(6))?,
            digest: downcast::<StringArray>(column(7))?,
            crc64: Vec::new(),
            batch,
        };
        // Non-nullable fields can still arrive with a validity bitmap from a
        // hand-made client; refuse nulls rather than read garbage behind them.
        for i in [0, 1, 2, 3, 4, 5] {
            if view.batch.column(i).null_count() > 0 {
                return Err(WireError::Schema(format!(
                    "column {} has nulls but is declared non-nullable",
                    range_schema().field(i).name()
                )));
            }
        }
        for row in 0..view.len() {
            let key = view.file_key.value(row);
            if key.is_empty() || key.len() > MAX_FILE_KEY_BYTES || key.contains('\0') {
                return Err(WireError::Row {
                    row,
                    detail: format!(
                        "file key {:?} must be 1 to {MAX_FILE_KEY_BYTES} bytes without NUL",
                        key.chars().take(64).collect::<String>()
                    ),
                });
            }
            let kind = view.kind.value(row);
            let Some(kind) = RowKind::from_u8(kind) else {
                return Err(WireError::Row {
                    row,
                    detail: format!("unknown row kind {kind}"),
                });
            };
            let data = view.data.value(row);
            if kind == RowKind::Data {
                let computed = crate::checksum::crc32c(data);
                let claimed = view.crc.value(row);
                if computed != claimed {
                    return Err(WireError::Row {
                        row,
                        detail: format!(
                            "crc32c mismatch for '{}' generation {} at offset {} ({} bytes): claimed {claimed:#010x}, computed {computed:#010x}",
                            view.file_key.value(row),
                            view.generation.value(row),
                            view.offset.value(row),
                            data.len()
                        ),
                    });
                }
                let offset = view.offset.value(row);
                if offset
                    .checked_add(data.len() as u64)
                    .is_none_or(|end| end > MAX_FILE_END)
                {
                    return Err(WireError::Row {
                        row,
                        detail: format!(
                            "{} bytes at offset {offset} end past the largest file offset ({MAX_FILE_END})",
                            data.len()
                        ),
                    });
                }
                if data.len() > CRC64_AT_VALIDATION_ABOVE {
                    view.crc64.resize(row, None);
                    view.crc64.push(Some(crate::checksum::crc64nvme(data)));
                }
            } else if !data.is_empty() {
                return Err(WireError::Row {
                    row,
                    detail: format!("{kind:?} row carries data bytes"),
                });
            }
        }
        Ok(view)
    }

    pub fn len(&self) -> usize {
        self.batch.num_rows()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn row(&self, i: usize) -> Row<'_> {
        Row {
            // validate() rejected unknown kinds.
            kind: RowKind::from_u8(self.kind.value(i)).unwrap_or(RowKind::Data),
            file_key: self.file_key.value(i),
            generation: self.generation.value(i),
            offset: self.offset.value(i),
            data: self.data.value(i),
            crc32c: self.crc.value(i),
            crc64nvme: self.crc64.get(i).copied().flatten(),
            path: optional_str(&self.path, i),
            digest: optional_str(&self.digest, i),
        }
    }

    pub fn rows(&self) -> impl Iterator<Item = Row<'_>> {
        (0..self.len()).map(|i| self.row(i))
    }

    /// `bytes`, which lie in this batch's data column, as a handle that
    /// keeps them alive on its own: the same memory, counted, not copied.
    /// `None` for bytes from anywhere else.
    pub fn share_data(&self, bytes: &[u8]) -> Option<Buffer> {
        let values = self.data.values();
        let start = (bytes.as_ptr() as usize).checked_sub(values.as_ptr() as usize)?;
        (start + bytes.len() <= values.len()).then(|| values.slice_with_length(start, bytes.len()))
    }

    /// Bytes of range payload carried by this batch.
    pub fn data_bytes(&self) -> u64 {
        let offsets = self.data.value_offsets();
        match (offsets.first(), offsets.last()) {
            (Some(&first), Some(&last)) => (last - first) as u64,
            _ => 0,
        }
    }
}

fn optional_str(array: &StringArray, i: usize) -> Option<&str> {
    array.is_valid(i).then(|| array.value(i))
}

fn downcast<T: Array + Clone + 'static>(array: ArrayRef) -> Result<T, WireError> {
    array
        .as_any()
        .downcast_ref::<T>()
        .cloned()
        .ok_or_else(|| WireError::Schema(format!("column has type {}", array.data_type())))
}

/// The alignment the first row of a batch is read at (see
/// [`DataColumn::fill_next`]): a page, as direct writes need.
const ROW_ALIGNMENT: usize = 4096;
/// Rows shorter than this are not given a lead: their aligned middle is
/// below any sink's direct-write minimum.
const MIN_ALIGNED_ROW: usize = 64 << 10;

/// Most room a data column keeps beyond its size hint.
const MAX_HEADROOM: usize = 256 << 10;

/// The `data` column under construction: one contiguous values buffer that
/// becomes the Arrow buffer, or the start of the IPC body, without a copy.
/// It is sized from the larger of the previous batch and a high-water mark
/// that loses an eighth per batch, plus a quarter of that as headroom (at
/// most [`MAX_HEADROOM`]: full batches stop at their budget anyway): a
/// stream of full batches never regrows it; batches of uneven size (a burst
/// of files written in step, handed over in one batch or two, wherever the
/// events split it) seldom do, where growing copies every row read so far;
/// and a trickle after a burst stops reserving megabytes within a few tens
/// of batches (room never written is never given pages). Every
/// reservation keeps room behind the payload for the small columns an
/// encoded body appends (growing a full body to fit them would copy it).
struct DataColumn {
    offsets: Vec<i32>,
    values: Vec<u8>,
    /// The decaying high-water mark of the values' length.
    size_hint: usize,
}

impl DataColumn {
    fn with_capacity(rows: usize, bytes: usize) -> Self {
        let mut offsets = Vec::with_capacity(rows + 1);
        offsets.push(0);
        Self {
            offsets,
            values: Vec::with_capacity(bytes),
            size_hint: 0,
        }
    }

    fn end_offset(&self) -> i32 {
        i32::try_from(self.values.len()).expect("a batch's data stays under 2 GiB")
    }

    fn append(&mut self, bytes: &[u8], trailer: usize) {
        self.values.reserve(bytes.len() + trailer);
        self.values.extend_from_slice(bytes);
        self.offsets.push(self.end_offset());
    }

    /// Lets `fill` write up to `max_len` bytes at the end; returns how many
    /// it wrote. The first row of a batch, if it may be large, is read at a
    /// lead of `file_offset` modulo [`ROW_ALIGNMENT`] into the values: the
    /// sink receives the values on a page boundary (`put_receive`), so
    /// the row lies there aligned like its file offset and its middle is
    /// written with O_DIRECT from where it is. The lead is bytes of no row:
    /// the column's first offset skips it.
    fn fill_next<E>(
        &mut self,
        file_offset: u64,
        max_len: usize,
        trailer: usize,
        fill: impl for<'b> FnOnce(&'b mut [MaybeUninit<u8>]) -> Result<&'b mut [u8], E>,
    ) -> Result<usize, E> {
        let first_row = self.offsets.len() == 1;
        let lead = match first_row && max_len >= MIN_ALIGNED_ROW {
            true => (file_offset % ROW_ALIGNMENT as u64) as usize,
            false => 0,
        };
        if lead > 0 {
            self.values.reserve(lead + max_len + trailer);
            self.values.resize(lead, 0);
            self.offsets[0] = self.end_offset();
        }
        let filled = self.fill_at_end(max_len, trailer, fill);
        if lead > 0 {
            match filled {
                // A short read: the row is not worth its lead.
                Ok(filled) if filled > 0 && filled < MIN_ALIGNED_ROW => {
                    self.values.copy_within(lead.., 0);
                    self.values.truncate(filled);
                    self.offsets = vec![0, self.end_offset()];
                }
                Ok(filled) if filled > 0 => {}
                // Nothing read: no lead without a row.
                _ => {
                    self.values.clear();
                    self.offsets[0] = 0;
                }
            }
        }
        filled
    }

    fn fill_at_end<E>(
        &mut self,
        max_len: usize,
        trailer: usize,
        fill: impl for<'b> FnOnce(&'b mut [MaybeUninit<u8>]) -> Result<&'b mut [u8], E>,
    ) -> Result<usize, E> {
        self.values.reserve(max_len + trailer);
        let room = &mut self.values.spare_capacity_mut()[..max_len];
        let room_start = room.as_ptr().cast::<u8>();
        let filled = fill(room)?;
        let written = filled.len();
        assert!(
            std::ptr::eq(filled.as_ptr(), room_start) && written <= max_len,
            "fill must return the start of the room it was given"
        );
        // SAFETY: `filled` is a `&mut [u8]` over the first `written` bytes
        // of the spare capacity (checked just above), so they are initialised.
        unsafe { self.values.set_len(self.values.len() + written) };
        if written > 0 {
            self.offsets.push(self.end_offset());
        }
        Ok(written)
    }

    /// The bytes of the last row.
    fn last(&self) -> &[u8] {
        let start = self.offsets[self.offsets.len() - 2] as usize;
        &self.values[start..]
    }

    /// The finished column's offsets and values; the next one starts with
    /// room for the size hint (see above), plus `trailer`.
    fn take(&mut self, trailer: usize) -> (Vec<i32>, Vec<u8>) {
        let rows = self.offsets.len() - 1;
        let hint = self.values.len().max(self.size_hint - self.size_hint / 8);
        let headroom = (hint / 4).min(MAX_HEADROOM);
        let mut next = Self::with_capacity(rows, hint + headroom + trailer);
        next.size_hint = hint;
        let Self {
            offsets, values, ..
        } = std::mem::replace(self, next);
        (offsets, values)
    }

    fn finish(&mut self, trailer: usize) -> BinaryArray {
        let (offsets, values) = self.take(trailer);
        let offsets = OffsetBuffer::new(ScalarBuffer::from(offsets));
        BinaryArray::new(offsets, Buffer::from_vec(values), None)
    }
}

/// Accumulates rows into one batch; `finish` hands out a batch and leaves the
/// builder ready for the next.
pub struct BatchBuilder {
    kind: UInt8Builder,
    file_key: StringBuilder,
    generation: UInt64Builder,
    offset: UInt64Builder,
    data: DataColumn,
    crc: UInt32Builder,
    path: StringBuilder,
    digest: StringBuilder,
    rows: usize,
    data_bytes: usize,
    /// Bytes of file keys, paths and digests so far.
    string_bytes: usize,
}

/// Upper bound of the bytes an IPC body holds besides the payload, for
/// `rows` rows with `strings` bytes of strings: per row 37 bytes of fixed
/// width values and offsets plus two validity bits, one more offset per
/// offsets buffer, and up to 7 bytes of padding after each of the 20 buffers
/// and the payload.
fn trailer_bound(rows: usize, strings: usize) -> usize {
    38 * rows + strings + 256
}

impl BatchBuilder {
    pub fn with_capacity(rows: usize, data_bytes: usize) -> Self {
        Self {
            kind: UInt8Builder::with_capacity(rows),
            file_key: StringBuilder::with_capacity(rows, rows * 48),
            generation: UInt64Builder::with_capacity(rows),
            offset: UInt64Builder::with_capacity(rows),
            data: DataColumn::with_capacity(rows, data_bytes + trailer_bound(rows, rows * 48)),
            crc: UInt32Builder::with_capacity(rows),
            path: StringBuilder::with_capacity(rows, 0),
            digest: StringBuilder::with_capacity(rows, 0),
            rows: 0,
            data_bytes: 0,
            string_bytes: 0,
        }
    }

    /// Room an encoded body needs behind the payload once a row with
    /// `strings` bytes of key, path and digest is added.
    fn trailer_with(&self, strings: usize) -> usize {
        trailer_bound(self.rows + 1, self.string_bytes + strings)
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn data_bytes(&self) -> usize {
        self.data_bytes
    }

    /// Upper bound of the encoded body's size: payload (with its lead)
    /// plus the other columns.
    pub fn encoded_bytes(&self) -> usize {
        self.data_bytes
            + self.data.offsets[0] as usize
            + trailer_bound(self.rows, self.string_bytes)
    }

    pub fn push_data(&mut self, file_key: &str, generation: u64, offset: u64, data: &[u8]) {
        self.push(
            RowKind::Data,
            file_key,
            generation,
            offset,
            data,
            None,
            None,
        );
        self.crc.append_value(crate::checksum::crc32c(data));
    }

    /// Appends a data row whose bytes `fill` writes straight into the batch
    /// (a pread into the Arrow buffer: no copy through a scratch buffer).
    /// `fill` gets room for `max_len` bytes and returns the part it filled,
    /// which must start at the beginning of that room. Returns the row's
    /// bytes; when `fill` wrote nothing, no row is added.
    pub fn push_data_in_place<E>(
        &mut self,
        file_key: &str,
        generation: u64,
        offset: u64,
        max_len: usize,
        fill: impl for<'b> FnOnce(&'b mut [MaybeUninit<u8>]) -> Result<&'b mut [u8], E>,
    ) -> Result<&[u8], E> {
        let trailer = self.trailer_with(file_key.len());
        let written = self.data.fill_next(offset, max_len, trailer, fill)?;
        if written == 0 {
            return Ok(&[]);
        }
        self.string_bytes += file_key.len();
        self.kind.append_value(RowKind::Data as u8);
        self.file_key.append_value(file_key);
        self.generation.append_value(generation);
        self.offset.append_value(offset);
        self.path.append_null();
        self.digest.append_null();
        self.rows += 1;
        self.data_bytes += written;
        let bytes = self.data.last();
        self.crc.append_value(crate::checksum::crc32c(bytes));
        Ok(bytes)
    }

    pub fn push_open(&mut self, file_key: &str, generation: u64, path: &str) {
        self.push(
            RowKind::Open,
            file_key,
            generation,
            0,
            &[],
            Some(path),
            None,
        );
        self.crc.append_value(0);
    }

    pub fn push_rename(&mut self, file_key: &str, generation: u64, new_path: &str) {
        self.push(
            RowKind::Rename,
            file_key,
            generation,
            0,
            &[],
            Some(new_path),
            None,
        );
        self.crc.append_value(0);
    }

    pub fn push_seal(&mut self, file_key: &str, generation: u64, size: u64, digest: &str) {
        self.push(
            RowKind::Seal,
            file_key,
            generation,
            size,
            &[],
            None,
            Some(digest),
        );
        self.crc.append_value(0);
    }

    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        kind: RowKind,
        file_key: &str,
        generation: u64,
        offset: u64,
        data: &[u8],
        path: Option<&str>,
        digest: Option<&str>,
    ) {
        let strings = file_key.len() + path.map_or(0, str::len) + digest.map_or(0, str::len);
        let trailer = self.trailer_with(strings);
        self.string_bytes += strings;
        self.kind.append_value(kind as u8);
        self.file_key.append_value(file_key);
        self.generation.append_value(generation);
        self.offset.append_value(offset);
        self.data.append(data, trailer);
        self.path.append_option(path);
        self.digest.append_option(digest);
        self.rows += 1;
        self.data_bytes += data.len();
    }

    /// Finishes the batch and leaves the builder empty for reuse.
    pub fn finish(&mut self) -> RecordBatch {
        let trailer = trailer_bound(self.rows, self.string_bytes);
        self.rows = 0;
        self.data_bytes = 0;
        self.string_bytes = 0;
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.kind.finish()),
            Arc::new(self.file_key.finish()),
            Arc::new(self.generation.finish()),
            Arc::new(self.offset.finish()),
            Arc::new(self.data.finish(trailer)),
            Arc::new(self.crc.finish()),
            Arc::new(self.path.finish()),
            Arc::new(self.digest.finish()),
        ];
        // Every column above is built to the schema's types and lengths.
        RecordBatch::try_new(range_schema(), columns)
            .expect("builder columns match the wire schema")
    }

    /// Finishes the batch already IPC-encoded, its payload not copied (see
    /// [`crate::encode`]), and leaves the builder empty for reuse.
    pub fn finish_encoded(&mut self) -> EncodedBatch {
        let trailer = trailer_bound(self.rows, std::mem::take(&mut self.string_bytes));
        let rows = std::mem::take(&mut self.rows);
        self.data_bytes = 0;
        let (data_offsets, payload) = self.data.take(trailer);
        let mut body = BodyWriter::new(payload);
        body.column(&self.kind.finish());
        body.column(&self.file_key.finish());
        body.column(&self.generation.finish());
        body.column(&self.offset.finish());
        body.payload_column(&data_offsets);
        body.column(&self.crc.finish());
        body.column(&self.path.finish());
        body.column(&self.digest.finish());
        body.finish(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_schema::{Field, Schema};

    /// Fills the room with `bytes` (at most its length), as a pread would.
    fn write_into<'b>(room: &'b mut [MaybeUninit<u8>], bytes: &[u8]) -> &'b mut [u8] {
        let n = bytes.len().min(room.len());
        for (slot, byte) in room.iter_mut().zip(&bytes[..n]) {
            slot.write(*byte);
        }
        let (filled, _) = room.split_at_mut(n);
        // SAFETY: the first `n` slots were written just above.
        unsafe { &mut *(filled as *mut [MaybeUninit<u8>] as *mut [u8]) }
    }

    /// A row's bytes are shared from the batch, not copied; bytes from
    /// elsewhere are not taken for the batch's.
    #[test]
    fn a_row_s_bytes_are_shared_from_its_batch() {
        let mut b = BatchBuilder::with_capacity(2, 64);
        b.push_data("f", 1, 0, b"first");
        b.push_data("f", 1, 5, b"second");
        let batch = RangeBatch::validate(b.finish()).unwrap();
        let second = batch.row(1).data;
        let shared = batch.share_data(second).expect("the batch's own bytes");
        assert_eq!(shared.as_slice(), b"second");
        assert_eq!(shared.as_ptr(), second.as_ptr(), "the same memory");
        assert!(
            batch.share_data(b"second").is_none(),
            "bytes from elsewhere"
        );
        let whole = batch.share_data(&batch.row(0).data[..0]);
        assert_eq!(whole.map(|b| b.len()), Some(0));
    }

    /// A large first row is read at a lead that matches its file offset's
    /// phase; a short one, an empty read or a failed one leaves no lead.
    #[test]
    fn a_large_first_row_gets_a_lead_in_its_files_phase() {
        let row: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let mut b = BatchBuilder::with_capacity(2, 1 << 20);
        b.push_data_in_place::<()>("f", 1, 5000, 1 << 20, |room| Ok(write_into(room, &row)))
            .unwrap();
        b.push_seal("f", 1, 305_000, "crc64nvme:0000000000000000");
        assert_eq!(b.data_bytes(), row.len());
        let encoded = b.finish_encoded();
        assert_eq!(encoded.data_bytes(), row.len() as u64);
        let decoded = RangeBatch::validate(encoded.decode().unwrap()).unwrap();
        assert_eq!(decoded.row(0).data, &row[..]);
        assert_eq!(decoded.data_bytes(), row.len() as u64);
        let lead = decoded.row(0).data.as_ptr() as usize - encoded.body.as_ptr() as usize;
        assert_eq!(lead, 5000 % ROW_ALIGNMENT);

        for (fill, expected) in [(&row[..1000], 1000usize), (&row[..0], 0)] {
            let mut b = BatchBuilder::with_capacity(1, 1 << 20);
            b.push_data_in_place::<()>("f", 1, 5000, 1 << 20, |room| Ok(write_into(room, fill)))
                .unwrap();
            assert_eq!(b.data.offsets[0], 0, "no lead for a {expected}-byte row");
            assert_eq!(b.data.values.len(), expected);
        }
        // A later read that finds nothing leaves the first row and its lead.
        let mut b = BatchBuilder::with_capacity(2, 1 << 20);
        b.push_data_in_place::<()>("f", 1, 5000, 1 << 20, |room| Ok(write_into(room, &row)))
            .unwrap();
        b.push_data_in_place::<()>("g", 1, 9000, 1 << 20, |room| Ok(write_into(room, &[])))
            .unwrap();
        b.push_seal("f", 1, 305_000, "crc64nvme:0000000000000000");
        let decoded = RangeBatch::validate(b.finish()).unwrap();
        assert_eq!(decoded.row(0).data, &row[..]);
        assert_eq!(decoded.len(), 2);

        let mut b = BatchBuilder::with_capacity(1, 1 << 20);
        let failed: Result<&[u8], &str> =
            b.push_data_in_place("f", 1, 5000, 1 << 20, |_| Err("eio"));
        assert!(failed.is_err());
        assert!(b.data.values.is_empty() && b.data.offsets == [0]);
    }

    #[test]
    fn rows_filled_in_place_match_copied_rows_and_an_empty_fill_adds_none() {
        let mut b = BatchBuilder::with_capacity(1, 0);
        b.push_data("f", 1, 0, b"copied");
        let row = b
            .push_data_in_place::<()>("f", 1, 6, 100, |room| Ok(write_into(room, b" in place")))
            .unwrap()
            .to_vec();
        assert_eq!(row, b" in place");
        let none = b
            .push_data_in_place::<()>("f", 1, 15, 8, |room| Ok(write_into(room, b"")))
            .unwrap();
        assert!(none.is_empty());
        b.push_seal("f", 1, 15, "00ff");
        let refused: Result<&[u8], &str> = b.push_data_in_place("f", 1, 15, 8, |_| Err("eio"));
        assert_eq!(refused, Err("eio"));
        assert_eq!(b.rows(), 3);
        assert_eq!(b.data_bytes(), 15);
        // Validation recomputes each crc32c from the column the batch carries.
        let batch = RangeBatch::validate(b.finish()).unwrap();
        assert_eq!(batch.len(), 3);
        assert_eq!(batch.row(0).data, b"copied");
        assert_eq!(batch.row(1).data, b" in place");
        assert_eq!(batch.row(1).offset, 6);
        assert_eq!(batch.row(2).kind, RowKind::Seal);
        // The builder starts over, with room sized from the batch before.
        b.push_data("g", 1, 0, b"next");
        assert_eq!(RangeBatch::validate(b.finish()).unwrap().len(), 1);
    }

    #[test]
    fn built_batches_validate_and_read_back() {
        let mut b = BatchBuilder::with_capacity(4, 64);
        b.push_data("a/b.xtc2", 1, 10, b"hello");
        b.push_rename("a/b.xtc2", 1, "a/c.xtc2");
        b.push_seal("a/b.xtc2", 1, 15, "00ff");
        let batch = RangeBatch::validate(b.finish()).unwrap();
        assert_eq!(batch.len(), 3);
        let r0 = batch.row(0);
        assert_eq!(
            (r0.kind, r0.file_key, r0.offset, r0.data),
            (RowKind::Data, "a/b.xtc2", 10, &b"hello"[..])
        );
        assert_eq!(batch.row(1).path, Some("a/c.xtc2"));
        assert_eq!(
            (batch.row(2).kind, batch.row(2).offset, batch.row(2).digest),
            (RowKind::Seal, 15, Some("00ff"))
        );
    }

    #[test]
    fn a_range_past_the_largest_file_offset_is_refused() {
        for (offset, len) in [
            (u64::MAX - 4, 5),
            (MAX_FILE_END - 4, 5),
            (MAX_FILE_END + 1, 0),
        ] {
            let mut b = BatchBuilder::with_capacity(1, 8);
            b.push_data("a", 1, offset, &b"hello"[..len]);
            let refused = RangeBatch::validate(b.finish())
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                refused.contains("end past the largest file offset"),
                "{offset}+{len}: {refused}"
            );
        }
        let mut b = BatchBuilder::with_capacity(1, 8);
        b.push_data("a", 1, MAX_FILE_END - 5, b"hello");
        assert!(RangeBatch::validate(b.finish()).is_ok());
    }

    #[test]
    fn long_rows_carry_their_crc64_from_validation() {
        let large: Vec<u8> = (0..=CRC64_AT_VALIDATION_ABOVE as u32)
            .map(|i| (i * 7) as u8)
            .collect();
        let small = &large[..CRC64_AT_VALIDATION_ABOVE];
        let mut b = BatchBuilder::with_capacity(4, 2 * large.len() + 64);
        b.push_data("a", 1, 0, b"small");
        b.push_seal("a", 1, 5, "00ff");
        b.push_data("b", 1, 0, &large);
        b.push_data("c", 1, 0, small);
        let batch = RangeBatch::validate(b.finish()).unwrap();
        let crcs: Vec<_> = batch.rows().map(|row| row.crc64nvme).collect();
        assert_eq!(
            crcs,
            [None, None, Some(crate::checksum::crc64nvme(&large)), None]
        );
    }

    #[test]
    fn bad_crc_is_rejected_with_context() {
        let mut b = BatchBuilder::with_capacity(1, 8);
        b.push_data("f", 1, 0, b"abc");
        let good = b.finish();
        let mut columns = good.columns().to_vec();
        columns[5] = Arc::new(UInt32Array::from(vec![7u32]));
        let bad = RecordBatch::try_new(range_schema(), columns).unwrap();
        let err = RangeBatch::validate(bad).err().unwrap().to_string();
        assert!(err.contains("crc32c mismatch for 'f'"), "{err}");
    }

    #[test]
    fn nullability_difference_is_a_schema_error() {
        let fields: Vec<Field> = range_schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect();
        let schema = Arc::new(Schema::new(fields));
        let mut b = BatchBuilder::with_capacity(1, 8);
        b.push_data("f", 1, 0, b"abc");
        let batch = b.finish().with_schema(schema).unwrap();
        assert!(matches!(
            RangeBatch::validate(batch),
            Err(WireError::Schema(_))
        ));
    }
}
