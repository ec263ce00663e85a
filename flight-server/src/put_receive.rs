//! The DoPut request body read into messages with one copy of each byte.
//!
//! tonic's decoder copies every HTTP/2 DATA frame into a buffer of its own
//! before it decodes a message, and each message it splits off leaves the
//! next one a fresh allocation (docs/profile.md: a sixth of the sink's
//! CPU). Here the gRPC framing and the FlightData fields are followed by
//! hand as the frames arrive: the small fields are gathered and decoded by
//! prost, and the body's bytes go from the frames straight into the body's
//! own buffer. That buffer is laid out so that the largest range's bytes sit
//! at an address aligned like their offset in the file, so the sink writes
//! their aligned middle with O_DIRECT from where they are, without a staging
//! copy. The layout is only a hint: any body, however laid out, decodes the
//! same.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use arrow_flight::FlightData;
use bytes::{Buf, Bytes, BytesMut};
use futures::Stream;
use http_body::Body;
use prost::Message;
use tonic::Status;

/// The alignment a range's bytes are given in memory: that of direct writes
/// on 4 KiB pages. On a host with larger pages the sink's direct writes
/// need more, and it stages them through its aligned buffers instead.
pub(crate) const BODY_ALIGNMENT: usize = 4096;

/// `FlightData.data_body`.
const DATA_BODY_FIELD: u64 = 1000;
const PREFIX_BYTES: usize = 5;
/// A protobuf key and a length: two varints of at most 10 bytes each.
const MAX_FIELD_HEADER: usize = 20;
/// Bodies shorter than this are not laid out: no range in them reaches a
/// sink's direct-write minimum.
const MIN_ALIGNED_BODY: usize = 64 << 10;
/// The body's bytes before the data values kept aside to choose the layout:
/// the small columns of a batch of many thousand rows. A body whose values
/// begin later is laid out at once.
const MAX_PRELUDE: usize = 1 << 20;

/// The messages of a DoPut request body.
pub(crate) struct PutMessages<B> {
    body: B,
    /// What is left of the DATA frame being read.
    frame: Bytes,
    ended: bool,
    failed: bool,
    max_message_bytes: usize,
    message: Assembly,
}

impl<B> PutMessages<B> {
    pub(crate) fn new(body: B, max_message_bytes: usize) -> Self {
        Self {
            body,
            frame: Bytes::new(),
            ended: false,
            failed: false,
            max_message_bytes,
            message: Assembly::default(),
        }
    }
}

impl<B> Stream for PutMessages<B>
where
    B: Body<Data = Bytes, Error = Status> + Unpin,
{
    type Item = Result<FlightData, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.failed {
            return Poll::Ready(None);
        }
        loop {
            match this
                .message
                .advance(&mut this.frame, this.max_message_bytes)
            {
                Ok(Some(message)) => return Poll::Ready(Some(Ok(message))),
                Ok(None) => {}
                Err(status) => {
                    this.failed = true;
                    return Poll::Ready(Some(Err(status)));
                }
            }
            if this.ended {
                return Poll::Ready(match this.message.missing() {
                    None => None,
                    Some(missing) => {
                        this.failed = true;
                        Some(Err(Status::invalid_argument(format!(
                            "the DoPut stream ended inside a message: {missing}"
                        ))))
                    }
                });
            }
            match ready!(Pin::new(&mut this.body).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        this.frame = data;
                    }
                }
                Some(Err(status)) => {
                    this.failed = true;
                    return Poll::Ready(Some(Err(status)));
                }
                None => this.ended = true,
            }
        }
    }
}

/// One message while it arrives.
#[derive(Default)]
struct Assembly {
    prefix: [u8; PREFIX_BYTES],
    prefix_len: usize,
    /// The message's length and the bytes of it still to come, once its
    /// prefix is complete.
    length: Option<(u64, u64)>,
    /// The fields other than the body, as they were encoded.
    head: BytesMut,
    field: Field,
    body: Option<Bytes>,
}

/// Where a message's reading stands within its fields.
enum Field {
    /// At the start of a field: its key (and length) so far.
    Header {
        bytes: [u8; MAX_FIELD_HEADER],
        len: usize,
    },
    /// Copying a small field's value into the head.
    Small { left: u64 },
    /// Reading the body.
    Body(BodyBuffer),
}

impl Default for Field {
    fn default() -> Self {
        Self::Header {
            bytes: [0; MAX_FIELD_HEADER],
            len: 0,
        }
    }
}

fn malformed(detail: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("a malformed DoPut message: {detail}"))
}

impl Assembly {
    /// Reads from `frame` until a message is complete (returned) or the
    /// frame is used up.
    fn advance(
        &mut self,
        frame: &mut Bytes,
        max_message_bytes: usize,
    ) -> Result<Option<FlightData>, Status> {
        loop {
            let Some((length, left)) = self.length else {
                if frame.is_empty() {
                    return Ok(None);
                }
                let take = (PREFIX_BYTES - self.prefix_len).min(frame.len());
                self.prefix[self.prefix_len..self.prefix_len + take]
                    .copy_from_slice(&frame[..take]);
                frame.advance(take);
                self.prefix_len += take;
                if self.prefix_len < PREFIX_BYTES {
                    return Ok(None);
                }
                if self.prefix[0] != 0 {
                    return Err(Status::unimplemented(
                        "a compressed DoPut message: this sink accepts uncompressed messages only",
                    ));
                }
                let mut be = [0u8; 4];
                be.copy_from_slice(&self.prefix[1..]);
                let length = u64::from(u32::from_be_bytes(be));
                if length > max_message_bytes as u64 {
                    return Err(Status::out_of_range(format!(
                        "a DoPut message too large: {length} bytes, the limit is {max_message_bytes} bytes"
                    )));
                }
                self.length = Some((length, length));
                if length == 0 {
                    return self.finish().map(Some);
                }
                continue;
            };
            if frame.is_empty() {
                return Ok(None);
            }
            let used = match &mut self.field {
                Field::Header { bytes, len } => {
                    bytes[*len] = frame[0];
                    *len += 1;
                    frame.advance(1);
                    // This byte is the header's; what follows it must hold the value.
                    let room = left - 1;
                    let header = parse_field_header(&bytes[..*len], room)?;
                    if let Some(header) = header {
                        let encoded = &bytes[..*len];
                        self.field = match header {
                            FieldHeader::Body(_) if self.body.is_some() => {
                                return Err(malformed(
                                    "a message with two bodies (FlightData.data_body repeated)",
                                ));
                            }
                            FieldHeader::Body(body_len) => {
                                Field::Body(BodyBuffer::new(body_len, &self.head))
                            }
                            FieldHeader::Small(value_len) => {
                                self.head.extend_from_slice(encoded);
                                Field::Small { left: value_len }
                            }
                        };
                    } else if *len == MAX_FIELD_HEADER {
                        return Err(malformed("a field's key and length run over 20 bytes"));
                    }
                    1
                }
                Field::Small { left } => {
                    let take = (*left).min(frame.len() as u64) as usize;
                    self.head.extend_from_slice(&frame[..take]);
                    frame.advance(take);
                    *left -= take as u64;
                    take
                }
                Field::Body(body) => {
                    let take = body.left().min(frame.len());
                    body.extend(&frame[..take]);
                    frame.advance(take);
                    take
                }
            };
            let left = left
                .checked_sub(used as u64)
                .ok_or_else(|| malformed("a field runs past the message's end"))?;
            self.length = Some((length, left));
            self.end_field_if_done();
            if left == 0 {
                if !matches!(self.field, Field::Header { len: 0, .. }) {
                    return Err(malformed(format!(
                        "the {length}-byte message ends inside a field"
                    )));
                }
                return self.finish().map(Some);
            }
        }
    }

    fn end_field_if_done(&mut self) {
        let done = match &self.field {
            Field::Header { .. } => false,
            Field::Small { left } => *left == 0,
            Field::Body(body) => body.left() == 0,
        };
        if done && let Field::Body(body) = std::mem::take(&mut self.field) {
            // A repeated body field: the last one counts, as in protobuf.
            self.body = Some(body.finish());
        }
    }

    fn finish(&mut self) -> Result<FlightData, Status> {
        self.prefix_len = 0;
        self.length = None;
        self.field = Field::default();
        let head = self.head.split().freeze();
        let mut message = FlightData::decode(head).map_err(malformed)?;
        message.data_body = self.body.take().unwrap_or_default();
        Ok(message)
    }

    /// What a stream that ends here leaves missing, if it ends inside a message.
    fn missing(&self) -> Option<String> {
        match self.length {
            Some((length, left)) => Some(format!("{left} bytes of {length} never came")),
            None if self.prefix_len > 0 => Some("its 5-byte prefix was cut short".into()),
            None => None,
        }
    }
}

enum FieldHeader {
    Body(usize),
    /// Any other field, with the bytes of its value still to come.
    Small(u64),
}

/// Decodes a field's key (and length), once `bytes` holds all of it;
/// `room` is what the message has left after it.
fn parse_field_header(bytes: &[u8], room: u64) -> Result<Option<FieldHeader>, Status> {
    let Some((key, key_len)) = varint(bytes)? else {
        return Ok(None);
    };
    let rest = &bytes[key_len..];
    let (tag, wire_type) = (key >> 3, key & 7);
    if tag == 0 {
        return Err(malformed("a field numbered 0"));
    }
    match wire_type {
        // A varint value: the header holds it once it is complete.
        0 => Ok(varint(rest)?.map(|_| FieldHeader::Small(0))),
        1 => Ok(Some(FieldHeader::Small(8))),
        5 => Ok(Some(FieldHeader::Small(4))),
        2 => {
            let Some((len, _)) = varint(rest)? else {
                return Ok(None);
            };
            if len > room {
                return Err(malformed(format!(
                    "a field of {len} bytes where the message has {room} left"
                )));
            }
            if tag == DATA_BODY_FIELD {
                // Bounded by the message limit, itself under 4 GiB.
                let len = usize::try_from(len).map_err(malformed)?;
                Ok(Some(FieldHeader::Body(len)))
            } else {
                Ok(Some(FieldHeader::Small(len)))
            }
        }
        other => Err(malformed(format!(
            "field {tag} has wire type {other}, which FlightData never uses"
        ))),
    }
}

/// A varint at the start of `bytes`: `None` while incomplete.
fn varint(bytes: &[u8]) -> Result<Option<(u64, usize)>, Status> {
    let mut value = 0u64;
    for (i, &byte) in bytes.iter().enumerate() {
        if i == 10 {
            return Err(malformed("a varint over 10 bytes"));
        }
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(Some((value, i + 1)));
        }
    }
    if bytes.len() > 10 {
        return Err(malformed("a varint over 10 bytes"));
    }
    Ok(None)
}

/// A message body while it arrives: its first bytes are kept aside until
/// the data values begin, then the buffer is laid out (see the module
/// documentation) and the rest is copied into it as it comes.
struct BodyBuffer {
    len: usize,
    /// Where the data values begin in the body and where the columns that
    /// choose the layout lie, if the IPC header says so.
    layout: Option<BatchLayout>,
    prelude: Vec<u8>,
    /// The buffer and the padding before the body in it, once laid out.
    buffer: Option<(Vec<u8>, usize)>,
}

impl BodyBuffer {
    fn new(len: usize, head: &[u8]) -> Self {
        if len < MIN_ALIGNED_BODY {
            return Self {
                len,
                layout: None,
                prelude: Vec::new(),
                buffer: Some((Vec::with_capacity(len), 0)),
            };
        }
        let layout = BatchLayout::of(head).filter(|layout| layout.values_at <= len);
        let mut body = Self {
            len,
            layout,
            prelude: Vec::new(),
            buffer: None,
        };
        if !body.layout.as_ref().is_some_and(|l| l.columns_first) {
            body.lay_out();
        }
        body
    }

    fn received(&self) -> usize {
        match &self.buffer {
            Some((buffer, pad)) => buffer.len() - pad,
            None => self.prelude.len(),
        }
    }

    fn left(&self) -> usize {
        self.len - self.received()
    }

    fn extend(&mut self, mut bytes: &[u8]) {
        if self.buffer.is_none() {
            let values_at = self.layout.as_ref().map_or(0, |layout| layout.values_at);
            let take = (values_at - self.prelude.len()).min(bytes.len());
            self.prelude.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.prelude.len() < values_at {
                return;
            }
            self.lay_out();
        }
        if let Some((buffer, _)) = &mut self.buffer {
            buffer.extend_from_slice(bytes);
        }
    }

    /// Allocates the buffer, with the data values at the phase of the
    /// largest range when the columns that tell it came first (pyarrow's
    /// order), else on a page boundary (tailflight's watcher puts the values
    /// first: ranges read at block-aligned file offsets stay aligned).
    fn lay_out(&mut self) {
        let values_at = self.layout.as_ref().map_or(0, |layout| layout.values_at);
        let phase = self
            .layout
            .as_ref()
            .filter(|layout| layout.columns_first)
            .and_then(|layout| layout.largest_range_phase(&self.prelude))
            .unwrap_or(0);
        let mut buffer = Vec::with_capacity(self.len + 2 * BODY_ALIGNMENT);
        // The padding that puts the values at `phase`, from the address the
        // allocation got.
        let values_address = buffer.as_ptr() as usize + values_at;
        let pad = (phase + BODY_ALIGNMENT - values_address % BODY_ALIGNMENT) % BODY_ALIGNMENT;
        buffer.resize(pad, 0);
        buffer.extend_from_slice(&self.prelude);
        self.prelude = Vec::new();
        self.buffer = Some((buffer, pad));
    }

    fn finish(mut self) -> Bytes {
        if self.buffer.is_none() {
            self.lay_out();
        }
        match self.buffer {
            Some((buffer, pad)) => Bytes::from(buffer).slice(pad..),
            None => Bytes::new(),
        }
    }
}

/// Where a batch body's columns lie, from its IPC header: the data values,
/// and the columns that tell each range's file offset and place in them.
struct BatchLayout {
    /// Whether the columns that choose the phase precede the values.
    columns_first: bool,
    rows: usize,
    values_at: usize,
    kinds: std::ops::Range<usize>,
    offsets: std::ops::Range<usize>,
    value_offsets: std::ops::Range<usize>,
}

/// Buffer positions in a range batch's body (validity, offsets and values
/// of each column in schema order, as Arrow IPC lays them out).
const KIND_VALUES: usize = 1;
const OFFSET_VALUES: usize = 8;
const DATA_OFFSETS: usize = 10;
const DATA_VALUES: usize = 11;
const RANGE_BATCH_BUFFERS: usize = 20;

impl BatchLayout {
    /// The layout of a body whose message's fields so far are `head`, if
    /// they carry a range batch's IPC header.
    fn of(head: &[u8]) -> Option<Self> {
        let header = FlightData::decode(head).ok()?.data_header;
        let message = arrow_ipc::root_as_message(&header).ok()?;
        let batch = message.header_as_record_batch()?;
        let buffers = batch.buffers()?;
        if buffers.len() != RANGE_BATCH_BUFFERS || batch.compression().is_some() {
            return None;
        }
        let span = |i: usize| {
            let buffer = buffers.get(i);
            let start = usize::try_from(buffer.offset()).ok()?;
            let end = start.checked_add(usize::try_from(buffer.length()).ok()?)?;
            Some(start..end)
        };
        let values_at = span(DATA_VALUES)?.start;
        let kinds = span(KIND_VALUES)?;
        let offsets = span(OFFSET_VALUES)?;
        let value_offsets = span(DATA_OFFSETS)?;
        let columns_first = values_at <= MAX_PRELUDE
            && [&kinds, &offsets, &value_offsets]
                .iter()
                .all(|span| span.end <= values_at);
        Some(Self {
            columns_first,
            rows: usize::try_from(batch.length()).ok()?,
            values_at,
            kinds,
            offsets,
            value_offsets,
        })
    }

    /// The address, modulo the alignment, at which the values should begin
    /// so that the largest data range lies aligned like its file offset.
    fn largest_range_phase(&self, prelude: &[u8]) -> Option<usize> {
        let kinds = prelude.get(self.kinds.clone())?;
        let offsets = prelude.get(self.offsets.clone())?;
        let value_offsets = prelude.get(self.value_offsets.clone())?;
        let mut largest: Option<(i64, usize)> = None;
        for row in 0..self.rows {
            if *kinds.get(row)? != crate::schema::RowKind::Data as u8 {
                continue;
            }
            let at = |bytes: &[u8], i: usize, width: usize| {
                bytes.get(i * width..(i + 1) * width).map(|b| {
                    b.iter()
                        .rev()
                        .fold(0u64, |v, &byte| v << 8 | u64::from(byte))
                })
            };
            let start = at(value_offsets, row, 4)? as u32 as i32;
            let end = at(value_offsets, row + 1, 4)? as u32 as i32;
            let len = i64::from(end) - i64::from(start);
            if largest.is_none_or(|(longest, _)| len > longest) {
                let file_offset = at(offsets, row, 8)?;
                let align = BODY_ALIGNMENT as u64;
                let phase =
                    (file_offset % align + align - u64::try_from(start).ok()? % align) % align;
                largest = Some((len, phase as usize));
            }
        }
        largest.map(|(_, phase)| phase)
    }
}

#[cfg(test)]
mod tests;
