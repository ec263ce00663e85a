//! The floor gRPC itself sets: a stream of bytes messages pushed over tonic
//! (HTTP/2, plaintext or TLS 1.3) from memory and discarded on arrival, with
//! no Arrow, no files and no acks beyond gRPC's own reply. Next to
//! `copy_floor` (bare TCP/TLS) and the pipeline, it splits the pipeline's CPU
//! per byte into what tonic and h2 cost and what tailflight adds.
//!
//! Two processes:
//!
//! ```text
//! tonic_floor serve --listen 127.0.0.1:PORT [--streams N] [--tls-dir DIR]
//! tonic_floor push --to http://127.0.0.1:PORT --streams N --total BYTES [--message BYTES] [--tls-dir DIR]
//! ```
//!
//! Start `serve` first; it prints `listening on ADDR` to stderr once it
//! accepts connections (with `--tls-dir`, after writing `cert.pem` there).
//! `push` opens N channels (each its own TCP connection, as the watcher's
//! pool does) and makes one client-streaming call `/floor.Floor/Push` on
//! each, sending total/N bytes (the remainder spread over the first calls)
//! as messages of `--message` bytes: clones of one preallocated `Bytes`, so
//! the pusher never copies payload itself; what copying remains is tonic's
//! (the prost encoder copies each message into its encode buffer) and the
//! socket's. The server counts each message's bytes and drops them, then
//! answers the call with the count, which the pusher checks. `serve` exits
//! after N calls have completed.
//!
//! Both print one JSON line to stdout when done:
//! `{"role":..,"bytes":..,"seconds":..,"user_s":..,"sys_s":..}`, the CPU
//! times being the whole process's, from `getrusage(RUSAGE_SELF)`. The
//! server's seconds run from the first call's start to the last call's end;
//! the pusher's from when its connections are up until every call answered.
//!
//! The HTTP/2 settings default to production's (the sink's server and the
//! watcher's endpoint): 8 MiB stream and 16 MiB connection windows on both
//! ends, 1 MiB frames towards the server, TCP_NODELAY, and a 64 MiB
//! message limit. With `--tls-dir` the server makes a self-signed
//! certificate for "localhost" and the pusher trusts exactly that one; both
//! ends use the provider of `flight_server::tls` (aws-lc-rs, AES-128-GCM
//! first), as production does.
//!
//! The message and the service are written by hand, the way tonic's
//! generated code does it:
//!
//! ```text
//! package floor;
//! message Chunk { bytes data = 1; }
//! message Total { uint64 bytes = 1; }
//! service Floor { rpc Push(stream Chunk) returns (Total); }
//! ```

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use clap::{Parser, Subcommand};
use tonic::transport::{
    Certificate, Channel, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig,
};

mod floor;

const MIB: u64 = 1 << 20;
const CERT_FILE: &str = "cert.pem";
const SERVICE: &str = "floor.Floor";
const PUSH_PATH: &str = "/floor.Floor/Push";

#[derive(Parser)]
#[command(about = "Bytes messages over a bare tonic stream: the floor of gRPC's cost per byte")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

/// HTTP/2 and gRPC settings, on both ends.
#[derive(clap::Args, Clone, Copy)]
struct Http2 {
    /// HTTP/2 initial window of each stream.
    #[arg(long, default_value_t = 8 * MIB as u32)]
    stream_window: u32,
    /// HTTP/2 initial window of each connection.
    #[arg(long, default_value_t = 16 * MIB as u32)]
    connection_window: u32,
    /// Largest gRPC message either end accepts.
    #[arg(long, default_value_t = 64 * MIB as usize)]
    max_message: usize,
}

#[derive(Subcommand)]
enum Command {
    /// Serve Push calls, counting and dropping their bytes, until N completed.
    Serve {
        #[arg(long)]
        listen: SocketAddr,
        /// Push calls to serve before exiting.
        #[arg(long, default_value_t = 1)]
        streams: usize,
        /// Serve TLS 1.3; the self-signed certificate is written here.
        #[arg(long)]
        tls_dir: Option<PathBuf>,
        /// Largest HTTP/2 frame the server accepts (SETTINGS_MAX_FRAME_SIZE).
        #[arg(long, default_value_t = 1 << 20)]
        max_frame: u32,
        #[command(flatten)]
        http2: Http2,
    },
    /// Push TOTAL bytes over N concurrent calls, each on its own connection.
    Push {
        /// The server's URL, http://HOST:PORT (https:// is implied by --tls-dir).
        #[arg(long)]
        to: String,
        #[arg(long, default_value_t = 1)]
        streams: usize,
        /// Bytes to push in all.
        #[arg(long)]
        total: u64,
        /// Bytes per message.
        #[arg(long, default_value_t = MIB as usize)]
        message: usize,
        /// Connect over TLS, trusting the server's cert.pem in this dir.
        #[arg(long)]
        tls_dir: Option<PathBuf>,
        #[command(flatten)]
        http2: Http2,
    },
}

fn main() -> Result<()> {
    let args = Args::parse();
    let runtime = floor::runtime()?;
    let (role, bytes, seconds) = match args.command {
        Command::Serve {
            listen,
            streams,
            tls_dir,
            max_frame,
            http2,
        } => {
            ensure!(streams > 0, "--streams must be positive");
            let (bytes, seconds) =
                runtime.block_on(serve(listen, streams, tls_dir.as_deref(), max_frame, http2))?;
            ("serve", bytes, seconds)
        }
        Command::Push {
            to,
            streams,
            total,
            message,
            tls_dir,
            http2,
        } => {
            ensure!(streams > 0, "--streams must be positive");
            ensure!(
                message > 0 && message + 16 <= http2.max_message,
                "--message must be positive and below --max-message ({})",
                http2.max_message
            );
            let (bytes, seconds) = runtime.block_on(push(
                &to,
                streams,
                total,
                message,
                tls_dir.as_deref(),
                http2,
            ))?;
            ("push", bytes, seconds)
        }
    };
    // Calls' tasks and connections end before the CPU is read.
    runtime.shutdown_timeout(Duration::from_secs(1));
    floor::report(role, bytes, seconds)
}

// ------------------------------------------------------------- messages

/// One message of a Push call: payload only.
#[derive(Clone, PartialEq, prost::Message)]
struct Chunk {
    #[prost(bytes = "bytes", tag = "1")]
    data: Bytes,
}

/// The reply to a Push call: the payload bytes the server received.
#[derive(Clone, PartialEq, prost::Message)]
struct Total {
    #[prost(uint64, tag = "1")]
    bytes: u64,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'static>>;

// ---------------------------------------------------------------- serve

/// What the calls have done so far.
#[derive(Default)]
struct Tally {
    first_start: Option<Instant>,
    last_end: Option<Instant>,
    bytes: u64,
    /// Calls ended, well or not.
    completed: usize,
    /// The first call that failed, and why.
    failure: Option<tonic::Status>,
}

struct State {
    tally: Mutex<Tally>,
    /// Set once `streams` calls have completed.
    done: tokio::sync::watch::Sender<bool>,
    streams: usize,
    max_message: usize,
}

impl State {
    fn tally(&self) -> std::sync::MutexGuard<'_, Tally> {
        // A poisoned tally is only a panicked call's: its numbers stand.
        self.tally
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The Floor service, as tonic's generated `FloorServer` would be.
#[derive(Clone)]
struct FloorServer {
    state: Arc<State>,
}

impl tonic::server::NamedService for FloorServer {
    const NAME: &'static str = SERVICE;
}

/// The Push method: counts each message's bytes and drops them.
struct PushSvc(Arc<State>);

impl tonic::server::ClientStreamingService<Chunk> for PushSvc {
    type Response = Total;
    type Future = BoxFuture<tonic::Response<Total>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<tonic::Streaming<Chunk>>) -> Self::Future {
        let state = self.0.clone();
        Box::pin(async move {
            state.tally().first_start.get_or_insert_with(Instant::now);
            let mut stream = request.into_inner();
            let mut bytes = 0u64;
            let ended = loop {
                match stream.message().await {
                    Ok(Some(chunk)) => bytes += chunk.data.len() as u64,
                    Ok(None) => break Ok(()),
                    Err(status) => break Err(status),
                }
            };
            // A failed call counts too, so that the server ends and says so.
            let completed = {
                let mut tally = state.tally();
                tally.last_end = Some(Instant::now());
                tally.bytes += bytes;
                tally.completed += 1;
                if let Err(status) = &ended {
                    tally.failure.get_or_insert_with(|| status.clone());
                }
                tally.completed
            };
            if completed >= state.streams {
                state.done.send_replace(true);
            }
            ended?;
            Ok(tonic::Response::new(Total { bytes }))
        })
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for FloorServer {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        match request.uri().path() {
            PUSH_PATH => {
                let state = self.state.clone();
                Box::pin(async move {
                    let max_message = state.max_message;
                    let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default())
                        .max_decoding_message_size(max_message)
                        .max_encoding_message_size(max_message);
                    Ok(grpc.client_streaming(PushSvc(state), request).await)
                })
            }
            _ => Box::pin(async move {
                let mut response = http::Response::new(tonic::body::Body::default());
                let headers = response.headers_mut();
                headers.insert(
                    tonic::Status::GRPC_STATUS,
                    (tonic::Code::Unimplemented as i32).into(),
                );
                headers.insert(
                    http::header::CONTENT_TYPE,
                    tonic::metadata::GRPC_CONTENT_TYPE,
                );
                Ok(response)
            }),
        }
    }
}

/// Makes the self-signed certificate for "localhost", writes `cert.pem`
/// into `dir` (whole, by a rename) and returns the server's TLS settings.
fn server_tls(dir: &Path) -> Result<ServerTlsConfig> {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])
        .context("cannot make a self-signed certificate")?;
    let cert_pem = certified.cert.pem();
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let temp = dir.join(format!("{CERT_FILE}.{}.tmp", std::process::id()));
    std::fs::write(&temp, &cert_pem).with_context(|| format!("cannot write {}", temp.display()))?;
    let path = dir.join(CERT_FILE);
    std::fs::rename(&temp, &path)
        .with_context(|| format!("cannot rename {} to {}", temp.display(), path.display()))?;
    let identity = Identity::from_pem(cert_pem, certified.signing_key.serialize_pem());
    Ok(ServerTlsConfig::new().identity(identity))
}

async fn serve(
    listen: SocketAddr,
    streams: usize,
    tls_dir: Option<&Path>,
    max_frame: u32,
    http2: Http2,
) -> Result<(u64, f64)> {
    flight_server::tls::install_crypto_provider();
    let mut builder = Server::builder()
        .tcp_nodelay(true)
        .initial_stream_window_size(http2.stream_window)
        .initial_connection_window_size(http2.connection_window)
        .max_frame_size(max_frame);
    if let Some(dir) = tls_dir {
        builder = builder
            .tls_config(server_tls(dir)?)
            .context("tonic refused the TLS settings")?;
    }
    let (done, mut done_rx) = tokio::sync::watch::channel(false);
    let state = Arc::new(State {
        tally: Mutex::new(Tally::default()),
        done,
        streams,
        max_message: http2.max_message,
    });
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    eprintln!("listening on {listen}");
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let shutdown = {
        let mut done = state.done.subscribe();
        async move {
            let _ = done.wait_for(|done| *done).await;
        }
    };
    let mut served = tokio::spawn(
        builder
            .add_service(FloorServer {
                state: state.clone(),
            })
            .serve_with_incoming_shutdown(incoming, shutdown),
    );
    tokio::select! {
        joined = &mut served => joined.context("the server task failed")?.context("the server failed")?,
        _ = done_rx.wait_for(|done| *done) => {
            // The graceful shutdown lets the last replies go out; a peer
            // that keeps its connection open past that is not waited for.
            match tokio::time::timeout(Duration::from_secs(5), &mut served).await {
                Ok(joined) => joined.context("the server task failed")?.context("the server failed")?,
                Err(_) => served.abort(),
            }
        }
    }
    let tally = state.tally();
    if let Some(status) = &tally.failure {
        bail!(
            "a Push call failed after {} bytes in all: {status}",
            tally.bytes
        );
    }
    ensure!(
        tally.completed >= streams,
        "the server stopped after {} of {streams} calls",
        tally.completed
    );
    let seconds = match (tally.first_start, tally.last_end) {
        (Some(start), Some(end)) => end.duration_since(start).as_secs_f64(),
        _ => 0.0,
    };
    Ok((tally.bytes, seconds))
}

// ----------------------------------------------------------------- push

/// The client's settings for `to`, with TLS trusting only `dir/cert.pem`.
fn endpoint(to: &str, tls_dir: Option<&Path>, http2: Http2) -> Result<Endpoint> {
    let url = match (tls_dir, to.strip_prefix("http://")) {
        (Some(_), Some(rest)) => format!("https://{rest}"),
        _ => to.to_owned(),
    };
    let mut endpoint = Endpoint::from_shared(url.clone())
        .with_context(|| format!("{url} is not a valid endpoint URL"))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .initial_stream_window_size(http2.stream_window)
        .initial_connection_window_size(http2.connection_window);
    if let Some(dir) = tls_dir {
        let path = dir.join(CERT_FILE);
        let pem =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(pem))
            .domain_name("localhost");
        endpoint = endpoint
            .tls_config(tls)
            .context("tonic refused the TLS settings")?;
    } else if url.starts_with("https://") {
        bail!("an https:// URL needs --tls-dir");
    }
    Ok(endpoint)
}

/// Connects a channel of its own, retrying while the server is not up yet
/// (with TLS, it writes its certificate before it listens).
async fn connect(to: &str, tls_dir: Option<&Path>, http2: Http2) -> Result<Channel> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let error = match endpoint(to, tls_dir, http2) {
            Ok(endpoint) => match endpoint.connect().await {
                Ok(channel) => return Ok(channel),
                Err(e) => anyhow::Error::new(e).context(format!("cannot connect to {to}")),
            },
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            return Err(error);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One Push call sending `bytes` as clones of `payload` (the last cut
/// short); returns the bytes the server says it received.
async fn push_call(
    channel: Channel,
    payload: Bytes,
    bytes: u64,
    max_message: usize,
) -> Result<u64> {
    let size = payload.len() as u64;
    let messages = bytes.div_ceil(size);
    let chunks = futures::stream::iter((0..messages).map(move |i| {
        let left = bytes - i * size;
        let data = if left >= size {
            payload.clone()
        } else {
            payload.slice(..left as usize)
        };
        Chunk { data }
    }));
    let mut grpc = tonic::client::Grpc::new(channel)
        .max_decoding_message_size(max_message)
        .max_encoding_message_size(max_message);
    grpc.ready().await.context("the channel is not ready")?;
    let codec = tonic_prost::ProstCodec::<Chunk, Total>::default();
    let path = http::uri::PathAndQuery::from_static(PUSH_PATH);
    let reply = grpc
        .client_streaming(tonic::Request::new(chunks), path, codec)
        .await
        .context("the Push call failed")?;
    Ok(reply.into_inner().bytes)
}

async fn push(
    to: &str,
    streams: usize,
    total: u64,
    message: usize,
    tls_dir: Option<&Path>,
    http2: Http2,
) -> Result<(u64, f64)> {
    flight_server::tls::install_crypto_provider();
    let payload = Bytes::from(
        (0..message)
            .map(|i| (i as u8).wrapping_mul(31))
            .collect::<Vec<u8>>(),
    );
    let mut channels = Vec::with_capacity(streams);
    for _ in 0..streams {
        channels.push(connect(to, tls_dir, http2).await?);
    }
    let start = Instant::now();
    let share = total / streams as u64;
    let extra = total % streams as u64;
    let mut calls = Vec::with_capacity(streams);
    for (i, channel) in channels.into_iter().enumerate() {
        let bytes = share + u64::from((i as u64) < extra);
        let payload = payload.clone();
        let max_message = http2.max_message;
        calls.push(tokio::spawn(async move {
            let received = push_call(channel, payload, bytes, max_message)
                .await
                .with_context(|| format!("call {i}"))?;
            ensure!(
                received == bytes,
                "call {i} sent {bytes} bytes, the server received {received}"
            );
            Ok(bytes)
        }));
    }
    let mut bytes = 0;
    for call in calls {
        bytes += call.await.context("a call's task failed")??;
    }
    Ok((bytes, start.elapsed().as_secs_f64()))
}
