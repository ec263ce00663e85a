//! What the relay stands on, as small interfaces: the log of events it
//! publishes ([`EventLog`], the sink's outbox) and the brokers
//! ([`Brokers`], which make a [`Publisher`] and a [`Reader`] per
//! connection). librdkafka implements the brokers' side, the model tests a
//! topic of their own. Every method blocks; the relay runs the brokers'
//! calls on worker threads with deadlines.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use sink::SinkError;
use sink::outbox::{PendingEvent, RelayPhases, RelayReport};

pub use crate::position::{Check, Written};

/// The events to publish, in sequence order, and where the relay says
/// what it does.
pub trait EventLog: Send + Sync + 'static {
    /// The sink's name, in the relay's transactional id.
    fn sink_id(&self) -> &str;
    /// The newest event the relay may publish.
    fn durable_through(&self) -> u64;
    /// The newest event withdrawn as published.
    fn published_through(&self) -> u64;
    /// Waits until an event after `seq` is durable, or `timeout` passes.
    fn wait_beyond(&self, seq: u64, timeout: Duration);
    /// Durable events after `after`, in order: at most `limit`, and no
    /// more once `byte_limit` bytes are read.
    fn read(
        &self,
        after: u64,
        limit: usize,
        byte_limit: usize,
    ) -> Result<Vec<PendingEvent>, SinkError>;
    /// Withdraws the events through `through`, replacing the relay's mark
    /// in the same write; `sync`: durable before it returns.
    fn published(&self, through: u64, mark: Option<&[u8]>, sync: bool) -> Result<(), SinkError>;
    /// The relay's mark, as last given to [`Self::published`].
    fn mark(&self) -> Result<Option<Vec<u8>>, SinkError>;
    /// The relay tells what it is doing (`status`).
    fn report(&self, update: &mut dyn FnMut(&mut RelayReport));
    /// The relay starts waiting for the brokers (`true`), or got its answer.
    fn waiting_for_brokers(&self, waiting: bool);
    /// Events and bytes not yet withdrawn, for the relay's warnings.
    fn depth(&self) -> (u64, u64);
}

/// The brokers: a new pair of clients for each connection.
pub trait Brokers: Send + 'static {
    type Publisher: Publisher;
    type Reader: Reader;
    /// Where the brokers are, for the log.
    fn describe(&self) -> String;
    /// The clients of a new connection; the ones before it are abandoned.
    fn connect(&mut self) -> anyhow::Result<(Self::Publisher, Self::Reader)>;
}

/// The transactional producer of one connection, with the consumer that
/// reads its records back at the start.
pub trait Publisher: Send + 'static {
    /// Makes transactions ready, fencing every earlier producer of the
    /// relay, and ends what they left open: returns the offset of the
    /// fence in each partition, after every earlier record of the relay.
    /// `with_group`: the fence covers the group of a relay before the
    /// record headers too.
    fn start(&mut self, with_group: bool) -> anyhow::Result<BTreeMap<i32, i64>>;
    /// The position a relay before the record headers kept in its group.
    fn read_position(&self) -> anyhow::Result<u64>;
    /// The sequence numbers of the relay's committed records from `from`
    /// up to the fence.
    fn scan(
        &mut self,
        from: &BTreeMap<i32, i64>,
        fenced: &BTreeMap<i32, i64>,
    ) -> anyhow::Result<BTreeSet<u64>>;
    /// Publishes `events` in one transaction: where its time went, and
    /// the last record it wrote to each partition.
    fn transaction(
        &mut self,
        events: &[PendingEvent],
        stop: &Arc<AtomicBool>,
    ) -> anyhow::Result<(RelayPhases, BTreeMap<i32, Written>)>;
    /// Aborts the transaction under way.
    fn abort(&self) -> anyhow::Result<()>;
}

/// The consumer that reads back, beside publishing, the last records the
/// acknowledged transactions wrote.
pub trait Reader: Send + 'static {
    fn check(&mut self, written: &BTreeMap<i32, Written>) -> anyhow::Result<Check>;
}
