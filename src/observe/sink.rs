//! What a sink shows operators: bytes placed and made durable (per source,
//! from its commit feed), commit rounds and their latency, its placements,
//! held and journaled bytes, disk space, subscriptions and health.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use anyhow::Context;
use prometheus::{Histogram, HistogramOpts, HistogramVec};
use serde_json::json;

use super::history::{History, Point};
use super::metrics::{Families, PREFIX};
use super::recent::RecentProblems;
use super::snapshot::{Observed, Snapshot};

pub struct SinkObserved {
    sink: Arc<sink::Sink>,
    root: PathBuf,
    state_dir: PathBuf,
    problems: RecentProblems,
    started: Instant,
    feed: Arc<FeedCounts>,
    history: History,
    /// The process's role for its identity, in a fleet.
    role: Option<fleet::RoleStatus>,
}

/// What the feed listener counts.
struct FeedCounts {
    /// Bytes made durable per source since the start.
    committed: Mutex<BTreeMap<String, u64>>,
    rounds: AtomicU64,
    /// Rounds the listener fell too far behind to see.
    missed_rounds: AtomicU64,
    /// From a batch's arrival to its round being durable.
    commit_latency: Histogram,
    /// Each stage of the commit rounds.
    stages: HistogramVec,
}

/// From 100 µs to 10 s: commit rounds take milliseconds, and seconds
/// are what operators must see.
const LATENCY_BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5, 10.0,
];

impl SinkObserved {
    /// Starts listening to the sink's feed on a thread of its own, which
    /// ends when the feed closes (join it then).
    pub fn attach(
        sink: Arc<sink::Sink>,
        root: PathBuf,
        state_dir: PathBuf,
        problems: RecentProblems,
    ) -> anyhow::Result<(Self, std::thread::JoinHandle<()>)> {
        let commit_latency = Histogram::with_opts(
            HistogramOpts::new(
                format!("{PREFIX}_sink_commit_latency_seconds"),
                "From the arrival of the last batch that brought a file's ranges to their commit round being durable (per file and round).",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
        )
        .context("making the commit latency histogram")?;
        let stages = HistogramVec::new(
            HistogramOpts::new(
                format!("{PREFIX}_sink_stage_seconds"),
                "Each stage of the commit rounds, per round (the slowest batch's where batches have their own): receive (arrival to placement), write (placement), queue (waiting for the round), flush, manifest, journal (journaling rounds only).",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["stage"],
        )
        .context("making the stage histograms")?;
        let feed = Arc::new(FeedCounts {
            committed: Mutex::new(BTreeMap::new()),
            rounds: AtomicU64::new(0),
            missed_rounds: AtomicU64::new(0),
            commit_latency,
            stages,
        });
        let mut rounds = sink
            .feed()
            .subscribe()
            .context("the sink's committer has stopped")?;
        let counts = feed.clone();
        let thread = std::thread::Builder::new()
            .name("metrics-feed".into())
            .spawn(move || {
                use tokio::sync::broadcast::error::RecvError;
                loop {
                    match rounds.blocking_recv() {
                        Ok(round) => counts.count(&round),
                        Err(RecvError::Lagged(missed)) => {
                            counts.missed_rounds.fetch_add(missed, Ordering::Relaxed);
                            tracing::warn!(missed, "the metrics fell behind the commit feed; bytes committed in the rounds missed are not counted");
                        }
                        Err(RecvError::Closed) => return,
                    }
                }
            })
            .context("starting the metrics feed listener")?;
        Ok((
            Self {
                sink,
                root,
                state_dir,
                problems,
                started: Instant::now(),
                feed,
                history: History::default(),
                role: None,
            },
            thread,
        ))
    }

    /// Shows the process's role for its identity too (a fleet's member).
    pub fn with_role(mut self, role: Option<fleet::RoleStatus>) -> Self {
        self.role = role;
        self
    }

    fn committed_total(&self) -> u64 {
        crate::observe::lock(&self.feed.committed).values().sum()
    }
}

impl FeedCounts {
    fn count(&self, round: &sink::CommitRound) {
        self.rounds.fetch_add(1, Ordering::Relaxed);
        let s = round.stages;
        for (stage, us) in [
            ("receive", s.receive_us),
            ("write", s.write_us),
            ("queue", s.queue_us),
            ("flush", s.flush_us),
            ("manifest", s.manifest_us),
        ] {
            self.stages
                .with_label_values(&[stage])
                .observe(us as f64 / 1e6);
        }
        if s.journal_us > 0 {
            self.stages
                .with_label_values(&["journal"])
                .observe(s.journal_us as f64 / 1e6);
        }
        let mut committed = super::lock(&self.committed);
        for file in &round.files {
            let bytes: u64 = file.ranges.iter().map(|(start, end)| end - start).sum();
            if bytes == 0 {
                continue;
            }
            *committed.entry(file.id.source.clone()).or_default() += bytes;
            if let Some(received) = file.received {
                let latency = round
                    .committed_at
                    .duration_since(received)
                    .unwrap_or_default();
                self.commit_latency.observe(latency.as_secs_f64());
            }
        }
    }
}

/// Free and total bytes of the filesystem holding `dir`.
fn disk_space(dir: &std::path::Path) -> Option<(u64, u64)> {
    let stat = rustix::fs::statvfs(dir).ok()?;
    Some((
        stat.f_bavail.saturating_mul(stat.f_frsize),
        stat.f_blocks.saturating_mul(stat.f_frsize),
    ))
}

/// The event outbox and its Kafka relay, when the sink records events.
fn events_metrics(m: &Families, events: &sink::outbox::OutboxStatus) {
    m.gauge(
        "sink_outbox_events",
        "Commit events recorded and not yet published to Kafka.",
        events.depth_events as f64,
    );
    m.gauge(
        "sink_outbox_bytes",
        "Bytes of commit events recorded and not yet published (the sink refuses new data at sink_outbox_limit_bytes).",
        events.depth_bytes as f64,
    );
    m.gauge(
        "sink_outbox_limit_bytes",
        "Most bytes of unpublished events the outbox keeps.",
        events.limit_bytes as f64,
    );
    m.gauge(
        "sink_outbox_oldest_age_seconds",
        "How long the oldest unpublished commit event has waited (0 when none waits).",
        events.oldest_age_ms.unwrap_or(0) as f64 / 1000.0,
    );
    m.counter(
        "sink_events_published_total",
        "Commit events the Kafka relay published since the sink started.",
        events.relay.published_events as f64,
    );
    m.gauge(
        "sink_event_relay_up",
        "1 while the Kafka relay publishes or has nothing to publish; 0 while it fails (brokers unreachable, topic missing, not authorised).",
        f64::from(u8::from(events.relay.state != "failing")),
    );
}

impl SinkObserved {
    /// What the commit feed counted: bytes per source, rounds, latency and
    /// the rounds' stages.
    fn feed_metrics(&self, m: &Families, committed: &BTreeMap<String, u64>) {
        let per_source = m.counters(
            "sink_committed_bytes_total",
            "Bytes made durable (and then acknowledged) per source since the sink started, from its commit feed.",
            &["source"],
        );
        for (source, bytes) in committed {
            per_source
                .with_label_values(&[source.as_str()])
                .inc_by(*bytes as f64);
        }
        m.counter(
            "sink_commit_rounds_total",
            "Commit rounds: each makes a group of placed ranges durable, records them, then lets their acks go.",
            self.feed.rounds.load(Ordering::Relaxed) as f64,
        );
        m.counter(
            "sink_feed_missed_rounds_total",
            "Commit rounds the metrics missed by falling behind the feed (their bytes are not counted).",
            self.feed.missed_rounds.load(Ordering::Relaxed) as f64,
        );
        m.register(self.feed.commit_latency.clone());
        m.register(self.feed.stages.clone());
    }

    /// Free and total space of the root's and the state directory's
    /// filesystems.
    fn disk_metrics(&self, m: &Families) {
        let disk_free = m.gauges(
            "sink_disk_free_bytes",
            "Bytes available to the sink on the filesystem of its root or of its state directory.",
            &["dir"],
        );
        let disk_size = m.gauges(
            "sink_disk_size_bytes",
            "Size of the filesystem of the sink's root or of its state directory.",
            &["dir"],
        );
        for (name, dir) in [("root", &self.root), ("state", &self.state_dir)] {
            if let Some((free, size)) = disk_space(dir) {
                disk_free.with_label_values(&[name]).set(free as f64);
                disk_size.with_label_values(&[name]).set(size as f64);
            }
        }
    }

    /// The figures of the sink's own status: placement, the manifest,
    /// subscriptions, events.
    fn status_metrics(m: &Families, s: &sink::SinkStatus) {
        m.gauge(
        "sink_placed_bytes",
        "Bytes placed and recorded in the manifest, kept across restarts (ranges a crash left unproven are withdrawn from it at the restart).",
        s.placed_bytes as f64,
    );
        m.counter(
        "sink_duplicate_bytes_total",
        "Bytes received again that the manifest already held: recognised and not written (kept across restarts).",
        s.duplicate_bytes as f64,
    );
        m.counter(
            "sink_rewritten_bytes_total",
            "Bytes written again over ranges whose record a crash had lost (kept across restarts).",
            s.rewritten_bytes as f64,
        );
        m.gauge(
            "sink_files",
            "File generations in the manifest.",
            s.files as f64,
        );
        m.gauge(
            "sink_sealed_files",
            "Sealed file generations in the manifest.",
            s.sealed_files as f64,
        );
        m.gauge(
            "sink_journal_backlog_bytes",
            "Bytes durable in the journal whose destination files are not flushed yet.",
            s.journal_backlog_bytes as f64,
        );
        m.gauge(
            "sink_held_bytes",
            "Bytes that arrived ahead of the bytes before them in their file, waiting in memory.",
            s.held_bytes as f64,
        );
        m.counter(
            "sink_direct_written_bytes_total",
            "Bytes written past the page cache (O_DIRECT) since the start.",
            s.direct_written_bytes as f64,
        );
        m.counter(
            "sink_direct_staged_bytes_total",
            "Of the bytes written past the page cache, those copied into an aligned buffer first \
             (not received aligned like their file offset).",
            s.direct_staged_bytes as f64,
        );
        let placements = m.gauges(
            "sink_placements",
            "Batches being placed (running) and waiting for a placement thread (waiting).",
            &["state"],
        );
        placements
            .with_label_values(&["running"])
            .set(s.placements_running as f64);
        placements
            .with_label_values(&["waiting"])
            .set(s.placements_waiting as f64);
        m.gauge(
            "sink_placement_threads",
            "Batches placed at once at most.",
            s.placement_threads as f64,
        );
        m.gauge(
            "sink_subscriptions",
            "Live-tail subscriptions being served.",
            s.subscriptions.len() as f64,
        );
        m.gauge(
            "sink_subscription_max_lag_bytes",
            "Durable bytes the slowest subscription has not been sent yet.",
            s.subscriptions
                .iter()
                .map(|s| s.behind_bytes)
                .max()
                .unwrap_or(0) as f64,
        );
        m.gauge(
        "sink_subscription_max_lag_seconds",
        "How long the oldest durable byte not yet sent to the slowest subscription has been durable.",
        s.subscriptions
            .iter()
            .map(|s| s.behind_seconds)
            .fold(0.0, f64::max),
    );
        if let Some(events) = &s.events {
            events_metrics(m, events);
        }
    }

    fn disks_json(&self) -> Vec<serde_json::Value> {
        [("root", &self.root), ("state", &self.state_dir)]
            .iter()
            .filter_map(|(name, dir)| {
                disk_space(dir).map(
                    |(free, size)| json!({"dir": name, "free_bytes": free, "size_bytes": size}),
                )
            })
            .collect()
    }
}

impl Observed for SinkObserved {
    fn snapshot(&self) -> Snapshot {
        let status = self.sink.status();
        let m = Families::new();
        m.build_info("sink");
        m.process();
        let cluster = self.role.as_ref().and_then(|role| role.cluster());
        if let Some(role) = &self.role {
            super::fleet::role_metrics(&m, &role.report());
        }
        if let Some(view) = &cluster {
            super::fleet::cluster_metrics(&m, view);
        }
        let poisoned = self.sink.health().reason().map(|r| r.to_string());
        m.gauge(
            "sink_ready",
            "1 while the sink accepts batches; 0 once it is poisoned (a failure it cannot recover from without a restart).",
            f64::from(u8::from(poisoned.is_none())),
        );
        let committed = super::lock(&self.feed.committed).clone();
        self.feed_metrics(&m, &committed);
        self.disk_metrics(&m);
        let status_json = match &status {
            Ok(s) => {
                Self::status_metrics(&m, s);
                serde_json::to_value(s).unwrap_or_default()
            }
            Err(error) => json!({ "error": error.to_string() }),
        };
        let now_ms = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let disks = self.disks_json();
        let status = json!({
            "role": "sink",
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_seconds": self.started.elapsed().as_secs_f64(),
            "unix_ms": now_ms,
            "ready": poisoned.is_none(),
            "poisoned": poisoned,
            "sources": committed.iter().map(|(source, bytes)| json!({"source": source, "committed_bytes": bytes})).collect::<Vec<_>>(),
            "commit_rounds": self.feed.rounds.load(Ordering::Relaxed),
            "disk": disks,
            "sink": status_json,
            "fleet": self.role.as_ref().map(|role| role.report()),
            "cluster": cluster,
            "history": self.history.points(),
            "problems": self.problems.list(),
        });
        Snapshot {
            status,
            metrics: m.gather(),
            not_ready: poisoned.map(|reason| format!("poisoned: {reason}")),
        }
    }

    fn sample(&self) {
        let (lag_bytes, lag_seconds) = match self.sink.status() {
            Ok(s) => (
                s.subscriptions
                    .iter()
                    .map(|s| s.behind_bytes)
                    .max()
                    .unwrap_or(0) as f64,
                s.subscriptions
                    .iter()
                    .map(|s| s.behind_seconds)
                    .fold(0.0, f64::max),
            ),
            Err(_) => (0.0, 0.0),
        };
        self.history.push(Point {
            lag_bytes,
            lag_seconds,
            bytes_total: self.committed_total() as f64,
            ..Point::default()
        });
    }
}
