//! Following the streams of a subscription: one task per stream
//! subscribes where its sink is served now and hands the batches over; one
//! loop owns the output and the cursors, takes the batches in order and
//! saves the cursors after each. After an interruption, or a takeover that
//! moves its sink identity, a stream subscribes again from what the output
//! took, so nothing arrives twice and nothing is skipped.

use std::future::Future;
use std::io::Write;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::Context;
use flight_server::client::{ClientError, Consumed};
use flight_server::subscription::Ticket;
use flight_server::tls::ClientTls;
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot, watch};

use crate::rebuild::Rebuilt;
use crate::rows::{line, rows};
use crate::state::{Cursors, StateFile};

/// Where one stream of the subscription comes from: a sink's endpoint, or
/// a sink identity's, which changes at a takeover.
pub struct Stream {
    /// The identity (empty for a sink named by its endpoint).
    pub identity: String,
    /// The endpoint serving it now; none while no process does.
    pub endpoint: watch::Receiver<Option<String>>,
}

/// What to follow and how.
#[derive(Clone)]
pub struct FollowConfig {
    /// The subscription every stream makes: source, globs, start, follow,
    /// batch size (its cursor is each stream's own).
    pub ticket: Ticket,
    pub tls: Option<ClientTls>,
    pub token: Option<String>,
    /// The streams are a fleet's sink identities, which move at takeovers.
    pub fleet: bool,
}

/// Where the rows go.
pub enum Output {
    /// Files rebuilt under a directory.
    Files(Rebuilt),
    /// One line per row ([`crate::rows::line`]), each in one write.
    Lines(Box<dyn Write + Send>),
}

impl Output {
    /// Takes in a batch; returns the data bytes it held.
    fn take(&mut self, batch: &arrow_array::RecordBatch) -> anyhow::Result<u64> {
        let mut bytes = 0;
        for row in rows(batch)? {
            bytes += row.data.len() as u64;
            match self {
                Output::Files(rebuilt) => rebuilt.take(&row)?,
                Output::Lines(out) => {
                    let mut text = line(&row);
                    text.push('\n');
                    out.write_all(text.as_bytes())
                        .context("writing a row's line")?;
                }
            }
        }
        Ok(bytes)
    }
}

/// What a tail tells as it goes (the console's progress and messages).
pub trait Events: Send + Sync + 'static {
    /// A stream lost its sink, was moved or ended; it resumes.
    fn resuming(&self, stream: &str, why: &str);
    /// The output took a batch holding `bytes` of data.
    fn taken(&self, bytes: u64);
}

/// How long a stream without `follow` waits for an identity with no
/// active process.
const ENDPOINT_PATIENCE: Duration = Duration::from_secs(60);

/// Follows `streams` into `output` until they end (without `follow`), one
/// fails, or `stopped` resolves; saves the cursors to `state` after every
/// batch. `cursors` holds one cursor per stream, in order.
pub async fn follow(
    config: FollowConfig,
    streams: Vec<Stream>,
    mut output: Output,
    cursors: Cursors,
    state: Option<StateFile>,
    events: Arc<dyn Events>,
    stopped: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let cursors = Arc::new(Mutex::new(cursors));
    let (deliver, mut delivered) = mpsc::channel::<Delivery>(4);
    let mut tasks = tokio::task::JoinSet::new();
    for (index, stream) in streams.into_iter().enumerate() {
        let follower = Follower {
            index,
            config: config.clone(),
            cursors: cursors.clone(),
            deliver: deliver.clone(),
            events: events.clone(),
        };
        tasks.spawn(follower.run(stream));
    }
    drop(deliver);
    tokio::pin!(stopped);
    let mut interrupted = false;
    loop {
        let delivery = tokio::select! {
            delivery = delivered.recv() => match delivery {
                Some(delivery) => delivery,
                None => break,
            },
            // A stream that failed ends the tail at once.
            Some(ended) = tasks.join_next() => {
                ended.context("a stream's task failed")??;
                continue;
            }
            // What was taken is in the cursor.
            () = &mut stopped => {
                interrupted = true;
                break;
            }
        };
        match delivery {
            Delivery::Batch { stream, consumed } => {
                let bytes = output.take(&consumed.batch)?;
                let mut held = lock(&cursors);
                held.took(stream, &consumed.cursor);
                if let Some(state) = &state {
                    state.save(&held)?;
                }
                drop(held);
                events.taken(bytes);
            }
            Delivery::Settled(answer) => {
                let _ = answer.send(());
            }
        }
    }
    if interrupted {
        tasks.abort_all();
    }
    while let Some(ended) = tasks.join_next().await {
        match ended {
            Ok(outcome) => outcome?,
            Err(e) if e.is_cancelled() => {}
            Err(e) => return Err(anyhow::Error::new(e).context("a stream's task failed")),
        }
    }
    Ok(())
}

/// What the streams hand to the loop that owns the output and the cursors.
enum Delivery {
    Batch {
        stream: usize,
        consumed: Consumed,
    },
    /// Answered once every batch sent before it is in the output and its
    /// cursor: a stream resumes only from there, so nothing arrives twice.
    Settled(oneshot::Sender<()>),
}

fn lock(cursors: &Mutex<Cursors>) -> MutexGuard<'_, Cursors> {
    cursors
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One stream's task.
struct Follower {
    index: usize,
    config: FollowConfig,
    cursors: Arc<Mutex<Cursors>>,
    deliver: mpsc::Sender<Delivery>,
    events: Arc<dyn Events>,
}

/// How a stream's subscription ended without an error.
enum Ended {
    /// The sink ended it (everything durable was sent, without follow).
    Finished,
    /// The loop that takes the batches is gone: the tail is stopping.
    Closed,
    /// The identity moved to another process (a takeover).
    Moved,
}

impl Follower {
    async fn run(self, mut stream: Stream) -> anyhow::Result<()> {
        let follow = self.config.ticket.follow;
        let mut name = format!("sink identity {}", stream.identity);
        loop {
            // Without follow, an identity nobody serves is not waited for
            // forever: it is named.
            let patience = (!follow).then_some(ENDPOINT_PATIENCE);
            let endpoint = match wait_endpoint(&mut stream.endpoint, patience).await {
                Ok(Some(endpoint)) => endpoint,
                Ok(None) => return Ok(()),
                Err(waited) => anyhow::bail!(
                    "{name} has had no active process for {waited:?}: its files cannot be read now"
                ),
            };
            if stream.identity.is_empty() {
                name = endpoint.clone();
            }
            let outcome = self.subscribe(&mut stream, &endpoint).await;
            match outcome {
                Ok(Ended::Moved) => {
                    self.events.resuming(
                        &name,
                        &format!("moved from {endpoint}; resuming at its new endpoint"),
                    );
                    continue;
                }
                Ok(Ended::Closed) => return Ok(()),
                Ok(Ended::Finished) if !follow => return Ok(()),
                Ok(Ended::Finished) => self
                    .events
                    .resuming(&name, "the subscription ended; resuming in 1 s"),
                Err(error) if self.config.fleet && unknown_source(&error) => {
                    // This identity holds none of the source's files yet.
                    if !follow {
                        return Ok(());
                    }
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    continue;
                }
                // Following, a sink that went away is waited for: the
                // stream resumes from the cursor once it is back.
                Err(error) if (follow || self.config.fleet) && retryable(&error) => {
                    self.events.resuming(
                        &name,
                        &format!("subscription interrupted ({error:#}); resuming in 1 s"),
                    );
                }
                Err(error) => return Err(error.context(name)),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// One subscription at `endpoint`, from what the output took.
    async fn subscribe(&self, stream: &mut Stream, endpoint: &str) -> anyhow::Result<Ended> {
        let (settled, settling) = oneshot::channel();
        if self.deliver.send(Delivery::Settled(settled)).await.is_err() {
            return Ok(Ended::Closed);
        }
        let _ = settling.await;
        let ticket = lock(&self.cursors).ticket(self.index, &self.config.ticket);
        let client = flight_server::ClientConfig {
            endpoint: endpoint.to_owned(),
            tls: self.config.tls.clone(),
            ..Default::default()
        };
        let mut batches =
            flight_server::client::subscribe(&client, &ticket, self.config.token.as_deref())
                .await?;
        loop {
            tokio::select! {
                next = batches.next() => {
                    let Some(consumed) = next else { return Ok(Ended::Finished) };
                    let delivery = Delivery::Batch { stream: self.index, consumed: consumed? };
                    if self.deliver.send(delivery).await.is_err() {
                        return Ok(Ended::Closed);
                    }
                }
                // A takeover: the new process serves from the same state.
                changed = stream.endpoint.changed(), if self.config.fleet => {
                    if changed.is_err() || stream.endpoint.borrow().as_deref() != Some(endpoint) {
                        return Ok(Ended::Moved);
                    }
                }
            }
        }
    }
}

/// The endpoint now, waiting while there is none: `Ok(None)` once nobody
/// follows it any more, `Err` after `patience` without one.
async fn wait_endpoint(
    endpoint: &mut watch::Receiver<Option<String>>,
    patience: Option<Duration>,
) -> Result<Option<String>, Duration> {
    let waiting = endpoint.wait_for(Option::is_some);
    let current = match patience {
        Some(patience) => tokio::time::timeout(patience, waiting)
            .await
            .map_err(|_| patience)?,
        None => waiting.await,
    };
    Ok(current.ok().and_then(|current| current.clone()))
}

/// A sink that holds no file of the source (yet).
fn unknown_source(error: &anyhow::Error) -> bool {
    matches!(
        error.downcast_ref::<ClientError>(),
        Some(ClientError::Action { status, .. })
            if status.code() == tonic::Code::InvalidArgument
                && status.message().contains("is unknown to this sink")
    )
}

/// Whether a subscription's failure is the sink or the network going away
/// (worth waiting for), not a refusal.
fn retryable(error: &anyhow::Error) -> bool {
    match error.downcast_ref::<ClientError>() {
        Some(ClientError::Endpoint { .. }) => true,
        Some(ClientError::Action { status, .. }) => matches!(
            status.code(),
            tonic::Code::Unavailable
                | tonic::Code::Unknown
                | tonic::Code::Internal
                | tonic::Code::Cancelled
        ),
        None => false,
    }
}
