//! Whole-file digests for seals, computed on a worker thread of their own.
//!
//! Most seals need no hashing: the tailer digests a file as it reads it.
//! A file it took up part way (resumed from a checkpoint or a sink's
//! watermark) must be read again from its start, and on the tailer thread
//! that paused the tailing of every other file for as long as it took. The
//! worker takes such jobs from a short queue and hands the digests back;
//! the tailer polls for them with its other work. The worker is joined
//! when the hasher is dropped, and a stop ends a job between two reads.

use std::fs::File;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::thread::JoinHandle;

use flight_server::SealDigest;

use crate::stop::Stop;

/// Jobs waiting for the worker; when full, the tailer asks again later.
const QUEUE: usize = 16;
/// Bytes the digest reads at once (see `SealDigest::of_file_prefix_unless`):
/// the tests size their files around it.
#[cfg(test)]
const CHUNK: usize = 1 << 20;

/// A file to digest from offset 0 to `size`, named by the caller's `id`.
pub(crate) struct Job<Id> {
    pub id: Id,
    pub file: File,
    pub size: u64,
    pub kind: SealDigest,
}

/// The digest of a job's file prefix.
pub(crate) struct Hashed<Id> {
    pub id: Id,
    pub size: u64,
    pub digest: io::Result<String>,
}

pub(crate) struct SealHasher<Id: Send + 'static> {
    jobs: Option<SyncSender<Job<Id>>>,
    results: Receiver<Hashed<Id>>,
    worker: Option<JoinHandle<()>>,
    /// Set when the hasher is dropped: the tailer is gone (stopped or
    /// failed) and nobody wants the digest of the job at hand.
    quit: Arc<AtomicBool>,
}

impl<Id: Send + 'static> SealHasher<Id> {
    pub fn start(stop: Arc<Stop>) -> io::Result<Self> {
        Self::spawn(stop, None)
    }

    /// A hasher whose worker takes each job only once `gate` yields (or
    /// is dropped), so tests can hold a digest back.
    #[cfg(test)]
    pub fn start_held(stop: Arc<Stop>, gate: Receiver<()>) -> io::Result<Self> {
        Self::spawn(stop, Some(gate))
    }

    fn spawn(stop: Arc<Stop>, gate: Option<Receiver<()>>) -> io::Result<Self> {
        let (jobs, queued) = std::sync::mpsc::sync_channel::<Job<Id>>(QUEUE);
        let (done, results) = std::sync::mpsc::channel();
        let quit = Arc::new(AtomicBool::new(false));
        let halted = {
            let quit = quit.clone();
            move || stop.is_requested() || quit.load(Ordering::Relaxed)
        };
        let worker = std::thread::Builder::new()
            .name("seal-hasher".into())
            .spawn(move || {
                while let Ok(job) = queued.recv() {
                    if let Some(gate) = &gate {
                        let _ = gate.recv();
                    }
                    let digest = digest_prefix(&job.file, job.size, job.kind, &halted);
                    if halted() {
                        return;
                    }
                    let hashed = Hashed {
                        id: job.id,
                        size: job.size,
                        digest,
                    };
                    if done.send(hashed).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Self {
            jobs: Some(jobs),
            results,
            worker: Some(worker),
            quit,
        })
    }

    /// Queues a job, or gives it back when the queue is full.
    pub fn submit(&self, job: Job<Id>) -> Result<(), Job<Id>> {
        let Some(jobs) = &self.jobs else {
            return Err(job);
        };
        jobs.try_send(job).map_err(|e| match e {
            TrySendError::Full(job) | TrySendError::Disconnected(job) => job,
        })
    }

    /// A finished job, if any.
    pub fn try_result(&self) -> Option<Hashed<Id>> {
        self.results.try_recv().ok()
    }
}

impl<Id: Send + 'static> Drop for SealHasher<Id> {
    fn drop(&mut self) {
        // Closing the queue ends the worker after its current job, which
        // `quit` cuts short: a tailer that failed must not wait for the
        // digest of a large file before it can report why.
        self.quit.store(true, Ordering::Relaxed);
        self.jobs = None;
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

/// The digest of the first `size` bytes of `file`, or an error if it was
/// `halted` first or the file is shorter.
fn digest_prefix(
    file: &File,
    size: u64,
    kind: SealDigest,
    halted: &dyn Fn() -> bool,
) -> io::Result<String> {
    kind.of_file_prefix_unless(file, size, halted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn temp_file(tag: &str, data: &[u8]) -> (std::path::PathBuf, File) {
        let path =
            std::env::temp_dir().join(format!("watcher-seal-hash-{tag}-{}", std::process::id()));
        std::fs::write(&path, data).expect("write a temp file");
        let file = File::open(&path).expect("open the temp file");
        (path, file)
    }

    fn wait_result<Id: Send + 'static>(hasher: &SealHasher<Id>) -> Hashed<Id> {
        for _ in 0..3000 {
            if let Some(hashed) = hasher.try_result() {
                return hashed;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("the worker never answered");
    }

    #[test]
    fn digests_match_hashing_on_the_spot() {
        let data: Vec<u8> = (0..3 * CHUNK as u32 + 77)
            .map(|i| (i % 253) as u8)
            .collect();
        let (path, file) = temp_file("match", &data);
        let hasher = SealHasher::start(Arc::new(Stop::default())).expect("start the worker");
        for kind in [SealDigest::Crc64Nvme, SealDigest::Blake3] {
            for size in [0, 1, CHUNK as u64, data.len() as u64 - 5] {
                let job = Job {
                    id: (kind, size),
                    file: file.try_clone().expect("clone the handle"),
                    size,
                    kind,
                };
                assert!(hasher.submit(job).is_ok());
                let hashed = wait_result(&hasher);
                assert_eq!(hashed.id, (kind, size));
                assert_eq!(hashed.size, size);
                let expected = kind.of_file_prefix(&file, size).expect("hash on the spot");
                assert_eq!(hashed.digest.expect("digest"), expected);
            }
        }
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_file_shorter_than_asked_is_an_error() {
        let (path, file) = temp_file("short", b"only this");
        let hasher = SealHasher::start(Arc::new(Stop::default())).expect("start the worker");
        let job = Job {
            id: 1u8,
            file,
            size: 100,
            kind: SealDigest::default(),
        };
        assert!(hasher.submit(job).is_ok());
        assert!(wait_result(&hasher).digest.is_err());
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn dropping_the_hasher_ends_its_work_without_a_stop() {
        // /dev/zero never runs out: only giving up ends this job.
        let zero = File::open("/dev/zero").expect("open /dev/zero");
        let hasher = SealHasher::start(Arc::new(Stop::default())).expect("start the worker");
        let job = Job {
            id: 0u8,
            file: zero,
            size: 1 << 50,
            kind: SealDigest::Crc64Nvme,
        };
        assert!(hasher.submit(job).is_ok());
        let (dropped, done) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(hasher);
            let _ = dropped.send(());
        });
        // Only stops a hung test: giving up takes one read.
        assert!(
            done.recv_timeout(Duration::from_secs(30)).is_ok(),
            "dropping the hasher waited for its job"
        );
    }

    #[test]
    fn a_stop_ends_queued_work_and_drop_joins_the_worker() {
        let data = vec![7u8; 4 * CHUNK];
        let (path, file) = temp_file("stop", &data);
        let stop = Arc::new(Stop::default());
        let hasher = SealHasher::start(stop.clone()).expect("start the worker");
        stop.request();
        for id in 0..QUEUE {
            let job = Job {
                id,
                file: file.try_clone().expect("clone the handle"),
                size: data.len() as u64,
                kind: SealDigest::Blake3,
            };
            let _ = hasher.submit(job);
        }
        // Returns at all: the worker saw the stop and ended.
        drop(hasher);
        let _ = std::fs::remove_file(path);
    }
}
