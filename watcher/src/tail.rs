//! The tailer: one thread that owns every tracked file, reads what was
//! appended, batches it, sends control rows (open, rename, seal) and
//! checkpoints what the sinks acknowledged.
//!
//! Files are identified by (device, inode), their birth time where the
//! filesystem keeps one (a freed inode number is reused by the next file)
//! and a fingerprint of their first bytes, never by path alone: a rename
//! is the same file under a new path,
//! while a new inode at an old path, or a file that shrank, is a new
//! generation. Bytes of two generations are never mixed: each generation has
//! its own key on the wire.
//!
//! This file holds the loop and the parts it owns, each a type of its own:
//! - `files`: the [`files::FileTable`], what is known of each file, with
//!   its indexes by path and inode kept in step;
//! - `batcher`: the [`batcher::Outbound`], each sink's open batch and the
//!   batches in flight;
//! - `checkpoint`: the [`checkpoint::Checkpoints`], the state store and
//!   what it does not hold yet.
//!
//! The tailer's work on them is split by concern:
//! - `identity`: what a path is (new file, rename, new generation, resumed);
//! - `reader`: reading appended bytes into batches;
//! - `controls`: open, rename and seal rows, and when a file is sealed;
//! - `acks`: acknowledgements, applied to each file.

mod acks;
mod batcher;
mod checkpoint;
mod controls;
mod files;
mod identity;
mod reader;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use anyhow::Context;
use flight_server::{Delivery, FileWatermark, Outgoing};
use manifest_db::WatchState;
use tokio::sync::mpsc;

use crate::config::WatchConfig;
use crate::discover::{self, Discovery};
use crate::lag::LagEvents;
use crate::progress::Progress;
use crate::seal_hash::SealHasher;
use crate::stop::Stop;
use batcher::Outbound;
use checkpoint::Checkpoints;
use files::{FileKey, FileTable, Set, Tracked};

/// How often acknowledged offsets are written to the state store.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(200);
/// After a stop, how long acknowledgements of what was already sent are
/// awaited: long enough that a clean stop with healthy sinks records nearly
/// everything (less to send again), short enough that a stop does not
/// depend on the sinks.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// What reconciliation made of a file found on disk.
enum Adoption {
    /// Part of it is at the sink: continue from there.
    Track(Box<Tracked>),
    /// All of it is at the sink, sealed.
    Complete,
    /// The sink holds nothing of it.
    Unknown,
}

pub(crate) struct Tailer {
    config: Arc<WatchConfig>,
    root: PathBuf,
    checkpoints: Checkpoints,
    files: FileTable,
    /// What the sinks hold, for a watcher that lost its state.
    watermarks: Vec<(usize, FileWatermark)>,
    outbound: Outbound,
    deliveries: std::sync::mpsc::Receiver<(usize, Delivery)>,
    /// Files with something to read, in turn.
    ready: VecDeque<FileKey>,
    ready_set: Set<FileKey>,
    progress: Arc<Progress>,
    /// Told how long each growth took to become durable.
    lag_events: Option<Arc<dyn LagEvents>>,
    /// When each sink last acknowledged anything.
    sink_last_ack: Vec<Instant>,
    /// Largest single data row read at once.
    max_row_bytes: usize,
    discovery: Box<dyn Discovery>,
    /// Some files are polled (see [`Tracked::polled`]).
    polling_some: bool,
    /// Directories left unwatched, as last told in the log.
    unwatched_told: usize,
    /// What the last walk passed over (each told in the log once).
    skipped: std::collections::BTreeSet<discover::Skipped>,
    /// Set while a walk (not an event) brings files under tracking.
    walking: bool,
    /// Files whose controls or seal may be able to move.
    attention: Set<FileKey>,
    /// Descriptors opened since the last check against the open-file cap.
    opened_since_shed: usize,
    next_sweep: Instant,
    seal_hasher: SealHasher<FileKey>,
    stop: Arc<Stop>,
}

impl Tailer {
    pub fn new(
        config: Arc<WatchConfig>,
        state: WatchState,
        watermarks: Vec<(usize, FileWatermark)>,
        outboxes: Vec<mpsc::Sender<Outgoing>>,
        deliveries: std::sync::mpsc::Receiver<(usize, Delivery)>,
        progress: Arc<Progress>,
        stop: Arc<Stop>,
    ) -> anyhow::Result<Self> {
        let checkpoints = Checkpoints::new(state);
        let files = FileTable::new(checkpoints.load()?, &watermarks);
        let discovery = discover::discovery(&config.root, config.events)
            .with_context(|| format!("watching {} for changes", config.root.display()))?;
        let polling_some = config.events == discover::EventSource::Poll;
        let outbound = Outbound::new(&config, outboxes, stop.clone());
        let sink_last_ack = vec![Instant::now(); config.sinks.len().max(1)];
        Ok(Self {
            root: config.root.clone(),
            max_row_bytes: config.max_row_bytes.max(4096),
            config,
            checkpoints,
            files,
            watermarks,
            outbound,
            deliveries,
            ready: VecDeque::new(),
            ready_set: Set::default(),
            lag_events: progress.lag_events(),
            sink_last_ack,
            progress,
            polling_some,
            unwatched_told: 0,
            skipped: Default::default(),
            discovery,
            walking: false,
            attention: Set::default(),
            opened_since_shed: 0,
            next_sweep: Instant::now(),
            seal_hasher: SealHasher::start(stop.clone())
                .context("starting the seal hasher thread")?,
            stop,
        })
    }

    /// Makes the seal hasher take each job only once `gate` yields.
    #[cfg(test)]
    pub fn hold_seal_hashing(&mut self, gate: std::sync::mpsc::Receiver<()>) -> anyhow::Result<()> {
        self.seal_hasher = SealHasher::start_held(self.stop.clone(), gate)
            .context("starting the seal hasher thread")?;
        Ok(())
    }

    /// Tails until a stop is requested (see [`Stop`]) or something fails.
    pub fn run(mut self) -> anyhow::Result<()> {
        self.rescan()?;
        let mut next_rescan = Instant::now() + self.config.rescan_every;
        let mut next_checkpoint = Instant::now() + CHECKPOINT_EVERY;
        while !self.stop.is_requested() {
            let timeout = self.wait_budget();
            let changes = self.discovery.wait(timeout)?;
            self.drain_deliveries();
            self.collect_seal_digests();
            let mut overflow = false;
            for change in changes {
                overflow |= self.on_change(change);
            }
            let now = Instant::now();
            if overflow || now >= next_rescan {
                self.rescan()?;
                next_rescan = now + self.config.rescan_every;
            }
            if self.polling_some {
                self.queue_due_polls(now);
            }
            self.read_ready();
            self.outbound.flush_due(Instant::now());
            self.advance_controls();
            if Instant::now() >= next_checkpoint {
                self.checkpoint();
                next_checkpoint = Instant::now() + CHECKPOINT_EVERY;
            }
        }
        self.settle();
        self.checkpoint();
        Ok(())
    }

    /// Writes acknowledged offsets and forgets sealed files once recorded
    /// (until then they stay tracked); publishes the progress either way.
    fn checkpoint(&mut self) {
        if self.checkpoints.write(&self.files) {
            self.files.forget_sealed();
        }
        let now = Instant::now();
        let snapshot =
            checkpoint::progress_of(&mut self.files, now, &self.config.lag, &self.sink_last_ack);
        self.progress
            .publish(snapshot, self.files.finished_count() as u64);
    }

    /// After a stop: sends what is batched if there is room and collects
    /// the acknowledgements that arrive within [`STOP_GRACE`]. Whatever is
    /// still unacknowledged then stays unrecorded and is read again by the
    /// next run.
    fn settle(&mut self) {
        self.drain_deliveries();
        self.outbound.flush_all();
        let deadline = Instant::now() + STOP_GRACE;
        while !self.outbound.idle() {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.deliveries.recv_timeout(left) {
                Ok((_, delivery)) => self.on_delivery(delivery),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
            }
        }
        if !self.outbound.idle() {
            tracing::info!(
                batches = self.outbound.in_flight(),
                "stopping with batches unacknowledged; they are sent again after a restart"
            );
        }
    }

    /// How long to wait for events: short while a batch lingers or polls are due.
    fn wait_budget(&self) -> Duration {
        let mut budget = Duration::from_millis(10);
        if !self.ready.is_empty() {
            return Duration::ZERO;
        }
        if let Some(due) = self.outbound.next_due() {
            budget = budget.min(due.saturating_duration_since(Instant::now()));
        }
        if self.polling_some {
            budget = budget.min(self.config.poll_min);
        }
        budget
    }

    fn mark_ready(&mut self, key: &FileKey) {
        self.attention.insert(key.clone());
        if self.ready_set.insert(key.clone()) {
            self.ready.push_back(key.clone());
        }
    }
}
