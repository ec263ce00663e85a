//! The send's reader thread: reads each file from where the sink's copy
//! ends, into batches (pread straight into the batch), digests every byte
//! from the start for the seal, follows a file still growing until it has
//! settled, and tells the driver what it read and what it decided.
//!
//! It owns the open files and the digests; the driver owns what the sink
//! acknowledged. They talk only through the channel of [`ReaderEvent`]s,
//! which is bounded: the reader waits while the network is behind.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use flight_server::{BatchBuilder, EncodedBatch, FileHasher, SealDigest};
use tokio::sync::mpsc;

/// One file to read.
pub(super) struct ReadJob {
    pub file: usize,
    pub local: PathBuf,
    pub key: String,
    pub generation: u64,
    /// The sink holds every byte below this: read it for the digest only.
    pub resume_from: u64,
}

/// One row of a batch, in row order.
#[derive(Clone, Copy, Debug)]
pub(super) struct BatchRow {
    pub file: usize,
    /// The generation the bytes were sent as: a file sent again as a new
    /// generation must not count the old one's acknowledgements.
    pub generation: u64,
    pub bytes: u64,
}

pub(super) enum ReaderEvent {
    Batch {
        batch: EncodedBatch,
        rows: Vec<BatchRow>,
    },
    /// The file has not changed for the settle time: complete at `size`.
    Settled {
        file: usize,
        generation: u64,
        size: u64,
        digest: String,
    },
    /// Sent up to `size` and left as it is (it was still growing, and
    /// following was not asked for).
    LeftGrowing {
        file: usize,
        generation: u64,
        size: u64,
    },
    Failed {
        file: usize,
        generation: u64,
        reason: String,
    },
}

pub(super) struct ReaderConfig {
    pub follow: bool,
    pub settle: Duration,
    pub batch_bytes: usize,
    pub max_row_bytes: usize,
    pub digest: SealDigest,
    /// Bytes per second on the wire, at most (`None`: as fast as it goes).
    pub limit_rate: Option<u64>,
}

/// A file being read.
struct Reading {
    job: ReadJob,
    file: File,
    offset: u64,
    hasher: FileHasher,
    /// With following off, where reading stops for a file still growing.
    cap: Option<u64>,
    /// Size, modification and change time when last looked at, and when
    /// they last changed (by this clock: a file's own times may lie ahead).
    seen: Option<Seen>,
    changed_at: Instant,
    /// It changed while it was being read: its bytes may have been
    /// rewritten where they were already read, so its seal's digest is
    /// read again from the file.
    changed_while_read: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seen {
    size: u64,
    mtime_ns: i64,
    ctime_ns: i64,
}

impl Seen {
    fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            size: meta.size(),
            mtime_ns: meta
                .mtime()
                .saturating_mul(1_000_000_000)
                .saturating_add(meta.mtime_nsec()),
            ctime_ns: meta
                .ctime()
                .saturating_mul(1_000_000_000)
                .saturating_add(meta.ctime_nsec()),
        }
    }
}

/// Paces reads to a rate: a token bucket of one second's bytes.
struct Pace {
    rate: u64,
    started: Instant,
    taken: u64,
}

impl Pace {
    fn take(&mut self, bytes: u64, stop: &AtomicBool) {
        self.taken += bytes;
        let due = Duration::from_secs_f64(self.taken as f64 / self.rate as f64);
        while !stop.load(Ordering::Relaxed) {
            let elapsed = self.started.elapsed();
            if elapsed >= due {
                break;
            }
            std::thread::sleep((due - elapsed).min(Duration::from_millis(100)));
        }
    }
}

pub(super) struct Reader {
    config: ReaderConfig,
    events: mpsc::Sender<ReaderEvent>,
    stop: Arc<AtomicBool>,
    builder: BatchBuilder,
    rows: Vec<BatchRow>,
    scratch: Vec<u8>,
    pace: Option<Pace>,
}

/// The driver is gone: stop reading.
struct Gone;

impl Reader {
    pub fn new(
        config: ReaderConfig,
        events: mpsc::Sender<ReaderEvent>,
        stop: Arc<AtomicBool>,
    ) -> Self {
        let builder = BatchBuilder::with_capacity(1024, config.batch_bytes + config.max_row_bytes);
        let pace = config.limit_rate.map(|rate| Pace {
            rate: rate.max(1),
            started: Instant::now(),
            taken: 0,
        });
        Self {
            config,
            events,
            stop,
            builder,
            rows: Vec::new(),
            scratch: Vec::new(),
            pace,
        }
    }

    /// Reads the jobs as they come, following the files still growing
    /// until each has settled (or, without following, leaving them as they
    /// are), until the driver closes `jobs`.
    pub fn run(mut self, jobs: std::sync::mpsc::Receiver<ReadJob>) {
        let _ = self.run_jobs(jobs);
    }

    fn run_jobs(&mut self, jobs: std::sync::mpsc::Receiver<ReadJob>) -> Result<(), Gone> {
        let poll =
            (self.config.settle / 8).clamp(Duration::from_millis(20), Duration::from_millis(500));
        let mut growing: Vec<Reading> = Vec::new();
        loop {
            let job = if growing.is_empty() {
                self.flush()?;
                match jobs.recv() {
                    Ok(job) => Some(job),
                    Err(_) => return Ok(()),
                }
            } else {
                jobs.try_recv().ok()
            };
            if self.stopped() {
                return Err(Gone);
            }
            if let Some(job) = job {
                if let Some(reading) = self.open(job)?
                    && let Some(reading) = self.read_and_judge(reading)?
                {
                    growing.push(reading);
                }
                continue;
            }
            // Every job at hand is read: look at the growing ones again.
            self.flush()?;
            std::thread::sleep(poll);
            let mut still = Vec::with_capacity(growing.len());
            for reading in std::mem::take(&mut growing) {
                if let Some(reading) = self.read_and_judge(reading)? {
                    still.push(reading);
                }
            }
            growing = still;
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn emit(&self, event: ReaderEvent) -> Result<(), Gone> {
        self.events.blocking_send(event).map_err(|_| Gone)
    }

    fn open(&mut self, job: ReadJob) -> Result<Option<Reading>, Gone> {
        let file = match File::open(&job.local) {
            Ok(file) => file,
            Err(e) => {
                self.emit(ReaderEvent::Failed {
                    file: job.file,
                    generation: job.generation,
                    reason: format!("cannot open {}: {e}", job.local.display()),
                })?;
                return Ok(None);
            }
        };
        let hasher = self.config.digest.hasher();
        Ok(Some(Reading {
            job,
            file,
            offset: 0,
            hasher,
            cap: None,
            seen: None,
            changed_at: Instant::now(),
            changed_while_read: false,
        }))
    }

    /// Reads what the file holds now, then decides: settled, left growing,
    /// failed, or (returned) to be looked at again.
    ///
    /// A file is settled once neither its size nor its times have changed
    /// for the settle time, judged by its modification time or, where that
    /// lies in the future (another host's clock), by this process's clock;
    /// and it did not change while this pass read it.
    fn read_and_judge(&mut self, mut reading: Reading) -> Result<Option<Reading>, Gone> {
        let meta = match reading.file.metadata() {
            Ok(meta) => meta,
            Err(e) => return self.fail(&reading, format!("cannot examine: {e}")),
        };
        let before = Seen::of(&meta);
        if reading.seen.is_some_and(|seen| seen != before) {
            reading.changed_at = Instant::now();
            reading.changed_while_read |= reading.offset > 0;
        }
        reading.seen = Some(before);
        let size = before.size;
        if size < reading.offset {
            let reason = format!(
                "truncated while being sent (it had {} bytes, now {size})",
                reading.offset
            );
            return self.fail(&reading, reason);
        }
        let quiet_for = meta
            .modified()
            .ok()
            .and_then(|modified| SystemTime::now().duration_since(modified).ok())
            .unwrap_or_default()
            .max(reading.changed_at.elapsed());
        let quiet = quiet_for >= self.config.settle;
        if !quiet && !self.config.follow && reading.cap.is_none() {
            reading.cap = Some(size);
        }
        let end = reading.cap.map_or(size, |cap| cap.min(size));
        if let Err(reason) = self.read_to(&mut reading, end)? {
            return self.fail(&reading, reason);
        }
        let after = match reading.file.metadata() {
            Ok(meta) => Seen::of(&meta),
            Err(e) => return self.fail(&reading, format!("cannot examine: {e}")),
        };
        let unchanged = after == before;
        if !unchanged {
            reading.seen = Some(after);
            reading.changed_at = Instant::now();
            reading.changed_while_read = true;
        }
        if quiet && unchanged && reading.offset == size {
            let mut digest = reading.hasher.finish();
            if reading.changed_while_read {
                // What was read may have been rewritten behind the reader:
                // the seal must vouch for the file as it is.
                match self.config.digest.of_file_prefix(&reading.file, size) {
                    Ok(now) if now != digest => {
                        tracing::warn!(file = %reading.job.local.display(), "rewritten in place while it was sent; the sink will be asked to check it");
                        digest = now;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        return self
                            .fail(&reading, format!("reading it again for its digest: {e}"));
                    }
                }
            }
            self.emit(ReaderEvent::Settled {
                file: reading.job.file,
                generation: reading.job.generation,
                size,
                digest,
            })?;
            return Ok(None);
        }
        if let Some(cap) = reading.cap {
            self.emit(ReaderEvent::LeftGrowing {
                file: reading.job.file,
                generation: reading.job.generation,
                size: cap,
            })?;
            return Ok(None);
        }
        Ok(Some(reading))
    }

    fn fail(&mut self, reading: &Reading, reason: String) -> Result<Option<Reading>, Gone> {
        self.emit(ReaderEvent::Failed {
            file: reading.job.file,
            generation: reading.job.generation,
            reason: format!("{}: {reason}", reading.job.local.display()),
        })?;
        Ok(None)
    }

    /// Reads up to `end`: below the resume point into a scratch buffer, for
    /// the digest only; above it into the batch. The inner error is the
    /// file's (a read that failed), the outer the driver's (gone).
    fn read_to(&mut self, reading: &mut Reading, end: u64) -> Result<Result<(), String>, Gone> {
        while reading.offset < end {
            if self.stopped() {
                return Err(Gone);
            }
            let offset = reading.offset;
            let want = (end - offset).min(self.config.max_row_bytes as u64) as usize;
            if offset < reading.job.resume_from {
                let want = want.min((reading.job.resume_from - offset) as usize);
                self.scratch.resize(want, 0);
                let got = match rustix::io::pread(&reading.file, &mut self.scratch[..], offset) {
                    Ok(0) => return Ok(Err(format!("ended at {offset} bytes while being read"))),
                    Ok(got) => got,
                    Err(e) => return Ok(Err(format!("reading at {offset}: {e}"))),
                };
                reading.hasher.update(&self.scratch[..got]);
                reading.offset += got as u64;
                continue;
            }
            if let Some(pace) = &mut self.pace {
                pace.take(want as u64, &self.stop);
            }
            let file = &reading.file;
            let data = self.builder.push_data_in_place(
                &reading.job.key,
                reading.job.generation,
                offset,
                want,
                |room| rustix::io::pread(file, room, offset).map(|(filled, _)| filled),
            );
            let data = match data {
                Ok([]) => return Ok(Err(format!("ended at {offset} bytes while being read"))),
                Ok(data) => data,
                Err(e) => return Ok(Err(format!("reading at {offset}: {e}"))),
            };
            reading.hasher.update(data);
            let got = data.len() as u64;
            reading.offset += got;
            self.rows.push(BatchRow {
                file: reading.job.file,
                generation: reading.job.generation,
                bytes: got,
            });
            if self.builder.encoded_bytes() >= self.config.batch_bytes {
                self.flush()?;
            }
        }
        Ok(Ok(()))
    }

    fn flush(&mut self) -> Result<(), Gone> {
        if self.rows.is_empty() {
            return Ok(());
        }
        let batch = self.builder.finish_encoded();
        let rows = std::mem::take(&mut self.rows);
        self.emit(ReaderEvent::Batch { batch, rows })
    }
}
