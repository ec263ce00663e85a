//! A one-shot send (`tailflight send`): copies files and trees to a sink on
//! the watcher's machinery (the same parallel connections, batches, and
//! seals with a whole-file digest that the sink checks against what it
//! placed), and returns when every file is sealed or has a reason not to be.
//!
//! - `plan`: what the command line names, and what it passes over;
//! - `resume`: where each file starts, from what the sink already holds
//!   (its watermarks), so a rerun sends only the rest, with no state of
//!   its own;
//! - `reader`: the thread that reads, digests and follows growing files;
//! - this module: the driver, which owns what the sink acknowledged and
//!   decides each file's outcome.

mod plan;
mod reader;
mod report;
mod resume;

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use flight_server::client::{ClientConfig, Delivery, Outgoing};
use flight_server::tls::ClientTls;
use flight_server::{BatchBuilder, FlightPool, SealDigest};

pub use plan::{Passed, Planned, check_prefix};
pub use report::{Cut, FileReport, Outcome, SendReport};

use reader::{BatchRow, ReadJob, Reader, ReaderConfig, ReaderEvent};
use resume::{Start, Unreachable};

/// A validated send.
#[derive(Clone, Debug)]
pub struct SendConfig {
    pub sources: Vec<PathBuf>,
    pub recursive: bool,
    /// Where the files go, spread over them by path.
    pub sinks: Vec<SinkTarget>,
    /// The source name the sink files them under.
    pub source: String,
    /// Where under the source's directory they land ("" for its top).
    pub prefix: String,
    pub connections: usize,
    pub window_bytes: u64,
    pub max_message_bytes: usize,
    pub batch_bytes: usize,
    pub max_row_bytes: usize,
    pub tls: Option<ClientTls>,
    /// Follow a growing file until it has been unchanged for `settle`
    /// (else send it up to its size when first read, and leave it unsealed).
    pub follow: bool,
    pub settle: Duration,
    pub digest: SealDigest,
    /// How long the sink may be out of reach (no connection and nothing
    /// acknowledged) before the send gives up.
    pub retry_for: Duration,
    pub limit_rate: Option<u64>,
}

/// A sink to send to: an endpoint, or a fleet's sink identity followed to
/// wherever it is served (across takeovers).
#[derive(Clone, Debug)]
pub struct SinkTarget {
    /// The endpoint (`http(s)://host:port`), or the identity when followed.
    pub name: String,
    /// Where the identity is served now (`None` inside: nowhere, for the moment).
    pub follow: Option<tokio::sync::watch::Receiver<Option<String>>>,
}

impl SinkTarget {
    pub fn endpoint(endpoint: impl Into<String>) -> Self {
        Self {
            name: endpoint.into(),
            follow: None,
        }
    }

    pub fn identity(
        identity: impl Into<String>,
        served_at: tokio::sync::watch::Receiver<Option<String>>,
    ) -> Self {
        Self {
            name: identity.into(),
            follow: Some(served_at),
        }
    }
}

/// What a send reports while it runs, for a progress bar.
#[derive(Debug, Default)]
pub struct SendProgress {
    pub files_total: AtomicU64,
    pub files_done: AtomicU64,
    pub bytes_total: AtomicU64,
    /// Acknowledged, or held by the sink before the run.
    pub bytes_done: AtomicU64,
    pub connected: AtomicU64,
    /// Set once the plan and the sink's watermarks are known.
    pub started: AtomicBool,
}

/// A file as the driver follows it.
struct Run {
    planned: Planned,
    generation: u64,
    resume_from: u64,
    /// The sink held it sealed: its seal is sent again, for the sink to
    /// check the digest of the file as it is here.
    was_sealed: bool,
    /// Sent again as a new generation after the sink refused its seal.
    resent: bool,
    acked: u64,
    /// The reader found it settled: seal at this size with this digest.
    settled: Option<(u64, String)>,
    left_growing: Option<u64>,
    seal_sent: bool,
    outcome: Option<Outcome>,
}

impl Run {
    fn sealable(&self) -> Option<(u64, &str)> {
        let (size, digest) = self.settled.as_ref()?;
        (self.outcome.is_none() && !self.seal_sent && self.resume_from + self.acked >= *size)
            .then_some((*size, digest.as_str()))
    }
}

/// Runs a send to its end: every file sealed or with its reason, or the
/// whole send cut (unreachable, refused, `shutdown`). Files are spread over
/// the sinks as a watcher spreads them ([`crate::shard::rendezvous`] of their
/// path), each sink's share sent on its own pool, side by side.
pub async fn send(
    config: SendConfig,
    progress: Arc<SendProgress>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<SendReport> {
    anyhow::ensure!(!config.sinks.is_empty(), "no sink to send to");
    let started = Instant::now();
    let (sources, recursive, prefix) = (
        config.sources.clone(),
        config.recursive,
        config.prefix.clone(),
    );
    tokio::pin!(shutdown);
    let planning = tokio::task::spawn_blocking(move || plan::plan(&sources, recursive, &prefix));
    let plan = tokio::select! {
        plan = planning => plan?,
        () = &mut shutdown => {
            return Ok(SendReport {
                cut: Some(Cut::Interrupted),
                seconds: started.elapsed().as_secs_f64(),
                ..SendReport::default()
            });
        }
    };
    let mut report = SendReport {
        passed: plan.passed,
        total_bytes: plan.files.iter().map(|f| f.size).sum(),
        ..SendReport::default()
    };
    progress
        .files_total
        .store(plan.files.len() as u64, Ordering::Relaxed);
    progress
        .bytes_total
        .store(report.total_bytes, Ordering::Relaxed);
    let names: Vec<String> = config.sinks.iter().map(|sink| sink.name.clone()).collect();
    let mut shares: Vec<Vec<Planned>> = vec![Vec::new(); names.len()];
    for planned in plan.files {
        shares[crate::shard::rendezvous(&planned.key, &names)].push(planned);
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let sends = futures::future::join_all(
        config
            .sinks
            .iter()
            .zip(shares)
            .filter(|(_, share)| !share.is_empty())
            .map(|(sink, share)| send_to(&config, sink, share, progress.clone(), stop_rx.clone())),
    );
    tokio::pin!(sends);
    let parts = tokio::select! {
        parts = &mut sends => parts,
        () = &mut shutdown => {
            let _ = stop_tx.send(true);
            sends.await
        }
    };
    progress.started.store(true, Ordering::Relaxed);
    for part in parts {
        let part = part?;
        report.files.extend(part.files);
        report.already_bytes += part.already_bytes;
        report.sent_bytes += part.sent_bytes;
        report.acked_bytes += part.acked_bytes;
        report.wire_bytes += part.wire_bytes;
        report.cut = match (report.cut.take(), part.cut) {
            (Some(a), Some(b)) => Some(a.graver(b)),
            (a, b) => a.or(b),
        };
    }
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// Sends `files` to one sink; the report holds only their figures.
async fn send_to(
    config: &SendConfig,
    sink: &SinkTarget,
    files: Vec<Planned>,
    progress: Arc<SendProgress>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<SendReport> {
    let mut report = SendReport::default();
    let client = ClientConfig {
        endpoint: sink.name.clone(),
        source: config.source.clone(),
        connections: config.connections,
        window_bytes: config.window_bytes,
        max_message_bytes: config.max_message_bytes,
        tls: config.tls.clone(),
        connect_timeout: Duration::from_secs(5),
    };
    let (pool, deliveries) = match &sink.follow {
        Some(target) => {
            FlightPool::start_following(client, None, sink.name.clone(), target.clone())?
        }
        None => FlightPool::start(client)?,
    };
    let pool = Arc::new(pool);
    let marks = tokio::select! {
        marks = resume::watermarks(&pool, &config.source, config.retry_for) => marks,
        Ok(_) = stop.wait_for(|&stop| stop) => Err(Unreachable::Interrupted),
    };
    let marks = match marks {
        Ok(marks) => marks,
        Err(cut) => {
            report.cut = Some(cut.into());
            report.files = files
                .into_iter()
                .map(|planned| FileReport {
                    local: planned.local.display().to_string(),
                    key: planned.key,
                    size: planned.size,
                    outcome: Outcome::Failed {
                        reason: "not sent: the send was cut before it began".into(),
                    },
                })
                .collect();
            return Ok(report);
        }
    };
    let starts = {
        let files = files.clone();
        tokio::task::spawn_blocking(move || resume::starts(&files, &marks))
    };
    let starts = tokio::select! {
        starts = starts => starts?,
        Ok(_) = stop.wait_for(|&stop| stop) => {
            report.cut = Some(Cut::Interrupted);
            return Ok(report);
        }
    };
    let mut runs: Vec<Run> = files
        .into_iter()
        .zip(starts)
        .map(|(planned, start)| {
            let (generation, resume_from, outcome) = match &start {
                Start::Sealed { generation } => (*generation, planned.size, None),
                Start::Resume { generation, from } => (*generation, *from, None),
                Start::Fresh { generation } => (*generation, 0, None),
                Start::Unreadable { reason } => (
                    1,
                    0,
                    Some(Outcome::Failed {
                        reason: reason.clone(),
                    }),
                ),
            };
            Run {
                was_sealed: matches!(start, Start::Sealed { .. }),
                resent: false,
                planned,
                generation,
                resume_from,
                acked: 0,
                settled: None,
                left_growing: None,
                seal_sent: false,
                outcome,
            }
        })
        .collect();
    report.already_bytes = runs.iter().map(|r| r.resume_from).sum();
    let mut driver = Driver {
        pool: pool.clone(),
        deliveries,
        progress: progress.clone(),
        tokens: HashMap::new(),
        next_token: 0,
        undecided: runs.iter().filter(|r| r.outcome.is_none()).count(),
        seal_candidates: Vec::new(),
        last_progress: Instant::now(),
        retry_for: config.retry_for,
        sent_bytes: 0,
        shown_connected: 0,
        to_open: Vec::new(),
        jobs: None,
    };
    progress
        .files_done
        .fetch_add((runs.len() - driver.undecided) as u64, Ordering::Relaxed);
    progress
        .bytes_done
        .fetch_add(report.already_bytes, Ordering::Relaxed);
    progress.started.store(true, Ordering::Relaxed);
    let cut = driver.run(config, &mut runs, &mut stop).await;
    progress
        .connected
        .fetch_sub(driver.shown_connected, Ordering::Relaxed);
    report.cut = cut;
    report.sent_bytes = driver.sent_bytes;
    report.acked_bytes = runs.iter().map(|r| r.acked).sum();
    report.wire_bytes = pool.connection_stats().iter().map(|c| c.sent_bytes).sum();
    report.files = runs
        .into_iter()
        .map(|run| FileReport {
            local: run.planned.local.display().to_string(),
            key: run.planned.key,
            size: run.settled.map_or(run.planned.size, |(size, _)| size),
            outcome: run.outcome.unwrap_or_else(|| Outcome::Failed {
                reason: "not finished when the send was cut".into(),
            }),
        })
        .collect();
    Ok(report)
}

/// What a batch carried, by row: the file and its generation (and the
/// bytes, for data).
enum Carried {
    Data(Vec<BatchRow>),
    Opens(Vec<(usize, u64)>),
    Seals(Vec<(usize, u64)>),
}

/// Open or Seal rows in one batch, at most: file keys are short, so such a
/// batch stays far below any message limit.
const CONTROL_ROWS_PER_BATCH: usize = 2048;

struct Driver {
    pool: Arc<FlightPool>,
    deliveries: tokio::sync::mpsc::UnboundedReceiver<Delivery>,
    progress: Arc<SendProgress>,
    tokens: HashMap<u64, Carried>,
    next_token: u64,
    /// Files without an outcome yet.
    undecided: usize,
    /// Files that may have become sealable since the last look.
    seal_candidates: Vec<usize>,
    /// When the sink last answered a batch, or none was waiting.
    last_progress: Instant,
    retry_for: Duration,
    sent_bytes: u64,
    /// This sink's connections as last added to the progress' count.
    shown_connected: u64,
    /// Files waiting for their Open row to be sent (a generation above 1
    /// must be opened, and the Open acknowledged, before its data).
    to_open: Vec<usize>,
    /// Files to read, for the reader thread (closed when all is decided).
    jobs: Option<std::sync::mpsc::Sender<ReadJob>>,
}

impl Driver {
    /// Gives a file its outcome, unless it has one already.
    fn decide(&mut self, run: &mut Run, outcome: Outcome) {
        if run.outcome.is_some() {
            return;
        }
        match &outcome {
            Outcome::Failed { reason } => {
                tracing::warn!(file = %run.planned.local.display(), %reason, "not sent")
            }
            Outcome::Refused { reason } => {
                tracing::error!(file = %run.planned.local.display(), %reason, "the sink refused the file")
            }
            _ => {}
        }
        run.outcome = Some(outcome);
        self.undecided -= 1;
        self.progress.files_done.fetch_add(1, Ordering::Relaxed);
    }

    fn token(&mut self, carried: Carried) -> u64 {
        self.next_token += 1;
        self.tokens.insert(self.next_token, carried);
        self.next_token
    }

    async fn run(
        &mut self,
        config: &SendConfig,
        runs: &mut [Run],
        stop: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Option<Cut> {
        let reader_stop = Arc::new(AtomicBool::new(false));
        let (events_tx, mut events) = tokio::sync::mpsc::channel(4);
        let (jobs_tx, jobs_rx) = std::sync::mpsc::channel();
        self.jobs = Some(jobs_tx);
        let reader = Reader::new(
            ReaderConfig {
                follow: config.follow,
                settle: config.settle,
                batch_bytes: config.batch_bytes,
                max_row_bytes: config.max_row_bytes,
                digest: config.digest,
                limit_rate: config.limit_rate,
            },
            events_tx,
            reader_stop.clone(),
        );
        let reading = std::thread::Builder::new()
            .name("send-reader".into())
            .spawn(move || reader.run(jobs_rx));
        let reading = match reading {
            Ok(handle) => handle,
            Err(e) => {
                tracing::error!(error = %e, "cannot start the reader thread");
                return Some(Cut::Refused {
                    reason: format!("cannot start the reader thread: {e}"),
                });
            }
        };
        for (file, run) in runs.iter().enumerate() {
            if run.outcome.is_some() {
                continue;
            }
            // Later generations are opened first, on their own: their data
            // may travel on any connection, and must not arrive before the Open.
            if run.generation > 1 && run.resume_from == 0 {
                self.to_open.push(file);
            } else {
                self.read(file, run);
            }
        }
        let (out_tx, mut out_rx) = tokio::sync::mpsc::channel::<Outgoing>(1);
        let pool = self.pool.clone();
        let sender = tokio::spawn(async move {
            while let Some(out) = out_rx.recv().await {
                pool.send(out).await;
            }
        });
        let mut pending: Option<Outgoing> = None;
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        let cut = loop {
            if self.undecided == 0 {
                break None;
            }
            if pending.is_none() {
                pending = self.opens(runs).or_else(|| self.seals(runs));
            }
            tokio::select! {
                permit = out_tx.reserve(), if pending.is_some() => match permit {
                    Ok(permit) => {
                        if let Some(out) = pending.take() {
                            permit.send(out);
                        }
                    }
                    Err(_) => break Some(Cut::Unreachable { detail: "the connection pool ended".into() }),
                },
                event = events.recv(), if pending.is_none() => match event {
                    Some(event) => pending = self.on_reader(event, runs),
                    // The reader ends only when told to, or when it panicked.
                    None => break Some(Cut::Refused { reason: "the reader thread ended unexpectedly (a bug: please report it)".into() }),
                },
                delivery = self.deliveries.recv() => match delivery {
                    Some(delivery) => self.on_delivery(delivery, runs),
                    None => break Some(Cut::Unreachable { detail: "the connection pool ended".into() }),
                },
                _ = tick.tick() => {
                    if let Some(cut) = self.check_reach() {
                        break Some(cut);
                    }
                }
                Ok(_) = stop.wait_for(|&stop| stop) => break Some(Cut::Interrupted),
            }
        };
        self.jobs = None;
        reader_stop.store(true, Ordering::Relaxed);
        drop(events);
        sender.abort();
        // A read stuck on a hung filesystem must not hold the exit.
        let joined = tokio::task::spawn_blocking(move || reading.join());
        if tokio::time::timeout(Duration::from_secs(10), joined)
            .await
            .is_err()
        {
            tracing::warn!("the reader thread is stuck in a read; leaving it behind");
        }
        cut
    }

    /// Hands a file to the reader, from its start for this generation.
    fn read(&self, file: usize, run: &Run) {
        if let Some(jobs) = &self.jobs {
            let _ = jobs.send(ReadJob {
                file,
                local: run.planned.local.clone(),
                key: run.planned.key.clone(),
                generation: run.generation,
                resume_from: run.resume_from,
            });
        }
    }

    /// A batch of Open rows for files waiting for one.
    fn opens(&mut self, runs: &[Run]) -> Option<Outgoing> {
        if self.to_open.is_empty() {
            return None;
        }
        let at = self.to_open.len().saturating_sub(CONTROL_ROWS_PER_BATCH);
        let due = self.to_open.split_off(at);
        let mut builder = BatchBuilder::with_capacity(due.len(), 0);
        for &i in &due {
            let run = &runs[i];
            builder.push_open(&run.planned.key, run.generation, &run.planned.key);
        }
        let carried = due.iter().map(|&i| (i, runs[i].generation)).collect();
        let token = self.token(Carried::Opens(carried));
        Some(Outgoing {
            token,
            batch: builder.finish_encoded(),
        })
    }

    /// Gives up once the sink has been out of reach for `retry_for`.
    fn check_reach(&mut self) -> Option<Cut> {
        let connected = self.pool.connected() as u64;
        self.progress
            .connected
            .fetch_add(connected, Ordering::Relaxed);
        self.progress
            .connected
            .fetch_sub(self.shown_connected, Ordering::Relaxed);
        self.shown_connected = connected;
        if self.tokens.is_empty() {
            self.last_progress = Instant::now();
            return None;
        }
        // A sink that takes connections but fails every batch (a full
        // disk, a poisoned sink) is as far out of reach as one that is down.
        (self.last_progress.elapsed() >= self.retry_for).then(|| Cut::Unreachable {
            detail: format!(
                "{} answered no batch for {:?} with {} waiting ({connected} of {} connections up)",
                self.pool.name(),
                self.retry_for,
                self.tokens.len(),
                self.pool.connections()
            ),
        })
    }

    fn on_reader(&mut self, event: ReaderEvent, runs: &mut [Run]) -> Option<Outgoing> {
        match event {
            ReaderEvent::Batch { batch, rows } => {
                self.sent_bytes += rows.iter().map(|r| r.bytes).sum::<u64>();
                let token = self.token(Carried::Data(rows));
                return Some(Outgoing { token, batch });
            }
            // What the reader says of a generation sent before is stale.
            ReaderEvent::Settled {
                file,
                generation,
                size,
                digest,
            } if generation == runs[file].generation => {
                runs[file].settled = Some((size, digest));
                self.seal_candidates.push(file);
            }
            ReaderEvent::LeftGrowing {
                file,
                generation,
                size,
            } if generation == runs[file].generation => {
                runs[file].left_growing = Some(size);
                self.judge_left_growing(&mut runs[file]);
            }
            ReaderEvent::Failed {
                file,
                generation,
                reason,
            } if generation == runs[file].generation => {
                self.decide(&mut runs[file], Outcome::Failed { reason })
            }
            _ => {}
        }
        None
    }

    fn judge_left_growing(&mut self, run: &mut Run) {
        if let Some(size) = run.left_growing
            && run.resume_from + run.acked >= size
        {
            self.decide(run, Outcome::Incomplete { size });
        }
    }

    fn on_delivery(&mut self, delivery: Delivery, runs: &mut [Run]) {
        self.last_progress = Instant::now();
        let (token, refusal, ack) = match delivery {
            Delivery::Acked { token, ack } => (token, None, Some(ack)),
            Delivery::Refused { token, error } => (token, Some(error), None),
        };
        let Some(carried) = self.tokens.remove(&token) else {
            return;
        };
        let rejected: HashMap<usize, String> = ack
            .map(|ack| ack.rejected.into_iter().map(|r| (r.row, r.error)).collect())
            .unwrap_or_default();
        let rows: Vec<(usize, u64, u64)> = match &carried {
            Carried::Data(rows) => rows
                .iter()
                .map(|r| (r.file, r.generation, r.bytes))
                .collect(),
            Carried::Opens(files) | Carried::Seals(files) => files
                .iter()
                .map(|&(f, generation)| (f, generation, 0))
                .collect(),
        };
        for (row, (file, generation, bytes)) in rows.into_iter().enumerate() {
            let run = &mut runs[file];
            if generation != run.generation || run.outcome.is_some() {
                continue;
            }
            if let Some(reason) = refusal
                .as_deref()
                .or(rejected.get(&row).map(String::as_str))
            {
                let reason = reason.to_owned();
                if matches!(carried, Carried::Seals(_)) && !run.resent {
                    self.send_again(run, file, &reason);
                } else {
                    self.decide(run, Outcome::Refused { reason });
                }
                continue;
            }
            run.acked += bytes;
            self.progress.bytes_done.fetch_add(bytes, Ordering::Relaxed);
            match carried {
                Carried::Seals(_) if run.was_sealed => self.decide(run, Outcome::AlreadySealed),
                Carried::Seals(_) => self.decide(run, Outcome::Sealed),
                Carried::Data(_) => {
                    self.seal_candidates.push(file);
                    self.judge_left_growing(run);
                }
                Carried::Opens(_) => self.read(file, run),
            }
        }
    }

    /// The sink refused a file's seal: what it holds is not this file (it
    /// changed since it was sent, or was rewritten in place while it was).
    /// The file goes again, whole, as a new generation that replaces it.
    fn send_again(&mut self, run: &mut Run, file: usize, reason: &str) {
        tracing::warn!(file = %run.planned.local.display(), %reason, "the sink's copy differs; sending the file again as a new generation");
        self.progress
            .bytes_done
            .fetch_sub(run.resume_from + run.acked, Ordering::Relaxed);
        run.resent = true;
        run.was_sealed = false;
        run.generation += 1;
        run.resume_from = 0;
        run.acked = 0;
        run.settled = None;
        run.left_growing = None;
        run.seal_sent = false;
        self.to_open.push(file);
    }

    /// A batch of seals for files whose every byte is acknowledged.
    fn seals(&mut self, runs: &mut [Run]) -> Option<Outgoing> {
        self.seal_candidates.sort_unstable();
        self.seal_candidates.dedup();
        self.seal_candidates
            .retain(|&i| runs[i].sealable().is_some());
        if self.seal_candidates.is_empty() {
            return None;
        }
        let at = self
            .seal_candidates
            .len()
            .saturating_sub(CONTROL_ROWS_PER_BATCH);
        let due = self.seal_candidates.split_off(at);
        let mut builder = BatchBuilder::with_capacity(due.len(), 0);
        let mut sealed = Vec::with_capacity(due.len());
        for i in due {
            let run = &mut runs[i];
            if let Some((size, digest)) = run.sealable() {
                builder.push_seal(&run.planned.key, run.generation, size, digest);
                sealed.push((i, run.generation));
            }
            run.seal_sent = true;
        }
        let token = self.token(Carried::Seals(sealed));
        Some(Outgoing {
            token,
            batch: builder.finish_encoded(),
        })
    }
}
