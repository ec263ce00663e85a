//! One moment of an observed process, as every view of it (metrics,
//! status JSON, the page, OTLP) shows it, and what can be observed.

/// One moment of a process, as every view of it shows it.
pub struct Snapshot {
    /// `/api/status` (documented in the README's section for operators).
    pub status: serde_json::Value,
    pub metrics: Vec<prometheus::proto::MetricFamily>,
    /// Why the process should not be sent work now, if so.
    pub not_ready: Option<String>,
}

/// A process that can be observed.
pub trait Observed: Send + Sync + 'static {
    /// Takes a snapshot; may block briefly (it reads counters from disk).
    fn snapshot(&self) -> Snapshot;

    /// Adds a point to the history the page draws (every few seconds).
    fn sample(&self) {}
}
