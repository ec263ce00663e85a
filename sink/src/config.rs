//! What a sink is told to do: its root, state, listening address, TLS,
//! layout, policies and limits, validated by the binary (which parses the
//! command line and TOML) and taken as is here.

use std::net::SocketAddr;
use std::path::PathBuf;

use flight_server::tls::ServerTls;
use serde::{Deserialize, Serialize};

use crate::durability::flush::SyncStrategy;

/// Where files of a source land under the root.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layout {
    /// `<root>/<source>/<relative path>`.
    #[default]
    PerSource,
    /// `<root>/<relative path>`: for a sink that serves one source (the
    /// first it sees, in its manifest or on the wire; others are refused).
    Flat,
}

/// What happens at the destination to a generation that a newer one replaces
/// (the source file was truncated, or deleted and created again).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SupersededPolicy {
    /// Mirror the source: the old generation's file is removed.
    #[default]
    Mirror,
    /// Keep the old generation beside the new one as `<path>.gen<N>`.
    Keep,
}

#[derive(Clone, Debug)]
pub struct SinkConfig {
    /// Destination root; files land under it and nowhere else.
    pub root: PathBuf,
    /// The manifest's directory (RocksDB).
    pub state_dir: PathBuf,
    pub listen: SocketAddr,
    pub tls: Option<ServerTls>,
    pub layout: Layout,
    pub superseded: SupersededPolicy,
    pub max_message_bytes: usize,
    pub window_bytes: u32,
    pub max_open_files: usize,
    /// Ranges up to this many bytes may go to the journal file (0: none).
    pub journal_max_range: u64,
    /// Most bytes held in memory across files because they arrived ahead of
    /// the bytes before them, so that a file grows only over bytes written
    /// in order; a batch that would hold more is refused as retryable. 0
    /// turns writing in order off.
    pub hold_limit: u64,
    /// Ranges whose block-aligned middle holds at least this many bytes
    /// write it with O_DIRECT, past the page cache (0: never; None: 512 KiB
    /// on local disk filesystems, never elsewhere).
    pub direct_min: Option<u64>,
    /// How commit rounds make their files durable.
    pub sync: SyncStrategy,
    /// Seals read each file back from disk to check its digest (otherwise a
    /// CRC-64 seal is checked against the bytes as they were written).
    pub seal_read_back: bool,
    /// Batches placed at once, each on a thread of its own (None: four per
    /// core, at least 8 and at most 64).
    pub placement_threads: Option<usize>,
    /// Who may subscribe to and list the sink's files.
    pub read_access: flight_server::ReadAccess,
    /// Record commit events in the manifest's outbox for a relay to
    /// publish (None: no events).
    pub events: Option<crate::outbox::EventsConfig>,
    /// A fleet's catalogue: listings answer for every member of the fleet.
    pub federation: Option<flight_server::federation::Federation>,
}

impl Default for SinkConfig {
    fn default() -> Self {
        Self {
            root: PathBuf::from("dest"),
            state_dir: PathBuf::from("sink-state"),
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            tls: None,
            layout: Layout::PerSource,
            superseded: SupersededPolicy::Mirror,
            max_message_bytes: 64 << 20,
            window_bytes: 64 << 20,
            max_open_files: 1024,
            journal_max_range: 64 << 10,
            hold_limit: 256 << 20,
            direct_min: None,
            sync: SyncStrategy::Auto,
            seal_read_back: false,
            placement_threads: None,
            read_access: Default::default(),
            events: None,
            federation: None,
        }
    }
}
