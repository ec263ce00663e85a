//! The floor's Arrow Flight transport: the same ranges as Arrow record
//! batches in one DoPut call, through arrow-flight's own encoder and
//! decoder and tonic, one `PutResult` per round back; the HTTP/2 floor's
//! windows, frame size and runtimes. A batch holds one message's ranges,
//! a row each: the file's name, the offset, the bytes' CRC32C (checked on
//! landing) and the bytes. It measures what any mover on Arrow Flight's
//! wire pays on top of the floor over HTTP/2 (Arrow's IPC framing, gRPC's,
//! tonic's codec and tasks), without a manifest, a window or tailflight's
//! own encoder.

use std::net::{SocketAddr, TcpStream};
use std::pin::Pin;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use arrow_array::{Array, BinaryArray, RecordBatch, StringArray, UInt32Array, UInt64Array};
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightClient, FlightData, FlightDescriptor, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaResult, Ticket,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use tokio::sync::{mpsc as async_mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::http2::{H2_MAX_FRAME, H2_WINDOW};
use super::message::{Arrived, Crcs, MAX_MESSAGE, Range, parse, unix_nanos};
use super::outbound::{Outbound, hand_over, into_tokio, runtime};

/// How long the lander waits for the shipper's DoPut on its connection.
const PUT_WAIT: Duration = Duration::from_secs(60);

/// A message's ranges as a record batch: one row each.
fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("offset", DataType::UInt64, false),
        Field::new("crc32c", DataType::UInt32, false),
        Field::new("bytes", DataType::Binary, false),
    ]))
}

/// The shipping end: each message's batch handed over from the tailing
/// thread to a thread of the runtime's, which encodes it into the call.
pub(super) struct Shipper {
    schema: SchemaRef,
    batches: Outbound<RecordBatch>,
}

impl Shipper {
    pub(super) fn connect(stream: TcpStream, to: SocketAddr) -> Result<Self> {
        let batches = Outbound::start("floor-flight-send", "Arrow Flight", move |queued| {
            send(stream, to, queued)
        })?;
        Ok(Self {
            schema: schema(),
            batches,
        })
    }

    /// Sends the ranges of `body` (a message without its length) as one
    /// batch; their bytes are copied into it, so `body` can be reused.
    pub(super) fn send(&self, body: &[u8]) -> Result<()> {
        let ranges = parse(body, Crcs::Carried)?;
        let batch = RecordBatch::try_new(
            self.schema.clone(),
            vec![
                Arc::new(StringArray::from_iter_values(
                    ranges.iter().map(|r| r.name.as_str()),
                )),
                Arc::new(UInt64Array::from_iter_values(
                    ranges.iter().map(|r| r.offset),
                )),
                Arc::new(UInt32Array::from_iter_values(
                    ranges.iter().map(|r| r.crc.unwrap_or_default()),
                )),
                Arc::new(BinaryArray::from_iter_values(
                    ranges.iter().map(|r| &body[r.data.clone()]),
                )),
            ],
        )
        .context("building a batch of the message's ranges")?;
        self.batches.send(batch)
    }

    /// Ends the call once every batch is sent, and waits for its last ack.
    pub(super) fn finish(self) -> Result<()> {
        self.batches.finish()
    }
}

/// Sends each batch `queued` in one DoPut call to `to` over `stream`, and
/// ends the call once the queue closes.
async fn send(
    stream: TcpStream,
    to: SocketAddr,
    queued: async_mpsc::UnboundedReceiver<RecordBatch>,
) -> Result<()> {
    // The channel's one connection is the one the lander accepted.
    let connection = Arc::new(Mutex::new(Some(into_tokio(stream)?)));
    let connector = tower::service_fn(move |_: http::Uri| {
        let taken = connection.lock().ok().and_then(|mut slot| slot.take());
        async move {
            taken
                .map(hyper_util::rt::TokioIo::new)
                .ok_or_else(|| std::io::Error::other("the floor's one connection was lost"))
        }
    });
    let channel = tonic::transport::Endpoint::from_static("http://floor.invalid")
        .initial_stream_window_size(H2_WINDOW)
        .initial_connection_window_size(H2_WINDOW)
        .connect_with_connector(connector)
        .await
        .with_context(|| format!("the Arrow Flight channel to {to}"))?;
    let mut client = FlightClient::new_from_inner(
        FlightServiceClient::new(channel).max_encoding_message_size(2 * MAX_MESSAGE),
    );
    let batches = UnboundedReceiverStream::new(queued).map(Ok::<_, FlightError>);
    // One FlightData per batch: no message is cut into smaller ones.
    let encoded = FlightDataEncoderBuilder::new()
        .with_max_flight_data_size(MAX_MESSAGE)
        .build(batches);
    let mut acks = client
        .do_put(encoded)
        .await
        .with_context(|| format!("the DoPut call to {to}"))?;
    // Acks are read and dropped as they come: the floor keeps no window,
    // but pays for receiving them.
    while let Some(ack) = acks.next().await {
        ack.with_context(|| format!("acks from {to}"))?;
    }
    Ok(())
}

/// The landing end: serves one DoPut call on `stream` on a runtime of its
/// own (on the calling thread), hands each batch's ranges to the rounds
/// and writes each round's ack (`acks`) back.
pub(super) fn receive(
    stream: TcpStream,
    arrivals: mpsc::SyncSender<Arrived>,
    acks: async_mpsc::UnboundedReceiver<u64>,
) -> Result<()> {
    let peer = stream
        .peer_addr()
        .context("the shipper's address of a connection")?;
    runtime()?.block_on(async move {
        let io = into_tokio(stream)?;
        let (ended, landed) = oneshot::channel();
        let lander = Lander {
            call: Mutex::new(Some(Call {
                arrivals,
                acks,
                ended,
            })),
            peer,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        // One connection, and no end to the incoming ones until the call
        // is over: an ended stream of connections would start the server's
        // shutdown before the call began.
        let incoming = futures::stream::once(async { Ok::<_, std::io::Error>(io) })
            .chain(futures::stream::pending());
        let server = tonic::transport::Server::builder()
            .initial_stream_window_size(H2_WINDOW)
            .initial_connection_window_size(H2_WINDOW)
            .max_frame_size(H2_MAX_FRAME)
            .add_service(
                FlightServiceServer::new(lander).max_decoding_message_size(2 * MAX_MESSAGE),
            )
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stopped.await;
            });
        let mut served = tokio::spawn(server);
        let landed = tokio::select! {
            landed = tokio::time::timeout(PUT_WAIT, landed) => match landed {
                Ok(Ok(landed)) => landed,
                Ok(Err(_)) => Err(anyhow::anyhow!("the DoPut call from {peer} ended unanswered")),
                Err(_) => Err(anyhow::anyhow!("no DoPut call came from {peer} in {PUT_WAIT:?}")),
            },
            served = &mut served => {
                served.context("the Arrow Flight server's task panicked")?
                    .with_context(|| format!("serving {peer}"))?;
                bail!("the Arrow Flight server stopped before {peer}'s call ended");
            }
        };
        // The graceful stop lets the last acks go out first.
        let _ = stop.send(());
        let served = served
            .await
            .context("the Arrow Flight server's task panicked")?
            .with_context(|| format!("serving {peer}"));
        landed.and(served)
    })
}

/// What the one DoPut call takes over.
struct Call {
    arrivals: mpsc::SyncSender<Arrived>,
    acks: async_mpsc::UnboundedReceiver<u64>,
    /// Told how landing the call's batches ended.
    ended: oneshot::Sender<Result<()>>,
}

/// The lander's Flight service: DoPut, once.
struct Lander {
    call: Mutex<Option<Call>>,
    peer: SocketAddr,
}

type Refused<T> = std::result::Result<Response<T>, Status>;
type Nothing<T> = Pin<Box<dyn Stream<Item = std::result::Result<T, Status>> + Send>>;

fn refused<T>(call: &str) -> Refused<T> {
    Err(Status::unimplemented(format!(
        "the floor's lander takes only DoPut, not {call}"
    )))
}

#[tonic::async_trait]
impl FlightService for Lander {
    type HandshakeStream = Nothing<HandshakeResponse>;
    type ListFlightsStream = Nothing<FlightInfo>;
    type DoGetStream = Nothing<FlightData>;
    type DoPutStream = Nothing<PutResult>;
    type DoExchangeStream = Nothing<FlightData>;
    type DoActionStream = Nothing<arrow_flight::Result>;
    type ListActionsStream = Nothing<ActionType>;

    async fn do_put(&self, request: Request<Streaming<FlightData>>) -> Refused<Self::DoPutStream> {
        let taken = self.call.lock().ok().and_then(|mut call| call.take());
        let Some(Call {
            arrivals,
            acks,
            ended,
        }) = taken
        else {
            return Err(Status::failed_precondition(
                "the floor's lander takes one DoPut call",
            ));
        };
        let peer = self.peer;
        let batches = FlightRecordBatchStream::new_from_flight_data(
            request.into_inner().map_err(FlightError::from),
        );
        tokio::spawn(async move {
            let _ = ended.send(land_batches(batches, arrivals, peer).await);
        });
        let acks = UnboundedReceiverStream::new(acks).map(|messages| {
            Ok(PutResult {
                app_metadata: Bytes::copy_from_slice(&messages.to_le_bytes()),
            })
        });
        Ok(Response::new(Box::pin(acks)))
    }

    async fn handshake(
        &self,
        _: Request<Streaming<HandshakeRequest>>,
    ) -> Refused<Self::HandshakeStream> {
        refused("Handshake")
    }

    async fn list_flights(&self, _: Request<Criteria>) -> Refused<Self::ListFlightsStream> {
        refused("ListFlights")
    }

    async fn get_flight_info(&self, _: Request<FlightDescriptor>) -> Refused<FlightInfo> {
        refused("GetFlightInfo")
    }

    async fn poll_flight_info(&self, _: Request<FlightDescriptor>) -> Refused<PollInfo> {
        refused("PollFlightInfo")
    }

    async fn get_schema(&self, _: Request<FlightDescriptor>) -> Refused<SchemaResult> {
        refused("GetSchema")
    }

    async fn do_get(&self, _: Request<Ticket>) -> Refused<Self::DoGetStream> {
        refused("DoGet")
    }

    async fn do_exchange(
        &self,
        _: Request<Streaming<FlightData>>,
    ) -> Refused<Self::DoExchangeStream> {
        refused("DoExchange")
    }

    async fn do_action(&self, _: Request<Action>) -> Refused<Self::DoActionStream> {
        refused("DoAction")
    }

    async fn list_actions(&self, _: Request<Empty>) -> Refused<Self::ListActionsStream> {
        refused("ListActions")
    }
}

/// Hands each decoded batch's ranges to the rounds, until the call ends.
async fn land_batches(
    mut batches: FlightRecordBatchStream,
    arrivals: mpsc::SyncSender<Arrived>,
    peer: SocketAddr,
) -> Result<()> {
    while let Some(batch) = batches.next().await {
        let batch = batch.with_context(|| format!("a batch from {peer}"))?;
        let received_ns = unix_nanos();
        let arrival =
            arrived(&batch, received_ns).with_context(|| format!("a batch from {peer}"))?;
        if !hand_over(&arrivals, arrival) {
            return Ok(());
        }
    }
    Ok(())
}

/// A batch's ranges, each checked against its CRC32C, with their bytes
/// left where the decoder put them.
fn arrived(batch: &RecordBatch, received_ns: u128) -> Result<Arrived> {
    fn column<'b, T: 'static>(batch: &'b RecordBatch, at: usize, name: &str) -> Result<&'b T> {
        batch
            .column(at)
            .as_any()
            .downcast_ref::<T>()
            .with_context(|| format!("column {at} ({name}) is not of the floor's schema"))
    }
    ensure!(
        batch.num_columns() == 4,
        "a batch of {} columns, not the floor's 4",
        batch.num_columns()
    );
    let names = column::<StringArray>(batch, 0, "name")?;
    let offsets = column::<UInt64Array>(batch, 1, "offset")?;
    let crcs = column::<UInt32Array>(batch, 2, "crc32c")?;
    let data = column::<BinaryArray>(batch, 3, "bytes")?;
    let ends = data.value_offsets();
    let first = ends.first().map_or(0, |&at| at as usize);
    let last = ends.last().map_or(0, |&at| at as usize);
    let mut ranges = Vec::with_capacity(batch.num_rows());
    for (row, &at) in ends.iter().take(batch.num_rows()).enumerate() {
        let (name, offset, crc) = (names.value(row), offsets.value(row), crcs.value(row));
        let bytes = data.value(row);
        ensure!(
            crc_fast::crc32_iscsi(bytes) == crc,
            "the shipper's range of {name} at offset {offset} ({} bytes) fails its CRC32C",
            bytes.len()
        );
        let start = at as usize - first;
        ranges.push(Range {
            name: name.to_owned(),
            offset,
            data: start..start + bytes.len(),
            crc: Some(crc),
        });
    }
    Ok(Arrived {
        bytes: Bytes::from_owner(data.values().clone()).slice(first..last),
        ranges,
        received_ns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(crc: u32) -> RecordBatch {
        RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(StringArray::from_iter_values(["a", "b"])),
                Arc::new(UInt64Array::from_iter_values([0, 7])),
                Arc::new(UInt32Array::from_iter_values([
                    crc_fast::crc32_iscsi(b"xy"),
                    crc,
                ])),
                Arc::new(BinaryArray::from_iter_values([&b"xy"[..], b"abc"])),
            ],
        )
        .unwrap()
    }

    #[test]
    fn a_batch_lands_as_its_ranges_over_its_bytes() {
        let arrival = arrived(&batch(crc_fast::crc32_iscsi(b"abc")), 1).unwrap();
        assert_eq!(&arrival.bytes[..], b"xyabc");
        let ranges: Vec<_> = arrival
            .ranges
            .iter()
            .map(|r| (r.name.as_str(), r.offset, r.data.clone()))
            .collect();
        assert_eq!(ranges, [("a", 0, 0..2), ("b", 7, 2..5)]);
    }

    #[test]
    fn a_range_whose_bytes_changed_on_the_way_is_refused() {
        let refused = arrived(&batch(crc_fast::crc32_iscsi(b"abd")), 1)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(refused.contains("b at offset 7"), "{refused}");
        assert!(refused.contains("fails its CRC32C"), "{refused}");
    }

    #[test]
    fn a_batch_of_another_schema_is_refused() {
        let other = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("x", DataType::UInt64, false)])),
            vec![Arc::new(UInt64Array::from_iter_values([1]))],
        )
        .unwrap();
        assert!(arrived(&other, 1).is_err());
    }
}
