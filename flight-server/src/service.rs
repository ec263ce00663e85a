//! The Flight service of a sink: DoPut ingest with per-batch acks, and actions.
//!
//! The service owns the wire-level checks (hello, schema, sequence numbers,
//! crc32c) and the pipelining of batches within one stream; what placing a
//! batch means belongs to the [`Ingest`] the sink plugs in.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaResult, Ticket,
};
use futures::future::BoxFuture;
use futures::stream::{BoxStream, FuturesUnordered};
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::connection::ServerConnection;
use crate::decode;
use crate::federation::{Asked, Federation};
use crate::protocol::{self, Hello};
use crate::read_access::{ReadAccess, ReadGate};
use crate::route::{Acks, Messages, PutRequest, RoutedStreams, RoutesLayer};
use crate::tls::ServerTls;
use crate::wire::RangeBatch;

/// What a placed batch leaves to wait for: resolves with its ack once
/// everything the ack reports is durable.
pub type AwaitDurable = Pin<Box<dyn Future<Output = Result<protocol::Ack, Status>> + Send>>;

/// Placed batches of one stream waiting to become durable, at most. Their
/// batches are dropped once placed; what each still costs the sink (the
/// ranges it waits for) is bounded by the sink itself.
const MAX_AWAITING_DURABLE: usize = protocol::MAX_UNACKED_BATCHES;

/// What a sink does with validated batches.
pub trait Ingest: Send + Sync + 'static {
    /// Accepts (or refuses) a stream from `source`, before any batch.
    fn accept_source(&self, source: &str) -> Result<(), Status>;

    /// Places one batch: resolves once its bytes are in their files (or
    /// held by the sink until the bytes before them arrive), when the batch
    /// itself is no longer needed, with the wait for its ack.
    fn ingest(
        &self,
        source: Arc<str>,
        seq: u64,
        batch: RangeBatch,
    ) -> impl Future<Output = Result<AwaitDurable, Status>> + Send;

    /// Answers a Flight action with a JSON body.
    fn action(
        &self,
        name: &str,
        body: &[u8],
    ) -> impl Future<Output = Result<Vec<u8>, Status>> + Send;

    /// Serves a DoGet ticket from `peer` as a stream of Flight messages.
    fn get(
        &self,
        ticket: Ticket,
        peer: String,
    ) -> impl Future<Output = Result<BoxStream<'static, Result<FlightData, Status>>, Status>> + Send
    {
        let _ = (ticket, peer);
        async { Err(Status::unimplemented("DoGet is not served by this sink")) }
    }

    /// Lists what a ListFlights criteria expression matches.
    fn list(
        &self,
        criteria: Vec<u8>,
    ) -> impl Future<Output = Result<Vec<FlightInfo>, Status>> + Send {
        let _ = criteria;
        async {
            Err(Status::unimplemented(
                "ListFlights is not served by this sink",
            ))
        }
    }

    /// Describes one flight (GetFlightInfo).
    fn info(
        &self,
        descriptor: FlightDescriptor,
    ) -> impl Future<Output = Result<FlightInfo, Status>> + Send {
        let _ = descriptor;
        async {
            Err(Status::unimplemented(
                "GetFlightInfo is not served by this sink",
            ))
        }
    }
}

/// Limits and transport settings of the server.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub tls: Option<ServerTls>,
    /// Largest decoded gRPC message accepted (tonic's default is 4 MiB).
    pub max_message_bytes: usize,
    /// HTTP/2 flow-control windows; match the clients' in-flight window.
    pub stream_window_bytes: u32,
    pub connection_window_bytes: u32,
    /// Batches of one stream being placed at once (placed batches waiting
    /// to become durable do not count: see `MAX_AWAITING_DURABLE`).
    pub pipeline_depth: usize,
    /// DoPut streams served at once; with the message limit and the
    /// pipeline depth this bounds the batches peers can make the sink hold.
    pub max_streams: usize,
    /// Who may subscribe and list (see [`crate::read_access`]).
    pub read_access: ReadAccess,
    /// How long a DoPut message that has begun may go without a byte
    /// before its stream is ended (see [`crate::stall`]).
    pub message_stall: Duration,
    /// A fleet's catalogue: listings answer for every member (see
    /// [`crate::federation`]).
    pub federation: Option<Federation>,
}

/// Largest HTTP/2 frame peers may send. Every DATA frame is handled on its
/// own by h2 and by the DoPut route, and the watcher writes one per
/// `writev`: at HTTP/2's default of 16 KiB a gigabyte is 65,000 of them. A
/// larger frame only needs that much more of the connection's read buffer;
/// 1 MiB is the watcher's largest row, and the cost per byte measured at
/// 4 MiB was no lower (docs/measurements.md).
const HTTP2_MAX_FRAME_BYTES: u32 = 1 << 20;

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            tls: None,
            max_message_bytes: 64 << 20,
            stream_window_bytes: 64 << 20,
            connection_window_bytes: 64 << 20,
            pipeline_depth: 8,
            max_streams: 256,
            read_access: ReadAccess::default(),
            message_stall: crate::stall::MESSAGE_STALL,
            federation: None,
        }
    }
}

/// Runs the Flight service until `shutdown` resolves.
pub async fn serve<I: Ingest>(
    ingest: Arc<I>,
    config: ServerConfig,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mutual_tls = config
        .tls
        .as_ref()
        .is_some_and(|tls| tls.client_ca.is_some());
    let (drain_tx, drain_rx) = tokio::sync::watch::channel(false);
    let draining = Draining(drain_rx);
    let readers = Arc::new(ReadGate::new(config.read_access.clone(), mutual_tls));
    let streams = Streams {
        draining: draining.clone(),
        ingest: ingest.clone(),
        readers: readers.clone(),
        pipeline_depth: config.pipeline_depth.max(1),
        put_permits: Arc::new(tokio::sync::Semaphore::new(config.max_streams.max(1))),
        per_peer: Default::default(),
    };
    let routes = RoutesLayer::new(
        streams.clone(),
        config.max_message_bytes,
        config.message_stall,
    );
    let service = Service {
        readers,
        ingest,
        streams,
        federation: config.federation.clone(),
    };
    let server = FlightServiceServer::new(service)
        .max_decoding_message_size(config.max_message_bytes)
        .max_encoding_message_size(config.max_message_bytes);
    let mut builder = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .initial_stream_window_size(config.stream_window_bytes)
        .initial_connection_window_size(config.connection_window_bytes)
        .max_frame_size(Some(HTTP2_MAX_FRAME_BYTES))
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)));
    if let Some(tls) = &config.tls {
        builder = builder.tls_config(tls.load()?)?;
    }
    // DoPut and DoGet are served by routes of their own, ahead of tonic's.
    let mut builder = builder.layer(routes);
    let tls = config.tls.is_some();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener)
        .map(move |accepted| accepted.map(|stream| ServerConnection::new(stream, tls)));
    // DoPut streams live as long as their watchers, so a graceful shutdown
    // would wait forever: stop accepting, give streams a moment to finish
    // what is in flight, then drop them. Nothing acknowledged is lost, and
    // what was not acknowledged is sent again.
    let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
    let stop_accepting = async move {
        shutdown.await;
        let _ = drain_tx.send(true);
        let _ = stopping_tx.send(());
    };
    let server = builder
        .add_service(server)
        .serve_with_incoming_shutdown(incoming, stop_accepting);
    tokio::pin!(server);
    tokio::select! {
        result = &mut server => result?,
        _ = async {
            let _ = stopping_rx.await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => tracing::info!("streams still open after the shutdown grace period; closing them"),
    }
    Ok(())
}

/// How long open streams may run on after a shutdown was asked for.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Whether the server is shutting down: streams end as soon as what they
/// took in is acknowledged (DoPut) or at once (DoGet), so that a planned
/// stop or handover waits for nothing else.
#[derive(Clone)]
struct Draining(tokio::sync::watch::Receiver<bool>);

impl Draining {
    fn never() -> Self {
        let (_, receiver) = tokio::sync::watch::channel(false);
        Self(receiver)
    }

    fn is_draining(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once draining starts (never, if the server is gone
    /// without draining).
    async fn started(&mut self) {
        if self.0.wait_for(|draining| *draining).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

struct Service<I> {
    ingest: Arc<I>,
    readers: Arc<ReadGate>,
    streams: Streams<I>,
    federation: Option<Federation>,
}

/// What serves DoPut and DoGet streams: shared by the route that serves
/// them ahead of tonic's router (see [`crate::route`]) and by tonic's
/// handlers.
struct Streams<I> {
    draining: Draining,
    ingest: Arc<I>,
    readers: Arc<ReadGate>,
    pipeline_depth: usize,
    /// DoPut streams served at once, at most.
    put_permits: Arc<tokio::sync::Semaphore>,
    /// DoPut streams open per peer address, so that one peer cannot hold
    /// every stream the sink serves.
    per_peer: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
}

impl<I> Clone for Streams<I> {
    fn clone(&self) -> Self {
        Self {
            draining: self.draining.clone(),
            ingest: self.ingest.clone(),
            readers: self.readers.clone(),
            pipeline_depth: self.pipeline_depth,
            put_permits: self.put_permits.clone(),
            per_peer: self.per_peer.clone(),
        }
    }
}

/// Most DoPut streams one peer address may hold open at once (a watcher
/// opens one per connection, 4 by default).
pub const MAX_STREAMS_PER_PEER: usize = 64;
/// How long a DoPut stream may stay open without its first message (the
/// hello): a peer that opens streams and sends nothing gives them up.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(30);

/// A peer's hold on one of its DoPut streams, given back when dropped.
struct PeerStream {
    per_peer: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
    address: Option<std::net::IpAddr>,
}

impl PeerStream {
    fn take(
        per_peer: &Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
        address: Option<std::net::IpAddr>,
        peer: &str,
    ) -> Result<Self, Status> {
        if let Some(address) = address {
            let mut open = per_peer.lock().unwrap_or_else(|p| p.into_inner());
            let count = open.entry(address).or_default();
            if *count >= MAX_STREAMS_PER_PEER {
                return Err(Status::resource_exhausted(format!(
                    "peer {peer}: {MAX_STREAMS_PER_PEER} streams from this address are open already; retry later"
                )));
            }
            *count += 1;
        }
        Ok(Self {
            per_peer: per_peer.clone(),
            address,
        })
    }
}

impl Drop for PeerStream {
    fn drop(&mut self) {
        if let Some(address) = self.address {
            let mut open = self.per_peer.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(count) = open.get_mut(&address) {
                *count -= 1;
                if *count == 0 {
                    open.remove(&address);
                }
            }
        }
    }
}

impl<I: Ingest> Streams<I> {
    /// Serves a DoGet ticket; a subscription ends, saying why, when the
    /// server drains.
    async fn get(&self, request: Request<Ticket>) -> Result<Boxed<FlightData>, Status> {
        self.readers.check(&request)?;
        let peer = peer_name(&request);
        let stream = self.ingest.get(request.into_inner(), peer).await?;
        // A subscription ends when the server drains, saying why: its
        // consumer resumes from its cursor at the identity's next process.
        let mut draining = self.draining.clone();
        // Set only when the drain cut the stream, not when it ended itself.
        let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cutting = cut.clone();
        let stream = stream
            .take_until(async move {
                draining.started().await;
                cutting.store(true, std::sync::atomic::Ordering::SeqCst);
            })
            .chain(
                futures::stream::once(async move { cut.load(std::sync::atomic::Ordering::SeqCst) })
                    .filter_map(|drained| {
                        std::future::ready(drained.then(|| {
                            Err(Status::unavailable(
                                "the sink is stopping (a handover or a restart): resume from \
                                 your cursor",
                            ))
                        }))
                    }),
            );
        Ok(Box::pin(stream))
    }

    /// Takes a DoPut stream: checks the peer, then reads its messages and
    /// answers with its acks.
    fn open<S>(&self, request: Request<S>) -> Result<Response<Boxed<PutResult>>, Status>
    where
        S: Stream<Item = Result<FlightData, Status>> + Send + Unpin + 'static,
    {
        self.readers.refuse_readers(&request)?;
        let peer = peer_name(&request);
        let peer_stream =
            PeerStream::take(&self.per_peer, request.remote_addr().map(|a| a.ip()), &peer)?;
        let permit = self.put_permits.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "peer {peer}: the sink serves its maximum number of streams; retry later"
            ))
        })?;
        let (tx, rx) = mpsc::channel(self.pipeline_depth * 2);
        let ingest = self.ingest.clone();
        let depth = self.pipeline_depth;
        let draining = self.draining.clone();
        tokio::spawn(async move {
            let _permit = (permit, peer_stream);
            // `run_put` tells a panic decoding the peer's bytes (its fault)
            // from one placing them (the sink's). Anything else that panics
            // here is the sink's own bug too: it ends this stream, never the
            // sink or other streams, and is never reported as bad input.
            let outcome =
                run_put_catching(ingest, &peer, request.into_inner(), &tx, depth, draining).await;
            if let Err(status) = outcome {
                if connection_lost(&status) {
                    // A watcher stopping or crashing: nothing was refused.
                    tracing::info!(%peer, error = %status.message(), "DoPut stream ended: the peer's connection closed");
                } else {
                    tracing::warn!(%peer, error = %status.message(), "DoPut stream refused");
                }
                let _ = tx.send(Err(status)).await;
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

impl<I: Ingest> RoutedStreams for Streams<I> {
    fn open_put(&self, request: PutRequest) -> Result<Acks, Status> {
        self.open(request).map(Response::into_inner)
    }

    fn open_get(&self, request: Request<Ticket>) -> BoxFuture<'static, Result<Messages, Status>> {
        let streams = self.clone();
        Box::pin(async move { streams.get(request).await })
    }
}

type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

fn peer_name<T>(request: &Request<T>) -> String {
    request
        .remote_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|| "unknown peer".into())
}

#[tonic::async_trait]
impl<I: Ingest> FlightService for Service<I> {
    type HandshakeStream = Boxed<HandshakeResponse>;
    type ListFlightsStream = Boxed<FlightInfo>;
    type DoGetStream = Boxed<FlightData>;
    type DoPutStream = Boxed<PutResult>;
    type DoExchangeStream = Boxed<FlightData>;
    type DoActionStream = Boxed<arrow_flight::Result>;
    type ListActionsStream = Boxed<ActionType>;

    async fn handshake(
        &self,
        _: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        Err(Status::unimplemented(
            "no handshake: authenticate with mutual TLS",
        ))
    }

    async fn list_flights(
        &self,
        request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        self.readers.check(&request)?;
        let asked = Asked::of(&request);
        let criteria = request.into_inner().expression.to_vec();
        let mut infos = self.ingest.list(criteria.clone()).await?;
        if let Some(federation) = &self.federation {
            federation.stamp_own(&mut infos);
            if !asked.by_member {
                infos.extend(federation.list_others(&criteria, &asked).await);
            }
        }
        Ok(Response::new(Box::pin(futures::stream::iter(
            infos.into_iter().map(Ok),
        ))))
    }

    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.readers.check(&request)?;
        let asked = Asked::of(&request);
        let descriptor = request.into_inner();
        let Some(federation) = &self.federation else {
            return Ok(Response::new(self.ingest.info(descriptor).await?));
        };
        match self.ingest.info(descriptor.clone()).await {
            Ok(info) => {
                let mut infos = [info];
                federation.stamp_own(&mut infos);
                let [info] = infos;
                Ok(Response::new(info))
            }
            Err(status) if status.code() == tonic::Code::NotFound && !asked.by_member => Ok(
                Response::new(federation.describe_elsewhere(descriptor, &asked).await?),
            ),
            Err(status) => Err(status),
        }
    }

    async fn poll_flight_info(
        &self,
        _: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        Err(Status::unimplemented("poll_flight_info is not served"))
    }

    async fn get_schema(
        &self,
        _: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        Err(Status::unimplemented("get_schema is not served"))
    }

    async fn do_get(
        &self,
        request: Request<Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        self.streams.get(request).await.map(Response::new)
    }

    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        self.streams.open(request)
    }

    async fn do_exchange(
        &self,
        _: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        Err(Status::unimplemented("do_exchange is not served"))
    }

    async fn do_action(
        &self,
        request: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        let action = request.into_inner();
        let body = self.ingest.action(&action.r#type, &action.body).await?;
        let result = arrow_flight::Result { body: body.into() };
        Ok(Response::new(Box::pin(futures::stream::once(async {
            Ok(result)
        }))))
    }

    async fn list_actions(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        let actions = [
            (
                protocol::ACTION_WATERMARKS,
                "durable watermarks of a source: body {\"source\": NAME}",
            ),
            (protocol::ACTION_STATUS, "counters and state of the sink"),
        ]
        .map(|(name, description)| {
            Ok(ActionType {
                r#type: name.into(),
                description: description.into(),
            })
        });
        Ok(Response::new(Box::pin(futures::stream::iter(actions))))
    }
}

/// Whether a stream failed because the peer's connection went away rather
/// than because this side refused what it sent.
fn connection_lost(status: &Status) -> bool {
    if status.code() == tonic::Code::Cancelled {
        return true;
    }
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if let Some(h2) = error.downcast_ref::<h2::Error>() {
            // The connection broke (an I/O error) or the peer reset or
            // abandoned the stream: it is gone, it was not refused.
            return h2.is_io() || h2.is_go_away() || (h2.is_reset() && h2.is_remote());
        }
        source = error.source();
    }
    false
}

/// Reads one DoPut stream, places up to `depth` batches at once and sends each
/// ack as soon as its batch is durable. Returns the error that ends the stream.
///
/// A placed batch leaves the placing stage at once, so waiting for durability
/// never stops the stream being read: a batch whose ranges the sink holds
/// until the bytes before them arrive may wait for a batch further down this
/// very stream.
async fn run_put<I: Ingest>(
    ingest: Arc<I>,
    peer: &str,
    mut stream: impl Stream<Item = Result<FlightData, Status>> + Unpin,
    acks: &mpsc::Sender<Result<PutResult, Status>>,
    depth: usize,
    mut draining: Draining,
) -> Result<(), Status> {
    use futures::FutureExt;
    let mut source: Option<Arc<str>> = None;
    let mut schema_seen = false;
    let mut placing = FuturesUnordered::new();
    let mut awaiting = FuturesUnordered::new();
    let mut input_done = false;
    let hello_deadline = tokio::time::Instant::now() + HELLO_TIMEOUT;
    loop {
        let drained = draining.is_draining();
        if drained && !input_done && placing.is_empty() && awaiting.is_empty() {
            // Everything read was acknowledged: the peer sends the rest to
            // whoever serves next.
            return Err(Status::unavailable(format!(
                "peer {peer}: the sink is stopping (a handover or a restart); send what was not \
                 acknowledged again"
            )));
        }
        let may_read = !input_done
            && !drained
            && placing.len() < depth
            && awaiting.len() < MAX_AWAITING_DURABLE;
        tokio::select! {
            // Once the peer has sent everything, its acks are all that is
            // left: the drain changes nothing then.
            () = draining.started(), if !drained && !input_done => {}
            // A stream that ended without a hello has nothing more to wait for.
            _ = tokio::time::sleep_until(hello_deadline), if source.is_none() && !input_done => {
                return Err(Status::deadline_exceeded(format!(
                    "peer {peer}: no hello within {} s of opening the stream; closing it",
                    HELLO_TIMEOUT.as_secs()
                )));
            }
            Some(result) = awaiting.next(), if !awaiting.is_empty() => {
                let ack: protocol::Ack = result?;
                let put = PutResult { app_metadata: ack.encode().into() };
                if acks.send(Ok(put)).await.is_err() {
                    return Ok(()); // the peer went away; nothing left to tell it
                }
            }
            Some(result) = placing.next(), if !placing.is_empty() => {
                let (seq, placed): (u64, Result<AwaitDurable, Status>) = result;
                let durable = placed?;
                awaiting.push(
                    std::panic::AssertUnwindSafe(durable)
                        .catch_unwind()
                        .map(move |outcome| outcome.unwrap_or_else(|panic| Err(sink_panic(seq, "waiting for it to become durable", panic)))),
                );
            }
            message = stream.next(), if may_read => {
                let Some(data) = message.transpose()? else {
                    input_done = true;
                    continue;
                };
                if source.is_none() {
                    let descriptor = data.flight_descriptor.as_ref().ok_or_else(|| {
                        Status::invalid_argument(format!("peer {peer}: the first message of a DoPut stream must carry a descriptor with the tailflight hello"))
                    })?;
                    let hello = Hello::decode(&descriptor.cmd)
                        .map_err(|e| Status::invalid_argument(format!("peer {peer}: {e}")))?;
                    ingest.accept_source(&hello.source)?;
                    source = Some(Arc::from(hello.source.as_str()));
                }
                let Some((seq, batch)) = decode_put(peer, &data, &mut schema_seen)? else {
                    continue;
                };
                let source = source.clone().unwrap_or_else(|| Arc::from(""));
                let ingest = ingest.clone();
                placing.push(async move {
                    let placed = std::panic::AssertUnwindSafe(ingest.ingest(source, seq, batch))
                        .catch_unwind()
                        .await
                        .unwrap_or_else(|panic| Err(sink_panic(seq, "placing it", panic)));
                    (seq, placed)
                });
            }
            else => break,
        }
    }
    Ok(())
}

/// The DoPut path without a network, for `ops/fuzz`: not a stable API.
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    /// Reads `messages` as the DoPut stream of `peer` (hello, schema,
    /// batches), decoding, validating and placing them as a served stream
    /// would, and sends each batch's ack to `acks` once it is durable.
    /// Returns the error that ended the stream; a panic anywhere in it comes
    /// back as an internal error saying so, as the served stream reports it.
    pub async fn put<I: Ingest>(
        ingest: Arc<I>,
        peer: &str,
        messages: impl Stream<Item = Result<FlightData, Status>> + Unpin,
        acks: &mpsc::Sender<Result<PutResult, Status>>,
        depth: usize,
    ) -> Result<(), Status> {
        run_put_catching(ingest, peer, messages, acks, depth, Draining::never()).await
    }
}

/// [`run_put`], with a panic anywhere in it turned into the internal error
/// that ends the stream.
async fn run_put_catching<I: Ingest>(
    ingest: Arc<I>,
    peer: &str,
    stream: impl Stream<Item = Result<FlightData, Status>> + Unpin,
    acks: &mpsc::Sender<Result<PutResult, Status>>,
    depth: usize,
    draining: Draining,
) -> Result<(), Status> {
    use futures::FutureExt;
    std::panic::AssertUnwindSafe(run_put(ingest, peer, stream, acks, depth, draining))
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| {
            Err(Status::internal(format!(
                "peer {peer}: the sink's stream handler panicked (a bug in the sink): {}",
                panic_message(panic.as_ref())
            )))
        })
}

/// A panic in the sink's handling of a batch: its own bug, never bad input.
fn sink_panic(seq: u64, doing: &str, panic: Box<dyn std::any::Any + Send>) -> Status {
    Status::internal(format!(
        "batch {seq}: {doing} panicked (a bug in the sink, not bad input): {}",
        panic_message(panic.as_ref())
    ))
}

/// Decodes one DoPut message: `None` for a schema or an empty message, the
/// batch and its sequence number otherwise. Decoding hostile IPC can panic
/// inside arrow: a panic here is the peer's malformed input, refused as such.
fn decode_put(
    peer: &str,
    data: &FlightData,
    schema_seen: &mut bool,
) -> Result<Option<(u64, RangeBatch)>, Status> {
    let seen = *schema_seen;
    let decoding = std::panic::AssertUnwindSafe(|| decode::message(data, seen));
    let decoded = std::panic::catch_unwind(decoding).map_err(|_| {
        Status::invalid_argument(format!(
            "peer {peer}: a message could not be decoded (malformed Arrow IPC)"
        ))
    })?;
    let undecodable =
        |e: String| Status::invalid_argument(format!("peer {peer}: undecodable Flight data: {e}"));
    match decoded.map_err(undecodable)? {
        decode::Message::Empty => Ok(None),
        decode::Message::Schema => {
            *schema_seen = true;
            Ok(None)
        }
        decode::Message::Batch(batch) => {
            let seq = protocol::decode_seq(&data.app_metadata)
                .map_err(|e| Status::invalid_argument(format!("peer {peer}: {e}")))?;
            let validating = std::panic::AssertUnwindSafe(move || RangeBatch::validate(batch));
            let batch = std::panic::catch_unwind(validating)
                .map_err(|_| {
                    Status::invalid_argument(format!(
                        "peer {peer}: batch {seq} could not be read (malformed Arrow arrays)"
                    ))
                })?
                .map_err(|e| Status::invalid_argument(format!("peer {peer}: batch {seq}: {e}")))?;
            Ok(Some((seq, batch)))
        }
    }
}

/// The text a panic was raised with, if it had one.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(a panic without a message)".to_string())
}

#[cfg(test)]
mod tests;
