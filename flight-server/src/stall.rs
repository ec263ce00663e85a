//! A DoPut request body that gives up on a message which stops arriving.
//!
//! HTTP/2 keepalive finds a dead peer, and the hello timeout a silent
//! stream; neither finds a live peer that began a message and sends no more
//! of it: the sink would hold the part it has (up to the 64 MiB message
//! limit, on each of the streams the peer may open) for as long as the
//! peer keeps its connection. The guard follows the gRPC framing of the
//! body (a 5-byte prefix with the length, then the message) and ends the
//! stream once a message has had no byte for the stall limit. Between
//! messages a stream may be idle for as long as its watcher has nothing to
//! send; a slow peer is not stalled as long as bytes come.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use tonic::Status;

/// A message that has begun must go on arriving: at least one byte this often.
pub const MESSAGE_STALL: Duration = Duration::from_secs(60);

const PREFIX_BYTES: usize = 5;

/// Wraps a request body; see the module documentation.
pub(crate) struct StallGuard<B> {
    inner: B,
    stall: Duration,
    /// Bytes of the current message's prefix seen so far.
    prefix: [u8; PREFIX_BYTES],
    prefix_len: usize,
    /// Bytes of the current message still to come.
    body_left: u64,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<B> StallGuard<B> {
    pub(crate) fn new(inner: B, stall: Duration) -> Self {
        Self {
            inner,
            stall,
            prefix: [0; PREFIX_BYTES],
            prefix_len: 0,
            body_left: 0,
            deadline: None,
        }
    }

    /// Follows the framing through `data`.
    fn advance(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.body_left == 0 {
                let take = (PREFIX_BYTES - self.prefix_len).min(data.len());
                self.prefix[self.prefix_len..self.prefix_len + take].copy_from_slice(&data[..take]);
                self.prefix_len += take;
                data = &data[take..];
                if self.prefix_len == PREFIX_BYTES {
                    let mut length = [0u8; 4];
                    length.copy_from_slice(&self.prefix[1..]);
                    self.body_left = u64::from(u32::from_be_bytes(length));
                    self.prefix_len = 0;
                }
            } else {
                let take = (self.body_left as usize).min(data.len());
                self.body_left -= take as u64;
                data = &data[take..];
            }
        }
    }

    fn in_message(&self) -> bool {
        self.prefix_len > 0 || self.body_left > 0
    }
}

impl<B> Body for StallGuard<B>
where
    B: Body<Data = Bytes, Error = Status> + Unpin,
{
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.advance(data.chunk());
                    this.deadline = this
                        .in_message()
                        .then(|| Box::pin(tokio::time::sleep(this.stall)));
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => {
                let stalled = this
                    .deadline
                    .as_mut()
                    .is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready());
                if !stalled {
                    return Poll::Pending;
                }
                this.deadline = None;
                Poll::Ready(Some(Err(Status::deadline_exceeded(format!(
                    "a message began and no byte of it came for {} s ({} bytes of it still to come); closing the stream",
                    this.stall.as_secs_f64(),
                    this.body_left
                )))))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    type Fed = Result<Frame<Bytes>, Status>;
    type FedBody =
        StallGuard<http_body_util::StreamBody<tokio_stream::wrappers::ReceiverStream<Fed>>>;

    /// A body fed frame by frame from the test.
    fn fed() -> (tokio::sync::mpsc::Sender<Fed>, FedBody) {
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let body = http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        (tx, StallGuard::new(body, Duration::from_millis(200)))
    }

    fn message(len: u32) -> Vec<u8> {
        let mut bytes = vec![0u8];
        bytes.extend(len.to_be_bytes());
        bytes.extend(std::iter::repeat_n(7u8, len as usize));
        bytes
    }

    /// A message cut short and left there ends the stream; the bytes that
    /// came before are passed on.
    #[tokio::test]
    async fn a_message_that_stops_arriving_ends_the_stream() {
        let (tx, mut body) = fed();
        let whole = message(100);
        tx.send(Ok(Frame::data(Bytes::from(whole[..40].to_vec()))))
            .await
            .expect("send");
        let first = body.frame().await.expect("a frame").expect("data");
        assert_eq!(first.into_data().map(|d| d.len()).ok(), Some(40));
        let error = body
            .frame()
            .await
            .expect("an end")
            .expect_err("the stalled message ends the stream");
        assert_eq!(error.code(), tonic::Code::DeadlineExceeded);
        assert!(error.message().contains("65 bytes"), "{}", error.message());
    }

    /// Between messages, and with a prefix split over frames, nothing is
    /// stalled: a stream may idle for as long as its peer has nothing to send.
    #[tokio::test]
    async fn a_stream_idle_between_messages_is_not_stalled() {
        let (tx, mut body) = fed();
        let mut bytes = message(3);
        bytes.extend(message(0));
        bytes.extend(message(10));
        for piece in [&bytes[..2], &bytes[2..9], &bytes[9..]] {
            tx.send(Ok(Frame::data(Bytes::from(piece.to_vec()))))
                .await
                .expect("send");
            body.frame().await.expect("a frame").expect("data");
        }
        let idle = tokio::time::timeout(Duration::from_secs(1), body.frame()).await;
        assert!(idle.is_err(), "an idle stream between messages was ended");
    }
}
