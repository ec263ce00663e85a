//! The relay's Kafka clients: one transactional producer with the consumer
//! that reads the relay's records back at a start, the consumer that reads
//! back what the brokers acknowledged while publishing, and every
//! librdkafka call the relay makes. Each method blocks; the relay runs them on a
//! [`crate::worker::Worker`] so none can hold it up for good.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use rdkafka::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerGroupMetadata};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use sink::outbox::{CLOUDEVENTS_CONTENT_TYPE, PendingEvent, RelayPhases};

use crate::brokers::{EventLog, Publisher, Reader};
use crate::position::{Check, RELAY_HEADER, SEQ_HEADER, Written};

/// How long one librdkafka call may block before it counts as failed.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a transaction may take from its first call to its commit,
/// retries of the commit included.
pub const TRANSACTION_BUDGET: Duration = Duration::from_secs(30);
/// The header of the records the start-up fence writes and aborts: no
/// read_committed consumer ever sees them.
pub const CONTROL_HEADER: &str = "tailflight-control";
/// How long the start waits for the fence's abort markers to be written.
const FENCE_PATIENCE: Duration = Duration::from_secs(5);
/// How long reading a record back waits for its partition's stable
/// offset to pass it before it says it is not stable yet.
const STABLE_PATIENCE: Duration = Duration::from_millis(250);
/// The delivery opaque of the fence's records (an event's is its sequence
/// number, never 0).
const FENCE_OPAQUE: usize = 0;

/// Hears librdkafka's errors (brokers down, authentication failed) as
/// they happen, while a call may still be waiting out its timeout, and
/// puts them in `status` at once; keeps the last failed delivery, which a
/// failed commit only counts; and the last record delivered to each
/// partition, which the relay reads back.
pub struct RelayContext {
    log: Arc<dyn EventLog>,
    /// This client's number, and the current client's: an abandoned client
    /// (fenced by its successor, so it fails) does not speak for the relay.
    generation: u64,
    current: Arc<AtomicU64>,
    pub failed_delivery: std::sync::Mutex<Option<String>>,
    pub delivered: std::sync::Mutex<BTreeMap<i32, Written>>,
    /// Delivery reports served, failed ones included.
    pub reports: AtomicU64,
}

impl RelayContext {
    /// The context of client number `generation`; `current` is the
    /// relay's current client's number.
    pub fn new(log: Arc<dyn EventLog>, generation: u64, current: Arc<AtomicU64>) -> Self {
        Self {
            log,
            generation,
            current,
            failed_delivery: std::sync::Mutex::new(None),
            delivered: std::sync::Mutex::new(BTreeMap::new()),
            reports: AtomicU64::new(0),
        }
    }
}

impl ClientContext for RelayContext {
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!(%error, reason, generation = self.generation, "librdkafka reports an error");
        if self.current.load(Ordering::SeqCst) != self.generation {
            return;
        }
        self.log.report(&mut |report| {
            report.state = "failing".into();
            report.error = Some(format!("{error}: {reason}"));
        });
    }
}

impl ProducerContext for RelayContext {
    /// The event's outbox sequence number (0 for the fence's records).
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, seq: Self::DeliveryOpaque) {
        use rdkafka::message::Message;
        match result {
            Ok(message) => {
                let written = Written {
                    offset: message.offset(),
                    seq: seq as u64,
                };
                self.delivered
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(message.partition())
                    .and_modify(|last| {
                        if written.offset > last.offset {
                            *last = written;
                        }
                    })
                    .or_insert(written);
            }
            Err((error, message)) => {
                let failed = format!(
                    "a record to {}/{} was not delivered: {error}",
                    message.topic(),
                    message.partition()
                );
                *self
                    .failed_delivery
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = Some(failed);
            }
        }
        self.reports.fetch_add(1, Ordering::SeqCst);
    }
}

pub type Transactional = ThreadedProducer<RelayContext>;

pub struct Client {
    pub producer: Transactional,
    pub consumer: BaseConsumer,
    pub topic: String,
    /// `tailflight-relay.<sink id>`: the transactional id, the value of
    /// the records' relay header, and the group where a relay before the
    /// headers kept its position.
    pub identity: String,
    /// Where the brokers are, for errors.
    pub brokers: String,
}

impl Client {
    /// Makes the producer's transactions ready and ends whatever an earlier
    /// producer with this id left unresolved. Returns the offset of the
    /// fence's record in each partition: every record an earlier producer
    /// of this relay wrote is before it.
    ///
    /// `init_transactions` fences an earlier producer and aborts the
    /// transaction it left open. It does not end records a transaction
    /// left without markers: a broker shutting down skips the markers of
    /// partitions with no leader at that moment, even for a transaction it
    /// reports committed, and the next marker of this producer id in that
    /// partition decides their fate. So the start writes one record to
    /// every partition, and aborts: whatever was left without
    /// markers is ended as aborted before the relay reads its records back.
    /// Those events are then published again.
    ///
    /// `with_group`: the fence also covers the consumer group where a relay
    /// before the record headers kept its position, which is then read
    /// (only a relay without a mark reads it).
    pub fn start(&mut self, with_group: bool) -> anyhow::Result<BTreeMap<i32, i64>> {
        let brokers = &self.brokers;
        self.producer
            .init_transactions(CALL_TIMEOUT)
            .with_context(|| format!("starting transactions with the brokers {brokers}"))?;
        let partitions = self.check_topic()?;
        self.fence(partitions, with_group)
    }

    /// Fails clearly if the topic does not exist and the brokers do not
    /// create it, or if this client may not see it. Returns its partitions.
    fn check_topic(&self) -> anyhow::Result<i32> {
        let topic = &self.topic;
        let metadata = self
            .producer
            .client()
            .fetch_metadata(Some(topic), CALL_TIMEOUT)
            .with_context(|| format!("reading the metadata of topic {topic:?}"))?;
        let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) else {
            anyhow::bail!("the brokers did not describe topic {topic:?}");
        };
        if let Some(error) = found.error() {
            let code = RDKafkaErrorCode::from(error);
            anyhow::bail!(match code {
                RDKafkaErrorCode::UnknownTopicOrPartition => format!(
                    "topic {topic:?} does not exist (yet): brokers that create topics \
                     make it within seconds; with auto.create.topics.enable=false, create it"
                ),
                RDKafkaErrorCode::TopicAuthorizationFailed => {
                    format!("not authorised to use topic {topic:?}")
                }
                other => format!("topic {topic:?}: {other}"),
            });
        }
        if found.partitions().is_empty() {
            anyhow::bail!("topic {topic:?} has no partitions yet");
        }
        Ok(found.partitions().len() as i32)
    }

    /// Writes a control record to each of the topic's `partitions` (and,
    /// `with_group`, the relay's group), and aborts (see [`Self::start`]).
    fn fence(&mut self, partitions: i32, with_group: bool) -> anyhow::Result<BTreeMap<i32, i64>> {
        let doing = |what: &str| format!("{what} (the start-up fence of topic {:?})", self.topic);
        self.take_delivered();
        let reported = self.reports();
        self.producer
            .begin_transaction()
            .with_context(|| doing("beginning a transaction"))?;
        for partition in 0..partitions {
            let headers = OwnedHeaders::new().insert(Header {
                key: CONTROL_HEADER,
                value: Some("fence"),
            });
            let empty: &[u8] = &[];
            // Keyed: a compacted topic refuses records without a key.
            let record: BaseRecord<'_, str, [u8], usize> =
                BaseRecord::with_opaque_to(&self.topic, FENCE_OPAQUE)
                    .partition(partition)
                    .key(CONTROL_HEADER)
                    .payload(empty)
                    .headers(headers);
            self.send(record)
                .with_context(|| doing(&format!("writing to partition {partition}")))?;
        }
        if with_group {
            let group = self
                .group()
                .with_context(|| doing("adding the relay's group"))?;
            let mut position = TopicPartitionList::new();
            position
                .add_partition_offset(&self.topic, 0, Offset::Offset(0))
                .with_context(|| doing("adding the relay's group"))?;
            self.producer
                .send_offsets_to_transaction(&position, &group, CALL_TIMEOUT)
                .with_context(|| doing("adding the relay's group"))?;
        }
        self.wait_delivered(None, reported + partitions as u64)
            .with_context(|| doing("delivering"))?;
        // A partition the fence did not reach is not fenced.
        if let Some(failed) = self.take_failed_delivery() {
            anyhow::bail!(doing(&failed));
        }
        let fenced: BTreeMap<i32, i64> = self
            .take_delivered()
            .into_iter()
            .map(|(partition, written)| (partition, written.offset))
            .collect();
        if fenced.len() != partitions as usize {
            anyhow::bail!(doing(&format!(
                "{} of {partitions} partitions reported the fence's record",
                fenced.len()
            )));
        }
        self.producer
            .abort_transaction(CALL_TIMEOUT)
            .with_context(|| doing("aborting"))?;
        Ok(fenced)
    }

    fn group(&self) -> anyhow::Result<ConsumerGroupMetadata> {
        self.consumer
            .group_metadata()
            .context("the position reader has no group metadata")
    }

    /// The position a relay before the record headers committed to its
    /// consumer group with each transaction (0: none). Reads only stable offsets: while a transaction's
    /// markers are outstanding the brokers answer "try again", and after
    /// [`CALL_TIMEOUT`] this fails.
    pub fn read_position(&self) -> anyhow::Result<u64> {
        let topic = &self.topic;
        let mut wanted = TopicPartitionList::new();
        wanted.add_partition(topic, 0);
        let committed = self
            .consumer
            .committed_offsets(wanted, CALL_TIMEOUT)
            .with_context(|| format!("reading the relay's position (group {})", self.identity))?;
        let Some(element) = committed.find_partition(topic, 0) else {
            anyhow::bail!(
                "the brokers did not answer for the relay's position (group {})",
                self.identity
            );
        };
        element
            .error()
            .with_context(|| format!("reading the relay's position (group {})", self.identity))?;
        // No offset committed yet: nothing was ever published.
        Ok(match element.offset() {
            Offset::Offset(next) if next > 0 => next as u64 - 1,
            _ => 0,
        })
    }

    /// Publishes `events` in one transaction, and says where its time went
    /// and the last record it wrote to each partition.
    pub fn transaction(
        &mut self,
        events: &[PendingEvent],
        stop: &Arc<AtomicBool>,
    ) -> anyhow::Result<(RelayPhases, BTreeMap<i32, Written>)> {
        self.take_failed_delivery();
        self.take_delivered();
        let reported = self.reports();
        let first = events.first().map_or(0, |e| e.seq);
        let last = events.last().map_or(0, |e| e.seq);
        let doing =
            |what: &str| format!("{what} (events {first}..={last} to topic {:?})", self.topic);
        let started = Instant::now();
        let mut phases = RelayPhases::default();
        let mut lap = Lap(started);
        self.producer
            .begin_transaction()
            .with_context(|| doing("beginning a transaction"))?;
        phases.begin = lap.next();
        for event in events {
            let seq = event.seq.to_string();
            let headers = OwnedHeaders::new_with_capacity(3)
                .insert(Header {
                    key: "content-type",
                    value: Some(CLOUDEVENTS_CONTENT_TYPE),
                })
                .insert(Header {
                    key: RELAY_HEADER,
                    value: Some(&self.identity),
                })
                .insert(Header {
                    key: SEQ_HEADER,
                    value: Some(&seq),
                });
            let record = BaseRecord::with_opaque_to(&self.topic, event.seq as usize)
                .key(&event.key)
                .payload(&event.payload)
                .headers(headers)
                .timestamp(event.recorded_unix_ms as i64);
            self.send(record)
                .with_context(|| doing("producing an event"))?;
        }
        phases.produce = lap.next();
        // The crate's commit flushes first, and its flush waits for events
        // in 100 ms polls that only the producer's own thread is served
        // by: each publication took 100 ms more than it needed. Waiting
        // here for the messages to be delivered leaves it nothing to wait for.
        self.wait_delivered(Some(stop), reported + events.len() as u64)
            .with_context(|| doing("delivering"))?;
        phases.deliver = lap.next();
        loop {
            if stop.load(Ordering::SeqCst) {
                anyhow::bail!(doing("the sink is stopping: not committing"));
            }
            match self.producer.commit_transaction(CALL_TIMEOUT) {
                Ok(()) => {
                    phases.commit = lap.next();
                    return Ok((phases, self.take_delivered()));
                }
                // Retriable: the outcome is unknown; committing again is
                // how librdkafka finds out.
                Err(KafkaError::Transaction(e))
                    if e.is_retriable() && started.elapsed() < TRANSACTION_BUDGET =>
                {
                    tracing::debug!(error = %e, "committing the transaction again");
                }
                Err(error) => {
                    // The commit only counts failed deliveries: name one.
                    let failed = self
                        .take_failed_delivery()
                        .map_or_else(String::new, |failed| format!(" ({failed})"));
                    return Err(error)
                        .with_context(|| doing(&format!("committing the transaction{failed}")));
                }
            }
        }
    }

    /// The outbox sequence numbers of this relay's committed records in
    /// the topic, from `from`'s offset in each partition (a partition it
    /// does not name: from its start) up to the start-up fence's record
    /// (`fenced`), which every earlier record of this relay precedes.
    /// Fails if another producer's open transaction holds a partition's
    /// stable offset before the fence (its records, and any of ours after
    /// them, cannot be read yet).
    pub fn scan(
        &mut self,
        from: &BTreeMap<i32, i64>,
        fenced: &BTreeMap<i32, i64>,
    ) -> anyhow::Result<BTreeSet<u64>> {
        let topic = self.topic.clone();
        let doing = |what: &str| format!("{what} (reading this relay's records in {topic:?} back)");
        let mut until = Instant::now() + CALL_TIMEOUT;
        let mut assignment = TopicPartitionList::new();
        let mut open = BTreeSet::new();
        for (&partition, &fence) in fenced {
            // The fence's abort markers are written after the brokers
            // answered the abort.
            let (low, stable) = stable_past(
                &self.consumer,
                &topic,
                partition,
                fence,
                FENCE_PATIENCE,
                until,
            )
            .with_context(|| doing(&format!("the offsets of partition {partition}")))?;
            if stable <= fence {
                anyhow::bail!(doing(&format!(
                    "partition {partition} is stable only up to offset {stable}, before this \
                     relay's fence at {fence}, {FENCE_PATIENCE:?} after the fence's abort: a \
                     transaction of another producer is open there"
                )));
            }
            let start = from.get(&partition).copied().unwrap_or(low).max(low);
            if start < stable {
                assignment
                    .add_partition_offset(&topic, partition, Offset::Offset(start))
                    .with_context(|| doing("assigning"))?;
                open.insert(partition);
            }
        }
        let mut found = BTreeSet::new();
        if open.is_empty() {
            return Ok(found);
        }
        self.consumer
            .assign(&assignment)
            .with_context(|| doing("assigning"))?;
        // Other producers' records since the mark are read too: the read
        // may take long, but fails only once it stops moving.
        until = Instant::now() + CALL_TIMEOUT;
        while !open.is_empty() {
            if Instant::now() >= until {
                anyhow::bail!(doing(&format!(
                    "partitions {open:?} gave nothing for {CALL_TIMEOUT:?} before their end"
                )));
            }
            match self.consumer.poll(Duration::from_millis(100)) {
                None => {}
                // Brokers going away and coming back: the deadline decides.
                Some(Err(KafkaError::MessageConsumption(code))) => {
                    tracing::debug!(%code, "reading this relay's records back");
                }
                Some(Ok(message)) => {
                    until = Instant::now() + CALL_TIMEOUT;
                    if let Some(seq) = seq_of(&self.identity, &message) {
                        found.insert(seq);
                    }
                    let partition = message.partition();
                    if fenced
                        .get(&partition)
                        .is_some_and(|fence| message.offset() > *fence)
                    {
                        open.remove(&partition);
                    }
                }
                // At the stable offset, which is past the fence.
                Some(Err(KafkaError::PartitionEOF(partition))) => {
                    open.remove(&partition);
                }
                Some(Err(error)) => return Err(error).with_context(|| doing("reading")),
            }
        }
        self.consumer
            .unassign()
            .with_context(|| doing("ending the read"))?;
        Ok(found)
    }

    /// Aborts the transaction under way; its records stay invisible to
    /// read_committed consumers.
    pub fn abort(&self) -> anyhow::Result<()> {
        self.producer
            .abort_transaction(CALL_TIMEOUT)
            .context("aborting a failed transaction")
    }

    /// The last record delivered to each partition since the last call.
    fn take_delivered(&self) -> BTreeMap<i32, Written> {
        std::mem::take(
            &mut *self
                .producer
                .context()
                .delivered
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        )
    }

    /// Delivery reports served so far.
    fn reports(&self) -> u64 {
        self.producer.context().reports.load(Ordering::SeqCst)
    }

    fn take_failed_delivery(&self) -> Option<String> {
        self.producer
            .context()
            .failed_delivery
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// Queues `record`, letting librdkafka's queue drain while it is full.
    fn send<K, P>(&self, mut record: BaseRecord<'_, K, P, usize>) -> anyhow::Result<()>
    where
        K: rdkafka::message::ToBytes + ?Sized,
        P: rdkafka::message::ToBytes + ?Sized,
    {
        let until = Instant::now() + CALL_TIMEOUT;
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                    if Instant::now() < until =>
                {
                    record = back;
                    self.producer.poll(Duration::from_millis(10));
                }
                Err((error, _)) => return Err(error.into()),
            }
        }
    }

    /// Waits until librdkafka holds no record and `reports` delivery
    /// reports were served: its count drops before the report reaches us.
    fn wait_delivered(&self, stop: Option<&Arc<AtomicBool>>, reports: u64) -> anyhow::Result<()> {
        let until = Instant::now() + CALL_TIMEOUT;
        while self.producer.in_flight_count() > 0 || self.reports() < reports {
            if stop.is_some_and(|stop| stop.load(Ordering::SeqCst)) {
                anyhow::bail!("the sink is stopping");
            }
            if Instant::now() >= until {
                anyhow::bail!(
                    "{} records not delivered within {CALL_TIMEOUT:?}",
                    self.producer.in_flight_count()
                );
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        Ok(())
    }
}

impl Publisher for Client {
    fn start(&mut self, with_group: bool) -> anyhow::Result<BTreeMap<i32, i64>> {
        Client::start(self, with_group)
    }

    fn read_position(&self) -> anyhow::Result<u64> {
        Client::read_position(self)
    }

    fn scan(
        &mut self,
        from: &BTreeMap<i32, i64>,
        fenced: &BTreeMap<i32, i64>,
    ) -> anyhow::Result<BTreeSet<u64>> {
        Client::scan(self, from, fenced)
    }

    fn transaction(
        &mut self,
        events: &[PendingEvent],
        stop: &Arc<AtomicBool>,
    ) -> anyhow::Result<(RelayPhases, BTreeMap<i32, Written>)> {
        Client::transaction(self, events, stop)
    }

    fn abort(&self) -> anyhow::Result<()> {
        Client::abort(self)
    }
}

/// The consumer that reads back, beside publishing, the last records of
/// the transactions the brokers acknowledged: on a thread of its own, so a
/// read-back never holds up the next transaction.
pub struct ReadBack {
    pub consumer: BaseConsumer,
    pub topic: String,
    /// The value of the relay header on this relay's records.
    pub identity: String,
}

impl ReadBack {
    /// Reads back the last record this relay wrote to each partition
    /// (`written`). Within one producer's run every transaction before it
    /// committed, so a record a read_committed reader sees proves the
    /// records before it in its partition: a transaction whose markers a
    /// broker skipped there took the fate of the next marker, a commit.
    pub fn check(&mut self, written: &BTreeMap<i32, Written>) -> anyhow::Result<Check> {
        let topic = self.topic.clone();
        let doing = |what: &str| format!("{what} (reading this relay's last records in {topic:?})");
        let until = Instant::now() + CALL_TIMEOUT;
        let mut assignment = TopicPartitionList::new();
        for (&partition, last) in written {
            // The coordinator writes the markers after it acknowledged the
            // commit: usually within milliseconds.
            let (_, stable) = stable_past(
                &self.consumer,
                &topic,
                partition,
                last.offset,
                STABLE_PATIENCE,
                until,
            )
            .with_context(|| doing(&format!("the offsets of partition {partition}")))?;
            if stable <= last.offset {
                return Ok(Check::NotYetStable {
                    partition,
                    offset: last.offset,
                });
            }
            assignment
                .add_partition_offset(&topic, partition, Offset::Offset(last.offset))
                .with_context(|| doing("assigning"))?;
        }
        self.consumer
            .assign(&assignment)
            .with_context(|| doing("assigning"))?;
        let mut open: BTreeSet<i32> = written.keys().copied().collect();
        let mut outcome = Check::Held;
        while !open.is_empty() && outcome == Check::Held {
            if Instant::now() >= until {
                anyhow::bail!(doing(&format!(
                    "partitions {open:?} did not answer within {CALL_TIMEOUT:?}"
                )));
            }
            let (partition, seen) = match self.consumer.poll(Duration::from_millis(100)) {
                None => continue,
                // Brokers going away and coming back: the deadline decides.
                Some(Err(KafkaError::MessageConsumption(code))) => {
                    tracing::debug!(%code, "reading this relay's last records back");
                    continue;
                }
                Some(Ok(message)) => (
                    message.partition(),
                    Some((message.offset(), seq_of(&self.identity, &message))),
                ),
                // The stable offset is past the record: it was skipped.
                Some(Err(KafkaError::PartitionEOF(partition))) => (partition, None),
                Some(Err(error)) => return Err(error).with_context(|| doing("reading")),
            };
            let Some(last) = written.get(&partition) else {
                continue;
            };
            if !open.remove(&partition) {
                continue;
            }
            if seen != Some((last.offset, Some(last.seq))) {
                outcome = Check::TakenBack {
                    partition,
                    offset: last.offset,
                    seq: last.seq,
                };
            }
        }
        self.consumer
            .unassign()
            .with_context(|| doing("ending the read"))?;
        Ok(outcome)
    }
}

impl Reader for ReadBack {
    fn check(&mut self, written: &BTreeMap<i32, Written>) -> anyhow::Result<Check> {
        ReadBack::check(self, written)
    }
}

/// The outbox sequence number of one of the relay `identity`'s records;
/// none for anyone else's.
fn seq_of(identity: &str, message: &BorrowedMessage<'_>) -> Option<u64> {
    let headers = message.headers()?;
    let mut ours = false;
    let mut seq = None;
    for header in headers.iter() {
        match header.key {
            RELAY_HEADER => ours = header.value == Some(identity.as_bytes()),
            SEQ_HEADER => {
                seq = header
                    .value
                    .and_then(|value| std::str::from_utf8(value).ok())
                    .and_then(|value| value.parse().ok());
            }
            _ => {}
        }
    }
    seq.filter(|_| ours)
}

/// A partition's low watermark and stable offset, once the stable offset
/// is past `offset` or `patience` has passed (then as they are), each
/// read within what is left until `until`.
fn stable_past(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    offset: i64,
    patience: Duration,
    until: Instant,
) -> anyhow::Result<(i64, i64)> {
    let given_up = Instant::now() + patience;
    loop {
        let (low, stable) = consumer.fetch_watermarks(topic, partition, left(until))?;
        if stable > offset || Instant::now() >= given_up {
            return Ok((low, stable));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// What is left of the time until `until`, at least a millisecond.
fn left(until: Instant) -> Duration {
    until
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

/// Microseconds between successive calls of [`Lap::next`].
pub struct Lap(pub Instant);

impl Lap {
    pub fn next(&mut self) -> u64 {
        let now = Instant::now();
        let us = now.duration_since(self.0).as_micros() as u64;
        self.0 = now;
        us
    }
}
