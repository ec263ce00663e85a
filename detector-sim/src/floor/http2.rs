//! The floor's HTTP/2 transport: the same messages carried in one HTTP/2
//! stream (the request body from the shipper, one small ack per round in
//! the response body back), through the h2 crate as hyper and tonic use it,
//! with the sink's flow-control windows and frame size, each side on a
//! multi-threaded tokio runtime as the watcher's and the sink's are. It
//! measures what Arrow Flight's transport adds to the floor, without Arrow,
//! gRPC's framing or any of tailflight's own work.

use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;

use anyhow::{Context, Result, bail, ensure};
use bytes::{Buf, Bytes, BytesMut};
use tokio::sync::mpsc as async_mpsc;

use super::message::{Arrived, Crcs, MAX_MESSAGE, parse, unix_nanos};
use super::outbound::{Outbound, hand_over, into_tokio, runtime};

/// HTTP/2 flow-control windows, stream and connection, both ways: the sink's.
pub(super) const H2_WINDOW: u32 = 64 << 20;

/// The largest DATA frame the lander accepts: the sink's.
pub(super) const H2_MAX_FRAME: u32 = 1 << 20;

/// The shipping end: messages handed over from the tailing thread to a
/// thread of the runtime's, which writes them as DATA frames of one request.
pub(super) fn shipper(stream: TcpStream, to: SocketAddr) -> Result<Outbound<Bytes>> {
    Outbound::start("floor-h2-send", "HTTP/2", move |queued| {
        send(stream, to, queued)
    })
}

/// Writes each message `queued` as a DATA frame of one request to `to`,
/// and ends the request once the queue closes.
async fn send(
    stream: TcpStream,
    to: SocketAddr,
    mut queued: async_mpsc::UnboundedReceiver<Bytes>,
) -> Result<()> {
    let io = into_tokio(stream)?;
    let (client, connection) = h2::client::Builder::new()
        .initial_window_size(H2_WINDOW)
        .initial_connection_window_size(H2_WINDOW)
        .handshake::<_, Bytes>(io)
        .await
        .with_context(|| format!("HTTP/2 handshake with {to}"))?;
    let driver = tokio::spawn(connection);
    let mut client = client
        .ready()
        .await
        .with_context(|| format!("HTTP/2 connection to {to}"))?;
    let request = http::Request::post("http://localhost/floor")
        .body(())
        .context("the request")?;
    let (response, mut body) = client
        .send_request(request, false)
        .with_context(|| format!("the request to {to}"))?;
    // Acks are read and dropped as they come: the floor keeps no window,
    // but pays for receiving them.
    let acks = tokio::spawn(async move {
        let mut acks = response
            .await
            .with_context(|| format!("the response from {to}"))?
            .into_body();
        while let Some(ack) = acks.data().await {
            let ack = ack.with_context(|| format!("acks from {to}"))?;
            acks.flow_control()
                .release_capacity(ack.len())
                .context("giving back the acks' window")?;
        }
        anyhow::Ok(())
    });
    while let Some(message) = queued.recv().await {
        body.send_data(message, false)
            .with_context(|| format!("sending a message to {to}"))?;
    }
    body.send_data(Bytes::new(), true)
        .with_context(|| format!("ending the request to {to}"))?;
    acks.await.context("the acks' task panicked")??;
    drop((client, body));
    driver
        .await
        .context("the HTTP/2 connection's task panicked")?
        .with_context(|| format!("the HTTP/2 connection to {to}"))
}

/// The landing end: reads the one request on `stream` on a runtime of its
/// own (on the calling thread), cuts its body into messages and hands them
/// to the rounds; writes each round's ack (`acks`) back.
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
        let mut connection = h2::server::Builder::new()
            .initial_window_size(H2_WINDOW)
            .initial_connection_window_size(H2_WINDOW)
            .max_frame_size(H2_MAX_FRAME)
            .handshake::<_, Bytes>(io)
            .await
            .with_context(|| format!("HTTP/2 handshake with {peer}"))?;
        let (request, mut respond) = connection
            .accept()
            .await
            .with_context(|| format!("{peer} closed before its request"))?
            .with_context(|| format!("the request from {peer}"))?;
        let mut out = respond
            .send_response(http::Response::new(()), false)
            .with_context(|| format!("the response to {peer}"))?;
        // Accepting drives the connection; a second stream is not expected.
        let driver = tokio::spawn(async move {
            match connection.accept().await {
                None => Ok(()),
                Some(Err(e)) => {
                    Err(e).with_context(|| format!("the HTTP/2 connection from {peer}"))
                }
                Some(Ok(_)) => bail!("{peer} opened a second stream"),
            }
        });
        let acking = tokio::spawn(async move {
            let mut acks = acks;
            while let Some(messages) = acks.recv().await {
                out.send_data(Bytes::copy_from_slice(&messages.to_le_bytes()), false)
                    .context("sending an ack")?;
            }
            // The rounds ended: so does the response.
            let _ = out.send_data(Bytes::new(), true);
            anyhow::Ok(())
        });
        let mut body = request.into_body();
        let mut buffer = BytesMut::with_capacity(1 << 20);
        while let Some(data) = body.data().await {
            let data = data.with_context(|| format!("the request body from {peer}"))?;
            body.flow_control()
                .release_capacity(data.len())
                .context("giving back the request's window")?;
            buffer.extend_from_slice(&data);
            while let Some(message) = next_message(&mut buffer)? {
                let received_ns = unix_nanos();
                let ranges = parse(&message, Crcs::Checked)?;
                let arrival = Arrived {
                    bytes: message,
                    ranges,
                    received_ns,
                };
                if !hand_over(&arrivals, arrival) {
                    return Ok(());
                }
            }
        }
        ensure!(
            buffer.is_empty(),
            "{peer} ended its request inside a message ({} bytes left)",
            buffer.len()
        );
        drop(arrivals);
        acking.await.context("the acks' task panicked")??;
        driver
            .await
            .context("the HTTP/2 connection's task panicked")?
    })
}

/// The next whole message in `buffer` (a length, then that many bytes),
/// without its length; `None` until all of it has arrived.
fn next_message(buffer: &mut BytesMut) -> Result<Option<Bytes>> {
    if buffer.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_le_bytes(buffer[..4].try_into()?) as usize;
    ensure!(
        len <= MAX_MESSAGE,
        "a message of {len} bytes is over the limit of {MAX_MESSAGE}"
    );
    if buffer.len() < 4 + len {
        buffer.reserve(4 + len - buffer.len());
        return Ok(None);
    }
    buffer.advance(4);
    Ok(Some(buffer.split_to(len).freeze()))
}
