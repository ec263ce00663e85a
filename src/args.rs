//! The command line's shared pieces: the flags of the sink, the watcher
//! and the simulator (and of TLS, the exporters, the Kafka events), and the
//! validated configurations the libraries take, made from them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use flight_server::tls::{ClientTls, ServerTls};

use crate::parse::{SizeOrAuto, parse_duration, parse_size, parse_size_or_auto};
use crate::{choices, identity, observe};

#[derive(Args, Clone)]
pub struct ServerTlsArgs {
    /// Serve TLS with this certificate (PEM).
    #[arg(long, requires = "tls_key")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, requires = "tls_cert")]
    pub(crate) tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (mutual TLS).
    #[arg(long, requires = "tls_cert")]
    pub(crate) client_ca: Option<PathBuf>,
}

impl ServerTlsArgs {
    pub(crate) fn config(&self) -> Option<ServerTls> {
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
    pub(crate) tls_ca: Option<PathBuf>,
    /// Client certificate for mutual TLS (PEM).
    #[arg(long, requires = "tls_ca", requires = "tls_key")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// Client private key for mutual TLS (PEM).
    #[arg(long, requires = "tls_cert")]
    pub(crate) tls_key: Option<PathBuf>,
    /// Name to check the sink's certificate against (default: the host of --to).
    #[arg(long)]
    pub(crate) tls_domain: Option<String>,
}

impl ClientTlsArgs {
    pub(crate) fn config(&self) -> Option<ClientTls> {
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
    pub(crate) metrics_listen: Option<SocketAddr>,
    /// Also push the same metrics over OTLP/gRPC to this collector
    /// (e.g. http://otel-collector:4317).
    #[arg(long)]
    pub(crate) otlp_endpoint: Option<String>,
    /// How often to push over OTLP.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub(crate) otlp_every: Duration,
}

impl ExportArgs {
    pub(crate) fn wanted(&self) -> bool {
        self.metrics_listen.is_some() || self.otlp_endpoint.is_some()
    }

    pub(crate) fn otlp(
        &self,
        service: &str,
        source: Option<&str>,
    ) -> Option<observe::otlp::OtlpConfig> {
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
    pub(crate) root: PathBuf,
    /// Manifest directory (RocksDB); keep it on durable storage.
    #[arg(long)]
    pub(crate) state: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub(crate) listen: SocketAddr,
    #[command(flatten)]
    pub(crate) tls: ServerTlsArgs,
    /// Where files land: per-source (<root>/<source>/<path>) or flat (<root>/<path>).
    #[arg(long, value_enum, default_value = "per-source")]
    pub(crate) layout: choices::Layout,
    /// What happens to a generation a newer one replaces: mirror (remove it) or keep (as <path>.gen<N>).
    #[arg(long, value_enum, default_value = "mirror")]
    pub(crate) superseded: choices::Superseded,
    /// Largest gRPC message accepted (bytes); larger batches are refused.
    #[arg(long, default_value_t = 64 << 20)]
    pub(crate) max_message_bytes: usize,
    /// HTTP/2 flow-control window per stream and connection (bytes).
    #[arg(long, default_value_t = 64 << 20)]
    pub(crate) window_bytes: u32,
    /// Destination files kept open at once. Files whose journaled ranges
    /// wait for the background flush stay open until it; as many waiting
    /// start it early, and a cached file written directly holds a second
    /// descriptor, so at most about four times this many are open. Live-tail
    /// subscriptions keep up to this many more open between them, beyond
    /// 64 each.
    #[arg(long, default_value_t = 1024)]
    pub(crate) max_open_files: usize,
    /// Ranges up to this size may be made durable in the journal file (in
    /// the state directory) when their commit round flushes nothing else;
    /// their files are flushed in the background, about every 400 ms or
    /// 16 MiB, whichever comes first. One write
    /// and fdatasync of that file per round instead of a writeback of each
    /// grown file: lower latency for many small appends. 0 flushes every file
    /// in place before its ack.
    #[arg(long, default_value = "64KiB", value_parser = parse_size)]
    pub(crate) journal_max_range: u64,
    /// Writes each destination file in order, so that live readers never
    /// read a hole: ranges that arrive ahead of the bytes before them wait
    /// in memory, at most this many bytes for the whole sink (a batch that
    /// would hold more is refused and sent again). 0 writes every range as
    /// it arrives, as fast as that is, and readers may then read holes.
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    pub(crate) hold_limit: u64,
    /// Ranges whose block-aligned middle holds at least this many bytes
    /// write it with O_DIRECT, past the page cache: bulk data is not copied
    /// into page-cache memory first. auto: 512KiB on local disk filesystems
    /// (ext4, XFS, btrfs), never on others (network and parallel ones may
    /// make each direct write a synchronous round trip). Files whose
    /// filesystem refuses O_DIRECT are written through the page cache.
    /// 0 never writes directly.
    #[arg(long, default_value = "auto", value_parser = parse_size_or_auto)]
    pub(crate) direct_min: SizeOrAuto,
    /// How commit rounds make files durable: auto (one syncfs for rounds
    /// touching several files on a local filesystem, Linux 5.8+, while at
    /// most 64 MiB of the machine's memory is dirty; else per file), files
    /// (fdatasync each file, fsync each changed directory), filesystem
    /// (always syncfs; it also waits for other writers' dirty data there).
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) sync: choices::Sync,
    /// Read each file back from disk when it is sealed and compare its digest
    /// with the source's. Without it, a CRC-64 seal is compared with the
    /// checksum of the bytes as the sink wrote them (computed as each range
    /// is placed), and only files whose ranges this process did not all
    /// write (after a restart) are read back. Costs a second pass over every
    /// byte on the destination filesystem.
    #[arg(long)]
    pub(crate) seal_read_back: bool,
    /// Append "source key generation offset length durable_unix_nanos received_unix_nanos"
    /// per range a commit round made durable (latency benchmarks; `bench` feature).
    #[cfg(feature = "bench")]
    #[arg(long)]
    pub(crate) commit_log: Option<PathBuf>,
    /// Let the kernel back the sink's memory with transparent huge pages.
    /// Refused by default: a fault on one zeroes 2 MiB at once, and a burst
    /// of new files at the start held the first second's writes up to
    /// 300 ms. Allowed, a large transfer costs the sink about a tenth less
    /// CPU per byte (fewer page faults).
    #[arg(long)]
    pub(crate) transparent_huge_pages: bool,
    /// Batches placed at once, each on a thread of its own; more wait in
    /// memory (each stream holds at most 8). Every thread that has placed
    /// batches keeps an allocator heap: this bounds the threads, and with
    /// them the memory, when the disk falls behind. Default: four per core,
    /// at least 8 and at most 64.
    #[arg(long)]
    pub(crate) placement_threads: Option<usize>,
    /// Subscriber tokens, one a line: live-tail subscriptions and listings
    /// then need 'authorization: Bearer <token>' with one of them. Read
    /// again whenever the file changes (edit it to rotate tokens).
    #[arg(long)]
    pub(crate) subscriber_tokens: Option<PathBuf>,
    /// Under mutual TLS, let a client certificate the CA signed (a
    /// watcher's) subscribe and list too; otherwise it may only write.
    #[arg(long)]
    pub(crate) writers_may_read: bool,
    /// Append what the manifest holds at the start, then every commit
    /// round of the commit feed, as JSON lines (for tests and for watching
    /// commits land).
    #[arg(long)]
    pub(crate) feed_log: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) export: ExportArgs,
    #[command(flatten)]
    pub(crate) events: EventArgs,
    #[command(flatten)]
    pub(crate) fleet: identity::FleetArgs,
    /// With --identity: the URL watchers and consumers reach this process
    /// at (default: http(s)://<--listen>).
    #[arg(long, requires = "identity")]
    pub(crate) advertise: Option<String>,
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
    pub(crate) kafka_brokers: Option<String>,
    /// The topic events go to.
    #[arg(long, default_value = "tailflight.events")]
    pub(crate) kafka_topic: String,
    /// Any librdkafka property, KEY=VALUE (repeat): security.protocol,
    /// sasl.*, ssl.*, compression.type, ... An unknown one fails at startup.
    #[arg(long, value_parser = parse_key_value)]
    pub(crate) kafka_property: Vec<(String, String)>,
    /// Unpublished events kept at most (bytes); past it, the sink refuses
    /// new data (its senders retry) until the relay catches up.
    #[arg(long, default_value = "1GiB", value_parser = parse_outbox_limit)]
    pub(crate) kafka_outbox_limit: u64,
    /// The sink's name in its events; default: its manifest's random id.
    #[arg(long)]
    pub(crate) sink_id: Option<String>,
}

impl EventArgs {
    pub(crate) fn kafka(&self) -> Option<kafka_relay::KafkaSettings> {
        self.kafka_brokers
            .as_ref()
            .map(|brokers| kafka_relay::KafkaSettings {
                brokers: brokers.clone(),
                topic: self.kafka_topic.clone(),
                properties: self.kafka_property.clone(),
            })
    }
}

pub(crate) fn parse_key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, _)) if kafka_relay::RESERVED_PROPERTIES.contains(&key.trim()) => Err(format!(
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

pub(crate) fn parse_outbox_limit(text: &str) -> Result<u64, String> {
    match parse_size(text)? {
        0 => Err("the outbox needs room for at least one round's events".into()),
        limit => Ok(limit),
    }
}

#[derive(Args, Clone)]
pub struct WatchArgs {
    /// Directory tree to tail.
    #[arg(long)]
    pub(crate) dir: PathBuf,
    /// Stable name of this watcher; the sink places files under <root>/<source>/.
    #[arg(long)]
    pub(crate) source: String,
    /// Sink endpoint (http://HOST:PORT or https://HOST:PORT); repeat to
    /// shard files across sinks. With --coordinator instead, files are
    /// sharded over the cluster's sink identities, wherever they run.
    #[arg(long = "to", required_unless_present = "coordinator")]
    pub(crate) to: Vec<String>,
    /// Checkpoint directory (RocksDB). If lost, the watcher reconciles with the sinks.
    #[arg(long)]
    pub(crate) state: PathBuf,
    #[command(flatten)]
    pub(crate) tls: ClientTlsArgs,
    /// How changes are heard of: inotify (a watch per directory), fanotify
    /// (one mark on the tree's filesystem: no watch limit, needs
    /// CAP_SYS_ADMIN, falls back to inotify without it) or poll (NFS,
    /// Lustre, GPFS: remote writes raise no local event).
    #[arg(long, value_enum, default_value = "inotify")]
    pub(crate) events: choices::Events,
    /// The same as --events poll.
    #[arg(long)]
    pub(crate) poll: bool,
    /// Fastest poll interval for a growing file (adaptive polling backs off to --poll-max).
    #[arg(long, default_value = "5ms", value_parser = parse_duration)]
    pub(crate) poll_min: Duration,
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    pub(crate) poll_max: Duration,
    /// Full rescan interval (also recovers from inotify overflow).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub(crate) rescan: Duration,
    /// TCP connections per sink.
    #[arg(long, default_value_t = 4)]
    pub(crate) connections: usize,
    /// Bytes in flight (sent, not acknowledged) per connection.
    #[arg(long, default_value = "32MiB", value_parser = parse_size)]
    pub(crate) window: u64,
    /// Send a batch once it holds this many bytes...
    #[arg(long, default_value = "4MiB", value_parser = parse_size)]
    pub(crate) batch_bytes: u64,
    /// ...or once its first row waited this long.
    #[arg(long, default_value = "300us", value_parser = parse_duration)]
    pub(crate) linger: Duration,
    /// Largest single range in a batch.
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    pub(crate) max_row_bytes: u64,
    /// A closed file idle this long is sealed (renaming away from the in-progress suffix seals at once).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub(crate) seal_idle: Duration,
    /// Whole-file digest a seal carries and the sink verifies: crc64nvme (fast, catches
    /// damage and misplaced bytes) or blake3 (cryptographic, ~4x the CPU).
    #[arg(long, default_value = "crc64nvme")]
    pub(crate) seal_digest: flight_server::SealDigest,
    /// Suffix of files still being written.
    #[arg(long, default_value = ".inprogress")]
    pub(crate) inprogress_suffix: String,
    /// Largest gRPC message sent (bytes).
    #[arg(long, default_value_t = 64 << 20)]
    pub(crate) max_message_bytes: usize,
    /// Source files kept open at once (idle, fully read files are closed first).
    #[arg(long, default_value_t = 4096)]
    pub(crate) max_open_files: usize,
    #[command(flatten)]
    pub(crate) export: ExportArgs,
    #[command(flatten)]
    pub(crate) fleet: identity::FleetArgs,
    /// With --coordinator: how long to wait at startup for a sink identity
    /// to be registered before giving up.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub(crate) sinks_patience: Duration,
    /// Also export the lag of this many files furthest behind, labelled by
    /// path (0: per-source aggregates only, whatever the number of files).
    #[arg(long, default_value_t = 0)]
    pub(crate) metrics_top_files: usize,
    /// A file whose owed bytes were all seen this recently is caught up
    /// (they are the pipeline's own latency, not a lag).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub(crate) caught_up_within: Duration,
    /// A file owing bytes with no acknowledgement for this long is stalled.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub(crate) stall_after: Duration,
    /// A file owing nothing that has not grown for this long is idle
    /// (before that, caught up).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub(crate) idle_after: Duration,
}

#[derive(Args, Clone)]
pub struct SimArgs {
    /// Output directory.
    #[arg(long)]
    pub(crate) dir: PathBuf,
    /// Run name; files are <run>-sNN-cNNN.xtc2.
    #[arg(long, default_value = "r0001")]
    pub(crate) run: String,
    /// Files written in parallel.
    #[arg(long, default_value_t = 4)]
    pub(crate) streams: usize,
    /// Threads making the writes, the streams dealt out among them in turn
    /// (default: one per stream).
    #[arg(long)]
    pub(crate) writer_threads: Option<usize>,
    /// Writes per second per stream (0: as fast as possible).
    #[arg(long, default_value_t = 120.0)]
    pub(crate) rate: f64,
    /// Bytes per frame (or per event with --events-per-write).
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    pub(crate) frame: u64,
    /// Events gathered into one write.
    #[arg(long, default_value_t = 1)]
    pub(crate) events_per_write: usize,
    /// Rotate chunk files at this size.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    pub(crate) chunk: u64,
    /// Stop after this long...
    #[arg(long, value_parser = parse_duration)]
    pub(crate) duration: Option<Duration>,
    /// ...or after this many bytes in all.
    #[arg(long, value_parser = parse_size)]
    pub(crate) total: Option<u64>,
    /// A burst every this long...
    #[arg(long, value_parser = parse_duration)]
    pub(crate) burst_every: Option<Duration>,
    /// ...lasting this long...
    #[arg(long, value_parser = parse_duration)]
    pub(crate) burst_len: Option<Duration>,
    /// ...at this multiple of the rate.
    #[arg(long, default_value_t = 4.0)]
    pub(crate) burst_factor: f64,
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Log each write ("file offset len unix_nanos") to this file.
    #[arg(long)]
    pub(crate) write_log: Option<PathBuf>,
}

#[derive(Args, Clone)]
pub struct VerifyArgs {
    pub(crate) source: PathBuf,
    pub(crate) dest: PathBuf,
    /// Skip files ending with this suffix (repeatable).
    #[arg(long)]
    pub(crate) ignore: Vec<String>,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args, Clone)]
pub struct CertsArgs {
    /// Directory to write ca.pem, server.pem/.key and client.pem/.key into.
    #[arg(long)]
    pub(crate) out: PathBuf,
    /// Names the server certificate is valid for (default: localhost and 127.0.0.1).
    #[arg(long = "host")]
    pub(crate) hosts: Vec<String>,
}

#[derive(Args, Clone)]
pub struct StatusArgs {
    /// Sink endpoint.
    #[arg(long = "to", default_value = "http://127.0.0.1:50051")]
    pub(crate) to: String,
    #[command(flatten)]
    pub(crate) tls: ClientTlsArgs,
}

#[derive(Args, Clone)]
pub struct AuditArgs {
    /// The sink's manifest directory (the sink must not be running).
    #[arg(long)]
    pub(crate) state: PathBuf,
    /// Also print every file record (destination path, placed ranges, seal).
    #[arg(long)]
    pub(crate) files: bool,
}

pub(crate) fn sink_config(args: &SinkArgs) -> sink::SinkConfig {
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

pub(crate) fn watch_config(args: &WatchArgs) -> watcher::WatchConfig {
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

pub(crate) fn sim_config(args: &SimArgs) -> detector_sim::SimConfig {
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
