//! A commit request as it waits in the committer's queue: the request, when
//! it was queued, and where its answer goes.

use std::time::Instant;

use tokio::sync::oneshot;

use crate::error::SinkError;
use crate::state::CommitRequest;

/// A request in the committer's queue, or waiting for other batches' ranges.
pub(crate) struct Queued {
    pub request: CommitRequest,
    /// When it was queued (for the commit round's trace).
    pub queued: Instant,
    pub reply: oneshot::Sender<Result<(), SinkError>>,
}
