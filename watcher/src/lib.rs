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
mod config;
mod discover;
pub mod lag;
#[cfg(test)]
mod model_tests;
pub mod progress;
mod reconcile;
mod seal_hash;
pub mod send;
mod shard;
mod stop;
mod tail;
#[cfg(test)]
mod testkit;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use flight_server::{ClientConfig, FlightPool};
use manifest_db::WatchState;

pub use config::WatchConfig;
pub use discover::EventSource;
pub use lag::{FileState, LagEvents, LagPolicy};
pub use progress::{DiscoveryStatus, FileProgress, Phase, Progress, SinkLink, SourceSummary};
pub use shard::rendezvous;

use crate::stop::{Stop, StopOnDrop};

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
