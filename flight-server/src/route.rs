//! DoPut and DoGet served from their HTTP/2 bodies, ahead of tonic's router.
//!
//! tonic's generated handlers decode every request message with a decoder
//! that copies each DATA frame, and encode every response message into a
//! buffer of its own, copying each batch body once more. The bulk of the
//! bytes a sink moves is in DoPut requests (batches in) and DoGet responses
//! (a subscription's batches out), so these two calls are served here:
//! DoPut bodies read by [`PutMessages`] (see [`crate::put_receive`]), DoGet
//! responses framed as the watcher frames its requests (a message's small
//! fields, then its body as it is; see [`crate::put_stream`]). The checks
//! and streams are the service's own; every other call goes on to tonic.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use arrow_flight::{FlightData, PutResult, Ticket};
use bytes::{Buf, Bytes};
use futures::future::{BoxFuture, Either};
use futures::stream::BoxStream;
use futures::{FutureExt, Stream};
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue};
use http_body::Frame;
use http_body_util::BodyExt;
use prost::Message;
use tonic::body::Body;
use tonic::codec::{Codec, EncodeBody, SingleMessageCompressionOverride};
use tonic::{Code, Status};

use crate::put_receive::PutMessages;
use crate::put_stream::{DO_PUT_PATH, frames};
use crate::stall::StallGuard;

const DO_GET_PATH: &str = "/arrow.flight.protocol.FlightService/DoGet";
/// The most a DoGet request (one ticket) may hold.
const MAX_TICKET_BYTES: usize = 1 << 20;

/// A DoPut stream's request as this route hands it over.
pub(crate) type PutRequest = tonic::Request<PutMessages<StallGuard<Body>>>;

/// The acks of a DoPut stream.
pub(crate) type Acks = BoxStream<'static, Result<PutResult, Status>>;

/// The messages of a DoGet stream.
pub(crate) type Messages = std::pin::Pin<Box<dyn Stream<Item = Result<FlightData, Status>> + Send>>;

/// What takes the streams this route serves.
pub(crate) trait RoutedStreams: Clone + Send + Sync + 'static {
    /// Checks the peer and starts reading a DoPut stream.
    fn open_put(&self, request: PutRequest) -> Result<Acks, Status>;

    /// Checks the peer and starts a DoGet stream.
    fn open_get(
        &self,
        request: tonic::Request<Ticket>,
    ) -> BoxFuture<'static, Result<Messages, Status>>;
}

/// Puts [`Routes`] in front of tonic's router.
pub(crate) struct RoutesLayer<I> {
    streams: I,
    max_message_bytes: usize,
    stall: Duration,
}

impl<I> RoutesLayer<I> {
    pub(crate) fn new(streams: I, max_message_bytes: usize, stall: Duration) -> Self {
        Self {
            streams,
            max_message_bytes,
            stall,
        }
    }
}

impl<I: Clone> Clone for RoutesLayer<I> {
    fn clone(&self) -> Self {
        Self {
            streams: self.streams.clone(),
            max_message_bytes: self.max_message_bytes,
            stall: self.stall,
        }
    }
}

impl<S, I: Clone> tower::Layer<S> for RoutesLayer<I> {
    type Service = Routes<S, I>;

    fn layer(&self, inner: S) -> Self::Service {
        Routes {
            inner,
            layer: self.clone(),
        }
    }
}

/// Serves DoPut and DoGet itself and hands every other request to `inner`.
pub(crate) struct Routes<S, I> {
    inner: S,
    layer: RoutesLayer<I>,
}

impl<S: Clone, I: Clone> Clone for Routes<S, I> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

type Answer<E> = BoxFuture<'static, Result<http::Response<Body>, E>>;

impl<S, I> tower::Service<http::Request<Body>> for Routes<S, I>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>,
    S::Error: Send + 'static,
    I: RoutedStreams,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Either<S::Future, Answer<S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        match request.uri().path() {
            DO_PUT_PATH => {
                let response = self.layer.serve_put(request);
                Either::Right(std::future::ready(Ok(response)).boxed())
            }
            DO_GET_PATH => {
                let layer = self.layer.clone();
                Either::Right(async move { Ok(layer.serve_get(request).await) }.boxed())
            }
            _ => Either::Left(self.inner.call(request)),
        }
    }
}

/// A gRPC response whose messages follow in `body`.
fn grpc_response(body: Body) -> http::Response<Body> {
    let mut response = http::Response::new(body);
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    response
}

/// Refuses a request whose messages are compressed: none of ours are.
fn refuse_compression<B>(request: &http::Request<B>) -> Result<(), Status> {
    match request.headers().get("grpc-encoding") {
        Some(encoding) if encoding != "identity" => Err(Status::unimplemented(format!(
            "messages compressed with {encoding:?}: this sink accepts uncompressed messages only"
        ))),
        _ => Ok(()),
    }
}

impl<I: RoutedStreams> RoutesLayer<I> {
    fn serve_put(&self, request: http::Request<Body>) -> http::Response<Body> {
        if let Err(status) = refuse_compression(&request) {
            return status.into_http();
        }
        let (parts, body) = request.into_parts();
        // Each body is watched for a message that stops arriving.
        let messages = PutMessages::new(StallGuard::new(body, self.stall), self.max_message_bytes);
        let request = tonic::Request::from_http(http::Request::from_parts(parts, messages));
        let acks = match self.streams.open_put(request) {
            Ok(acks) => acks,
            Err(status) => return status.into_http(),
        };
        let encoder = tonic_prost::ProstCodec::<PutResult, FlightData>::default().encoder();
        grpc_response(Body::new(EncodeBody::new_server(
            encoder,
            acks,
            None,
            SingleMessageCompressionOverride::default(),
            Some(self.max_message_bytes),
        )))
    }

    async fn serve_get(&self, request: http::Request<Body>) -> http::Response<Body> {
        match self.open_get(request).await {
            Ok(messages) => grpc_response(Body::new(FramedMessages {
                messages: Some(messages),
                frames: VecDeque::new(),
                max_message_bytes: self.max_message_bytes,
            })),
            Err(status) => status.into_http(),
        }
    }

    async fn open_get(&self, request: http::Request<Body>) -> Result<Messages, Status> {
        refuse_compression(&request)?;
        let (parts, body) = request.into_parts();
        let bytes = http_body_util::Limited::new(body, MAX_TICKET_BYTES + 5)
            .collect()
            .await
            .map_err(|e| Status::invalid_argument(format!("reading the DoGet request: {e}")))?
            .to_bytes();
        let ticket = decode_unary::<Ticket>(bytes)?;
        let request = tonic::Request::from_http(http::Request::from_parts(parts, ticket));
        self.streams.open_get(request).await
    }
}

/// The one message of a unary request body.
fn decode_unary<M: Message + Default>(mut bytes: Bytes) -> Result<M, Status> {
    let bad = |detail: &str| Status::invalid_argument(format!("a malformed request: {detail}"));
    if bytes.len() < 5 {
        return Err(bad("shorter than a gRPC message prefix"));
    }
    if bytes.get_u8() != 0 {
        return Err(Status::unimplemented(
            "a compressed request: this sink accepts uncompressed messages only",
        ));
    }
    let length = bytes.get_u32() as usize;
    if length != bytes.len() {
        return Err(bad(&format!(
            "a message of {length} bytes in a body of {} after its prefix",
            bytes.len()
        )));
    }
    M::decode(bytes).map_err(|e| bad(&e.to_string()))
}

/// A DoGet response body: each message as the frames that carry it, its
/// body not copied, then the status as trailers.
struct FramedMessages {
    messages: Option<Messages>,
    frames: VecDeque<Bytes>,
    max_message_bytes: usize,
}

fn trailers(status: &Status) -> Frame<Bytes> {
    let mut headers = HeaderMap::new();
    if status.add_header(&mut headers).is_err() {
        headers.insert("grpc-status", HeaderValue::from(Code::Internal as i32));
    }
    Frame::trailers(headers)
}

impl http_body::Body for FramedMessages {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        loop {
            if let Some(frame) = this.frames.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(frame))));
            }
            let Some(messages) = this.messages.as_mut() else {
                return Poll::Ready(None);
            };
            let next = match messages.as_mut().poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(next) => next,
            };
            let framed = match next {
                Some(Ok(message)) => frames(message, this.max_message_bytes),
                Some(Err(status)) => Err(status),
                None => {
                    this.messages = None;
                    return Poll::Ready(Some(Ok(trailers(&Status::ok("")))));
                }
            };
            match framed {
                Ok(framed) => this
                    .frames
                    .extend(framed.into_iter().filter(|frame| !frame.is_empty())),
                Err(status) => {
                    this.messages = None;
                    return Poll::Ready(Some(Ok(trailers(&status))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.messages.is_none() && self.frames.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    fn body_of(messages: Vec<Result<FlightData, Status>>) -> FramedMessages {
        FramedMessages {
            messages: Some(Box::pin(futures::stream::iter(messages))),
            frames: VecDeque::new(),
            max_message_bytes: 1 << 20,
        }
    }

    /// Everything a body yields: its data frames, then its trailers.
    fn drain(body: FramedMessages) -> (Vec<Bytes>, Option<HeaderMap>) {
        let mut body = std::pin::pin!(body);
        let mut data = Vec::new();
        let mut trailers = None;
        futures::executor::block_on(async {
            while let Some(frame) = body.frame().await {
                match frame.expect("a frame").into_data() {
                    Ok(bytes) => data.push(bytes),
                    Err(frame) => trailers = frame.into_trailers().ok(),
                }
            }
        });
        (data, trailers)
    }

    /// The frames decode to the messages sent, bodies not copied, and the
    /// stream ends with an OK status.
    #[test]
    fn messages_go_out_whole_with_their_bodies_shared() {
        let body = Bytes::from(vec![5u8; 100_000]);
        let sent = vec![
            FlightData {
                data_header: Bytes::from_static(b"schema"),
                ..FlightData::default()
            },
            FlightData {
                data_header: Bytes::from_static(b"batch"),
                app_metadata: Bytes::from_static(b"cursor"),
                data_body: body.clone(),
                flight_descriptor: None,
            },
        ];
        let (frames, trailers) = drain(body_of(sent.iter().cloned().map(Ok).collect()));
        assert!(
            frames.iter().any(|frame| frame.as_ptr() == body.as_ptr()),
            "the body was copied"
        );
        let trailers = trailers.expect("trailers");
        assert_eq!(trailers["grpc-status"], "0");
        let stream = http_body_util::StreamBody::new(futures::stream::iter(
            frames.into_iter().map(|f| Ok::<_, Status>(Frame::data(f))),
        ));
        let received: Vec<FlightData> =
            futures::executor::block_on(PutMessages::new(stream, 1 << 20).collect::<Vec<_>>())
                .into_iter()
                .map(|m| m.expect("decodes"))
                .collect();
        assert_eq!(received, sent);
    }

    /// An error ends the stream with its status in the trailers.
    #[test]
    fn an_error_is_the_streams_status() {
        let (frames, trailers) = drain(body_of(vec![
            Ok(FlightData::default()),
            Err(Status::unavailable("the sink is stopping")),
            Ok(FlightData::default()),
        ]));
        assert_eq!(frames.len(), 1, "a message after the error was sent");
        let trailers = trailers.expect("trailers");
        assert_eq!(
            trailers["grpc-status"],
            (Code::Unavailable as i32).to_string()
        );
        assert_eq!(trailers["grpc-message"], "the%20sink%20is%20stopping");
    }

    #[test]
    fn a_unary_request_is_one_whole_message() {
        let ticket = Ticket::new("follow");
        let mut wire = vec![0u8];
        wire.extend_from_slice(&(ticket.encoded_len() as u32).to_be_bytes());
        wire.extend_from_slice(&ticket.encode_to_vec());
        assert_eq!(
            decode_unary::<Ticket>(Bytes::from(wire.clone())).unwrap(),
            ticket
        );
        let short = Bytes::copy_from_slice(&wire[..wire.len() - 1]);
        assert_eq!(
            decode_unary::<Ticket>(short).unwrap_err().code(),
            Code::InvalidArgument
        );
        wire[0] = 1;
        assert_eq!(
            decode_unary::<Ticket>(Bytes::from(wire))
                .unwrap_err()
                .code(),
            Code::Unimplemented
        );
        assert!(decode_unary::<Ticket>(Bytes::from_static(&[0, 0])).is_err());
    }
}
