//! The floor any mover pays: file bytes copied over TCP (or TLS 1.3) and made
//! durable on the other side, with no framing or protocol beyond a length
//! prefix. Benchmark scripts run the same files through this and through the
//! pipeline, and report the pipeline's CPU per GB as a ratio to this one's.
//!
//! Two processes:
//!
//! ```text
//! copy_floor receive --listen 127.0.0.1:PORT --dest DIR [--tls-dir DIR] [--ack-every BYTES] [--direct] [--connections N] [--http2 [--h2-max-frame BYTES]] [--checksums]
//! copy_floor send --to 127.0.0.1:PORT --connections N [--tls-dir DIR] [--window BYTES] [--chunk BYTES] [--http2] [--checksums] FILE...
//! ```
//!
//! Start `receive` first; it prints `listening on ADDR` to stderr once it
//! accepts connections (with `--tls-dir`, after writing `cert.pem` there).
//! Both print one JSON line to stdout when done:
//! `{"role":..,"bytes":..,"seconds":..,"user_s":..,"sys_s":..}`, the CPU
//! times being the whole process's, from `getrusage(RUSAGE_SELF)`.
//!
//! The wire, integers little-endian: the sender writes frames
//! `[u32 name_len][name][u64 offset][u32 len][payload]`; files go to the
//! connections round robin, each file's chunks in order. The receiver
//! `pwrite`s each payload at its offset into `DEST/name`. Once `ack_every`
//! payload bytes have arrived on a connection since its last ack, and at the
//! end of the stream, it `fdatasync`s every file it wrote since that ack and
//! sends one `u64`: the bytes durable so far on the connection; it reads on
//! meanwhile. The sender keeps at most its `window` bytes unacknowledged,
//! cutting a chunk short to fill the window exactly, so `ack_every` must not
//! exceed the sender's window (the defaults: 2 MiB and 8 MiB). After its
//! last frame the sender shuts
//! down its writing half and reads acks until the receiver closes.
//!
//! With `--http2` on both sides, the same frames travel in one HTTP/2
//! stream per connection (the request body; acks come back in the response
//! body), through the h2 crate as hyper and tonic use it, with the sink's
//! flow-control windows and, by default, its largest frame (1 MiB;
//! `--h2-max-frame` on the receiver sets another). The sender hands each frame to h2
//! as its own buffer (no copy); the receiver copies each payload once out
//! of h2's read buffer into aligned memory, as the sink must. That is the
//! least an HTTP/2 mover (Arrow Flight's transport) pays beyond the bare
//! copy: P1c reports it beside the bare floor.
//!
//! With `--checksums` on both sides, each frame's header also carries the
//! checks the pipeline makes on every byte (see `checks.rs`), and the
//! receiver verifies them: the floor of a copy with end-to-end integrity.
//!
//! With `--tls-dir`: TLS 1.3 with the one cipher suite
//! TLS13_AES_128_GCM_SHA256, through tokio-rustls (as tonic uses it). The
//! receiver makes a self-signed certificate for "localhost" at start; the
//! sender trusts exactly that certificate, read once its TCP connections are
//! up (so never one left by an earlier run).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::net::SocketAddr;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use clap::{Parser, Subcommand};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

mod checks;
#[path = "../floor/mod.rs"]
mod floor;
mod http2;
mod tls;

/// tailflight's allocator: a buffer per HTTP/2 frame costs what it costs
/// there, not the C library's trips to the kernel for large blocks.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const MIB: u64 = 1 << 20;

/// How frames travel: bare on the stream or inside HTTP/2 (on the
/// receiver, with the largest HTTP/2 frame it takes; the sender's value
/// is unused), with or without their checksums. Both ends must be given
/// the same: nothing in the stream says which.
#[derive(Clone, Copy)]
struct Wire {
    http2: Option<u32>,
    checksums: bool,
}
/// Longest file name a frame may carry.
const MAX_NAME: usize = 4096;
/// Largest payload a frame may carry (the receiver's buffer grows to it).
const MAX_PAYLOAD: usize = 256 << 20;

#[derive(Parser)]
#[command(about = "Bare file copy over TCP or TLS: the floor a mover's CPU is compared with")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Accept connections and write the files they carry into DEST.
    Receive {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long)]
        dest: PathBuf,
        /// Serve TLS 1.3; the self-signed certificate is written here.
        #[arg(long)]
        tls_dir: Option<PathBuf>,
        /// Payload bytes per connection between acks (each after an
        /// fdatasync); a quarter of the sender's window by default, so the
        /// sender keeps sending while the receiver flushes.
        #[arg(long, default_value_t = 2 * MIB)]
        ack_every: u64,
        /// Write the block-aligned middle of each payload with O_DIRECT,
        /// past the page cache (as the sink does on local filesystems).
        #[arg(long)]
        direct: bool,
        /// Connections to accept before exiting once they all end.
        #[arg(long, default_value_t = 1)]
        connections: usize,
        /// Take the frames from one HTTP/2 stream per connection.
        #[arg(long)]
        http2: bool,
        /// With --http2: the largest HTTP/2 frame the receiver takes
        /// (16 KiB to 16 MiB - 1; the sink's is 1 MiB).
        #[arg(long, default_value_t = 1 << 20)]
        h2_max_frame: u32,
        /// Verify each frame's checksums (the sender must send them).
        #[arg(long)]
        checksums: bool,
    },
    /// Send FILEs over N connections and wait until every byte is durable.
    Send {
        #[arg(long)]
        to: SocketAddr,
        #[arg(long, default_value_t = 1)]
        connections: usize,
        /// Connect over TLS 1.3, trusting the receiver's cert.pem in this dir.
        #[arg(long)]
        tls_dir: Option<PathBuf>,
        /// Most payload bytes unacknowledged per connection.
        #[arg(long, default_value_t = 8 * MIB)]
        window: u64,
        /// Most payload bytes per frame.
        #[arg(long, default_value_t = MIB as usize)]
        chunk: usize,
        /// Send the frames in one HTTP/2 stream per connection.
        #[arg(long)]
        http2: bool,
        /// Send each frame's checksums (the receiver must verify them).
        #[arg(long)]
        checksums: bool,
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

fn main() -> Result<()> {
    let args = Args::parse();
    let runtime = floor::runtime()?;
    let (role, bytes, seconds) = match args.command {
        Command::Receive {
            listen,
            dest,
            tls_dir,
            ack_every,
            direct,
            connections,
            http2,
            h2_max_frame,
            checksums,
        } => {
            ensure!(ack_every > 0, "--ack-every must be positive");
            ensure!(
                ((16 << 10)..(16 << 20)).contains(&h2_max_frame),
                "--h2-max-frame must be at least 16 KiB and below 16 MiB"
            );
            ensure!(connections > 0, "--connections must be positive");
            let (bytes, seconds) = runtime.block_on(receive(
                listen,
                dest,
                tls_dir.as_deref(),
                ack_every,
                direct,
                connections,
                Wire {
                    http2: http2.then_some(h2_max_frame),
                    checksums,
                },
            ))?;
            ("receive", bytes, seconds)
        }
        Command::Send {
            to,
            connections,
            tls_dir,
            window,
            chunk,
            http2,
            checksums,
            files,
        } => {
            ensure!(window > 0, "--window must be positive");
            ensure!(connections > 0, "--connections must be positive");
            ensure!(
                chunk > 0 && chunk <= MAX_PAYLOAD,
                "--chunk must be between 1 and {MAX_PAYLOAD}"
            );
            let (bytes, seconds) = runtime.block_on(send(
                to,
                connections,
                tls_dir.as_deref(),
                window,
                chunk,
                Wire {
                    http2: http2.then_some(0),
                    checksums,
                },
                &files,
            ))?;
            ("send", bytes, seconds)
        }
    };
    drop(runtime);
    floor::report(role, bytes, seconds)
}

// ---------------------------------------------------------------- receive

/// Files of DEST opened so far, shared by the connections: each is created
/// (and truncated) once per run.
struct Dest {
    dir: PathBuf,
    /// Write the aligned middle of each payload with O_DIRECT.
    direct: bool,
    files: Mutex<HashMap<String, Arc<DestFile>>>,
}

/// A destination file: written through the page cache, and with `--direct`
/// also through a second descriptor opened with O_DIRECT.
struct DestFile {
    cached: File,
    direct: Option<File>,
}

/// The block size O_DIRECT writes are aligned to.
const BLOCK: u64 = 4096;

impl DestFile {
    /// Writes `bytes` at `offset`: the blocks wholly inside it directly
    /// (their address in memory is as aligned as their offset in the file,
    /// see `receive_stream`), the partial blocks at its ends through the
    /// page cache.
    fn write_at(&self, bytes: &[u8], offset: u64) -> std::io::Result<()> {
        let end = offset + bytes.len() as u64;
        let (start_block, end_block) = (offset.div_ceil(BLOCK) * BLOCK, end / BLOCK * BLOCK);
        let Some(direct) = self.direct.as_ref().filter(|_| end_block > start_block) else {
            return self.cached.write_all_at(bytes, offset);
        };
        let at = |o: u64| (o - offset) as usize;
        self.cached
            .write_all_at(&bytes[..at(start_block)], offset)?;
        direct.write_all_at(&bytes[at(start_block)..at(end_block)], start_block)?;
        self.cached.write_all_at(&bytes[at(end_block)..], end_block)
    }
}

impl Dest {
    fn open(&self, name: &str) -> Result<Arc<DestFile>> {
        let mut files = self
            .files
            .lock()
            .map_err(|_| anyhow::anyhow!("the file cache's lock is poisoned"))?;
        if let Some(file) = files.get(name) {
            return Ok(file.clone());
        }
        let path = self.dir.join(name);
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        let direct = match self.direct {
            false => None,
            true => Some(
                OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(&path)
                    .with_context(|| format!("cannot open {} with O_DIRECT", path.display()))?,
            ),
        };
        let file = Arc::new(DestFile {
            cached: file,
            direct,
        });
        files.insert(name.to_owned(), file.clone());
        Ok(file)
    }
}

async fn receive(
    listen: SocketAddr,
    dest: PathBuf,
    tls_dir: Option<&Path>,
    ack_every: u64,
    direct: bool,
    connections: usize,
    wire: Wire,
) -> Result<(u64, f64)> {
    std::fs::create_dir_all(&dest).with_context(|| format!("cannot create {}", dest.display()))?;
    let acceptor = tls_dir.map(tls::acceptor).transpose()?;
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    eprintln!("listening on {listen}");
    let dest = Arc::new(Dest {
        dir: dest,
        direct,
        files: Mutex::new(HashMap::new()),
    });

    let mut start = None;
    let mut tasks = Vec::with_capacity(connections);
    for _ in 0..connections {
        let (tcp, peer) = listener
            .accept()
            .await
            .with_context(|| format!("accept on {listen}"))?;
        start.get_or_insert_with(Instant::now);
        tcp.set_nodelay(true)
            .with_context(|| format!("TCP_NODELAY for {peer}"))?;
        let dest = dest.clone();
        let acceptor = acceptor.clone();
        tasks.push(tokio::spawn(async move {
            match acceptor {
                None => receive_on(tcp, peer, &dest, ack_every, wire).await,
                Some(acceptor) => {
                    let tls = acceptor
                        .accept(tcp)
                        .await
                        .with_context(|| format!("TLS handshake with {peer}"))?;
                    receive_on(tls, peer, &dest, ack_every, wire).await
                }
            }
        }));
    }
    let mut bytes = 0;
    for task in tasks {
        bytes += task.await.context("a connection's task failed")??;
    }
    let seconds = start.map_or(0.0, |s| s.elapsed().as_secs_f64());
    Ok((bytes, seconds))
}

/// Reads exactly `buf.len()` bytes, or none at a clean end of stream:
/// returns whether it read them.
async fn read_exact_or_eof<S: AsyncRead + Unpin>(stream: &mut S, buf: &mut [u8]) -> Result<bool> {
    let mut filled = 0;
    while filled < buf.len() {
        let n = stream.read(&mut buf[filled..]).await?;
        if n == 0 {
            if filled == 0 {
                return Ok(false);
            }
            bail!("stream ended inside a {}-byte field", buf.len());
        }
        filled += n;
    }
    Ok(true)
}

/// Files to flush, and the bytes durable on the connection once they are.
type AckRequest = (Vec<(String, Arc<DestFile>)>, u64);

/// Flushes what each request names, then acknowledges its total, in order;
/// shuts the writing half down once the reader has sent its last request.
async fn acker<W: AsyncWrite + Unpin + Send>(
    mut out: W,
    peer: SocketAddr,
    mut requests: tokio::sync::mpsc::Receiver<AckRequest>,
) -> Result<()> {
    while let Some((files, total)) = requests.recv().await {
        tokio::task::spawn_blocking(move || -> Result<()> {
            for (name, file) in &files {
                file.cached
                    .sync_data()
                    .with_context(|| format!("fdatasync of {name} (from {peer})"))?;
            }
            Ok(())
        })
        .await
        .context("the fdatasync task failed")??;
        out.write_all(&total.to_le_bytes())
            .await
            .with_context(|| format!("ack {total} to {peer}"))?;
        out.flush()
            .await
            .with_context(|| format!("ack {total} to {peer}"))?;
    }
    out.shutdown()
        .await
        .with_context(|| format!("closing the connection from {peer}"))
}

/// One connection's frames, bare on the stream or inside HTTP/2, written
/// into `dest`; returns its payload bytes.
async fn receive_on<S>(
    stream: S,
    peer: SocketAddr,
    dest: &Dest,
    ack_every: u64,
    wire: Wire,
) -> Result<u64>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let checksums = wire.checksums;
    let Some(max_frame) = wire.http2 else {
        // Frames are read on while the files of the last ack are flushed.
        let (frames, out) = tokio::io::split(stream);
        return receive_frames(frames, out, peer, dest, ack_every, checksums).await;
    };
    let (frames, out, driver) = http2::accept(stream, peer, max_frame).await?;
    let total = receive_frames(frames, out, peer, dest, ack_every, checksums).await?;
    // Done once the sender, with every ack read, closes the connection.
    driver
        .await
        .context("the HTTP/2 connection's task failed")??;
    Ok(total)
}

/// The frames read from `frames`, written into `dest`, acks written to
/// `out`; returns the payload bytes.
async fn receive_frames<R, W>(
    mut stream: R,
    out: W,
    peer: SocketAddr,
    dest: &Dest,
    ack_every: u64,
    checksums: bool,
) -> Result<u64>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (requests, pending) = tokio::sync::mpsc::channel::<AckRequest>(2);
    let acks = tokio::spawn(acker(out, peer, pending));
    let fields = checks::header_bytes(checksums);
    let mut head = Vec::with_capacity(MAX_NAME + 12 + fields);
    let mut verifier = checks::Receiver::default();
    let mut payload: Vec<u8> = Vec::new();
    // This connection's own view of the cache, and the files it wrote
    // since its last ack.
    let mut files: HashMap<String, Arc<DestFile>> = HashMap::new();
    let mut dirty: Vec<(String, Arc<DestFile>)> = Vec::new();
    let mut total = 0u64;
    let mut since_ack = 0u64;
    loop {
        let mut name_len = [0u8; 4];
        let more = read_exact_or_eof(&mut stream, &mut name_len)
            .await
            .with_context(|| format!("frame header from {peer} after {total} bytes"))?;
        if !more {
            break;
        }
        let name_len = u32::from_le_bytes(name_len) as usize;
        ensure!(
            (1..=MAX_NAME).contains(&name_len),
            "{peer} sent a name of {name_len} bytes"
        );
        head.resize(name_len + 12 + fields, 0);
        stream
            .read_exact(&mut head)
            .await
            .with_context(|| format!("frame header from {peer} after {total} bytes"))?;
        let (name, rest) = head.split_at(name_len);
        let offset = u64::from_le_bytes(rest[..8].try_into()?);
        let len = u32::from_le_bytes(rest[8..12].try_into()?) as usize;
        let sent_checks: Option<&[u8; checks::FIELDS]> = match checksums {
            true => Some(rest[12..].try_into()?),
            false => None,
        };
        let name = std::str::from_utf8(name)
            .with_context(|| format!("{peer} sent a file name that is not UTF-8"))?;
        ensure!(
            name != "." && name != ".." && !name.contains(['/', '\0']),
            "{peer} sent the file name {name:?}, not a plain name"
        );
        ensure!(
            len <= MAX_PAYLOAD,
            "{peer} sent a frame of {len} bytes for {name}"
        );
        let file = match files.get(name) {
            Some(file) => file.clone(),
            None => {
                let file = dest.open(name)?;
                files.insert(name.to_owned(), file.clone());
                file
            }
        };
        // Placed so that its address is as aligned as its offset in the
        // file: O_DIRECT takes whole blocks from block-aligned memory.
        if payload.len() < len + 2 * BLOCK as usize {
            payload.resize(len + 2 * BLOCK as usize, 0);
        }
        let start = payload.as_ptr().align_offset(BLOCK as usize) + (offset % BLOCK) as usize;
        let payload = &mut payload[start..start + len];
        stream
            .read_exact(payload)
            .await
            .with_context(|| format!("{len} bytes of {name} at {offset} from {peer}"))?;
        let what = || format!("{len} bytes of {name} at {offset} from {peer}");
        if let Some(sent) = sent_checks {
            checks::Receiver::arrived(payload, sent, what())?;
        }
        file.write_at(payload, offset)
            .with_context(|| format!("pwrite of {len} bytes to {name} at {offset}"))?;
        if let Some(sent) = sent_checks {
            verifier.written(name, payload, sent, what())?;
        }
        if !dirty.iter().any(|(_, f)| Arc::ptr_eq(f, &file)) {
            dirty.push((name.to_owned(), file));
        }
        total += len as u64;
        since_ack += len as u64;
        if since_ack >= ack_every {
            // Gone only if the acker failed: its error is the one to tell.
            if requests
                .send((std::mem::take(&mut dirty), total))
                .await
                .is_err()
            {
                break;
            }
            since_ack = 0;
        }
    }
    // The final ack: everything this connection carried is durable.
    let _ = requests.send((dirty, total)).await;
    drop(requests);
    acks.await.context("the acker task failed")??;
    Ok(total)
}

// ------------------------------------------------------------------- send

struct Source {
    path: PathBuf,
    name: String,
    file: File,
    size: u64,
}

fn open_sources(paths: &[PathBuf]) -> Result<Vec<Source>> {
    let mut names = HashMap::new();
    paths
        .iter()
        .map(|path| {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .with_context(|| format!("{} has no UTF-8 file name", path.display()))?
                .to_owned();
            ensure!(name.len() <= MAX_NAME, "{name} is too long a name");
            if let Some(other) = names.insert(name.clone(), path) {
                bail!(
                    "{} and {} have the same name",
                    other.display(),
                    path.display()
                );
            }
            let file =
                File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
            let size = file
                .metadata()
                .with_context(|| format!("cannot stat {}", path.display()))?
                .len();
            Ok(Source {
                path: path.clone(),
                name,
                file,
                size,
            })
        })
        .collect()
}

/// Connects to `to`, retrying while the receiver is not listening yet.
async fn connect(to: SocketAddr) -> Result<TcpStream> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match TcpStream::connect(to).await {
            Ok(tcp) => {
                tcp.set_nodelay(true)
                    .with_context(|| format!("TCP_NODELAY to {to}"))?;
                return Ok(tcp);
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                if Instant::now() >= deadline {
                    return Err(e).with_context(|| format!("nothing listens on {to}"));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e).with_context(|| format!("cannot connect to {to}")),
        }
    }
}

async fn send(
    to: SocketAddr,
    connections: usize,
    tls_dir: Option<&Path>,
    window: u64,
    chunk: usize,
    wire: Wire,
    paths: &[PathBuf],
) -> Result<(u64, f64)> {
    let mut shares: Vec<Vec<Source>> = (0..connections).map(|_| Vec::new()).collect();
    for (i, source) in open_sources(paths)?.into_iter().enumerate() {
        shares[i % connections].push(source);
    }
    let mut tcps = Vec::with_capacity(connections);
    for _ in 0..connections {
        tcps.push(connect(to).await?);
    }
    // The receiver wrote its certificate before listening.
    let connector = tls_dir.map(tls::connector).transpose()?;
    let start = Instant::now();
    let (http2, checksums) = (wire.http2.is_some(), wire.checksums);
    let mut tasks = Vec::with_capacity(connections);
    for (i, (tcp, sources)) in tcps.into_iter().zip(shares).enumerate() {
        let connector = connector.clone();
        let peer = format!("connection {i} to {to}");
        tasks.push(tokio::spawn(async move {
            match (connector, http2) {
                (None, false) => send_stream(tcp, &peer, sources, window, chunk, checksums).await,
                (None, true) => http2::send(tcp, &peer, sources, window, chunk, checksums).await,
                (Some(connector), http2) => {
                    let server = ServerName::try_from("localhost")?;
                    let tls = connector
                        .connect(server, tcp)
                        .await
                        .with_context(|| format!("TLS handshake on {peer}"))?;
                    match http2 {
                        false => send_stream(tls, &peer, sources, window, chunk, checksums).await,
                        true => http2::send(tls, &peer, sources, window, chunk, checksums).await,
                    }
                }
            }
        }));
    }
    let mut bytes = 0;
    for task in tasks {
        bytes += task.await.context("a connection's task failed")??;
    }
    Ok((bytes, start.elapsed().as_secs_f64()))
}

/// Reads one ack; `None` once the receiver has closed the stream.
async fn read_ack<S: AsyncRead + Unpin>(
    stream: &mut S,
    peer: &str,
    acked: u64,
    sent: u64,
) -> Result<Option<u64>> {
    let mut ack = [0u8; 8];
    if !read_exact_or_eof(stream, &mut ack)
        .await
        .with_context(|| format!("ack on {peer}"))?
    {
        return Ok(None);
    }
    let ack = u64::from_le_bytes(ack);
    ensure!(
        (acked..=sent).contains(&ack),
        "{peer} acked {ack} bytes, after {acked} of {sent} sent"
    );
    Ok(Some(ack))
}

/// Sends `sources` over one connection; returns the payload bytes once the
/// receiver has acked them all.
async fn send_stream<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    peer: &str,
    sources: Vec<Source>,
    window: u64,
    chunk: usize,
    checksums: bool,
) -> Result<u64> {
    let fields = checks::header_bytes(checksums);
    let longest = sources.iter().map(|s| s.name.len()).max().unwrap_or(0);
    // Header and payload of a frame, contiguous, so one write sends both.
    let mut buf = vec![0u8; 4 + longest + 12 + fields + chunk];
    let mut sent = 0u64;
    let mut acked = 0u64;
    for source in &sources {
        let name = source.name.as_bytes();
        let head = 4 + name.len() + 12 + fields;
        let mut file_crc = 0u64;
        buf[..4].copy_from_slice(&(name.len() as u32).to_le_bytes());
        buf[4..4 + name.len()].copy_from_slice(name);
        let mut offset = 0u64;
        // One frame even for an empty file, so that it is created.
        loop {
            let remaining = source.size - offset;
            if remaining > 0 && sent - acked >= window {
                // Whatever TLS still buffers must leave before an ack can come.
                stream
                    .flush()
                    .await
                    .with_context(|| format!("flush on {peer}"))?;
                while sent - acked >= window {
                    acked = read_ack(&mut stream, peer, acked, sent)
                        .await?
                        .with_context(|| format!("{peer} closed with {sent} bytes sent"))?;
                }
            }
            let len = remaining.min(chunk as u64).min(window - (sent - acked)) as usize;
            let frame = &mut buf[..head + len];
            let lengths = head - fields;
            frame[lengths - 12..lengths - 4].copy_from_slice(&offset.to_le_bytes());
            frame[lengths - 4..lengths].copy_from_slice(&(len as u32).to_le_bytes());
            source
                .file
                .read_exact_at(&mut frame[head..], offset)
                .with_context(|| {
                    format!(
                        "pread of {len} bytes from {} at {offset}",
                        source.path.display()
                    )
                })?;
            if checksums {
                checks::fill(frame, head, &mut file_crc);
            }
            stream
                .write_all(frame)
                .await
                .with_context(|| format!("{len} bytes of {} at {offset} on {peer}", source.name))?;
            sent += len as u64;
            offset += len as u64;
            if offset >= source.size {
                break;
            }
        }
    }
    stream
        .shutdown()
        .await
        .with_context(|| format!("shutdown of {peer} after {sent} bytes"))?;
    read_last_acks(&mut stream, peer, acked, sent).await?;
    Ok(sent)
}

/// Reads acks until the receiver closes; an error unless the last one
/// covers all `sent` bytes.
async fn read_last_acks<S: AsyncRead + Unpin>(
    stream: &mut S,
    peer: &str,
    mut acked: u64,
    sent: u64,
) -> Result<()> {
    while let Some(ack) = read_ack(stream, peer, acked, sent).await? {
        acked = ack;
    }
    ensure!(
        acked == sent,
        "{peer} closed with {acked} of {sent} bytes acked"
    );
    Ok(())
}
