//! The operators' HTTP listener of `watch` and `sink` (`--metrics-listen`):
//! Prometheus metrics at `/metrics` (text format 0.0.4), the status as JSON
//! at `/api/status`, a self-contained live status page at `/`, and
//! `/healthz` and `/readyz` for service managers and load balancers.
//!
//! Everything shown comes from one [`Snapshot`] taken from the core crates'
//! own reports (the watcher's `Progress`, the sink's status and its commit
//! feed): they know nothing of HTTP or Prometheus, and the metrics, the
//! JSON and the page cannot disagree about one moment.

pub mod fleet;
mod history;
mod metrics;
pub mod otlp;
mod recent;
mod sink;
mod snapshot;
mod watch;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

pub use recent::RecentProblems;
pub use sink::SinkObserved;
pub use snapshot::{Observed, Snapshot};
pub use watch::WatchObserved;

const PAGE: &str = include_str!("page.html");

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Listens on `listen` (failing now if it cannot) and serves there, on a
/// task of its own, until `shutdown` resolves.
pub async fn start(
    listen: SocketAddr,
    observed: Arc<dyn Observed>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen for metrics on {listen}"))?;
    tracing::info!(listen = %listener.local_addr()?, "serving metrics (/metrics), the status page (/) and /api/status");
    let app = axum::Router::new()
        .route("/", get(page))
        .route("/metrics", get(metrics))
        .route("/api/status", get(status))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(observed.clone());
    Ok(tokio::spawn(async move {
        let sampled = observed;
        let _sampler = AbortOnDrop(tokio::spawn(async move {
            let mut every = tokio::time::interval(history::SAMPLE_EVERY);
            loop {
                every.tick().await;
                let observed = sampled.clone();
                let _ = tokio::task::spawn_blocking(move || observed.sample()).await;
            }
        }));
        if let Err(error) = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!(%error, %listen, "the metrics listener failed");
        }
    }))
}

/// Starts what was asked for: the HTTP listener on `listen`, OTLP pushes
/// to a collector; their tasks end when aborted (or, the listener, at
/// `shutdown`).
pub async fn export(
    observed: Arc<dyn Observed>,
    listen: Option<SocketAddr>,
    otlp: Option<otlp::OtlpConfig>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let mut tasks = Vec::new();
    if let Some(listen) = listen {
        tasks.push(start(listen, observed.clone(), shutdown).await?);
    }
    if let Some(config) = otlp {
        tasks.push(tokio::spawn(otlp::run(config, observed)));
    }
    Ok(tasks)
}

/// The OTLP settings of a process: its resource is the service's name,
/// this host as its instance, and the source a watcher follows.
pub fn otlp_config(
    endpoint: &str,
    every: std::time::Duration,
    service: &str,
    source: Option<&str>,
) -> otlp::OtlpConfig {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let mut resource = vec![
        ("service.name".to_string(), service.to_string()),
        (
            "service.instance.id".to_string(),
            format!("{host}:{}", std::process::id()),
        ),
        (
            "service.version".to_string(),
            env!("CARGO_PKG_VERSION").to_string(),
        ),
        ("host.name".to_string(), host),
    ];
    if let Some(source) = source {
        resource.push(("tailflight.source".to_string(), source.to_string()));
    }
    otlp::OtlpConfig {
        endpoint: endpoint.to_string(),
        // An interval cannot be zero; nobody needs pushes this often.
        every: every.max(std::time::Duration::from_millis(100)),
        resource,
    }
}

async fn snapshot(observed: Arc<dyn Observed>) -> Result<Snapshot, Response> {
    tokio::task::spawn_blocking(move || observed.snapshot())
        .await
        .map_err(|e| {
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("taking the snapshot failed: {e}\n"),
            )
                .into_response()
        })
}

async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        PAGE,
    )
}

async fn metrics(State(observed): State<Arc<dyn Observed>>) -> Response {
    match snapshot(observed).await {
        Ok(snapshot) => match prometheus::TextEncoder::new().encode_to_string(&snapshot.metrics) {
            Ok(text) => ([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], text).into_response(),
            Err(e) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("encoding the metrics failed: {e}\n"),
            )
                .into_response(),
        },
        Err(response) => response,
    }
}

async fn status(State(observed): State<Arc<dyn Observed>>) -> Response {
    match snapshot(observed).await {
        Ok(snapshot) => (
            [(header::CACHE_CONTROL, "no-store")],
            axum::Json(snapshot.status),
        )
            .into_response(),
        Err(response) => response,
    }
}

async fn ready(State(observed): State<Arc<dyn Observed>>) -> Response {
    match snapshot(observed).await {
        Ok(Snapshot {
            not_ready: None, ..
        }) => "ready\n".into_response(),
        Ok(Snapshot {
            not_ready: Some(why),
            ..
        }) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response(),
        Err(response) => response,
    }
}
