//! `tailflight tail`: the console consumer of a sink's live-tail
//! subscriptions, as `kafka-console-consumer` is Kafka's. It rebuilds the
//! files it follows under `--out` (byte for byte, renames applied, each
//! seal's digest checked) or prints one line per row, keeps its cursor in a
//! state file so that a restart resumes where it stopped, and reports its
//! progress on stderr.

use std::collections::HashMap;
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

use crate::ClientTlsArgs;

#[derive(Args, Clone)]
pub struct TailArgs {
    /// The sink's endpoint.
    #[arg(long = "from", default_value = "http://127.0.0.1:50051")]
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
    #[arg(long, value_parser = crate::parse_size)]
    max_batch_bytes: Option<u64>,
    #[command(flatten)]
    tls: ClientTlsArgs,
}

/// What the state file holds.
#[derive(serde::Serialize, serde::Deserialize)]
struct State {
    source: String,
    cursor: Vec<flight_server::subscription::Position>,
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
    let mut cursor = Cursor::default();
    let mut start = match args.start.as_str() {
        "now" => Start::Now,
        _ => Start::Beginning,
    };
    if let Some(path) = &state_path
        && let Ok(text) = std::fs::read(path)
    {
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
        cursor = Cursor::from_positions(state.cursor);
        start = Start::Cursor;
    }
    let config = flight_server::ClientConfig {
        endpoint: args.from.clone(),
        tls: args.tls.config(),
        ..Default::default()
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
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut progress = Progress::new();
        // Once a stream has told where it starts, a new one resumes there.
        let mut resumable = start == Start::Cursor;
        loop {
            let from_cursor = resumable || start == Start::Cursor;
            let ticket = Ticket {
                source: args.source.clone(),
                globs: args.globs.clone(),
                start: if from_cursor { Start::Cursor } else { start },
                cursor: from_cursor.then(|| cursor.positions()),
                follow: args.follow,
                max_batch_bytes: args.max_batch_bytes,
            };
            let outcome: anyhow::Result<()> = async {
                let mut batches =
                    flight_server::client::subscribe(&config, &ticket, token.as_deref()).await?;
                while let Some(consumed) = batches.next().await {
                    let consumed = consumed?;
                    let bytes = output.take(&consumed.batch)?;
                    cursor.apply(&consumed.cursor);
                    resumable = true;
                    if let Some(path) = &state_path {
                        save(path, &args.source, &cursor)?;
                    }
                    progress.add(bytes);
                }
                Ok(())
            }
            .await;
            match outcome {
                Ok(()) => break,
                // Following, a sink that went away is waited for: the
                // stream resumes from the cursor once it is back.
                Err(error) if args.follow && retryable(&error) => {
                    eprintln!("subscription interrupted ({error:#}); resuming in 1 s");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(error) => return Err(error),
            }
        }
        progress.report(true);
        anyhow::Ok(())
    })?;
    Ok(std::process::ExitCode::SUCCESS)
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
fn save(path: &Path, source: &str, cursor: &Cursor) -> anyhow::Result<()> {
    let state = State {
        source: source.to_owned(),
        cursor: cursor.positions(),
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
        eprintln!(
            "{} {:.1} MiB in {seconds:.1} s ({:.1} MiB/s)",
            if done { "received" } else { "receiving:" },
            self.bytes as f64 / 1048576.0,
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
