//! DoPut requests served from their HTTP/2 body, ahead of tonic's router.
//!
//! tonic's generated handler would decode DoPut messages with its own
//! decoder, which copies every DATA frame (see [`crate::put_receive`]).
//! This route reads the body with [`PutMessages`] instead and answers as
//! the generated handler would: the same checks and stream, its acks
//! encoded by tonic's encoder. Every other call goes on to tonic.

use std::task::{Context, Poll};
use std::time::Duration;

use arrow_flight::{FlightData, PutResult};
use futures::future::Either;
use http::HeaderValue;
use http::header::CONTENT_TYPE;
use tonic::Status;
use tonic::body::Body;
use tonic::codec::{Codec, EncodeBody, SingleMessageCompressionOverride};

use crate::put_receive::PutMessages;
use crate::put_stream::DO_PUT_PATH;
use crate::stall::StallGuard;

/// A DoPut stream's request as this route hands it over.
pub(crate) type PutRequest = tonic::Request<PutMessages<StallGuard<Body>>>;

/// The acks of a DoPut stream.
pub(crate) type Acks = futures::stream::BoxStream<'static, Result<PutResult, Status>>;

/// What takes DoPut streams: checks the peer and starts reading.
pub(crate) trait OpenPut: Clone + Send + Sync + 'static {
    fn open_put(&self, request: PutRequest) -> Result<Acks, Status>;
}

/// Puts [`PutRoute`] in front of tonic's router.
pub(crate) struct PutRouteLayer<I> {
    puts: I,
    max_message_bytes: usize,
    stall: Duration,
}

impl<I> PutRouteLayer<I> {
    pub(crate) fn new(puts: I, max_message_bytes: usize, stall: Duration) -> Self {
        Self {
            puts,
            max_message_bytes,
            stall,
        }
    }
}

impl<I: Clone> Clone for PutRouteLayer<I> {
    fn clone(&self) -> Self {
        Self {
            puts: self.puts.clone(),
            max_message_bytes: self.max_message_bytes,
            stall: self.stall,
        }
    }
}

impl<S, I: Clone> tower::Layer<S> for PutRouteLayer<I> {
    type Service = PutRoute<S, I>;

    fn layer(&self, inner: S) -> Self::Service {
        PutRoute {
            inner,
            layer: self.clone(),
        }
    }
}

/// Serves DoPut itself and hands every other request to `inner`.
pub(crate) struct PutRoute<S, I> {
    inner: S,
    layer: PutRouteLayer<I>,
}

impl<S: Clone, I: Clone> Clone for PutRoute<S, I> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S, I> tower::Service<http::Request<Body>> for PutRoute<S, I>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>,
    I: OpenPut,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Either<S::Future, std::future::Ready<Result<Self::Response, S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if request.uri().path() != DO_PUT_PATH {
            return Either::Left(self.inner.call(request));
        }
        Either::Right(std::future::ready(Ok(self.layer.serve(request))))
    }
}

impl<I: OpenPut> PutRouteLayer<I> {
    fn serve(&self, request: http::Request<Body>) -> http::Response<Body> {
        if let Some(encoding) = request.headers().get("grpc-encoding")
            && encoding != "identity"
        {
            return Status::unimplemented(format!(
                "DoPut messages compressed with {encoding:?}: this sink accepts uncompressed \
                 messages only"
            ))
            .into_http();
        }
        let (parts, body) = request.into_parts();
        // Each body is watched for a message that stops arriving.
        let messages = PutMessages::new(StallGuard::new(body, self.stall), self.max_message_bytes);
        let request = tonic::Request::from_http(http::Request::from_parts(parts, messages));
        let acks = match self.puts.open_put(request) {
            Ok(acks) => acks,
            Err(status) => return status.into_http(),
        };
        let encoder = tonic_prost::ProstCodec::<PutResult, FlightData>::default().encoder();
        let body = EncodeBody::new_server(
            encoder,
            acks,
            None,
            SingleMessageCompressionOverride::default(),
            Some(self.max_message_bytes),
        );
        let mut response = http::Response::new(Body::new(body));
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        response
    }
}
