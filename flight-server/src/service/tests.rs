use super::*;
use crate::client::{ClientConfig, Delivery, FlightPool, Outgoing};
use crate::wire::BatchBuilder;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A sink whose placement has a bug: every batch panics.
#[derive(Default)]
struct PanickingIngest {
    calls: AtomicUsize,
}

impl Ingest for PanickingIngest {
    fn accept_source(&self, _: &str) -> Result<(), Status> {
        Ok(())
    }

    async fn ingest(&self, _: Arc<str>, seq: u64, _: RangeBatch) -> Result<AwaitDurable, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        panic!("a bug in the sink while placing batch {seq}");
    }

    async fn action(&self, _: &str, _: &[u8]) -> Result<Vec<u8>, Status> {
        Err(Status::unimplemented("no actions"))
    }
}

/// A server of `ingest` on a loopback port, the sender that stops it, its
/// task, and a pool of one connection to it.
async fn serve_one_connection<I: Ingest>(
    ingest: Arc<I>,
    config: ServerConfig,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), Box<dyn std::error::Error + Send + Sync>>>,
    (FlightPool, mpsc::UnboundedReceiver<Delivery>),
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(ingest, config, listener, async move {
        let _ = stopped.await;
    }));
    let pool = FlightPool::start(ClientConfig {
        endpoint: format!("http://{address}"),
        source: "s".into(),
        connections: 1,
        ..ClientConfig::default()
    })
    .unwrap();
    (stop, server, pool)
}

/// A sink that holds every batch but the last one's ranges until the
/// last arrives, as a sink writing in order holds ranges that came
/// ahead of the bytes before them.
struct GapAtTheEnd {
    last: u64,
    filled: tokio::sync::watch::Sender<bool>,
}

impl Ingest for GapAtTheEnd {
    fn accept_source(&self, _: &str) -> Result<(), Status> {
        Ok(())
    }

    async fn ingest(&self, _: Arc<str>, seq: u64, _: RangeBatch) -> Result<AwaitDurable, Status> {
        if seq == self.last {
            self.filled.send_replace(true);
        }
        let mut filled = self.filled.subscribe();
        Ok(Box::pin(async move {
            let _ = filled.wait_for(|filled| *filled).await;
            Ok(protocol::Ack {
                seq,
                ..Default::default()
            })
        }))
    }

    async fn action(&self, _: &str, _: &[u8]) -> Result<Vec<u8>, Status> {
        Err(Status::unimplemented("no actions"))
    }
}

/// Batches waiting to become durable do not stop a stream being read:
/// the batch that releases them may come after more of them than the
/// pipeline places at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_batches_do_not_stop_the_stream_being_read() {
    let depth = 4;
    let batches = 3 * depth as u64;
    let ingest = Arc::new(GapAtTheEnd {
        last: batches - 1,
        filled: tokio::sync::watch::channel(false).0,
    });
    let (stop, server, (pool, mut deliveries)) = serve_one_connection(
        ingest,
        ServerConfig {
            pipeline_depth: depth,
            ..ServerConfig::default()
        },
    )
    .await;
    for token in 0..batches {
        let mut builder = BatchBuilder::with_capacity(1, 16);
        builder.push_data("f", 1, token * 16, b"sixteen bytes!!!");
        pool.send(Outgoing {
            token,
            batch: builder.finish_encoded(),
        })
        .await;
    }
    // A deadlock guard, not a timing goal: before, the stream stopped
    // reading with `depth` batches waiting, and this never completed.
    let acked = tokio::time::timeout(Duration::from_secs(60), async {
        let mut acked = 0;
        while acked < batches {
            match deliveries.recv().await {
                Some(Delivery::Acked { .. }) => acked += 1,
                other => panic!("expected an ack, got {other:?}"),
            }
        }
        acked
    })
    .await
    .expect("the stream stopped being read while batches waited");
    assert_eq!(acked, batches);
    drop(pool);
    let _ = stop.send(());
    let _ = server.await;
}

/// A panic inside the sink is its own bug, not the watcher's bad input:
/// the client keeps retrying the batch instead of giving up on it after
/// a few "refusals" (which would stop the file's transfer for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_while_placing_is_retried_never_refused() {
    let ingest = Arc::new(PanickingIngest::default());
    let (stop, server, (pool, mut deliveries)) =
        serve_one_connection(ingest.clone(), ServerConfig::default()).await;
    let mut builder = BatchBuilder::with_capacity(1, 16);
    builder.push_data("f", 1, 0, b"sixteen bytes!!!");
    pool.send(Outgoing {
        token: 7,
        batch: builder.finish_encoded(),
    })
    .await;
    // More attempts than the client's refusal limit, each ended by the
    // panic; none may come back as a refusal.
    let waited = tokio::time::timeout(Duration::from_secs(60), async {
        while ingest.calls.load(Ordering::SeqCst) < 6 {
            if let Ok(delivery) = deliveries.try_recv() {
                return Some(delivery);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        deliveries.try_recv().ok()
    })
    .await
    .expect("the client stopped sending the batch");
    assert!(
        !matches!(waited, Some(Delivery::Refused { .. })),
        "the client gave up on a batch because the sink panicked: {waited:?}"
    );
    drop(pool);
    let _ = stop.send(());
    let _ = server.await;
}
