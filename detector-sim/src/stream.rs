//! One stream's writer thread: paced frame writes into a sequence of chunk files.
//!
//! A chunk lives as "<name>.inprogress" while it grows and is renamed to "<name>" once it
//! holds `chunk_bytes` or the run ends, the way LCLS-II style DAQs hand files to movers.
//! Frames are written with plain sequential `write()` calls; a frame that does not fit
//! in the current chunk is split, its tail opening the next chunk.

use crate::config::SimConfig;
use crate::content::fill;
use crate::pacing::{Burst, Pacer, Wait};
use anyhow::{Context, Result, anyhow, bail};
use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

pub(crate) const INPROGRESS: &str = ".inprogress";

/// Final name of chunk `chunk` of stream `stream`.
pub(crate) fn chunk_name(run: &str, stream: usize, chunk: usize) -> String {
    format!("{run}-s{stream:02}-c{chunk:03}.xtc2")
}

/// What every stream thread of one run shares.
pub(crate) struct Shared<'a> {
    pub cfg: &'a SimConfig,
    pub write_size: usize,
    pub start: Instant,
    pub end: Option<Instant>,
    pub stop: &'a AtomicBool,
    /// Raised when a sibling stream failed, so the others wind down instead of
    /// running out the full duration.
    pub abort: &'a AtomicBool,
    pub log: Option<&'a WriteLog>,
}

impl Shared<'_> {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || self.abort.load(Ordering::Relaxed)
    }
}

pub(crate) struct StreamOutput {
    pub files: Vec<(String, u64)>,
    pub bytes: u64,
}

/// One stream between writes: its schedule, its open chunk and what it has written.
struct StreamWriter<'a> {
    sh: &'a Shared<'a>,
    quota: Option<u64>,
    pacer: Pacer,
    buf: Vec<u8>,
    chunks: Chunks<'a>,
    written: u64,
}

impl<'a> StreamWriter<'a> {
    fn new(sh: &'a Shared<'a>, stream: usize, quota: Option<u64>) -> Self {
        let cfg = sh.cfg;
        let burst = match (cfg.burst_every, cfg.burst_len) {
            (Some(every), Some(len)) => Some(Burst {
                every,
                len,
                factor: cfg.burst_factor,
            }),
            _ => None,
        };
        let buf_len = match quota {
            Some(q) => (sh.write_size as u64).min(q) as usize,
            None => sh.write_size,
        };
        StreamWriter {
            sh,
            quota,
            pacer: Pacer::new(sh.start, cfg.rate_hz, burst),
            buf: vec![0u8; buf_len],
            chunks: Chunks {
                sh,
                stream,
                next_chunk: 0,
                open: None,
                done: Vec::new(),
            },
            written: 0,
        }
    }

    /// Waits until this stream's next write is due and makes it. `Ok(false)` once the
    /// stream has reached its quota, the end time or a stop.
    fn step(&mut self) -> Result<bool> {
        let len = match self.quota {
            Some(q) if self.written >= q => return Ok(false),
            // The last write is cut short so the run's total comes out exact.
            Some(q) => (q - self.written).min(self.sh.write_size as u64) as usize,
            None => self.sh.write_size,
        };
        if self.pacer.wait(self.sh.end, || self.sh.stopping()) == Wait::Stop {
            return Ok(false);
        }
        self.chunks.write_frame(&mut self.buf[..len])?;
        self.written += len as u64;
        self.pacer.advance();
        Ok(true)
    }

    /// Renames the open chunk and reports what the stream wrote.
    fn finish(mut self) -> Result<StreamOutput> {
        self.chunks.finish_open()?;
        if self.pacer.dropped_schedule > 0 {
            tracing::warn!(
                stream = self.chunks.stream,
                skipped = self.pacer.dropped_schedule,
                "stream skipped scheduled writes"
            );
        }
        Ok(StreamOutput {
            files: self.chunks.done,
            bytes: self.written,
        })
    }
}

/// Writes frames for a group of streams on the calling thread until each reaches its
/// byte quota, the end time or a stop. The stream whose write is due first goes next;
/// streams due at the same moment (or written back to back) take turns.
pub(crate) fn run_streams(
    sh: &Shared<'_>,
    members: &[(usize, Option<u64>)],
) -> Result<Vec<StreamOutput>> {
    let mut active: Vec<StreamWriter<'_>> = members
        .iter()
        .map(|&(stream, quota)| StreamWriter::new(sh, stream, quota))
        .collect();
    let mut outputs = Vec::with_capacity(active.len());
    let mut turn = 0;
    while !active.is_empty() {
        let pick = next_due(&active, turn);
        let stream = active[pick].chunks.stream;
        let stepped = match active[pick].step() {
            Ok(true) => {
                turn = pick + 1;
                continue;
            }
            Ok(false) => active.remove(pick).finish(),
            Err(e) => {
                active.remove(pick);
                Err(e)
            }
        };
        match stepped {
            Ok(output) => outputs.push(output),
            Err(e) => {
                // The run is over: the other streams of this thread close and
                // rename their chunks, as the streams of other threads do.
                sh.abort.store(true, Ordering::Relaxed);
                for writer in active {
                    let other = writer.chunks.stream;
                    if let Err(e) = writer.finish() {
                        tracing::error!("stream {other} of run {}: {e:#}", sh.cfg.run);
                    }
                }
                return Err(e.context(format!("stream {stream} of run {}", sh.cfg.run)));
            }
        }
        turn = pick;
    }
    Ok(outputs)
}

/// Index of the stream due first, searching from `turn` so that ties rotate.
/// A stream without a schedule (back to back) is always due.
fn next_due(active: &[StreamWriter<'_>], turn: usize) -> usize {
    let n = active.len();
    let mut best = turn % n;
    for k in 1..n {
        let i = (turn + k) % n;
        if active[i].pacer.due() < active[best].pacer.due() {
            best = i;
        }
    }
    best
}

struct Chunk {
    name: String,
    tmp: PathBuf,
    file: File,
    len: u64,
}

struct Chunks<'a> {
    sh: &'a Shared<'a>,
    stream: usize,
    next_chunk: usize,
    open: Option<Chunk>,
    done: Vec<(String, u64)>,
}

impl Chunks<'_> {
    /// Writes one frame of `buf.len()` bytes, splitting it across chunk boundaries.
    fn write_frame(&mut self, buf: &mut [u8]) -> Result<()> {
        let chunk_bytes = self.sh.cfg.chunk_bytes;
        let mut pos = 0usize;
        while pos < buf.len() {
            let mut chunk = match self.open.take() {
                Some(c) => c,
                None => self.create()?,
            };
            let room = chunk_bytes - chunk.len;
            let n = ((buf.len() - pos) as u64).min(room) as usize;
            let piece = &mut buf[pos..pos + n];
            fill(self.sh.cfg.seed, &chunk.name, chunk.len, piece);
            chunk.file.write_all(piece).with_context(|| {
                format!(
                    "writing {n} bytes at offset {} of {}",
                    chunk.len,
                    chunk.tmp.display()
                )
            })?;
            if let Some(log) = self.sh.log {
                log.record(&chunk.name, chunk.len, n, unix_nanos())?;
            }
            chunk.len += n as u64;
            pos += n;
            if chunk.len >= chunk_bytes {
                self.finish(chunk)?;
            } else {
                self.open = Some(chunk);
            }
        }
        Ok(())
    }

    fn create(&mut self) -> Result<Chunk> {
        let dir = &self.sh.cfg.dir;
        let name = chunk_name(&self.sh.cfg.run, self.stream, self.next_chunk);
        let final_path = dir.join(&name);
        // A rename would silently replace a file a mover may already have shipped.
        if fs::symlink_metadata(&final_path).is_ok() {
            bail!(
                "{} already exists; use another run name or directory",
                final_path.display()
            );
        }
        let tmp = dir.join(format!("{name}{INPROGRESS}"));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .with_context(|| format!("creating {}", tmp.display()))?;
        self.next_chunk += 1;
        tracing::debug!(file = %tmp.display(), "chunk opened");
        Ok(Chunk {
            name,
            tmp,
            file,
            len: 0,
        })
    }

    fn finish(&mut self, chunk: Chunk) -> Result<()> {
        let Chunk {
            name,
            tmp,
            file,
            len,
        } = chunk;
        // Close before the rename so the final name never refers to a file still open
        // for writing.
        drop(file);
        let final_path = self.sh.cfg.dir.join(&name);
        fs::rename(&tmp, &final_path).with_context(|| {
            format!(
                "renaming {} to {} ({len} bytes)",
                tmp.display(),
                final_path.display()
            )
        })?;
        tracing::debug!(file = %final_path.display(), bytes = len, "chunk closed");
        self.done.push((name, len));
        Ok(())
    }

    fn finish_open(&mut self) -> Result<()> {
        match self.open.take() {
            Some(chunk) => self.finish(chunk),
            None => Ok(()),
        }
    }
}

/// The optional per-write log: "file offset len unix_nanos_after_write_returned".
pub(crate) struct WriteLog {
    path: PathBuf,
    out: Mutex<BufWriter<File>>,
}

impl WriteLog {
    pub fn open(path: &Path) -> Result<Self> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening write log {}", path.display()))?;
        Ok(WriteLog {
            path: path.to_path_buf(),
            out: Mutex::new(BufWriter::with_capacity(1 << 16, file)),
        })
    }

    fn record(&self, name: &str, offset: u64, len: usize, nanos: u64) -> Result<()> {
        let mut out = self.out.lock().map_err(|_| {
            anyhow!(
                "write log {} poisoned by a panicked stream",
                self.path.display()
            )
        })?;
        writeln!(out, "{name} {offset} {len} {nanos}")
            .with_context(|| format!("appending to write log {}", self.path.display()))
    }

    pub fn flush(&self) -> Result<()> {
        let mut out = self.out.lock().map_err(|_| {
            anyhow!(
                "write log {} poisoned by a panicked stream",
                self.path.display()
            )
        })?;
        out.flush()
            .with_context(|| format!("flushing write log {}", self.path.display()))
    }
}

fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}
