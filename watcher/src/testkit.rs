//! Test kit: a fake transport that stands in for the sinks, so the real
//! tailer can be run against a model of what the destination must hold.
//!
//! The fake sink consumes the tailer's outboxes, applies every row to an
//! in-memory destination and acknowledges each batch on the tailer's
//! delivery channel, as a sink would once the batch is durable. It records
//! what a real sink would refuse or what would break exactly-once
//! placement (different bytes for the same offset of one generation, a
//! seal whose digest does not match the bytes held) as violations.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use flight_server::{Ack, Delivery, Outgoing, RangeBatch, RowKind, SealDigest};
use manifest_db::IntervalSet;
use tokio::sync::mpsc;

/// One generation of one file, as the destination holds it.
#[derive(Debug, Default)]
pub struct DestFile {
    /// Where it lives now (its key until an Open or Rename says otherwise).
    pub path: String,
    pub data: Vec<u8>,
    pub placed: IntervalSet,
    /// (size, digest) once sealed.
    pub seal: Option<(u64, String)>,
}

#[derive(Debug, Default)]
pub struct Dest {
    /// By (key, generation).
    pub files: BTreeMap<(String, u64), DestFile>,
    pub violations: Vec<String>,
    pub batches: u64,
    /// While set, batches with a seal row are applied but not yet
    /// acknowledged (as by a slow sink), so tests can act meanwhile.
    pub hold_seal_acks: bool,
    /// While set, every answer is garbled from this seed on, as a broken
    /// or hostile sink's would be (see [`garble`]).
    pub garble_answers: Option<u64>,
}

/// A sink's answer to a batch of `rows` rows, garbled: byte counts near
/// `u64::MAX`, rejections of rows the batch does not have (or of every
/// row, superseded or not), a refusal instead of an ack. `state` steps a
/// xorshift generator.
pub fn garble(ack: Ack, rows: usize, state: &mut u64) -> Result<Ack, String> {
    let mut next = || {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    };
    let mut ack = ack;
    match next() % 6 {
        0 => {
            ack.placed = u64::MAX;
            ack.duplicate = next();
            ack.stale = u64::MAX;
        }
        1 => {
            ack.rejected = (0..next() % 4)
                .map(|_| flight_server::RejectedRow {
                    row: match next() % 3 {
                        0 => usize::MAX,
                        1 => rows + (next() % 8) as usize,
                        _ => (next() % rows.max(1) as u64) as usize,
                    },
                    error: "garbled".into(),
                    superseded: next() % 2 == 0,
                })
                .collect();
        }
        2 => {
            ack.rejected = (0..rows)
                .map(|row| flight_server::RejectedRow {
                    row,
                    error: "every row refused".into(),
                    superseded: next() % 3 == 0,
                })
                .collect();
        }
        3 => return Err("refused by a garbling sink".into()),
        4 => ack.seq = next(),
        _ => {}
    }
    Ok(ack)
}

impl Dest {
    /// Whether some generation at `path` holds exactly `content` from offset 0.
    pub fn holds(&self, path: &str, content: &[u8]) -> bool {
        self.files.values().any(|f| {
            f.path == path
                && f.placed.covers(0, content.len() as u64)
                && f.data.get(..content.len()) == Some(content)
        })
    }

    fn apply(&mut self, batch: &RangeBatch) -> Ack {
        let mut ack = Ack::default();
        for row in batch.rows() {
            let id = (row.file_key.to_owned(), row.generation);
            let file = self.files.entry(id.clone()).or_insert_with(|| DestFile {
                path: row.file_key.to_owned(),
                ..DestFile::default()
            });
            match row.kind {
                RowKind::Data => {
                    let start = row.offset as usize;
                    let end = start + row.data.len();
                    if file.data.len() < end {
                        file.data.resize(end, 0);
                    }
                    let mut fresh = 0;
                    for (s, e) in file.placed.missing(row.offset, end as u64) {
                        let (s, e) = (s as usize, e as usize);
                        file.data[s..e].copy_from_slice(&row.data[s - start..e - start]);
                        fresh += (e - s) as u64;
                    }
                    if file.data[start..end] != *row.data {
                        self.violations.push(format!(
                            "{id:?}: other bytes at {start}..{end} than placed before"
                        ));
                    }
                    ack.placed += fresh;
                    ack.duplicate += row.data.len() as u64 - fresh;
                    file.placed.insert(row.offset, end as u64);
                }
                RowKind::Open | RowKind::Rename => {
                    if let Some(path) = row.path {
                        file.path = path.to_owned();
                    }
                }
                RowKind::Seal => {
                    let size = row.offset;
                    let digest = row.digest.unwrap_or_default().to_owned();
                    let held = SealDigest::of_digest(&digest)
                        .ok()
                        .filter(|_| file.placed.covers(0, size))
                        .and_then(|kind| {
                            let mut hasher = kind.hasher();
                            hasher.update(file.data.get(..size as usize)?);
                            Some(hasher.finish())
                        });
                    if held.as_deref() != Some(digest.as_str()) {
                        self.violations.push(format!(
                            "{id:?}: seal at {size} with {digest} does not match the bytes held"
                        ));
                    }
                    file.seal = Some((size, digest));
                }
            }
        }
        ack
    }
}

/// Sinks that answer every batch; their threads end once the tailer (the
/// outboxes' only sender) is gone.
pub struct FakeSinks {
    threads: Vec<JoinHandle<()>>,
}

impl FakeSinks {
    /// Outboxes for `sinks` sinks and the delivery channel, to hand to a
    /// tailer, with the fake sinks already serving them.
    #[allow(clippy::type_complexity)]
    pub fn start(
        sinks: usize,
        dest: Arc<Mutex<Dest>>,
    ) -> (
        Self,
        Vec<mpsc::Sender<Outgoing>>,
        std::sync::mpsc::Receiver<(usize, Delivery)>,
    ) {
        let (delivery_tx, delivery_rx) = std::sync::mpsc::channel();
        let mut outboxes = Vec::new();
        let mut threads = Vec::new();
        for index in 0..sinks {
            let (tx, mut rx) = mpsc::channel::<Outgoing>(2);
            outboxes.push(tx);
            let dest = dest.clone();
            let deliveries = delivery_tx.clone();
            threads.push(std::thread::spawn(move || {
                while let Some(out) = rx.blocking_recv() {
                    let batch = out
                        .batch
                        .decode()
                        .map_err(|e| e.to_string())
                        .and_then(|b| RangeBatch::validate(b).map_err(|e| e.to_string()));
                    let ack = match batch {
                        Ok(batch) => {
                            let mut held = dest.lock().unwrap_or_else(|p| p.into_inner());
                            held.batches += 1;
                            let ack = held.apply(&batch);
                            drop(held);
                            if batch.rows().any(|row| row.kind == RowKind::Seal) {
                                // Bounded: a test that forgets to let go still ends.
                                for _ in 0..2000 {
                                    if !dest
                                        .lock()
                                        .unwrap_or_else(|p| p.into_inner())
                                        .hold_seal_acks
                                    {
                                        break;
                                    }
                                    std::thread::sleep(std::time::Duration::from_millis(5));
                                }
                            }
                            ack
                        }
                        Err(error) => {
                            let mut dest = dest.lock().unwrap_or_else(|p| p.into_inner());
                            dest.violations.push(format!("an invalid batch: {error}"));
                            continue;
                        }
                    };
                    let garbling = dest
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .garble_answers
                        .as_mut()
                        .map(|state| garble(ack.clone(), out.batch.rows(), state));
                    let delivery = match garbling {
                        None => Delivery::Acked {
                            token: out.token,
                            ack,
                        },
                        Some(Ok(ack)) => Delivery::Acked {
                            token: out.token,
                            ack,
                        },
                        Some(Err(error)) => Delivery::Refused {
                            token: out.token,
                            error,
                        },
                    };
                    if deliveries.send((index, delivery)).is_err() {
                        break;
                    }
                }
            }));
        }
        (Self { threads }, outboxes, delivery_rx)
    }

    /// Waits for the sink threads (after the tailer is gone).
    pub fn join(self) {
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

/// A scratch directory under the system temp dir, removed on drop unless
/// the test failed.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Self {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("watcher-unit-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create a scratch dir");
        // The tailer works on canonical paths.
        Self(std::fs::canonicalize(&dir).expect("canonical scratch dir"))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("test folder kept: {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
