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

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail, ensure};
use inotify::{EventMask, Inotify, WatchMask};

/// Most bytes read from one file for one message: a file far behind is
/// caught up over several messages instead of one unbounded one.
const MAX_READ_PER_FILE: u64 = 4 << 20;

/// Largest message [`land`] accepts; [`ship`] stays well under it.
const MAX_MESSAGE: usize = 256 << 20;

/// Size of the ring file [`land`] writes into.
const RING_BYTES: u64 = 64 << 20;

/// Tails every file in `src` (not its subdirectories) and sends what is
/// appended to `to`, until `limit` has passed.
pub fn ship(src: &Path, to: SocketAddr, limit: Duration) -> Result<()> {
    let started = Instant::now();
    let mut inotify = Inotify::init().context("initialising inotify")?;
    inotify
        .watches()
        .add(
            src,
            WatchMask::MODIFY | WatchMask::CREATE | WatchMask::MOVED_FROM | WatchMask::MOVED_TO,
        )
        .with_context(|| format!("watching {}", src.display()))?;
    let mut stream = connect(to, Duration::from_secs(10))?;
    stream.set_nodelay(true).context("setting TCP_NODELAY")?;
    // Per file: its descriptor, where its unread bytes start, and the name
    // its ranges are sent under.
    let mut tails: HashMap<std::ffi::OsString, Tail> = HashMap::new();
    let mut moved_from: HashMap<u32, std::ffi::OsString> = HashMap::new();
    let mut events = vec![0u8; 64 << 10];
    let mut names: Vec<std::ffi::OsString> = Vec::new();
    let mut message = Vec::with_capacity(1 << 20);
    while started.elapsed() < limit {
        names.clear();
        if !readable(&inotify, Duration::from_millis(200))? {
            continue;
        }
        let read = match inotify.read_events(&mut events) {
            Ok(read) => read,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e).context("reading inotify events"),
        };
        for event in read {
            let Some(name) = event.name else { continue };
            // A renamed file keeps its tail (and the name it was first
            // read under): its bytes are not sent again.
            if event.mask.contains(EventMask::MOVED_FROM) {
                moved_from.insert(event.cookie, name.to_owned());
                continue;
            }
            if event.mask.contains(EventMask::MOVED_TO)
                && let Some(from) = moved_from.remove(&event.cookie)
                && let Some(tail) = tails.remove(&from)
            {
                tails.insert(name.to_owned(), tail);
            }
            if !names.iter().any(|known| known == name) {
                names.push(name.to_owned());
            }
        }
        message.clear();
        message.extend_from_slice(&[0u8; 4]);
        let mut ranges = 0u32;
        for name in &names {
            if !tails.contains_key(name) {
                let path = src.join(name);
                match File::open(&path) {
                    Ok(file) => {
                        let key = name.to_string_lossy().into_owned();
                        tails.insert(
                            name.clone(),
                            Tail {
                                file,
                                offset: 0,
                                key,
                            },
                        );
                    }
                    // Renamed or removed since the event: nothing to read.
                    Err(_) => continue,
                }
            }
            let Some(Tail { file, offset, key }) = tails.get_mut(name) else {
                continue;
            };
            let len = file
                .metadata()
                .with_context(|| format!("reading the size of {name:?}"))?
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
            let data_at = message.len();
            message.resize(data_at + want as usize, 0);
            let got = file
                .read_at(&mut message[data_at..], *offset)
                .with_context(|| format!("reading {name:?} at offset {offset}"))?;
            message.truncate(data_at + got);
            message[len_at..data_at].copy_from_slice(&(got as u32).to_le_bytes());
            *offset += got as u64;
            ranges += 1;
        }
        if ranges == 0 {
            continue;
        }
        let body = (message.len() - 4) as u32;
        message[..4].copy_from_slice(&body.to_le_bytes());
        stream
            .write_all(&message)
            .with_context(|| format!("sending {ranges} ranges to {to}"))?;
    }
    Ok(())
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

/// One range of a received message: where its bytes are in the message.
struct Range {
    name: String,
    offset: u64,
    data: std::ops::Range<usize>,
}

/// A message as received, with when it was.
struct Arrived {
    bytes: Vec<u8>,
    ranges: Vec<Range>,
    received_ns: u128,
}

/// Accepts one connection on `listener` and makes what it sends durable in
/// `ring`, logging each range's commit to `commit_log`, until the peer
/// closes or `limit` has passed.
pub fn land(listener: TcpListener, ring: &Path, commit_log: &Path, limit: Duration) -> Result<()> {
    let started = Instant::now();
    let ring = Ring::create(ring, RING_BYTES)?;
    let mut log = BufWriter::new(
        File::create(commit_log)
            .with_context(|| format!("creating the commit log {}", commit_log.display()))?,
    );
    let (stream, peer) = listener.accept().context("accepting the shipper")?;
    let (arrivals, arrived) = mpsc::channel::<Arrived>();
    let reader = std::thread::Builder::new()
        .name("floor-receive".into())
        .spawn(move || receive(stream, arrivals))
        .context("starting the receiving thread")?;
    let mut ring = ring;
    let mut round: Vec<Arrived> = Vec::new();
    while started.elapsed() < limit {
        match arrived.recv_timeout(Duration::from_millis(200)) {
            Ok(first) => round.push(first),
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        round.extend(arrived.try_iter());
        let pieces: Vec<&[u8]> = round.iter().map(|a| a.bytes.as_slice()).collect();
        ring.write_durably(&pieces)?;
        let committed_ns = unix_nanos();
        for arrival in round.drain(..) {
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
    }
    drop(arrived);
    match reader.join() {
        Ok(result) => result.with_context(|| format!("receiving from {peer}")),
        Err(_) => bail!("the receiving thread panicked"),
    }
}

/// Reads messages from `stream` until it closes or `arrivals` is dropped.
fn receive(stream: TcpStream, arrivals: mpsc::Sender<Arrived>) -> Result<()> {
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
        let ranges = parse(&bytes)?;
        let arrival = Arrived {
            bytes,
            ranges,
            received_ns,
        };
        if arrivals.send(arrival).is_err() {
            return Ok(());
        }
    }
}

/// The ranges of one message: name length (u16 LE), name, offset (u64 LE),
/// length (u32 LE), bytes; repeated.
fn parse(bytes: &[u8]) -> Result<Vec<Range>> {
    let mut ranges = Vec::new();
    let mut at = 0usize;
    let mut take = |n: usize| -> Result<std::ops::Range<usize>> {
        ensure!(
            bytes.len() - at >= n,
            "a message ends inside a range (at byte {at} of {})",
            bytes.len()
        );
        at += n;
        Ok(at - n..at)
    };
    let mut rest = bytes.len();
    while rest > 0 {
        let name_len = u16::from_le_bytes(bytes[take(2)?].try_into()?) as usize;
        let name = String::from_utf8_lossy(&bytes[take(name_len)?]).into_owned();
        let offset = u64::from_le_bytes(bytes[take(8)?].try_into()?);
        let len = u32::from_le_bytes(bytes[take(4)?].try_into()?) as usize;
        let data = take(len)?;
        rest = bytes.len() - data.end;
        ranges.push(Range { name, offset, data });
    }
    Ok(ranges)
}

/// A preallocated file written round after round from its start again.
struct Ring {
    file: File,
    path: PathBuf,
    capacity: u64,
    head: u64,
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
        })
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

fn unix_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_arrive_durable_and_logged() {
        let dir = std::env::temp_dir().join(format!("tailflight-floor-{}", std::process::id()));
        let src = dir.join("src");
        std::fs::create_dir_all(&src).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let ring = dir.join("ring");
        let log = dir.join("commit.log");
        let (ring_c, log_c) = (ring.clone(), log.clone());
        let landing =
            std::thread::spawn(move || land(listener, &ring_c, &log_c, Duration::from_secs(20)));
        let src_c = src.clone();
        let shipping = std::thread::spawn(move || ship(&src_c, addr, Duration::from_secs(2)));
        std::thread::sleep(Duration::from_millis(300));
        let mut file = File::create(src.join("a.dat")).unwrap();
        for _ in 0..20 {
            file.write_all(&[7u8; 1000]).unwrap();
            std::thread::sleep(Duration::from_millis(20));
        }
        // Keeps events coming until the shipper's limit passes.
        for _ in 0..200 {
            if shipping.is_finished() {
                break;
            }
            file.write_all(b"x").unwrap();
            std::thread::sleep(Duration::from_millis(20));
        }
        shipping.join().unwrap().unwrap();
        landing.join().unwrap().unwrap();
        let logged = std::fs::read_to_string(&log).unwrap();
        let mut covered = 0u64;
        for line in logged.lines() {
            let fields: Vec<&str> = line.split('\t').collect();
            assert_eq!(fields.len(), 7);
            assert_eq!(fields[1], "a.dat");
            assert_eq!(
                fields[3].parse::<u64>().unwrap(),
                covered,
                "ranges follow on"
            );
            covered += fields[4].parse::<u64>().unwrap();
        }
        assert!(covered >= 20_000);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
