//! A topic and an outbox in memory for the relay's model tests: the
//! brokers' side keeps records with their transaction's fate (committed,
//! aborted, or still open), fences producers by epoch as a transactional
//! id does, and takes faults the tests inject; the outbox checks, at every
//! withdrawal, that the topic holds every event withdrawn.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sink::SinkError;
use sink::outbox::{PendingEvent, RelayPhases, RelayReport};

use crate::brokers::{Brokers, Check, EventLog, Publisher, Reader, Written};

pub(crate) const PARTITIONS: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Open,
    Committed,
    Aborted,
}

#[derive(Clone, Debug)]
struct Record {
    /// None for a fence's record.
    seq: Option<u64>,
    relay: String,
    epoch: u64,
    fate: Fate,
}

/// Faults the next calls meet.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    /// The next transaction is acknowledged, but its markers are lost: its
    /// records end aborted (a broker restarted as it wrote them).
    pub(crate) take_back_next: bool,
    /// The next transaction fails before its commit.
    pub(crate) fail_next: bool,
    /// The next read-backs find their partition not stable yet.
    pub(crate) unstable_reads: u32,
}

#[derive(Debug, Default)]
struct TopicState {
    partitions: Vec<Vec<Record>>,
    /// Events the relay has read back committed (a read-back that found
    /// its transaction's last records, or a start's scan): the only ones it
    /// may withdraw from the outbox.
    read_back: BTreeSet<u64>,
    /// The epoch of the relay's transactional id: a producer of an older
    /// one is fenced.
    epoch: u64,
    faults: Faults,
}

/// The topic, shared by the model's clients and the test.
#[derive(Debug, Default)]
pub(crate) struct Topic {
    state: Mutex<TopicState>,
}

impl Topic {
    pub(crate) fn new() -> Arc<Self> {
        let topic = Self::default();
        topic.lock().partitions = vec![Vec::new(); PARTITIONS];
        Arc::new(topic)
    }

    fn lock(&self) -> MutexGuard<'_, TopicState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn faults(&self, inject: impl FnOnce(&mut Faults)) {
        inject(&mut self.lock().faults);
    }

    /// The sequence numbers of `relay`'s committed records, sorted: what a
    /// read_committed consumer of every partition gets.
    pub(crate) fn committed(&self, relay: &str) -> Vec<u64> {
        let state = self.lock();
        let mut seqs: Vec<u64> = state
            .partitions
            .iter()
            .flatten()
            .filter(|r| r.relay == relay && r.fate == Fate::Committed)
            .filter_map(|r| r.seq)
            .collect();
        seqs.sort_unstable();
        seqs
    }

    /// Commits records of `relay` as an earlier run of it did (one whose
    /// withdrawal from the outbox was lost).
    pub(crate) fn commit_directly(&self, relay: &str, seqs: impl IntoIterator<Item = u64>) {
        let mut state = self.lock();
        let epoch = state.epoch;
        for seq in seqs {
            let partition = partition_of(&key_of(seq));
            state.partitions[partition].push(Record {
                seq: Some(seq),
                relay: relay.into(),
                epoch,
                fate: Fate::Committed,
            });
        }
    }

    /// The events the relay has read back committed.
    pub(crate) fn read_back(&self) -> BTreeSet<u64> {
        self.lock().read_back.clone()
    }

    /// Read-backs still to find their partition not stable.
    pub(crate) fn unstable_reads_left(&self) -> u32 {
        self.lock().faults.unstable_reads
    }

    /// Another producer with the relay's transactional id starts: the
    /// relay's client is fenced.
    pub(crate) fn fence_by_another(&self) {
        self.lock().epoch += 1;
    }
}

fn key_of(seq: u64) -> Vec<u8> {
    format!("file-{}", seq % 7).into_bytes()
}

fn partition_of(key: &[u8]) -> usize {
    key.iter().map(|&b| b as usize).sum::<usize>() % PARTITIONS
}

pub(crate) struct ModelBrokers {
    pub(crate) topic: Arc<Topic>,
    pub(crate) identity: String,
}

impl Brokers for ModelBrokers {
    type Publisher = ModelClient;
    type Reader = ModelReader;

    fn describe(&self) -> String {
        "the model's brokers".into()
    }

    fn connect(&mut self) -> anyhow::Result<(ModelClient, ModelReader)> {
        Ok((
            ModelClient {
                topic: self.topic.clone(),
                identity: self.identity.clone(),
                epoch: 0,
            },
            ModelReader {
                topic: self.topic.clone(),
                identity: self.identity.clone(),
            },
        ))
    }
}

pub(crate) struct ModelClient {
    topic: Arc<Topic>,
    identity: String,
    epoch: u64,
}

impl ModelClient {
    fn end_open(&self, state: &mut TopicState) {
        for record in state.partitions.iter_mut().flatten() {
            if record.relay == self.identity && record.fate == Fate::Open {
                record.fate = Fate::Aborted;
            }
        }
    }
}

impl Publisher for ModelClient {
    fn start(&mut self, _with_group: bool) -> anyhow::Result<BTreeMap<i32, i64>> {
        let mut state = self.topic.lock();
        state.epoch += 1;
        self.epoch = state.epoch;
        self.end_open(&mut state);
        let mut fenced = BTreeMap::new();
        for (partition, records) in state.partitions.iter_mut().enumerate() {
            fenced.insert(partition as i32, records.len() as i64);
            records.push(Record {
                seq: None,
                relay: self.identity.clone(),
                epoch: self.epoch,
                fate: Fate::Aborted,
            });
        }
        Ok(fenced)
    }

    fn read_position(&self) -> anyhow::Result<u64> {
        Ok(0)
    }

    fn scan(
        &mut self,
        from: &BTreeMap<i32, i64>,
        fenced: &BTreeMap<i32, i64>,
    ) -> anyhow::Result<BTreeSet<u64>> {
        let mut state = self.topic.lock();
        let mut found = BTreeSet::new();
        for (&partition, &fence) in fenced {
            let start = from.get(&partition).copied().unwrap_or(0).max(0) as usize;
            let records = &state.partitions[partition as usize];
            for record in records.iter().take(fence as usize).skip(start) {
                if record.relay == self.identity && record.fate == Fate::Committed {
                    found.extend(record.seq);
                }
            }
        }
        state.read_back.extend(found.iter().copied());
        Ok(found)
    }

    fn transaction(
        &mut self,
        events: &[PendingEvent],
        _stop: &Arc<AtomicBool>,
    ) -> anyhow::Result<(RelayPhases, BTreeMap<i32, Written>)> {
        let mut state = self.topic.lock();
        if state.epoch != self.epoch {
            anyhow::bail!(
                "fenced: a newer producer (epoch {}) holds this transactional id",
                state.epoch
            );
        }
        let failing = std::mem::take(&mut state.faults.fail_next);
        let taken_back = !failing && std::mem::take(&mut state.faults.take_back_next);
        let mut written = BTreeMap::new();
        for event in events {
            let partition = partition_of(&event.key);
            let records = &mut state.partitions[partition];
            written.insert(
                partition as i32,
                Written {
                    offset: records.len() as i64,
                    seq: event.seq,
                },
            );
            records.push(Record {
                seq: Some(event.seq),
                relay: self.identity.clone(),
                epoch: self.epoch,
                fate: Fate::Open,
            });
        }
        if failing {
            anyhow::bail!("the model's brokers refused the transaction");
        }
        let fate = if taken_back {
            Fate::Aborted
        } else {
            Fate::Committed
        };
        for record in state.partitions.iter_mut().flatten() {
            if record.relay == self.identity
                && record.epoch == self.epoch
                && record.fate == Fate::Open
            {
                record.fate = fate;
            }
        }
        Ok((RelayPhases::default(), written))
    }

    fn abort(&self) -> anyhow::Result<()> {
        let mut state = self.topic.lock();
        for record in state.partitions.iter_mut().flatten() {
            if record.relay == self.identity
                && record.epoch == self.epoch
                && record.fate == Fate::Open
            {
                record.fate = Fate::Aborted;
            }
        }
        Ok(())
    }
}

pub(crate) struct ModelReader {
    topic: Arc<Topic>,
    identity: String,
}

impl Reader for ModelReader {
    fn check(&mut self, written: &BTreeMap<i32, Written>) -> anyhow::Result<Check> {
        let mut state = self.topic.lock();
        if state.faults.unstable_reads > 0 {
            state.faults.unstable_reads -= 1;
            if let Some((&partition, last)) = written.iter().next() {
                return Ok(Check::NotYetStable {
                    partition,
                    offset: last.offset,
                });
            }
        }
        for (&partition, last) in written {
            let held = state.partitions[partition as usize]
                .get(last.offset as usize)
                .is_some_and(|r| {
                    r.relay == self.identity && r.fate == Fate::Committed && r.seq == Some(last.seq)
                });
            if !held {
                return Ok(Check::TakenBack {
                    partition,
                    offset: last.offset,
                    seq: last.seq,
                });
            }
        }
        // A partition's last record proves the committed records before it
        // in that partition.
        let mut proven = Vec::new();
        for (&partition, last) in written {
            for record in &state.partitions[partition as usize][..=last.offset as usize] {
                if record.relay == self.identity && record.fate == Fate::Committed {
                    proven.extend(record.seq);
                }
            }
        }
        state.read_back.extend(proven);
        Ok(Check::Held)
    }
}

#[derive(Default)]
struct LogState {
    events: BTreeMap<u64, PendingEvent>,
    durable: u64,
    published: u64,
    mark: Option<Vec<u8>>,
    report: RelayReport,
    /// Events withdrawn that the topic did not hold committed then, or
    /// that the relay had not read back.
    withdrawn_unheld: Vec<u64>,
}

/// The outbox in memory.
pub(crate) struct MemoryLog {
    state: Mutex<LogState>,
    changed: Condvar,
    topic: Arc<Topic>,
    relay: String,
}

impl MemoryLog {
    pub(crate) fn new(topic: Arc<Topic>, relay: &str) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::default(),
            changed: Condvar::new(),
            topic,
            relay: relay.into(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records `count` new events, durable at once.
    pub(crate) fn append(&self, count: u64) {
        let mut state = self.lock();
        for _ in 0..count {
            state.durable += 1;
            let seq = state.durable;
            state.events.insert(
                seq,
                PendingEvent {
                    seq,
                    key: key_of(seq),
                    payload: format!("event {seq}").into_bytes(),
                    recorded_unix_ms: 0,
                },
            );
        }
        self.changed.notify_all();
    }

    /// `count` numbers that no event holds (withdrawn events).
    pub(crate) fn skip(&self, count: u64) {
        self.lock().durable += count;
        self.changed.notify_all();
    }

    pub(crate) fn set_mark(&self, mark: Vec<u8>) {
        self.lock().mark = Some(mark);
    }

    pub(crate) fn relay_report(&self) -> RelayReport {
        self.lock().report.clone()
    }

    pub(crate) fn withdrawn_unheld(&self) -> Vec<u64> {
        self.lock().withdrawn_unheld.clone()
    }

    pub(crate) fn pending(&self) -> usize {
        self.lock().events.len()
    }
}

impl EventLog for MemoryLog {
    fn sink_id(&self) -> &str {
        "model"
    }

    fn durable_through(&self) -> u64 {
        self.lock().durable
    }

    fn published_through(&self) -> u64 {
        self.lock().published
    }

    fn wait_beyond(&self, seq: u64, timeout: Duration) {
        let until = Instant::now() + timeout;
        let mut state = self.lock();
        while state.durable <= seq {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            state = match self.changed.wait_timeout(state, left) {
                Ok((state, _)) => state,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    fn read(
        &self,
        after: u64,
        limit: usize,
        _byte_limit: usize,
    ) -> Result<Vec<PendingEvent>, SinkError> {
        let state = self.lock();
        if after >= state.durable {
            return Ok(Vec::new());
        }
        Ok(state
            .events
            .range(after + 1..=state.durable)
            .take(limit)
            .map(|(_, event)| event.clone())
            .collect())
    }

    fn published(&self, through: u64, mark: Option<&[u8]>, _sync: bool) -> Result<(), SinkError> {
        let committed: BTreeSet<u64> = self.topic.committed(&self.relay).into_iter().collect();
        let read_back = self.topic.read_back();
        let mut state = self.lock();
        let through = through.min(state.durable);
        let withdrawn: Vec<u64> = state
            .events
            .range(..=through)
            .map(|(&seq, _)| seq)
            .collect();
        for seq in withdrawn {
            if !committed.contains(&seq) || !read_back.contains(&seq) {
                state.withdrawn_unheld.push(seq);
            }
            state.events.remove(&seq);
        }
        state.published = state.published.max(through);
        if let Some(mark) = mark {
            state.mark = Some(mark.to_vec());
        }
        Ok(())
    }

    fn mark(&self) -> Result<Option<Vec<u8>>, SinkError> {
        Ok(self.lock().mark.clone())
    }

    fn report(&self, update: &mut dyn FnMut(&mut RelayReport)) {
        update(&mut self.lock().report);
    }

    fn waiting_for_brokers(&self, _waiting: bool) {}

    fn depth(&self) -> (u64, u64) {
        let state = self.lock();
        (state.durable - state.published, 0)
    }
}
