use std::collections::VecDeque;

use arrow_flight::FlightDescriptor;
use futures::StreamExt;
use http_body::Frame;
use tonic::Code;

use super::*;
use crate::wire::BatchBuilder;

/// A small deterministic generator: the same cases on every run.
struct Noise(u64);

impl Noise {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn bytes(&mut self, len: usize) -> Bytes {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

fn framed(message: &FlightData) -> Vec<u8> {
    let encoded = message.encode_to_vec();
    let mut out = vec![0u8];
    out.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
    out.extend_from_slice(&encoded);
    out
}

type TestBody = http_body_util::StreamBody<
    futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Status>>>,
>;

/// `wire` cut into DATA frames at the given lengths, the rest in one.
fn body_of(wire: &[u8], cuts: impl IntoIterator<Item = usize>) -> TestBody {
    let mut frames = Vec::new();
    let mut rest = wire;
    for cut in cuts {
        let cut = cut.min(rest.len());
        frames.push(Ok(Frame::data(Bytes::copy_from_slice(&rest[..cut]))));
        rest = &rest[cut..];
    }
    if !rest.is_empty() {
        frames.push(Ok(Frame::data(Bytes::copy_from_slice(rest))));
    }
    http_body_util::StreamBody::new(futures::stream::iter(frames))
}

fn read_all<B>(body: B, max: usize) -> Vec<Result<FlightData, Status>>
where
    B: Body<Data = Bytes, Error = Status> + Unpin,
{
    futures::executor::block_on(PutMessages::new(body, max).collect())
}

fn batch_message(rows: &[(u64, usize)], seq: u64) -> FlightData {
    let mut builder = BatchBuilder::with_capacity(rows.len(), 1 << 20);
    for (i, &(offset, len)) in rows.iter().enumerate() {
        let data: Vec<u8> = (0..len).map(|j| (i * 31 + j) as u8).collect();
        builder.push_data(&format!("run/f{i}.xtc2"), 1, offset, &data);
    }
    builder.push_seal("run/done.xtc2", 2, 77, "crc64nvme:0000000000000000");
    let batch = builder.finish_encoded();
    FlightData {
        data_header: batch.header.clone(),
        data_body: batch.body.clone(),
        app_metadata: Bytes::copy_from_slice(&seq.to_be_bytes()),
        flight_descriptor: None,
    }
}

fn sample_messages(noise: &mut Noise) -> Vec<FlightData> {
    let mut messages = vec![
        FlightData {
            flight_descriptor: Some(FlightDescriptor::new_cmd(b"{\"source\":\"s\"}".to_vec())),
            ..FlightData::default()
        },
        FlightData::default(),
        batch_message(&[(0, 8192), (1 << 20, 70_000)], 0),
        batch_message(&[(777, 300_000)], 1),
    ];
    for seq in 2..12 {
        let len = noise.below(3) as usize * 5000 + noise.below(300) as usize;
        let header_len = noise.below(40) as usize;
        messages.push(FlightData {
            data_header: noise.bytes(header_len),
            app_metadata: noise.bytes(8),
            data_body: noise.bytes(len),
            flight_descriptor: (seq % 3 == 0).then(|| FlightDescriptor::new_path(vec!["p".into()])),
        });
    }
    messages
}

/// However the stream is cut into frames, the messages come out as sent.
#[test]
fn messages_survive_any_framing() {
    let mut noise = Noise(0x5eed);
    for round in 0..80 {
        let messages = sample_messages(&mut noise);
        let wire: Vec<u8> = messages.iter().flat_map(framed).collect();
        let cuts: Vec<usize> = match round {
            0 => vec![1; wire.len()],
            1 => vec![],
            _ => (0..wire.len())
                .map(|_| 1 + noise.below(if round % 2 == 0 { 9 } else { 70_000 }) as usize)
                .collect(),
        };
        let read = read_all(body_of(&wire, cuts), 64 << 20);
        let read: Vec<FlightData> = read.into_iter().map(|m| m.expect("decodes")).collect();
        assert_eq!(read, messages, "round {round}");
    }
}

/// Fields in an order prost never writes and unknown fields decode as
/// prost decodes them; a repeated body is refused (no encoder writes one,
/// and each would be a buffer to allocate).
#[test]
fn field_order_and_unknown_fields_follow_protobuf() {
    use prost::encoding::{WireType, encode_key, encode_varint};
    let mut encoded = Vec::new();
    encode_key(7, WireType::Varint, &mut encoded);
    encode_varint(300, &mut encoded);
    encode_key(1000, WireType::LengthDelimited, &mut encoded);
    encode_varint(5, &mut encoded);
    encoded.extend_from_slice(b"final");
    encode_key(8, WireType::ThirtyTwoBit, &mut encoded);
    encoded.extend_from_slice(&[1, 2, 3, 4]);
    encode_key(9, WireType::SixtyFourBit, &mut encoded);
    encoded.extend_from_slice(&[1; 8]);
    encode_key(2, WireType::LengthDelimited, &mut encoded);
    encode_varint(6, &mut encoded);
    encoded.extend_from_slice(b"header");
    let expected = FlightData::decode(&encoded[..]).unwrap();
    assert_eq!(&expected.data_body[..], b"final");
    let framed = |encoded: &[u8]| {
        let mut wire = vec![0u8];
        wire.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
        wire.extend_from_slice(encoded);
        wire
    };
    let wire = framed(&encoded);
    for step in [1, 2, 3, 7, 1000] {
        let read = read_all(body_of(&wire, vec![step; wire.len()]), 1 << 20);
        assert_eq!(read.len(), 1);
        assert_eq!(read[0].as_ref().unwrap(), &expected, "frames of {step}");
    }

    encode_key(1000, WireType::LengthDelimited, &mut encoded);
    encode_varint(3, &mut encoded);
    encoded.extend_from_slice(b"two");
    let status = refusal(&framed(&encoded), 1 << 20);
    assert!(status.message().contains("two bodies"), "{status:?}");
}

fn data_row_address(message: &FlightData, row: usize) -> usize {
    let decoded = crate::decode::message(message, true).expect("decodes");
    let crate::decode::Message::Batch(batch) = decoded else {
        panic!("not a batch")
    };
    let batch = crate::wire::RangeBatch::validate(batch).expect("valid");
    batch.row(row).data.as_ptr() as usize
}

/// Ranges at block-aligned offsets land on block-aligned addresses (the
/// watcher's layout: values first), and with the columns first (pyarrow's
/// layout) the largest range lands in its file offset's phase.
#[test]
fn the_largest_range_lies_aligned_like_its_file_offset() {
    let message = batch_message(&[(1 << 20, 64 << 10), (3 << 20, 256 << 10)], 9);
    let wire = framed(&message);
    let read = read_all(body_of(&wire, vec![1000; wire.len()]), 64 << 20);
    let read = read[0].as_ref().unwrap();
    assert_eq!(read, &message);
    for row in [0, 1] {
        assert_eq!(data_row_address(read, row) % BODY_ALIGNMENT, 0, "row {row}");
    }

    let mut builder = BatchBuilder::with_capacity(2, 1 << 20);
    builder.push_data("a", 1, 100, &[1; 5000]);
    builder.push_data("b", 1, 12_345, &vec![2; 300_000]);
    let batch = builder.finish();
    let ipc = arrow_flight::utils::batches_to_flight_data(&crate::schema::range_schema(), [&batch])
        .expect("encode");
    let mut message = ipc[1].clone();
    message.app_metadata = Bytes::from_static(&[0; 8]);
    let wire = framed(&message);
    let read = read_all(body_of(&wire, vec![4096; wire.len()]), 64 << 20);
    let read = read[0].as_ref().unwrap();
    assert_eq!(read, &message);
    assert_eq!(
        data_row_address(read, 1) % BODY_ALIGNMENT,
        12_345 % BODY_ALIGNMENT
    );
}

/// The watcher reads a batch's first large row at a lead in its file
/// offset's phase: received, the row lies aligned like its file offset.
#[test]
fn a_watcher_row_at_an_unaligned_offset_is_received_in_phase() {
    let row = vec![7u8; 300_000];
    let mut builder = BatchBuilder::with_capacity(1, 1 << 20);
    builder
        .push_data_in_place::<()>("f", 1, 12_345, 1 << 20, |room| {
            for (slot, byte) in room.iter_mut().zip(&row) {
                slot.write(*byte);
            }
            let (filled, _) = room.split_at_mut(row.len());
            // SAFETY: the first `row.len()` slots were written just above.
            Ok(unsafe { &mut *(filled as *mut [std::mem::MaybeUninit<u8>] as *mut [u8]) })
        })
        .unwrap();
    let batch = builder.finish_encoded();
    let message = FlightData {
        data_header: batch.header.clone(),
        data_body: batch.body.clone(),
        app_metadata: Bytes::from_static(&[0; 8]),
        flight_descriptor: None,
    };
    let wire = framed(&message);
    let read = read_all(body_of(&wire, vec![65_536; wire.len()]), 64 << 20);
    let read = read[0].as_ref().unwrap();
    assert_eq!(
        data_row_address(read, 0) % BODY_ALIGNMENT,
        12_345 % BODY_ALIGNMENT
    );
}

fn refusal(wire: &[u8], max: usize) -> Status {
    let read = read_all(body_of(wire, vec![3; wire.len()]), max);
    let last = read.into_iter().last().expect("something was read");
    last.expect_err("the stream should end in an error")
}

#[test]
fn bad_framing_is_refused_with_what_was_wrong() {
    let message = batch_message(&[(0, 10_000)], 0);
    let wire = framed(&message);

    let status = refusal(&wire, 1000);
    assert_eq!(status.code(), Code::OutOfRange);
    assert!(status.message().contains("too large") && status.message().contains("1000"));

    let mut compressed = wire.clone();
    compressed[0] = 1;
    assert_eq!(refusal(&compressed, 1 << 20).code(), Code::Unimplemented);

    let status = refusal(&wire[..wire.len() - 10], 1 << 20);
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("10 bytes"), "{status:?}");

    let status = refusal(&wire[..3], 1 << 20);
    assert!(status.message().contains("prefix"), "{status:?}");

    // A field longer than its message.
    let mut wire = vec![0u8, 0, 0, 0, 4];
    wire.extend_from_slice(&[0x12, 0x7f, 1, 2]);
    assert_eq!(refusal(&wire, 1 << 20).code(), Code::InvalidArgument);

    // A group, which FlightData never has.
    let wire = [0u8, 0, 0, 0, 2, 0x0b, 0x0c];
    assert!(refusal(&wire, 1 << 20).message().contains("wire type"));
}

/// An error from the connection ends the stream with that error, and
/// nothing is read after it.
#[test]
fn a_body_error_passes_through_and_ends_the_stream() {
    let wire = framed(&batch_message(&[(0, 10_000)], 0));
    let frames: VecDeque<Result<Frame<Bytes>, Status>> = [
        Ok(Frame::data(Bytes::copy_from_slice(&wire[..100]))),
        Err(Status::cancelled("the peer went away")),
        Ok(Frame::data(Bytes::copy_from_slice(&wire[100..]))),
    ]
    .into();
    let body = http_body_util::StreamBody::new(futures::stream::iter(frames));
    let read = read_all(body, 1 << 20);
    assert_eq!(read.len(), 1);
    assert_eq!(read[0].as_ref().unwrap_err().code(), Code::Cancelled);
}

/// Random bytes, and valid streams with bytes changed or cut, never panic:
/// they end in messages and at most one error, after which nothing more
/// is read.
#[test]
fn damaged_streams_end_in_an_error_never_a_panic() {
    let mut noise = Noise(0xbad5eed);
    let valid: Vec<u8> = sample_messages(&mut noise)
        .iter()
        .flat_map(framed)
        .collect();
    for case in 0..200 {
        let mut wire = if case % 3 == 0 {
            let len = 1 + noise.below(3000) as usize;
            noise.bytes(len).to_vec()
        } else {
            valid.clone()
        };
        if case % 3 != 0 {
            for _ in 0..1 + noise.below(8) {
                let at = noise.below(wire.len() as u64) as usize;
                wire[at] = noise.next() as u8;
            }
            if case % 3 == 2 {
                wire.truncate(noise.below(wire.len() as u64) as usize);
            }
        }
        let cuts: Vec<usize> = (0..wire.len())
            .map(|_| 1 + noise.below(5000) as usize)
            .collect();
        let read = read_all(body_of(&wire, cuts), 1 << 20);
        let errors = read.iter().filter(|m| m.is_err()).count();
        assert!(errors <= 1, "case {case}: {errors} errors");
        if errors == 1 {
            assert!(read.last().is_some_and(Result::is_err), "case {case}");
        }
    }
}
