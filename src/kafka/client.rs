//! The relay's Kafka client: one transactional producer and the consumer
//! that reads the relay's position back, and every librdkafka call the
//! relay makes. Each method blocks; the relay runs them on a
//! [`super::worker::Worker`] so none can hold it up for good.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerGroupMetadata};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use sink::outbox::{CLOUDEVENTS_CONTENT_TYPE, PendingEvent, RelayPhases};

use super::RelayContext;

/// How long one librdkafka call may block before it counts as failed.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a transaction may take from its first call to its commit,
/// retries of the commit included.
pub const TRANSACTION_BUDGET: Duration = Duration::from_secs(30);
/// The header of the records the start-up fence writes and aborts: no
/// read_committed consumer ever sees them.
pub const CONTROL_HEADER: &str = "tailflight-control";

pub type Transactional = ThreadedProducer<RelayContext>;

pub struct Client {
    pub producer: Transactional,
    pub consumer: BaseConsumer,
    pub topic: String,
    /// `tailflight-relay.<sink id>`: the transactional id, and the group
    /// that holds the relay's position.
    pub identity: String,
}

impl Client {
    /// Makes the producer's transactions ready, ends whatever an earlier
    /// producer with this id left unresolved, and returns the relay's
    /// position as the brokers hold it.
    ///
    /// `init_transactions` fences an earlier producer and aborts the
    /// transaction it left open. It does not end records a transaction
    /// left without markers: a broker shutting down skips the markers of
    /// partitions with no leader at that moment, even for a transaction it
    /// reports committed, and the next marker of this producer id in that
    /// partition decides their fate. So the start writes one record to
    /// every partition and the position, and aborts: whatever was left
    /// without markers is ended as aborted, position included, before the
    /// position is read back. Those events are then published again.
    pub fn start(&mut self, brokers: &str) -> anyhow::Result<u64> {
        self.producer
            .init_transactions(CALL_TIMEOUT)
            .with_context(|| format!("starting transactions with the brokers {brokers}"))?;
        let partitions = self.check_topic()?;
        self.fence(partitions)?;
        self.read_position()
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

    /// Writes a control record to each of the topic's `partitions` and the
    /// relay's group, and aborts (see [`Self::start`]).
    fn fence(&mut self, partitions: i32) -> anyhow::Result<()> {
        let doing = |what: &str| format!("{what} (the start-up fence of topic {:?})", self.topic);
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
            let record: BaseRecord<'_, str, [u8]> = BaseRecord::to(&self.topic)
                .partition(partition)
                .key(CONTROL_HEADER)
                .payload(empty)
                .headers(headers);
            self.send(record)
                .with_context(|| doing(&format!("writing to partition {partition}")))?;
        }
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
        self.wait_delivered(None)
            .with_context(|| doing("delivering"))?;
        // A partition the fence did not reach is not fenced.
        if let Some(failed) = self.take_failed_delivery() {
            anyhow::bail!(doing(&failed));
        }
        self.producer
            .abort_transaction(CALL_TIMEOUT)
            .with_context(|| doing("aborting"))?;
        Ok(())
    }

    fn group(&self) -> anyhow::Result<ConsumerGroupMetadata> {
        self.consumer
            .group_metadata()
            .context("the position reader has no group metadata")
    }

    /// The position committed with the last transaction the brokers hold
    /// (0: none yet). Reads only stable offsets: while a transaction's
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

    /// Publishes `events` and the position `last` in one transaction, and
    /// says where its time went.
    pub fn transaction(
        &mut self,
        events: &[PendingEvent],
        last: u64,
        stop: &Arc<AtomicBool>,
    ) -> anyhow::Result<RelayPhases> {
        self.take_failed_delivery();
        let first = events.first().map_or(last, |e| e.seq);
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
            let headers = OwnedHeaders::new().insert(Header {
                key: "content-type",
                value: Some(CLOUDEVENTS_CONTENT_TYPE),
            });
            let record = BaseRecord::to(&self.topic)
                .key(&event.key)
                .payload(&event.payload)
                .headers(headers)
                .timestamp(event.recorded_unix_ms as i64);
            self.send(record)
                .with_context(|| doing("producing an event"))?;
        }
        phases.produce = lap.next();
        let mut position = TopicPartitionList::new();
        position
            .add_partition_offset(&self.topic, 0, Offset::Offset(last as i64 + 1))
            .with_context(|| doing("recording the relay's position"))?;
        let group = self
            .group()
            .with_context(|| doing("adding the relay's position to the transaction"))?;
        self.producer
            .send_offsets_to_transaction(&position, &group, CALL_TIMEOUT)
            .with_context(|| doing("adding the relay's position to the transaction"))?;
        phases.offsets = lap.next();
        // The crate's commit flushes first, and its flush waits for events
        // in 100 ms polls that only the producer's own thread is served
        // by: each publication took 100 ms more than it needed. Waiting
        // here for the messages to be delivered leaves it nothing to wait for.
        self.wait_delivered(Some(stop))
            .with_context(|| doing("delivering"))?;
        phases.deliver = lap.next();
        loop {
            if stop.load(Ordering::SeqCst) {
                anyhow::bail!(doing("the sink is stopping: not committing"));
            }
            match self.producer.commit_transaction(CALL_TIMEOUT) {
                Ok(()) => {
                    phases.commit = lap.next();
                    return Ok(phases);
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

    /// Aborts the transaction under way; its records stay invisible to
    /// read_committed consumers.
    pub fn abort(&self) -> anyhow::Result<()> {
        self.producer
            .abort_transaction(CALL_TIMEOUT)
            .context("aborting a failed transaction")
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
    fn send<K, P>(&self, mut record: BaseRecord<'_, K, P>) -> anyhow::Result<()>
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

    fn wait_delivered(&self, stop: Option<&Arc<AtomicBool>>) -> anyhow::Result<()> {
        let until = Instant::now() + CALL_TIMEOUT;
        while self.producer.in_flight_count() > 0 {
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
