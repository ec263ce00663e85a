//! Accepted connections, read through a buffer of their own when TLS runs
//! on top.
//!
//! rustls pulls ciphertext from its socket at most 4 KiB per read, so a
//! fast TLS sink would spend its time in `recvfrom`. Reading the socket in
//! large chunks into a buffer and serving rustls from memory makes the
//! calls a hundred times fewer, at the cost of one copy. Plaintext connections are read directly: hyper already reads
//! those in large chunks.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, BufReader, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Bytes read from the socket at once under TLS.
const TLS_READ_BUFFER: usize = 256 << 10;

/// A TCP connection as the Flight server reads it.
pub(crate) enum ServerConnection {
    Direct(TcpStream),
    Buffered(BufReader<TcpStream>),
}

impl ServerConnection {
    pub fn new(stream: TcpStream, tls: bool) -> Self {
        if tls {
            Self::Buffered(BufReader::with_capacity(TLS_READ_BUFFER, stream))
        } else {
            Self::Direct(stream)
        }
    }

    fn stream(&self) -> &TcpStream {
        match self {
            Self::Direct(stream) => stream,
            Self::Buffered(reader) => reader.get_ref(),
        }
    }
}

impl Connected for ServerConnection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream().connect_info()
    }
}

impl AsyncRead for ServerConnection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Direct(stream) => Pin::new(stream).poll_read(cx, buf),
            Self::Buffered(reader) => Pin::new(reader).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ServerConnection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Direct(stream) => Pin::new(stream).poll_write(cx, buf),
            Self::Buffered(reader) => Pin::new(reader).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Direct(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            Self::Buffered(reader) => Pin::new(reader).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.stream().is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Direct(stream) => Pin::new(stream).poll_flush(cx),
            Self::Buffered(reader) => Pin::new(reader).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Direct(stream) => Pin::new(stream).poll_shutdown(cx),
            Self::Buffered(reader) => Pin::new(reader).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn bytes_pass_both_ways_buffered_or_not() {
        for tls in [false, true] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let address = listener.local_addr().unwrap();
            let peer = tokio::spawn(async move {
                let mut stream = TcpStream::connect(address).await.unwrap();
                let payload: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
                stream.write_all(&payload).await.unwrap();
                let mut echo = [0u8; 5];
                stream.read_exact(&mut echo).await.unwrap();
                (payload, echo)
            });
            let (stream, _) = listener.accept().await.unwrap();
            let mut connection = ServerConnection::new(stream, tls);
            assert_eq!(
                connection.connect_info().remote_addr().map(|a| a.ip()),
                Some(address.ip())
            );
            let mut received = vec![0u8; 1_000_000];
            // Small reads, as rustls makes them.
            for chunk in received.chunks_mut(4096) {
                connection.read_exact(chunk).await.unwrap();
            }
            connection.write_all(b"hello").await.unwrap();
            connection.flush().await.unwrap();
            let (sent, echo) = peer.await.unwrap();
            assert_eq!(received, sent);
            assert_eq!(&echo, b"hello");
        }
    }
}
