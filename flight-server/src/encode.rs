//! Arrow IPC encoding of range batches that leaves the payload where pread
//! put it.
//!
//! arrow-ipc's writer copies every buffer of a batch into a fresh body: for a
//! range batch that is the whole payload, once more than the gRPC framing
//! already copies it. An IPC message header locates each buffer by offset and
//! length within the body, in any order, so the batch builder reads file bytes
//! straight into the start of what becomes the body, and [`BodyWriter`] only
//! appends the small columns behind them and describes the layout.

use arrow_array::Array;
use arrow_data::ArrayData;
use bytes::Bytes;

/// Buffers in an IPC body start at multiples of this (the format's minimum).
const BODY_ALIGNMENT: usize = 8;

/// One record batch of the range schema, encoded for the wire: the IPC
/// message header (a flatbuffer) and the body it describes. Cloning shares
/// both, so a batch kept for re-sending costs no second copy.
#[derive(Clone)]
pub struct EncodedBatch {
    pub(crate) header: Bytes,
    pub(crate) body: Bytes,
    rows: usize,
    data_bytes: u64,
    memory: u64,
}

impl std::fmt::Debug for EncodedBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncodedBatch")
            .field("rows", &self.rows)
            .field("data_bytes", &self.data_bytes)
            .field("body_bytes", &self.body.len())
            .finish()
    }
}

impl EncodedBatch {
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Bytes of range payload carried.
    pub fn data_bytes(&self) -> u64 {
        self.data_bytes
    }

    /// Memory held, allocation slack included.
    pub fn memory_size(&self) -> u64 {
        self.memory
    }

    /// Bytes it takes on the wire: its IPC header and body.
    pub fn wire_len(&self) -> u64 {
        (self.header.len() + self.body.len()) as u64
    }

    /// The batch as the sink decodes it (for tests and tools).
    pub fn decode(&self) -> Result<arrow_array::RecordBatch, String> {
        let data = arrow_flight::FlightData {
            data_header: self.header.clone(),
            data_body: self.body.clone(),
            ..Default::default()
        };
        match crate::decode::message(&data, true)? {
            crate::decode::Message::Batch(batch) => Ok(batch),
            _ => Err("not a record batch message".into()),
        }
    }
}

/// Lays out an IPC body whose first `payload_len` bytes are already in place.
pub(crate) struct BodyWriter {
    body: Vec<u8>,
    payload_len: usize,
    /// The rows' bytes in the payload (all of it but a lead before the
    /// first row, see `wire::DataColumn::fill_next`).
    row_bytes: usize,
    nodes: Vec<arrow_ipc::FieldNode>,
    buffers: Vec<arrow_ipc::Buffer>,
}

impl BodyWriter {
    /// `body` holds the payload (the values of the one binary column whose
    /// bytes were read in place) and nothing else.
    pub(crate) fn new(mut body: Vec<u8>) -> Self {
        let payload_len = body.len();
        pad(&mut body);
        Self {
            body,
            payload_len,
            row_bytes: payload_len,
            nodes: Vec::with_capacity(8),
            buffers: Vec::with_capacity(24),
        }
    }

    /// The next column: a primitive or string array without children,
    /// built here (offset 0).
    pub(crate) fn column(&mut self, array: &dyn Array) {
        let data = array.to_data();
        debug_assert_eq!(data.offset(), 0, "builder output starts at offset 0");
        self.validity(&data);
        for buffer in data.buffers() {
            self.append(buffer.as_slice());
        }
    }

    /// The next column: the binary column whose values are the payload at
    /// the start of the body, with these offsets (no nulls).
    pub(crate) fn payload_column(&mut self, offsets: &[i32]) {
        let rows = offsets.len().saturating_sub(1);
        if let (Some(first), Some(last)) = (offsets.first(), offsets.last()) {
            self.row_bytes = (last - first) as usize;
        }
        self.nodes.push(arrow_ipc::FieldNode::new(rows as i64, 0));
        self.buffers
            .push(arrow_ipc::Buffer::new(self.body.len() as i64, 0));
        let start = self.body.len();
        self.body
            .reserve(std::mem::size_of_val(offsets) + BODY_ALIGNMENT);
        for offset in offsets {
            self.body.extend_from_slice(&offset.to_le_bytes());
        }
        let len = self.body.len() - start;
        pad(&mut self.body);
        self.buffers
            .push(arrow_ipc::Buffer::new(start as i64, len as i64));
        self.buffers
            .push(arrow_ipc::Buffer::new(0, self.payload_len as i64));
    }

    fn validity(&mut self, data: &ArrayData) {
        self.nodes.push(arrow_ipc::FieldNode::new(
            data.len() as i64,
            data.null_count() as i64,
        ));
        match data.nulls().filter(|nulls| nulls.null_count() > 0) {
            Some(nulls) => self.append(nulls.inner().sliced().as_slice()),
            // No nulls: the format allows an empty validity buffer.
            None => self
                .buffers
                .push(arrow_ipc::Buffer::new(self.body.len() as i64, 0)),
        }
    }

    fn append(&mut self, bytes: &[u8]) {
        let start = self.body.len();
        self.body.extend_from_slice(bytes);
        pad(&mut self.body);
        self.buffers
            .push(arrow_ipc::Buffer::new(start as i64, bytes.len() as i64));
    }

    pub(crate) fn finish(mut self, rows: usize) -> EncodedBatch {
        let mut fbb = flatbuffers::FlatBufferBuilder::with_capacity(
            256 + 16 * (self.nodes.len() + self.buffers.len()),
        );
        let nodes = fbb.create_vector(&self.nodes);
        let buffers = fbb.create_vector(&self.buffers);
        let mut batch = arrow_ipc::RecordBatchBuilder::new(&mut fbb);
        batch.add_length(rows as i64);
        batch.add_nodes(nodes);
        batch.add_buffers(buffers);
        let batch = batch.finish();
        let mut message = arrow_ipc::MessageBuilder::new(&mut fbb);
        message.add_version(arrow_ipc::MetadataVersion::V5);
        message.add_header_type(arrow_ipc::MessageHeader::RecordBatch);
        message.add_bodyLength(self.body.len() as i64);
        message.add_header(batch.as_union_value());
        let message = message.finish();
        fbb.finish(message, None);
        let header = Bytes::copy_from_slice(fbb.finished_data());
        // The builder reserves headroom (see `DataColumn`) that a batch
        // mostly leaves untouched: it is given back here, and the batch
        // counts against the window what it holds. Shrinking a block to
        // at least half its size keeps it where it is (mimalloc), and a
        // batch much smaller than the room it had is copied, small.
        self.body.shrink_to_fit();
        let memory = (self.body.capacity() + header.len()) as u64;
        EncodedBatch {
            header,
            body: Bytes::from(self.body),
            rows,
            data_bytes: self.row_bytes as u64,
            memory,
        }
    }
}

fn pad(body: &mut Vec<u8>) {
    let padded = body.len().next_multiple_of(BODY_ALIGNMENT);
    body.resize(padded, 0);
}

#[cfg(test)]
mod tests {
    use std::mem::MaybeUninit;

    use arrow_flight::FlightData;

    use crate::wire::{BatchBuilder, RangeBatch, RowKind};

    fn fill_with<'a>(room: &'a mut [MaybeUninit<u8>], bytes: &[u8]) -> &'a mut [u8] {
        for (slot, byte) in room.iter_mut().zip(bytes) {
            slot.write(*byte);
        }
        // SAFETY: the first bytes.len() slots were written just above.
        unsafe { std::slice::from_raw_parts_mut(room.as_mut_ptr().cast::<u8>(), bytes.len()) }
    }

    /// Every row kind, nulls in the nullable columns, payload of odd length.
    fn build(b: &mut BatchBuilder) {
        b.push_data("dir/a.bin", 1, 0, b"first row");
        b.push_data_in_place::<()>("dir/a.bin", 1, 9, 100, |room| {
            Ok(fill_with(room, b", read in place"))
        })
        .unwrap();
        b.push_open("dir/b.bin", 2, "dir/b.bin");
        b.push_data("dir/b.bin", 2, 1 << 40, &[7u8; 1001]);
        b.push_rename("dir/a.bin", 1, "dir/a2.bin");
        b.push_seal("dir/a.bin", 1, 24, "crc64nvme:00112233445566ff");
    }

    #[test]
    fn encoded_batches_decode_to_what_the_builder_holds() {
        let mut plain = BatchBuilder::with_capacity(1, 0);
        let mut encoded = BatchBuilder::with_capacity(1, 0);
        for round in 0..3 {
            build(&mut plain);
            build(&mut encoded);
            let expected = plain.finish();
            let bound = encoded.encoded_bytes();
            let batch = encoded.finish_encoded();
            assert!(batch.body.len() <= bound, "{} > {bound}", batch.body.len());
            assert_eq!(batch.rows(), 6);
            assert_eq!(batch.data_bytes(), 9 + 15 + 1001);
            assert!(batch.memory_size() >= batch.body.len() as u64);
            assert_eq!(batch.body.len() % 8, 0, "body padded");
            let ours = batch.decode().unwrap();
            assert_eq!(ours, expected, "round {round}");
            let rows = RangeBatch::validate(ours).unwrap();
            assert_eq!(rows.row(1).data, b", read in place");
            assert_eq!(rows.row(5).kind, RowKind::Seal);

            // arrow-flight's own decoder reads it too.
            let message = FlightData {
                data_header: batch.header.clone(),
                data_body: batch.body.clone(),
                ..Default::default()
            };
            let standard = arrow_flight::utils::flight_data_to_arrow_batch(
                &message,
                crate::wire::range_schema(),
                &Default::default(),
            )
            .unwrap();
            assert_eq!(standard, expected);
        }
    }

    /// A body grown to fit the small columns behind a full payload would be
    /// copied whole (and its capacity doubled): the builder keeps room.
    #[test]
    fn full_batches_keep_room_for_the_small_columns() {
        let mut b = BatchBuilder::with_capacity(4, 4 << 20);
        for round in 0..3 {
            for row in 0..4u64 {
                let key = format!("run/stream-{row:02}/chunk-{round:03}.xtc2");
                b.push_data_in_place::<()>(&key, 1, row << 20, 1 << 20, |room| {
                    Ok(fill_with(room, &[round as u8; 1 << 20]))
                })
                .unwrap();
            }
            b.push_seal("run/x", 1, 10, "crc64nvme:0011223344556677");
            let batch = b.finish_encoded();
            let slack = batch.memory_size() - batch.body.len() as u64;
            assert!(
                slack < 64 << 10,
                "round {round}: {} bytes held for a body of {}",
                batch.memory_size(),
                batch.body.len()
            );
            assert_eq!(batch.decode().unwrap().num_rows(), 5);
        }
    }

    #[test]
    fn an_empty_batch_encodes() {
        let batch = BatchBuilder::with_capacity(0, 0).finish_encoded();
        assert_eq!(batch.rows(), 0);
        assert_eq!(batch.decode().unwrap().num_rows(), 0);
    }
}
