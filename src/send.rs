//! `tailflight send`: the one-shot copy's command line (bbcp- and
//! xrdcp-like), its progress bar or progress lines, its summary, and exit
//! codes that scripts can branch on. The copying is `watcher::send`'s.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::bail;
use clap::Args;
use watcher::send::{Cut, Outcome, SendConfig, SendProgress, SendReport, SinkTarget, check_prefix};

use crate::args::ClientTlsArgs;
use crate::identity::FleetArgs;
use crate::process::say;

/// Exit codes, as `tailflight send --help` lists them.
pub mod exit {
    /// Every file is sealed at the sink, its digest checked there.
    pub const SENT: u8 = 0;
    /// Something was not sent or not sealed: a missing or unreadable path,
    /// a link or special file passed over, a file left growing.
    pub const PARTIAL: u8 = 3;
    /// The sink refused a file or the whole send (its reason is printed).
    pub const REFUSED: u8 = 4;
    /// The sink could not be reached within `--retry-for`.
    pub const UNREACHABLE: u8 = 5;
    /// Stopped by SIGINT or SIGTERM; a rerun sends the rest.
    pub const INTERRUPTED: u8 = 130;
}

#[derive(Args, Clone)]
#[command(override_usage = "tailflight send [OPTIONS] SRC... DEST")]
#[command(
    after_help = "Exit codes: 0 every file sealed and its digest checked by the sink; \
1 an error of tailflight's own; 2 bad arguments; 3 partial (a path missing, unreadable or passed \
over, a file left growing); 4 refused by the sink; 5 sink unreachable; 130 interrupted. \
Run it again after any of them: it sends only what the sink does not hold."
)]
pub struct SendArgs {
    /// Files and directories to send, then the destination
    /// http(s)://HOST:PORT[/SOURCE[/PATH]] (with --coordinator:
    /// SOURCE[/PATH], the files spread over the fleet's sink identities):
    /// the files land under the sink's directory for SOURCE (default: this
    /// host's name), in PATH. A directory `d` lands as PATH/d/..., `d/`
    /// puts its contents in PATH.
    #[arg(required = true, num_args = 2.., value_name = "PATH")]
    paths: Vec<String>,
    /// Send directories and everything under them.
    #[arg(short = 'r', long)]
    recursive: bool,
    /// Parallel TCP connections.
    #[arg(short = 'P', long, default_value_t = 4)]
    connections: usize,
    /// Bytes in flight per connection.
    #[arg(long, default_value = "32MiB", value_parser = crate::parse::parse_size)]
    window_bytes: u64,
    /// A batch is sent when it holds this many bytes.
    #[arg(long, default_value = "4MiB", value_parser = crate::parse::parse_size)]
    batch_bytes: u64,
    /// Largest single range row.
    #[arg(long, default_value = "1MiB", value_parser = crate::parse::parse_size)]
    max_row_bytes: u64,
    /// Largest message (the sink's limit must be at least this).
    #[arg(long, default_value = "64MiB", value_parser = crate::parse::parse_size)]
    max_message_bytes: u64,
    /// Send a file still growing only up to its size when first read and
    /// leave it unsealed (reported as incomplete), instead of following it
    /// until it has settled.
    #[arg(long)]
    no_follow: bool,
    /// A file unchanged this long is complete and is sealed.
    #[arg(long, default_value = "5s", value_parser = crate::parse::parse_duration)]
    settle: Duration,
    /// Whole-file digest the sink checks each seal against: crc64nvme or blake3.
    #[arg(long, default_value = "crc64nvme")]
    seal_digest: String,
    /// Give up when the sink is out of reach for this long.
    #[arg(long, default_value = "2m", value_parser = crate::parse::parse_duration)]
    retry_for: Duration,
    /// At most this many file bytes per second.
    #[arg(long, value_parser = crate::parse::parse_size)]
    limit_rate: Option<u64>,
    /// No progress output and no summary; errors only (and the exit code).
    #[arg(short = 'q', long)]
    quiet: bool,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Without a terminal: a progress line this often.
    #[arg(long, default_value = "5s", value_parser = crate::parse::parse_duration)]
    progress_every: Duration,
    #[command(flatten)]
    tls: ClientTlsArgs,
    #[command(flatten)]
    fleet: FleetArgs,
}

/// Where the files go: the sink's endpoint, the source name, the path in it.
#[derive(Debug, PartialEq, Eq)]
struct Destination {
    endpoint: String,
    source: Option<String>,
    prefix: String,
}

/// A fleet's destination: SOURCE[/PATH], the sinks found through etcd.
fn parse_fleet_destination(dest: &str) -> anyhow::Result<Destination> {
    if dest.contains("://") {
        bail!("with --coordinator the destination is SOURCE[/PATH], not an endpoint ({dest:?})");
    }
    let path = dest.trim_matches('/');
    let (source, prefix) = path.split_once('/').unwrap_or((path, ""));
    if source.is_empty() || source == "." || source == ".." {
        bail!("the destination {dest:?} must start with a plain source name");
    }
    check_prefix(prefix).map_err(anyhow::Error::msg)?;
    Ok(Destination {
        endpoint: String::new(),
        source: Some(source.to_owned()),
        prefix: prefix.to_owned(),
    })
}

fn parse_destination(dest: &str) -> anyhow::Result<Destination> {
    let Some((scheme, rest)) = dest.split_once("://") else {
        bail!("the destination {dest:?} must be http(s)://HOST:PORT[/SOURCE[/PATH]]");
    };
    if scheme != "http" && scheme != "https" {
        bail!("the destination {dest:?} must start with http:// or https://");
    }
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    if authority.is_empty() {
        bail!("the destination {dest:?} names no host");
    }
    let path = path.trim_end_matches('/');
    let (source, prefix) = match path.split_once('/') {
        _ if path.is_empty() => (None, String::new()),
        Some((source, prefix)) => (Some(source.to_owned()), prefix.to_owned()),
        None => (Some(path.to_owned()), String::new()),
    };
    if let Some(source) = &source
        && (source.is_empty() || source == "." || source == "..")
    {
        bail!("the destination's source name {source:?} must be a plain name");
    }
    check_prefix(&prefix).map_err(anyhow::Error::msg)?;
    Ok(Destination {
        endpoint: format!("{scheme}://{authority}"),
        source,
        prefix,
    })
}

/// The validated configuration, or the caller's mistake.
fn config(args: &SendArgs) -> anyhow::Result<SendConfig> {
    let (dest, sources) = args
        .paths
        .split_last()
        .ok_or_else(|| anyhow::anyhow!("no destination given"))?;
    let tls = args.tls.config();
    let dest = if args.fleet.coordinated() {
        if args.fleet.identity().is_some() {
            bail!("--identity is for sinks and watchers; a send finds the sink identities itself");
        }
        parse_fleet_destination(dest)?
    } else {
        let dest = parse_destination(dest)?;
        if dest.endpoint.starts_with("https://") != tls.is_some() {
            bail!("an https:// destination needs --tls-ca, and --tls-ca an https:// destination");
        }
        dest
    };
    let limit = |value: u64, what: &str| {
        usize::try_from(value).map_err(|_| anyhow::anyhow!("{what} is too large"))
    };
    let batch_bytes = limit(args.batch_bytes, "--batch-bytes")?;
    let max_row_bytes = limit(args.max_row_bytes, "--max-row-bytes")?;
    let max_message_bytes = limit(args.max_message_bytes, "--max-message-bytes")?;
    if batch_bytes + max_row_bytes + (64 << 10) > max_message_bytes {
        bail!("--batch-bytes plus --max-row-bytes must stay below --max-message-bytes");
    }
    if args.connections == 0 || max_row_bytes == 0 {
        bail!("--connections and --max-row-bytes must be at least 1");
    }
    Ok(SendConfig {
        sources: sources.iter().map(PathBuf::from).collect(),
        recursive: args.recursive,
        // A fleet's sinks are found once the runtime runs (see `run`).
        sinks: if dest.endpoint.is_empty() {
            Vec::new()
        } else {
            vec![SinkTarget::endpoint(dest.endpoint)]
        },
        source: dest.source.unwrap_or_else(crate::identity::host_name),
        prefix: dest.prefix,
        connections: args.connections,
        window_bytes: args.window_bytes,
        max_message_bytes,
        batch_bytes,
        max_row_bytes,
        tls,
        follow: !args.no_follow,
        settle: args.settle,
        digest: args
            .seal_digest
            .parse()
            .map_err(|e| anyhow::anyhow!("--seal-digest: {e}"))?,
        retry_for: args.retry_for,
        limit_rate: args.limit_rate.filter(|&rate| rate > 0),
    })
}

pub fn run(args: SendArgs) -> anyhow::Result<ExitCode> {
    let mut config = match config(&args) {
        Ok(config) => config,
        Err(e) => {
            say!("tailflight send: {e:#}");
            return Ok(ExitCode::from(2));
        }
    };
    // Files still growing stay open until they settle: a fresh tree of
    // thousands of them needs the hard limit.
    crate::process::raise_fd_limit();
    let runtime = crate::process::runtime()?;
    let progress = Arc::new(SendProgress::default());
    let report = runtime.block_on(async {
        let stop = crate::process::stop_signal();
        // Kept while the send runs: it follows the identities' endpoints.
        let mut _directory = None;
        if args.fleet.coordinated() {
            match fleet_sinks(&args, stop()).await {
                Ok(Some(directory)) => {
                    config.sinks = directory
                        .identities()
                        .iter()
                        .filter_map(|identity| {
                            let served_at = directory.endpoint(identity)?;
                            Some(SinkTarget::identity(identity.clone(), served_at))
                        })
                        .collect();
                    _directory = Some(directory);
                }
                Ok(None) => return Ok(None),
                Err(e) => {
                    say!("tailflight send: the fleet's sinks are unreachable: {e:#}");
                    return Ok(Some(Err(())));
                }
            }
        }
        let shown = show_progress(&args, progress.clone());
        let report = watcher::send::send(config, progress, stop()).await;
        shown.finish();
        report.map(|report| Some(Ok(report)))
    })?;
    let report = match report {
        Some(Ok(report)) => report,
        Some(Err(())) => return Ok(ExitCode::from(exit::UNREACHABLE)),
        None => return Ok(ExitCode::from(exit::INTERRUPTED)),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    if !args.quiet {
        eprint!("{}", summary(&report));
    }
    Ok(ExitCode::from(exit_code(&report)))
}

/// The fleet's sink identities and where each is served, within
/// `--retry-for`; `None` if stopped first.
async fn fleet_sinks(
    args: &SendArgs,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<Option<fleet::SinkDirectory>> {
    let connect = tokio::time::timeout(args.retry_for, args.fleet.connect(None, stop));
    let coordinator = match connect.await {
        Ok(connected) => connected?,
        Err(_) => bail!("no answer from the coordinator within {:?}", args.retry_for),
    };
    let Some(coordinator) = coordinator else {
        return Ok(None);
    };
    Ok(Some(
        fleet::follow_sinks(&coordinator, args.retry_for).await?,
    ))
}

fn exit_code(report: &SendReport) -> u8 {
    let refused = report.count(|o| matches!(o, Outcome::Refused { .. })) > 0;
    match &report.cut {
        Some(Cut::Unreachable { .. }) => exit::UNREACHABLE,
        Some(Cut::Refused { .. }) => exit::REFUSED,
        Some(Cut::Interrupted) => exit::INTERRUPTED,
        None if refused => exit::REFUSED,
        None if report.complete() => exit::SENT,
        None => exit::PARTIAL,
    }
}

fn summary(report: &SendReport) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let sealed = report.count(|o| *o == Outcome::Sealed);
    let already = report.count(|o| *o == Outcome::AlreadySealed);
    let rate = report.acked_bytes as f64 / report.seconds.max(1e-3);
    let _ = writeln!(
        out,
        "sent {} of {} files ({sealed} sealed now, {already} already at the sink): {} of {} sent in {:.1} s ({}/s), {} were there before",
        sealed + already,
        report.files.len(),
        bytes(report.acked_bytes),
        bytes(report.total_bytes),
        report.seconds,
        bytes(rate as u64),
        bytes(report.already_bytes),
    );
    for file in &report.files {
        let why = match &file.outcome {
            Outcome::Sealed | Outcome::AlreadySealed => continue,
            Outcome::Incomplete { size } => {
                format!("incomplete: still growing, sent up to {size} bytes and not sealed")
            }
            Outcome::Failed { reason } => format!("failed: {reason}"),
            Outcome::Refused { reason } => format!("refused by the sink: {reason}"),
        };
        let _ = writeln!(out, "  {} -> {}: {why}", file.local, file.key);
    }
    for passed in &report.passed {
        let _ = writeln!(out, "  {}: not sent: {}", passed.path, passed.why);
    }
    match &report.cut {
        Some(Cut::Unreachable { detail }) => {
            let _ = writeln!(out, "stopped: the sink is unreachable: {detail}");
        }
        Some(Cut::Refused { reason }) => {
            let _ = writeln!(out, "stopped: the sink refused the send: {reason}");
        }
        Some(Cut::Interrupted) => {
            let _ = writeln!(
                out,
                "interrupted: run the same command again to send the rest"
            );
        }
        None => {}
    }
    out
}

fn bytes(n: u64) -> String {
    indicatif::HumanBytes(n).to_string()
}

/// The progress display: a bar on a terminal, lines otherwise, nothing
/// with `--quiet`.
enum Shown {
    Nothing,
    Bar(indicatif::ProgressBar, tokio::task::JoinHandle<()>),
    Lines(tokio::task::JoinHandle<()>),
}

impl Shown {
    fn finish(self) {
        match self {
            Shown::Nothing => {}
            Shown::Bar(bar, task) => {
                task.abort();
                bar.finish_and_clear();
            }
            Shown::Lines(task) => task.abort(),
        }
    }
}

fn show_progress(args: &SendArgs, progress: Arc<SendProgress>) -> Shown {
    if args.quiet {
        return Shown::Nothing;
    }
    let load = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::Relaxed);
    if std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:30} {bytes}/{total_bytes} {bytes_per_sec} ETA {eta} files {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        let shown = bar.clone();
        let task = tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(100));
            loop {
                every.tick().await;
                shown.set_length(load(&progress.bytes_total));
                shown.set_position(load(&progress.bytes_done));
                shown.set_message(format!(
                    "{}/{}",
                    load(&progress.files_done),
                    load(&progress.files_total)
                ));
            }
        });
        return Shown::Bar(bar, task);
    }
    let every = args.progress_every.max(Duration::from_millis(100));
    Shown::Lines(tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.tick().await;
        let mut last = (std::time::Instant::now(), 0u64);
        loop {
            tick.tick().await;
            if !progress.started.load(Ordering::Relaxed) {
                say!("send: waiting for the sink");
                continue;
            }
            let done = load(&progress.bytes_done);
            let total = load(&progress.bytes_total);
            let rate =
                done.saturating_sub(last.1) as f64 / last.0.elapsed().as_secs_f64().max(1e-3);
            last = (std::time::Instant::now(), done);
            let eta = if rate > 0.0 {
                format!("{:.0} s", total.saturating_sub(done) as f64 / rate)
            } else {
                "-".into()
            };
            say!(
                "send: {} of {} ({:.0}%), {}/s, ETA {eta}, files {}/{}, connections {}",
                bytes(done),
                bytes(total),
                100.0 * done as f64 / total.max(1) as f64,
                bytes(rate as u64),
                load(&progress.files_done),
                load(&progress.files_total),
                load(&progress.connected),
            );
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_parse_like_urls() {
        let dest = parse_destination("https://sink:50051/cxi/run7/raw/").unwrap();
        assert_eq!(
            dest,
            Destination {
                endpoint: "https://sink:50051".into(),
                source: Some("cxi".into()),
                prefix: "run7/raw".into()
            }
        );
        let bare = parse_destination("http://127.0.0.1:50051").unwrap();
        assert_eq!((bare.source, bare.prefix.as_str()), (None, ""));
        let source = parse_destination("http://h:1/src").unwrap();
        assert_eq!(
            (source.source.as_deref(), source.prefix.as_str()),
            (Some("src"), "")
        );
        for bad in [
            "sink:50051",
            "ftp://h:1/a",
            "http:///a",
            "http://h:1/a/../b",
            "http://h:1/../b",
        ] {
            assert!(parse_destination(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn exit_codes_tell_what_happened() {
        let file = |outcome| watcher::send::FileReport {
            local: "l".into(),
            key: "k".into(),
            size: 1,
            outcome,
        };
        let mut report = SendReport {
            files: vec![file(Outcome::Sealed), file(Outcome::AlreadySealed)],
            ..SendReport::default()
        };
        assert_eq!(exit_code(&report), exit::SENT);
        report.files.push(file(Outcome::Incomplete { size: 1 }));
        assert_eq!(exit_code(&report), exit::PARTIAL);
        report.files.push(file(Outcome::Refused {
            reason: "no".into(),
        }));
        assert_eq!(exit_code(&report), exit::REFUSED);
        report.cut = Some(Cut::Unreachable {
            detail: "down".into(),
        });
        assert_eq!(exit_code(&report), exit::UNREACHABLE);
    }
}
