//! copy_floor's HTTP/2 transport: the same frames carried in one HTTP/2
//! stream per connection (the request body one way, acks in the response
//! body the other), through the h2 crate as hyper and tonic use it, with
//! the sink's flow-control windows.

use std::fs::File;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Poll, ready};

use anyhow::{Context, Result, bail};
use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::task::JoinHandle;

use crate::{Source, checks, read_ack, read_last_acks};

/// HTTP/2 flow-control windows, stream and connection, both ways: the sink's.
const H2_WINDOW: u32 = 64 << 20;

/// Accepts the one stream a sender opens on `stream`: its request body to
/// read frames from, its response body to write acks to, and the task that
/// drives the connection (done once the sender closes it).
pub async fn accept<S>(
    stream: S,
    peer: SocketAddr,
    max_frame: u32,
) -> Result<(H2Reader, H2Writer, JoinHandle<Result<()>>)>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut connection = h2::server::Builder::new()
        .initial_window_size(H2_WINDOW)
        .initial_connection_window_size(H2_WINDOW)
        .max_frame_size(max_frame)
        .handshake::<_, Bytes>(stream)
        .await
        .with_context(|| format!("HTTP/2 handshake with {peer}"))?;
    let (request, mut respond) = connection
        .accept()
        .await
        .with_context(|| format!("{peer} closed before its request"))?
        .with_context(|| format!("the request from {peer}"))?;
    let out = respond
        .send_response(http::Response::new(()), false)
        .with_context(|| format!("the response to {peer}"))?;
    // Accepting drives the connection; a second stream is not expected.
    let driver = tokio::spawn(async move {
        match connection.accept().await {
            None => Ok(()),
            Some(Err(e)) => Err(e).with_context(|| format!("the HTTP/2 connection from {peer}")),
            Some(Ok(_)) => bail!("{peer} opened a second stream"),
        }
    });
    let frames = H2Reader::new(request.into_body());
    let out = H2Writer {
        body: out,
        ended: false,
    };
    Ok((frames, out, driver))
}

/// Sends `sources` in one HTTP/2 stream over `io`, each frame handed to h2
/// as its own buffer; returns the payload bytes once all are acked.
pub async fn send<S>(
    io: S,
    peer: &str,
    sources: Vec<Source>,
    window: u64,
    chunk: usize,
    checksums: bool,
) -> Result<u64>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (client, connection) = h2::client::Builder::new()
        .initial_window_size(H2_WINDOW)
        .initial_connection_window_size(H2_WINDOW)
        .handshake::<_, Bytes>(io)
        .await
        .with_context(|| format!("HTTP/2 handshake on {peer}"))?;
    let driver = tokio::spawn(connection);
    let mut client = client
        .ready()
        .await
        .with_context(|| format!("HTTP/2 connection on {peer}"))?;
    let request = http::Request::post("http://localhost/copy")
        .body(())
        .context("the request")?;
    let (response, mut body) = client
        .send_request(request, false)
        .with_context(|| format!("the request on {peer}"))?;
    let response = response
        .await
        .with_context(|| format!("the response on {peer}"))?;
    let mut acks = H2Reader::new(response.into_body());
    let mut sent = 0u64;
    let mut acked = 0u64;
    for source in &sources {
        let name = source.name.as_bytes();
        let mut offset = 0u64;
        let mut file_crc = 0u64;
        let fields = checks::header_bytes(checksums);
        // One frame even for an empty file, so that it is created.
        loop {
            let remaining = source.size - offset;
            while remaining > 0 && sent - acked >= window {
                acked = read_ack(&mut acks, peer, acked, sent)
                    .await?
                    .with_context(|| format!("{peer} closed with {sent} bytes sent"))?;
            }
            let len = remaining.min(chunk as u64).min(window - (sent - acked)) as usize;
            let mut frame = Vec::with_capacity(4 + name.len() + 12 + fields + len);
            frame.extend_from_slice(&(name.len() as u32).to_le_bytes());
            frame.extend_from_slice(name);
            frame.extend_from_slice(&offset.to_le_bytes());
            frame.extend_from_slice(&(len as u32).to_le_bytes());
            // Filled in once the payload is read.
            frame.resize(frame.len() + fields, 0);
            let head = frame.len();
            pread_append(&source.file, &mut frame, len, offset).with_context(|| {
                format!(
                    "pread of {len} bytes from {} at {offset}",
                    source.path.display()
                )
            })?;
            if checksums {
                checks::fill(&mut frame, head, &mut file_crc);
            }
            body.send_data(Bytes::from(frame), false)
                .with_context(|| format!("{len} bytes of {} at {offset} on {peer}", source.name))?;
            sent += len as u64;
            offset += len as u64;
            if offset >= source.size {
                break;
            }
        }
    }
    body.send_data(Bytes::new(), true)
        .with_context(|| format!("the end of the request on {peer}"))?;
    read_last_acks(&mut acks, peer, acked, sent).await?;
    // With every handle gone the connection says goodbye and ends.
    drop((client, body, acks));
    driver
        .await
        .context("the HTTP/2 connection's task failed")?
        .with_context(|| format!("the HTTP/2 connection on {peer}"))?;
    Ok(sent)
}

/// Appends `len` bytes of `file` at `offset` to `buf`, read straight into
/// its spare capacity (as the watcher reads, without zeroing it first).
fn pread_append(file: &File, buf: &mut Vec<u8>, len: usize, offset: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    buf.reserve(len);
    let mut done = 0;
    while done < len {
        let spare = buf.spare_capacity_mut();
        let at = (offset + done as u64) as libc::off_t;
        // SAFETY: pread writes at most `len - done` bytes, within the spare
        // capacity reserved above, and the length grows only by what it wrote.
        let n = unsafe { libc::pread(file.as_raw_fd(), spare.as_mut_ptr().cast(), len - done, at) };
        match n {
            n if n > 0 => {
                unsafe { buf.set_len(buf.len() + n as usize) };
                done += n as usize;
            }
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// An HTTP/2 body read as a byte stream, its flow-control window given back
/// as each DATA frame arrives (the frames' own protocol bounds what is in
/// flight).
pub struct H2Reader {
    body: h2::RecvStream,
    chunk: Bytes,
}

impl H2Reader {
    fn new(body: h2::RecvStream) -> Self {
        H2Reader {
            body,
            chunk: Bytes::new(),
        }
    }
}

impl AsyncRead for H2Reader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        while this.chunk.is_empty() {
            match ready!(this.body.poll_data(cx)) {
                None => return Poll::Ready(Ok(())),
                Some(Err(e)) => return Poll::Ready(Err(std::io::Error::other(e))),
                Some(Ok(data)) => {
                    this.body
                        .flow_control()
                        .release_capacity(data.len())
                        .map_err(std::io::Error::other)?;
                    this.chunk = data;
                }
            }
        }
        let n = this.chunk.len().min(buf.remaining());
        buf.put_slice(&this.chunk[..n]);
        this.chunk.advance(n);
        Poll::Ready(Ok(()))
    }
}

/// An HTTP/2 body written as a byte stream: each write a DATA frame (only
/// acks go this way), shutdown its end.
pub struct H2Writer {
    body: h2::SendStream<Bytes>,
    ended: bool,
}

impl AsyncWrite for H2Writer {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.get_mut()
            .body
            .send_data(Bytes::copy_from_slice(buf), false)
            .map_err(std::io::Error::other)?;
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if !this.ended {
            this.ended = true;
            this.body
                .send_data(Bytes::new(), true)
                .map_err(std::io::Error::other)?;
        }
        Poll::Ready(Ok(()))
    }
}
