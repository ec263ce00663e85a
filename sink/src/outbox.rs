//! The event outbox: what each commit round tells the world about its files
//! (opened, ranges committed, renamed, sealed, superseded), written as
//! CloudEvents into the round's own manifest write, so an event exists if
//! and only if its commit does. A relay outside this crate (the binary's
//! Kafka relay) reads the outbox in order, publishes, and removes what it
//! published; nothing here knows where events go.
//!
//! Events are made once, when their round is recorded, and stored as they
//! will be published: an event published again after a crash is the same
//! bytes, with the same id. The outbox is bounded on disk by
//! [`EventsConfig::limit_bytes`]; at the bound the sink refuses new batches
//! as retryable (their senders keep them and send them again) rather than
//! drop an event.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use manifest_db::{OutboxEvent, SinkManifest};
use serde::{Deserialize, Serialize};

use crate::error::SinkError;
use crate::feed::{FileChange, FileCommit};

/// The CloudEvents `type` of each event, and the prefix they share.
pub const EVENT_TYPE_PREFIX: &str = "org.tailflight.";
/// The content type of a structured-mode CloudEvent on Kafka.
pub const CLOUDEVENTS_CONTENT_TYPE: &str = "application/cloudevents+json; charset=UTF-8";

/// Whether a sink records events, and how much it may keep unpublished.
#[derive(Clone, Debug)]
pub struct EventsConfig {
    /// The sink's name in its events (`source` and `data.sink`); by default
    /// the manifest's own random id, stable across restarts.
    pub sink_id: Option<String>,
    /// Most bytes of unpublished events kept; past it, new batches are
    /// refused (retryable) until the relay catches up.
    pub limit_bytes: u64,
}

impl Default for EventsConfig {
    fn default() -> Self {
        Self {
            sink_id: None,
            limit_bytes: 1 << 30,
        }
    }
}

/// What the relay last said of itself, for `status`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RelayReport {
    /// "starting", "publishing", "idle" or "failing".
    pub state: String,
    /// Why it is failing (brokers unreachable, topic missing, not
    /// authorised, ...), as the relay last saw it.
    pub error: Option<String>,
    /// Events published by this run of the sink.
    pub published_events: u64,
    /// When it last published (ms since the Unix epoch).
    pub last_published_unix_ms: Option<u64>,
    /// Since when it has waited for the brokers to answer (ms since the
    /// Unix epoch), if it is waiting now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_since_unix_ms: Option<u64>,
    /// Times the relay started a new client after a failure.
    #[serde(default)]
    pub restarts: u64,
    /// Why it last did.
    #[serde(default)]
    pub last_restart_reason: Option<String>,
    /// Clients (the relay's producers and read-back consumers) left inside
    /// a librdkafka call that has not returned: abandoned, or still
    /// finishing when their connection ended.
    #[serde(default)]
    pub stuck_clients: u64,
    /// Times the position read back was behind a transaction the brokers
    /// had acknowledged (its events were published again).
    #[serde(default)]
    pub taken_back: u64,
    /// Transactions the brokers acknowledged in this run of the sink.
    #[serde(default)]
    pub transactions: u64,
    /// Where those transactions' time went, summed over them.
    #[serde(default)]
    pub phase_us: RelayPhases,
}

/// Microseconds summed over the relay's acknowledged transactions, per
/// part: what an event's way from its commit to the topic is made of.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RelayPhases {
    /// From the commit of a transaction's oldest event to the transaction's
    /// start (ms resolution): waiting for the transaction before it.
    pub waited: u64,
    /// Reading the events from the outbox.
    pub read: u64,
    /// `begin_transaction`.
    pub begin: u64,
    /// Handing the events to librdkafka.
    pub produce: u64,
    /// Until the brokers acknowledged every event.
    pub deliver: u64,
    /// `commit_transaction`: the brokers write the commit markers.
    pub commit: u64,
    /// Reading the last records back (about once a second beside
    /// publishing, on a thread of its own, and when idle).
    pub confirm: u64,
}

/// A relay that has waited this long for the brokers is shown as failing,
/// before librdkafka's own timeouts end its call.
const NO_ANSWER_AFTER: Duration = Duration::from_secs(5);

/// The outbox as `status` shows it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct OutboxStatus {
    pub sink_id: String,
    /// The newest event recorded (durable), and the newest published.
    pub recorded_through: u64,
    pub published_through: u64,
    /// Recorded and not yet published.
    pub depth_events: u64,
    pub depth_bytes: u64,
    pub limit_bytes: u64,
    /// Batches refused since the start because the outbox was full.
    #[serde(default)]
    pub refused_batches: u64,
    /// How long the oldest unpublished event has waited.
    pub oldest_age_ms: Option<u64>,
    pub relay: RelayReport,
}

/// The sink's outbox: shared by the committer (which records events) and
/// the relay (which publishes them).
pub struct Outbox {
    manifest: SinkManifest,
    sink_id: String,
    /// `source` of every event: `tailflight://sink/<sink id>`.
    source_uri: String,
    limit_bytes: u64,
    /// Sequence number of the newest event whose round is durable: the
    /// relay never reads past it (a round still in the journal's write may
    /// yet be withdrawn by a crash).
    durable: AtomicU64,
    /// Sequence number of the newest event removed as published.
    published: AtomicU64,
    /// Bytes of the events between the two.
    bytes: AtomicU64,
    /// Batches refused because the outbox was full.
    refused: AtomicU64,
    changed: tokio::sync::Notify,
    relay: Mutex<RelayReport>,
}

/// One event as the outbox hands it to the relay.
#[derive(Clone, Debug)]
pub struct PendingEvent {
    pub seq: u64,
    pub key: Vec<u8>,
    pub payload: Vec<u8>,
    pub recorded_unix_ms: u64,
}

impl Outbox {
    /// The outbox of `manifest`, with what it already holds.
    pub(crate) fn open(manifest: SinkManifest, config: &EventsConfig) -> anyhow::Result<Self> {
        let sink_id = match &config.sink_id {
            Some(id) => id.clone(),
            None => manifest.manifest_id()?,
        };
        let last = manifest.outbox_last()?;
        let first = manifest.outbox_after(0, 1, 0)?.first().map(|(seq, _)| *seq);
        let depth = manifest.outbox_depth()?;
        Ok(Self {
            source_uri: format!("tailflight://sink/{sink_id}"),
            sink_id,
            limit_bytes: config.limit_bytes,
            durable: AtomicU64::new(last),
            published: AtomicU64::new(first.map_or(last, |first| first - 1)),
            bytes: AtomicU64::new(depth.bytes),
            refused: AtomicU64::new(0),
            changed: tokio::sync::Notify::new(),
            relay: Mutex::new(RelayReport {
                state: "starting".into(),
                ..RelayReport::default()
            }),
            manifest,
        })
    }

    pub fn sink_id(&self) -> &str {
        &self.sink_id
    }

    /// The newest event the relay may publish.
    pub fn durable_through(&self) -> u64 {
        self.durable.load(Ordering::SeqCst)
    }

    /// The newest event removed as published.
    pub fn published_through(&self) -> u64 {
        self.published.load(Ordering::SeqCst)
    }

    /// Waits until an event after `seq` is durable, or `timeout` passes.
    pub async fn wait_beyond(&self, seq: u64, timeout: Duration) {
        let changed = self.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if self.durable_through() > seq {
            return;
        }
        let _ = tokio::time::timeout(timeout, changed).await;
    }

    /// Durable events after `after`, in order: at most `limit`, and no more
    /// once `byte_limit` bytes are read. Blocking (a RocksDB read).
    pub fn read(
        &self,
        after: u64,
        limit: usize,
        byte_limit: usize,
    ) -> Result<Vec<PendingEvent>, SinkError> {
        let durable = self.durable_through();
        let events = self
            .manifest
            .outbox_after(after, limit, byte_limit)
            .map_err(|e| SinkError::Storage(format!("reading the event outbox: {e}")))?;
        Ok(events
            .into_iter()
            .take_while(|(seq, _)| *seq <= durable)
            .map(|(seq, event)| PendingEvent {
                seq,
                key: event.key,
                payload: event.payload,
                recorded_unix_ms: event.recorded_unix_ms,
            })
            .collect())
    }

    /// Removes the events through `seq`: they are published. With a
    /// `mark` (the relay's: where its published events can be found), it
    /// replaces the last one in the same write, even if nothing more is
    /// removed; `sync`: durable before it returns. Blocking.
    pub fn published(&self, seq: u64, mark: Option<&[u8]>, sync: bool) -> Result<(), SinkError> {
        let seq = seq.min(self.durable_through());
        let before = self.published_through();
        if seq <= before && mark.is_none() {
            return Ok(());
        }
        let removed = self
            .manifest
            .outbox_remove(before, seq.max(before), mark, sync)
            .map_err(|e| {
                SinkError::Storage(format!("removing published events from the outbox: {e}"))
            })?;
        self.published.fetch_max(seq, Ordering::SeqCst);
        let _ = self
            .bytes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| {
                Some(b.saturating_sub(removed))
            });
        Ok(())
    }

    /// The relay's mark, as last given to [`Self::published`]. Blocking.
    pub fn mark(&self) -> Result<Option<Vec<u8>>, SinkError> {
        self.manifest
            .outbox_mark()
            .map_err(|e| SinkError::Storage(format!("reading the relay's mark: {e}")))
    }

    /// The relay tells what it is doing.
    pub fn report(&self, update: impl FnOnce(&mut RelayReport)) {
        update(&mut self.relay.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// The relay starts waiting for the brokers (`true`), or got its answer.
    pub fn waiting_for_brokers(&self, waiting: bool) {
        let since = waiting.then(|| unix_ms(SystemTime::now()));
        self.report(|report| report.waiting_since_unix_ms = since);
    }

    pub fn status(&self) -> OutboxStatus {
        let published_through = self.published_through();
        let recorded_through = self.durable_through();
        let oldest_age_ms = self
            .manifest
            .outbox_after(published_through, 1, 0)
            .ok()
            .and_then(|events| events.first().map(|(_, e)| e.recorded_unix_ms))
            .map(|recorded| unix_ms(SystemTime::now()).saturating_sub(recorded));
        OutboxStatus {
            sink_id: self.sink_id.clone(),
            recorded_through,
            published_through,
            depth_events: recorded_through.saturating_sub(published_through),
            depth_bytes: self.bytes.load(Ordering::Relaxed),
            limit_bytes: self.limit_bytes,
            refused_batches: self.refused.load(Ordering::Relaxed),
            oldest_age_ms,
            relay: self.relay_report(),
        }
    }

    fn relay_report(&self) -> RelayReport {
        let mut report = self.relay.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let now = unix_ms(SystemTime::now());
        if let Some(since) = report.waiting_since_unix_ms {
            let waited = now.saturating_sub(since);
            if waited >= NO_ANSWER_AFTER.as_millis() as u64 && report.state != "failing" {
                report.state = "failing".into();
                report.error = Some(format!(
                    "no answer from the brokers for {:.1} s",
                    waited as f64 / 1000.0
                ));
            }
        }
        report
    }

    /// Refuses new data while the outbox is at its bound.
    pub(crate) fn check_room(&self) -> Result<(), SinkError> {
        let bytes = self.bytes.load(Ordering::Relaxed);
        if bytes < self.limit_bytes {
            return Ok(());
        }
        self.refused.fetch_add(1, Ordering::Relaxed);
        let relay = self.relay_report();
        Err(SinkError::Storage(format!(
            "the event outbox holds {bytes} bytes of unpublished events (limit {}); new data waits until the relay publishes them (relay: {}{})",
            self.limit_bytes,
            relay.state,
            relay.error.map(|e| format!(": {e}")).unwrap_or_default()
        )))
    }

    /// The events of one commit round, in the order its files' changes
    /// happened: opened, ranges committed, renamed, sealed, superseded.
    pub(crate) fn events_of(
        &self,
        files: &[FileCommit],
        committed_at: SystemTime,
        journal_round: u64,
    ) -> Vec<OutboxEvent> {
        let time = humantime::format_rfc3339_millis(committed_at).to_string();
        let recorded_unix_ms = unix_ms(committed_at);
        let mut events = Vec::new();
        for file in files {
            let key = record_key(&file.id.source, &file.id.key);
            let base = EventData {
                sink: self.sink_id.clone(),
                source: file.id.source.clone(),
                file_key: file.id.key.clone(),
                generation: file.id.generation,
                path: file.path.clone(),
                ..EventData::default()
            };
            let mut push = |kind: &str, data: EventData| {
                let event = CloudEvent::new(kind, &self.source_uri, &time, data);
                events.push(OutboxEvent {
                    journal_round,
                    recorded_unix_ms,
                    key: key.clone(),
                    payload: event.to_json(),
                });
            };
            let mut changes = file.changes.iter().peekable();
            if let Some(FileChange::Opened) = changes.peek() {
                changes.next();
                push("file.opened", base.clone());
            }
            if !file.ranges.is_empty() {
                push(
                    "range.committed",
                    EventData {
                        ranges: Some(file.ranges.clone()),
                        contiguous_end: Some(file.contiguous_end),
                        ..base.clone()
                    },
                );
            }
            for change in changes {
                match change {
                    FileChange::Opened => push("file.opened", base.clone()),
                    FileChange::Renamed { from } => push(
                        "file.renamed",
                        EventData {
                            from: Some(from.clone()),
                            contiguous_end: Some(file.contiguous_end),
                            ..base.clone()
                        },
                    ),
                    FileChange::Sealed { size, digest } => push(
                        "file.sealed",
                        EventData {
                            size: Some(*size),
                            digest: Some(digest.clone()),
                            ..base.clone()
                        },
                    ),
                    FileChange::Superseded => push("file.superseded", base.clone()),
                }
            }
        }
        events
    }

    /// A round's events are durable: the relay may publish through `last`.
    pub(crate) fn recorded(&self, last: u64, bytes: u64) {
        self.bytes.fetch_add(bytes, Ordering::SeqCst);
        self.durable.fetch_max(last, Ordering::SeqCst);
        self.changed.notify_waiters();
    }
}

/// What an event takes in the outbox, as [`Outbox::recorded`] counts it.
pub(crate) fn stored_len(event: &OutboxEvent) -> u64 {
    (20 + event.key.len() + event.payload.len()) as u64
}

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

/// The record key of a file's events: `["<source>","<file key>"]`, so one
/// file's events land in one partition, in order.
pub fn record_key(source: &str, key: &str) -> Vec<u8> {
    serde_json::to_vec(&(source, key)).unwrap_or_default()
}

/// A CloudEvent in structured mode, as published.
#[derive(Serialize, Deserialize)]
struct CloudEvent {
    specversion: String,
    id: String,
    source: String,
    #[serde(rename = "type")]
    kind: String,
    subject: String,
    time: String,
    datacontenttype: String,
    data: EventData,
}

/// The `data` of every event type; each type fills its own fields.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct EventData {
    sink: String,
    source: String,
    file_key: String,
    generation: u64,
    /// The file's destination path, relative to the sink's root.
    path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ranges: Option<Vec<(u64, u64)>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    contiguous_end: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    from: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    digest: Option<String>,
}

impl CloudEvent {
    fn new(kind: &str, source_uri: &str, time: &str, data: EventData) -> Self {
        let kind = format!("{EVENT_TYPE_PREFIX}{kind}.v1");
        Self {
            specversion: "1.0".into(),
            id: event_id(&kind, &data),
            source: source_uri.into(),
            subject: data.path.clone(),
            kind,
            time: time.into(),
            datacontenttype: "application/json".into(),
            data,
        }
    }

    fn to_json(&self) -> Vec<u8> {
        // Strings, integers and plain structs always serialise.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// A deterministic id: the same change of the same file generation always
/// gets the same id, so a consumer can drop a copy it has seen.
fn event_id(kind: &str, data: &EventData) -> String {
    let mut hasher = blake3::Hasher::new();
    for part in [kind, &data.source, &data.file_key] {
        hasher.update(part.as_bytes());
        hasher.update(&[0]);
    }
    hasher.update(&data.generation.to_be_bytes());
    if let Some(ranges) = &data.ranges {
        for (start, end) in ranges {
            hasher.update(&start.to_be_bytes());
            hasher.update(&end.to_be_bytes());
        }
    }
    if let Some(from) = &data.from {
        // A file renamed back and forth is told apart by how much of it
        // was there at each rename.
        hasher.update(from.as_bytes());
        hasher.update(&[0]);
        hasher.update(data.path.as_bytes());
        hasher.update(&[0]);
        hasher.update(&data.contiguous_end.unwrap_or(0).to_be_bytes());
    }
    if let Some(size) = data.size {
        hasher.update(&size.to_be_bytes());
    }
    let hash = hasher.finalize();
    hash.to_hex()[..32].to_string()
}

/// The startup's correction of the events a journal round cut short by a
/// crash recorded (never published: the relay waits for a round to be
/// durable): ranges withdrawn from `file` leave its range events, and a
/// seal taken back leaves with them. Returns the rewrite to commit, if any.
pub(crate) fn withdraw(
    manifest: &SinkManifest,
    journal_round: u64,
    withdrawn: &[(manifest_db::FileId, u64, u64)],
    unsealed: &[manifest_db::FileId],
    contiguous_end: impl Fn(&manifest_db::FileId) -> u64,
) -> Result<Vec<(u64, Option<OutboxEvent>)>, manifest_db::Error> {
    let mut rewrite = Vec::new();
    let mut after = 0;
    loop {
        let events = manifest.outbox_after(after, 4096, 64 << 20)?;
        let Some((last, _)) = events.last() else {
            return Ok(rewrite);
        };
        after = *last;
        for (seq, mut event) in events {
            if event.journal_round != journal_round {
                continue;
            }
            let Ok(mut cloud) = serde_json::from_slice::<CloudEvent>(&event.payload) else {
                continue;
            };
            let id = manifest_db::FileId {
                source: cloud.data.source.clone(),
                key: cloud.data.file_key.clone(),
                generation: cloud.data.generation,
            };
            let sealed = cloud.kind.ends_with(".file.sealed.v1");
            if sealed && unsealed.contains(&id) {
                rewrite.push((seq, None));
                continue;
            }
            let Some(ranges) = cloud.data.ranges.as_ref() else {
                continue;
            };
            let mut kept = manifest_db::IntervalSet::default();
            for &(start, end) in ranges {
                kept.insert(start, end);
            }
            let mut changed = false;
            for (file, offset, len) in withdrawn {
                if *file == id && kept.covers(*offset, offset + len) {
                    kept.remove(*offset, offset + len);
                    changed = true;
                }
            }
            if !changed {
                continue;
            }
            if kept.ranges().is_empty() {
                rewrite.push((seq, None));
                continue;
            }
            cloud.data.ranges = Some(kept.ranges().to_vec());
            cloud.data.contiguous_end = Some(
                cloud
                    .data
                    .contiguous_end
                    .unwrap_or(0)
                    .min(contiguous_end(&id)),
            );
            cloud.id = event_id(&cloud.kind, &cloud.data);
            event.payload = cloud.to_json();
            rewrite.push((seq, Some(event)));
        }
    }
}

/// The outbox, shared.
pub type SharedOutbox = Arc<Outbox>;

#[cfg(test)]
mod tests {
    use super::*;
    use manifest_db::{FileId, SinkCommit};

    fn file() -> FileId {
        FileId {
            source: "hutch".into(),
            key: "run/a.xtc2.inprogress".into(),
            generation: 1,
        }
    }

    fn commit(
        ranges: Vec<(u64, u64)>,
        contiguous_end: u64,
        changes: Vec<FileChange>,
    ) -> FileCommit {
        FileCommit {
            id: file(),
            path: "hutch/run/a.xtc2.inprogress".into(),
            ranges,
            contiguous_end,
            changes,
            received: None,
            inode: None,
            sealed: None,
        }
    }

    fn parse(event: &OutboxEvent) -> serde_json::Value {
        serde_json::from_slice(&event.payload).unwrap()
    }

    #[test]
    fn a_round_tells_each_change_in_order_with_stable_ids() {
        let dir = crate::test_support::scratch("outbox-events");
        let manifest = SinkManifest::open(&dir).unwrap();
        let outbox = Outbox::open(manifest, &EventsConfig::default()).unwrap();
        let round = [commit(
            vec![(0, 10)],
            10,
            vec![
                FileChange::Opened,
                FileChange::Renamed {
                    from: "hutch/run/a.xtc2.inprogress".into(),
                },
                FileChange::Sealed {
                    size: 10,
                    digest: "crc64nvme:0000000000000001".into(),
                },
            ],
        )];
        let at = UNIX_EPOCH + Duration::from_millis(1_795_000_000_123);
        let events = outbox.events_of(&round, at, 3);
        let kinds: Vec<_> = events
            .iter()
            .map(|e| parse(e)["type"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            kinds,
            [
                "org.tailflight.file.opened.v1",
                "org.tailflight.range.committed.v1",
                "org.tailflight.file.renamed.v1",
                "org.tailflight.file.sealed.v1"
            ]
        );
        let committed = parse(&events[1]);
        assert_eq!(committed["data"]["ranges"], serde_json::json!([[0, 10]]));
        assert_eq!(committed["time"], "2026-11-18T11:06:40.123Z");
        assert_eq!(events[1].key, br#"["hutch","run/a.xtc2.inprogress"]"#);
        // The same change made again (after a crash) is the same event.
        assert_eq!(
            outbox.events_of(&round, at, 3)[1].payload,
            events[1].payload
        );
        let ids: std::collections::HashSet<_> =
            events.iter().map(|e| parse(e)["id"].clone()).collect();
        assert_eq!(ids.len(), 4);
    }

    #[test]
    fn a_withdrawn_range_and_seal_leave_the_unpublished_events() {
        let dir = crate::test_support::scratch("outbox-withdraw");
        let manifest = SinkManifest::open(&dir).unwrap();
        let outbox = Outbox::open(manifest.clone(), &EventsConfig::default()).unwrap();
        let at = SystemTime::now();
        let earlier = outbox.events_of(
            &[commit(vec![(0, 10)], 10, vec![FileChange::Opened])],
            at,
            6,
        );
        let cut_short = outbox.events_of(
            &[commit(
                vec![(10, 30)],
                30,
                vec![FileChange::Sealed {
                    size: 30,
                    digest: "crc64nvme:0000000000000002".into(),
                }],
            )],
            at,
            7,
        );
        for events in [earlier, cut_short] {
            manifest
                .commit(&SinkCommit {
                    outbox: events,
                    ..SinkCommit::default()
                })
                .unwrap();
        }
        // Round 7's range [20, 30) never reached the journal: withdrawn,
        // and the seal with it.
        let rewrite = withdraw(&manifest, 7, &[(file(), 20, 10)], &[file()], |_| 20).unwrap();
        manifest
            .commit(&SinkCommit {
                outbox_rewrite: rewrite,
                ..SinkCommit::default()
            })
            .unwrap();
        let left: Vec<_> = manifest
            .outbox_after(0, 10, usize::MAX)
            .unwrap()
            .into_iter()
            .map(|(_, e)| parse(&e))
            .collect();
        let kinds: Vec<_> = left.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "org.tailflight.file.opened.v1",
                "org.tailflight.range.committed.v1",
                "org.tailflight.range.committed.v1"
            ]
        );
        assert_eq!(left[1]["data"]["ranges"], serde_json::json!([[0, 10]]));
        assert_eq!(left[2]["data"]["ranges"], serde_json::json!([[10, 20]]));
        assert_eq!(left[2]["data"]["contiguous_end"], 20);
    }
}
