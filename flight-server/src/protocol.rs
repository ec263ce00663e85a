//! Messages that travel beside the batches: the stream hello, per-batch acks
//! and the bodies of actions. They are JSON so that any Flight client
//! (pyarrow included) can speak them.

use serde::{Deserialize, Serialize};

use crate::WireError;

/// Protocol version carried in every hello; the sink refuses other versions.
pub const PROTOCOL_VERSION: u32 = 1;

/// Action: the durable watermarks a sink holds for a source (reconciliation).
pub const ACTION_WATERMARKS: &str = "watermarks";
/// Action: counters and state of the sink.
pub const ACTION_STATUS: &str = "status";

/// Batches of one DoPut stream that may be unacknowledged at once: the sink
/// reads a stream on while fewer of its placed batches wait to become
/// durable, and a watcher keeps no more than this in flight on a
/// connection, so every batch it sends is read, even one that batches
/// before it in the stream wait for.
pub const MAX_UNACKED_BATCHES: usize = 1024;

/// Sent as the FlightDescriptor command of each DoPut stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol: u32,
    /// The stable name of the watcher; the sink places its files under it.
    pub source: String,
}

impl Hello {
    pub fn new(source: &str) -> Self {
        Self {
            protocol: PROTOCOL_VERSION,
            source: source.to_owned(),
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let hello: Self = serde_json::from_slice(bytes).map_err(|e| WireError::Malformed {
            what: "stream hello",
            detail: e.to_string(),
        })?;
        if hello.protocol != PROTOCOL_VERSION {
            return Err(WireError::Malformed {
                what: "stream hello",
                detail: format!(
                    "protocol {} is not supported (this sink speaks {PROTOCOL_VERSION})",
                    hello.protocol
                ),
            });
        }
        Ok(hello)
    }
}

/// A row the sink refused without failing the stream (e.g. a seal whose hash
/// does not match). Data rows are never refused this way: a bad data row fails
/// the whole batch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejectedRow {
    pub row: usize,
    pub error: String,
    /// The row's generation was replaced by a newer one at the sink: the
    /// watcher can let the file go.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub superseded: bool,
}

/// The answer to one batch: sent only once everything it says is durable.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    /// The sequence number the client put in the batch's app_metadata.
    pub seq: u64,
    /// Bytes written and recorded by this batch.
    pub placed: u64,
    /// Bytes already recorded before, acknowledged without being written again.
    pub duplicate: u64,
    /// Bytes of generations a newer generation has replaced (not written).
    pub stale: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejected: Vec<RejectedRow>,
}

impl Ack {
    pub fn encode(&self) -> Vec<u8> {
        // Serialising plain integers and strings cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        serde_json::from_slice(bytes).map_err(|e| WireError::Malformed {
            what: "ack",
            detail: e.to_string(),
        })
    }
}

/// What the sink holds of one file generation, for a watcher that lost its state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileWatermark {
    pub key: String,
    pub generation: u64,
    /// Where the file lives now, relative to the source's directory.
    pub path: String,
    /// Every byte below this is durable.
    pub contiguous_end: u64,
    pub placed_bytes: u64,
    pub sealed_size: Option<u64>,
    pub superseded: bool,
    /// crc32c of the first `head_len` bytes, so a watcher can tell its file is the same one.
    pub head_crc32c: u32,
    pub head_len: u64,
}

/// Sequence numbers travel as 8 big-endian bytes of app_metadata.
pub fn encode_seq(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

pub fn decode_seq(bytes: &[u8]) -> Result<u64, WireError> {
    let array: [u8; 8] = bytes.try_into().map_err(|_| WireError::Malformed {
        what: "batch app_metadata",
        detail: format!(
            "expected an 8-byte sequence number, got {} bytes",
            bytes.len()
        ),
    })?;
    Ok(u64::from_be_bytes(array))
}
