//! The sink under fuzzing: a real [`sink::Sink`] on a scratch root, fed
//! through the same DoPut reading, decoding, validation and placement a
//! served stream takes (without a network), and the checks every case
//! must pass whatever its bytes:
//!
//! - no panic and no internal error (a peer's bytes are never the sink's bug);
//! - the sink is not poisoned (bad input is refused, it never breaks the sink);
//! - an ack never claims more bytes than its batch carried;
//! - nothing is written outside the root, nor outside a source's directory;
//! - a valid stream (no mutation) is acknowledged whole and leaves its files
//!   byte-identical;
//! - between sinks, the audit of the stopped sink's manifest is clean.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::{FlightData, PutResult};
use flight_server::Ack;
use flight_server::service::fuzzing;
use sink::{Sink, SinkConfig};
use tokio::sync::mpsc;
use tonic::{Code, Status};

use crate::plan::Expected;

/// How long a mutated case may take: a batch whose ranges wait for bytes
/// before them that never come is never acknowledged, and the case ends
/// as a peer that went away would.
const MUTATED_CASE_LIMIT: Duration = Duration::from_secs(1);
/// A valid case is never given up on this early (it only bounds a hang).
const VALID_CASE_LIMIT: Duration = Duration::from_secs(120);
/// Batches placed at once per stream, as the served default.
const PIPELINE_DEPTH: usize = 8;

/// What one case came to.
#[derive(Debug, Default)]
pub struct Outcome {
    pub acks: Vec<Ack>,
    /// The status the stream ended with; `None` when it ended cleanly or
    /// still waited for acks at the end of its grace.
    pub ended: Option<Status>,
    pub timed_out: bool,
}

/// A violation of what must hold whatever the input: a crasher.
#[derive(Debug, Clone)]
pub struct Violation(pub String);

/// One sink on a scratch directory of its own.
pub struct Target {
    pub dir: PathBuf,
    pub sink: Arc<Sink>,
}

/// The sink settings a target cycles through, so that both holding ranges
/// in order and writing them where they land, with and without the journal,
/// are fuzzed.
fn config_for(dir: &Path, variant: u64) -> SinkConfig {
    SinkConfig {
        root: dir.join("root"),
        state_dir: dir.join("state"),
        hold_limit: if variant.is_multiple_of(2) {
            1 << 20
        } else {
            0
        },
        journal_max_range: if variant % 4 < 2 { 64 << 10 } else { 0 },
        placement_threads: Some(4),
        max_open_files: 64,
        ..SinkConfig::default()
    }
}

impl Target {
    pub fn open(dir: PathBuf, variant: u64) -> anyhow::Result<Self> {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("root"))?;
        let sink = Sink::open(&config_for(&dir, variant))?;
        Ok(Self {
            dir,
            sink: Arc::new(sink),
        })
    }

    /// Runs one stream through the sink and checks what must hold.
    pub async fn run(
        &self,
        messages: Vec<FlightData>,
        expected: Option<&Expected>,
    ) -> Result<Outcome, Violation> {
        let data_bytes = batch_data_bytes(&messages);
        let limit = if expected.is_some() {
            VALID_CASE_LIMIT
        } else {
            MUTATED_CASE_LIMIT
        };
        let outcome = put(self.sink.clone(), messages, limit).await;
        if let Some(status) = &outcome.ended
            && status.code() == Code::Internal
        {
            return Err(Violation(format!(
                "an internal error (a bug in the sink): {}",
                status.message()
            )));
        }
        if let Some(reason) = self.sink.health().reason() {
            return Err(Violation(format!("the sink was poisoned: {reason}")));
        }
        for ack in &outcome.acks {
            let claimed = ack
                .placed
                .saturating_add(ack.duplicate)
                .saturating_add(ack.stale);
            let carried = data_bytes.get(&ack.seq).copied().unwrap_or(0);
            if claimed > carried {
                return Err(Violation(format!(
                    "the ack of batch {} claims {claimed} bytes; its batches carried {carried}",
                    ack.seq
                )));
            }
        }
        if let Some(expected) = expected {
            self.check_valid(&outcome, expected)?;
        }
        Ok(outcome)
    }

    fn check_valid(&self, outcome: &Outcome, expected: &Expected) -> Result<(), Violation> {
        // Refused as retryable (the hold budget taken by hostile streams'
        // ranges, for instance): a watcher sends it again; nothing to check.
        if outcome
            .ended
            .as_ref()
            .is_some_and(|status| status.code() == Code::Unavailable)
        {
            return Ok(());
        }
        if outcome.ended.is_some() || outcome.timed_out {
            return Err(Violation(format!(
                "a valid stream was not acknowledged whole: ended {:?}, timed out {}",
                outcome.ended, outcome.timed_out
            )));
        }
        for (path, content) in &expected.files {
            let placed = self.dir.join("root").join(&expected.source).join(path);
            // A file that never got a byte is only created by an Open.
            match std::fs::read(&placed) {
                Ok(bytes) if &bytes == content => {}
                Ok(bytes) => {
                    return Err(Violation(format!(
                        "{} holds {} bytes that differ from the {} sent",
                        placed.display(),
                        bytes.len(),
                        content.len()
                    )));
                }
                Err(_) if content.is_empty() => {}
                Err(e) => {
                    return Err(Violation(format!(
                        "{} of a valid stream: {e}",
                        placed.display()
                    )));
                }
            }
        }
        Ok(())
    }

    /// Nothing outside `root/<source>/` and the state directory: a walk of
    /// the target's directory, and the absolute escapes the mutations try.
    pub fn check_confinement(&self) -> Result<(), Violation> {
        for entry in read_dir(&self.dir)? {
            let name = entry.file_name();
            if name != "root" && name != "state" {
                return Err(Violation(format!(
                    "{} was written beside the root",
                    entry.path().display()
                )));
            }
        }
        for entry in read_dir(&self.dir.join("root"))? {
            let kind = entry
                .file_type()
                .map_err(|e| Violation(format!("{}: {e}", entry.path().display())))?;
            // The sink's own mark of its root is the only file it keeps there.
            if kind.is_file() && entry.file_name() == sink::root_mark::ROOT_MARK {
                continue;
            }
            if !kind.is_dir() {
                return Err(Violation(format!(
                    "{} was written into the root, outside every source's directory",
                    entry.path().display()
                )));
            }
        }
        no_links(&self.dir.join("root"))?;
        for escape in ["/tmp/escape", "/escape", "/tmp/outside"] {
            if Path::new(escape).exists() {
                return Err(Violation(format!(
                    "{escape} exists: a write escaped the root"
                )));
            }
        }
        Ok(())
    }

    /// Stops the sink and audits its manifest; removes its directory if clean.
    pub async fn close(self) -> Result<(), Violation> {
        self.check_confinement()?;
        self.sink.shutdown().await;
        let state = self.dir.join("state");
        drop(self.sink);
        // Placements of streams given up on may still be finishing on their
        // threads, each holding the sink (and its manifest's lock) until done.
        let mut attempts = 0;
        let report = loop {
            attempts += 1;
            match sink::audit(&state, false) {
                Ok(report) => break report,
                Err(e) if attempts < 100 && format!("{e:#}").contains("lock") => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => {
                    return Err(Violation(format!(
                        "the audit could not read the manifest: {e:#}"
                    )));
                }
            }
        };
        if report.overlapping_placements != 0 || report.record_mismatches != 0 {
            return Err(Violation(format!(
                "the audit found {} overlapping placements and {} record mismatches: {:?}",
                report.overlapping_placements, report.record_mismatches, report.examples
            )));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        Ok(())
    }
}

fn read_dir(dir: &Path) -> Result<Vec<std::fs::DirEntry>, Violation> {
    std::fs::read_dir(dir)
        .and_then(|entries| entries.collect::<Result<Vec<_>, _>>())
        .map_err(|e| Violation(format!("reading {}: {e}", dir.display())))
}

fn no_links(dir: &Path) -> Result<(), Violation> {
    for entry in read_dir(dir)? {
        let kind = entry
            .file_type()
            .map_err(|e| Violation(format!("{}: {e}", entry.path().display())))?;
        if kind.is_symlink() {
            return Err(Violation(format!(
                "{} is a symbolic link under the root",
                entry.path().display()
            )));
        }
        if kind.is_dir() {
            no_links(&entry.path())?;
        }
    }
    Ok(())
}

/// Data bytes each batch message carried, by the sequence number in its
/// app_metadata (summed over messages that share one), read back from the
/// messages themselves so that mutated batches are counted as sent.
fn batch_data_bytes(messages: &[FlightData]) -> HashMap<u64, u64> {
    let mut bytes = HashMap::new();
    for message in messages {
        let Ok(seq) = flight_server::protocol::decode_seq(&message.app_metadata) else {
            continue;
        };
        // The body bounds what its data column can hold.
        *bytes.entry(seq).or_insert(0) += message.data_body.len() as u64;
    }
    bytes
}

/// Sends `messages` as one DoPut stream and gathers its acks, giving up
/// after `limit` as a peer that went away would.
async fn put(sink: Arc<Sink>, messages: Vec<FlightData>, limit: Duration) -> Outcome {
    let (acks_tx, mut acks_rx) = mpsc::channel::<Result<PutResult, Status>>(PIPELINE_DEPTH * 2);
    let stream = futures::stream::iter(messages.into_iter().map(Ok));
    let running = async move {
        let result = fuzzing::put(sink, "fuzz", stream, &acks_tx, PIPELINE_DEPTH).await;
        drop(acks_tx);
        result
    };
    let mut outcome = Outcome::default();
    let gather = async {
        let mut acks = Vec::new();
        let mut refused = None;
        while let Some(answer) = acks_rx.recv().await {
            match answer.map(|put| Ack::decode(&put.app_metadata)) {
                Ok(Ok(ack)) => acks.push(ack),
                Ok(Err(e)) => {
                    refused = Some(Status::internal(format!(
                        "the sink sent an unreadable ack: {e}"
                    )))
                }
                Err(status) => refused = Some(status),
            }
        }
        (acks, refused)
    };
    let both = async { futures::join!(running, gather) };
    match tokio::time::timeout(limit, both).await {
        Ok((result, (acks, refused))) => {
            outcome.acks = acks;
            outcome.ended = result.err().or(refused);
        }
        Err(_) => outcome.timed_out = true,
    }
    outcome
}
