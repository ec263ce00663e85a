//! A TCP delay line for benchmarks: emulates WAN round-trip time on
//! loopback or between network namespaces, where netem is not available.
//!
//! Each accepted connection is relayed to the target; every chunk read in
//! either direction is held for the one-way delay (RTT/2) before it is
//! written on. Buffering is unbounded on purpose, so the relay never limits
//! the rate: what limits throughput is what a real long link limits, the
//! windows of the endpoints (TCP's and HTTP/2's, whose updates are delayed
//! too). Rate limits are the job of tbf on a veth pair, not of this relay.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Relays connections from `listener` to `target`, delaying each direction by `one_way`.
pub async fn serve(
    listener: TcpListener,
    target: SocketAddr,
    one_way: Duration,
) -> anyhow::Result<()> {
    loop {
        let (inbound, peer) = listener
            .accept()
            .await
            .context("accepting a relay connection")?;
        tokio::spawn(async move {
            let outbound = match TcpStream::connect(target).await {
                Ok(stream) => stream,
                Err(error) => {
                    tracing::warn!(%peer, %target, %error, "relay cannot reach its target");
                    return;
                }
            };
            let _ = inbound.set_nodelay(true);
            let _ = outbound.set_nodelay(true);
            let (in_read, in_write) = inbound.into_split();
            let (out_read, out_write) = outbound.into_split();
            tokio::spawn(delay(in_read, out_write, one_way));
            tokio::spawn(delay(out_read, in_write, one_way));
        });
    }
}

async fn delay(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    one_way: Duration,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buffer = vec![0u8; 256 << 10];
    loop {
        match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if tx
                    .send((Instant::now() + one_way, buffer[..n].to_vec()))
                    .is_err()
                {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}
