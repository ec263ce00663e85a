//! What a watcher is told: the validated configuration the binary makes
//! from its flags.

use std::path::PathBuf;
use std::time::Duration;

use flight_server::SealDigest;
use flight_server::tls::ClientTls;

use crate::discover::EventSource;
use crate::lag::LagPolicy;

#[derive(Clone, Debug)]
pub struct WatchConfig {
    /// The tree to watch.
    pub root: PathBuf,
    /// Stable name of this watcher; the sink places its files under it.
    pub source: String,
    /// Where acknowledged offsets are checkpointed (RocksDB).
    pub state_dir: PathBuf,
    /// Sink endpoints, or sink identities when `followed_sinks` is given;
    /// files are sharded across them by rendezvous hashing.
    pub sinks: Vec<String>,
    /// For each of `sinks` (then identities of a fleet), where it is
    /// served now; empty when `sinks` are endpoints.
    pub followed_sinks: Vec<tokio::sync::watch::Receiver<Option<String>>>,
    pub connections: usize,
    pub window_bytes: u64,
    pub max_message_bytes: usize,
    pub tls: Option<ClientTls>,
    /// How changes are heard of: inotify, fanotify, or polling (network
    /// and parallel filesystems).
    pub events: EventSource,
    pub poll_min: Duration,
    pub poll_max: Duration,
    pub rescan_every: Duration,
    /// A batch is sent when it holds this many bytes...
    pub batch_bytes: usize,
    /// ...or when its oldest row has waited this long.
    pub linger: Duration,
    /// Largest single range row.
    pub max_row_bytes: usize,
    pub seal: bool,
    /// A closed file idle this long is complete.
    pub seal_idle: Duration,
    /// Whole-file digest of seal rows.
    pub seal_digest: SealDigest,
    /// Files with this suffix are in progress; renaming them away seals them.
    pub inprogress_suffix: String,
    /// Source files kept open at once; idle, fully read ones are closed first.
    pub max_open_files: usize,
    /// When a file counts as stalled or idle (see [`lag`]).
    pub lag: LagPolicy,
}

impl Default for WatchConfig {
    fn default() -> Self {
        Self {
            root: PathBuf::from("."),
            source: "default".into(),
            state_dir: PathBuf::from("watch-state"),
            sinks: vec!["http://127.0.0.1:50051".into()],
            followed_sinks: Vec::new(),
            connections: 4,
            window_bytes: 32 << 20,
            max_message_bytes: 64 << 20,
            tls: None,
            events: EventSource::Inotify,
            poll_min: Duration::from_millis(5),
            poll_max: Duration::from_millis(500),
            rescan_every: Duration::from_secs(5),
            batch_bytes: 4 << 20,
            linger: Duration::from_millis(1),
            max_row_bytes: 1 << 20,
            seal: true,
            seal_idle: Duration::from_secs(60),
            seal_digest: SealDigest::default(),
            inprogress_suffix: ".inprogress".into(),
            max_open_files: 4096,
            lag: LagPolicy::default(),
        }
    }
}

impl WatchConfig {
    pub(crate) fn sinks_names(&self) -> &[String] {
        &self.sinks
    }
}
