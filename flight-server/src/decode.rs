//! Arrow IPC decoding of incoming DoPut messages, without copying their bodies.
//!
//! arrow-flight's stream decoder copies every record batch body whose
//! address is not 64-byte aligned, and a body that prost slices out of a
//! gRPC message never is: at full rate that copy cost the sink a tenth of
//! its CPU. The only buffer that matters here is the `data` column's values,
//! which need no alignment, so the body is wrapped as it is and arrow-ipc
//! realigns just the small buffers that need it.

use std::collections::HashMap;

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_flight::FlightData;
use arrow_ipc::MessageHeader;

use crate::schema::range_schema;

/// What one FlightData message carried.
pub(crate) enum Message {
    /// No IPC header (e.g. a message carrying only a descriptor).
    Empty,
    /// The stream's schema, checked to be the range schema.
    Schema,
    Batch(RecordBatch),
}

/// Decodes one message; `schema_seen` says whether the schema came before.
pub(crate) fn message(data: &FlightData, schema_seen: bool) -> Result<Message, String> {
    if data.data_header.is_empty() {
        return Ok(Message::Empty);
    }
    let header = arrow_ipc::root_as_message(&data.data_header[..])
        .map_err(|e| format!("the IPC header is not a valid flatbuffer: {e}"))?;
    match header.header_type() {
        MessageHeader::Schema => {
            let ipc_schema = header
                .header_as_schema()
                .ok_or("a Schema message without a schema")?;
            let schema = arrow_ipc::convert::try_fb_to_schema(ipc_schema)
                .map_err(|e| format!("cannot decode the schema: {e}"))?;
            if schema.fields() != range_schema().fields() {
                return Err(format!(
                    "stream schema is not the tailflight range schema (nullability included): got {:?}",
                    schema.fields()
                ));
            }
            Ok(Message::Schema)
        }
        MessageHeader::RecordBatch => {
            if !schema_seen {
                return Err("a record batch before the schema".into());
            }
            let batch = header
                .header_as_record_batch()
                .ok_or("a RecordBatch message without a record batch")?;
            // arrow-ipc slices each buffer out of the body and panics on
            // one that lies outside it: refuse those here, with what they are.
            for (i, buffer) in batch.buffers().into_iter().flatten().enumerate() {
                let (offset, length) = (buffer.offset(), buffer.length());
                let inside = u64::try_from(offset)
                    .ok()
                    .zip(u64::try_from(length).ok())
                    .and_then(|(offset, length)| offset.checked_add(length))
                    .is_some_and(|end| end <= data.data_body.len() as u64);
                if !inside {
                    return Err(format!(
                        "buffer {i} (offset {offset}, length {length}) lies outside the {}-byte body",
                        data.data_body.len()
                    ));
                }
            }
            let body = Buffer::from(data.data_body.clone());
            arrow_ipc::reader::read_record_batch(
                &body,
                batch,
                range_schema(),
                &HashMap::new(),
                None,
                &header.version(),
            )
            .map(Message::Batch)
            .map_err(|e| format!("cannot decode the record batch: {e}"))
        }
        other => Err(format!(
            "unexpected IPC message {other:?}: a range stream has a schema, then record batches"
        )),
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::{Array, BinaryArray};

    use super::*;
    use crate::wire::BatchBuilder;

    fn encoded() -> (RecordBatch, Vec<FlightData>) {
        let mut builder = BatchBuilder::with_capacity(2, 1 << 20);
        builder.push_data("run/a.xtc2", 1, 0, &[7u8; 300_000]);
        builder.push_data("run/b.xtc2", 2, 4096, &[9u8; 700_001]);
        let batch = builder.finish();
        let messages =
            arrow_flight::utils::batches_to_flight_data(&range_schema(), [&batch]).expect("encode");
        (batch, messages)
    }

    #[test]
    fn a_batch_decodes_without_copying_its_data() {
        let (batch, messages) = encoded();
        assert!(matches!(message(&messages[0], false), Ok(Message::Schema)));
        let body = &messages[1].data_body;
        let Ok(Message::Batch(decoded)) = message(&messages[1], true) else {
            panic!("expected a batch");
        };
        assert_eq!(decoded, batch);
        let data = decoded
            .column_by_name("data")
            .and_then(|c| c.as_any().downcast_ref::<BinaryArray>())
            .expect("data column");
        let values = data.value_data().as_ptr_range();
        let body = body.as_ptr_range();
        assert!(
            body.start <= values.start && values.end <= body.end,
            "the data column was copied out of the message body"
        );
    }

    #[test]
    fn a_batch_before_the_schema_or_a_garbled_header_is_refused() {
        let (_, mut messages) = encoded();
        let Err(error) = message(&messages[1], false) else {
            panic!("a batch before the schema was accepted");
        };
        assert!(error.contains("before the schema"), "{error}");
        messages[1].data_header = bytes::Bytes::from_static(b"not a flatbuffer at all");
        assert!(message(&messages[1], true).is_err());
    }
}
