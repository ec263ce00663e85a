//! What can go wrong in the sink, said by whose fault it is.
//!
//! Only the service module turns these into gRPC codes: a peer's bad input
//! is refused (the watcher gives up on that row or file), everything else
//! asks the peer to retry later, and an internal failure (a panic, a dead
//! task) is never reported as the peer's fault.

use std::sync::Arc;

/// Why the sink did not do what was asked.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SinkError {
    /// The peer sent something this sink will not accept; sending it again
    /// will not help.
    #[error("{0}")]
    Peer(String),
    /// The sink's storage failed for this request (disk full, I/O error);
    /// nothing of it was acknowledged, and it may be retried.
    #[error("sink storage: {0}")]
    Storage(String),
    /// An earlier failure poisoned the sink (see [`crate::Health`]): it
    /// refuses work until it is restarted and recovers from its manifest.
    #[error("the sink failed earlier and refuses work until restarted: {0}")]
    Poisoned(Arc<str>),
    /// The sink is stopping; what was not acknowledged is sent again later.
    #[error("the sink is shutting down")]
    Shutdown,
    /// A bug in the sink (a panic, a task that died): not the peer's fault.
    #[error("internal error in the sink: {0}")]
    Internal(String),
}

impl SinkError {
    /// The same error with what was being done put before its detail; a
    /// poisoned or stopping sink says so on its own.
    pub fn context(self, doing: impl std::fmt::Display) -> Self {
        match self {
            Self::Peer(detail) => Self::Peer(format!("{doing}: {detail}")),
            Self::Storage(detail) => Self::Storage(format!("{doing}: {detail}")),
            Self::Internal(detail) => Self::Internal(format!("{doing}: {detail}")),
            other @ (Self::Poisoned(_) | Self::Shutdown) => other,
        }
    }

    /// A storage failure: what was being done, and the error it met.
    pub(crate) fn storage(doing: impl std::fmt::Display, error: impl std::fmt::Display) -> Self {
        Self::Storage(format!("{doing}: {error}"))
    }

    /// The message without the variant's prefix, for wrapping in more context.
    pub fn into_detail(self) -> String {
        match self {
            Self::Peer(detail) | Self::Storage(detail) | Self::Internal(detail) => detail,
            Self::Poisoned(reason) => reason.to_string(),
            Self::Shutdown => "the sink is shutting down".to_string(),
        }
    }
}

/// The text a panic was raised with (shared with the service's own).
pub(crate) use flight_server::service::panic_message;
