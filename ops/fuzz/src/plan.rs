//! A DoPut stream as the fuzzer thinks of it, before it becomes bytes: the
//! hello, the schema message and batches of rows, each field free to hold
//! what no watcher would send. [`Plan::valid`] makes one a real watcher
//! could have sent, with the files it must leave behind; [`Plan::encode`]
//! turns any plan into the Flight messages of a stream.

use std::sync::Arc;

use arrow_array::{
    ArrayRef, BinaryArray, RecordBatch, StringArray, UInt8Array, UInt32Array, UInt64Array,
};
use arrow_flight::{FlightData, FlightDescriptor};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use bytes::Bytes;
use flight_server::checksum::{crc32c, crc64nvme, crc64nvme_digest};
use flight_server::protocol::{PROTOCOL_VERSION, encode_seq};
use flight_server::range_schema;
use rand::Rng;
use rand::rngs::SmallRng;

/// One row, every column as it goes on the wire.
#[derive(Clone, Debug)]
pub struct Row {
    pub kind: u8,
    pub file_key: String,
    pub generation: u64,
    pub offset: u64,
    pub data: Vec<u8>,
    pub crc32c: u32,
    pub path: Option<String>,
    pub digest: Option<String>,
}

impl Row {
    pub fn data(file_key: &str, generation: u64, offset: u64, data: Vec<u8>) -> Self {
        Self {
            kind: 0,
            file_key: file_key.to_owned(),
            generation,
            offset,
            crc32c: crc32c(&data),
            data,
            path: None,
            digest: None,
        }
    }

    fn control(kind: u8, file_key: &str, generation: u64) -> Self {
        Self {
            kind,
            file_key: file_key.to_owned(),
            generation,
            offset: 0,
            data: Vec::new(),
            crc32c: 0,
            path: None,
            digest: None,
        }
    }
}

/// How a batch's columns are declared when it is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Columns {
    /// The range schema.
    Range,
    /// Every column nullable, with a null in each: the stream's schema still
    /// says they are not (a hand-made client's mistake).
    NullsInRequired,
}

#[derive(Clone, Debug)]
pub struct Batch {
    pub rows: Vec<Row>,
    /// The batch's app_metadata (its sequence number, 8 bytes big-endian).
    pub app_metadata: Vec<u8>,
    pub columns: Columns,
}

/// What goes where the schema message belongs.
#[derive(Clone, Debug)]
pub enum SchemaMessage {
    Range,
    Missing,
    /// A schema other than the range schema.
    Other(SchemaRef),
}

/// A whole DoPut stream.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The descriptor's command of the first message (the hello); `None`:
    /// no descriptor at all.
    pub hello: Option<Vec<u8>>,
    pub schema: SchemaMessage,
    pub batches: Vec<Batch>,
}

/// What a valid plan must leave in the sink's root: `<source>/<path>` with
/// these bytes.
#[derive(Clone, Debug)]
pub struct Expected {
    pub source: String,
    pub files: Vec<(String, Vec<u8>)>,
}

/// Sources the cases speak for: a few, so per-source state is shared and
/// exercised across cases.
pub const SOURCES: [&str; 4] = ["det-a", "det-b", "cam.1", "daq_02"];

pub fn hello(source: &str) -> Vec<u8> {
    serde_json::json!({ "protocol": PROTOCOL_VERSION, "source": source })
        .to_string()
        .into_bytes()
}

impl Plan {
    /// A stream a watcher could have sent: 1-3 files, each at a path of
    /// its own (unique to `case`, so cases do not wait on each other's
    /// gaps), written in order in pieces, maybe renamed, maybe sealed; the
    /// rows spread over 1-4 batches in order.
    pub fn valid(rng: &mut SmallRng, case: u64) -> (Self, Expected) {
        let source = SOURCES[rng.random_range(0..SOURCES.len())];
        let mut rows = Vec::new();
        let mut files = Vec::new();
        for file in 0..rng.random_range(1..=3u32) {
            // A file's key is its path when first seen; generation 1 needs
            // no open row (a watcher sends one only for later generations,
            // and waits for its ack before the data).
            let key = if rng.random_bool(0.5) {
                format!("run{}/c{case}-{file}.xtc2", case % 7)
            } else {
                format!("k{case}-{file}")
            };
            let mut path = key.clone();
            let mut content = Vec::new();
            for _ in 0..rng.random_range(0..=4u32) {
                let len = match rng.random_range(0..10u32) {
                    0 => 0,
                    1 => rng.random_range(60_000..70_000),
                    _ => rng.random_range(1..2_000),
                };
                let piece: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                rows.push(Row::data(&key, 1, content.len() as u64, piece.clone()));
                content.extend(piece);
            }
            if rng.random_bool(0.25) {
                path = format!("renamed/c{case}-{file}.done");
                let mut rename = Row::control(2, &key, 1);
                rename.path = Some(path.clone());
                rows.push(rename);
            }
            if rng.random_bool(0.4) {
                let mut seal = Row::control(3, &key, 1);
                seal.offset = content.len() as u64;
                seal.digest = Some(crc64nvme_digest(crc64nvme(&content)));
                rows.push(seal);
            }
            files.push((path, content));
        }
        let cuts = rng.random_range(1..=4usize).min(rows.len().max(1));
        let per_batch = rows.len().div_ceil(cuts).max(1);
        let batches = rows
            .chunks(per_batch)
            .enumerate()
            .map(|(i, chunk)| Batch {
                rows: chunk.to_vec(),
                app_metadata: encode_seq(i as u64 + 1).to_vec(),
                columns: Columns::Range,
            })
            .collect();
        (
            Self {
                hello: Some(hello(source)),
                schema: SchemaMessage::Range,
                batches,
            },
            Expected {
                source: source.to_owned(),
                files,
            },
        )
    }

    /// The stream's Flight messages: the hello on the first, then the
    /// schema (unless missing), then the batches.
    pub fn encode(&self) -> Result<Vec<FlightData>, String> {
        let mut messages = Vec::new();
        match &self.schema {
            SchemaMessage::Range => messages.push(schema_message(&range_schema())?),
            SchemaMessage::Missing => {}
            SchemaMessage::Other(schema) => messages.push(schema_message(schema)?),
        }
        for batch in &self.batches {
            let mut message = batch_message(batch)?;
            message.app_metadata = Bytes::from(batch.app_metadata.clone());
            messages.push(message);
        }
        if messages.is_empty() {
            messages.push(FlightData::default());
        }
        if let Some(cmd) = &self.hello {
            messages[0].flight_descriptor = Some(FlightDescriptor::new_cmd(cmd.clone()));
        }
        Ok(messages)
    }
}

fn schema_message(schema: &Schema) -> Result<FlightData, String> {
    arrow_flight::utils::batches_to_flight_data(schema, std::iter::empty::<&RecordBatch>())
        .map_err(|e| format!("encoding a schema: {e}"))?
        .into_iter()
        .next()
        .ok_or_else(|| "the encoder made no schema message".to_string())
}

/// The range schema with every field nullable.
fn nullable_schema() -> SchemaRef {
    let fields: Vec<Field> = range_schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    Arc::new(Schema::new(fields))
}

fn batch_message(batch: &Batch) -> Result<FlightData, String> {
    let rows = &batch.rows;
    let nulls = batch.columns == Columns::NullsInRequired;
    // The first row of each column is null when nulls are asked for.
    let null_first = |i: usize| nulls && i == 0;
    let columns: Vec<ArrayRef> = vec![
        Arc::new(UInt8Array::from_iter(
            rows.iter()
                .enumerate()
                .map(|(i, r)| (!null_first(i)).then_some(r.kind)),
        )),
        Arc::new(StringArray::from_iter(
            rows.iter()
                .enumerate()
                .map(|(i, r)| (!null_first(i)).then_some(r.file_key.as_str())),
        )),
        Arc::new(UInt64Array::from_iter(
            rows.iter().map(|r| Some(r.generation)),
        )),
        Arc::new(UInt64Array::from_iter(rows.iter().map(|r| Some(r.offset)))),
        Arc::new(BinaryArray::from_iter(
            rows.iter()
                .enumerate()
                .map(|(i, r)| (!null_first(i)).then_some(r.data.as_slice())),
        )),
        Arc::new(UInt32Array::from_iter(rows.iter().map(|r| Some(r.crc32c)))),
        Arc::new(StringArray::from_iter(
            rows.iter().map(|r| r.path.as_deref()),
        )),
        Arc::new(StringArray::from_iter(
            rows.iter().map(|r| r.digest.as_deref()),
        )),
    ];
    let schema = if nulls {
        nullable_schema()
    } else {
        range_schema()
    };
    let record = RecordBatch::try_new(schema.clone(), columns)
        .map_err(|e| format!("building a record batch: {e}"))?;
    let messages = arrow_flight::utils::batches_to_flight_data(&schema, [&record])
        .map_err(|e| format!("encoding a record batch: {e}"))?;
    messages
        .into_iter()
        .nth(1)
        .ok_or_else(|| "the encoder made no batch message".to_string())
}

/// A schema other than the range schema, for streams that send one.
pub fn other_schema(rng: &mut SmallRng) -> SchemaRef {
    let mut fields: Vec<Field> = range_schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    match rng.random_range(0..4u32) {
        0 => fields.reverse(),
        1 => {
            fields.pop();
        }
        2 => fields.push(Field::new("extra", DataType::Utf8, true)),
        _ => fields[3] = Field::new("offset", DataType::Int64, false),
    }
    Arc::new(Schema::new(fields))
}
