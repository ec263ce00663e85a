//! A stop must end the watcher whatever its sinks do.
//!
//! The sinks here are TCP listeners that accept connections and never say a
//! word: that is what a SIGSTOPped sink looks like from the outside (the
//! kernel still completes the handshake), and what a hung one looks like.
//! A refused port stands for a sink that is down. Whatever was not
//! acknowledged must stay unrecorded, so that it is sent again later.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use manifest_db::{WatchState, WatchedFile};
use tokio::net::TcpListener;
use watcher::{Progress, WatchConfig};

/// Only stops a hung test: a stop that works takes a small fraction of it.
const MUST_RETURN_WITHIN: Duration = Duration::from_secs(30);

/// A scratch directory under the system temp dir, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("watcher-shutdown-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("src")).expect("create scratch dir");
        Self(dir)
    }

    fn root(&self) -> PathBuf {
        self.0.join("src")
    }

    fn state(&self) -> PathBuf {
        self.0.join("state")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A sink that accepts connections, keeps them open and never answers.
/// Returns its endpoint and a counter of the connections it accepted.
async fn silent_sink() -> (String, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("local address");
    let accepted = Arc::new(AtomicU64::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        // Bounded: the watcher opens a handful of connections per attempt.
        while held.len() < 1000 {
            let Ok((socket, _)) = listener.accept().await else {
                break;
            };
            count.fetch_add(1, Ordering::Relaxed);
            held.push(socket);
        }
    });
    (format!("http://{addr}"), accepted)
}

/// An endpoint nobody listens on.
fn refused_sink() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let addr = listener.local_addr().expect("local address");
    drop(listener);
    format!("http://{addr}")
}

fn config(scratch: &Scratch, sink: String) -> WatchConfig {
    WatchConfig {
        root: scratch.root(),
        source: "shutdown-test".into(),
        state_dir: scratch.state(),
        sinks: vec![sink],
        connections: 1,
        // Small windows and batches: the pipeline fills with little data.
        window_bytes: 64 << 10,
        batch_bytes: 64 << 10,
        max_row_bytes: 64 << 10,
        ..WatchConfig::default()
    }
}

/// Polls until `condition` holds; fails the test after a generous bound.
async fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if condition() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("never happened: {what}");
}

fn recorded(state: &Path) -> Vec<WatchedFile> {
    WatchState::open(state)
        .expect("open the watcher state")
        .load()
        .expect("load the watcher state")
}

/// Runs the watcher until `shutdown`, failing the test if it does not
/// return at all.
async fn run_until(
    config: WatchConfig,
    progress: Arc<Progress>,
    shutdown: impl Future<Output = ()>,
) {
    let result = tokio::time::timeout(MUST_RETURN_WITHIN, watcher::run(config, progress, shutdown))
        .await
        .expect("the watcher did not return after its shutdown signal");
    result.expect("the watcher failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_ends_reconciliation_with_a_sink_that_never_answers() {
    let scratch = Scratch::new("reconcile-silent");
    std::fs::write(scratch.root().join("a.dat"), b"some bytes").expect("write a source file");
    let (sink, accepted) = silent_sink().await;
    let progress = Arc::new(Progress::default());
    // One connection is the pool's stream; the second is the watermarks
    // request of the reconciliation, which then waits for an answer.
    let shutdown = async move {
        wait_for("the reconciliation connects", || {
            accepted.load(Ordering::Relaxed) >= 2
        })
        .await
    };
    run_until(config(&scratch, sink), progress.clone(), shutdown).await;
    assert_eq!(progress.bytes_read(), 0, "tailing began without watermarks");
    assert!(
        recorded(&scratch.state()).is_empty(),
        "a watcher stopped before reconciling recorded files, so it would not reconcile next time"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_ends_reconciliation_with_a_sink_that_is_down() {
    let scratch = Scratch::new("reconcile-down");
    std::fs::write(scratch.root().join("a.dat"), b"some bytes").expect("write a source file");
    let progress = Arc::new(Progress::default());
    // Nothing to observe from a port that refuses: stop after a few attempts.
    let shutdown = tokio::time::sleep(Duration::from_millis(1500));
    run_until(config(&scratch, refused_sink()), progress.clone(), shutdown).await;
    assert_eq!(progress.bytes_read(), 0, "tailing began without watermarks");
    assert!(recorded(&scratch.state()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_ends_tailing_while_the_sink_never_acknowledges() {
    let scratch = Scratch::new("tail-silent");
    // A watcher with state does not reconcile: it goes straight to tailing.
    WatchState::open(&scratch.state())
        .expect("open the watcher state")
        .save(
            &[WatchedFile {
                key: "earlier".into(),
                path: "earlier".into(),
                generation: 1,
                ..WatchedFile::default()
            }],
            true,
        )
        .expect("seed the watcher state");
    // Far more than the queue, the window and the outboxes hold together,
    // so the tailer must end up waiting for room that never comes.
    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(scratch.root().join("big.dat"), &data).expect("write a source file");
    let (sink, _) = silent_sink().await;
    let progress = Arc::new(Progress::default());
    let watching = progress.clone();
    let shutdown = async move {
        wait_for("the tailer sends data", || {
            watching.bytes_read() >= 512 << 10
        })
        .await
    };
    run_until(config(&scratch, sink), progress.clone(), shutdown).await;
    assert_eq!(progress.bytes_acked(), 0);
    let records = recorded(&scratch.state());
    let big = records.iter().find(|r| r.path == "big.dat");
    assert!(
        big.is_none_or(|r| r.acked_offset == 0),
        "unacknowledged bytes were recorded as acknowledged: {big:?}"
    );
}
