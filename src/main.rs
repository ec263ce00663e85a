//! `tailflight`: parses arguments (and an optional TOML config equivalent to
//! them) and dispatches to the crates that do the work.

mod catalogue;
mod choices;
mod cluster;
#[cfg(feature = "bench")]
mod commit_log;
mod config;
mod demo;
mod feed_log;
mod heap;
mod identity;
mod kafka;
mod limits;
mod observe;
mod send;
mod serve;
mod service_manager;
mod tail;
mod top;
mod verify;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use flight_server::tls::{ClientTls, ServerTls};

/// Batches are megabytes and short-lived: glibc's malloc hands such blocks
/// back to the kernel and faults fresh zeroed pages in for the next batch,
/// a measurable share of each process's CPU at full rate. mimalloc keeps them.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: heap::Counting<mimalloc::MiMalloc> = heap::Counting::new(mimalloc::MiMalloc);
#[cfg(feature = "system-allocator")]
#[global_allocator]
static ALLOCATOR: heap::Counting<std::alloc::System> = heap::Counting::new(std::alloc::System);

/// The heap's figures by the global allocator's count.
pub fn heap_figures() -> heap::HeapFigures {
    ALLOCATOR.figures()
}

#[derive(Parser)]
#[command(
    name = "tailflight",
    version,
    args_override_self = true,
    about = "Stream growing files over Arrow Flight, placed exactly once at the destination"
)]
struct Cli {
    /// Log filter (RUST_LOG syntax), e.g. "info" or "watcher=debug".
    #[arg(long, global = true, default_value = "info", env = "TAILFLIGHT_LOG")]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Receive ranges and place them under a root directory.
    Sink(SinkArgs),
    /// Tail a directory tree and stream appended bytes to sinks.
    Watch(WatchArgs),
    /// Write DAQ-like growing files (detector simulator).
    Sim(SimArgs),
    /// Compare a source tree with a destination tree; exits 1 on any difference.
    Verify(VerifyArgs),
    /// Make a development CA, a server and a client certificate.
    Certs(CertsArgs),
    /// Ask a running sink for its counters.
    Status(StatusArgs),
    /// Check a sink manifest (after redoing journal rounds a machine crash lost): no byte range recorded twice; prints counters.
    Audit(AuditArgs),
    /// Run simulator, watcher and sink on loopback with live progress, then verify.
    Demo(demo::DemoArgs),
    /// Follow a sink's files as they become durable (a live-tail subscription).
    Tail(tail::TailArgs),
    /// A terminal view of a watcher or a sink (its --metrics-listen address).
    Top(top::TopArgs),
    /// Copy files and trees to a sink once (resumable, sealed, digest checked), as bbcp or xrdcp do.
    Send(send::SendArgs),
    /// A fleet's identities, their processes and roles (etcd); `handover` drains one to a standby.
    Fleet(cluster::ClusterArgs),
}

#[derive(Args, Clone)]
pub struct ServerTlsArgs {
    /// Serve TLS with this certificate (PEM).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (mutual TLS).
    #[arg(long, requires = "tls_cert")]
    client_ca: Option<PathBuf>,
}

impl ServerTlsArgs {
    fn config(&self) -> Option<ServerTls> {
        Some(ServerTls {
            cert: self.tls_cert.clone()?,
            key: self.tls_key.clone()?,
            client_ca: self.client_ca.clone(),
        })
    }
}

#[derive(Args, Clone)]
pub struct ClientTlsArgs {
    /// Connect with TLS, trusting this CA for the sink's certificate (PEM).
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// Client certificate for mutual TLS (PEM).
    #[arg(long, requires = "tls_ca", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// Client private key for mutual TLS (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Name to check the sink's certificate against (default: the host of --to).
    #[arg(long)]
    tls_domain: Option<String>,
}

impl ClientTlsArgs {
    fn config(&self) -> Option<ClientTls> {
        Some(ClientTls {
            ca: self.tls_ca.clone()?,
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            domain: self.tls_domain.clone(),
        })
    }
}

/// What a watcher or a sink shows operators (see `observe`).
#[derive(Args, Clone)]
pub struct ExportArgs {
    /// Serve Prometheus metrics (/metrics), the status page (/), its JSON
    /// (/api/status), /healthz and /readyz on this address.
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Also push the same metrics over OTLP/gRPC to this collector
    /// (e.g. http://otel-collector:4317).
    #[arg(long)]
    otlp_endpoint: Option<String>,
    /// How often to push over OTLP.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    otlp_every: Duration,
}

impl ExportArgs {
    fn wanted(&self) -> bool {
        self.metrics_listen.is_some() || self.otlp_endpoint.is_some()
    }

    fn otlp(&self, service: &str, source: Option<&str>) -> Option<observe::otlp::OtlpConfig> {
        let endpoint = self.otlp_endpoint.as_ref()?;
        Some(observe::otlp_config(
            endpoint,
            self.otlp_every,
            service,
            source,
        ))
    }
}

#[derive(Args, Clone)]
pub struct SinkArgs {
    /// Destination root: files land under it and nowhere else.
    #[arg(long)]
    root: PathBuf,
    /// Manifest directory (RocksDB); keep it on durable storage.
    #[arg(long)]
    state: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    #[command(flatten)]
    tls: ServerTlsArgs,
    /// Where files land: per-source (<root>/<source>/<path>) or flat (<root>/<path>).
    #[arg(long, value_enum, default_value = "per-source")]
    layout: choices::Layout,
    /// What happens to a generation a newer one replaces: mirror (remove it) or keep (as <path>.gen<N>).
    #[arg(long, value_enum, default_value = "mirror")]
    superseded: choices::Superseded,
    /// Largest gRPC message accepted (bytes); larger batches are refused.
    #[arg(long, default_value_t = 64 << 20)]
    max_message_bytes: usize,
    /// HTTP/2 flow-control window per stream and connection (bytes).
    #[arg(long, default_value_t = 64 << 20)]
    window_bytes: u32,
    /// Destination files kept open at once. Files whose journaled ranges
    /// wait for the background flush stay open until it; as many waiting
    /// start it early, and a cached file written directly holds a second
    /// descriptor, so at most about four times this many are open. Live-tail
    /// subscriptions keep up to this many more open between them, beyond
    /// 64 each.
    #[arg(long, default_value_t = 1024)]
    max_open_files: usize,
    /// Ranges up to this size may be made durable in the journal file (in
    /// the state directory) when their commit round flushes nothing else;
    /// their files are flushed in the background, about every 400 ms or
    /// 16 MiB, whichever comes first. One write
    /// and fdatasync of that file per round instead of a writeback of each
    /// grown file: lower latency for many small appends. 0 flushes every file
    /// in place before its ack.
    #[arg(long, default_value = "64KiB", value_parser = parse_size)]
    journal_max_range: u64,
    /// Writes each destination file in order, so that live readers never
    /// read a hole: ranges that arrive ahead of the bytes before them wait
    /// in memory, at most this many bytes for the whole sink (a batch that
    /// would hold more is refused and sent again). 0 writes every range as
    /// it arrives, as fast as that is, and readers may then read holes.
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    hold_limit: u64,
    /// Ranges whose block-aligned middle holds at least this many bytes
    /// write it with O_DIRECT, past the page cache: bulk data is not copied
    /// into page-cache memory first. auto: 512KiB on local disk filesystems
    /// (ext4, XFS, btrfs), never on others (network and parallel ones may
    /// make each direct write a synchronous round trip). Files whose
    /// filesystem refuses O_DIRECT are written through the page cache.
    /// 0 never writes directly.
    #[arg(long, default_value = "auto", value_parser = parse_size_or_auto)]
    direct_min: SizeOrAuto,
    /// How commit rounds make files durable: auto (one syncfs for rounds
    /// touching several files on a local filesystem, Linux 5.8+, while at
    /// most 64 MiB of the machine's memory is dirty; else per file), files
    /// (fdatasync each file, fsync each changed directory), filesystem
    /// (always syncfs; it also waits for other writers' dirty data there).
    #[arg(long, value_enum, default_value = "auto")]
    sync: choices::Sync,
    /// Read each file back from disk when it is sealed and compare its digest
    /// with the source's. Without it, a CRC-64 seal is compared with the
    /// checksum of the bytes as the sink wrote them (computed as each range
    /// is placed), and only files whose ranges this process did not all
    /// write (after a restart) are read back. Costs a second pass over every
    /// byte on the destination filesystem.
    #[arg(long)]
    seal_read_back: bool,
    /// Append "source key generation offset length durable_unix_nanos received_unix_nanos"
    /// per range a commit round made durable (latency benchmarks; `bench` feature).
    #[cfg(feature = "bench")]
    #[arg(long)]
    commit_log: Option<PathBuf>,
    /// Batches placed at once, each on a thread of its own; more wait in
    /// memory (each stream holds at most 8). Every thread that has placed
    /// batches keeps an allocator heap: this bounds the threads, and with
    /// them the memory, when the disk falls behind. Default: four per core,
    /// at least 8 and at most 64.
    #[arg(long)]
    placement_threads: Option<usize>,
    /// Subscriber tokens, one a line: live-tail subscriptions and listings
    /// then need 'authorization: Bearer <token>' with one of them. Read
    /// again whenever the file changes (edit it to rotate tokens).
    #[arg(long)]
    subscriber_tokens: Option<PathBuf>,
    /// Under mutual TLS, let a client certificate the CA signed (a
    /// watcher's) subscribe and list too; otherwise it may only write.
    #[arg(long)]
    writers_may_read: bool,
    /// Append what the manifest holds at the start, then every commit
    /// round of the commit feed, as JSON lines (for tests and for watching
    /// commits land).
    #[arg(long)]
    feed_log: Option<PathBuf>,
    #[command(flatten)]
    export: ExportArgs,
    #[command(flatten)]
    events: EventArgs,
    #[command(flatten)]
    fleet: identity::FleetArgs,
    /// With --identity: the URL watchers and consumers reach this process
    /// at (default: http(s)://<--listen>).
    #[arg(long, requires = "identity")]
    advertise: Option<String>,
}

/// Commit events on Kafka (`[sink.kafka]` in a config file).
#[derive(Args, Clone)]
pub struct EventArgs {
    /// Publish commit events (file.opened, range.committed, file.renamed,
    /// file.sealed, file.superseded, as CloudEvents) to these Kafka brokers
    /// (host:port,...). The events are recorded with each commit in the
    /// manifest's outbox and published exactly once, in order per file.
    /// Without it, no events are recorded and no Kafka code runs.
    #[arg(long)]
    kafka_brokers: Option<String>,
    /// The topic events go to.
    #[arg(long, default_value = "tailflight.events")]
    kafka_topic: String,
    /// Any librdkafka property, KEY=VALUE (repeat): security.protocol,
    /// sasl.*, ssl.*, compression.type, ... An unknown one fails at startup.
    #[arg(long, value_parser = parse_key_value)]
    kafka_property: Vec<(String, String)>,
    /// Unpublished events kept at most (bytes); past it, the sink refuses
    /// new data (its senders retry) until the relay catches up.
    #[arg(long, default_value = "1GiB", value_parser = parse_outbox_limit)]
    kafka_outbox_limit: u64,
    /// The sink's name in its events; default: its manifest's random id.
    #[arg(long)]
    sink_id: Option<String>,
}

impl EventArgs {
    fn kafka(&self) -> Option<kafka::KafkaSettings> {
        self.kafka_brokers
            .as_ref()
            .map(|brokers| kafka::KafkaSettings {
                brokers: brokers.clone(),
                topic: self.kafka_topic.clone(),
                properties: self.kafka_property.clone(),
            })
    }
}

fn parse_key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, _)) if kafka::RESERVED_PROPERTIES.contains(&key.trim()) => Err(format!(
            "{} is set by the relay (exactly-once publication depends on it); use --kafka-brokers \
             for the brokers",
            key.trim()
        )),
        Some((key, value)) if !key.trim().is_empty() => {
            Ok((key.trim().to_owned(), value.to_owned()))
        }
        _ => Err(format!("{text:?} is not KEY=VALUE")),
    }
}

fn parse_outbox_limit(text: &str) -> Result<u64, String> {
    match parse_size(text)? {
        0 => Err("the outbox needs room for at least one round's events".into()),
        limit => Ok(limit),
    }
}

#[derive(Args, Clone)]
pub struct WatchArgs {
    /// Directory tree to tail.
    #[arg(long)]
    dir: PathBuf,
    /// Stable name of this watcher; the sink places files under <root>/<source>/.
    #[arg(long)]
    source: String,
    /// Sink endpoint (http://HOST:PORT or https://HOST:PORT); repeat to
    /// shard files across sinks. With --coordinator instead, files are
    /// sharded over the cluster's sink identities, wherever they run.
    #[arg(long = "to", required_unless_present = "coordinator")]
    to: Vec<String>,
    /// Checkpoint directory (RocksDB). If lost, the watcher reconciles with the sinks.
    #[arg(long)]
    state: PathBuf,
    #[command(flatten)]
    tls: ClientTlsArgs,
    /// How changes are heard of: inotify (a watch per directory), fanotify
    /// (one mark on the tree's filesystem: no watch limit, needs
    /// CAP_SYS_ADMIN, falls back to inotify without it) or poll (NFS,
    /// Lustre, GPFS: remote writes raise no local event).
    #[arg(long, value_enum, default_value = "inotify")]
    events: choices::Events,
    /// The same as --events poll.
    #[arg(long)]
    poll: bool,
    /// Fastest poll interval for a growing file (adaptive polling backs off to --poll-max).
    #[arg(long, default_value = "5ms", value_parser = parse_duration)]
    poll_min: Duration,
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    poll_max: Duration,
    /// Full rescan interval (also recovers from inotify overflow).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    rescan: Duration,
    /// TCP connections per sink.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Bytes in flight (sent, not acknowledged) per connection.
    #[arg(long, default_value = "32MiB", value_parser = parse_size)]
    window: u64,
    /// Send a batch once it holds this many bytes...
    #[arg(long, default_value = "4MiB", value_parser = parse_size)]
    batch_bytes: u64,
    /// ...or once its first row waited this long.
    #[arg(long, default_value = "300us", value_parser = parse_duration)]
    linger: Duration,
    /// Largest single range in a batch.
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    max_row_bytes: u64,
    /// A closed file idle this long is sealed (renaming away from the in-progress suffix seals at once).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    seal_idle: Duration,
    /// Whole-file digest a seal carries and the sink verifies: crc64nvme (fast, catches
    /// damage and misplaced bytes) or blake3 (cryptographic, ~4x the CPU).
    #[arg(long, default_value = "crc64nvme")]
    seal_digest: flight_server::SealDigest,
    /// Suffix of files still being written.
    #[arg(long, default_value = ".inprogress")]
    inprogress_suffix: String,
    /// Largest gRPC message sent (bytes).
    #[arg(long, default_value_t = 64 << 20)]
    max_message_bytes: usize,
    /// Source files kept open at once (idle, fully read files are closed first).
    #[arg(long, default_value_t = 4096)]
    max_open_files: usize,
    #[command(flatten)]
    export: ExportArgs,
    #[command(flatten)]
    fleet: identity::FleetArgs,
    /// With --coordinator: how long to wait at startup for a sink identity
    /// to be registered before giving up.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    sinks_patience: Duration,
    /// Also export the lag of this many files furthest behind, labelled by
    /// path (0: per-source aggregates only, whatever the number of files).
    #[arg(long, default_value_t = 0)]
    metrics_top_files: usize,
    /// A file whose owed bytes were all seen this recently is caught up
    /// (they are the pipeline's own latency, not a lag).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    caught_up_within: Duration,
    /// A file owing bytes with no acknowledgement for this long is stalled.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    stall_after: Duration,
    /// A file owing nothing that has not grown for this long is idle
    /// (before that, caught up).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    idle_after: Duration,
}

#[derive(Args, Clone)]
pub struct SimArgs {
    /// Output directory.
    #[arg(long)]
    dir: PathBuf,
    /// Run name; files are <run>-sNN-cNNN.xtc2.
    #[arg(long, default_value = "r0001")]
    run: String,
    /// Files written in parallel.
    #[arg(long, default_value_t = 4)]
    streams: usize,
    /// Threads making the writes, the streams dealt out among them in turn
    /// (default: one per stream).
    #[arg(long)]
    writer_threads: Option<usize>,
    /// Writes per second per stream (0: as fast as possible).
    #[arg(long, default_value_t = 120.0)]
    rate: f64,
    /// Bytes per frame (or per event with --events-per-write).
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    frame: u64,
    /// Events gathered into one write.
    #[arg(long, default_value_t = 1)]
    events_per_write: usize,
    /// Rotate chunk files at this size.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    chunk: u64,
    /// Stop after this long...
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// ...or after this many bytes in all.
    #[arg(long, value_parser = parse_size)]
    total: Option<u64>,
    /// A burst every this long...
    #[arg(long, value_parser = parse_duration)]
    burst_every: Option<Duration>,
    /// ...lasting this long...
    #[arg(long, value_parser = parse_duration)]
    burst_len: Option<Duration>,
    /// ...at this multiple of the rate.
    #[arg(long, default_value_t = 4.0)]
    burst_factor: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Log each write ("file offset len unix_nanos") to this file.
    #[arg(long)]
    write_log: Option<PathBuf>,
}

#[derive(Args, Clone)]
pub struct VerifyArgs {
    source: PathBuf,
    dest: PathBuf,
    /// Skip files ending with this suffix (repeatable).
    #[arg(long)]
    ignore: Vec<String>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Clone)]
pub struct CertsArgs {
    /// Directory to write ca.pem, server.pem/.key and client.pem/.key into.
    #[arg(long)]
    out: PathBuf,
    /// Names the server certificate is valid for (default: localhost and 127.0.0.1).
    #[arg(long = "host")]
    hosts: Vec<String>,
}

#[derive(Args, Clone)]
pub struct StatusArgs {
    /// Sink endpoint.
    #[arg(long = "to", default_value = "http://127.0.0.1:50051")]
    to: String,
    #[command(flatten)]
    tls: ClientTlsArgs,
}

#[derive(Args, Clone)]
pub struct AuditArgs {
    /// The sink's manifest directory (the sink must not be running).
    #[arg(long)]
    state: PathBuf,
    /// Also print every file record (destination path, placed ranges, seal).
    #[arg(long)]
    files: bool,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    units::parse_duration(s).map_err(|e| e.to_string())
}

/// A size, or "auto" (None) for the default the sink picks.
#[derive(Clone, Copy, Debug)]
struct SizeOrAuto(Option<u64>);

fn parse_size_or_auto(s: &str) -> Result<SizeOrAuto, String> {
    match s {
        "auto" => Ok(SizeOrAuto(None)),
        size => parse_size(size).map(|n| SizeOrAuto(Some(n))),
    }
}

fn parse_size(s: &str) -> Result<u64, String> {
    units::parse_size(s).map_err(|e| e.to_string())
}

fn main() -> std::process::ExitCode {
    let args = match config::expand_config_args(std::env::args_os().collect()) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("tailflight: {e:#}");
            return std::process::ExitCode::from(2);
        }
    };
    let cli = Cli::parse_from(args);
    // A panic while a sink's placement thread holds its locks poisons the
    // sink before the locks go (the hook is the program's to set).
    sink::health::install_panic_hook();
    // Warnings and errors are also kept for the status page.
    let problems = observe::RecentProblems::default();
    {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::util::SubscriberInitExt;
        // The demo keeps its terminal for its progress line.
        let log_file = match &cli.command {
            Command::Demo(args) => match demo::log_file(args) {
                Ok(file) => Some(file),
                Err(e) => {
                    eprintln!("tailflight: {e:#}");
                    return std::process::ExitCode::FAILURE;
                }
            },
            _ => None,
        };
        // A send keeps the terminal for its progress and says what went
        // wrong in its summary; its log is there when asked for (--log).
        let log = match &cli.command {
            Command::Send(_) if cli.log == "info" => "off",
            _ => cli.log.as_str(),
        };
        let filter = tracing_subscriber::EnvFilter::try_new(log).unwrap_or_else(|_| "info".into());
        let registry = tracing_subscriber::registry()
            .with(filter)
            .with(problems.clone());
        match log_file {
            Some(file) => registry
                .with(
                    tracing_subscriber::fmt::layer()
                        .with_ansi(false)
                        .with_writer(std::sync::Mutex::new(file)),
                )
                .init(),
            None => registry
                .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
                .init(),
        }
    }
    match run(cli.command, problems) {
        Ok(code) => code,
        Err(e) => match e.downcast_ref::<limits::FlagsRefused>() {
            // As clap refuses what it cannot parse: the caller's mistake.
            Some(refused) => {
                eprintln!("tailflight: {refused}");
                std::process::ExitCode::from(2)
            }
            None => {
                eprintln!("tailflight: error: {e:#}");
                std::process::ExitCode::FAILURE
            }
        },
    }
}

/// Sinks and watchers hold a descriptor per open file: take the hard limit.
fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit with a valid, initialised struct.
    unsafe {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                tracing::warn!("cannot raise the open-file limit; many files may exhaust it");
            }
        }
    }
}

/// How long an idle thread of tokio's blocking pool waits for more work
/// before it ends. mimalloc keeps pages for every thread that allocated;
/// pool threads that outlive a burst of work (the catch-up after a network
/// cut) keep them all, and each burst may grow the pool. A thread that ends
/// gives its pages back, so the memory follows the work instead of the
/// largest burst so far (docs/measurements.md).
const BLOCKING_THREAD_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .thread_keep_alive(BLOCKING_THREAD_IDLE)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

async fn ctrl_c() {
    let _ = tokio::signal::ctrl_c().await;
}

/// One SIGINT/SIGTERM listener for the whole process, started now, and a
/// maker of futures that resolve once it has heard the signal: a signal
/// that arrives before some part of the process starts waiting is not lost
/// to it. Call it inside the runtime.
fn stop_signal() -> impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    let (heard, hearing) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        terminated().await;
        let _ = heard.send(true);
    });
    move || {
        let mut hearing = hearing.clone();
        Box::pin(async move {
            // An error means the listener is gone: the process is ending.
            let _ = hearing.wait_for(|heard| *heard).await;
        })
    }
}

/// Resolves on SIGINT or SIGTERM.
pub(crate) async fn terminated() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => return ctrl_c().await,
    };
    tokio::select! {
        _ = ctrl_c() => {}
        _ = term.recv() => {}
    }
}

fn sink_config(args: &SinkArgs) -> sink::SinkConfig {
    sink::SinkConfig {
        root: args.root.clone(),
        state_dir: args.state.clone(),
        listen: args.listen,
        tls: args.tls.config(),
        layout: args.layout.into(),
        superseded: args.superseded.into(),
        max_message_bytes: args.max_message_bytes,
        window_bytes: args.window_bytes,
        max_open_files: args.max_open_files,
        journal_max_range: args.journal_max_range,
        hold_limit: args.hold_limit,
        direct_min: args.direct_min.0,
        sync: args.sync.into(),
        seal_read_back: args.seal_read_back,
        placement_threads: args.placement_threads,
        read_access: flight_server::ReadAccess {
            tokens_file: args.subscriber_tokens.clone(),
            writers_may_read: args.writers_may_read,
        },
        events: args
            .events
            .kafka_brokers
            .as_ref()
            .map(|_| sink::outbox::EventsConfig {
                sink_id: args.events.sink_id.clone(),
                limit_bytes: args.events.kafka_outbox_limit,
            }),
        federation: None,
    }
}

fn watch_config(args: &WatchArgs) -> watcher::WatchConfig {
    watcher::WatchConfig {
        root: args.dir.clone(),
        source: args.source.clone(),
        state_dir: args.state.clone(),
        sinks: args.to.clone(),
        followed_sinks: Vec::new(),
        connections: args.connections,
        window_bytes: args.window,
        max_message_bytes: args.max_message_bytes,
        tls: args.tls.config(),
        events: if args.poll {
            watcher::EventSource::Poll
        } else {
            args.events.into()
        },
        poll_min: args.poll_min,
        poll_max: args.poll_max,
        rescan_every: args.rescan,
        batch_bytes: args.batch_bytes as usize,
        linger: args.linger,
        max_row_bytes: args.max_row_bytes as usize,
        seal: true,
        seal_idle: args.seal_idle,
        seal_digest: args.seal_digest,
        inprogress_suffix: args.inprogress_suffix.clone(),
        max_open_files: args.max_open_files,
        lag: watcher::LagPolicy {
            caught_up_within: args.caught_up_within,
            stall_after: args.stall_after,
            idle_after: args.idle_after,
            ..watcher::LagPolicy::default()
        },
    }
}

fn sim_config(args: &SimArgs) -> detector_sim::SimConfig {
    detector_sim::SimConfig {
        dir: args.dir.clone(),
        run: args.run.clone(),
        streams: args.streams,
        writer_threads: args.writer_threads,
        rate_hz: args.rate,
        frame_bytes: args.frame as usize,
        events_per_write: args.events_per_write,
        burst_every: args.burst_every,
        burst_len: args.burst_len,
        burst_factor: args.burst_factor,
        chunk_bytes: args.chunk,
        duration: args.duration,
        total_bytes: args.total,
        seed: args.seed,
        write_log: args.write_log.clone(),
    }
}

fn run(
    command: Command,
    problems: observe::RecentProblems,
) -> anyhow::Result<std::process::ExitCode> {
    use std::process::ExitCode;
    match command {
        Command::Sink(args) => {
            limits::check_sink(&args)?;
            raise_fd_limit();
            let config = sink_config(&args);
            runtime()?.block_on(async {
                let stop = stop_signal();
                if args.fleet.identity().is_some() {
                    serve::run_sink_identity(&args, &config, problems, &stop).await
                } else {
                    serve::serve_sink(&args, &config, problems, &stop, None, || {}).await
                }
            })?;
        }
        Command::Watch(args) => {
            limits::check_watch(&args)?;
            raise_fd_limit();
            let progress = Arc::new(watcher::Progress::default());
            runtime()?.block_on(async {
                let stop = stop_signal();
                let mut exporters = Vec::new();
                let role = args.fleet.identity().map(|identity| {
                    fleet::RoleStatus::new(fleet::Kind::Watcher, identity, args.fleet.cluster())
                });
                if args.export.wanted() {
                    let observed = observe::WatchObserved::new(
                        args.source.clone(),
                        progress.clone(),
                        args.metrics_top_files,
                        problems,
                    )?;
                    exporters = observe::export(
                        Arc::new(observed.with_role(role.clone())),
                        args.export.metrics_listen,
                        args.export.otlp("tailflight-watch", Some(&args.source)),
                        stop(),
                    )
                    .await?;
                }
                let watched_progress = progress.clone();
                let service = tokio::spawn(async move {
                    // Ready once reconciled and tailing (its first progress
                    // is published after its first walk).
                    while watched_progress.phase() != watcher::Phase::Tailing
                        || watched_progress.publications() == 0
                    {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    service_manager::ready("tailing");
                    let mut last = watched_progress.publications();
                    service_manager::watchdog(move || {
                        let now = watched_progress.publications();
                        let moved = now != last;
                        last = now;
                        if moved {
                            Ok(())
                        } else {
                            Err(
                                "the tailer has not published its progress since the last ping"
                                    .into(),
                            )
                        }
                    })
                    .await;
                });
                let watched = serve::run_watcher(&args, progress.clone(), role, &stop).await;
                service.abort();
                for exporter in exporters {
                    exporter.abort();
                }
                watched
            })?;
        }
        Command::Sim(args) => {
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            // SIGTERM or Ctrl-C ends the run cleanly: last chunks renamed, end marker written.
            let signals = runtime()?;
            let stop_on_signal = stop.clone();
            signals.spawn(async move {
                terminated().await;
                stop_on_signal.store(true, std::sync::atomic::Ordering::Relaxed);
            });
            let report = detector_sim::run(&sim_config(&args), &stop)?;
            println!(
                "wrote {} bytes in {} files in {:.2}s",
                report.bytes,
                report.files.len(),
                report.elapsed.as_secs_f64()
            );
        }
        Command::Verify(args) => {
            let options = crate::verify::VerifyOptions {
                ignore: args.ignore.clone(),
                ..Default::default()
            };
            let report = crate::verify::verify_trees(&args.source, &args.dest, &options)?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!("{report}");
            }
            return Ok(if report.is_identical() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            });
        }
        Command::Certs(args) => {
            flight_server::tls::make_dev_certs(&args.out, &args.hosts).map_err(|e| {
                anyhow::anyhow!("making certificates in {}: {e}", args.out.display())
            })?;
            println!(
                "wrote {} into {}",
                flight_server::tls::DEV_CERT_FILES.join(", "),
                args.out.display()
            );
        }
        Command::Status(args) => {
            let config = flight_server::ClientConfig {
                endpoint: args.to.clone(),
                tls: args.tls.config(),
                ..Default::default()
            };
            let status = runtime()?.block_on(flight_server::client::action(
                &config,
                flight_server::protocol::ACTION_STATUS,
                Vec::new(),
            ))?;
            println!("{}", String::from_utf8_lossy(&status));
        }
        Command::Audit(args) => {
            let report = sink::audit(&args.state, args.files)?;
            println!("{}", serde_json::to_string_pretty(&report)?);
            return Ok(if report.overlapping_placements == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            });
        }
        Command::Demo(args) => return demo::run(args),
        Command::Tail(args) => return tail::run(args),
        Command::Top(args) => return top::run(args),
        Command::Send(args) => return send::run(args),
        Command::Fleet(args) => return cluster::run(args),
    }
    Ok(ExitCode::SUCCESS)
}
