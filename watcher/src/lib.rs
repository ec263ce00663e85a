//! The watcher: discovers and tails growing files under a directory tree and
//! streams the appended ranges to one or more sinks.
//!
//! - `discover`: tree walks, and hearing of changes (inotify, fanotify, polling);
//! - `tail`: the tailer thread (identity, reading, batching, seals, checkpoints);
//! - `seal_hash`: the worker that digests files for seals off the tailer thread;
//! - [`progress`]: what the watcher reports about itself;
//! - [`lag`]: how far behind each file is, and its state;
//! - `reconcile`: what the sinks hold, for a watcher without state;
//! - [`send`]: a one-shot copy of files and trees (`tailflight send`);
//! - `stop`: the stop signal every part of the watcher honours.
//!
//! The tailer does blocking file I/O on a thread of its own; the connections
//! to the sinks run on tokio. Bounded channels between them are the
//! backpressure that keeps memory bounded.

#[cfg(test)]
mod answer_tests;
mod discover;
pub mod lag;
#[cfg(test)]
mod model_tests;
pub mod progress;
mod reconcile;
mod seal_hash;
pub mod send;
mod stop;
mod tail;
#[cfg(test)]
mod testkit;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use flight_server::tls::ClientTls;
use flight_server::{ClientConfig, FlightPool, SealDigest};
use manifest_db::WatchState;

pub use discover::EventSource;
pub use lag::{FileState, LagEvents, LagPolicy};
pub use progress::{DiscoveryStatus, FileProgress, Phase, Progress, SinkLink, SourceSummary};

use crate::stop::{Stop, StopOnDrop};

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

/// The sink a file key goes to: highest hash of (key, sink) wins, so adding
/// or removing a sink moves only the keys that must move.
pub fn rendezvous(key: &str, sinks: &[String]) -> usize {
    let score = |sink: &str| {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in key.bytes().chain([0xff]).chain(sink.bytes()) {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        // Finalise so that nearby inputs spread (FNV alone clusters).
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^ (h >> 33)
    };
    (0..sinks.len())
        .max_by_key(|&i| score(&sinks[i]))
        .unwrap_or(0)
}

/// Runs the watcher until `shutdown` resolves or the tailer fails.
///
/// Once `shutdown` resolves, `run` returns in bounded time whatever the
/// sinks do: what they have not acknowledged is not recorded, and the next
/// run sends it again.
pub async fn run(
    config: WatchConfig,
    progress: Arc<Progress>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    anyhow::ensure!(!config.sinks.is_empty(), "no sink given (--to)");
    anyhow::ensure!(
        config.followed_sinks.is_empty() || config.followed_sinks.len() == config.sinks.len(),
        "each followed sink identity needs its endpoint"
    );
    anyhow::ensure!(
        !config.source.is_empty()
            && !config.source.contains(['/', '\0'])
            && config.source != "."
            && config.source != "..",
        "source name {:?} must be one plain path component",
        config.source
    );
    // A batch may exceed batch_bytes by one row; the sink refuses messages
    // over its limit, so a batch must fit with room for the IPC framing.
    let largest_batch = config.batch_bytes + config.max_row_bytes + (64 << 10);
    anyhow::ensure!(
        largest_batch <= config.max_message_bytes,
        "--batch-bytes ({}) plus --max-row-bytes ({}) must stay below --max-message-bytes ({}), and below the sink's limit",
        config.batch_bytes,
        config.max_row_bytes,
        config.max_message_bytes
    );
    let root = std::fs::canonicalize(&config.root).with_context(|| {
        format!(
            "the watched directory {} is not accessible",
            config.root.display()
        )
    })?;
    let config = Arc::new(WatchConfig { root, ..config });
    let state = WatchState::open(&config.state_dir)?;
    tokio::pin!(shutdown);
    // Every task started here ends with `run`: none may outlive it holding
    // a pool (and its connections) or a batch.
    let mut tasks = AbortOnDrop(Vec::new());
    let mut pools = Vec::new();
    let (delivery_tx, delivery_rx) = std::sync::mpsc::channel();
    for (index, sink) in config.sinks.iter().enumerate() {
        let client = ClientConfig {
            endpoint: sink.clone(),
            source: config.source.clone(),
            connections: config.connections,
            window_bytes: config.window_bytes,
            max_message_bytes: config.max_message_bytes,
            tls: config.tls.clone(),
            connect_timeout: Duration::from_secs(5),
        };
        let (pool, mut deliveries) = match config.followed_sinks.get(index) {
            Some(target) => FlightPool::start_following(
                client,
                progress.pool_events(),
                sink.clone(),
                target.clone(),
            )?,
            None => FlightPool::start_with_events(client, progress.pool_events())?,
        };
        let index = pools.len();
        let forward = delivery_tx.clone();
        tasks.0.push(tokio::spawn(async move {
            while let Some(delivery) = deliveries.recv().await {
                if forward.send((index, delivery)).is_err() {
                    break;
                }
            }
        }));
        pools.push(Arc::new(pool));
    }
    let links = pools.clone();
    let published = progress.clone();
    tasks.0.push(tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_millis(500));
        loop {
            every.tick().await;
            published.set_sinks(
                links
                    .iter()
                    .map(|pool| SinkLink {
                        endpoint: pool.name().to_string(),
                        connections: pool.connections(),
                        connected: pool.connected(),
                        connection_stats: pool.connection_stats(),
                    })
                    .collect(),
            );
        }
    }));
    let watermarks = if state.is_empty()? {
        progress.set_phase(Phase::Reconciling);
        tokio::select! {
            marks = reconcile::reconcile(&config.source, &pools) => marks,
            () = &mut shutdown => {
                // Nothing was recorded, so the next run reconciles again.
                tracing::info!("stopped before every sink was reconciled; nothing was sent");
                close_pools(&pools).await;
                return Ok(());
            }
        }
    } else {
        Vec::new()
    };
    let mut outboxes = Vec::new();
    for pool in &pools {
        let (tx, mut rx) = tokio::sync::mpsc::channel(2);
        let pool = pool.clone();
        tasks.0.push(tokio::spawn(async move {
            while let Some(out) = rx.recv().await {
                pool.send(out).await;
            }
        }));
        outboxes.push(tx);
    }
    let stop = Arc::new(Stop::default());
    let _stop_on_drop = StopOnDrop(stop.clone());
    let tailer = tail::Tailer::new(
        config.clone(),
        state,
        watermarks,
        outboxes,
        delivery_rx,
        progress.clone(),
        stop.clone(),
    )?;
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("tailer".into())
        .spawn(move || {
            let _ = done_tx.send(tailer.run());
        })
        .context("starting the tailer thread")?;
    tracing::info!(root = %config.root.display(), source = %config.source, sinks = ?config.sinks, events_asked = config.events.as_str(), "watching");
    progress.set_phase(Phase::Tailing);
    tokio::pin!(done_rx);
    let ended = tokio::select! {
        result = &mut done_rx => result,
        () = &mut shutdown => {
            stop.request();
            progress.set_phase(Phase::Stopped);
            done_rx.await
        }
    };
    close_pools(&pools).await;
    ended.unwrap_or_else(|_| Err(anyhow::anyhow!("the tailer thread panicked")))
}

/// Ends every pool's connections before `run` returns: a sink stopped
/// right after must not find a stream of this watcher's still open.
async fn close_pools(pools: &[Arc<FlightPool>]) {
    for pool in pools {
        pool.close().await;
    }
}

/// Aborts its tasks when dropped.
struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendezvous_is_stable_and_spreads() {
        let sinks: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let mut counts = [0usize; 3];
        for i in 0..3000 {
            let key = format!("run1/file-{i}.xtc2");
            let s = rendezvous(&key, &sinks);
            assert_eq!(s, rendezvous(&key, &sinks));
            counts[s] += 1;
        }
        assert!(counts.iter().all(|&c| c > 800), "{counts:?}");
        // Removing a sink moves only its own keys.
        let two = &sinks[..2];
        for i in 0..300 {
            let key = format!("k{i}");
            let before = rendezvous(&key, &sinks);
            if before < 2 {
                assert_eq!(rendezvous(&key, two), before);
            }
        }
    }
}
