//! What the floors over HTTP/2 and over Arrow Flight share on both ends:
//! the runtime each side runs on, the hand-over of the accepted socket to
//! it, the sending thread a shipper feeds through a queue, and the hand-off
//! of each arrival to the lander's rounds.

use std::future::Future;
use std::net::TcpStream;
use std::sync::mpsc;

use anyhow::{Context, Result, bail};
use tokio::sync::mpsc as async_mpsc;

use super::message::Arrived;

/// A multi-threaded runtime, as the watcher's and the sink's are.
pub(super) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

pub(super) fn into_tokio(stream: TcpStream) -> Result<tokio::net::TcpStream> {
    stream.set_nodelay(true).context("setting TCP_NODELAY")?;
    stream
        .set_nonblocking(true)
        .context("making the socket non-blocking")?;
    tokio::net::TcpStream::from_std(stream).context("handing the socket to the runtime")
}

/// A sending thread with a runtime of its own, fed from the tailing thread
/// through a queue: the tailing thread never waits on the transport.
pub(super) struct Outbound<T> {
    queue: async_mpsc::UnboundedSender<T>,
    thread: std::thread::JoinHandle<Result<()>>,
    /// The transport, as errors name it ("HTTP/2", "Arrow Flight").
    transport: &'static str,
}

impl<T: Send + 'static> Outbound<T> {
    /// Starts the thread `thread_name`, which runs `send` over what is
    /// queued until the queue closes.
    pub(super) fn start<Sending>(
        thread_name: &str,
        transport: &'static str,
        send: impl FnOnce(async_mpsc::UnboundedReceiver<T>) -> Sending + Send + 'static,
    ) -> Result<Self>
    where
        Sending: Future<Output = Result<()>>,
    {
        let (queue, queued) = async_mpsc::unbounded_channel::<T>();
        let thread = std::thread::Builder::new()
            .name(thread_name.into())
            .spawn(move || runtime()?.block_on(send(queued)))
            .with_context(|| format!("starting the {transport} sending thread"))?;
        Ok(Self {
            queue,
            thread,
            transport,
        })
    }

    pub(super) fn send(&self, item: T) -> Result<()> {
        if self.queue.send(item).is_err() {
            // The sender ended: it says why once joined.
            bail!("the {} sender stopped", self.transport);
        }
        Ok(())
    }

    /// Closes the queue, and waits until the sender has sent all of it and
    /// seen its end through.
    pub(super) fn finish(self) -> Result<()> {
        drop(self.queue);
        match self.thread.join() {
            Ok(result) => result,
            Err(_) => bail!("the {} sending thread panicked", self.transport),
        }
    }
}

/// Hands `arrival` to the rounds, from a task of the lander's runtime;
/// false once the rounds have ended (the lander's time is up).
pub(super) fn hand_over(arrivals: &mpsc::SyncSender<Arrived>, arrival: Arrived) -> bool {
    match arrivals.try_send(arrival) {
        Ok(()) => true,
        // The rounds fell behind (their queue is full): wait for them,
        // telling the runtime this worker blocks.
        Err(mpsc::TrySendError::Full(arrival)) => {
            tokio::task::block_in_place(|| arrivals.send(arrival)).is_ok()
        }
        Err(mpsc::TrySendError::Disconnected(_)) => false,
    }
}
