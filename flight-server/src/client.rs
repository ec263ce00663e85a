//! The watcher's side of the wire: N separate TCP connections to one sink,
//! each carrying one long-lived DoPut stream, fed from a shared queue.
//!
//! Each connection keeps at most `window_bytes` sent but not acknowledged, and
//! the HTTP/2 windows are raised to match, so on a long-RTT link throughput is
//! set by the window, not by HTTP/2's 64 KiB default. Batches that were in
//! flight when a connection failed go back to their place in the queue (it
//! stays in the order batches were handed over) and are sent again on
//! whichever connection is up; the sink recognises what it already placed.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use arrow_flight::{FlightData, FlightDescriptor, SchemaAsIpc};
use arrow_ipc::writer::IpcWriteOptions;
use tokio::sync::{Notify, Semaphore, mpsc};
use tonic::transport::Endpoint;

pub use crate::calls::{
    ClientConfig, ClientError, Consumed, action, connect_plain, endpoint_url, subscribe,
};
use crate::calls::{error_chain, make_endpoint, run_action};
use crate::encode::EncodedBatch;
use crate::protocol::{self, Ack, Hello};
use crate::put_stream::{self, MessageFrames, frames};
use crate::schema::range_schema;

/// A batch to deliver; `token` is the caller's name for it.
pub struct Outgoing {
    pub token: u64,
    pub batch: EncodedBatch,
}

/// What became of a batch.
#[derive(Debug)]
pub enum Delivery {
    /// Durable at the sink.
    Acked { token: u64, ack: Ack },
    /// The sink refused the batch itself several times (it is not retried again).
    Refused { token: u64, error: String },
}

/// What the pool tells its owner as it happens, for distributions the
/// owner keeps (the pool's own figures are in [`FlightPool::connection_stats`]).
pub trait PoolEvents: Send + Sync + 'static {
    /// A batch of `bytes` was acknowledged by the sink at `endpoint`
    /// `latency` after it was sent on connection `connection`.
    fn batch_acked(&self, endpoint: &str, connection: usize, bytes: u64, latency: Duration);
}

/// One connection's figures, kept up by its task.
#[derive(Default)]
struct ConnectionCounters {
    up: AtomicBool,
    sent_bytes: AtomicU64,
    acked_bytes: AtomicU64,
    in_flight_bytes: AtomicU64,
    in_flight_batches: AtomicU64,
    /// When the oldest batch in flight was sent, in µs since the pool
    /// started (0: none in flight).
    oldest_sent_us: AtomicU64,
    /// Established at least once.
    up_before: AtomicBool,
    /// Established again after being lost.
    reconnects: AtomicU64,
    /// Batches the sink refused as bad input (each try).
    refusals: AtomicU64,
    /// Batches sent again after their connection failed.
    resent_batches: AtomicU64,
    /// Streams that failed, by reason (a gRPC code or a short name).
    failures: Mutex<BTreeMap<String, u64>>,
}

impl ConnectionCounters {
    fn failed(&self, reason: &str) {
        *lock(&self.failures).entry(reason.to_string()).or_default() += 1;
    }
}

/// One connection as [`FlightPool::connection_stats`] reports it.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ConnectionStats {
    pub index: usize,
    pub up: bool,
    /// Batches' bytes on the wire (IPC header and body) sent, sent again
    /// included, and acknowledged.
    pub sent_bytes: u64,
    pub acked_bytes: u64,
    /// Bytes in flight as charged against the window (a small batch
    /// counts as 64 KiB).
    pub in_flight_bytes: u64,
    pub in_flight_batches: u64,
    /// Age of the oldest batch sent and not yet acknowledged (0: none).
    pub oldest_unacked_seconds: f64,
    pub reconnects: u64,
    pub refusals: u64,
    pub resent_batches: u64,
    /// Streams that failed (connecting included), by reason: a gRPC code
    /// (`Unavailable`, `InvalidArgument`, ...), `connect`, `stream-closed`
    /// or `bad-ack`.
    pub failures: BTreeMap<String, u64>,
}

/// Refusals of the same batch before it is reported instead of retried.
const MAX_REFUSALS: u32 = 3;

/// Longest wait between reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_millis(500);

struct Queued {
    /// Place in the order batches were handed over: resent batches go back
    /// to their place in it, never ahead of older ones.
    order: u64,
    out: Outgoing,
    bytes: u64,
    refusals: u32,
    /// Whether this item still holds queue space (only until first taken).
    holds_queue_space: bool,
    /// When it was last sent (while in flight).
    sent_at: Option<Instant>,
}

struct Shared {
    config: ClientConfig,
    /// What the pool is called in logs and metrics: the sink's identity
    /// when its endpoint is followed, else the endpoint itself.
    name: String,
    /// Where the sink is served now (`None`: nowhere, for the moment).
    target: tokio::sync::watch::Receiver<Option<String>>,
    /// Keeps a fixed target's channel open.
    _fixed: Option<tokio::sync::watch::Sender<Option<String>>>,
    /// The endpoint made for the current target, and its URL.
    endpoint: Mutex<Option<(String, Endpoint)>>,
    /// Batches waiting to be sent, in hand-over order (see [`Shared::requeue`]).
    queue: Mutex<VecDeque<Queued>>,
    next_order: std::sync::atomic::AtomicU64,
    queued: Notify,
    /// Bounds the queue in KiB, so a fast reader cannot outrun the network.
    queue_space: Semaphore,
    queue_space_kib: u32,
    deliveries: mpsc::UnboundedSender<Delivery>,
    connected: AtomicUsize,
    counters: Vec<ConnectionCounters>,
    started: Instant,
    events: Option<Arc<dyn PoolEvents>>,
}

/// A pool of connections to one sink.
pub struct FlightPool {
    shared: Arc<Shared>,
    tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl FlightPool {
    /// Ends its connections and waits until their tasks are gone: a sink
    /// stopping after this sees no stream of this pool's. (Dropping the
    /// pool only asks them to end.)
    pub async fn close(&self) {
        let tasks = std::mem::take(
            &mut *self
                .tasks
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            let _ = task.await;
        }
    }
}

impl Drop for FlightPool {
    fn drop(&mut self) {
        let tasks = self
            .tasks
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for task in tasks.iter() {
            task.abort();
        }
    }
}

/// What a batch counts against the queue and the window. Small batches are
/// charged a floor, so thousands of tiny ones (many slow files, each
/// flushed by the linger timer) cannot pile up: their per-batch overhead
/// is real memory too.
fn batch_bytes(batch: &EncodedBatch) -> u64 {
    batch.memory_size().max(MIN_BATCH_CHARGE)
}

const MIN_BATCH_CHARGE: u64 = 64 << 10;

impl FlightPool {
    /// Starts the connection tasks; they connect (and reconnect) on their own.
    pub fn start(
        config: ClientConfig,
    ) -> Result<(Self, mpsc::UnboundedReceiver<Delivery>), ClientError> {
        Self::start_with_events(config, None)
    }

    /// [`FlightPool::start`], telling `events` what happens.
    pub fn start_with_events(
        config: ClientConfig,
        events: Option<Arc<dyn PoolEvents>>,
    ) -> Result<(Self, mpsc::UnboundedReceiver<Delivery>), ClientError> {
        let endpoint = make_endpoint(&config)?;
        let (fixed, target) = tokio::sync::watch::channel(Some(config.endpoint.clone()));
        let name = config.endpoint.clone();
        Self::start_inner(config, events, name, target, Some(fixed), Some(endpoint))
    }

    /// A pool for a sink identity whose endpoint moves (a fleet's
    /// takeovers): each connection connects to `target`'s endpoint of the
    /// moment, waits while it is `None`, and lets go of its stream (its
    /// batches go back to the queue) as soon as it changes. `config.endpoint`
    /// is ignored; `name` stands for the sink in logs and metrics.
    pub fn start_following(
        config: ClientConfig,
        events: Option<Arc<dyn PoolEvents>>,
        name: String,
        target: tokio::sync::watch::Receiver<Option<String>>,
    ) -> Result<(Self, mpsc::UnboundedReceiver<Delivery>), ClientError> {
        Self::start_inner(config, events, name, target, None, None)
    }

    fn start_inner(
        config: ClientConfig,
        events: Option<Arc<dyn PoolEvents>>,
        name: String,
        target: tokio::sync::watch::Receiver<Option<String>>,
        fixed: Option<tokio::sync::watch::Sender<Option<String>>>,
        endpoint: Option<(String, Endpoint)>,
    ) -> Result<(Self, mpsc::UnboundedReceiver<Delivery>), ClientError> {
        let (deliveries, receiver) = mpsc::unbounded_channel();
        // One window's worth queued for all the connections: each finds a
        // batch ready as soon as an ack opens room in its window. More
        // would only hold memory (and a first touch of it) while the
        // windows are full.
        let queue_space_kib = (config.window_bytes >> 10).clamp(1024, u32::MAX as u64 >> 4) as u32;
        let shared = Arc::new(Shared {
            name,
            target,
            _fixed: fixed,
            endpoint: Mutex::new(endpoint),
            queue: Mutex::new(VecDeque::new()),
            next_order: std::sync::atomic::AtomicU64::new(0),
            queued: Notify::new(),
            queue_space: Semaphore::new(queue_space_kib as usize),
            queue_space_kib,
            deliveries,
            connected: AtomicUsize::new(0),
            counters: (0..config.connections.max(1))
                .map(|_| ConnectionCounters::default())
                .collect(),
            started: Instant::now(),
            events,
            config,
        });
        let tasks = (0..shared.config.connections.max(1))
            .map(|index| tokio::spawn(run_connection(shared.clone(), index)))
            .collect();
        Ok((
            Self {
                shared,
                tasks: std::sync::Mutex::new(tasks),
            },
            receiver,
        ))
    }

    /// Queues a batch, waiting while the queue is full.
    pub async fn send(&self, out: Outgoing) {
        let bytes = batch_bytes(&out.batch);
        let kib = ((bytes >> 10) as u32).clamp(1, self.shared.queue_space_kib);
        // The semaphore is never closed, so acquiring cannot fail.
        if let Ok(permit) = self.shared.queue_space.acquire_many(kib).await {
            permit.forget();
        }
        self.shared.push_back(Queued {
            order: 0,
            out,
            bytes,
            refusals: 0,
            holds_queue_space: true,
            sent_at: None,
        });
    }

    /// Connections this pool keeps (established or being re-established).
    pub fn connections(&self) -> usize {
        self.shared.config.connections.max(1)
    }

    /// Connections currently established.
    pub fn connected(&self) -> usize {
        self.shared.connected.load(Ordering::Relaxed)
    }

    /// The sink's name in logs and metrics: its identity when followed,
    /// else its endpoint.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Where the sink is served now (`None`: nowhere, for the moment).
    pub fn endpoint(&self) -> Option<String> {
        self.shared.target.borrow().clone()
    }

    /// Each connection's figures now.
    pub fn connection_stats(&self) -> Vec<ConnectionStats> {
        let now_us = self.shared.started.elapsed().as_micros() as u64;
        self.shared
            .counters
            .iter()
            .enumerate()
            .map(|(index, c)| {
                let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
                let oldest = load(&c.oldest_sent_us);
                ConnectionStats {
                    index,
                    up: c.up.load(Ordering::Relaxed),
                    sent_bytes: load(&c.sent_bytes),
                    acked_bytes: load(&c.acked_bytes),
                    in_flight_bytes: load(&c.in_flight_bytes),
                    in_flight_batches: load(&c.in_flight_batches),
                    oldest_unacked_seconds: if oldest == 0 {
                        0.0
                    } else {
                        now_us.saturating_sub(oldest) as f64 / 1e6
                    },
                    reconnects: load(&c.reconnects),
                    refusals: load(&c.refusals),
                    resent_batches: load(&c.resent_batches),
                    failures: lock(&c.failures).clone(),
                }
            })
            .collect()
    }

    /// Runs a Flight action on a connection of its own and returns its body.
    /// Waits while the sink has no endpoint.
    pub async fn action(&self, name: &str, body: Vec<u8>) -> Result<Vec<u8>, ClientError> {
        let (url, endpoint) = self.shared.current_endpoint().await?;
        let config = ClientConfig {
            endpoint: url,
            ..self.shared.config.clone()
        };
        run_action(&config, &endpoint, name, body).await
    }
}

impl Shared {
    /// The endpoint to connect to now, waiting while there is none. Made
    /// once per URL (it loads the TLS files).
    async fn current_endpoint(&self) -> Result<(String, Endpoint), ClientError> {
        let mut target = self.target.clone();
        let url = match target.wait_for(Option::is_some).await {
            Ok(url) => url.clone().unwrap_or_default(),
            // The follower is gone: the pool is being dropped.
            Err(_) => {
                return Err(ClientError::Endpoint {
                    endpoint: self.name.clone(),
                    detail: "no longer followed".into(),
                });
            }
        };
        if let Some((cached, endpoint)) = lock(&self.endpoint).as_ref()
            && *cached == url
        {
            return Ok((cached.clone(), endpoint.clone()));
        }
        let made = make_endpoint(&ClientConfig {
            endpoint: url,
            ..self.config.clone()
        })?;
        *lock(&self.endpoint) = Some(made.clone());
        Ok(made)
    }

    fn push_back(&self, mut item: Queued) {
        let mut queue = lock(&self.queue);
        // Numbered under the lock, so the queue stays in order.
        item.order = self.next_order.fetch_add(1, Ordering::Relaxed);
        queue.push_back(item);
        drop(queue);
        self.queued.notify_waiters();
    }

    /// Puts batches that were in flight back in the queue at their place in
    /// hand-over order. Connections fail at different times; putting each
    /// one's batches at the front would let a later range of a file go out
    /// before an earlier one that failed on another connection, and a sink
    /// writing in order holds the later range until the earlier arrives,
    /// which may sit unread behind it in the same stream.
    fn requeue(&self, items: Vec<Queued>) {
        if items.is_empty() {
            return;
        }
        let mut queue = lock(&self.queue);
        for item in items {
            let at = queue.partition_point(|queued| queued.order < item.order);
            queue.insert(at, item);
        }
        drop(queue);
        self.queued.notify_waiters();
    }

    /// Takes the next batch. Cancel-safe: nothing is taken unless it returns.
    async fn next(&self) -> Queued {
        loop {
            let notified = self.queued.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(mut item) = lock(&self.queue).pop_front() {
                if std::mem::take(&mut item.holds_queue_space) {
                    self.queue_space.add_permits(
                        ((item.bytes >> 10) as u32).clamp(1, self.queue_space_kib) as usize,
                    );
                }
                return item;
            }
            notified.await;
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere cannot leave a VecDeque half-updated in a way that matters here.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One connection: connect, stream, and on any failure hand the unacknowledged
/// batches back to the queue and reconnect with backoff.
async fn run_connection(shared: Arc<Shared>, index: usize) {
    let mut backoff = Duration::from_millis(50);
    let counters = &shared.counters[index];
    loop {
        let mut in_flight = BTreeMap::new();
        let result = stream_once(&shared, index, &mut in_flight, &mut backoff).await;
        counters.up.store(false, Ordering::Relaxed);
        counters.in_flight_bytes.store(0, Ordering::Relaxed);
        counters.in_flight_batches.store(0, Ordering::Relaxed);
        counters.oldest_sent_us.store(0, Ordering::Relaxed);
        let unacked: Vec<Queued> = in_flight.into_values().collect();
        let count = unacked.len();
        counters
            .resent_batches
            .fetch_add(count as u64, Ordering::Relaxed);
        match result {
            Ok(()) => {
                tracing::info!(sink = %shared.name, connection = index, "stream closed by the sink")
            }
            Err(StreamFailure::Refused(status)) => {
                counters.refusals.fetch_add(1, Ordering::Relaxed);
                counters.failed(&code_name(status.code()));
                tracing::error!(sink = %shared.name, connection = index, error = %status.message(), resent = count, "sink refused a batch");
                let mut retry = Vec::new();
                for mut item in unacked {
                    item.refusals += 1;
                    if item.refusals >= MAX_REFUSALS {
                        let _ = shared.deliveries.send(Delivery::Refused {
                            token: item.out.token,
                            error: status.message().to_owned(),
                        });
                    } else {
                        retry.push(item);
                    }
                }
                shared.requeue(retry);
                tokio::time::sleep(backoff).await;
                continue;
            }
            Err(StreamFailure::Transport { reason, detail }) => {
                counters.failed(&reason);
                tracing::warn!(sink = %shared.name, connection = index, error = %detail, resent = count, "connection lost; reconnecting");
            }
        }
        shared.requeue(unacked);
        tokio::time::sleep(backoff).await;
        // Capped low: a restarted sink should see its watchers back within a
        // fraction of a second, and a refused connect costs little.
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

enum StreamFailure {
    /// The sink answered a batch with an error of its own (bad input).
    Refused(tonic::Status),
    /// Connecting failed or the connection broke; `reason` is a short,
    /// bounded name for metrics (a gRPC code, `connect`, ...).
    Transport { reason: String, detail: String },
}

impl StreamFailure {
    fn transport(reason: &str, detail: String) -> Self {
        StreamFailure::Transport {
            reason: reason.to_string(),
            detail,
        }
    }
}

/// A gRPC code as a metric label ("Unavailable", "InvalidArgument", ...).
fn code_name(code: tonic::Code) -> String {
    format!("{code:?}")
}

fn classify(status: tonic::Status) -> StreamFailure {
    use tonic::Code;
    match status.code() {
        Code::InvalidArgument
        | Code::PermissionDenied
        | Code::FailedPrecondition
        | Code::OutOfRange => StreamFailure::Refused(status),
        code => StreamFailure::transport(
            &code_name(code),
            format!("{}: {}", status.code(), status.message()),
        ),
    }
}

/// The first message of a stream: the range schema, with the hello as its descriptor.
fn schema_message(hello: &Hello) -> FlightData {
    let cmd = serde_json::to_vec(hello).unwrap_or_default();
    FlightData::from(SchemaAsIpc::new(
        &range_schema(),
        &IpcWriteOptions::default(),
    ))
    .with_descriptor(FlightDescriptor::new_cmd(cmd))
}

/// A batch as a DoPut message numbered `seq`; header and body are shared,
/// not copied.
fn batch_message(batch: &EncodedBatch, seq: u64) -> FlightData {
    FlightData {
        data_header: batch.header.clone(),
        data_body: batch.body.clone(),
        app_metadata: protocol::encode_seq(seq).to_vec().into(),
        flight_descriptor: None,
    }
}

async fn stream_once(
    shared: &Arc<Shared>,
    index: usize,
    in_flight: &mut BTreeMap<u64, Queued>,
    backoff: &mut Duration,
) -> Result<(), StreamFailure> {
    let mut moved = shared.target.clone();
    let (endpoint, channel_endpoint) = shared
        .current_endpoint()
        .await
        .map_err(|e| StreamFailure::transport("connect", e.to_string()))?;
    // A change from now on ends this stream (a takeover moved the sink);
    // one since the endpoint was read ends it at once.
    let target_now = moved.borrow_and_update().clone();
    if target_now.as_deref() != Some(endpoint.as_str()) {
        return Err(StreamFailure::transport(
            "moved",
            format!(
                "the sink moved from {endpoint} to {} before the stream started",
                target_now.as_deref().unwrap_or("nowhere yet")
            ),
        ));
    }
    let endpoint = &endpoint;
    let channel = channel_endpoint.connect().await.map_err(|e| {
        StreamFailure::transport(
            "connect",
            format!("cannot connect to {endpoint}: {}", error_chain(&e)),
        )
    })?;
    let max_bytes = shared.config.max_message_bytes;
    let (tx, rx) = mpsc::channel::<MessageFrames>(2);
    let hello = Hello::new(&shared.config.source);
    let hello = frames(schema_message(&hello), max_bytes).map_err(classify)?;
    tx.send(hello)
        .await
        .map_err(|_| StreamFailure::transport("stream-closed", "request stream closed".into()))?;
    let mut responses = put_stream::do_put(channel, rx, max_bytes)
        .await
        .map_err(classify)?;
    shared.connected.fetch_add(1, Ordering::Relaxed);
    let _connected = scopeguard(|| {
        shared.connected.fetch_sub(1, Ordering::Relaxed);
    });
    let counters = &shared.counters[index];
    if counters.up_before.swap(true, Ordering::Relaxed) {
        counters.reconnects.fetch_add(1, Ordering::Relaxed);
    }
    counters.up.store(true, Ordering::Relaxed);
    // The oldest batch in flight is the first by sequence number.
    let publish_oldest = |in_flight: &BTreeMap<u64, Queued>| {
        let oldest = in_flight
            .first_key_value()
            .and_then(|(_, item)| item.sent_at)
            .map_or(0, |at| {
                (at.saturating_duration_since(shared.started).as_micros() as u64).max(1)
            });
        counters.oldest_sent_us.store(oldest, Ordering::Relaxed);
        counters
            .in_flight_batches
            .store(in_flight.len() as u64, Ordering::Relaxed);
    };
    let mut next_seq = 0u64;
    let mut in_flight_bytes = 0u64;
    loop {
        tokio::select! {
            changed = moved.changed() => {
                let now = changed.ok().and_then(|()| moved.borrow().clone());
                if now.as_deref() != Some(endpoint.as_str()) {
                    return Err(StreamFailure::transport(
                        "moved",
                        format!("the sink moved from {endpoint} to {}", now.as_deref().unwrap_or("nowhere yet")),
                    ));
                }
            }
            response = responses.message() => {
                let Some(put) = response.map_err(classify)? else {
                    return Ok(());
                };
                let ack = Ack::decode(&put.app_metadata)
                    .map_err(|e| StreamFailure::transport("bad-ack", format!("unreadable ack from {endpoint}: {e}")))?;
                let Some(item) = in_flight.remove(&ack.seq) else {
                    return Err(StreamFailure::transport("bad-ack", format!("{endpoint} acknowledged batch {} that was not in flight", ack.seq)));
                };
                in_flight_bytes -= item.bytes;
                counters.in_flight_bytes.store(in_flight_bytes, Ordering::Relaxed);
                counters
                    .acked_bytes
                    .fetch_add(item.out.batch.wire_len(), Ordering::Relaxed);
                publish_oldest(in_flight);
                if let (Some(events), Some(sent_at)) = (&shared.events, item.sent_at) {
                    events.batch_acked(&shared.name, index, item.out.batch.wire_len(), sent_at.elapsed());
                }
                *backoff = Duration::from_millis(50);
                let _ = shared.deliveries.send(Delivery::Acked { token: item.out.token, ack });
            }
            item = shared.next(), if in_flight_bytes < shared.config.window_bytes
                && in_flight.len() < protocol::MAX_UNACKED_BATCHES => {
                let seq = next_seq;
                next_seq += 1;
                let message = batch_message(&item.out.batch, seq);
                in_flight_bytes += item.bytes;
                let mut item = item;
                item.sent_at = Some(Instant::now());
                counters
                    .sent_bytes
                    .fetch_add(item.out.batch.wire_len(), Ordering::Relaxed);
                counters.in_flight_bytes.store(in_flight_bytes, Ordering::Relaxed);
                in_flight.insert(seq, item);
                publish_oldest(in_flight);
                // Too large a batch is refused like one the sink refused.
                let message = frames(message, max_bytes).map_err(classify)?;
                if tx.send(message).await.is_err() {
                    // The request stream ended; the response side says why.
                    let status = responses.message().await.err();
                    return Err(status.map(classify).unwrap_or_else(|| StreamFailure::transport("stream-closed", "request stream closed".into())));
                }
            }
        }
    }
}

struct ScopeGuard<F: FnMut()>(F);

impl<F: FnMut()> Drop for ScopeGuard<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

fn scopeguard<F: FnMut()>(f: F) -> ScopeGuard<F> {
    ScopeGuard(f)
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;
    use crate::wire::BatchBuilder;

    fn batch_of(bytes: usize) -> EncodedBatch {
        let mut builder = BatchBuilder::with_capacity(1, bytes);
        builder.push_data("f", 1, 0, &vec![7; bytes]);
        builder.finish_encoded()
    }

    /// Batches wait before the connections' windows in a queue of one
    /// window's worth for them all: with no connection up, the pool takes
    /// that much and then makes its sender wait.
    #[tokio::test]
    async fn the_queue_before_the_connections_holds_one_window() {
        let nothing_listens = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = nothing_listens.local_addr().unwrap();
        drop(nothing_listens);
        let window = 2u64 << 20;
        let (pool, _deliveries) = FlightPool::start(ClientConfig {
            endpoint: format!("http://{address}"),
            connections: 4,
            window_bytes: window,
            ..ClientConfig::default()
        })
        .unwrap();
        let mut queued = 0u64;
        for token in 0..64 {
            let batch = batch_of(500 << 10);
            let bytes = batch_bytes(&batch);
            match pool.send(Outgoing { token, batch }).now_or_never() {
                Some(()) => queued += bytes,
                None => break,
            }
        }
        assert!(queued <= window, "{queued} bytes queued");
        assert!(queued > window - (600 << 10), "{queued} bytes queued");
        pool.close().await;
    }
}
