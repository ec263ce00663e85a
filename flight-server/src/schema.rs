//! The Arrow schema of a tailflight batch: one schema carries both byte
//! ranges and control records, so a single DoPut stream keeps them in the
//! order the watcher chose. A batch holds many rows, from many files; each
//! row is one of [`RowKind`]. Control rows reuse the numeric columns
//! (`offset` is the final size of a seal) and leave `data` empty.
//!
//! The bottom of this crate's module graph: schema → wire (rows, builder)
//! → encode → decode → client, service.

use std::sync::{Arc, LazyLock};

use arrow_schema::{DataType, Field, Schema, SchemaRef};

/// What a row means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RowKind {
    /// Bytes of `file_key` generation `generation` at `offset`.
    Data = 0,
    /// A new generation (after truncation or inode reuse) placed at `path`.
    Open = 1,
    /// The file now lives at `path` (relative to the source root).
    Rename = 2,
    /// The file is complete: `offset` is its final size, `digest` its whole-file
    /// digest (`crc64nvme:<hex>` or `blake3:<hex>`, see [`crate::checksum`]).
    Seal = 3,
}

impl RowKind {
    pub(crate) fn from_u8(value: u8) -> Option<Self> {
        match value {
            0 => Some(Self::Data),
            1 => Some(Self::Open),
            2 => Some(Self::Rename),
            3 => Some(Self::Seal),
            _ => None,
        }
    }
}

static SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("kind", DataType::UInt8, false),
        Field::new("file_key", DataType::Utf8, false),
        Field::new("generation", DataType::UInt64, false),
        Field::new("offset", DataType::UInt64, false),
        Field::new("data", DataType::Binary, false),
        Field::new("crc32c", DataType::UInt32, false),
        Field::new("path", DataType::Utf8, true),
        Field::new("digest", DataType::Utf8, true),
    ]))
});

/// The schema every batch on the wire must have, nullability included.
pub fn range_schema() -> SchemaRef {
    SCHEMA.clone()
}
