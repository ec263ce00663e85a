//! Blocking work run from async tasks: on tokio's blocking pool, so the
//! async workers stay on their own threads.

use crate::error::{SinkError, panic_message};

/// Runs blocking work (a commit round's, a subscriber's reads) on the
/// blocking pool. Running it in place (`block_in_place`) spares two
/// hand-offs between threads, but each call moves the async worker to
/// another thread, and the allocator keeps pages for every thread that has
/// run async work: under repeated network cuts the sink's memory grew
/// with it (docs/measurements.md). A panic comes back as an internal
/// error; work the runtime dropped unrun, as the sink shutting down.
pub(crate) async fn run_blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, SinkError> {
    tokio::task::spawn_blocking(work).await.map_err(join_error)
}

/// Why a task ended without its result: a panic is a bug of the sink's; a
/// task the runtime dropped unrun means the sink is shutting down.
pub(crate) fn join_error(error: tokio::task::JoinError) -> SinkError {
    if error.is_panic() {
        SinkError::Internal(format!(
            "panicked: {}",
            panic_message(error.into_panic().as_ref())
        ))
    } else {
        SinkError::Shutdown
    }
}
