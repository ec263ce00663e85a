//! The Kafka relay: publishes the sink's event outbox to a topic through
//! librdkafka, exactly once.
//!
//! Each publication is one Kafka transaction holding a run of outbox events
//! (in outbox order, keyed by file, so a file's events keep their order in
//! one partition) and the relay's position: the sequence number of the last
//! of them, committed as the offset of a consumer group of the relay's own
//! (`tailflight-relay.<sink id>`, partition 0 of the topic) through
//! `send_offsets_to_transaction`. Either both are in Kafka or neither is.
//! At start, `init_transactions` fences and aborts whatever transaction a
//! previous run left open, and the position read back says which outbox
//! events are in the topic already: those are removed, the rest published.
//! Readers must consume with `isolation.level=read_committed` (librdkafka's
//! default; the Java client's default is read_uncommitted) to see each
//! event once.
//!
//! The relay never slows ingest: it runs on a thread of its own, reads the
//! outbox behind the commits, and while the brokers cannot be reached it
//! retries with backoff, says why in `status` and a rate-limited warning,
//! and lets the outbox grow (bounded: see `sink::outbox`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use sink::outbox::{CLOUDEVENTS_CONTENT_TYPE, Outbox};

/// Where and how to publish, validated from the flags.
#[derive(Clone, Debug)]
pub struct KafkaSettings {
    pub brokers: String,
    pub topic: String,
    /// librdkafka properties, applied after ours (so they win).
    pub properties: Vec<(String, String)>,
}

/// Properties the relay sets itself: exactly once depends on them.
pub const RESERVED_PROPERTIES: [&str; 6] = [
    "bootstrap.servers",
    "transactional.id",
    "enable.idempotence",
    "isolation.level",
    "group.id",
    "enable.auto.commit",
];

/// Events per transaction at most, and their bytes.
const BATCH_EVENTS: usize = 2000;
const BATCH_BYTES: usize = 4 << 20;
/// How long a Kafka call may block before it counts as failed.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// One warning per this long while the relay keeps failing.
const WARN_EVERY: Duration = Duration::from_secs(30);

/// The relay's thread; stopped and joined by [`KafkaRelay::stop`].
pub struct KafkaRelay {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl KafkaRelay {
    /// Checks the settings (an unknown or invalid property fails here, at
    /// startup) and starts publishing `outbox`.
    pub fn start(
        outbox: Arc<Outbox>,
        settings: KafkaSettings,
        runtime: tokio::runtime::Handle,
    ) -> anyhow::Result<Self> {
        let relay = Relay::new(outbox, settings, runtime);
        // Creating a client validates every property without connecting.
        let _checked = relay
            .producer()
            .context("the Kafka producer's settings are not valid")?;
        relay
            .consumer()
            .context("the Kafka position reader's settings are not valid")?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("kafka-relay".into())
            .spawn(move || relay.run(&stopping))
            .context("starting the Kafka relay's thread")?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops after the transaction under way, and joins the thread.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

struct Relay {
    outbox: Arc<Outbox>,
    settings: KafkaSettings,
    runtime: tokio::runtime::Handle,
    /// `tailflight-relay.<sink id>`: the transactional id and the group
    /// that holds the relay's position.
    identity: String,
    last_warning: Option<Instant>,
    failures_unwarned: u64,
}

/// Why a publication failed, and what to do about it.
enum Failure {
    /// Abort the transaction and publish the same events again.
    Abort(String),
    /// The producer cannot go on (fenced, or a fatal error): make a new one,
    /// which reads the position back first.
    Restart(String),
}

type Transactional = ThreadedProducer<RelayContext>;

/// Hears librdkafka's errors (brokers down, authentication failed) as
/// they happen, while a call may still be waiting out its timeout, and
/// puts them in `status` at once.
struct RelayContext {
    outbox: Arc<Outbox>,
}

impl ClientContext for RelayContext {
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!(%error, reason, "librdkafka reports an error");
        self.outbox.report(|report| {
            report.state = "failing".into();
            report.error = Some(format!("{error}: {reason}"));
        });
    }
}

impl ProducerContext for RelayContext {
    type DeliveryOpaque = ();

    // The transaction's commit says whether its records were delivered.
    fn delivery(&self, _: &DeliveryResult<'_>, _: Self::DeliveryOpaque) {}
}

impl Relay {
    fn new(outbox: Arc<Outbox>, settings: KafkaSettings, runtime: tokio::runtime::Handle) -> Self {
        Self {
            identity: format!("tailflight-relay.{}", outbox.sink_id()),
            outbox,
            settings,
            runtime,
            last_warning: None,
            failures_unwarned: 0,
        }
    }

    fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.settings.brokers);
        config.set("client.id", &self.identity);
        config
    }

    fn with_user_properties(&self, mut config: ClientConfig) -> ClientConfig {
        for (key, value) in &self.settings.properties {
            config.set(key, value);
        }
        config
    }

    fn producer(&self) -> anyhow::Result<Transactional> {
        let mut config = self.client_config();
        config
            .set("enable.idempotence", "true")
            .set("transactional.id", &self.identity)
            // An event is published as soon as its round is durable; the
            // transaction's commit flushes anyway.
            .set("linger.ms", "1")
            // Brokers that stop answering are given up on (and the call
            // retried) after 10 s instead of librdkafka's 60.
            .set("socket.timeout.ms", "10000")
            // A transaction that starts while the broker still writes the
            // last one's markers is told to retry; librdkafka's 100 ms
            // backoff made that wait the larger part of each publication.
            .set("retry.backoff.ms", "5");
        let context = RelayContext {
            outbox: self.outbox.clone(),
        };
        Ok(self
            .with_user_properties(config)
            .create_with_context(context)?)
    }

    fn consumer(&self) -> anyhow::Result<BaseConsumer> {
        let mut config = self.client_config();
        config
            .set("group.id", &self.identity)
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed");
        // Producer-only properties would be refused here: keep the ones a
        // consumer knows (security, SASL and the like) by trying each.
        let mut consumer_config = config.clone();
        for (key, value) in &self.settings.properties {
            let mut trial = consumer_config.clone();
            trial.set(key, value);
            if trial.create::<BaseConsumer>().is_ok() {
                consumer_config = trial;
            }
        }
        Ok(consumer_config.create()?)
    }

    fn run(mut self, stop: &AtomicBool) {
        let mut backoff = BACKOFF_MIN;
        while !stop.load(Ordering::SeqCst) {
            self.outbox.waiting_for_brokers(true);
            let connected = self.connect();
            self.outbox.waiting_for_brokers(false);
            match connected {
                Ok((producer, consumer, position)) => {
                    // Ends only when the producer cannot go on (fenced by
                    // another relay with the same id, or a fatal error):
                    // back off before the next one, so two relays sharing
                    // an id do not fence each other in a hot loop.
                    if self.publish(&producer, &consumer, position, stop) {
                        backoff = BACKOFF_MIN;
                    }
                    sleep_unless_stopped(backoff, stop);
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
                Err(error) => {
                    self.failing(format!("{error:#}"));
                    sleep_unless_stopped(backoff, stop);
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }

    /// A producer whose transactions are ready, and the relay's position:
    /// the newest outbox event already in the topic.
    fn connect(&mut self) -> anyhow::Result<(Transactional, BaseConsumer, u64)> {
        let producer = self.producer()?;
        producer.init_transactions(CALL_TIMEOUT).with_context(|| {
            format!(
                "starting transactions with the brokers {}",
                self.settings.brokers
            )
        })?;
        self.check_topic(&producer)?;
        let consumer = self.consumer()?;
        let position = self.read_position(&consumer)?;
        let recorded = self.outbox.durable_through();
        if position > recorded {
            anyhow::bail!(
                "the topic says this sink published through event {position}, but its outbox \
                 has only recorded {recorded}: a state directory restored from an older copy, or \
                 another sink with the same --sink-id ({}); nothing is published until that is \
                 resolved",
                self.outbox.sink_id()
            );
        }
        self.outbox
            .published(position)
            .context("removing events the topic already holds")?;
        self.outbox.report(|report| {
            report.state = "publishing".into();
            report.error = None;
        });
        tracing::info!(
            brokers = %self.settings.brokers,
            topic = %self.settings.topic,
            position,
            "the Kafka relay is connected; publishing the outbox after its position"
        );
        Ok((producer, consumer, position))
    }

    /// Fails clearly if the topic does not exist and the brokers do not
    /// create it, or if this client may not see it.
    fn check_topic(&self, producer: &Transactional) -> anyhow::Result<()> {
        let topic = &self.settings.topic;
        let metadata = producer
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
        Ok(())
    }

    /// The position committed with the last transaction (0: none yet).
    fn read_position(&self, consumer: &BaseConsumer) -> anyhow::Result<u64> {
        let mut wanted = TopicPartitionList::new();
        wanted.add_partition(&self.settings.topic, 0);
        let committed = consumer
            .committed_offsets(wanted, CALL_TIMEOUT)
            .with_context(|| format!("reading the relay's position (group {})", self.identity))?;
        let Some(element) = committed.find_partition(&self.settings.topic, 0) else {
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

    fn publish(
        &mut self,
        producer: &Transactional,
        consumer: &BaseConsumer,
        mut position: u64,
        stop: &AtomicBool,
    ) -> bool {
        let Some(group) = consumer.group_metadata() else {
            self.failing("the position reader has no group metadata".into());
            return false;
        };
        let mut published_any = false;
        let mut backoff = BACKOFF_MIN;
        let mut idle_reported = false;
        while !stop.load(Ordering::SeqCst) {
            // Taken before the read: what becomes durable after it is read
            // next time, never skipped.
            let durable = self.outbox.durable_through();
            let events = match self.outbox.read(position, BATCH_EVENTS, BATCH_BYTES) {
                Ok(events) => events,
                Err(error) => {
                    self.failing(format!("{error}"));
                    sleep_unless_stopped(backoff, stop);
                    continue;
                }
            };
            let Some(last) = events.last().map(|event| event.seq) else {
                // Events a withdrawal removed leave numbers no event has:
                // nothing to publish up to what was durable at the read.
                position = position.max(durable);
                if !idle_reported {
                    self.outbox.report(|report| {
                        report.state = "idle".into();
                        report.error = None;
                    });
                    idle_reported = true;
                }
                let outbox = self.outbox.clone();
                self.runtime
                    .block_on(outbox.wait_beyond(position, Duration::from_millis(500)));
                continue;
            };
            idle_reported = false;
            self.outbox.waiting_for_brokers(true);
            let published = self.transaction(producer, &group, &events, last, stop);
            self.outbox.waiting_for_brokers(false);
            match published {
                Ok(()) => {
                    position = last;
                    backoff = BACKOFF_MIN;
                    published_any = true;
                    if let Err(error) = self.outbox.published(last) {
                        // The topic has them; the next start reads the
                        // position back and removes them then.
                        tracing::warn!(%error, "cannot remove published events from the outbox");
                    }
                    let now_ms = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map_or(0, |since| since.as_millis() as u64);
                    self.outbox.report(|report| {
                        report.state = "publishing".into();
                        report.error = None;
                        report.published_events += events.len() as u64;
                        report.last_published_unix_ms = Some(now_ms);
                    });
                    if self.failures_unwarned > 0 || self.last_warning.is_some() {
                        tracing::info!("the Kafka relay publishes again");
                        self.last_warning = None;
                        self.failures_unwarned = 0;
                    }
                }
                Err(Failure::Abort(reason)) => {
                    self.failing(reason);
                    // Whatever the aborted transaction wrote stays invisible
                    // to read_committed consumers.
                    if let Err(error) = producer.abort_transaction(CALL_TIMEOUT) {
                        self.failing(format!("aborting a failed transaction: {error}"));
                        if is_fatal(&error) {
                            return published_any;
                        }
                    }
                    sleep_unless_stopped(backoff, stop);
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
                Err(Failure::Restart(reason)) => {
                    self.failing(reason);
                    return published_any;
                }
            }
        }
        published_any
    }

    /// Publishes `events` and the position `last` in one transaction.
    fn transaction(
        &self,
        producer: &Transactional,
        group: &rdkafka::consumer::ConsumerGroupMetadata,
        events: &[sink::outbox::PendingEvent],
        last: u64,
        stop: &AtomicBool,
    ) -> Result<(), Failure> {
        let range = format!("events {}..={last}", events.first().map_or(last, |e| e.seq));
        let step = |what: &'static str| {
            let range = range.clone();
            let topic = self.settings.topic.clone();
            move |error| classify(error, &format!("{what} ({range} to topic {topic:?})"))
        };
        producer
            .begin_transaction()
            .map_err(step("beginning a transaction"))?;
        for event in events {
            let headers = OwnedHeaders::new().insert(Header {
                key: "content-type",
                value: Some(CLOUDEVENTS_CONTENT_TYPE),
            });
            let mut record = BaseRecord::to(&self.settings.topic)
                .key(&event.key)
                .payload(&event.payload)
                .headers(headers)
                .timestamp(event.recorded_unix_ms as i64);
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        // librdkafka's queue is full: let it drain.
                        record = back;
                        producer.poll(Duration::from_millis(10));
                    }
                    Err((error, _)) => {
                        return Err(step("producing an event")(error));
                    }
                }
            }
        }
        let mut position = TopicPartitionList::new();
        position
            .add_partition_offset(&self.settings.topic, 0, Offset::Offset(last as i64 + 1))
            .map_err(|e| Failure::Abort(format!("recording the relay's position: {e}")))?;
        producer
            .send_offsets_to_transaction(&position, group, CALL_TIMEOUT)
            .map_err(step("adding the relay's position to the transaction"))?;
        // The crate's commit flushes first, and its flush waits for events
        // in 100 ms polls that only the producer's own thread is served
        // by: each publication took 100 ms more than it needed. Waiting
        // here for the messages to be delivered leaves it nothing to wait for.
        let flushing = Instant::now();
        while producer.in_flight_count() > 0 && flushing.elapsed() < CALL_TIMEOUT {
            if stop.load(Ordering::SeqCst) {
                return Err(Failure::Abort("the sink is stopping".into()));
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        loop {
            if stop.load(Ordering::SeqCst) {
                return Err(Failure::Abort("the sink is stopping".into()));
            }
            match producer.commit_transaction(CALL_TIMEOUT) {
                Ok(()) => return Ok(()),
                Err(error) => match step("committing the transaction")(error) {
                    // Retriable: the outcome is unknown; committing again
                    // is how librdkafka finds out.
                    Failure::Abort(reason) if reason.starts_with(RETRIABLE) => {
                        tracing::debug!(%reason, "committing the transaction again");
                    }
                    failure => return Err(failure),
                },
            }
        }
    }

    /// Says the relay is failing: in `status` at once, in the log at most
    /// every [`WARN_EVERY`].
    fn failing(&mut self, reason: String) {
        self.outbox.report(|report| {
            report.state = "failing".into();
            report.error = Some(reason.clone());
        });
        let due = self
            .last_warning
            .is_none_or(|last| last.elapsed() >= WARN_EVERY);
        if due {
            let status = self.outbox.status();
            tracing::warn!(
                %reason,
                unpublished_events = status.depth_events,
                unpublished_bytes = status.depth_bytes,
                failures_since_last_warning = self.failures_unwarned,
                "the Kafka relay cannot publish; events wait in the outbox and ingest goes on"
            );
            self.last_warning = Some(Instant::now());
            self.failures_unwarned = 0;
        } else {
            self.failures_unwarned += 1;
        }
    }
}

const RETRIABLE: &str = "retriable: ";

fn is_fatal(error: &KafkaError) -> bool {
    matches!(error, KafkaError::Transaction(e) if e.is_fatal())
}

fn classify(error: KafkaError, doing: &str) -> Failure {
    match &error {
        KafkaError::Transaction(e) if e.is_fatal() => Failure::Restart(format!(
            "{doing}: {error} (fatal: a new producer takes over)"
        )),
        KafkaError::Transaction(e) if e.is_retriable() => {
            Failure::Abort(format!("{RETRIABLE}{doing}: {error}"))
        }
        KafkaError::Transaction(e) if e.txn_requires_abort() => {
            Failure::Abort(format!("{doing}: {error}"))
        }
        KafkaError::Transaction(_) => Failure::Restart(format!("{doing}: {error}")),
        _ => Failure::Abort(format!("{doing}: {error}")),
    }
}

fn sleep_unless_stopped(pause: Duration, stop: &AtomicBool) {
    let until = Instant::now() + pause;
    while !stop.load(Ordering::SeqCst) {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(100)));
    }
}
