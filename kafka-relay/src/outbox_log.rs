//! The sink's outbox as the relay's [`EventLog`]: waits for new events on
//! the sink's runtime, since the outbox tells of them through a tokio
//! notification.

use std::sync::Arc;
use std::time::Duration;

use sink::SinkError;
use sink::outbox::{Outbox, PendingEvent, RelayReport};

use crate::brokers::EventLog;

pub(crate) struct SinkOutbox {
    outbox: Arc<Outbox>,
    runtime: tokio::runtime::Handle,
}

impl SinkOutbox {
    pub(crate) fn new(outbox: Arc<Outbox>, runtime: tokio::runtime::Handle) -> Self {
        Self { outbox, runtime }
    }
}

impl EventLog for SinkOutbox {
    fn sink_id(&self) -> &str {
        self.outbox.sink_id()
    }

    fn durable_through(&self) -> u64 {
        self.outbox.durable_through()
    }

    fn published_through(&self) -> u64 {
        self.outbox.published_through()
    }

    fn wait_beyond(&self, seq: u64, timeout: Duration) {
        self.runtime.block_on(self.outbox.wait_beyond(seq, timeout));
    }

    fn read(
        &self,
        after: u64,
        limit: usize,
        byte_limit: usize,
    ) -> Result<Vec<PendingEvent>, SinkError> {
        self.outbox.read(after, limit, byte_limit)
    }

    fn published(&self, through: u64, mark: Option<&[u8]>, sync: bool) -> Result<(), SinkError> {
        self.outbox.published(through, mark, sync)
    }

    fn mark(&self) -> Result<Option<Vec<u8>>, SinkError> {
        self.outbox.mark()
    }

    fn report(&self, update: &mut dyn FnMut(&mut RelayReport)) {
        self.outbox.report(|report| update(report));
    }

    fn waiting_for_brokers(&self, waiting: bool) {
        self.outbox.waiting_for_brokers(waiting);
    }

    fn depth(&self) -> (u64, u64) {
        let status = self.outbox.status();
        (status.depth_events, status.depth_bytes)
    }
}
