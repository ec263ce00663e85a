//! The brokers of a real cluster, through librdkafka: the properties the
//! relay sets (exactly once depends on them) and the user's, checked at
//! start, and a producer with its consumers for each connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use rdkafka::ClientConfig;
use rdkafka::consumer::BaseConsumer;

use crate::brokers::{Brokers, EventLog};
use crate::client::{Client, ReadBack, RelayContext, Transactional};

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

pub(crate) struct Librdkafka {
    brokers: String,
    topic: String,
    /// librdkafka properties, applied after ours (so they win).
    properties: Vec<(String, String)>,
    /// `tailflight-relay.<sink id>`: the transactional id, the value of
    /// the records' relay header, and the group where a relay before the
    /// headers kept its position.
    identity: String,
    log: Arc<dyn EventLog>,
    /// The number of the current client (see [`RelayContext`]).
    generation: Arc<AtomicU64>,
    /// The user's properties a consumer accepts, found once at start:
    /// trying each creates and drops a consumer.
    consumer_properties: Vec<(String, String)>,
}

impl Librdkafka {
    /// Checks the settings: an unknown or invalid property fails here, at
    /// startup (creating a client validates every property without
    /// connecting).
    pub(crate) fn new(settings: &KafkaSettings, log: Arc<dyn EventLog>) -> anyhow::Result<Self> {
        let mut brokers = Self {
            brokers: settings.brokers.clone(),
            topic: settings.topic.clone(),
            properties: settings.properties.clone(),
            identity: relay_identity(log.sink_id()),
            log,
            generation: Arc::new(AtomicU64::new(0)),
            consumer_properties: Vec::new(),
        };
        let _checked = brokers
            .producer()
            .context("the Kafka producer's settings are not valid")?;
        brokers
            .find_consumer_properties()
            .context("the Kafka position reader's settings are not valid")?;
        Ok(brokers)
    }

    fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.brokers);
        config.set("client.id", &self.identity);
        config
    }

    fn with_user_properties(&self, mut config: ClientConfig) -> ClientConfig {
        for (key, value) in &self.properties {
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
        let context = RelayContext::new(
            self.log.clone(),
            self.generation.load(Ordering::SeqCst),
            self.generation.clone(),
        );
        Ok(self
            .with_user_properties(config)
            .create_with_context(context)?)
    }

    fn consumer_config(&self) -> ClientConfig {
        let mut config = self.client_config();
        config
            .set("group.id", &self.identity)
            .set("enable.auto.commit", "false")
            // Also makes librdkafka ask for stable offsets only, and its
            // watermarks' high one the stable offset.
            .set("isolation.level", "read_committed")
            // Reading records back ends at the stable offset.
            .set("enable.partition.eof", "true")
            .set("fetch.wait.max.ms", "20");
        config
    }

    /// Producer-only properties would be refused by a consumer: keeps the
    /// ones it knows (security, SASL and the like) by trying each.
    fn find_consumer_properties(&mut self) -> anyhow::Result<()> {
        let mut config = self.consumer_config();
        for (key, value) in &self.properties {
            let mut trial = config.clone();
            trial.set(key, value);
            if trial.create::<BaseConsumer>().is_ok() {
                config = trial;
                self.consumer_properties.push((key.clone(), value.clone()));
            }
        }
        config.create::<BaseConsumer>()?;
        Ok(())
    }

    fn consumer(&self) -> anyhow::Result<BaseConsumer> {
        let mut config = self.consumer_config();
        for (key, value) in &self.consumer_properties {
            config.set(key, value);
        }
        Ok(config.create()?)
    }
}

/// `tailflight-relay.<sink id>`.
pub(crate) fn relay_identity(sink_id: &str) -> String {
    format!("tailflight-relay.{sink_id}")
}

impl Brokers for Librdkafka {
    type Publisher = Client;
    type Reader = ReadBack;

    fn describe(&self) -> String {
        self.brokers.clone()
    }

    fn connect(&mut self) -> anyhow::Result<(Client, ReadBack)> {
        self.generation.fetch_add(1, Ordering::SeqCst);
        let client = Client {
            producer: self.producer().context("creating the Kafka producer")?,
            consumer: self
                .consumer()
                .context("creating the Kafka position reader")?,
            topic: self.topic.clone(),
            identity: self.identity.clone(),
            brokers: self.brokers.clone(),
        };
        let read_back = ReadBack {
            consumer: self
                .consumer()
                .context("creating the Kafka read-back consumer")?,
            topic: self.topic.clone(),
            identity: self.identity.clone(),
        };
        Ok((client, read_back))
    }
}
