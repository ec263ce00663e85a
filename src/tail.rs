//! `tailflight tail`: the console consumer of a sink's live-tail
//! subscriptions, as `kafka-console-consumer` is Kafka's. It rebuilds the
//! files it follows under `--out` (byte for byte, renames applied, each
//! seal's digest checked) or prints one line per row, keeps its cursor in a
//! state file so that a restart resumes where it stopped, and reports its
//! progress on stderr.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use arrow_array::Array;
use arrow_array::cast::AsArray;
use arrow_array::types::UInt64Type;
use clap::Args;
use flight_server::checksum::SealDigest;
use flight_server::subscription::{Cursor, RowKind, Start, Ticket};
use futures::StreamExt;

use crate::args::ClientTlsArgs;
use crate::process::say;

#[derive(Args, Clone)]
pub struct TailArgs {
    /// The sink's endpoint.
    #[arg(
        long = "from",
        default_value = "http://127.0.0.1:50051",
        conflicts_with = "coordinator"
    )]
    from: String,
    /// The source whose files to follow.
    #[arg(long)]
    source: String,
    /// Globs over <source>/<path> (repeatable; default: every file).
    #[arg(long = "glob")]
    globs: Vec<String>,
    /// Where to start when there is no state file to resume from.
    #[arg(long, default_value = "beginning", value_parser = ["beginning", "now"])]
    start: String,
    /// Stay and deliver new bytes as they become durable.
    #[arg(long)]
    follow: bool,
    /// Rebuild the files under this directory.
    #[arg(long, conflicts_with = "print", required_unless_present = "print")]
    out: Option<PathBuf>,
    /// Print one line per row instead.
    #[arg(long)]
    print: bool,
    /// Keeps the cursor: a restart resumes from it (default: <out>/.tailflight-cursor.json).
    #[arg(long)]
    state: Option<PathBuf>,
    /// A file holding the subscriber token the sink asks for (its first line).
    #[arg(long, env = "TAILFLIGHT_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Largest batch the sink sends (bytes).
    #[arg(long, value_parser = crate::parse::parse_size)]
    max_batch_bytes: Option<u64>,
    #[command(flatten)]
    tls: ClientTlsArgs,
    /// With --coordinator: follow the source over every sink identity of
    /// the fleet, wherever each is served (instead of --from).
    #[command(flatten)]
    fleet: crate::identity::FleetArgs,
}

/// What the state file holds: the cursor of a sink's stream, or with
/// `--coordinator` one per sink identity (a sink refuses a cursor naming
/// files it does not hold).
#[derive(serde::Serialize, serde::Deserialize)]
struct State {
    source: String,
    #[serde(default)]
    cursor: Vec<flight_server::subscription::Position>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    identities: BTreeMap<String, Vec<flight_server::subscription::Position>>,
}

/// Where one stream of the subscription comes from: a sink's endpoint, or
/// a sink identity's, which changes at a takeover.
struct Stream {
    /// The identity (empty for a sink named by `--from`).
    identity: String,
    endpoint: tokio::sync::watch::Receiver<Option<String>>,
}

/// What the streams hand to the task that owns the output and the cursors.
enum Delivery {
    Batch {
        stream: usize,
        consumed: flight_server::client::Consumed,
    },
    /// Answered once every batch sent before it is in the output and its
    /// cursor: a stream resumes only from there, so nothing arrives twice.
    Settled(tokio::sync::oneshot::Sender<()>),
}

/// The cursors of every stream, as far as the output took their batches.
#[derive(Default)]
struct Cursors {
    cursors: Vec<Cursor>,
    /// Whether a stream's cursor says where to resume (it has carried an
    /// update, or came from the state file).
    resumable: Vec<bool>,
}

pub fn run(args: TailArgs) -> anyhow::Result<std::process::ExitCode> {
    let state_path = args.state.clone().or_else(|| {
        args.out
            .as_ref()
            .map(|out| out.join(".tailflight-cursor.json"))
    });
    if args.start == "now" && args.out.is_some() {
        bail!(
            "--out rebuilds whole files, and --start now joins them in the middle: use --print with --start now"
        );
    }
    if args.fleet.identity().is_some() {
        bail!("--identity is for sinks and watchers; a tail follows every sink identity");
    }
    let start = match args.start.as_str() {
        "now" => Start::Now,
        _ => Start::Beginning,
    };
    let saved: Option<State> = match &state_path {
        Some(path) => match std::fs::read(path) {
            Ok(text) => {
                let state: State = serde_json::from_slice(&text)
                    .with_context(|| format!("reading the cursor in {}", path.display()))?;
                if state.source != args.source {
                    bail!(
                        "{} holds a cursor of source {:?}, not {:?}",
                        path.display(),
                        state.source,
                        args.source
                    );
                }
                if args.fleet.coordinated() && !state.cursor.is_empty() {
                    bail!(
                        "{} holds the cursor of one sink (--from), not one per sink identity of a \
                         fleet (--coordinator): give another --state",
                        path.display()
                    );
                }
                if !args.fleet.coordinated() && !state.identities.is_empty() {
                    bail!(
                        "{} holds a fleet's cursors (--coordinator), not one sink's (--from): give \
                         another --state",
                        path.display()
                    );
                }
                Some(state)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(anyhow::Error::new(e)
                    .context(format!("reading the cursor in {}", path.display())));
            }
        },
        None => None,
    };
    let token = match &args.token_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("reading the token in {}", path.display()))?
                .lines()
                .next()
                .unwrap_or_default()
                .trim()
                .to_owned(),
        ),
        None => None,
    };
    let mut output = match &args.out {
        Some(out) => Output::Files(Rebuilt::new(out)?),
        None => Output::Print,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        // Kept for as long as the streams follow the identities' endpoints.
        let (streams, _directory) = streams_of(&args).await?;
        let names: Vec<String> = streams
            .iter()
            .map(|stream| stream.identity.clone())
            .collect();
        let mut cursors = Cursors::default();
        for stream in &streams {
            // An identity the state does not name starts as a new one.
            let positions = saved.as_ref().and_then(|state| {
                if args.fleet.coordinated() {
                    state.identities.get(&stream.identity).cloned()
                } else {
                    Some(state.cursor.clone())
                }
            });
            cursors.resumable.push(positions.is_some());
            cursors
                .cursors
                .push(Cursor::from_positions(positions.unwrap_or_default()));
        }
        let cursors = std::sync::Arc::new(std::sync::Mutex::new(cursors));
        let (deliver, mut delivered) = tokio::sync::mpsc::channel::<Delivery>(4);
        let mut tasks = tokio::task::JoinSet::new();
        for (index, stream) in streams.into_iter().enumerate() {
            let follower = Follower {
                index,
                fleet: args.fleet.coordinated(),
                args: args.clone(),
                start,
                token: token.clone(),
                cursors: cursors.clone(),
                deliver: deliver.clone(),
            };
            tasks.spawn(follower.run(stream));
        }
        drop(deliver);
        let names: Vec<String> = names;
        let mut progress = Progress::new();
        let terminated = crate::process::terminated();
        tokio::pin!(terminated);
        let mut interrupted = false;
        loop {
            let delivery = tokio::select! {
                delivery = delivered.recv() => match delivery {
                    Some(delivery) => delivery,
                    None => break,
                },
                // A stream that failed ends the tail at once.
                Some(ended) = tasks.join_next() => {
                    ended.context("a stream's task failed")??;
                    continue;
                }
                // Stopped (Ctrl-C, SIGTERM): what was taken is in the cursor.
                () = &mut terminated => {
                    interrupted = true;
                    break;
                }
            };
            match delivery {
                Delivery::Batch { stream, consumed } => {
                    let bytes = output.take(&consumed.batch)?;
                    let positions = {
                        let mut held = lock(&cursors);
                        held.cursors[stream].apply(&consumed.cursor);
                        held.resumable[stream] = true;
                        held.cursors
                            .iter()
                            .map(Cursor::positions)
                            .collect::<Vec<_>>()
                    };
                    if let Some(path) = &state_path {
                        save(
                            path,
                            &args.source,
                            &positions,
                            &names,
                            args.fleet.coordinated(),
                        )?;
                    }
                    progress.add(bytes);
                }
                Delivery::Settled(answer) => {
                    let _ = answer.send(());
                }
            }
        }
        if interrupted {
            tasks.abort_all();
        }
        while let Some(ended) = tasks.join_next().await {
            match ended {
                Ok(outcome) => outcome?,
                Err(e) if e.is_cancelled() => {}
                Err(e) => return Err(anyhow::Error::new(e).context("a stream's task failed")),
            }
        }
        progress.report(true);
        anyhow::Ok(())
    })?;
    Ok(std::process::ExitCode::SUCCESS)
}

fn lock(cursors: &std::sync::Mutex<Cursors>) -> std::sync::MutexGuard<'_, Cursors> {
    cursors
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The streams to follow: the sink of `--from`, or every sink identity of
/// the fleet (the ones registered when the tail starts).
async fn streams_of(
    args: &TailArgs,
) -> anyhow::Result<(Vec<Stream>, Option<fleet::SinkDirectory>)> {
    if !args.fleet.coordinated() {
        let (_, endpoint) = tokio::sync::watch::channel(Some(args.from.clone()));
        return Ok((
            vec![Stream {
                identity: String::new(),
                endpoint,
            }],
            None,
        ));
    }
    let Some(coordinator) = args.fleet.connect(None, std::future::pending()).await? else {
        bail!("the coordinator is unreachable");
    };
    let directory = fleet::follow_sinks(&coordinator, Duration::from_secs(60)).await?;
    let streams: Vec<Stream> = directory
        .identities()
        .iter()
        .filter_map(|identity| {
            Some(Stream {
                identity: identity.clone(),
                endpoint: directory.endpoint(identity)?,
            })
        })
        .collect();
    Ok((streams, Some(directory)))
}

/// One stream's task: subscribes where its sink is served now, hands the
/// batches over, and after an interruption or a takeover subscribes again
/// from its cursor.
struct Follower {
    index: usize,
    fleet: bool,
    args: TailArgs,
    start: Start,
    token: Option<String>,
    cursors: std::sync::Arc<std::sync::Mutex<Cursors>>,
    deliver: tokio::sync::mpsc::Sender<Delivery>,
}

impl Follower {
    async fn run(self, mut stream: Stream) -> anyhow::Result<()> {
        let name = if stream.identity.is_empty() {
            self.args.from.clone()
        } else {
            format!("sink identity {}", stream.identity)
        };
        loop {
            // Without --follow, an identity nobody serves is not waited for
            // forever: it is named.
            let patience = (!self.args.follow).then_some(ENDPOINT_PATIENCE);
            let endpoint = match wait_endpoint(&mut stream.endpoint, patience).await {
                Ok(Some(endpoint)) => endpoint,
                Ok(None) => return Ok(()),
                Err(waited) => anyhow::bail!(
                    "{name} has had no active process for {waited:?}: its files cannot be read now"
                ),
            };
            // Resume from what the output took, not from what is on its way.
            let (settled, settling) = tokio::sync::oneshot::channel();
            if self.deliver.send(Delivery::Settled(settled)).await.is_err() {
                return Ok(());
            }
            let _ = settling.await;
            let (cursor, resumable) = {
                let held = lock(&self.cursors);
                (
                    held.cursors[self.index].positions(),
                    held.resumable[self.index],
                )
            };
            let ticket = Ticket {
                source: self.args.source.clone(),
                globs: self.args.globs.clone(),
                file_key: None,
                start: if resumable { Start::Cursor } else { self.start },
                cursor: resumable.then_some(cursor),
                follow: self.args.follow,
                max_batch_bytes: self.args.max_batch_bytes,
            };
            let config = flight_server::ClientConfig {
                endpoint: endpoint.clone(),
                tls: self.args.tls.config(),
                ..Default::default()
            };
            let outcome: anyhow::Result<Ended> = async {
                let mut batches =
                    flight_server::client::subscribe(&config, &ticket, self.token.as_deref())
                        .await?;
                loop {
                    tokio::select! {
                        next = batches.next() => {
                            let Some(consumed) = next else { return Ok(Ended::Finished) };
                            let delivery = Delivery::Batch { stream: self.index, consumed: consumed? };
                            if self.deliver.send(delivery).await.is_err() {
                                return Ok(Ended::Finished);
                            }
                        }
                        // A takeover: the new process serves from the same state.
                        changed = stream.endpoint.changed(), if self.fleet => {
                            if changed.is_err() || stream.endpoint.borrow().as_deref() != Some(endpoint.as_str()) {
                                return Ok(Ended::Moved);
                            }
                        }
                    }
                }
            }
            .await;
            match outcome {
                Ok(Ended::Moved) => {
                    say!("{name}: moved from {endpoint}; resuming at its new endpoint");
                    continue;
                }
                Ok(Ended::Finished) if !self.args.follow => return Ok(()),
                Ok(Ended::Finished) => {
                    say!("{name}: the subscription ended; resuming in 1 s")
                }
                Err(error) if self.fleet && unknown_source(&error) => {
                    // This identity holds none of the source's files yet.
                    if !self.args.follow {
                        return Ok(());
                    }
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    continue;
                }
                // Following, a sink that went away is waited for: the
                // stream resumes from the cursor once it is back.
                Err(error) if (self.args.follow || self.fleet) && retryable(&error) => {
                    say!("{name}: subscription interrupted ({error:#}); resuming in 1 s");
                }
                Err(error) => return Err(error.context(name)),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// How long a tail without `--follow` waits for an identity with no
/// active process.
const ENDPOINT_PATIENCE: Duration = Duration::from_secs(60);

/// How a stream ended without an error.
enum Ended {
    /// The sink ended it (everything durable was sent, without --follow).
    Finished,
    /// The identity moved to another process (a takeover).
    Moved,
}

/// The endpoint now, waiting while there is none: `Ok(None)` once nobody
/// follows it any more, `Err` after `patience` without one.
async fn wait_endpoint(
    endpoint: &mut tokio::sync::watch::Receiver<Option<String>>,
    patience: Option<Duration>,
) -> Result<Option<String>, Duration> {
    let waiting = endpoint.wait_for(Option::is_some);
    let current = match patience {
        Some(patience) => tokio::time::timeout(patience, waiting)
            .await
            .map_err(|_| patience)?,
        None => waiting.await,
    };
    Ok(current.ok().and_then(|current| current.clone()))
}

/// A sink that holds no file of the source (yet).
fn unknown_source(error: &anyhow::Error) -> bool {
    use flight_server::client::ClientError;
    matches!(
        error.downcast_ref::<ClientError>(),
        Some(ClientError::Action { status, .. })
            if status.code() == tonic::Code::InvalidArgument
                && status.message().contains("is unknown to this sink")
    )
}

/// Whether a subscription's failure is the sink or the network going away
/// (worth waiting for), not a refusal.
fn retryable(error: &anyhow::Error) -> bool {
    use flight_server::client::ClientError;
    match error.downcast_ref::<ClientError>() {
        Some(ClientError::Endpoint { .. }) => true,
        Some(ClientError::Action { status, .. }) => matches!(
            status.code(),
            tonic::Code::Unavailable
                | tonic::Code::Unknown
                | tonic::Code::Internal
                | tonic::Code::Cancelled
        ),
        None => false,
    }
}

/// Writes the state file whole or not at all.
fn save(
    path: &Path,
    source: &str,
    positions: &[Vec<flight_server::subscription::Position>],
    names: &[String],
    fleet: bool,
) -> anyhow::Result<()> {
    let state = State {
        source: source.to_owned(),
        cursor: if fleet {
            Vec::new()
        } else {
            positions.first().cloned().unwrap_or_default()
        },
        identities: if fleet {
            names
                .iter()
                .cloned()
                .zip(positions.iter().cloned())
                .collect()
        } else {
            BTreeMap::new()
        },
    };
    let partial = path.with_extension("partial");
    std::fs::write(&partial, serde_json::to_vec(&state)?)
        .with_context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, path).with_context(|| format!("replacing {}", path.display()))?;
    Ok(())
}

struct Progress {
    started: Instant,
    last: Instant,
    bytes: u64,
}

impl Progress {
    fn new() -> Self {
        Self {
            started: Instant::now(),
            last: Instant::now(),
            bytes: 0,
        }
    }

    fn add(&mut self, bytes: u64) {
        self.bytes += bytes;
        if self.last.elapsed() >= Duration::from_secs(2) {
            self.report(false);
            self.last = Instant::now();
        }
    }

    fn report(&self, done: bool) {
        let seconds = self.started.elapsed().as_secs_f64().max(1e-3);
        say!(
            "{} {:.1} MiB ({} bytes) in {seconds:.1} s ({:.1} MiB/s)",
            if done { "received" } else { "receiving:" },
            self.bytes as f64 / 1048576.0,
            self.bytes,
            self.bytes as f64 / 1048576.0 / seconds
        );
    }
}

enum Output {
    Files(Rebuilt),
    Print,
}

/// One row, read out of a consumer batch.
struct Row<'a> {
    kind: RowKind,
    path: &'a str,
    key: &'a str,
    generation: u64,
    offset: u64,
    data: &'a [u8],
    size: Option<u64>,
    digest: Option<&'a str>,
    from_path: Option<&'a str>,
}

impl Output {
    /// Takes in a batch; returns the data bytes it held.
    fn take(&mut self, batch: &arrow_array::RecordBatch) -> anyhow::Result<u64> {
        let column = |name: &str| {
            batch
                .column_by_name(name)
                .with_context(|| format!("a consumer batch without column {name:?}"))
        };
        let kind = column("kind")?.as_string::<i32>();
        let path = column("path")?.as_string::<i32>();
        let key = column("file_key")?.as_string::<i32>();
        let generation = column("generation")?.as_primitive::<UInt64Type>();
        let offset = column("offset")?.as_primitive::<UInt64Type>();
        let data = column("data")?.as_binary::<i32>();
        let size = column("size")?.as_primitive::<UInt64Type>();
        let digest = column("digest")?.as_string::<i32>();
        let from_path = column("from_path")?.as_string::<i32>();
        let mut bytes = 0;
        for i in 0..batch.num_rows() {
            let row = Row {
                kind: RowKind::parse(kind.value(i))
                    .with_context(|| format!("unknown row kind {:?}", kind.value(i)))?,
                path: path.value(i),
                key: key.value(i),
                generation: generation.value(i),
                offset: offset.value(i),
                data: data.value(i),
                size: size.is_valid(i).then(|| size.value(i)),
                digest: digest.is_valid(i).then(|| digest.value(i)),
                from_path: from_path.is_valid(i).then(|| from_path.value(i)),
            };
            bytes += row.data.len() as u64;
            match self {
                Output::Print => print_row(&row),
                Output::Files(rebuilt) => rebuilt.take(&row)?,
            }
        }
        Ok(bytes)
    }
}

fn print_row(row: &Row<'_>) {
    let what = match row.kind {
        RowKind::Data => format!(
            "crc32c={:08x} {} bytes",
            flight_server::checksum::crc32c(row.data),
            row.data.len()
        ),
        RowKind::Renamed => format!("from {}", row.from_path.unwrap_or("?")),
        RowKind::Sealed => format!(
            "size {} digest {}",
            row.size.unwrap_or(0),
            row.digest.unwrap_or("?")
        ),
        RowKind::Opened | RowKind::Superseded => String::new(),
    };
    println!(
        "{:<10} {} key={} gen={} offset={} {what}",
        row.kind.as_str(),
        row.path,
        row.key,
        row.generation,
        row.offset
    );
}

/// Files rebuilt under a directory, by the rows that describe them.
struct Rebuilt {
    out: PathBuf,
    open: HashMap<String, std::fs::File>,
}

impl Rebuilt {
    fn new(out: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        Ok(Self {
            out: out.to_owned(),
            open: HashMap::new(),
        })
    }

    /// Where a row's path lands: under the output directory, never outside.
    fn target(&self, path: &str) -> anyhow::Result<PathBuf> {
        let confined = !path.is_empty()
            && !path.starts_with('/')
            && path
                .split('/')
                .all(|part| !part.is_empty() && part != "." && part != "..");
        if !confined {
            bail!("the sink sent a path that would leave the output directory: {path:?}");
        }
        Ok(self.out.join(path))
    }

    fn file(&mut self, path: &str, truncate: bool) -> anyhow::Result<&std::fs::File> {
        let target = self.target(path)?;
        if truncate || !self.open.contains_key(path) {
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)?;
            }
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(truncate)
                .open(&target)
                .with_context(|| format!("opening {}", target.display()))?;
            self.open.insert(path.to_owned(), file);
        }
        self.open
            .get(path)
            .with_context(|| format!("{path} is not open"))
    }

    fn take(&mut self, row: &Row<'_>) -> anyhow::Result<()> {
        match row.kind {
            RowKind::Opened => {
                self.file(row.path, true)?;
            }
            RowKind::Data => {
                let target = self.target(row.path)?;
                self.file(row.path, false)?
                    .write_all_at(row.data, row.offset)
                    .with_context(|| {
                        format!("writing at offset {} of {}", row.offset, target.display())
                    })?;
            }
            RowKind::Renamed => {
                let from = row.from_path.context("a renamed row without from_path")?;
                let (from_target, to_target) = (self.target(from)?, self.target(row.path)?);
                self.open.remove(from);
                self.open.remove(row.path);
                if let Some(parent) = to_target.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                match std::fs::rename(&from_target, &to_target) {
                    Ok(()) => {}
                    // Applied already, by this consumer before it was
                    // stopped (its cursor had not caught up yet).
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound && to_target.exists() => {}
                    Err(e) => {
                        return Err(e).with_context(|| {
                            format!(
                                "renaming {} to {}",
                                from_target.display(),
                                to_target.display()
                            )
                        });
                    }
                }
            }
            RowKind::Sealed => {
                let (size, digest) = (row.size.unwrap_or(0), row.digest.unwrap_or_default());
                let target = self.target(row.path)?;
                self.open.remove(row.path);
                let file = std::fs::File::open(&target)
                    .with_context(|| format!("opening {} to check its seal", target.display()))?;
                let algorithm = SealDigest::of_digest(digest)
                    .map_err(|e| anyhow::anyhow!("the seal of {}: {e}", row.path))?;
                let got = algorithm
                    .of_file_prefix(&file, size)
                    .with_context(|| format!("hashing {}", target.display()))?;
                if got != digest || file.metadata()?.len() != size {
                    bail!(
                        "{} does not match its seal (key {} generation {}): {size} bytes with {digest}, rebuilt {} bytes with {got}",
                        target.display(),
                        row.key,
                        row.generation,
                        file.metadata()?.len()
                    );
                }
            }
            // A generation the cursor knew that no longer exists at all:
            // nothing of it is here under a name the sink could give.
            RowKind::Superseded if row.path.is_empty() => {}
            RowKind::Superseded => {
                // The generation is void: its file goes (a newer one follows).
                self.open.remove(row.path);
                let target = self.target(row.path)?;
                let _ = std::fs::remove_file(&target);
            }
        }
        Ok(())
    }
}
