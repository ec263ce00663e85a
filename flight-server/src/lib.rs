//! The tailflight wire.
//!
//! - [`schema`]: the Arrow schema of byte-range batches;
//! - [`wire`]: typed row access and the batch builder;
//! - [`encode`]: IPC encoding of a batch without copying its payload;
//! - [`checksum`]: CRC-32C of each row and the whole-file digest of a seal;
//! - [`protocol`]: what travels beside the batches (stream hello, acks, actions);
//! - [`service`]: the Flight service a sink plugs its [`Ingest`] into;
//! - [`stall`]: ending a DoPut stream whose message stops arriving;
//! - `put_receive`: DoPut messages read from the HTTP/2 frames with one copy,
//!   and `route`, which serves DoPut with them, and DoGet without copying its
//!   batches, ahead of tonic's router;
//! - [`subscription`]: live-tail tickets, the consumer schema and cursors;
//! - [`calls`]: one sink over a connection of its own: how to reach it, what
//!   goes wrong, actions and live-tail subscriptions;
//! - [`client`]: the multi-connection DoPut client with a bounded in-flight window;
//! - [`tls`]: rustls configuration from PEM files.

pub mod calls;
pub mod checksum;
pub mod client;
mod connection;
mod decode;
pub mod encode;
pub mod federation;
pub mod protocol;
mod put_receive;
mod put_stream;
mod read_access;
mod route;
pub mod schema;
pub mod service;
pub mod stall;
pub mod subscription;
pub mod tls;
pub mod wire;

pub use checksum::{FileHasher, SealDigest};
pub use client::{
    ClientConfig, ConnectionStats, Consumed, Delivery, FlightPool, Outgoing, PoolEvents,
};
pub use encode::EncodedBatch;
pub use protocol::{Ack, FileWatermark, Hello, RejectedRow};
pub use read_access::ReadAccess;
pub use service::{AwaitDurable, Ingest, ServerConfig, serve};
pub use wire::{BatchBuilder, RangeBatch, Row, RowKind, range_schema};

/// A batch or message that does not follow the wire format.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("wrong schema: {0}")]
    Schema(String),
    #[error("row {row}: {detail}")]
    Row { row: usize, detail: String },
    #[error("malformed {what}: {detail}")]
    Malformed { what: &'static str, detail: String },
}
