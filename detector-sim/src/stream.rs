//! One stream's writer thread: paced frame writes into a sequence of chunk files.
//!
//! A chunk lives as "<name>.inprogress" while it grows and is renamed to "<name>" once it
//! holds `chunk_bytes` or the run ends, the way LCLS-II style DAQs hand files to movers.
//! Frames are written with plain sequential `write()` calls; a frame that does not fit
//! in the current chunk is split, its tail opening the next chunk.

use crate::SimConfig;
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

/// Writes frames for one stream until its byte quota, the end time or a stop.
pub(crate) fn run_stream(
    sh: &Shared<'_>,
    stream: usize,
    quota: Option<u64>,
) -> Result<StreamOutput> {
    let cfg = sh.cfg;
    let burst = match (cfg.burst_every, cfg.burst_len) {
        (Some(every), Some(len)) => Some(Burst {
            every,
            len,
            factor: cfg.burst_factor,
        }),
        _ => None,
    };
    let mut pacer = Pacer::new(sh.start, cfg.rate_hz, burst);
    let buf_len = match quota {
        Some(q) => (sh.write_size as u64).min(q) as usize,
        None => sh.write_size,
    };
    let mut buf = vec![0u8; buf_len];
    let mut chunks = Chunks {
        sh,
        stream,
        next_chunk: 0,
        open: None,
        done: Vec::new(),
    };
    let mut written = 0u64;

    loop {
        let len = match quota {
            Some(q) if written >= q => break,
            // The last write is cut short so the run's total comes out exact.
            Some(q) => (q - written).min(sh.write_size as u64) as usize,
            None => sh.write_size,
        };
        if pacer.wait(sh.end, || sh.stopping()) == Wait::Stop {
            break;
        }
        chunks.write_frame(&mut buf[..len])?;
        written += len as u64;
        pacer.advance();
    }
    chunks.finish_open()?;
    if pacer.dropped_schedule > 0 {
        tracing::warn!(
            stream,
            skipped = pacer.dropped_schedule,
            "stream skipped scheduled writes"
        );
    }
    Ok(StreamOutput {
        files: chunks.done,
        bytes: written,
    })
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
