//! `tailflight tail`: the console consumer of a sink's live-tail
//! subscriptions, as `kafka-console-consumer` is Kafka's. It rebuilds the
//! files it follows under `--out` (byte for byte, renames applied, each
//! seal's digest checked) or prints one line per row, keeps its cursor in a
//! state file so that a restart resumes where it stopped, and reports its
//! progress on stderr. The following is the `consumer` crate's; this
//! module turns the flags into its configuration and finds the streams.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use consumer::follow::{Events, FollowConfig, Output, Stream, follow};
use consumer::rebuild::Rebuilt;
use consumer::state::{Cursors, StateFile};
use flight_server::subscription::{Start, Ticket};

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

pub fn run(args: TailArgs) -> anyhow::Result<std::process::ExitCode> {
    if args.start == "now" && args.out.is_some() {
        bail!(
            "--out rebuilds whole files, and --start now joins them in the middle: use --print with --start now"
        );
    }
    if args.fleet.identity().is_some() {
        bail!("--identity is for sinks and watchers; a tail follows every sink identity");
    }
    let state = args
        .state
        .clone()
        .or_else(|| {
            args.out
                .as_ref()
                .map(|out| out.join(".tailflight-cursor.json"))
        })
        .map(|path| StateFile {
            path,
            source: args.source.clone(),
            fleet: args.fleet.coordinated(),
        });
    let saved = match &state {
        Some(state) => state.load()?,
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
    let output = match &args.out {
        Some(out) => Output::Files(Rebuilt::new(out)?),
        None => Output::Lines(Box::new(std::io::stdout())),
    };
    let config = FollowConfig {
        ticket: Ticket {
            source: args.source.clone(),
            globs: args.globs.clone(),
            file_key: None,
            start: match args.start.as_str() {
                "now" => Start::Now,
                _ => Start::Beginning,
            },
            cursor: None,
            follow: args.follow,
            max_batch_bytes: args.max_batch_bytes,
        },
        tls: args.tls.config(),
        token,
        fleet: args.fleet.coordinated(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let progress = Arc::new(Console::default());
    runtime.block_on(async {
        // Kept for as long as the streams follow the identities' endpoints.
        let (streams, _directory) = streams_of(&args).await?;
        let names: Vec<String> = streams.iter().map(|s| s.identity.clone()).collect();
        let cursors = Cursors::new(&names, saved.as_ref(), args.fleet.coordinated());
        let events: Arc<dyn Events> = progress.clone();
        follow(
            config,
            streams,
            output,
            cursors,
            state,
            events,
            crate::process::terminated(),
        )
        .await
    })?;
    progress.report(true);
    Ok(std::process::ExitCode::SUCCESS)
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

/// The console's side of a tail: its messages and a progress line every
/// two seconds, on stderr.
struct Console {
    started: Instant,
    progress: Mutex<(Instant, u64)>,
}

impl Default for Console {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            progress: Mutex::new((Instant::now(), 0)),
        }
    }
}

impl Events for Console {
    fn resuming(&self, stream: &str, why: &str) {
        say!("{stream}: {why}");
    }

    fn taken(&self, bytes: u64) {
        let mut progress = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        progress.1 += bytes;
        if progress.0.elapsed() >= Duration::from_secs(2) {
            progress.0 = Instant::now();
            drop(progress);
            self.report(false);
        }
    }
}

impl Console {
    fn report(&self, done: bool) {
        let bytes = self.progress.lock().unwrap_or_else(|p| p.into_inner()).1;
        let seconds = self.started.elapsed().as_secs_f64().max(1e-3);
        say!(
            "{} {:.1} MiB ({} bytes) in {seconds:.1} s ({:.1} MiB/s)",
            if done { "received" } else { "receiving:" },
            bytes as f64 / 1048576.0,
            bytes,
            bytes as f64 / 1048576.0 / seconds
        );
    }
}
