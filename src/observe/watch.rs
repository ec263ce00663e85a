//! What a watcher shows operators: its source's verdict and lag, its files
//! by state and lag class, the files furthest behind, and its links to the
//! sinks, all from one snapshot of its `Progress`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::{HistogramOpts, HistogramVec};

use flight_server::ConnectionStats;
use serde_json::json;
use watcher::{DiscoveryStatus, FileProgress, FileState, Phase, Progress, SinkLink, SourceSummary};

use super::history::{History, Point};
use super::metrics::{Families, PREFIX};
use super::recent::RecentProblems;
use super::snapshot::{Observed, Snapshot};

/// One figure of a connection.
type ConnectionFigure = fn(&ConnectionStats) -> f64;

/// Each connection's gauges: name, help, figure.
const CONNECTION_GAUGES: [(&str, &str, ConnectionFigure); 4] = [
    (
        "connection_up",
        "1 while the connection is established.",
        |c| f64::from(u8::from(c.up)),
    ),
    (
        "connection_in_flight_bytes",
        "Bytes sent on the connection and not yet acknowledged, as charged against its window.",
        |c| c.in_flight_bytes as f64,
    ),
    (
        "connection_in_flight_batches",
        "Batches sent on the connection and not yet acknowledged.",
        |c| c.in_flight_batches as f64,
    ),
    (
        "connection_oldest_unacked_seconds",
        "Age of the oldest batch sent on the connection and not yet acknowledged (0: none).",
        |c| c.oldest_unacked_seconds,
    ),
];

/// Each connection's counters: name, help, figure.
const CONNECTION_COUNTERS: [(&str, &str, ConnectionFigure); 5] = [
    (
        "connection_sent_bytes_total",
        "Batch bytes sent on the connection (resent batches included).",
        |c| c.sent_bytes as f64,
    ),
    (
        "connection_acked_bytes_total",
        "Batch bytes the sink acknowledged on the connection.",
        |c| c.acked_bytes as f64,
    ),
    (
        "connection_reconnects_total",
        "Times the connection was established again after it was lost.",
        |c| c.reconnects as f64,
    ),
    (
        "connection_refusals_total",
        "Times the sink refused a batch on the connection as bad input (each try).",
        |c| c.refusals as f64,
    ),
    (
        "connection_resent_batches_total",
        "Batches in flight when the connection failed, sent again.",
        |c| c.resent_batches as f64,
    ),
];

/// Every connection with its sink's endpoint.
fn connections_of(sinks: &[SinkLink]) -> impl Iterator<Item = (&str, &ConnectionStats)> {
    sinks.iter().flat_map(|link| {
        link.connection_stats
            .iter()
            .map(move |c| (link.endpoint.as_str(), c))
    })
}

/// Files the status page lists, furthest behind first.
const PAGE_FILES: usize = 25;

pub struct WatchObserved {
    source: String,
    progress: Arc<Progress>,
    /// Files furthest behind exported with their paths (0: none).
    top_files: usize,
    problems: RecentProblems,
    started: Instant,
    history: History,
    ack_latency: Arc<AckLatency>,
    /// The process's role for its identity, in a fleet.
    role: Option<fleet::RoleStatus>,
}

/// Latency distributions the watcher's parts tell as things happen: batch
/// → acknowledgement (the connections), growth seen → durable (the tailer).
struct AckLatency {
    batch_acked: HistogramVec,
    seen_to_durable: prometheus::Histogram,
}

impl flight_server::PoolEvents for AckLatency {
    fn batch_acked(&self, endpoint: &str, _connection: usize, _bytes: u64, latency: Duration) {
        self.batch_acked
            .with_label_values(&[endpoint])
            .observe(latency.as_secs_f64());
    }
}

impl watcher::LagEvents for AckLatency {
    fn seen_to_durable(&self, latency: Duration) {
        self.seen_to_durable.observe(latency.as_secs_f64());
    }
}

/// From 250 µs to 30 s: loopback answers in a millisecond, a WAN in a
/// round trip and a commit, a stalled sink never.
const ACK_BUCKETS: [f64; 15] = [
    0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0,
];

impl WatchObserved {
    /// Also makes `progress` tell it each acknowledgement's latency: call
    /// it before the watcher runs.
    pub fn new(
        source: String,
        progress: Arc<Progress>,
        top_files: usize,
        problems: RecentProblems,
    ) -> anyhow::Result<Self> {
        let histogram = HistogramVec::new(
            HistogramOpts::new(
                format!("{PREFIX}_batch_ack_latency_seconds"),
                "From a batch being sent to its acknowledgement (its bytes durable at the sink), per sink.",
            )
            .buckets(ACK_BUCKETS.to_vec()),
            &["sink"],
        )?;
        let seen_to_durable = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                format!("{PREFIX}_source_append_to_durable_seconds"),
                "From the watcher seeing a file grow to those bytes being durable at the sink (one observation per growth seen).",
            )
            .const_label("source", &source)
            .buckets(ACK_BUCKETS.to_vec()),
        )?;
        let ack_latency = Arc::new(AckLatency {
            batch_acked: histogram,
            seen_to_durable,
        });
        progress.set_pool_events(ack_latency.clone());
        progress.set_lag_events(ack_latency.clone());
        Ok(Self {
            source,
            progress,
            top_files,
            problems,
            started: Instant::now(),
            history: History::default(),
            ack_latency,
            role: None,
        })
    }

    /// Shows the process's role for its identity too (a fleet's member).
    pub fn with_role(mut self, role: Option<fleet::RoleStatus>) -> Self {
        self.role = role;
        self
    }
}

/// Furthest behind first: bytes owed, then seconds.
fn by_lag(files: &mut [FileProgress]) {
    files.sort_by(|a, b| {
        b.bytes_behind()
            .cmp(&a.bytes_behind())
            .then(b.seconds_behind.total_cmp(&a.seconds_behind))
            .then_with(|| a.path.cmp(&b.path))
    });
}

fn file_json(f: &FileProgress) -> serde_json::Value {
    json!({
        "path": f.path,
        "generation": f.generation,
        "size": f.size,
        "acked": f.acked,
        "lag_bytes": f.bytes_behind(),
        "lag_seconds": f.seconds_behind,
        "state": f.state,
        "append_rate": f.append_rate,
        "drain_rate": f.drain_rate,
        "eta_seconds": f.eta_seconds,
    })
}

/// One moment of the watcher, gathered once for both its metrics and its
/// status.
struct Moment<'a> {
    source: &'a str,
    files: Vec<FileProgress>,
    summary: SourceSummary,
    phase: Phase,
    sinks: Vec<SinkLink>,
    /// Bytes owed to each sink, over the files that go to it.
    owed: Vec<u64>,
    discovery: DiscoveryStatus,
    observed: u64,
    read: u64,
    acked: u64,
    role: Option<fleet::RoleReport>,
    cluster: Option<fleet::ClusterView>,
}

impl WatchObserved {
    fn moment(&self) -> Moment<'_> {
        let mut files = self.progress.files();
        let summary = self.progress.summary(&files);
        by_lag(&mut files);
        let sinks = self.progress.sinks();
        let mut owed = vec![0u64; sinks.len()];
        for f in &files {
            if let Some(sum) = owed.get_mut(f.sink) {
                *sum += f.bytes_behind();
            }
        }
        Moment {
            source: self.source.as_str(),
            files,
            summary,
            phase: self.progress.phase(),
            sinks,
            owed,
            discovery: self.progress.discovery(),
            observed: self.progress.bytes_observed(),
            read: self.progress.bytes_read(),
            acked: self.progress.bytes_acked(),
            role: self.role.as_ref().map(|role| role.report()),
            cluster: self.role.as_ref().and_then(|role| role.cluster()),
        }
    }

    /// The source's figures: bytes, lag, files by state and by lag,
    /// discovery, the verdict.
    fn source_metrics(&self, m: &Families, w: &Moment<'_>) {
        let per_source = |name: &str, help: &str, value: f64| {
            m.gauges(name, help, &["source"])
                .with_label_values(&[w.source])
                .set(value)
        };
        let source_total = |name: &str, help: &str, value: u64| {
            m.counters(name, help, &["source"])
                .with_label_values(&[w.source])
                .inc_by(value as f64)
        };
        source_total(
            "source_observed_bytes_total",
            "Bytes the source's files grew by, as the watcher saw them (since it started; a file resumed from the checkpoint counts from its acknowledged offset).",
            w.observed,
        );
        source_total(
            "source_read_bytes_total",
            "Bytes read from the source's files and sent (again, after a reconnect).",
            w.read,
        );
        source_total(
            "source_committed_bytes_total",
            "Bytes the sinks acknowledged: durable at the destination.",
            w.acked,
        );
        source_total(
            "source_sealed_files_total",
            "Files whose seal (complete, digest checked at the sink) was acknowledged since the watcher started.",
            self.progress.seals(),
        );
        per_source(
            "source_lag_bytes",
            "Bytes seen at the source and not yet durable at a sink, over all its files.",
            w.summary.lag_bytes_sum as f64,
        );
        per_source(
            "source_summed_file_lag_seconds",
            "The seconds behind of all the source's files added up (how much waiting is owed, where source_lag_seconds is the oldest).",
            w.summary.lag_seconds_sum,
        );
        per_source(
            "source_max_file_lag_bytes",
            "The most bytes one file of the source owes.",
            w.summary.lag_bytes_max as f64,
        );
        per_source(
            "source_lag_seconds",
            "How long ago the source's oldest byte not yet durable was seen: its lag in time (0 when caught up).",
            w.summary.lag_seconds_max,
        );
        per_source(
            "source_tracked_files",
            "Files being followed now (sealed files are no longer followed).",
            w.files.len() as f64,
        );
        per_source(
            "source_watched_directories",
            "Directories whose changes raise events (inotify watches, or directories known to the fanotify mark).",
            w.discovery.watched_directories as f64,
        );
        per_source(
            "source_unwatched_directories",
            "Directories no event reaches (inotify's watch limit reached, or another error): their files are polled and new files found by rescans.",
            w.discovery.unwatched_directories as f64,
        );
        per_source(
            "source_polled_files",
            "Files polled because no event tells of them (all of them with --events poll).",
            w.discovery.polled_files as f64,
        );
        per_source(
            "source_skipped_entries",
            "Entries the last walk did not transfer (symbolic links, names that are not UTF-8, unreadable directories, FIFOs); the status names them.",
            w.discovery.skipped_entries as f64,
        );
        let by_state = m.gauges(
            "source_files",
            "Files by state (done: sealed since the start).",
            &["source", "state"],
        );
        for (state, n) in &w.summary.files_by_state {
            by_state
                .with_label_values(&[w.source, state.as_str()])
                .set(*n as f64);
        }
        let verdict = m.gauges(
            "source_verdict",
            "1 for the source's verdict (the worst state of its files), 0 for the other states.",
            &["source", "state"],
        );
        for state in FileState::ALL {
            verdict
                .with_label_values(&[w.source, state.as_str()])
                .set(f64::from(u8::from(state == w.summary.verdict)));
        }
        per_source(
            "source_verdict_severity",
            "The verdict as a number: 0 done, 1 idle, 2 caught-up, 3 progressing, 4 falling-behind, 5 stalled, 6 failed.",
            f64::from(w.summary.verdict.severity()),
        );
        let by_class = m.gauges(
            "source_files_by_lag",
            "Files by how long their oldest byte not yet durable has waited, at most the class's bound (0s: caught up; inf: over a minute).",
            &["source", "lag_class"],
        );
        for (class, n) in &w.summary.files_by_lag_class {
            by_class
                .with_label_values(&[w.source, class])
                .set(*n as f64);
        }
    }

    /// Each sink's connections, lag and per-connection figures.
    fn link_metrics(&self, m: &Families, w: &Moment<'_>) {
        let connections = m.gauges(
            "link_connections",
            "Connections to each sink the watcher keeps.",
            &["sink"],
        );
        let connected = m.gauges(
            "link_connections_up",
            "Connections to each sink established now.",
            &["sink"],
        );
        let link_lag = m.gauges(
            "link_lag_bytes",
            "Bytes seen at the source and not yet durable, over the files that go to each sink.",
            &["sink"],
        );
        for (link, owed) in w.sinks.iter().zip(&w.owed) {
            link_lag
                .with_label_values(&[link.endpoint.as_str()])
                .set(*owed as f64);
        }
        for link in &w.sinks {
            connections
                .with_label_values(&[link.endpoint.as_str()])
                .set(link.connections as f64);
            connected
                .with_label_values(&[link.endpoint.as_str()])
                .set(link.connected as f64);
        }
        for (name, help, figure) in CONNECTION_GAUGES {
            let family = m.gauges(name, help, &["sink", "connection"]);
            for (link, c) in connections_of(&w.sinks) {
                family
                    .with_label_values(&[link, c.index.to_string().as_str()])
                    .set(figure(c));
            }
        }
        for (name, help, figure) in CONNECTION_COUNTERS {
            let family = m.counters(name, help, &["sink", "connection"]);
            for (link, c) in connections_of(&w.sinks) {
                family
                    .with_label_values(&[link, c.index.to_string().as_str()])
                    .inc_by(figure(c));
            }
        }
        let failures_by_connection = m.counters(
            "connection_failures_total",
            "Streams that failed on the connection (connecting included), by reason: a gRPC code (Unavailable, InvalidArgument, ...), connect, stream-closed or bad-ack.",
            &["sink", "connection", "reason"],
        );
        for (link, c) in connections_of(&w.sinks) {
            for (reason, n) in &c.failures {
                failures_by_connection
                    .with_label_values(&[link, c.index.to_string().as_str(), reason.as_str()])
                    .inc_by(*n as f64);
            }
        }
    }

    /// The files furthest behind, one series each (--metrics-top-files).
    fn file_metrics(&self, m: &Families, w: &Moment<'_>) {
        if self.top_files > 0 {
            let lag_bytes = m.gauges(
                "file_lag_bytes",
                "Bytes owed by each of the files furthest behind (--metrics-top-files).",
                &["source", "path"],
            );
            let lag_seconds = m.gauges(
                "file_lag_seconds",
                "Seconds behind of each of the files furthest behind (--metrics-top-files).",
                &["source", "path"],
            );
            for f in w.files.iter().take(self.top_files) {
                lag_bytes
                    .with_label_values(&[w.source, f.path.as_str()])
                    .set(f.bytes_behind() as f64);
                lag_seconds
                    .with_label_values(&[w.source, f.path.as_str()])
                    .set(f.seconds_behind);
            }
            m.gauges(
                "file_lag_truncated_files",
                "Files left out of the per-file lag series by --metrics-top-files.",
                &["source"],
            )
            .with_label_values(&[w.source])
            .set(w.files.len().saturating_sub(self.top_files) as f64);
        }
    }

    fn status_json(&self, w: &Moment<'_>) -> serde_json::Value {
        json!({
            "fleet": w.role,
            "cluster": w.cluster,
            "role": "watcher",
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_seconds": self.started.elapsed().as_secs_f64(),
            "phase": w.phase,
            "ready": w.phase == Phase::Tailing,
            // The tailer's heartbeat (progress published, walks made): the
            // first comes after its first walk.
            "tailer_heartbeats": self.progress.publications(),
            "sources": [{
                "source": w.source,
                "verdict": w.summary.verdict,
                "files_by_state": w.summary.files_by_state.iter().map(|(s, n)| (s.as_str(), *n)).collect::<std::collections::BTreeMap<_, _>>(),
                "files_by_lag_class": w.summary.files_by_lag_class.iter().map(|(class, n)| json!({"class": class, "files": n})).collect::<Vec<_>>(),
                "tracked_files": w.files.len(),
                "lag_bytes": w.summary.lag_bytes_sum,
                "max_file_lag_bytes": w.summary.lag_bytes_max,
                "lag_seconds": w.summary.lag_seconds_max,
                "summed_file_lag_seconds": w.summary.lag_seconds_sum,
                "append_rate": w.summary.append_rate,
                "drain_rate": w.summary.drain_rate,
                "observed_bytes": w.observed,
                "read_bytes": w.read,
                "committed_bytes": w.acked,
                "sealed_files": self.progress.seals(),
                "discovery": w.discovery,
            }],
            "sinks": w.sinks.iter().zip(&w.owed).map(|(link, owed)| {
                let mut value = serde_json::to_value(link).unwrap_or_default();
                value["lag_bytes"] = json!(owed);
                value
            }).collect::<Vec<_>>(),
            "files": w.files.iter().take(PAGE_FILES).map(file_json).collect::<Vec<_>>(),
            "files_not_listed": w.files.len().saturating_sub(PAGE_FILES),
            "history": self.history.points(),
            "problems": self.problems.list(),
        })
    }
}

impl Observed for WatchObserved {
    fn snapshot(&self) -> Snapshot {
        if let Some(role) = &self.role
            && role.report().role != fleet::Role::Active
        {
            return super::fleet::not_active_snapshot(
                "watcher",
                role,
                &self.problems,
                self.started,
            );
        }
        let w = self.moment();
        let m = Families::new();
        m.build_info("watcher");
        m.process();
        if let Some(report) = &w.role {
            super::fleet::role_metrics(&m, report);
        }
        if let Some(view) = &w.cluster {
            super::fleet::cluster_metrics(&m, view);
        }
        m.gauge(
            "ready",
            "1 once the watcher tails (after reconciling with its sinks), else 0.",
            f64::from(u8::from(w.phase == Phase::Tailing)),
        );
        self.source_metrics(&m, &w);
        self.link_metrics(&m, &w);
        m.register(self.ack_latency.batch_acked.clone());
        m.register(self.ack_latency.seen_to_durable.clone());
        self.file_metrics(&m, &w);
        let not_ready = match w.phase {
            Phase::Tailing => None,
            Phase::Starting => Some("starting".to_string()),
            Phase::Reconciling => Some("reconciling with the sinks".to_string()),
            Phase::Stopped => Some("stopping".to_string()),
        };
        Snapshot {
            status: self.status_json(&w),
            metrics: m.gather(),
            not_ready,
        }
    }

    fn sample(&self) {
        let files = self.progress.files();
        let summary = self.progress.summary(&files);
        self.history.push(Point {
            lag_bytes: summary.lag_bytes_sum as f64,
            lag_seconds: summary.lag_seconds_max,
            bytes_total: self.progress.bytes_acked() as f64,
            ..Point::default()
        });
    }
}
