//! Live-tail subscriptions on the wire: the DoGet ticket a consumer sends,
//! the Arrow schema of what it receives, and the cursor that lets it resume.
//! JSON and Arrow only, so that any Flight client (pyarrow included) can
//! subscribe without tailflight code.
//!
//! A ticket names one source and globs over `<source>/<path>`:
//!
//! ```json
//! {"source": "hutch1", "globs": ["hutch1/xtc/*.xtc2*"], "start": "beginning",
//!  "follow": true, "max_batch_bytes": 4194304}
//! ```
//!
//! `start` is `beginning` (every durable byte of the matching files), `now`
//! (only what becomes durable after the subscription starts; files that
//! appear later from their first byte) or `cursor`, with `cursor` holding
//! what earlier streams' batches carried. Each batch's `app_metadata` is a
//! JSON [`CursorUpdate`]: the position, after the batch, of each file it
//! touched. A consumer merges them by file key (a newer generation replaces
//! an older one) and sends the merged cursor to resume exactly there.

use std::sync::{Arc, LazyLock};

use arrow_array::builder::{StringBuilder, UInt64Builder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use serde::{Deserialize, Serialize};

use crate::WireError;

/// Largest `max_batch_bytes` a ticket may ask for.
pub const MAX_BATCH_BYTES: u64 = 16 << 20;
/// `max_batch_bytes` when a ticket does not say.
pub const DEFAULT_BATCH_BYTES: u64 = 4 << 20;

/// Where a subscription starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Start {
    #[default]
    Beginning,
    Now,
    Cursor,
}

/// What a consumer asks for (the DoGet ticket, JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ticket {
    pub source: String,
    /// Globs over `<source>/<path>` (`*` within a name, `**` across
    /// directories); none means every file of the source.
    #[serde(default)]
    pub globs: Vec<String>,
    /// One file, by its key, whatever its name becomes (a listing's
    /// tickets name their file so: a rename between the listing and the
    /// DoGet does not lose it). Replaces the globs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_key: Option<String>,
    #[serde(default)]
    pub start: Start,
    /// With `start: cursor`: the positions earlier batches carried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<Vec<Position>>,
    /// Stay open and deliver new bytes as they become durable; otherwise
    /// end once what is durable now has been sent.
    #[serde(default)]
    pub follow: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_batch_bytes: Option<u64>,
}

impl Ticket {
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let ticket: Self = serde_json::from_slice(bytes).map_err(|e| WireError::Malformed {
            what: "subscription ticket",
            detail: e.to_string(),
        })?;
        let bad = |detail: String| WireError::Malformed {
            what: "subscription ticket",
            detail,
        };
        if let Some(size) = ticket.max_batch_bytes
            && !(1..=MAX_BATCH_BYTES).contains(&size)
        {
            return Err(bad(format!(
                "max_batch_bytes {size} is outside 1..={MAX_BATCH_BYTES}"
            )));
        }
        match (ticket.start, &ticket.cursor) {
            (Start::Cursor, None) => return Err(bad("start \"cursor\" needs a cursor".into())),
            (Start::Beginning | Start::Now, Some(_)) => {
                return Err(bad("a cursor goes with start \"cursor\"".into()));
            }
            _ => {}
        }
        Ok(ticket)
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn batch_bytes(&self) -> u64 {
        self.max_batch_bytes.unwrap_or(DEFAULT_BATCH_BYTES)
    }
}

/// Where a consumer stands in one file: every byte of `generation` below
/// `offset` was delivered, under `path` (so that a consumer resuming after
/// a rename it did not apply is told of it), and its seal too if `sealed`.
/// Serialised as `[key, generation, offset, path]`, with a fifth element
/// `true` once sealed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Position {
    pub key: String,
    pub generation: u64,
    pub offset: u64,
    pub path: String,
    pub sealed: bool,
}

impl Serialize for Position {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        let mut tuple = serializer.serialize_tuple(if self.sealed { 5 } else { 4 })?;
        tuple.serialize_element(&self.key)?;
        tuple.serialize_element(&self.generation)?;
        tuple.serialize_element(&self.offset)?;
        tuple.serialize_element(&self.path)?;
        if self.sealed {
            tuple.serialize_element(&true)?;
        }
        tuple.end()
    }
}

impl<'de> Deserialize<'de> for Position {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            Open(String, u64, u64, String),
            Sealed(String, u64, u64, String, bool),
        }
        Ok(match Form::deserialize(deserializer)? {
            Form::Open(key, generation, offset, path) => Self {
                key,
                generation,
                offset,
                path,
                sealed: false,
            },
            Form::Sealed(key, generation, offset, path, sealed) => Self {
                key,
                generation,
                offset,
                path,
                sealed,
            },
        })
    }
}

/// A batch's `app_metadata`: the positions of the files it touched, after it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CursorUpdate {
    pub cursor: Vec<Position>,
}

impl CursorUpdate {
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        serde_json::from_slice(bytes).map_err(|e| WireError::Malformed {
            what: "cursor update",
            detail: e.to_string(),
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// Merges cursor updates into the cursor a resuming ticket carries: one
/// position per file key, the newest generation's.
#[derive(Clone, Debug, Default)]
pub struct Cursor {
    files: std::collections::BTreeMap<String, Position>,
}

impl Cursor {
    pub fn apply(&mut self, update: &CursorUpdate) {
        for position in &update.cursor {
            match self.files.get(&position.key) {
                Some(known) if known.generation > position.generation => {}
                _ => {
                    self.files.insert(position.key.clone(), position.clone());
                }
            }
        }
    }

    pub fn positions(&self) -> Vec<Position> {
        self.files.values().cloned().collect()
    }

    pub fn from_positions(positions: Vec<Position>) -> Self {
        let mut cursor = Self::default();
        cursor.apply(&CursorUpdate { cursor: positions });
        cursor
    }
}

/// What a row of a subscription tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowKind {
    /// `data` holds the file's bytes at `offset`, all durable.
    Data,
    /// A file (or a new generation of one) the subscription had not seen.
    Opened,
    /// The file is now at `path` (it was at `from_path`).
    Renamed,
    /// The file is complete: `size` bytes with `digest`.
    Sealed,
    /// A newer generation replaced this one: what was delivered of it is
    /// void, and the new generation follows from offset 0.
    Superseded,
}

impl RowKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Data => "data",
            Self::Opened => "opened",
            Self::Renamed => "renamed",
            Self::Sealed => "sealed",
            Self::Superseded => "superseded",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "data" => Self::Data,
            "opened" => Self::Opened,
            "renamed" => Self::Renamed,
            "sealed" => Self::Sealed,
            "superseded" => Self::Superseded,
            _ => return None,
        })
    }
}

static SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("kind", DataType::Utf8, false),
        Field::new("source", DataType::Utf8, false),
        Field::new("path", DataType::Utf8, false),
        Field::new("file_key", DataType::Utf8, false),
        Field::new("generation", DataType::UInt64, false),
        Field::new("offset", DataType::UInt64, false),
        Field::new("data", DataType::Binary, false),
        Field::new("size", DataType::UInt64, true),
        Field::new("digest", DataType::Utf8, true),
        Field::new("from_path", DataType::Utf8, true),
    ]))
});

/// The schema of every batch a subscription delivers.
pub fn consumer_schema() -> SchemaRef {
    SCHEMA.clone()
}

/// One row to deliver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerRow<'a> {
    pub kind: RowKind,
    pub path: &'a str,
    pub file_key: &'a str,
    pub generation: u64,
    pub offset: u64,
    pub data: &'a [u8],
    pub size: Option<u64>,
    pub digest: Option<&'a str>,
    pub from_path: Option<&'a str>,
}

/// Builds one consumer batch.
pub struct ConsumerBatchBuilder {
    source: String,
    rows: usize,
    kind: StringBuilder,
    path: StringBuilder,
    file_key: StringBuilder,
    generation: UInt64Builder,
    offset: UInt64Builder,
    /// The `data` column, built by hand so that file bytes can be read
    /// straight into it ([`Self::push_read`]).
    data_values: Vec<u8>,
    data_offsets: Vec<i32>,
    size: UInt64Builder,
    digest: StringBuilder,
    from_path: StringBuilder,
}

impl ConsumerBatchBuilder {
    pub fn new(source: &str, data_bytes: usize) -> Self {
        Self {
            source: source.to_owned(),
            rows: 0,
            kind: StringBuilder::new(),
            path: StringBuilder::new(),
            file_key: StringBuilder::new(),
            generation: UInt64Builder::new(),
            offset: UInt64Builder::new(),
            data_values: Vec::with_capacity(data_bytes),
            data_offsets: vec![0],
            size: UInt64Builder::new(),
            digest: StringBuilder::new(),
            from_path: StringBuilder::new(),
        }
    }

    pub fn push(&mut self, row: &ConsumerRow<'_>) {
        self.data_values.extend_from_slice(row.data);
        self.push_row_but_data(row);
    }

    /// Appends the row's columns but `data`, whose bytes are in place.
    fn push_row_but_data(&mut self, row: &ConsumerRow<'_>) {
        self.rows += 1;
        self.data_offsets.push(self.data_values.len() as i32);
        self.kind.append_value(row.kind.as_str());
        self.path.append_value(row.path);
        self.file_key.append_value(row.file_key);
        self.generation.append_value(row.generation);
        self.offset.append_value(row.offset);
        self.size.append_option(row.size);
        self.digest.append_option(row.digest);
        self.from_path.append_option(row.from_path);
    }

    /// Pushes a data row whose bytes `read` puts straight into the batch
    /// (at most `len` of them; it returns how many): no copy between the
    /// file and the column. A row of no bytes is not pushed.
    pub fn push_read<E>(
        &mut self,
        row: &ConsumerRow<'_>,
        len: usize,
        read: impl FnOnce(&mut [u8]) -> Result<usize, E>,
    ) -> Result<usize, E> {
        let start = self.data_values.len();
        self.data_values.resize(start + len, 0);
        let got = match read(&mut self.data_values[start..]) {
            Ok(got) => got.min(len),
            Err(e) => {
                self.data_values.truncate(start);
                return Err(e);
            }
        };
        self.data_values.truncate(start + got);
        if got == 0 {
            return Ok(0);
        }
        self.push_row_but_data(row);
        Ok(got)
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn finish(mut self) -> RecordBatch {
        let rows = self.rows;
        let mut source = StringBuilder::with_capacity(rows, rows * self.source.len());
        for _ in 0..rows {
            source.append_value(&self.source);
        }
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.kind.finish()),
            Arc::new(source.finish()),
            Arc::new(self.path.finish()),
            Arc::new(self.file_key.finish()),
            Arc::new(self.generation.finish()),
            Arc::new(self.offset.finish()),
            Arc::new(arrow_array::BinaryArray::new(
                arrow_buffer::OffsetBuffer::new(self.data_offsets.into()),
                arrow_buffer::Buffer::from_vec(self.data_values),
                None,
            )),
            Arc::new(self.size.finish()),
            Arc::new(self.digest.finish()),
            Arc::new(self.from_path.finish()),
        ];
        // The columns match the schema by construction.
        RecordBatch::try_new(consumer_schema(), columns)
            .expect("consumer batch columns match the consumer schema")
    }
}

/// A ticket's globs, compiled: each over `<source>/<path>`, `*` within a
/// name, `**` across directories. None means every file of the source.
#[derive(Clone, Debug)]
pub struct Globs {
    set: globset::GlobSet,
}

impl Globs {
    /// Refuses globs that could name something outside the source: absolute,
    /// with `..`, `.` or empty components, or of another source.
    pub fn new(source: &str, globs: &[String]) -> Result<Self, String> {
        let mut builder = globset::GlobSetBuilder::new();
        let all = [format!("{source}/**")];
        let globs = if globs.is_empty() { &all[..] } else { globs };
        for glob in globs {
            if glob.starts_with('/') {
                return Err(format!(
                    "glob {glob:?} is absolute; globs are over <source>/<path>"
                ));
            }
            if glob
                .split('/')
                .any(|part| part == ".." || part == "." || part.is_empty())
            {
                return Err(format!("glob {glob:?} has an empty, '.' or '..' component"));
            }
            if glob.split('/').next() != Some(source) {
                return Err(format!(
                    "glob {glob:?} does not start with the ticket's source {source:?}/"
                ));
            }
            let compiled = globset::GlobBuilder::new(glob)
                .literal_separator(true)
                .build()
                .map_err(|e| format!("glob {glob:?}: {e}"))?;
            builder.add(compiled);
        }
        let set = builder
            .build()
            .map_err(|e| format!("globs {globs:?}: {e}"))?;
        Ok(Self { set })
    }

    /// Whether `path` (`<source>/<path>`) matches one of the globs.
    pub fn matches(&self, path: &str) -> bool {
        self.set.is_match(path)
    }
}

/// The glob that matches exactly one file's `<source>/<path>`.
pub fn exact_glob(source: &str, path: &str) -> String {
    format!("{source}/{}", globset::escape(path))
}

/// The first message of a subscription's stream: the consumer schema.
pub fn schema_message() -> arrow_flight::FlightData {
    arrow_flight::FlightData::from(arrow_flight::SchemaAsIpc::new(
        &consumer_schema(),
        &arrow_ipc::writer::IpcWriteOptions::default(),
    ))
}

/// A consumer batch as one Flight message, its cursor update as its
/// `app_metadata`.
pub fn encode_batch(
    batch: &RecordBatch,
    update: &CursorUpdate,
) -> Result<arrow_flight::FlightData, WireError> {
    use arrow_ipc::writer::{
        DictionaryTracker, IpcDataGenerator, IpcWriteContext, IpcWriteOptions,
    };
    let (_, encoded) = IpcDataGenerator::default()
        .encode(
            batch,
            &mut DictionaryTracker::new(false),
            &IpcWriteOptions::default(),
            &mut IpcWriteContext::default(),
        )
        .map_err(|e| WireError::Malformed {
            what: "consumer batch",
            detail: e.to_string(),
        })?;
    let mut message = arrow_flight::FlightData::from(encoded);
    message.app_metadata = update.encode().into();
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_names_and_directories_and_stay_in_their_source() {
        let globs =
            |g: &[&str]| Globs::new("h1", &g.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let xtc = globs(&["h1/xtc/*.xtc2*"]).unwrap();
        assert!(xtc.matches("h1/xtc/r1-s00.xtc2.inprogress"));
        assert!(!xtc.matches("h1/xtc/sub/r1.xtc2"));
        let all = globs(&[]).unwrap();
        assert!(all.matches("h1/xtc/sub/r1.xtc2"));
        assert!(!all.matches("h2/a"));
        assert!(globs(&["h1/**/r?.dat"]).unwrap().matches("h1/r1.dat"));
        for bad in ["h1/../etc/*", "/h1/*", "h2/*", "h1//a", "h1/[a"] {
            assert!(globs(&[bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn tickets_and_cursors_round_trip_and_bad_ones_are_named() {
        let ticket = Ticket::decode(br#"{"source":"s","start":"cursor","cursor":[["a",1,10,"a"],["b",2,5,"d/b",true]],"follow":true}"#).unwrap();
        let cursor = ticket.cursor.clone().unwrap();
        assert!(cursor[1].sealed && cursor[1].path == "d/b");
        assert_eq!(Ticket::decode(&ticket.encode()).unwrap(), ticket);
        for bad in [
            &b"garbage"[..],
            br#"{"source":"s","start":"cursor"}"#,
            br#"{"source":"s","max_batch_bytes":1000000000}"#,
            br#"{"source":"s","unknown":1}"#,
        ] {
            assert!(
                Ticket::decode(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let mut merged = Cursor::default();
        merged.apply(&CursorUpdate {
            cursor: cursor.clone(),
        });
        merged.apply(&CursorUpdate {
            cursor: vec![Position {
                key: "a".into(),
                generation: 1,
                offset: 20,
                path: "a".into(),
                sealed: false,
            }],
        });
        assert_eq!(merged.positions()[0].offset, 20);
    }
}
