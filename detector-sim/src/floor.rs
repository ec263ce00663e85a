//! The latency floor, for benchmarks: the least that any tool which tails
//! growing files and makes their appends durable elsewhere has to do, done
//! with nothing else, so that tailflight's append → durable latency can be
//! set beside what this machine allows on the same workload.
//!
//! [`ship`] watches one directory with inotify and, for each read of events,
//! reads every named file from where it left off to its end and sends all
//! those ranges as one length-prefixed message on one TCP connection.
//! [`land`] takes every message that has arrived since its last round,
//! writes them with one write into a preallocated ring file (overwriting
//! blocks already written, as tailflight's journal does, so the fdatasync
//! is a data write and a cache flush), fdatasyncs it, and logs each range's
//! commit time in the format of the sink's `--commit-log`.
//!
//! What it leaves out, which is why it is a floor and not a peer: no copy of
//! a range into its own destination file, no manifest, no acknowledgement
//! or window, no checksum, no TLS, no recovery. It trusts its peer.
//!
//! [`land`] given a destination folder (`--place`) also does the one thing a
//! mover cannot leave out: each range is written into its own file there, at
//! its offset, by a thread of its own while the ring's write and fdatasync
//! run (the ring makes the bytes durable, as tailflight's journal does), and
//! a range counts as committed once both are done. The files written are
//! flushed in the background every [`FLUSH_PLACED_EVERY`] (the sink's
//! policy for its journaled files), and the ring comes round to a round's
//! bytes only once its files are flushed. That is the floor of what
//! tailflight's sink does after a batch arrives, without its manifest,
//! checksums and acknowledgements.
//!
//! Given [`Transport::Http2`], both ends carry the same messages over one
//! HTTP/2 stream instead (see `http2`), each range with its CRC32C, which
//! the shipper computes and the lander checks, and the lander acks each
//! round: the floor of a tool that ships over Arrow Flight's transport and
//! checks its bytes, still without Arrow, a manifest or a window. Given
//! [`Transport::Flight`], the ranges travel as Arrow record batches in one
//! Arrow Flight DoPut call (see `flight`), checked and acked the same way:
//! the floor of a tool on Arrow Flight's wire, still without a manifest or
//! a window.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use inotify::{EventMask, Inotify, WatchMask};

/// Size of the ring file the `land` subcommand writes into.
pub const RING_BYTES: u64 = 64 << 20;

/// Messages received and not yet written: the receiving thread waits (and
/// TCP pushes back on the shipper) beyond that.
const QUEUED_MESSAGES: usize = 64;

/// How often the placed files are flushed in the background: the sink's
/// interval for its journaled files. At P3's rate (40 MB/s) the ring
/// (64 MiB) comes round in about four of these.
pub const FLUSH_PLACED_EVERY: Duration = Duration::from_millis(400);

mod flight;
mod http2;
mod message;
mod outbound;

use message::{Arrived, Crcs, MAX_MESSAGE, MAX_READ_PER_FILE, MESSAGE_TARGET, parse, unix_nanos};
use outbound::Outbound;

/// How the floor's two ends talk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Length-prefixed messages on a bare TCP connection, nothing checked,
    /// nothing acknowledged.
    Tcp,
    /// The same messages in one HTTP/2 stream, a CRC32C per range checked
    /// on landing, and an ack per round back (see `http2`).
    Http2,
    /// The same ranges as Arrow record batches in one Arrow Flight DoPut
    /// call, each CRC32C checked on landing, a `PutResult` per round back
    /// (see `flight`).
    Flight,
}

/// Where the shipper's messages go.
enum Outlet {
    Tcp(TcpStream),
    Http2(Outbound<Bytes>),
    Flight(flight::Shipper),
}

impl Outlet {
    /// Sends `message` whole; leaves `message` empty, with room for the next.
    fn send(&mut self, message: &mut Vec<u8>, to: SocketAddr) -> Result<()> {
        match self {
            Outlet::Tcp(stream) => {
                stream
                    .write_all(message)
                    .with_context(|| format!("sending a message to {to}"))?;
                message.clear();
            }
            Outlet::Http2(shipper) => {
                // The body goes to HTTP/2 as it is; the next message gets a
                // buffer of its own.
                let next = Vec::with_capacity(message.capacity());
                shipper.send(Bytes::from(std::mem::replace(message, next)))?;
            }
            Outlet::Flight(shipper) => {
                // Past its length: the batch copies the ranges' bytes.
                shipper.send(&message[4..])?;
                message.clear();
            }
        }
        Ok(())
    }

    fn finish(self) -> Result<()> {
        match self {
            Outlet::Tcp(_) => Ok(()),
            Outlet::Http2(shipper) => shipper.finish(),
            Outlet::Flight(shipper) => shipper.finish(),
        }
    }
}

/// Tails every file in `src` (not its subdirectories) and sends what is
/// appended to `to`, until `limit` has passed.
pub fn ship(src: &Path, to: SocketAddr, transport: Transport, limit: Duration) -> Result<()> {
    let started = Instant::now();
    ship_while(src, to, transport, || started.elapsed() < limit)
}

/// [`ship`], for as long as `going` says so (asked at least every 200 ms).
pub fn ship_while(
    src: &Path,
    to: SocketAddr,
    transport: Transport,
    going: impl Fn() -> bool,
) -> Result<()> {
    let mut inotify = Inotify::init().context("initialising inotify")?;
    inotify
        .watches()
        .add(
            src,
            WatchMask::MODIFY | WatchMask::CREATE | WatchMask::MOVED_FROM | WatchMask::MOVED_TO,
        )
        .with_context(|| format!("watching {}", src.display()))?;
    let stream = connect(to, Duration::from_secs(10))?;
    stream.set_nodelay(true).context("setting TCP_NODELAY")?;
    let checked = transport != Transport::Tcp;
    let mut outlet = match transport {
        Transport::Tcp => Outlet::Tcp(stream),
        Transport::Http2 => Outlet::Http2(http2::shipper(stream, to)?),
        Transport::Flight => Outlet::Flight(flight::Shipper::connect(stream, to)?),
    };
    // Per file: its descriptor, where its unread bytes start, and the name
    // its ranges are sent under.
    let mut tails: HashMap<OsString, Tail> = HashMap::new();
    let mut moved_from: HashMap<u32, OsString> = HashMap::new();
    let mut events = vec![0u8; 64 << 10];
    // Files to read in the next pass: those with events, and those with
    // bytes left over from the last pass (read again without waiting).
    let mut names: Vec<OsString> = Vec::new();
    let mut message = Vec::with_capacity(1 << 20);
    while going() {
        let wait = match names.is_empty() {
            true => Duration::from_millis(200),
            false => Duration::ZERO,
        };
        if readable(&inotify, wait)? {
            let read = match inotify.read_events(&mut events) {
                Ok(read) => Some(read),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
                Err(e) => return Err(e).context("reading inotify events"),
            };
            let mut overflowed = false;
            for event in read.into_iter().flatten() {
                if event.mask.contains(EventMask::Q_OVERFLOW) {
                    overflowed = true;
                    continue;
                }
                let Some(name) = event.name else { continue };
                if event.mask.contains(EventMask::MOVED_FROM) {
                    moved_from.insert(event.cookie, name.to_owned());
                    continue;
                }
                if event.mask.contains(EventMask::MOVED_TO) {
                    // A renamed file keeps its tail (and the name it was
                    // first read under): its bytes are not sent again.
                    // Whatever was tailed at the new name is gone.
                    tails.remove(name);
                    if let Some(from) = moved_from.remove(&event.cookie)
                        && let Some(tail) = tails.remove(&from)
                    {
                        tails.insert(name.to_owned(), tail);
                    }
                } else if event.mask.contains(EventMask::CREATE) {
                    // A new file under a name already tailed.
                    tails.remove(name);
                }
                if !names.iter().any(|known| known == name) {
                    names.push(name.to_owned());
                }
            }
            // A move whose other half did not come in the same read left
            // the folder: its tail goes.
            for (_, gone) in moved_from.drain() {
                tails.remove(&gone);
            }
            if overflowed {
                // Events were lost: every file is read again to its end.
                for entry in
                    std::fs::read_dir(src).with_context(|| format!("listing {}", src.display()))?
                {
                    let name = entry.context("listing the source folder")?.file_name();
                    if !names.contains(&name) {
                        names.push(name);
                    }
                }
            }
        }
        message.clear();
        message.extend_from_slice(&[0u8; 4]);
        let mut ranges = 0u32;
        let mut left_over = Vec::new();
        for name in names.drain(..) {
            if message.len() >= MESSAGE_TARGET {
                left_over.push(name);
                continue;
            }
            if !tails.contains_key(&name) {
                match File::open(src.join(&name)) {
                    Ok(file) => {
                        let key = name.to_string_lossy().into_owned();
                        let tail = Tail {
                            file,
                            offset: 0,
                            key,
                        };
                        tails.insert(name.clone(), tail);
                    }
                    // Renamed or removed since the event: nothing to read.
                    Err(_) => continue,
                }
            }
            let Some(Tail { file, offset, key }) = tails.get_mut(&name) else {
                continue;
            };
            let len = file
                .metadata()
                .with_context(|| format!("reading the size of {key:?}"))?
                .len();
            let want = len.saturating_sub(*offset).min(MAX_READ_PER_FILE);
            if want == 0 {
                continue;
            }
            let name_bytes = key.as_bytes();
            let name_len = u16::try_from(name_bytes.len())
                .with_context(|| format!("file name {key:?} is too long"))?;
            message.extend_from_slice(&name_len.to_le_bytes());
            message.extend_from_slice(name_bytes);
            message.extend_from_slice(&offset.to_le_bytes());
            let len_at = message.len();
            message.extend_from_slice(&[0u8; 4]);
            if checked {
                message.extend_from_slice(&[0u8; 4]);
            }
            let data_at = message.len();
            message.resize(data_at + want as usize, 0);
            let got = file
                .read_at(&mut message[data_at..], *offset)
                .with_context(|| format!("reading {key:?} at offset {offset}"))?;
            message.truncate(data_at + got);
            // `got` is at most MAX_READ_PER_FILE.
            message[len_at..len_at + 4].copy_from_slice(&(got as u32).to_le_bytes());
            if checked {
                let crc = crc_fast::crc32_iscsi(&message[data_at..]);
                message[len_at + 4..data_at].copy_from_slice(&crc.to_le_bytes());
            }
            *offset += got as u64;
            ranges += 1;
            if *offset < len {
                left_over.push(name);
            }
        }
        names = left_over;
        if ranges == 0 {
            continue;
        }
        // At most MESSAGE_TARGET plus one file's read and its header.
        let body = u32::try_from(message.len() - 4).context("a message over 4 GiB")?;
        message[..4].copy_from_slice(&body.to_le_bytes());
        outlet
            .send(&mut message, to)
            .with_context(|| format!("sending {ranges} ranges"))?;
    }
    outlet.finish()
}

/// A file being tailed.
struct Tail {
    file: File,
    offset: u64,
    key: String,
}

/// Connects to `to`, trying again while nothing listens there yet (the
/// lander may still be starting), for at most `wait`.
fn connect(to: SocketAddr, wait: Duration) -> Result<TcpStream> {
    let started = Instant::now();
    loop {
        match TcpStream::connect(to) {
            Ok(stream) => return Ok(stream),
            Err(e)
                if e.kind() == std::io::ErrorKind::ConnectionRefused
                    && started.elapsed() < wait =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e).with_context(|| format!("connecting to {to}")),
        }
    }
}

/// Whether inotify has events to read, waiting at most `wait`.
fn readable(inotify: &Inotify, wait: Duration) -> Result<bool> {
    let mut poll = libc::pollfd {
        fd: inotify.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, alive for the call.
    let ready = unsafe { libc::poll(&mut poll, 1, wait.as_millis() as libc::c_int) };
    if ready < 0 {
        let error = std::io::Error::last_os_error();
        if error.kind() == std::io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(error).context("waiting for inotify events");
    }
    Ok(ready > 0)
}

/// Accepts one connection on `listener` and makes what it sends durable in
/// `ring`, logging each range's commit to `commit_log`, until the peer
/// closes or `limit` has passed. With `place`, each range is also written
/// into its own file in that folder (see the module's doc).
pub fn land(
    listener: TcpListener,
    ring: &Path,
    ring_bytes: u64,
    commit_log: &Path,
    place: Option<&Path>,
    transport: Transport,
    limit: Duration,
) -> Result<()> {
    ensure!(
        ring_bytes >= MAX_MESSAGE as u64,
        "a ring of {ring_bytes} bytes cannot take the largest message ({MAX_MESSAGE} bytes)"
    );
    let started = Instant::now();
    let mut ring = Ring::create(ring, ring_bytes)?;
    let mut log = BufWriter::new(
        File::create(commit_log)
            .with_context(|| format!("creating the commit log {}", commit_log.display()))?,
    );
    let (stream, peer) = listener.accept().context("accepting the shipper")?;
    let (arrivals, arrived) = mpsc::sync_channel::<Arrived>(QUEUED_MESSAGES);
    let (acks, to_ack) = tokio::sync::mpsc::unbounded_channel();
    let reader = std::thread::Builder::new()
        .name("floor-receive".into())
        .spawn(move || match transport {
            Transport::Tcp => receive(stream, arrivals),
            Transport::Http2 => http2::receive(stream, arrivals, to_ack),
            Transport::Flight => flight::receive(stream, arrivals, to_ack),
        })
        .context("starting the receiving thread")?;
    let placer = place.map(Placer::start).transpose()?;
    let landed = land_rounds(
        &mut ring,
        &arrived,
        &mut log,
        placer.as_ref(),
        &acks,
        || started.elapsed() < limit,
    );
    drop((arrived, acks));
    // A placer that stopped says why itself (a failed flush, say); the
    // rounds only saw that it stopped.
    if let Some(placer) = placer {
        placer.stop()?;
    }
    landed?;
    match reader.join() {
        Ok(result) => result.with_context(|| format!("receiving from {peer}")),
        Err(_) => bail!("the receiving thread panicked"),
    }
}

/// [`land`]'s rounds: every message arrived since the last round, into the
/// ring (and their files), then logged; for as long as `going` says so.
fn land_rounds(
    ring: &mut Ring,
    arrived: &mpsc::Receiver<Arrived>,
    log: &mut impl Write,
    placer: Option<&Placer>,
    acks: &tokio::sync::mpsc::UnboundedSender<u64>,
    going: impl Fn() -> bool,
) -> Result<()> {
    // A message that did not fit the last round starts the next.
    let mut next: Option<Arrived> = None;
    while going() {
        let first = match next.take() {
            Some(first) => first,
            None => match arrived.recv_timeout(Duration::from_millis(200)) {
                Ok(first) => first,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            },
        };
        let mut bytes = first.bytes.len() as u64;
        let mut round = vec![first];
        for arrival in arrived.try_iter() {
            if bytes + arrival.bytes.len() as u64 > ring.capacity {
                next = Some(arrival);
                break;
            }
            bytes += arrival.bytes.len() as u64;
            round.push(arrival);
        }
        let round = Arc::new(round);
        let end = ring.end_after(bytes);
        if let Some(placer) = placer {
            // The ring may come round only to bytes whose files are durable.
            placer.wait_for_flush(end.saturating_sub(ring.capacity))?;
            placer.place(round.clone(), end)?;
        }
        let pieces: Vec<&[u8]> = round.iter().map(|a| &a.bytes[..]).collect();
        ring.write_durably(&pieces)?;
        if let Some(placer) = placer {
            placer.placed()?;
        }
        let committed_ns = unix_nanos();
        for arrival in round.iter() {
            for range in &arrival.ranges {
                writeln!(
                    log,
                    "floor\t{}\t1\t{}\t{}\t{}\t{}",
                    range.name,
                    range.offset,
                    range.data.len(),
                    committed_ns,
                    arrival.received_ns
                )
                .context("writing the commit log")?;
            }
        }
        log.flush().context("writing the commit log")?;
        // Only HTTP/2 and Flight shippers read acks; nobody listening is no error.
        let _ = acks.send(round.len() as u64);
    }
    Ok(())
}

/// Longest a round waits for the placed files' flush to free ring space.
const FLUSH_WAIT_LIMIT: Duration = Duration::from_secs(60);

/// The thread that writes each range into its own file (and the one that
/// flushes those files), for a placing [`land`].
struct Placer {
    /// Each round, with where it ends in the ring (counting laps).
    rounds: mpsc::SyncSender<(Arc<Vec<Arrived>>, u64)>,
    placed: mpsc::Receiver<Result<()>>,
    /// Where in the ring (counting laps) the rounds end whose placed files
    /// are flushed.
    flushed: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<Result<()>>,
}

impl Placer {
    fn start(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the destination folder {}", dir.display()))?;
        let (rounds, to_place) = mpsc::sync_channel(1);
        let (done, placed) = mpsc::sync_channel(1);
        let flushed = Arc::new(AtomicU64::new(0));
        let dir = dir.to_owned();
        let flushed_by_thread = flushed.clone();
        let thread = std::thread::Builder::new()
            .name("floor-place".into())
            .spawn(move || place_rounds(&dir, to_place, done, flushed_by_thread))
            .context("starting the placing thread")?;
        Ok(Self {
            rounds,
            placed,
            flushed,
            thread,
        })
    }

    fn place(&self, round: Arc<Vec<Arrived>>, end: u64) -> Result<()> {
        if self.rounds.send((round, end)).is_err() {
            bail!("the placing thread stopped");
        }
        Ok(())
    }

    /// Waits until the round handed over last is in its files.
    fn placed(&self) -> Result<()> {
        self.placed
            .recv()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the placing thread stopped")))
    }

    /// Waits until the files of every round ending at or before `upto` (in
    /// the ring, counting laps) are flushed.
    fn wait_for_flush(&self, upto: u64) -> Result<()> {
        let waiting = Instant::now();
        while self.flushed.load(Ordering::Acquire) < upto {
            ensure!(!self.thread.is_finished(), "the placing thread stopped");
            ensure!(
                waiting.elapsed() < FLUSH_WAIT_LIMIT,
                "the placed files' flush has not freed the ring's space in {FLUSH_WAIT_LIMIT:?}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    fn stop(self) -> Result<()> {
        drop(self.rounds);
        match self.thread.join() {
            Ok(result) => result,
            Err(_) => bail!("the placing thread panicked"),
        }
    }
}

/// Files written and not flushed yet, and where in the ring the rounds
/// that wrote them end.
type ToFlush = (Vec<(String, Arc<File>)>, u64);

/// The placing thread: each round's ranges into their files, answered on
/// `done`; the files written since the last flush handed to a flushing
/// thread every [`FLUSH_PLACED_EVERY`], which moves `flushed` on once they
/// are durable. What is left is flushed when the rounds end.
fn place_rounds(
    dir: &Path,
    rounds: mpsc::Receiver<(Arc<Vec<Arrived>>, u64)>,
    done: mpsc::SyncSender<Result<()>>,
    flushed: Arc<AtomicU64>,
) -> Result<()> {
    // A rendezvous channel: a hand-over succeeds only while the flusher is
    // idle, so a flush still running leaves the files for the next one.
    let (to_flush, flushing) = mpsc::sync_channel::<ToFlush>(0);
    let flusher = std::thread::Builder::new()
        .name("floor-flush".into())
        .spawn(move || -> Result<()> {
            for (files, upto) in flushing {
                for (name, file) in files {
                    file.sync_data()
                        .with_context(|| format!("flushing the placed file {name}"))?;
                }
                flushed.fetch_max(upto, Ordering::AcqRel);
            }
            Ok(())
        })
        .context("starting the flushing thread")?;
    let mut files: HashMap<String, Arc<File>> = HashMap::new();
    let mut dirty: HashMap<String, Arc<File>> = HashMap::new();
    let mut placed_upto = 0;
    let mut last_flush = Instant::now();
    let mut flusher_gone = false;
    loop {
        match rounds.recv_timeout(FLUSH_PLACED_EVERY) {
            Ok((round, end)) => {
                let result = place_round(dir, &round, &mut files, &mut dirty);
                placed_upto = end;
                let failed = result.is_err();
                if done.send(result).is_err() || failed {
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                if !dirty.is_empty() {
                    flusher_gone = to_flush
                        .send((dirty.drain().collect(), placed_upto))
                        .is_err();
                }
                break;
            }
        }
        if last_flush.elapsed() >= FLUSH_PLACED_EVERY && !dirty.is_empty() {
            match to_flush.try_send((dirty.drain().collect(), placed_upto)) {
                Ok(()) => last_flush = Instant::now(),
                Err(mpsc::TrySendError::Full((files, _))) => dirty.extend(files),
                Err(mpsc::TrySendError::Disconnected(_)) => {
                    flusher_gone = true;
                    break;
                }
            }
        }
    }
    drop(to_flush);
    let flushed = match flusher.join() {
        Ok(result) => result,
        Err(_) => bail!("the flushing thread panicked"),
    };
    flushed?;
    ensure!(!flusher_gone, "the flushing thread stopped");
    Ok(())
}

/// Writes a round's ranges into their files, opened (and created) at the
/// first range of each.
fn place_round(
    dir: &Path,
    round: &[Arrived],
    files: &mut HashMap<String, Arc<File>>,
    dirty: &mut HashMap<String, Arc<File>>,
) -> Result<()> {
    for arrival in round {
        for range in &arrival.ranges {
            let file = match files.get(&range.name) {
                Some(file) => file,
                None => {
                    ensure!(
                        is_plain_name(&range.name),
                        "the shipper sent a range of {:?}, which is not a plain file name",
                        range.name
                    );
                    let path = dir.join(&range.name);
                    let file = OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(false)
                        .custom_flags(libc::O_NOFOLLOW)
                        .open(&path)
                        .with_context(|| format!("creating {}", path.display()))?;
                    files.entry(range.name.clone()).or_insert(Arc::new(file))
                }
            };
            file.write_all_at(&arrival.bytes[range.data.clone()], range.offset)
                .with_context(|| format!("writing {} at offset {}", range.name, range.offset))?;
            if !dirty.contains_key(&range.name) {
                dirty.insert(range.name.clone(), file.clone());
            }
        }
    }
    Ok(())
}

/// A name that stays in the destination folder: one component, not `.` or `..`.
fn is_plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

/// Reads messages from `stream` until it closes or `arrivals` is dropped.
fn receive(stream: TcpStream, arrivals: mpsc::SyncSender<Arrived>) -> Result<()> {
    stream.set_nodelay(true).context("setting TCP_NODELAY")?;
    let mut stream = BufReader::with_capacity(1 << 20, stream);
    loop {
        let mut len = [0u8; 4];
        match stream.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e).context("reading a message's length"),
        }
        let len = u32::from_le_bytes(len) as usize;
        ensure!(
            len <= MAX_MESSAGE,
            "a message of {len} bytes is over the limit of {MAX_MESSAGE}"
        );
        let mut bytes = vec![0u8; len];
        stream
            .read_exact(&mut bytes)
            .with_context(|| format!("reading a message of {len} bytes"))?;
        let received_ns = unix_nanos();
        let ranges = parse(&bytes, Crcs::Absent)?;
        let arrival = Arrived {
            bytes: Bytes::from(bytes),
            ranges,
            received_ns,
        };
        if arrivals.send(arrival).is_err() {
            return Ok(());
        }
    }
}

/// A preallocated file written round after round from its start again.
struct Ring {
    file: File,
    path: PathBuf,
    capacity: u64,
    head: u64,
    /// Where the current lap starts, counting every lap before it.
    lap: u64,
}

impl Ring {
    fn create(path: &Path, capacity: u64) -> Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .with_context(|| format!("creating the ring file {}", path.display()))?;
        // Zeros written, not fallocated: overwriting written blocks changes
        // no metadata, so each round's fdatasync has none to commit.
        let zeros = vec![0u8; 1 << 20];
        let mut at = 0;
        while at < capacity {
            file.write_all_at(&zeros, at)
                .with_context(|| format!("preallocating {}", path.display()))?;
            at += zeros.len() as u64;
        }
        file.sync_all()
            .with_context(|| format!("syncing {}", path.display()))?;
        Ok(Self {
            file,
            path: path.to_owned(),
            capacity,
            head: 0,
            lap: 0,
        })
    }

    /// Where a round of `len` bytes written next would end, counting laps
    /// (a round that does not fit before the end starts the next lap).
    fn end_after(&self, len: u64) -> u64 {
        match self.head + len > self.capacity {
            true => self.lap + self.capacity + len,
            false => self.lap + self.head + len,
        }
    }

    fn write_durably(&mut self, pieces: &[&[u8]]) -> Result<()> {
        let len: u64 = pieces.iter().map(|p| p.len() as u64).sum();
        ensure!(
            len <= self.capacity,
            "a round of {len} bytes does not fit the ring of {}",
            self.capacity
        );
        if self.head + len > self.capacity {
            self.head = 0;
            self.lap += self.capacity;
        }
        for piece in pieces {
            self.file
                .write_all_at(piece, self.head)
                .with_context(|| format!("writing {}", self.path.display()))?;
            self.head += piece.len() as u64;
        }
        self.file
            .sync_data()
            .with_context(|| format!("fdatasync of {}", self.path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where rounds end counts every lap: the placing floor's wait for its
    /// files' flush compares these with where the flushed rounds end.
    #[test]
    fn a_ring_counts_its_laps() {
        let dir = std::env::temp_dir().join(format!("tailflight-ring-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut ring = Ring::create(&dir.join("ring"), 100).unwrap();
        assert_eq!(ring.end_after(60), 60);
        ring.write_durably(&[&[1; 60]]).unwrap();
        assert_eq!(ring.end_after(30), 90);
        ring.write_durably(&[&[2; 10], &[3; 20]]).unwrap();
        // 20 bytes do not fit before the end: the next lap starts at 100.
        assert_eq!(ring.end_after(20), 120);
        ring.write_durably(&[&[4; 20]]).unwrap();
        assert_eq!(ring.end_after(80), 200);
        assert_eq!(ring.end_after(81), 281);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_plain_names_are_placed() {
        assert!(is_plain_name("a.dat"));
        for name in ["", ".", "..", "../a", "a/b", "/etc/passwd", "a\0b"] {
            assert!(!is_plain_name(name), "{name:?}");
        }
    }

    #[test]
    fn appends_arrive_durable_and_logged() {
        land_appends("plain", false, Transport::Tcp);
    }

    #[test]
    fn a_placing_floor_writes_each_file_whole() {
        land_appends("placing", true, Transport::Tcp);
    }

    #[test]
    fn over_http2_appends_arrive_checked_and_whole() {
        land_appends("http2", true, Transport::Http2);
    }

    #[test]
    fn over_arrow_flight_appends_arrive_checked_and_whole() {
        land_appends("flight", true, Transport::Flight);
    }

    #[test]
    fn a_range_whose_bytes_changed_on_the_way_is_refused() {
        let mut message = Vec::new();
        message.extend_from_slice(&1u16.to_le_bytes());
        message.extend_from_slice(b"a");
        message.extend_from_slice(&0u64.to_le_bytes());
        message.extend_from_slice(&3u32.to_le_bytes());
        message.extend_from_slice(&crc_fast::crc32_iscsi(b"abc").to_le_bytes());
        message.extend_from_slice(b"abc");
        assert_eq!(parse(&message, Crcs::Checked).unwrap()[0].data, 19..22);
        *message.last_mut().unwrap() = b'd';
        let refused = parse(&message, Crcs::Checked).unwrap_err().to_string();
        assert!(refused.contains("fails its CRC32C"), "{refused}");
    }

    fn land_appends(name: &str, placing: bool, transport: Transport) {
        let dir =
            std::env::temp_dir().join(format!("tailflight-floor-{name}-{}", std::process::id()));
        let src = dir.join("src");
        std::fs::create_dir_all(&src).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let ring = dir.join("ring");
        let log = dir.join("commit.log");
        let placed = dir.join("placed");
        let (ring_c, log_c, placed_c) = (ring.clone(), log.clone(), placed.clone());
        let ring_bytes = (MAX_MESSAGE as u64).next_multiple_of(1 << 20);
        let landing = std::thread::spawn(move || {
            land(
                listener,
                &ring_c,
                ring_bytes,
                &log_c,
                placing.then_some(placed_c.as_path()),
                transport,
                Duration::from_secs(60),
            )
        });
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (src_c, stop_c) = (src.clone(), stop.clone());
        let shipping = std::thread::spawn(move || {
            ship_while(&src_c, addr, transport, || {
                !stop_c.load(std::sync::atomic::Ordering::Relaxed)
            })
        });
        // The watch is in place once the shipper has connected; a write
        // before that is still read, from offset 0, at the next event.
        std::thread::sleep(Duration::from_millis(200));
        let mut file = File::create(src.join("a.dat")).unwrap();
        for i in 0..20u8 {
            file.write_all(&[i; 1000]).unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
        let logged = |log: &Path| -> Vec<(u64, u64)> {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            text.lines()
                .map(|line| {
                    let fields: Vec<&str> = line.split('\t').collect();
                    assert_eq!(fields.len(), 7, "{line}");
                    assert_eq!(fields[1], "a.dat");
                    (fields[3].parse().unwrap(), fields[4].parse().unwrap())
                })
                .collect()
        };
        for _ in 0..2000 {
            if logged(&log).iter().map(|(_, len)| len).sum::<u64>() >= 20_000 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        shipping.join().unwrap().unwrap();
        landing.join().unwrap().unwrap();
        let mut covered = 0u64;
        for (offset, len) in logged(&log) {
            assert_eq!(offset, covered, "ranges follow on, none twice");
            covered += len;
        }
        assert_eq!(covered, 20_000);
        if placing {
            let written = std::fs::read(placed.join("a.dat")).unwrap();
            assert_eq!(written, std::fs::read(src.join("a.dat")).unwrap());
        } else {
            assert!(!placed.exists());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
