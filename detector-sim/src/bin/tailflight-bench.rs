//! `tailflight-bench`: the tools only the benchmark suite runs, kept out of
//! the production `tailflight` binary: the machine's latency floor (`floor
//! ship` / `floor land`) and the WAN emulation (`delay-line`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "tailflight-bench",
    about = "Benchmark-only tools of tailflight"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// TCP relay that delays each direction by half an RTT (WAN emulation).
    DelayLine {
        /// Address to accept connections on.
        #[arg(long)]
        listen: SocketAddr,
        /// Address to relay them to.
        #[arg(long)]
        to: SocketAddr,
        /// Round-trip time to add (each direction gets half).
        #[arg(long, value_parser = parse_duration)]
        rtt: Duration,
    },
    /// The bare latency floor: ship a directory's appends, land them durably.
    #[command(subcommand)]
    Floor(FloorCommand),
}

#[derive(Subcommand)]
enum FloorCommand {
    /// Tail the files of one directory (inotify) and send their appends to `land`.
    Ship {
        /// Directory whose files to tail (not its subdirectories).
        #[arg(long)]
        src: PathBuf,
        /// Address of `tailflight-bench floor land`.
        #[arg(long)]
        to: SocketAddr,
        /// Ship over one HTTP/2 stream, each range with its CRC32C (the
        /// lander must be given `--http2` too).
        #[arg(long, conflicts_with = "flight")]
        http2: bool,
        /// Ship as Arrow record batches in one Arrow Flight DoPut call,
        /// each range with its CRC32C (the lander must be given `--flight` too).
        #[arg(long)]
        flight: bool,
        /// Stop after this long.
        #[arg(long, value_parser = parse_duration, default_value = "10m")]
        limit: Duration,
    },
    /// Make what `ship` sends durable in a ring file, logging each range's commit time.
    Land {
        /// Address to accept the shipper on.
        #[arg(long)]
        listen: SocketAddr,
        /// The ring file (created, 64 MiB).
        #[arg(long)]
        ring: PathBuf,
        /// Where to log commits, in the format of the sink's --commit-log.
        #[arg(long)]
        commit_log: PathBuf,
        /// Also write each range into its own file in this folder, beside
        /// the ring's write and fdatasync (the floor of placement).
        #[arg(long)]
        place: Option<PathBuf>,
        /// Take one HTTP/2 stream, check each range's CRC32C and ack each
        /// round (the shipper must be given `--http2` too).
        #[arg(long, conflicts_with = "flight")]
        http2: bool,
        /// Take one Arrow Flight DoPut call of record batches, check each
        /// range's CRC32C and ack each round (the shipper must be given
        /// `--flight` too).
        #[arg(long)]
        flight: bool,
        /// Stop after this long.
        #[arg(long, value_parser = parse_duration, default_value = "10m")]
        limit: Duration,
    },
}

fn transport(http2: bool, flight: bool) -> detector_sim::floor::Transport {
    match (http2, flight) {
        (true, _) => detector_sim::floor::Transport::Http2,
        (_, true) => detector_sim::floor::Transport::Flight,
        _ => detector_sim::floor::Transport::Tcp,
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    units::parse_duration(s).map_err(|e| e.to_string())
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Floor(FloorCommand::Ship {
            src,
            to,
            http2,
            flight,
            limit,
        }) => {
            detector_sim::floor::ship(&src, to, transport(http2, flight), limit)?;
        }
        Command::Floor(FloorCommand::Land {
            listen,
            ring,
            commit_log,
            place,
            http2,
            flight,
            limit,
        }) => {
            let listener = std::net::TcpListener::bind(listen)
                .with_context(|| format!("cannot listen on {listen}"))?;
            detector_sim::floor::land(
                listener,
                &ring,
                detector_sim::floor::RING_BYTES,
                &commit_log,
                place.as_deref(),
                transport(http2, flight),
                limit,
            )?;
        }
        Command::DelayLine { listen, to, rtt } => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("cannot start the async runtime")?;
            runtime.block_on(async {
                let listener = tokio::net::TcpListener::bind(listen)
                    .await
                    .with_context(|| format!("cannot listen on {listen}"))?;
                tokio::select! {
                    result = detector_sim::delay_line::serve(listener, to, rtt / 2) => result,
                    _ = terminated() => Ok(()),
                }
            })?;
        }
    }
    Ok(())
}

/// Resolves on SIGINT or SIGTERM (the suite stops its tools with SIGTERM).
async fn terminated() {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
