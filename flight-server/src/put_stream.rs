//! The DoPut call, with its request messages framed here so that a batch's
//! payload reaches HTTP/2 as the buffer it was read into.
//!
//! tonic's encoder writes each message into one buffer, and prost's encoding
//! of the `data_body` bytes copied every batch body into it once more (a
//! tenth of the watcher's CPU under mTLS, docs/measurements.md). A gRPC message is a 5-byte
//! prefix and the protobuf bytes, and a protobuf message may end with any
//! length-delimited field: so each message goes out as two frames, its
//! small fields behind the prefix, then its body, shared. Responses are
//! decoded by tonic as before.

use std::task::Poll;

use arrow_flight::{FlightData, PutResult};
use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;
use http::header::{CONTENT_TYPE, TE};
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::client::GrpcService;
use tonic::codec::{Codec, Streaming};
use tonic::transport::Channel;
use tonic::{Code, Status};

pub(crate) const DO_PUT_PATH: &str = "/arrow.flight.protocol.FlightService/DoPut";
/// `FlightData.data_body`.
const DATA_BODY_FIELD: u32 = 1000;

/// One request message as the frames that carry it: the gRPC prefix with
/// the small fields, then the body (empty for messages without one).
pub(crate) type MessageFrames = [Bytes; 2];

/// Frames `message`; its `data_body` is not copied.
pub(crate) fn frames(mut message: FlightData, max_bytes: usize) -> Result<MessageFrames, Status> {
    let body = std::mem::take(&mut message.data_body);
    let head_len = message.encoded_len();
    let body_field_len = match body.len() {
        0 => 0,
        n => key_len(DATA_BODY_FIELD) + encoded_len_varint(n as u64) + n,
    };
    let total = head_len + body_field_len;
    if total > max_bytes {
        return Err(Status::out_of_range(format!(
            "a message of {total} bytes is over the limit of {max_bytes}"
        )));
    }
    let length = u32::try_from(total)
        .map_err(|_| Status::out_of_range(format!("a message of {total} bytes")))?;
    let mut head = BytesMut::with_capacity(5 + head_len + 16);
    head.put_u8(0); // not compressed
    head.put_u32(length);
    message
        .encode(&mut head)
        .map_err(|e| Status::internal(format!("encoding a message: {e}")))?;
    if !body.is_empty() {
        encode_key(DATA_BODY_FIELD, WireType::LengthDelimited, &mut head);
        encode_varint(body.len() as u64, &mut head);
    }
    Ok([head.freeze(), body])
}

/// Opens a DoPut stream on `channel` that sends what `requests` yields, and
/// returns the stream of its results.
pub(crate) async fn do_put(
    mut channel: Channel,
    requests: mpsc::Receiver<MessageFrames>,
    max_decoding_bytes: usize,
) -> Result<Streaming<PutResult>, Status> {
    let data = ReceiverStream::new(requests).flat_map(|frames| {
        let frames = frames
            .into_iter()
            .filter(|frame| !frame.is_empty())
            .map(|frame| Ok::<_, Status>(http_body::Frame::data(frame)));
        futures::stream::iter(frames)
    });
    let body = tonic::body::Body::new(http_body_util::StreamBody::new(data));
    let request = http::Request::builder()
        .method(http::Method::POST)
        .version(http::Version::HTTP_2)
        .uri(DO_PUT_PATH)
        .header(TE, "trailers")
        .header(CONTENT_TYPE, "application/grpc")
        .body(body)
        .map_err(|e| Status::internal(format!("building the DoPut request: {e}")))?;
    std::future::poll_fn(|cx| match GrpcService::poll_ready(&mut channel, cx) {
        Poll::Ready(result) => Poll::Ready(result.map_err(|e| Status::from_error(e.into()))),
        Poll::Pending => Poll::Pending,
    })
    .await?;
    let response = GrpcService::call(&mut channel, request)
        .await
        .map_err(|e| Status::from_error(e.into()))?;
    let decoder = tonic_prost::ProstCodec::<FlightData, PutResult>::default().decoder();
    // A grpc-status in the headers is a trailers-only answer: no messages follow.
    if let Some(status) = Status::from_header_map(response.headers()) {
        if status.code() != Code::Ok {
            return Err(status);
        }
        return Ok(Streaming::new_empty(decoder, response.into_body()));
    }
    let status_code = response.status();
    Ok(Streaming::new_response(
        decoder,
        response.into_body(),
        status_code,
        None,
        Some(max_decoding_bytes),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two frames, joined, are exactly what prost would encode behind a
    /// gRPC prefix, and the body frame is the body itself.
    #[test]
    fn frames_are_the_prost_encoding_without_copying_the_body() {
        let body = Bytes::from((0..70_000u32).map(|i| i as u8).collect::<Vec<_>>());
        let message = FlightData {
            data_header: Bytes::from_static(b"header"),
            app_metadata: Bytes::from_static(b"seq"),
            data_body: body.clone(),
            flight_descriptor: None,
        };
        let expected = message.encode_to_vec();
        let [head, tail] = frames(message, 1 << 20).unwrap();
        assert_eq!(tail.as_ptr(), body.as_ptr(), "the body was copied");
        assert_eq!(head[0], 0);
        let length = u32::from_be_bytes(head[1..5].try_into().unwrap()) as usize;
        assert_eq!(length, expected.len());
        let joined = [&head[5..], &tail[..]].concat();
        assert_eq!(joined, expected);
        assert_eq!(FlightData::decode(&joined[..]).unwrap().data_body, body);

        let empty = FlightData::default();
        let [head, tail] = frames(empty.clone(), 1 << 20).unwrap();
        assert!(tail.is_empty());
        assert_eq!(&head[5..], &empty.encode_to_vec()[..]);

        let big = FlightData {
            data_body: body,
            ..FlightData::default()
        };
        assert_eq!(frames(big, 1024).unwrap_err().code(), Code::OutOfRange);
    }
}
