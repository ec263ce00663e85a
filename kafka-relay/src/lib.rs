//! The Kafka relay: publishes the sink's event outbox to a topic through
//! librdkafka, exactly once. It sits at the edge: the sink knows only its
//! outbox, and the relay reaches the outbox and the brokers through the
//! small interfaces of [`brokers`], which its model tests stand in for.
//!
//! Each publication is one Kafka transaction holding a run of outbox events
//! (in outbox order, keyed by file, so a file's events keep their order in
//! one partition). Every record names the relay and carries its outbox
//! sequence number in headers, and that is the relay's position: what the
//! topic holds (`position`). Readers must consume with
//! `isolation.level=read_committed` (librdkafka's default; the Java
//! client's default is read_uncommitted) to see each event once.
//!
//! The relay trusts only what it reads back from the brokers: an
//! acknowledged transaction leaves its events in the outbox until the last
//! record it wrote to each partition is read back committed (by a consumer
//! on a thread of its own, beside publishing, at least once a second, and
//! whenever there is nothing left to publish); a record not
//! there (a broker restarted while it wrote the markers can take a
//! transaction back) makes it publish again from there. Every start of a
//! client first ends whatever an earlier one left without markers (see
//! `client::Client::start`), then reads its records after its mark back.
//!
//! Every librdkafka call runs on a worker thread (`worker`) with a
//! deadline: a client stuck in a call is abandoned and a new one with the
//! same transactional id fences it. After any failure the relay starts a
//! new client from the position the brokers confirm, with backoff; it
//! never stops for good, and `status` counts its restarts and says why.
//!
//! The relay never slows ingest: it runs on a thread of its own, reads the
//! outbox behind the commits, and while the brokers cannot be reached it
//! retries with backoff, says why in `status` and a rate-limited warning,
//! and lets the outbox grow (bounded: see `sink::outbox`).

pub mod brokers;
mod client;
mod connect;
mod outbox_log;
mod position;
mod relay;
mod worker;

#[cfg(test)]
mod model;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use sink::outbox::Outbox;

pub use connect::{KafkaSettings, RESERVED_PROPERTIES};

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
        let log: Arc<dyn brokers::EventLog> =
            Arc::new(outbox_log::SinkOutbox::new(outbox, runtime));
        let brokers = connect::Librdkafka::new(&settings, log.clone())?;
        Self::start_with(log, settings.topic, brokers)
    }

    /// The relay of `log` to `topic` on `brokers`: what [`Self::start`]
    /// runs with the sink's outbox and librdkafka, and the model tests
    /// with their own.
    pub(crate) fn start_with<B: brokers::Brokers>(
        log: Arc<dyn brokers::EventLog>,
        topic: String,
        brokers: B,
    ) -> anyhow::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let relay = relay::Relay::new(log, topic, brokers, stop.clone());
        let thread = std::thread::Builder::new()
            .name("kafka-relay".into())
            .spawn(move || relay.run())
            .context("starting the Kafka relay's thread")?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops after the call under way, and joins the thread.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
